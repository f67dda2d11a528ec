//! Whether `dsplan run` is the whole job (ranks as threads, `--world-size`) or one rank of a job
//! of processes started by a launcher ([`dsplan_executor::launch`]): `mpirun`, `srun`, torchrun
//! or the DeepSpeed launcher (and `dsplan launch`, which uses them).
//!
//! * On the CPU the processes communicate over MPI ([`dsplan_executor::comm::MpiComm`], cargo
//!   feature `mpi`): under `mpirun` (or `srun --mpi=pmix`) MPI finds the job; a torchrun-style
//!   environment on the CPU is refused with the command to use instead, since MPI cannot join
//!   processes it did not start.
//! * Rank 0 alone prints the run's header, progress and summary and writes `--metrics` and
//!   `--save-model`; every rank writes its own checkpoint files.
//! * A rank that fails prints its error prefixed with its rank and ends the whole job
//!   (`MPI_Abort`), so no rank waits for it. A collective that takes longer than
//!   `DSPLAN_COLLECTIVE_TIMEOUT` seconds (default 1800, torch's default) ends the job with an
//!   error naming the operation and the rank.

use dsplan_executor::cuda::Backend;
use dsplan_executor::launch::{LaunchEnv, Launcher};
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::train::{
    CheckpointOptions, TrainError, TrainReport, TrainSpec, train_planned_with,
};
use dsplan_planner::plan::{ModelGraph, Plan};

use super::{Failure, Outcome};

/// The variable that sets the collective timeout, in seconds.
#[cfg(feature = "mpi")]
pub(super) const TIMEOUT_VARIABLE: &str = "DSPLAN_COLLECTIVE_TIMEOUT";
#[cfg(feature = "mpi")]
/// Its default: torch's and DeepSpeed's default process-group timeout (30 minutes).
const DEFAULT_TIMEOUT_S: u64 = 1800;

/// How this process's ranks run.
pub(super) enum Ranks {
    /// Every rank is a thread of this process.
    Threads,
    /// This process is one rank of a job of processes (never made without MPI).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Process(ProcessRank),
}

/// This process's place in a job of processes, and its connection to the others.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(super) struct ProcessRank {
    env: LaunchEnv,
    #[cfg(feature = "mpi")]
    job: dsplan_executor::comm::MpiJob,
    #[cfg(feature = "mpi")]
    timeout: std::time::Duration,
    /// Without MPI no process rank can be made ([`ProcessRank::connect`] refuses).
    #[cfg(not(feature = "mpi"))]
    never: std::convert::Infallible,
}

impl Ranks {
    /// Reads the launcher's environment: a job of one process is [`Ranks::Threads`].
    pub(super) fn detect(world_flag: u64) -> Result<Ranks, Failure> {
        let env = LaunchEnv::from_process_env()
            .map_err(|e| Failure::usage(format!("the launcher's environment: {e}")))?;
        if !env.is_multi_process() {
            return Ok(Ranks::Threads);
        }
        if world_flag != 1 && world_flag as usize != env.world_size {
            return Err(Failure::usage(format!(
                "--world-size {world_flag}, but {} started {} processes; leave --world-size \
                 out (each process is one rank)",
                env.launcher.name(),
                env.world_size
            )));
        }
        ProcessRank::connect(env).map(Ranks::Process)
    }

    /// The number of ranks of the run.
    pub(super) fn world(&self, world_flag: u64) -> usize {
        match self {
            Ranks::Threads => world_flag as usize,
            Ranks::Process(p) => p.env.world_size,
        }
    }

    /// Whether this process prints the run's header, progress and summary (rank 0).
    pub(super) fn reports(&self) -> bool {
        match self {
            Ranks::Threads => true,
            Ranks::Process(p) => p.env.rank == 0,
        }
    }

    /// How ranks are described in the header ("thread" or "process").
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Ranks::Threads => "rank(s)",
            Ranks::Process(_) => "process rank(s)",
        }
    }

    /// Refuses process ranks on a GPU: the CUDA backend trains one process on one GPU today.
    pub(super) fn check_backend(&self, backend: &Backend) -> Result<(), Failure> {
        match (self, backend) {
            (Ranks::Process(p), Backend::Cuda(_)) => Err(Failure::usage(format!(
                "{} started {} processes, but the CUDA backend trains one process on one GPU;                  run the job with --device cpu (ranks over MPI) or as one process",
                p.env.launcher.name(),
                p.env.world_size
            ))),
            _ => Ok(()),
        }
    }

    /// Trains: every rank as a thread, or this process as its rank.
    pub(super) fn train(
        &self,
        spec: &TrainSpec,
        plan: &Plan,
        graph: &ModelGraph,
        checkpoints: &CheckpointOptions,
        observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, TrainError> {
        match self {
            Ranks::Threads => train_planned_with(spec, plan, graph, checkpoints, observer),
            Ranks::Process(p) => p.train(spec, plan, graph, checkpoints, observer),
        }
    }

    /// Reports `failure` and, for a rank of a job of processes, ends the whole job with its
    /// exit code (the others would otherwise wait for this rank). Returns for threads.
    pub(super) fn fail(&self, failure: &Failure) -> Outcome {
        match self {
            Ranks::Threads => {
                if !failure.message.is_empty() {
                    eprintln!("error: {}", failure.message);
                }
                failure.outcome
            }
            Ranks::Process(p) => {
                eprintln!("error: rank {}: {}", p.env.rank, failure.message);
                p.abort(failure.outcome)
            }
        }
    }
}

