//! [`ModelGraph`]: a model as the plan sees it: every trainable parameter tensor with its
//! shape, in `model.parameters()` order, and the modules that own them (DeepSpeed's stage-3
//! fetch units) in forward execution order, each with the matmul work it does.
//!
//! GPT-2 and the Llama layout (Llama, Mistral, Qwen2) are built exactly: Hugging Face names,
//! shapes (GPT-2's `Conv1D` weights are `[in, out]`, `nn.Linear` weights `[out, in]`) and the
//! order in which the forward pass enters each module. GPT-2's tied `lm_head` owns no tensor
//! of its own, but is a fetch unit that uses `transformer.wte.weight` again, as in DeepSpeed's
//! trace. Other families (T5, BERT, BLOOM) come from [`crate::model::layouts`] with flat
//! shapes, and their execution order is assumed to be the parameter order.

use serde::Serialize;

use crate::model::layouts;
use crate::model::tensors::Storage;
use crate::model::{Architecture, Bias, Embeddings, Family, LmHead, ModelSpec};

/// One trainable parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamTensor {
    /// Hugging Face name, e.g. `transformer.h.0.attn.c_attn.weight`.
    pub name: String,
    /// Shape as the framework stores it.
    pub shape: Vec<u64>,
    /// Elements (the product of the shape).
    pub numel: u64,
}

/// What a fetch unit computes, for the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitKind {
    /// A lookup table (token or position embedding): no matmul.
    Embedding,
    /// LayerNorm / RMSNorm: no matmul.
    Norm,
    /// A projection: 2 FLOPs per weight element per token.
    Linear,
    /// The attention output projection, preceded by the attention core (QKᵀ and AV:
    /// 4 × sequence × attention width FLOPs per token).
    AttentionOutput,
    /// The output projection to the vocabulary.
    LmHead,
}

/// A module that owns parameters directly: DeepSpeed's stage-3 fetch unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FetchUnit {
    /// Module name, e.g. `transformer.h.3.mlp.c_fc`.
    pub module: String,
    /// The tensors it uses (indices into [`ModelGraph::tensors`]), ascending.
    pub tensors: Vec<usize>,
    /// The transformer block it belongs to, if any.
    pub layer: Option<u64>,
    /// What it computes.
    pub kind: UnitKind,
    /// Weight elements multiplied per token (2 FLOPs each in forward).
    pub matmul_params: u64,
}

/// Whether [`ModelGraph::units`] follow the real forward order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitOrder {
    /// The order the Hugging Face forward pass enters each module.
    Execution,
    /// Assumed equal to the parameter order (families dsplan does not model op by op).
    ParameterOrder,
}

/// A model's parameters and fetch units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelGraph {
    /// Display name.
    pub name: String,
    /// Trainable tensors in `model.parameters()` order (tied copies not repeated).
    pub tensors: Vec<ParamTensor>,
    /// Fetch units in forward order.
    pub units: Vec<FetchUnit>,
    /// How [`Self::units`] are ordered.
    pub unit_order: UnitOrder,
    /// The architecture.
    pub architecture: Architecture,
}

/// Why a model cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelGraphError(pub String);

impl std::fmt::Display for ModelGraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelGraphError {}

impl ModelGraph {
    /// The graph of a model specification; it needs the architecture (a preset, a
    /// `config.json`, or a safetensors directory with one).
    pub fn from_spec(spec: &ModelSpec) -> Result<ModelGraph, ModelGraphError> {
        let Some(architecture) = spec.architecture else {
            return Err(ModelGraphError(format!(
                "`{}`: a plan needs every tensor's shape; give a preset or a config.json, not only a parameter count",
                spec.name
            )));
        };
        Self::from_architecture(&spec.name, &architecture)
    }

