//! JSON number literals, kept the way Python reads them: an integer literal is an integer
//! (`u64`/`i64` when it fits, else the nearest `f64`); a literal with a fraction or an
//! exponent is a float (`5e8` is `500000000.0`, so a validator can tell `5e8` from `2.5` and
//! from `500000000`). A float beyond `f64` (`1e400`) is an error.
//!
//! hjson 3.1 (DeepSpeed's loader) goes one step further and turns a float literal with no
//! fraction below 1e10 into a Python int (`1.0` → `1`, `5e8` → `500000000`); dsplan keeps the
//! float so that checks can see how a value was written, and treats integral floats as
//! integers where DeepSpeed would.

use super::cursor::Cursor;
use super::error::{ParseError, describe_found, quote, word_at};
use crate::diagnostics::Code;
use serde_json::Number;

/// Whether a literal had a fraction or an exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Digits only (with an optional `-`).
    Integer,
    /// With `.digits` and/or `e[+-]digits`.
    Float,
}

/// Read the number at the cursor (on `-` or a digit), leaving the cursor after it.
pub(crate) fn parse_number(cursor: &mut Cursor<'_>) -> Result<Number, ParseError> {
    let text = cursor.text();
    let start = cursor.pos();
    if cursor.peek() == Some(b'-') {
        cursor.advance(1);
    }
    match cursor.peek() {
        Some(b'0') => {
            cursor.advance(1);
            if cursor.peek().is_some_and(|byte| byte.is_ascii_digit()) {
                return Err(leading_zero(text, start));
            }
        }
        Some(b'1'..=b'9') => cursor.advance_while(|byte| byte.is_ascii_digit()),
        _ => return Err(no_digit_after_minus(text, start, cursor.pos())),
    }
    let mut form = Form::Integer;
    if cursor.peek() == Some(b'.') {
        cursor.advance(1);
        require_digit(cursor, start, "after the decimal point")?;
        form = Form::Float;
    }
    if matches!(cursor.peek(), Some(b'e' | b'E')) {
        cursor.advance(1);
        if matches!(cursor.peek(), Some(b'+' | b'-')) {
            cursor.advance(1);
        }
        require_digit(cursor, start, "in the exponent")?;
        form = Form::Float;
    }
    let literal = &text[start..cursor.pos()];
    match form {
        Form::Integer => match integer(literal) {
            Some(number) => Ok(number),
            None => float(literal, start),
        },
        Form::Float => float(literal, start),
    }
}

/// An integer literal as `u64` or `i64`, `None` when it fits neither.
fn integer(literal: &str) -> Option<Number> {
    if literal.starts_with('-') {
        literal.parse::<i64>().ok().map(Number::from)
    } else {
        literal.parse::<u64>().ok().map(Number::from)
    }
}

/// A literal as the nearest `f64` (correctly rounded, as Python's `float()`), or
/// [`Code::NumberOutOfRange`] when it is beyond the `f64` range.
fn float(literal: &str, start: usize) -> Result<Number, ParseError> {
    let out_of_range = || {
        ParseError::new(
            Code::NumberOutOfRange,
            start,
            format!("{} does not fit in a 64-bit float", quote(literal)),
        )
        .with_help("the largest finite 64-bit float is about 1.8e308")
    };
    literal
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(out_of_range)
}

/// At least one digit must follow; consume the digits.
fn require_digit(cursor: &mut Cursor<'_>, start: usize, where_: &str) -> Result<(), ParseError> {
    if !cursor.peek().is_some_and(|byte| byte.is_ascii_digit()) {
        let text = cursor.text();
        let written = word_at(text, start);
        return Err(ParseError::syntax(
            cursor.pos(),
            format!("expected a digit {where_} in {}", quote(written)),
        )
        .with_help("write numbers as in `1.0`, `0.5`, `5e8` or `1e-6`"));
    }
    cursor.advance_while(|byte| byte.is_ascii_digit());
    Ok(())
}

/// `01`, `-007`.
fn leading_zero(text: &str, start: usize) -> ParseError {
    let written = word_at(text, start);
    ParseError::syntax(
        start,
        format!(
            "JSON numbers cannot have a leading zero: {}",
            quote(written)
        ),
    )
    .with_help("remove the leading zeros (or quote the value if it is meant as a string)")
}

