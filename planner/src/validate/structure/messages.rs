//! The diagnostics the structural walk emits, worded once: unknown keys with a did-you-mean,
//! wrong types with coercion hints, and `"auto"` where it is or is not filled.

use serde_json::Value;

use super::types::kind_name;
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;
use crate::validate::suggest::{self, NEAR_MISS, WORTH_SUGGESTING};

pub(crate) fn unknown_key(key: &str, pointer: &str, known: &[&str]) -> Diagnostic {
    let section = json_pointer::parent(pointer);
    let nearest = suggest::nearest(key, known.iter().copied(), WORTH_SUGGESTING);
    let at_top_level = section.is_empty();
    if at_top_level && !nearest.is_some_and(|best| suggest::similarity(key, best) >= NEAR_MISS) {
        return Diagnostic::warning(
            Code::UnusedTopLevelKey,
            pointer,
            format!("`{key}` is not a DeepSpeed key; DeepSpeed ignores it"),
        )
        .with_help("fine if your own code reads it; otherwise check its spelling");
    }
    let message = if at_top_level {
        format!("unknown top-level key `{key}`")
    } else {
        format!("unknown key `{key}` in {}", section_name(section))
    };
    let diagnostic = Diagnostic::error(Code::UnknownKey, pointer, message);
    match nearest {
        Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
        None if !known.is_empty() && known.len() <= 12 => {
            diagnostic.with_help(format!("valid keys here: {}", known.join(", ")))
        }
        None => diagnostic,
    }
}

pub(crate) fn wrong_type(value: &Value, expected: &str, pointer: &str) -> Diagnostic {
    let name = display_name(pointer);
    if let (Some(number), true) = (value.as_f64(), expected.contains("integer"))
        && number.fract() != 0.0
        && number.is_finite()
    {
        return Diagnostic::error(
            Code::NonIntegral,
            pointer,
            format!("`{name}` must be an integer; {value} has a fractional part"),
        )
        .with_help(format!("use a whole number such as {}", number.round()));
    }
    let diagnostic = Diagnostic::error(
        Code::WrongType,
        pointer,
        format!(
            "`{name}` must be {expected}; found {} {value}",
            kind_name(value)
        ),
    );
    match value {
        Value::String(text) if text.trim().parse::<f64>().is_ok() && !expected.contains("string") => {
            diagnostic.with_help(format!(
                "write {} without quotes: DeepSpeed's pydantic sections happen to coerce a quoted number, its plain keys (batch sizes, gradient_clipping) do not",
                text.trim()
            ))
        }
        Value::String(text) if matches!(text.as_str(), "true" | "false") => diagnostic
            .with_help(format!("write {text} without quotes")),
        _ => diagnostic,
    }
}

pub(crate) fn auto_not_allowed(pointer: &str) -> Diagnostic {
    if pointer == "/bfloat16/enabled" {
        return Diagnostic::error(
            Code::AutoNotAllowed,
            pointer,
            "`bfloat16.enabled` cannot be \"auto\": the Hugging Face Trainer fills only `bf16.enabled`, so DeepSpeed drops this \"auto\" and trains without bf16",
        )
        .with_help("rename the section `bfloat16` to `bf16`");
    }
    Diagnostic::error(
        Code::AutoNotAllowed,
        pointer,
        format!("`{}` cannot be \"auto\": neither the Hugging Face Trainer nor dsplan fills it", display_name(pointer)),
    )
    .with_help(
        "give a value; DeepSpeed itself silently uses the default for \"auto\" inside its pydantic sections and crashes on it elsewhere",
    )
}

pub(crate) fn needs_resolution(pointer: &str) -> Diagnostic {
    Diagnostic::info(
        Code::NeedsResolution,
        pointer,
        format!(
            "`{}` is \"auto\": filled by the Hugging Face Trainer or `dsplan resolve`",
            display_name(pointer)
        ),
    )
    .with_help(
        "run `dsplan resolve` with your training arguments to see the value DeepSpeed will get",
    )
}

/// `zero_optimization.offload_param.device` for `/zero_optimization/offload_param/device`.
pub(crate) fn display_name(pointer: &str) -> String {
    let tokens = json_pointer::tokens(pointer);
    if tokens.is_empty() {
        "the config".to_string()
    } else {
        tokens.join(".")
    }
}

/// "the top level" or "`zero_optimization`".
pub(crate) fn section_name(pointer: &str) -> String {
    if pointer.is_empty() {
        "the top level".to_string()
    } else {
        format!("`{}`", display_name(pointer))
    }
}
