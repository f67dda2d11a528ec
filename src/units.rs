//! Sizes and memory amounts as users type them on the command line.
//!
//! Counts (parameters): `2.7B`, `350M`, `65_798_144`, `1.5e9`, `7k`, `1T`; suffixes K, M, B
//! (or G) and T are powers of 1000, case-insensitive. Memory: `80GiB` (2^30), `80GB` (10^9),
//! `512MiB`, `1.5TB`, `4096B`; a unit is required. Both are parsed as exact decimals: the value
//! must come out a whole number (`1.5` parameters is an error, `2.7B` is 2,700,000,000 exactly).

use std::fmt;

/// A size string that could not be read, with the reason and an example of what works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    input: String,
    reason: String,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.input, self.reason)
    }
}

impl std::error::Error for UnitError {}

const COUNT_HELP: &str =
    "write a whole number such as 65_798_144 or 1.5e9, or use a suffix K, M, B or T (2.7B, 350M)";
const MEMORY_HELP: &str = "write a number with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 80GiB";

/// An exact decimal `digits x 10^exponent`.
struct Decimal {
    digits: u128,
    exponent: i32,
}

/// Parses `123`, `1_000`, `2.75`, `1.5e9`, `4E+3` exactly.
fn parse_decimal(text: &str) -> Option<Decimal> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let mut digits: u128 = 0;
    for c in whole.chars().chain(fraction.chars()) {
        let digit = c.to_digit(10)?;
        digits = digits.checked_mul(10)?.checked_add(u128::from(digit))?;
    }
    let fraction_len = i32::try_from(fraction.len()).ok()?;
    Some(Decimal {
        digits,
        exponent: exponent.checked_sub(fraction_len)?,
    })
}

/// `decimal x multiplier`, when it is a whole number that fits in u64.
fn whole(decimal: &Decimal, multiplier: u128) -> Result<u64, &'static str> {
    let too_large = "is too large";
    let mut value = decimal.digits.checked_mul(multiplier).ok_or(too_large)?;
    if decimal.exponent >= 0 {
        for _ in 0..decimal.exponent {
            value = value.checked_mul(10).ok_or(too_large)?;
        }
    } else {
        for _ in 0..decimal.exponent.unsigned_abs() {
            if value % 10 != 0 {
                return Err("is not a whole number");
            }
            value /= 10;
        }
    }
    u64::try_from(value).map_err(|_| too_large)
}

/// Splits `2.7B` into (`2.7`, `B`): the number is everything up to the first letter that is
/// not an exponent marker followed by a digit or sign.
fn split_unit(text: &str) -> (&str, &str) {
    let bytes = text.as_bytes();
    for (i, &byte) in bytes.iter().enumerate() {
        if byte.is_ascii_alphabetic() {
            let exponent = matches!(byte, b'e' | b'E')
                && i > 0
                && bytes
                    .get(i + 1)
                    .is_some_and(|next| next.is_ascii_digit() || matches!(next, b'+' | b'-'));
            if !exponent {
                return (&text[..i], &text[i..]);
            }
        }
    }
    (text, "")
}

fn error(input: &str, reason: impl Into<String>) -> UnitError {
    UnitError {
        input: input.to_owned(),
        reason: reason.into(),
    }
}

/// A count such as `2.7B`, `350M`, `65_798_144` or `1.5e9`.
pub fn parse_count(input: &str) -> Result<u64, UnitError> {
    let text: String = input.trim().chars().filter(|&c| c != '_').collect();
    let (number, suffix) = split_unit(&text);
    let multiplier: u128 = match suffix.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "B" | "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => {
            return Err(error(
                input,
                format!("unknown suffix `{suffix}`; {COUNT_HELP}"),
            ));
        }
    };
    let decimal =
        parse_decimal(number).ok_or_else(|| error(input, format!("not a number; {COUNT_HELP}")))?;
    whole(&decimal, multiplier).map_err(|reason| error(input, format!("{reason}; {COUNT_HELP}")))
}

/// An amount of memory such as `80GiB`, `80GB` or `512MiB`, in bytes.
#[allow(
    dead_code,
    reason = "memory flags arrive with `recommend`; unit-tested here"
)]
pub fn parse_bytes(input: &str) -> Result<u64, UnitError> {
    let text: String = input.trim().chars().filter(|&c| c != '_').collect();
    let (number, unit) = split_unit(&text);
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "" => return Err(error(input, format!("no unit; {MEMORY_HELP}"))),
        _ => {
            return Err(error(
                input,
                format!("unknown unit `{unit}`; {MEMORY_HELP}"),
            ));
        }
    };
    let decimal = parse_decimal(number)
        .ok_or_else(|| error(input, format!("not a number; {MEMORY_HELP}")))?;
    whole(&decimal, multiplier)
        .map_err(|reason| error(input, format!("{reason} of bytes; {MEMORY_HELP}")))
}

/// [`parse_bytes`] for clap's `value_parser` (`--gpu-memory 80GB`, `--cpu-memory 1.5TiB`).
pub fn memory_arg(input: &str) -> Result<u64, String> {
    parse_bytes(input).map_err(|error| error.to_string())
}

/// A byte count as GiB with two decimals, no unit (the tables name the unit in their header).
pub fn gib_figure(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// [`parse_count`] for clap's `value_parser`.
pub fn count_arg(input: &str) -> Result<u64, String> {
    parse_count(input).map_err(|error| error.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_every_documented_spelling() {
        assert_eq!(parse_count("2.7B"), Ok(2_700_000_000));
        assert_eq!(parse_count("350M"), Ok(350_000_000));
        assert_eq!(parse_count("65_798_144"), Ok(65_798_144));
        assert_eq!(parse_count("1.5e9"), Ok(1_500_000_000));
        assert_eq!(parse_count("2.783959040e9"), Ok(2_783_959_040));
        assert_eq!(parse_count("7k"), Ok(7_000));
        assert_eq!(parse_count("1t"), Ok(1_000_000_000_000));
        assert_eq!(parse_count("4E+3"), Ok(4_000));
    }

    #[test]
    fn bad_counts_say_why() {
        assert!(parse_count("1.5").is_err_and(|e| e.to_string().contains("not a whole number")));
        assert!(parse_count("2.7X").is_err_and(|e| e.to_string().contains("unknown suffix `X`")));
        assert!(parse_count("abc").is_err());
        assert!(parse_count("").is_err());
        assert!(parse_count("-5").is_err());
        assert!(parse_count("1e30").is_err_and(|e| e.to_string().contains("too large")));
    }

    #[test]
    fn memory_units_are_exact() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert!(parse_bytes("80").is_err_and(|e| e.to_string().contains("no unit")));
        assert!(parse_bytes("80G").is_err_and(|e| e.to_string().contains("unknown unit `G`")));
        assert!(parse_bytes("0.1B").is_err());
    }
}
