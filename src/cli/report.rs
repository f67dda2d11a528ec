//! `dsplan report`: what this machine offers dsplan's CUDA backend (dsplan's `ds_report`):
//! the driver and its CUDA version, the CUDA libraries found and whether they load, each GPU,
//! the CPU's SIMD, MPI and the kernel cache; without a GPU it says exactly what is missing and
//! exits 0.
//!
//! `--check` then runs [`dsplan_executor::cuda::check`] on the GPU: every kernel compiled and
//! held against its CPU reference in every precision, and one training step against the CPU
//! backend, printed as a pass/fail table of measured errors and tolerances. Without a usable
//! GPU it says why and exits 2; a failed row exits 1. `--show-check FILE` renders a check
//! saved with `--check --format json` (on a GPU machine) instead of running one.

use std::path::PathBuf;

use clap::Args;
use dsplan_executor::cuda::check::{self, CheckReport, CheckRow, Metric, Scope, Verdict};
use dsplan_executor::cuda::inventory::{DriverReport, MachineReport, Need};
use dsplan_executor::cuda::{DeviceChoice, DeviceError, choose_backend};
use serde_json::{Value, json};

use super::run::bytes;
use super::{Format, Outcome};

/// Arguments of `dsplan report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Also compile every kernel, run each against its CPU reference on the GPU in every
    /// precision, and one training step against the CPU backend (needs a GPU; exit 2 without
    /// one, 1 when a check fails).
    #[arg(long, conflicts_with = "show_check")]
    check: bool,
    /// With --check: only the kernels, not the training step.
    #[arg(long, requires = "check")]
    kernels_only: bool,
    /// The GPU to check (CUDA ordinal).
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: usize,
    /// Render a check result saved by `dsplan report --check --format json` (its `check`
    /// object, or the whole output) instead of running one.
    #[arg(long, value_name = "FILE")]
    show_check: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// What became of `--check`.
enum CheckOutcome {
    /// Not asked for.
    NotAsked,
    /// It could not run, and why.
    CannotRun(String),
    /// It ran (or was read from a file).
    Ran(CheckReport),
}

/// Runs `dsplan report`.
pub fn run(args: ReportArgs) -> Outcome {
    let machine = MachineReport::collect();
    let check = if let Some(path) = &args.show_check {
        match read_check(path) {
            Ok(report) => CheckOutcome::Ran(report),
            Err(why) => {
                say!("error: {why}");
                return Outcome::UsageError;
            }
        }
    } else if args.check {
        run_check(&args)
    } else {
        CheckOutcome::NotAsked
    };
    match args.format {
        Format::Human => {
            print!("{}", human_machine(&machine));
            match &check {
                CheckOutcome::NotAsked => {}
                CheckOutcome::CannotRun(why) => say!("error: --check cannot run: {why}"),
                CheckOutcome::Ran(report) => print!("\n{}", human_check(report)),
            }
        }
        Format::Json => {
            let check_value = match &check {
                CheckOutcome::NotAsked => Value::Null,
                CheckOutcome::CannotRun(why) => json!({"status": "not-run", "reason": why}),
                CheckOutcome::Ran(report) => check_json(report),
            };
            let output = json!({
                "dsplan_version": env!("CARGO_PKG_VERSION"),
                "machine": machine,
                "check": check_value,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&output).unwrap_or_default()
            );
        }
    }
    match check {
        CheckOutcome::NotAsked => Outcome::Success,
        CheckOutcome::CannotRun(_) => Outcome::UsageError,
        CheckOutcome::Ran(report) if report.passed() => Outcome::Success,
        CheckOutcome::Ran(_) => Outcome::InputRejected,
    }
}

/// Probes for the GPU (cudarc panics on a missing driver, so this comes first) and runs the
/// check, with one progress line per row on stderr.
fn run_check(args: &ReportArgs) -> CheckOutcome {
    if let Err(error) = choose_backend(DeviceChoice::Cuda, args.gpu) {
        return CheckOutcome::CannotRun(cannot_check(&error));
    }
    let scope = if args.kernels_only {
        Scope::Kernels
    } else {
        Scope::KernelsAndStep
    };
    say!("checking GPU {} ...", args.gpu);
    let progress = |row: &CheckRow| say!("  {}", row_line(row));
    match check::run(args.gpu, scope, &progress) {
        Ok(report) => CheckOutcome::Ran(report),
        Err(error) => CheckOutcome::CannotRun(format!("GPU {}: {error}", args.gpu)),
    }
}

