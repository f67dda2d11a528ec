//! `dsplan schedule FILE`: the learning rate (and OneCycle's β₁) of every training step, as the
//! executor will step it: the Trainer's `"auto"` pass, then DeepSpeed 0.19.8's scheduler.
//!
//! `json` prints `[{"step": k, "lr": x, "momentum": m_or_null}, ...]` where step k runs with
//! `lr` (k = 0 before any scheduler step), written row by row; `human` prints the phases and a
//! compact table; `svg` draws the curve from at most [`CHART_POINTS`] points per line. Memory
//! does not grow with `--steps`, which is at most [`MAX_STEPS`].

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dsplan_planner::resolve::ResolvedSchedule;
use dsplan_planner::resolve::phases::{default_steps, phases};
use dsplan_planner::resolve::schedule::schedule;
use dsplan_planner::schedule::py_float_repr;
use dsplan_planner::schedule::rows::{MAX_STEPS, curve, write_json_rows};
use dsplan_planner::schedule::svg::lr_curve_svg;
use dsplan_planner::source::SourceFile;

use super::Outcome;
use super::resolve::print_stdout;
use super::training_args::{TrainingArgsFlags, environment};
use crate::render;

/// The most points per line of the SVG chart (the chart is 800 pixels wide).
const CHART_POINTS: u64 = 4_000;

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
    /// Training steps to show, at most 10,000,000 (default: --num-training-steps, else the
    /// schedule's whole shape).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    steps: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: ScheduleFormat,
}

/// Run `dsplan schedule`.
pub fn run(args: ScheduleArgs) -> Outcome {
    // Printed: the user's path, control characters escaped (`render::escape_controls`).
    let display = crate::render::escape_controls(&args.file.display().to_string()).into_owned();
    let bytes = match super::read_input(&args.file) {
        Ok(bytes) => bytes,
        Err(diagnostic) => {
            say_text!("{}", render::human_unlocated(&display, &[diagnostic]));
            return Outcome::UsageError;
        }
    };
    let env = match environment(None, &args.training, None) {
        Ok(env) => env,
        Err(message) => {
            say!("error: {message}");
            return Outcome::UsageError;
        }
    };
    let (file, mut diagnostics) = match SourceFile::parse(&display, &bytes) {
        Ok(parsed) => parsed,
        Err(fatal) => {
            say_text!("{}", render::human_with_bytes(&display, &bytes, &fatal));
            return Outcome::InputRejected;
        }
    };
    let resolved = match schedule(file.value(), &env) {
        Ok(resolved) => resolved,
        Err(found) => {
            diagnostics.extend(found);
            file.locate_all(&mut diagnostics);
            diagnostics.sort_by_key(|d| (d.line, d.column));
            say_text!("{}", render::human(&file, &diagnostics));
            say_text!("{}", render::file_summary(&display, &diagnostics));
            return Outcome::InputRejected;
        }
    };
    diagnostics.extend(resolved.diagnostics.iter().cloned());
    file.locate_all(&mut diagnostics);
    diagnostics.sort_by_key(|d| (d.line, d.column));
    if !diagnostics.is_empty() {
        say_text!("{}", render::human(&file, &diagnostics));
    }
    let wanted = args
        .steps
        .or(env.training_args.num_training_steps.map(|n| n.value))
        .unwrap_or_else(|| default_steps(&resolved.schedule));
    let steps = wanted.min(MAX_STEPS);
    if steps < wanted {
        say!(
            "note: {display}: the run has {wanted} steps; `dsplan schedule` shows at most {MAX_STEPS}, so these are the first {MAX_STEPS}"
        );
    }
    let out = match args.format {
        ScheduleFormat::Json => return stream_json_rows(&resolved, steps),
        ScheduleFormat::Svg => {
            let chart = curve(&resolved.schedule, steps, CHART_POINTS);
            lr_curve_svg(
                &chart.lr,
                chart.momentum.as_deref(),
                &format!("{} ({display})", resolved.schedule.type_name()),
            )
        }
        ScheduleFormat::Human => human(&resolved, steps),
    };
    print_stdout(&out);
    Outcome::Success
}

/// Writes the JSON list of every step's rates as it computes them (constant memory).
fn stream_json_rows(resolved: &ResolvedSchedule, steps: u64) -> Outcome {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match write_json_rows(&resolved.schedule, steps, &mut out) {
        Ok(()) => Outcome::Success,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Outcome::Success,
        Err(error) => {
            say!("error: cannot write the schedule: {error}");
            Outcome::UsageError
        }
    }
}

/// The phases and a table of about [`TABLE_ROWS`] steps (plus the phase boundaries), each
/// computed on its own.
fn human(resolved: &ResolvedSchedule, steps: u64) -> String {
    let schedule = &resolved.schedule;
    let mut out = format!(
        "{} over {steps} training steps; the optimizer's lr is {}\n\nphases (step k runs with the rate after k scheduler steps):\n",
        schedule.type_name(),
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
    let last = steps;
    let cycles_momentum = schedule.momentum_at(0).is_some();
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
        if cycles_momentum { "β₁" } else { "" }
    );
    out.push_str(&format!("\n{}\n", header.trim_end()));
    for step in shown {
        let lr = schedule.lr_at(step);
        let beta1 = schedule
            .momentum_at(step)
            .map(|(b, _)| py_float_repr(b))
            .unwrap_or_default();
        out.push_str(format!("{step:>10}  {:<24}{beta1}", py_float_repr(lr)).trim_end());
        out.push('\n');
    }
    out.trim_end().to_string()
}
