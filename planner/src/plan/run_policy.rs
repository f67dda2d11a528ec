//! [`RunPolicy`]: how a run's ZeRO engine behaves beyond sizes and buckets, decided once here
//! and read by the executor, which decides none of it itself.
//!
//! DeepSpeed picks an optimizer wrapper from the stage and the precision
//! (deepspeed-facts §3.2), and the wrapper fixes which ranks hold what, how the gradient norm is
//! taken and where the gradient average divides by the world size:
//!
//! | config | [`DeepSpeedOptimizer`] | [`EngineFamily`] (engine stage) | [`ClipRule`] | why |
//! |---|---|---|---|---|
//! | stage 0, fp32 | `Unwrapped` | replicated (0) | `DataParallel` | the plain optimizer; the parameters are the master |
//! | stage 0, fp16 | `Fp16Optimizer` | replicated (0) | `Fp16Optimizer` | fp32 master on every rank; ZeRO's norm formula over the whole (already averaged) gradient, no sum over ranks |
//! | stage 0, bf16 | `Fp16Optimizer` | replicated (0) | `Fp16Optimizer` | DeepSpeed 0.19.8 accumulates in the model dtype (`get_data_types`), so bf16 with bf16 accumulation is `DDP_BFLOAT16`: `FP16_Optimizer` over bf16, loss scale 1, the fp32 master and states on every rank, a step skipped on a non-finite norm (`_do_optimizer_sanity_check`) |
//! | stage 1, bf16, `data_types.grad_accum_dtype: fp32`, no offload | `Bf16Optimizer` | flat partition (1) | `Bf16Optimizer` | `BF16_Optimizer` shards the fp32 master and states ZeRO-1 style, accumulates in fp32 and all-gathers the bf16 partitions after the step (§5.4) |
//! | stage 1 or 2 (otherwise) | `ZeroOptimizer` | flat partition (1 or 2) | `ZeroF32` | `DeepSpeedZeroOptimizer`: partition norms summed over ranks in f32 |
//! | stage 3 | `ZeroStage3` | sharded (3) | `ZeroF64` | `DeepSpeedZeroOptimizer_Stage3`: the same sums in f64 |
//!
//! The gradient average ([`GradientAveraging`], deepspeed-facts §4.3): ZeRO's buckets divide by
//! the world size before the sum (stage 3 always; stages 1/2 with `reduce_scatter`), the
//! engine's own all-reduce (stage 0, and stages 1/2 without `reduce_scatter`) multiplies by
//! `1/gradient_predivide_factor` before it and by `factor/W` after it, unless
//! `prescale_gradients` divides first.

use serde::Serialize;

use super::settings::{Precision, Settings};
use crate::config::{DsConfig, ZeroStage};

/// The DeepSpeed optimizer wrapper a run reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeepSpeedOptimizer {
    /// fp32 without ZeRO: the client optimizer as it is, with `clip_grad_norm_`.
    Unwrapped,
    /// fp16 or bf16 without ZeRO: `FP16_Optimizer` (`FP16_UnfusedOptimizer` for unfused
    /// optimizers); over bf16 DeepSpeed names it `DDP_BFLOAT16`.
    Fp16Optimizer,
    /// bf16 at stage 1 accumulating in fp32 (`data_types.grad_accum_dtype`), without offload:
    /// `BF16_Optimizer`.
    Bf16Optimizer,
    /// Stages 1 and 2: `DeepSpeedZeroOptimizer`.
    ZeroOptimizer,
    /// Stage 3: `DeepSpeedZeroOptimizer_Stage3`.
    ZeroStage3,
}

impl DeepSpeedOptimizer {
    /// DeepSpeed's class name.
    pub fn class_name(self) -> &'static str {
        match self {
            DeepSpeedOptimizer::Unwrapped => "the plain optimizer",
            DeepSpeedOptimizer::Fp16Optimizer => "FP16_Optimizer",
            DeepSpeedOptimizer::Bf16Optimizer => "BF16_Optimizer",
            DeepSpeedOptimizer::ZeroOptimizer => "DeepSpeedZeroOptimizer",
            DeepSpeedOptimizer::ZeroStage3 => "DeepSpeedZeroOptimizer_Stage3",
        }
    }
}

