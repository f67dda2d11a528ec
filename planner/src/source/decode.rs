//! From bytes to text: strip a UTF-8 byte-order mark, reject bytes that are not UTF-8 with the
//! position of the first bad byte.

use crate::diagnostics::{Code, Diagnostic};

/// The UTF-8 encoding of U+FEFF.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A file's bytes seen as text.
pub(crate) struct Decoded<'b> {
    /// The text after any byte-order mark.
    pub text: &'b str,
    /// Whether the file started with a UTF-8 byte-order mark.
    pub byte_order_mark: ByteOrderMark,
}

/// Whether a UTF-8 byte-order mark preceded the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ByteOrderMark {
    /// The file starts with `EF BB BF`.
    Present,
    /// It does not.
    Absent,
}

/// Decode `bytes` as UTF-8, or say where they stop being UTF-8.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded<'_>, Box<Diagnostic>> {
    let (body, byte_order_mark, skipped) = match bytes.strip_prefix(UTF8_BOM) {
        Some(rest) => (rest, ByteOrderMark::Present, UTF8_BOM.len()),
        None => (bytes, ByteOrderMark::Absent, 0),
    };
    match std::str::from_utf8(body) {
        Ok(text) => Ok(Decoded {
            text,
            byte_order_mark,
        }),
        Err(error) => Err(Box::new(not_utf8(body, error.valid_up_to(), skipped))),
    }
}

/// The diagnostic for the first invalid byte at `bad` (an offset into `body`, which is valid
/// UTF-8 before it); `skipped` bytes of byte-order mark precede `body` in the file.
fn not_utf8(body: &[u8], bad: usize, skipped: usize) -> Diagnostic {
    let valid = std::str::from_utf8(&body[..bad]).unwrap_or_default();
    let line = valid.matches('\n').count() + 1;
    let line_start = valid.rfind('\n').map_or(0, |at| at + 1);
    let column = valid[line_start..].chars().count() + 1;
    let byte = body[bad];
    let help = if looks_like_utf16(body) {
        "the file looks like UTF-16: save it as UTF-8"
    } else {
        "save the file as UTF-8 (DeepSpeed and the Hugging Face Trainer both read it as UTF-8)"
    };
    Diagnostic::error(
        Code::NotUtf8,
        "",
        format!(
            "the file is not valid UTF-8: byte 0x{byte:02X} at offset {} (line {line}, column {column})",
            bad + skipped
        ),
    )
    .with_help(help)
    .at(line, column)
}

/// UTF-16 files start with a byte-order mark `FF FE` / `FE FF`, or have a zero byte next to
/// each ASCII character.
fn looks_like_utf16(body: &[u8]) -> bool {
    body.starts_with(b"\xFF\xFE")
        || body.starts_with(b"\xFE\xFF")
        || (body.len() >= 2 && (body[0] == 0 || body[1] == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_a_byte_order_mark() {
        let decoded = decode(b"\xEF\xBB\xBF{}").expect("valid");
        assert_eq!(decoded.text, "{}");
        assert_eq!(decoded.byte_order_mark, ByteOrderMark::Present);
        let decoded = decode(b"{}").expect("valid");
        assert_eq!(decoded.byte_order_mark, ByteOrderMark::Absent);
    }

    #[test]
    fn names_the_first_bad_byte_with_its_line_and_column() {
        let error = decode(b"{\n  \"a\": \"\xC3\xA9\xFF\"\n}")
            .err()
            .expect("invalid");
        assert_eq!(error.code, Code::NotUtf8);
        assert_eq!((error.line, error.column), (Some(2), Some(10)));
        assert!(
            error.message.contains("0xFF at offset 12"),
            "{}",
            error.message
        );
    }

    #[test]
    fn offsets_count_the_byte_order_mark() {
        let error = decode(b"\xEF\xBB\xBF\xFF").err().expect("invalid");
        assert!(error.message.contains("offset 3"), "{}", error.message);
        assert_eq!((error.line, error.column), (Some(1), Some(1)));
    }

    #[test]
    fn recognises_utf16() {
        let error = decode(b"\xFF\xFE{\0}\0").err().expect("invalid");
        assert!(error.help.as_deref().unwrap_or("").contains("UTF-16"));
    }
}
