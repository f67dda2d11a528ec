"""The GPU kit's part of issue 35: measures exactly the jobs of a committed prediction file with
DeepSpeed 0.19.8, one fresh process per job, alone on the GPU, and writes
`bench/results/gpu/<date>-<device>-predicted.json` (rows `{id, job, predicted, measured,
prediction_commit, ...}`).

    # here, without a GPU: check every selected job, print the plan of calls
    python3 bench/predicted_run.py --dry [--call N | --jobs ID,ID] [--smoke N]
    # on the lent GPU machine (the device tool's `run`, carry [".gpukit"]):
    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/predicted_run.py --call 1 2>&1 | tee $OUT/predicted.log

`--call N` runs the jobs the prediction file planned for call N; `--jobs` names them (a rerun
of what a call did not finish). The jobs run in the file's order until `--budget` seconds are
spent; a job whose estimated time no longer fits is skipped with a row saying so, so the call
ends in time and its results come back.

On the GPU machine: the wheels in `.gpukit/wheels` (bench/gpu_kit_pack.sh --wheels-only:
deepspeed 0.19.8 and what the image lacks) go to a private site folder; DeepSpeed's FusedAdam
and CPUAdam are JIT-built (with `TORCH_CUDA_ARCH_LIST` set to the device's own capability:
the image's "9.0a" breaks DeepSpeed 0.19.8's parser) before the first job. Each job
(`bench/predicted_job.py`) reports `max_memory_allocated`, `max_memory_reserved`, its step
seconds and its peak RSS; this process samples the driver's view every 50 ms through NVML
(the job's own used memory, or the device's used memory less what was used before it
started where NVML lists no processes) for `driver_peak`, and takes the job's rusage.

`prediction_commit` is the commit that added the prediction file (git log), or, where the
machine has no git history, what `bench/gpu_kit_pack.sh` recorded in `.gpukit/PREDICTIONS`.
A GPU run without one refuses to start: results that cannot be traced to committed
predictions are worthless.

`--dry` (no GPU, no result file): every selected job's DeepSpeed config is derived again from
the job list (bench/predict.py) and must equal the file's, its model config must equal
`bench/predictions/models/<model>.json`, its command is printed; where torch and transformers
import, each model is built on the meta device and its parameter count checked against
dsplan's; where deepspeed imports, each config goes through DeepSpeed's own parser;
`--smoke N` also runs the first N selected jobs through `predicted_job.py --device
cpu-smoke` (the whole code path on the CPU, a 2-layer model). Lines say what was skipped and
why. Exit 1 if any check fails.
"""

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import predict  # noqa: E402  (the job list's config function: one source for both sides)

JOB_SCRIPT = os.path.join(HERE, "predicted_job.py")
SAMPLE_SECONDS = 0.05


def newest_prediction_file():
    files = sorted(glob.glob(os.path.join(HERE, "predictions", "????-??-??-round*.json")))
    return files[-1] if files else None


def rel(path):
    return os.path.relpath(os.path.abspath(path), ROOT)


def prediction_commit(path, kit):
    """The commit that added the prediction file, and how it was found; (None, why) if none."""
    relative = rel(path)
    try:
        in_git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--git-dir"],
                                capture_output=True).returncode == 0
        tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "--error-unmatch", relative],
                                 capture_output=True, text=True)
        if in_git and tracked.returncode == 0:
            changed = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--",
                                      relative]).returncode
            if changed != 0:
                return None, f"{relative} differs from its committed version: never edit it"
            commit = subprocess.run(["git", "-C", ROOT, "log", "--diff-filter=A", "-n", "1",
                                     "--format=%H", "--", relative], capture_output=True,
                                    text=True, check=True).stdout.strip()
            if commit:
                return commit, "git log"
        elif in_git:
            return None, f"{relative} is not committed: commit it before measuring"
    except (OSError, subprocess.CalledProcessError):
        pass
    recorded = os.path.join(kit, "PREDICTIONS")
    if os.path.isfile(recorded):
        with open(recorded) as f:
            commits = json.load(f)
        if relative in commits:
            return commits[relative], recorded
    return None, (f"no git history here and {recorded} does not name {relative} "
                  "(run bench/gpu_kit_pack.sh --wheels-only after committing it)")