    /// The graph of an architecture, with the LM head of the training class.
    pub fn from_architecture(
        name: &str,
        arch: &Architecture,
    ) -> Result<ModelGraph, ModelGraphError> {
        arch.validate()
            .map_err(|error| ModelGraphError(error.to_string()))?;
        let mut builder = Builder::default();
        let unit_order = match arch.family {
            Family::Gpt2 => {
                gpt2(&mut builder, arch);
                UnitOrder::Execution
            }
            Family::Llama {
                attention_bias,
                mlp_bias,
            } => {
                llama(
                    &mut builder,
                    arch,
                    [attention_bias, attention_bias, mlp_bias],
                );
                UnitOrder::Execution
            }
            Family::Mistral => {
                llama(&mut builder, arch, [Bias::Absent; 3]);
                UnitOrder::Execution
            }
            Family::Qwen2 => {
                llama(
                    &mut builder,
                    arch,
                    [Bias::Present, Bias::Absent, Bias::Absent],
                );
                UnitOrder::Execution
            }
            Family::T5 { .. } | Family::Bert { .. } | Family::Bloom => {
                generic(&mut builder, arch);
                UnitOrder::ParameterOrder
            }
        };
        Ok(ModelGraph {
            name: name.to_owned(),
            tensors: builder.tensors,
            units: builder.units,
            unit_order,
            architecture: *arch,
        })
    }

    /// Total trainable elements.
    pub fn total_params(&self) -> u64 {
        self.tensors.iter().map(|t| t.numel).sum()
    }

    /// The largest tensor's element count.
    pub fn largest_tensor(&self) -> u64 {
        self.tensors.iter().map(|t| t.numel).max().unwrap_or(0)
    }

    /// Elements of the tensors a unit uses.
    pub fn unit_numel(&self, unit: &FetchUnit) -> u64 {
        unit.tensors.iter().map(|&t| self.tensors[t].numel).sum()
    }
}

/// Collects tensors (parameter order) and units (execution order).
#[derive(Default)]
struct Builder {
    tensors: Vec<ParamTensor>,
    units: Vec<FetchUnit>,
}

impl Builder {
    /// Appends a tensor and returns its index.
    fn tensor(&mut self, name: String, shape: &[u64]) -> usize {
        let numel = shape.iter().product();
        self.tensors.push(ParamTensor {
            name,
            shape: shape.to_vec(),
            numel,
        });
        self.tensors.len() - 1
    }

    fn unit(
        &mut self,
        module: String,
        tensors: Vec<usize>,
        layer: Option<u64>,
        kind: UnitKind,
        matmul_params: u64,
    ) {
        let mut tensors = tensors;
        tensors.sort_unstable();
        self.units.push(FetchUnit {
            module,
            tensors,
            layer,
            kind,
            matmul_params,
        });
    }
}

fn gpt2(b: &mut Builder, arch: &Architecture) {
    let (h, v) = (arch.hidden, arch.vocab);
    let inner = arch.intermediate;
    let positions = arch.positions.unwrap_or(1024);
    let wte = b.tensor("transformer.wte.weight".into(), &[v, h]);
    b.unit(
        "transformer.wte".into(),
        vec![wte],
        None,
        UnitKind::Embedding,
        0,
    );
    let wpe = b.tensor("transformer.wpe.weight".into(), &[positions, h]);
    b.unit(
        "transformer.wpe".into(),
        vec![wpe],
        None,
        UnitKind::Embedding,
        0,
    );
    // (module suffix, weight shape, bias width, kind); GPT-2's Conv1D stores [in, out].
    let block: [(&str, [u64; 2], UnitKind); 6] = [
        ("ln_1", [h, 0], UnitKind::Norm),
        ("attn.c_attn", [h, 3 * h], UnitKind::Linear),
        ("attn.c_proj", [h, h], UnitKind::AttentionOutput),
        ("ln_2", [h, 0], UnitKind::Norm),
        ("mlp.c_fc", [h, inner], UnitKind::Linear),
        ("mlp.c_proj", [inner, h], UnitKind::Linear),
    ];
    for layer in 0..arch.layers {
        for (suffix, [rows, cols], kind) in block {
            let module = format!("transformer.h.{layer}.{suffix}");
            let (weight_shape, bias_width, matmul) = if kind == UnitKind::Norm {
                (vec![rows], rows, 0)
            } else {
                (vec![rows, cols], cols, rows * cols)
            };
            let weight = b.tensor(format!("{module}.weight"), &weight_shape);
            let bias = b.tensor(format!("{module}.bias"), &[bias_width]);
            b.unit(module, vec![weight, bias], Some(layer), kind, matmul);
        }
    }
    let ln_w = b.tensor("transformer.ln_f.weight".into(), &[h]);
    let ln_b = b.tensor("transformer.ln_f.bias".into(), &[h]);
    b.unit(
        "transformer.ln_f".into(),
        vec![ln_w, ln_b],
        None,
        UnitKind::Norm,
        0,
    );
    let head = match arch.embeddings {
        Embeddings::Tied => wte,
        Embeddings::Untied => b.tensor("lm_head.weight".into(), &[v, h]),
    };
    b.unit("lm_head".into(), vec![head], None, UnitKind::LmHead, v * h);
}

