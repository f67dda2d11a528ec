//! What `dsplan run` writes, checked before step 0 so that no output destroys an input and no
//! trained model is lost at the end:
//!
//! * [`check_paths`]: every output (`--metrics`, `--save-model`, `--save-checkpoint`) against
//!   every input (the config, `--model`, `--data`, `--training-args`, `--resume`) and against
//!   each other ([`crate::cli::outputs`]);
//! * [`prepare`]: each output's directory exists and takes files, the target is a regular
//!   file or absent (a FIFO or character device is written through), the file system has room
//!   for the first checkpoint and the model (from the parameter count), and the checkpoint
//!   directory is locked for this run ([`DirLock`]), a fresh run refusing another run's tags
//!   unless `--overwrite`;
//! * [`Prepared::finish`]: after an `--overwrite` run, the other run's tags later than this
//!   run's last are removed (they would look newer than `latest`), and those that remain are
//!   named.

use std::path::{Path, PathBuf};

use dsplan_executor::checkpoint::SavedCheckpoint;
use dsplan_executor::checkpoint::{DirLock, LockError};
use dsplan_executor::io::{OutputKind, OutputTarget, available_bytes, probe_writable};
use dsplan_executor::model::ModelConfig;
use dsplan_executor::zero::Dtype;

use super::{Failure, RunArgs, bytes};
use crate::cli::outputs::{Allowed, Paths, Shape};
use crate::render::escape_controls;

/// Bytes a checkpoint takes per parameter: the model states widened to fp32 (4) and the
/// optimizer's fp32 master weights and two Adam moments (12).
const CHECKPOINT_BYTES_PER_PARAM: u64 = 16;

/// The step of a `global_step{N}` tag.
fn parse_tag_step(tag: &str) -> Option<u64> {
    tag.strip_prefix("global_step")?.parse().ok()
}

/// `path` for a message: control characters escaped.
fn shown(path: &Path) -> String {
    escape_controls(&path.display().to_string()).into_owned()
}

/// Refuses an output that is an input, lies inside one (or inside another output directory),
/// or is another output; nothing has been opened for writing yet.
pub(super) fn check_paths(args: &RunArgs, model: &ModelConfig) -> Result<(), Failure> {
    let mut paths = Paths::default();
    paths.input("the config", &args.config, Shape::File);
    if let Some(model) = args.model.as_deref().map(Path::new)
        && dsplan_planner::user_file::exists(model)
    {
        let shape = if model.is_dir() {
            Shape::Directory
        } else {
            Shape::File
        };
        paths.input("--model", model, shape);
    }
    if let Some(data) = &args.data {
        paths.input("--data", data, Shape::File);
    }
    if let Some(training_args) = args.training.training_args_file() {
        paths.input("--training-args", training_args, Shape::File);
    }
    if let Some(resume) = &args.resume {
        paths.input("--resume", resume, Shape::Directory);
    }
    if let Some(metrics) = &args.metrics {
        paths.output("--metrics", metrics, Shape::File);
    }
    if let Some(save) = &args.save_model {
        paths.output("--save-model", save, saved_model_shape(model));
    }
    if let Some(dir) = &args.save_checkpoint {
        paths.output("--save-checkpoint", dir, Shape::Directory);
    }
    paths.allow(Allowed {
        input: "--resume",
        output: "--save-checkpoint",
    });
    paths.check().map_err(Failure::usage)
}

/// What `--save-model` writes for `model`: a GPT-2 is one safetensors file, a Llama-family
/// model a `save_pretrained` directory.
fn saved_model_shape(model: &ModelConfig) -> Shape {
    match model {
        ModelConfig::Gpt2(_) => Shape::File,
        ModelConfig::Llama(_) => Shape::Directory,
    }
}

/// The outputs of a run, checked, with its checkpoint directory locked until it is dropped.
#[derive(Debug)]
pub(super) struct Prepared {
    lock: Option<DirLock>,
    /// The checkpoint tags the directory held before this run (`--overwrite`).
    earlier_tags: Vec<String>,
}

/// What a run will write: its size in bytes, and the model's shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    /// The trained model (`--save-model`).
    pub model: u64,
    /// Whether the trained model is one file or a directory.
    pub model_shape: Shape,
    /// One checkpoint (`--save-checkpoint`).
    pub checkpoint: u64,
}

