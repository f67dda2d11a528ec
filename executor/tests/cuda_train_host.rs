//! The device training step checked on the host (no GPU): its buffers against the planner's
//! `dsplan-cuda` plan (equal to the byte) and DeepSpeed's GPU plan (printed), and its op lists against the launcher's shape rules, the CPU model's
//! tensors and the `.cu` signatures of every kernel it launches. Prints the memory table and
//! the launch counts with `--nocapture`.

use dsplan_executor::cuda::train::offload::check_offload_plan;
use dsplan_executor::cuda::train::{DeviceLayout, Op, StepProgram};
use dsplan_executor::metrics::{Category, PlanMemory};
use dsplan_executor::model::{ActivationLayout, BatchShape, Gpt2Config, Recompute};
use dsplan_executor::train::plan::model_graph;
use dsplan_executor::train::{AttentionKernel, TrainSettings, choose_model, compile_cuda_plan};
use dsplan_kernels::Dtype;
use dsplan_planner::plan::settings::OffloadStepping;
use dsplan_planner::plan::{self, Cluster, PlanBackend, Workload};
use serde_json::json;

#[path = "support/signatures.rs"]
mod signatures;
use signatures::check_launch_signatures;

#[path = "support/models.rs"]
mod models;
use models::small_head_64;

fn layout(config: Gpt2Config, batch: usize, seq_len: usize, dtype: Dtype) -> DeviceLayout {
    DeviceLayout::new(config, BatchShape { batch, seq_len }, dtype)
}

