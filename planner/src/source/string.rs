//! JSON string literals: every JSON escape including surrogate pairs; raw control characters,
//! unknown escapes and unpaired surrogates are syntax errors.

use super::cursor::Cursor;
use super::error::{ParseError, quote};

/// Read the string literal at the cursor (which is on its opening `"`) and leave the cursor
/// after its closing `"`.
pub(crate) fn parse_string(cursor: &mut Cursor<'_>) -> Result<String, ParseError> {
    let text = cursor.text();
    let open = cursor.pos();
    cursor.advance(1);
    let mut decoded = String::new();
    loop {
        let chunk_start = cursor.pos();
        cursor.advance_while(|byte| byte != b'"' && byte != b'\\' && byte >= 0x20);
        decoded.push_str(&text[chunk_start..cursor.pos()]);
        match cursor.peek() {
            Some(b'"') => {
                cursor.advance(1);
                return Ok(decoded);
            }
            Some(b'\\') => decoded.push(parse_escape(cursor)?),
            Some(b'\n' | b'\r') => return Err(unclosed(open, "before the end of the line")),
            Some(control) => return Err(control_character(cursor.pos(), control)),
            None => return Err(unclosed(open, "before the end of the file")),
        }
    }
}

/// The string starting at `open` has no closing quote `where_`.
fn unclosed(open: usize, where_: &str) -> ParseError {
    ParseError::syntax(open, format!("this string is not closed {where_}"))
        .with_help("add the closing `\"` (a string cannot span lines: write a line break as `\\n`)")
}

/// A raw control character inside a string.
fn control_character(at: usize, control: u8) -> ParseError {
    let escape = match control {
        b'\t' => "\\t".to_owned(),
        0x08 => "\\b".to_owned(),
        0x0C => "\\f".to_owned(),
        _ => format!("\\u{control:04X}"),
    };
    ParseError::syntax(
        at,
        format!("control character U+{control:04X} inside a string"),
    )
    .with_help(format!("write it as `{escape}`"))
}

/// Decode the escape at the cursor (on its `\`), leaving the cursor after it.
fn parse_escape(cursor: &mut Cursor<'_>) -> Result<char, ParseError> {
    let backslash = cursor.pos();
    let simple = match cursor.peek_at(1) {
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => return parse_unicode_escape(cursor),
        _ => return Err(invalid_escape(cursor.text(), backslash)),
    };
    cursor.advance(2);
    Ok(simple)
}

/// An escape JSON does not have (`\x`, `\'`, a Windows path's `\U`).
fn invalid_escape(text: &str, backslash: usize) -> ParseError {
    let escape: String = text[backslash..].chars().take(2).collect();
    ParseError::syntax(
        backslash,
        format!("invalid escape {} in a string", quote(&escape)),
    )
    .with_help(
        "JSON escapes are \\\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX; \
             to write a backslash, double it: `\\\\`",
    )
}

/// Decode `\uXXXX`, joining a high surrogate with the `\uXXXX` low surrogate that must follow.
fn parse_unicode_escape(cursor: &mut Cursor<'_>) -> Result<char, ParseError> {
    let first_at = cursor.pos();
    let first = hex_escape(cursor)?;
    let code_point = match first {
        0xD800..=0xDBFF => {
            let second = if cursor.starts_with("\\u") {
                hex_escape(cursor)?
            } else {
                return Err(unpaired_surrogate(first_at, first));
            };
            if !(0xDC00..=0xDFFF).contains(&second) {
                return Err(unpaired_surrogate(first_at, first).with_help(format!(
                    "the escape after it, `\\u{second:04X}`, is not a low surrogate \
                     \\uDC00–\\uDFFF"
                )));
            }
            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
        }
        0xDC00..=0xDFFF => return Err(unpaired_surrogate(first_at, first)),
        _ => first,
    };
    char::from_u32(code_point).ok_or_else(|| {
        ParseError::syntax(
            first_at,
            format!("`\\u{first:04X}` is not a Unicode character"),
        )
    })
}

