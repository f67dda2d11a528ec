//! The execution plan of a run: [`compile_plan`] hands the resolved config, the model and the
//! run's shape to `planner::plan::compile`, as the executor's CPU backend presents them.
//!
//! What is passed for the in-process CPU "cluster":
//!
//! * **model**: the [`ModelGraph`] of the model being trained (GPT-2 or Llama family) ([`model_graph`]): the same
//!   tensors, in the same order, under the same Hugging Face names as [`ParamLayout`];
//! * **cluster**: `world` ranks on one node (`Cluster::new(world, world)`), all threads of this
//!   process. The cluster's rates (an H100 node by default) only feed the plan's step-time
//!   estimate, which a CPU run does not use; memory and layout do not depend on them;
//! * **workload**: the run's sequence length, full activation checkpointing when the run
//!   recomputes each block ([`TrainSettings::recompute`]; none otherwise: the model keeps every
//!   activation), `all_gather_into_tensor` *unavailable*: the in-process collectives
//!   work on `f32` copies, so the stage 1/2 parameter all-gather runs in
//!   `allgather_bucket_size` pieces, as DeepSpeed does on backends without it, instead of
//!   staging the whole flat buffer; and the **`dsplan-cpu` backend**
//!   (`PlanBackend::DsplanCpu`): the plan's buffer list is this executor's own
//!   (`planner::plan::cpu_buffers`), so the memory it predicts is what the ranks measure.
//!
//! A run on one GPU compiles its plan with [`compile_cuda_plan`] instead: the
//! **`dsplan-cuda` backend** (`PlanBackend::DsplanCuda`, `planner::plan::cuda_buffers`), whose
//! buffers are exactly the device step's ([`crate::cuda::train::DeviceLayout`]), with NCCL's
//! `all_gather_into_tensor`.
//!
//! [`ParamLayout`]: crate::model::ParamLayout

use dsplan_planner::config::DsConfig;
use dsplan_planner::diagnostics::Diagnostic;
use dsplan_planner::model::Architecture;
use dsplan_planner::plan::{
    self, Checkpointing, Cluster, ModelGraph, Plan, PlanBackend, Training, Workload,
};

use super::{TrainError, TrainSettings};
use crate::model::{ModelConfig, Recompute};

/// The architecture the planner knows `config` by.
pub fn architecture(config: &ModelConfig) -> Architecture {
    config.architecture()
}

/// The planner's graph of the model `config` describes.
pub fn model_graph(config: &ModelConfig) -> Result<ModelGraph, Vec<Diagnostic>> {
    ModelGraph::from_architecture(config.family_name(), &architecture(config)).map_err(|error| {
        vec![Diagnostic::error(
            dsplan_planner::diagnostics::Code::WrongType,
            "",
            format!("the model cannot be planned: {error}"),
        )]
    })
}

/// The workload of a CPU run with rows of `seq_len` tokens ([`Workload::for_backend`] of
/// `dsplan-cpu`: the in-process collectives have no `all_gather_into_tensor`; the buffers are
/// the CPU executor's). Without recomputation the executor stores every activation (no
/// checkpointing) and runs eager attention, which are the planner's defaults
/// ([`compile_plan`] sets the run's checkpointing).
pub fn cpu_workload(seq_len: usize) -> Workload {
    run_workload(PlanBackend::DsplanCpu, &DsConfig::default(), seq_len)
}

/// The workload of a run on one GPU with rows of `seq_len` tokens: the CUDA executor's
/// buffers (`dsplan-cuda`).
pub fn cuda_workload(seq_len: usize) -> Workload {
    run_workload(PlanBackend::DsplanCuda, &DsConfig::default(), seq_len)
}

fn run_workload(backend: PlanBackend, config: &DsConfig, seq_len: usize) -> Workload {
    Workload {
        sequence_length: Some(seq_len as u64),
        ..Workload::for_backend(backend, config)
    }
}

/// The plan of a run of `settings` training `model` on `world` in-process ranks, with rows of
/// `seq_len` tokens (it holds the graph it was compiled for, [`Plan::model_graph`]). `Err`: the
/// planner's diagnostics.
pub fn compile_plan(
    settings: &TrainSettings,
    model: &ModelConfig,
    seq_len: usize,
    world: usize,
) -> Result<Plan, Vec<Diagnostic>> {
    compile_with(settings, model, world, PlanBackend::DsplanCpu, seq_len)
}

/// The plan of a run of `settings` training `model` on one GPU with rows of `seq_len` tokens
/// (`dsplan-cuda`: the device step's buffers). `Err`: the planner's diagnostics.
pub fn compile_cuda_plan(
    settings: &TrainSettings,
    model: &ModelConfig,
    seq_len: usize,
    world: usize,
) -> Result<Plan, Vec<Diagnostic>> {
    compile_with(settings, model, world, PlanBackend::DsplanCuda, seq_len)
}

fn compile_with(
    settings: &TrainSettings,
    model: &ModelConfig,
    world: usize,
    backend: PlanBackend,
    seq_len: usize,
) -> Result<Plan, Vec<Diagnostic>> {
    let graph = model_graph(model)?;
    let world = world.max(1) as u64;
    let cluster = Cluster::new(world, world).map_err(|message| {
        vec![Diagnostic::error(
            dsplan_planner::diagnostics::Code::OutOfRange,
            "",
            message,
        )]
    })?;
    let workload = Workload {
        checkpointing: match settings.recompute {
            Recompute::Nothing => Checkpointing::None,
            Recompute::EachLayer => Checkpointing::Full,
        },
        ..run_workload(backend, &settings.config, seq_len)
    };
    Ok(
        plan::compile(&settings.config, &graph, &cluster, &workload)?
            .with_training(settings.training.clone()),
    )
}

/// The training policy `plan` carries ([`compile_plan`] puts it there); a plan without one
/// cannot be run.
pub fn plan_training(plan: &Plan) -> Result<&Training, TrainError> {
    plan.training.as_ref().ok_or_else(|| {
        TrainError::PlanMismatch(crate::zero::PlanMismatch {
            message: "it carries no training policy (optimizer, loss scaling, schedule); compile it with compile_plan".into(),
        })
    })
}
