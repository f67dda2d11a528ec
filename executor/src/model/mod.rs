//! GPT-2 on the CPU, written by hand (llm.c style), matching Hugging Face `transformers`.
//!
//! * [`Gpt2Config`] fixes the shapes; [`ParamLayout`] places every parameter (Hugging Face
//!   names, Conv1D `[in, out]` weights, tied `lm_head`) in one flat buffer, and the gradients
//!   in a second buffer with the same layout; [`ActivationLayout`] places every activation of
//!   a `(B, T)` batch in one arena.
//! * One module per layer kind, each with `*_forward` and `*_backward` side by side and the
//!   shapes in the doc comments: [`encoder`], [`layernorm`], [`matmul`], [`attention`],
//!   [`gelu`], [`residual`], [`classifier`]. Matrix products go through [`gemm`].
//! * [`Gpt2`] strings them together: `forward(tokens, targets) -> loss`, `backward()`.
//!   [`Gpt2Core`] is the same model without its parameters: it reads them, and writes their
//!   gradients, one [`ParamUnit`] at a time through a [`ParamSource`] ([`units`]), which is how
//!   ZeRO ranks hold them sharded or in 16 bits.
//!
//! * With activation checkpointing ([`Recompute::EachLayer`], [`recompute`]) forward keeps only
//!   each block's input and backward re-runs each block's forward before its backward.
//!
//! Dropout is not implemented (all GPT-2 dropouts are taken as 0, as in the fixtures).
//! Vocabulary in comments: `B` batch, `T` sequence, `C` channels, `NH` heads, `hs` head size,
//! `V` vocab, `L` layers, `N = B * T` rows.

mod activations;
pub mod attention;
pub mod classifier;
mod config;
pub mod embedding;
pub mod encoder;
mod error;
mod evaluate;
mod family;
pub mod gelu;
pub mod gemm;
mod gpt2;
mod init;
pub mod layernorm;
pub mod linear;
pub mod llama;
mod lm_arena;
pub mod masking;
pub mod matmul;
mod owned;
mod params;
pub mod recompute;
pub mod residual;
pub mod rmsnorm;
pub mod rope;
mod sum;
pub mod swiglu;
pub mod units;

pub use activations::{ActivationLayout, BatchShape, BlockActivations, planned_arena_len};
pub use classifier::LossDivisor;
pub use config::{ConfigError, Gpt2Config};
pub use error::ModelError;
pub use evaluate::evaluate_batch;
pub use family::{ModelConfig, ModelCore, ModelLayout};
pub use gpt2::{Gpt2, Gpt2Core, next_token_targets};
pub use init::init_params;
pub use masking::{RowPositions, TokenLayout, TrainingBatch};
pub use params::{BlockParams, ParamLayout};
pub use recompute::Recompute;
pub use units::{ParamSource, ParamTable, ParamUnit, UnitGrads, UnitParams, UnitSpans};
