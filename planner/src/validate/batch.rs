//! The batch-size triangle: `train_batch_size = micro × gradient_accumulation × world size`.
//!
//! DeepSpeed derives whichever of the three keys is missing with floor division, then asserts
//! that all three are positive and that the identity holds (`research/deepspeed-facts.md`
//! §3.1). [`derive`] reproduces that derivation for all eight combinations of given and
//! missing keys; [`check`] turns its outcome into diagnostics that show the arithmetic.

use serde_json::Value;

use crate::diagnostics::{Code, Diagnostic};

/// `train_batch_size`.
pub const TRAIN_BATCH: &str = "/train_batch_size";
/// `train_micro_batch_size_per_gpu`.
pub const MICRO_BATCH: &str = "/train_micro_batch_size_per_gpu";
/// `gradient_accumulation_steps`.
pub const GRAD_ACCUM: &str = "/gradient_accumulation_steps";

/// The three batch keys as given in a config (`None` = absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GivenBatch {
    /// `train_batch_size`.
    pub train: Option<i128>,
    /// `train_micro_batch_size_per_gpu`.
    pub micro: Option<i128>,
    /// `gradient_accumulation_steps`.
    pub accumulation: Option<i128>,
}

/// The solved triangle, with how each value was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolvedBatch {
    /// `train_batch_size`.
    pub train: i128,
    /// `train_micro_batch_size_per_gpu`.
    pub micro: i128,
    /// `gradient_accumulation_steps`.
    pub accumulation: i128,
    /// The data-parallel world size used.
    pub world_size: i128,
    /// Which key was derived and the arithmetic, e.g.
    /// `gradient_accumulation_steps = (train_batch_size 32 // micro 4) // world size 8 = 1`.
    pub derivations: Vec<Derivation>,
}

/// One derived value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derivation {
    /// The pointer of the derived key.
    pub pointer: &'static str,
    /// The arithmetic, readable.
    pub formula: String,
}

/// Why DeepSpeed would reject the batch keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Neither `train_batch_size` nor `train_micro_batch_size_per_gpu`.
    Missing,
    /// A given or derived value is below 1.
    NotPositive {
        /// Pointer of the key at fault (the given key that led to it, for derived values).
        pointer: &'static str,
        /// Explanation with the arithmetic.
        message: String,
    },
    /// The identity does not hold.
    Mismatch(SolvedBatch),
}

