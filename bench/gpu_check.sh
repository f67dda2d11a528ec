#!/usr/bin/env bash
# The GPU kit: everything issue 11 (item 5) and issue 16 ask of a lent GPU, in one command of
# under 8 minutes on a machine without cargo. See bench/README.md, "The GPU kit".
#
#   bench/gpu_check.sh [--dry] [--kit DIR] [--budget SECONDS] [--keep DIR] [--parts LIST]
#                      [--ds-width N] [--ds-runs MODEL:STAGE:OFFLOAD,...]
#
# --parts picks groups (default all: check,stages,torch,profile,tests,mpi,w2,llama,ds; `report`
# always runs; `tc` alone names stage0_tc..stage3_tc, which `stages` includes),
# so a rerun after fixes spends device time only where it must. Order: report and check; the
# timed runs alone on the GPU (stages, torch); then, sharing the GPU because nothing there is
# timed against a target, the tests, the W = 2 and Llama runs, and DeepSpeed's memory runs
# (--ds-width processes at a time, default 4; --ds-runs names a subset, e.g.
# gpt2-medium:1:none,gpt2:2:cpu).
#
# Parts, each time-boxed (and all inside --budget, default 470 s) so one failure or hang does
# not eat the rest; a part's status (ok, failed, timeout, skipped) goes into the results:
#   report      `dsplan report` (text and JSON)
#   check       `dsplan report --check`: every kernel vs its CPU reference in every precision,
#               and one training step vs the CPU backend
#   stage0..3   `dsplan run --device cuda --model gpt2 --attention-kernel scalar` (the parts run
#               the scalar kernels, the default before 2026-11-27; stage0_tc the tensor-core
#               ones, now the default for 16-bit GPU runs), bf16, micro-batch 16 x 1024, W=1:
#               tokens/s (median after the warm-up), MFU, measured vs planned device memory
#   stage0_tc..stage3_tc  the same with --attention-kernel tensor-core (attention_tc.cu; skipped dry)
#   w2_stage1..3  the same at --world-size 2 (micro-batch 8 per rank): two thread ranks
#               sharing GPU 0, collectives staged through host memory; tokens/s, memory
#               (run last, after the DeepSpeed memory runs, so issue 16's parts come first)
#   llama, llama_ckpt  `dsplan run --device cuda` on a ~100M LLaMA (GQA, head 64), bf16 stage 0,
#               without and with activation checkpointing (dsplan_llama*.json in the work dir)
#   torch_*     PyTorch eager and torch.compile on the same GPU (bench/torch_gpu_step.py)
#   profile     Nsight Compute's duration of every kernel of one step of stage 0, then the same
#               with --attention-kernel tensor-core as profile_tc (ncu_summary.py:
#               where the step's GPU time goes, and the sum against the step's wall time)
#   mpi_*       issue 12: 2 processes sharing the GPU under mpirun (bin/dsplan-mpi, the `mpi`
#               feature), stages 1-3, against 2 thread ranks: the saved models byte for byte
#   tests_*     the ignored GPU tests (test binaries built and stripped by gpu_kit_pack.sh),
#               run while the DeepSpeed runs are going (they time nothing); tests_cuda_world
#               is W = 2: two thread ranks sharing the GPU run the plan's collectives through
#               the host-staged adapter at stages 1-3, and NCCL's device collectives at W = 1
#   ds_*        DeepSpeed 0.19.8 memory runs (bench/ds_memory.py): gpt2 and gpt2-medium, bf16,
#               stages 0-3 and stages 2-3 with offload_optimizer cpu, max_memory_allocated and
#               max_memory_reserved after 5 steps, next to `dsplan estimate` of the same config
# Then one results JSON: bench/results/gpu/<date>-<device>.json, copied to $OUT when set.
#
# --dry runs every part here on the CPU: dsplan parts with --device cpu on tiny-gpt2,
# `report --check` must fail cleanly (exit 2), the test binaries list their tests and run their
# host tests, the DeepSpeed configs are written and estimated, and torch/DeepSpeed runs are
# skipped with a line when torch is absent. Its results go to the work directory (and $OUT),
# never to bench/results/gpu/.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
mode=gpu kit="$root/.gpukit" budget=470 keep="" ds_width=4 ds_runs=""
parts="check,stages,torch,profile,tests,mpi,w2,llama,ds"
while (($#)); do
    case "$1" in
        --dry) mode=dry; shift ;;
        --kit) kit="$2"; shift 2 ;;
        --budget) budget="$2"; shift 2 ;;
        --keep) keep="$2"; shift 2 ;;
        --parts) parts="$2"; shift 2 ;;
        --ds-width) ds_width="$2"; shift 2 ;;
        --ds-runs) ds_runs="$2"; shift 2 ;;
        *) echo "unknown option $1 (see the head of $0)" >&2; exit 2 ;;
    esac
