//! Supervised fine-tuning data as TRL 1.16's `SFTTrainer` prepares it, for `dsplan run`.
//!
//! * [`tokenizer`]: a Hugging Face tokenizer read from a model directory (`tokenizers` crate),
//!   its special tokens and chat template;
//! * [`template`]: the chat template rendered with minijinja as transformers renders it,
//!   `{% generation %}` spans included;
//!
//! Still to come (issue 31): datasets (JSONL, JSON, Parquet), TRL's preparation rules,
//! best-fit-decreasing packing, collation, sample order and a cache of the prepared stream.

pub mod error;
pub mod hash;
pub mod template;
pub mod tokenizer;

pub use error::{Location, Record, SftError};
pub use hash::Fingerprint;
pub use template::{ChatTemplate, RenderRequest, Rendered};
pub use tokenizer::{AddSpecial, ChatEncoded, Encoded, HfTokenizer, SpecialToken, SpecialTokens};
