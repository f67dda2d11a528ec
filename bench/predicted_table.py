"""Predicted against measured (issue 35): the rows of one or more
`bench/results/gpu/*-predicted.json` files, their ratios, and a summary against the issue's
targets.

    python3 bench/predicted_table.py bench/results/gpu/2026-12-01-nvidia-h200-predicted.json \
        [more results files] [--json-out FILE] [--repo DIR]

Before any ratio, every row is traced to its predictions: the prediction file named by the row
is read as it was at the row's `prediction_commit` (`git show COMMIT:FILE` in `--repo`, default
this checkout), and the row's `predicted` values and its job must equal that file's, number
for number. A row that does not trace is an integrity error: the table is still printed, and
the exit status is 2.

Ratios are predicted / measured:
  live      predicted live tensors / max_memory_allocated      target within 3 %
  reserved  predicted GPU peak / max_memory_reserved           target within 5 %
  driver    predicted GPU peak / the driver's peak             shown, no target
  host      predicted host peak / peak RSS                     target within 10 % (offload jobs)
  step      predicted step seconds / measured step seconds     target within 15 %
The targets are the prediction file's own (`targets`). Rows not measured (failed, timeout,
skipped) are listed and count against no target. A later results file replaces an earlier
one's row of the same job unless it did not measure it. Standard library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import predict  # noqa: E402

GIB = 1 << 30
# name, predicted key, measured key, target key, which jobs the target applies to
RATIOS = [
    ("live", "live_tensors", "max_allocated", "live_tensors", "all"),
    ("reserved", "gpu_peak", "max_reserved", "gpu_peak", "all"),
    ("driver", "gpu_peak", "driver_peak", None, "all"),
    ("host", "host_peak", "host_peak_rss", "host_peak", "offload"),
    ("step", "step_seconds", "step_seconds", "step_seconds", "all"),
]


def offloads(job):
    return job["offload_optimizer"] != "none" or job["offload_param"] != "none"


class Predictions:
    """Prediction files as committed, read once per (commit, path)."""

    def __init__(self, repo):
        self.repo = repo
        self.files = {}

    def job(self, commit, path, job_id):
        key = (commit, path)
        if key not in self.files:
            done = subprocess.run(["git", "-C", self.repo, "show", f"{commit}:{path}"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                self.files[key] = f"git show {commit}:{path} failed: {done.stderr.strip()}"
            else:
                document = json.loads(done.stdout)
                self.files[key] = {job["id"]: job for job in document["jobs"]}
                self.files[key]["__targets__"] = document["targets"]
        found = self.files[key]
        if isinstance(found, str):
            return None, None, found
        if job_id not in found:
            return None, None, f"{path} at {commit} has no job {job_id}"
        return found[job_id], found["__targets__"], None


def load_rows(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            document = json.load(f)
        if document.get("smoke"):
            raise SystemExit(f"error: {path} is a cpu-smoke run of the kit, not a measurement")
        for row in document.get("rows", []):
            old = rows.get(row["id"])
            if old is None or old[0]["status"] != "measured" or row["status"] == "measured":
                rows[row["id"]] = (row, os.path.basename(path))
    return list(rows.values())


def trace(row, predictions):
    """The row's committed job and targets, or why the row does not trace."""
    commit, path = row.get("prediction_commit"), row.get("prediction_file")
    if not commit or not path:
        return None, None, "no prediction_commit or prediction_file"
    job, targets, problem = predictions.job(commit, path, row["id"])
    if problem:
        return None, None, problem
    if row.get("predicted") != job["predicted"]:
        return None, None, (f"predicted {row.get('predicted')} differs from {path} at "
                            f"{commit[:12]}: {job['predicted']}")
    if row.get("job") != predict.job_record(job):
        return None, None, f"the job differs from {path} at {commit[:12]}"
    return job, targets, None