done
python="${PYTHON:-python3}"
if [[ $mode == dry && -z "${PYTHON:-}" && -x "$here/.venv/bin/python" ]]; then
    python="$here/.venv/bin/python"  # has torch: the dry run exercises the torch parts too
fi
start=$(date +%s)
deadline=$((start + budget))
work="${keep:-$(mktemp -d /tmp/dsplan-gpu-check.XXXXXX)}"
mkdir -p "$work/ds"
: >"$work/parts.tsv"
export DSPLAN_KERNEL_CACHE="$work/kernel-cache"
echo "== gpu_check ($mode) in $work, budget ${budget}s"

# --- the binaries: the packed kit, else (dry mode only) this checkout's build
bin="$kit/bin/dsplan"
tests_dir="$kit/tests"
if [[ ! -x "$bin" ]]; then
    if [[ $mode == dry ]]; then
        for candidate in "$root/target/release/dsplan" "$root/target/debug/dsplan"; do
            [[ -x "$candidate" ]] && { bin="$candidate"; break; }
        done
        echo "note: no packed kit at $kit; using $bin"
    fi
    [[ -x "$bin" ]] || { echo "error: no dsplan binary at $kit/bin (run bench/gpu_kit_pack.sh)" >&2; exit 2; }
fi
commit="$(cat "$kit/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# --- one part: part NAME BOX [expect=RC] CMD...; output in $work/NAME.log
part() {
    local name="$1" box="$2"; shift 2
    local expect=0
    if [[ "$1" == expect=* ]]; then expect="${1#expect=}"; shift; fi
    local now remain limit t0 rc status note=""
    now=$(date +%s)
    remain=$((deadline - now - 15))
    if ((remain < 5)); then
        printf '%s\tskipped\t0\t-1\tout of time (budget %ss)\n' "$name" "$budget" >>"$work/parts.tsv"
        echo "== $name: skipped, out of time"
        return 1
    fi
    limit=$((box < remain ? box : remain))
    t0=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$work/$name.log" 2>&1
    rc=$?
    if ((rc == expect)); then status=ok
    elif ((rc == 124 || rc == 137)); then status=timeout; note="after ${limit}s"
    else status=failed; note="exit $rc, expected $expect"
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "$rc" "$note" >>"$work/parts.tsv"
    echo "== $name: $status ($(($(date +%s) - t0)) s) $note"
    if [[ $status != ok ]]; then
        # Why: the panics' first lines (a test binary prints them before its summary), then the end.
        grep -A 3 "panicked at" "$work/$name.log" | head -n 24 | sed 's/^/   ! /'
        tail -n 8 "$work/$name.log" | sed 's/^/   | /'
    fi
    [[ $status == ok ]]
}
skip() {
    printf '%s\tskipped\t0\t-1\t%s\n' "$1" "$2" >>"$work/parts.tsv"
    echo "== $1: skipped, $2"
}

# --- Python side: the carried wheels, CUDA libraries from NVIDIA's wheels on the loader path
if compgen -G "$kit/wheels/*.whl" >/dev/null && [[ $mode == gpu ]]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$work/site" "$kit"/wheels/*.whl >"$work/pip.log" 2>&1 \
        && export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" \
        || { echo "note: installing the carried wheels failed:"; tail -n 5 "$work/pip.log"; }
fi
libs="$("$python" - <<'PY' 2>/dev/null
import glob, site, sys
dirs = []
for base in list(getattr(site, "getsitepackages", lambda: [])()) + sys.path:
    dirs += sorted(glob.glob(base + "/nvidia/*/lib"))
