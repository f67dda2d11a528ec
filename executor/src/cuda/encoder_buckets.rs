//! Host-side grouping of a batch's rows by token, for the deterministic `encoder_backward_wte`
//! kernel: one group per distinct token, its rows in ascending order, so the kernel adds each
//! token's gradient rows in exactly the order `encoder_backward` (CPU) does.

/// Rows grouped by token, in compressed (CSR) form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBuckets {
    /// The distinct tokens, ascending.
    pub tokens: Vec<u32>,
    /// `starts[k]..starts[k + 1]` indexes `rows` for token `tokens[k]`; `tokens.len() + 1` long.
    pub starts: Vec<i32>,
    /// Row indices (`b * T + t`), grouped by token, ascending within a group.
    pub rows: Vec<i32>,
}

impl TokenBuckets {
    /// Groups `tokens` (`B * T` of them, row-major) by value.
    ///
    /// Row indices are `i32` as the kernel reads them; a batch of 2^31 rows or more is far
    /// beyond any activation memory and is reported as `None`.
    pub fn new(tokens: &[u32]) -> Option<Self> {
        i32::try_from(tokens.len()).ok()?;
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        // Stable: equal tokens keep ascending row order.
        order.sort_by_key(|&row| tokens[row]);
        let mut buckets = TokenBuckets {
            tokens: Vec::new(),
            starts: Vec::new(),
            rows: Vec::with_capacity(tokens.len()),
        };
        for (i, &row) in order.iter().enumerate() {
            let token = tokens[row];
            if buckets.tokens.last() != Some(&token) {
                buckets.tokens.push(token);
                buckets.starts.push(i as i32);
            }
            buckets.rows.push(row as i32);
        }
        buckets.starts.push(order.len() as i32);
        Some(buckets)
    }

    /// The number of groups (the kernel's `gridDim.y`).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::encoder::encoder_backward;

    #[test]
    fn groups_rows_by_token_in_row_order() {
        let buckets = TokenBuckets::new(&[5, 2, 5, 7, 2, 5]).expect("small");
        assert_eq!(buckets.tokens, vec![2, 5, 7]);
        assert_eq!(buckets.starts, vec![0, 2, 5, 6]);
        assert_eq!(buckets.rows, vec![1, 4, 0, 2, 5, 3]);
        assert_eq!(buckets.len(), 3);
        assert!(TokenBuckets::new(&[]).is_some_and(|b| b.is_empty() && b.starts == vec![0]));
    }

    /// Doing what the kernel does, on the CPU, gives `encoder_backward`'s dwte bit for bit.
    #[test]
    fn summing_by_bucket_matches_the_cpu_encoder_backward() {
        let (c, seq_len, vocab) = (3, 4, 6);
        let tokens: Vec<u32> = vec![1, 4, 1, 1, 0, 4, 5, 1];
        let dout: Vec<f32> = (0..tokens.len() * c)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.37)
            .collect();
        let mut dwte = vec![0.25f32; vocab * c];
        let mut dwpe = vec![0.0f32; seq_len * c];
        encoder_backward(&mut dwte, &mut dwpe, &dout, &tokens, seq_len);

        let buckets = TokenBuckets::new(&tokens).expect("small");
        let mut kernel_dwte = vec![0.25f32; vocab * c];
        for k in 0..buckets.len() {
            for ch in 0..c {
                let dst = buckets.tokens[k] as usize * c + ch;
                let mut acc = kernel_dwte[dst];
                for &row in
                    &buckets.rows[buckets.starts[k] as usize..buckets.starts[k + 1] as usize]
                {
                    acc += dout[row as usize * c + ch];
                }
                kernel_dwte[dst] = acc;
            }
        }
        assert_eq!(kernel_dwte, dwte);
    }
}
