//! The prepared stream is cached next to the data: a second open reads it back equal to the
//! first, a change of data or settings makes a new key, a damaged file is never used but named
//! and replaced,
//! and no temporary file is left behind. Skips without `../shared`.

mod support;

use dsplan_sft::{CacheDir, CacheUse, DatasetOptions, PrepareSettings, open_prepared};

#[test]
fn second_open_reads_the_cache_and_a_damaged_one_is_replaced() {
    let Some(root) = support::reference() else {
        return;
    };
    let run = support::Run::read(&root, "text_packed");
    let tokenizer = run.tokenizer();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("train.jsonl");
    std::fs::copy(run.data("train_file"), &data).expect("copy");
    let options = DatasetOptions::default();
    let settings = run.settings();
    let open = |settings: &PrepareSettings| {
        open_prepared(&data, &options, &tokenizer, settings, &CacheDir::NextToData)
    };

    let (first, how) = open(&settings).expect("prepares");
    assert_eq!(how, CacheUse::Written);
    let (again, how) = open(&settings).expect("reads");
    assert_eq!(how, CacheUse::Hit);
    assert_eq!(again, first);
    let cache_dir = dir.path().join(".dsplan-cache");
    let files: Vec<_> = std::fs::read_dir(&cache_dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one cache file, no temporary left: {files:?}"
    );

    let unpacked = PrepareSettings {
        packing: dsplan_sft::Packing::Off,
        ..settings
    };
    assert_eq!(
        open(&unpacked).expect("prepares").1,
        CacheUse::Written,
        "new settings, new key"
    );

    let mut bytes = std::fs::read(&files[0]).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&files[0], &bytes).expect("write");
    let (rebuilt, how) = open(&settings).expect("prepares again");
    let CacheUse::Replaced(why) = how else {
        panic!("a damaged cache is replaced, not {how:?}");
    };
    assert!(
        why.to_string()
            .contains(&format!("{}: fails its checksum", files[0].display())),
        "{why}"
    );
    assert_eq!(rebuilt, first, "the damaged file is not used");
    assert_eq!(
        open(&settings).expect("reads").1,
        CacheUse::Hit,
        "and is replaced"
    );
    bytes.truncate(10);
    std::fs::write(&files[0], &bytes).expect("write");
    let (_, how) = open(&settings).expect("prepares again");
    assert!(
        matches!(&how, CacheUse::Replaced(why)
            if why.to_string().contains("not a dsplan token cache")
                || why.to_string().contains("checksum")),
        "{how:?}"
    );

    std::fs::write(&data, "{\"text\": \"new data\"}\n").expect("write");
    let (changed, how) = open(&settings).expect("prepares");
    assert_eq!(
        (how, changed.rows.len()),
        (CacheUse::Written, 1),
        "edited data, new key"
    );
}

#[test]
fn masked_labels_come_back_from_the_cache() {
    let Some(root) = support::reference() else {
        return;
    };
    let run = support::Run::read(&root, "messages_assistant_only");
    let tokenizer = run.tokenizer();
    let cache = tempfile::tempdir().expect("temp dir");
    let open = || {
        open_prepared(
            &run.data("train_file"),
            &DatasetOptions::default(),
            &tokenizer,
            &run.settings(),
            &CacheDir::At(cache.path().to_path_buf()),
        )
        .expect("opens")
    };
    let (first, how) = open();
    assert_eq!(how, CacheUse::Written);
    assert!(first.rows[0].label_values().contains(&dsplan_sft::IGNORE));
    let (again, how) = open();
    assert_eq!((how, again), (CacheUse::Hit, first));
}
