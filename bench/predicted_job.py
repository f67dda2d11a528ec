"""One job of a prediction file, trained with DeepSpeed: what bench/predicted_run.py starts in a
fresh process per job (issue 35).

    python3 bench/predicted_job.py --job JOB.json --result-out RESULT.json [--device cuda|cpu-smoke]

The job (one entry of `bench/predictions/*.json`'s `jobs`) carries its Hugging Face model
config and its DeepSpeed config; nothing here chooses a shape. The model is a transformers
`AutoModelForCausalLM` from that config, random init, `sdpa` attention, built as the Hugging
Face Trainer builds it: `HfDeepSpeedConfig` registered first, so a stage-3 model is built
under `deepspeed.zero.Init`. Below stage 3 the fp32 model is built on the host with
transformers' init switched off and its parameters then filled by 16 threads (normal, std =
`initializer_range`; norms 1, biases 0): the same tensors, allocated and written on the host
as HF's own init would, without its single-threaded 60 M params/s. `gradient_checkpointing`
"on" calls `model.gradient_checkpointing_enable()` (transformers' default: non-reentrant).

Each optimizer step is `gradient_accumulation_steps` micro-steps of forward, `engine.backward`
and `engine.step`, on random tokens. Measured: `max_memory_allocated` and
`max_memory_reserved` over the whole process (build, `initialize`, every step; each phase's
peak kept, the counters reset between phases), the wall time of every optimizer step (the
median of the timed ones is `step_seconds`), skipped steps (fp16 overflow), the losses, and
the peak RSS so far (`ru_maxrss`; the parent takes the whole process's, teardown included,
from `wait4`). The driver's figure is sampled by the parent.

`--device cpu-smoke` runs the same code on the CPU (gloo, DeepSpeed's CPU accelerator) with
the model cut to 2 layers and a small width, to try the code path without a GPU: its figures
mean nothing and it writes `"smoke": true`.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def phase_memory(torch, device, phase, step):
    """The allocator's counters at the end of a phase: its peaks since the last reset."""
    if device != "cuda":
        return {"phase": phase, "step": step}
    torch.cuda.synchronize()
    return {
        "phase": phase,
        "step": step,
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "max_reserved": torch.cuda.max_memory_reserved(),
    }


def peak(phases, key):
    """The largest of the phases' peaks (None on the CPU, where there are no counters)."""
    values = [p[key] for p in phases if key in p]
    return max(values) if values else None


def loss_scale(engine):
    """fp16's loss scale after the last step (None when the optimizer has none)."""
    scale = getattr(getattr(engine, "optimizer", None), "cur_scale", None)
    return float(scale) if scale is not None else None


def reset_peaks(torch, device):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def shrunk(model_config):
    """The smoke test's model: the job's architecture at 2 layers and a small width."""
    config = dict(model_config)
    if config["model_type"] == "gpt2":
        config.update(n_embd=64, n_layer=2, n_head=2, vocab_size=512, n_positions=256)
    else:
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      vocab_size=512, max_position_embeddings=256)
    return config


def fill_parameters(torch, model, std, threads=16):
    """Random init of a host model, by `threads` threads (torch's normal_ is single-threaded
    on the CPU): normal(0, std) for matrices and embeddings, 1 for norm weights, 0 for biases."""
    from concurrent.futures import ThreadPoolExecutor

    chunks, seen = [], set()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.data_ptr() in seen:
                continue
            seen.add(parameter.data_ptr())
            flat = parameter.data.view(-1)
            if parameter.dim() == 1:
                flat.fill_(0.0 if name.endswith("bias") else 1.0)
                continue
            chunks += list(flat.split(1 << 24))

    def fill(index):
        generator = torch.Generator().manual_seed(index)
        with torch.no_grad():
            chunks[index].normal_(0.0, std, generator=generator)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, range(len(chunks))))


