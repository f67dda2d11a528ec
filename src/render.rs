//! Human-readable diagnostics, in the style of rustc:
//!
//! ```text
//! error[unknown-key]: unknown key `overlap_com` in `zero_optimization`
//!   --> ds_config.json:12:5 (/zero_optimization/overlap_com)
//!    |
//! 12 |     "overlap_com": true,
//!    |     ^^^^^^^^^^^^^
//!    = help: did you mean `overlap_comm`?
//! ```
//!
//! The carets underline the key (object member) or value the diagnostic's pointer names,
//! limited to the diagnostic's line; when the diagnostic was located somewhere its pointer does
//! not lead (a comment, a syntax error), they underline the token at its column. No colour
//! codes. A diagnostic without a position has no snippet.

use dsplan_planner::source::SourceFile;
use dsplan_planner::{Diagnostic, Severity};

/// Spaces a tab takes in a snippet, so carets line up under it.
const TAB_WIDTH: usize = 4;

/// Render diagnostics of a parsed file, each with the line it points at.
pub fn human(file: &SourceFile, diagnostics: &[Diagnostic]) -> String {
    render_all(file.path(), diagnostics, |diagnostic| {
        file_snippet(file, diagnostic)
    })
}

/// Render diagnostics of a file that could not be parsed (no [`SourceFile`]): position and
/// pointer, no snippet.
pub fn human_unlocated(path: &str, diagnostics: &[Diagnostic]) -> String {
    render_all(path, diagnostics, |_| None)
}

/// Render the fatal diagnostics of a file that could not be parsed, with the line each points
/// at taken from the file's raw `bytes` (a leading byte-order mark is skipped, as the parser
/// does; invalid UTF-8 shows as `�`). The carets underline the token at the column.
pub fn human_with_bytes(path: &str, bytes: &[u8], diagnostics: &[Diagnostic]) -> String {
    let body = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = String::from_utf8_lossy(body);
    let lines: Vec<&str> = text.split('\n').collect();
    let ascii: Vec<bool> = lines.iter().map(|line| line.is_ascii()).collect();
    render_all(path, diagnostics, |diagnostic| {
        let line = diagnostic.line?;
        let column = diagnostic.column?;
        let index = line.checked_sub(1)?;
        let line_text = lines.get(index)?;
        let line_text = line_text.strip_suffix('\r').unwrap_or(line_text);
        let at = byte_of_column(line_text, column, ascii[index]);
        Some(Snippet::at_token(line, line_text, at))
    })
}

/// The byte offset of a 1-based character `column` in `line` (its end when past it); on an
/// ASCII line without walking it.
fn byte_of_column(line: &str, column: usize, ascii: bool) -> usize {
    let skipped = column.saturating_sub(1);
    if ascii {
        return skipped.min(line.len());
    }
    line.char_indices()
        .nth(skipped)
        .map_or(line.len(), |(at, _)| at)
}

/// One line closing a file's report: `ds_config.json: valid` or
/// `ds_config.json: invalid (2 errors, 1 warning, 3 infos)`.
pub fn file_summary(path: &str, diagnostics: &[Diagnostic]) -> String {
    let count = |severity| {
        diagnostics
            .iter()
            .filter(|d| d.severity == severity)
            .count()
    };
    let parts: Vec<String> = [
        (count(Severity::Error), "error"),
        (count(Severity::Warning), "warning"),
        (count(Severity::Info), "info"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, noun)| format!("{n} {noun}{}", if n == 1 { "" } else { "s" }))
    .collect();
    let verdict = if count(Severity::Error) > 0 {
        "invalid"
    } else {
        "valid"
    };
    if parts.is_empty() {
        format!("{}: {verdict}\n", bounded(path))
    } else {
        format!("{}: {verdict} ({})\n", bounded(path), parts.join(", "))
    }
}

/// Characters of a line shown before the column a diagnostic points at; longer lines are cut
/// (marked with `…`), so a diagnostic on a 256 MB line prints at most 160 characters of it.
const CONTEXT_BEFORE: usize = 60;

/// Characters shown from the column on (the underlined token included).
const CONTEXT_AFTER: usize = 100;

/// The excerpt shown under a diagnostic: a window of one line, escaped, and where the carets go.
struct Snippet {
    /// 1-based line number.
    line: usize,
    /// The excerpt as printed: tabs expanded, control characters escaped, cut ends marked.
    shown: String,
    /// Screen columns before the first caret.
    indent: usize,
    /// How many carets (at least 1).
    carets: usize,
}

