//! `dsplan validate FILE...`: every problem in every file, in one run.

use std::path::PathBuf;

use clap::Args;
use dsplan_planner::diagnostics::{Diagnostic, Severity};
use dsplan_planner::source::SourceFile;
use dsplan_planner::validate::{self, ValidateOptions};
use serde::Serialize;

use super::{Format, Outcome};
use crate::render;

/// Arguments of `dsplan validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Config files to check (JSON; comments and trailing commas are accepted with a warning).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Data-parallel world size: enables the exact batch-size check.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    world_size: Option<u64>,
    /// Treat every warning as an error (for CI jobs).
    #[arg(long)]
    strict: bool,
    /// Output format: diagnostics for people (stderr) or JSON (stdout).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
}

/// One file's verdict, as `--format json` prints it.
#[derive(Debug, Serialize)]
struct FileReport {
    path: String,
    valid: bool,
    diagnostics: Vec<Diagnostic>,
}

/// Run `dsplan validate`.
pub fn run(args: ValidateArgs) -> Outcome {
    let options = ValidateOptions {
        world_size: args.world_size,
    };
    let mut reports = Vec::with_capacity(args.files.len());
    let mut rendered = String::new();
    let mut unreadable = false;
    for path in &args.files {
        let display = path.display().to_string();
        let (mut diagnostics, shown) = match super::read_input(path) {
            Err(diagnostic) => {
                unreadable = true;
                (vec![diagnostic], Shown::Nothing)
            }
            Ok(bytes) => match validate::validate_source(&display, &bytes, options) {
                Ok((file, diagnostics)) => (diagnostics, Shown::Parsed(Box::new(file))),
                Err(fatal) => (fatal, Shown::Raw(bytes)),
            },
        };
        if args.strict {
            promote_warnings(&mut diagnostics);
        }
        let valid = !diagnostics.iter().any(Diagnostic::is_error);
        if args.format == Format::Human {
            rendered.push_str(&match &shown {
                Shown::Parsed(file) => render::human(file, &diagnostics),
                Shown::Raw(bytes) => render::human_with_bytes(&display, bytes, &diagnostics),
                Shown::Nothing => render::human_unlocated(&display, &diagnostics),
            });
            rendered.push_str(&render::file_summary(&display, &diagnostics));
        }
        reports.push(FileReport {
            path: display,
            valid,
            diagnostics,
        });
    }
    let invalid = reports.iter().filter(|r| !r.valid).count();
    match args.format {
        Format::Human => {
            if reports.len() > 1 {
                rendered.push_str(&format!(
                    "{} files checked: {} valid, {} invalid\n",
                    reports.len(),
                    reports.len() - invalid,
                    invalid
                ));
            }
            say_text!("{rendered}");
        }
        Format::Json => {
            let out = serde_json::json!({ "files": reports });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        }
    }
    if unreadable {
        Outcome::UsageError
    } else if invalid > 0 {
        Outcome::InputRejected
    } else {
        Outcome::Success
    }
}

/// What a file's diagnostics can be shown against.
enum Shown {
    /// The parsed file: snippets from its text.
    Parsed(Box<SourceFile>),
    /// Bytes that did not parse: snippets from the raw lines.
    Raw(Vec<u8>),
    /// Nothing was read.
    Nothing,
}

fn promote_warnings(diagnostics: &mut [Diagnostic]) {
    for diagnostic in diagnostics
        .iter_mut()
        .filter(|d| d.severity == Severity::Warning)
    {
        diagnostic.severity = Severity::Error;
    }
}
