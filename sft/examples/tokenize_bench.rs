//! Tokenization throughput: builds a ~100 MB JSONL (language-modelling rows, the fixtures'
//! texts with each row's number woven in so the words vary) and a ~20 MB conversational one in
//! a temporary directory, prepares each as TRL does (tokenize, label, truncate; in parallel)
//! twice, by the `tokenizers` crate's path (the baseline) and by the fast path, checks that
//! both give the same rows, and prints MB/s of each and their ratio, then the time to reopen
//! the same data from its token cache.
//!
//! `cargo run --release -p dsplan-sft --example tokenize_bench [-- MEGABYTES [fast-only|text-only]]`
//! (`fast-only`: three preparations by the fast path and their median, nothing else; also for
//! a profiler; `text-only`: the same for the language-modelling data alone, for paired A/B
//! runs)
//! (needs `../shared/reference/sft`, or `$DSPLAN_SHARED_DIR`).

/// The allocator of the `dsplan` binary, so that the bench times what `dsplan run` does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dsplan_sft::{
    AddSpecial, CacheDir, CacheUse, DatasetOptions, DatasetReader, EncodePath, Example,
    HfTokenizer, PrepareSettings, RenderRequest, open_prepared,
};

fn reference() -> Result<PathBuf, String> {
    let shared = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    let dir = shared.join("reference/sft");
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "{} not found: set DSPLAN_SHARED_DIR",
            dir.display()
        ))
    }
}

/// Writes `megabytes` of JSONL made from the lines of `source`, each with its row number at
/// the start of its first `field` string, and returns the bytes written.
fn build(source: &Path, target: &Path, field: &str, megabytes: usize) -> Result<u64, String> {
    let marker = format!("\"{field}\": \"");
    let text = std::fs::read_to_string(source).map_err(|e| format!("{}: {e}", source.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let file = std::fs::File::create(target).map_err(|e| e.to_string())?;
    let mut out = std::io::BufWriter::new(file);
    let (mut written, limit, mut row) = (0u64, (megabytes as u64) << 20, 0usize);
    while written < limit {
        let line = lines[row % lines.len()];
        let varied = line.replacen(&marker, &format!("{marker}row {row}: "), 1);
        writeln!(out, "{varied}").map_err(|e| e.to_string())?;
        written += varied.len() as u64 + 1;
        row += 1;
    }
    out.flush().map_err(|e| e.to_string())?;
    settle(target)?;
    Ok(written)
}

/// Writes `path` (a file, or every file of a directory) to the disk, so that the next timed
/// run does not share the machine with the kernel writing it back (dsplan does not sync its
/// token cache: in a run that writeback overlaps training, not the preparation).
fn settle(path: &Path) -> Result<(), String> {
    let sync = |file: &Path| {
        std::fs::File::open(file)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("{}: {e}", file.display()))
    };
    if path.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| e.to_string())? {
            sync(&entry.map_err(|e| e.to_string())?.path())?;
        }
        Ok(())
    } else {
        sync(path)
    }
}

/// CPU seconds this process has used (user and system, all threads), from `/proc/self/stat`
/// (in ticks of 1/100 s); `None` where it cannot be read. On a shared machine wall-clock rates
/// swing with other work, so the bench also prints MB per CPU-second, which swings less (other
/// work still costs it caches and hyperthreads).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks = |at: usize| fields.get(at)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// MB per CPU-second over `cpu` (or "?").
fn per_cpu(mb: f64, cpu: Option<f64>) -> String {
    cpu.filter(|&c| c > 0.0)
        .map_or_else(|| "?".to_string(), |c| format!("{:.1}", mb / c))
}

/// One preparation of `data` into a fresh cache directory: the set and the seconds it took.
fn prepare_once(
    data: &Path,
    tokenizer: &HfTokenizer,
    cache: &Path,
) -> Result<(dsplan_sft::PreparedSet, f64, Option<f64>), String> {
    let cpu = cpu_seconds();
    let options = DatasetOptions::default();
    let settings = PrepareSettings::default();
    let dir = CacheDir::At(cache.to_path_buf());
    let start = Instant::now();
    let (set, how) =
        open_prepared(data, &options, tokenizer, &settings, &dir).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu.zip(cpu_seconds()).map(|(before, after)| after - before);
    settle(cache)?;
    if how != CacheUse::Written {
        return Err(format!(
            "{}: the first open did not prepare",
            data.display()
        ));
    }
    Ok((set, seconds, cpu))
}

