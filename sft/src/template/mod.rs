//! [`ChatTemplate`]: a tokenizer's Jinja chat template rendered with minijinja the way
//! transformers renders it (`apply_chat_template`): an immutable sandbox with
//! `trim_blocks=True, lstrip_blocks=True`, the final newline of the template dropped, loop
//! controls, Python's string and dict methods (`minijinja_contrib::pycompat`), the globals
//! `raise_exception(message)` and `strftime_now(format)`, transformers' `tojson`, and the
//! variables `messages`, `add_generation_prompt`, `tools`, `documents` plus the named special
//! tokens (`bos_token`, `eos_token`, ...). `{% generation %}` blocks mark the assistant's text
//! ([`generation`]).

mod clock;
pub mod generation;
mod tojson;

use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};

use crate::tokenizer::SpecialTokens;

/// The template's name inside its environment.
const NAME: &str = "chat_template";

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    has_generation: bool,
}

/// A rendered conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The text.
    pub text: String,
    /// Byte spans of the `{% generation %}` blocks in `text`, in order.
    pub generation: Vec<Range<usize>>,
}

/// What to render.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// The conversation (a JSON array of `{"role", "content", ...}` objects, passed as is).
    pub messages: &'a serde_json::Value,
    /// `add_generation_prompt`.
    pub add_generation_prompt: bool,
    /// The tokenizer's named special tokens.
    pub special: &'a SpecialTokens,
}

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(source: &str) -> Result<Self, String> {
        let (rewritten, has_generation) = generation::rewrite(source);
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson::tojson);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            clock::strftime_now(&format)
        });
        env.add_template_owned(NAME, rewritten)
            .map_err(|e| describe(&e))?;
        Ok(Self {
            env,
            source: source.to_string(),
            has_generation,
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template marks the assistant's text with `{% generation %}` (what
    /// `assistant_only_loss` needs).
    pub fn has_generation_blocks(&self) -> bool {
        self.has_generation
    }

    /// Renders a conversation.
    pub fn render(&self, request: RenderRequest<'_>) -> Result<Rendered, String> {
        let template = self.env.get_template(NAME).map_err(|e| describe(&e))?;
        let mut context: std::collections::BTreeMap<&str, Value> =
            std::collections::BTreeMap::from([
                (
                    "messages",
                    Value::from(minijinja::value::Serde(request.messages)),
                ),
                (
                    "add_generation_prompt",
                    Value::from(request.add_generation_prompt),
                ),
                ("tools", Value::from(())),
                ("documents", Value::from(())),
            ]);
        for (name, text) in request.special.template_variables() {
            context.insert(name, Value::from(text));
        }
        let rendered = template
            .render(Value::from(context))
            .map_err(|e| describe(&e))?;
        if !self.has_generation {
            return Ok(Rendered {
                text: rendered,
                generation: Vec::new(),
            });
        }
        if holds_marker(request.messages) {
            return Err(
                "the conversation holds U+E000 or U+E001, which mark {% generation %} \
                        blocks while rendering"
                    .to_string(),
            );
        }
        let (text, generation) = generation::extract(&rendered)?;
        Ok(Rendered { text, generation })
    }
}

/// Whether a key or string anywhere in `value` holds a generation marker (what the JSON text
/// of `value` would show: serde_json writes these characters unescaped), found without
/// writing that text.
fn holds_marker(value: &serde_json::Value) -> bool {
    let marked = |text: &str| text.contains([generation::OPEN, generation::CLOSE]);
    match value {
        serde_json::Value::String(text) => marked(text),
        serde_json::Value::Array(items) => items.iter().any(holds_marker),
        serde_json::Value::Object(object) => object
            .iter()
            .any(|(key, item)| marked(key) || holds_marker(item)),
        _ => false,
    }
}

/// A template error with its line and the template's own message (what `raise_exception`
/// said, for instance).
fn describe(error: &Error) -> String {
    let mut text = match error.kind() {
        ErrorKind::InvalidOperation => match error.detail() {
            Some(detail) => format!("the chat template failed: {detail}"),
            None => format!("the chat template failed: {error}"),
        },
        _ => format!("the chat template failed: {error}"),
    };
    if let Some(line) = error.line() {
        text.push_str(&format!(" (template line {line})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk finds a marker wherever the JSON text of the conversation would show one, and
    /// nowhere else.
    #[test]
    fn markers_are_found_in_keys_and_strings_as_in_the_json_text() {
        let cases = [
            serde_json::json!([{"role": "user", "content": "plain"}]),
            serde_json::json!([{"role": "user", "content": "a\u{E000}b"}]),
            serde_json::json!([{"role": "user", "content": "x", "meta": {"k\u{E001}": 1}}]),
            serde_json::json!([{"role": "user", "content": ["deep", ["\u{E001}"]]}]),
            serde_json::json!([{"role": "user", "content": null, "n": 57344}]),
        ];
        let mut found = 0;
        for value in &cases {
            let by_text = value
                .to_string()
                .contains([generation::OPEN, generation::CLOSE]);
            assert_eq!(holds_marker(value), by_text, "{value}");
            found += usize::from(by_text);
        }
        assert_eq!(found, 3);
    }
}
