//! What the file uses that DeepSpeed's hjson loader accepts and strict JSON does not: comments,
//! trailing commas, a byte-order mark. Counted while parsing, reported once per file.

use super::decode::ByteOrderMark;
use super::lines::LineIndex;
use crate::diagnostics::{Code, Diagnostic};

/// The help every [`Code::NonStrictJson`] diagnostic carries.
pub(crate) const NON_STRICT_HELP: &str = "DeepSpeed's loader accepts this, but the Hugging Face \
     Trainer and accelerate read the file with strict JSON and will reject it";

/// One kind of non-strict syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leniency {
    /// `// ...`, `# ...` or `/* ... */`.
    Comment,
    /// A `,` before `}` or `]`.
    TrailingComma,
    /// A UTF-8 byte-order mark before the text.
    ByteOrderMark,
}

/// How many of each kind of non-strict syntax a file uses, and where the first one is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NonStrictTally {
    comments: usize,
    trailing_commas: usize,
    byte_order_mark: bool,
    first_offset: Option<usize>,
}

impl NonStrictTally {
    /// A tally that starts with the file's byte-order mark, if any.
    pub fn new(byte_order_mark: ByteOrderMark) -> Self {
        let mut tally = NonStrictTally::default();
        if byte_order_mark == ByteOrderMark::Present {
            tally.record(Leniency::ByteOrderMark, 0);
        }
        tally
    }

    /// Count one occurrence at byte `offset`.
    pub fn record(&mut self, leniency: Leniency, offset: usize) {
        match leniency {
            Leniency::Comment => self.comments += 1,
            Leniency::TrailingComma => self.trailing_commas += 1,
            Leniency::ByteOrderMark => self.byte_order_mark = true,
        }
        self.first_offset = Some(self.first_offset.map_or(offset, |first| first.min(offset)));
    }

    /// Whether anything non-strict was seen.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.first_offset.is_none()
    }

    /// Whether at least one comment was seen.
    pub fn has_comments(&self) -> bool {
        self.comments > 0
    }

    /// The one warning for the whole file, located at the first occurrence; `None` for a
    /// strict JSON file.
    pub fn summary(&self, text: &str, lines: &LineIndex) -> Option<Diagnostic> {
        let first = self.first_offset?;
        let mut parts = Vec::new();
        if self.byte_order_mark {
            parts.push("a byte-order mark".to_owned());
        }
        if self.comments > 0 {
            parts.push(counted(self.comments, "comment", "comments"));
        }
        if self.trailing_commas > 0 {
            parts.push(counted(
                self.trailing_commas,
                "trailing comma",
                "trailing commas",
            ));
        }
        let (line, column) = lines.line_col(text, first);
        Some(
            Diagnostic::warning(
                Code::NonStrictJson,
                "",
                format!(
                    "the file is not strict JSON: it has {}",
                    join_english(&parts)
                ),
            )
            .with_help(NON_STRICT_HELP)
            .at(line, column),
        )
    }
}

/// `1 comment`, `3 comments`.
fn counted(count: usize, singular: &str, plural: &str) -> String {
    if count == 1 {
        format!("1 {singular}")
    } else {
        format!("{count} {plural}")
    }
}

/// `a`, `a and b`, `a, b and c`.
fn join_english(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(tally: &NonStrictTally, text: &str) -> Option<Diagnostic> {
        tally.summary(text, &LineIndex::new(text))
    }

    #[test]
    fn strict_files_get_no_warning() {
        let tally = NonStrictTally::new(ByteOrderMark::Absent);
        assert!(tally.is_empty());
        assert_eq!(summary_of(&tally, "{}"), None);
    }

    #[test]
    fn summarises_counts_at_the_first_occurrence() {
        let text = "{\n  \"a\": 1, // one\n  \"b\": 2, # two\n}";
        let mut tally = NonStrictTally::new(ByteOrderMark::Absent);
        tally.record(Leniency::TrailingComma, text.find(", #").expect("comma"));
        tally.record(Leniency::Comment, text.find("//").expect("comment"));
        tally.record(Leniency::Comment, text.find('#').expect("comment"));
        let warning = summary_of(&tally, text).expect("warning");
        assert_eq!(warning.code, Code::NonStrictJson);
        assert_eq!(
            warning.message,
            "the file is not strict JSON: it has 2 comments and 1 trailing comma"
        );
        assert_eq!((warning.line, warning.column), (Some(2), Some(11)));
        assert_eq!(warning.help.as_deref(), Some(NON_STRICT_HELP));
    }

    #[test]
    fn names_a_byte_order_mark() {
        let mut tally = NonStrictTally::new(ByteOrderMark::Present);
        tally.record(Leniency::Comment, 3);
        let warning = summary_of(&tally, "{} //").expect("warning");
        assert_eq!(
            warning.message,
            "the file is not strict JSON: it has a byte-order mark and 1 comment"
        );
        assert_eq!((warning.line, warning.column), (Some(1), Some(1)));
    }
}
