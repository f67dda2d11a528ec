#!/usr/bin/env bash
# Ranks as processes vs ranks as threads: tokens/s of `dsplan run` with 2 ranks as threads
# (--world-size 2) and as 2 processes under mpirun (feature `mpi`), in paired, alternating
# rounds on the same machine, for tiny-gpt2 and GPT-2 124M. Prints each round and the median
# ratio processes / threads per model.
#
#   bench/ranks_overhead.sh [--rounds R] [--steps S] [--models "tiny-gpt2 gpt2"]
#
# Needs Open MPI (`apt-get install libopenmpi-dev openmpi-bin libclang-dev`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
rounds=3
steps=4
models="tiny-gpt2 gpt2"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --steps) steps="$2"; shift 2 ;;
        --models) models="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

echo "== building dsplan --features mpi (release)"
(cd "$root" && cargo build --release --features mpi --bin dsplan)
bin="${CARGO_TARGET_DIR:-$root/target}/release/dsplan"
mpirun=(mpirun)
if mpirun --version | grep -q "Open MPI"; then
    mpirun+=(--allow-run-as-root --oversubscribe)
fi
config="$root/configs/zero2_fp16.json"

# tokens/s of the JSON summary on stdin.
tokens_per_s() {
    python3 -c 'import json, sys
def find(v):
    if isinstance(v, dict):
        if "tokens_per_s" in v: return v["tokens_per_s"]
        for x in v.values():
            r = find(x)
            if r is not None: return r
print(find(json.load(sys.stdin)))'
}

for model in $models; do
    ratios=()
    for ((r = 1; r <= rounds; r++)); do
        args=(run "$config" --model "$model" --steps "$steps" --seq-len 64 --device cpu --format json)
        threads=$("$bin" "${args[@]}" --world-size 2 2>/dev/null | tokens_per_s)
        processes=$("${mpirun[@]}" -np 2 "$bin" "${args[@]}" 2>/dev/null | tokens_per_s)
        ratio=$(python3 -c "print(f'{$processes / $threads:.3f}')")
        ratios+=("$ratio")
        echo "$model round $r: threads $threads tokens/s, processes $processes tokens/s, ratio $ratio"
    done
    median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$model: median processes/threads = $median"
done
