//! Python's numeric semantics, as DeepSpeed's estimators use them.
//!
//! DeepSpeed computes its estimates with Python integers and floats and truncates with `int()`.
//! Reproducing its bytes exactly means doing what Python does at each step:
//!
//! - `int * int` is exact (arbitrary precision), so products of integers are formed in `u128`;
//! - `int * float` first converts the integer to the nearest double (ties to even), which is
//!   what `u128 as f64` does;
//! - `int / int` is the *correctly rounded* quotient of the two exact integers, which is not
//!   always `(a as f64) / (b as f64)` once an operand exceeds 2^53; [`true_divide`] computes it
//!   exactly for every pair;
//! - `int(x)` truncates toward zero ([`truncate`]).

use std::cmp::Ordering;

/// A Python number as it flows through DeepSpeed's formulas: an exact integer or a double.
/// `max(int, float)` keeps the type of the winner, and that type changes the next product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PyNumber {
    /// A Python `int` (exact).
    Int(u128),
    /// A Python `float` (IEEE double).
    Float(f64),
}

impl PyNumber {
    /// Python's `max(self, other)`: returns `self` unless `other` is strictly greater, comparing
    /// exactly (Python compares an int and a float by their mathematical values).
    pub fn max(self, other: PyNumber) -> PyNumber {
        if other.greater_than(self) {
            other
        } else {
            self
        }
    }

    /// `self > other`, exactly as Python compares mixed int/float values.
    fn greater_than(self, other: PyNumber) -> bool {
        match (self, other) {
            (PyNumber::Int(a), PyNumber::Int(b)) => a > b,
            (PyNumber::Float(a), PyNumber::Float(b)) => a > b,
            (PyNumber::Int(a), PyNumber::Float(b)) => {
                int_cmp_float(a, b) == Some(Ordering::Greater)
            }
            (PyNumber::Float(a), PyNumber::Int(b)) => int_cmp_float(b, a) == Some(Ordering::Less),
        }
    }

    /// Python's `left * self` for an integer `left`: exact when `self` is an int, otherwise
    /// `float(left) * self`.
    pub fn times_int(self, left: u128) -> PyNumber {
        match self {
            PyNumber::Int(b) => PyNumber::Int(left.saturating_mul(b)),
            PyNumber::Float(b) => PyNumber::Float(left as f64 * b),
        }
    }

    /// Python's `self * factor` for a float `factor`: always a float.
    pub fn times_float(self, factor: f64) -> f64 {
        match self {
            PyNumber::Int(a) => a as f64 * factor,
            PyNumber::Float(a) => a * factor,
        }
    }
}

/// Exact comparison of an integer with a double (`None` when the double is NaN).
fn int_cmp_float(int: u128, float: f64) -> Option<Ordering> {
    if float.is_nan() {
        return None;
    }
    if float < 0.0 {
        return Some(Ordering::Greater);
    }
    // 2^128 and above: bigger than any u128.
    if float >= 340_282_366_920_938_463_463_374_607_431_768_211_456.0 {
        return Some(Ordering::Less);
    }
    let whole = float.trunc();
    let whole_int = whole as u128; // exact: `whole` is integral and in range
    match int.cmp(&whole_int) {
        Ordering::Equal if float > whole => Some(Ordering::Less),
        ordering => Some(ordering),
    }
}

/// Python's `a / b` for two non-negative integers: the exact quotient rounded once to the
/// nearest double, ties to even. `None` when `b` is zero (Python raises `ZeroDivisionError`).
pub fn true_divide(a: u128, b: u128) -> Option<f64> {
    if b == 0 {
        return None;
    }
    if a == 0 {
        return Some(0.0);
    }
    const EXACT: u128 = 1 << 53;
    if a <= EXACT && b <= EXACT {
        // Both convert exactly and IEEE division rounds the exact quotient once.
        return Some(a as f64 / b as f64);
    }
    // Scale `a` up so the integer quotient carries well over 53 significant bits, then round
    // that quotient with the remainder as a sticky bit.
    let scale = a.leading_zeros().saturating_sub(1);
    let scaled = a << scale;
    let quotient = scaled / b;
    let sticky = !scaled.is_multiple_of(b);
    if quotient == 0 {
        // `b` is at least 2^64 times larger than `a`: far below any value DeepSpeed prints
        // or truncates to something other than zero.
        return Some((a as f64) / (b as f64));
    }
    Some(round_to_double(quotient, sticky) * pow2(-(scale as i32)))
}