impl Sizes {
    /// The sizes of a model of `num_params` parameters saved as `save_trained` saves it.
    pub fn of(model: &ModelConfig, num_params: u64, dtype: Dtype) -> Self {
        let model_bytes = match model {
            ModelConfig::Gpt2(_) => 4,
            ModelConfig::Llama(_) => dtype.bytes() as u64,
        };
        Self {
            model: num_params.saturating_mul(model_bytes),
            model_shape: saved_model_shape(model),
            checkpoint: num_params.saturating_mul(CHECKPOINT_BYTES_PER_PARAM),
        }
    }
}

/// Checks every output of the run before step 0 and locks its checkpoint directory (when
/// `writes`: rank 0 of a job writes for all).
pub(super) fn prepare(args: &RunArgs, sizes: Sizes, writes: bool) -> Result<Prepared, Failure> {
    let mut needed: Vec<(PathBuf, &str, u64)> = Vec::new();
    if let Some(path) = &args.metrics {
        target_directory("--metrics", path)?;
    }
    if let Some(path) = &args.save_model {
        let dir = match sizes.model_shape {
            Shape::File => target_directory("--save-model", path)?,
            Shape::Directory => model_directory(path)?,
        };
        if let Some(dir) = dir {
            needed.push((dir, "--save-model", sizes.model));
        }
    }
    let mut prepared = Prepared {
        lock: None,
        earlier_tags: Vec::new(),
    };
    if let Some(dir) = &args.save_checkpoint {
        checkpoint_directory(dir)?;
        if writes {
            let lock = DirLock::acquire(dir).map_err(|e| lock_failure(dir, e))?;
            if let Some(owner) = &lock.took_over {
                say!(
                    "note: --save-checkpoint {}: took over the lock of {owner}, which has ended",
                    shown(dir)
                );
            }
            prepared.lock = Some(lock);
        }
        let existing = existing_checkpoints(dir);
        if args.resume.is_none() && !args.overwrite && !existing.is_empty() {
            let dir = shown(dir);
            return Err(Failure::usage(format!(
                "--save-checkpoint {dir} already holds another run's checkpoints ({}); \
                 pass --resume {dir} to continue that run, --overwrite to replace its tags, \
                 or name another directory",
                existing.join(", ")
            )));
        }
        if args.resume.is_none() && args.overwrite {
            prepared.earlier_tags = existing.into_iter().filter(|n| n != "latest").collect();
        }
        needed.push((dir.clone(), "--save-checkpoint", sizes.checkpoint));
    }
    check_room(&needed)?;
    Ok(prepared)
}

impl Prepared {
    /// After a run that saved `saved` with `--overwrite`: removes the other run's tags later
    /// than this run's last (a reader would take them for newer than `latest`) and names those
    /// that remain. Returns the notes to print.
    pub fn finish(&self, dir: &Path, saved: &[SavedCheckpoint]) -> Vec<String> {
        let ours: Vec<&str> = saved.iter().map(|c| c.location.tag.as_str()).collect();
        let Some(last) = saved
            .iter()
            .filter_map(|c| parse_tag_step(&c.location.tag))
            .max()
        else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for tag in &self.earlier_tags {
            if ours.contains(&tag.as_str()) {
                continue;
            }
            match parse_tag_step(tag) {
                Some(step) if step > last => match std::fs::remove_dir_all(dir.join(tag)) {
                    Ok(()) => removed.push(tag.clone()),
                    Err(_) => kept.push(tag.clone()),
                },
                _ => kept.push(tag.clone()),
            }
        }
        let dir = shown(dir);
        let mut notes = Vec::new();
        if !removed.is_empty() {
            notes.push(format!(
                "--overwrite: removed the other run's later tag(s) {} from {dir}",
                removed.join(", ")
            ));
        }
        if !kept.is_empty() {
            notes.push(format!(
                "--overwrite: {dir} still holds the other run's tag(s) {} (`latest` names this \
                 run's last)",
                kept.join(", ")
            ));
        }
        notes
    }
}

