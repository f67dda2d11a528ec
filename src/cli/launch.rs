//! `dsplan launch [OPTIONS] CONFIG [RUN FLAGS]`: starts `dsplan run CONFIG [RUN FLAGS]` as one
//! process per rank, with the DeepSpeed launcher's options: `--hostfile` (`host slots=N`, `#`
//! comments; default `/job/hostfile`, else this machine), `--include`/`--exclude`
//! (`node1:0,1@node2`), `--num_nodes`/`--num_gpus`, `--master_addr`/`--master_port`, and the
//! variables of `.deepspeed_env` (in the working directory or `$HOME`) exported to every rank.
//!
//! CPU ranks communicate over MPI, so the job is handed to `mpirun` (as DeepSpeed's `--launcher
//! openmpi` does), which starts every rank on every host; `dsplan` must be built with the `mpi`
//! feature. Each output line is prefixed with its rank (`[rank 1] ...`).
//!
//! **Pre-flight, before anything starts:** the hostfile and filters parse, every host resolves,
//! the filters name slots the hosts have, the master port is free when the master is this
//! machine, `mpirun`, the config and this binary exist. Any failure is an error (exit 2) and
//! nothing is started.
//!
//! Not yet: `--no_ssh --node_rank` (one launcher per node) needs ranks that join without MPI's
//! process manager, i.e. GPU ranks over NCCL; CPU jobs refuse it with the command to use.

mod hosts;
mod relay;
mod supervise;

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::Args;
use dsplan_planner::user_file::{self, FileKind};

use super::Outcome;
use hosts::{Host, parse_env_file, parse_hostfile, select};

/// DeepSpeed's default hostfile.
const DEFAULT_HOSTFILE: &str = "/job/hostfile";

/// Arguments of `dsplan launch` (the DeepSpeed launcher's names).
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Hosts and their slots, one `HOST slots=N` per line (# starts a comment). Without it
    /// (and without /job/hostfile) the job runs on this machine.
    #[arg(long = "hostfile", short = 'H', value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Only these hosts and slots: `node1:0,1@node2` (slots 0 and 1 of node1, all of node2).
    #[arg(long = "include", short = 'i', value_name = "SPEC")]
    include: Option<String>,
    /// All hosts and slots but these (same syntax as --include).
    #[arg(
        long = "exclude",
        short = 'e',
        value_name = "SPEC",
        conflicts_with = "include"
    )]
    exclude: Option<String>,
    /// Use the first N hosts.
    #[arg(long = "num_nodes", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    num_nodes: Option<u64>,
    /// Ranks per host (GPUs per node in DeepSpeed; CPU ranks here). Default: every slot of
    /// the hostfile, or 1 on this machine.
    #[arg(long = "num_gpus", visible_alias = "num_procs", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    num_gpus: Option<u64>,
    /// The master's address (default: the first host).
    #[arg(long = "master_addr", value_name = "HOST")]
    master_addr: Option<String>,
    /// The master's port.
    #[arg(long = "master_port", value_name = "PORT", default_value_t = 29_500)]
    master_port: u16,
    /// Start only this node's ranks, without ssh (run once per node with --node_rank).
    #[arg(long = "no_ssh")]
    no_ssh: bool,
    /// With --no_ssh: this node's index in the hostfile.
    #[arg(long = "node_rank", value_name = "R", requires = "no_ssh")]
    node_rank: Option<u64>,
    /// The config, then `dsplan run`'s flags (everything after the config is passed on).
    #[arg(value_name = "CONFIG [RUN FLAGS]", required = true, num_args = 1..,
          trailing_var_arg = true, allow_hyphen_values = true)]
    run: Vec<String>,
}

/// Run `dsplan launch`.
pub fn run(args: LaunchArgs) -> Outcome {
    match launch(&args) {
        Ok(outcome) => outcome,
        Err(message) => {
            // Host names, paths and file contents are the user's: printed escaped.
            say!("error: {}", crate::render::escape_controls(&message));
            Outcome::UsageError
        }
    }
}