print(":".join(dict.fromkeys(dirs)))
PY
)"
# cudarc's loader tries libnccl.so but NCCL's wheel ships libnccl.so.2 only.
mkdir -p "$work/lib"
for d in ${libs//:/ }; do
    [[ -e "$d/libnccl.so.2" && ! -e "$work/lib/libnccl.so" ]] && ln -s "$d/libnccl.so.2" "$work/lib/libnccl.so"
done
export LD_LIBRARY_PATH="$work/lib${libs:+:$libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
have_torch=no have_cuda_torch=no have_ds=no
"$python" -c "import torch" 2>/dev/null && have_torch=yes
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && have_cuda_torch=yes
"$python" -c "import deepspeed" >/dev/null 2>&1 && have_ds=yes
echo "torch: $have_torch (CUDA: $have_cuda_torch), deepspeed: $have_ds"
# The image sets TORCH_CUDA_ARCH_LIST with an arch suffix ("9.0a"), which DeepSpeed 0.19.8's
# JIT builder cannot parse (seen on an H200, 2026-11-26): name the device's own capability.
if [[ $mode == gpu && $have_cuda_torch == yes ]]; then
    echo "TORCH_CUDA_ARCH_LIST was '${TORCH_CUDA_ARCH_LIST:-}'"
    TORCH_CUDA_ARCH_LIST="$("$python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
    export TORCH_CUDA_ARCH_LIST
    echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
fi

# DeepSpeed's FusedAdam and CPUAdam JIT-compile (nvcc, ninja) in the background from the
# start, so the memory runs later find them built.
jit_pid=""
if [[ $mode == gpu && $have_ds == yes && $have_cuda_torch == yes ]]; then
    export TORCH_EXTENSIONS_DIR="$work/torch_extensions"
    # Two processes (not threads: DeepSpeed's builder edits os.environ while it builds).
    ds_build() {
        "$python" - "$1" <<'PY2'
import os, sys, time, torch
major, minor = torch.cuda.get_device_capability()
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
t = time.time()
from deepspeed.ops import op_builder
getattr(op_builder, sys.argv[1])().load()
print(f"deepspeed {sys.argv[1]} built in {time.time() - t:.0f} s")
PY2
    }
    ( ds_build FusedAdamBuilder >"$work/ds_jit.log" 2>&1 &
      ds_build CPUAdamBuilder >"$work/ds_jit_cpu.log" 2>&1
      wait ) &
    jit_pid=$!
fi

# --- which parts run (--parts): a rerun after fixes names only what it needs
want() { [[ ",$parts," == *",$1,"* ]]; }
echo "== parts: $parts"

# --- 1. the report, and the check
part report 30 "$bin" report --format json && cp "$work/report.log" "$work/report.json"
"$bin" report 2>&1 | tee "$work/report.txt" | tail -n 12
if ! want check; then
    skip check "not in --parts"
elif [[ $mode == gpu ]]; then
    part check 120 "$bin" report --check --format json
else
    part check 30 expect=2 "$bin" report --check --format json
fi
# The JSON is on stdout, progress on stderr: keep the JSON object alone.
"$python" - "$work/check.log" "$work/check.json" <<'PY2'
import json, sys
try:
    text = open(sys.argv[1], errors="replace").read()
except OSError:
    text = ""
start = text.find("{\n")
try:
    obj, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
except ValueError:
    obj = None
json.dump(obj or {"check": {"status": "not-run", "reason": "no JSON in check.log"}}, open(sys.argv[2], "w"))
PY2

# --- 2. dsplan training: GPT-2 124M bf16 at stages 0-3 (dry: tiny-gpt2 on the CPU). Configs
# first (the Llama and W = 2 parts derive theirs from them), then the runs; a stage 0 that hangs
# skips stages 1-3 (they would hang the same way and eat the budget), one that fails fast does not.
if [[ $mode == gpu ]]; then
    batch=16 seq=1024 warmup=3 timed=7 model=gpt2 device=cuda
else
    batch=2 seq=64 warmup=1 timed=2 model=tiny-gpt2 device=cpu
fi
for stage in 0 1 2 3; do
    cat >"$work/zero${stage}_bf16.json" <<JSON
{
  "train_micro_batch_size_per_gpu": $batch,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "bf16": { "enabled": true },
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01 } },
  "zero_optimization": { "stage": $stage }
}
JSON
done
stage_hung=""
for stage in 0 1 2 3; do
    if ! want stages; then skip "stage$stage" "not in --parts"; continue; fi
    if [[ -n $stage_hung ]]; then skip "stage$stage" "stage 0 timed out"; continue; fi
    part "stage$stage" 60 bash -c "'$bin' run '$work/zero${stage}_bf16.json' --device $device --model $model --attention-kernel scalar \
        --steps $((warmup + timed)) --seq-len $seq --metrics '$work/dsplan_stage$stage.jsonl' \
        --format json >'$work/dsplan_stage$stage.json'"
    [[ $stage == 0 ]] && grep -q $'^stage0\ttimeout' "$work/parts.tsv" && stage_hung=yes
