//! The Llama family's device buffers checked on the host (no GPU): allocation equals the
//! `dsplan-cuda` plan to the byte, and the activations carry the CPU model's names and shapes
//! where they are the same tensor.

use dsplan_executor::cuda::gemm::Pass;
use dsplan_executor::cuda::train::family::llama::LlamaTensors;
use dsplan_executor::cuda::train::program::Access;
use dsplan_executor::cuda::train::{DeviceLayout, Family, Op, Region, StepProgram};
use dsplan_executor::metrics::{Category, PlanMemory};
use dsplan_executor::model::llama::{
    AttentionBias, LlamaActivations, LlamaConfig, LlamaFamily, LlamaLayout,
};
use dsplan_executor::model::rope::{Rope, RopeScaling};
use dsplan_executor::model::{BatchShape, ModelConfig, Recompute};
use dsplan_executor::train::{AttentionKernel, TrainSettings, choose_model, compile_cuda_plan};
use dsplan_kernels::Dtype;
use dsplan_planner::model::Embeddings;
use serde_json::json;

#[path = "support/signatures.rs"]
mod signatures;
use signatures::check_launch_signatures;

/// The Llama family's own tensors of a layout.
fn llama_tensors(layout: &DeviceLayout) -> &LlamaTensors {
    match &layout.family {
        Family::Llama(tensors) => tensors,
        Family::Gpt2(_) => panic!("a Llama-family layout"),
    }
}

fn train_config(stage: u8, dtype: Dtype) -> serde_json::Value {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
    });
    match dtype {
        Dtype::Bf16 => config["bf16"] = json!({"enabled": true}),
        Dtype::F16 => config["fp16"] = json!({"enabled": true}),
        Dtype::F32 | Dtype::F64 => {}
    }
    config
}

/// A small decoder with head size 64 (the attention kernels' smallest), GQA 4:2.
fn llama(family: LlamaFamily, bias: AttentionBias, embeddings: Embeddings) -> LlamaConfig {
    LlamaConfig {
        family,
        vocab_size: 300,
        max_position_embeddings: 128,
        hidden_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        intermediate_size: 688,
        rms_norm_eps: 1e-5,
        rope: Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        },
        attention_bias: bias,
        embeddings,
        sliding_window: None,
    }
}

fn models() -> Vec<LlamaConfig> {
    let tiny = match choose_model(Some("tiny-llama"), 1)
        .expect("tiny-llama")
        .config
    {
        ModelConfig::Llama(c) => c,
        ModelConfig::Gpt2(_) => panic!("tiny-llama is a Llama"),
    };
    vec![
        tiny,
        llama(
            LlamaFamily::Llama,
            AttentionBias::Absent,
            Embeddings::Untied,
        ),
        llama(LlamaFamily::Qwen2, AttentionBias::Qkv, Embeddings::Tied),
        llama(LlamaFamily::Llama, AttentionBias::QkvO, Embeddings::Tied),
        llama(
            LlamaFamily::Mistral,
            AttentionBias::Absent,
            Embeddings::Untied,
        ),
    ]
}

/// The device buffers per category equal the `dsplan-cuda` plan's peaks to the byte (and the
/// total): Llama (tied and untied, with and without o bias), Qwen2 with q/k/v biases, Mistral,
/// in f32, bf16 and f16, stages 0-3 at W=1.
#[test]
fn llama_device_buffers_equal_the_dsplan_cuda_plan_to_the_byte() {
    let seq_len = 32;
    for config in models() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let device = DeviceLayout::new(config, BatchShape { batch: 2, seq_len }, dtype);
            let ours = device.bytes_by_category();
            for stage in 0..=3u8 {
                let settings =
                    TrainSettings::from_config(&train_config(stage, dtype), 1).expect("settings");
                let plan = compile_cuda_plan(&settings, &ModelConfig::Llama(config), seq_len, 1)
                    .expect("plan");
                let predicted = PlanMemory::of(&plan);
                for category in Category::ALL {
                    assert_eq!(
                        ours.get(category),
                        predicted.peak.get(category),
                        "{:?} {:?} {dtype} stage {stage} {category:?}",
                        config.family,
                        config.attention_bias
                    );
                }
                assert_eq!(ours.total(), predicted.peak_total);
            }
        }
    }
}