def select(document, call, ids):
    jobs = document["jobs"]
    if ids:
        wanted = [i for i in ids.split(",") if i]
        known = {job["id"] for job in jobs}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise SystemExit(f"error: --jobs names no job of the file: {', '.join(unknown)}")
        return [job for job in jobs if job["id"] in wanted]
    if call is not None:
        calls = [c["call"] for c in document["calls"]]
        if call not in calls:
            raise SystemExit(f"error: --call {call}: the file plans calls {calls}")
        return [job for job in jobs if job["schedule"]["call"] == call]
    return list(jobs)


def print_plan(document, selected):
    print(f"== plan: {len(document['jobs'])} jobs in {len(document['calls'])} calls "
          f"(each ~9 minutes: {predict.CALL_JOB_SECONDS} s of jobs + "
          f"{predict.CALL_SETUP_SECONDS} s of set-up)")
    for c in document["calls"]:
        print(f"   call {c['call']}: {len(c['jobs'])} jobs, ~{c['estimated_seconds']:.0f} s")
    total = sum(job["schedule"]["estimated_seconds"] for job in selected)
    print(f"== selected: {len(selected)} jobs, ~{total:.0f} s of jobs")


def job_command(python, job_file, result_file, device="cuda"):
    return [python, JOB_SCRIPT, "--job", job_file, "--result-out", result_file,
            "--device", device]


# --- the dry run --------------------------------------------------------------------------

def try_import(python, code, env=None):
    """Runs `code` with `python`: (whether it worked, its last line of output or of error)."""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    except OSError as error:
        return False, str(error)
    text = done.stdout if done.returncode == 0 else done.stderr
    lines = text.strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else ""


def cpu_env(python):
    """The environment of CPU-only DeepSpeed: its CPU accelerator, ninja beside the Python."""
    path = os.path.dirname(os.path.abspath(python)) + os.pathsep + os.environ.get("PATH", "")
    return dict(os.environ, DS_ACCELERATOR="cpu", PATH=path)


