//! The Llama family's device step (Llama, Qwen2, Mistral without a sliding window), next to
//! GPT-2's: [`buffers`] lays out every device buffer from the planner's
//! `memory::cuda_layout::llama_cuda_tensors`, the list the `dsplan-cuda` plan counts, so the
//! plan and the allocation agree by construction.
//!
//! | module | job | runs without a GPU |
//! |---|---|---|
//! | [`buffers`] | every device buffer of a Llama-family step ([`LlamaDeviceLayout`]) | yes |
//! | [`forward`], [`backward`] | the passes as ops ([`crate::cuda::train::program::LlamaOp`] and the shared ones) | yes |
//! | [`step`] | `StepProgram::llama` and its host check | yes |
//! | [`execute`] | the Llama ops on the GPU | needs a GPU |

pub mod backward;
pub mod buffers;
pub mod execute;
pub mod forward;
pub mod step;

pub use buffers::{LlamaDeviceBlock, LlamaDeviceLayout};