/// The Llama layout. `biases`: on q/k/v, on o, on the MLP projections.
fn llama(b: &mut Builder, arch: &Architecture, biases: [Bias; 3]) {
    let (h, v, inner) = (arch.hidden, arch.vocab, arch.intermediate);
    let (attn, kv) = (arch.attention_width(), arch.kv_width());
    let embed = b.tensor("model.embed_tokens.weight".into(), &[v, h]);
    b.unit(
        "model.embed_tokens".into(),
        vec![embed],
        None,
        UnitKind::Embedding,
        0,
    );
    let [qkv_bias, o_bias, mlp_bias] = biases;
    // Parameter order (self_attn, mlp, norms) differs from execution order.
    let projections: [(&str, u64, u64, Bias, UnitKind); 7] = [
        ("self_attn.q_proj", attn, h, qkv_bias, UnitKind::Linear),
        ("self_attn.k_proj", kv, h, qkv_bias, UnitKind::Linear),
        ("self_attn.v_proj", kv, h, qkv_bias, UnitKind::Linear),
        (
            "self_attn.o_proj",
            h,
            attn,
            o_bias,
            UnitKind::AttentionOutput,
        ),
        ("mlp.gate_proj", inner, h, mlp_bias, UnitKind::Linear),
        ("mlp.up_proj", inner, h, mlp_bias, UnitKind::Linear),
        ("mlp.down_proj", h, inner, mlp_bias, UnitKind::Linear),
    ];
    for layer in 0..arch.layers {
        let prefix = format!("model.layers.{layer}");
        let mut owned = Vec::new();
        for (suffix, out, input, bias, kind) in projections {
            let module = format!("{prefix}.{suffix}");
            let mut tensors = vec![b.tensor(format!("{module}.weight"), &[out, input])];
            if bias == Bias::Present {
                tensors.push(b.tensor(format!("{module}.bias"), &[out]));
            }
            owned.push((module, tensors, kind, out * input));
        }
        let norms: Vec<(String, usize)> = ["input_layernorm", "post_attention_layernorm"]
            .iter()
            .map(|norm| {
                let module = format!("{prefix}.{norm}");
                let index = b.tensor(format!("{module}.weight"), &[h]);
                (module, index)
            })
            .collect();
        // Execution: input norm, q, k, v, o, post-attention norm, gate, up, down.
        let mut projections = owned.into_iter();
        let emit_norm = |b: &mut Builder, (module, index): (String, usize)| {
            b.unit(module, vec![index], Some(layer), UnitKind::Norm, 0);
        };
        let mut norms = norms.into_iter();
        if let Some(norm) = norms.next() {
            emit_norm(b, norm);
        }
        for (module, tensors, kind, matmul) in projections.by_ref().take(4) {
            b.unit(module, tensors, Some(layer), kind, matmul);
        }
        if let Some(norm) = norms.next() {
            emit_norm(b, norm);
        }
        for (module, tensors, kind, matmul) in projections {
            b.unit(module, tensors, Some(layer), kind, matmul);
        }
    }
    let norm = b.tensor("model.norm.weight".into(), &[h]);
    b.unit("model.norm".into(), vec![norm], None, UnitKind::Norm, 0);
    let head = match arch.embeddings {
        Embeddings::Tied => embed,
        Embeddings::Untied => b.tensor("lm_head.weight".into(), &[v, h]),
    };
    b.unit("lm_head".into(), vec![head], None, UnitKind::LmHead, v * h);
}