fn train_config(stage: u8, dtype: Dtype) -> serde_json::Value {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 4,
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

/// The device buffers per category equal the `dsplan-cuda` plan's peaks to the byte (the
/// total too): gpt2 124M in bf16, fp32 and fp16 and a small head-size-64 model, micro-batch
/// 4, stages 0-3 at W=1.
#[test]
fn device_buffers_equal_the_dsplan_cuda_plan_to_the_byte() {
    let gpt2 = choose_model(Some("gpt2"), 1)
        .expect("gpt2 preset")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2");
    let cases = [
        (gpt2, 1024, Dtype::Bf16),
        (gpt2, 1024, Dtype::F32),
        (gpt2, 1024, Dtype::F16),
        (small_head_64(), 64, Dtype::Bf16),
        (small_head_64(), 48, Dtype::F32),
    ];
    for (model, seq_len, dtype) in cases {
        let device = layout(model, 4, seq_len, dtype);
        let ours = device.bytes_by_category();
        for stage in 0..=3u8 {
            let settings =
                TrainSettings::from_config(&train_config(stage, dtype), 1).expect("settings");
            let plan = compile_cuda_plan(&settings, &model.into(), seq_len, 1).expect("plan");
            let predicted = PlanMemory::of(&plan);
            for category in Category::ALL {
                assert_eq!(
                    ours.get(category),
                    predicted.peak.get(category),
                    "L={} {dtype} stage {stage} {category:?}",
                    model.n_layer
                );
            }
            assert_eq!(ours.total(), predicted.peak_total, "{dtype} stage {stage}");
        }
    }
}

/// Informative: gpt2 124M bf16, micro-batch 4 x 1024, the device buffers against DeepSpeed's
/// GPU plan at W=1 (printed with `--nocapture`). Parameters, master weights and optimizer
/// states are the same buffers (within DeepSpeed's padding); the rest differ by design (see
/// `cuda::train::buffers`).
#[test]
fn device_buffers_against_the_deepspeed_gpu_plan() {
    let model = choose_model(Some("gpt2"), 1)
        .expect("gpt2 preset")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2");
    let device = layout(model, 4, 1024, Dtype::Bf16);
    let ours = device.bytes_by_category();
    let graph = model_graph(&model.into()).expect("graph");
    let cluster = Cluster::new(1, 1).expect("cluster");
    let workload = Workload {
        sequence_length: Some(1024),
        ..Workload::default()
    };
    eprintln!(
        "| stage | category | device (MB) | deepspeed-gpu plan (MB) | ratio |\n|---|---|---|---|---|"
    );
    for stage in 0..=3u8 {
        let settings =
            TrainSettings::from_config(&train_config(stage, Dtype::Bf16), 1).expect("settings");
        let plan = plan::compile(&settings.config, &graph, &cluster, &workload).expect("plan");
        assert_eq!(plan.settings.backend, PlanBackend::DeepspeedGpu);
        let predicted = PlanMemory::of(&plan).peak;
        for category in Category::ALL {
            let (a, b) = (ours.get(category), predicted.get(category));
            let ratio = if b == 0 {
                f64::NAN
            } else {
                a as f64 / b as f64
            };
            eprintln!(
                "| {stage} | {category:?} | {:.1} | {:.1} | {ratio:.3} |",
                a as f64 / 1e6,
                b as f64 / 1e6
            );
        }
        for category in [Category::Params, Category::Master, Category::Optimizer] {
            let (a, b) = (ours.get(category) as f64, predicted.get(category) as f64);
            assert!(
                (a / b - 1.0).abs() < 0.05,
                "stage {stage} {category:?}: device {a} vs plan {b}"
            );
        }
    }
}

/// Two GPUs are planned (one rank's buffers; `cuda_collectives_host` checks them). Offload is
/// planned too (`planner/tests/cuda_offload_plans.rs`): the step lays out an optimizer offload
/// (its host program is checked in `cuda_offload_host_program`) and refuses `offload_param` by
/// name.
#[test]
fn the_dsplan_cuda_plan_plans_two_gpus_and_offload_and_the_step_takes_the_optimizer_offload() {
    let model = small_head_64();
    let settings = TrainSettings::from_config(&train_config(2, Dtype::Bf16), 2).expect("settings");
    let plan = compile_cuda_plan(&settings, &model.into(), 64, 2).expect("two GPUs");
    assert_eq!(plan.settings.world_size, 2);
    let mut config = train_config(2, Dtype::Bf16);
    config["zero_optimization"]["offload_optimizer"] = json!({"device": "cpu"});
    let settings = TrainSettings::from_config(&config, 1).expect("settings");
    let plan = compile_cuda_plan(&settings, &model.into(), 64, 1).expect("offload plans");
    assert!(
        plan.buffers.iter().any(|b| b.device == plan::Device::Cpu),
        "host buffers"
    );
    assert_eq!(
        check_offload_plan(&plan),
        Ok(Some(OffloadStepping::Exact)),
        "the optimizer offload is taken"
    );
    DeviceLayout::for_plan_rank(
        model,
        BatchShape {
            batch: 2,
            seq_len: 64,
        },
        Dtype::Bf16,
        Recompute::Nothing,
        &plan,
        0,
    )
    .expect("a device layout for the optimizer-offloaded plan");
    config["zero_optimization"]["stage"] = json!(3);
    config["zero_optimization"]["offload_param"] = json!({"device": "cpu"});
    let settings = TrainSettings::from_config(&config, 1).expect("settings");
    let plan = compile_cuda_plan(&settings, &model.into(), 64, 1).expect("offload_param plans");
    let refused = check_offload_plan(&plan).expect_err("offload_param is refused by name");
    assert!(refused.contains("offload_param"), "{refused}");
}

#[test]
fn every_op_of_the_step_passes_the_launchers_shape_rules() {
    for (config, dtype) in [
        (Gpt2Config::gpt2(), Dtype::Bf16),
        (Gpt2Config::gpt2(), Dtype::F32),
        (small_head_64(), Dtype::F16),
    ] {
        let layout = layout(config, 2, 64, dtype);
        let program = StepProgram::new(&layout);
        program.check(&layout).expect("every op consistent");
        for grad_accum in [1, 4] {
            let launches = program.launch_count(grad_accum, dtype).expect("launches");
            let ops = program.ops(grad_accum).count();
            eprintln!(
                "L={} {dtype}: G={grad_accum}: {ops} ops, {launches} kernel launches and library calls per step",
                config.n_layer
            );
        }
        let l = config.n_layer;
        // forward: encoder + L * (ln_1 + 7) + ln_f + logits + classifier
        // backward: zero + 2 (classifier) + ln_f + L * (3 + 1 + 3 + 1 + 3 + 1 + 3 + 1) + encoder
        let expected_micro = (1 + l * 8 + 3) + (1 + 2 + 1 + l * 16 + 1);
        assert_eq!(program.micro_step.len(), expected_micro);
    }
}

/// GPT-2's logits rows are `Vp` = 50,304 elements apart (50,257 rounded up to a multiple of
/// 64): the three vocabulary products are issued to cuBLASLt with `V` = 50,257 columns and a
/// leading dimension of 50,304, 16-byte aligned in every dtype (the unpadded 100,514-byte bf16
/// rows sent cuBLASLt to Turing-era kernels on an H200), every operand 256-byte aligned; the
/// classifier reads the same rows; the padding is allocated (and planned: the test above).
#[test]
fn the_vocabulary_products_and_the_classifier_use_aligned_padded_rows() {
    let (v, vp) = (50_257usize, 50_304usize);
    let (batch, seq_len) = (2, 64);
    let n = batch * seq_len;
    for (dtype, bytes) in [(Dtype::Bf16, 2), (Dtype::F32, 4), (Dtype::F16, 2)] {
        let layout = layout(Gpt2Config::gpt2(), batch, seq_len, dtype);
        assert_eq!(layout.step.logits_stride, vp);
        let planned = layout.activation_table.get("logits").expect("logits");
        assert_eq!(planned.span.len, n * vp);
        assert_eq!(layout.step.logits.span.offset, planned.span.offset);
        assert_eq!(layout.step.logits.len(), (n - 1) * vp + v);
        let program = StepProgram::new(&layout);
        let mut leading = Vec::new();
        for op in &program.micro_step {
            let vocabulary = match op {
                Op::Linear { product, .. } if product.dims.2 == v => Some(*product),
                _ => None,
            };
            if let Some(product) = vocabulary {
                let plan = product.plan();
                let config = plan.config;
                // The (N, V) operand: V columns (one of cuBLASLt's m, n, k), rows Vp apart.
                let strided = plan.operands.iter().find(|o| o.stride != o.cols);
                let strided = strided.expect("a strided operand");
                assert_eq!((strided.rows, strided.cols, strided.stride), (n, v, vp));
                assert!(
                    [config.m, config.n, config.k].contains(&(v as u64)),
                    "{config:?}"
                );
                leading.extend([config.lda, config.ldb, config.ldc]);
                // Every operand starts 256-byte aligned in its allocation (cudaMalloc's
                // alignment), the alignment cuBLASLt's heuristics assume by default.
                for (tensor, _) in op.tensors() {
                    assert_eq!(tensor.span.offset * bytes % 256, 0, "{dtype}: {tensor:?}");
                }
            }
            if let Op::FusedClassifier {
                logits,
                vocab,
                stride,
                ..
            } = op
            {
                assert_eq!((*vocab, *stride, *logits), (v, vp, layout.step.logits));
            }
        }
        // Forward, dlnf and dwte, each with one operand of leading dimension Vp.
        assert_eq!(leading.iter().filter(|&&ld| ld == vp as i64).count(), 3);
        for ld in leading {
            assert_eq!(
                ld as usize * bytes % 16,
                0,
                "{dtype}: leading dimension {ld}"
            );
        }
    }
}

/// The CPU tensor `name`'s shape as the device lays it out: the logits' rows padded to a
/// multiple of 64 (`cuda_layout::padded_vocab`), every other tensor as it is.
fn padded_logits(name: &str, shape: &[usize]) -> Vec<usize> {
    let mut shape = shape.to_vec();
    if name == "logits" {
        let vocab = shape.last_mut().expect("(B, T, V)");
        *vocab = vocab.next_multiple_of(64);
    }
    shape
}

/// The device activations that are the CPU model's tensors have its names and sizes (the
/// logits' rows padded).
#[test]
fn device_activations_have_the_cpu_models_shapes() {
    let config = choose_model(None, 1)
        .expect("tiny")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2");
    let shape = BatchShape {
        batch: 3,
        seq_len: 16,
    };
    let cpu = ActivationLayout::new(&config, shape, Recompute::Nothing);
    let device = DeviceLayout::new(config, shape, Dtype::Bf16);
    let mut matched = 0;
    for table in [&device.activation_table, &device.stats_table] {
        for entry in table.entries() {
            match cpu.table().get(&entry.name) {
                Some(cpu_entry) => {
                    assert_eq!(
                        entry.shape,
                        padded_logits(&entry.name, &cpu_entry.shape),
                        "{}",
                        entry.name
                    );
                    matched += 1;
                }
                None => assert!(
                    entry.name.ends_with(".lse"),
                    "{} has no CPU counterpart",
                    entry.name
                ),
            }
        }
    }
    // Every CPU tensor but att / datt (the T x T matrices) exists on the device.
    let missing: Vec<&str> = cpu
        .table()
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .filter(|n| device.activation_table.get(n).is_none() && device.stats_table.get(n).is_none())
        .collect();
    assert!(
        missing.iter().all(|n| n.ends_with("att") || *n == "datt"),
        "{missing:?}"
    );
    assert_eq!(matched, cpu.table().entries().len() - missing.len());
}

/// Each kernel launch's argument list equals its entry point's `.cu` signature.
#[test]
fn launches_match_the_kernel_signatures() {
    let config = small_head_64();
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let layout = layout(config, 2, 32, dtype);
        let program = StepProgram::new(&layout);
        assert!(check_launch_signatures(program.ops(1), dtype) > 20);
    }
}