/// What each rank holds, as the engine lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineFamily {
    /// Every rank holds every state (stage 0's engine).
    Replicated,
    /// One flat buffer in equal partitions per rank: master and optimizer states (and, at
    /// stage 2, the gradients); the parameters all-gathered after the step (stages 1 and 2).
    FlatPartition,
    /// Every tensor sharded across the ranks, gathered for use (stage 3).
    Sharded,
}

impl EngineFamily {
    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineFamily::Replicated => "replicated",
            EngineFamily::FlatPartition => "flat partition",
            EngineFamily::Sharded => "sharded",
        }
    }
}

/// How the global gradient norm and the unscale-and-clip factor are computed: each wrapper
/// has its own order of operations and rounding (`reference/gpt2/deepspeed_zero/README.md`,
/// "Gradient clipping as each stage implements it").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClipRule {
    /// `clip_grad_norm_` (fp32 without ZeRO): per-tensor norms in f32, their root sum of
    /// squares divided by `W` and summed over ranks; `clip/(N + 1e-6)` when below 1.
    DataParallel,
    /// `BF16_Optimizer`: the norm as `DataParallel`; `clip/(N + 1e-6)` when below 1.
    Bf16Optimizer,
    /// `FP16_Optimizer`: ZeRO's f32 formula over the rank's whole gradient, not summed over
    /// ranks (they hold the same averaged gradient).
    Fp16Optimizer,
    /// `DeepSpeedZeroOptimizer`: `Σ ‖slice‖²` in f64 per rank, cast to f32, summed over ranks
    /// in f32; `1/c`, `c = max(1, (N/S + 1e-6)/clip)·S`.
    ZeroF32,
    /// `DeepSpeedZeroOptimizer_Stage3`: the same sums and factor in f64.
    ZeroF64,
}

impl ClipRule {
    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClipRule::DataParallel => "clip_grad_norm_ (f32, averaged over ranks)",
            ClipRule::Bf16Optimizer => "BF16_Optimizer (f32, averaged over ranks)",
            ClipRule::Fp16Optimizer => "FP16_Optimizer (f32, this rank's gradient)",
            ClipRule::ZeroF32 => "ZeRO (f64 slices, summed over ranks in f32)",
            ClipRule::ZeroF64 => "ZeRO stage 3 (summed over ranks in f64)",
        }
    }
}

/// Where the gradient average divides by the world size `W`, and every intermediate is rounded
/// to the communication dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum GradientAveraging {
    /// Divide by `W`, then sum (ZeRO's buckets; `prescale_gradients`).
    PreDivide,
    /// Multiply by `1/factor`, sum, multiply by `factor/W` (the engine's own all-reduce).
    PostMultiply {
        /// `gradient_predivide_factor` (1 by default).
        predivide_factor: f64,
    },
}

/// The engine's behaviour; see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RunPolicy {
    /// The DeepSpeed wrapper the run reproduces, which decides the rest.
    pub optimizer: DeepSpeedOptimizer,
    /// What each rank holds.
    pub engine: EngineFamily,
    /// The stage whose engine runs (the config's).
    pub engine_stage: ZeroStage,
    /// The gradient norm and clip factor.
    pub clip: ClipRule,
    /// The gradient average.
    pub averaging: GradientAveraging,
}