/// Why the check cannot run, in words that fit `report --check`.
fn cannot_check(error: &DeviceError) -> String {
    match error {
        DeviceError::NoDriver => {
            "no NVIDIA driver (libcuda.so cannot be loaded); the check needs a GPU".to_string()
        }
        DeviceError::NoDevice(why) => {
            format!("the CUDA driver reports no GPU ({why}); check CUDA_VISIBLE_DEVICES")
        }
        DeviceError::DriverFailed(why) => format!("the CUDA driver failed to initialise ({why})"),
        DeviceError::OrdinalOutOfRange { ordinal, count } => {
            format!("--gpu {ordinal} was asked for but this machine has {count} GPU(s)")
        }
        DeviceError::UnsupportedArch(device) => {
            format!("{device} is older than sm_80, which dsplan's kernels need")
        }
        DeviceError::MissingLibraries(names) => format!(
            "a GPU is present but {} cannot be loaded (see `missing` above)",
            names.join(" and ")
        ),
    }
}

/// A saved check: the `check` object of `report --format json`, or the object itself.
fn read_check(path: &std::path::Path) -> Result<CheckReport, String> {
    use dsplan_planner::user_file::{FileKind, read_text};
    let text = read_text(path, FileKind::SavedReport)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let object = match value.get("check") {
        Some(check) if check.is_object() => check.clone(),
        _ => value,
    };
    serde_json::from_value(object).map_err(|e| {
        format!(
            "{}: not a check result ({e}); save one with `dsplan report --check --format json`",
            path.display()
        )
    })
}

/// The check as JSON: the rows, and the summary in the shape of the GPU results file
/// (`kernels`: passed, failed, checks; `step_vs_cpu`: passed, max_rel_err).
fn check_json(report: &CheckReport) -> Value {
    let mut value = serde_json::to_value(report).unwrap_or(Value::Null);
    let kernel_rows: Vec<&CheckRow> = report
        .rows
        .iter()
        .filter(|r| r.kind != check::CheckKind::TrainStep)
        .collect();
    let step_rows: Vec<&CheckRow> = report
        .rows
        .iter()
        .filter(|r| r.kind == check::CheckKind::TrainStep)
        .collect();
    let step = if step_rows.is_empty() {
        Value::Null
    } else {
        json!({
            "passed": step_rows.iter().all(|r| r.verdict == Verdict::Pass),
            "max_rel_err": step_rows
                .iter()
                .filter(|r| matches!(r.metric, Metric::ScalarRelative | Metric::UpdateNorm))
                .map(|r| r.error)
                .fold(0.0f64, f64::max),
        })
    };
    if let Some(object) = value.as_object_mut() {
        object.insert("status".to_string(), json!(status_word(report)));
        object.insert(
            "kernels".to_string(),
            json!({
                "passed": kernel_rows.iter().filter(|r| r.verdict == Verdict::Pass).count(),
                "failed": kernel_rows.iter().filter(|r| r.verdict == Verdict::Fail).count(),
                "skipped": kernel_rows.iter().filter(|r| r.verdict == Verdict::Skipped).count(),
            }),
        );
        object.insert("step_vs_cpu".to_string(), step);
    }
    value
}

fn status_word(report: &CheckReport) -> &'static str {
    if report.passed() { "passed" } else { "failed" }
}

