//! Bounded diagnostics: of each kind (code and severity) at most [`PER_KIND`] are reported;
//! the rest are counted in one closing diagnostic of the same kind, "and N more ...", placed
//! right after the last one shown. A file of a million duplicate keys or mistyped array items
//! then yields a page of output, not gigabytes.

use std::collections::HashMap;

use crate::diagnostics::{Code, Diagnostic, Severity};

/// The most diagnostics of one kind reported.
pub const PER_KIND: usize = 50;

/// Counts diagnostics of each kind as they are found, so a producer can skip building those
/// past the cap ([`Tally::admit`]) and close with [`Tally::summaries`].
#[derive(Debug, Default, Clone)]
pub struct Tally {
    seen: HashMap<(Code, Severity), usize>,
}

impl Tally {
    /// Counts one diagnostic of `code` and `severity`; `true` while it is within the cap.
    pub fn admit(&mut self, code: Code, severity: Severity) -> bool {
        let seen = self.seen.entry((code, severity)).or_insert(0);
        *seen += 1;
        *seen <= PER_KIND
    }

    /// How many of `code` and `severity` were past the cap.
    pub fn omitted(&self, code: Code, severity: Severity) -> usize {
        self.seen
            .get(&(code, severity))
            .map_or(0, |&n| n.saturating_sub(PER_KIND))
    }
}

/// The closing diagnostic for `omitted` more of the kind of `last` (the last one shown), at
/// its place.
pub fn and_more(last: &Diagnostic, omitted: usize) -> Diagnostic {
    let noun = match last.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "note",
    };
    let mut summary = Diagnostic::new(
        last.severity,
        last.code,
        last.pointer.clone(),
        format!(
            "and {omitted} more {}{noun}(s) like the above, not shown (at most {PER_KIND} of \
             each kind are)",
            last.code.as_str().to_owned() + " "
        ),
    )
    .with_help("fix the ones shown and check again");
    summary.line = last.line;
    summary.column = last.column;
    summary
}

/// Keeps at most [`PER_KIND`] diagnostics of each kind, in order, each kind's count of the
/// rest in an [`and_more`] right after its last one kept. Summaries already there count
/// for what they say, once.
pub fn cap_each_kind(diagnostics: &mut Vec<Diagnostic>) {
    let mut tally = Tally::default();
    let mut kept_last: HashMap<(Code, Severity), usize> = HashMap::new();
    let mut kept: Vec<Diagnostic> = Vec::with_capacity(diagnostics.len().min(1024));
    let mut carried: HashMap<(Code, Severity), usize> = HashMap::new();
    for diagnostic in diagnostics.drain(..) {
        let kind = (diagnostic.code, diagnostic.severity);
        if let Some(n) = summary_count(&diagnostic) {
            *carried.entry(kind).or_insert(0) += n;
            continue;
        }
        if tally.admit(kind.0, kind.1) {
            kept_last.insert(kind, kept.len());
            kept.push(diagnostic);
        }
    }
    let mut closing: Vec<(usize, Diagnostic)> = kept_last
        .iter()
        .filter_map(|(&kind, &at)| {
            let omitted = tally.omitted(kind.0, kind.1) + carried.get(&kind).copied().unwrap_or(0);
            (omitted > 0).then(|| (at, and_more(&kept[at], omitted)))
        })
        .collect();
    closing.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    for (at, summary) in closing {
        kept.insert(at + 1, summary);
    }
    *diagnostics = kept;
}

/// The count an [`and_more`] diagnostic stands for.
fn summary_count(diagnostic: &Diagnostic) -> Option<usize> {
    let rest = diagnostic.message.strip_prefix("and ")?;
    let (count, tail) = rest.split_once(' ')?;
    if !tail.starts_with("more ") || !tail.contains("like the above, not shown") {
        return None;
    }
    count.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many(code: Code, n: usize) -> Vec<Diagnostic> {
        (0..n)
            .map(|i| Diagnostic::error(code, format!("/a/{i}"), format!("problem {i}")))
            .collect()
    }

    #[test]
    fn each_kind_is_cut_at_the_cap_and_counted_once() {
        let mut found = many(Code::DuplicateKey, 1000);
        found.extend(many(Code::WrongType, 3));
        cap_each_kind(&mut found);
        assert_eq!(found.len(), PER_KIND + 1 + 3);
        let summary = &found[PER_KIND];
        assert_eq!(summary.code, Code::DuplicateKey);
        assert!(
            summary
                .message
                .starts_with("and 950 more duplicate-key error(s)"),
            "{}",
            summary.message
        );
        assert_eq!(summary.pointer, format!("/a/{}", PER_KIND - 1));
        // Capping again changes nothing.
        let again = found.clone();
        cap_each_kind(&mut found);
        assert_eq!(found, again);
    }
}
