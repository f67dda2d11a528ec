"""dsplan's offload Adam against DeepSpeedCPUAdam, paired, on the same cores (bench/README.md).

Runs under the venv's python (torch 2.15.0, deepspeed 0.19.8). Each round starts a fresh
dsplan worker (`offload_adam_bench serve`) and builds a fresh DeepSpeedCPUAdam over its own
copy of the same data in this process (64M fp32 parameters by default); both then step in
cycles, alternately, the order swapped every cycle (cpu-anchors.md §3b). Per cycle and per
comparison, the ratio of parameter rates dsplan / DeepSpeed is taken, so drift of the host's
memory bandwidth cancels; the summary gives medians and ranges over all cycles and the
per-round medians.

Comparisons (each a dsplan step against the DeepSpeed host work it replaces):

* fp32 step: dsplan with f32 gradients and no copy-out, against `DeepSpeedCPUAdam.step()`
  (28 B/param each).
* offload step, bf16: dsplan reading bf16 gradients, writing bf16 parameters in the same pass
  (28 B/param), against ZeRO-Offload's host work in DeepSpeed 0.19.8's stage_1_and_2.py
  `step()`: the fp32 gradient buffer's `unscale_and_clip_grads` pass (`mul_(1 / combined_scale)`,
  run whenever `gradient_clipping` is set or the loss scale is not 1), `DeepSpeedCPUAdam.step()`,
  and `bit16_buffer.copy_(fp32_partition)` (42 B/param). Also against the same without the
  unscale pass (bf16 with no clipping: 34 B/param).
* offload step, fp16: the same with fp16 gradients and parameters (DeepSpeed always unscales
  with a dynamic loss scale).

Bytes are counted STREAM-style: read plus written, write-allocate reads not counted. The
gradient's arrival by DMA (2 B for dsplan, 4 B for DeepSpeed's fp32 buffer) is not timed and
not counted in the step's bytes; it is listed separately.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

# DeepSpeed's ZeRO-Offload host bytes per parameter (executor/src/optim/offload/bytes.rs).
DS_BYTES = {"fp32": 28, "offload_unscale": 42, "offload_no_unscale": 34}
DSPLAN_BYTES = {"fp32": 28, "bf16": 28, "fp16": 28}

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def cpu_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle


def initial_params(n):
    """offload_adam_bench.rs's initial_param."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761)) % np.uint64(1 << 32)
    return (h.astype(np.float64) / 4294967296.0 - 0.5).astype(np.float32)


