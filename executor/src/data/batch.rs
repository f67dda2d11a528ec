//! [`TokenBatch`]: rows of `seq_len + 1` tokens, with the input/target views a model needs.

/// A batch of token rows `[rows, seq_len + 1]`, row-major.
///
/// A row carries its own next-token targets: position `t` reads token `t` and predicts token
/// `t + 1`. Two equivalent ways to train on it:
///
/// * llm.c style: [`TokenBatch::inputs`] and [`TokenBatch::targets`], both `[rows, seq_len]`;
/// * Hugging Face style (`labels = input_ids`): feed the whole row, `[rows, seq_len + 1]`, and
///   leave the last position without a target. The reference fixtures store rows this way
///   (32 tokens, 31 predicted positions); causal attention makes both give the same loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    rows: usize,
    row_len: usize,
    tokens: Vec<u32>,
}

impl TokenBatch {
    /// A batch from `tokens`, which must hold `rows * row_len` ids (checked by the sources).
    pub(crate) fn from_parts(rows: usize, row_len: usize, tokens: Vec<u32>) -> Self {
        debug_assert_eq!(tokens.len(), rows * row_len);
        TokenBatch {
            rows,
            row_len,
            tokens,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tokens per row, `seq_len + 1`.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Predicted positions per row, `row_len - 1`.
    pub fn seq_len(&self) -> usize {
        self.row_len - 1
    }

    /// All tokens, `[rows, seq_len + 1]` row-major.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Row `index`, if it exists.
    pub fn row(&self, index: usize) -> Option<&[u32]> {
        self.tokens
            .get(index * self.row_len..(index + 1) * self.row_len)
    }

    /// The rows in order.
    pub fn iter_rows(&self) -> impl Iterator<Item = &[u32]> {
        self.tokens.chunks_exact(self.row_len)
    }

    /// Model inputs `[rows, seq_len]`: every row without its last token.
    pub fn inputs(&self) -> Vec<u32> {
        self.iter_rows()
            .flat_map(|row| &row[..row.len() - 1])
            .copied()
            .collect()
    }

    /// Next-token targets `[rows, seq_len]`: every row without its first token.
    pub fn targets(&self) -> Vec<u32> {
        self.iter_rows()
            .flat_map(|row| &row[1..])
            .copied()
            .collect()
    }

    /// The token buffer, `[rows, seq_len + 1]`.
    pub fn into_tokens(self) -> Vec<u32> {
        self.tokens
    }
}