/// Solve the triangle exactly as DeepSpeed 0.19.8 does.
pub fn derive(given: GivenBatch, world_size: i128) -> Result<SolvedBatch, BatchError> {
    let w = world_size;
    let mut derivations = Vec::new();
    let mut derived = |pointer, formula: String| derivations.push(Derivation { pointer, formula });
    let (train, micro, accumulation) = match (given.train, given.micro, given.accumulation) {
        (Some(tb), Some(mb), Some(gas)) => (tb, mb, gas),
        (Some(tb), Some(mb), None) => {
            let gas = floor_div(floor_div(tb, mb), w);
            derived(
                GRAD_ACCUM,
                format!(
                    "gradient_accumulation_steps = (train_batch_size {tb} // train_micro_batch_size_per_gpu {mb}) // world size {w} = {gas}"
                ),
            );
            (tb, mb, gas)
        }
        (Some(tb), None, Some(gas)) => {
            let mb = floor_div(floor_div(tb, w), gas);
            derived(
                MICRO_BATCH,
                format!(
                    "train_micro_batch_size_per_gpu = (train_batch_size {tb} // world size {w}) // gradient_accumulation_steps {gas} = {mb}"
                ),
            );
            (tb, mb, gas)
        }
        (None, Some(mb), Some(gas)) => {
            let tb = mb * gas * w;
            derived(
                TRAIN_BATCH,
                format!(
                    "train_batch_size = train_micro_batch_size_per_gpu {mb} × gradient_accumulation_steps {gas} × world size {w} = {tb}"
                ),
            );
            (tb, mb, gas)
        }
        (Some(tb), None, None) => {
            let mb = floor_div(tb, w);
            derived(
                GRAD_ACCUM,
                "gradient_accumulation_steps = 1 (default when only train_batch_size is given)"
                    .to_string(),
            );
            derived(
                MICRO_BATCH,
                format!(
                    "train_micro_batch_size_per_gpu = train_batch_size {tb} // world size {w} = {mb}"
                ),
            );
            (tb, mb, 1)
        }
        (None, Some(mb), None) => {
            let tb = mb * w;
            derived(
                GRAD_ACCUM,
                "gradient_accumulation_steps = 1 (default when only the micro batch is given)"
                    .to_string(),
            );
            derived(
                TRAIN_BATCH,
                format!(
                    "train_batch_size = train_micro_batch_size_per_gpu {mb} × world size {w} = {tb}"
                ),
            );
            (tb, mb, 1)
        }
        (None, None, _) => return Err(BatchError::Missing),
    };
    let solved = SolvedBatch {
        train,
        micro,
        accumulation,
        world_size: w,
        derivations,
    };
    let blame = |derived_pointer: &'static str| -> &'static str {
        // A derived value at fault is the given train_batch_size's doing.
        if solved
            .derivations
            .iter()
            .any(|d| d.pointer == derived_pointer)
        {
            TRAIN_BATCH
        } else {
            derived_pointer
        }
    };
    let explain = |derived_pointer: &'static str| -> String {
        solved
            .derivations
            .iter()
            .find(|d| d.pointer == derived_pointer)
            .map(|d| format!(": DeepSpeed derives {}", d.formula))
            .unwrap_or_default()
    };
    if train <= 0 {
        return Err(BatchError::NotPositive {
            pointer: blame(TRAIN_BATCH),
            message: format!(
                "train_batch_size is {train}; it must be at least 1{}",
                explain(TRAIN_BATCH)
            ),
        });
    }
    if micro <= 0 {
        return Err(BatchError::NotPositive {
            pointer: blame(MICRO_BATCH),
            message: format!(
                "train_micro_batch_size_per_gpu is {micro}; it must be at least 1{}",
                explain(MICRO_BATCH)
            ),
        });
    }
    if accumulation <= 0 {
        return Err(BatchError::NotPositive {
            pointer: blame(GRAD_ACCUM),
            message: format!(
                "gradient_accumulation_steps is {accumulation}; it must be at least 1{}",
                explain(GRAD_ACCUM)
            ),
        });
    }
    if train != micro * accumulation * w {
        return Err(BatchError::Mismatch(solved));
    }
    Ok(solved)
}

/// Python's `//` on integers (floor division; the divisor is never 0 here because the
/// positivity asserts come first in DeepSpeed only for given values, so guard it).
fn floor_div(a: i128, b: i128) -> i128 {
    if b == 0 { 0 } else { a.div_euclid(b) }
}

/// Read one batch key: `Ok(None)` absent, `Ok(Some(n))` an integral number, `Err(())` a value
/// the triangle cannot use (`"auto"`, a string, a fraction: reported elsewhere).
fn read(document: &Value, pointer: &str) -> Result<Option<i128>, ()> {
    match document.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Ok(Some(i128::from(i))),
            (_, Some(u), _) => Ok(Some(i128::from(u))),
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e30 => Ok(Some(f as i128)),
            _ => Err(()),
        },
        Some(_) => Err(()),
    }
}

