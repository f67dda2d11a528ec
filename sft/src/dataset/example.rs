//! [`Example`]: one dataset record in one of TRL's three shapes, checked field by field:
//! language modelling `{"text"}` (the field is `dataset_text_field`), prompt-completion
//! `{"prompt", "completion"}` and conversational `{"messages": [{"role", "content"}, ...]}`.
//! Other fields are ignored, as TRL ignores them.

use serde_json::{Map, Value};

/// TRL's dataset shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `{"text": str}`: language modelling.
    Text,
    /// `{"prompt": str, "completion": str}`.
    PromptCompletion,
    /// `{"messages": [{"role": str, "content": str}, ...]}`.
    Messages,
}

/// The shape of a dataset: detected from its first valid record, or forced
/// (`--dataset-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShapeChoice {
    /// From the fields of the first record that is a JSON object.
    #[default]
    Detect,
    /// This shape; records without its fields are bad.
    Forced(Shape),
}

/// One valid record.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    /// A text to model.
    Text(String),
    /// A prompt and its completion.
    PromptCompletion {
        /// The prompt.
        prompt: String,
        /// The completion.
        completion: String,
    },
    /// A conversation: the `messages` array, checked, passed to the chat template as it is.
    Messages(Value),
}

/// The roles a conversation may hold.
pub const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

impl Shape {
    /// The shape whose fields `object` has: `messages` first, then `prompt` + `completion`,
    /// then the text field (TRL's order of checks).
    pub fn detect(object: &Map<String, Value>, text_field: &str) -> Option<Shape> {
        if object.contains_key("messages") {
            Some(Shape::Messages)
        } else if object.contains_key("prompt") && object.contains_key("completion") {
            Some(Shape::PromptCompletion)
        } else if object.contains_key(text_field) {
            Some(Shape::Text)
        } else {
            None
        }
    }

    /// The name `--dataset-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Text => "text",
            Shape::PromptCompletion => "prompt-completion",
            Shape::Messages => "messages",
        }
    }

    /// The shape named `name` (`text`, `prompt-completion`, `messages`).
    pub fn parse(name: &str) -> Option<Shape> {
        [Shape::Text, Shape::PromptCompletion, Shape::Messages]
            .into_iter()
            .find(|shape| shape.name() == name || shape.name().replace('-', "_") == name)
    }

    /// `value` as an example of this shape, or why it is not one.
    pub fn example(self, value: Value, text_field: &str) -> Result<Example, String> {
        let Value::Object(mut object) = value else {
            return Err(format!("is {}, not a JSON object", kind(&value)));
        };
        match self {
            Shape::Text => Ok(Example::Text(take_string(&mut object, text_field)?)),
            Shape::PromptCompletion => {
                let prompt = take_string(&mut object, "prompt")?;
                let completion = take_string(&mut object, "completion")?;
                Ok(Example::PromptCompletion { prompt, completion })
            }
            Shape::Messages => {
                let messages = object
                    .remove("messages")
                    .ok_or_else(|| missing("messages", &object))?;
                check_messages(&messages)?;
                Ok(Example::Messages(messages))
            }
        }
    }
}

/// Why a record shows no shape.
pub fn undetected(text_field: &str) -> String {
    format!(
        "has none of the fields that name a dataset shape (`{text_field}`; `prompt` and \
         `completion`; `messages`)"
    )
}

fn take_string(object: &mut Map<String, Value>, field: &str) -> Result<String, String> {
    match object.remove(field) {
        Some(Value::String(text)) => Ok(text),
        Some(other) => Err(format!("field `{field}` is {}, not a string", kind(&other))),
        None => Err(missing(field, object)),
    }
}

fn missing(field: &str, object: &Map<String, Value>) -> String {
    let present: Vec<&str> = object.keys().map(String::as_str).collect();
    format!(
        "has no field `{field}` (its fields: {})",
        if present.is_empty() {
            "none".to_string()
        } else {
            present.join(", ")
        }
    )
}

fn check_messages(messages: &Value) -> Result<(), String> {
    let Value::Array(turns) = messages else {
        return Err(format!(
            "field `messages` is {}, not an array of {{\"role\", \"content\"}} objects",
            kind(messages)
        ));
    };
    if turns.is_empty() {
        return Err("field `messages` is an empty conversation".to_string());
    }
    for (at, turn) in turns.iter().enumerate() {
        let Value::Object(turn) = turn else {
            return Err(format!("messages[{at}] is {}, not an object", kind(turn)));
        };
        let role = match turn.get("role") {
            Some(Value::String(role)) => role,
            Some(other) => {
                return Err(format!(
                    "messages[{at}].role is {}, not a string",
                    kind(other)
                ));
            }
            None => return Err(format!("messages[{at}] has no `role`")),
        };
        if !ROLES.contains(&role.as_str()) {
            return Err(format!(
                "messages[{at}].role is {role:?}, not one of {}",
                ROLES.join(", ")
            ));
        }
        match turn.get("content") {
            Some(Value::String(_)) => {}
            Some(Value::Null) | None if turn.contains_key("tool_calls") => {}
            Some(other) => {
                return Err(format!(
                    "messages[{at}].content is {}, not a string",
                    kind(other)
                ));
            }
            None => return Err(format!("messages[{at}] has no `content`")),
        }
    }
    Ok(())
}

/// A JSON value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