done
# stage0_tc..stage3_tc: the stages again with --attention-kernel tensor-core (attention_tc.cu:
# flash attention on tensor cores, the default for 16-bit GPU runs since 2026-11-27), each its
# own part so a failure or a wrong loss does not touch the scalar figures. CUDA-only: the dry
# run skips them with a line.
for stage in 0 1 2 3; do
    if ! want stages && ! want tc; then
        skip "stage${stage}_tc" "not in --parts"
    elif [[ $mode != gpu ]]; then
        skip "stage${stage}_tc" "dry run: --attention-kernel tensor-core is CUDA-only (refused with --device cpu)"
    elif [[ -n $stage_hung ]]; then
        skip "stage${stage}_tc" "stage 0 timed out"
    else
        part "stage${stage}_tc" 60 bash -c "'$bin' run '$work/zero${stage}_bf16.json' --device cuda --model $model \
            --attention-kernel tensor-core --steps $((warmup + timed)) --seq-len $seq \
            --metrics '$work/dsplan_stage${stage}_tc.jsonl' --format json >'$work/dsplan_stage${stage}_tc.json'"
    fi
done

# --- 3. PyTorch eager and torch.compile on the same device, alone on it like dsplan's runs
for mode_name in eager compile; do
    box=$([[ $mode_name == compile ]] && echo 120 || echo 60)
    if ! want torch; then
        skip "torch_$mode_name" "not in --parts"
    elif [[ $mode == gpu && $have_cuda_torch == yes ]]; then
        part "torch_$mode_name" "$box" bash -c "cd '$here' && PYTHONUNBUFFERED=1 '$python' torch_gpu_step.py \
            --mode $mode_name --batch $batch --seq $seq --steps $timed --warmup $warmup"
    elif [[ $mode == dry && $have_torch == yes ]]; then
        part "torch_$mode_name" "$box" bash -c "cd '$here' && '$python' torch_gpu_step.py --device cpu \
            --model nn --preset tiny --mode $mode_name --batch $batch --seq $seq --steps $timed --warmup $warmup"
    elif [[ $mode == dry ]]; then
        skip "torch_$mode_name" "torch is not importable by $python here (dry run; on the GPU machine it is)"
    else
        skip "torch_$mode_name" "torch with CUDA is not importable by $python"
    fi
    [[ -f "$work/torch_$mode_name.log" ]] && tail -n 1 "$work/torch_$mode_name.log" >"$work/torch_$mode_name.json"
done

# The device's copy bandwidth (the ceiling the AdamW kernel is held against): a 4 GiB
# device-to-device copy through PyTorch, median of 20 after 3 warm-ups, bytes read + written.
if want profile && [[ $mode == gpu && $have_cuda_torch == yes ]]; then
    part copy_bandwidth 30 "$python" -c '
import json, statistics, torch
n = 1 << 30
a = torch.randn(n, device="cuda"); b = torch.empty_like(a)
times = []
for i in range(23):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
    if i >= 3: times.append(s.elapsed_time(e) / 1e3)
t = statistics.median(times)
print(json.dumps({"bytes_moved": 2 * 4 * n, "seconds": t, "bytes_per_s": 2 * 4 * n / t}))'
    tail -n 1 "$work/copy_bandwidth.log" >"$work/copy_bandwidth.json"
fi

# --- 3b. Where the step's GPU time goes: Nsight Compute times every kernel of one stage-0 step
# (clocks and caches as found: --clock-control none, --cache-control none).
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)"
if ! want profile; then
    skip profile "not in --parts"
