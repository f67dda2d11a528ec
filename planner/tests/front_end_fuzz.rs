//! A fuzz test of the config front end: every corpus config of `../shared/corpus/ds_configs/`,
//! mutated (bytes flipped, inserted, deleted, cut, spliced with the shapes below), plus the
//! shapes that broke it before (a huge value, deep nesting, control characters, thousands of
//! duplicate keys, keys under two spellings), through the reader, `validate_source` and
//! `resolve`. No input may panic; a fatal parse error must be located; the whole run is
//! bounded (a fixed number of cases, a seeded generator: the same cases every run).
//! `tests/front_end_fuzz_cli.rs` sends a sample of the same shapes through the binary.

use std::path::{Path, PathBuf};

use dsplan_planner::resolve::{Environment, resolve};
use dsplan_planner::source::SourceFile;
use dsplan_planner::validate::{ValidateOptions, validate_source};

/// Mutated copies of each corpus file.
const MUTANTS_PER_FILE: usize = 40;

fn corpus_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/ds_configs");
    dir.is_dir().then_some(dir)
}

/// xorshift64*: a small seeded generator, so every run tries the same cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Fragments spliced into files: the shapes of issue 14.
const FRAGMENTS: &[&[u8]] = &[
    b"\"\\u001b]0;pwned\\u0007\\u001b[2J\": 1,",
    b"\x1b[2J\x07",
    b"\"train_batch_size\": 8, \"train_batch_size\": 8,",
    b"\"zero_optimization\": {\"prefetch_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": 5},",
    b"\"activation_checkpointing\": {\"partition_activation\": true},",
    b"\"fp16\": {\"enabled\": true, \"loss_scale\": 8, \"loss_scale_window\": 0, \"min_loss_scale\": -1},",
    b"\"train_micro_batch_size_per_gpu\": 9007199254740993,",
    b"\"optimizer\": {\"type\": \"Muon\", \"params\": {\"lr\": -1}},",
    b"1e400",
    b"[[[[[[[[[[[[[[[[[[[[",
    b"\"auto\"",
    b"\xff\xfe",
    b"// comment\n",
    b",}",
    b"\"\\ud800\"",
    // The sections closed later, and the range table's knobs.
    b"\"autotuning\": {\"enabeld\": true, \"model_info\": {\"num_layer\": 2}},",
    b"\"timers\": {\"throughputs\": {}},",
    b"\"checkpoint\": {\"writer\": {\"decouple\": true}},",
    b"\"optimizer\": {\"type\": \"AdamW\", \"param\": {\"lr\": 1}},",
    b"\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_mom\": 1.5, \"decay_lr_rate\": -1, \"cycle_min_lr\": -1}},",
    b"\"pipeline\": {\"pipe_partitoned\": true, \"chunks\": 4},",
    b"\"expert_parallel\": {\"autoep_sise\": 2, \"expert_w3\": null},",
    b"\"aio\": {\"block_size\": 0, \"queue_depth\": 0, \"intra_op_parallelism\": 0},",
    b"\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 0, \"max_live_parameters\": 0, \"offload_param\": {\"device\": \"nvme\", \"buffer_count\": 0}},",
    // Issue 33: hysteresis 0, short-name stage-3 autos, a quoted number.
    b"\"fp16\": {\"enabled\": true, \"hysteresis\": 0},",
    b"\"zero_optimization\": {\"stage\": 3, \"param_persistence_threshold\": \"auto\"},",
    b"\"train_batch_size\": \"4\",",
];

fn mutate(rng: &mut Rng, original: &[u8]) -> Vec<u8> {
    let mut bytes = original.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(5) {
            0 if !bytes.is_empty() => {
                let at = at.min(bytes.len() - 1);
                bytes[at] ^= 1 << rng.below(8);
            }
            1 => bytes.insert(at, rng.next() as u8),
            2 if at < bytes.len() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ => {
                let fragment = FRAGMENTS[rng.below(FRAGMENTS.len())];
                bytes.splice(at..at, fragment.iter().copied());
            }
        }
    }
    bytes
}