impl RunPolicy {
    /// The policy of a run of `config` decided as `settings`.
    pub fn new(config: &DsConfig, settings: &Settings) -> RunPolicy {
        let optimizer = match (settings.stage, settings.precision) {
            (ZeroStage::Disabled, Precision::Fp32) => DeepSpeedOptimizer::Unwrapped,
            (ZeroStage::Disabled, Precision::Fp16 | Precision::Bf16) => {
                DeepSpeedOptimizer::Fp16Optimizer
            }
            (ZeroStage::OptimizerStates, Precision::Bf16) if settings.bf16_optimizer() => {
                DeepSpeedOptimizer::Bf16Optimizer
            }
            (ZeroStage::OptimizerStates | ZeroStage::Gradients, _) => {
                DeepSpeedOptimizer::ZeroOptimizer
            }
            (ZeroStage::Weights, _) => DeepSpeedOptimizer::ZeroStage3,
        };
        let (engine, engine_stage, clip) = match optimizer {
            DeepSpeedOptimizer::Unwrapped => (
                EngineFamily::Replicated,
                ZeroStage::Disabled,
                ClipRule::DataParallel,
            ),
            DeepSpeedOptimizer::Fp16Optimizer => (
                EngineFamily::Replicated,
                ZeroStage::Disabled,
                ClipRule::Fp16Optimizer,
            ),
            DeepSpeedOptimizer::Bf16Optimizer => (
                EngineFamily::FlatPartition,
                ZeroStage::OptimizerStates,
                ClipRule::Bf16Optimizer,
            ),
            DeepSpeedOptimizer::ZeroOptimizer => (
                EngineFamily::FlatPartition,
                settings.stage,
                ClipRule::ZeroF32,
            ),
            DeepSpeedOptimizer::ZeroStage3 => {
                (EngineFamily::Sharded, ZeroStage::Weights, ClipRule::ZeroF64)
            }
        };
        let engine_all_reduce = if config.prescale_gradients {
            GradientAveraging::PreDivide
        } else {
            GradientAveraging::PostMultiply {
                predivide_factor: config.gradient_predivide_factor,
            }
        };
        let averaging = match settings.stage {
            // `BF16_Optimizer` has no `reduce_gradients`: the engine all-reduces for it.
            _ if optimizer == DeepSpeedOptimizer::Bf16Optimizer => engine_all_reduce,
            ZeroStage::Disabled => engine_all_reduce,
            ZeroStage::OptimizerStates | ZeroStage::Gradients if !settings.reduce_scatter => {
                engine_all_reduce
            }
            ZeroStage::OptimizerStates | ZeroStage::Gradients | ZeroStage::Weights => {
                GradientAveraging::PreDivide
            }
        };
        RunPolicy {
            optimizer,
            engine,
            engine_stage,
            clip,
            averaging,
        }
    }

    /// Whether the engine keeps a flat partition per rank and so all-gathers the parameters
    /// after the step (when there is more than one rank).
    pub fn gathers_flat_partitions(&self) -> bool {
        self.engine == EngineFamily::FlatPartition
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, Embeddings, Family};
    use crate::plan::{Cluster, ModelGraph, Workload, decide};
    use serde_json::{Value, json};

    fn policy(config: Value) -> RunPolicy {
        let arch = Architecture {
            family: Family::Gpt2,
            layers: 1,
            hidden: 8,
            heads: 2,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 32,
            vocab: 16,
            positions: Some(8),
            embeddings: Embeddings::Tied,
        };
        let graph = ModelGraph::from_architecture("gpt2", &arch).expect("graph");
        let cluster = Cluster::new(2, 2).expect("cluster");
        let mut config = config;
        config["train_micro_batch_size_per_gpu"] = json!(1);
        config["gradient_accumulation_steps"] = json!(1);
        let typed = crate::config::from_value(&config).expect("typed");
        let (settings, found) = decide::decide(&typed, &graph, &cluster, &Workload::default());
        let settings = settings.unwrap_or_else(|| panic!("decided: {found:?}"));
        RunPolicy::new(&typed, &settings)
    }

    fn at(stage: u64, precision: &str) -> RunPolicy {
        let mut config = json!({"zero_optimization": {"stage": stage}});
        if precision != "fp32" {
            config[precision] = json!({"enabled": true});
        }
        policy(config)
    }

    #[test]
    fn fp32_without_zero_is_the_plain_replicated_optimizer() {
        let p = at(0, "fp32");
        assert_eq!(p.optimizer, DeepSpeedOptimizer::Unwrapped);
        assert_eq!(
            (p.engine, p.engine_stage, p.clip),
            (
                EngineFamily::Replicated,
                ZeroStage::Disabled,
                ClipRule::DataParallel
            )
        );
    }

