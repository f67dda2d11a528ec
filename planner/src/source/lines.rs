//! Byte offsets to 1-based lines and columns. A line ends at `\n`; a `\r` before it belongs to
//! the line ending. Columns count characters, not bytes.

use super::Span;

/// The byte offset where each line starts, and whether the line is pure ASCII (then a column
/// is a byte count, found without walking the line), built once per file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineIndex {
    starts: Vec<usize>,
    ascii: Vec<bool>,
}

impl LineIndex {
    /// Index the lines of `text`.
    pub fn new(text: &str) -> Self {
        let mut starts = vec![0];
        let mut ascii = Vec::new();
        let mut line_ascii = true;
        for (at, byte) in text.bytes().enumerate() {
            line_ascii &= byte.is_ascii();
            if byte == b'\n' {
                starts.push(at + 1);
                ascii.push(line_ascii);
                line_ascii = true;
            }
        }
        ascii.push(line_ascii);
        LineIndex { starts, ascii }
    }

    /// The byte offset of a 1-based line and column (in characters); `None` past the line.
    pub fn offset_of(&self, text: &str, line: usize, column: usize) -> Option<usize> {
        let span = self.line_span(text, line)?;
        let skipped = column.checked_sub(1)?;
        if self.ascii.get(line - 1).copied().unwrap_or(false) {
            return (skipped <= span.end - span.start).then_some(span.start + skipped);
        }
        let line_text = span.slice(text);
        line_text
            .char_indices()
            .map(|(at, _)| at)
            .chain(std::iter::once(line_text.len()))
            .nth(skipped)
            .map(|at| span.start + at)
    }

    /// 1-based line and column of `offset`, clamped to the text and floored to a character
    /// boundary.
    pub fn line_col(&self, text: &str, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line_index = self.starts.partition_point(|&start| start <= offset) - 1;
        let start = self.starts[line_index];
        let column = if self.ascii.get(line_index).copied().unwrap_or(false) {
            offset - start + 1
        } else {
            text[start..offset].chars().count() + 1
        };
        (line_index + 1, column)
    }

    /// 1-based line of `offset`.
    pub fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset)
    }

    /// The bytes of a 1-based line, line ending excluded.
    pub fn line_span(&self, text: &str, line: usize) -> Option<Span> {
        let start = *self.starts.get(line.checked_sub(1)?)?;
        let mut end = self.starts.get(line).map_or(text.len(), |next| next - 1);
        if end > start && text.as_bytes()[end - 1] == b'\r' {
            end -= 1;
        }
        Some(Span { start, end })
    }

    /// The text of a 1-based line, line ending excluded.
    pub fn line_text<'t>(&self, text: &'t str, line: usize) -> Option<&'t str> {
        self.line_span(text, line).map(|span| span.slice(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_are_one_based_and_count_characters() {
        let text = "{\r\n  \"é\": 1,\n\n}";
        let lines = LineIndex::new(text);
        assert_eq!(lines.line_col(text, 0), (1, 1));
        assert_eq!(lines.line_col(text, 1), (1, 2));
        let one = text.find('1').expect("digit");
        assert_eq!(lines.line_col(text, one), (2, 8));
        assert_eq!(lines.line_col(text, text.len()), (4, 2));
        assert_eq!(lines.line_col(text, text.len() + 10), (4, 2));
        assert_eq!(lines.line_of(one), 2);
    }

    #[test]
    fn offsets_of_columns_invert_line_col() {
        let text = "{\r\n  \"é\": 1,\n\n}";
        let lines = LineIndex::new(text);
        for offset in (0..=text.len()).filter(|&at| text.is_char_boundary(at)) {
            let (line, column) = lines.line_col(text, offset);
            let span = lines.line_span(text, line).expect("line");
            if offset <= span.end {
                assert_eq!(
                    lines.offset_of(text, line, column),
                    Some(offset),
                    "{offset}"
                );
            }
        }
        assert_eq!(lines.offset_of(text, 1, 3), None);
        assert_eq!(lines.offset_of(text, 9, 1), None);
    }

    #[test]
    fn an_offset_inside_a_character_counts_as_that_character() {
        let text = "\"é\"";
        let lines = LineIndex::new(text);
        assert_eq!(lines.line_col(text, 2), (1, 2));
    }

    #[test]
    fn line_text_drops_the_line_ending() {
        let text = "{\r\n  \"a\": 1\n}\n";
        let lines = LineIndex::new(text);
        assert_eq!(lines.line_text(text, 1), Some("{"));
        assert_eq!(lines.line_text(text, 2), Some("  \"a\": 1"));
        assert_eq!(lines.line_text(text, 3), Some("}"));
        assert_eq!(lines.line_text(text, 4), Some(""));
        assert_eq!(lines.line_text(text, 5), None);
        assert_eq!(lines.line_text(text, 0), None);
    }
}
