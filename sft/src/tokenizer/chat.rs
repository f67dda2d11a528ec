//! [`HfTokenizer::apply_chat_template`]: transformers' `apply_chat_template(messages,
//! tokenize=True, return_dict=True, return_assistant_tokens_mask=...)`: the conversation
//! rendered by the template, the text tokenized without special tokens (the template writes
//! its own BOS), and the assistant mask from the `{% generation %}` spans: for each span
//! `[start, end)` the tokens `char_to_token(start) ..= char_to_token(end - 1)` (to the end of
//! the text when the last one has no token, or is token 0, as transformers' `if end_token`
//! reads it); a span whose first character has no token ends the marking, as there.

use super::{AddSpecial, HfTokenizer};
use crate::template::RenderRequest;

/// A tokenized conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatEncoded {
    /// The rendered text.
    pub text: String,
    /// Its token ids.
    pub ids: Vec<u32>,
    /// Per token, whether the assistant wrote it (inside a `{% generation %}` block).
    pub assistant_mask: Vec<bool>,
}

impl HfTokenizer {
    /// Renders and tokenizes `messages` (see the [module docs](self)); `Err` says why the
    /// template could not render them (a template error, `raise_exception`, no template).
    pub fn apply_chat_template(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<ChatEncoded, String> {
        let template = self.chat_template().ok_or_else(|| {
            "the tokenizer has no chat template (no chat_template.jinja, no `chat_template` in \
             tokenizer_config.json), so conversational rows cannot be rendered"
                .to_string()
        })?;
        let rendered = template.render(RenderRequest {
            messages,
            add_generation_prompt,
            special: self.special(),
        })?;
        if rendered.generation.is_empty() {
            let ids = self.encode(&rendered.text, AddSpecial::No)?;
            return Ok(ChatEncoded {
                assistant_mask: vec![false; ids.len()],
                ids,
                text: rendered.text,
            });
        }
        let encoded = self.encode_with_offsets(&rendered.text, AddSpecial::No)?;
        let mut mask = vec![false; encoded.ids.len()];
        for span in &rendered.generation {
            let last_char = rendered.text[..span.end]
                .char_indices()
                .next_back()
                .map_or(span.start, |(at, _)| at);
            let Some(first) = encoded.token_at(span.start).filter(|_| !span.is_empty()) else {
                break;
            };
            let end = match encoded.token_at(last_char) {
                Some(last) if last > 0 => last + 1,
                _ => mask.len(),
            };
            for marked in mask.iter_mut().take(end).skip(first) {
                *marked = true;
            }
        }
        Ok(ChatEncoded {
            text: rendered.text,
            ids: encoded.ids,
            assistant_mask: mask,
        })
    }
}
