//! [`SpecialTokens`]: the named special tokens of a tokenizer (`bos_token`, `eos_token`,
//! `pad_token`, `unk_token`) as `tokenizer_config.json` names them, with their ids.

use serde_json::Value;

/// One named special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token's text (`"</s>"`), as the chat template sees it.
    pub text: String,
    /// Its id in the vocabulary.
    pub id: u32,
}

/// The named special tokens; a name the config leaves out (or sets to `null`) is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos: Option<SpecialToken>,
    /// `eos_token`.
    pub eos: Option<SpecialToken>,
    /// `pad_token`.
    pub pad: Option<SpecialToken>,
    /// `unk_token`.
    pub unk: Option<SpecialToken>,
}

impl SpecialTokens {
    /// The template variables transformers passes for them (`bos_token`, ...), the missing ones
    /// left out as transformers leaves them out.
    pub fn template_variables(&self) -> Vec<(&'static str, String)> {
        [
            ("bos_token", &self.bos),
            ("eos_token", &self.eos),
            ("pad_token", &self.pad),
            ("unk_token", &self.unk),
        ]
        .into_iter()
        .filter_map(|(name, token)| token.as_ref().map(|t| (name, t.text.clone())))
        .collect()
    }
}

/// The text of a special-token entry of `tokenizer_config.json`: a plain string (transformers
/// 5) or an `AddedToken` object with a `content` (older files); `null` is none.
pub fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(object) => object
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}
