//! A check's row: what was compared, the measured error, the tolerance, the verdict. The
//! measures are the ones the GPU tests have always used (see [`relative_error`]).

use serde::{Deserialize, Serialize};

/// What a row checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckKind {
    /// A kernel file compiled by NVRTC and its entry points loaded.
    Compile,
    /// A kernel's output against its CPU reference.
    Kernel,
    /// A training step on the GPU against the CPU backend.
    TrainStep,
}

/// How [`CheckRow::error`] is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// `max |got - want| / (|want| + 1% of max |want|)`.
    Relative,
    /// `‖got - want‖₂ / ‖want‖₂`: a matrix product's measure, since one element of a sum
    /// that cancels can carry a large relative error that says nothing about the product.
    NormRelative,
    /// `|got - want| / |want|` of one scalar (a loss, a norm).
    ScalarRelative,
    /// `‖Δgot - Δwant‖ / ‖Δwant‖` of an update (Δ: after minus before).
    UpdateNorm,
    /// `max (|got - want| - rel |want|)`: the absolute excess over a relative allowance.
    Excess,
    /// Elements that differ bit for bit (tolerance 0).
    Mismatches,
    /// Nothing measured: compiled, or not run.
    None,
}

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Within tolerance.
    Pass,
    /// Beyond tolerance, not finite, or the case failed to run.
    Fail,
    /// Not run here (e.g. NCCL missing); says why in `detail`.
    Skipped,
}

/// One comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRow {
    /// What kind of check.
    pub kind: CheckKind,
    /// What was compared, e.g. `layernorm_forward out`.
    pub name: String,
    /// The storage precision (`f32`, `bf16`, `f16`, or `-`).
    pub dtype: String,
    /// How `error` is measured.
    pub metric: Metric,
    /// The measured error (NaN, `null` in JSON: not finite somewhere, or not measured).
    #[serde(with = "nan_as_null")]
    pub error: f64,
    /// The largest absolute difference of any element.
    #[serde(with = "nan_as_null")]
    pub max_abs_err: f64,
    /// The tolerance on `error`.
    pub tol: f64,
    /// The verdict.
    pub verdict: Verdict,
    /// Why it failed or was skipped, or what was done (compile time).
    pub detail: Option<String>,
}

impl CheckRow {
    /// A row from a measurement: passes when `error <= tol` (NaN fails).
    pub fn measured(
        kind: CheckKind,
        name: impl Into<String>,
        dtype: &str,
        metric: Metric,
        (error, max_abs_err): (f64, f64),
        tol: f64,
    ) -> Self {
        let pass = error <= tol && max_abs_err.is_finite();
        CheckRow {
            kind,
            name: name.into(),
            dtype: dtype.to_string(),
            metric,
            error,
            max_abs_err,
            tol,
            verdict: if pass { Verdict::Pass } else { Verdict::Fail },
            detail: None,
        }
    }

    /// A row for something that could not be run or did not compile.
    pub fn failed(kind: CheckKind, name: impl Into<String>, why: impl Into<String>) -> Self {
        CheckRow {
            kind,
            name: name.into(),
            dtype: "-".to_string(),
            metric: Metric::None,
            error: f64::NAN,
            max_abs_err: f64::NAN,
            tol: 0.0,
            verdict: Verdict::Fail,
            detail: Some(why.into()),
        }
    }

    /// A row for something that ran without a measurement (a compile).
    pub fn done(kind: CheckKind, name: impl Into<String>, what: impl Into<String>) -> Self {
        CheckRow {
            verdict: Verdict::Pass,
            ..CheckRow::failed(kind, name, what)
        }
    }

    /// A row not run here, and why.
    pub fn skipped(kind: CheckKind, name: impl Into<String>, why: impl Into<String>) -> Self {
        CheckRow {
            verdict: Verdict::Skipped,
            ..CheckRow::failed(kind, name, why)
        }
    }

