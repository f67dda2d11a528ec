//! JSON pointers (RFC 6901): the address every diagnostic and every provenance record uses.

/// Escape one reference token (`~` → `~0`, `/` → `~1`).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Undo [`escape_token`].
pub fn unescape_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// `base` extended by an object key.
pub fn child(base: &str, key: &str) -> String {
    format!("{base}/{}", escape_token(key))
}

/// `base` extended by an array index.
pub fn index(base: &str, index: usize) -> String {
    format!("{base}/{index}")
}

/// The unescaped tokens of a pointer (`"/a/b~1c"` → `["a", "b/c"]`); `""` has none.
pub fn tokens(pointer: &str) -> Vec<String> {
    if pointer.is_empty() {
        return Vec::new();
    }
    pointer.split('/').skip(1).map(unescape_token).collect()
}

/// The pointer of the parent value; the root's parent is the root.
pub fn parent(pointer: &str) -> &str {
    match pointer.rfind('/') {
        Some(at) => &pointer[..at],
        None => "",
    }
}

/// The last token, unescaped (`""` for the root).
pub fn last_token(pointer: &str) -> String {
    match pointer.rfind('/') {
        Some(at) => unescape_token(&pointer[at + 1..]),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip() {
        let p = child(&child("", "a/b"), "c~d");
        assert_eq!(p, "/a~1b/c~0d");
        assert_eq!(tokens(&p), vec!["a/b".to_string(), "c~d".to_string()]);
        assert_eq!(parent(&p), "/a~1b");
        assert_eq!(last_token(&p), "c~d");
        assert_eq!(tokens(""), Vec::<String>::new());
        assert_eq!(index("/x", 3), "/x/3");
    }
}
