"""Paired rounds of dsplan's CPU GPT-2 training step against PyTorch's (bench/README.md).

Each round runs one dsplan measurement and one PyTorch measurement, each in a fresh process,
in alternating order (dsplan first in even rounds, PyTorch first in odd ones), so both see the
same background load. Every process does its own warm-up steps, then timed steps; its result is
the median over its timed steps. Per round the ratio dsplan / PyTorch (tokens/s) is taken;
the summary gives medians and ranges over rounds, and the machine load while measuring: the
load average, and the CPUs kept busy by processes other than the benchmark (from /proc/stat,
less the measured child's own CPU time).

Standard library only (runs under any python3); PyTorch is run with the venv's interpreter.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_jiffies():
    """(busy, total) jiffies over all CPUs from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(label, argv, env):
    """Runs one measurement process; returns its JSON result plus load figures."""
    hz = os.sysconf("SC_CLK_TCK")
    load_before = os.getloadavg()[0]
    jiffies0, child0, wall0 = cpu_jiffies(), children_cpu_s(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    jiffies1, child1, wall1 = cpu_jiffies(), children_cpu_s(), time.monotonic()
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{label} failed with exit code {proc.returncode}: {' '.join(argv)}")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
    if result is None:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{label} printed no JSON result")
    wall = wall1 - wall0
    child_cpu = child1 - child0
    result["wall_s"] = wall
    result["process_cpus"] = child_cpu / wall
    result["loadavg_before"] = load_before
    if jiffies0 and jiffies1:
        busy_cpus = (jiffies1[0] - jiffies0[0]) / hz / wall
        result["other_cpus_busy"] = max(0.0, busy_cpus - child_cpu / wall)
    return result


def other_cpus_now(seconds):
    """CPUs kept busy over `seconds` by everything on the machine (the benchmark is idle)."""
    hz = os.sysconf("SC_CLK_TCK")
    before = cpu_jiffies()
    time.sleep(seconds)
    after = cpu_jiffies()
    if not before or not after:
        return 0.0
    return (after[0] - before[0]) / hz / seconds


def wait_for_quiet(limit_cpus, max_wait_s):
    """Waits (at most `max_wait_s`) until other processes use at most `limit_cpus`."""
    waited = 0.0
    while waited < max_wait_s:
        busy = other_cpus_now(2.0)
        waited += 2.0
        if busy <= limit_cpus:
            return busy
    return busy


def fmt_range(values, digits=1):
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def summarise(title, rounds, args):
    ds = [r["dsplan"]["tokens_per_s"] for r in rounds]
    th = [r["torch"]["tokens_per_s"] for r in rounds]
    ratios = [r["ratio"] for r in rounds]
    others = [r[n].get("other_cpus_busy", float("nan")) for r in rounds for n in ("dsplan", "torch")]
    loads = [r[n]["loadavg_before"] for r in rounds for n in ("dsplan", "torch")]
    print(f"summary of {title}: {args.preset} B={args.batch} T={args.seq}, {args.threads} threads, median [min-max]")
    for key, label in (("dsplan", "dsplan"), ("torch", f"torch {rounds[0]['torch'].get('torch', '')}")):
        values = [r[key]["tokens_per_s"] for r in rounds]
        gf = [r[key]["gflops_6n_attn"] for r in rounds]
        phases = "/".join(
            f"{statistics.median(r[key][p] for r in rounds):.0f}" for p in ("fwd_ms", "bwd_ms", "opt_ms")
        )
        print(f"  {label:<20} {fmt_range(values)} tokens/s, {fmt_range(gf)} GFLOP/s (6N+attn), fwd/bwd/opt {phases} ms")
    print(f"  ratio dsplan/torch   {fmt_range(ratios, 3)}  (per round: {', '.join(f'{x:.3f}' for x in ratios)})")
    print(f"  dsplan tokens/s per round: {', '.join(f'{x:.1f}' for x in ds)}")
    print(f"  torch  tokens/s per round: {', '.join(f'{x:.1f}' for x in th)}")
    print(f"  machine: load average {fmt_range(loads, 2)}, other processes kept {fmt_range(others, 2)} CPUs busy")


def torch_model_name(args):
    if args.torch_model == "nn":
        return "torch.nn in torch_step.py"
    return "transformers LlamaForCausalLM" if args.preset.startswith("llama") else "transformers GPT2LMHeadModel"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsplan-bin", required=True, help="path to the train_bench example binary")
    parser.add_argument("--python", required=True, help="python with torch installed")
    parser.add_argument("--preset", choices=["gpt2", "tiny", "llama-100m"], default="gpt2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps per process")
    parser.add_argument("--torch-model", choices=["hf", "nn"], default="hf")
    parser.add_argument("--torch-attn", choices=["eager", "sdpa"], default="eager")
    parser.add_argument("--json-out", default=None, help="write every measurement here")
    parser.add_argument(
        "--quiet-cpus",
        type=float,
        default=0.1,
        help="a measurement is 'quiet' when other processes kept at most this many CPUs busy",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait for a quiet machine before each round (0: do not wait)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="re-runs of a round whose measurements were not quiet (the disturbed one is kept too)",
    )
    args = parser.parse_args()

    # cpu-anchors.md: 2 warm-up + 5 timed steps for gpt2, 15 timed for gpt2-tiny.
    small = args.preset == "tiny"
    steps = args.steps or (15 if small else 5)
    warmup = args.warmup if args.warmup is not None else (3 if small else 2)
    shape = ["--preset", args.preset, "--batch", str(args.batch), "--seq", str(args.seq)]
    shape += ["--steps", str(steps), "--warmup", str(warmup), "--threads", str(args.threads)]

    env = dict(os.environ)
    threads = str(args.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, RAYON_NUM_THREADS=threads)
    runs = {
        "dsplan": [args.dsplan_bin] + shape,
        "torch": [args.python, os.path.join(HERE, "torch_step.py"), "--model", args.torch_model]
        + ["--attn", args.torch_attn]
        + shape,
    }

    print(
        f"paired benchmark: {args.preset} B={args.batch} T={args.seq}, {args.threads} threads, "
        f"{args.rounds} rounds, {warmup} warm-up + {steps} timed steps per process, "
        f"PyTorch model: {torch_model_name(args)} ({args.torch_attn} attention)",
        flush=True,
    )
    rounds = []
    for r in range(args.rounds):
        order = ["dsplan", "torch"] if r % 2 == 0 else ["torch", "dsplan"]
        for attempt in range(args.retries + 1):
            if args.quiet_wait > 0:
                busy = wait_for_quiet(args.quiet_cpus, args.quiet_wait)
                if busy > args.quiet_cpus:
                    print(f"  (machine still busy: {busy:.2f} CPUs used by others; measuring anyway)")
            results = {}
            for name in order:
                results[name] = measure(name, runs[name], env)
                res = results[name]
                print(
                    f"  round {r + 1} {name:<6}: {res['tokens_per_s']:8.1f} tokens/s  "
                    f"fwd/bwd/opt {res['fwd_ms']:.0f}/{res['bwd_ms']:.0f}/{res['opt_ms']:.0f} ms  "
                    f"process {res['process_cpus']:.2f} CPUs, others {res.get('other_cpus_busy', float('nan')):.2f} CPUs, "
                    f"load {res['loadavg_before']:.2f}",
                    flush=True,
                )
            ratio = results["dsplan"]["tokens_per_s"] / results["torch"]["tokens_per_s"]
            quiet = all(res.get("other_cpus_busy", 0.0) <= args.quiet_cpus for res in results.values())
            print(f"  round {r + 1} ratio dsplan/torch: {ratio:.3f}{'' if quiet else '  (disturbed)'}", flush=True)
            rounds.append({"round": r + 1, "order": order, "ratio": ratio, "quiet": quiet, **results})
            if quiet:
                break

    print()
    summarise(f"all {len(rounds)} rounds", rounds, args)
    quiet_rounds = [r for r in rounds if r["quiet"]]
    if quiet_rounds and len(quiet_rounds) < len(rounds):
        summarise(
            f"the {len(quiet_rounds)} quiet rounds (others <= {args.quiet_cpus} CPUs)", quiet_rounds, args
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