impl Snippet {
    /// Underline the token that starts at byte offset `at` (a character boundary) of `text`.
    fn at_token(line: usize, text: &str, at: usize) -> Self {
        let width = token_width(window_after(text, at));
        Snippet::window(line, text, at, width)
    }

    /// The window of `text` around byte offset `at` (a character boundary), underlining
    /// `width` characters from there (no further than the window).
    fn window(line: usize, text: &str, at: usize, width: usize) -> Self {
        let (head, tail) = text.split_at(at.min(text.len()));
        let mut before: Vec<char> = head.chars().rev().take(CONTEXT_BEFORE + 1).collect();
        let cut_before = before.len() > CONTEXT_BEFORE;
        before.truncate(CONTEXT_BEFORE);
        before.reverse();
        let mut after: Vec<char> = tail.chars().take(CONTEXT_AFTER + 1).collect();
        let cut_after = after.len() > CONTEXT_AFTER;
        after.truncate(CONTEXT_AFTER);
        let mut shown = String::new();
        if cut_before {
            shown.push('…');
        }
        before.iter().for_each(|&c| push_shown(&mut shown, c));
        let indent = shown.chars().count();
        let mut underlined = String::new();
        after
            .iter()
            .take(width.max(1))
            .for_each(|&c| push_shown(&mut underlined, c));
        after.iter().for_each(|&c| push_shown(&mut shown, c));
        if cut_after {
            shown.push('…');
        }
        Snippet {
            line,
            shown,
            indent,
            carets: underlined.chars().count().max(1),
        }
    }
}

/// At most the window's worth of `text` from byte offset `at`, for measuring the token there.
fn window_after(text: &str, at: usize) -> &str {
    let tail = text.get(at..).unwrap_or("");
    let end = tail
        .char_indices()
        .nth(CONTEXT_AFTER)
        .map_or(tail.len(), |(end, _)| end);
    &tail[..end]
}

/// Appends `c` as printed in an excerpt: a tab as spaces, a control character escaped.
fn push_shown(out: &mut String, c: char) {
    if c == '\t' {
        out.push_str(&" ".repeat(TAB_WIDTH));
    } else {
        push_escaped(out, c);
    }
}

/// Appends `c`, or its escape `\u{1b}` when printing it could drive the terminal (a C0 or C1
/// control character, DEL, or a bidirectional override).
fn push_escaped(out: &mut String, c: char) {
    if c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') {
        out.push_str(&format!("\\u{{{:x}}}", c as u32));
    } else {
        out.push(c);
    }
}

/// `text` with every control character escaped ([`push_escaped`]): for anything printed that
/// came from the user's input (keys and values quoted in messages, paths, pointers).
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let safe = |c: char| {
        !(c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'))
    };
    if text.chars().all(safe) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    text.chars().for_each(|c| push_escaped(&mut out, c));
    std::borrow::Cow::Owned(out)
}

/// `message` with every control character but a newline escaped ([`escape_controls`]): for a
/// whole message printed at a sink (`error: ...`), which may hold paths, names and file contents
/// from the user. The one escaping rule of everything dsplan prints; escaping twice changes
/// nothing.
pub fn escape_message(message: &str) -> String {
    message
        .split('\n')
        .map(|line| escape_controls(line).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Characters of a message, help, path or pointer printed; the rest is cut (marked with `…`),
/// so a key of a million characters quoted in a message does not flood the terminal.
const MAX_TEXT: usize = 1000;

/// `text` escaped ([`escape_controls`]) and cut to [`MAX_TEXT`] characters.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT) {
        None => escape_controls(text).into_owned(),
        Some((end, _)) => format!("{}…", escape_controls(&text[..end])),
    }
}

/// The snippet for a diagnostic of a parsed file: the pointer's key or value span when the
/// diagnostic sits at its start, the token at the column otherwise.
fn file_snippet(file: &SourceFile, diagnostic: &Diagnostic) -> Option<Snippet> {
    let line = diagnostic.line?;
    let column = diagnostic.column?;
    let line_span = file.line_span(line)?;
    let line_text = file.line_text(line)?;
    let anchor = file.anchor_span(&diagnostic.pointer);
    let Some(at) = file.offset_of(line, column) else {
        return Some(Snippet::at_token(line, line_text, line_text.len()));
    };
    if anchor.start != at {
        return Some(Snippet::at_token(line, line_text, at - line_span.start));
    }
    let end = anchor.end.min(line_span.end).max(anchor.start);
    let at = anchor.start - line_span.start;
    let width = file
        .text()
        .get(anchor.start..end)
        .map_or(1, |s| window_after(s, 0).chars().count());
    Some(Snippet::window(line, line_text, at, width))
}

