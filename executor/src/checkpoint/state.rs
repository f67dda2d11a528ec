//! [`EngineState`]: the run state a checkpoint carries besides tensors (`engine_state.json`):
//! steps, the loss scaler's full state, the config's digest, the plan's layout, the model, the
//! sequence length and the data, so that a resume can continue exactly or say what differs.

use dsplan_planner::schedule::loss_scale::{DynamicScaleState, LossScaler};
use serde::{Deserialize, Serialize};

use super::reshard::SavedLayout;
use crate::data::{BUNDLED_CORPUS, BUNDLED_CORPUS_NAME, WindowOrder};
use crate::model::{ModelConfig, ParamTable};
use crate::train::{DataChoice, TrainSpec};
use crate::zero::{Dtype, EnginePlan};

/// The `format` field of every checkpoint this version writes.
pub const FORMAT: &str = "dsplan-checkpoint/2";

/// Everything about a run at a step that is not a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    /// [`FORMAT`].
    pub format: String,
    /// The tag (`global_step{N}`).
    pub tag: String,
    /// Optimizer steps run, skipped ones included (DeepSpeed's `global_steps`).
    pub global_step: u64,
    /// Steps skipped for overflowing gradients (DeepSpeed's `skipped_steps`).
    pub skipped_steps: u64,
    /// Steps the learning-rate scheduler has taken (applied optimizer steps).
    pub lr_scheduler_step: u64,
    /// Samples trained on (`global_samples`).
    pub global_samples: u64,
    /// The loss scaler.
    pub loss_scaler: ScalerState,
    /// FNV-1a 64 of the resolved config, to notice a changed config.
    pub config_digest: String,
    /// Data-parallel ranks.
    pub world_size: usize,
    /// `zero_optimization.stage` of the config.
    pub stage: u8,
    /// Parameter, accumulation and communication dtypes.
    pub dtypes: SavedDtypes,
    /// The model's shape.
    pub model: SavedModel,
    /// The plan's flat layout and each rank's share of it.
    pub layout: SavedLayout,
    /// Predicted positions per row.
    pub seq_len: usize,
    /// Rows per step (`train_batch_size`).
    pub train_batch: usize,
    /// Where the batches came from.
    pub data: DataDescription,
}

impl EngineState {
    /// The state of a run of `spec` by `plan` before its first step, its loss scaler
    /// `scaler`.
    pub fn for_run(
        spec: &TrainSpec,
        plan: &EnginePlan,
        params: &(impl ParamTable + ?Sized),
        scaler: &LossScaler,
    ) -> Self {
        let dtypes = plan.dtypes();
        let config = serde_json::to_vec(&spec.settings.config).unwrap_or_default();
        Self {
            format: FORMAT.to_string(),
            tag: super::layout::tag_of_step(0),
            global_step: 0,
            skipped_steps: 0,
            lr_scheduler_step: 0,
            global_samples: 0,
            loss_scaler: ScalerState::of(scaler),
            config_digest: digest(&config),
            world_size: plan.world(),
            stage: spec.settings.stage as u8,
            dtypes: SavedDtypes {
                model: dtypes.model.name().to_string(),
                accum: dtypes.accum.name().to_string(),
                comm: dtypes.comm.name().to_string(),
            },
            model: spec.model.into(),
            layout: SavedLayout::of(plan, params),
            seq_len: spec.seq_len,
            train_batch: spec.settings.batch.train_batch,
            data: DataDescription::of(&spec.data),
        }
    }

    /// This state after `global_step` steps, `applied` of them applied, with `scaler`.
    pub fn at_step(&self, global_step: u64, applied: u64, scaler: &LossScaler) -> Self {
        Self {
            tag: super::layout::tag_of_step(global_step),
            global_step,
            skipped_steps: global_step.saturating_sub(applied),
            lr_scheduler_step: applied,
            global_samples: global_step * self.train_batch as u64,
            loss_scaler: ScalerState::of(scaler),
            ..self.clone()
        }
    }
}

