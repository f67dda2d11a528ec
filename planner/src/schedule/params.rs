//! Reading `scheduler.params` the way Python binds them to a DeepSpeed constructor.
//!
//! DeepSpeed passes `scheduler.params` as keyword arguments (`cls(optimizer, **params)`), so the
//! JSON values arrive as Python objects: JSON integers become `int`, other numbers `float`,
//! `true`/`false` become `bool` (a subclass of `int`), `null` becomes `None`. This module keeps
//! those distinctions, because DeepSpeed's checks depend on them (`isinstance(x, int)` refuses
//! `10.0` but accepts `True`), and formats values as Python's `repr` does for messages.
//!
//! Note on loaders: DeepSpeed reading the file itself (hjson) turns `10.0` into the int `10`;
//! `json.load` (the Hugging Face path) keeps it a float. This module follows the values it is
//! given; a caller that knows the file went through DeepSpeed's loader normalises first.

use serde_json::{Map, Value};

use super::error::{ScheduleError, ScheduleErrorKind, ScheduleWarning};

/// A Python number as it arrives from JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PyNum {
    /// A JSON integer (or a boolean, which Python treats as 0/1).
    Int(i128),
    /// Any other JSON number.
    Float(f64),
}

impl PyNum {
    /// The value as a double, as Python converts it in mixed arithmetic.
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            PyNum::Int(i) => i as f64,
            PyNum::Float(x) => x,
        }
    }
}

/// The constructor keyword arguments of one scheduler, with the warnings gathered on the way.
pub(crate) struct Params<'a> {
    map: &'a Map<String, Value>,
    scheduler: &'static str,
    /// Warnings DeepSpeed would log (or that point at a loader difference).
    pub(crate) warnings: Vec<ScheduleWarning>,
}

