//! The `dsplan` command line: parses flags, calls the planner and executor, renders results.
//! This is the only place in dsplan that prints or exits.

mod cli;
mod render;
mod units;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::run()
}
