//! `--eval-split F`: the records of a dataset split as `train_test_split(test_size=F,
//! shuffle=False)` splits them, each side prepared (and packed) on its own: equal, row for row,
//! to preparing the first records and the last ones as two files. The split is cached per side
//! and read back. Skips without `../shared`.

mod support;

use std::path::Path;

use dsplan_sft::{
    CacheDir, CacheUse, DatasetReader, HeldOut, OnBadRow, PreparedSet, open_split, prepare_dataset,
};
use support::Run;

/// The ids and labels of every row, without the record numbers (those of a file of the last
/// records start again from 0).
fn tokens(set: &PreparedSet) -> Vec<(Vec<u32>, Vec<i64>)> {
    set.rows
        .iter()
        .map(|row| (row.input_ids.clone(), row.label_values()))
        .collect()
}

fn prepare_file(run: &Run, path: &Path) -> PreparedSet {
    let reader = DatasetReader::open(path, Default::default()).expect("opens");
    prepare_dataset(reader, &run.tokenizer(), &run.settings(), OnBadRow::Stop).expect("prepares")
}

#[test]
fn a_split_equals_its_two_halves_prepared_as_files() {
    let Some(root) = support::reference() else {
        return;
    };
    for (name, fraction) in [("text", 0.05), ("text_packed", 0.1), ("messages", 0.3)] {
        let run = Run::read(&root, name);
        let data = run.data("train_file");
        let text = std::fs::read_to_string(&data).expect("data");
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let eval_count = (fraction * lines.len() as f64).ceil() as usize;
        let boundary = lines.len() - eval_count;
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |file: &str, part: &[&str]| {
            let path = dir.path().join(file);
            std::fs::write(&path, part.join("\n") + "\n").expect("write");
            path
        };
        let first = prepare_file(&run, &write("first.jsonl", &lines[..boundary]));
        let last = prepare_file(&run, &write("last.jsonl", &lines[boundary..]));

        let copy = dir.path().join("data.jsonl");
        std::fs::copy(&data, &copy).expect("copy");
        let held_out = HeldOut::new(fraction).expect("fraction");
        let split = |cache: &CacheDir| {
            open_split(
                &copy,
                &Default::default(),
                &run.tokenizer(),
                &run.settings(),
                cache,
                held_out,
            )
            .expect("splits")
        };
        let ((train, eval), how) = split(&CacheDir::NextToData);
        assert_eq!(how, CacheUse::Written, "{name}");
        assert_eq!(tokens(&train), tokens(&first), "{name}: the train side");
        assert_eq!(tokens(&eval), tokens(&last), "{name}: the eval side");
        assert!(
            eval.rows
                .iter()
                .flat_map(|row| &row.source_rows)
                .all(|&r| r >= boundary as u64),
            "{name}: eval rows hold only the last records"
        );
        let ((train_again, eval_again), how) = split(&CacheDir::NextToData);
        assert_eq!(
            how,
            CacheUse::Hit,
            "{name}: the second open reads the cache"
        );
        assert_eq!((train_again, eval_again), (train, eval), "{name}: cached");
        eprintln!(
            "{name:12} {fraction}: {} records, {} train rows, {} eval rows",
            lines.len(),
            first.rows.len(),
            last.rows.len()
        );
    }
}
