//! The Unicode classes the pre-tokenizer patterns test (`\p{L}`, `\p{N}`, `\s`), built from
//! regex-syntax's tables: the tables of the regex engine behind the `tokenizers` crate's
//! `fancy-regex` patterns, so that a character is a letter here exactly when it is one there.
//! Also the case folds of `(?i:...)` for the contraction letters.

use regex_syntax::hir::{Class, HirKind};

/// What a pattern sees in one character. The three named classes are disjoint in Unicode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CharClass {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s` (Unicode `White_Space`).
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

/// The class of every character: a table for the Basic Multilingual Plane, sorted ranges above.
#[derive(Debug, Clone)]
pub struct Classes {
    bmp: Vec<CharClass>,
    astral: Vec<(u32, u32, CharClass)>,
}

const BMP: u32 = 0x1_0000;

impl Classes {
    /// The tables of `\p{L}`, `\p{N}` and `\s`.
    pub fn new() -> Result<Self, String> {
        let mut bmp = vec![CharClass::Other; BMP as usize];
        let mut astral = Vec::new();
        for (pattern, class) in [
            (r"\p{L}", CharClass::Letter),
            (r"\p{N}", CharClass::Number),
            (r"\s", CharClass::Space),
        ] {
            for (start, end) in ranges(pattern)? {
                let (start, end) = (u32::from(start), u32::from(end));
                for code in start..=end.min(BMP - 1) {
                    bmp[code as usize] = class;
                }
                if end >= BMP {
                    astral.push((start.max(BMP), end, class));
                }
            }
        }
        astral.sort_unstable_by_key(|&(start, _, _)| start);
        Ok(Self { bmp, astral })
    }

    /// The class of `c`.
    #[inline]
    pub fn of(&self, c: char) -> CharClass {
        let code = u32::from(c);
        if code < BMP {
            return self.bmp[code as usize];
        }
        let after = self.astral.partition_point(|&(start, _, _)| start <= code);
        match after.checked_sub(1).map(|at| self.astral[at]) {
            Some((_, end, class)) if code <= end => class,
            _ => CharClass::Other,
        }
    }
}

/// The characters `(?i:letter)` matches (`s` also matches `ſ`, U+017F).
pub fn case_folds(letter: char) -> Result<Vec<char>, String> {
    let mut chars = Vec::new();
    for (start, end) in ranges(&format!("(?i:{letter})"))? {
        chars.extend(start..=end);
    }
    Ok(chars)
}

/// The ranges of a pattern that is one Unicode class.
fn ranges(pattern: &str) -> Result<Vec<(char, char)>, String> {
    let hir = regex_syntax::parse(pattern).map_err(|e| format!("{pattern}: {e}"))?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => Ok(class
            .ranges()
            .iter()
            .map(|range| (range.start(), range.end()))
            .collect()),
        other => Err(format!("{pattern} is not a character class: {other:?}")),
    }
}