/// Diagnostics for the batch keys of `document` at `world_size` (when known).
pub fn check(document: &Value, world_size: Option<u64>) -> Vec<Diagnostic> {
    let (Ok(train), Ok(micro), Ok(accumulation)) = (
        read(document, TRAIN_BATCH),
        read(document, MICRO_BATCH),
        read(document, GRAD_ACCUM),
    ) else {
        return Vec::new(); // "auto" or a wrong type: resolution or the schema speaks for it
    };
    let given = GivenBatch {
        train,
        micro,
        accumulation,
    };
    if let Some(gas) = accumulation.filter(|&gas| gas < 1) {
        return vec![
            Diagnostic::error(
                Code::BatchSizeNotPositive,
                GRAD_ACCUM,
                format!("gradient_accumulation_steps is {gas}; it must be at least 1"),
            )
            .with_help("use 1 for no accumulation"),
        ];
    }
    let Some(world_size) = world_size else {
        return check_without_world_size(given);
    };
    match derive(given, i128::from(world_size)) {
        Ok(_) => Vec::new(),
        Err(BatchError::Missing) => vec![missing()],
        Err(BatchError::NotPositive { pointer, message }) => {
            vec![Diagnostic::error(
            Code::BatchSizeNotPositive,
            pointer,
            format!("{message} (world size {world_size})"),
        )
        .with_help(format!(
            "train_batch_size must be at least micro × gradient accumulation × world size = {}",
            micro.unwrap_or(1) * accumulation.unwrap_or(1) * i128::from(world_size)
        ))]
        }
        Err(BatchError::Mismatch(solved)) => vec![mismatch(&solved, given)],
    }
}

fn check_without_world_size(given: GivenBatch) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for (pointer, value) in [(TRAIN_BATCH, given.train), (MICRO_BATCH, given.micro)] {
        if let Some(v) = value.filter(|&v| v < 1) {
            found.push(Diagnostic::error(
                Code::BatchSizeNotPositive,
                pointer,
                format!("{} is {v}; it must be at least 1", &pointer[1..]),
            ));
        }
    }
    if given.train.is_none() && given.micro.is_none() {
        found.push(missing());
    }
    if let (Some(tb), Some(mb), Some(gas)) = (given.train, given.micro, given.accumulation)
        && tb > 0
        && mb > 0
        && gas > 0
        && tb % (mb * gas) != 0
    {
        found.push(
                Diagnostic::error(
                    Code::BatchSizeMismatch,
                    TRAIN_BATCH,
                    format!(
                        "train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu {mb} × gradient_accumulation_steps {gas} = {}: no world size makes the batch sizes add up",
                        mb * gas
                    ),
                )
                .with_help("train_batch_size must equal micro × gradient accumulation × world size"),
            );
    }
    found
}

fn missing() -> Diagnostic {
    Diagnostic::error(
        Code::BatchSizeMissing,
        "",
        "neither `train_batch_size` nor `train_micro_batch_size_per_gpu` is given; DeepSpeed needs at least one",
    )
    .with_help("add `\"train_micro_batch_size_per_gpu\": 1` (or \"auto\" when training through the Hugging Face Trainer)")
}

