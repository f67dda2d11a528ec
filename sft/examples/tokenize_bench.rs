//! Tokenization throughput: builds a ~100 MB JSONL (language-modelling rows, the fixtures'
//! texts with each row's number woven in so the words vary) and a ~20 MB conversational one in
//! a temporary directory, prepares each as TRL does (tokenize, label, truncate; in parallel)
//! twice, by the `tokenizers` crate's path (the baseline) and by the fast path, checks that
//! both give the same rows, and prints MB/s of each and their ratio, then the time to reopen
//! the same data from its token cache.
//!
//! `cargo run --release -p dsplan-sft --example tokenize_bench [-- MEGABYTES]`
//! (needs `../shared/reference/sft`, or `$DSPLAN_SHARED_DIR`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dsplan_sft::{
    CacheDir, CacheUse, DatasetOptions, EncodePath, HfTokenizer, PrepareSettings, open_prepared,
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
    Ok(written)
}

/// One preparation of `data` into a fresh cache directory: the set and the seconds it took.
fn prepare_once(
    data: &Path,
    tokenizer: &HfTokenizer,
    cache: &Path,
) -> Result<(dsplan_sft::PreparedSet, f64), String> {
    let options = DatasetOptions::default();
    let settings = PrepareSettings::default();
    let dir = CacheDir::At(cache.to_path_buf());
    let start = Instant::now();
    let (set, how) =
        open_prepared(data, &options, tokenizer, &settings, &dir).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    if how != CacheUse::Written {
        return Err(format!(
            "{}: the first open did not prepare",
            data.display()
        ));
    }
    Ok((set, seconds))
}

fn measure(
    name: &str,
    data: &Path,
    model: &Path,
    bytes: u64,
    scratch: &Path,
) -> Result<(), String> {
    let fast = HfTokenizer::from_dir(model).map_err(|e| e.to_string())?;
    if let Err(why) = fast.fast_path() {
        println!("{name}: {why}");
    }
    let by_crate = fast.clone().with_path(EncodePath::Crate);
    let (baseline, crate_seconds) = prepare_once(data, &by_crate, &scratch.join("crate"))?;
    let cache = scratch.join("fast");
    let (set, first) = prepare_once(data, &fast, &cache)?;
    if set != baseline {
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
         ({:.2} M tokens/s); fast / crate = {:.2}x; same rows",
        mb / crate_seconds,
        mb / first,
        tokens as f64 / first / 1e6,
        crate_seconds / first,
    );
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
    )?;
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
    )?;
    Ok(())
}
