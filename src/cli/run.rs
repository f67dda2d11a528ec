//! `dsplan run FILE`: train according to a DeepSpeed config, ZeRO stages 0-3 over in-process
//! ranks on the CPU.
//!
//! Without `--model` and `--data` it trains the `tiny-gpt2` preset on the corpus bundled with
//! dsplan (byte-level tokens). Progress goes to stderr: a progress bar on a terminal, a line
//! every `steps_per_print` steps in DeepSpeed's form (`step=, skipped=, lr=, mom=`, the lr and
//! momentum of the next step, plus loss and tokens/s; with the mean phase times of the
//! interval when `wall_clock_breakdown`), then a
//! summary with tokens/s and the measured peak memory per rank and category next to the
//! prediction. `--format json` prints that summary as JSON on stdout. `--metrics` writes one
//! JSON object per step; `--save-model` the trained fp32 parameters under Hugging Face names.
//! Both files are written atomically (temporary file, then rename).

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::{Args, ValueEnum};
use dsplan_executor::checkpoint::save_model;
use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::{Category, StepMetrics};
use dsplan_executor::model::ParamLayout;
use dsplan_executor::train::{
    DataChoice, ModelChoiceError, TrainError, TrainReport, TrainSettings, TrainSpec, choose_model,
    stored_shape,
};
use dsplan_executor::zero::{MixedPrecision, PhaseTimes};
use dsplan_planner::diagnostics::Diagnostic;
use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::validate::{self, ValidateOptions};
use serde_json::{Value, json};

use super::{Format, Outcome};
use crate::render;

/// Steps when neither `--steps`, the scheduler's `total_num_steps` nor stored data say.
const DEFAULT_STEPS: u64 = 200;
/// Longest default sequence (the model's `n_positions` if shorter).
const DEFAULT_SEQ_LEN: usize = 64;

/// Arguments of `dsplan run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The DeepSpeed config (ds_config.json) to train with.
    #[arg(value_name = "FILE")]
    config: PathBuf,
    /// A GPT-2 preset (default tiny-gpt2), a Hugging Face config.json (fresh weights), or a
    /// save_pretrained directory (config.json + model.safetensors, trained from its weights).
    #[arg(long, value_name = "M")]
    model: Option<String>,
    /// Training data: a text file (byte tokens), an llm.c token .bin, or a .safetensors file
    /// with input_ids [steps, global_batch, seq+1] used batch by batch. Default: the corpus
    /// bundled with dsplan.
    #[arg(long, value_name = "D")]
    data: Option<PathBuf>,
    /// Optimizer steps. Default: the scheduler's total_num_steps, the steps a .safetensors
    /// data file holds, or 200.
    #[arg(long, value_name = "S")]
    steps: Option<u64>,
    /// Data-parallel ranks (threads of this process).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    world_size: u64,
    /// Where to compute: cuda is not built yet; auto picks the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Seed of fresh model weights and of the data order.
    #[arg(long, value_name = "S", default_value_t = 1234)]
    seed: u64,
    /// Tokens per row (default: the model's n_positions, at most 64; fixed by .safetensors data).
    #[arg(long, value_name = "L", value_parser = clap::value_parser!(u64).range(1..))]
    seq_len: Option<u64>,
    /// Write one JSON object per step here (step, loss, lr, grad_norm, loss_scale, skipped,
    /// tokens_per_s).
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Write the trained fp32 parameters here (safetensors, Hugging Face names).
    #[arg(long, value_name = "FILE")]
    save_model: Option<PathBuf>,
    /// Output format of the final summary.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (not built yet).
    Cuda,
    /// CUDA when available, else the CPU.
    Auto,
}

/// A failure with its exit code.
struct Failure {
    outcome: Outcome,
    message: String,
}

impl Failure {
    fn input(message: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::InputRejected,
            message: message.into(),
        }
    }

    fn usage(message: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::UsageError,
            message: message.into(),
        }
    }
}

/// Run `dsplan run`.
pub fn run(args: RunArgs) -> Outcome {
    match train_from_args(&args) {
        Ok(()) => Outcome::Success,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("error: {}", failure.message);
            }
            failure.outcome
        }
    }
}

