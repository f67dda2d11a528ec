//! Progress of `dsplan run` on stderr as rank 0 reports steps: a progress bar (step, loss, lr,
//! tokens/s) when stderr is a terminal, DeepSpeed's `steps_per_print` lines otherwise; and the
//! `--metrics` file, one JSON object per step, each line written as its step ends.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dsplan_executor::io::open_stream;
use dsplan_executor::metrics::PhaseTimes;
use dsplan_executor::metrics::StepMetrics;
use dsplan_planner::plan::Training;
use dsplan_planner::schedule::LrSchedule;
use indicatif::{ProgressBar, ProgressStyle};

use super::{Failure, thousands};

/// The `--metrics` file: each line written and flushed as its step ends (so a killed run
/// loses at most the line being written), through [`open_stream`] (a regular file is
/// truncated and written in place; a FIFO or character device is written through).
pub(super) struct MetricsFile {
    path: PathBuf,
    file: File,
    failed: Option<std::io::Error>,
}

impl MetricsFile {
    pub(super) fn create(path: &Path) -> Result<Self, Failure> {
        let file = open_stream(path)
            .map_err(|e| Failure::usage(format!("--metrics {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            failed: None,
        })
    }

    /// One line, written whole with a single `write_all`; the first error is kept for
    /// [`MetricsFile::commit`] and later lines are dropped.
    fn write(&mut self, metrics: &StepMetrics) {
        if let Ok(line) = serde_json::to_string(metrics) {
            self.write_line(line);
        }
    }

    /// An eval line: `{"step": ..., "eval_loss": ...}`, `step` the index of the step it
    /// follows (the train line's).
    fn write_eval(&mut self, step: u64, eval_loss: f64) {
        let line = serde_json::json!({"step": step, "eval_loss": eval_loss});
        self.write_line(line.to_string());
    }

    fn write_line(&mut self, mut line: String) {
        if self.failed.is_some() {
            return;
        }
        line.push('\n');
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            self.failed = Some(e);
        }
    }

    /// Ends the file: the first write error, if any, else the data made durable.
    pub(super) fn commit(self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| {
            Failure::usage(format!("cannot write {}: {e}", self.path.display()))
        };
        if let Some(e) = self.failed {
            return Err(fail(e));
        }
        // FIFOs and devices cannot be synced; only a regular file's error counts.
        match self.file.sync_all() {
            Err(e) if self.file.metadata().is_ok_and(|m| m.is_file()) => Err(fail(e)),
            _ => Ok(()),
        }
    }
}

/// How progress is shown.
enum Display {
    /// An indicatif bar (stderr is a terminal).
    Bar(ProgressBar),
    /// DeepSpeed's periodic lines.
    Lines,
}

/// What the observer keeps between steps.
struct ProgressState {
    metrics: Option<MetricsFile>,
    interval: PhaseTimes,
    interval_steps: u64,
    skipped: u64,
    applied: u64,
}

/// Shows progress on stderr as rank 0 reports steps.
pub(super) struct Progress {
    base_lr: f64,
    betas: (f64, f64),
    schedule: Option<LrSchedule>,
    steps_per_print: u64,
    wall_clock_breakdown: bool,
    display: Display,
    state: Mutex<ProgressState>,
}

impl Progress {
    pub(super) fn new(total: u64, training: &Training, metrics: Option<MetricsFile>) -> Self {
        let display = if std::io::stderr().is_terminal() {
            let style =
                ProgressStyle::with_template("[{elapsed_precise}] [{bar:24}] {pos}/{len} {msg}")
                    .map(|s| s.progress_chars("#> "))
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            Display::Bar(ProgressBar::new(total).with_style(style))
        } else {
            Display::Lines
        };
        Self {
            base_lr: training.optimizer.lr,
            betas: (training.optimizer.betas[0], training.optimizer.betas[1]),
            schedule: training.schedule.clone(),
            steps_per_print: training.steps_per_print,
            wall_clock_breakdown: training.wall_clock_breakdown,
            display,
            state: Mutex::new(ProgressState {
                metrics,
                interval: PhaseTimes::default(),
                interval_steps: 0,
                skipped: 0,
                applied: 0,
            }),
        }
    }

    /// Continues a resumed run: `global_step` steps already run, `applied` of them applied.
    pub(super) fn resume_at(&mut self, global_step: u64, applied: u64) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        state.applied = applied;
        state.skipped = global_step.saturating_sub(applied);
        if let Display::Bar(bar) = &self.display {
            bar.set_position(global_step);
        }
    }

    pub(super) fn observe(&self, m: &StepMetrics) {
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
        match &self.display {
            Display::Bar(bar) => {
                bar.set_message(format!(
                    "loss {:.4} lr {:.3e} {} tok/s{}",
                    m.loss,
                    m.lr,
                    thousands(m.tokens_per_s.round() as u64),
                    if state.skipped > 0 {
                        format!(" ({} skipped)", state.skipped)
                    } else {
                        String::new()
                    }
                ));
                bar.set_position(done);
            }
            Display::Lines => {
                if self.steps_per_print > 0 && done.is_multiple_of(self.steps_per_print) {
                    self.print_lines(&mut state, m, done);
                }
            }
        }
        if let Some(eval_loss) = m.eval_loss {
            self.eval(&mut state, m.step, eval_loss);
        }
    }

    /// The eval loss after step `step` (from 0): a `--metrics` line and a line on stderr.
    fn eval(&self, state: &mut ProgressState, step: u64, eval_loss: f64) {
        if let Some(metrics) = state.metrics.as_mut() {
            metrics.write_eval(step, eval_loss);
        }
        let line = format!("[Rank 0] step={}, eval_loss={eval_loss:.6}", step + 1);
        match &self.display {
            Display::Bar(bar) => bar.println(line),
            Display::Lines => say!("{line}"),
        }
    }

    /// DeepSpeed's line every `steps_per_print` steps (with the phase times of the interval
    /// when `wall_clock_breakdown`).
    fn print_lines(&self, state: &mut ProgressState, m: &StepMetrics, done: u64) {
        let mut err = std::io::stderr().lock();
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

    /// Ends the display; returns the metrics file to commit.
    pub(super) fn finish(self) -> Option<MetricsFile> {
        if let Display::Bar(bar) = &self.display {
            bar.finish();
        }
        let state = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        state.metrics
    }
}
