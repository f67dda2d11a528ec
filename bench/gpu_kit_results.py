"""Gathers what bench/gpu_check.sh measured into one results JSON (issue 16's shape, plus
the kit's own keys) and prints the summary tables last.

    python3 gpu_kit_results.py WORK_DIR --out FILE [--copy-to DIR] [--dry]

WORK_DIR holds the parts' outputs (see gpu_check.sh): `parts.tsv` (name, status, seconds,
exit code), `report.json`, `check.json`, `dsplan_stage{N}.json` and `.jsonl` (W = 1;
`dsplan_stage0_tc.*` is stage 0 with --attention-kernel tensor-core, its own row with
`"attention": "tensor-core"`; the others say `"scalar"`),
`dsplan_w2_stage{N}.json` and `.jsonl` (W = 2 thread ranks on one GPU; `world_size: 2` rows
of `gpt2_124m_bf16`, memory of rank 0 with every rank's in `ranks_allocated_bytes`), (and
`dsplan_llama*.json` / `.jsonl`),
`torch_{eager,compile}.json`, `ds/*.json` (ds_memory.py's lines) and `ds/*.estimate.json`
(`dsplan estimate --format json`), `tests_*.log`. A missing file leaves its keys null and
its part's status says why; nothing is invented. Standard library only.
"""

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peaks import flops_per_token, peak_flops  # noqa: E402

GPT2 = {"params": 124_439_808, "wpe": 1024 * 768, "layers": 12, "embd": 768}