def grads(n):
    """offload_adam_bench.rs's grad."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(40503) + np.uint64(12345)) % np.uint64(65536)
    return ((h.astype(np.float64) / 65536.0 - 0.5) * 1e-2).astype(np.float32)


class DeepSpeedSide:
    """One partition under DeepSpeedCPUAdam, laid out as ZeRO-Offload lays it out."""

    def __init__(self, n):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        self.param = torch.nn.Parameter(torch.from_numpy(initial_params(n)))
        g = torch.from_numpy(grads(n))
        # The fp32 gradient buffer holds the device's 16-bit gradients, widened.
        self.grad_bf16 = g.to(torch.bfloat16).float()
        self.grad_fp16 = g.to(torch.float16).float()
        self.param.grad = self.grad_bf16
        self.bit16_bf16 = torch.empty(n, dtype=torch.bfloat16)
        self.bit16_fp16 = torch.empty(n, dtype=torch.float16)
        self.opt = DeepSpeedCPUAdam([self.param], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        # unscale_and_clip_grads with clipping on and not firing: clip = clamp(norm/clip, min=1).
        self.combined_scale = torch.clamp(torch.tensor(0.5), min=1.0)

    def run(self, variant):
        """Seconds for the variant's host work; the parts' seconds in self.parts."""
        # The buffer the step reads (a reference swap, not a copy).
        self.param.grad = self.grad_fp16 if variant == "offload_fp16" else self.grad_bf16
        grad = self.param.grad
        unscale = variant in ("offload_unscale", "offload_fp16")
        out = None
        if variant != "fp32":
            out = self.bit16_fp16 if variant == "offload_fp16" else self.bit16_bf16
        t0 = time.perf_counter()
        if unscale:
            grad.data.mul_(1.0 / self.combined_scale)
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        if out is not None:
            out.data.copy_(self.param.data)
        t3 = time.perf_counter()
        self.parts = {"unscale_s": t1 - t0, "step_s": t2 - t1, "copy_s": t3 - t2}
        return t3 - t0


class DsplanSide:
    """The offload_adam_bench worker."""

    def __init__(self, binary, n, threads, env):
        self.proc = subprocess.Popen(
            [binary, "serve", "--params", str(n), "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.info = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the dsplan worker exited (code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def run(self, variant):
        return self.ask(variant)["seconds"]

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait()


# (label, dsplan command, DeepSpeed variant)
COMPARISONS = [
    ("fp32 step", "fp32", "fp32"),
    ("offload step bf16 (DS with unscale pass)", "bf16", "offload_unscale"),
    ("offload step bf16 (DS without unscale pass)", "bf16", "offload_no_unscale"),
    ("offload step fp16 (DS with unscale pass)", "fp16", "offload_fp16"),
]
DS_BYTES["offload_fp16"] = 42


def fmt(values, digits=3):
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsplan-bin", required=True)
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=10, help="paired cycles per round")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per side and comparison")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    n = args.params
    print(
        f"paired: {n} parameters, {args.threads} threads, {args.rounds} rounds x {args.cycles} cycles, "
        f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        flush=True,
    )
    cycles = []  # one record per comparison per cycle
    sums = []
    for r in range(args.rounds):
        hz = os.sysconf("SC_CLK_TCK")
        t_round = time.time()
        dsplan = DsplanSide(args.dsplan_bin, n, args.threads, env)
        ds = DeepSpeedSide(n)
        print(f"  round {r + 1}: dsplan worker {dsplan.info}, DeepSpeed ready in {time.time() - t_round:.1f} s", flush=True)
        for _, d_cmd, ds_var in COMPARISONS:
            for _ in range(args.warmup):
                dsplan.run(d_cmd)
                ds.run(ds_var)
        busy0, wall0 = cpu_jiffies(), time.monotonic()
        cpu0 = time.process_time()
        child0 = os.times()
        for c in range(args.cycles):
            for k, (label, d_cmd, ds_var) in enumerate(COMPARISONS):
                first_dsplan = (c + k) % 2 == 0
                if first_dsplan:
                    td = dsplan.run(d_cmd)
                    tds = ds.run(ds_var)
                else:
                    tds = ds.run(ds_var)
                    td = dsplan.run(d_cmd)
                cycles.append(
                    {"round": r, "cycle": c, "comparison": label, "dsplan_s": td, "deepspeed_s": tds,
                     "ratio": tds / td, "dsplan_first": first_dsplan, "deepspeed_parts": ds.parts}
                )
        wall = time.monotonic() - wall0
        child1 = os.times()
        own = (time.process_time() - cpu0)
        # The worker's CPU time is not ours until it exits; the machine's busy CPUs include both.
        busy = (cpu_jiffies() - busy0) / hz / wall
        dsplan_sum = dsplan.ask("sum")
        ds_sum = float(ds.param.data.double().sum())
        sums.append({"round": r, "dsplan": dsplan_sum, "deepspeed": ds_sum})
        dsplan.close()
        rmeds = {label: statistics.median(x["ratio"] for x in cycles if x["round"] == r and x["comparison"] == label)
                 for label, _, _ in COMPARISONS}
        print(
            f"  round {r + 1}: ratio medians "
            + ", ".join(f"{label}: {v:.3f}" for label, v in rmeds.items())
            + f"; machine busy {busy:.2f} CPUs (benchmark included), this process {own / wall:.2f}",
            flush=True,
        )
        rel = abs(dsplan_sum["sum"] - ds_sum) / max(abs(ds_sum), 1e-30)
        print(f"    same computation: sum of parameters dsplan {dsplan_sum['sum']:.6f}, DeepSpeed {ds_sum:.6f} "
              f"(relative difference {rel:.2e}, {dsplan_sum['steps']} steps each)", flush=True)
        del ds

    print(f"\nsummary: {n} parameters, {args.threads} threads, median [min-max] over "
          f"{args.rounds * args.cycles} cycles")
    print(f"| comparison | dsplan Gparam/s | DeepSpeed Gparam/s | dsplan GB/s (B/param) | DeepSpeed GB/s (B/param) "
          f"| ratio dsplan/DeepSpeed per cycle | rounds (ratio medians) |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for label, d_cmd, ds_var in COMPARISONS:
        rows = [x for x in cycles if x["comparison"] == label]
        d_rate = [n / x["dsplan_s"] / 1e9 for x in rows]
        s_rate = [n / x["deepspeed_s"] / 1e9 for x in rows]
        ratios = [x["ratio"] for x in rows]
        per_round = [statistics.median(x["ratio"] for x in rows if x["round"] == r) for r in range(args.rounds)]
        db, sb = DSPLAN_BYTES[d_cmd], DS_BYTES[ds_var]
        print(
            f"| {label} | **{statistics.median(d_rate):.3f}** [{min(d_rate):.3f}-{max(d_rate):.3f}] "
            f"| **{statistics.median(s_rate):.3f}** [{min(s_rate):.3f}-{max(s_rate):.3f}] "
            f"| {statistics.median(d_rate) * db:.1f} ({db}) | {statistics.median(s_rate) * sb:.1f} ({sb}) "
            f"| **{fmt(ratios)}** | {' / '.join(f'{x:.3f}' for x in per_round)} |"
        )
        summary.append({"comparison": label, "dsplan_gparam_s": statistics.median(d_rate),
                        "deepspeed_gparam_s": statistics.median(s_rate), "ratio_median": statistics.median(ratios),
                        "ratio_min": min(ratios), "ratio_max": max(ratios), "round_medians": per_round,
                        "dsplan_bytes_per_param": db, "deepspeed_bytes_per_param": sb})
    print("\nDeepSpeed's parts, median ms (unscale / step / copy):")
    for label, _, _ in COMPARISONS:
        rows = [x["deepspeed_parts"] for x in cycles if x["comparison"] == label]
        parts = " / ".join(f"{statistics.median(p[k] for p in rows) * 1e3:.1f}" for k in ("unscale_s", "step_s", "copy_s"))
        print(f"  {label}: {parts}")
    print("\nGradient arrival by DMA, not timed above: dsplan 2 B/param (bf16/fp16 staging), "
          "DeepSpeed 4 B/param (fp32 host buffer).")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"params": n, "threads": args.threads, "summary": summary, "cycles": cycles, "sums": sums}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
