//! Whether `dsplan run` is the whole job (ranks as threads, `--world-size`) or one rank of a job
//! of processes started by a launcher ([`dsplan_executor::launch`]): `mpirun`, `srun`, torchrun
//! or the DeepSpeed launcher (and `dsplan launch`, which uses them).
//!
//! * On the CPU the processes communicate over MPI ([`dsplan_executor::comm::MpiComm`], cargo
//!   feature `mpi`): under `mpirun` (or `srun --mpi=pmix`) MPI finds the job; a torchrun-style
//!   environment on the CPU is refused with the command to use instead, since MPI cannot join
//!   processes it did not start.
//! * On GPUs (`--device cuda`) each process is rank `RANK` on GPU `LOCAL_RANK` (of the GPUs
//!   `CUDA_VISIBLE_DEVICES` leaves visible): under torchrun or the DeepSpeed launcher NCCL is
//!   bootstrapped by the TCP rendezvous on `MASTER_ADDR:MASTER_PORT`, and NCCL is also the
//!   loop's host `Comm`; under `mpirun` with the `mpi` feature the NCCL id travels over MPI
//!   and MPI is the host `Comm`. Processes that share a GPU (more local ranks than GPUs) stage
//!   their collectives through host memory over MPI (`mpi` feature); without it they are
//!   refused before training, naming why.
//! * Rank 0 alone prints the run's header, progress and summary and writes `--metrics` and
//!   `--save-model`; every rank writes its own checkpoint files.
//! * A rank that fails prints its error prefixed with its rank and ends the whole job
//!   (`MPI_Abort`), so no rank waits for it. A collective that takes longer than
//!   `DSPLAN_COLLECTIVE_TIMEOUT` seconds (default 1800, torch's default) ends the job with an
//!   error naming the operation and the rank. A GPU rank that fails without MPI prints its
//!   error and exits at once (no destructor waits on a collective), so the launcher
//!   (torchrun, the DeepSpeed launcher, `dsplan launch`) ends the others; NCCL's rendezvous
//!   waits at most `DSPLAN_COLLECTIVE_TIMEOUT` for the other ranks.

use dsplan_executor::cuda::Backend;
#[cfg(feature = "mpi")]
use dsplan_executor::cuda::device_comm::HostStaged;
use dsplan_executor::cuda::nccl::NcclComm;
#[cfg(feature = "mpi")]
use dsplan_executor::cuda::train::NcclWithHost;
use dsplan_executor::cuda::train::{
    CudaTrainError, DeviceLink, nccl_library, place_process, processes_per_gpu, train_cuda_as_rank,
    visible_gpus,
};
use dsplan_executor::launch::{LaunchEnv, Launcher};
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::train::{
    CheckpointOptions, TrainError, TrainReport, TrainSpec, train_planned_with,
};
use dsplan_planner::plan::Plan;

use super::{Device, Failure, Outcome};

/// The variable that sets the collective timeout, in seconds.
pub(super) const TIMEOUT_VARIABLE: &str = "DSPLAN_COLLECTIVE_TIMEOUT";

/// How this process's ranks run.
pub(super) enum Ranks {
    /// Every rank is a thread of this process.
    Threads,
    /// This process is one rank of a job of processes (never made without MPI).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Process(ProcessRank),
    /// This process is one rank of a job of processes on GPUs (`--device cuda`).
    Gpu(GpuRank),
}

/// This process's place in a job of GPU processes, and how it reaches the others.
pub(super) struct GpuRank {
    env: LaunchEnv,
    timeout: std::time::Duration,
    /// The job's MPI, under an MPI launcher (`mpi` feature): the NCCL id's broadcast, the
    /// host `Comm`, and the host staging of processes sharing a GPU.
    #[cfg(feature = "mpi")]
    job: Option<dsplan_executor::comm::MpiJob>,
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
    /// Reads the launcher's environment: a job of one process is [`Ranks::Threads`]; under
    /// `--device cuda` a job of processes is [`Ranks::Gpu`], otherwise [`Ranks::Process`].
    pub(super) fn detect(world_flag: u64, device: Device) -> Result<Ranks, Failure> {
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
        match device {
            Device::Cuda => GpuRank::connect(env).map(Ranks::Gpu),
            Device::Cpu | Device::Auto => ProcessRank::connect(env).map(Ranks::Process),
        }
    }

    /// The number of ranks of the run.
    pub(super) fn world(&self, world_flag: u64) -> usize {
        match self {
            Ranks::Threads => world_flag as usize,
            Ranks::Process(p) => p.env.world_size,
            Ranks::Gpu(g) => g.env.world_size,
        }
    }

    /// Whether this process prints the run's header, progress and summary (rank 0).
    pub(super) fn reports(&self) -> bool {
        match self {
            Ranks::Threads => true,
            Ranks::Process(p) => p.env.rank == 0,
            Ranks::Gpu(g) => g.env.rank == 0,
        }
    }