/// Read `\uXXXX` at the cursor, leaving the cursor after it.
fn hex_escape(cursor: &mut Cursor<'_>) -> Result<u32, ParseError> {
    let at = cursor.pos();
    let digits = cursor.text().get(at + 2..at + 6).unwrap_or("");
    if digits.len() != 4 || !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        let shown: String = cursor.text()[at..].chars().take(6).collect();
        return Err(
            ParseError::syntax(at, format!("invalid unicode escape {}", quote(&shown)))
                .with_help("`\\u` must be followed by exactly four hex digits, as in `\\u00e9`"),
        );
    }
    cursor.advance(6);
    u32::from_str_radix(digits, 16).map_err(|_| ParseError::syntax(at, "invalid unicode escape"))
}

/// A surrogate escape without its partner.
fn unpaired_surrogate(at: usize, unit: u32) -> ParseError {
    ParseError::syntax(
        at,
        format!("unpaired surrogate `\\u{unit:04X}` in a string"),
    )
    .with_help(
        "a high surrogate \\uD800–\\uDBFF must be followed by a low surrogate \\uDC00–\\uDFFF \
         (or write the character itself)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::decode::ByteOrderMark;
    use crate::source::strictness::NonStrictTally;

    fn parse(text: &str) -> Result<(String, usize), ParseError> {
        let mut cursor = Cursor::new(text, NonStrictTally::new(ByteOrderMark::Absent));
        let decoded = parse_string(&mut cursor)?;
        Ok((decoded, cursor.pos()))
    }

    #[test]
    fn decodes_every_escape() {
        let (decoded, end) =
            parse(r#""a\"b\\c\/d\be\ff\ng\rh\ti\u00e9\u20AC\ud83d\ude00" tail"#).expect("valid");
        assert_eq!(
            decoded,
            "a\"b\\c/d\u{8}e\u{c}f\ng\rh\ti\u{e9}\u{20ac}\u{1f600}"
        );
        assert_eq!(
            end,
            r#""a\"b\\c\/d\be\ff\ng\rh\ti\u00e9\u20AC\ud83d\ude00""#.len()
        );
    }

    #[test]
    fn keeps_raw_unicode() {
        assert_eq!(parse("\"é😀\"").expect("valid").0, "é😀");
    }

    #[test]
    fn rejects_bad_escapes_at_the_backslash() {
        let error = parse(r#""C:\Users""#).expect_err("invalid");
        assert_eq!(error.offset, 3);
        assert_eq!(error.message, "invalid escape `\\U` in a string");
        assert!(error.help.as_deref().unwrap_or("").contains("double it"));
        assert!(parse(r#""\u12""#).is_err());
        assert!(parse(r#""\u12g4""#).is_err());
        assert!(parse(r#""\"#).is_err());
        assert!(parse("\"\\é\"").is_err());
    }

    #[test]
    fn rejects_unpaired_surrogates() {
        assert!(parse(r#""\ud83d""#).is_err());
        assert!(parse(r#""\ud83dx""#).is_err());
        assert!(parse(r#""\ud83d\u0041""#).is_err());
        let error = parse(r#""\ude00""#).expect_err("lone low surrogate");
        assert_eq!(error.offset, 1);
        assert!(error.message.contains("unpaired surrogate `\\uDE00`"));
    }

    #[test]
    fn rejects_raw_control_characters() {
        let error = parse("\"a\tb\"").expect_err("tab");
        assert_eq!(error.offset, 2);
        assert_eq!(error.help.as_deref(), Some("write it as `\\t`"));
        let error = parse("\"a\u{1}\"").expect_err("control");
        assert_eq!(error.help.as_deref(), Some("write it as `\\u0001`"));
    }

    #[test]
    fn an_unclosed_string_points_at_its_opening_quote() {
        let error = parse("\"stage\n").expect_err("unclosed");
        assert_eq!(error.offset, 0);
        assert_eq!(
            error.message,
            "this string is not closed before the end of the line"
        );
        let error = parse("\"stage").expect_err("unclosed");
        assert_eq!(
            error.message,
            "this string is not closed before the end of the file"
        );
    }
}
