//! Value types shared by every section: `"auto"`-or-value, DeepSpeed's lenient integers,
//! case-insensitive string enums and dtype names.
//!
//! DeepSpeed reads integers through pydantic (lax mode) or plain `dict.get`, and both accept an
//! integral float such as `5e8`; serde_json would reject `5e8` for a `u64`. [`NonNegativeInt`]
//! and [`Integer`] accept what DeepSpeed accepts and nothing more: a JSON number with no
//! fractional part, within the range JSON carries exactly (±2^53).

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// The largest integer a JSON number (an IEEE double) holds exactly: 2^53.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// A non-negative integer as DeepSpeed reads it: `500000000`, `5e8` and `5.0e8` are all 5×10^8;
/// `2.5`, `-1`, strings and anything above 2^53 are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NonNegativeInt(pub u64);

impl NonNegativeInt {
    /// The value as a `u64`.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for NonNegativeInt {
    fn from(value: u64) -> Self {
        NonNegativeInt(value)
    }
}

impl fmt::Display for NonNegativeInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for NonNegativeInt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for NonNegativeInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = deserializer.deserialize_any(IntegerVisitor)?;
        u64::try_from(value).map(NonNegativeInt).map_err(|_| {
            de::Error::custom(format!("expected a non-negative integer, found {value}"))
        })
    }
}

impl JsonSchema for NonNegativeInt {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "NonNegativeInt".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_EXACT_INTEGER,
        })
    }
}

/// A positive integer (≥ 1), read as leniently as [`NonNegativeInt`]: for counts DeepSpeed
/// requires to be non-zero (batch sizes, `reduce_bucket_size`, warm-up steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PositiveInt(u64);

impl PositiveInt {
    /// `value` as a positive integer, or `None` for 0.
    pub fn new(value: u64) -> Option<Self> {
        (value > 0).then_some(PositiveInt(value))
    }

    /// The value as a `u64` (never 0).
    pub fn get(self) -> u64 {
        self.0
    }

    /// A positive constant; 0 is raised to 1 (for defaults written in code).
    pub const fn const_new(value: u64) -> Self {
        PositiveInt(if value == 0 { 1 } else { value })
    }
}

impl fmt::Display for PositiveInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for PositiveInt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for PositiveInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = NonNegativeInt::deserialize(deserializer)?.get();
        PositiveInt::new(value)
            .ok_or_else(|| de::Error::custom("expected a positive integer, found 0"))
    }
}

impl JsonSchema for PositiveInt {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "PositiveInt".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_EXACT_INTEGER,
        })
    }
}

/// A signed integer as DeepSpeed reads it (for the few fields where `-1` means something, such
/// as `flops_profiler.module_depth`): integral floats accepted, fractions rejected, |n| ≤ 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Integer(pub i64);

impl Integer {
    /// The value as an `i64`.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl From<i64> for Integer {
    fn from(value: i64) -> Self {
        Integer(value)
    }
}

impl Serialize for Integer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = deserializer.deserialize_any(IntegerVisitor)?;
        i64::try_from(value)
            .map(Integer)
            .map_err(|_| de::Error::custom(format!("integer {value} is out of range")))
    }
}

impl JsonSchema for Integer {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Integer".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer",
            "minimum": -(MAX_EXACT_INTEGER as i64),
            "maximum": MAX_EXACT_INTEGER,
        })
    }
}

/// Reads any JSON number that is an exact integer within ±2^53 into an `i128`.
struct IntegerVisitor;