/// Where the time of one preparation goes, each stage timed alone on the same data: reading
/// and parsing the records, rendering the chat template (conversations), encoding by the
/// crate's path and by the fast path (in parallel, as the prepare step does).
fn stages(data: &Path, fast: &HfTokenizer, by_crate: &HfTokenizer) -> Result<String, String> {
    use rayon::prelude::*;
    let start = Instant::now();
    let examples = DatasetReader::open(data, DatasetOptions::default())
        .and_then(|mut reader| reader.read_all())
        .map_err(|e| e.to_string())?;
    let read = start.elapsed().as_secs_f64();
    let texts = |tokenizer: &HfTokenizer| -> Result<Vec<String>, String> {
        examples
            .par_iter()
            .map(|sourced| match &sourced.example {
                Example::Text(text) => Ok(text.clone()),
                Example::Messages(messages) => {
                    let template = tokenizer.chat_template().ok_or("no chat template")?;
                    template
                        .render(RenderRequest {
                            messages,
                            add_generation_prompt: false,
                            special: tokenizer.special(),
                        })
                        .map(|rendered| rendered.text)
                }
                Example::PromptCompletion { .. } => Err("not benchmarked".to_string()),
            })
            .collect()
    };
    let start = Instant::now();
    let rendered = texts(fast)?;
    let render = start.elapsed().as_secs_f64();
    let offsets = fast
        .chat_template()
        .is_some_and(|t| t.has_generation_blocks());
    let encode = |tokenizer: &HfTokenizer| -> Result<(f64, usize), String> {
        let start = Instant::now();
        let tokens = rendered
            .par_iter()
            .map(|text| {
                if offsets {
                    tokenizer
                        .encode_with_offsets(text, AddSpecial::No)
                        .map(|e| e.ids.len())
                } else {
                    tokenizer.encode(text, AddSpecial::Yes).map(|ids| ids.len())
                }
            })
            .try_reduce(|| 0, |a, b| Ok(a + b))?;
        Ok((start.elapsed().as_secs_f64(), tokens))
    };
    let (crate_encode, crate_tokens) = encode(by_crate)?;
    let (fast_encode, fast_tokens) = encode(fast)?;
    if crate_tokens != fast_tokens {
        return Err("the paths give different token counts".to_string());
    }
    let what = if offsets { "with offsets" } else { "ids" };
    let render = match examples.first().map(|s| &s.example) {
        Some(Example::Messages(_)) => format!("render {render:.2} s, "),
        _ => String::new(),
    };
    Ok(format!(
        "stages alone: read+parse {read:.2} s, {render}encode {what}: crate {crate_encode:.2} s, \
         fast {fast_encode:.2} s ({:.2}x)",
        crate_encode / fast_encode
    ))
}

/// A digest of every row's ids, labels, sources and lengths, and the counts.
fn digest(set: &dsplan_sft::PreparedSet) -> (u64, usize, u64) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for row in &set.rows {
        row.input_ids.hash(&mut hasher);
        row.labels.hash(&mut hasher);
        row.source_rows.hash(&mut hasher);
        row.seq_lengths.hash(&mut hasher);
    }
    (hasher.finish(), set.rows.len(), set.dropped_all_masked)
}

/// Preparations by the fast path in `fast-only` mode (their median is printed).
const FAST_ROUNDS: usize = 3;

/// What the bench runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runs {
    /// Both paths, the stages and the cache.
    Compare,
    /// Preparations by the fast path.
    FastOnly,
    /// Preparations by the fast path of the language-modelling data alone.
    TextOnly,
}

