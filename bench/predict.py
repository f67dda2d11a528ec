"""Predictions before measurement (issue 35): `dsplan estimate` of every job of a job list,
written as a prediction file that is committed before any GPU measures the jobs.

    python3 bench/predict.py bench/predictions/round1-jobs.json \
        --out bench/predictions/2026-11-28-round1.json
    python3 bench/predict.py bench/predictions/round1-jobs.json \
        --check bench/predictions/2026-11-28-round1.json      # at the file's commit: exit 0

For each job it writes the DeepSpeed config the GPU will train with (`ds_config`), embeds the
Hugging Face config of its model (`bench/predictions/models/<model>.json`), and asks this
checkout's `dsplan` twice:

    dsplan estimate --config C --model M --lm-head include --seq-len S --flash-attention
                    --activation-checkpointing none|full --format json
                    --cuda-context 0B --fragmentation 0           -> live tensors
    (the same, default margins) --step-time <H200 constants>    -> GPU peak, host peak, step

`predicted` holds the live tensors (against `max_memory_allocated`), the full GPU peak
(against `max_memory_reserved` and the driver's figure), the host peak (against peak RSS) and
the cost model's step seconds. Nothing in it is typed by hand: `--check` regenerates it and
compares. The file also plans the GPU calls: each job's run time is estimated (a scheduling
guess, not a prediction: see `estimated_seconds`) and the jobs, in the list's order, are
packed into calls of `CALL_JOB_SECONDS`.

Standard library only. Without `--dsplan` it builds `dsplan` with cargo first (debug).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS_DIR = os.path.join(HERE, "predictions", "models")

GIB = 1 << 30
# The device the jobs are for: one H200 (139 GiB, KINDS.md) in a machine of 128 GiB.
DEVICE = "NVIDIA H200"
GPU_BYTES = 139 * GIB
HOST_BYTES = 128 * GIB
# A job must be predicted this far under the machine, so that an under-prediction of up to
# 10 % (GPU) or 15 % (host) still runs.
GPU_FIT = 0.90
HOST_FIT = 0.85
# recommend's cost model with the H200's datasheet figures where they differ from the H100
# defaults: HBM3e 4.8 TB/s, PCIe 5.0 x16 (64 GB/s). Dense bf16/fp16 peak (989.4 TFLOP/s),
# efficiency (0.40) and CPU Adam (1.344 G params/s, measured on 2 vCPUs) stay the defaults.
COST_FLAGS = ["--hbm-gbps", "4800", "--host-link-gbps", "64"]
# The schedule: one device call runs at most 10 minutes; the jobs of one call are packed into
# CALL_JOB_SECONDS, leaving CALL_SETUP_SECONDS for the wheels and DeepSpeed's op builds
# (FusedAdam 31 s, CPUAdam 38 s on the 2026-11-27 H100) and the results.
CALL_JOB_SECONDS = 480
CALL_SETUP_SECONDS = 60
PRECISIONS = ("bf16", "fp16")
OFFLOADS = ("none", "cpu")
CHECKPOINTING = {"on": "full", "off": "none"}


class JobError(Exception):
    """A job of the list that cannot be predicted or does not fit: names the job and the fix."""


def ds_config(job):
    """The DeepSpeed config one job trains with (world size 1)."""
    zero = {"stage": job["stage"]}
    if job["offload_optimizer"] == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if job["offload_param"] == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    zero.update(job.get("zero_knobs", {}))
    if job["precision"] == "bf16":
        precision = {"bf16": {"enabled": True}}
    else:
        # The scaler's knobs given (DeepSpeed's ZeRO wrapper otherwise starts at 2^32 with no
        # hysteresis and skips the first steps: deepspeed-facts §5.2).
        precision = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                              "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    return {
        "train_micro_batch_size_per_gpu": job["micro_batch"],
        "gradient_accumulation_steps": job["gradient_accumulation_steps"],
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        **precision,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        },
        "zero_optimization": zero,
        "wall_clock_breakdown": False,
    }


def check_job(job, where):
    """The fields a job must have, with the values the kit can run."""
    required = {
        "id": str, "model": str, "stage": int, "offload_optimizer": str, "offload_param": str,
        "precision": str, "micro_batch": int, "seq_len": int, "gradient_checkpointing": str,
        "gradient_accumulation_steps": int,
    }
    for key, kind in required.items():
        if not isinstance(job.get(key), kind):
            raise JobError(f"{where}: `{key}` must be a {kind.__name__} (see the other jobs)")
    allowed = {
        "stage": (0, 1, 2, 3), "offload_optimizer": OFFLOADS, "offload_param": OFFLOADS,
        "precision": PRECISIONS, "gradient_checkpointing": tuple(CHECKPOINTING),
    }
    for key, values in allowed.items():
        if job[key] not in values:
            raise JobError(f"{where}: `{key}` is {job[key]!r}; use one of {list(values)}")
    if job["offload_optimizer"] == "cpu" and job["stage"] == 0:
        raise JobError(f"{where}: offload_optimizer needs ZeRO stage 1-3")
    if job["offload_param"] == "cpu" and job["stage"] != 3:
        raise JobError(f"{where}: offload_param needs ZeRO stage 3")
    if job.get("zero_knobs") and job["stage"] != 3:
        raise JobError(f"{where}: zero_knobs are stage-3 knobs; the job is at stage {job['stage']}")
    if not os.path.isfile(model_path(job["model"])):
        raise JobError(f"{where}: no model config {model_path(job['model'])}; add it or fix `model`")


def model_path(name):
    return os.path.join(MODELS_DIR, f"{name}.json")


def estimate_args(job, config_path, model_file, margins):
    """The `dsplan estimate` arguments of one job ({config} and {model} stand for the files)."""
    args = ["estimate", "--config", config_path, "--model", model_file, "--lm-head", "include",
            "--seq-len", str(job["seq_len"]), "--flash-attention",
            "--activation-checkpointing", CHECKPOINTING[job["gradient_checkpointing"]],
            "--format", "json"]
    if margins == "tensors":
        args += ["--cuda-context", "0B", "--fragmentation", "0"]
    else:
        args += ["--step-time", *COST_FLAGS]
    return args


def run_estimate(dsplan, args, where):
    done = subprocess.run([dsplan, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise JobError(f"{where}: dsplan {' '.join(args)} failed ({done.returncode}): "
                       f"{done.stderr.strip()}")
    return json.loads(done.stdout)


def estimated_seconds(job, params, step_seconds, steps):
    """A scheduling guess of one job's wall time on the GPU machine, not a prediction:
    20 s of interpreter, imports, NCCL and teardown; building the model (random init filled
    by 16 threads on the host at ~300 M params/s, or HF's init under zero.Init at ~200 M/s);
    pinning the offloaded fp32 states at ~5 GB/s; every step at 3x the cost model's
    prediction, and at least 0.2 s."""
    seconds = 20.0
    seconds += params / (200e6 if job["stage"] == 3 else 300e6)
    if job["offload_optimizer"] == "cpu":
        seconds += params * 16 / 5e9
    seconds += (steps["warmup"] + steps["timed"]) * max(3 * step_seconds, 0.2)
    return round(seconds, 1)


def schedule(jobs):
    """Packs the jobs, in order, into calls of CALL_JOB_SECONDS each."""
    calls, current, used = [], [], 0.0
    for job in jobs:
        seconds = job["schedule"]["estimated_seconds"]
        if current and used + seconds > CALL_JOB_SECONDS:
            calls.append((current, used))
            current, used = [], 0.0
        current.append(job)
        used += seconds
    if current:
        calls.append((current, used))
    plan = []
    for number, (members, used) in enumerate(calls, start=1):
        for job in members:
            job["schedule"]["call"] = number
        plan.append({"call": number, "jobs": [job["id"] for job in members],
                     "estimated_seconds": round(used + CALL_SETUP_SECONDS, 1)})
    return plan


def predict_job(dsplan, job, steps, work):
    where = f"job {job['id']}"
    with open(model_path(job["model"])) as f:
        model_config = json.load(f)
    config = ds_config(job)
    config_path = os.path.join(work, f"{job['id']}.ds_config.json")
    model_file = os.path.join(work, f"{job['model']}.json")
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    with open(model_file, "w") as f:
        json.dump(model_config, f, indent=2)
    tensors = run_estimate(dsplan, estimate_args(job, config_path, model_file, "tensors"), where)
    full = run_estimate(dsplan, estimate_args(job, config_path, model_file, "full"), where)
    peaks = full["full"]["peaks"]
    step = full["step_time"]["seconds"]
    predicted = {
        "live_tensors": tensors["full"]["peaks"]["gpu"]["bytes"],
        "live_tensors_phase": tensors["full"]["peaks"]["gpu"]["phase"],
        "gpu_peak": peaks["gpu"]["bytes"],
        "gpu_peak_phase": peaks["gpu"]["phase"],
        "host_peak": peaks["cpu"]["bytes"],
        "host_peak_phase": peaks["cpu"]["phase"],
        "step_seconds": step["total"],
        "step_components": {k: step[k] for k in ("compute", "communication", "offload",
                                                 "optimizer")},
    }
    if predicted["gpu_peak"] > GPU_FIT * GPU_BYTES:
        raise JobError(f"{where}: predicted {predicted['gpu_peak'] / GIB:.1f} GiB per GPU, over "
                       f"{GPU_FIT:.0%} of the {DEVICE}'s {GPU_BYTES / GIB:.0f} GiB; lower "
                       "micro_batch or seq_len, or turn gradient_checkpointing on")
    if predicted["host_peak"] > HOST_FIT * HOST_BYTES:
        raise JobError(f"{where}: predicted {predicted['host_peak'] / GIB:.1f} GiB of host "
                       f"memory, over {HOST_FIT:.0%} of the machine's {HOST_BYTES / GIB:.0f} "
                       "GiB; offload less or pick a smaller model")
    params = full["model"]["total_params"]
    out = dict(job)
    out.update({
        "model_config": model_config,
        "params": params,
        "ds_config": config,
        "dsplan_commands": [
            estimate_args(job, "{config}", "{model}", "tensors"),
            estimate_args(job, "{config}", "{model}", "full"),
        ],
        "predicted": predicted,
        "schedule": {"estimated_seconds": estimated_seconds(job, params, step["total"], steps)},
    })
    return out


def job_record(job):
    """A job of a prediction file as the GPU runs it: without its predictions and schedule."""
    return {k: v for k, v in job.items() if k not in ("predicted", "schedule")}


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def source_state(allow_dirty):
    """The commit whose CLI makes the predictions; refuses uncommitted changes to the code."""
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "planner", "src", "executor", "kernels",
                "Cargo.toml", "Cargo.lock")
    if dirty and not allow_dirty:
        raise JobError("uncommitted changes to the planner or the CLI:\n" + dirty +
                       "\ncommit them first: predictions must come from a commit's CLI "
                       "(--allow-dirty for a trial run)")
    return commit, bool(dirty)


def build_dsplan():
    subprocess.run(["cargo", "build", "-q", "--bin", "dsplan"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "dsplan")


def predictions(job_list_path, dsplan, allow_dirty, date):
    with open(job_list_path) as f:
        job_list = json.load(f)
    steps = job_list["steps"]
    seen = set()
    for index, job in enumerate(job_list["jobs"]):
        check_job(job, f"{job_list_path}: /jobs/{index} ({job.get('id', 'no id')})")
        if job["id"] in seen:
            raise JobError(f"{job_list_path}: /jobs/{index}: the id {job['id']} is used twice")
        seen.add(job["id"])
    commit, dirty = source_state(allow_dirty)
    version = subprocess.run([dsplan, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        jobs = [predict_job(dsplan, job, steps, work) for job in job_list["jobs"]]
    calls = schedule(jobs)
    return {
        "round": job_list["round"],
        "created": date,
        "about": "dsplan's predictions of DeepSpeed 0.19.8 jobs, committed before any GPU "
                 "measured them (issue 35). Never edit this file: a new round gets a new one. "
                 "bench/predict.py --check regenerates it at its commit.",
        "job_list": os.path.relpath(job_list_path, ROOT),
        "dsplan_commit": commit,
        "dsplan_tree_dirty": dirty,
        "dsplan_version": version,
        "device": {"name": DEVICE, "gpu_bytes": GPU_BYTES, "host_bytes": HOST_BYTES},
        "cost_flags": COST_FLAGS,
        "targets": {"live_tensors": 0.03, "gpu_peak": 0.05, "host_peak": 0.10,
                    "step_seconds": 0.15},
        "steps": steps,
        "calls": calls,
        "jobs": jobs,
    }


def dump(document):
    """JSON with each job a block of one line per key, so that the file reads and diffs well."""
    compact = lambda value: json.dumps(value, separators=(", ", ": "))  # noqa: E731
    lines = ["{"]
    keys = list(document)
    for index, key in enumerate(keys):
        comma = "," if index < len(keys) - 1 else ""
        value = document[key]
        if key in ("jobs", "calls"):
            lines.append(f" {json.dumps(key)}: [")
            for number, item in enumerate(value):
                inner = ",\n".join(f"   {json.dumps(k)}: {compact(v)}" for k, v in item.items())
                end = "," if number < len(value) - 1 else ""
                lines.append("  {\n" + inner + "\n  }" + end)
            lines.append(" ]" + comma)
        else:
            lines.append(f" {json.dumps(key)}: {compact(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def compare(fresh, committed):
    """The differences between a regenerated prediction file and a committed one."""
    problems = []
    keys = ("dsplan_version", "cost_flags", "steps", "calls", "device", "round")
    for key in keys:
        if fresh.get(key) != committed.get(key):
            problems.append(f"/{key}: committed {committed.get(key)!r}, now {fresh.get(key)!r}")
    old = {job["id"]: job for job in committed.get("jobs", [])}
    for job in fresh["jobs"]:
        if job["id"] not in old:
            problems.append(f"job {job['id']}: not in the committed file")
            continue
        for key, value in job.items():
            if old[job["id"]].get(key) != value:
                problems.append(f"job {job['id']} /{key}: committed {old[job['id']].get(key)!r}"
                                f", now {value!r}")
    for name in old.keys() - {job["id"] for job in fresh["jobs"]}:
        problems.append(f"job {name}: in the committed file, not in the job list")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("jobs", help="the job list (bench/predictions/round*-jobs.json)")
    parser.add_argument("--out", help="write the prediction file here")
    parser.add_argument("--check", metavar="FILE",
                        help="regenerate and compare with FILE; exit 1 on any difference")
    parser.add_argument("--dsplan", help="the dsplan binary (default: cargo build, debug)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--allow-dirty", action="store_true",
                        help="predict with uncommitted planner/CLI changes (trial runs only)")
    args = parser.parse_args()
    if not (args.out or args.check):
        parser.error("give --out FILE or --check FILE")
    try:
        dsplan = args.dsplan or build_dsplan()
        document = predictions(args.jobs, dsplan, args.allow_dirty, args.date)
    except JobError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        with open(args.check) as f:
            committed = json.load(f)
        problems = compare(document, committed)
        for problem in problems:
            print(f"differs: {problem}", file=sys.stderr)
        if problems:
            print(f"{args.check}: {len(problems)} difference(s) from this checkout's CLI",
                  file=sys.stderr)
            return 1
        print(f"{args.check}: every job's config and prediction equals this checkout's CLI "
              f"({len(document['jobs'])} jobs)")
    if args.out:
        with open(args.out, "w") as f:
            f.write(dump(document))
        summary(document, sys.stdout)
    return 0


def summary(document, out):
    print(f"{'id':<58} {'live':>7} {'gpu':>7} {'host':>7} {'step s':>7} {'est s':>6} call",
          file=out)
    for job in document["jobs"]:
        p = job["predicted"]
        print(f"{job['id']:<58} {p['live_tensors'] / GIB:>7.2f} {p['gpu_peak'] / GIB:>7.2f}"
              f" {p['host_peak'] / GIB:>7.2f} {p['step_seconds']:>7.3f}"
              f" {job['schedule']['estimated_seconds']:>6.0f} {job['schedule']['call']}",
              file=out)
    for call in document["calls"]:
        print(f"call {call['call']}: {len(call['jobs'])} jobs, ~{call['estimated_seconds']:.0f} s",
              file=out)


if __name__ == "__main__":
    sys.exit(main())