/// Every device activation the CPU model also keeps has the CPU's name and shape; the
/// parameters are the CPU's table; the bias partials exist exactly when a projection has a
/// bias, and the losses close the statistics (the trainer reads them from the end).
#[test]
fn llama_device_activations_are_the_cpu_models_where_they_correspond() {
    let shape = BatchShape {
        batch: 2,
        seq_len: 16,
    };
    for config in models() {
        let device = DeviceLayout::new(config, shape, Dtype::Bf16);
        let cpu = LlamaActivations::new(&config, shape, Recompute::Nothing);
        let mut shared = 0;
        for entry in device.activation_table.entries() {
            if let Some(theirs) = cpu.table().get(&entry.name) {
                // The logits' rows are padded to a multiple of 64 (300 to 320).
                let mut want = theirs.shape.clone();
                if entry.name == "logits" {
                    let vocab = want.last_mut().expect("(B, T, V)");
                    *vocab = vocab.next_multiple_of(64);
                }
                assert_eq!(entry.shape, want, "{}", entry.name);
                shared += 1;
            }
        }
        // encoded, lnf, logits, 4 backward buffers, and 8 per layer.
        assert_eq!(shared, 7 + 8 * config.num_hidden_layers, "{config:?}");
        for name in ["ln1_rstd", "ln2_rstd"] {
            let ours = device.stats_table.get(&format!("h.0.{name}")).expect(name);
            let theirs = cpu.table().get(&format!("h.0.{name}")).expect(name);
            assert_eq!(ours.shape, theirs.shape);
        }
        assert_eq!(
            device.param_table().entries(),
            LlamaLayout::new(&config).table().entries()
        );
        assert_eq!(
            device.step.bias_partials.is_empty(),
            config.attention_bias == AttentionBias::Absent
        );
        let last = device.stats_table.entries().last().map(|e| e.name.clone());
        assert_eq!(last.as_deref(), Some("losses"));
        assert_eq!(
            llama_tensors(&device).rope_cos.len(),
            shape.seq_len * config.head_dim / 2,
            "the rotation table is (T, hs/2)"
        );
    }
}

/// The head-size-64 variants (the kernels' head sizes) and the ~100M Llama of the CPU
/// benchmark (`train_bench --preset llama-100m`: V 32000, C 768, L 8, 12 heads over 4).
fn kernel_models() -> Vec<LlamaConfig> {
    let mut list = models()[1..].to_vec();
    list.push(LlamaConfig {
        vocab_size: 32_000,
        max_position_embeddings: 2048,
        hidden_size: 768,
        num_hidden_layers: 8,
        num_attention_heads: 12,
        num_key_value_heads: 4,
        intermediate_size: 2048,
        ..llama(
            LlamaFamily::Llama,
            AttentionBias::Absent,
            Embeddings::Untied,
        )
    });
    list
}

/// The Llama family's `lm_head` products and classifier use the padded logits rows as GPT-2's
/// do: vocabulary 300 in rows of 320 (the small models), 32,000 in rows of 32,000 (already a
/// multiple of 64); forward, `dlnf` and `dW` each once over `layout.step.logits` with that stride.
#[test]
fn the_llama_lm_head_and_classifier_use_the_padded_logits_rows() {
    for config in kernel_models() {
        let layout = DeviceLayout::new(
            config,
            BatchShape {
                batch: 2,
                seq_len: 64,
            },
            Dtype::Bf16,
        );
        let (v, vp) = (config.vocab_size, config.vocab_size.next_multiple_of(64));
        assert_eq!(layout.step.logits_stride, vp);
        assert_eq!(layout.step.logits.len(), (2 * 64 - 1) * vp + v);
        let program = StepProgram::new(&layout);
        let mut uses = 0;
        for op in &program.micro_step {
            let stride = match op {
                Op::Linear {
                    product,
                    out,
                    first,
                    second,
                    ..
                } if [out, first, second].contains(&&layout.step.logits) => product.stride,
                Op::FusedClassifier { vocab, stride, .. } => {
                    assert_eq!(*vocab, v);
                    *stride
                }
                _ => continue,
            };
            assert_eq!(stride, vp, "{op:?}");
            uses += 1;
        }
        assert_eq!(uses, 4, "forward, classifier, dlnf, dW");
    }
}

/// Every op of the Llama step fits its layout (bounds, aliasing, the launcher's shape rules,
/// an entry point for every launch), and a micro-step has the documented ops: forward
/// `5 + L·(10 + P)`, backward `5 + L·(11 + 2P + o + b)` with `P` the q/k/v products (1 fused,
/// 3 with biases), `o` the o bias and `b` the q/k/v biases' pass. Prints the counts.
#[test]
fn every_llama_op_passes_the_launchers_shape_rules() {
    for config in kernel_models() {
        for (dtype, batch, seq_len) in [(Dtype::Bf16, 2, 64), (Dtype::F32, 1, 128)] {
            let layout = DeviceLayout::new(config, BatchShape { batch, seq_len }, dtype);
            let program = StepProgram::new(&layout);
            program.check(&layout).expect("every op consistent");
            let l = config.num_hidden_layers;
            let (p, o, b) = match config.attention_bias {
                AttentionBias::Absent => (1, 0, 0),
                AttentionBias::Qkv => (3, 0, 1),
                AttentionBias::QkvO => (3, 1, 1),
            };
            let forward = 5 + l * (10 + p);
            let backward = 5 + l * (11 + 2 * p + o + b);
            assert_eq!(program.micro_step.len(), forward + backward, "{config:?}");
            for grad_accum in [1, 4] {
                let launches = program.launch_count(grad_accum, dtype).expect("launches");
                eprintln!(
                    "{:?} {:?} L={l} C={} {dtype} B={batch} T={seq_len} G={grad_accum}: {} ops, \
                     {launches} kernel launches and library calls per step",
                    config.family,
                    config.attention_bias,
                    config.hidden_size,
                    program.ops(grad_accum).count()
                );
            }
        }
    }
}

