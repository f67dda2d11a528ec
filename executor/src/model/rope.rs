//! Rotary position embeddings, `transformers`' rotate-half (GPT-NeoX) layout: dimension `i` of
//! a head is paired with `i + hs/2`, and the pair `(a, b)` at position `t` becomes
//! `(a cos - b sin, b cos + a sin)` with the angle `t * inv_freq[i]`.
//!
//! [`Rope`] is the configuration (`rope_theta` and `rope_scaling` / `rope_parameters`);
//! [`RopeTable`] the cosines and sines of one sequence length, computed in f32 as
//! `transformers` computes them (`inv_freq` in f32, then `t * inv_freq` in f32). The rotation is
//! applied in place to the `q` and `k` heads of each row; its backward is the rotation by the
//! opposite angle. A row's position is its index in its sequence ([`Positions::Sequential`]) or
//! the batch's own `position_ids` ([`Positions::Given`], packed rows whose documents restart
//! at 0).

use rayon::prelude::*;

/// How `inv_freq` is rescaled (`rope_type` of `rope_parameters` / `rope_scaling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `"default"`: `inv_freq[i] = theta^(-2i/hs)`.
    Default,
    /// `"linear"`: every `inv_freq` divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// `"dynamic"` (NTK): the base grows when a sequence is longer than
    /// `max_position_embeddings`; unchanged up to it.
    Dynamic {
        /// The scaling factor.
        factor: f32,
        /// The context length the base was trained for.
        original_max_positions: usize,
    },
    /// `"llama3"`: long wavelengths divided by `factor`, short ones kept, a smooth blend in
    /// between (Llama 3.1+).
    Llama3 {
        /// The divisor of the long wavelengths.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        original_max_positions: usize,
    },
}

/// The rotary embedding of a model: base and scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// `rope_theta`.
    pub theta: f32,
    /// `rope_type` and its parameters.
    pub scaling: RopeScaling,
}

impl Rope {
    /// The `hs / 2` inverse frequencies for heads of `head_dim` and sequences of `seq_len`, in
    /// f32 as `transformers` computes them.
    pub fn inv_freq(&self, head_dim: usize, seq_len: usize) -> Vec<f32> {
        let base = match self.scaling {
            RopeScaling::Dynamic {
                factor,
                original_max_positions,
            } if seq_len > original_max_positions => {
                let ratio = f64::from(factor) * seq_len as f64 / original_max_positions as f64
                    - (f64::from(factor) - 1.0);
                let exponent = head_dim as f64 / (head_dim as f64 - 2.0);
                (f64::from(self.theta) * ratio.powf(exponent)) as f32
            }
            _ => self.theta,
        };
        let dim = head_dim as f32;
        let unscaled = (0..head_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim));
        match self.scaling {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => unscaled.collect(),
            RopeScaling::Linear { factor } => unscaled.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_positions,
            } => {
                let old = original_max_positions as f64;
                let low_wavelen = (old / f64::from(low_freq_factor)) as f32;
                let high_wavelen = (old / f64::from(high_freq_factor)) as f32;
                let spread = (f64::from(high_freq_factor) - f64::from(low_freq_factor)) as f32;
                let two_pi = std::f64::consts::TAU as f32;
                unscaled
                    .map(|f| {
                        let wavelen = two_pi / f;
                        let kept = if wavelen > low_wavelen { f / factor } else { f };
                        if wavelen < high_wavelen || wavelen > low_wavelen {
                            return kept;
                        }
                        let smooth = (old as f32 / wavelen - low_freq_factor) / spread;
                        (1.0 - smooth) * kept / factor + smooth * kept
                    })
                    .collect()
            }
        }
    }

    /// The table for `seq_len` positions and heads of `head_dim`.
    pub fn table(&self, head_dim: usize, seq_len: usize) -> RopeTable {
        let inv_freq = self.inv_freq(head_dim, seq_len);
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(seq_len * half);
        let mut sin = Vec::with_capacity(seq_len * half);
        for t in 0..seq_len {
            for &f in &inv_freq {
                let angle = t as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable { half, cos, sin }
    }
}

/// Cosines and sines `(T, hs/2)` (the second half of a head uses the same values).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Positions the table covers (`0 .. len`).
    pub fn len(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Whether the table covers no position.
    pub fn is_empty(&self) -> bool {
        self.cos.is_empty()
    }

    /// `cos` `(T, hs/2)`.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// `sin` `(T, hs/2)`.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }
}

/// Which way the pairs turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// By `+angle` (forward).
    Forward,
    /// By `-angle` (backward: the transpose of the rotation).
    Inverse,
}

