//! `dsplan run --device cuda|auto`: which backend runs, and the run on one GPU.
//!
//! [`choose`] probes the driver once, before the config is read (`--device cuda` without a
//! usable GPU is a usage error, exit 2; `auto` falls back to the CPU with one notice line).
//! Once the run is known, [`settle`] asks whether the GPU backend can run it
//! ([`check_spec`]: one rank, a head size with attention kernels; no offload): under `cuda`
//! a refusal is a usage error naming the reason, under `auto` the CPU runs it after one
//! notice line. [`train`] runs [`train_cuda_planned`]: the one training loop of every
//! backend, so the GPU run has the CPU run's progress, `--metrics`, `--save-model`,
//! checkpoints, resume and summary ([`super::report`], which adds the device, MFU and what
//! the driver reports in use). The run's plan is compiled with the `dsplan-cuda` backend,
//! whose buffers are the device step's, so allocated and planned memory agree to the byte.
//!
//! Ranks as threads start at GPU 0 and are placed by
//! [`dsplan_executor::cuda::train::thread_placement`] (one GPU each while there are enough,
//! NCCL between them; ranks sharing a GPU stage their collectives through host memory); a
//! process started by a launcher trains as its rank ([`super::ranks::GpuRank`]).

use dsplan_executor::cuda::train::{
    CudaTrainError, check_spec, thread_placement, train_cuda_planned,
};
use dsplan_executor::cuda::{Backend, CudaDeviceInfo, DeviceChoice, choose_backend};
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::train::settings::AttentionKernel;
use dsplan_executor::train::{CheckpointOptions, TrainReport, TrainSettings, TrainSpec};
use dsplan_executor::zero::Dtype;
use dsplan_planner::config::OffloadDevice;
use dsplan_planner::plan::Plan;

use super::ranks::Ranks;
use super::{Device, Failure};

/// The GPU a single process trains on.
const ORDINAL: usize = 0;

/// Resolves `--device` against the driver; prints `auto`'s fallback notice.
pub(super) fn choose(device: Device) -> Result<Backend, Failure> {
    let choice = match device {
        Device::Cpu => DeviceChoice::Cpu,
        Device::Cuda => DeviceChoice::Cuda,
        Device::Auto => DeviceChoice::Auto,
    };
    let chosen = choose_backend(choice, ORDINAL).map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(notice) = &chosen.notice {
        say!("{notice}");
    }
    Ok(chosen.backend)
}

/// Keeps the GPU when its backend can run `spec`; otherwise an error under `--device cuda`,
/// the CPU and one notice line under `auto`.
pub(super) fn settle(
    backend: Backend,
    device: Device,
    spec: &TrainSpec,
) -> Result<Backend, Failure> {
    let Backend::Cuda(_) = backend else {
        return Ok(backend);
    };
    let Some(why) = unsupported(spec) else {
        return Ok(backend);
    };
    match device {
        Device::Auto => {
            say!("note: --device auto: {why}; running on the CPU");
            Ok(Backend::Cpu)
        }
        Device::Cuda | Device::Cpu => Err(Failure::usage(format!(
            "--device cuda: {why}; use --device cpu"
        ))),
    }
}

/// `--attention-kernel` other than scalar needs the CUDA backend and 16-bit training: a usage
/// error naming the fix otherwise (checked before [`settle`], so `--device cuda` in f32 is told
/// about the precision, and after it, so an `auto` run that falls back to the CPU is refused
/// rather than silently running another kernel).
pub(super) fn check_attention_kernel(
    backend: &Backend,
    settings: &TrainSettings,
) -> Result<(), Failure> {
    let kernel = settings.attention;
    if kernel == AttentionKernel::Scalar {
        return Ok(());
    }
    if matches!(backend, Backend::Cpu) {
        return Err(Failure::usage(format!(
            "--attention-kernel {kernel} selects CUDA kernels, and this run trains on the CPU; \
             use --device cuda on a GPU, or drop the option"
        )));
    }
    if settings.precision().model_dtype() == Dtype::F32 {
        return Err(Failure::usage(format!(
            "--attention-kernel {kernel} is built for bf16 and fp16 training, and the config \
             trains in f32; enable bf16 or fp16 in the config, or use --attention-kernel scalar"
        )));
    }
    Ok(())
}

/// Why the GPU backend cannot run `spec` (`None`: it can).
fn unsupported(spec: &TrainSpec) -> Option<String> {
    let zero = &spec.settings.config.zero_optimization;
    let offloaded = [
        (
            "optimizer",
            zero.offload_optimizer.as_ref().map(|o| o.device),
        ),
        ("parameter", zero.offload_param.as_ref().map(|o| o.device)),
    ]
    .into_iter()
    .find(|(_, device)| device.is_some_and(|d| d != OffloadDevice::None));
    if let Some((what, _)) = offloaded {
        return Some(format!(
            "the CUDA backend does not run {what} offload on a GPU yet: `dsplan plan --backend \
             dsplan-cuda` plans it and the offloaded step's program (optimizer offload to the \
             CPU, stages 1-3) runs on the host interpreter, but the device executor does not \
             allocate its host buffers; remove the offload section, or run with --device cpu"
        ));
    }
    check_spec(spec).err().map(|e| e.to_string())
}

/// Where the run computes, for the opening line: the CPU, one GPU, where `world` thread
/// ranks are placed and how they communicate, or this process rank's GPU.
pub(super) fn place(backend: &Backend, ranks: &Ranks, world: usize) -> String {
    let Backend::Cuda(device) = backend else {
        return "on the CPU".to_string();
    };
    match ranks {
        Ranks::Gpu(rank) => rank.describe(&device.name),
        _ if world > 1 => match thread_placement(world, device.ordinal) {
            Ok(placement) => format!("{placement}, {}", device.name),
            Err(e) => format!("on GPU {} ({}; {e})", device.ordinal, device.name),
        },
        _ => format!("on GPU {} ({})", device.ordinal, device.name),
    }
}

/// How many ranks train on the busiest GPU: the thread ranks [`thread_placement`] puts on
/// one GPU, or the node's processes sharing this process's GPU (1 on the CPU or when the
/// placement is unknown; the run then fails at placement with its own error).
pub(super) fn ranks_per_gpu(backend: &Backend, ranks: &Ranks, world: usize) -> usize {
    match (backend, ranks) {
        (Backend::Cpu, _) => 1,
        (Backend::Cuda(_), Ranks::Gpu(rank)) => rank.processes_per_gpu(),
        (Backend::Cuda(device), _) if world > 1 => {
            thread_placement(world, device.ordinal).map_or(1, |p| p.busiest())
        }
        (Backend::Cuda(_), _) => 1,
    }
}

/// Trains `spec` by `plan` through the one training loop, with the CPU run's checkpoints and
/// observer: every rank as a thread from `device` on, or this process as its rank; the
/// summary is every run's ([`super::report`]).
pub(super) fn train(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    (device, ranks): (&CudaDeviceInfo, &Ranks),
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, CudaTrainError> {
    match ranks {
        Ranks::Gpu(rank) => rank.train(spec, plan, checkpoints, observer),
        Ranks::Threads | Ranks::Process(_) => {
            train_cuda_planned(spec, plan, checkpoints, device.ordinal, observer)
        }
    }
}
