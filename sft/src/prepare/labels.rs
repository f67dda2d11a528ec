//! [`Labels`]: which tokens of a prepared row are trained on. A label is always its token's
//! id or `-100` (TRL's masks only ever hide tokens), so a row keeps one bit of meaning per
//! token, and none at all when every token is trained on (a text row, a whole conversation):
//! no second copy of the ids, eight bytes a token, is made for each row.

use super::row::IGNORE;

/// Which tokens of a row carry a label; compared by meaning (a mask with every token trained
/// on is [`Labels::Every`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Labels {
    /// Every token is its own label.
    Every,
    /// Token `i` is its own label where `mask[i]`, else `-100`; at least one is not.
    Masked(Vec<bool>),
}

impl Labels {
    /// The labels of `mask` (`true`: trained on).
    pub fn from_mask(mask: Vec<bool>) -> Self {
        if mask.iter().all(|&trained| trained) {
            Labels::Every
        } else {
            Labels::Masked(mask)
        }
    }

    /// Whether token `at` is trained on.
    pub fn is_trained(&self, at: usize) -> bool {
        match self {
            Labels::Every => true,
            Labels::Masked(mask) => mask.get(at).copied().unwrap_or(false),
        }
    }

    /// Whether no token of a row of `len` tokens is trained on.
    pub fn none_trained(&self, len: usize) -> bool {
        match self {
            Labels::Every => len == 0,
            Labels::Masked(mask) => !mask.iter().any(|&trained| trained),
        }
    }

    /// The label values of a row whose ids are `ids`: the id, or `-100`.
    pub fn values<'a>(&'a self, ids: &'a [u32]) -> impl Iterator<Item = i64> + 'a {
        ids.iter().enumerate().map(move |(at, &id)| {
            if self.is_trained(at) {
                i64::from(id)
            } else {
                IGNORE
            }
        })
    }

    /// Keeps the first `len` tokens' labels.
    pub fn truncate(&mut self, len: usize) {
        if let Labels::Masked(mask) = self {
            mask.truncate(len);
            if mask.iter().all(|&trained| trained) {
                *self = Labels::Every;
            }
        }
    }

    /// Appends `other`, the labels of `other_len` tokens, to these labels of `len` tokens.
    pub fn append(&mut self, len: usize, other: Labels, other_len: usize) {
        if *self == Labels::Every && other == Labels::Every {
            return;
        }
        let mut mask = match std::mem::replace(self, Labels::Every) {
            Labels::Every => vec![true; len],
            Labels::Masked(mask) => mask,
        };
        match other {
            Labels::Every => mask.extend(std::iter::repeat_n(true, other_len)),
            Labels::Masked(more) => mask.extend(more),
        }
        *self = Labels::from_mask(mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_mean_what_their_values_say() {
        let ids = [5, 6, 7];
        let masked = Labels::from_mask(vec![false, true, true]);
        assert_eq!(masked.values(&ids).collect::<Vec<_>>(), [IGNORE, 6, 7]);
        assert_eq!(Labels::from_mask(vec![true; 3]), Labels::Every);
        assert!(!masked.none_trained(3));
        assert!(Labels::from_mask(vec![false, false]).none_trained(2));
        assert!(!Labels::Every.none_trained(1) && Labels::Every.none_trained(0));

        let mut shortened = Labels::from_mask(vec![true, true, false]);
        shortened.truncate(2);
        assert_eq!(shortened, Labels::Every);

        let mut joined = Labels::Every;
        joined.append(2, Labels::Every, 1);
        assert_eq!(joined, Labels::Every);
        joined.append(3, Labels::from_mask(vec![false, true]), 2);
        let all: Vec<i64> = joined.values(&[1, 2, 3, 4, 5]).collect();
        assert_eq!(all, [1, 2, 3, IGNORE, 5]);
    }
}
