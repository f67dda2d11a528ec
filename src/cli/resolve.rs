//! `dsplan resolve FILE --world-size N`: the config DeepSpeed really trains with.
//!
//! Human output prints the resolved config as JSON on stdout (ready to save), or with
//! `--explain` one line per value with its origin; warnings and errors go to stderr. JSON
//! output is `{"config", "batch", "diagnostics"}` (plus `"provenance"` with `--explain`), with
//! `"config": null` when resolution fails.

use std::path::PathBuf;

use clap::Args;
use dsplan_planner::diagnostics::{Code, Diagnostic};
use dsplan_planner::resolve::trace::walk;
use dsplan_planner::resolve::{MISMATCH_SEPARATOR, Provenance, Resolved, resolve};
use dsplan_planner::source::SourceFile;
use serde_json::{Map, Value, json};

use super::training_args::{ModelFlags, TrainingArgsFlags, environment};
use super::{Format, Outcome};
use crate::render;

/// Arguments of `dsplan resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The DeepSpeed config (JSON; comments and trailing commas accepted with a warning).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Data-parallel world size (number of GPUs, divided by tensor/pipeline parallel sizes).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    world_size: u64,
    #[command(flatten)]
    model: ModelFlags,
    #[command(flatten)]
    training: TrainingArgsFlags,
    /// Print, for every value, where it came from.
    #[arg(long)]
    explain: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Run `dsplan resolve`.
pub fn run(args: ResolveArgs) -> Outcome {
    // Printed: the user's path, control characters escaped (`render::escape_controls`).
    let display = crate::render::escape_controls(&args.file.display().to_string()).into_owned();
    let bytes = match super::read_input(&args.file) {
        Ok(bytes) => bytes,
        Err(diagnostic) => {
            return fail(&args, None, &display, &[diagnostic], Outcome::UsageError);
        }
    };
    let env = match environment(Some(args.world_size), &args.training, Some(&args.model)) {
        Ok(env) => env,
        Err(message) => {
            say!("error: {}", render::escape_message(&message));
            return Outcome::UsageError;
        }
    };
    let (file, mut diagnostics) = match SourceFile::parse(&display, &bytes) {
        Ok(parsed) => parsed,
        Err(fatal) => {
            if args.format == Format::Human {
                say_text!("{}", render::human_with_bytes(&display, &bytes, &fatal));
            }
            return fail(&args, None, &display, &fatal, Outcome::InputRejected);
        }
    };
    match resolve(file.value(), &env) {
        Ok(resolved) => {
            diagnostics.extend(resolved.diagnostics.iter().cloned());
            file.locate_all(&mut diagnostics);
            diagnostics.sort_by_key(|d| (d.line, d.column));
            succeed(&args, &file, &resolved, &diagnostics)
        }
        Err(found) => {
            diagnostics.extend(found);
            file.locate_all(&mut diagnostics);
            diagnostics.sort_by_key(|d| (d.line, d.column));
            fail(
                &args,
                Some(&file),
                &display,
                &diagnostics,
                Outcome::InputRejected,
            )
        }
    }
}

fn succeed(
    args: &ResolveArgs,
    file: &SourceFile,
    resolved: &Resolved,
    diagnostics: &[Diagnostic],
) -> Outcome {
    match args.format {
        Format::Human => {
            let stdout = if args.explain {
                explanation(file, resolved)
            } else {
                pretty(&resolved.config)
            };
            print_stdout(&stdout);
            let mut stderr = render::human(file, diagnostics);
            let batch = resolved.batch;
            stderr.push_str(&format!(
                "{}: resolved at world size {} (train_batch_size {} = micro batch {} × accumulation {} × {}){}\n",
                file.path(),
                args.world_size,
                batch.train_batch_size,
                batch.train_micro_batch_size_per_gpu,
                batch.gradient_accumulation_steps,
                args.world_size,
                count_warnings(diagnostics)
            ));
            say_text!("{stderr}");
        }
        Format::Json => {
            let mut out = json!({
                "config": resolved.config,
                "batch": resolved.batch,
                "diagnostics": diagnostics,
            });
            if args.explain {
                out["provenance"] = provenance_json(file, resolved);
            }
            print_stdout(&pretty(&out));
        }
    }
    Outcome::Success
}