impl Visitor<'_> for IntegerVisitor {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer (an integral float such as 5e8 is fine)")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i128, E> {
        within_exact_range(i128::from(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i128, E> {
        within_exact_range(i128::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<i128, E> {
        if !value.is_finite() {
            return Err(E::custom(format!("expected an integer, found {value}")));
        }
        if value.fract() != 0.0 {
            return Err(E::custom(format!(
                "expected an integer, found {value} (it has a fractional part)"
            )));
        }
        if value.abs() > MAX_EXACT_INTEGER as f64 {
            return Err(E::custom(format!(
                "integer {value} is larger than 2^53, the largest integer JSON holds exactly"
            )));
        }
        // In range and integral, so the conversion is exact.
        Ok(value as i128)
    }
}

fn within_exact_range<E: de::Error>(value: i128) -> Result<i128, E> {
    if value.unsigned_abs() > u128::from(MAX_EXACT_INTEGER) {
        return Err(E::custom(format!(
            "integer {value} is larger than 2^53, the largest integer JSON holds exactly"
        )));
    }
    Ok(value)
}

/// A value that is either the string `"auto"` (left for Hugging Face's Trainer/Accelerate, or
/// `dsplan resolve`, to fill from the training arguments and the model) or a concrete `T`.
///
/// Only the keys Hugging Face fills use it (see [`crate::config::registry::AUTO_KEYS`]);
/// anywhere else `"auto"` is an error, because DeepSpeed itself either silently replaces it with
/// the default (pydantic sections) or crashes on it (plain keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AutoOr<T> {
    /// `"auto"`: to be filled before DeepSpeed sees the config.
    Auto,
    /// A concrete value.
    Value(T),
}

impl<T> AutoOr<T> {
    /// The concrete value, or `None` when it is still `"auto"`.
    pub fn value(&self) -> Option<&T> {
        match self {
            AutoOr::Auto => None,
            AutoOr::Value(value) => Some(value),
        }
    }

    /// Whether this is `"auto"`.
    pub fn is_auto(&self) -> bool {
        matches!(self, AutoOr::Auto)
    }
}

impl<T: Default> Default for AutoOr<T> {
    fn default() -> Self {
        AutoOr::Value(T::default())
    }
}

impl<T> From<T> for AutoOr<T> {
    fn from(value: T) -> Self {
        AutoOr::Value(value)
    }
}

/// The literal that stands for "fill me in".
pub const AUTO: &str = "auto";

impl<T: Serialize> Serialize for AutoOr<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoOr::Auto => serializer.serialize_str(AUTO),
            AutoOr::Value(value) => value.serialize(serializer),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for AutoOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        if raw.as_str() == Some(AUTO) {
            return Ok(AutoOr::Auto);
        }
        T::deserialize(raw)
            .map(AutoOr::Value)
            .map_err(|error| de::Error::custom(format!("{error} (or \"auto\")")))
    }
}

impl<T: JsonSchema> JsonSchema for AutoOr<T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        format!("AutoOr_{}", T::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let auto = json_schema!({ "const": AUTO });
        let value = generator.subschema_for::<T>();
        // Flatten `T`'s own alternatives so the result is one level of `anyOf`.
        let mut branches = vec![auto.to_value()];
        match value.as_object().and_then(|o| o.get("anyOf")) {
            Some(Value::Array(inner)) if value.as_object().is_some_and(|o| o.len() == 1) => {
                branches.extend(inner.iter().cloned())
            }
            _ => branches.push(value.to_value()),
        }
        json_schema!({ "anyOf": branches })
    }
}

/// Declares a string enum that DeepSpeed compares case-insensitively (it calls `.lower()` or
/// `.upper()` before comparing). Serialises to the canonical spelling; the schema lists the
/// canonical, lower-case, upper-case and capitalised spellings.
macro_rules! case_insensitive_enum {
    (
        $(#[doc = $doc:literal])*
        pub enum $name:ident {
            $( $(#[doc = $variant_doc:literal])* $variant:ident => $spelling:literal, )+
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[doc = $variant_doc])* $variant, )+
        }

        impl $name {
            /// Every variant with its canonical spelling.
            pub const ALL: &'static [($name, &'static str)] = &[ $( ($name::$variant, $spelling), )+ ];

            /// The canonical spelling DeepSpeed compares against.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $spelling, )+ }
            }

            /// The variant whose spelling equals `text` ignoring ASCII case.
            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL
                    .iter()
                    .find(|(_, spelling)| spelling.eq_ignore_ascii_case(text))
                    .map(|(variant, _)| *variant)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::parse(&text).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|(_, s)| *s).collect();
                    serde::de::Error::custom(format!(
                        "unknown value `{text}`, expected one of {} (any letter case)",
                        names.join(", ")
                    ))
                })
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let canonical: Vec<&str> = Self::ALL.iter().map(|(_, s)| *s).collect();
                let description =
                    $crate::config::primitives::enum_description(concat!($($doc, "\n",)*));
                schemars::json_schema!({
                    "description": description,
                    "type": "string",
                    "enum": $crate::config::primitives::case_spellings(&canonical),
                })
            }
        }
    };
}

