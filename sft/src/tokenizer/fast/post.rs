//! What the post-processor adds to a single sequence when special tokens are asked for, read
//! from its serialized form: nothing for `ByteLevel` (it only trims offsets) or no
//! post-processor, the special tokens around `$A` for `TemplateProcessing`, either of them in
//! a `Sequence`. Anything else is not supported.

use serde_json::Value;

/// The ids before and after the sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Template {
    /// Ids before the text's.
    pub prefix: Vec<u32>,
    /// Ids after them.
    pub suffix: Vec<u32>,
}

impl Template {
    /// The template of the post-processor `value` (`null` for none).
    pub fn from_value(value: &Value) -> Result<Self, String> {
        let kind = value.get("type").and_then(Value::as_str);
        match kind {
            None if value.is_null() => Ok(Self::default()),
            Some("ByteLevel") => Ok(Self::default()),
            Some("TemplateProcessing") => single(value),
            Some("Sequence") => {
                let mut found = Self::default();
                let processors = value.get("processors").and_then(Value::as_array);
                for processor in processors.into_iter().flatten() {
                    let template = Self::from_value(processor)?;
                    if template != Self::default() {
                        if found != Self::default() {
                            return Err("two templates in a post-processor sequence".into());
                        }
                        found = template;
                    }
                }
                Ok(found)
            }
            _ => Err(format!("post-processor {value} is not supported")),
        }
    }
}

/// `TemplateProcessing`'s `single`: special tokens, one `$A`, special tokens.
fn single(value: &Value) -> Result<Template, String> {
    let pieces = value
        .get("single")
        .and_then(Value::as_array)
        .ok_or("TemplateProcessing without a `single` list")?;
    let mut template = Template::default();
    let mut seen_sequence = false;
    for piece in pieces {
        if let Some(sequence) = piece.get("Sequence") {
            if seen_sequence || sequence.get("id").and_then(Value::as_str) != Some("A") {
                return Err(format!("template piece {piece} is not the one `$A`"));
            }
            seen_sequence = true;
            continue;
        }
        let name = piece
            .get("SpecialToken")
            .and_then(|token| token.get("id"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("template piece {piece} is not supported"))?;
        let ids = value
            .get("special_tokens")
            .and_then(|tokens| tokens.get(name))
            .and_then(|token| token.get("ids"))
            .and_then(Value::as_array)
            .ok_or_else(|| format!("template token {name:?} has no ids"))?;
        let side = if seen_sequence {
            &mut template.suffix
        } else {
            &mut template.prefix
        };
        for id in ids {
            let id = id
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| format!("template token {name:?} has the id {id}"))?;
            side.push(id);
        }
    }
    if seen_sequence {
        Ok(template)
    } else {
        Err("TemplateProcessing's `single` has no `$A`".into())
    }
}
