//! [`Span`]: where one tensor lives inside a flat buffer, and how to borrow several at once.

/// A contiguous run of elements inside a flat buffer: `buffer[offset .. offset + len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Index of the first element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// The span `offset .. offset + len`.
    pub const fn new(offset: usize, len: usize) -> Self {
        Self { offset, len }
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// The elements of `buffer` this span covers.
    ///
    /// # Panics
    /// When the span lies outside `buffer` (a layout bug, not bad input).
    pub fn of<'a, T>(&self, buffer: &'a [T]) -> &'a [T] {
        &buffer[self.offset..self.end()]
    }

    /// The elements of `buffer` this span covers, mutably.
    ///
    /// # Panics
    /// When the span lies outside `buffer` (a layout bug, not bad input).
    pub fn of_mut<'a, T>(&self, buffer: &'a mut [T]) -> &'a mut [T] {
        &mut buffer[self.offset..self.end()]
    }
}

/// Borrows `N` pairwise-disjoint spans of one buffer mutably at the same time, in the order given.
///
/// Safe code (successive `split_at_mut`), so layer functions can read their inputs and write
/// their outputs inside one arena. Empty spans are allowed anywhere.
///
/// # Panics
/// When two non-empty spans overlap or one lies outside `buffer`: both are layout bugs.
pub fn split_spans_mut<'a, T, const N: usize>(
    buffer: &'a mut [T],
    spans: [Span; N],
) -> [&'a mut [T]; N] {
    let mut order: [usize; N] = std::array::from_fn(|i| i);
    order.sort_by_key(|&i| spans[i].offset);
    let mut pieces: [Option<&'a mut [T]>; N] = std::array::from_fn(|_| None);
    let mut rest = buffer;
    let mut consumed = 0;
    for &i in &order {
        let span = spans[i];
        if span.len == 0 {
            pieces[i] = Some(&mut []);
            continue;
        }
        assert!(
            span.offset >= consumed,
            "overlapping spans: {span:?} starts before {consumed}"
        );
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(span.offset - consumed);
        let (piece, tail) = tail.split_at_mut(span.len);
        pieces[i] = Some(piece);
        rest = tail;
        consumed = span.end();
    }
    pieces.map(|piece| piece.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_returns_pieces_in_request_order() {
        let mut buffer: Vec<u32> = (0..10).collect();
        let [a, b, c] = split_spans_mut(
            &mut buffer,
            [Span::new(6, 2), Span::new(0, 3), Span::new(3, 0)],
        );
        assert_eq!(a, &[6, 7]);
        assert_eq!(b, &[0, 1, 2]);
        assert!(c.is_empty());
        a[0] = 60;
        b[2] = 20;
        assert_eq!(buffer[6], 60);
        assert_eq!(buffer[2], 20);
    }

    #[test]
    #[should_panic(expected = "overlapping")]
    fn split_rejects_overlap() {
        let mut buffer = [0u8; 8];
        let _ = split_spans_mut(&mut buffer, [Span::new(0, 4), Span::new(3, 2)]);
    }
}