impl<'a> Params<'a> {
    /// Binds `map` to a constructor taking `accepted` keywords, of which `required` have no
    /// default. Unknown keywords are refused first, as Python does when binding arguments.
    pub(crate) fn bind(
        map: &'a Map<String, Value>,
        scheduler: &'static str,
        accepted: &[&str],
        required: &[&str],
    ) -> Result<Self, ScheduleError> {
        for key in map.keys() {
            if key == "optimizer" {
                return Err(ScheduleError::param(
                    ScheduleErrorKind::UnknownParameter,
                    key,
                    format!("{scheduler}.__init__() got multiple values for argument 'optimizer'"),
                ));
            }
            if !accepted.contains(&key.as_str()) {
                let mut error = ScheduleError::param(
                    ScheduleErrorKind::UnknownParameter,
                    key,
                    format!("{scheduler}.__init__() got an unexpected keyword argument '{key}'"),
                );
                error.suggestion = nearest(key, accepted).map(str::to_string);
                return Err(error);
            }
        }
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|name| !map.contains_key(*name))
            .collect();
        if let Some(first) = missing.first() {
            let names: Vec<String> = missing.iter().map(|n| format!("'{n}'")).collect();
            let plural = if missing.len() == 1 { "" } else { "s" };
            return Err(ScheduleError::param(
                ScheduleErrorKind::MissingParameter,
                first,
                format!(
                    "{scheduler}.__init__() missing {} required positional argument{plural}: {}",
                    missing.len(),
                    names.join(" and ")
                ),
            ));
        }
        Ok(Params {
            map,
            scheduler,
            warnings: Vec::new(),
        })
    }

    /// The raw value of `name`, if given (`Some(Value::Null)` is Python's `None`).
    pub(crate) fn raw(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name)
    }

    /// Records a warning about `name`.
    pub(crate) fn warn(&mut self, name: &str, message: impl Into<String>) {
        self.warnings.push(ScheduleWarning::param(name, message));
    }

    /// A number used in arithmetic (`float` or `int`); booleans are accepted as 0/1 with a
    /// warning, as Python does.
    pub(crate) fn number_value(
        &mut self,
        name: &str,
        value: &Value,
    ) -> Result<PyNum, ScheduleError> {
        match value {
            Value::Number(n) => Ok(py_num(n)),
            Value::Bool(b) => {
                self.warn(
                    name,
                    format!(
                        "`{name}` is a boolean; DeepSpeed uses it as the number {}",
                        i32::from(*b)
                    ),
                );
                Ok(PyNum::Int(i128::from(*b)))
            }
            other => Err(ScheduleError::param(
                ScheduleErrorKind::WrongType,
                name,
                format!(
                    "{}: `{name}` must be a number, got {} ({})",
                    self.scheduler,
                    py_repr(other),
                    py_type(other)
                ),
            )),
        }
    }

    /// [`Self::number_value`] of `name`, or `default` when absent.
    pub(crate) fn number(&mut self, name: &str, default: f64) -> Result<f64, ScheduleError> {
        match self.raw(name) {
            None => Ok(default),
            Some(value) => Ok(self.number_value(name, value)?.as_f64()),
        }
    }

    /// One value per parameter group: a list must have exactly `groups` entries (DeepSpeed's
    /// `expected N value for NAME, got M`, with `label` as NAME), a scalar is repeated.
    pub(crate) fn per_group_value(
        &mut self,
        name: &str,
        value: &Value,
        groups: usize,
        mismatch: impl Fn(usize, usize) -> String,
    ) -> Result<Vec<f64>, ScheduleError> {
        match value {
            Value::Array(items) => {
                if items.len() != groups {
                    return Err(ScheduleError::param(
                        ScheduleErrorKind::GroupCountMismatch,
                        name,
                        mismatch(groups, items.len()),
                    ));
                }
                items
                    .iter()
                    .map(|item| Ok(self.number_value(name, item)?.as_f64()))
                    .collect()
            }
            scalar => Ok(vec![self.number_value(name, scalar)?.as_f64(); groups]),
        }
    }

    /// DeepSpeed's `isinstance(x, int) and x > 0` check; `message` receives Python's repr.
    pub(crate) fn positive_int(
        &mut self,
        name: &str,
        default: i128,
        message: impl Fn(&str) -> String,
    ) -> Result<i128, ScheduleError> {
        let Some(value) = self.raw(name) else {
            return Ok(default);
        };
        let int = match value {
            Value::Number(n) => match py_num(n) {
                PyNum::Int(i) => Some(i),
                PyNum::Float(_) => None,
            },
            Value::Bool(b) => Some(i128::from(*b)),
            _ => None,
        };
        match int {
            Some(i) if i > 0 => {
                if value.is_boolean() {
                    self.warn(
                        name,
                        format!("`{name}` is a boolean; DeepSpeed uses it as the integer 1"),
                    );
                }
                Ok(i)
            }
            _ => Err(ScheduleError::param(
                ScheduleErrorKind::InvalidValue,
                name,
                message(&py_repr(value)),
            )),
        }
    }

    /// Python's `float(x)`: numbers, booleans and numeric strings (the latter with a warning).
    pub(crate) fn float_conversion(
        &mut self,
        name: &str,
        value: &Value,
    ) -> Result<f64, ScheduleError> {
        if let Value::String(text) = value {
            return match parse_py_float(text) {
                Some(x) => {
                    self.warn(
                        name,
                        format!(
                            "`{name}` is the string {}; DeepSpeed converts it with float()",
                            py_repr(value)
                        ),
                    );
                    Ok(x)
                }
                None => Err(ScheduleError::param(
                    ScheduleErrorKind::WrongType,
                    name,
                    format!("could not convert string to float: {}", py_repr(value)),
                )),
            };
        }
        self.number_value(name, value)
            .map(PyNum::as_f64)
            .map_err(|mut error| {
                error.message = format!(
                    "float() argument must be a string or a real number, not '{}' (`{name}`)",
                    py_type(value)
                );
                error
            })
    }

    /// Python truthiness of `name` (`if x:`), `default` when absent; a non-boolean gets a warning.
    pub(crate) fn truthy(&mut self, name: &str, default: bool) -> bool {
        let Some(value) = self.raw(name) else {
            return default;
        };
        let truth = match value {
            Value::Bool(b) => return *b,
            Value::Null => false,
            Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
        };
        self.warn(
            name,
            format!(
                "`{name}` is {} rather than a boolean; DeepSpeed takes it as {}",
                py_repr(value),
                if truth { "True" } else { "False" }
            ),
        );
        truth
    }
}

/// The accepted name closest to `key`, if reasonably close.
fn nearest<'n>(key: &str, names: &[&'n str]) -> Option<&'n str> {
    names
        .iter()
        .map(|name| (strsim::jaro_winkler(key, name), *name))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| name)
}

