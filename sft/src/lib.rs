//! Supervised fine-tuning data as TRL 1.16's `SFTTrainer` prepares it, for `dsplan run`.
//!
//! * [`tokenizer`]: a Hugging Face tokenizer read from a model directory (`tokenizers` crate),
//!   its special tokens and chat template;
//! * [`template`]: the chat template rendered with minijinja as transformers renders it,
//!   `{% generation %}` spans included;
//! * [`dataset`]: JSONL, JSON and Parquet files (or a directory of shards) read a chunk at a
//!   time in TRL's three shapes, bad rows reported with file and line or skipped with a count;
//! * [`prepare`]: each row tokenized, labelled and truncated as TRL does;
//! * [`pack`]: best-fit-decreasing packing;
//! * [`collate`]: micro-batches as TRL's collator makes them (right padding, or padding-free
//!   with position ids restarting per document);
//! * [`order`]: which rows each optimizer step, rank and micro-step reads;
//! * [`cache`]: the prepared token stream kept next to the data;
//! * [`data`]: [`SftData::open`], all of it for a run: per step and rank, the micro-batches.

pub mod cache;
pub mod collate;
pub mod data;
pub mod dataset;
pub mod error;
pub mod hash;
pub mod order;
pub mod pack;
pub mod prepare;
pub mod template;
pub mod tokenizer;

pub use cache::{CacheDir, CacheUse, cache_key, cache_path, open_prepared, open_split};
pub use collate::{Collation, MicroBatch, collate};
pub use data::{EvalData, SftData, SftSettings};
pub use dataset::{DatasetOptions, DatasetReader, Example, OnBadRow, Shape, ShapeChoice};
pub use error::{Location, Record, SftError};
pub use hash::Fingerprint;
pub use order::{BatchLayout, SampleOrder, Sampling, StepRows, eval_batches};
pub use prepare::{
    AssistantLoss, CompletionLoss, HeldOut, IGNORE, Labels, OverLength, Packing, PrepareSettings,
    PreparedRow, PreparedSet, prepare_dataset, prepare_split,
};
pub use template::{ChatTemplate, RenderRequest, Rendered};
pub use tokenizer::{
    AddSpecial, ChatEncoded, EncodePath, Encoded, HfTokenizer, SpecialToken, SpecialTokens,
    Unsupported,
};