/// `--attention-kernel tensor-core`: the step's attention ops launch the `attention_tc_*`
/// kernels (forward, the shared preprocess, dk/dv, dq) in bf16 and f16, with arguments that
/// match attention_tc.cu's signatures, and nothing else of the step changes; in f32 the
/// description is an error before any launch (the tensor-core kernels are 16-bit only).
#[test]
fn tensor_core_attention_swaps_only_the_attention_launches() {
    let config = small_head_64();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let layout = layout(config, 2, 32, dtype);
        let scalar = StepProgram::new(&layout);
        let tc = scalar.clone().with_attention(AttentionKernel::TensorCore);
        assert!(check_launch_signatures(tc.ops(1), dtype) > 20);
        let entries = |program: &StepProgram| -> Vec<String> {
            program
                .ops(1)
                .flat_map(|op| op.launches(dtype).expect("launches"))
                .map(|l| l.entry_point)
                .collect()
        };
        let (before, after) = (entries(&scalar), entries(&tc));
        assert_eq!(before.len(), after.len());
        let mut swapped = 0;
        for (a, b) in before.iter().zip(&after) {
            if a.starts_with("attention_forward") || a.starts_with("attention_backward_d") {
                assert_eq!(b, &a.replacen("attention_", "attention_tc_", 1));
                swapped += 1;
            } else {
                assert_eq!(a, b);
            }
        }
        // Forward, dk/dv and dq of each of the two layers.
        assert_eq!(swapped, 3 * config.n_layer, "{dtype}");
        assert!(after.contains(&format!("attention_tc_forward_hs64_{dtype}")));
    }
    let f32_layout = layout(config, 2, 32, Dtype::F32);
    let tc = StepProgram::new(&f32_layout).with_attention(AttentionKernel::TensorCore);
    let error = tc
        .ops(1)
        .find_map(|op| op.launches(Dtype::F32).err())
        .expect("f32 tensor-core attention is refused");
    assert!(error.to_string().contains("bf16 and f16"), "{error}");
}