/// An exit code for `Outcome`.
#[cfg(feature = "mpi")]
fn code(outcome: Outcome) -> i32 {
    match outcome {
        Outcome::Success => 0,
        Outcome::InputRejected => 1,
        Outcome::UsageError => 2,
    }
}

impl ProcessRank {
    #[cfg(feature = "mpi")]
    fn connect(env: LaunchEnv) -> Result<Self, Failure> {
        use dsplan_executor::comm::MpiJob;
        let timeout = collective_timeout()?;
        if !matches!(
            env.launcher,
            Launcher::OpenMpi | Launcher::Pmi | Launcher::Slurm
        ) {
            return Err(not_mpi(&env));
        }
        let job = MpiJob::init().map_err(|e| Failure::usage(e.to_string()))?;
        if (job.rank(), job.world_size()) != (env.rank, env.world_size) {
            return Err(Failure::usage(format!(
                "{} made this process rank {} of {}, but MPI sees rank {} of {}: start the job \
                 through MPI's process manager (`mpirun`, or `srun --mpi=pmix`)",
                env.launcher.name(),
                env.rank,
                env.world_size,
                job.rank(),
                job.world_size()
            )));
        }
        Ok(ProcessRank { env, job, timeout })
    }

    #[cfg(not(feature = "mpi"))]
    fn connect(env: LaunchEnv) -> Result<Self, Failure> {
        if env.launcher.is_mpi() || env.launcher == Launcher::Slurm {
            return Err(Failure::usage(format!(
                "{} started this process as rank {} of {}, but this dsplan was built without \
                 MPI: CPU ranks as processes need `cargo build --release --features mpi` (and \
                 Open MPI or MPICH)",
                env.launcher.name(),
                env.rank,
                env.world_size
            )));
        }
        Err(not_mpi(&env))
    }

    #[cfg(feature = "mpi")]
    fn train(
        &self,
        spec: &TrainSpec,
        plan: &Plan,
        graph: &ModelGraph,
        checkpoints: &CheckpointOptions,
        observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, TrainError> {
        let rank = self.env.rank;
        let comm = self.job.comm(
            self.timeout,
            Box::new(move |error| {
                eprintln!("error: rank {rank}: {error} (the limit is {TIMEOUT_VARIABLE})");
                std::process::exit(code(Outcome::InputRejected));
            }),
        );
        dsplan_executor::train::train_planned_as_rank(
            spec,
            plan,
            graph,
            checkpoints,
            Box::new(comm),
            observer,
        )
    }

    #[cfg(not(feature = "mpi"))]
    fn train(
        &self,
        _spec: &TrainSpec,
        _plan: &Plan,
        _graph: &ModelGraph,
        _checkpoints: &CheckpointOptions,
        _observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, TrainError> {
        match self.never {}
    }

    #[cfg(feature = "mpi")]
    fn abort(&self, outcome: Outcome) -> Outcome {
        self.job.abort(code(outcome))
    }

    #[cfg(not(feature = "mpi"))]
    fn abort(&self, _outcome: Outcome) -> Outcome {
        match self.never {}
    }
}

/// The refusal of a torchrun-style environment on the CPU.
fn not_mpi(env: &LaunchEnv) -> Failure {
    Failure::usage(format!(
        "{} started this process as rank {} of {}: CPU ranks as processes communicate over MPI, \
         which must start them itself; use `mpirun -np {} dsplan run ...` or `dsplan launch \
         --num_gpus {} ...` (which hands CPU jobs to mpirun), or one process with \
         --world-size {} (ranks as threads)",
        env.launcher.name(),
        env.rank,
        env.world_size,
        env.world_size,
        env.world_size,
        env.world_size
    ))
}

/// `DSPLAN_COLLECTIVE_TIMEOUT`, in seconds.
#[cfg(feature = "mpi")]
fn collective_timeout() -> Result<std::time::Duration, Failure> {
    match std::env::var(TIMEOUT_VARIABLE) {
        Err(_) => Ok(std::time::Duration::from_secs(DEFAULT_TIMEOUT_S)),
        Ok(value) => value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&s| s > 0)
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| {
                Failure::usage(format!(
                    "{TIMEOUT_VARIABLE}={value:?} is not a whole number of seconds above 0"
                ))
            }),
    }
}