/// Each kernel launch of the Llama step passes the argument types its `.cu` entry point
/// declares, in f32, bf16 and f16.
#[test]
fn llama_launches_match_the_kernel_signatures() {
    for config in kernel_models() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let shape = BatchShape {
                batch: 2,
                seq_len: 32,
            };
            let layout = DeviceLayout::new(config, shape, dtype);
            let program = StepProgram::new(&layout);
            assert!(check_launch_signatures(program.ops(1), dtype) > 10 * config.num_hidden_layers);
            if dtype == Dtype::F32 {
                continue; // the tensor-core kernels are 16-bit only
            }
            // `--attention-kernel tensor-core`: the grouped-query attention launches become the
            // attention_tc_*_gqa kernels, with attention_tc.cu's signatures.
            let tc = program.with_attention(AttentionKernel::TensorCore);
            assert!(check_launch_signatures(tc.ops(1), dtype) > 10 * config.num_hidden_layers);
            let tc_launches = tc
                .ops(1)
                .flat_map(|op| op.launches(dtype).expect("launches"))
                .filter(|l| l.kernel.starts_with("attention_tc_") && l.kernel.ends_with("_gqa"))
                .count();
            assert_eq!(tc_launches, 3 * config.num_hidden_layers, "{dtype}");
        }
    }
}

/// Backward writes the gradient of every parameter: the spans of region `Grads` the
/// micro-step writes cover it exactly (a tied `lm_head` lands in the embedding's).
#[test]
fn the_llama_backward_writes_every_parameter_gradient() {
    for config in kernel_models() {
        let shape = BatchShape {
            batch: 1,
            seq_len: 32,
        };
        let layout = DeviceLayout::new(config, shape, Dtype::Bf16);
        let program = StepProgram::new(&layout);
        let mut written = vec![false; layout.len(Region::Grads)];
        for op in &program.micro_step {
            for (tensor, access) in op.tensors() {
                if tensor.region == Region::Grads && access == Access::Write {
                    written[tensor.span.offset..tensor.span.end()].fill(true);
                }
            }
        }
        let missing: Vec<&str> = layout
            .param_table()
            .entries()
            .iter()
            .filter(|e| !written[e.span.offset..e.span.end()].iter().all(|&w| w))
            .map(|e| e.name.as_str())
            .collect();
        assert!(missing.is_empty(), "no gradient for {missing:?}");
    }
}

/// With q/k/v biases each projection writes its own columns of `qkv` (rows `QKV` apart),
/// side by side; without, one product writes the whole row.
#[test]
fn the_qkv_projections_write_their_columns_of_qkv() {
    for config in kernel_models() {
        let shape = BatchShape {
            batch: 2,
            seq_len: 32,
        };
        let layout = DeviceLayout::new(config, shape, Dtype::Bf16);
        let qkv = llama_tensors(&layout).blocks[0].qkv;
        let outs: Vec<(usize, usize, usize)> = StepProgram::new(&layout)
            .micro_step
            .iter()
            .filter_map(|op| match op {
                Op::Linear { product, out, .. }
                    if product.pass == Pass::Forward && out.overlaps(&qkv) =>
                {
                    Some((
                        out.span.offset - qkv.span.offset,
                        product.dims.2,
                        product.stride,
                    ))
                }
                _ => None,
            })
            .collect();
        let (a, kv, w) = (config.q_width(), config.kv_width(), config.qkv_width());
        let expected = match config.attention_bias {
            AttentionBias::Absent => vec![(0, w, w)],
            _ => vec![(0, a, w), (a, kv, w), (a + kv, kv, w)],
        };
        assert_eq!(outs, expected, "{config:?}");
    }
}