/// A change in shape that breaks an op is caught on the host.
#[test]
fn a_wrong_shape_is_an_error_before_any_launch() {
    let config = choose_model(None, 1)
        .expect("tiny")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2");
    let layout = layout(config, 2, 16, Dtype::Bf16);
    let program = StepProgram::new(&layout);
    let Some(Op::LayerNormForward {
        out,
        mean,
        rstd,
        inp,
        weight,
        bias,
    }) = program
        .micro_step
        .iter()
        .find(|op| matches!(op, Op::LayerNormForward { .. }))
        .cloned()
    else {
        panic!("the first block's ln_1 is a plain LayerNorm");
    };
    let short = Op::LayerNormForward {
        out: out.prefix(out.len() - 1),
        mean,
        rstd,
        inp,
        weight,
        bias,
    };
    assert!(short.check(&layout).is_err());
    let aliased = Op::LayerNormForward {
        out: inp,
        mean,
        rstd,
        inp,
        weight,
        bias,
    };
    assert!(aliased.check(&layout).is_err());
}

/// A head size without attention kernels (tiny-gpt2's 16) is refused by the step's check and
/// by `train_cuda` before any CUDA call (so this runs without a GPU), naming the sizes that
/// exist; head sizes 64 and 128 pass.
#[test]
fn a_head_size_without_attention_kernels_is_refused_before_allocating() {
    use dsplan_executor::cuda::train::program::attention_head_sizes;
    use dsplan_executor::cuda::train::{CudaTrainError, check_spec, train_cuda};
    use dsplan_executor::data::WindowOrder;
    use dsplan_executor::train::{DataChoice, TrainSpec};

    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        assert_eq!(attention_head_sizes(dtype), vec![64, 128]);
    }
    let tiny = choose_model(None, 1).expect("tiny");
    let tiny_config = tiny.config.gpt2().copied().expect("a GPT-2");
    assert_eq!(tiny_config.head_dim(), 16);
    let narrow = layout(tiny_config, 2, 16, Dtype::Bf16);
    let error = StepProgram::new(&narrow)
        .check(&narrow)
        .expect_err("head size 16");
    assert!(
        error.0.contains("head size (n_embd / n_head) is 16"),
        "{error}"
    );
    assert!(error.0.contains("64 and 128"), "{error}");
    for (n_embd, n_head) in [(128, 2), (256, 2)] {
        let config = Gpt2Config {
            n_embd,
            n_head,
            ..tiny_config
        };
        let wide = layout(config, 2, 16, Dtype::Bf16);
        StepProgram::new(&wide)
            .check(&wide)
            .expect("head sizes 64 and 128 have kernels");
    }

    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    });
    let spec = TrainSpec {
        settings: TrainSettings::from_config(&config, 1).expect("settings"),
        model: tiny.config,
        initial_params: tiny.params,
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 1 },
        },
        seq_len: 16,
        steps: 1,
        world: 1,
    };
    for error in [
        check_spec(&spec).expect_err("refused"),
        train_cuda(&spec, 0, &|_, _| {}).expect_err("refused before any CUDA call"),
    ] {
        let CudaTrainError::Setup(message) = &error else {
            panic!("a setup error, not a CUDA one: {error}");
        };
        assert!(message.contains("head size"), "{message}");
    }
    // At W = 2 the GPU refuses tiny-gpt2 for its head size, as at W = 1, not for the world.
    let two = TrainSpec {
        world: 2,
        ..spec.clone()
    };
    let error = check_spec(&two).expect_err("head size 16");
    assert!(error.to_string().contains("head size"), "{error}");
    // Activation checkpointing: the GPU backend recomputes too.
    let wide = Gpt2Config {
        n_embd: 128,
        n_head: 2,
        ..*tiny.config.gpt2().expect("a GPT-2")
    };
    let recomputing = TrainSpec {
        settings: spec.settings.clone().with_gradient_checkpointing(true),
        model: wide.into(),
        initial_params: dsplan_executor::model::init_params(
            &wide,
            &dsplan_executor::model::ParamLayout::new(&wide),
            1,
        ),
        ..spec
    };
    check_spec(&recomputing).expect("the GPU recomputes each block (activation checkpointing)");
}

