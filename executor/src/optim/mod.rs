//! Optimizer arithmetic on flat f32 slices (a whole buffer or one rank's shard of it).
//!
//! * [`adam`]: Adam / AdamW as DeepSpeed configures them (`adam_w_mode`, `bias_correction`),
//!   in `torch.optim.AdamW`'s arithmetic order.
//! * [`clip`]: global L2 gradient norm and `torch.nn.utils.clip_grad_norm_` scaling.
//! * [`offload`]: ZeRO-Offload's host optimizer: the same Adam as one pass over fp32 state in
//!   host memory, 16-bit gradients in and 16-bit parameters out, on a NUMA-aware pool.

pub mod adam;
pub mod clip;
pub mod offload;

pub use adam::{AdamConfig, AdamError, AdamState, BiasCorrection, WeightDecay, adam_step};
pub use clip::{
    ClipReport, clip_coefficient, clip_grad_norm, global_norm, scale_grads, sum_of_squares,
};