/// `-` followed by something other than a digit (`-Infinity`, `- 1`).
fn no_digit_after_minus(text: &str, start: usize, after: usize) -> ParseError {
    let error = ParseError::syntax(
        after,
        format!(
            "expected a digit after `-`, found {}",
            describe_found(text, after)
        ),
    );
    if word_at(text, start).eq_ignore_ascii_case("-infinity") {
        error.with_help("JSON has no infinity: write a large finite number such as `-1e308`")
    } else {
        error.with_help("write the digits right after the minus sign, as in `-1`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::decode::ByteOrderMark;
    use crate::source::strictness::NonStrictTally;

    fn parse(text: &str) -> Result<(Number, usize), ParseError> {
        let mut cursor = Cursor::new(text, NonStrictTally::new(ByteOrderMark::Absent));
        let number = parse_number(&mut cursor)?;
        Ok((number, cursor.pos()))
    }

    fn number(text: &str) -> Number {
        parse(text).expect("valid number").0
    }

    #[test]
    fn integers_stay_integers() {
        assert_eq!(number("0").as_u64(), Some(0));
        assert_eq!(number("-0").as_u64(), Some(0));
        assert_eq!(number("42").as_u64(), Some(42));
        assert_eq!(number("-42").as_i64(), Some(-42));
        assert_eq!(number("18446744073709551615").as_u64(), Some(u64::MAX));
        assert_eq!(number("-9223372036854775808").as_i64(), Some(i64::MIN));
    }

    #[test]
    fn integers_too_big_for_64_bits_become_floats() {
        let big = number("18446744073709551616");
        assert!(big.is_f64());
        assert_eq!(big.as_f64(), Some(18446744073709551616.0));
        assert!(number("-9223372036854775809").is_f64());
        let error = parse(&"9".repeat(400)).expect_err("beyond f64");
        assert_eq!(error.code, Code::NumberOutOfRange);
    }

    #[test]
    fn fractions_and_exponents_make_floats() {
        let five = number("5e8");
        assert!(five.is_f64());
        assert_eq!(five.as_f64(), Some(500_000_000.0));
        assert!(number("2.0").is_f64());
        assert_eq!(number("2.5").as_f64(), Some(2.5));
        assert_eq!(number("1E-6").as_f64(), Some(1e-6));
        assert_eq!(number("-1.5e+3").as_f64(), Some(-1500.0));
        assert_eq!(number("1e-400").as_f64(), Some(0.0));
        assert_eq!(number("0.1").as_f64(), Some(0.1));
    }

    #[test]
    fn stops_after_the_literal() {
        assert_eq!(parse("12,").expect("valid").1, 2);
        assert_eq!(parse("1.5.2").expect("valid").1, 3);
        assert_eq!(parse("3}").expect("valid").1, 1);
    }

    #[test]
    fn overflow_is_out_of_range_at_the_number() {
        let error = parse("1e400").expect_err("overflow");
        assert_eq!(error.code, Code::NumberOutOfRange);
        assert_eq!(error.offset, 0);
        assert_eq!(error.message, "`1e400` does not fit in a 64-bit float");
        assert_eq!(
            parse("-1e400").expect_err("overflow").code,
            Code::NumberOutOfRange
        );
    }

    #[test]
    fn malformed_numbers_are_syntax_errors() {
        let error = parse("01").expect_err("leading zero");
        assert_eq!(
            error.message,
            "JSON numbers cannot have a leading zero: `01`"
        );
        let error = parse("1.").expect_err("no fraction digits");
        assert_eq!(
            error.message,
            "expected a digit after the decimal point in `1.`"
        );
        assert_eq!(error.offset, 2);
        let error = parse("1e+").expect_err("no exponent digits");
        assert_eq!(error.message, "expected a digit in the exponent in `1e+`");
        let error = parse("-Infinity").expect_err("infinity");
        assert_eq!(
            error.message,
            "expected a digit after `-`, found `Infinity`"
        );
        assert!(error.help.as_deref().unwrap_or("").contains("no infinity"));
        assert_eq!(parse("-").expect_err("bare minus").offset, 1);
    }
}