fn measure(
    name: &str,
    data: &Path,
    model: &Path,
    bytes: u64,
    scratch: &Path,
    runs: Runs,
) -> Result<(), String> {
    let fast = HfTokenizer::from_dir(model).map_err(|e| e.to_string())?;
    if let Err(why) = fast.fast_path() {
        println!("{name}: {why}");
    }
    if runs != Runs::Compare {
        let mb = bytes as f64 / 1e6;
        let mut rates = Vec::new();
        for round in 0..FAST_ROUNDS {
            let (set, seconds, _) =
                prepare_once(data, &fast, &scratch.join(format!("fast{round}")))?;
            rates.push(mb / seconds);
            println!(
                "{name}: {} rows, fast path {:.1} MB/s",
                set.rows.len(),
                mb / seconds
            );
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "{name}: median of {FAST_ROUNDS} fast-path preparations {:.1} MB/s",
            rates[rates.len() / 2]
        );
        return Ok(());
    }
    let by_crate = fast.clone().with_path(EncodePath::Crate);
    // Each set is reduced to a digest and dropped before the next run, so that neither run
    // works beside the other's rows in memory.
    let (baseline, crate_seconds, crate_cpu) =
        prepare_once(data, &by_crate, &scratch.join("crate"))?;
    let baseline = digest(&baseline);
    let cache = scratch.join("fast");
    let (set, first, fast_cpu) = prepare_once(data, &fast, &cache)?;
    if digest(&set) != baseline {
        return Err(format!(
            "{name}: the fast path's rows differ from the crate's"
        ));
    }
    let tokens: usize = set.rows.iter().map(|r| r.len()).sum();
    let start = Instant::now();
    let (again, how) = open_prepared(
        data,
        &DatasetOptions::default(),
        &fast,
        &PrepareSettings::default(),
        &CacheDir::At(cache),
    )
    .map_err(|e| e.to_string())?;
    let cached = start.elapsed().as_secs_f64();
    if how != CacheUse::Hit || again.rows.len() != set.rows.len() {
        return Err(format!("{name}: the second open did not read the cache"));
    }
    let mb = bytes as f64 / 1e6;
    println!(
        "{name}: {mb:.1} MB, {} rows, {tokens} tokens, {} threads, cache written",
        set.rows.len(),
        rayon::current_num_threads(),
    );
    println!(
        "  crate path {crate_seconds:.2} s = {:.1} MB/s; fast path {first:.2} s = {:.1} MB/s \
         ({:.2} M tokens/s); fast / crate = {:.2}x; same rows (digest)",
        mb / crate_seconds,
        mb / first,
        tokens as f64 / first / 1e6,
        crate_seconds / first,
    );
    println!(
        "  per CPU-second of this process (less changed than wall time by other work on a \
         shared machine, not unchanged): crate path {} MB, fast path {} MB ({:.1} / {:.1} CPU-s)",
        per_cpu(mb, crate_cpu),
        per_cpu(mb, fast_cpu),
        crate_cpu.unwrap_or(f64::NAN),
        fast_cpu.unwrap_or(f64::NAN),
    );
    println!("  {}", stages(data, &fast, &by_crate)?);
    println!(
        "  cached re-open {cached:.3} s ({:.0}x faster than the fast path)",
        first / cached
    );
    Ok(())
}

fn main() -> Result<(), String> {
    let megabytes: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("{arg:?} is not a number of megabytes"))?,
        None => 100,
    };
    let runs = match std::env::args().nth(2).as_deref() {
        None => Runs::Compare,
        Some("fast-only") => Runs::FastOnly,
        Some("text-only") => Runs::TextOnly,
        Some(other) => return Err(format!("{other:?} is not `fast-only` or `text-only`")),
    };
    let root = reference()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let text = dir.path().join("text.jsonl");
    let bytes = build(&root.join("data/text.jsonl"), &text, "text", megabytes)?;
    measure(
        "text (llama_bpe, byte-level BPE)",
        &text,
        &root.join("models/llama_bpe"),
        bytes,
        &dir.path().join("text-caches"),
        runs,
    )?;
    if runs == Runs::TextOnly {
        return Ok(());
    }
    let chat = dir.path().join("messages.jsonl");
    let bytes = build(
        &root.join("data/messages.jsonl"),
        &chat,
        "content",
        megabytes.div_ceil(5),
    )?;
    measure(
        "messages (llama_sp, chat template)",
        &chat,
        &root.join("models/llama_sp"),
        bytes,
        &dir.path().join("messages-caches"),
        runs,
    )?;
    Ok(())
}
