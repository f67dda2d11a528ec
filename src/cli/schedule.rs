//! `dsplan schedule FILE`: the learning rate (and OneCycle's β₁) of every training step, as the
//! executor will step it: the Trainer's `"auto"` pass, then DeepSpeed 0.19.8's scheduler.
//!
//! `json` prints `[{"step": k, "lr": x, "momentum": m_or_null}, ...]` where step k runs with
//! `lr` (k = 0 before any scheduler step); `human` prints the phases and a compact table; `svg`
//! draws the curve.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dsplan_planner::resolve::ResolvedSchedule;
use dsplan_planner::resolve::phases::{default_steps, phases};
use dsplan_planner::resolve::schedule::schedule;
use dsplan_planner::schedule::svg::lr_curve_svg;
use dsplan_planner::schedule::{LrSchedule, py_float_repr};
use dsplan_planner::source::SourceFile;

use super::Outcome;
use super::resolve::print_stdout;
use super::training_args::{TrainingArgsFlags, environment};
use crate::render;

/// The most steps one run prints.
const MAX_STEPS: u64 = 10_000_000;

/// Rows of the compact human table (besides phase boundaries).
const TABLE_ROWS: u64 = 12;

/// Output format of `dsplan schedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ScheduleFormat {
    /// Phases and a compact table.
    #[default]
    Human,
    /// Every step as JSON.
    Json,
    /// An SVG chart.
    Svg,
}

/// Arguments of `dsplan schedule`.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// The DeepSpeed config (JSON; comments and trailing commas accepted with a warning).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    #[command(flatten)]
    training: TrainingArgsFlags,
    /// Training steps to show (default: --num-training-steps, else the schedule's whole shape).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    steps: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: ScheduleFormat,
}

/// Run `dsplan schedule`.
pub fn run(args: ScheduleArgs) -> Outcome {
    let display = args.file.display().to_string();
    let bytes = match super::read_input(&args.file) {
        Ok(bytes) => bytes,
        Err(diagnostic) => {
            eprint!("{}", render::human_unlocated(&display, &[diagnostic]));
            return Outcome::UsageError;
        }
    };
    let env = match environment(None, &args.training, None) {
        Ok(env) => env,
        Err(message) => {
            eprintln!("error: {message}");
            return Outcome::UsageError;
        }
    };
    let (file, mut diagnostics) = match SourceFile::parse(&display, &bytes) {
        Ok(parsed) => parsed,
        Err(fatal) => {
            eprint!("{}", render::human_with_bytes(&display, &bytes, &fatal));
            return Outcome::InputRejected;
        }
    };
    let resolved = match schedule(file.value(), &env) {
        Ok(resolved) => resolved,
        Err(found) => {
            diagnostics.extend(found);
            file.locate_all(&mut diagnostics);
            diagnostics.sort_by_key(|d| (d.line, d.column));
            eprint!("{}", render::human(&file, &diagnostics));
            eprint!("{}", render::file_summary(&display, &diagnostics));
            return Outcome::InputRejected;
        }
    };
    diagnostics.extend(resolved.diagnostics.iter().cloned());
    file.locate_all(&mut diagnostics);
    diagnostics.sort_by_key(|d| (d.line, d.column));
    if !diagnostics.is_empty() {
        eprint!("{}", render::human(&file, &diagnostics));
    }
    let steps = args
        .steps
        .or(env.training_args.num_training_steps.map(|n| n.value))
        .unwrap_or_else(|| default_steps(&resolved.schedule))
        .min(MAX_STEPS);
    if args.format == ScheduleFormat::Json {
        return stream_json_rows(&resolved.schedule, steps);
    }
    let points: Vec<(u64, f64)> = (0..steps)
        .map(|k| (k, resolved.schedule.lr_at(k)))
        .collect();
    let momentum: Option<Vec<(u64, f64)>> = (0..steps)
        .map(|k| {
            resolved
                .schedule
                .momentum_at(k)
                .map(|(beta1, _)| (k, beta1))
        })
        .collect();
    let out = match args.format {
        ScheduleFormat::Json => return stream_json_rows(&resolved.schedule, steps),
        ScheduleFormat::Svg => lr_curve_svg(
            &points,
            momentum.as_deref(),
            &format!("{} ({display})", resolved.schedule.type_name()),
        ),
        ScheduleFormat::Human => human(&resolved, &points, momentum.as_deref()),
    };
    print_stdout(&out);
    Outcome::Success
}

/// Writes the JSON list of every step's rates row by row as it computes them, so that 10^7
/// steps take constant memory (building the whole list first took 6 GB).
fn stream_json_rows(schedule: &LrSchedule, steps: u64) -> Outcome {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut write = || -> std::io::Result<()> {
        out.write_all(b"[")?;
        for k in 0..steps {
            let beta1 = schedule.momentum_at(k).map(|(beta1, _)| beta1);
            let separator = if k == 0 { "\n  " } else { ",\n  " };
            // Numbers through serde_json (its float formatting), no JSON value per row.
            write!(out, "{separator}{{\"step\": {k}, \"lr\": ")?;
            serde_json::to_writer(&mut out, &schedule.lr_at(k))?;
            out.write_all(b", \"momentum\": ")?;
            serde_json::to_writer(&mut out, &beta1)?;
            out.write_all(b"}")?;
        }
        out.write_all(b"\n]\n")?;
        out.flush()
    };
    match write() {
        Ok(()) => Outcome::Success,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Outcome::Success,
        Err(error) => {
            eprintln!("error: cannot write the schedule: {error}");
            Outcome::UsageError
        }
    }
}

fn human(
    resolved: &ResolvedSchedule,
    points: &[(u64, f64)],
    momentum: Option<&[(u64, f64)]>,
) -> String {
    let schedule = &resolved.schedule;
    let mut out = format!(
        "{} over {} training steps; the optimizer's lr is {}\n\nphases (step k runs with the rate after k scheduler steps):\n",
        schedule.type_name(),
        points.len(),
        resolved.base_lr_source
    );
    let phase_list = phases(schedule);
    for phase in &phase_list {
        let span = match phase.to_step {
            Some(end) => format!("steps {}–{end}", phase.from_step),
            None => format!("from step {}", phase.from_step),
        };
        out.push_str(&format!("  {span:<18} {}\n", phase.description));
    }
    let last = points.len() as u64;
    let mut shown: Vec<u64> = (0..TABLE_ROWS).map(|i| i * last / TABLE_ROWS).collect();
    for phase in &phase_list {
        shown.extend([phase.from_step, phase.to_step.unwrap_or(0)]);
    }
    shown.push(last.saturating_sub(1));
    shown.retain(|step| *step < last);
    shown.sort_unstable();
    shown.dedup();
    let header = format!(
        "{:>10}  {:<24}{}",
        "step",
        "lr",
        if momentum.is_some() { "β₁" } else { "" }
    );
    out.push_str(&format!("\n{}\n", header.trim_end()));
    for step in shown {
        let (_, lr) = points[step as usize];
        let beta1 = momentum
            .and_then(|m| m.get(step as usize))
            .map(|(_, b)| py_float_repr(*b))
            .unwrap_or_default();
        out.push_str(format!("{step:>10}  {:<24}{beta1}", py_float_repr(lr)).trim_end());
        out.push('\n');
    }
    out.trim_end().to_string()
}
