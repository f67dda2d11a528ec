//! Command-line definition (clap derive) and dispatch. Each subcommand lives in its own file
//! with its arguments and its `run` function.

mod cost_args;
mod estimate;
mod launch;
mod outputs;
mod parallel;
mod plan;
mod recommend;
mod report;
mod resolve;
mod run;
mod schedule;
mod schema;
mod sft_config;
mod training_args;
mod training_choices;
mod validate;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

/// DeepSpeed-compatible config compiler, memory planner and training executor.
#[derive(Debug, Parser)]
#[command(name = "dsplan", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check configs against DeepSpeed 0.19.8's schema and rules; every problem at once.
    Validate(validate::ValidateArgs),
    /// Print the JSON Schema of ds_config.json (the bytes of schemas/ds_config.schema.json).
    Schema,
    /// Memory per GPU and CPU: DeepSpeed's estimators exactly, then the full per-phase estimate.
    Estimate(estimate::EstimateArgs),
    /// Compile a resolved config and a model into the explicit execution plan.
    Plan(plan::PlanArgs),
    /// The fastest DeepSpeed configuration that fits a model, a cluster and a target batch.
    Recommend(recommend::RecommendArgs),
    /// The fully resolved config: DeepSpeed defaults materialised, "auto" filled as the Hugging
    /// Face Trainer fills it, the batch triangle solved; --explain says where each value came from.
    Resolve(resolve::ResolveArgs),
    /// The learning rate (and OneCycle momentum) of every training step, as DeepSpeed computes it.
    Schedule(schedule::ScheduleArgs),
    /// Train with a config: ZeRO stages 0-3 over in-process ranks on the CPU.
    Run(run::RunArgs),
    /// What this machine offers the CUDA backend (driver, CUDA libraries, GPUs, CPU SIMD, MPI,
    /// kernel cache); --check runs every kernel and a training step against the CPU on the GPU.
    Report(report::ReportArgs),
    /// Start `dsplan run` as one process per rank, with the DeepSpeed launcher's options
    /// (hostfile, --include/--exclude, --num_gpus); CPU jobs go through mpirun.
    Launch(launch::LaunchArgs),
}

/// Output format shared by every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Readable text; diagnostics on stderr.
    #[default]
    Human,
    /// Machine-readable JSON on stdout.
    Json,
}

/// Exit codes of the CLI contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is fine.
    Success,
    /// The input is wrong or does not fit.
    InputRejected,
    /// Bad flags or unreadable files.
    UsageError,
}

impl From<Outcome> for ExitCode {
    fn from(outcome: Outcome) -> ExitCode {
        ExitCode::from(match outcome {
            Outcome::Success => 0,
            Outcome::InputRejected => 1,
            Outcome::UsageError => 2,
        })
    }
}

/// Parse the command line and run the chosen command.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Validate(args) => validate::run(args),
        Command::Schema => schema::run(),
        Command::Estimate(args) => estimate::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Recommend(args) => recommend::run(args),
        Command::Resolve(args) => resolve::run(args),
        Command::Schedule(args) => schedule::run(args),
        Command::Run(args) => run::run(args),
        Command::Report(args) => report::run(args),
        Command::Launch(args) => launch::run(args),
    };
    ExitCode::from(outcome)
}

/// Read an input file, bounded ([`dsplan_planner::source::read_config`]); an unreadable one
/// becomes an `unreadable-file` diagnostic naming it.
pub fn read_input(path: &std::path::Path) -> Result<Vec<u8>, dsplan_planner::Diagnostic> {
    dsplan_planner::source::read_config(path)
}
