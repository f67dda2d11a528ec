//! The `dsplan` command line: parses flags, calls the planner and executor, renders results.
//! This is the only place in dsplan that prints or exits.

#[macro_use]
mod stderr;
mod cli;
mod render;
mod units;

use std::process::ExitCode;

/// mimalloc, not the system allocator: preparing a fine-tuning dataset makes a few small
/// allocations per row on every thread (the parsed text, its ids, its labels), and glibc's
/// malloc spent a fifth of the preparation's time on them
/// (`bench/results/cpu/2026-12-05-tokenize-bench-mimalloc.txt`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::run()
}
