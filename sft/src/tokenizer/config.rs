//! What a model directory says about its tokenizer besides `tokenizer.json`: the special
//! tokens and the chat template, read as transformers 5 reads them.
//!
//! * `tokenizer_config.json`: `bos_token`, `eos_token`, `pad_token`, `unk_token` (strings, or
//!   `AddedToken` objects in older files), and possibly `chat_template` (a string, or a list of
//!   `{"name", "template"}` whose `"default"` entry is used);
//! * `chat_template.jinja`: the template as `save_pretrained` writes it since transformers
//!   4.50; it wins over the config's entry, as in transformers;
//! * `special_tokens_map.json` (older saves): fills the names the config leaves out.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::special::token_text;
use crate::error::SftError;

/// The file names a tokenizer directory may hold, in the order they are read and copied.
pub const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];

/// The tokenizer side of a model directory.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// The texts of the named special tokens, by name (`"bos_token"` ...).
    pub special_texts: Vec<(&'static str, Option<String>)>,
    /// The chat template's source and the file it came from.
    pub chat_template: Option<(String, PathBuf)>,
    /// The files found (from [`TOKENIZER_FILES`]).
    pub files: Vec<PathBuf>,
}

/// The special-token names transformers passes to chat templates.
pub const SPECIAL_NAMES: [&str; 4] = ["bos_token", "eos_token", "pad_token", "unk_token"];

impl TokenizerConfig {
    /// Reads the configuration files of `dir` (each may be absent).
    pub fn read(dir: &Path) -> Result<Self, SftError> {
        let files: Vec<PathBuf> = TOKENIZER_FILES
            .iter()
            .map(|name| dir.join(name))
            .filter(|path| path.is_file())
            .collect();
        let config = read_object(&dir.join("tokenizer_config.json"))?;
        let map = read_object(&dir.join("special_tokens_map.json"))?;
        let special_texts = SPECIAL_NAMES
            .iter()
            .map(|&name| {
                let from = |object: &Option<Map<String, Value>>| {
                    object
                        .as_ref()
                        .and_then(|o| o.get(name))
                        .and_then(token_text)
                };
                (name, from(&config).or_else(|| from(&map)))
            })
            .collect();
        let jinja = dir.join("chat_template.jinja");
        let chat_template = if jinja.is_file() {
            Some((read_text(&jinja)?, jinja))
        } else {
            let path = dir.join("tokenizer_config.json");
            config
                .as_ref()
                .and_then(|c| c.get("chat_template"))
                .map(|value| template_entry(value, &path))
                .transpose()?
                .map(|source| (source, path))
        };
        Ok(Self {
            special_texts,
            chat_template,
            files,
        })
    }
}

/// The template of a `chat_template` entry: a string, or the `"default"` of a named list.
fn template_entry(value: &Value, path: &Path) -> Result<String, SftError> {
    match value {
        Value::String(source) => Ok(source.clone()),
        Value::Array(entries) => entries
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                SftError::in_file(
                    path.display().to_string(),
                    "`chat_template` is a list of named templates without a \"default\" one",
                )
            }),
        other => Err(SftError::in_file(
            path.display().to_string(),
            format!("`chat_template` must be a string or a list of templates, found {other}"),
        )),
    }
}

fn read_text(path: &Path) -> Result<String, SftError> {
    std::fs::read_to_string(path)
        .map_err(|error| SftError::in_file(path.display().to_string(), error.to_string()))
}

/// The JSON object in `path`, or `None` when there is no such file.
fn read_object(path: &Path) -> Result<Option<Map<String, Value>>, SftError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = read_text(path)?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(object)) => Ok(Some(object)),
        Ok(_) => Err(SftError::in_file(
            path.display().to_string(),
            "is not a JSON object",
        )),
        Err(error) => Err(SftError::in_file(
            path.display().to_string(),
            format!("is not JSON: {error}"),
        )),
    }
}
