#!/usr/bin/env bash
# Packs the GPU kit: everything bench/gpu_check.sh needs on a lent GPU machine that has no
# cargo, in one git-ignored folder of the repo root that the device tool's `carry` can name.
#
#   bench/gpu_kit_pack.sh [--kit DIR] [--no-wheels | --wheels-only]
#
# --wheels-only packs the wheels and PREDICTIONS alone (no cargo build): all that
# bench/predicted_run.py needs on the GPU machine (issue 35; transformers, accelerate,
# nvidia-ml-py and psutil are in the GPU image already).
#
#   .gpukit/bin/dsplan           release build, stripped
#   .gpukit/bin/dsplan-mpi       the same with the `mpi` feature (links libmpi.so.40: Open MPI 4.x)
#   .gpukit/tests/cuda_kernels   the GPU test binaries (`cargo test --release --no-run`),
#   .gpukit/tests/cuda_train       stripped; run there with --ignored
#   .gpukit/tests/cuda_probe
#   .gpukit/tests/cuda_world       (the step's collectives: NCCL at W=1, 2 ranks sharing a GPU)
#   .gpukit/wheels/*.whl         deepspeed 0.19.8 (pure Python, built here from its sdist) and
#                                what it needs that the GPU image lacks: hjson, pydantic,
#                                pydantic-core (cp312 manylinux), annotated-types,
#                                typing-inspection, typing-extensions
#   .gpukit/COMMIT, MANIFEST     the commit built and every file with its size
#   .gpukit/PREDICTIONS          {path: commit that added it} of every committed, unedited
#                                bench/predictions/<date>-round*.json (the GPU machine has no
#                                git history: bench/predicted_run.py reads prediction_commit here)
#
# It prints the kit's size: the kit plus the repository's tracked files must stay under the
# device tool's 64 MiB.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
kit="$root/.gpukit" wheels=yes binaries=yes
while (($#)); do
    case "$1" in
        --kit) kit="$2"; shift 2 ;;
        --no-wheels) wheels=no; shift ;;
        --wheels-only) binaries=no; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
DEEPSPEED_VERSION=0.19.8
PYDANTIC_VERSION=2.12.5
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

cd "$root"
rm -rf "$kit"
mkdir -p "$kit/wheels"

if [[ $binaries == yes ]]; then
mkdir -p "$kit/bin" "$kit/tests"
echo "== building dsplan with the mpi feature (release): bin/dsplan-mpi"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build --release --bin dsplan --features mpi
cp "$target/release/dsplan" "$kit/bin/dsplan-mpi"
echo "== building dsplan and the GPU test binaries (release)"
cargo build --release --bin dsplan
cargo test --release -p dsplan-executor --test cuda_kernels --test cuda_train --test cuda_probe \
    --test cuda_world \
    --no-run --message-format=json 2>/dev/null >"$kit/.build.json"
cp "$target/release/dsplan" "$kit/bin/dsplan"
python3 - "$kit/.build.json" "$kit/tests" <<'PY'
import json, shutil, sys
for line in open(sys.argv[1]):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe and msg["target"]["kind"] == ["test"]:
        shutil.copy(exe, f"{sys.argv[2]}/{msg['target']['name']}")
PY
rm "$kit/.build.json"
strip "$kit/bin/dsplan" "$kit/bin/dsplan-mpi" "$kit"/tests/*
for t in cuda_kernels cuda_train cuda_probe cuda_world; do
    [[ -x "$kit/tests/$t" ]] || { echo "error: test binary $t was not built" >&2; exit 1; }
done
fi

if [[ $wheels == yes ]]; then
    echo "== wheels (deepspeed $DEEPSPEED_VERSION built from its sdist; Python 3.12 manylinux for the rest)"
    tmp="$(mktemp -d)"
    python3 -m pip download -q --no-deps --no-binary=:all: "deepspeed==$DEEPSPEED_VERSION" -d "$tmp"
    python3 -m pip wheel -q --no-deps "$tmp"/deepspeed-*.tar.gz -w "$kit/wheels"
    rm -rf "$tmp"
    fetch() {
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${PLATFORMS[@]}" -d "$kit/wheels" "$@"
    }
    fetch "pydantic==$PYDANTIC_VERSION"
    core="$(unzip -p "$kit"/wheels/pydantic-"$PYDANTIC_VERSION"-*.whl '*/METADATA' \
        | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p' | head -n 1)"
    fetch "pydantic-core==$core" hjson annotated-types typing-inspection typing-extensions
fi

git rev-parse --short HEAD >"$kit/COMMIT"
python3 - "$kit/PREDICTIONS" <<'PY'
import glob, json, subprocess, sys
commits = {}
for path in sorted(glob.glob("bench/predictions/????-??-??-round*.json")):
    edited = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path]).returncode != 0
    added = subprocess.run(["git", "log", "--diff-filter=A", "-n", "1", "--format=%H", "--", path],
                           capture_output=True, text=True).stdout.strip()
    if added and not edited:
        commits[path] = added
    else:
        print(f"note: {path} is {'edited' if edited else 'not committed'}: not in PREDICTIONS")
json.dump(commits, open(sys.argv[1], "w"), indent=1)
print(f"== PREDICTIONS: {len(commits)} committed prediction file(s)")
PY
(cd "$kit" && find . -type f -printf '%s\t%p\n' | sort -k2) >"$kit/MANIFEST"
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
size=$(du -sb "$kit" | cut -f1)
echo "== kit: $kit"
sed 's/^/   /' "$kit/MANIFEST"
printf '== kit %.1f MiB + tracked files %.1f MiB = %.1f MiB of the 64 MiB the device tool carries\n' \
    "$(echo "$size / 1048576" | bc -l)" "$(echo "$tracked / 1048576" | bc -l)" \
    "$(echo "($size + $tracked) / 1048576" | bc -l)"
if ((size + tracked > 64 * 1048576)); then
    echo "error: over 64 MiB" >&2
    exit 1
fi