def load(path):
    """The JSON in `path` (the last line that parses, for logs), or None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        for line in reversed(text.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def parts(work):
    rows = []
    try:
        with open(os.path.join(work, "parts.tsv")) as f:
            for line in f:
                name, status, seconds, rc, *note = line.rstrip("\n").split("\t")
                rows.append(
                    {"part": name, "status": status, "seconds": float(seconds), "exit_code": int(rc),
                     "note": note[0] if note else ""}
                )
    except OSError:
        pass
    return rows


def kernels_and_step(check):
    if not check or "rows" not in check:
        reason = check.get("reason") if isinstance(check, dict) else "no check output"
        return {"passed": 0, "failed": 0, "checks": [], "not_run": reason}, None
    rows = check["rows"]
    checks = [
        {
            "name": r["name"],
            "kind": r["kind"],
            "dtype": r["dtype"],
            "metric": r["metric"],
            "error": r["error"],
            "max_abs_err": r["max_abs_err"],
            "tol": r["tol"],
            "verdict": r["verdict"],
            "detail": r.get("detail"),
        }
        for r in rows
        if r["kind"] != "train-step"
    ]
    kernels = {
        "passed": sum(c["verdict"] == "pass" for c in checks),
        "failed": sum(c["verdict"] == "fail" for c in checks),
        "skipped": sum(c["verdict"] == "skipped" for c in checks),
        "checks": checks,
    }
    step_rows = [r for r in rows if r["kind"] == "train-step"]
    step = None
    if step_rows:
        rel = [r["error"] for r in step_rows if r["metric"] in ("scalar-relative", "update-norm")]
        step = {
            "passed": all(r["verdict"] == "pass" for r in step_rows),
            "max_rel_err": max((x for x in rel if x is not None), default=None),
            "rows": step_rows,
        }
    return kernels, step


def run_figures(work, name, warmup):
    """`dsplan_{name}.json` (the run's summary), the median tokens/s of its `.jsonl` steps after
    `warmup` (the last step when there are no more), and how many steps that median is over."""
    summary = load(os.path.join(work, f"dsplan_{name}.json"))
    try:
        with open(os.path.join(work, f"dsplan_{name}.jsonl")) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        steps = []
    timed = [s["tokens_per_s"] for s in steps[warmup:]] or [s["tokens_per_s"] for s in steps[-1:]]
    rate = statistics.median(timed) if timed else None
    return summary, rate, len(steps[warmup:])


def dsplan_llama(work, variant, warmup):
    """The ~100M LLaMA run `variant` (llama: keeping activations, llama_ckpt: recomputing each
    block): tokens/s, device memory against the plan, and the losses."""
    summary, rate, timed_steps = run_figures(work, variant, warmup)
    memory = (summary or {}).get("device_memory") or {}
    return {
        "variant": variant,
        "activation_checkpointing": variant.endswith("_ckpt"),
        "tokens_per_s": rate,
        "timed_steps": timed_steps,
        "device_peak_bytes": memory.get("driver_used"),
        # Shared with DeepSpeed's memory runs: the driver's figure counts theirs too.
        "device_peak_counts_other_processes": True,
        "device_allocated_bytes": memory.get("peak_total"),
        "plan_peak_bytes": memory.get("plan_peak_total"),
        "first_loss": (summary or {}).get("first_loss"),
        "final_loss": (summary or {}).get("final_loss"),
    }


def dsplan_stage(work, stage, warmup, torch_runs, batch, seq, dry, world=1, attention="scalar"):
    name = f"stage{stage}" if world == 1 else f"w{world}_stage{stage}"
    if attention == "tensor-core":
        name += "_tc"
    summary, rate, timed_steps = run_figures(work, name, warmup)
    row = {"stage": stage, "world_size": world, "micro_batch": batch, "seq_len": seq,
           "attention": attention}
    device = (summary or {}).get("device") or ""
    peak = peak_flops(device)
    per_token = flops_per_token(GPT2["params"], GPT2["wpe"], GPT2["layers"], GPT2["embd"], seq)
    memory = (summary or {}).get("device_memory") or {}
    cpu_memory = (summary or {}).get("memory") or {}
    row.update(
        {
            "tokens_per_s": rate,
            "timed_steps": timed_steps,
            "mfu": rate * per_token / peak if (rate and peak and not dry) else None,
            "mfu_whole_run_reported": (summary or {}).get("mfu"),
            "torch_eager_tokens_per_s": (torch_runs.get("eager") or {}).get("tokens_per_s"),
            "torch_compile_tokens_per_s": (torch_runs.get("compile") or {}).get("tokens_per_s"),
            # Measured: the driver's in-use bytes after the run (context and workspaces
            # included); allocated: the device step's buffers; plan: `dsplan plan --backend
            # dsplan-cuda`'s peak for the same config.
            "device_peak_bytes": memory.get("driver_used"),
            # The driver's figure less what it was before the step's buffers (context,
            # communicator, cuBLASLt): what the run added, against the plan.
            "device_added_bytes": memory.get("driver_added"),
            "device_allocated_bytes": memory.get("peak_total"),
            "plan_peak_bytes": memory.get("plan_peak_total"),
            "first_loss": (summary or {}).get("first_loss"),
            "final_loss": (summary or {}).get("final_loss"),
        }
    )
    if world > 1:
        # Every rank's device buffers (the summary's `memory.ranks`); the GPU's tokens/s is
        # the whole job's (both ranks share it), so MFU is of the one GPU.
        ranks = (cpu_memory.get("ranks") or []) if isinstance(cpu_memory, dict) else []
        row["ranks_allocated_bytes"] = [r.get("peak_total") for r in ranks]
        # These runs share the GPU with DeepSpeed's memory runs (gpu_check.sh, part 4), so
        # the driver's figure counts their memory too.
        row["device_peak_counts_other_processes"] = True
        if not dry:
            for key in ("torch_eager_tokens_per_s", "torch_compile_tokens_per_s"):
                row[key] = None
    if dry and cpu_memory:
        ranks = cpu_memory.get("ranks") or [{}]
        row["cpu_measured_peak_bytes"] = ranks[0].get("peak_total")
        row["cpu_plan_peak_bytes"] = (cpu_memory.get("plan") or {}).get("peak_total")
    return row


def deepspeed_rows(work):
    rows = []
    for estimate_path in sorted(glob.glob(os.path.join(work, "ds", "*.estimate.json"))):
        stem = estimate_path[: -len(".estimate.json")]
        run = load(stem + ".run.json") or {}
        spec = load(stem + ".spec.json") or {}
        estimate = load(estimate_path) or {}
        tensors = load(stem + ".estimate_tensors.json") or {}

        def gpu_peak(e):
            return (((e.get("full") or {}).get("peaks") or {}).get("gpu") or {}).get("bytes")

        row = dict(spec)
        row.update(
            {
                "max_allocated": run.get("max_allocated"),
                "max_reserved": run.get("max_reserved"),
                "dsplan_estimate_peak": gpu_peak(estimate),
                "dsplan_estimate_tensors_peak": gpu_peak(tensors),
                # DeepSpeed's own estimator for this config, as `dsplan estimate` reproduces it.
                "deepspeed_estimator_gpu_bytes": ((estimate.get("full") or {}).get("deepspeed") or {}).get("gpu_bytes"),
                "run_seconds": run.get("seconds"),
                "losses": run.get("losses"),
                # The allocator's counters after initialize and each step's phases (ds_memory.py).
                "phases": run.get("phases"),
                "status": "measured" if run.get("max_allocated") is not None else (
                    "estimate only (dry run)" if spec.get("dry") else "not measured (see the part's log)"
                ),
            }
        )
        if row["max_allocated"] and row["dsplan_estimate_tensors_peak"]:
            row["ratio_tensors_estimate_to_allocated"] = row["dsplan_estimate_tensors_peak"] / row["max_allocated"]
        if row["max_reserved"] and row["dsplan_estimate_peak"]:
            row["ratio_estimate_to_reserved"] = row["dsplan_estimate_peak"] / row["max_reserved"]
        rows.append(row)
    return rows


def adamw_bandwidth(profile, copy, params=GPT2["params"], grad_bytes=2):
    """The fused AdamW kernel's bandwidth over the device's copy bandwidth, from the `profile`
    part (its duration in one stage-0 step) and `copy_bandwidth`. The kernel reads the fp32
    master weights and both fp32 moments and the 16-bit gradients, and writes the three fp32
    buffers and the 16-bit parameters: `3·4·2 + 2·grad_bytes` bytes per parameter."""
    if not profile or not copy:
        return None, "not measured: no `profile` or `copy_bandwidth`"
    kernels = [k for k in profile.get("kernels", []) if k["kernel"].startswith("adamw_")]
    if not kernels or not copy.get("bytes_per_s"):
        return None, "not measured: no adamw_* kernel in the profile"
    seconds = sum(k["ms_per_step"] for k in kernels) / 1e3
    moved = params * (3 * 4 * 2 + 2 * grad_bytes)
    achieved = moved / seconds
    return achieved / copy["bytes_per_s"], (
        f"{kernels[0]['kernel']}: {moved / 1e9:.3f} GB in {seconds * 1e3:.3f} ms = "
        f"{achieved / 1e12:.2f} TB/s against a {copy['bytes_per_s'] / 1e12:.2f} TB/s copy"
    )


def test_counts(work):
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "tests_*.log"))):
        name = os.path.basename(path)[len("tests_"):-len(".log")]
        with open(path, errors="replace") as f:
            text = f.read()
        match = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", text)
        if match:
            result, passed, failed, ignored = match[-1]
            out[name] = {"result": result, "passed": int(passed), "failed": int(failed), "ignored": int(ignored)}
        else:
            out[name] = {"result": "no summary line (timed out or did not start)"}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work")
    parser.add_argument("--out", required=True)
    parser.add_argument("--copy-to")
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--stages", default="0 1 2 3")
    parser.add_argument("--w2-batch", type=int, default=8)
    parser.add_argument("--w2-stages", default="1 2 3")
    args = parser.parse_args()
    work = args.work

    report = load(os.path.join(work, "report.json")) or {}
    machine = report.get("machine") or {}
    gpus = machine.get("gpus") or []
    driver = machine.get("driver") or {}
    check = (load(os.path.join(work, "check.json")) or {}).get("check")
    kernels, step = kernels_and_step(check)
    torch_runs = {m: load(os.path.join(work, f"torch_{m}.json")) for m in ("eager", "compile")}
    device = gpus[0]["name"] if gpus else ("cpu (dry run)" if args.dry else "unknown")
    results = {
        "device": device,
        "driver": driver.get("version"),
        "cuda": driver.get("cuda_version"),
        "date": datetime.date.today().isoformat(),
        "dsplan_commit": args.commit,
        "dry_run": args.dry,
        "kernels": kernels,
        "step_vs_cpu": step,
        "gpt2_124m_bf16": [
            dsplan_stage(work, int(s), args.warmup, torch_runs, args.batch, args.seq, args.dry)
            for s in args.stages.split()
        ]
        + [dsplan_stage(work, int(s), args.warmup, torch_runs, args.batch, args.seq, args.dry,
                        attention="tensor-core")
           for s in args.stages.split()]
        + [
            dsplan_stage(work, int(s), args.warmup, torch_runs, args.w2_batch, args.seq, args.dry, 2)
            for s in args.w2_stages.split()
        ],
        "llama_100m_bf16": [dsplan_llama(work, v, args.warmup) for v in ("llama", "llama_ckpt")],
        "torch": torch_runs,
        "profile": load(os.path.join(work, "profile_summary.json")),
        "profile_tensor_core_attention": load(os.path.join(work, "profile_tc_summary.json")),
        "copy_bandwidth": load(os.path.join(work, "copy_bandwidth.json")),
        "deepspeed_memory": deepspeed_rows(work),
        "gpu_tests": test_counts(work),
        "parts": parts(work),
        "machine": machine,
    }
    results["adamw_bandwidth_fraction"], results["adamw_bandwidth_note"] = adamw_bandwidth(
        results["profile"], results["copy_bandwidth"]
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    if args.copy_to:
        os.makedirs(args.copy_to, exist_ok=True)
        shutil.copy(args.out, args.copy_to)
    print_tables(results, args.out)


def fmt_bytes(n):
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n / 2**20:.2f} MiB"


def fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def print_tables(r, path):
    print(f"\n== results ({'DRY RUN on the CPU: no GPU figures' if r['dry_run'] else r['device']}) -> {path}")
    print(f"{'part':<28} {'status':<10} {'s':>6}  note")
    for p in r["parts"]:
        print(f"{p['part']:<28} {p['status']:<10} {p['seconds']:>6.0f}  {p['note']}")
    k = r["kernels"]
    print(f"\nkernels: {k.get('passed')} passed, {k.get('failed')} failed, {k.get('skipped', 0)} skipped"
          + (f" (not run: {k['not_run']})" if k.get("not_run") else ""))
    for c in k.get("checks", []):
        if c["verdict"] == "fail":
            print(f"  FAIL {c['name']} [{c['dtype']}]: {c['error']} > {c['tol']} {c.get('detail') or ''}")
    s = r["step_vs_cpu"]
    print("step vs CPU: " + ("not run" if s is None else f"passed={s['passed']} max_rel_err={s['max_rel_err']}"))
    for name, t in r["gpu_tests"].items():
        print(f"tests {name}: {t}")
    print(f"\n{'stage':>5} {'W':>2} {'attention':>11} {'tokens/s':>10} {'MFU':>7} {'eager':>9} {'compile':>9} {'measured':>10} {'allocated':>10} {'plan':>10}")
    if r["dry_run"]:
        print("(dry run: tiny-gpt2 on the CPU; memory columns are the CPU rank's measured peak and its plan)")
    for g in r["gpt2_124m_bf16"]:
        if r["dry_run"]:
            g = dict(g, device_peak_bytes=g.get("cpu_measured_peak_bytes"), plan_peak_bytes=g.get("cpu_plan_peak_bytes"))
        print(f"{g['stage']:>5} {g['world_size']:>2} {g.get('attention', 'scalar'):>11} {fmt(g['tokens_per_s']):>10} {fmt(g['mfu'], '{:.1%}'):>7} "
              f"{fmt(g['torch_eager_tokens_per_s']):>9} {fmt(g['torch_compile_tokens_per_s']):>9} "
              f"{fmt_bytes(g['device_peak_bytes']):>10} {fmt_bytes(g['device_allocated_bytes']):>10} "
              f"{fmt_bytes(g['plan_peak_bytes']):>10}")
    print(f"\n{'llama ~100M bf16':<18} {'tokens/s':>10} {'measured':>10} {'allocated':>10} {'plan':>10} {'loss':>15}")
    for g in r["llama_100m_bf16"]:
        loss = f"{fmt(g['first_loss'], '{:.3f}')}->{fmt(g['final_loss'], '{:.3f}')}"
        print(f"{g['variant']:<18} {fmt(g['tokens_per_s']):>10} {fmt_bytes(g['device_peak_bytes']):>10} "
              f"{fmt_bytes(g['device_allocated_bytes']):>10} {fmt_bytes(g['plan_peak_bytes']):>10} {loss:>15}")
    print(f"\n{'model':<12} {'st':>2} {'offload':>7} {'max_alloc':>10} {'max_resv':>10} {'est':>10} {'est/resv':>8} "
          f"{'tensors':>10} {'t/alloc':>7}  status")
    for d in r["deepspeed_memory"]:
        print(f"{d.get('model', '?'):<12} {d.get('stage', '?'):>2} {d.get('offload_optimizer', '?'):>7} "
              f"{fmt_bytes(d['max_allocated']):>10} {fmt_bytes(d['max_reserved']):>10} "
              f"{fmt_bytes(d['dsplan_estimate_peak']):>10} {fmt(d.get('ratio_estimate_to_reserved'), '{:.3f}'):>8} "
              f"{fmt_bytes(d['dsplan_estimate_tensors_peak']):>10} "
              f"{fmt(d.get('ratio_tensors_estimate_to_allocated'), '{:.3f}'):>7}  {d['status']}")


if __name__ == "__main__":
    main()
