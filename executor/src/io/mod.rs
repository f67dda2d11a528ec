//! Reading and writing models in Hugging Face's formats, and probing where a run will write.
//!
//! * [`hf_config`]: a GPT-2 `config.json` to a [`crate::model::Gpt2Config`], refusing variants
//!   this implementation does not compute (untied head, other activations, ...).
//! * [`llama_config`]: a Llama / Qwen2 / Mistral `config.json` to a
//!   [`crate::model::llama::LlamaConfig`] and back.
//! * [`safetensors`]: `model.safetensors` to and from the flat parameter buffer, by tensor name.
//! * [`hf_weights`]: any family's weights from and to a directory, single file or sharded.
//! * [`probe_writable`]: whether a directory takes new entries, before a run relies on it.
//! * [`output`]: writing a command's output files (atomically over regular files, through
//!   FIFOs and character devices, never over anything else).
//! * [`process_alive`]: whether the process that left a file behind still runs.

mod config_keys;
mod error;
pub mod hf_config;
pub mod hf_weights;
pub mod llama_config;
pub mod llama_pretrained;
pub mod output;
mod probe;
mod process;
pub mod safetensors;

pub use error::LoadError;
pub use output::{OutputKind, OutputTarget, open_stream, replace_entry, write_output};
pub use probe::{available_bytes, probe_writable};
pub use process::process_alive;
