//! [`setup`]: where the job runs and by which plan, decided once before anything is
//! allocated.
//!
//! 1. The backend is settled ([`super::cuda::settle`]): the GPU `--device` chose, or the CPU
//!    when `auto` finds the GPU backend cannot run the job.
//! 2. The attention kernels follow from that backend and the precision, once
//!    ([`AttentionChoice::kernel`]), and an explicit choice the backend cannot run is refused.
//! 3. The plan is compiled for the backend's buffers (`dsplan-cuda` or `dsplan-cpu`, what
//!    `dsplan plan --backend` shows); its warnings are printed with the file's lines.
//! 4. The memory pre-flight sets the plan's peak against the machine ([`super::memory`]).

use dsplan_executor::cuda::Backend;
use dsplan_executor::train::{TrainSpec, compile_cuda_plan, compile_plan};
use dsplan_planner::diagnostics::{Diagnostic, Severity};
use dsplan_planner::plan::Plan;

use super::job::Job;
use super::ranks::Ranks;
use super::{AttentionChoice, Failure, RunArgs, cuda, memory};
use crate::render;

/// The settled backend, the run (weights not yet read) and its plan.
pub(super) struct Setup {
    /// Where the run computes.
    pub backend: Backend,
    /// The run.
    pub spec: TrainSpec,
    /// The plan the engines follow.
    pub plan: Plan,
}

/// Settles `backend` for `job` on a world of `world` ranks, compiles its plan and checks its
/// memory; see the [module documentation](self).
pub(super) fn setup(
    args: &RunArgs,
    job: &Job,
    backend: Backend,
    world: usize,
    ranks: &Ranks,
) -> Result<Setup, Failure> {
    // The GPU backend's own checks see the kernels it would run; under `auto` the CPU may
    // take the job, whose kernels are then the CPU's.
    let on_gpu = job
        .settings
        .clone()
        .with_attention_kernel(args.attention_kernel.kernel(&backend, &job.settings));
    cuda::check_attention_kernel(&backend, &on_gpu)?;
    let backend = cuda::settle(backend, args.device, &job.spec(on_gpu, world))?;
    let settings = job
        .settings
        .clone()
        .with_attention_kernel(args.attention_kernel.kernel(&backend, &job.settings));
    cuda::check_attention_kernel(&backend, &settings)?;
    let spec = job.spec(settings, world);
    let plan = compile(job, &spec, &backend, world, ranks)?;
    let ranks_per_gpu = cuda::ranks_per_gpu(&backend, ranks, world);
    let preflight = memory::preflight(
        &plan,
        &backend,
        world,
        ranks_per_gpu,
        job.num_params,
        job.data_bytes,
    );
    memory::enforce(preflight, args.force)?;
    Ok(Setup {
        backend,
        spec,
        plan,
    })
}

/// The plan of `spec` for `backend`'s buffers; its warnings printed by rank 0 alone.
fn compile(
    job: &Job,
    spec: &TrainSpec,
    backend: &Backend,
    world: usize,
    ranks: &Ranks,
) -> Result<Plan, Failure> {
    let compile = match backend {
        Backend::Cuda(_) => compile_cuda_plan,
        Backend::Cpu => compile_plan,
    };
    let plan = compile(&spec.settings, &spec.model, spec.seq_len, world).map_err(|mut found| {
        job.file.locate_all(&mut found);
        say_text!("{}", render::human(&job.file, &found));
        Failure::input(format!(
            "{}: the plan cannot be compiled; `dsplan plan` explains it",
            job.display
        ))
    })?;
    let mut warnings: Vec<Diagnostic> = plan
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .cloned()
        .collect();
    job.file.locate_all(&mut warnings);
    if ranks.reports() {
        say_text!("{}", render::human(&job.file, &warnings));
    }
    Ok(plan)
}

impl AttentionChoice {
    /// The kernels a run on `backend` launches: an explicit choice as it is (checked by
    /// [`cuda::check_attention_kernel`]); `auto` the tensor-core kernels wherever they run
    /// (the CUDA backend, 16-bit training: 2.5x the scalar kernels' tokens/s on an H200,
    /// 2026-11-27, every check passed), else the scalar ones.
    pub(super) fn kernel(
        self,
        backend: &Backend,
        settings: &dsplan_executor::train::TrainSettings,
    ) -> dsplan_executor::train::settings::AttentionKernel {
        use dsplan_executor::train::settings::AttentionKernel;
        match self {
            AttentionChoice::Scalar => AttentionKernel::Scalar,
            AttentionChoice::TensorCore => AttentionKernel::TensorCore,
            AttentionChoice::Auto => match backend {
                Backend::Cuda(_)
                    if settings.precision().model_dtype() != dsplan_executor::zero::Dtype::F32 =>
                {
                    AttentionKernel::TensorCore
                }
                _ => AttentionKernel::Scalar,
            },
        }
    }
}
