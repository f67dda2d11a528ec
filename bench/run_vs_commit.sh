#!/usr/bin/env bash
# `dsplan run` now against `dsplan run` at an earlier commit, on the CPU, in paired rounds that
# alternate which binary goes first: GPT-2 124M, micro-batch 4 x 256 tokens, fp32, for each
# ZeRO setting in --cases (stage:world). Each round's figure is the median per-step tokens/s
# of the run's --metrics (the first step, which allocates, left out). Prints every round and
# the median ratio new / old per case. Both binaries are built in release here (the old one
# in a detached worktree under target/).
#
#   bench/run_vs_commit.sh BASE_COMMIT [--rounds R] [--steps S] [--cases "0:1 2:2 3:2"]
#                          [--old-bin PATH]   (a release dsplan already built at BASE_COMMIT)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
[[ $# -ge 1 ]] || { echo "usage: $0 BASE_COMMIT [--rounds R] [--steps S] [--cases LIST]" >&2; exit 2; }
base="$1"
shift
rounds=3
steps=4
cases="0:1 2:2 3:2"
old_bin=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --steps) steps="$2"; shift 2 ;;
        --cases) cases="$2"; shift 2 ;;
        --old-bin) old_bin="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

target="${CARGO_TARGET_DIR:-$root/target}"
old_tree="$target/run_vs_commit/$base"
echo "== building dsplan at HEAD and at $base (release)"
(cd "$root" && cargo build --release --bin dsplan)
if [[ -z "$old_bin" ]]; then
    if [[ ! -d "$old_tree" ]]; then
        git -C "$root" worktree add --detach "$old_tree" "$base"
    fi
    (cd "$old_tree" && CARGO_TARGET_DIR="$target/run_vs_commit/target" cargo build --release --bin dsplan)
    old_bin="$target/run_vs_commit/target/release/dsplan"
fi
new_bin="$target/release/dsplan"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The config of one case: fp32 AdamW, micro-batch 4 per rank, no accumulation.
config() {
    local stage="$1" world="$2"
    cat > "$work/s$stage-w$world.json" <<JSON
{"train_batch_size": $((4 * world)), "train_micro_batch_size_per_gpu": 4,
 "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $stage}}
JSON
    echo "$work/s$stage-w$world.json"
}

# Median per-step tokens/s of one run, its first step left out.
tokens_per_s() {
    local bin="$1" file="$2" world="$3"
    "$bin" run "$file" --model gpt2 --seq-len 256 --steps "$steps" --world-size "$world" \
        --device cpu --metrics "$work/metrics.jsonl" --force > /dev/null 2>&1
    python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%.1f" % statistics.median(r["tokens_per_s"] for r in rows[1:]))' "$work/metrics.jsonl"
}

for case in $cases; do
    stage="${case%%:*}"
    world="${case##*:}"
    file="$(config "$stage" "$world")"
    ratios=()
    for ((r = 1; r <= rounds; r++)); do
        if ((r % 2)); then
            new=$(tokens_per_s "$new_bin" "$file" "$world")
            old=$(tokens_per_s "$old_bin" "$file" "$world")
        else
            old=$(tokens_per_s "$old_bin" "$file" "$world")
            new=$(tokens_per_s "$new_bin" "$file" "$world")
        fi
        ratio=$(python3 -c "print(f'{$new / $old:.3f}')")
        ratios+=("$ratio")
        echo "stage $stage W=$world round $r: old $old tokens/s, new $new tokens/s, new/old $ratio"
    done
    median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "stage $stage W=$world: median new/old = $median (over $rounds rounds, $steps steps each)"
done