/// The GPU's checkpoints are the CPU rank's files: the device's whole flat state, cut by
/// `owned_from_whole` / `held_from_whole`, is what a single CPU rank of the same plan holds
/// (master and parameters, fp32 and bf16, stages 0-3), and consolidating the cuts of every
/// rank gives the whole back (W = 1, 2 and 4). The `dsplan-cuda` plan lays the state out as
/// the `dsplan-cpu` plan does, so a checkpoint moves between the backends unresharded.
#[test]
fn the_device_state_is_cut_as_a_cpu_rank_holds_it_for_checkpoints() {
    use std::sync::Arc;

    use dsplan_executor::checkpoint::consolidate;
    use dsplan_executor::comm::LocalComm;
    use dsplan_executor::cuda::train::{held_from_whole, owned_from_whole};
    use dsplan_executor::metrics::MemoryLedger;
    use dsplan_executor::model::{ParamLayout, init_params};
    use dsplan_executor::train::compile_plan;
    use dsplan_executor::zero::{EnginePlan, ListedBuffers, RankOptions, ZeroRank};

    let model = choose_model(None, 2).expect("tiny");
    let gpt2 = model.config.gpt2().copied().expect("a GPT-2");
    let params = ParamLayout::new(&gpt2);
    let whole = init_params(&gpt2, &params, 4);
    for dtype in [Dtype::F32, Dtype::Bf16] {
        for stage in 0..=3u8 {
            for world in [1usize, 2, 4] {
                let what = format!("{dtype:?} stage {stage} W={world}");
                let settings =
                    TrainSettings::from_config(&train_config(stage, dtype), world).expect("config");
                let cpu_plan = compile_plan(&settings, &model.config, 16, world).expect("cpu plan");
                let engine_plan = EnginePlan::from_plan(&cpu_plan, &params).expect("fits");
                let cuts: Vec<Vec<f32>> = (0..world)
                    .map(|rank| owned_from_whole(&engine_plan, rank, &whole))
                    .collect();
                assert_eq!(
                    consolidate(&engine_plan, engine_plan.stage(), &cuts),
                    whole,
                    "{what}: the cuts consolidate to the whole"
                );
                if world != 1 {
                    continue;
                }
                let cuda_plan =
                    compile_cuda_plan(&settings, &model.config, 16, 1).expect("cuda plan");
                let on_device = EnginePlan::from_plan(&cuda_plan, &params).expect("fits");
                assert_eq!(on_device.stage(), engine_plan.stage(), "{what}");
                assert_eq!(on_device.flat(), engine_plan.flat(), "{what}");
                assert_eq!(on_device.owned(0), engine_plan.owned(0), "{what}");
                assert_eq!(on_device.shards(), engine_plan.shards(), "{what}");

                let engine_plan = Arc::new(engine_plan);
                let ledger = MemoryLedger::new();
                let comm = LocalComm::group(1).expect("a group").remove(0);
                let options = RankOptions::from_plan(&engine_plan, engine_plan.grad_scaling());
                let mut rank = ZeroRank::new(
                    Box::new(comm),
                    Arc::clone(&engine_plan),
                    options,
                    &whole,
                    &ListedBuffers::of_plan(&cpu_plan),
                    &ledger,
                )
                .expect("a rank");
                // The CPU rank builds its fp32 master from the model-dtype parameters, as
                // DeepSpeed does.
                let rounded: Vec<f32> = match dtype {
                    Dtype::Bf16 => whole
                        .iter()
                        .map(|&x| half::bf16::from_f32(x).to_f32())
                        .collect(),
                    _ => whole.clone(),
                };
                let owned = rank.export_owned().expect("owned");
                assert_eq!(
                    owned.master,
                    owned_from_whole(&on_device, 0, &rounded),
                    "{what}: master"
                );
                let (_, held) = rank.held_params().expect("held");
                assert_eq!(
                    held,
                    held_from_whole(&on_device, 0, &rounded),
                    "{what}: parameters"
                );
            }
        }
    }
}

