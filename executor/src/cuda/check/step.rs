//! One optimizer step of a small model on the GPU against the CPU backend, from the same
//! [`TrainSpec`] (settings, initial parameters, data), in fp32 and bf16. **Needs a GPU.**
//!
//! The model is tiny-gpt2 widened to head size 64 (vocabulary 300, 64 positions, width 128,
//! 2 heads, 2 blocks); 300 is not a multiple of 64, so the device's logits rows are padded
//! (to 320, `cuda_layout::padded_vocab`) as GPT-2's 50,257 are, and the step checks the
//! padded products and classifier against the CPU's unpadded logits; the step is two micro-steps of 4 x 64 tokens with clipping at 1.0 and
//! AdamW (lr 1e-3, eps 1e-6, weight decay 0.01). eps is 1e-6 rather than 1e-8: Adam's first
//! step moves each parameter by about lr * g / (|g| + eps), so with a tiny eps a gradient that
//! is rounding noise on both backends moves its parameter by +-lr with either sign; with 1e-6
//! such an element moves by at most lr * (its noise) / eps, and the comparison measures the
//! step.
//!
//! The Llama family's step ([`one_llama_step_vs_cpu`]) runs the same comparison on a Llama
//! (GQA 2:1, untied head) and a Qwen2 (q/k/v biases, tied embeddings) of width 128, head size
//! 64, SwiGLU 256, 2 layers, with the same tolerances.
//!
//! Tolerances:
//! * fp32: loss within 1e-5 relative; every parameter within 1e-5 relative + 1e-6 absolute;
//!   the update within 1e-3 in norm.
//! * bf16: the GPU keeps parameters, activations and gradients in bf16 between kernels
//!   (relative rounding 4e-3 per store) where the CPU backend rounds only the parameters and
//!   the gradients it hands the optimizer; so the loss within 1e-2 relative, the update within
//!   10% in norm, and every parameter within 2 lr (+1e-6) of the CPU's.

use serde_json::{Value, json};

use super::compare::{CheckKind, CheckRow, Metric};
use crate::cuda::train::train_cuda;
use crate::data::WindowOrder;
use crate::model::llama::{AttentionBias, LlamaConfig, LlamaFamily};
use crate::model::rope::{Rope, RopeScaling};
use crate::model::{Gpt2Config, ModelConfig, ParamLayout, init_params};
use crate::train::{DataChoice, TrainSettings, TrainSpec, choose_model, train};
use dsplan_planner::model::Embeddings;

/// The small models' vocabulary: not a multiple of 64, so the device pads the logits' rows
/// (300 in rows of 320); the bundled corpus's byte tokens are all below it.
pub const SMALL_VOCAB: usize = 300;

/// tiny-gpt2 widened to head size 64.
pub fn small_model() -> Result<Gpt2Config, String> {
    let tiny = choose_model(None, 1).map_err(|e| format!("tiny-gpt2: {e}"))?;
    Ok(Gpt2Config {
        n_embd: 128,
        n_head: 2,
        n_layer: 2,
        n_positions: 64,
        vocab_size: SMALL_VOCAB,
        ..*tiny
            .config
            .gpt2()
            .ok_or("the default preset is not a GPT-2")?
    })
}

/// The spec of the check: `steps` steps of the small model with `precision`'s config keys.
pub fn small_spec(precision: &Value, steps: u64) -> Result<TrainSpec, String> {
    let model = small_model()?;
    let params = init_params(&model, &ParamLayout::new(&model), 11);
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-6, "weight_decay": 0.01}},
    });
    if let (Some(object), Some(extra)) = (config.as_object_mut(), precision.as_object()) {
        object.extend(extra.clone());
    }
    Ok(TrainSpec {
        settings: TrainSettings::from_config(&config, 1).map_err(|e| format!("settings: {e}"))?,
        model: model.into(),
        initial_params: params,
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 7 },
        },
        seq_len: 64,
        steps,
        world: 1,
    })
}

/// The largest `|gpu - cpu| - rel * |cpu|` over the parameters, the largest `|gpu - cpu|`,
/// and `‖Δgpu - Δcpu‖ / ‖Δcpu‖` over the update (Δ: final minus initial).
pub fn param_errors(initial: &[f32], gpu: &[f32], cpu: &[f32], rel: f64) -> (f64, f64, f64) {
    let mut worst = f64::NEG_INFINITY;
    let mut worst_abs = 0.0f64;
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for ((&p0, &g), &c) in initial.iter().zip(gpu).zip(cpu) {
        let (p0, g, c) = (f64::from(p0), f64::from(g), f64::from(c));
        let d = (g - c).abs();
        // NaN is sticky: `f64::max` would drop it.
        if d.is_nan() || worst.is_nan() {
            worst = f64::NAN;
            worst_abs = f64::NAN;
        } else {
            worst = worst.max(d - rel * c.abs());
            worst_abs = worst_abs.max(d);
        }
        diff += ((g - p0) - (c - p0)).powi(2);
        norm += (c - p0).powi(2);
    }
    (worst, worst_abs, (diff / norm.max(1e-300)).sqrt())
}

/// One step on GPU `ordinal` and on the CPU, fp32 then bf16: three rows each (loss, every
/// parameter, the update).
pub fn one_step_vs_cpu(ordinal: usize) -> Result<Vec<CheckRow>, String> {
    steps_vs_cpu(ordinal, &small_spec)
}

/// [`one_step_vs_cpu`] for the Llama family: a GQA Llama with an untied head, then a Qwen2
/// with q/k/v biases and a tied head ([`small_llama_spec`]).
pub fn one_llama_step_vs_cpu(ordinal: usize) -> Result<Vec<CheckRow>, String> {
    let mut rows = steps_vs_cpu(ordinal, &|precision, steps| {
        small_llama_spec(SmallLlama::Llama, precision, steps)
    })?;
    rows.extend(steps_vs_cpu(ordinal, &|precision, steps| {
        small_llama_spec(SmallLlama::Qwen2, precision, steps)
    })?);
    Ok(rows)
}