/// The loss scaler's state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScalerState {
    /// fp16's dynamic scaler (DeepSpeed's names).
    Dynamic {
        /// `cur_scale`.
        scale: f64,
        /// `cur_hysteresis`.
        cur_hysteresis: i64,
        /// `cur_iter`.
        cur_iter: i64,
        /// `last_overflow_iter`.
        last_overflow_iter: i64,
    },
    /// A scale that never changes (fp16 static, bf16, fp32).
    Fixed {
        /// The scale.
        scale: f64,
    },
}

impl ScalerState {
    /// The state of `scaler`.
    pub fn of(scaler: &LossScaler) -> Self {
        match scaler {
            LossScaler::Dynamic(dynamic) => {
                let s = dynamic.state();
                ScalerState::Dynamic {
                    scale: s.scale,
                    cur_hysteresis: s.cur_hysteresis,
                    cur_iter: s.cur_iter,
                    last_overflow_iter: s.last_overflow_iter,
                }
            }
            LossScaler::Fixed { scale, .. } => ScalerState::Fixed { scale: *scale },
        }
    }

    /// `fresh` (the scaler the run's config builds) continued from this state; `Err` says
    /// what differs when the config builds another kind of scaler.
    pub fn restore(&self, fresh: LossScaler) -> Result<LossScaler, String> {
        match (self, fresh) {
            (
                &ScalerState::Dynamic {
                    scale,
                    cur_hysteresis,
                    cur_iter,
                    last_overflow_iter,
                },
                LossScaler::Dynamic(mut dynamic),
            ) => {
                dynamic.restore(DynamicScaleState {
                    scale,
                    cur_hysteresis,
                    cur_iter,
                    last_overflow_iter,
                });
                Ok(LossScaler::Dynamic(dynamic))
            }
            (&ScalerState::Fixed { scale }, fixed @ LossScaler::Fixed { .. })
                if fixed.scale() == scale =>
            {
                Ok(fixed)
            }
            (saved, other) => Err(format!(
                "the checkpoint's loss scaler is {}, the config's is {}",
                saved.describe(),
                ScalerState::of(&other).describe()
            )),
        }
    }

    /// `dynamic (scale 1024)` or `fixed at 1`.
    pub fn describe(&self) -> String {
        match self {
            ScalerState::Dynamic { scale, .. } => format!("dynamic (scale {scale})"),
            ScalerState::Fixed { scale } => format!("fixed at {scale}"),
        }
    }
}

/// The dtypes of a run, by DeepSpeed's names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDtypes {
    /// Parameters.
    pub model: String,
    /// Gradient accumulation.
    pub accum: String,
    /// Reductions.
    pub comm: String,
}

/// A dtype from its DeepSpeed name.
pub fn dtype_named(name: &str) -> Option<Dtype> {
    [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .find(|d| d.name() == name)
}

/// A model's shape, as saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedModel {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `n_positions`.
    pub n_positions: usize,
    /// `n_embd`.
    pub n_embd: usize,
    /// `n_layer`.
    pub n_layer: usize,
    /// `n_head`.
    pub n_head: usize,
    /// `layer_norm_epsilon` (`rms_norm_eps` for the Llama family).
    pub layer_norm_epsilon: f32,
    /// A Llama-family model's whole `config.json` (absent for GPT-2, whose shape the fields
    /// above fix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama: Option<serde_json::Value>,
}

impl From<ModelConfig> for SavedModel {
    fn from(model: ModelConfig) -> Self {
        match model {
            ModelConfig::Gpt2(c) => Self {
                vocab_size: c.vocab_size,
                n_positions: c.n_positions,
                n_embd: c.n_embd,
                n_layer: c.n_layer,
                n_head: c.n_head,
                layer_norm_epsilon: c.layer_norm_epsilon,
                llama: None,
            },
            ModelConfig::Llama(c) => Self {
                vocab_size: c.vocab_size,
                n_positions: c.max_position_embeddings,
                n_embd: c.hidden_size,
                n_layer: c.num_hidden_layers,
                n_head: c.num_attention_heads,
                layer_norm_epsilon: c.rms_norm_eps,
                llama: Some(crate::io::llama_config::llama_config_to_json(&c, "float32")),
            },
        }
    }
}