/// Activation checkpointing on the device, GPT-2: the allocation equals the `dsplan-cuda`
/// plan with full checkpointing to the byte (stages 0-3, f32 and bf16); the activations drop
/// by `L - 1` working sets (`17·NC` and `4N + B·NH·T` statistics each); backward re-runs each
/// block but the last (`ln_1` and 6 ops, `mlp.c_proj` left out) before its backward.
#[test]
fn checkpointing_allocation_equals_the_plan_and_recomputes_each_block() {
    use dsplan_executor::cuda::train::Region;
    use dsplan_planner::memory::cuda_layout::CudaRegion;

    let model = small_head_64();
    let (batch, seq_len) = (4, 64);
    let shape = BatchShape { batch, seq_len };
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let full = layout(model, batch, seq_len, dtype);
        let device = DeviceLayout::recomputing(model, shape, dtype, Recompute::EachLayer);
        for stage in 0..=3u8 {
            let settings = TrainSettings::from_config(&train_config(stage, dtype), 1)
                .expect("settings")
                .with_gradient_checkpointing(true);
            let plan = compile_cuda_plan(&settings, &model.into(), seq_len, 1).expect("plan");
            let predicted = PlanMemory::of(&plan);
            let ours = device.bytes_by_category();
            for category in Category::ALL {
                assert_eq!(
                    ours.get(category),
                    predicted.peak.get(category),
                    "{dtype} stage {stage} {category:?}"
                );
            }
        }
        let (l, n, c) = (model.n_layer, shape.tokens(), model.n_embd);
        let activations = Region::Step(CudaRegion::Activations);
        let stats = Region::Step(CudaRegion::Stats);
        assert_eq!(
            full.len(activations) - device.len(activations),
            (l - 1) * 17 * n * c
        );
        assert_eq!(
            full.len(stats) - device.len(stats),
            (l - 1) * (4 * n + batch * model.n_head * seq_len)
        );
        let program = StepProgram::new(&device);
        program.check(&device).expect("every op consistent");
        let plain = StepProgram::new(&full).micro_step.len();
        assert_eq!(program.micro_step.len(), plain + (l - 1) * 7);
    }
}