def dry_checks(document, selected, python, work):
    """Every check that needs no GPU; returns the problems found."""
    problems = []
    for job in selected:
        where = f"job {job['id']}"
        listed = {k: job[k] for k in ("id", "model", "stage", "offload_optimizer",
                                      "offload_param", "precision", "micro_batch", "seq_len",
                                      "gradient_checkpointing", "gradient_accumulation_steps")}
        if "zero_knobs" in job:
            listed["zero_knobs"] = job["zero_knobs"]
        try:
            predict.check_job(listed, where)
        except predict.JobError as error:
            problems.append(str(error))
            continue
        if predict.ds_config(listed) != job["ds_config"]:
            problems.append(f"{where}: its ds_config is not what bench/predict.py makes of it")
        with open(predict.model_path(job["model"])) as f:
            if json.load(f) != job["model_config"]:
                problems.append(f"{where}: its model_config differs from "
                                f"{rel(predict.model_path(job['model']))}")
        for key in ("live_tensors", "gpu_peak", "host_peak", "step_seconds"):
            if not isinstance(job.get("predicted", {}).get(key), (int, float)):
                problems.append(f"{where}: predicted.{key} is missing")
        job_file = os.path.join(work, f"{job['id']}.job.json")
        write_job(document, job, job_file)
        command = job_command(python, job_file, os.path.join(work, f"{job['id']}.result.json"))
        shown = [rel(command[1])] + [os.path.basename(a) for a in command[2:]]
        print(f"   {job['id']}: call {job['schedule']['call']}, "
              f"~{job['schedule']['estimated_seconds']:.0f} s: python3 {' '.join(shown)}")

    ok, versions = try_import(python, "import torch, transformers; "
                              "print(torch.__version__, transformers.__version__)")
    if not ok:
        print(f"== skipped: model parameter counts (torch and transformers do not import "
              f"with {python}: {versions})")
    else:
        print(f"== torch, transformers: {versions}; building each model on the meta device")
        models = {job["model"]: job for job in selected}
        code = ("import json, sys, torch\n"
                "from transformers import AutoConfig, AutoModelForCausalLM\n"
                "config = AutoConfig.for_model(**json.load(open(sys.argv[1])))\n"
                "with torch.device('meta'):\n"
                "    model = AutoModelForCausalLM.from_config(config, attn_implementation='sdpa')\n"
                "print(sum(p.numel() for p in model.parameters()))\n")
        for name, job in sorted(models.items()):
            path = os.path.join(work, f"{name}.config.json")
            with open(path, "w") as f:
                json.dump(job["model_config"], f)
            done = subprocess.run([python, "-c", code, path], capture_output=True, text=True)
            counted = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else None
            if counted is None or int(counted) != job["params"]:
                problems.append(f"model {name}: transformers counts {counted} parameters, "
                                f"dsplan {job['params']}: {done.stderr.strip()[-300:]}")
            else:
                print(f"   {name}: {job['params']:,} parameters in transformers and in dsplan")

    ok, versions = try_import(python, "import deepspeed; print(deepspeed.__version__)",
                              cpu_env(python))
    if not ok:
        print(f"== skipped: DeepSpeed's config parser (deepspeed does not import with {python})")
    else:
        print(f"== deepspeed {versions}: each config through DeepSpeedConfig")
        code = ("import json, sys\n"
                "from deepspeed.runtime.config import DeepSpeedConfig\n"
                "for path in sys.argv[1:]:\n"
                "    try:\n"
                "        DeepSpeedConfig(json.load(open(path)))\n"
                "    except Exception as error:\n"
                "        print('REFUSED', path, repr(error)[:300])\n")
        paths = []
        for job in selected:
            path = os.path.join(work, f"{job['id']}.ds_config.json")
            with open(path, "w") as f:
                json.dump(job["ds_config"], f)
            paths.append(path)
        done = subprocess.run([python, "-c", code, *paths], capture_output=True, text=True,
                              env=cpu_env(python))
        refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
        problems += [f"DeepSpeed refuses {line}" for line in refused]
        if done.returncode != 0:
            problems.append(f"DeepSpeed's parser failed: {done.stderr.strip()[-300:]}")
        elif not refused:
            print(f"   {len(paths)} configs accepted")
    return problems


def smoke(document, selected, python, work, count):
    """Runs the first `count` selected jobs through the job script on the CPU."""
    ok, _ = try_import(python, "import deepspeed, torch, transformers", cpu_env(python))
    if not ok:
        print(f"== skipped: --smoke (deepspeed, torch and transformers must import with "
              f"{python})")
        return []
    problems = []
    for job in selected[:count]:
        job_file = os.path.join(work, f"{job['id']}.job.json")
        result_file = os.path.join(work, f"{job['id']}.smoke.json")
        write_job(document, job, job_file)
        command = job_command(python, job_file, result_file, "cpu-smoke") + [
            "--warmup", "1", "--timed", "1"]
        t0 = time.time()
        with open(os.path.join(work, f"{job['id']}.smoke.log"), "w") as log:
            rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                env=cpu_env(python)).returncode
        if rc != 0 or not os.path.isfile(result_file):
            problems.append(f"smoke {job['id']}: exit {rc} (log {work}/{job['id']}.smoke.log)")
            continue
        with open(result_file) as f:
            result = json.load(f)
        print(f"   smoke {job['id']}: ok in {time.time() - t0:.0f} s, "
              f"losses {[round(x, 3) for x in result['losses']]}")
    return problems


# --- the GPU run --------------------------------------------------------------------------

def write_job(document, job, path):
    with open(path, "w") as f:
        json.dump(dict(job, steps=document["steps"]), f)


