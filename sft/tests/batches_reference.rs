//! Micro-batches collated here equal TRL's collator output in `batches*.safetensors`,
//! micro-batch by micro-batch and eval batch by eval batch, for every run (both ranks of
//! text_ws2): input ids, labels with -100, attention masks (padded) or position ids
//! (padding-free), and shapes. The train rows come from `trajectory.json`'s sample indices;
//! the eval rows from [`eval_batches`]. Skips without `../shared`.

mod support;

use dsplan_sft::{Collation, MicroBatch, collate, eval_batches};
use safetensors::SafeTensors;
use support::{RUNS, Run, tensor};

fn widen<T: Copy + Into<i64>>(values: &[T]) -> Vec<i64> {
    values.iter().map(|&v| v.into()).collect()
}

fn assert_batch(file: &SafeTensors<'_>, prefix: &str, batch: &MicroBatch) {
    let (ids, shape) =
        tensor(file, &format!("{prefix}.input_ids")).unwrap_or_else(|| panic!("{prefix} missing"));
    assert_eq!(shape, [batch.rows, batch.seq_len], "{prefix}: shape");
    assert_eq!(widen(&batch.input_ids), ids, "{prefix}: input_ids");
    let (labels, _) = tensor(file, &format!("{prefix}.labels")).expect("labels");
    assert_eq!(batch.labels, labels, "{prefix}: labels");
    let mask = tensor(file, &format!("{prefix}.attention_mask")).map(|(v, _)| v);
    assert_eq!(
        batch.attention_mask.as_deref().map(widen),
        mask,
        "{prefix}: attention_mask"
    );
    let positions = tensor(file, &format!("{prefix}.position_ids")).map(|(v, _)| v);
    assert_eq!(
        batch.position_ids.as_deref().map(widen),
        positions,
        "{prefix}: position_ids"
    );
}

#[test]
fn batches_equal_trl_collator_for_every_run_and_rank() {
    let Some(root) = support::reference() else {
        return;
    };
    let mut compared = 0;
    for name in RUNS {
        let run = Run::read(&root, name);
        let settings = run.settings();
        let collation = Collation::for_run(&run.tokenizer(), &settings).expect("collation");
        let train = run.prepare("train").rows;
        let eval = run.prepare("eval").rows;
        let steps = run.sample_indices();
        let eval_size = run
            .config("per_device_eval_batch_size")
            .as_u64()
            .expect("eval bs") as usize;
        let eval_order = eval_batches(eval.len(), eval_size, run.world_size());
        for rank in 0..run.world_size() {
            let bytes = run.batches_file(rank);
            let file = SafeTensors::deserialize(&bytes).expect("safetensors");
            for (step, ranks) in steps.iter().enumerate() {
                for (micro, indices) in ranks[rank].iter().enumerate() {
                    let batch = collate(&train, indices, collation);
                    assert_batch(&file, &format!("train.step{step:02}.micro{micro}"), &batch);
                    compared += 1;
                }
            }
            for (at, indices) in eval_order[rank].iter().enumerate() {
                let batch = collate(&eval, indices, collation);
                assert_batch(&file, &format!("eval.batch{at:02}"), &batch);
                compared += 1;
            }
            let stored_eval = file
                .names()
                .iter()
                .filter(|n| n.starts_with("eval.") && n.ends_with(".labels"))
                .count();
            assert_eq!(
                stored_eval,
                eval_order[rank].len(),
                "{name} rank {rank}: eval batch count"
            );
        }
    }
    // 6 one-rank runs and 2 ranks of text_ws2, 20 micro-batches each; eval: 3 batches for 5
    // runs, 2 packed bins batches, 2 per rank of text_ws2.
    assert_eq!(compared, 6 * 20 + 2 * 20 + 5 * 3 + 2 + 2 * 2);
}
