//! The training step on the GPU, built from the kernels of [`super::launch`] and the products
//! of [`super::gemm`], for every model family.
//!
//! The step is data first: [`layout`] lays out every device buffer on the host
//! ([`DeviceLayout`], bytes per memory category before any allocation); each [`family`] is a
//! recipe of [`Op`]s (its forward and backward in the CPU model's order) over that layout;
//! [`step`] wraps them into a step's phases and [`world_step`] adds the plan's collectives
//! at `W > 1`. The same op lists then run on the GPU ([`execute`], one op per launcher or
//! cuBLASLt call) or on the host ([`host`], the GPU's twin), both as backends of the one
//! training loop (`crate::train::step`: data, loss scaling, schedule, clipping, reporting,
//! checkpoints). Host tests read the lists (shapes, aliasing, launch counts, kernel
//! signatures) without a GPU.
//!
//! | module | job | runs without a GPU |
//! |---|---|---|
//! | [`region`] | the step's regions and tensor references, the ground floor | yes |
//! | [`step_tensors`] | the tensors every family has, and the `lm_head` and classifier ops | yes |
//! | [`layout`] | every device buffer, sized from the model and micro-batch ([`DeviceLayout`]) | yes |
//! | [`shares`] | a rank's shares of the plan's model states | yes |
//! | [`family`] | each model family's tensors and recipe of ops | yes |
//! | [`program`] | [`Op`]: the one op vocabulary, its shape checks and kernel launches | yes |
//! | [`step`] | the op lists of a step's phases | yes |
//! | [`world_step`] | the step of one rank among `W > 1`: the plan's collectives between the units' compute | yes |
//! | [`mfu`] | FLOPs per token and device peaks | yes |
//! | [`offload`] | ZeRO-Offload: a program's optimizer moved to the host, the plans it runs | yes |
//! | [`owned`] | a rank's owned share of the model states, in the device's and the CPU checkpoint's layouts | yes |
//! | [`placement`] | each rank's GPU and the device collective, from the rank and GPU counts | yes |
//! | [`spec`] | whether the GPU can run a spec ([`check_spec`]), and the run's errors | yes |
//! | [`host`] | the step's program interpreted on host buffers and thread ranks ([`host::train_program_on_host`]) | yes |
//! | [`device_step`] | the training loop's backend for a rank's program, on any target ([`device_step::DeviceStep`]) | yes (on the host target) |
//! | [`execute`] | allocations and the op interpreter | needs a GPU |
//! | [`execute_comm`] | the communication ops through a `DeviceComm`, on their streams | needs a GPU |
//! | [`rank`] | one rank's GPU as a target of the device step ([`Gpu`], [`CudaStep`]) | needs a GPU |
//! | [`world`] | the runs: one GPU, `W` thread ranks, one process rank of a job | needs a GPU (its programs are built on the host) |
//!
//! For ZeRO stages 0-3 on one GPU the math is the same step. At `W > 1`, [`world_program`]
//! builds a rank's step from the plan (buckets, stage-3 schedule, parameter all-gather) and
//! [`execute_comm`] runs its collectives through `cuda::device_comm`; [`world`] drives `W`
//! thread ranks (or this process as one rank of a job) through the one training loop.

pub mod device_step;
pub mod execute;
pub mod execute_comm;
pub mod family;
pub mod host;
pub mod layout;
pub mod mfu;
pub mod offload;
mod offload_plan;
pub mod owned;
pub mod placement;
pub mod program;
pub mod rank;
pub mod region;
pub mod shares;
pub mod spec;
pub mod step;
pub mod step_tensors;
pub mod world;
pub mod world_step;

pub use family::{ConstantUpload, Family, Recipe};
pub use layout::DeviceLayout;
pub use owned::{DeviceOwned, held_from_whole, owned_from_whole, scatter_owned};
pub use placement::{
    DeviceLink, NcclLibrary, Placement, place_process, place_ranks, processes_per_gpu,
};
pub use program::{Launch, Op, ShapeError};
pub use rank::{CudaStep, Gpu, NcclWithHost, RankComm};
pub use region::{Region, TensorRef};
pub use spec::{CudaTrainError, check_spec, kernel_dtype};
pub use step::StepProgram;
pub use world::{
    nccl_library, rank_models, thread_placement, train_cuda, train_cuda_as_rank,
    train_cuda_planned, visible_gpus,
};
pub use world_step::world_program;
