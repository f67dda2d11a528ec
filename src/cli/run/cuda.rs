//! `dsplan run --device cuda|auto`: which backend runs, and the run on one GPU.
//!
//! [`choose`] probes the driver once, before the config is read (`--device cuda` without a
//! usable GPU is a usage error, exit 2; `auto` falls back to the CPU with one notice line).
//! Once the run is known, [`settle`] asks whether the GPU backend can run it
//! ([`check_spec`]: one rank, a head size with attention kernels; no offload): under `cuda`
//! a refusal is a usage error naming the reason, under `auto` the CPU runs it after one
//! notice line. [`train`] runs [`train_cuda`] with the CPU run's progress, `--metrics` and
//! `--save-model`, and prints the CPU run's summary plus the device, MFU and device memory:
//! what dsplan allocated per category next to the plan's prediction (the run's plan is
//! compiled with the `dsplan-cuda` backend, whose buffers are the device step's, so the two
//! agree to the byte), and what the driver
//! reports in use. `--format json` adds `device`, `mfu` and `device_memory`
//! (`peak_total`, `by_category`, `plan`, `plan_peak_total`, `driver_used`).
//!
//! One process, GPU 0 (the multi-process launch, one GPU per `LOCAL_RANK`, is not built).

use dsplan_executor::cuda::train::mfu::peak_flops;
use dsplan_executor::cuda::train::{CudaStepRecord, CudaTrainReport, check_spec, train_cuda};
use dsplan_executor::cuda::{Backend, CudaDeviceInfo, DeviceChoice, choose_backend};
use dsplan_executor::io::llama_pretrained::save_trained;
use dsplan_executor::metrics::{Category, PlanMemory, StepMetrics};
use dsplan_executor::train::TrainSpec;
use dsplan_executor::zero::PhaseTimes;
use dsplan_planner::config::OffloadDevice;
use dsplan_planner::plan::Plan;
use serde_json::{Value, json};

use super::progress::{MetricsFile, Progress};
use super::report::{RunFacts, Totals, head, json_map};
use super::{Device, Failure, bytes, thousands};
use crate::cli::Format;

/// The GPU a single process trains on.
const ORDINAL: usize = 0;

/// Resolves `--device` against the driver; prints `auto`'s fallback notice.
pub(super) fn choose(device: Device) -> Result<Backend, Failure> {
    let choice = match device {
        Device::Cpu => DeviceChoice::Cpu,
        Device::Cuda => DeviceChoice::Cuda,
        Device::Auto => DeviceChoice::Auto,
    };
    let chosen = choose_backend(choice, ORDINAL).map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(notice) = &chosen.notice {
        eprintln!("{notice}");
    }
    Ok(chosen.backend)
}

/// Keeps the GPU when its backend can run `spec` (with the checkpoint flag given, if any);
/// otherwise an error under `--device cuda`, the CPU and one notice line under `auto`.
pub(super) fn settle(
    backend: Backend,
    device: Device,
    spec: &TrainSpec,
    checkpoint_flag: Option<&str>,
) -> Result<Backend, Failure> {
    let Backend::Cuda(_) = backend else {
        return Ok(backend);
    };
    let why = checkpoint_flag
        .map(|flag| format!("the CUDA backend does not save or resume checkpoints yet ({flag})"))
        .or_else(|| unsupported(spec));
    let Some(why) = why else {
        return Ok(backend);
    };
    match device {
        Device::Auto => {
            eprintln!("note: --device auto: {why}; running on the CPU");
            Ok(Backend::Cpu)
        }
        Device::Cuda | Device::Cpu => Err(Failure::usage(format!(
            "--device cuda: {why}; use --device cpu"
        ))),
    }
}

/// Why the GPU backend cannot run `spec` (`None`: it can).
fn unsupported(spec: &TrainSpec) -> Option<String> {
    let zero = &spec.settings.config.zero_optimization;
    let offloaded = [
        (
            "optimizer",
            zero.offload_optimizer.as_ref().map(|o| o.device),
        ),
        ("parameter", zero.offload_param.as_ref().map(|o| o.device)),
    ]
    .into_iter()
    .find(|(_, device)| device.is_some_and(|d| d != OffloadDevice::None));
    if let Some((what, _)) = offloaded {
        return Some(format!(
            "the CUDA backend keeps every state on the GPU; {what} offload is not built for it yet"
        ));
    }
    check_spec(spec).err().map(|e| e.to_string())
}

/// Where the run computes, for the opening line.
pub(super) fn place(backend: &Backend) -> String {
    match backend {
        Backend::Cpu => "on the CPU".to_string(),
        Backend::Cuda(device) => format!("on GPU {} ({})", device.ordinal, device.name),
    }
}

/// What the GPU run needs from the command beyond the spec.
pub(super) struct GpuRun<'a> {
    /// `--metrics`.
    pub metrics: Option<&'a std::path::Path>,
    /// `--save-model`.
    pub save_model: Option<&'a std::path::Path>,
    /// `--format`.
    pub format: Format,
    /// The summary's facts.
    pub facts: RunFacts<'a>,
}