elif [[ $mode != gpu ]]; then
    skip profile "dry run: Nsight Compute needs a GPU"
elif [[ -z $ncu_bin ]]; then
    skip profile "ncu not found"
else
    # profile: the step with --attention-kernel scalar; profile_tc: with tensor-core.
    for variant in profile profile_tc; do
        kernel=$([[ $variant == profile_tc ]] && echo tensor-core || echo scalar)
        part "$variant" 120 "$ncu_bin" --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --csv --page raw --print-units base \
            --log-file "$work/$variant.csv" "$bin" run "$work/zero0_bf16.json" --device cuda --attention-kernel $kernel \
            --model $model --steps 1 --seq-len $seq
        # The CSV is in --log-file; should ncu print it to stdout instead, the part's log has it.
        for csv in "$work/$variant.csv" "$work/$variant.log"; do
            "$python" "$here/ncu_summary.py" "$csv" --steps 1 --json-out "$work/${variant}_summary.json" \
                >"$work/${variant}_summary.txt" 2>&1 && break
        done
        head -n 25 "$work/${variant}_summary.txt"; tail -n 1 "$work/${variant}_summary.txt"
    done
fi

# --- 4. Nothing timed from here on that the targets need, so three things share the GPU:
# (a) the ignored GPU tests, (b) the W = 2 runs then the Llama runs (their memory, not their
# speed, is the point), (c) in the foreground DeepSpeed's memory runs, --ds-width at a time
# (each process's caching allocator counts only its own tensors, so the peaks do not mix).
run_tests() {
    local t
    for t in cuda_kernels cuda_train cuda_world cuda_probe; do
        if ! want tests; then
            skip "tests_$t" "not in --parts"
        elif [[ ! -x "$tests_dir/$t" ]]; then
            skip "tests_$t" "no test binary $tests_dir/$t (run bench/gpu_kit_pack.sh)"
        elif [[ $mode == gpu && $t != cuda_probe ]]; then
            # The two-GPU tests (a stuck or abandoned NCCL collective) need a second GPU.
            local only_one=()
            if [[ $t == cuda_world ]] && (($(nvidia-smi -L 2>/dev/null | grep -c '^GPU') < 2)); then
                only_one=(--skip two_gpus)
            fi
            part "tests_$t" 150 "$tests_dir/$t" --ignored --test-threads=1 --nocapture "${only_one[@]}"
        else
            # Dry (and cuda_probe everywhere): list the tests and run the host ones.
            "$tests_dir/$t" --list --ignored >"$work/list_${t}.log" 2>&1
            part "tests_$t" 60 "$tests_dir/$t" --test-threads=1
        fi
    done
}