fn fail(
    args: &ResolveArgs,
    file: Option<&SourceFile>,
    display: &str,
    diagnostics: &[Diagnostic],
    outcome: Outcome,
) -> Outcome {
    match args.format {
        Format::Human => {
            let mut stderr = match file {
                Some(file) => render::human(file, diagnostics),
                None if outcome == Outcome::UsageError => {
                    render::human_unlocated(display, diagnostics)
                }
                None => String::new(), // already rendered against the raw bytes
            };
            stderr.push_str(&mismatch_summary(diagnostics));
            stderr.push_str(&render::file_summary(display, diagnostics));
            say_text!("{stderr}");
        }
        Format::Json => {
            let out = json!({"config": null, "diagnostics": diagnostics});
            print_stdout(&pretty(&out));
        }
    }
    outcome
}

/// The Trainer reports every mismatch in one error; so does this summary (those against
/// defaults included: the Trainer has no notion of a default).
fn mismatch_summary(diagnostics: &[Diagnostic]) -> String {
    let mismatches: Vec<&Diagnostic> = diagnostics
        .iter()
        .filter(|d| d.code == Code::AutoMismatch)
        .collect();
    if !mismatches.iter().any(|d| d.is_error()) {
        return String::new();
    }
    let mut text = format!(
        "\n{} value{} disagree with the training arguments; the Hugging Face Trainer refuses the file listing:\n",
        mismatches.len(),
        if mismatches.len() == 1 { "" } else { "s" }
    );
    for mismatch in mismatches {
        let line = mismatch
            .message
            .split(MISMATCH_SEPARATOR)
            .next()
            .unwrap_or_default();
        let note = if mismatch.is_error() {
            ""
        } else {
            "   (TrainingArguments default)"
        };
        text.push_str(&format!("  - {line}{note}\n"));
    }
    text.push_str("  set these keys to \"auto\", or change the training arguments\n\n");
    text
}

fn count_warnings(diagnostics: &[Diagnostic]) -> String {
    match diagnostics.iter().filter(|d| !d.is_error()).count() {
        0 => String::new(),
        1 => ", 1 note".to_string(),
        n => format!(", {n} notes"),
    }
}

/// One line per value: pointer, value, origin (with the line in the file).
fn explanation(file: &SourceFile, resolved: &Resolved) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    walk(&resolved.config, "", &mut |pointer| {
        let value = resolved
            .config
            .pointer(pointer)
            .map(|v| v.to_string())
            .unwrap_or_default();
        let origin = match resolved.provenance.get(pointer) {
            Some(provenance) => describe(file, provenance),
            None => String::new(),
        };
        rows.push((pointer.to_string(), value, origin));
    });
    let pointer_width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|r| r.1.chars().count())
        .filter(|w| *w <= 24)
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(pointer, value, origin)| {
            format!("{pointer:<pointer_width$}  {value:<value_width$}  {origin}")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An origin for people, with the file's line for values written in it.
fn describe(file: &SourceFile, provenance: &Provenance) -> String {
    let text = provenance.describe();
    match (provenance, line_of(file, provenance)) {
        (Provenance::File { .. }, Some(line)) => format!("{text} (line {line})"),
        _ => text,
    }
}

fn line_of(file: &SourceFile, provenance: &Provenance) -> Option<usize> {
    let Provenance::File { pointer } = provenance else {
        return None;
    };
    let span = file.span_of(pointer)?;
    Some(file.line_col(span.anchor().start).0)
}

/// `{pointer: {"kind": ..., ..., "line": n}}` in the config's order.
fn provenance_json(file: &SourceFile, resolved: &Resolved) -> Value {
    let mut map = Map::new();
    walk(&resolved.config, "", &mut |pointer| {
        if let Some(provenance) = resolved.provenance.get(pointer) {
            let mut value = serde_json::to_value(provenance).unwrap_or(Value::Null);
            if let (Some(line), Value::Object(object)) = (line_of(file, provenance), &mut value) {
                object.insert("line".into(), Value::from(line));
            }
            map.insert(pointer.to_string(), value);
        }
    });
    Value::Object(map)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// Writes `text` and a newline to stdout; a closed pipe (`dsplan resolve ... | head`) is not an
/// error worth a panic.
pub(super) fn print_stdout(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}
