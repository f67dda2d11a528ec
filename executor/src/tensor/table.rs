//! [`TensorTable`]: the layout of one flat buffer as a list of named, shaped spans.
//!
//! The table is the single source of truth for a buffer: its length is the sum of the entries,
//! each entry's offset is where the previous one ended. The planner can sum the same table to
//! predict memory; the executor allocates exactly `total_len()` elements.

use super::Span;

/// One named tensor inside a flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The tensor's name (for parameters: the Hugging Face name).
    pub name: String,
    /// Its shape, outermost dimension first (row-major).
    pub shape: Vec<usize>,
    /// Where it lives in the buffer.
    pub span: Span,
}

/// Named tensors packed back to back in one flat buffer, in insertion order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorTable {
    entries: Vec<TensorEntry>,
    total_len: usize,
}

impl TensorTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a tensor of `shape` after the last one and returns its span.
    pub fn push(&mut self, name: impl Into<String>, shape: &[usize]) -> Span {
        let len = shape.iter().product();
        let span = Span::new(self.total_len, len);
        self.entries.push(TensorEntry {
            name: name.into(),
            shape: shape.to_vec(),
            span,
        });
        self.total_len += len;
        span
    }

    /// All entries, in buffer order.
    pub fn entries(&self) -> &[TensorEntry] {
        &self.entries
    }

    /// The entry called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.iter().find(|entry| entry.name == name)
    }

    /// Number of elements the whole buffer needs.
    pub fn total_len(&self) -> usize {
        self.total_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_packed_back_to_back() {
        let mut table = TensorTable::new();
        let a = table.push("a", &[2, 3]);
        let b = table.push("b", &[4]);
        assert_eq!(a, Span::new(0, 6));
        assert_eq!(b, Span::new(6, 4));
        assert_eq!(table.total_len(), 10);
        assert_eq!(table.get("b").map(|e| e.shape.clone()), Some(vec![4]));
        assert!(table.get("c").is_none());
    }
}