class DriverSampler(threading.Thread):
    """The driver's used memory of one process (NVML), or of the device less a baseline."""

    def __init__(self, pid, nvml, handle, baseline):
        super().__init__(daemon=True)
        self.pid, self.nvml, self.handle, self.baseline = pid, nvml, handle, baseline
        self.process_peak = 0
        self.device_peak = 0
        self.rss_peak = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                for process in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    if process.pid == self.pid and process.usedGpuMemory:
                        self.process_peak = max(self.process_peak, process.usedGpuMemory)
                used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
                self.device_peak = max(self.device_peak, used)
            except Exception:  # noqa: BLE001 (a sample lost is not a run lost)
                pass
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.rss_peak = max(self.rss_peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
            self.samples += 1
            self.stop.wait(SAMPLE_SECONDS)

    def driver_peak(self):
        if self.process_peak:
            return self.process_peak, "nvml process"
        if self.device_peak:
            return self.device_peak - self.baseline, "nvml device used less the baseline"
        return None, "no NVML sample"


def open_nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as error:  # noqa: BLE001
        print(f"note: NVML unavailable ({error}); no driver figure")
        return None, None


def install_wheels(python, kit, work):
    wheels = sorted(glob.glob(os.path.join(kit, "wheels", "*.whl")))
    if not wheels:
        print(f"note: no wheels in {kit}/wheels (bench/gpu_kit_pack.sh --wheels-only)")
        return
    site = os.path.join(work, "site")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--no-compile", "--no-cache-dir", "--upgrade", "--target", site,
                           *wheels], capture_output=True, text=True)
    if done.returncode != 0:
        print("note: installing the carried wheels failed:\n" + done.stderr[-800:])
        return
    os.environ["PYTHONPATH"] = site + (":" + os.environ["PYTHONPATH"]
                                       if os.environ.get("PYTHONPATH") else "")


