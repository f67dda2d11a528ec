//! "Did you mean …?": the nearest valid name for a misspelt key or value.

/// How close two names are, from 0 (unrelated) to 1 (equal ignoring case).
pub fn similarity(typed: &str, known: &str) -> f64 {
    if typed.eq_ignore_ascii_case(known) {
        return 1.0;
    }
    strsim::normalized_damerau_levenshtein(&typed.to_ascii_lowercase(), &known.to_ascii_lowercase())
}

/// The closest of `candidates` to `typed` with at least `threshold` similarity.
pub fn nearest<'a>(
    typed: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    threshold: f64,
) -> Option<&'a str> {
    // Similarity s needs a length difference of at most (1 - s) × the longer length; skip
    // candidates that cannot reach the threshold before the quadratic edit distance.
    let close_in_length = |candidate: &str| {
        let (a, b) = (
            typed.chars().count() as f64,
            candidate.chars().count() as f64,
        );
        (a - b).abs() <= (1.0 - threshold) * a.max(b)
    };
    candidates
        .into_iter()
        .filter(|candidate| close_in_length(candidate))
        .map(|candidate| (similarity(typed, candidate), candidate))
        .filter(|(score, _)| *score >= threshold)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// Similarity above which an unknown top-level key counts as a misspelling of a known one
/// (an error) rather than a project's own key (a warning).
pub const NEAR_MISS: f64 = 0.8;

/// Similarity above which a suggestion is worth showing at all.
pub const WORTH_SUGGESTING: f64 = 0.6;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_classic_misspellings() {
        let keys = [
            "gradient_accumulation_steps",
            "train_batch_size",
            "zero_optimization",
        ];
        assert_eq!(
            nearest("gradient_acumulation_steps", keys, NEAR_MISS),
            Some("gradient_accumulation_steps")
        );
        assert_eq!(
            nearest("zero_optimisation", keys, NEAR_MISS),
            Some("zero_optimization")
        );
        assert_eq!(
            nearest("overlap_com", ["overlap_comm", "stage"], NEAR_MISS),
            Some("overlap_comm")
        );
        assert_eq!(nearest("my_project_setting", keys, NEAR_MISS), None);
    }
}