/// Families listed by [`layouts::tensors`] only: flat shapes, parameter-order units.
fn generic(b: &mut Builder, arch: &Architecture) {
    let entries = layouts::tensors(arch, LmHead::Include);
    let mut index_of = std::collections::HashMap::new();
    let mut current: Option<(String, Vec<usize>)> = None;
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for entry in &entries {
        let tensor = match &entry.storage {
            Storage::Owned => {
                let index = b.tensor(entry.name.clone(), &[entry.numel]);
                index_of.insert(entry.name.clone(), index);
                index
            }
            Storage::SharedWith(target) => match index_of.get(target) {
                Some(&index) => index,
                None => continue,
            },
        };
        let module = entry.module().to_owned();
        match &mut current {
            Some((name, tensors)) if *name == module => tensors.push(tensor),
            _ => {
                if let Some(done) = current.take() {
                    groups.push(done);
                }
                current = Some((module, vec![tensor]));
            }
        }
    }
    groups.extend(current);
    for (module, tensors) in groups {
        let largest = tensors
            .iter()
            .map(|&t| b.tensors[t].numel)
            .max()
            .unwrap_or(0);
        let (kind, matmul) = generic_kind(&module, largest, arch);
        let layer = layer_number(&module);
        b.unit(module, tensors, layer, kind, matmul);
    }
}

/// A guess at what a module of another family computes, from its name and size.
fn generic_kind(module: &str, largest: u64, arch: &Architecture) -> (UnitKind, u64) {
    let lower = module.to_ascii_lowercase();
    if lower.contains("embed") || lower == "shared" || lower.ends_with("relative_attention_bias") {
        (UnitKind::Embedding, 0)
    } else if lower.contains("lm_head") || lower.ends_with("decoder") {
        (UnitKind::LmHead, largest)
    } else if largest <= arch.hidden.max(arch.vocab) && !lower.contains("dense") {
        (UnitKind::Norm, 0)
    } else {
        (UnitKind::Linear, largest)
    }
}

/// The first dotted number in a module name (`encoder.block.3.layer...` → 3).
fn layer_number(module: &str) -> Option<u64> {
    module.split('.').find_map(|part| part.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets;
    use crate::model::tensors::TensorEntry;

    fn owned(arch: &Architecture) -> Vec<(String, u64)> {
        layouts::tensors(arch, LmHead::Include)
            .into_iter()
            .filter(|t: &TensorEntry| t.storage == Storage::Owned)
            .map(|t| (t.name, t.numel))
            .collect()
    }

    #[test]
    fn exact_families_list_the_same_tensors_as_the_model_module() {
        for name in [
            "gpt2",
            "tiny-gpt2",
            "llama-2-7b",
            "llama-2-70b",
            "mistral-7b",
            "qwen2-7b",
        ] {
            let preset = presets::lookup(name).expect("preset");
            let graph = ModelGraph::from_architecture(name, &preset.architecture).expect("graph");
            let ours: Vec<(String, u64)> = graph
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.numel))
                .collect();
            assert_eq!(ours, owned(&preset.architecture), "{name}");
        }
    }

    #[test]
    fn every_tensor_is_used_by_a_unit() {
        for preset in presets::PRESETS {
            let graph =
                ModelGraph::from_architecture(preset.name, &preset.architecture).expect("graph");
            let mut used = vec![false; graph.tensors.len()];
            for unit in &graph.units {
                for &t in &unit.tensors {
                    used[t] = true;
                }
            }
            assert!(used.iter().all(|u| *u), "{}", preset.name);
        }
    }

    #[test]
    fn llama_units_follow_execution_order() {
        let preset = presets::lookup("llama-2-7b").expect("preset");
        let graph = ModelGraph::from_architecture("l", &preset.architecture).expect("graph");
        let names: Vec<&str> = graph.units[1..10]
            .iter()
            .map(|u| u.module.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "model.layers.0.input_layernorm",
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.self_attn.k_proj",
                "model.layers.0.self_attn.v_proj",
                "model.layers.0.self_attn.o_proj",
                "model.layers.0.post_attention_layernorm",
                "model.layers.0.mlp.gate_proj",
                "model.layers.0.mlp.up_proj",
                "model.layers.0.mlp.down_proj",
            ]
        );
    }
}
