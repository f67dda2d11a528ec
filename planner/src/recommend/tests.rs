//! Unit tests of the walk, the configs it writes and the cost model.

use super::*;
use crate::config::OffloadDevice;
use crate::diagnostics::Severity;
use crate::model::{LmHead, load, presets};

const GIB: u64 = 1 << 30;

fn request(model: &str, gpus: u64, gpu_gib: u64, cpu_gib: Option<u64>) -> Request {
    let preset = presets::lookup(model).expect("preset");
    Request {
        model: load::from_preset(preset, LmHead::Include).expect("counts"),
        cluster: Cluster {
            hardware: Topology::new(gpus, 1).expect("valid"),
            gpu_memory: gpu_gib * GIB,
            cpu_memory: cpu_gib.map(|gib| gib * GIB),
            nvme_path: None,
        },
        seq_len: 1024,
        checkpointing: Checkpointing::Full,
        attention: AttentionKernel::Flash,
        global_batch: 64,
        precision: Precision::Bf16,
        margins: Margins::default(),
        cost: CostModel::default(),
    }
}

#[test]
fn every_strategy_writes_a_config_dsplan_validate_accepts() {
    let dims = ModelDims::from_spec(&request("gpt2", 8, 80, None).model);
    for strategy in Strategy::WALK {
        for precision in [Precision::Bf16, Precision::Fp16, Precision::Fp32] {
            let plan = Plan {
                strategy,
                micro_batch: 2,
                accumulation: 4,
                offload_ratio: (strategy == Strategy::Zero3OffloadOptimizer).then_some(0.5),
            };
            let inputs = ConfigInputs {
                precision,
                hidden: dims.layers.hidden,
                largest_tensor: dims.largest_tensor,
                world: 8,
                checkpointing: Checkpointing::Full,
                nvme_path: Some("/local_nvme"),
            };
            let config = strategy::ds_config(&plan, &inputs);
            let problems: Vec<_> = validate_document(
                &config,
                ValidateOptions {
                    world_size: Some(8),
                },
            )
            .into_iter()
            .filter(|d| d.severity != Severity::Info)
            .collect();
            assert!(
                problems.is_empty(),
                "{strategy:?} {precision:?}: {problems:?}"
            );
            assert_eq!(config["train_batch_size"], 64);
            // Read back, the config is the strategy.
            let reading = read_config(
                &config,
                Topology::new(8, 1).expect("valid"),
                None,
                &Overrides::default(),
            )
            .expect("reads back");
            assert_eq!(reading.setup.zero.stage, strategy.stage());
            assert_eq!(
                reading.setup.zero.optimizer_offloaded(),
                strategy.optimizer_device() != OffloadDevice::None
            );
            assert_eq!(reading.setup.precision, precision);
            assert_eq!(reading.checkpointing, Checkpointing::Full);
        }
    }
}

#[test]
fn the_batch_must_split_over_the_gpus() {
    let mut asked = request("gpt2", 8, 80, None);
    asked.global_batch = 100;
    let error = recommend(&asked).expect_err("100 over 8");
    assert_eq!(
        error.to_string(),
        "a global batch of 100 cannot be split over 8 GPUs; use 96 or 104"
    );
    asked.global_batch = 0;
    assert_eq!(
        recommend(&asked).expect_err("zero"),
        RecommendError::ZeroBatch
    );
}

#[test]
fn a_small_model_takes_zero1_with_the_largest_micro_batch() {
    let recommendation = recommend(&request("gpt2", 8, 80, None)).expect("fits");
    assert_eq!(recommendation.chosen.plan.strategy, Strategy::Zero1);
    // 64 sequences over 8 GPUs: all 8 in one micro-step.
    assert_eq!(recommendation.chosen.plan.micro_batch, 8);
    assert_eq!(recommendation.chosen.plan.accumulation, 1);
    assert!(recommendation.chosen.gpu_peak.bytes <= 80 * GIB);
    assert_eq!(recommendation.candidates.len(), Strategy::WALK.len());
    // Without --cpu-memory, offload is not considered; without --nvme-path, NVMe is not.
    let reasons: Vec<_> = recommendation
        .candidates
        .iter()
        .map(|c| c.rejection.clone())
        .collect();
    assert_eq!(reasons[2], Some(Rejection::NoCpuMemory));
    assert_eq!(reasons[6], Some(Rejection::NoNvmePath));
}

#[test]
fn nothing_fits_says_by_how_much() {
    let error = recommend(&request("llama-2-70b", 1, 16, Some(64))).expect_err("too small");
    let RecommendError::NothingFits(candidates) = error else {
        panic!("{error}")
    };
    let Some(Rejection::GpuMemory { needed, available }) = &candidates[0].rejection else {
        panic!("{:?}", candidates[0])
    };
    assert_eq!(*available, 16 * GIB);
    assert!(
        *needed > 16 * 70_000_000_000,
        "ZeRO-1 on one GPU holds 16 bytes per parameter"
    );
    // With the optimizer and parameters offloaded the GPU would fit; the host does not.
    assert!(matches!(
        candidates[5].rejection,
        Some(Rejection::CpuMemory { .. })
    ));
}

#[test]
fn offloading_more_costs_cpu_adam_time() {
    let asked = request("llama-2-7b", 1, 80, Some(1024));
    let prepared = Prepared::of(&asked.model);
    let time = |ratio: Option<f64>| {
        let plan = Plan {
            strategy: Strategy::Zero3OffloadOptimizer,
            micro_batch: 1,
            accumulation: 64,
            offload_ratio: ratio,
        };
        let read = read_back(&asked, &prepared.dims, &plan).expect("reads back");
        match try_plan(&asked, &prepared, plan, read).expect("estimates") {
            Tried::Fits(evaluated) => evaluated.fit.step_time,
            Tried::TooLarge { gpu, .. } => panic!("{gpu}"),
        }
    };
    let half = time(Some(0.5));
    let all = time(None);
    assert!(all.optimizer > half.optimizer);
    // 6.74B parameters on one node's CPU Adam at 1.344e9 parameters/s.
    let expected = 6_738_415_616.0 / 1.344e9;
    assert!(
        (all.optimizer / expected - 1.0).abs() < 0.01,
        "{}",
        all.optimizer
    );
    assert_eq!(half.compute, all.compute);
}

#[test]
fn bad_cost_constants_are_refused() {
    let mut asked = request("gpt2", 8, 80, None);
    asked.cost.compute_efficiency = 1.5;
    let error = recommend(&asked).expect_err("efficiency above 1");
    assert!(error.to_string().contains("compute_efficiency"), "{error}");
}

#[test]
fn divisors_are_found_by_trial_division_up_to_the_root() {
    assert_eq!(super::divisors(1), [1]);
    assert_eq!(super::divisors(12), [1, 2, 3, 4, 6, 12]);
    assert_eq!(super::divisors(49), [1, 7, 49]);
    assert_eq!(super::divisors(1 << 40).len(), 41);
}