    /// How ranks are described in the header ("thread" or "process").
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Ranks::Threads => "rank(s)",
            Ranks::Process(_) | Ranks::Gpu(_) => "process rank(s)",
        }
    }

    /// Refuses what cannot train: CPU process ranks on a GPU (`--device auto` chose it; GPU
    /// process ranks are asked for with `--device cuda`), and GPU process ranks this machine
    /// cannot place or connect ([`GpuRank::placement`]).
    pub(super) fn check_backend(&self, backend: &Backend) -> Result<(), Failure> {
        match (self, backend) {
            (Ranks::Process(p), Backend::Cuda(_)) => Err(Failure::usage(format!(
                "{} started {} processes and --device auto chose the GPU: process ranks on \
                 GPUs are started with --device cuda (NCCL, or MPI with the `mpi` feature); use \
                 --device cuda, or --device cpu for ranks over MPI",
                p.env.launcher.name(),
                p.env.world_size
            ))),
            (Ranks::Gpu(g), Backend::Cuda(_)) => g.placement().map(|_| ()),
            (Ranks::Gpu(g), Backend::Cpu) => Err(Failure::usage(format!(
                "rank {} was started for --device cuda, but the run is on the CPU",
                g.env.rank
            ))),
            _ => Ok(()),
        }
    }

    /// Trains: every rank as a thread, or this process as its rank.
    pub(super) fn train(
        &self,
        spec: &TrainSpec,
        plan: &Plan,
        checkpoints: &CheckpointOptions,
        observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, TrainError> {
        match self {
            Ranks::Threads => train_planned_with(spec, plan, checkpoints, observer),
            Ranks::Process(p) => p.train(spec, plan, checkpoints, observer),
            // `check_backend` refuses a GPU rank on the CPU before training.
            Ranks::Gpu(g) => Err(TrainError::PlanMismatch(
                dsplan_executor::zero::PlanMismatch {
                    message: format!("rank {} was started for --device cuda", g.env.rank),
                },
            )),
        }
    }

    /// Reports `failure` and, for a rank of a job of processes, ends the whole job with its
    /// exit code (the others would otherwise wait for this rank). Returns for threads.
    pub(super) fn fail(&self, failure: &Failure) -> Outcome {
        match self {
            Ranks::Threads => {
                if !failure.message.is_empty() {
                    say!("error: {}", crate::render::escape_message(&failure.message));
                }
                failure.outcome
            }
            Ranks::Process(p) => {
                say!(
                    "error: rank {}: {}",
                    p.env.rank,
                    crate::render::escape_message(&failure.message)
                );
                p.abort(failure.outcome)
            }
            Ranks::Gpu(g) => {
                say!(
                    "error: rank {}: {}",
                    g.env.rank,
                    crate::render::escape_message(&failure.message)
                );
                g.abort(failure.outcome)
            }
        }
    }
}

