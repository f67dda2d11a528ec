//! Where every value is: a tree shaped like the document, each node holding its key and value
//! spans, looked up by JSON pointer. A repeated key replaces the earlier subtree, as the value
//! does, so the tree always describes exactly the value that was kept.

use super::Located;
use crate::json_pointer;
use std::collections::HashMap;

/// The position of one value and of everything inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpanNode {
    /// Key and value spans of this value.
    pub located: Located,
    /// The positions of the items or members inside it.
    pub children: Children,
}

/// The positions inside a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Children {
    /// A string, number, boolean or null.
    Scalar,
    /// The items of an array, in order.
    Array(Vec<SpanNode>),
    /// The members of an object, by key.
    Object(HashMap<String, SpanNode>),
}

impl SpanNode {
    /// The node at `pointer`, if that value exists.
    pub fn find(&self, pointer: &str) -> Option<&Located> {
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return None;
        }
        let mut node = self;
        for token in json_pointer::tokens(pointer) {
            node = node.child(&token)?;
        }
        Some(&node.located)
    }

    /// The node at `pointer` or, when it does not exist, at its nearest existing ancestor.
    pub fn nearest(&self, pointer: &str) -> &Located {
        let mut node = self;
        if pointer.starts_with('/') {
            for token in json_pointer::tokens(pointer) {
                match node.child(&token) {
                    Some(child) => node = child,
                    None => break,
                }
            }
        }
        &node.located
    }

    /// The member or item named by one unescaped pointer token.
    fn child(&self, token: &str) -> Option<&SpanNode> {
        match &self.children {
            Children::Scalar => None,
            Children::Object(members) => members.get(token),
            Children::Array(items) => items.get(array_index(token)?),
        }
    }
}

/// An RFC 6901 array index: `0` or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    let canonical = !token.is_empty()
        && token.bytes().all(|byte| byte.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if canonical { token.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Span;

    fn scalar(start: usize, end: usize, key: Option<(usize, usize)>) -> SpanNode {
        SpanNode {
            located: Located {
                key: key.map(|(start, end)| Span { start, end }),
                value: Span { start, end },
            },
            children: Children::Scalar,
        }
    }

    /// The tree of `{"a/b": [7, 8]}`.
    fn tree() -> SpanNode {
        let items = vec![scalar(10, 11, None), scalar(13, 14, None)];
        let mut members = HashMap::new();
        members.insert(
            "a/b".to_owned(),
            SpanNode {
                located: Located {
                    key: Some(Span { start: 1, end: 6 }),
                    value: Span { start: 8, end: 15 },
                },
                children: Children::Array(items),
            },
        );
        SpanNode {
            located: Located {
                key: None,
                value: Span { start: 0, end: 16 },
            },
            children: Children::Object(members),
        }
    }

    #[test]
    fn finds_values_by_pointer() {
        let tree = tree();
        assert_eq!(tree.find("").map(|l| l.value.start), Some(0));
        assert_eq!(
            tree.find("/a~1b").and_then(|l| l.key).map(|k| k.start),
            Some(1)
        );
        assert_eq!(tree.find("/a~1b/1").map(|l| l.value.start), Some(13));
        assert_eq!(tree.find("/a~1b/2"), None);
        assert_eq!(tree.find("/a~1b/01"), None);
        assert_eq!(tree.find("/a~1b/-"), None);
        assert_eq!(tree.find("/a~1b/0/x"), None);
        assert_eq!(tree.find("/missing"), None);
        assert_eq!(tree.find("a~1b"), None);
    }

    #[test]
    fn nearest_falls_back_to_the_closest_ancestor() {
        let tree = tree();
        assert_eq!(tree.nearest("/a~1b/0/deeper").value.start, 10);
        assert_eq!(tree.nearest("/a~1b/9").value.start, 8);
        assert_eq!(tree.nearest("/missing/key").value.start, 0);
        assert_eq!(tree.nearest("garbage").value.start, 0);
    }
}
