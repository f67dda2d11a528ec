//! Which tokenizers the fast encoder takes: the shapes it reproduces exactly, read from the
//! crate's own loaded pipeline (its serialized form, with every default filled in). Anything
//! else is refused with the reason, and the tokenizer keeps the crate's path.
//!
//! Supported: no normalizer, truncation or padding; a BPE model without dropout, subword
//! prefix or word suffix; plain added tokens ([`AddedSplitter`]); a post-processor of
//! [`Template`]; and as pre-tokenizer
//! * `ByteLevel` with `use_regex` (GPT-2's pattern), either `add_prefix_space`;
//! * `Sequence [Split(pattern, Isolated, not inverted), ByteLevel(no prefix space, no regex)]`
//!   with a pattern of [`Pattern::from_source`];
//! * `Metaspace` (any `prepend_scheme`; without `split` only when no vocabulary token holds a
//!   character followed by the replacement, and the model does not `ignore_merges`, see
//!   [`super::words`]).

use serde_json::Value;
use tokenizers::{ModelWrapper, Tokenizer};

use super::added::AddedSplitter;
use super::bytes::ByteChars;
use super::pattern::{Pattern, Splitter};
use super::post::Template;
use super::words::{MetaCut, Prepend, Words};

/// The parts of a supported tokenizer.
pub struct Shape {
    /// The added tokens.
    pub added: AddedSplitter,
    /// The pre-tokenizer.
    pub words: Words,
    /// The post-processor.
    pub post: Template,
}

/// The shape of `tokenizer`, or why it is not supported.
pub fn read(tokenizer: &Tokenizer) -> Result<Shape, String> {
    if tokenizer.get_normalizer().is_some() {
        return Err("it has a normalizer".into());
    }
    if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
        return Err("it truncates or pads".into());
    }
    if tokenizer.get_encode_special_tokens() {
        return Err("it splits special tokens (encode_special_tokens)".into());
    }
    let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return Err("its model is not BPE".into());
    };
    if bpe.dropout.is_some_and(|d| d > 0.0)
        || bpe.continuing_subword_prefix.is_some()
        || bpe.end_of_word_suffix.is_some()
    {
        return Err(
            "its BPE has dropout, a continuing_subword_prefix or an end_of_word_suffix".into(),
        );
    }
    let json = |value: Result<Value, serde_json::Error>| value.map_err(|e| e.to_string());
    let pre = json(serde_json::to_value(tokenizer.get_pre_tokenizer()))?;
    let post = json(serde_json::to_value(tokenizer.get_post_processor()))?;
    let words = pre_tokenizer(&pre, || {
        if bpe.ignore_merges {
            return Err("Metaspace without split, with ignore_merges".to_string());
        }
        Ok(bpe.get_vocab())
    })?;
    Ok(Shape {
        added: AddedSplitter::new(tokenizer.get_added_tokens_decoder())?,
        words,
        post: Template::from_value(&post)?,
    })
}

fn field<'a>(value: &'a Value, name: &str) -> &'a Value {
    value.get(name).unwrap_or(&Value::Null)
}

/// The [`Words`] of the pre-tokenizer `value`; `vocab` gives the vocabulary when it is needed.
fn pre_tokenizer(
    value: &Value,
    vocab: impl FnOnce() -> Result<std::collections::HashMap<String, u32>, String>,
) -> Result<Words, String> {
    let unsupported = || format!("pre-tokenizer {value} is not supported");
    let byte_words = |pattern: Pattern, prefix_space: bool| -> Result<Words, String> {
        Ok(Words::ByteLevel {
            splitter: Box::new(Splitter::new(pattern)?),
            bytes: Box::new(ByteChars::new()),
            prefix_space,
        })
    };
    match field(value, "type").as_str() {
        Some("ByteLevel") if field(value, "use_regex") == true => {
            byte_words(Pattern::Gpt2, field(value, "add_prefix_space") == true)
        }
        Some("Sequence") => {
            let steps = field(value, "pretokenizers")
                .as_array()
                .ok_or_else(unsupported)?;
            let [split, bytes] = steps.as_slice() else {
                return Err(unsupported());
            };
            let pattern = field(field(split, "pattern"), "Regex")
                .as_str()
                .and_then(Pattern::from_source);
            let plain_split = field(split, "type") == "Split"
                && field(split, "behavior") == "Isolated"
                && field(split, "invert") == false;
            let plain_bytes = field(bytes, "type") == "ByteLevel"
                && field(bytes, "add_prefix_space") == false
                && field(bytes, "use_regex") == false;
            match pattern {
                Some(pattern) if plain_split && plain_bytes => byte_words(pattern, false),
                _ => Err(unsupported()),
            }
        }
        Some("Metaspace") => {
            let replacement = field(value, "replacement")
                .as_str()
                .and_then(|s| {
                    let mut chars = s.chars();
                    chars.next().filter(|_| chars.next().is_none())
                })
                .ok_or_else(unsupported)?;
            let prepend = match field(value, "prepend_scheme").as_str() {
                Some("always") => Prepend::Always,
                Some("first") => Prepend::First,
                Some("never") => Prepend::Never,
                _ => return Err(unsupported()),
            };
            let cut = if field(value, "split") == true {
                MetaCut::EveryReplacement
            } else {
                check_cuttable(&vocab()?, replacement)?;
                MetaCut::AfterOtherChar
            };
            Ok(Words::Metaspace {
                replacement,
                prepend,
                cut,
            })
        }
        _ => Err(unsupported()),
    }
}

/// Metaspace without `split` is cut before a replacement that follows another character:
/// refused when a vocabulary token holds such a pair, or when the replacement is no token.
fn check_cuttable(
    vocab: &std::collections::HashMap<String, u32>,
    replacement: char,
) -> Result<(), String> {
    if !vocab.contains_key(replacement.encode_utf8(&mut [0; 4]) as &str) {
        return Err(format!(
            "Metaspace's {replacement:?} is not in the vocabulary"
        ));
    }
    let crossing = vocab.keys().find(|token| {
        let mut previous = None;
        token.chars().any(|c| {
            let crosses = c == replacement && previous.is_some_and(|p| p != replacement);
            previous = Some(c);
            crosses
        })
    });
    match crossing {
        Some(token) => Err(format!(
            "Metaspace without split, and token {token:?} joins a character to a following {replacement:?}"
        )),
        None => Ok(()),
    }
}