# World size 2: two thread ranks sharing GPU 0 (CUDA_VISIBLE_DEVICES=0: the collectives staged
# through host memory, NCCL refusing two ranks on one GPU), stages 1-3, micro-batch half of
# W = 1's per rank (the same tokens per step); tokens/s, each rank's device buffers vs the
# plan's. Dry: tiny-gpt2 as two CPU thread ranks.
# The Llama family: a ~100M LLaMA (V 32000, C 768, L 8, 12 heads over 4, head 64, SwiGLU 2048,
# untied) from its config.json, bf16 stage 0, without and with activation checkpointing
# (measured vs planned memory in each JSON). Dry: tiny-llama on the CPU.
w2_batch=$((batch / 2 > 0 ? batch / 2 : 1))
w2_steps=$((warmup + 3))
llama_shape="$work/llama_100m_config.json"
cat >"$llama_shape" <<'JSON'
{ "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
  "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
  "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048,
  "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false }
JSON
llama_model=$([[ $mode == gpu ]] && echo "$llama_shape" || echo tiny-llama)
"$python" - "$work/zero0_bf16.json" "$work/zero0_bf16_ckpt.json" <<'PY2'
import json, sys
config = json.load(open(sys.argv[1]))
config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False}
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY2
run_w2_and_llama() {
    local stage variant config
    for stage in 1 2 3; do
        if ! want w2; then skip "w2_stage$stage" "not in --parts"; continue; fi
        config="$work/zero${stage}_bf16_w2.json"
        sed "s/\"train_micro_batch_size_per_gpu\": $batch/\"train_micro_batch_size_per_gpu\": $w2_batch/" \
            "$work/zero${stage}_bf16.json" >"$config"
        part "w2_stage$stage" 60 bash -c "CUDA_VISIBLE_DEVICES=0 '$bin' run '$config' --device $device --attention-kernel scalar \
            --model $model --world-size 2 --steps $w2_steps --seq-len $seq \
            --metrics '$work/dsplan_w2_stage$stage.jsonl' --format json >'$work/dsplan_w2_stage$stage.json'"
    done
    for variant in llama llama_ckpt; do
        if ! want llama; then skip "$variant" "not in --parts"; continue; fi
        config="$work/zero0_bf16$([[ $variant == llama_ckpt ]] && echo _ckpt).json"
        part "$variant" 60 bash -c "'$bin' run '$config' --device $device --model '$llama_model' --attention-kernel scalar \
            --steps $((warmup + timed)) --seq-len $seq --metrics '$work/dsplan_$variant.jsonl' \
            --format json >'$work/dsplan_$variant.json'"
    done
}
# Issue 12 on the GPU: 2 processes sharing GPU 0 under mpirun (the `mpi` feature: their
# collectives staged through host memory over MPI) against 2 thread ranks, stages 1-3, gpt2
# bf16 at 4 x 256 for 3 steps; the saved models must be equal byte for byte. Dry: the CPU.
run_mpi() {
    local stage config mpi_bin="$kit/bin/dsplan-mpi" mpi_model=$model mpi_seq=256 mpi_batch=4
    [[ $mode == dry ]] && mpi_seq=$seq mpi_batch=$batch
    for stage in 1 2 3; do
        if ! want mpi; then skip "mpi_stage$stage" "not in --parts"; continue; fi
        if [[ ! -x $mpi_bin ]] || ! command -v mpirun >/dev/null; then
            skip "mpi_stage$stage" "no $mpi_bin or no mpirun"; continue
        fi
        config="$work/zero${stage}_bf16_mpi.json"
        sed "s/\"train_micro_batch_size_per_gpu\": $batch/\"train_micro_batch_size_per_gpu\": $mpi_batch/" \
            "$work/zero${stage}_bf16.json" >"$config"
        local common="run '$config' --device $device --model $mpi_model --attention-kernel scalar --steps 3 --seq-len $mpi_seq"
        part "mpi_stage$stage" 90 bash -c "set -e
            CUDA_VISIBLE_DEVICES=0 '$mpi_bin' $common --world-size 2 --save-model '$work/mpi_threads$stage.safetensors'
            CUDA_VISIBLE_DEVICES=0 mpirun --allow-run-as-root --oversubscribe --mca plm_rsh_agent false -np 2 \
                -x LD_LIBRARY_PATH -x DSPLAN_KERNEL_CACHE -x CUDA_VISIBLE_DEVICES \
                '$mpi_bin' $common --save-model '$work/mpi_processes$stage.safetensors'
            cmp '$work/mpi_threads$stage.safetensors' '$work/mpi_processes$stage.safetensors'
            echo 'processes equal threads byte for byte'"
    done
}
run_tests_and_mpi() { run_tests; run_mpi; }
run_tests_and_mpi &
tests_pid=$!
run_w2_and_llama &
w2_pid=$!

ds_specs=()
for model_name in gpt2 gpt2-medium; do
    for spec in "0 none" "1 none" "2 none" "3 none" "2 cpu" "3 cpu"; do
        # --ds-runs keeps the named ones (a rerun measures only what an earlier run missed).
        [[ -z $ds_runs || ",$ds_runs," == *",$model_name:${spec// /:},"* ]] && ds_specs+=("$model_name $spec")
    done