fn train_from_args(args: &RunArgs) -> Result<(), Failure> {
    match args.device {
        Device::Cuda => {
            return Err(Failure::usage(
                "the CUDA backend is not built yet; use --device cpu (or auto)",
            ));
        }
        Device::Auto => eprintln!("note: no CUDA backend in this build; running on the CPU"),
        Device::Cpu => {}
    }
    let world = args.world_size as usize;
    let display = args.config.display().to_string();
    let bytes = std::fs::read(&args.config)
        .map_err(|e| Failure::usage(format!("cannot read {display}: {e}")))?;
    let options = ValidateOptions {
        world_size: Some(args.world_size),
    };
    let (file, diagnostics) = match validate::validate_source(&display, &bytes, options) {
        Ok(parsed) => parsed,
        Err(fatal) => {
            eprint!("{}", render::human_with_bytes(&display, &bytes, &fatal));
            return Err(Failure::input(format!(
                "{display} is not a readable config"
            )));
        }
    };
    let errors: Vec<Diagnostic> = diagnostics
        .into_iter()
        .filter(Diagnostic::is_error)
        .collect();
    if !errors.is_empty() {
        eprint!("{}", render::human(&file, &errors));
        return Err(Failure::input(format!(
            "{display} has {} error(s); `dsplan validate` explains them",
            errors.len()
        )));
    }
    let settings = TrainSettings::from_config(file.value(), world)
        .map_err(|e| Failure::input(format!("{display}: {e}")))?;
    let model = choose_model(args.model.as_deref(), args.seed)
        .map_err(|e: ModelChoiceError| Failure::usage(e.to_string()))?;

    let stored = match &args.data {
        Some(path) => stored_shape(path).map_err(|e| Failure::usage(e.to_string()))?,
        None => None,
    };
    let seq_len = match (stored, args.seq_len) {
        (Some(shape), Some(asked)) if asked as usize != shape.seq_len => {
            return Err(Failure::usage(format!(
                "--seq-len {asked}, but the stored rows hold {} tokens (seq_len {})",
                shape.seq_len + 1,
                shape.seq_len
            )));
        }
        (Some(shape), _) => shape.seq_len,
        (None, Some(asked)) => asked as usize,
        (None, None) => model.config.n_positions.min(DEFAULT_SEQ_LEN),
    };
    let steps = args.steps.unwrap_or_else(|| {
        stored.map(|s| s.steps).unwrap_or_else(|| {
            file.value()
                .pointer("/scheduler/params/total_num_steps")
                .and_then(Value::as_u64)
                .filter(|&n| n > 0)
                .unwrap_or(DEFAULT_STEPS)
        })
    });
    let order = WindowOrder::Shuffled { seed: args.seed };
    let data = match &args.data {
        Some(path) => DataChoice::File {
            path: path.clone(),
            order,
        },
        None => DataChoice::Bundled { order },
    };
    let data_name = args
        .data
        .as_ref()
        .map_or("the bundled corpus (byte tokens)".to_string(), |p| {
            p.display().to_string()
        });

    let num_params = model.params.len();
    let layout = ParamLayout::new(&model.config);
    let spec = TrainSpec {
        settings: settings.clone(),
        model: model.config,
        initial_params: model.params,
        data,
        seq_len,
        steps,
        world,
    };
    let batch = settings.batch;
    eprintln!(
        "dsplan run {display}: ZeRO stage {}, {}, {world} rank(s) on the CPU",
        settings.stage as u8,
        precision_name(&settings.precision),
    );
    eprintln!(
        "model {} ({} parameters); data {data_name}; {} x {seq_len} tokens per rank and micro-step, {} micro-step(s), global batch {}; {steps} steps",
        model.description,
        thousands(num_params as u64),
        batch.micro_batch,
        batch.grad_accum,
        batch.train_batch,
    );
    for notice in &settings.notices {
        eprintln!("note: {notice}");
    }

    let metrics = match &args.metrics {
        Some(path) => Some(MetricsFile::create(path)?),
        None => None,
    };
    let progress = Progress::new(steps, &settings, metrics);
    let result = dsplan_executor::train::train(&spec, &|m| progress.observe(m));
    let metrics = progress.finish();
    let report = result.map_err(|e| match e {
        TrainError::Data(_) => Failure::usage(e.to_string()),
        _ => Failure::input(e.to_string()),
    });
    if let Some(metrics) = metrics {
        metrics.commit()?;
    }
    let report = report?;

    if let Some(path) = &args.save_model {
        save_model(path, &report.final_params, &layout)
            .map_err(|e| Failure::usage(format!("cannot save the model: {e}")))?;
    }
    let summary = summary(&display, &model.description, num_params, &spec, &report);
    match args.format {
        Format::Human => eprint!("{}", human_summary(&report, &summary)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ),
    }
    if let Some(path) = &args.save_model {
        eprintln!("saved the trained fp32 model to {}", path.display());
    }
    Ok(())
}

