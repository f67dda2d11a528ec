"""One PyTorch measurement for bench/gpu_vs_pytorch.sh: GPT-2 bf16 training steps on one GPU.

A step is what `dsplan run --device cuda` does per optimizer step with gradient accumulation 1:
zero_grad(set_to_none=True), forward with labels (Hugging Face's shifted mean cross-entropy),
backward, gradient clipping to 1.0, and fused AdamW (lr 1e-4, betas (0.9, 0.999), eps 1e-8,
weight_decay 0.01). Mixed precision is PyTorch's usual one: fp32 parameters and optimizer,
`torch.autocast(dtype=bfloat16)` around the forward (DeepSpeed's bf16 keeps bf16 parameters
next to an fp32 master instead; the arithmetic precision of the matmuls is the same). Dropout
is 0; attention is torch's fused causal `sdpa` (flash attention on Hopper).

`--mode compile` wraps the model in `torch.compile` (the first steps compile; they are the
warm-up). The script prints one line per step and, last, one JSON line with tokens/s (median of
the timed steps), model FLOP/s and MFU against the device's dense bf16 peak.
"""

import argparse
import json
import statistics
import time

import torch

from gpu_peaks import flops_per_token, peak_flops
from torch_step import PRESETS, PRESET_NAMES, build_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["hf", "nn"], default="hf")
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test)")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model, loss_of, wpe_numel, _, n_layer, n_embd = build_model(args.model, args.preset, "sdpa")
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True
    )
    step_fn = loss_of
    if args.mode == "compile":
        step_fn = torch.compile(loss_of)
    vocab = PRESETS[args.preset][0]
    tokens = torch.randint(0, vocab, (args.batch, args.seq), device=device)
    n_tokens = args.batch * args.seq

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rates = []
    loss = float("nan")
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss_t = step_fn(tokens)
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss = loss_t.item()
        sync()
        seconds = time.perf_counter() - t0
        kind = "warm-up" if step < args.warmup else "timed"
        if step >= args.warmup:
            rates.append(n_tokens / seconds)
        print(
            f"step {step:>2} ({kind}): loss {loss:.4f}  {seconds * 1e3:.1f} ms  "
            f"{n_tokens / seconds:.0f} tokens/s",
            flush=True,
        )

    rate = statistics.median(rates)
    per_token = flops_per_token(n_params, wpe_numel, n_layer, n_embd, args.seq)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(name)
    mfu = rate * per_token / peak if peak else None
    peak_bytes = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    print(
        json.dumps(
            {
                "impl": f"torch-{args.mode}",
                "torch": torch.__version__,
                "device": name,
                "model": PRESET_NAMES[args.preset],
                "params": n_params,
                "batch": args.batch,
                "seq": args.seq,
                "steps": args.steps,
                "warmup": args.warmup,
                "tokens_per_s": rate,
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "model_flops_per_token": per_token,
                "tflops": rate * per_token / 1e12,
                "peak_bf16_flops": peak,
                "mfu": mfu,
                "peak_memory_bytes": peak_bytes,
                "last_loss": loss,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
