#!/usr/bin/env bash
# dsplan's CUDA training of GPT-2 124M in bf16 against PyTorch eager and torch.compile on the
# same GPU, in the same run (issue 7's comparison; see bench/README.md, "GPU").
#
#   bench/gpu_vs_pytorch.sh [--dsplan-bin PATH] [--python PATH] [--batch B] [--seq T]
#                           [--steps S] [--warmup W] [--stages "0 1 2 3"] [--out DIR]
#
# On a machine with cargo it builds `dsplan` in release; on a lent GPU machine (no cargo) pass
# the binary built elsewhere with --dsplan-bin. PyTorch comes from --python (default: python3;
# it needs torch with CUDA and transformers). For every stage it writes a config (bf16, micro
# batch B, accumulation 1, AdamW lr 1e-4, clipping 1.0), runs `dsplan run --device cuda
# --model gpt2` with --metrics, and takes the median tokens/s of the steps after the warm-up
# (the first steps include NVRTC compilation); then PyTorch eager and compile. It prints one
# table: tokens/s, MFU and peak memory of each, and dsplan's ratio to each PyTorch mode.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
bin="" python="python3" batch=16 seq=1024 steps=20 warmup=5 stages="0 1 2 3" out=""
while (($#)); do
    case "$1" in
        --dsplan-bin) bin="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        --batch) batch="$2"; shift 2 ;;
        --seq) seq="$2"; shift 2 ;;
        --steps) steps="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --stages) stages="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z "$bin" ]]; then
    echo "== building dsplan (release)"
    (cd "$root" && cargo build --release)
    bin="${CARGO_TARGET_DIR:-$root/target}/release/dsplan"
fi
out="${out:-$(mktemp -d)}"
mkdir -p "$out"
echo "== results in $out"

total=$((warmup + steps))
for stage in $stages; do
    config="$out/zero${stage}_bf16.json"
    cat >"$config" <<EOF
{
  "train_micro_batch_size_per_gpu": $batch,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "bf16": { "enabled": true },
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01 } },
  "zero_optimization": { "stage": $stage }
}
EOF
    echo "== dsplan stage $stage"
    "$bin" run "$config" --device cuda --model gpt2 --steps "$total" --seq-len "$seq" \
        --metrics "$out/dsplan_stage${stage}.jsonl" --format json >"$out/dsplan_stage${stage}.json"
done

for mode in eager compile; do
    echo "== torch $mode"
    (cd "$here" && "$python" torch_gpu_step.py --mode "$mode" --batch "$batch" --seq "$seq" \
        --steps "$steps" --warmup "$warmup") | tee "$out/torch_${mode}.log"
    tail -n 1 "$out/torch_${mode}.log" >"$out/torch_${mode}.json"
done

python3 - "$out" "$warmup" "$stages" <<'EOF'
import json, statistics, sys
out, warmup, stages = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
torch = {m: json.load(open(f"{out}/torch_{m}.json")) for m in ("eager", "compile")}
print(f"\ndevice: {torch['eager']['device']}, GPT-2 124M bf16, B={torch['eager']['batch']} T={torch['eager']['seq']}")
print(f"{'run':<16} {'tokens/s':>10} {'MFU':>7} {'peak mem':>10} {'vs eager':>9} {'vs compile':>10}")
def row(name, rate, mfu, mem):
    mfu_text = f"{100 * mfu:.1f}%" if mfu else "-"
    mem_text = f"{mem / 2**30:.2f} GiB" if mem else "-"
    print(f"{name:<16} {rate:>10.0f} {mfu_text:>7} {mem_text:>10} "
          f"{rate / torch['eager']['tokens_per_s']:>8.2f}x {rate / torch['compile']['tokens_per_s']:>9.2f}x")
for mode in ("eager", "compile"):
    t = torch[mode]
    row(f"torch {mode}", t["tokens_per_s"], t["mfu"], t["peak_memory_bytes"])
for stage in stages:
    summary = json.load(open(f"{out}/dsplan_stage{stage}.json"))
    steps = [json.loads(l) for l in open(f"{out}/dsplan_stage{stage}.jsonl")]
    rate = statistics.median(s["tokens_per_s"] for s in steps[warmup:])
    per_token = torch["eager"]["model_flops_per_token"]
    peak = torch["eager"]["peak_bf16_flops"]
    mfu = rate * per_token / peak if peak else None
    mem = summary.get("device_memory", {}).get("peak_total") if isinstance(summary.get("device_memory"), dict) else None
    row(f"dsplan stage {stage}", rate, mfu, mem)
EOF