/// A GPT-2 spec of the small head-64 model at `world` ranks with `config`.
fn world_spec(config: &serde_json::Value, world: usize) -> dsplan_executor::train::TrainSpec {
    use dsplan_executor::data::WindowOrder;
    use dsplan_executor::model::{ParamLayout, init_params};
    use dsplan_executor::train::{DataChoice, TrainSpec};
    let model = small_head_64();
    TrainSpec {
        settings: TrainSettings::from_config(config, world).expect("settings"),
        model: model.into(),
        initial_params: init_params(&model, &ParamLayout::new(&model), 1),
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 1 },
        },
        seq_len: 64,
        steps: 1,
        world,
    }
}

/// `W > 1` on the GPU, on the host: `check_spec` accepts GPT-2 at W = 2 and 3; every rank's
/// step is built from the `dsplan-cuda` plan and checked (`rank_models`: the plan's
/// collectives between the compute, every op within the rank's buffers) at stages 0-3 in
/// fp32 and 1-3 in bf16; the Llama family gets the same answer at W = 2 as at W = 1 (no
/// refusal for the world size: its ranks have their shares of the plan too).
#[test]
fn the_gpu_trainer_takes_gpt2_at_world_two_and_three_and_builds_every_ranks_step() {
    use dsplan_executor::cuda::train::program::CommAction;
    use dsplan_executor::cuda::train::{CudaTrainError, check_spec, rank_models};

    for world in [2usize, 3] {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            for stage in 0..=3u8 {
                let what = format!("{dtype:?} stage {stage} W={world}");
                let spec = world_spec(&train_config(stage, dtype), world);
                check_spec(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                let compiled = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, world);
                let plan = compiled.unwrap_or_else(|e| panic!("{what}: {e:?}"));
                let models = rank_models(&spec, &plan).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(models.len(), world, "{what}");
                for (rank, model) in models.iter().enumerate() {
                    let collectives = model
                        .program
                        .ops(2)
                        .filter(|op| {
                            matches!(op, Op::Collective(c)
                                if matches!(c.action, CommAction::Collective { .. }))
                        })
                        .count();
                    assert!(collectives > 0, "{what} rank {rank}: no collectives");
                }
            }
        }
    }
    let llama = choose_model(Some("tiny-llama"), 1).expect("tiny-llama");
    let config = train_config(2, Dtype::Bf16);
    let llama_spec = |world| dsplan_executor::train::TrainSpec {
        model: llama.config,
        initial_params: llama.params.clone(),
        ..world_spec(&config, world)
    };
    // tiny-llama's head size may have no kernel: whatever the answer, it is the same at both
    // world sizes.
    let answer = |world| {
        check_spec(&llama_spec(world))
            .err()
            .map(|e: CudaTrainError| e.to_string())
    };
    let (one, two) = (answer(1), answer(2));
    eprintln!("tiny-llama: W = 1 {one:?}, W = 2 {two:?}");
    assert_eq!(
        one, two,
        "the Llama family's answer depends on the world size"
    );
}

