//! Every run's train and eval data, prepared here, equal TRL's `prepared_{train,eval}.jsonl`
//! exactly: token ids, labels (with -100), source rows and, for packed bins, the document
//! lengths. Skips without `../shared`.

mod support;

use support::{RUNS, Run, ints};

#[test]
fn prepared_rows_equal_trl_for_every_run() {
    let Some(root) = support::reference() else {
        return;
    };
    let mut compared = 0;
    for name in RUNS {
        let run = Run::read(&root, name);
        for split in ["train", "eval"] {
            let ours = run.prepare(split);
            let expected = run.expected_rows(split);
            assert_eq!(ours.rows.len(), expected.len(), "{name} {split}: row count");
            for (row, want) in ours.rows.iter().zip(&expected) {
                let at = want["index"].as_u64().expect("index");
                let ids: Vec<i64> = row.input_ids.iter().map(|&id| i64::from(id)).collect();
                assert_eq!(
                    ids,
                    ints(&want["input_ids"]),
                    "{name} {split} row {at}: ids"
                );
                assert_eq!(
                    row.label_values(),
                    ints(&want["labels"]),
                    "{name} {split} row {at}: labels"
                );
                let sources: Vec<i64> = row.source_rows.iter().map(|&r| r as i64).collect();
                assert_eq!(
                    sources,
                    ints(&want["source_rows"]),
                    "{name} {split} row {at}"
                );
                if let Some(lengths) = want.get("seq_lengths") {
                    let ours: Vec<i64> = row.seq_lengths.iter().map(|&l| i64::from(l)).collect();
                    assert_eq!(ours, ints(lengths), "{name} {split} row {at}: seq_lengths");
                }
                compared += 1;
            }
        }
    }
    assert!(compared > 1000, "{compared} rows compared");
}

#[test]
fn long_prompts_are_dropped_and_counted() {
    let Some(root) = support::reference() else {
        return;
    };
    let prepared = Run::read(&root, "prompt_completion").prepare("train");
    assert_eq!((prepared.rows.len(), prepared.dropped_all_masked), (148, 2));
    let packed = Run::read(&root, "text_packed").prepare("train");
    assert_eq!((packed.rows.len(), packed.dropped_all_masked), (90, 0));
}