fn precision_name(precision: &MixedPrecision) -> String {
    match precision {
        MixedPrecision::Fp32 => "fp32".to_string(),
        MixedPrecision::Bf16 { .. } => "bf16 (fp32 master weights)".to_string(),
        MixedPrecision::Fp16 { scale } => {
            if scale.is_dynamic() {
                format!(
                    "fp16 (fp32 master weights, dynamic loss scale from 2^{})",
                    scale.initial_scale_power
                )
            } else {
                format!(
                    "fp16 (fp32 master weights, static loss scale {})",
                    scale.loss_scale
                )
            }
        }
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes as `12.3 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// The `--metrics` file: lines go to a temporary file, renamed into place at the end.
struct MetricsFile {
    path: PathBuf,
    temp: PathBuf,
    writer: BufWriter<File>,
}

impl MetricsFile {
    fn create(path: &Path) -> Result<Self, Failure> {
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let file = File::create(&temp)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            temp,
            writer: BufWriter::new(file),
        })
    }

    fn write(&mut self, metrics: &StepMetrics) {
        if let Ok(line) = serde_json::to_string(metrics) {
            let _ = writeln!(self.writer, "{line}");
        }
    }

    fn commit(mut self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| {
            Failure::usage(format!("cannot write {}: {e}", self.path.display()))
        };
        self.writer.flush().map_err(fail)?;
        self.writer.get_ref().sync_all().map_err(fail)?;
        std::fs::rename(&self.temp, &self.path).map_err(fail)
    }
}

/// What the observer keeps between steps.
struct ProgressState {
    metrics: Option<MetricsFile>,
    interval: PhaseTimes,
    interval_steps: u64,
    skipped: u64,
    applied: u64,
    bar_shown: bool,
}

/// Prints progress on stderr as rank 0 reports steps.
struct Progress {
    total: u64,
    base_lr: f64,
    betas: (f64, f64),
    schedule: Option<LrSchedule>,
    steps_per_print: u64,
    wall_clock_breakdown: bool,
    terminal: bool,
    state: Mutex<ProgressState>,
}

impl Progress {
    fn new(total: u64, settings: &TrainSettings, metrics: Option<MetricsFile>) -> Self {
        Self {
            total,
            base_lr: settings.optimizer.lr,
            betas: (settings.optimizer.adam.beta1, settings.optimizer.adam.beta2),
            schedule: settings.schedule.clone(),
            steps_per_print: settings.steps_per_print,
            wall_clock_breakdown: settings.wall_clock_breakdown,
            terminal: std::io::stderr().is_terminal(),
            state: Mutex::new(ProgressState {
                metrics,
                interval: PhaseTimes::default(),
                interval_steps: 0,
                skipped: 0,
                applied: 0,
                bar_shown: false,
            }),
        }
    }

    fn observe(&self, m: &StepMetrics) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(metrics) = state.metrics.as_mut() {
            metrics.write(m);
        }
        state.interval.forward += m.times.forward;
        state.interval.backward += m.times.backward;
        state.interval.reduce += m.times.reduce;
        state.interval.step += m.times.step;
        state.interval_steps += 1;
        state.skipped += u64::from(m.skipped);
        state.applied += u64::from(!m.skipped);
        let done = m.step + 1;
        let mut err = std::io::stderr().lock();
        if self.steps_per_print > 0 && done.is_multiple_of(self.steps_per_print) {
            if state.bar_shown {
                let _ = write!(err, "\r\x1b[2K");
                state.bar_shown = false;
            }
            // As DeepSpeed's engine: the lr and momentum after the step (the next step's).
            let (lr, (beta1, beta2)) = match &self.schedule {
                Some(s) => (
                    s.lr_at(state.applied),
                    s.momentum_at(state.applied).unwrap_or(self.betas),
                ),
                None => (self.base_lr, self.betas),
            };
            let _ = writeln!(
                err,
                "[Rank 0] step={done}, skipped={}, lr=[{lr}], mom=[({beta1}, {beta2})], loss={:.4}, loss_scale={}, tokens/s={}",
                state.skipped,
                m.loss,
                m.loss_scale,
                thousands(m.tokens_per_s.round() as u64)
            );
            if self.wall_clock_breakdown {
                let n = state.interval_steps.max(1) as f64 / 1000.0;
                let t = state.interval;
                let _ = writeln!(
                    err,
                    "[Rank 0] time (ms) | fwd: {:.2} | bwd: {:.2} | reduce: {:.2} | step: {:.2}",
                    t.forward / n,
                    t.backward / n,
                    t.reduce / n,
                    t.step / n
                );
            }
            state.interval = PhaseTimes::default();
            state.interval_steps = 0;
        }
        if self.terminal {
            let width = 24;
            let filled = (done * width / self.total.max(1)).min(width) as usize;
            let _ = write!(
                err,
                "\r\x1b[2K[{}{}] {done}/{} loss {:.4} lr {:.2e} {} tok/s",
                "#".repeat(filled),
                " ".repeat(width as usize - filled),
                self.total,
                m.loss,
                m.lr,
                thousands(m.tokens_per_s.round() as u64)
            );
            state.bar_shown = true;
        }
    }

    fn finish(self) -> Option<MetricsFile> {
        let state = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        if state.bar_shown {
            eprintln!();
        }
        state.metrics
    }
}

/// The run's summary, as `--format json` prints it.
fn summary(
    config: &str,
    model: &str,
    num_params: usize,
    spec: &TrainSpec,
    report: &TrainReport,
) -> Value {
    let skipped = report.steps.iter().filter(|s| s.skipped).count();
    let ranks: Vec<Value> = report
        .memory
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            json!({"rank": rank, "peak_total": m.peak_total, "peak": m.peak, "at_peak": m.at_peak})
        })
        .collect();
    json!({
        "config": config,
        "model": model,
        "params": num_params,
        "world_size": spec.world,
        "stage": spec.settings.stage as u8,
        "precision": spec.settings.precision.model_dtype().name(),
        "steps": report.steps.len(),
        "applied_steps": report.applied_steps,
        "skipped_steps": skipped,
        "first_loss": report.steps.first().map(|s| s.loss),
        "final_loss": report.steps.last().map(|s| s.loss),
        "tokens": report.tokens,
        "seconds": report.seconds,
        "tokens_per_s": report.tokens as f64 / report.seconds.max(1e-9),
        "memory": {"predicted": report.predicted, "predicted_total": report.predicted.total(), "ranks": ranks},
        "notices": spec.settings.notices,
    })
}

/// The human summary: throughput, then memory per rank and category.
fn human_summary(report: &TrainReport, summary: &Value) -> String {
    let mut out = String::new();
    let skipped = summary["skipped_steps"].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "done: {} steps ({skipped} skipped) in {:.2} s, {} tokens/s; loss {:.4} -> {:.4}\n",
        report.steps.len(),
        report.seconds,
        thousands((report.tokens as f64 / report.seconds.max(1e-9)).round() as u64),
        summary["first_loss"].as_f64().unwrap_or(f64::NAN),
        summary["final_loss"].as_f64().unwrap_or(f64::NAN),
    ));
    out.push_str("peak memory per rank, measured (predicted):\n");
    for (rank, m) in report.memory.iter().enumerate() {
        let parts: Vec<String> = Category::ALL
            .iter()
            .filter(|&&c| m.peak.get(c) > 0 || report.predicted.get(c) > 0)
            .map(|&c| {
                format!(
                    "{} {} ({})",
                    c.name(),
                    bytes(m.peak.get(c)),
                    bytes(report.predicted.get(c))
                )
            })
            .collect();
        out.push_str(&format!(
            "  rank {rank}: total {} | {}\n",
            bytes(m.peak_total),
            parts.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024), "3.00 MiB");
    }
}