/// Where a run's batches come from (batches are a function of the step index, the source and
/// its order, so this is what a resumed run must read again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDescription {
    /// Which kind of source.
    pub kind: DataKind,
    /// The corpus name or the file's path.
    pub name: String,
    /// The source's size in bytes (`None`: unreadable when saved); of labelled data, the
    /// bytes of its prepared token ids.
    pub bytes: Option<u64>,
    /// The window order (`sequential` or `shuffled:SEED`).
    pub order: String,
}

/// The kinds of [`DataChoice`], as a checkpoint records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// The bundled corpus, byte tokens.
    Bundled,
    /// A token file (llm.c `.bin`, safetensors `input_ids`, or a text file as bytes).
    File,
    /// Recorded collated micro-batches, replayed step by step.
    Recorded,
    /// Labelled micro-batches prepared outside the executor (a fine-tuning dataset).
    Labelled,
}

impl DataKind {
    /// The name a checkpoint records.
    pub fn name(self) -> &'static str {
        match self {
            DataKind::Bundled => "bundled",
            DataKind::File => "file",
            DataKind::Recorded => "recorded",
            DataKind::Labelled => "labelled",
        }
    }

    /// Whether rows may be longer than the model's positions: recorded and prepared
    /// fine-tuning rows are packed, their position ids restarting per document.
    pub fn packs_rows(self) -> bool {
        matches!(self, DataKind::Recorded | DataKind::Labelled)
    }
}

impl DataDescription {
    /// The description of `data`.
    pub fn of(data: &DataChoice) -> Self {
        let order = |o: &WindowOrder| match o {
            WindowOrder::Sequential => "sequential".to_string(),
            WindowOrder::Shuffled { seed } => format!("shuffled:{seed}"),
        };
        match data {
            DataChoice::Bundled { order: o } => Self {
                kind: DataKind::Bundled,
                name: BUNDLED_CORPUS_NAME.into(),
                bytes: Some(BUNDLED_CORPUS.len() as u64),
                order: order(o),
            },
            DataChoice::File { path, order: o } => Self {
                kind: DataKind::File,
                name: path.display().to_string(),
                bytes: std::fs::metadata(path).ok().map(|m| m.len()),
                order: order(o),
            },
            DataChoice::Recorded { files } => Self {
                kind: DataKind::Recorded,
                name: files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                bytes: files
                    .iter()
                    .map(|f| std::fs::metadata(f).ok().map(|m| m.len()))
                    .sum(),
                // Replayed step by step, in the order recorded.
                order: "sequential".into(),
            },
            DataChoice::Labelled(labelled) => Self {
                kind: DataKind::Labelled,
                name: labelled.0.name(),
                bytes: Some(labelled.0.bytes()),
                order: labelled.0.order(),
            },
        }
    }
}

/// FNV-1a, 64 bits, as 16 hex digits.
pub fn digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_fnv1a() {
        assert_eq!(digest(b""), "cbf29ce484222325");
        assert_eq!(digest(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn scaler_kinds_must_agree() {
        let saved = ScalerState::Fixed { scale: 1.0 };
        assert!(saved.restore(LossScaler::full_precision()).is_ok());
        let dynamic = ScalerState::Dynamic {
            scale: 8.0,
            cur_hysteresis: 1,
            cur_iter: 3,
            last_overflow_iter: 1,
        };
        let error = dynamic
            .restore(LossScaler::full_precision())
            .expect_err("kinds differ");
        assert!(error.contains("dynamic"), "{error}");
    }
}
