//! Data sources without reference files: window arithmetic, the rank/micro-step split,
//! shuffling, llm.c files, stored batches and their errors, the bundled corpus.

use std::collections::BTreeSet;
use std::path::PathBuf;

use dsplan_executor::data::{
    BUNDLED_CORPUS, BatchLayout, DataError, LlmcFormat, LlmcProblem, MicroBatchIndex, SplitMix64,
    StoredBatchSource, StreamSource, TokenSource, WindowOrder, bundled_corpus, open,
    parse_llmc_tokens, write_llmc_tokens,
};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

fn layout(micro: usize, seq: usize, accum: usize, world: usize) -> BatchLayout {
    BatchLayout::new(micro, seq, accum, world).expect("layout")
}

/// Tokens whose value is their position (mod 2^16), so a row shows where it was cut.
fn positions(count: usize) -> Vec<u32> {
    (0..count as u32).map(|i| i % 65536).collect()
}

fn at(step: u64, rank: usize, micro_step: usize) -> MicroBatchIndex {
    MicroBatchIndex {
        step,
        rank,
        micro_step,
    }
}

#[test]
fn splitmix64_matches_the_published_test_vectors() {
    let mut rng = SplitMix64::new(1234567);
    let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
    assert_eq!(
        first,
        [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423
        ]
    );
    assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn the_split_is_rank_major_with_micro_steps_inside_a_rank() {
    let l = layout(3, 8, 2, 4);
    assert_eq!(l.global_batch(), 24);
    assert_eq!(l.rows_of(0, 0), Ok(0..3));
    assert_eq!(l.rows_of(0, 1), Ok(3..6));
    assert_eq!(l.rows_of(1, 0), Ok(6..9));
    assert_eq!(l.rows_of(3, 1), Ok(21..24));
    // Every row of the global batch goes to exactly one (rank, micro-step).
    let mut seen = vec![0; l.global_batch()];
    for rank in 0..4 {
        for micro_step in 0..2 {
            for row in l.rows_of(rank, micro_step).expect("rows") {
                seen[row] += 1;
            }
        }
    }
    assert!(seen.iter().all(|&count| count == 1));
    assert_eq!(
        l.rows_of(4, 0),
        Err(DataError::RankOutOfRange { rank: 4, world: 4 })
    );
    assert_eq!(
        l.rows_of(0, 2),
        Err(DataError::MicroStepOutOfRange {
            micro_step: 2,
            grad_accum: 2
        })
    );
}

#[test]
fn layouts_reject_zero_counts() {
    for (index, field) in ["micro_batch", "seq_len", "grad_accum", "world"]
        .into_iter()
        .enumerate()
    {
        let mut counts = [1usize; 4];
        counts[index] = 0;
        let error = BatchLayout::new(counts[0], counts[1], counts[2], counts[3]).expect_err("zero");
        assert_eq!(error, DataError::InvalidLayout { field, value: 0 });
        assert!(error.to_string().contains(field));
    }
    assert_eq!(
        BatchLayout::new(usize::MAX, 2, 2, 1),
        Err(DataError::LayoutTooLarge)
    );
}

#[test]
fn sequential_windows_overlap_by_one_token_and_ranks_take_contiguous_blocks() {
    let l = layout(2, 4, 1, 2); // global batch 4 rows of 5 tokens
    let mut source =
        StreamSource::new("positions", positions(41), l, WindowOrder::Sequential).expect("source");
    assert_eq!(source.windows(), 10); // (41 - 1) / 4
    assert_eq!(source.steps_per_epoch(), 2);
    let rank0 = source.micro_batch(at(0, 0, 0)).expect("batch");
    assert_eq!(rank0.rows(), 2);
    assert_eq!(rank0.tokens(), &[0, 1, 2, 3, 4, 4, 5, 6, 7, 8]);
    assert_eq!(rank0.inputs(), vec![0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(rank0.targets(), vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let rank1 = source.micro_batch(at(0, 1, 0)).expect("batch");
    assert_eq!(rank1.row(0), Some(&[8, 9, 10, 11, 12][..]));
    let step1 = source.micro_batch(at(1, 0, 0)).expect("batch");
    assert_eq!(step1.row(0), Some(&[16, 17, 18, 19, 20][..]));
    // Windows 8 and 9 do not fill a global batch: step 2 starts the next epoch at window 0.
    assert_eq!(
        source.global_batch(2).expect("batch"),
        source.global_batch(0).expect("batch")
    );
}

#[test]
fn micro_batches_of_all_ranks_and_micro_steps_rebuild_the_global_batch() {
    let l = layout(2, 6, 3, 2);
    for order in [WindowOrder::Sequential, WindowOrder::Shuffled { seed: 7 }] {
        let mut source = StreamSource::new("positions", positions(2000), l, order).expect("source");
        for step in [0, 1, 5, 40] {
            let global = source.global_batch(step).expect("global");
            let mut pieces = Vec::new();
            for rank in 0..2 {
                for micro_step in 0..3 {
                    let batch = source
                        .micro_batch(at(step, rank, micro_step))
                        .expect("micro");
                    pieces.extend_from_slice(batch.tokens());
                }
            }
            assert_eq!(pieces, global.tokens(), "{order:?}, step {step}");
        }
    }
}

#[test]
fn shuffled_epochs_visit_every_window_once_in_a_seeded_order() {
    let l = layout(1, 3, 1, 2);
    let tokens = positions(3 * 41 + 1); // 41 windows, 20 steps per epoch, one left over
    let window_starts = |seed: u64, epoch: u64| {
        let mut source = StreamSource::new(
            "positions",
            tokens.clone(),
            l,
            WindowOrder::Shuffled { seed },
        )
        .expect("source");
        let steps = source.steps_per_epoch();
        assert_eq!(steps, 20);
        (epoch * steps..(epoch + 1) * steps)
            .flat_map(|step| {
                let batch = source.global_batch(step).expect("batch");
                batch.iter_rows().map(|row| row[0]).collect::<Vec<_>>()
            })
            .collect::<Vec<u32>>()
    };
    let epoch0 = window_starts(42, 0);
    let distinct: BTreeSet<u32> = epoch0.iter().copied().collect();
    assert_eq!(distinct.len(), 40, "40 distinct windows of 41 per epoch");
    assert!(distinct.iter().all(|start| start % 3 == 0 && *start <= 120));
    assert_eq!(window_starts(42, 0), epoch0, "same seed, same order");
    assert_ne!(window_starts(43, 0), epoch0, "another seed, another order");
    assert_ne!(window_starts(42, 1), epoch0, "another epoch, another order");
    let sequential: Vec<u32> = (0..40).map(|w| w * 3).collect();
    assert_ne!(epoch0, sequential, "the shuffle moved something");
}

#[test]
fn a_stream_too_small_for_one_global_batch_is_an_error_with_the_numbers() {
    let l = layout(2, 10, 2, 2); // 8 rows: needs 8 * 10 + 1 = 81 tokens
    assert!(StreamSource::new("ok", positions(81), l, WindowOrder::Sequential).is_ok());
    let error = StreamSource::from_text("short.txt", &[b'a'; 80], l, WindowOrder::Sequential)
        .expect_err("too small");
    assert_eq!(
        error,
        DataError::TooSmall {
            origin: "short.txt".into(),
            tokens: 80,
            needed: 81,
            global_batch: 8,
            seq_len: 10
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("short.txt") && message.contains("81"),
        "{message}"
    );
    assert!(StreamSource::from_text("empty", b"", l, WindowOrder::Sequential).is_err());
}

#[test]
fn text_is_byte_level_with_a_vocabulary_of_256() {
    let l = layout(1, 4, 1, 1);
    let mut source =
        StreamSource::from_text("t", "héllo wörld".as_bytes(), l, WindowOrder::Sequential)
            .expect("source");
    assert_eq!(source.token_bound(), 256);
    assert_eq!(source.steps(), None);
    let batch = source.micro_batch(at(0, 0, 0)).expect("batch");
    assert_eq!(batch.tokens(), &[104, 0xC3, 0xA9, 108, 108]);
}

#[test]
fn llmc_files_round_trip_in_both_formats() {
    let tokens: Vec<u32> = (0..500).map(|i| (i * 97) % 50257).collect();
    for format in [LlmcFormat::Gpt2, LlmcFormat::Llama3] {
        let bytes = write_llmc_tokens(format, &tokens).expect("write");
        assert_eq!(bytes.len(), 1024 + 500 * format.token_bytes());
        assert_eq!(&bytes[0..4], &format.magic().to_le_bytes());
        assert_eq!(&bytes[8..12], &500i32.to_le_bytes());
        assert_eq!(parse_llmc_tokens(&bytes), Ok((format, tokens.clone())));
        let (found, mut source) =
            StreamSource::from_llmc("t.bin", &bytes, layout(2, 8, 1, 1), WindowOrder::Sequential)
                .expect("source");
        assert_eq!(found, format);
        assert_eq!(
            source.token_bound(),
            tokens.iter().max().map(|m| m + 1).expect("max")
        );
        assert_eq!(
            source.micro_batch(at(1, 0, 0)).expect("batch").row(0),
            Some(&tokens[16..25])
        );
    }
    assert_eq!(write_llmc_tokens(LlmcFormat::Gpt2, &[1, 70000]), Err(1));
}

#[test]
fn malformed_llmc_files_are_rejected_with_the_reason() {
    let good = write_llmc_tokens(LlmcFormat::Gpt2, &[1, 2, 3]).expect("write");
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        edit(&mut bytes);
        parse_llmc_tokens(&bytes).expect_err("malformed")
    };
    assert_eq!(
        with(&|b| b.truncate(1000)),
        LlmcProblem::ShortHeader { bytes: 1000 }
    );
    assert_eq!(
        with(&|b| b[0..4].copy_from_slice(&20240521i32.to_le_bytes())),
        LlmcProblem::BadMagic { found: 20240521 }
    );
    assert_eq!(
        with(&|b| b[4..8].copy_from_slice(&7i32.to_le_bytes())),
        LlmcProblem::BadVersion {
            magic: 20240520,
            found: 7,
            expected: 1
        }
    );
    assert_eq!(
        with(&|b| b[8..12].copy_from_slice(&(-3i32).to_le_bytes())),
        LlmcProblem::NegativeCount { count: -3 }
    );
    assert_eq!(
        with(&|b| b.push(0)),
        LlmcProblem::SizeMismatch {
            tokens: 3,
            expected_bytes: 1030,
            actual_bytes: 1031
        }
    );
    let error = StreamSource::from_llmc(
        "data.bin",
        b"not a token file",
        layout(1, 1, 1, 1),
        WindowOrder::Sequential,
    )
    .expect_err("malformed");
    assert!(
        error
            .to_string()
            .contains("`data.bin` is not an llm.c token file")
    );
}

/// A safetensors file with one tensor `name` of `dtype` and `shape` holding `values`.
fn safetensors_file(name: &str, dtype: Dtype, shape: &[usize], values: &[i64]) -> Vec<u8> {
    let data: Vec<u8> = match dtype {
        Dtype::I64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::I32 => values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        Dtype::U16 => values
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        Dtype::F32 => values
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        other => panic!("test helper does not write {other:?}"),
    };
    let view = TensorView::new(dtype, shape.to_vec(), &data).expect("view");
    safetensors::serialize([(name, view)], None).expect("serialize")
}

#[test]
fn stored_batches_are_used_step_by_step_and_split_like_the_reference() {
    // 3 steps x 4 rows x 5 tokens; value = 100 * step + 10 * row + position.
    let values: Vec<i64> = (0..3)
        .flat_map(|s| (0..4).flat_map(move |r| (0..5).map(move |t| 100 * s + 10 * r + t)))
        .collect();
    for dtype in [Dtype::I64, Dtype::I32, Dtype::U16] {
        let bytes = safetensors_file("input_ids", dtype, &[3, 4, 5], &values);
        let mut source = StoredBatchSource::from_safetensors(
            "b.safetensors",
            &bytes,
            "input_ids",
            layout(1, 4, 2, 2),
        )
        .expect("source");
        assert_eq!(source.steps(), Some(3));
        assert_eq!(source.token_bound(), 235);
        // Rank 1, micro-step 0 of step 2 is global row 1 * 1 * 2 + 0 = 2.
        let batch = source.micro_batch(at(2, 1, 0)).expect("batch");
        assert_eq!(batch.tokens(), &[220, 221, 222, 223, 224]);
        assert_eq!(
            source.micro_batch(at(3, 0, 0)),
            Err(DataError::StepOutOfRange { step: 3, steps: 3 })
        );
    }
    // A two-dimensional tensor is one step.
    let bytes = safetensors_file("input_ids", Dtype::I64, &[4, 5], &values[..20]);
    let mut source = StoredBatchSource::from_safetensors(
        "one.safetensors",
        &bytes,
        "input_ids",
        layout(4, 4, 1, 1),
    )
    .expect("source");
    assert_eq!(source.steps(), Some(1));
    assert_eq!(
        source.global_batch(0).expect("batch").row(3),
        Some(&[30, 31, 32, 33, 34][..])
    );
}

#[test]
fn stored_batches_reject_wrong_names_dtypes_shapes_and_values() {
    let l = layout(2, 4, 1, 2);
    let open = |bytes: &[u8]| {
        StoredBatchSource::from_safetensors("f.safetensors", bytes, "input_ids", l)
            .expect_err("rejected")
    };
    let values = vec![1i64; 40];
    let missing = open(&safetensors_file("tokens", Dtype::I64, &[2, 4, 5], &values));
    assert!(
        matches!(&missing, DataError::MissingTensor { available, .. } if available == &["tokens"])
    );
    assert!(missing.to_string().contains("it has: tokens"));
    let dtype = open(&safetensors_file(
        "input_ids",
        Dtype::F32,
        &[2, 4, 5],
        &values,
    ));
    assert!(matches!(&dtype, DataError::UnsupportedDtype { dtype, .. } if dtype == "F32"));
    for shape in [&[40][..], &[1, 2, 4, 5], &[0, 4, 5]] {
        let error = open(&safetensors_file(
            "input_ids",
            Dtype::I64,
            shape,
            &values[..shape.iter().product::<usize>()],
        ));
        assert!(
            matches!(error, DataError::WrongShape { .. }),
            "{shape:?}: {error:?}"
        );
    }
    let row = open(&safetensors_file(
        "input_ids",
        Dtype::I64,
        &[2, 5, 4],
        &values,
    ));
    assert_eq!(
        row,
        DataError::RowLength {
            origin: "f.safetensors".into(),
            stored: 4,
            expected: 5
        }
    );
    assert!(row.to_string().contains("set seq_len to 3"));
    let batch = open(&safetensors_file(
        "input_ids",
        Dtype::I64,
        &[4, 2, 5],
        &values,
    ));
    assert!(matches!(
        batch,
        DataError::GlobalBatch {
            stored: 2,
            expected: 4,
            ..
        }
    ));
    let mut negative = values.clone();
    negative[7] = -100;
    assert_eq!(
        open(&safetensors_file(
            "input_ids",
            Dtype::I64,
            &[2, 4, 5],
            &negative
        )),
        DataError::InvalidToken {
            origin: "f.safetensors".into(),
            index: 7,
            value: -100
        }
    );
    assert!(matches!(open(b"garbage"), DataError::Safetensors { .. }));
}

#[test]
fn row_buffers_of_the_wrong_length_are_rejected() {
    let mut source = StreamSource::new(
        "p",
        positions(100),
        layout(1, 4, 1, 1),
        WindowOrder::Sequential,
    )
    .expect("source");
    let mut out = vec![0; 4];
    assert_eq!(
        source.fill_row(0, 0, &mut out),
        Err(DataError::RowBuffer {
            found: 4,
            expected: 5
        })
    );
    assert_eq!(
        source.fill_row(0, 1, &mut [0; 5]),
        Err(DataError::RowOutOfRange {
            row: 1,
            global_batch: 1
        })
    );
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dsplan-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn open_picks_the_format_by_extension() {
    let dir = TempDir::new("data-open");
    let l = layout(1, 4, 1, 2);
    let text = dir.0.join("corpus.txt");
    std::fs::write(&text, b"abcdefghijklmnop").expect("write");
    let mut source = open(&text, l, WindowOrder::Sequential).expect("text");
    assert_eq!(
        source.micro_batch(at(0, 1, 0)).expect("batch").tokens(),
        b"efghi".map(u32::from)
    );

    let bin = dir.0.join("tokens.bin");
    std::fs::write(
        &bin,
        write_llmc_tokens(LlmcFormat::Gpt2, &positions(30)).expect("bin"),
    )
    .expect("write");
    let mut source = open(&bin, l, WindowOrder::Sequential).expect("bin");
    assert_eq!(
        source.micro_batch(at(1, 1, 0)).expect("batch").tokens(),
        &[12, 13, 14, 15, 16]
    );

    let stored = dir.0.join("batches.safetensors");
    let values: Vec<i64> = (0..10).collect();
    std::fs::write(
        &stored,
        safetensors_file("input_ids", Dtype::I64, &[1, 2, 5], &values),
    )
    .expect("write");
    let mut source = open(&stored, l, WindowOrder::Shuffled { seed: 1 }).expect("stored");
    assert_eq!(
        source.micro_batch(at(0, 1, 0)).expect("batch").tokens(),
        &[5, 6, 7, 8, 9]
    );

    let missing = dir.0.join("missing.txt");
    let error = open(&missing, l, WindowOrder::Sequential)
        .err()
        .expect("missing file");
    assert!(matches!(&error, DataError::Io { path, .. } if path.ends_with("missing.txt")));
    assert!(error.to_string().starts_with("cannot read `"));
}

#[test]
fn the_bundled_corpus_is_small_plain_text_and_trains_out_of_the_box() {
    assert!(
        (100_000..=300_000).contains(&BUNDLED_CORPUS.len()),
        "{}",
        BUNDLED_CORPUS.len()
    );
    assert!(
        BUNDLED_CORPUS
            .iter()
            .all(|&b| b == b'\n' || (b' '..=b'~').contains(&b))
    );
    let on_disk = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/tiny_corpus.txt"
    ))
    .expect("data/tiny_corpus.txt");
    assert_eq!(on_disk, BUNDLED_CORPUS);
    let mut source =
        bundled_corpus(layout(4, 64, 2, 2), WindowOrder::Shuffled { seed: 1 }).expect("bundled");
    assert_eq!(source.token_bound(), 256);
    assert!(
        source.steps_per_epoch() > 100,
        "{}",
        source.steps_per_epoch()
    );
    let batch = source.micro_batch(at(3, 1, 1)).expect("batch");
    assert_eq!((batch.rows(), batch.row_len()), (4, 65));
}