    /// A product's output against its reference with [`norm_relative_error`].
    pub fn norm_relative(name: &str, dtype: &str, got: &[f32], want: &[f32], tol: f64) -> Self {
        Self::kernel(
            name,
            dtype,
            Metric::NormRelative,
            norm_relative_error(got, want),
            tol,
        )
    }

    /// A kernel output against its reference with [`relative_error`].
    pub fn relative(name: &str, dtype: &str, got: &[f32], want: &[f32], tol: f64) -> Self {
        Self::kernel(
            name,
            dtype,
            Metric::Relative,
            relative_error(got, want),
            tol,
        )
    }

    /// A kernel row from a measure's `(error, max_abs_err)`, or a failed row naming why it
    /// could not be measured.
    fn kernel(
        name: &str,
        dtype: &str,
        metric: Metric,
        measured: Result<(f64, f64), String>,
        tol: f64,
    ) -> Self {
        match measured {
            Ok(errors) => CheckRow::measured(CheckKind::Kernel, name, dtype, metric, errors, tol),
            Err(why) => CheckRow {
                dtype: dtype.to_string(),
                ..CheckRow::failed(CheckKind::Kernel, name, why)
            },
        }
    }

    /// Bit-for-bit equality of `got` and `want` (elements that differ; tolerance 0).
    pub fn exact<T: PartialEq + Copy + Into<f64>>(
        name: &str,
        dtype: &str,
        got: &[T],
        want: &[T],
    ) -> Self {
        if got.len() != want.len() {
            return CheckRow::failed(
                CheckKind::Kernel,
                name,
                format!("{} elements, expected {}", got.len(), want.len()),
            );
        }
        let mut mismatches = 0usize;
        let mut max_abs = 0.0f64;
        for (&g, &w) in got.iter().zip(want) {
            // Values as `PartialEq` compares them, with a NaN matching a NaN.
            if g != w && !(Into::<f64>::into(g).is_nan() && Into::<f64>::into(w).is_nan()) {
                mismatches += 1;
                let d = (Into::<f64>::into(g) - Into::<f64>::into(w)).abs();
                if d.is_nan() || d > max_abs {
                    max_abs = d;
                }
            }
        }
        CheckRow::measured(
            CheckKind::Kernel,
            name,
            dtype,
            Metric::Mismatches,
            (mismatches as f64, max_abs),
            0.0,
        )
    }
}

/// NaN written as JSON `null` and read back as NaN (JSON has no NaN).
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_nan() {
            s.serialize_none()
        } else {
            s.serialize_f64(*x)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// `(max |g - w| / (|w| + 1e-2 max |w|), max |g - w|)` over the elements; the relative part
/// is NaN when any element is NaN. An error when the lengths differ.
pub fn relative_error(got: &[f32], want: &[f32]) -> Result<(f64, f64), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let scale = want
        .iter()
        .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
        .max(1e-6);
    let (mut worst, mut worst_abs) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let diff = (f64::from(g) - f64::from(w)).abs();
        let err = diff / (f64::from(w).abs() + scale * 1e-2);
        if err.is_nan() || err > worst {
            worst = err;
        }
        if diff.is_nan() || diff > worst_abs {
            worst_abs = diff;
        }
        if worst.is_nan() {
            break;
        }
    }
    Ok((worst, worst_abs))
}