    #[test]
    fn fp16_without_zero_is_replicated_with_the_fp16_optimizers_local_norm() {
        let p = at(0, "fp16");
        assert_eq!(p.optimizer, DeepSpeedOptimizer::Fp16Optimizer);
        assert_eq!(
            (p.engine, p.engine_stage, p.clip),
            (
                EngineFamily::Replicated,
                ZeroStage::Disabled,
                ClipRule::Fp16Optimizer
            )
        );
    }

    #[test]
    fn bf16_without_zero_is_the_fp16_optimizer_replicated() {
        let p = at(0, "bf16");
        assert_eq!(p.optimizer, DeepSpeedOptimizer::Fp16Optimizer);
        assert_eq!(
            (p.engine, p.engine_stage, p.clip),
            (
                EngineFamily::Replicated,
                ZeroStage::Disabled,
                ClipRule::Fp16Optimizer
            )
        );
        assert!(!p.gathers_flat_partitions());
    }

    #[test]
    fn bf16_at_stage_one_accumulating_in_fp32_is_bf16_optimizer() {
        let p = policy(
            json!({"zero_optimization": {"stage": 1}, "bf16": {"enabled": true},
            "data_types": {"grad_accum_dtype": "fp32"}}),
        );
        assert_eq!(p.optimizer, DeepSpeedOptimizer::Bf16Optimizer);
        assert_eq!(
            (p.engine, p.engine_stage, p.clip),
            (
                EngineFamily::FlatPartition,
                ZeroStage::OptimizerStates,
                ClipRule::Bf16Optimizer
            )
        );
        assert!(p.gathers_flat_partitions());
        // The average is the engine's own all-reduce (`buffered_allreduce_fallback`).
        assert_eq!(
            p.averaging,
            GradientAveraging::PostMultiply {
                predivide_factor: 1.0
            }
        );
    }

    #[test]
    fn stages_one_and_two_are_the_zero_optimizer_in_any_precision() {
        for precision in ["fp32", "fp16", "bf16"] {
            for (stage, engine_stage) in
                [(1, ZeroStage::OptimizerStates), (2, ZeroStage::Gradients)]
            {
                let p = at(stage, precision);
                assert_eq!(p.optimizer, DeepSpeedOptimizer::ZeroOptimizer);
                assert_eq!(
                    (p.engine, p.engine_stage, p.clip),
                    (EngineFamily::FlatPartition, engine_stage, ClipRule::ZeroF32),
                    "stage {stage} {precision}"
                );
            }
        }
    }

    #[test]
    fn stage_three_is_sharded_with_the_f64_norm() {
        for precision in ["fp32", "fp16", "bf16"] {
            let p = at(3, precision);
            assert_eq!(p.optimizer, DeepSpeedOptimizer::ZeroStage3);
            assert_eq!(
                (p.engine, p.engine_stage, p.clip),
                (EngineFamily::Sharded, ZeroStage::Weights, ClipRule::ZeroF64)
            );
            assert!(!p.gathers_flat_partitions());
        }
    }

    #[test]
    fn the_average_divides_where_deepspeed_divides() {
        let post = |factor| GradientAveraging::PostMultiply {
            predivide_factor: factor,
        };
        // ZeRO's buckets pre-divide (stages 1/2 with reduce_scatter, the default; stage 3).
        assert_eq!(at(1, "fp32").averaging, GradientAveraging::PreDivide);
        assert_eq!(at(2, "fp32").averaging, GradientAveraging::PreDivide);
        assert_eq!(at(3, "fp32").averaging, GradientAveraging::PreDivide);
        // The engine's all-reduce: stage 0, and stages 1/2 without reduce_scatter.
        assert_eq!(at(0, "fp32").averaging, post(1.0));
        let no_scatter = policy(
            json!({"zero_optimization": {"stage": 1, "reduce_scatter": false},
            "gradient_predivide_factor": 4.0}),
        );
        assert_eq!(no_scatter.averaging, post(4.0));
        let stage0 = policy(json!({"gradient_predivide_factor": 2.0}));
        assert_eq!(stage0.averaging, post(2.0));
        let prescaled = policy(json!({"prescale_gradients": true}));
        assert_eq!(prescaled.averaging, GradientAveraging::PreDivide);
    }
}