/// A shape change that breaks a Llama op is caught on the host: a rotation table of the wrong
/// length, a strided output one element short.
#[test]
fn a_wrong_llama_shape_is_an_error_before_any_launch() {
    let config = kernel_models()[1];
    let shape = BatchShape {
        batch: 2,
        seq_len: 32,
    };
    let layout = DeviceLayout::new(config, shape, Dtype::Bf16);
    let program = StepProgram::new(&layout);
    let mut broken = 0;
    for op in &program.micro_step {
        let wrong = match op.clone() {
            Op::Rope {
                rows,
                cos,
                sin,
                heads,
                width,
                seq_len,
                rotation,
            } => Op::Rope {
                rows,
                cos: cos.prefix(cos.len() - 1),
                sin,
                heads,
                width,
                seq_len,
                rotation,
            },
            Op::Linear {
                product,
                out,
                first,
                second,
                bias,
            } if product.pass == Pass::Forward => Op::Linear {
                product,
                out: out.prefix(out.len() - 1),
                first,
                second,
                bias,
            },
            _ => continue,
        };
        assert!(op.check(&layout).is_ok());
        assert!(wrong.check(&layout).is_err(), "{wrong:?}");
        broken += 1;
    }
    assert!(broken > 4);
}

/// The CUDA backend's host check accepts the Llama family with head size 64 (the small Llama
/// and Qwen2 the GPU test trains), and refuses tiny-llama's head size 16 as it refuses
/// tiny-gpt2's: a setup error naming the head size, before any CUDA call (so `dsplan run
/// --device cuda --model tiny-llama` fails as the GPT-2 run does).
#[test]
fn the_cuda_backend_accepts_the_llama_family_and_refuses_what_gpt2_is_refused() {
    use dsplan_executor::cuda::check::step::{SmallLlama, small_llama_spec};
    use dsplan_executor::cuda::train::{CudaTrainError, check_spec, train_cuda};

    for which in [SmallLlama::Llama, SmallLlama::Qwen2] {
        for precision in [json!({}), json!({"bf16": {"enabled": true}})] {
            let spec = small_llama_spec(which, &precision, 1).expect("spec");
            check_spec(&spec).unwrap_or_else(|e| panic!("{which:?}: {e}"));
        }
    }
    let mut spec = small_llama_spec(SmallLlama::Llama, &json!({}), 1).expect("spec");
    let tiny = choose_model(Some("tiny-llama"), 1).expect("tiny-llama");
    spec.model = tiny.config;
    spec.initial_params = tiny.params;
    for error in [
        check_spec(&spec).expect_err("head size 16"),
        train_cuda(&spec, 0, &|_, _| {}).expect_err("refused before any CUDA call"),
    ] {
        let CudaTrainError::Setup(message) = &error else {
            panic!("a setup error, not a CUDA one: {error}");
        };
        assert!(message.contains("head size"), "{message}");
    }
}

/// Activation checkpointing on the device, Llama family: the allocation equals the
/// `dsplan-cuda` plan with full checkpointing to the byte (stages 0-3, three dtypes); the
/// activations drop by `L - 1` working sets; backward re-runs each layer but the last up to
/// SwiGLU (`8 + P` ops) before its backward, and every op still fits.
#[test]
fn llama_checkpointing_allocation_equals_the_plan_and_recomputes_each_layer() {
    let seq_len = 32;
    let shape = BatchShape { batch: 2, seq_len };
    for config in kernel_models() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let full = DeviceLayout::new(config, shape, dtype);
            let device = DeviceLayout::recomputing(config, shape, dtype, Recompute::EachLayer);
            for stage in 0..=3u8 {
                let settings = TrainSettings::from_config(&train_config(stage, dtype), 1)
                    .expect("settings")
                    .with_gradient_checkpointing(true);
                let plan = compile_cuda_plan(&settings, &ModelConfig::Llama(config), seq_len, 1)
                    .expect("plan");
                let predicted = PlanMemory::of(&plan);
                let ours = device.bytes_by_category();
                for category in Category::ALL {
                    assert_eq!(
                        ours.get(category),
                        predicted.peak.get(category),
                        "{config:?} {dtype} stage {stage} {category:?}"
                    );
                }
            }
            let (l, n) = (config.num_hidden_layers, shape.tokens());
            let (c, i) = (config.hidden_size, config.intermediate_size);
            let set = n * (3 * c + config.qkv_width() + config.q_width() + 3 * i);
            let region = Region::Step(dsplan_planner::memory::cuda_layout::CudaRegion::Activations);
            assert_eq!(full.len(region) - device.len(region), (l - 1) * set);

            let program = StepProgram::new(&device);
            program.check(&device).expect("every op consistent");
            let p = if config.attention_bias == AttentionBias::Absent {
                1
            } else {
                3
            };
            let plain = StepProgram::new(&full).micro_step.len();
            assert_eq!(program.micro_step.len(), plain + (l - 1) * (8 + p));
            assert!(check_launch_signatures(program.ops(1), dtype) > 0);
        }
    }
}