pub(crate) use case_insensitive_enum;

/// The spellings a case-insensitive enum lists in its schema: each canonical spelling, then its
/// lower-case, upper-case and capitalised forms, without repeats.
pub(crate) fn case_spellings(canonical: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |text: String| {
        if !out.contains(&text) {
            out.push(text);
        }
    };
    for spelling in canonical {
        push((*spelling).to_string());
    }
    for spelling in canonical {
        push(spelling.to_lowercase());
        push(spelling.to_uppercase());
        let lower = spelling.to_lowercase();
        let mut chars = lower.chars();
        if let Some(first) = chars.next() {
            push(first.to_uppercase().chain(chars).collect());
        }
    }
    out
}

/// A doc comment turned into a schema description: lines trimmed and joined, as schemars does.
pub(crate) fn enum_description(doc: &str) -> String {
    let text: Vec<&str> = doc.lines().map(str::trim).collect();
    let joined = text.join("\n");
    let trimmed = joined.trim();
    format!("{trimmed} Any letter case is accepted.")
}

/// A tensor data type as DeepSpeed's `DtypeEnum` spells it (case-sensitive): `"bf16"`,
/// `"bfloat16"`, `"torch.bfloat16"`, `"fp16"`, `"float16"`, `"half"`, `"torch.float16"`,
/// `"fp32"`, `"float32"`, `"float"`, `"torch.float32"`, `"int8"`, `"torch.int8"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DtypeName {
    /// 32-bit IEEE float.
    Fp32,
    /// 16-bit IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 8-bit integer.
    Int8,
}

impl DtypeName {
    /// Every spelling DeepSpeed accepts, with the dtype it names; the first of each is canonical.
    pub const SPELLINGS: &'static [(&'static str, DtypeName)] = &[
        ("fp32", DtypeName::Fp32),
        ("fp16", DtypeName::Fp16),
        ("bf16", DtypeName::Bf16),
        ("int8", DtypeName::Int8),
        ("float32", DtypeName::Fp32),
        ("float", DtypeName::Fp32),
        ("torch.float32", DtypeName::Fp32),
        ("float16", DtypeName::Fp16),
        ("half", DtypeName::Fp16),
        ("torch.float16", DtypeName::Fp16),
        ("bfloat16", DtypeName::Bf16),
        ("torch.bfloat16", DtypeName::Bf16),
        ("torch.int8", DtypeName::Int8),
    ];

    /// The canonical short spelling (`"fp32"`, `"fp16"`, `"bf16"`, `"int8"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DtypeName::Fp32 => "fp32",
            DtypeName::Fp16 => "fp16",
            DtypeName::Bf16 => "bf16",
            DtypeName::Int8 => "int8",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DtypeName::Fp32 => 4,
            DtypeName::Fp16 | DtypeName::Bf16 => 2,
            DtypeName::Int8 => 1,
        }
    }

    /// The dtype an exact spelling names.
    pub fn parse(text: &str) -> Option<Self> {
        Self::SPELLINGS
            .iter()
            .find(|(spelling, _)| *spelling == text)
            .map(|(_, dtype)| *dtype)
    }
}

impl Serialize for DtypeName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DtypeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        DtypeName::parse(&text).ok_or_else(|| {
            let names: Vec<&str> = Self::SPELLINGS.iter().map(|(s, _)| *s).collect();
            de::Error::custom(format!(
                "unknown dtype `{text}`, expected one of {}",
                names.join(", ")
            ))
        })
    }
}

