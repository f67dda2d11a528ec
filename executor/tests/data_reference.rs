//! The data split against DeepSpeed's reference runs: every (run, step, rank, micro-step) row
//! list of `deepspeed_zero/runs.json`, and the tokens of the fixtures' stored batches.
//!
//! Reads `../shared` next to the workspace (or `$DSPLAN_SHARED_DIR`); skips when it is absent.

use std::path::PathBuf;

use dsplan_executor::data::{
    BatchLayout, DEFAULT_TENSOR, DataError, MicroBatchIndex, StoredBatchSource, TokenSource,
};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    if dir.join("reference/gpt2").is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared not found");
        None
    }
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// `input_ids` of a fixture file as `i64`, read independently of the source under test.
fn fixture_ids(bytes: &[u8], name: &str) -> (Vec<usize>, Vec<i64>) {
    let file = SafeTensors::deserialize(bytes).expect("safetensors");
    let view = file.tensor(name).expect("tensor");
    assert_eq!(view.dtype(), Dtype::I64);
    let values = view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    (view.shape().to_vec(), values)
}

fn as_usize(value: &Value) -> usize {
    value.as_u64().expect("unsigned integer") as usize
}

#[test]
fn every_row_list_of_the_deepspeed_runs_follows_the_split_rule() {
    let Some(shared) = shared_dir() else { return };
    let runs: Value = serde_json::from_slice(&read(
        shared.join("reference/gpt2/deepspeed_zero/runs.json"),
    ))
    .expect("runs.json");
    let world = as_usize(&runs["world_size"]);
    let mut checked = 0;
    let mut layouts = std::collections::BTreeSet::new();
    for (name, run) in runs["runs"].as_object().expect("runs") {
        let config = &run["ds_config"];
        let micro = as_usize(&config["train_micro_batch_size_per_gpu"]);
        let accum = as_usize(&config["gradient_accumulation_steps"]);
        let layout = BatchLayout::new(micro, 31, accum, world).expect("layout");
        assert_eq!(
            layout.global_batch(),
            as_usize(&config["train_batch_size"]),
            "{name}"
        );
        layouts.insert((micro, accum));
        for step in run["steps"].as_array().expect("steps") {
            for per_rank in step["per_rank"].as_array().expect("per_rank") {
                let rank = as_usize(&per_rank["rank"]);
                let micro_rows = per_rank["rows"].as_array().expect("rows");
                assert_eq!(
                    micro_rows.len(),
                    accum,
                    "{name}: one row list per micro-step"
                );
                for (micro_step, rows) in micro_rows.iter().enumerate() {
                    let used: Vec<usize> = rows
                        .as_array()
                        .expect("rows")
                        .iter()
                        .map(as_usize)
                        .collect();
                    let ours: Vec<usize> =
                        layout.rows_of(rank, micro_step).expect("rows").collect();
                    assert_eq!(
                        used, ours,
                        "{name}, step {}, rank {rank}, micro-step {micro_step}",
                        step["step"]
                    );
                    checked += 1;
                }
            }
        }
    }
    // 10 runs x 20 steps x 2 ranks with GA 1, one run x 20 x 2 x 2 with GA 2.
    assert_eq!(checked, 10 * 20 * 2 + 20 * 2 * 2);
    assert_eq!(
        layouts.into_iter().collect::<Vec<_>>(),
        vec![(1, 2), (2, 1)]
    );
}

#[test]
fn the_fixture_batches_reach_each_rank_as_in_the_deepspeed_runs() {
    let Some(shared) = shared_dir() else { return };
    let bytes = read(shared.join("reference/gpt2/adamw_trajectory/batches.safetensors"));
    let (shape, ids) = fixture_ids(&bytes, "input_ids");
    assert_eq!(shape, [20, 4, 32]);
    let row = |step: usize, row: usize| -> Vec<u32> {
        ids[(step * 4 + row) * 32..(step * 4 + row + 1) * 32]
            .iter()
            .map(|&id| u32::try_from(id).expect("token id"))
            .collect()
    };
    // The README's two layouts: micro 2 x GA 1 x 2 ranks, and micro 1 x GA 2 x 2 ranks.
    for (micro, accum, expected_rows) in [
        (2, 1, vec![vec![vec![0, 1]], vec![vec![2, 3]]]),
        (1, 2, vec![vec![vec![0], vec![1]], vec![vec![2], vec![3]]]),
    ] {
        let layout = BatchLayout::new(micro, 31, accum, 2).expect("layout");
        let mut source = StoredBatchSource::from_safetensors(
            "batches.safetensors",
            &bytes,
            DEFAULT_TENSOR,
            layout,
        )
        .expect("fixture");
        assert_eq!(source.steps(), Some(20));
        assert!(source.token_bound() <= 256);
        for step in 0..20 {
            for (rank, per_micro) in expected_rows.iter().enumerate() {
                for (micro_step, rows) in per_micro.iter().enumerate() {
                    let at = MicroBatchIndex {
                        step: step as u64,
                        rank,
                        micro_step,
                    };
                    let batch = source.micro_batch(at).expect("batch");
                    assert_eq!(batch.row_len(), 32);
                    assert_eq!(batch.seq_len(), 31);
                    let want: Vec<u32> = rows.iter().flat_map(|&r| row(step, r)).collect();
                    assert_eq!(
                        batch.tokens(),
                        want,
                        "step {step}, rank {rank}, micro-step {micro_step}"
                    );
                }
            }
        }
        assert_eq!(
            source.micro_batch(MicroBatchIndex {
                step: 20,
                rank: 0,
                micro_step: 0
            }),
            Err(DataError::StepOutOfRange {
                step: 20,
                steps: 20
            })
        );
    }
}

#[test]
fn the_forward_backward_inputs_are_one_stored_step_and_labels_with_minus_100_are_refused() {
    let Some(shared) = shared_dir() else { return };
    let inputs = read(shared.join("reference/gpt2/forward_backward/inputs.safetensors"));
    let batches = read(shared.join("reference/gpt2/adamw_trajectory/batches.safetensors"));
    let layout = BatchLayout::new(4, 31, 1, 1).expect("layout");
    let mut single =
        StoredBatchSource::from_safetensors("inputs.safetensors", &inputs, "input_ids", layout)
            .expect("inputs");
    let mut first = StoredBatchSource::from_safetensors(
        "batches.safetensors",
        &batches,
        "input_ids",
        BatchLayout::new(2, 31, 1, 2).expect("layout"),
    )
    .expect("batches");
    assert_eq!(single.steps(), Some(1));
    // The README: inputs["input_ids"] == batches["input_ids"][0].
    assert_eq!(
        single.global_batch(0).expect("inputs"),
        first.global_batch(0).expect("batches")
    );
    assert!(
        StoredBatchSource::from_safetensors("inputs.safetensors", &inputs, "labels", layout)
            .is_ok()
    );
    let refused =
        StoredBatchSource::from_safetensors("inputs.safetensors", &inputs, "shift_labels", layout)
            .expect_err("-100 is not a token");
    assert!(
        matches!(refused, DataError::InvalidToken { value: -100, .. }),
        "{refused:?}"
    );
    // The model's view: llm.c-style inputs/targets are the HF row shifted by one.
    let batch = single.global_batch(0).expect("inputs");
    let (_, ids) = fixture_ids(&inputs, "input_ids");
    assert_eq!(batch.inputs().len(), 4 * 31);
    assert_eq!(i64::from(batch.targets()[0]), ids[1]);
    assert_eq!(i64::from(batch.inputs()[31]), ids[32]);
}
