//! One example to token ids and labels, by TRL 1.16's rules (README points 1-4): EOS appended
//! to texts and completions that lack it, BOS from the tokenizer's post-processor, the
//! completion found by the longest common prefix of the prompt's and the whole row's ids, the
//! chat template with its assistant mask, then truncation (keep_start) and the drop of rows
//! that have no label left (non-packed runs only).

use smallvec::{SmallVec, smallvec};

use super::labels::Labels;
use super::settings::{AssistantLoss, OverLength, Packing, PrepareSettings};
use crate::dataset::{Example, Sourced};
use crate::error::SftError;
use crate::tokenizer::{AddSpecial, HfTokenizer};

/// The label of a token that is not trained on.
pub const IGNORE: i64 = -100;

/// A prepared row: what the collator receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRow {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Which tokens are their own label (the others' is [`IGNORE`]); not shifted.
    pub labels: Labels,
    /// The dataset rows it holds (one; several for a packed bin, in bin order).
    pub source_rows: SmallVec<[u64; 1]>,
    /// The length of each document in it (one entry unless packed).
    pub seq_lengths: SmallVec<[u32; 1]>,
}

impl PreparedRow {
    fn single(row: u64, input_ids: Vec<u32>, labels: Labels) -> Self {
        let length = input_ids.len() as u32;
        Self {
            input_ids,
            labels,
            source_rows: smallvec![row],
            seq_lengths: smallvec![length],
        }
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// One label per token: the id, or [`IGNORE`].
    pub fn label_values(&self) -> Vec<i64> {
        self.labels.values(&self.input_ids).collect()
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

/// What became of one example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A row to train on.
    Kept(PreparedRow),
    /// Dropped: no token keeps a label after truncation (TRL drops these rows).
    AllMasked,
    /// The example cannot be prepared (a template error, a row over `max_length` that may
    /// not be truncated): a bad row.
    Bad(SftError),
}

/// Prepares `example` with `tokenizer`.
pub fn prepare_example(
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    sourced: &Sourced,
) -> Outcome {
    let fail = |message: String| Outcome::Bad(SftError::new(sourced.location.clone(), message));
    let labelled = match &sourced.example {
        Example::Text(text) => with_eos(tokenizer, text).and_then(|text| {
            let ids = tokenizer.encode(&text, AddSpecial::Yes)?;
            Ok((ids, Labels::Every))
        }),
        Example::PromptCompletion { prompt, completion } => {
            prompt_completion(tokenizer, settings, prompt, completion)
        }
        Example::Messages(messages) => conversation(tokenizer, settings, messages),
    };
    let (mut ids, mut labels) = match labelled {
        Ok(pair) => pair,
        Err(message) => return fail(message),
    };
    if settings.packing == Packing::Bfd {
        return Outcome::Kept(PreparedRow::single(sourced.row, ids, labels));
    }
    if let Some(max) = settings.max_length.filter(|&max| ids.len() > max) {
        if settings.over_length == OverLength::Refuse {
            return fail(format!(
                "is {} tokens long, more than max_length {max}, and truncation is off",
                ids.len()
            ));
        }
        ids.truncate(max);
        labels.truncate(max);
    }
    if labels.none_trained(ids.len()) {
        return Outcome::AllMasked;
    }
    Outcome::Kept(PreparedRow::single(sourced.row, ids, labels))
}

/// `text`, with the EOS string appended unless it already ends with it.
fn with_eos(tokenizer: &HfTokenizer, text: &str) -> Result<String, String> {
    let eos = tokenizer.special().eos.as_ref().ok_or_else(|| {
        "the tokenizer has no eos_token, which TRL appends to every text and completion".to_string()
    })?;
    let mut with = String::with_capacity(text.len() + eos.text.len());
    with.push_str(text);
    if !text.ends_with(&eos.text) {
        with.push_str(&eos.text);
    }
    Ok(with)
}

fn prompt_completion(
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    prompt: &str,
    completion: &str,
) -> Result<(Vec<u32>, Labels), String> {
    let completion = with_eos(tokenizer, completion)?;
    let prompt_ids = tokenizer.encode(prompt, AddSpecial::Yes)?;
    let ids = tokenizer.encode(&format!("{prompt}{completion}"), AddSpecial::Yes)?;
    let start = prompt_ids
        .iter()
        .zip(&ids)
        .take_while(|(a, b)| a == b)
        .count();
    let labels = if settings.masks_prompt() {
        Labels::from_mask((0..ids.len()).map(|at| at >= start).collect())
    } else {
        Labels::Every
    };
    Ok((ids, labels))
}

fn conversation(
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    messages: &serde_json::Value,
) -> Result<(Vec<u32>, Labels), String> {
    let chat = tokenizer.apply_chat_template(messages, false)?;
    let labels = match settings.assistant_loss {
        AssistantLoss::WholeConversation => Labels::Every,
        AssistantLoss::AssistantOnly => Labels::from_mask(chat.assistant_mask),
    };
    Ok((chat.ids, labels))
}
