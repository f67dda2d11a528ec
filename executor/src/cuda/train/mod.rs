//! The training step on one GPU, built from the kernels of [`super::launch`] and the products
//! of [`super::gemm`].
//!
//! The step is data first: [`buffers`] lays out every device buffer on the host
//! ([`DeviceLayout`], bytes per memory category before any allocation); [`forward`],
//! [`backward`] and [`step`] build the step as lists of [`Op`]s in the CPU model's order;
//! [`execute`] runs those same lists on the GPU, one op per launcher or cuBLASLt call, and
//! [`rank`] is the GPU's backend of the one training loop (`crate::train::step`: data,
//! loss scaling, schedule, clipping, reporting, checkpoints). Host tests read the
//! lists (shapes, aliasing, launch counts, kernel signatures) without a GPU.
//!
//! | module | job | runs without a GPU |
//! |---|---|---|
//! | [`buffers`] | every device buffer, sized from the model and micro-batch | yes |
//! | [`device_model`] | the run's family: its layout, step, check and constants | yes |
//! | [`llama`] | the Llama family's device buffers | yes |
//! | [`program`] | [`Op`]: one operation as data, its shape checks and kernel launches | yes |
//! | [`forward`], [`backward`] | the passes as ops | yes |
//! | [`step`] | the op lists of a step's phases | yes |
//! | [`mfu`] | FLOPs per token and device peaks | yes |
//! | [`execute`] | allocations and the op interpreter | needs a GPU |
//! | [`world_step`] | the step of one rank among `W > 1`: the plan's collectives between the units' compute | yes |
//! | [`execute_comm`] | the communication ops through a `DeviceComm`, on their streams | needs a GPU |
//! | [`owned`] | a rank's owned share of the model states, in the device's and the CPU checkpoint's layouts | yes |
//! | [`placement`] | each rank's GPU and the device collective, from the rank and GPU counts | yes |
//! | [`rank`] | the step's operations on one rank's GPU buffers ([`CudaStep`]) | needs a GPU |
//! | [`world`] | the runs: one GPU, `W` thread ranks, one process rank of a job | needs a GPU (its programs are built on the host) |
//! | [`host`] | the step's program interpreted on host buffers and thread ranks ([`host::train_program_on_host`]) | yes (f32) |
//! | [`spec`] | whether the GPU can run a spec ([`check_spec`]), and the run's errors | yes |
//!
//! For ZeRO stages 0-3 on one GPU the math is the same step. At `W > 1`, [`world_program`]
//! builds a rank's step from the plan (buckets, stage-3 schedule, parameter all-gather) and
//! [`execute_comm`] runs its collectives through `cuda::device_comm`; [`world`] drives `W`
//! thread ranks (or this process as one rank of a job) through the one training loop, for
//! GPT-2 and the Llama family alike (each layout's [`world_step::WorldLayout`]).

pub mod backward;
pub mod buffers;
pub mod device_model;
pub mod execute;
pub mod execute_comm;
pub mod forward;
pub mod host;
pub mod llama;
pub mod mfu;
pub mod owned;
pub mod placement;
pub mod program;
pub mod rank;
pub mod spec;
pub mod step;
pub mod world;
pub mod world_step;

pub use buffers::{DeviceLayout, Region, TensorRef};
pub use device_model::DeviceModel;
pub use owned::{DeviceOwned, held_from_whole, owned_from_whole, scatter_owned};
pub use placement::{
    DeviceLink, NcclLibrary, Placement, place_process, place_ranks, processes_per_gpu,
};
pub use program::{Launch, Op, ShapeError};
pub use rank::{CudaStep, NcclWithHost, RankComm};
pub use spec::{CudaTrainError, check_spec, kernel_dtype};
pub use step::StepProgram;
pub use world::{
    nccl_library, rank_models, thread_placement, train_cuda, train_cuda_as_rank,
    train_cuda_planned, visible_gpus,
};
pub use world_step::{WorldLayout, world_program};
