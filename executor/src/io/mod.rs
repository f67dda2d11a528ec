//! Reading and writing models in Hugging Face's formats, and probing where a run will write.
//!
//! * [`hf_config`]: a GPT-2 `config.json` to a [`crate::model::Gpt2Config`], refusing variants
//!   this implementation does not compute (untied head, other activations, ...).
//! * [`safetensors`]: `model.safetensors` to and from the flat parameter buffer, by tensor name.
//! * [`probe_writable`]: whether a directory takes new entries, before a run relies on it.

mod error;
pub mod hf_config;
mod probe;
pub mod safetensors;

pub use error::LoadError;
pub use probe::probe_writable;