/// A JSON number as the Python number `json.load` makes of it.
pub(crate) fn py_num(n: &serde_json::Number) -> PyNum {
    if let Some(i) = n.as_i64() {
        PyNum::Int(i128::from(i))
    } else if let Some(u) = n.as_u64() {
        PyNum::Int(i128::from(u))
    } else {
        PyNum::Float(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// Python's `float(str)`: surrounding whitespace, `inf`/`nan` spellings, underscores between
/// digits are not modelled (rare enough to refuse).
fn parse_py_float(text: &str) -> Option<f64> {
    let trimmed = text.trim();
    if trimmed.is_empty() || trimmed.contains('_') {
        return None;
    }
    trimmed.parse::<f64>().ok()
}

/// The name of the Python type `json.load` makes of `value`.
pub(crate) fn py_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) => match py_num(n) {
            PyNum::Int(_) => "int",
            PyNum::Float(_) => "float",
        },
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// `repr()` of the Python object `json.load` makes of `value`.
pub(crate) fn py_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_string(),
        Value::Bool(true) => "True".to_string(),
        Value::Bool(false) => "False".to_string(),
        Value::Number(n) => match py_num(n) {
            PyNum::Int(i) => i.to_string(),
            PyNum::Float(x) => py_float_repr(x),
        },
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(py_repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("'{k}': {}", py_repr(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for exponents in
/// `-4..16`, otherwise `d.ddde±XX`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            let (int_part, frac_part) = if digits.len() > int_len {
                (digits[..int_len].to_string(), digits[int_len..].to_string())
            } else {
                (format!("{digits:0<int_len$}"), "0".to_string())
            };
            format!("{sign}{int_part}.{frac_part}")
        } else {
            let zeros = "0".repeat((-exponent - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (0.0, "0.0"),
            (10.0, "10.0"),
            (0.001, "0.001"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1e-7, "1e-07"),
            (2.5e-5, "2.5e-05"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (-3.0, "-3.0"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for (x, expected) in cases {
            assert_eq!(py_float_repr(x), expected, "repr of {x:e}");
        }
    }

    #[test]
    fn repr_keeps_python_types() {
        assert_eq!(py_repr(&json!(10)), "10");
        assert_eq!(py_repr(&json!(10.0)), "10.0");
        assert_eq!(py_repr(&json!(true)), "True");
        assert_eq!(py_repr(&json!(null)), "None");
        assert_eq!(py_repr(&json!("it's")), "'it\\'s'");
        assert_eq!(py_repr(&json!([1, 2.5])), "[1, 2.5]");
    }

    #[test]
    fn unknown_keyword_is_refused_with_a_suggestion() {
        let map = json!({"warmup_num_step": 10})
            .as_object()
            .cloned()
            .expect("object");
        let error = Params::bind(&map, "WarmupLR", &["warmup_num_steps", "warmup_type"], &[])
            .err()
            .expect("refused");
        assert_eq!(error.kind, ScheduleErrorKind::UnknownParameter);
        assert_eq!(error.suggestion.as_deref(), Some("warmup_num_steps"));
        assert!(
            error
                .message
                .contains("unexpected keyword argument 'warmup_num_step'")
        );
    }

    #[test]
    fn missing_required_arguments_are_listed() {
        let map = Map::new();
        let error = Params::bind(
            &map,
            "OneCycle",
            &["cycle_min_lr", "cycle_max_lr"],
            &["cycle_min_lr", "cycle_max_lr"],
        )
        .err()
        .expect("refused");
        assert_eq!(
            error.message,
            "OneCycle.__init__() missing 2 required positional arguments: 'cycle_min_lr' and 'cycle_max_lr'"
        );
        assert_eq!(error.param.as_deref(), Some("cycle_min_lr"));
    }

    #[test]
    fn positive_int_follows_isinstance_int() {
        let map = json!({"a": 10.0, "b": true, "c": 0, "d": 7})
            .as_object()
            .cloned()
            .expect("object");
        let mut params = Params::bind(&map, "X", &["a", "b", "c", "d"], &[]).expect("bound");
        let msg = |r: &str| format!("got {r}");
        assert_eq!(
            params.positive_int("a", 5, msg).err().map(|e| e.message),
            Some("got 10.0".into())
        );
        assert_eq!(params.positive_int("b", 5, msg).ok(), Some(1));
        assert_eq!(
            params.positive_int("c", 5, msg).err().map(|e| e.message),
            Some("got 0".into())
        );
        assert_eq!(params.positive_int("d", 5, msg).ok(), Some(7));
        assert_eq!(params.positive_int("absent", 5, msg).ok(), Some(5));
        assert_eq!(params.warnings.len(), 1, "the boolean is flagged");
    }
}