/// Where each row of a `(B*T, width)` batch sits in its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions<'a> {
    /// Row `r` is at position `r % T` (`T` the table's length): `arange(T)` for every sequence.
    Sequential,
    /// Row `r` is at position `ids[r]` (`position_ids`, `(B*T)`, each below the table's
    /// length; checked by the caller).
    Given(&'a [u32]),
}

/// RoPE forward, in place.
///
/// * `rows` `(B*T, width)`: the first `heads * hs` columns of each row are rotated (the `q` and
///   `k` heads of a `[q | k | v]` row), the rest left alone; row `r` is at position `r % T`.
pub fn rope_forward(rows: &mut [f32], width: usize, heads: usize, table: &RopeTable) {
    rope_forward_at(rows, width, heads, table, Positions::Sequential);
}

/// RoPE backward, in place: `rows` holds the gradient w.r.t. the rotated values on entry and
/// w.r.t. the values before rotation on return (same layout as [`rope_forward`]).
pub fn rope_backward(rows: &mut [f32], width: usize, heads: usize, table: &RopeTable) {
    rope_backward_at(rows, width, heads, table, Positions::Sequential);
}

/// [`rope_forward`] with row `r` at the position `positions` gives it.
pub fn rope_forward_at(
    rows: &mut [f32],
    width: usize,
    heads: usize,
    table: &RopeTable,
    positions: Positions<'_>,
) {
    rotate(rows, width, heads, table, positions, Direction::Forward);
}

/// [`rope_backward`] with row `r` at the position `positions` gives it.
pub fn rope_backward_at(
    rows: &mut [f32],
    width: usize,
    heads: usize,
    table: &RopeTable,
    positions: Positions<'_>,
) {
    rotate(rows, width, heads, table, positions, Direction::Inverse);
}

fn rotate(
    rows: &mut [f32],
    width: usize,
    heads: usize,
    table: &RopeTable,
    positions: Positions<'_>,
    dir: Direction,
) {
    let half = table.half;
    let seq_len = table.cos.len() / half.max(1);
    rows.par_chunks_mut(width).enumerate().for_each(|(r, row)| {
        let t = match positions {
            Positions::Sequential => r % seq_len.max(1),
            Positions::Given(ids) => ids[r] as usize,
        };
        let cos = &table.cos[t * half..][..half];
        let sin = &table.sin[t * half..][..half];
        for head in row[..heads * 2 * half].chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x, y) = (a[i], b[i]);
                match dir {
                    Direction::Forward => {
                        a[i] = x * cos[i] - y * sin[i];
                        b[i] = y * cos[i] + x * sin[i];
                    }
                    Direction::Inverse => {
                        a[i] = x * cos[i] + y * sin[i];
                        b[i] = y * cos[i] - x * sin[i];
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_undoes_forward_and_llama3_keeps_short_wavelengths() {
        let rope = Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        };
        let table = rope.table(8, 3);
        let original: Vec<f32> = (0..3 * 20).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut rows = original.clone();
        rope_forward(&mut rows, 20, 2, &table);
        assert_ne!(rows, original);
        assert_eq!(
            rows[16..20],
            original[16..20],
            "columns past the heads untouched"
        );
        rope_backward(&mut rows, 20, 2, &table);
        for (x, y) in rows.iter().zip(&original) {
            assert!((x - y).abs() < 1e-6);
        }
        let scaled = Rope {
            theta: 500_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 64,
            },
        };
        let plain = Rope {
            scaling: RopeScaling::Default,
            ..scaled
        };
        let (a, b) = (scaled.inv_freq(16, 4), plain.inv_freq(16, 4));
        assert_eq!(a[0], b[0], "the highest frequency is kept");
        assert_eq!(a[7], b[7] / 8.0, "the lowest is divided by the factor");
    }

    #[test]
    fn given_positions_rotate_each_row_by_its_own_position() {
        let rope = Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        };
        let table = rope.table(8, 4);
        // Two packed documents, positions 0 1 2 | 0 1, against each rotated on its own.
        let original: Vec<f32> = (0..5 * 8).map(|i| (i as f32 * 0.41).cos()).collect();
        let mut packed = original.clone();
        rope_forward_at(
            &mut packed,
            8,
            1,
            &table,
            Positions::Given(&[0, 1, 2, 0, 1]),
        );
        let mut first = original[..24].to_vec();
        rope_forward(&mut first, 8, 1, &table);
        let mut second = original[24..].to_vec();
        rope_forward(&mut second, 8, 1, &table);
        assert_eq!(packed[..24], first[..]);
        assert_eq!(packed[24..], second[..]);
        assert_eq!(
            packed[24..32],
            original[24..32],
            "position 0 is the identity"
        );
        assert_ne!(packed[32..], original[32..], "position 1 rotates");
    }
}
