#!/usr/bin/env python3
"""Fine-tuning data in `dsplan run`, timed through the binary (issue 31's speed items).

1. Time to the first step on a cached dataset: a ~100 MB JSONL of text rows (the fixtures'
   texts, each row's number woven in) is prepared once (tokenized and cached next to the data),
   then `dsplan run` is started again on it; the script reads stderr as it arrives and prints
   the seconds from launch to the `data:` line (the cache read) and to the first step's line.
2. Training tokens/s on the JSONL against the same run on pre-tokenized data: the cached run
   writes its micro-batches (`--save-batches`), and `dsplan run --data batches.safetensors`
   trains on them (the same batches, padded to the same shape: the losses are equal, and
   checked so). The two runs alternate, `--rounds` pairs of `--steps` steps each; the script
   prints each run's median step tokens/s (from `--metrics`), each pair's ratio and the
   median ratio JSONL / pre-tokenized (the target: within 3 %).

    python3 bench/sft_data_speed.py --dsplan-bin target/release/dsplan [--megabytes 100]
        [--steps 100] [--rounds 5] [--shared ../shared]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_jsonl(source: Path, target: Path, megabytes: int) -> int:
    """Writes `megabytes` of JSONL text rows from `source`, each with its row number."""
    lines = [l for l in source.read_text().splitlines() if l.strip()]
    marker = '"text": "'
    written, row, limit = 0, 0, megabytes << 20
    with target.open("w") as out:
        while written < limit:
            line = lines[row % len(lines)].replace(marker, f"{marker}row {row}: ", 1)
            out.write(line + "\n")
            written += len(line) + 1
            row += 1
    return written


def timed_run(command: list[str]) -> tuple[float | None, float | None, float, str]:
    """Runs `command`; seconds from launch to the `data:` line, to the first step line, and
    to exit, and stderr."""
    start = time.monotonic()
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True)
    data_at = first_step_at = None
    seen = []
    assert process.stderr is not None
    for line in process.stderr:
        now = time.monotonic() - start
        seen.append(line)
        if data_at is None and line.startswith("data:"):
            data_at = now
        if first_step_at is None and "step=1," in line:
            first_step_at = now
    code = process.wait()
    if code != 0:
        sys.exit(f"{' '.join(command)} exited {code}:\n{''.join(seen[-20:])}")
    return data_at, first_step_at, time.monotonic() - start, "".join(seen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsplan-bin", default=str(ROOT / "target/release/dsplan"))
    parser.add_argument("--shared", default=os.environ.get("DSPLAN_SHARED_DIR",
                                                           str(ROOT.parent / "shared")))
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sft = Path(args.shared) / "reference/sft"
    run_dir = sft / "runs/text"
    run = json.loads((run_dir / "run.json").read_text())
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        ds = work / "ds_config.json"
        ds_config = dict(run["ds_config_input"], steps_per_print=1)
        ds.write_text(json.dumps(ds_config))
        training = work / "sft_config.json"
        training.write_text(json.dumps(run["sft_config_explicit"]))
        model = str(sft / run["model"])
        base = [args.dsplan_bin, "run", str(ds), "--model", model, "--training-args",
                str(training), "--device", "cpu"]

        big = work / "big.jsonl"
        size = build_jsonl(sft / "data/text.jsonl", big, args.megabytes)
        command = base + ["--data", str(big), "--steps", "1"]
        data_at, _, total, stderr = timed_run(command)
        data_line = next(l for l in stderr.splitlines() if l.startswith("data:"))
        print(f"{size / 1e6:.1f} MB JSONL, first run (tokenized and cached): data ready at "
              f"{data_at:.2f} s, done at {total:.2f} s\n  {data_line}")
        data_at, first_step_at, total, _ = timed_run(command)
        print(f"cached re-run: data ready at {data_at:.2f} s, first step done at "
              f"{first_step_at:.2f} s after launch ({first_step_at - data_at:.2f} s after the "
              f"data), exit at {total:.2f} s")

        batches = work / "batches.safetensors"
        steps = ["--steps", str(args.steps), "--format", "json"]
        jsonl = base + ["--data", str(big)] + steps
        subprocess.run(jsonl + ["--save-batches", str(batches)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        recorded = base + ["--data", str(batches)] + steps
        ratios = []
        for round_ in range(args.rounds):
            pair = [("jsonl", jsonl), ("pre-tokenized", recorded)]
            if round_ % 2:
                pair.reverse()
            summary, rate = {}, {}
            for name, command in pair:
                metrics = work / f"{name}.metrics.jsonl"
                done = subprocess.run(command + ["--metrics", str(metrics)], capture_output=True,
                                      text=True)
                if done.returncode != 0:
                    sys.exit(f"{name} run exited {done.returncode}:\n{done.stderr[-2000:]}")
                summary[name] = json.loads(done.stdout)
                # The median step (the first left out: it warms the caches), so that a step
                # slowed by other work on the machine does not move the figure.
                steps = [json.loads(l) for l in metrics.read_text().splitlines()]
                rate[name] = statistics.median(
                    s["tokens_per_s"] for s in steps[1:] if "tokens_per_s" in s)
            same = summary["jsonl"]["final_loss"] == summary["pre-tokenized"]["final_loss"]
            if not same:
                sys.exit(f"the runs differ: final loss {summary['jsonl']['final_loss']} vs "
                         f"{summary['pre-tokenized']['final_loss']}")
            ratios.append(rate["jsonl"] / rate["pre-tokenized"])
            print(f"round {round_ + 1}: median step JSONL {rate['jsonl']:,.0f} tokens/s, "
                  f"pre-tokenized "
                  f"{rate['pre-tokenized']:,.0f} tokens/s, ratio {ratios[-1]:.3f} "
                  f"(same final loss {summary['jsonl']['final_loss']:.6f})")
        print(f"{args.steps} steps a run, {args.rounds} pairs: median JSONL / pre-tokenized "
              f"tokens/s = {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
