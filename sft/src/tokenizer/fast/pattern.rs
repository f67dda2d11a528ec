//! The split regexes of byte-level tokenizers, hand-written: [`Pattern::Gpt2`] (the
//! `ByteLevel` pre-tokenizer's own regex, also found in `Split`), [`Pattern::Llama3`]
//! (Llama 3's, and Qwen 2's with one digit a piece). Each is recognised by its exact source
//! text; any other regex is not a pattern here and its tokenizer keeps the crate's path.
//!
//! [`Splitter::piece_end`] returns where the leftmost-first (backtracking) match starting at
//! a position ends, alternative by alternative, as fancy-regex finds it. Every character
//! starts a match of these patterns (each class has an alternative), so the pieces of a text
//! are consecutive matches.

use super::classes::{CharClass, Classes, case_folds};

/// GPT-2's pattern, as `ByteLevel` (with `use_regex`) applies it.
pub const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern (digits in pieces of up to three).
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: Llama 3's with one digit a piece.
pub const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A supported split pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// [`GPT2`].
    Gpt2,
    /// [`LLAMA3`] (`digits` 3) or [`QWEN2`] (`digits` 1).
    Llama3 {
        /// The most digits in one piece.
        digits: usize,
    },
}

impl Pattern {
    /// The pattern whose source is exactly `source`.
    pub fn from_source(source: &str) -> Option<Self> {
        match source {
            GPT2 => Some(Self::Gpt2),
            LLAMA3 => Some(Self::Llama3 { digits: 3 }),
            QWEN2 => Some(Self::Llama3 { digits: 1 }),
            _ => None,
        }
    }
}

/// The letters of the contractions, with what each matches (its case folds for Llama 3).
#[derive(Debug, Clone)]
struct Contractions {
    letters: Vec<(char, Vec<char>)>,
}

impl Contractions {
    fn new(fold: bool) -> Result<Self, String> {
        let letters = "strvemld"
            .chars()
            .map(|letter| {
                let matches = if fold {
                    case_folds(letter)?
                } else {
                    vec![letter]
                };
                Ok((letter, matches))
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { letters })
    }

    fn is(&self, c: Option<char>, letter: char) -> bool {
        c.is_some_and(|c| {
            self.letters
                .iter()
                .any(|(l, matches)| *l == letter && matches.contains(&c))
        })
    }

    /// The length of `s|t|re|ve|m|ll|d` at the start of `rest`, if one is there.
    fn after_apostrophe(&self, rest: &str) -> Option<usize> {
        let mut chars = rest.chars();
        let first = chars.next();
        let second = chars.next();
        let width = |c: Option<char>| c.map_or(0, char::len_utf8);
        if ['s', 't', 'm', 'd'].iter().any(|&l| self.is(first, l)) {
            return Some(width(first));
        }
        let pair = (self.is(first, 'r') || self.is(first, 'v')) && self.is(second, 'e')
            || self.is(first, 'l') && self.is(second, 'l');
        pair.then(|| width(first) + width(second))
    }
}

/// Splits texts into the pieces of one [`Pattern`].
#[derive(Debug, Clone)]
pub struct Splitter {
    pattern: Pattern,
    classes: Classes,
    contractions: Contractions,
}

fn char_at(s: &str, at: usize) -> Option<char> {
    s.get(at..).and_then(|rest| rest.chars().next())
}

impl Splitter {
    /// A splitter for `pattern`.
    pub fn new(pattern: Pattern) -> Result<Self, String> {
        Ok(Self {
            pattern,
            classes: Classes::new()?,
            contractions: Contractions::new(matches!(pattern, Pattern::Llama3 { .. }))?,
        })
    }

    fn class(&self, c: Option<char>) -> Option<CharClass> {
        c.map(|c| self.classes.of(c))
    }

    /// The end of the run of `class` starting at `at`, at most `most` characters long.
    fn run(&self, s: &str, at: usize, class: CharClass, most: usize) -> usize {
        let mut end = at;
        for c in s[at..].chars().take(most) {
            if self.classes.of(c) != class {
                break;
            }
            end += c.len_utf8();
        }
        end
    }

    /// `\s+(?!\S)|\s+` at `at` (a whitespace character): the run, less its last character
    /// when a non-space follows and the run has more than one.
    fn spaces(&self, s: &str, at: usize) -> usize {
        let end = self.run(s, at, CharClass::Space, usize::MAX);
        let last = s[..end].char_indices().next_back().map_or(at, |(i, _)| i);
        if end == s.len() || last == at {
            end
        } else {
            last
        }
    }

    /// The end of `'s|'t|'re|'ve|'m|'ll|'d` when `c0` (ending at `after`) is its apostrophe.
    fn contraction(&self, s: &str, c0: char, after: usize) -> Option<usize> {
        (c0 == '\'')
            .then(|| self.contractions.after_apostrophe(&s[after..]))
            .flatten()
            .map(|width| after + width)
    }

    /// Where the match starting at `at` (a character boundary before the end) ends.
    pub fn piece_end(&self, s: &str, at: usize) -> usize {
        match self.pattern {
            Pattern::Gpt2 => self.gpt2_end(s, at),
            Pattern::Llama3 { digits } => self.llama3_end(s, at, digits),
        }
    }

    fn gpt2_end(&self, s: &str, at: usize) -> usize {
        let Some(c0) = char_at(s, at) else {
            return s.len();
        };
        let after = at + c0.len_utf8();
        if let Some(end) = self.contraction(s, c0, after) {
            return end;
        }
        // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the class after an optional space decides.
        let (start, class) = match (c0, self.class(char_at(s, after))) {
            (' ', Some(next)) if next != CharClass::Space => (after, next),
            _ => (at, self.classes.of(c0)),
        };
        if class == CharClass::Space {
            self.spaces(s, at)
        } else {
            self.run(s, start, class, usize::MAX)
        }
    }

    fn llama3_end(&self, s: &str, at: usize, digits: usize) -> usize {
        let Some(c0) = char_at(s, at) else {
            return s.len();
        };
        let after = at + c0.len_utf8();
        if let Some(end) = self.contraction(s, c0, after) {
            return end;
        }
        let class = self.classes.of(c0);
        let next = self.class(char_at(s, after));
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if class == CharClass::Letter {
            return self.run(s, at, CharClass::Letter, usize::MAX);
        }
        let prefix = class != CharClass::Number && c0 != '\r' && c0 != '\n';
        if prefix && next == Some(CharClass::Letter) {
            return self.run(s, after, CharClass::Letter, usize::MAX);
        }
        // `\p{N}{1,digits}`
        if class == CharClass::Number {
            return self.run(s, at, CharClass::Number, digits);
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let symbols = match (c0, next) {
            (' ', Some(CharClass::Other)) => Some(after),
            _ if class == CharClass::Other => Some(at),
            _ => None,
        };
        if let Some(start) = symbols {
            let end = self.run(s, start, CharClass::Other, usize::MAX);
            let newlines = s[end..]
                .bytes()
                .take_while(|&b| b == b'\r' || b == b'\n')
                .count();
            return end + newlines;
        }
        // `\s*[\r\n]+`: up to the run's last line break.
        let end = self.run(s, at, CharClass::Space, usize::MAX);
        if let Some(last) = s.as_bytes()[at..end]
            .iter()
            .rposition(|&b| b == b'\r' || b == b'\n')
        {
            return at + last + 1;
        }
        self.spaces(s, at)
    }
}