impl JsonSchema for DtypeName {
    fn schema_name() -> Cow<'static, str> {
        "DtypeName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = Self::SPELLINGS.iter().map(|(s, _)| *s).collect();
        json_schema!({
            "description": "A tensor data type, spelt as DeepSpeed's DtypeEnum accepts it (case-sensitive).",
            "type": "string",
            "enum": names,
        })
    }
}

/// Deserialises a present value as `Some`, rejecting `null` (for `Option` fields whose `None`
/// only means "absent", where DeepSpeed itself refuses an explicit `null`).
pub(crate) fn some_not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn non_negative(value: Value) -> Result<u64, String> {
        serde_json::from_value::<NonNegativeInt>(value)
            .map(NonNegativeInt::get)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integral_floats_are_integers() {
        assert_eq!(non_negative(json!(5e8)), Ok(500_000_000));
        assert_eq!(non_negative(json!(5.0e8)), Ok(500_000_000));
        assert_eq!(non_negative(json!(500_000_000)), Ok(500_000_000));
        assert_eq!(non_negative(json!(0)), Ok(0));
        assert_eq!(non_negative(json!(1e14)), Ok(100_000_000_000_000));
    }

    #[test]
    fn fractions_negatives_and_huge_values_are_rejected() {
        assert!(non_negative(json!(2.5)).is_err_and(|e| e.contains("fractional")));
        assert!(non_negative(json!(-1)).is_err());
        assert!(non_negative(json!(-1.0)).is_err());
        assert!(non_negative(json!(1e-10)).is_err());
        assert!(non_negative(json!(MAX_EXACT_INTEGER + 1)).is_err_and(|e| e.contains("2^53")));
        assert!(non_negative(json!(1e16)).is_err());
        assert_eq!(
            non_negative(json!(MAX_EXACT_INTEGER)),
            Ok(MAX_EXACT_INTEGER)
        );
        assert!(non_negative(json!("5")).is_err());
        assert!(non_negative(json!(true)).is_err());
    }

    #[test]
    fn positive_integers_refuse_zero() {
        let read = |v: Value| serde_json::from_value::<PositiveInt>(v).map(PositiveInt::get);
        assert_eq!(read(json!(5e8)).ok(), Some(500_000_000));
        assert!(read(json!(0)).is_err());
        assert!(read(json!(0.0)).is_err());
    }

    #[test]
    fn signed_integers_keep_their_sign() {
        let read = |v: Value| serde_json::from_value::<Integer>(v).map(Integer::get);
        assert_eq!(read(json!(-1)).ok(), Some(-1));
        assert_eq!(read(json!(-1.0)).ok(), Some(-1));
        assert!(read(json!(-0.5)).is_err());
    }

    #[test]
    fn auto_or_reads_both_forms_and_writes_them_back() {
        let auto: AutoOr<NonNegativeInt> = serde_json::from_value(json!("auto")).expect("auto");
        assert!(auto.is_auto());
        let value: AutoOr<NonNegativeInt> = serde_json::from_value(json!(2e8)).expect("2e8");
        assert_eq!(value.value().map(|v| v.get()), Some(200_000_000));
        assert_eq!(serde_json::to_value(auto).ok(), Some(json!("auto")));
        assert_eq!(serde_json::to_value(value).ok(), Some(json!(200_000_000)));
        let other: Result<AutoOr<NonNegativeInt>, _> = serde_json::from_value(json!("Auto"));
        assert!(other.is_err());
    }

    #[test]
    fn dtype_spellings_are_exact() {
        assert_eq!(DtypeName::parse("torch.bfloat16"), Some(DtypeName::Bf16));
        assert_eq!(DtypeName::parse("half"), Some(DtypeName::Fp16));
        assert_eq!(DtypeName::parse("BF16"), None);
    }

    #[test]
    fn case_spellings_cover_common_forms() {
        let spellings = case_spellings(&["WARN", "fp32"]);
        for expected in ["WARN", "warn", "Warn", "fp32", "FP32", "Fp32"] {
            assert!(spellings.iter().any(|s| s == expected), "{expected}");
        }
        assert_eq!(
            spellings.len(),
            6,
            "no duplicates: {spellings:?} (WARN and FP32 appear once)"
        );
    }
}
