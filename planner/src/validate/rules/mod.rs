//! Semantic rules: what DeepSpeed (and the Hugging Face Trainer) check beyond the types, and
//! the silent fallbacks dsplan reports as problems. Each file holds one family of rules.

pub mod keys;
pub mod optimizer;
pub mod precision;
pub mod ranges;
pub mod zero;