/// `value + (sticky ? a little : 0)` rounded to the nearest double, ties to even.
fn round_to_double(value: u128, sticky: bool) -> f64 {
    let bits = 128 - value.leading_zeros();
    if bits <= 53 {
        // Exact unless a sticky fraction is present; with fewer than 53 bits the caller's
        // scaling guarantees this branch is only reached for tiny quotients.
        return value as f64;
    }
    let drop = bits - 53;
    let mantissa = value >> drop;
    let rest = value & ((1u128 << drop) - 1);
    let half = 1u128 << (drop - 1);
    let round_up = rest > half || (rest == half && (sticky || mantissa & 1 == 1));
    let mantissa = if round_up { mantissa + 1 } else { mantissa };
    mantissa as f64 * pow2(drop as i32)
}

/// 2^exponent as a double, exact for exponents in the normal range.
fn pow2(exponent: i32) -> f64 {
    let biased = (exponent + 1023).clamp(1, 2046) as u64;
    f64::from_bits(biased << 52)
}

/// Python's `int(x)` for a non-negative double that must fit in `u64`: truncation toward
/// zero. `None` for NaN, infinities, negatives below -1 and values of 2^64 or more.
pub fn truncate(x: f64) -> Option<u64> {
    const LIMIT: f64 = 18_446_744_073_709_551_616.0; // 2^64
    if !x.is_finite() || x <= -1.0 || x >= LIMIT {
        return None;
    }
    Some(x.trunc().max(0.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_quotients_match_float_division() {
        assert_eq!(true_divide(18 * 2_783_959_040, 8), Some(6_263_907_840.0));
        assert_eq!(true_divide(1, 3), Some(1.0 / 3.0));
        assert_eq!(true_divide(5, 0), None);
    }

    #[test]
    fn large_quotients_are_rounded_once() {
        // Pairs where Python's `a / b` differs from `float(a) / float(b)` (checked in Python).
        assert_eq!(
            true_divide(2_193_230_518_291_280_956, 509),
            Some(4_308_900_821_790_336.0)
        );
        assert_eq!(
            true_divide(1_749_418_159_988_775_213, 501),
            Some(3_491_852_614_748_054.5)
        );
        assert_eq!(
            true_divide(14_107_169_336_718_343_728, 66),
            Some(2.137_449_899_502_779_2e17)
        );
        // The naive division gives the other neighbour in each case.
        assert_eq!(
            2_193_230_518_291_280_956u64 as f64 / 509.0,
            4_308_900_821_790_335.5
        );
    }

    #[test]
    fn ties_round_to_even_with_sticky_bits() {
        // (2^55 + 5) / 4 = 2^53 + 1.25; doubles there are 2 apart: 2^53 + 2 is nearest.
        let value = true_divide((1 << 55) + 5, 4).expect("non-zero divisor");
        assert_eq!(value, ((1u64 << 53) + 2) as f64);
        // (2^55 + 4) / 4 = 2^53 + 1: an exact tie between 2^53 and 2^53 + 2, goes to even 2^53.
        let tie = true_divide((1 << 55) + 4, 4).expect("non-zero divisor");
        assert_eq!(tie, (1u64 << 53) as f64);
    }

    #[test]
    fn max_keeps_the_first_on_equality() {
        assert_eq!(
            PyNumber::Int(16).max(PyNumber::Float(16.0)),
            PyNumber::Int(16)
        );
        assert_eq!(
            PyNumber::Int(8).max(PyNumber::Float(9.0)),
            PyNumber::Float(9.0)
        );
        assert_eq!(
            PyNumber::Int(32).max(PyNumber::Float(18.0)),
            PyNumber::Int(32)
        );
        assert_eq!(
            PyNumber::Int(4).max(PyNumber::Float(4.5)),
            PyNumber::Float(4.5)
        );
    }

    #[test]
    fn truncation_is_toward_zero() {
        assert_eq!(truncate(2.999), Some(2));
        assert_eq!(truncate(0.5), Some(0));
        assert_eq!(truncate(f64::NAN), None);
        assert_eq!(truncate(1e30), None);
    }
}