/// Which small Llama-family model [`small_llama_spec`] trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmallLlama {
    /// Llama: no biases, untied `lm_head`.
    Llama,
    /// Qwen2: q/k/v biases, tied embeddings.
    Qwen2,
}

/// [`small_spec`] with a small Llama-family model of head size 64 (the kernels'): vocab 300,
/// width 128, 2 query heads over 1 key/value head, SwiGLU 256, 2 layers.
pub fn small_llama_spec(
    which: SmallLlama,
    precision: &Value,
    steps: u64,
) -> Result<TrainSpec, String> {
    let (family, attention_bias, embeddings) = match which {
        SmallLlama::Llama => (
            LlamaFamily::Llama,
            AttentionBias::Absent,
            Embeddings::Untied,
        ),
        SmallLlama::Qwen2 => (LlamaFamily::Qwen2, AttentionBias::Qkv, Embeddings::Tied),
    };
    let config = LlamaConfig {
        family,
        vocab_size: SMALL_VOCAB,
        max_position_embeddings: 64,
        hidden_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 64,
        intermediate_size: 256,
        rms_norm_eps: 1e-6,
        rope: Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        },
        attention_bias,
        embeddings,
        sliding_window: None,
    };
    let model = ModelConfig::Llama(config);
    let mut spec = small_spec(precision, steps)?;
    spec.initial_params = model.init_params(11);
    spec.model = model;
    Ok(spec)
}

/// One step of each precision on the GPU and the CPU for the spec `spec_of` builds.
fn steps_vs_cpu(
    ordinal: usize,
    spec_of: &dyn Fn(&Value, u64) -> Result<TrainSpec, String>,
) -> Result<Vec<CheckRow>, String> {
    let mut rows = Vec::new();
    for (dtype, precision) in [
        ("f32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        let spec = spec_of(&precision, 1)?;
        let gpu =
            train_cuda(&spec, ordinal, &|_, _| {}).map_err(|e| format!("{dtype} GPU step: {e}"))?;
        let cpu = train(&spec, &|_| {}).map_err(|e| format!("{dtype} CPU step: {e}"))?;
        let (Some(g), Some(c)) = (gpu.steps.first(), cpu.steps.first()) else {
            return Err(format!("{dtype}: a backend ran no step"));
        };
        if gpu.final_params.len() != cpu.final_params.len() {
            return Err(format!(
                "{dtype}: {} parameters on the GPU, {} on the CPU",
                gpu.final_params.len(),
                cpu.final_params.len()
            ));
        }
        let (loss_gpu, loss_cpu) = (g.loss, c.loss);
        let loss_rel = (loss_gpu - loss_cpu).abs() / loss_cpu.abs();
        let mut loss_row = CheckRow::measured(
            CheckKind::TrainStep,
            "train step loss",
            dtype,
            Metric::ScalarRelative,
            (loss_rel, (loss_gpu - loss_cpu).abs()),
            if dtype == "f32" { 1e-5 } else { 1e-2 },
        );
        loss_row.detail = Some(format!("GPU {loss_gpu:.7}, CPU {loss_cpu:.7}"));
        if g.grad_norm.is_none() {
            loss_row = CheckRow::failed(
                CheckKind::TrainStep,
                "train step loss",
                format!("{dtype}: the GPU skipped the step (no gradient norm)"),
            );
        }
        rows.push(loss_row);
        let (rel, tol) = if dtype == "f32" {
            (1e-5, 1e-6)
        } else {
            (0.0, 2e-3 + 1e-6)
        };
        let (worst, worst_abs, update_rel) = param_errors(
            &spec.initial_params,
            &gpu.final_params,
            &cpu.final_params,
            rel,
        );
        rows.push(CheckRow::measured(
            CheckKind::TrainStep,
            if dtype == "f32" {
                "train step parameters (beyond 1e-5 rel)"
            } else {
                "train step parameters"
            },
            dtype,
            Metric::Excess,
            (worst, worst_abs),
            tol,
        ));
        rows.push(CheckRow::measured(
            CheckKind::TrainStep,
            "train step update",
            dtype,
            Metric::UpdateNorm,
            (update_rel, worst_abs),
            if dtype == "f32" { 1e-3 } else { 0.1 },
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_errors_measure_excess_and_update() {
        let initial = [1.0f32, 1.0];
        let cpu = [0.9f32, 1.1];
        let (worst, worst_abs, update) = param_errors(&initial, &[0.9, 1.1], &cpu, 0.0);
        assert_eq!((worst, worst_abs, update), (0.0, 0.0, 0.0));
        let (worst, worst_abs, update) = param_errors(&initial, &[0.8, 1.1], &cpu, 0.0);
        assert!((worst - 0.1).abs() < 1e-6 && (worst_abs - 0.1).abs() < 1e-6);
        assert!((update - (0.01f64 / 0.02).sqrt()).abs() < 1e-6, "{update}");
        let (worst, _, _) = param_errors(&initial, &[f32::NAN, 1.1], &cpu, 0.0);
        assert!(worst.is_nan());
    }

    #[test]
    fn the_check_spec_builds_on_the_host() {
        let spec = small_spec(&json!({"bf16": {"enabled": true}}), 1).expect("spec");
        let model = spec.model.gpt2().copied().expect("a GPT-2");
        assert_eq!((model.n_embd / model.n_head, spec.seq_len), (64, 64));
        assert_eq!(
            spec.initial_params.len(),
            ParamLayout::new(&model).num_params()
        );
    }
}
