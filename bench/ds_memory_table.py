"""DeepSpeed's measured GPU memory from one or more GPU-kit results, held against `dsplan
estimate` of this checkout (issue 16, step 2).

    python3 bench/ds_memory_table.py RESULTS.json [RESULTS.json ...] --dsplan BIN --out FILE

Each run (model, stage, offload) is taken from the last results file that measured it (a
rerun that measured only what an earlier run missed completes it). Its DeepSpeed config is
written again by `ds_memory.py --write-config-only` (the same function wrote the measured
one), and `BIN estimate` is asked twice: as the kit asks (with the CUDA-context and
fragmentation margins, against `max_memory_reserved`) and without the margins (the live
tensors, against `max_memory_allocated`). Prints the table and writes the rows as JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def estimate(dsplan, config, model, seq, margins):
    command = [dsplan, "estimate", "--config", config, "--model", model, "--seq-len", str(seq),
               "--flash-attention", "--format", "json"]
    if not margins:
        command += ["--cuda-context", "0B", "--fragmentation", "0"]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["full"]["peaks"]["gpu"]["bytes"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--dsplan", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    runs = {}
    for path in args.results:
        with open(path) as f:
            results = json.load(f)
        for row in results.get("deepspeed_memory", []):
            if row.get("status") == "measured":
                key = (row["model"], row["stage"], row["offload_optimizer"])
                runs[key] = dict(row, measured_in=os.path.basename(path), device=results["device"])
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for (model, stage, offload), run in sorted(runs.items()):
            config = os.path.join(work, f"{model}_z{stage}_{offload}.json")
            subprocess.run([sys.executable, os.path.join(HERE, "ds_memory.py"), "--model", model,
                            "--stage", str(stage), "--offload-optimizer", offload, "--micro-batch",
                            str(run["micro_batch"]), "--seq", str(run["seq_len"]), "--config-out",
                            config, "--write-config-only"], check=True)
            full = estimate(args.dsplan, config, model, run["seq_len"], margins=True)
            tensors = estimate(args.dsplan, config, model, run["seq_len"], margins=False)
            rows.append({
                "model": model, "stage": stage, "offload_optimizer": offload,
                "micro_batch": run["micro_batch"], "seq_len": run["seq_len"],
                "device": run["device"], "measured_in": run["measured_in"],
                "max_allocated": run["max_allocated"], "max_reserved": run["max_reserved"],
                "dsplan_estimate_peak": full, "dsplan_estimate_tensors_peak": tensors,
                "ratio_tensors_to_allocated": tensors / run["max_allocated"],
                "ratio_estimate_to_reserved": full / run["max_reserved"],
            })
    gib = 2**30
    print(f"{'model':<12} {'st':>2} {'offload':>7} {'alloc':>8} {'tensors':>8} {'t/alloc':>7}"
          f" {'resv':>8} {'est':>8} {'est/resv':>8}  measured on")
    for r in rows:
        print(f"{r['model']:<12} {r['stage']:>2} {r['offload_optimizer']:>7}"
              f" {r['max_allocated'] / gib:>8.2f} {r['dsplan_estimate_tensors_peak'] / gib:>8.2f}"
              f" {r['ratio_tensors_to_allocated']:>7.3f} {r['max_reserved'] / gib:>8.2f}"
              f" {r['dsplan_estimate_peak'] / gib:>8.2f} {r['ratio_estimate_to_reserved']:>8.3f}"
              f"  {r['device']} ({r['measured_in']})")
    with open(args.out, "w") as f:
        json.dump({"dsplan_estimate_from": "this checkout", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
