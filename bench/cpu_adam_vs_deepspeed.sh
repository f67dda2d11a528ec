#!/usr/bin/env bash
# dsplan's offload Adam (executor/src/optim/offload) against DeepSpeedCPUAdam, paired in one
# run on the same cores (see bench/cpu_adam_vs_deepspeed.py and bench/README.md).
#
#   bench/cpu_adam_vs_deepspeed.sh [--params N] [--threads T] [--rounds R] [--cycles C]
#                                  [--warmup W] [--json-out FILE]
#
# 1. builds the `offload_adam_bench` example in release;
# 2. makes sure bench/.venv has torch 2.15.0, deepspeed 0.19.8, ninja and py-cpuinfo,
#    installing them from PyPI if not (torch's wheel brings its CUDA libraries: about 5 GB);
# 3. runs the paired rounds with OMP_NUM_THREADS = T. DeepSpeed JIT-builds its cpu_adam op
#    with ninja and g++ the first time (-march=native: AVX-512 on a CPU that has it; about
#    45 s on 2 idle cores), cached in bench/.venv/torch_extensions (its own, so that another
#    DeepSpeed install's build of the same op does not invalidate it or hold its lock).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
threads=2
for ((i = 1; i <= $#; i++)); do
    if [[ "${!i}" == "--threads" ]]; then
        j=$((i + 1))
        threads="${!j:-2}"
    fi
done

echo "== building offload_adam_bench (release)"
(cd "$root" && cargo build --release -p dsplan-executor --example offload_adam_bench)
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bin="$target_dir/release/examples/offload_adam_bench"

need="torch==2.15.0 numpy deepspeed==0.19.8 ninja py-cpuinfo"
check='import torch, numpy, deepspeed, ninja, cpuinfo
assert torch.__version__.split("+")[0] == "2.15.0", torch.__version__
assert deepspeed.__version__ == "0.19.8", deepspeed.__version__'
if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "== installing $need into $venv from PyPI"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --progress-bar off $need
fi

echo "== paired rounds"
# ninja must be on PATH for DeepSpeed's JIT build.
PATH="$venv/bin:$PATH" TORCH_EXTENSIONS_DIR="$venv/torch_extensions" OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" \
    "$venv/bin/python" "$here/cpu_adam_vs_deepspeed.py" --dsplan-bin "$bin" "$@"