fn mismatch(solved: &SolvedBatch, given: GivenBatch) -> Diagnostic {
    let SolvedBatch {
        train: tb,
        micro: mb,
        accumulation: gas,
        world_size: w,
        ..
    } = *solved;
    let product = mb * gas * w;
    let mut message = format!(
        "train_batch_size {tb} ≠ train_micro_batch_size_per_gpu {mb} × gradient_accumulation_steps {gas} × world size {w} = {product}"
    );
    for derivation in &solved.derivations {
        message.push_str(&format!(" (DeepSpeed derives {})", derivation.formula));
    }
    let mut fixes = Vec::new();
    if given.accumulation.is_some() && tb % (mb * w) == 0 {
        fixes.push(format!("gradient_accumulation_steps {}", tb / (mb * w)));
    }
    if given.micro.is_some() && tb % (gas * w) == 0 {
        fixes.push(format!("train_micro_batch_size_per_gpu {}", tb / (gas * w)));
    }
    fixes.push(format!("train_batch_size {product}"));
    let help = format!(
        "at world size {w}, any one of these adds up: {}; or give only two of the three keys and let DeepSpeed derive the third",
        fixes.join(", ")
    );
    Diagnostic::error(Code::BatchSizeMismatch, TRAIN_BATCH, message).with_help(help)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn given(train: Option<i128>, micro: Option<i128>, accumulation: Option<i128>) -> GivenBatch {
        GivenBatch {
            train,
            micro,
            accumulation,
        }
    }

    /// All eight combinations of given and missing keys, at world size 8.
    #[test]
    fn derives_like_deepspeed_for_every_combination() {
        let w = 8;
        let solved = |g| derive(g, w).map(|s| (s.train, s.micro, s.accumulation));
        assert_eq!(solved(given(Some(64), Some(4), Some(2))), Ok((64, 4, 2)));
        assert_eq!(solved(given(Some(64), Some(4), None)), Ok((64, 4, 2)));
        assert_eq!(solved(given(Some(64), None, Some(2))), Ok((64, 4, 2)));
        assert_eq!(solved(given(None, Some(4), Some(2))), Ok((64, 4, 2)));
        assert_eq!(solved(given(Some(64), None, None)), Ok((64, 8, 1)));
        assert_eq!(solved(given(None, Some(4), None)), Ok((32, 4, 1)));
        assert_eq!(solved(given(None, None, Some(2))), Err(BatchError::Missing));
        assert_eq!(solved(given(None, None, None)), Err(BatchError::Missing));
    }

    #[test]
    fn floor_division_yields_deepspeeds_zero() {
        // TB=32, MB=4, W=16: GAS = (32 // 4) // 16 = 0, which DeepSpeed's assert rejects.
        match derive(given(Some(32), Some(4), None), 16) {
            Err(BatchError::NotPositive { pointer, message }) => {
                assert_eq!(pointer, TRAIN_BATCH);
                assert!(message.contains("(train_batch_size 32 // train_micro_batch_size_per_gpu 4) // world size 16 = 0"), "{message}");
            }
            other => panic!("expected NotPositive, got {other:?}"),
        }
    }

    #[test]
    fn indivisible_derivation_is_a_mismatch() {
        // TB=20, MB=3, W=1: GAS = 6 and 3 × 6 × 1 = 18 ≠ 20.
        assert!(matches!(
            derive(given(Some(20), Some(3), None), 1),
            Err(BatchError::Mismatch(_))
        ));
    }

    #[test]
    fn mismatch_shows_the_arithmetic_and_fixes() {
        let document = json!({"train_batch_size": 20000, "train_micro_batch_size_per_gpu": 20, "gradient_accumulation_steps": 100});
        let found = check(&document, Some(8));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code, Code::BatchSizeMismatch);
        assert!(found[0].message.contains("20000 ≠ train_micro_batch_size_per_gpu 20 × gradient_accumulation_steps 100 × world size 8 = 16000"));
        assert!(
            found[0]
                .help
                .as_deref()
                .unwrap_or_default()
                .contains("gradient_accumulation_steps 125")
        );
    }

    #[test]
    fn without_world_size_only_world_independent_rules_apply() {
        assert!(
            check(
                &json!({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}),
                None
            )
            .is_empty()
        );
        let found = check(
            &json!({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}),
            None,
        );
        assert_eq!(found[0].code, Code::BatchSizeMismatch);
        let found = check(
            &json!({"gradient_accumulation_steps": 0, "train_batch_size": 8}),
            Some(1),
        );
        assert_eq!(found[0].code, Code::BatchSizeNotPositive);
        assert_eq!(found[0].pointer, GRAD_ACCUM);
        let found = check(&json!({"gradient_accumulation_steps": 4}), Some(1));
        assert_eq!(found[0].code, Code::BatchSizeMissing);
    }

    #[test]
    fn auto_and_integral_floats() {
        assert!(
            check(
                &json!({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3}),
                Some(8)
            )
            .is_empty()
        );
        assert!(
            check(
                &json!({"train_batch_size": 16.0, "train_micro_batch_size_per_gpu": 2}),
                Some(8)
            )
            .is_empty()
        );
    }
}