def build_ops(python, nvml, handle, work, selected):
    """FusedAdam (and CPUAdam when a job offloads) JIT-built in parallel; waits for both."""
    if nvml is not None:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    print(f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', '')}")
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(work, "torch_extensions")
    builders = ["FusedAdamBuilder"]
    if any(job["offload_optimizer"] == "cpu" for job in selected):
        builders.append("CPUAdamBuilder")
    code = ("import sys, time\nt = time.time()\nfrom deepspeed.ops import op_builder\n"
            "getattr(op_builder, sys.argv[1])().load()\n"
            "print(f'{sys.argv[1]} built in {time.time() - t:.0f} s')\n")
    running = [subprocess.Popen([python, "-c", code, name], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for name in builders]
    for name, process in zip(builders, running):
        try:
            out, _ = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            out = f"{name}: not built in 300 s (the jobs will try again)"
        print("   " + (out.strip().splitlines() or ["(no output)"])[-1])


def run_job(document, job, args, work, box, nvml, handle, port):
    job_file = os.path.join(work, f"{job['id']}.job.json")
    result_file = os.path.join(work, f"{job['id']}.result.json")
    write_job(document, job, job_file)
    baseline = nvml.nvmlDeviceGetMemoryInfo(handle).used if nvml else 0
    command = job_command(args.python, job_file, result_file, args.device)
    if args.device == "cpu-smoke":
        command += ["--warmup", "1", "--timed", "1"]
        env = cpu_env(args.python)
    else:
        env = dict(os.environ)
    env.update(MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    t0 = time.time()
    with open(os.path.join(work, f"{job['id']}.log"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        sampler = DriverSampler(process.pid, nvml, handle, baseline)
        sampler.start()
        status, rusage = "measured", None
        while True:
            pid, code, rusage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(code)
                break
            if time.time() - t0 > box:
                os.killpg(process.pid, 9)
                _, code, rusage = os.wait4(process.pid, 0)
                process.returncode = os.waitstatus_to_exitcode(code)
                status = "timeout"
                break
            time.sleep(0.2)
        sampler.stop.set()
    wall = time.time() - t0
    result = None
    if os.path.isfile(result_file):
        with open(result_file) as f:
            result = json.load(f)
    if status == "measured" and (process.returncode != 0 or result is None):
        status = "failed"
    driver_peak, driver_source = sampler.driver_peak()
    measured = {
        "max_allocated": result and result["max_allocated"],
        "max_reserved": result and result["max_reserved"],
        "driver_peak": driver_peak if status == "measured" else None,
        # The whole process's peak (wait4's rusage: teardown included), else the job's own.
        "host_peak_rss": (rusage.ru_maxrss * 1024 if rusage and result
                          else result and result["host_peak_rss"]),
        "step_seconds": result and result["step_seconds"],
    }
    details = {
        "wall_seconds": round(wall, 1),
        "exit": process.returncode,
        "driver_peak_source": driver_source,
        "driver_samples": sampler.samples,
        "driver_baseline": baseline,
        "sampled_rss_peak": sampler.rss_peak,
        "rusage_maxrss": rusage.ru_maxrss * 1024 if rusage else None,
    }
    if result:
        skip = ("id", "phases", "host_peak_rss")
        details.update({k: v for k, v in result.items() if k not in skip})
        details["host_peak_rss_at_result"] = result["host_peak_rss"]
        details["phases"] = result["phases"]
    else:
        with open(os.path.join(work, f"{job['id']}.log"), errors="replace") as f:
            details["log_tail"] = f.read()[-2000:]
    return status, measured, details


def results_path(out_dir, device_name):
    slug = re.sub("[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown-gpu"
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return os.path.join(out_dir, f"{date}-{slug}-predicted.json")


def gpu_run(args, document, selected, prediction_file):
    commit, source = prediction_commit(prediction_file, args.kit)
    if commit is None:
        raise SystemExit(f"error: {source}")
    print(f"== prediction file {rel(prediction_file)} at {commit} ({source})")
    smoke = args.device == "cpu-smoke"
    if smoke and os.path.abspath(args.out_dir) == os.path.join(ROOT, "bench", "results", "gpu"):
        raise SystemExit("error: --device cpu-smoke writes no GPU result: give --out-dir")
    start = time.time()
    work = args.keep or tempfile.mkdtemp(prefix="dsplan-predicted.")
    if not smoke:
        install_wheels(args.python, args.kit, work)
    ok, versions = try_import(args.python, "import torch, transformers, deepspeed; print("
                              "torch.__version__, transformers.__version__, "
                              "deepspeed.__version__, torch.cuda.is_available())",
                              cpu_env(args.python) if smoke else None)
    print(f"torch, transformers, deepspeed, CUDA: {versions}")
    if not ok or not (smoke or versions.endswith("True")):
        raise SystemExit("error: torch with CUDA, transformers and deepspeed must import")
    nvml, handle = (None, None) if smoke else open_nvml()
    device_name = nvml.nvmlDeviceGetName(handle) if nvml else "unknown-gpu"
    if isinstance(device_name, bytes):
        device_name = device_name.decode()
    if smoke:
        device_name = "cpu-smoke"
    else:
        build_ops(args.python, nvml, handle, work, selected)
    rows = []
    for index, job in enumerate(selected):
        remaining = args.budget - (time.time() - start)
        estimate = job["schedule"]["estimated_seconds"]
        row = {"id": job["id"], "job": predict.job_record(job), "predicted": job["predicted"],
               "prediction_commit": commit, "prediction_file": rel(prediction_file)}
        if remaining < estimate:
            row.update(status="skipped", measured=None,
                       note=f"out of time: ~{estimate:.0f} s needed, {remaining:.0f} s left")
            print(f"== {job['id']}: skipped ({row['note']})")
            rows.append(row)
            continue
        box = min(max(90.0, 3 * estimate), remaining)
        status, measured, details = run_job(document, job, args, work, box, nvml, handle,
                                            29600 + index)
        row.update(status=status, measured=measured, details=details)
        if details.get("params") not in (None, job["params"]) and not smoke:
            row["note"] = (f"the model has {details['params']} parameters, dsplan counted "
                           f"{job['params']}")
            print(f"note: {job['id']}: {row['note']}")
        rows.append(row)
        m = measured
        print(f"== {job['id']}: {status} in {details['wall_seconds']:.0f} s (est. {estimate:.0f})"
              + (f"; allocated {m['max_allocated']}, reserved {m['max_reserved']}, driver "
                 f"{m['driver_peak']}, RSS {m['host_peak_rss']}, step {m['step_seconds']}"
                 if status == "measured" else f"; {details.get('log_tail', '')[-600:]}"))
    out = results_path(args.out_dir, device_name)
    write_results(out, rows, device_name, prediction_file, commit, args, versions)
    if os.environ.get("OUT"):
        if os.path.dirname(os.path.abspath(out)) != os.path.abspath(os.environ["OUT"]):
            shutil.copy(out, os.environ["OUT"])
        with tarfile.open(os.path.join(os.environ["OUT"], "predicted_logs.tar.gz"), "w:gz") as tar:
            for name in sorted(os.listdir(work)):
                if name.endswith((".log", ".json")):
                    tar.add(os.path.join(work, name), arcname=name)
    measured = sum(row["status"] == "measured" for row in rows)
    print(f"== done in {time.time() - start:.0f} s: {measured} of {len(rows)} measured; "
          f"results: {out}")


def write_results(out, rows, device_name, prediction_file, commit, args, versions):
    """Writes the rows, merged with an earlier call's file of the same day and device."""
    document = {"kind": "predicted-vs-measured (issue 35)", "device": device_name,
                "smoke": args.device == "cpu-smoke",
                "prediction_file": rel(prediction_file), "prediction_commit": commit,
                "versions": versions, "calls": [], "rows": []}
    if os.path.isfile(out):
        with open(out) as f:
            earlier = json.load(f)
        if earlier.get("prediction_commit") == commit:
            document = earlier
    document["calls"].append({
        "call": args.call, "jobs": args.jobs,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget": args.budget,
    })
    by_id = {row["id"]: row for row in document["rows"]}
    for row in rows:
        old = by_id.get(row["id"])
        if old is None or old["status"] != "measured" or row["status"] == "measured":
            by_id[row["id"]] = row
    order = {job_id: i for i, job_id in enumerate(by_id)}
    document["rows"] = sorted(by_id.values(), key=lambda row: order[row["id"]])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predictions", default=newest_prediction_file(),
                        help="the prediction file (default: the newest bench/predictions/"
                        "<date>-round*.json)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--call", type=int, help="the jobs the file planned for call N")
    which.add_argument("--jobs", help="these job ids, comma-separated")
    parser.add_argument("--dry", action="store_true", help="check here, without a GPU")
    parser.add_argument("--device", choices=["cuda", "cpu-smoke"], default="cuda",
                        help="cpu-smoke: the whole run on the CPU with 2-layer models, to try "
                        "the kit here (its figures mean nothing; needs --out-dir)")
    parser.add_argument("--smoke", type=int, default=0, metavar="N",
                        help="--dry: also run the first N selected jobs on the CPU")
    parser.add_argument("--budget", type=float, default=530.0,
                        help="seconds for the whole call before results (default 530: run "
                        "with timeout_s 590)")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3"))
    parser.add_argument("--kit", default=os.path.join(ROOT, ".gpukit"))
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results", "gpu"))
    parser.add_argument("--keep", help="work in this directory (kept)")
    args = parser.parse_args()
    if not args.predictions or not os.path.isfile(args.predictions):
        parser.error(f"no prediction file {args.predictions!r}")
    with open(args.predictions) as f:
        document = json.load(f)
    selected = select(document, args.call, args.jobs)
    print_plan(document, selected)
    if not args.dry:
        gpu_run(args, document, selected, args.predictions)
        return 0
    commit, source = prediction_commit(args.predictions, args.kit)
    print(f"== prediction commit: {commit or 'none'} ({source})")
    with tempfile.TemporaryDirectory() as work:
        problems = dry_checks(document, selected, args.python, work)
        if args.smoke:
            problems += smoke(document, selected, args.python, work, args.smoke)
    for problem in problems:
        print(f"error: {problem}")
    print(f"== dry run: {len(selected)} jobs checked, {len(problems)} problem(s); "
          "no result written")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
