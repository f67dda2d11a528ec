//! Reading and writing models in Hugging Face's formats, and probing where a run will write.
//!
//! * [`hf_config`]: a GPT-2 `config.json` to a [`crate::model::Gpt2Config`], refusing variants
//!   this implementation does not compute (untied head, other activations, ...).
//! * [`safetensors`]: `model.safetensors` to and from the flat parameter buffer, by tensor name.
//! * [`probe_writable`]: whether a directory takes new entries, before a run relies on it.
//! * [`output`]: writing a command's output files (atomically over regular files, through
//!   FIFOs and character devices, never over anything else).
//! * [`process_alive`]: whether the process that left a file behind still runs.

mod error;
pub mod hf_config;
pub mod output;
mod probe;
mod process;
pub mod safetensors;

pub use error::LoadError;
pub use output::{OutputKind, OutputTarget, open_stream, write_output};
pub use probe::probe_writable;
pub use process::process_alive;