def ratios(row, job):
    values = {}
    for name, predicted_key, measured_key, _, _ in RATIOS:
        measured = (row.get("measured") or {}).get(measured_key)
        predicted = row["predicted"][predicted_key]
        values[name] = predicted / measured if measured else None
    return values


def summarise(table, targets):
    summary = {}
    for name, _, _, target_key, scope in RATIOS:
        if target_key is None:
            continue
        limit = targets[target_key]
        values = [(entry["ratios"][name], entry["id"]) for entry in table
                  if entry["status"] == "measured" and entry["ratios"][name] is not None
                  and (scope == "all" or entry["offload"])]
        within = [v for v, _ in values if abs(v - 1) <= limit]
        worst = max(values, key=lambda item: abs(item[0] - 1)) if values else None
        summary[name] = {
            "target": limit, "scope": scope, "jobs": len(values), "within": len(within),
            "min": min(v for v, _ in values) if values else None,
            "median": statistics.median(v for v, _ in values) if values else None,
            "max": max(v for v, _ in values) if values else None,
            "worst": {"id": worst[1], "ratio": worst[0]} if worst else None,
            "met": bool(values) and len(within) == len(values),
        }
    return summary


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(table, summary, problems):
    lines = ["| job | status | live / alloc | GPU / reserved | GPU / driver | host / RSS |"
             " step / measured | alloc GiB | reserved GiB | RSS GiB | step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in table:
        r, m = entry["ratios"], entry["measured"] or {}
        host = fmt(r["host"]) + ("" if entry["offload"] or r["host"] is None else " (no target)")
        lines.append(
            f"| {entry['id']} | {entry['status']} | {fmt(r['live'])} | {fmt(r['reserved'])} | "
            f"{fmt(r['driver'])} | {host} | {fmt(r['step'])} | "
            f"{fmt(m.get('max_allocated') and m['max_allocated'] / GIB, 2)} | "
            f"{fmt(m.get('max_reserved') and m['max_reserved'] / GIB, 2)} | "
            f"{fmt(m.get('host_peak_rss') and m['host_peak_rss'] / GIB, 2)} | "
            f"{fmt(m.get('step_seconds'))} |")
    lines += ["", "| quantity | target | jobs within | min | median | max | worst | met |",
              "|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        scope = " (offload jobs)" if s["scope"] == "offload" else ""
        worst = f"{s['worst']['id']} {s['worst']['ratio']:.3f}" if s["worst"] else "-"
        lines.append(f"| {name}{scope} | {s['target']:.0%} | {s['within']} of {s['jobs']} | "
                     f"{fmt(s['min'])} | {fmt(s['median'])} | {fmt(s['max'])} | {worst} | "
                     f"{'yes' if s['met'] else 'no'} |")
    for problem in problems:
        lines.append(f"\nINTEGRITY: {problem}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--repo", default=ROOT, help="the git repository holding the "
                        "prediction files' history (default: this checkout)")
    parser.add_argument("--json-out", help="also write rows, ratios and summary as JSON")
    args = parser.parse_args()
    predictions = Predictions(args.repo)
    table, problems, targets = [], [], None
    for row, source in load_rows(args.results):
        job, row_targets, problem = trace(row, predictions)
        if problem:
            problems.append(f"{source} row {row['id']}: {problem}")
            continue
        if targets is not None and row_targets != targets:
            problems.append(f"{source} row {row['id']}: its prediction file has other targets")
            continue
        targets = row_targets
        table.append({"id": row["id"], "status": row["status"], "offload": offloads(job),
                      "measured": row.get("measured"), "predicted": row["predicted"],
                      "prediction_commit": row["prediction_commit"], "source": source,
                      "ratios": ratios(row, job) if row["status"] == "measured"
                      else {name: None for name, *_ in RATIOS}})
    summary = summarise(table, targets) if targets else {}
    sys.stdout.write(markdown(table, summary, problems))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": table, "summary": summary, "integrity_problems": problems}, f,
                      indent=1)
            f.write("\n")
    return 2 if problems or not table else 0


if __name__ == "__main__":
    sys.exit(main())
