//! The `tojson` filter as transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`,
//! so Python's separators (`", "` and `": "`, or `","` and `": "` with an indent), no HTML
//! escaping (Jinja's own `tojson` escapes `<`, `>`, `&` and `'`), non-ASCII kept.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The filter: `value | tojson(indent=None, separators=None, sort_keys=False)`.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = Style {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct Style {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl Style {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(width) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    }

    fn write(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(value)),
            ValueKind::String => {
                let text = value.as_str().unwrap_or_default();
                out.push_str(&serde_json::to_string(text).unwrap_or_default());
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(('[', ']'), items.len(), depth, out, |i, out| {
                    self.write(&items[i], depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container(('{', '}'), keys.len(), depth, out, |i, out| {
                    let key = &keys[i];
                    let text = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                    out.push_str(&serde_json::to_string(&text).unwrap_or_default());
                    out.push_str(&self.key);
                    self.write(&value.get_item(key)?, depth + 1, out)
                })?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {} is not JSON", value.kind()),
                ));
            }
        }
        Ok(())
    }

    fn container(
        &self,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        out: &mut String,
        mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            self.newline(depth + 1, out);
            item(i, out)?;
        }
        self.newline(depth, out);
        out.push(close);
        Ok(())
    }
}

/// A number as Python's `json.dumps` writes it: integers bare, floats with a `.0` when whole.
fn number(value: &Value) -> String {
    if value.is_integer()
        && let Ok(int) = i64::try_from(value.clone())
    {
        return int.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(float) if float.is_finite() && float.fract() == 0.0 && float.abs() < 1e16 => {
            format!("{float:.1}")
        }
        Ok(float) if float.is_finite() => format!("{float:?}"),
        Ok(float) if float.is_nan() => "NaN".to_string(),
        Ok(float) if float > 0.0 => "Infinity".to_string(),
        Ok(_) => "-Infinity".to_string(),
        Err(_) => value.to_string(),
    }
}