/// Everything checked before the job starts.
struct Job {
    hosts: Vec<Host>,
    master_addr: String,
    env: Vec<(String, String)>,
    exe: PathBuf,
    mpirun: Vec<String>,
}

fn launch(args: &LaunchArgs) -> Result<Outcome, String> {
    if args.no_ssh {
        return Err(
            "--no_ssh: CPU ranks join over MPI, whose process manager must start every rank; \
             run `dsplan launch --hostfile FILE ...` once, on the first node (mpirun reaches \
             the others)"
                .to_string(),
        );
    }
    let job = preflight(args)?;
    let world: usize = job.hosts.iter().map(|h| h.slots.len()).sum();
    let placement: Vec<String> = job
        .hosts
        .iter()
        .map(|h| format!("{}:{}", h.name, h.slots.len()))
        .collect();
    say!(
        "dsplan launch: {world} rank(s) on {} (through mpirun)",
        crate::render::escape_controls(&placement.join(", "))
    );
    let mut command = Command::new(&job.mpirun[0]);
    command
        .args(&job.mpirun[1..])
        .args(["-np", &world.to_string(), "--host", &placement.join(",")])
        .arg("--tag-output")
        .args(["-x", &format!("MASTER_ADDR={}", job.master_addr)])
        .args(["-x", &format!("MASTER_PORT={}", args.master_port)]);
    for (name, value) in &job.env {
        command.args(["-x", &format!("{name}={value}")]);
    }
    command
        .arg(&job.exe)
        .arg("run")
        .args(&args.run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // In a process group of its own, ended with `launch` (see `supervise`).
    let mut job_process = supervise::Supervised::spawn(&mut command)
        .map_err(|e| format!("cannot start {}: {e}", job.mpirun[0]))?;
    let stdout = job_process
        .child()
        .stdout
        .take()
        .map(|s| relay(s, Stream::Out));
    let stderr = job_process
        .child()
        .stderr
        .take()
        .map(|s| relay(s, Stream::Err));
    let ended = job_process
        .wait()
        .map_err(|e| format!("waiting for mpirun: {e}"))?;
    for relay in [stdout, stderr].into_iter().flatten() {
        let _ = relay.join();
    }
    let status = match ended {
        supervise::Ended::Exited(status) => status,
        supervise::Ended::Stopped => {
            say!("dsplan launch: stopped by a signal; mpirun and every rank it started were ended");
            return Ok(Outcome::InputRejected);
        }
    };
    Ok(match status.code() {
        Some(0) => Outcome::Success,
        Some(2) => Outcome::UsageError,
        _ => {
            say!("dsplan launch: the job failed ({status})");
            Outcome::InputRejected
        }
    })
}

/// Where a relayed line goes.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Out,
    Err,
}

/// Copies `source` line by line, giving each rank's text its `[rank R] ` prefix (see
/// [`relay::RankLines`]; lines without a tag, mpirun's own, pass unchanged).
fn relay(source: impl Read + Send + 'static, stream: Stream) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut ranks = relay::RankLines::default();
        let print = |line: String| match stream {
            Stream::Out => println!("{line}"),
            Stream::Err => say!("{line}"),
        };
        // Bytes, not `lines()`: one line that is not UTF-8 must not stop the relay (mpirun
        // would block on a full pipe).
        for line in BufReader::new(source).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line);
            ranks.push_line(&line).into_iter().for_each(&print);
        }
        ranks.finish().into_iter().for_each(&print);
    })
}