done
ds_batch=8 ds_seq=1024
for spec in "${ds_specs[@]}"; do
    read -r model_name stage offload <<<"$spec"
    stem="$work/ds/${model_name}_z${stage}_${offload}"
    "$python" "$here/ds_memory.py" --model "$model_name" --stage "$stage" --offload-optimizer "$offload" \
        --micro-batch "$ds_batch" --seq "$ds_seq" --config-out "$stem.config.json" --write-config-only
    printf '{"model": "%s", "stage": %s, "offload_optimizer": "%s", "micro_batch": %s, "seq_len": %s, "attention": "sdpa", "dry": %s}\n' \
        "$model_name" "$stage" "$offload" "$ds_batch" "$ds_seq" "$([[ $mode == dry ]] && echo true || echo false)" >"$stem.spec.json"
    estimate=("$bin" estimate --config "$stem.config.json" --model "$model_name" --seq-len "$ds_seq" --flash-attention --format json)
    "${estimate[@]}" >"$stem.estimate.json" 2>"$stem.estimate.err" || echo "note: dsplan estimate failed for $spec: $(tail -n 2 "$stem.estimate.err")"
    "${estimate[@]}" --cuda-context 0B --fragmentation 0 >"$stem.estimate_tensors.json" 2>>"$stem.estimate.err" || true
done
echo "== deepspeed configs written and estimated: ${#ds_specs[@]}"
if ! want ds; then
    skip ds_runs "not in --parts"
elif [[ $mode == gpu && $have_ds == yes && $have_cuda_torch == yes ]]; then
    if [[ -n $jit_pid ]]; then
        echo "== waiting for DeepSpeed's op build"; wait "$jit_pid"; tail -qn 2 "$work/ds_jit.log" "$work/ds_jit_cpu.log"
    fi
    port=29600 ds_pids=()
    for spec in "${ds_specs[@]}"; do
        read -r model_name stage offload <<<"$spec"
        stem="$work/ds/${model_name}_z${stage}_${offload}"
        name="ds_${model_name}_z${stage}_${offload}"
        (
            export MASTER_PORT=$port
            part "$name" 120 env PYTHONUNBUFFERED=1 "$python" "$here/ds_memory.py" \
                --model "$model_name" --stage "$stage" --offload-optimizer "$offload" \
                --micro-batch "$ds_batch" --seq "$ds_seq" --config-out "$stem.config.json" \
                --result-out "$stem.run.json"
        ) &
        ds_pids+=($!)
        port=$((port + 1))
        if ((${#ds_pids[@]} >= ds_width)); then wait "${ds_pids[0]}"; ds_pids=("${ds_pids[@]:1}"); fi
    done
    for pid in "${ds_pids[@]}"; do wait "$pid"; done
elif [[ $mode == dry ]]; then
    skip ds_runs "dry run: DeepSpeed needs a GPU; configs written and estimated only"
else
    skip ds_runs "deepspeed or torch with CUDA is not importable by $python (wheels in $kit/wheels?)"
fi
wait "$tests_pid" "$w2_pid"

# --- 5. the results
if [[ $mode == gpu ]]; then
    slug="$("$python" -c "import json,re,sys; g=(json.load(open(sys.argv[1])).get('machine') or {}).get('gpus') or [{}]; print(re.sub('[^a-z0-9]+','-',(g[0].get('name') or 'unknown-gpu').lower()).strip('-'))" "$work/report.json" 2>/dev/null || echo unknown-gpu)"
    results="$root/bench/results/gpu/$(date -u +%Y-%m-%d)-$slug.json"
    dry_flag=""
else
    results="$work/dry-$(date -u +%Y-%m-%d)-cpu.json"
    dry_flag="--dry"
fi
"$python" "$here/gpu_kit_results.py" "$work" --out "$results" ${OUT:+--copy-to "$OUT"} $dry_flag \
    --commit "$commit" --warmup "$warmup" --batch "$batch" --seq "$seq" --w2-batch "$w2_batch"
if [[ -n "${OUT:-}" ]]; then
    # The logs come back only under 16 MiB: leave the models and the raw profile behind.
    tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$work" --exclude=kernel-cache --exclude=torch_extensions \
        --exclude=site --exclude=lib --exclude='*.safetensors' --exclude='profile*.csv' . 2>/dev/null
    if (($(stat -c %s "$OUT/gpu_check_logs.tar.gz") > 15 * 1048576)); then
        echo "note: the logs are over 15 MiB; keeping the .log and .json files only"
        (cd "$work" && find . -name '*.log' -o -name '*.json' | tar -czf "$OUT/gpu_check_logs.tar.gz" -T -)
    fi
fi
echo "== done in $(($(date +%s) - start)) s; results: $results"
