//! Names and paths of a checkpoint, DeepSpeed's where they carry over:
//!
//! ```text
//! DIR/latest                                                  the newest tag, one line
//! DIR/global_step{N}/engine_state.json                        run state (steps, scaler, plan, data)
//! DIR/global_step{N}/mp_rank_00_model_states.safetensors      stages 0-2: model-dtype parameters
//! DIR/global_step{N}/zero_pp_rank_{R}_mp_rank_00_model_states.safetensors   stage 3: rank R's shard
//! DIR/global_step{N}/[bf16_]zero_pp_rank_{R}_mp_rank_00_optim_states.safetensors  master, m, v
//! ```
//!
//! A tag directory is written as `DIR/.global_step{N}.partial-{pid}` and renamed into place
//! when complete; `latest` is replaced atomically after that.

use dsplan_planner::user_file::{self, FileKind};
use std::path::{Path, PathBuf};

use super::CheckpointError;

/// The file naming the newest tag.
pub const LATEST: &str = "latest";
/// The run state inside a tag directory.
pub const ENGINE_STATE: &str = "engine_state.json";
/// Stages 0-2: the model-dtype parameters under Hugging Face names.
pub const MODEL_STATES: &str = "mp_rank_00_model_states.safetensors";

/// The tag of the checkpoint taken after `step` optimizer steps.
pub fn tag_of_step(step: u64) -> String {
    format!("global_step{step}")
}

/// Stage 3: rank `rank`'s parameter shard.
pub fn zero_model_states(rank: usize) -> String {
    format!("zero_pp_rank_{rank}_mp_rank_00_model_states.safetensors")
}

/// Rank `rank`'s optimizer partition (`bf16_` prefixed when bf16 is on, as DeepSpeed does).
pub fn optim_states(rank: usize, bf16: bool) -> String {
    let prefix = if bf16 { "bf16_" } else { "" };
    format!("{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.safetensors")
}

/// Where a tag is written before it is complete.
pub fn staging_name(tag: &str) -> String {
    staging_name_of(tag, std::process::id())
}

/// [`staging_name`] as process `pid` names it: ranks that are processes all write into the
/// directory of rank 0's process.
pub fn staging_name_of(tag: &str, pid: u32) -> String {
    format!(".{tag}.partial-{pid}")
}

/// Where a tag is moved aside while a save replaces it.
pub fn aside_name(tag: &str) -> String {
    format!(".{tag}.old-{}", std::process::id())
}

/// The PID in the name of a staging or set-aside directory (`.TAG.partial-PID`,
/// `.TAG.old-PID`); `None` for any other name.
pub fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (_, pid) = rest
        .rsplit_once(".partial-")
        .or_else(|| rest.rsplit_once(".old-"))?;
    pid.parse().ok()
}

/// One checkpoint: a directory and a tag in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLocation {
    /// The checkpoint directory (holding `latest`).
    pub dir: PathBuf,
    /// The tag (`global_step{N}`).
    pub tag: String,
}

impl CheckpointLocation {
    /// The tag's directory.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.tag)
    }

    /// What `--resume PATH` names: a checkpoint directory (its `latest` tag) or a tag
    /// directory inside one (holding `engine_state.json`).
    pub fn resolve(path: &Path) -> Result<Self, CheckpointError> {
        if !path.is_dir() {
            return Err(CheckpointError::Missing {
                path: path.to_path_buf(),
                what: "checkpoint directory",
            });
        }
        let latest = path.join(LATEST);
        if user_file::exists(&latest) {
            let text = user_file::read_text(&latest, FileKind::LatestTag).map_err(|e| {
                CheckpointError::Io {
                    path: latest.clone(),
                    message: e.to_string(),
                }
            })?;
            let tag = text.trim();
            if tag.is_empty() || tag.contains(['/', '\\']) || tag.starts_with('.') {
                return Err(CheckpointError::Corrupt {
                    path: latest,
                    field: "tag".into(),
                    message: format!("`{tag}` is not a tag name"),
                });
            }
            let location = Self {
                dir: path.to_path_buf(),
                tag: tag.to_string(),
            };
            if !location.path().is_dir() {
                return Err(CheckpointError::Missing {
                    path: location.path(),
                    what: "tag directory named by `latest`",
                });
            }
            return Ok(location);
        }
        if path.join(ENGINE_STATE).is_file() {
            let tag = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            return Ok(Self { dir, tag });
        }
        Err(CheckpointError::Missing {
            path: latest,
            what: "`latest` file (or pass a tag directory holding engine_state.json)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_deepspeed() {
        assert_eq!(tag_of_step(12), "global_step12");
        assert_eq!(
            optim_states(1, true),
            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.safetensors"
        );
        assert_eq!(stale_pid(".global_step3.partial-123"), Some(123));
        assert_eq!(stale_pid(".global_step3.old-7"), Some(7));
        assert_eq!(stale_pid("global_step3"), None);
        assert_eq!(stale_pid(".latest.12.tmp"), None);
        assert_eq!(
            zero_model_states(0),
            "zero_pp_rank_0_mp_rank_00_model_states.safetensors"
        );
    }
}
