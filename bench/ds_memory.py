"""One DeepSpeed memory measurement for bench/gpu_check.sh (issue 16, step 2).

Trains a Hugging Face GPT-2 (random init from an explicit config, no download) with DeepSpeed
0.19.8 on one GPU for `--steps` steps (bf16, AdamW, clipping 1.0, random tokens) and prints one
JSON line: `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` over the whole
process (model build, `deepspeed.initialize`, the steps), next to what the config asked for,
and `phases`: the allocator's counters after `initialize` and after each step's forward,
backward and optimizer step, each phase's peak measured alone (the peak counters are reset
before it; the overall maxima are the largest of the phases').

The DeepSpeed config it trains with is written to `--config-out` first, so `dsplan estimate
--config <that file> --model <same> --seq-len <same>` reads the very same file. With
`--write-config-only` it stops there (no torch needed): the dry run uses this.

The model is built as the Hugging Face Trainer builds it: `HfDeepSpeedConfig` registered, then
`AutoModelForCausalLM.from_config`, so stage 3 builds it under `deepspeed.zero.Init` (what
`dsplan estimate` assumes by default; the output's `zero_init` says whether it happened). Attention is transformers' `sdpa` (flash attention on
Hopper; the estimate is asked with `--flash-attention`) unless `--attention eager`. Dropout
stays at GPT-2's 0.1.
"""

import argparse
import json
import os
import sys
import time

MODELS = {
    # name: (n_embd, n_layer, n_head), vocabulary 50257, 1024 positions
    "gpt2": (768, 12, 12),
    "gpt2-medium": (1024, 24, 16),
}


def ds_config(stage, offload, micro_batch):
    """The DeepSpeed config of one run."""
    zero = {"stage": stage}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        },
        "zero_optimization": zero,
        "wall_clock_breakdown": False,
    }


def phase_memory(phase, step):
    """The allocator's counters at the end of a phase: its peaks since the last reset."""
    import torch

    torch.cuda.synchronize()
    return {
        "phase": phase,
        "step": step,
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "max_reserved": torch.cuda.max_memory_reserved(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--stage", type=int, choices=[0, 1, 2, 3], default=0)
    parser.add_argument("--offload-optimizer", choices=["none", "cpu"], default="none")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--config-out", required=True)
    parser.add_argument(
        "--result-out",
        help="also write the JSON result to this file (the log's line can be glued to "
        "torch's own output: seen on an H200, 2026-11-26)",
    )
    parser.add_argument("--write-config-only", action="store_true")
    args = parser.parse_args()

    config = ds_config(args.stage, args.offload_optimizer, args.micro_batch)
    with open(args.config_out, "w") as f:
        json.dump(config, f, indent=2)
    if args.write_config_only:
        return

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")

    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    started = time.perf_counter()
    torch.manual_seed(0)
    n_embd, n_layer, n_head = MODELS[args.model]
    hf_config = GPT2Config(
        vocab_size=50257,
        n_positions=1024,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        attn_implementation=args.attention,
    )
    deepspeed.init_distributed(dist_backend="nccl")
    # As the Hugging Face Trainer does: with the DeepSpeed config registered, `from_config`
    # builds a stage-3 model under `deepspeed.zero.Init` (partitioned as it is built).
    try:
        from transformers.integrations import HfDeepSpeedConfig
    except ImportError:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig
    hf_deepspeed = HfDeepSpeedConfig(config)  # noqa: F841 (must stay alive)
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=args.attention)
    zero_init = any(hasattr(p, "ds_numel") for p in model.parameters())
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    device = engine.device
    tokens = torch.randint(0, 50257, (args.micro_batch, args.seq), device=device)
    # Where the peak is: each phase's own peak (the allocator's peak counters reset before it),
    # and the overall maxima kept here across the resets.
    torch.cuda.synchronize()
    phases = [phase_memory("initialize", None)]
    losses = []
    for step in range(args.steps):
        torch.cuda.reset_peak_memory_stats()
        loss = engine(input_ids=tokens, labels=tokens).loss
        phases.append(phase_memory("forward", step))
        torch.cuda.reset_peak_memory_stats()
        engine.backward(loss)
        phases.append(phase_memory("backward", step))
        torch.cuda.reset_peak_memory_stats()
        engine.step()
        phases.append(phase_memory("step", step))
        losses.append(loss.item())
    torch.cuda.synchronize()
    result = json.dumps(
        {
            "model": args.model,
            "params": n_params,
            "stage": args.stage,
            "offload_optimizer": args.offload_optimizer,
            "micro_batch": args.micro_batch,
            "seq_len": args.seq,
            "steps": args.steps,
            "attention": args.attention,
            "attention_used": getattr(model.config, "_attn_implementation", None),
            "zero_init": zero_init,
            "max_allocated": max(p["max_allocated"] for p in phases),
            "max_reserved": max(p["max_reserved"] for p in phases),
            "phases": phases,
            "allocated_after": torch.cuda.memory_allocated(),
            "losses": losses,
            "seconds": time.perf_counter() - started,
            "device": torch.cuda.get_device_name(),
            "deepspeed": deepspeed.__version__,
            "torch": torch.__version__,
        }
    )
    if args.result_out:
        with open(args.result_out, "w") as f:
            f.write(result + "\n")
    print(result, flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
