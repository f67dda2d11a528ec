#!/usr/bin/env python3
"""Writes calculator_cases.json: Megatron-LM's own theoretical memory numbers for a grid of jobs.

The numbers come from Megatron-LM's file itself, not from a transcription: this script loads
`megatron/training/theoretical_memory_usage.py` and `megatron/training/vocab_utils.py` from a
Megatron-LM checkout (no torch needed: the two `megatron.training.utils` helpers they import,
`print_rank_0` and `is_hybrid_model`, are replaced by stand-ins that print nothing and say "not
hybrid"), builds the `args` namespace Megatron's argument parser would build for each case's
flags, and calls `report_theoretical_memory(args, num_microbatches)` as `training.py` does.

    python3 generate_calculator_cases.py /path/to/Megatron-LM > calculator_cases.json

The checkout must be at the commit named in MEGATRON_COMMIT (the JSON records it).
dsplan's test (planner/tests/megatron_calculator.rs) parses each case's `megatron_args` with
dsplan's own parser and must land within 1e-6 relative of every figure.
"""

import contextlib
import importlib.util
import io
import json
import math
import subprocess
import sys
import types
from argparse import Namespace

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def load_megatron(root):
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if head != MEGATRON_COMMIT:
        sys.exit(f"{root} is at {head}, not {MEGATRON_COMMIT}")
    training = types.ModuleType("megatron.training")
    training.__path__ = []
    utils = types.ModuleType("megatron.training.utils")
    utils.print_rank_0 = lambda *a, **k: None
    utils.is_hybrid_model = lambda args: getattr(args, "hybrid_layer_pattern", None) is not None
    sys.modules.update({"megatron": types.ModuleType("megatron"), "megatron.training": training,
                        "megatron.training.utils": utils})
    modules = {}
    for name in ("theoretical_memory_usage", "vocab_utils"):
        spec = importlib.util.spec_from_file_location(
            f"megatron.training.{name}", f"{root}/megatron/training/{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules["theoretical_memory_usage"], modules["vocab_utils"]


# Published shapes. GPT-3: Brown et al. 2020, Table 2.1 (vocabulary of GPT-2's BPE, 50257);
# MT-NLG 530B: Smith et al. 2022; Llama 2: Touvron et al. 2023; Llama 3/3.1: Meta's model cards
# (config.json); Mistral 7B: Jiang et al. 2023; Qwen2.5-7B: its config.json; Megatron-LM's CI
# job gpt3_7b_*_memory_speed: its model_config.yaml.
GPT3 = dict(vocab=50257, seq=2048, swiglu=False, norm="LayerNorm", untie=False, groups=None)
LLAMA = dict(swiglu=True, norm="RMSNorm", untie=True)
SHAPES = [
    ("gpt3-125m", dict(GPT3, layers=12, hidden=768, heads=12)),
    ("gpt3-350m", dict(GPT3, layers=24, hidden=1024, heads=16)),
    ("gpt3-1.3b", dict(GPT3, layers=24, hidden=2048, heads=24, kv_channels=128)),
    ("gpt3-2.7b", dict(GPT3, layers=32, hidden=2560, heads=32)),
    ("gpt3-6.7b", dict(GPT3, layers=32, hidden=4096, heads=32)),
    ("gpt3-13b", dict(GPT3, layers=40, hidden=5140, heads=40, kv_channels=128)),
    ("gpt3-175b", dict(GPT3, layers=96, hidden=12288, heads=96)),
    ("mt-nlg-530b", dict(GPT3, layers=105, hidden=20480, heads=128)),
    ("llama2-7b", dict(LLAMA, layers=32, hidden=4096, heads=32, groups=None, ffn=11008,
                       vocab=32000, seq=4096)),
    ("llama2-70b", dict(LLAMA, layers=80, hidden=8192, heads=64, groups=8, ffn=28672,
                        vocab=32000, seq=4096)),
    ("llama3-8b", dict(LLAMA, layers=32, hidden=4096, heads=32, groups=8, ffn=14336,
                       vocab=128256, seq=8192)),
    ("llama3-70b", dict(LLAMA, layers=80, hidden=8192, heads=64, groups=8, ffn=28672,
                        vocab=128256, seq=8192)),
    ("llama3.1-405b", dict(LLAMA, layers=126, hidden=16384, heads=128, groups=8, ffn=53248,
                           vocab=128256, seq=8192)),
    ("mistral-7b", dict(LLAMA, layers=32, hidden=4096, heads=32, groups=8, ffn=14336,
                        vocab=32000, seq=8192)),
    ("qwen2.5-7b", dict(LLAMA, layers=28, hidden=3584, heads=28, groups=4, ffn=18944,
                        vocab=152064, seq=4096)),
    ("megatron-ci-gpt3-7b", dict(layers=32, hidden=4096, heads=32, groups=8, ffn=16384,
                                 vocab=131073, seq=8192, swiglu=False, norm="LayerNorm",
                                 untie=True)),
]


def valid(shape, t, p, vpp, m):
    """Megatron's own refusals for these flags (arguments.py, TransformerConfig, schedules)."""
    groups = shape.get("groups") or shape["heads"]
    if shape["heads"] % t or (groups % t and t % groups):
        return False
    if shape["layers"] % p:
        return False
    if vpp is not None:
        if p <= 2 or (shape["layers"] // p) % vpp or m < p:
            return False
    return True


def flags(shape, t, p, vpp, sp, dist_opt, recompute, mbs, gbs, divisible_by):
    args = [
        f"--num-layers {shape['layers']}", f"--hidden-size {shape['hidden']}",
        f"--num-attention-heads {shape['heads']}", f"--seq-length {shape['seq']}",
        f"--max-position-embeddings {shape['seq']}",
        f"--micro-batch-size {mbs}", f"--global-batch-size {gbs}",
        f"--tensor-model-parallel-size {t}", f"--pipeline-model-parallel-size {p}",
        "--bf16",
    ]
    if "kv_channels" in shape:
        args.append(f"--kv-channels {shape['kv_channels']}")
    if "ffn" in shape:
        args.append(f"--ffn-hidden-size {shape['ffn']}")
    if shape.get("groups"):
        args.append(f"--group-query-attention --num-query-groups {shape['groups']}")
    if shape["swiglu"]:
        args.append("--swiglu")
    if shape["norm"] == "RMSNorm":
        args.append("--normalization RMSNorm --position-embedding-type rope --disable-bias-linear")
    if shape["untie"]:
        args.append("--untie-embeddings-and-output-weights")
    if shape["vocab"] == 50257:
        args.append("--tokenizer-type GPT2BPETokenizer")
    else:
        args.append(f"--tokenizer-type NullTokenizer --vocab-size {shape['vocab']}")
    if divisible_by != 128:
        args.append(f"--make-vocab-size-divisible-by {divisible_by}")
    if vpp is not None:
        args.append(f"--num-layers-per-virtual-pipeline-stage {shape['layers'] // p // vpp}")
    if sp:
        args.append("--sequence-parallel")
    if dist_opt:
        args.append("--use-distributed-optimizer")
    if recompute == "selective":
        args.append("--recompute-granularity selective")
    elif recompute == "full":
        args.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    return " ".join(args)


def namespace(shape, t, p, vpp, sp, dist_opt, recompute, mbs, world, padded_vocab):
    """The attributes theoretical_memory_usage.py reads, as Megatron's parser leaves them."""
    hidden, heads = shape["hidden"], shape["heads"]
    if "ffn" in shape:
        ffn = shape["ffn"]
    elif shape["swiglu"]:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64
    else:
        ffn = 4 * hidden
    return Namespace(
        kv_channels=shape.get("kv_channels", hidden // heads), num_attention_heads=heads,
        hidden_size=hidden, group_query_attention=shape.get("groups") is not None,
        num_query_groups=shape.get("groups") or 1, num_experts=None, swiglu=shape["swiglu"],
        moe_shared_expert_intermediate_size=None, moe_layer_freq=1, moe_ffn_hidden_size=None,
        mtp_num_layers=None, normalization=shape["norm"], multi_latent_attention=False,
        padded_vocab_size=padded_vocab, untie_embeddings_and_output_weights=shape["untie"],
        ffn_hidden_size=ffn, moe_latent_size=None, moe_router_topk=2,
        add_bias_linear=shape["norm"] != "RMSNorm", expert_tensor_parallel_size=t,
        expert_model_parallel_size=1, pipeline_model_parallel_size=p, world_size=world,
        tensor_model_parallel_size=t, use_distributed_optimizer=dist_opt,
        data_parallel_size=world // (t * p), seq_length=shape["seq"], micro_batch_size=mbs,
        num_layers=shape["layers"], virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=sp, recompute_granularity=None if recompute == "none" else recompute,
        hybrid_layer_pattern=None,
    )


def cases():
    """The grid: every shape at every valid TP x PP in {1,2,4,8}^2, each with options rotated so
    that SP on/off, the distributed optimizer on/off, recompute none/selective/full, interleaved
    schedules and fewer micro-batches than stages all occur, then targeted extras."""
    i = 0
    for name, shape in SHAPES:
        for t in (1, 2, 4, 8):
            for p in (1, 2, 4, 8):
                for variant in range(2):
                    i += 1
                    sp = t > 1 and (i // 2 + variant) % 2 == 0
                    dist_opt = (i + variant) % 3 != 0
                    recompute = ("none", "selective", "full")[(i // 4 + variant) % 3]
                    mbs = 1 + (i % 2)
                    d = (1, 2, 4, 8)[(i + variant) % 4]
                    vpp = None
                    if p > 2 and variant == 1:
                        per_stage = shape["layers"] // p
                        vpp = next((v for v in (4, 2) if per_stage % v == 0 and per_stage >= v),
                                   None)
                    if p > 1 and vpp is None and variant == 1:
                        m = max(1, p // 2)       # fewer micro-batches than stages
                    else:
                        m = 2 * p
                    divisible_by = 64 if i % 7 == 0 else 128
                    if valid(shape, t, p, vpp, m):
                        yield name, shape, t, p, vpp, sp, dist_opt, recompute, mbs, d, m, divisible_by


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tmu, vocab_utils = load_megatron(sys.argv[1])
    out = []
    for name, shape, t, p, vpp, sp, dist_opt, recompute, mbs, d, m, divisible_by in cases():
        world = t * p * d
        gbs = m * mbs * d
        padded = vocab_utils.calculate_padded_vocab_size(shape["vocab"], divisible_by, t,
                                                         logging_enabled=False)
        args = namespace(shape, t, p, vpp, sp, dist_opt, recompute, mbs, world, padded)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            weight_mb, activation_mb, total_mb = tmu.report_theoretical_memory(
                args, num_microbatches=m)
        out.append({
            "name": f"{name} t{t} p{p}" + (f" vpp{vpp}" if vpp else "") + f" d{d} m{m}"
                    + (" sp" if sp else "") + (" distopt" if dist_opt else "") + f" {recompute}",
            "megatron_args": flags(shape, t, p, vpp, sp, dist_opt, recompute, mbs, gbs,
                                   divisible_by),
            "world_size": world,
            "padded_vocab_size": padded,
            "num_microbatches": m,
            "weight_and_optimizer_mb": weight_mb,
            "activation_mb": activation_mb,
            "total_mb": total_mb,
            "printed": printed.getvalue().strip().splitlines()[-1],
        })
    doc = {
        "source": "Megatron-LM megatron/training/theoretical_memory_usage.py, evaluated by "
                  "planner/tests/megatron/generate_calculator_cases.py",
        "megatron_commit": MEGATRON_COMMIT,
        "cases": out,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
