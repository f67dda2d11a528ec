//! The training step on one GPU, built from the kernels of [`super::launch`] and the products
//! of [`super::gemm`].
//!
//! The step is data first: [`buffers`] lays out every device buffer on the host
//! ([`DeviceLayout`], bytes per memory category before any allocation); [`forward`],
//! [`backward`] and [`step`] build the step as lists of [`Op`]s in the CPU model's order;
//! [`execute`] runs those same lists on the GPU, one op per launcher or cuBLASLt call, and
//! [`trainer`] is the GPU's backend of the one training loop (`crate::train::step`: data,
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
//! | [`trainer`] | the step's operations on one GPU ([`CudaStep`]), and a run | needs a GPU (its checkpoint layout does not) |
//!
//! For ZeRO stages 0-3 on one GPU the math is the same step. At `W > 1`, [`world_program`]
//! builds a rank's step from the plan (buckets, stage-3 schedule, parameter all-gather) and
//! [`execute_comm`] runs its collectives through `cuda::device_comm`; the trainer does not
//! drive it yet and refuses a world above 1.

pub mod backward;
pub mod buffers;
pub mod device_model;
pub mod execute;
pub mod execute_comm;
pub mod forward;
pub mod llama;
pub mod mfu;
pub mod program;
pub mod step;
pub mod trainer;
pub mod world_step;

pub use buffers::{DeviceLayout, Region, TensorRef};
pub use device_model::DeviceModel;
pub use program::{Launch, Op, ShapeError};
pub use step::StepProgram;
pub use trainer::{
    CudaStep, CudaTrainError, check_spec, held_from_whole, owned_from_whole, train_cuda,
    train_cuda_planned,
};
pub use world_step::world_program;
