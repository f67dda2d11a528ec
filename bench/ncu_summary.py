"""Where a step's GPU time goes: sums Nsight Compute's per-kernel durations by kernel.

    python3 ncu_summary.py PROFILE_CSV --steps N [--json-out FILE]

PROFILE_CSV is `ncu --metrics gpu__time_duration.sum --csv --page raw --print-units base`
output over a run of N training steps (bench/gpu_check.sh's `profile` part). Kernels are grouped
by name (a cuBLASLt kernel's long name cut at its first parenthesis); the table gives, per step,
each group's launches, total time and share, largest first, then the sum of every kernel's time
per step: what the step would take with no gap between kernels. Standard library only.
"""

import argparse
import collections
import csv
import io
import json
import sys


def rows(path):
    """(kernel name, nanoseconds) per launch."""
    text = open(path, errors="replace").read()
    # ncu prints its own lines (==PROF== ...) around the CSV: keep from the header on.
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{path}: no ncu CSV header found")
    reader = csv.DictReader(io.StringIO(text[start:]))
    name_key, time_key = "Kernel Name", "gpu__time_duration.sum"
    for row in reader:
        value = (row.get(time_key) or "").replace(",", "")
        try:
            ns = float(value)
        except ValueError:
            continue  # the units row
        yield row.get(name_key, "?"), ns


def group(name):
    return name.split("(")[0].strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    launches = collections.Counter()
    total = collections.Counter()
    for name, ns in rows(args.csv):
        key = group(name)
        launches[key] += 1
        total[key] += ns
    if not total:
        raise SystemExit(f"{args.csv}: no kernel durations")
    per_step_ms = sum(total.values()) / args.steps / 1e6
    table = [
        {
            "kernel": key,
            "launches_per_step": launches[key] / args.steps,
            "ms_per_step": ns / args.steps / 1e6,
            "share": ns / sum(total.values()),
        }
        for key, ns in total.most_common()
    ]
    print(f"{'kernel':<70} {'launches':>8} {'ms/step':>9} {'share':>6}")
    for r in table:
        print(f"{r['kernel'][:70]:<70} {r['launches_per_step']:>8.1f} {r['ms_per_step']:>9.3f} {r['share']:>6.1%}")
    print(f"kernel time per step: {per_step_ms:.1f} ms over {sum(launches.values()) / args.steps:.0f} launches")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"steps": args.steps, "kernel_ms_per_step": per_step_ms, "kernels": table}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