/// The directory an output file (or a model directory) goes into: it must exist and take new
/// files, and the target itself must be a regular file, absent, or a stream to write through
/// (`None`: a FIFO or character device, written through, which takes no room here).
fn target_directory(flag: &str, path: &Path) -> Result<Option<PathBuf>, Failure> {
    let target = OutputTarget::of(path)
        .map_err(|e| Failure::usage(format!("{flag} {}: {e}", shown(path))))?;
    if target.kind == OutputKind::WriteThrough {
        return Ok(None);
    }
    let dir = match target.path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Failure::usage(format!(
            "{flag} {}: the directory {} does not exist; create it first or name another path \
             (checked before training, so no trained model is lost)",
            shown(path),
            shown(&dir)
        )));
    }
    probe_writable(&dir).map_err(|e| {
        Failure::usage(format!(
            "{flag} {}: cannot write in {} ({e}); name a writable place (checked before \
             training, so no trained model is lost)",
            shown(path),
            shown(&dir)
        ))
    })?;
    Ok(Some(dir))
}

/// `--save-model DIR` of a Llama-family model: an existing directory that takes new files (the
/// save writes `config.json` and the weights into it, replacing those of an earlier save), or
/// a path with nothing there in a directory that does.
fn model_directory(path: &Path) -> Result<Option<PathBuf>, Failure> {
    if !path.is_dir() {
        if dsplan_planner::user_file::exists(path) {
            return Err(Failure::usage(format!(
                "--save-model {}: it is a file, and a Llama-family model is saved as a directory \
                 (config.json and its weights); name a directory, or a path with nothing there",
                shown(path)
            )));
        }
        return target_directory("--save-model", path);
    }
    probe_writable(path).map_err(|e| {
        Failure::usage(format!(
            "--save-model {}: cannot write in it ({e}); name a writable directory (checked \
             before training, so no trained model is lost)",
            shown(path)
        ))
    })?;
    Ok(Some(path.to_path_buf()))
}

/// `--save-checkpoint DIR`: created if missing, a writable directory.
fn checkpoint_directory(dir: &Path) -> Result<(), Failure> {
    let dir_shown = shown(dir);
    if dsplan_planner::user_file::exists(dir) && !dir.is_dir() {
        return Err(Failure::usage(format!(
            "--save-checkpoint {dir_shown}: not a directory; name a directory for the checkpoints"
        )));
    }
    std::fs::create_dir_all(dir)
        .and_then(|()| probe_writable(dir))
        .map_err(|e| {
            Failure::usage(format!(
                "--save-checkpoint {dir_shown}: cannot write there ({e}); name a writable directory"
            ))
        })
}

fn lock_failure(dir: &Path, error: LockError) -> Failure {
    Failure::usage(format!(
        "--save-checkpoint {}: {}",
        shown(dir),
        escape_controls(&error.to_string())
    ))
}

/// Refuses a run whose outputs do not fit where they go (outputs on one file system add up).
fn check_room(needed: &[(PathBuf, &str, u64)]) -> Result<(), Failure> {
    let mut by_device: Vec<(u64, u64, Vec<&str>, &Path)> = Vec::new();
    for (dir, flag, bytes) in needed {
        let device = device_of(dir);
        match by_device.iter_mut().find(|d| d.0 == device) {
            Some(entry) => {
                entry.1 = entry.1.saturating_add(*bytes);
                entry.2.push(flag);
            }
            None => by_device.push((device, *bytes, vec![flag], dir)),
        }
    }
    for (_, wanted, flags, dir) in by_device {
        let Some(free) = available_bytes(dir) else {
            continue;
        };
        if wanted > free {
            return Err(Failure::usage(format!(
                "{} need about {} in {}, where {} are free; make room or name another place \
                 (checked before training, so nothing is lost at the end)",
                flags.join(" and "),
                bytes(wanted),
                shown(dir),
                bytes(free)
            )));
        }
    }
    Ok(())
}

#[cfg(unix)]
fn device_of(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).map_or(0, |m| m.dev())
}

#[cfg(not(unix))]
fn device_of(_: &Path) -> u64 {
    0
}

/// The checkpoint entries (`latest`, `global_step*` tags) in `dir`, sorted; empty when there
/// are none or `dir` cannot be listed.
fn existing_checkpoints(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == "latest" || n.starts_with("global_step"))
        .collect();
    names.sort();
    names
}