/// What a GPU rank owns (its master, moments and, without a master, parameters) goes to the
/// CPU rank's checkpoint layout and back unchanged, at W = 2 and 3, stages 0-3, fp32 and bf16:
/// the device's share of a whole state is what `DeviceBuffers` uploads
/// (`initial_master`, or the owned parameters); cut to the CPU layout it equals
/// `owned_from_whole` of the same plan (so a W = 2 GPU checkpoint is a W = 2 CPU rank's
/// files); taken back it is the device's share again; the ranks' CPU cuts consolidate to the
/// whole. Stage 3's held parameters (the shard) give the CPU rank's held shard.
#[test]
fn a_gpu_ranks_share_round_trips_through_the_cpu_checkpoint_layout() {
    use dsplan_executor::checkpoint::consolidate;
    use dsplan_executor::cuda::train::region::RegionSizes;
    use dsplan_executor::cuda::train::{DeviceOwned, held_from_whole, owned_from_whole};
    use dsplan_executor::model::ParamLayout;
    use dsplan_executor::zero::EnginePlan;
    use dsplan_planner::plan::cuda_world::CudaShares;

    let model = small_head_64();
    let params = ParamLayout::new(&model);
    let psi = params.num_params();
    let whole: Vec<f32> = (0..psi).map(|i| 1.0 + i as f32 * 1e-3).collect();
    let mut checked = 0;
    for world in [2usize, 3] {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            for stage in 0..=3u8 {
                let what = format!("{dtype:?} stage {stage} W={world}");
                let settings =
                    TrainSettings::from_config(&train_config(stage, dtype), world).expect("config");
                let plan = compile_cuda_plan(&settings, &model.into(), 64, world)
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                let engine = EnginePlan::from_plan(&plan, &params).expect("fits");
                let shares = CudaShares::of_plan(&plan);
                let mut cuts = Vec::new();
                for rank in 0..world {
                    let layout = DeviceLayout::with_shares(
                        model,
                        BatchShape {
                            batch: 4,
                            seq_len: 64,
                        },
                        dtype,
                        Recompute::Nothing,
                        shares.for_rank(rank as u64),
                    );
                    let owned = DeviceOwned::of_layout(&layout);
                    let on_device = owned.from_whole(&whole);
                    let uploaded = if layout.trains_master() {
                        layout.initial_master(&whole)
                    } else {
                        layout.initial_params(&whole)[owned.params_at..owned.params_at + owned.len]
                            .to_vec()
                    };
                    assert_eq!(
                        on_device, uploaded,
                        "{what} rank {rank}: the device's share"
                    );
                    let cut = owned.to_cpu(&engine, rank, &on_device);
                    assert_eq!(
                        cut,
                        owned_from_whole(&engine, rank, &whole),
                        "{what} rank {rank}: the CPU rank's layout"
                    );
                    assert_eq!(
                        owned.from_cpu(&engine, rank, &cut),
                        on_device,
                        "{what} rank {rank}: back on the device"
                    );
                    if stage == 3 {
                        let mut from_shard = vec![0.0f32; psi];
                        owned.into_whole(&on_device, &mut from_shard);
                        assert_eq!(
                            held_from_whole(&engine, rank, &from_shard),
                            held_from_whole(&engine, rank, &whole),
                            "{what} rank {rank}: the held shard"
                        );
                    }
                    cuts.push(cut);
                    checked += 1;
                }
                assert_eq!(
                    consolidate(&engine, engine.stage(), &cuts),
                    whole,
                    "{what}: the ranks' cuts consolidate to the whole"
                );
            }
        }
    }
    // W = 2 and 3: fp32 and bf16, stages 0-3.
    assert_eq!(checked, (2 + 3) * 8, "every case ran");
}