/// `(‖g - w‖₂ / ‖w‖₂, max |g - w|)`; NaN when any element is NaN (or `w` is all zeros and
/// `g` is not). An error when the lengths differ.
pub fn norm_relative_error(got: &[f32], want: &[f32]) -> Result<(f64, f64), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let (mut diff2, mut want2, mut worst_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let diff = f64::from(g) - f64::from(w);
        diff2 += diff * diff;
        want2 += f64::from(w) * f64::from(w);
        if diff.is_nan() || diff.abs() > worst_abs {
            worst_abs = diff.abs();
        }
    }
    let error = match (diff2, want2) {
        (d, _) if d.is_nan() => f64::NAN,
        (0.0, 0.0) => 0.0,
        (_, 0.0) => f64::NAN,
        (d, w) => (d / w).sqrt(),
    };
    Ok((error, worst_abs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_norm_relative_row_measures_the_whole_product_not_its_worst_element() {
        // One element that cancels to nearly zero carries a 100% error; the product's
        // norm-wise error stays small, and NaN still fails.
        let want = [10.0f32, -10.0, 1e-3];
        let got = [10.0f32, -10.0, 2e-3];
        let row = CheckRow::norm_relative("x", "bf16", &got, &want, 1e-3);
        assert_eq!(row.verdict, Verdict::Pass, "{row:?}");
        assert!(
            (row.error - 1e-3 / 200f64.sqrt()).abs() < 1e-9,
            "{}",
            row.error
        );
        assert_eq!(row.metric, Metric::NormRelative);
        let row = CheckRow::relative("x", "bf16", &got, &want, 1e-3);
        assert_eq!(
            row.verdict,
            Verdict::Fail,
            "the element-wise measure fails it"
        );
        let row = CheckRow::norm_relative("x", "f32", &[f32::NAN, -10.0, 0.0], &want, 1.0);
        assert_eq!(row.verdict, Verdict::Fail);
        let row = CheckRow::norm_relative("x", "f32", &[1.0, 0.0], &[0.0, 0.0], 1.0);
        assert_eq!(row.verdict, Verdict::Fail, "zero reference, nonzero output");
        let row = CheckRow::norm_relative("x", "f32", &[1.0], &want, 1.0);
        assert_eq!(row.verdict, Verdict::Fail, "length mismatch");
    }

    #[test]
    fn a_relative_row_passes_within_tolerance_and_fails_beyond_or_on_nan() {
        let want = [1.0f32, -2.0, 100.0];
        let row = CheckRow::relative("x", "f32", &[1.0, -2.0, 100.001], &want, 1e-4);
        assert_eq!(row.verdict, Verdict::Pass, "{row:?}");
        assert!((row.error - 0.001 / 101.0).abs() < 1e-6, "{}", row.error);
        assert!((row.max_abs_err - 0.001).abs() < 1e-4);
        let row = CheckRow::relative("x", "f32", &[1.1, -2.0, 100.0], &want, 1e-2);
        assert_eq!(row.verdict, Verdict::Fail);
        let row = CheckRow::relative("x", "f32", &[f32::NAN, -2.0, 100.0], &want, 1.0);
        assert_eq!(row.verdict, Verdict::Fail);
        assert!(row.error.is_nan());
        let row = CheckRow::relative("x", "f32", &[1.0], &want, 1.0);
        assert_eq!(row.verdict, Verdict::Fail);
        assert!(row.detail.is_some_and(|d| d.contains("expected 3")));
    }

    #[test]
    fn a_row_round_trips_through_json_nan_included() {
        let row = CheckRow::failed(CheckKind::Kernel, "x", "did not run");
        let text = serde_json::to_string(&row).expect("json");
        assert!(text.contains("\"error\":null"), "{text}");
        let back: CheckRow = serde_json::from_str(&text).expect("back");
        assert!(back.error.is_nan() && back.verdict == Verdict::Fail);
    }

    #[test]
    fn an_exact_row_counts_mismatches() {
        let row = CheckRow::exact("cast", "bf16", &[1.0f32, 2.0, 3.0], &[1.0, 2.5, 3.0]);
        assert_eq!((row.error, row.max_abs_err), (1.0, 0.5));
        assert_eq!(row.verdict, Verdict::Fail);
        let row = CheckRow::exact("cast", "bf16", &[f32::NAN, 2.0], &[f32::NAN, 2.0]);
        assert_eq!(row.verdict, Verdict::Pass);
    }
}
