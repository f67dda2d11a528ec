"""One PyTorch measurement for bench/cpu_vs_pytorch.sh: GPT-2 or LLaMA fp32 training steps on the CPU.

A step is what dsplan's `train_bench` example times: zero_grad(set_to_none=True), forward with
labels (Hugging Face's shifted mean cross-entropy), backward, and fused AdamW over all
parameters (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01). Dropout is 0 and the
attention is `eager` (the full T x T square, masked), as in research/cpu-anchors.md section 4,
unless --attn sdpa asks for torch's fused causal attention.

The caller sets OMP_NUM_THREADS / MKL_NUM_THREADS before this process starts; the script also
calls torch.set_num_threads. It prints one line per step and, last, one JSON line with the same
keys as train_bench's.
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

PRESETS = {
    # name: (vocab_size, n_positions, n_embd, n_layer, n_head)
    "gpt2": (50257, 1024, 768, 12, 12),
    "tiny": (256, 1024, 128, 4, 4),
}
# LLaMA-shaped presets, built as transformers' LlamaForCausalLM (the shape of train_bench's).
LLAMA_PRESETS = {
    "llama-100m": dict(
        vocab_size=32000,
        max_position_embeddings=2048,
        hidden_size=768,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
    ),
}
PRESET_NAMES = {"gpt2": "gpt2", "tiny": "gpt2-tiny", "llama-100m": "llama-100m"}


class Block(nn.Module):
    """A GPT-2 block with Hugging Face's eager arithmetic (gelu_new, pre-LayerNorm)."""

    def __init__(self, n_embd, n_head, eps, attn):
        super().__init__()
        self.n_head = n_head
        self.attn = attn
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x, causal):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * (hs**-0.5)
            scores = torch.where(causal, scores, torch.finfo(scores.dtype).min)
            y = torch.matmul(F.softmax(scores, dim=-1), v)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.mlp_proj(h)


class Gpt2(nn.Module):
    """GPT-2 LM head model in plain torch.nn (tied embeddings), used with --model nn."""

    def __init__(self, vocab, positions, n_embd, n_layer, n_head, attn, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(positions, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, eps, attn) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, causal)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        # Hugging Face's causal LM loss: position t predicts token t + 1, mean over targets.
        vocab = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def build_model(kind, preset, attn):
    """The model, its loss, and what the FLOP count needs: (model, loss_of, looked_up_numel,
    vocab, layers, attention_width); looked_up_numel is what is only looked up (GPT-2's
    position embedding, an untied input embedding)."""
    if preset in LLAMA_PRESETS:
        if kind != "hf":
            raise SystemExit(f"--model {kind}: {preset} is built only as transformers' LlamaForCausalLM (--model hf)")
        from transformers import LlamaConfig, LlamaForCausalLM

        shape = LLAMA_PRESETS[preset]
        config = LlamaConfig(**shape, attention_dropout=0.0)
        config._attn_implementation = attn
        model = LlamaForCausalLM(config)
        looked_up = 0 if shape["tie_word_embeddings"] else shape["vocab_size"] * shape["hidden_size"]
        width = shape["num_attention_heads"] * shape["head_dim"]
        loss_of = lambda tokens: model(input_ids=tokens, labels=tokens).loss  # noqa: E731
        return model, loss_of, looked_up, shape["vocab_size"], shape["num_hidden_layers"], width
    vocab, positions, n_embd, n_layer, n_head = PRESETS[preset]
    if kind == "nn":
        model = Gpt2(vocab, positions, n_embd, n_layer, n_head, attn)
        return model, lambda tokens: model(tokens), positions * n_embd, vocab, n_layer, n_embd
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu_new",
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    config._attn_implementation = attn
    model = GPT2LMHeadModel(config)
    loss_of = lambda tokens: model(input_ids=tokens, labels=tokens).loss  # noqa: E731
    return model, loss_of, positions * n_embd, vocab, n_layer, n_embd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["hf", "nn"], default="hf")
    parser.add_argument(
        "--attn",
        choices=["eager", "sdpa"],
        default="eager",
        help="eager: the full masked T x T square (cpu-anchors.md); sdpa: torch's fused causal attention",
    )
    parser.add_argument("--preset", choices=sorted(PRESET_NAMES), default="gpt2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, loss_of, looked_up, vocab, n_layer, width = build_model(args.model, args.preset, args.attn)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True
    )
    tokens = torch.randint(0, vocab, (args.batch, args.seq))
    n_tokens = args.batch * args.seq

    samples = []
    loss = float("nan")
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        loss_t = loss_of(tokens)
        t2 = time.perf_counter()
        loss_t.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        loss = loss_t.item()
        ms = [1e3 * (b - a) for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4))]
        total = sum(ms)
        kind = "warm-up" if step < args.warmup else "timed"
        if step >= args.warmup:
            samples.append(ms)
        print(
            f"step {step:>2} ({kind}): loss {loss:.4f}  zero {ms[0]:.1f} ms  fwd {ms[1]:.1f} ms  "
            f"bwd {ms[2]:.1f} ms  opt {ms[3]:.1f} ms  total {total:.1f} ms  "
            f"{n_tokens / total * 1e3:.1f} tokens/s",
            flush=True,
        )

    rates = [n_tokens / sum(ms) * 1e3 for ms in samples]
    rate = statistics.median(rates)
    flops_6n = 6.0 * (n_params - looked_up)
    flops_attn = flops_6n + 12.0 * n_layer * width * args.seq
    phase = [statistics.median(ms[i] for ms in samples) for i in range(4)]
    name = PRESET_NAMES[args.preset]
    print(
        f"torch {name} train B={args.batch} T={args.seq} threads={torch.get_num_threads()}: "
        f"{rate:.1f} tokens/s [{min(rates):.1f}-{max(rates):.1f}], {rate * flops_6n / 1e9:.1f} GFLOP/s (6N), "
        f"{rate * flops_attn / 1e9:.1f} GFLOP/s (6N+attn); zero/fwd/bwd/opt "
        f"{phase[0]:.1f} / {phase[1]:.1f} / {phase[2]:.1f} / {phase[3]:.1f} ms"
    )
    print(
        json.dumps(
            {
                "impl": f"torch-{args.model}-{args.attn}",
                "torch": torch.__version__,
                "model": name,
                "batch": args.batch,
                "seq": args.seq,
                "threads": torch.get_num_threads(),
                "steps": args.steps,
                "warmup": args.warmup,
                "tokens_per_s": rate,
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "samples_tokens_per_s": rates,
                "gflops_6n": rate * flops_6n / 1e9,
                "gflops_6n_attn": rate * flops_attn / 1e9,
                "zero_ms": phase[0],
                "fwd_ms": phase[1],
                "bwd_ms": phase[2],
                "opt_ms": phase[3],
                "last_loss": loss,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