fn preflight(args: &LaunchArgs) -> Result<Job, String> {
    let hostfile = args
        .hostfile
        .clone()
        .or_else(|| Some(PathBuf::from(DEFAULT_HOSTFILE)).filter(|p| user_file::exists(p)));
    let listed = match &hostfile {
        Some(path) => {
            let text = user_file::read_text(path, FileKind::HostList)
                .map_err(|e| format!("cannot read the hostfile {}: {e}", path.display()))?;
            let hosts = parse_hostfile(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            if hosts.is_empty() {
                return Err(format!("{}: no host is listed", path.display()));
            }
            hosts
        }
        None if args.include.is_some() || args.exclude.is_some() => {
            return Err("--include/--exclude need a --hostfile that lists the hosts".into());
        }
        // This machine's slots are its cores, as a GPU node's are its GPUs; more ranks than
        // that need a hostfile that says so (`localhost slots=N`).
        None => vec![("localhost".to_string(), local_slots())],
    };
    let hosts = select(
        &listed,
        args.include.as_deref(),
        args.exclude.as_deref(),
        args.num_nodes.map(|n| n as usize),
        args.num_gpus.map(|n| n as usize),
    )
    .map_err(|e| match &hostfile {
        Some(path) => format!("{}: {e}", path.display()),
        None => format!(
            "{e} (without a hostfile this machine has one slot per core; a hostfile line \
             `localhost slots=N` gives it more)"
        ),
    })?;
    // Without a hostfile and --num_gpus, one rank.
    let hosts = match (&hostfile, args.num_gpus) {
        (None, None) => hosts
            .into_iter()
            .map(|mut h| {
                h.slots.truncate(1);
                h
            })
            .collect(),
        _ => hosts,
    };
    for host in &hosts {
        (host.name.as_str(), args.master_port)
            .to_socket_addrs()
            .map_err(|e| format!("host {} does not resolve: {e}", host.name))?;
    }
    let master_addr = args
        .master_addr
        .clone()
        .unwrap_or_else(|| hosts[0].name.clone());
    let master_is_here = is_this_machine(&master_addr)?;
    if master_is_here {
        TcpListener::bind(("0.0.0.0", args.master_port)).map_err(|e| {
            format!(
                "--master_port {} is not free on this machine ({e}); pick another",
                args.master_port
            )
        })?;
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the dsplan binary to start: {e}"))?;
    if !exe.is_file() {
        return Err(format!(
            "the dsplan binary {} does not exist",
            exe.display()
        ));
    }
    let config = Path::new(&args.run[0]);
    if !config.is_file() {
        return Err(format!(
            "the config {} does not exist (the first argument after the options is the \
             config of `dsplan run`)",
            config.display()
        ));
    }
    let env = deepspeed_env()?;
    let mpirun = mpirun_command()?;
    Ok(Job {
        hosts,
        master_addr,
        env,
        exe,
        mpirun,
    })
}

/// The slots of this machine when no hostfile lists it: one per core.
fn local_slots() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Whether `host` names this machine (its addresses are loopback or bindable here).
fn is_this_machine(host: &str) -> Result<bool, String> {
    let addrs: Vec<_> = (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("--master_addr {host} does not resolve: {e}"))?
        .collect();
    Ok(addrs
        .iter()
        .any(|a| a.ip().is_loopback() || TcpListener::bind((a.ip(), 0)).is_ok()))
}

/// The variables of `.deepspeed_env` in the working directory, else in `$HOME`.
fn deepspeed_env() -> Result<Vec<(String, String)>, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let candidates = [
        Some(PathBuf::from(".deepspeed_env")),
        home.map(|h| h.join(".deepspeed_env")),
    ];
    for path in candidates.into_iter().flatten() {
        if user_file::exists(&path) {
            let text = user_file::read_text(&path, FileKind::HostList)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            return parse_env_file(&text).map_err(|e| format!("{}: {e}", path.display()));
        }
    }
    Ok(Vec::new())
}

/// `mpirun` with the flags Open MPI needs to run ranks as root and more ranks than cores.
fn mpirun_command() -> Result<Vec<String>, String> {
    let output = Command::new("mpirun")
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "mpirun not found ({e}): CPU ranks run under MPI; install Open MPI \
             (`apt-get install openmpi-bin`) and build dsplan with `--features mpi`"
            )
        })?;
    let mut command = vec!["mpirun".to_string()];
    if String::from_utf8_lossy(&output.stdout).contains("Open MPI") {
        command.extend(["--allow-run-as-root", "--oversubscribe"].map(String::from));
    }
    Ok(command)
}
