#!/usr/bin/env bash
# dsplan's CPU training step (GPT-2 or a LLaMA-shaped decoder) against PyTorch's, in paired rounds (see bench/README.md).
#
#   bench/cpu_vs_pytorch.sh [--preset gpt2|tiny|llama-100m] [--batch B] [--seq T] [--threads N]
#                           [--rounds R] [--steps S] [--warmup W] [--torch-model hf|nn]
#                           [--json-out FILE]
#
# 1. builds the `train_bench` example in release;
# 2. makes sure bench/.venv has torch 2.15.0 and numpy (and transformers 5.23.0 for the
#    default --torch-model hf), installing them from PyPI if not: torch's Linux wheel pulls
#    its CUDA libraries too, about 5 GB on disk and several minutes the first time;
# 3. runs bench/cpu_vs_pytorch.py, which alternates fresh dsplan and PyTorch processes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
torch_model=hf
for ((i = 1; i <= $#; i++)); do
    if [[ "${!i}" == "--torch-model" ]]; then
        j=$((i + 1))
        torch_model="${!j:-hf}"
    fi
done

echo "== building train_bench (release)"
(cd "$root" && cargo build --release -p dsplan-executor --example train_bench)
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bin="$target_dir/release/examples/train_bench"

need="torch==2.15.0 numpy"
check='import torch, numpy; assert torch.__version__.split("+")[0] == "2.15.0", torch.__version__'
if [[ "$torch_model" == "hf" ]]; then
    need="$need transformers==5.23.0"
    check="$check; import transformers; assert transformers.__version__ == '5.23.0'"
fi
if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "== installing $need into $venv from PyPI"
    echo "   (torch's wheel brings its CUDA libraries: about 5 GB and several minutes)"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --progress-bar off $need
fi

echo "== paired rounds"
python3 "$here/cpu_vs_pytorch.py" --dsplan-bin "$bin" --python "$venv/bin/python" "$@"