/// An exit code for `Outcome`.
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
        checkpoints: &CheckpointOptions,
        observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, TrainError> {
        let rank = self.env.rank;
        let comm = self.job.comm(
            self.timeout,
            Box::new(move |error| {
                say!("error: rank {rank}: {error} (the limit is {TIMEOUT_VARIABLE})");
                std::process::exit(code(Outcome::InputRejected));
            }),
        );
        dsplan_executor::train::train_planned_as_rank(
            spec,
            plan,
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
fn collective_timeout() -> Result<std::time::Duration, Failure> {
    match std::env::var(TIMEOUT_VARIABLE) {
        Err(_) => Ok(dsplan_executor::comm::DEFAULT_TIMEOUT),
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

impl GpuRank {
    /// Takes the launcher's environment; under an MPI launcher with the `mpi` feature, joins
    /// MPI (whose rank must be the launcher's). Nothing is sent yet: NCCL is joined when the
    /// run starts, after the device probe.
    fn connect(env: LaunchEnv) -> Result<Self, Failure> {
        let timeout = collective_timeout()?;
        #[cfg(feature = "mpi")]
        {
            let job = if matches!(
                env.launcher,
                Launcher::OpenMpi | Launcher::Pmi | Launcher::Slurm
            ) {
                let job = dsplan_executor::comm::MpiJob::init()
                    .map_err(|e| Failure::usage(e.to_string()))?;
                if (job.rank(), job.world_size()) != (env.rank, env.world_size) {
                    return Err(Failure::usage(format!(
                        "{} made this process rank {} of {}, but MPI sees rank {} of {}",
                        env.launcher.name(),
                        env.rank,
                        env.world_size,
                        job.rank(),
                        job.world_size()
                    )));
                }
                Some(job)
            } else {
                None
            };
            Ok(GpuRank { env, timeout, job })
        }
        #[cfg(not(feature = "mpi"))]
        Ok(GpuRank { env, timeout })
    }

    /// Whether this process reaches the others through MPI.
    fn has_mpi(&self) -> bool {
        #[cfg(feature = "mpi")]
        return self.job.is_some();
        #[cfg(not(feature = "mpi"))]
        false
    }

    /// This process's GPU and device collective ([`place_process`]), or why it cannot train:
    /// processes that need the host staging (they share a GPU, or NCCL is missing) without
    /// MPI.
    /// How many of this node's processes train on this process's GPU (the node's
    /// processes over its visible GPUs; 1 when the count of either is unknown).
    pub(super) fn processes_per_gpu(&self) -> usize {
        let local = self.env.local_world_size.unwrap_or(1);
        visible_gpus().map_or(1, |visible| processes_per_gpu(local, visible))
    }

    pub(super) fn placement(&self) -> Result<(usize, DeviceLink), Failure> {
        let visible = visible_gpus().map_err(|e| Failure::usage(format!("--device cuda: {e}")))?;
        let nccl = nccl_library();
        let (ordinal, link) = place_process(
            self.env.local_rank,
            self.env.local_world_size,
            visible,
            nccl,
        )
        .map_err(|e| Failure::usage(format!("--device cuda: {e}")))?;
        if link == DeviceLink::HostStaged && !self.has_mpi() {
            let why = if nccl == dsplan_executor::cuda::train::NcclLibrary::Missing {
                "libnccl cannot be loaded (see `dsplan report`)".to_string()
            } else {
                format!(
                    "local rank {} shares one of {visible} visible GPU(s) with another process, \
                     and NCCL refuses two ranks on one GPU",
                    self.env.local_rank
                )
            };
            return Err(Failure::usage(format!(
                "--device cuda under {}: {why}; processes then stage their collectives through \
                 host memory over MPI, which needs a dsplan built with `--features mpi` started \
                 by mpirun; or give each process a GPU of its own, or run one process with \
                 --world-size {} (thread ranks share GPUs without MPI)",
                self.env.launcher.name(),
                self.env.world_size
            )));
        }
        Ok((ordinal, link))
    }

    /// Where this rank trains, for the header.
    pub(super) fn describe(&self, name: &str) -> String {
        match self.placement() {
            Ok((ordinal, link)) => {
                let how = match link {
                    DeviceLink::Nccl => "collectives over NCCL",
                    DeviceLink::HostStaged => "collectives staged through host memory over MPI",
                    DeviceLink::Alone => "no collectives",
                };
                format!(
                    "one GPU per process, rank {} on GPU {ordinal} ({name}; {how})",
                    self.env.rank
                )
            }
            Err(failure) => format!("on GPUs ({})", failure.message),
        }
    }

    /// Trains this process as its rank on its GPU, NCCL bootstrapped by the launcher's
    /// rendezvous (or over MPI), or staged through host memory over MPI.
    pub(super) fn train(
        &self,
        spec: &TrainSpec,
        plan: &Plan,
        checkpoints: &CheckpointOptions,
        observer: &(dyn Fn(&StepMetrics) + Sync),
    ) -> Result<TrainReport, CudaTrainError> {
        let (ordinal, link) = self
            .placement()
            .map_err(|f| CudaTrainError::Setup(f.message))?;
        let who = (self.env.rank, ordinal);
        #[cfg(feature = "mpi")]
        if let Some(job) = &self.job {
            let (rank, timeout) = (self.env.rank, self.timeout);
            let host = job.comm(
                self.timeout,
                Box::new(move |error| {
                    say!("error: rank {rank}: {error} (the limit is {TIMEOUT_VARIABLE})");
                    std::process::exit(code(Outcome::InputRejected));
                }),
            );
            return match link {
                DeviceLink::HostStaged => train_cuda_as_rank(
                    spec,
                    plan,
                    checkpoints,
                    who,
                    move |ctx, _| Ok(HostStaged::new(host, ctx.new_stream()?)),
                    observer,
                ),
                DeviceLink::Nccl | DeviceLink::Alone => train_cuda_as_rank(
                    spec,
                    plan,
                    checkpoints,
                    who,
                    move |ctx, _| {
                        let mut host = host;
                        let nccl = NcclComm::from_host_comm(ctx.new_stream()?, &mut host, timeout)?;
                        Ok(NcclWithHost { nccl, host })
                    },
                    observer,
                ),
            };
        }
        match link {
            DeviceLink::HostStaged => Err(CudaTrainError::Setup(
                "processes sharing a GPU need MPI (`--features mpi`, started by mpirun)".into(),
            )),
            DeviceLink::Nccl | DeviceLink::Alone => {
                let (env, timeout) = (&self.env, self.timeout);
                train_cuda_as_rank(
                    spec,
                    plan,
                    checkpoints,
                    who,
                    |ctx, _| NcclComm::from_env(ctx.new_stream()?, env, timeout),
                    observer,
                )
            }
        }
    }

    /// Ends the whole job: through MPI when it started it, else by exiting at once with
    /// `outcome`'s code (the launcher ends the other ranks).
    fn abort(&self, outcome: Outcome) -> Outcome {
        #[cfg(feature = "mpi")]
        if let Some(job) = &self.job {
            job.abort(code(outcome))
        }
        std::process::exit(code(outcome))
    }
}
