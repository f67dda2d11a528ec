//! Megatron-LM calculator parity: dsplan's `megatron_calculator` against Megatron-LM's
//! `report_theoretical_memory` itself, on the cases of `megatron/calculator_cases.json`.
//!
//! The expected figures were computed by running Megatron-LM's own
//! `megatron/training/theoretical_memory_usage.py` (commit recorded in the file) through
//! `megatron/generate_calculator_cases.py`; here each case's launch line goes through
//! dsplan's Megatron argument parser and calculator, and every figure must agree within 1e-6
//! relative, and the printed line byte for byte.

use dsplan_planner::parallel::calculator::{CalculatorInputs, report};
use dsplan_planner::parallel::megatron_args;
use serde_json::Value;
use std::collections::BTreeSet;

fn cases() -> Vec<Value> {
    let text = include_str!("megatron/calculator_cases.json");
    let document: Value = serde_json::from_str(text).expect("the fixture is JSON");
    document["cases"].as_array().expect("cases").clone()
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

#[test]
fn every_case_matches_megatron_within_one_in_a_million() {
    let cases = cases();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut worst = 0.0f64;
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let args = case["megatron_args"].as_str().expect("args");
        let world = case["world_size"].as_u64().expect("world");
        let parsed = megatron_args::parse(args, world)
            .unwrap_or_else(|error| panic!("{name}: refused: {error}"));
        assert!(parsed.warnings.is_empty(), "{name}: {:?}", parsed.warnings);
        let inputs = CalculatorInputs::from_job(&parsed.job)
            .unwrap_or_else(|error| panic!("{name}: {error}"))
            .expect("a Megatron-LM job");
        assert_eq!(
            inputs.padded_vocab_size,
            case["padded_vocab_size"].as_u64().expect("fixture field"),
            "{name}"
        );
        assert_eq!(
            inputs.num_microbatches,
            case["num_microbatches"].as_u64().expect("fixture field"),
            "{name}"
        );
        let ours = report(&inputs);
        for (field, value) in [
            ("weight_and_optimizer_mb", ours.weight_and_optimizer_mb),
            ("activation_mb", ours.activation_mb),
            ("total_mb", ours.total_mb),
        ] {
            let expected = case[field].as_f64().expect(field);
            let error = relative(value, expected);
            worst = worst.max(error);
            assert!(
                error <= 1e-6,
                "{name}: {field} {value} vs Megatron's {expected} ({error:e})"
            );
        }
        assert_eq!(
            ours.printed,
            case["printed"].as_str().expect("fixture field"),
            "{name}"
        );
    }
    println!("{} cases, worst relative difference {worst:e}", cases.len());
}

#[test]
fn the_grid_covers_what_the_issue_asks() {
    let cases = cases();
    let mut shapes = BTreeSet::new();
    let mut grid = BTreeSet::new();
    let (mut interleaved, mut sp, mut no_sp, mut dist, mut no_dist, mut fewer) = (0, 0, 0, 0, 0, 0);
    let mut recompute = BTreeSet::new();
    for case in &cases {
        let name = case["name"].as_str().expect("fixture field");
        let words: Vec<&str> = name.split_whitespace().collect();
        shapes.insert(words[0].to_owned());
        grid.insert((words[1].to_owned(), words[2].to_owned()));
        let p: u64 = words[2][1..].parse().expect("fixture field");
        interleaved += usize::from(name.contains(" vpp"));
        sp += usize::from(words.contains(&"sp"));
        no_sp += usize::from(!words.contains(&"sp"));
        dist += usize::from(words.contains(&"distopt"));
        no_dist += usize::from(!words.contains(&"distopt"));
        fewer += usize::from(case["num_microbatches"].as_u64().expect("fixture field") < p);
        recompute.insert(words[words.len() - 1].to_owned());
    }
    assert!(shapes.len() >= 10, "{shapes:?}");
    assert_eq!(grid.len(), 16, "{grid:?}");
    assert!(interleaved > 0 && sp > 0 && no_sp > 0 && dist > 0 && no_dist > 0 && fewer > 0);
    assert_eq!(recompute.len(), 3, "{recompute:?}");
}