/// Trains `spec` on `device` and prints the summary.
pub(super) fn train(
    run: &GpuRun<'_>,
    spec: &TrainSpec,
    plan: &Plan,
    device: &CudaDeviceInfo,
) -> Result<(), Failure> {
    let metrics = match run.metrics {
        Some(path) => Some(MetricsFile::create(path)?),
        None => None,
    };
    let progress = Progress::new(spec.steps, &spec.settings, metrics);
    let tokens_per_step = (spec.settings.batch.train_batch * spec.seq_len) as f64;
    let result = train_cuda(spec, device.ordinal, &|step, record| {
        progress.observe(&step_metrics(step, record, tokens_per_step));
    });
    let metrics = progress.finish();
    let report = result.map_err(|e| Failure::input(format!("--device cuda: {e}")))?;
    if let Some(metrics) = metrics {
        metrics.commit()?;
    }
    if let Some(path) = run.save_model {
        save_trained(
            path,
            &spec.model,
            &report.final_params,
            spec.settings.precision.model_dtype(),
        )
        .map_err(|e| Failure::usage(format!("cannot save the model: {e}")))?;
    }
    let plan_memory = PlanMemory::of(plan);
    let summary = summary(&run.facts, spec, &report, &plan_memory);
    match run.format {
        Format::Human => eprint!("{}", human(&report, &summary, &plan_memory)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ),
    }
    if let Some(path) = run.save_model {
        eprintln!("saved the trained fp32 model to {}", path.display());
    }
    Ok(())
}

/// A GPU step as the CPU run's progress and `--metrics` see it.
fn step_metrics(step: u64, record: &CudaStepRecord, tokens_per_step: f64) -> StepMetrics {
    StepMetrics {
        step,
        loss: record.loss,
        lr: record.lr,
        grad_norm: record.grad_norm,
        loss_scale: record.loss_scale,
        skipped: record.grad_norm.is_none(),
        tokens_per_s: tokens_per_step / record.seconds.max(1e-9),
        times: PhaseTimes::default(),
        seconds: record.seconds,
    }
}

/// The CPU run's summary keys, plus `device`, `mfu` and `device_memory`.
fn summary(
    facts: &RunFacts<'_>,
    spec: &TrainSpec,
    report: &CudaTrainReport,
    plan: &PlanMemory,
) -> Value {
    let skipped = report
        .steps
        .iter()
        .filter(|s| s.grad_norm.is_none())
        .count();
    let seconds: f64 = report.steps.iter().map(|s| s.seconds).sum();
    let tokens = report.tokens_per_step * report.steps.len() as u64;
    let mut summary = head(
        facts,
        spec,
        &Totals {
            steps: report.steps.len(),
            applied: report.steps.len() - skipped,
            skipped,
            first_loss: report.steps.first().map(|s| s.loss),
            final_loss: report.steps.last().map(|s| s.loss),
            tokens,
            seconds,
        },
    );
    summary.extend(json_map(json!({
        "device": report.device,
        "mfu": report.mfu,
        "device_memory": {
            "peak_total": report.allocated.total(),
            "by_category": report.allocated,
            "plan": plan.peak,
            "plan_peak_total": plan.peak_total,
            "driver_used": report.device_used_bytes,
        },
        "notices": spec.settings.notices,
    })));
    Value::Object(summary)
}

/// The human summary: throughput, device and MFU, then the device memory table.
fn human(report: &CudaTrainReport, summary: &Value, plan: &PlanMemory) -> String {
    let number = |key: &str| summary[key].as_f64().unwrap_or(f64::NAN);
    let mut out = format!(
        "done: {} steps ({} skipped) in {:.2} s, {} tokens/s; loss {:.4} -> {:.4}\n",
        report.steps.len(),
        summary["skipped_steps"].as_u64().unwrap_or(0),
        number("seconds"),
        thousands(number("tokens_per_s").round() as u64),
        number("first_loss"),
        number("final_loss"),
    );
    out.push_str(&match (report.mfu, peak_flops(&report.device)) {
        (Some(mfu), Some(peak)) => format!(
            "device: {}; MFU {:.1}% of its {:.0} TFLOP/s dense 16-bit peak (over the whole run, first steps' kernel compilation included)\n",
            report.device,
            100.0 * mfu,
            peak / 1e12
        ),
        _ => format!(
            "device: {}; MFU unknown (the device is not in dsplan's table of peaks)\n",
            report.device
        ),
    });
    out.push_str(
        "device memory, allocated by dsplan vs predicted by the plan (`dsplan plan --backend dsplan-cuda --world-size 1`):\n",
    );
    let rows: Vec<(&str, String, String)> = Category::ALL
        .iter()
        .map(|&c| {
            (
                c.name(),
                bytes(report.allocated.get(c)),
                bytes(plan.peak.get(c)),
            )
        })
        .chain(std::iter::once((
            "total",
            bytes(report.allocated.total()),
            bytes(plan.peak_total),
        )))
        .collect();
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
    let ours_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(9);
    let plan_width = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max(4);
    out.push_str(&format!(
        "  {:<name_width$}  {:>ours_width$}  {:>plan_width$}\n",
        "category", "allocated", "plan"
    ));
    for (name, ours, planned) in &rows {
        out.push_str(&format!(
            "  {name:<name_width$}  {ours:>ours_width$}  {planned:>plan_width$}\n"
        ));
    }
    out.push_str(&format!(
        "  in use on the device after the run (driver: total - free; with the CUDA context and library workspaces): {}\n",
        bytes(report.device_used_bytes)
    ));
    out.push_str(
        "  the plan lists the device step's own buffers (planner cuda_buffers), allocated once for the run: allocated and plan agree per category\n",
    );
    out
}
