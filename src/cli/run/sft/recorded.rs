//! Fine-tuning data already tokenized and collated: micro-batches recorded in safetensors
//! (`train.stepSS.microM.<key>`, the format of [`dsplan_executor::data::recorded`], one file
//! per rank). `--data batches.safetensors` holding such tensors trains on them as they are,
//! with no tokenizer; `--save-batches FILE` writes the micro-batches a run of JSONL / Parquet
//! data trains on, so that the same run can be replayed from them (and its collation read
//! with any safetensors tool).
//!
//! With more than one rank the files are `NAME_rank0.safetensors`, `NAME_rank1.safetensors`,
//! ... (the fixtures' naming): `--save-batches NAME.safetensors` writes them and
//! `--data NAME_rank0.safetensors` reads them all.

use std::io::Read;
use std::path::{Path, PathBuf};

use dsplan_executor::data::{Collated, LabelledSource, RecordedBatches, encode_rank};
use dsplan_executor::train::DataChoice;
use dsplan_sft::{SftData, collate};

use super::super::Failure;
use super::source::{collated, padding_only};
use crate::render;

/// The largest safetensors header read to look for recorded tensor names.
const HEADER_LIMIT: u64 = 64 << 20;

/// Whether `path` is a `.safetensors` file whose tensors are recorded micro-batches (a name
/// starts with `train.step`); a file that cannot be read is not (its error comes later).
pub(in crate::cli::run) fn is_recorded(path: &Path) -> bool {
    if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return false;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut length = [0u8; 8];
    if file.read_exact(&mut length).is_err() {
        return false;
    }
    let length = u64::from_le_bytes(length);
    if length > HEADER_LIMIT {
        return false;
    }
    let mut header = Vec::new();
    if file.take(length).read_to_end(&mut header).is_err() {
        return false;
    }
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&header)
        .is_ok_and(|names| names.keys().any(|name| name.starts_with("train.step")))
}

fn shown(path: &Path) -> String {
    render::escape_controls(&path.display().to_string()).into_owned()
}

/// The files of `world` ranks: `path` alone for one rank; else `path` is rank 0's,
/// `NAME_rank0.safetensors`, and rank `r`'s is `NAME_rank{r}.safetensors`.
fn rank_files(path: &Path, world: usize) -> Result<Vec<PathBuf>, String> {
    if world == 1 {
        return Ok(vec![path.to_path_buf()]);
    }
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_suffix("_rank0"))
        .ok_or_else(|| {
            format!(
                "{}: recorded batches for {world} ranks are one file per rank; give rank 0's, \
                 named NAME_rank0.safetensors (as --save-batches NAME.safetensors writes them)",
                shown(path)
            )
        })?;
    Ok(named_per_rank(path, stem, world))
}

/// `NAME_rank{r}.safetensors` for each of `world` ranks, beside `path`.
fn named_per_rank(path: &Path, stem: &str, world: usize) -> Vec<PathBuf> {
    (0..world)
        .map(|rank| path.with_file_name(format!("{stem}_rank{rank}.safetensors")))
        .collect()
}

/// The recorded batches at `path` for `world` ranks: the run's data, the longest micro-batch
/// and the steps (`steps` when given, at most those recorded).
pub(super) fn open(
    path: &Path,
    world: usize,
    steps: Option<u64>,
) -> Result<(DataChoice, usize, u64), Failure> {
    let files = rank_files(path, world).map_err(Failure::usage)?;
    let read = files
        .iter()
        .map(|file| {
            std::fs::read(file)
                .map(|bytes| (shown(file), bytes))
                .map_err(|e| Failure::usage(format!("--data {}: {e}", shown(file))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let batches = RecordedBatches::from_files(&read).map_err(|e| Failure::input(e.to_string()))?;
    let held = batches.steps().unwrap_or(0);
    let steps = match steps {
        Some(steps) if steps > held => {
            return Err(Failure::usage(format!(
                "{} holds {held} step(s) of batches, and the run asks for {steps}: record more \
                 steps, or pass --steps {held} or fewer",
                shown(path)
            )));
        }
        Some(steps) => steps,
        None => held,
    };
    Ok((
        DataChoice::Recorded { files },
        batches.shape().seq_len,
        steps,
    ))
}

/// Writes the training micro-batches of `steps` steps of `data` (`grad_accum` per step) to
/// `path` (one file per rank, see the module docs), each atomically; returns the files.
pub(super) fn save(
    path: &Path,
    data: &SftData,
    steps: u64,
    grad_accum: usize,
    world: usize,
) -> Result<Vec<PathBuf>, Failure> {
    let files = if world == 1 {
        vec![path.to_path_buf()]
    } else {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("batches");
        named_per_rank(path, stem, world)
    };
    for (rank, file) in files.iter().enumerate() {
        let train: Vec<Vec<Collated>> = (0..steps as usize)
            .map(|step| {
                let rows = data.order.step(step);
                let mine = rows.get(rank);
                (0..grad_accum)
                    .map(|micro| match mine.and_then(|m| m.get(micro)) {
                        Some(indices) => {
                            collated(&collate(&data.train.rows, indices, data.collation))
                        }
                        None => padding_only(data.collation),
                    })
                    .collect()
            })
            .collect();
        let bytes = encode_rank(&train).map_err(|e| Failure::input(e.to_string()))?;
        dsplan_executor::io::write_output(file, &bytes)
            .map_err(|e| Failure::usage(format!("--save-batches {}: {e}", shown(file))))?;
    }
    Ok(files)
}
