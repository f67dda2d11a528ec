//! Optimizer arithmetic on flat f32 slices (a whole buffer or one rank's shard of it).
//!
//! * [`adam`]: Adam / AdamW as DeepSpeed configures them (`adam_w_mode`, `bias_correction`),
//!   in `torch.optim.AdamW`'s arithmetic order.
//! * [`clip`]: global L2 gradient norm and `torch.nn.utils.clip_grad_norm_` scaling.

pub mod adam;
pub mod clip;

pub use adam::{AdamConfig, AdamError, AdamState, BiasCorrection, WeightDecay, adam_step};
pub use clip::{
    ClipReport, clip_coefficient, clip_grad_norm, global_norm, scale_grads, sum_of_squares,
};