def build_model(torch, model_config, zero3):
    """The model, as the Trainer builds it; returns it and how it was initialised."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**model_config)
    if zero3:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        return model, "transformers (under zero.Init)"
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.tie_weights()
    fill_parameters(torch, model, getattr(config, "initializer_range", 0.02))
    return model, "16 host threads, normal(0, initializer_range)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", required=True, help="one job of a prediction file, as JSON")
    parser.add_argument("--result-out", required=True)
    parser.add_argument("--device", choices=["cuda", "cpu-smoke"], default="cuda")
    parser.add_argument("--warmup", type=int, help="optimizer steps before the timed ones")
    parser.add_argument("--timed", type=int, help="timed optimizer steps")
    args = parser.parse_args()
    with open(args.job) as f:
        job = json.load(f)
    smoke = args.device == "cpu-smoke"
    device_kind = "cpu" if smoke else "cuda"
    warmup = args.warmup if args.warmup is not None else job["steps"]["warmup"]
    timed = args.timed if args.timed is not None else job["steps"]["timed"]
    model_config = shrunk(job["model_config"]) if smoke else dict(job["model_config"])
    ds_config = json.loads(json.dumps(job["ds_config"]))
    seq_len = 32 if smoke else job["seq_len"]
    if smoke and "fp16" in ds_config:
        # DeepSpeed's CPU accelerator has no fp16: the smoke test runs bf16.
        ds_config.pop("fp16")
        ds_config["bf16"] = {"enabled": True}

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(key, value)
    started = time.perf_counter()
    import deepspeed
    import torch
    import transformers

    imported = time.perf_counter()
    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo" if smoke else "nccl")
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    hf_deepspeed = HfDeepSpeedConfig(ds_config)  # noqa: F841 (must stay alive)
    zero3 = job["stage"] == 3
    model, init = build_model(torch, model_config, zero3)
    built = time.perf_counter()
    zero_init = any(hasattr(p, "ds_numel") for p in model.parameters())
    # model.parameters() yields a tied weight once.
    params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    checkpointing = job["gradient_checkpointing"] == "on"
    if checkpointing:
        model.gradient_checkpointing_enable()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config
    )
    device = engine.device
    synchronize(torch, device_kind)
    initialized = time.perf_counter()
    phases = [phase_memory(torch, device_kind, "initialize", None)]
    vocab = model_config["vocab_size"]
    tokens = torch.randint(0, vocab, (job["micro_batch"], seq_len), device=device)
    gas = job["gradient_accumulation_steps"]
    losses, step_seconds = [], []
    for step in range(warmup + timed):
        synchronize(torch, device_kind)
        t0 = time.perf_counter()
        for micro in range(gas):
            reset_peaks(torch, device_kind)
            loss = engine(input_ids=tokens, labels=tokens).loss
            phases.append(phase_memory(torch, device_kind, "forward", step))
            reset_peaks(torch, device_kind)
            engine.backward(loss)
            phases.append(phase_memory(torch, device_kind, "backward", step))
            reset_peaks(torch, device_kind)
            engine.step()
            phases.append(phase_memory(torch, device_kind, "step", step))
            losses.append(loss.item())
        synchronize(torch, device_kind)
        step_seconds.append(time.perf_counter() - t0)
    timed_seconds = step_seconds[warmup:]
    result = {
        "id": job["id"],
        "smoke": smoke,
        "params": params,
        "zero_init": zero_init,
        "init": init,
        "attention_used": getattr(model.config, "_attn_implementation", None),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", checkpointing)),
        "max_allocated": peak(phases, "max_allocated"),
        "max_reserved": peak(phases, "max_reserved"),
        "step_seconds": statistics.median(timed_seconds) if timed_seconds else None,
        "step_seconds_all": step_seconds,
        "warmup_steps": warmup,
        "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
        "loss_scale": loss_scale(engine),
        "losses": losses,
        "host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": {"import": imported - started, "build": built - imported,
                    "initialize": initialized - built,
                    "steps": time.perf_counter() - initialized},
        "phases": phases,
        "device": torch.cuda.get_device_name() if device_kind == "cuda" else "cpu",
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    text = json.dumps(result)
    with open(args.result_out, "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