/// Render every diagnostic, a blank line between two.
fn render_all(
    path: &str,
    diagnostics: &[Diagnostic],
    snippet: impl Fn(&Diagnostic) -> Option<Snippet>,
) -> String {
    diagnostics
        .iter()
        .map(|diagnostic| render_one(path, diagnostic, snippet(diagnostic)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_one(path: &str, diagnostic: &Diagnostic, snippet: Option<Snippet>) -> String {
    let gutter = diagnostic.line.map_or(1, |line| line.to_string().len());
    let pad = " ".repeat(gutter);
    let mut out = format!(
        "{}[{}]: {}\n",
        diagnostic.severity.as_str(),
        diagnostic.code.as_str(),
        bounded(&diagnostic.message)
    );
    let mut location = bounded(path);
    if let (Some(line), Some(column)) = (diagnostic.line, diagnostic.column) {
        location.push_str(&format!(":{line}:{column}"));
    }
    if !diagnostic.pointer.is_empty() {
        location.push_str(&format!(" ({})", bounded(&diagnostic.pointer)));
    }
    out.push_str(&format!("{pad}--> {location}\n"));
    if let Some(snippet) = snippet {
        out.push_str(&format!("{pad} |\n"));
        out.push_str(format!("{} | {}", snippet.line, snippet.shown).trim_end());
        out.push('\n');
        out.push_str(&format!(
            "{pad} | {}{}\n",
            " ".repeat(snippet.indent),
            "^".repeat(snippet.carets)
        ));
    }
    if let Some(help) = &diagnostic.help {
        out.push_str(&format!("{pad} = help: {}\n", bounded(help)));
    }
    out
}

/// How many characters the token at the start of `rest` spans: a string literal to its closing
/// quote, a comment to its end, a word or number, else one character (also at the end of a
/// line, where a missing `,` is reported).
fn token_width(rest: &str) -> usize {
    let chars: Vec<char> = rest.chars().collect();
    let width = match chars.as_slice() {
        [] => 1,
        ['"', ..] => {
            let mut escaped = false;
            let mut end = chars.len();
            for (at, &c) in chars.iter().enumerate().skip(1) {
                match c {
                    '"' if !escaped => {
                        end = at + 1;
                        break;
                    }
                    '\\' => escaped = !escaped,
                    _ => escaped = false,
                }
            }
            end
        }
        ['/', '/', ..] | ['#', ..] => rest.trim_end().chars().count(),
        ['/', '*', ..] => match rest.find("*/") {
            Some(at) => rest[..at + 2].chars().count(),
            None => rest.trim_end().chars().count(),
        },
        [c, ..] if is_word_char(*c) => chars.iter().take_while(|c| is_word_char(**c)).count(),
        _ => 1,
    };
    width.max(1)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsplan_planner::{Code, Severity};

    const CONFIG: &str = r#"{
  "train_batch_size": 16,
  "gradient_accumulation_steps": 1,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 1e-4, "betas": [0.9, 1.5]}
  },
  "fp16": {"enabled": true},
  "zero_optimization": {
    "stage": 2,
    "overlap_comm": true,
    "overlap_com": true,
    "reduce_bucket_size": 5e8
  }
}
"#;

    fn parsed(text: &str) -> (SourceFile, Vec<Diagnostic>) {
        SourceFile::parse_with_duplicates("ds_config.json", text.as_bytes()).expect("parses")
    }

    fn located(file: &SourceFile, mut diagnostic: Diagnostic) -> Diagnostic {
        file.locate(&mut diagnostic);
        diagnostic
    }

    #[test]
    fn renders_a_key_with_its_help() {
        let (file, _) = parsed(CONFIG);
        let diagnostic = located(
            &file,
            Diagnostic::error(
                Code::UnknownKey,
                "/zero_optimization/overlap_com",
                "unknown key `overlap_com` in `zero_optimization`",
            )
            .with_help("did you mean `overlap_comm`?"),
        );
        assert_eq!(
            human(&file, &[diagnostic]),
            "error[unknown-key]: unknown key `overlap_com` in `zero_optimization`\n\
             \x20 --> ds_config.json:12:5 (/zero_optimization/overlap_com)\n\
             \x20  |\n\
             12 |     \"overlap_com\": true,\n\
             \x20  |     ^^^^^^^^^^^^^\n\
             \x20  = help: did you mean `overlap_comm`?\n"
        );
    }

    #[test]
    fn renders_an_array_item_and_a_missing_key_at_its_parent() {
        let (file, _) = parsed(CONFIG);
        let item = located(
            &file,
            Diagnostic::error(
                Code::OutOfRange,
                "/optimizer/params/betas/1",
                "beta2 must be < 1",
            ),
        );
        let missing = located(
            &file,
            Diagnostic::warning(Code::MissingKey, "/fp16/loss_scale", "no `loss_scale`"),
        );
        assert_eq!(
            human(&file, &[item, missing]),
            "error[out-of-range]: beta2 must be < 1\n \
             --> ds_config.json:6:43 (/optimizer/params/betas/1)\n  \
             |\n\
             6 |     \"params\": {\"lr\": 1e-4, \"betas\": [0.9, 1.5]}\n  \
             |                                           ^^^\n\
             \n\
             warning[missing-key]: no `loss_scale`\n \
             --> ds_config.json:8:3 (/fp16/loss_scale)\n  \
             |\n\
             8 |   \"fp16\": {\"enabled\": true},\n  \
             |   ^^^^^^\n"
        );
    }

    #[test]
    fn a_value_spanning_lines_is_underlined_on_its_first_line_only() {
        let (file, _) = parsed(CONFIG);
        let root = located(
            &file,
            Diagnostic::error(Code::BatchSizeMismatch, "", "16 != 1 * 1 * 8"),
        );
        assert_eq!(
            human(&file, &[root]),
            "error[batch-size-mismatch]: 16 != 1 * 1 * 8\n \
             --> ds_config.json:1:1\n  \
             |\n\
             1 | {\n  \
             | ^\n"
        );
    }

    #[test]
    fn a_diagnostic_without_position_has_no_snippet() {
        let (file, _) = parsed(CONFIG);
        let diagnostic = Diagnostic::new(
            Severity::Info,
            Code::NeedsResolution,
            "/train_batch_size",
            "`auto` is filled by the Trainer",
        );
        assert_eq!(
            human(&file, &[diagnostic]),
            "info[needs-resolution]: `auto` is filled by the Trainer\n \
             --> ds_config.json (/train_batch_size)\n"
        );
    }

    #[test]
    fn parser_warnings_underline_the_token_they_are_located_at() {
        let text = "{\n\t\"a\": 1, // why not\n  \"a\": 2\n}\n";
        let (file, diagnostics) = parsed(text);
        assert_eq!(
            human(&file, &diagnostics),
            "warning[non-strict-json]: the file is not strict JSON: it has 1 comment\n \
             --> ds_config.json:2:10\n  \
             |\n\
             2 |     \"a\": 1, // why not\n  \
             |             ^^^^^^^^^^\n  \
             = help: DeepSpeed's loader accepts this, but the Hugging Face Trainer and \
             accelerate read the file with strict JSON and will reject it\n\
             \n\
             error[duplicate-key]: duplicate key `a` at the top level: first defined on line 2\n \
             --> ds_config.json:3:3 (/a)\n  \
             |\n\
             3 |   \"a\": 2\n  \
             |   ^^^\n  \
             = help: DeepSpeed rejects a file with duplicate keys; other readers silently keep \
             the last value (dsplan does too): keep only one\n"
        );
    }

    #[test]
    fn fatal_errors_render_without_a_file() {
        let text =
            "{\n  \"zero_optimization\": {\n    \"stage\": 3\n    \"offload_param\": {}\n  }\n}\n";
        let errors = SourceFile::parse("ds_config.json", text.as_bytes()).expect_err("fatal");
        assert_eq!(
            human_unlocated("ds_config.json", &errors),
            "error[syntax-error]: expected `,` or `}` after the value of `stage`, found \
             `\"offload_param\"`\n \
             --> ds_config.json:3:15 (/zero_optimization/stage)\n  \
             = help: add a comma here\n"
        );
        assert_eq!(
            human_with_bytes("ds_config.json", text.as_bytes(), &errors),
            "error[syntax-error]: expected `,` or `}` after the value of `stage`, found \
             `\"offload_param\"`\n \
             --> ds_config.json:3:15 (/zero_optimization/stage)\n  \
             |\n\
             3 |     \"stage\": 3\n  \
             |               ^\n  \
             = help: add a comma here\n"
        );
    }

    #[test]
    fn fatal_errors_underline_the_token_found() {
        let text = b"\xEF\xBB\xBF{\"fp16\": {\"enabled\": True}}";
        let errors = SourceFile::parse("c.json", text).expect_err("fatal");
        assert_eq!(
            human_with_bytes("c.json", text, &errors),
            "error[syntax-error]: expected a value for `enabled`, found `True`\n \
             --> c.json:1:22 (/fp16/enabled)\n  \
             |\n\
             1 | {\"fp16\": {\"enabled\": True}}\n  \
             |                      ^^^^\n  \
             = help: JSON booleans are lowercase: `true`\n"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_show_a_replacement_character() {
        let text = b"{\"a\": \"x\xFFy\"}";
        let errors = SourceFile::parse("c.json", text).expect_err("fatal");
        let rendered = human_with_bytes("c.json", text, &errors);
        assert!(
            rendered.contains("1 | {\"a\": \"x\u{FFFD}y\"}\n  |         ^\n"),
            "{rendered}"
        );
    }

    #[test]
    fn gutters_widen_with_the_line_number() {
        let text = format!("{{{}\n\"x\": tru}}", "\n".repeat(120));
        let errors = SourceFile::parse("c.json", text.as_bytes()).expect_err("fatal");
        let rendered = human_with_bytes("c.json", text.as_bytes(), &errors);
        assert!(
            rendered
                .contains("\n   --> c.json:122:6 (/x)\n    |\n122 | \"x\": tru}\n    |      ^^^\n"),
            "{rendered}"
        );
    }

    #[test]
    fn a_long_line_shows_a_window_around_the_column() {
        let long = "x".repeat(1_000_000);
        let text = format!("{{\"a\": \"{long}\", \"b\": 1, \"b\": 2}}");
        let errors = SourceFile::parse("c.json", text.as_bytes()).expect_err("duplicate");
        let rendered = human_with_bytes("c.json", text.as_bytes(), &errors);
        assert!(rendered.len() < 1000, "{} bytes", rendered.len());
        assert!(
            rendered.contains(&format!(
                "1 | …{}\", \"b\": 1, \"b\": 2}}\n",
                "x".repeat(49)
            )),
            "{rendered}"
        );
        assert!(
            rendered.contains(&format!("  | {}^^^\n", " ".repeat(61))),
            "{rendered}"
        );
        let (file, mut found) =
            SourceFile::parse_with_duplicates("c.json", text.as_bytes()).expect("parses");
        found.push(Diagnostic::error(Code::WrongType, "/a", "too long"));
        file.locate_all(&mut found);
        let rendered = human(&file, &found);
        assert!(rendered.len() < 2000, "{} bytes", rendered.len());
        assert!(rendered.contains("1 | {\"a\": \"xxxx"), "{rendered}");
        assert!(rendered.contains("xxxxxx…\n"), "{rendered}");
    }

    #[test]
    fn control_characters_from_the_input_are_escaped() {
        let text = "{\"\\u001b]0;pwned\\u0007\\u001b[2J\": 1, \"z\": 1\u{7}}";
        let fatal = SourceFile::parse("c\u{1b}.json", text.as_bytes()).expect_err("bell");
        let mut shown = human_with_bytes("c\u{1b}.json", text.as_bytes(), &fatal);
        let (file, _) = parsed("{\"\\u001b]0;pwned\\u0007\\u001b[2J\": 1}");
        let key = "\u{1b}]0;pwned\u{7}\u{1b}[2J";
        let mut unknown = Diagnostic::error(
            Code::UnknownKey,
            format!("/{key}"),
            format!("unknown key `{key}`"),
        )
        .with_help(format!("remove `{key}`"));
        file.locate(&mut unknown);
        shown.push_str(&human(&file, &[unknown]));
        shown.push_str(&file_summary("c\u{1b}.json", &[]));
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{shown:?}"
        );
        assert!(
            shown.contains("error[unknown-key]: unknown key `\\u{1b}]0;pwned\\u{7}\\u{1b}[2J`\n"),
            "{shown}"
        );
        assert!(
            shown.contains("(/\\u{1b}]0;pwned\\u{7}\\u{1b}[2J)"),
            "{shown}"
        );
        assert!(shown.contains("1 | {\"\\u001b]0;pwned"), "{shown}");
        assert!(shown.contains("\"z\": 1\\u{7}}\n"), "{shown}");
        assert!(shown.contains("c\\u{1b}.json: valid\n"), "{shown}");
    }

    #[test]
    fn token_widths() {
        assert_eq!(token_width(""), 1);
        assert_eq!(token_width("\"a\\\"b\": 1"), 6);
        assert_eq!(token_width("\"open"), 5);
        assert_eq!(token_width("// note  "), 7);
        assert_eq!(token_width("/* x */ 1"), 7);
        assert_eq!(token_width("1e-4, 2"), 4);
        assert_eq!(token_width("}"), 1);
    }
}
