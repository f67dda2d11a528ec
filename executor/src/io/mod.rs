//! Reading and writing models in Hugging Face's formats.
//!
//! * [`hf_config`]: a GPT-2 `config.json` to a [`crate::model::Gpt2Config`], refusing variants
//!   this implementation does not compute (untied head, other activations, ...).
//! * [`safetensors`]: `model.safetensors` to and from the flat parameter buffer, by tensor name.

mod error;
pub mod hf_config;
pub mod safetensors;

pub use error::LoadError;