/// The shapes, whole.
fn shapes() -> Vec<Vec<u8>> {
    let mut duplicates = String::from("{");
    for _ in 0..4000 {
        duplicates.push_str("\"train_batch_size\": 8, ");
    }
    duplicates.push_str("\"steps_per_print\": 1}");
    vec![
        format!("{{\"a\": \"{}\"}}", "x".repeat(8 << 20)).into_bytes(),
        format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
        format!("{{\"a\": {}1{}}}", "{\"b\": ".repeat(300), "}".repeat(300)).into_bytes(),
        duplicates.into_bytes(),
        b"{\"\\u001b]0;pwned\\u0007\\u001b[2J\": 1}".to_vec(),
        b"{\"a\": 1,\x1b[2J \x07}".to_vec(),
        vec![0; 4096],
        Vec::new(),
        // Every closed section with a typo and every range entry broken, in one file.
        format!("{{{} \"train_batch_size\": 8}}", FRAGMENTS[15..].iter().map(|f| String::from_utf8_lossy(f)).collect::<String>()).into_bytes(),
        // Issue 33: 200,000 duplicate keys, and 100,000 mistyped items of one list: each kind
        // of diagnostic is capped.
        format!("{{{}\"a\": 1}}", "\"a\": 1,".repeat(200_000)).into_bytes(),
        format!(
            "{{\"optimizer\": {{\"type\": \"Adam\", \"params\": {{\"betas\": [{}\"x\"]}}}}}}",
            "\"x\",".repeat(100_000)
        )
        .into_bytes(),
        // A refused value three levels down.
        b"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"buffer_count\": -1}}}".to_vec(),
    ]
}

/// Runs one input through the front end; panics only on a broken contract.
fn check(name: &str, bytes: &[u8]) {
    match validate_source(
        name,
        bytes,
        ValidateOptions {
            world_size: Some(8),
        },
    ) {
        Ok((file, found)) => {
            // Each kind is capped (dsplan_planner::capped): at most PER_KIND and one summary.
            let mut kinds = std::collections::HashMap::new();
            for diagnostic in &found {
                *kinds
                    .entry((diagnostic.code, diagnostic.severity))
                    .or_insert(0usize) += 1;
            }
            for (kind, count) in kinds {
                assert!(
                    count <= dsplan_planner::capped::PER_KIND + 1,
                    "{name}: {count} diagnostics of {kind:?}"
                );
            }
            for diagnostic in &found {
                assert!(
                    diagnostic.line.is_some(),
                    "{name}: unlocated {diagnostic:?}"
                );
            }
            if let Ok((file, _)) = SourceFile::parse(name, file.text().as_bytes()) {
                let env = Environment {
                    world_size: Some(8),
                    ..Environment::default()
                };
                // Every error resolve gives is placed in the file, however deep its field.
                if let Err(mut errors) = resolve(file.value(), &env) {
                    file.locate_all(&mut errors);
                    for error in &errors {
                        assert!(error.line.is_some(), "{name}: unlocated {error:?}");
                    }
                }
            }
        }
        Err(fatal) => {
            assert!(!fatal.is_empty(), "{name}: an empty fatal list");
            assert!(
                fatal.iter().any(|d| d.is_error()),
                "{name}: fatal without an error"
            );
        }
    }
}

#[test]
fn mutated_corpus_files_and_known_shapes_never_break_the_front_end() {
    let mut cases = 0usize;
    for (at, shape) in shapes().iter().enumerate() {
        check(&format!("shape-{at}.json"), shape);
        cases += 1;
    }
    let Some(dir) = corpus_dir() else {
        eprintln!("skipping the corpus mutants: ../shared/corpus/ds_configs not found");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for path in &files {
        let original = std::fs::read(path).expect("corpus file");
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        check(&name, &original);
        cases += 1;
        for k in 0..MUTANTS_PER_FILE {
            check(&format!("{name}#{k}"), &mutate(&mut rng, &original));
            cases += 1;
        }
    }
    eprintln!("front-end fuzz: {cases} cases");
    assert!(cases > files.len() * MUTANTS_PER_FILE, "{cases} cases");
}