/// The machine, readable.
pub fn human_machine(machine: &MachineReport) -> String {
    let mut out = format!("dsplan {} report\n\n", env!("CARGO_PKG_VERSION"));
    out.push_str(&match &machine.driver {
        DriverReport::Absent => {
            "NVIDIA driver   not found (libcuda.so cannot be loaded)\n".to_string()
        }
        DriverReport::NoDevice { detail } => {
            format!("NVIDIA driver   loaded, no GPU ({detail})\n")
        }
        DriverReport::Failed { detail } => format!("NVIDIA driver   failed ({detail})\n"),
        DriverReport::Ok {
            version,
            cuda_version,
        } => format!(
            "NVIDIA driver   {} (CUDA {cuda_version})\n",
            version.as_deref().unwrap_or("version unknown")
        ),
    });
    if machine.gpus.is_empty() {
        out.push_str("GPUs            none\n");
    }
    for gpu in &machine.gpus {
        let link = gpu.pcie_link.as_ref().map_or_else(
            || "link unknown".to_string(),
            |l| {
                format!(
                    "PCIe {} x{} (max {} x{})",
                    l.speed, l.width, l.max_speed, l.max_width
                )
            },
        );
        out.push_str(&format!(
            "GPU {}           {}, compute capability {}{}, {}, {} SMs, {}{}\n",
            gpu.ordinal,
            gpu.name,
            gpu.compute_capability,
            if gpu.supported {
                ""
            } else {
                " (unsupported: dsplan needs 8.0+)"
            },
            bytes(gpu.total_memory),
            gpu.multiprocessors
                .map_or("?".to_string(), |n| n.to_string()),
            link,
            gpu.pci_bus_id
                .as_deref()
                .map_or(String::new(), |id| format!(", bus {id}")),
        ));
    }
    out.push_str("\nCUDA libraries (loaded at run time)\n");
    for library in &machine.libraries {
        let need = match library.need {
            Need::Always => "every GPU run",
            Need::SeveralGpus => "several GPUs",
            Need::Listed => "not used by dsplan",
        };
        let state = match (&library.loadable, &library.version) {
            (true, Some(version)) => format!("loads, version {version}"),
            (true, None) => "loads".to_string(),
            (false, _) => "does not load".to_string(),
        };
        out.push_str(&format!("  {:<13} {:<19} {state}\n", library.name, need));
        if library.files.is_empty() {
            out.push_str("                no copy found\n");
        }
        for file in &library.files {
            out.push_str(&format!(
                "                {}{} [{}]\n",
                file.path,
                file.version
                    .as_deref()
                    .map_or(String::new(), |v| format!(" ({v})")),
                serde_json::to_value(file.origin)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ));
        }
    }
    let cpu = &machine.cpu;
    let yes = |b: bool| if b { "yes" } else { "no" };
    out.push_str(&format!(
        "\nCPU             {}, {} logical CPUs\nSIMD            AVX2 {}, FMA {}, AVX-512F {}, AVX-512 BF16 {}\n",
        cpu.model.as_deref().unwrap_or("model unknown"),
        cpu.logical_cpus,
        yes(cpu.avx2),
        yes(cpu.fma),
        yes(cpu.avx512f),
        yes(cpu.avx512_bf16)
    ));
    match &machine.mpi {
        None => out.push_str("MPI             not found (no mpirun on PATH, no libmpi)\n"),
        Some(mpi) => {
            out.push_str(&format!(
                "MPI             {}\n",
                mpi.mpirun.as_deref().unwrap_or("no mpirun on PATH")
            ));
            for library in &mpi.libraries {
                out.push_str(&format!("                {library}\n"));
            }
        }
    }
    let cache = &machine.kernel_cache;
    out.push_str(&match &cache.dir {
        None => "kernel cache    none (no DSPLAN_KERNEL_CACHE, XDG_CACHE_HOME or HOME): kernels compile every run\n".to_string(),
        Some(dir) if cache.entries == 0 => format!("kernel cache    {dir} (no kernels cached yet)\n"),
        Some(dir) => format!(
            "kernel cache    {dir} ({} kernel files, {})\n",
            cache.entries,
            bytes(cache.bytes)
        ),
    });
    if machine.missing.is_empty() {
        out.push_str("\nthe CUDA backend has everything it needs\n");
    } else {
        out.push_str("\nmissing for the CUDA backend:\n");
        for why in &machine.missing {
            out.push_str(&format!("  - {why}\n"));
        }
    }
    out
}

fn metric_word(metric: Metric) -> &'static str {
    match metric {
        Metric::Relative => "rel",
        Metric::NormRelative => "norm rel",
        Metric::ScalarRelative => "scalar rel",
        Metric::UpdateNorm => "update norm",
        Metric::Excess => "abs excess",
        Metric::Mismatches => "mismatches",
        Metric::None => "-",
    }
}

fn verdict_word(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Pass => "pass",
        Verdict::Fail => "FAIL",
        Verdict::Skipped => "skipped",
    }
}

fn number(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x == 0.0 {
        "0".to_string()
    } else {
        format!("{x:.2e}")
    }
}

/// One row as a progress line.
fn row_line(row: &CheckRow) -> String {
    match row.metric {
        Metric::None => format!(
            "{:<7} {} {}",
            verdict_word(row.verdict),
            row.name,
            row.detail.as_deref().unwrap_or("")
        ),
        _ => format!(
            "{:<7} {} [{}]: {} {} (tol {})",
            verdict_word(row.verdict),
            row.name,
            row.dtype,
            metric_word(row.metric),
            number(row.error),
            number(row.tol)
        ),
    }
}

/// The check as a table: one line per row, failures' reasons under them, then the summary.
pub fn human_check(report: &CheckReport) -> String {
    let name_width = report
        .rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "check on {} (compute capability {}), {:.1} s\n",
        report.device, report.compute_capability, report.seconds
    );
    out.push_str(&format!(
        "{:<name_width$}  {:<5}  {:<11}  {:>9}  {:>9}  {:>9}  result\n",
        "check", "dtype", "metric", "error", "tol", "max |err|"
    ));
    for row in &report.rows {
        let measured = row.metric != Metric::None;
        let cell = |x: f64| if measured { number(x) } else { "-".to_string() };
        out.push_str(&format!(
            "{:<name_width$}  {:<5}  {:<11}  {:>9}  {:>9}  {:>9}  {}\n",
            row.name,
            row.dtype,
            metric_word(row.metric),
            cell(row.error),
            cell(row.tol),
            cell(row.max_abs_err),
            verdict_word(row.verdict),
        ));
        if let Some(detail) = &row.detail
            && (row.verdict != Verdict::Pass || !measured)
        {
            out.push_str(&format!("{:<name_width$}    {detail}\n", ""));
        }
    }
    out.push_str(&format!(
        "\n{}: {} passed, {} failed, {} skipped\n",
        status_word(report),
        report.count(Verdict::Pass),
        report.count(Verdict::Fail),
        report.count(Verdict::Skipped)
    ));
    out
}
