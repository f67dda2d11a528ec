//! Checkpoints: a run of 6 steps equals 3 steps, a checkpoint, and a resumed run of 3 more,
//! bit for bit (parameters, losses, learning rates, loss scales) for fp32, bf16 and fp16 at
//! every ZeRO stage on 2 ranks; a checkpoint resumed at another world size and stage matches
//! the uninterrupted run within 1e-6; a save stopped at any point leaves the previous
//! checkpoint and `latest` usable; unreadable or unfitting checkpoints are errors naming the
//! file and the field.

use std::path::Path;

use dsplan_executor::checkpoint::{CheckpointError, SaveFault, load_checkpoint};
use dsplan_executor::data::WindowOrder;
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use dsplan_executor::train::{
    CheckpointOptions, DataChoice, SavePolicy, TrainError, TrainReport, TrainSettings, TrainSpec,
    compile_plan, resume_point, train_planned_with,
};
use serde_json::{Value, json};

const MODEL: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 32,
    n_embd: 32,
    n_layer: 2,
    n_head: 2,
    layer_norm_epsilon: 1e-5,
};
const SEQ_LEN: usize = 16;
const GLOBAL_BATCH: usize = 4;

fn config(stage: u8, world: usize, precision: &Value) -> Value {
    let mut config = json!({
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH / world,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 2,
            "total_num_steps": 40, "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000,
            "stage3_param_persistence_threshold": 100},
    });
    if let (Some(target), Some(extra)) = (config.as_object_mut(), precision.as_object()) {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    config
}

fn spec(stage: u8, world: usize, precision: &Value, steps: u64) -> TrainSpec {
    TrainSpec {
        settings: TrainSettings::from_config(&config(stage, world, precision), world)
            .expect("config"),
        model: MODEL.into(),
        initial_params: init_params(&MODEL, &ParamLayout::new(&MODEL), 5),
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 9 },
        },
        seq_len: SEQ_LEN,
        steps,
        world,
    }
}

/// Runs `spec`, saving into `save` at the end (and every `every` steps), resuming from
/// `resume`.
fn run(
    spec: &TrainSpec,
    save: Option<(&Path, Option<u64>, SaveFault)>,
    resume: Option<&Path>,
) -> Result<TrainReport, TrainError> {
    let plan = compile_plan(&spec.settings, &spec.model, spec.seq_len, spec.world).expect("plan");
    let resume = match resume {
        Some(path) => {
            let loaded = load_checkpoint(path)?;
            Some(resume_point(spec, &plan, &loaded)?)
        }
        None => None,
    };
    let options = CheckpointOptions {
        save: save.map(|(dir, every, fault)| SavePolicy {
            fault,
            ..SavePolicy::new(dir, every)
        }),
        resume,
    };
    train_planned_with(spec, &plan, &options, &|_| {})
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|x| x.to_bits()).collect()
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let (mut d2, mut b2) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        d2 += (f64::from(x) - f64::from(y)).powi(2);
        b2 += f64::from(y).powi(2);
    }
    (d2 / b2).sqrt()
}

fn assert_continues(whole: &TrainReport, resumed: &TrainReport, split: u64, what: &str) {
    assert_eq!(resumed.first_step, split, "{what}");
    assert_eq!(
        resumed.steps.len(),
        whole.steps.len() - split as usize,
        "{what}"
    );
    for (a, b) in resumed.steps.iter().zip(&whole.steps[split as usize..]) {
        assert_eq!(a.step, b.step, "{what}: step numbering continues");
        assert_eq!(
            a.loss.to_bits(),
            b.loss.to_bits(),
            "{what}: loss of step {}",
            b.step
        );
        assert_eq!(
            a.lr.to_bits(),
            b.lr.to_bits(),
            "{what}: lr of step {}",
            b.step
        );
        assert_eq!(
            a.loss_scale, b.loss_scale,
            "{what}: scale of step {}",
            b.step
        );
        assert_eq!(a.skipped, b.skipped, "{what}: step {}", b.step);
        assert_eq!(
            a.grad_norm.map(f64::to_bits),
            b.grad_norm.map(f64::to_bits),
            "{what}: norm of step {}",
            b.step
        );
    }
    assert_eq!(resumed.applied_steps, whole.applied_steps, "{what}");
    assert!(
        bits(&resumed.final_params) == bits(&whole.final_params),
        "{what}: parameters differ by {:e} relative",
        relative(&resumed.final_params, &whole.final_params)
    );
}

#[test]
fn three_steps_and_a_resume_equal_six_steps_bit_for_bit() {
    let precisions = [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
        (
            "fp16",
            json!({"fp16": {"enabled": true, "initial_scale_power": 12,
                "loss_scale_window": 2, "hysteresis": 1}}),
        ),
    ];
    for (name, precision) in &precisions {
        for stage in 0..=3u8 {
            let what = format!("{name} stage {stage}");
            let whole = run(&spec(stage, 2, precision, 6), None, None).expect("whole run");
            let dir = tempfile::tempdir().expect("temp dir");
            let first = run(
                &spec(stage, 2, precision, 3),
                Some((dir.path(), None, SaveFault::Never)),
                None,
            )
            .expect("first half");
            assert_eq!(first.checkpoints.len(), 1);
            let resumed =
                run(&spec(stage, 2, precision, 6), None, Some(dir.path())).expect("second half");
            let scales: Vec<f64> = whole.steps.iter().map(|s| s.loss_scale).collect();
            eprintln!(
                "{what}: checkpoint {} bytes in {:.3} s; scales {scales:?}",
                first.checkpoints[0].bytes, first.checkpoints[0].seconds
            );
            if *name == "fp16" {
                assert!(
                    scales[3..].windows(2).any(|w| w[0] != w[1]) || scales[2] != scales[3],
                    "{what}: the loss scale must change after the checkpoint"
                );
            }
            assert_continues(&whole, &resumed, 3, &what);
        }
    }
}

#[test]
fn periodic_checkpoints_resume_from_a_named_tag() {
    let precision = json!({});
    let whole = run(&spec(1, 2, &precision, 6), None, None).expect("whole");
    let dir = tempfile::tempdir().expect("temp dir");
    let saving = run(
        &spec(1, 2, &precision, 6),
        Some((dir.path(), Some(2), SaveFault::Never)),
        None,
    )
    .expect("saving run");
    let tags: Vec<&str> = saving
        .checkpoints
        .iter()
        .map(|c| c.location.tag.as_str())
        .collect();
    assert_eq!(tags, ["global_step2", "global_step4", "global_step6"]);
    assert_eq!(bits(&saving.final_params), bits(&whole.final_params));
    let latest = std::fs::read_to_string(dir.path().join("latest")).expect("latest");
    assert_eq!(latest, "global_step6");
    let resumed = run(
        &spec(1, 2, &precision, 6),
        None,
        Some(&dir.path().join("global_step2")),
    )
    .expect("resumed");
    assert_continues(&whole, &resumed, 2, "from global_step2");
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn another_world_size_or_stage_resumes_from_the_consolidated_state() {
    let precision = json!({});
    let whole = run(&spec(2, 2, &precision, 6), None, None).expect("whole");
    let dir = tempfile::tempdir().expect("temp dir");
    run(
        &spec(2, 2, &precision, 3),
        Some((dir.path(), None, SaveFault::Never)),
        None,
    )
    .expect("first half");
    for (world, stage) in [(4, 3u8), (1, 1), (2, 0)] {
        let resumed = run(&spec(stage, world, &precision, 6), None, Some(dir.path()))
            .expect("resharded resume");
        let rel = relative(&resumed.final_params, &whole.final_params);
        let loss = resumed
            .steps
            .iter()
            .zip(&whole.steps[3..])
            .map(|(a, b)| (a.loss - b.loss).abs() / b.loss)
            .fold(0.0, f64::max);
        eprintln!(
            "world 2 stage 2 -> world {world} stage {stage}: ‖Δ‖/‖p‖ {rel:.2e}, loss {loss:.2e}"
        );
        assert!(rel <= 1e-6, "world {world} stage {stage}: {rel:e}");
        assert!(loss <= 1e-6, "world {world} stage {stage}: loss {loss:e}");
        assert_eq!(resumed.steps[0].step, 3);
    }
}

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("latest")).expect("latest")
}

#[test]
fn a_save_stopped_anywhere_leaves_the_previous_checkpoint() {
    let precision = json!({});
    for stage in [2u8, 3] {
        let dir = tempfile::tempdir().expect("temp dir");
        run(
            &spec(stage, 2, &precision, 2),
            Some((dir.path(), None, SaveFault::Never)),
            None,
        )
        .expect("first checkpoint");
        let before = load_checkpoint(dir.path()).expect("loads");
        for fault in [
            SaveFault::AfterRankFiles,
            SaveFault::BeforeRename,
            SaveFault::BeforeLatest,
        ] {
            let error = run(
                &spec(stage, 2, &precision, 4),
                Some((dir.path(), None, fault)),
                Some(dir.path()),
            )
            .expect_err("the save stops");
            assert!(
                matches!(
                    &error,
                    TrainError::Checkpoint(e) if matches!(**e, CheckpointError::Injected { .. })
                ),
                "{error}"
            );
            assert_eq!(latest(dir.path()), "global_step2", "{fault:?}");
            let after = load_checkpoint(dir.path()).expect("the previous checkpoint loads");
            assert_eq!(after, before, "{fault:?}");
            // Only a complete tag is ever renamed into place.
            let renamed = dir.path().join("global_step4");
            assert_eq!(
                renamed.exists(),
                fault == SaveFault::BeforeLatest,
                "{fault:?}"
            );
            if renamed.exists() {
                load_checkpoint(&renamed).expect("a renamed tag is complete");
                std::fs::remove_dir_all(&renamed).expect("cleaned");
            }
        }
        // A failing write (a file where the checkpoint directory should be) is an error too.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"not a directory").expect("file");
        let error = run(
            &spec(stage, 2, &precision, 1),
            Some((&blocked, None, SaveFault::Never)),
            None,
        )
        .expect_err("cannot save");
        assert!(
            matches!(&error, TrainError::Checkpoint(e) if matches!(**e, CheckpointError::Io { .. })),
            "{error}"
        );
    }
}

fn resume_error(spec: &TrainSpec, path: &Path) -> CheckpointError {
    match run(spec, None, Some(path)) {
        Err(TrainError::Checkpoint(error)) => *error,
        other => panic!(
            "expected a checkpoint error, got {:?}",
            other.map(|r| r.steps)
        ),
    }
}

#[test]
fn broken_or_unfitting_checkpoints_are_errors_naming_file_and_field() {
    let fp32 = json!({});
    let dir = tempfile::tempdir().expect("temp dir");
    run(
        &spec(2, 2, &fp32, 2),
        Some((dir.path(), None, SaveFault::Never)),
        None,
    )
    .expect("checkpoint");
    let tag = dir.path().join("global_step2");
    let fresh = spec(2, 2, &fp32, 4);

    let missing = resume_error(&fresh, &dir.path().join("nowhere"));
    assert!(
        matches!(missing, CheckpointError::Missing { .. }),
        "{missing}"
    );

    // Another model, precision, data or sequence length: refused, saying what differs.
    let mut other_model = fresh.clone();
    let one_layer = Gpt2Config {
        n_layer: 1,
        ..MODEL
    };
    other_model.model = one_layer.into();
    other_model.initial_params = init_params(&one_layer, &ParamLayout::new(&one_layer), 5);
    let error = resume_error(&other_model, dir.path());
    assert!(
        matches!(&error, CheckpointError::Mismatch { field, .. } if field == "model"),
        "{error}"
    );
    let error = resume_error(
        &spec(2, 2, &json!({"bf16": {"enabled": true}}), 4),
        dir.path(),
    );
    assert!(
        matches!(&error, CheckpointError::Mismatch { field, .. } if field == "dtypes.model"),
        "{error}"
    );
    assert!(error.to_string().contains("engine_state.json"), "{error}");
    let mut other_data = fresh.clone();
    other_data.data = DataChoice::Bundled {
        order: WindowOrder::Sequential,
    };
    let error = resume_error(&other_data, dir.path());
    assert!(
        matches!(&error, CheckpointError::Mismatch { field, .. } if field == "data"),
        "{error}"
    );
    let mut other_len = fresh.clone();
    other_len.seq_len = 8;
    let error = resume_error(&other_len, dir.path());
    assert!(
        matches!(&error, CheckpointError::Mismatch { field, .. } if field == "seq_len"),
        "{error}"
    );
    let error = resume_error(&spec(2, 2, &fp32, 2), dir.path());
    assert!(
        matches!(&error, CheckpointError::Mismatch { field, .. } if field == "global_step"),
        "{error}"
    );

    // A truncated optimizer file, then a missing one.
    let optim = tag.join("zero_pp_rank_1_mp_rank_00_optim_states.safetensors");
    let bytes = std::fs::read(&optim).expect("optim file");
    std::fs::write(&optim, &bytes[..bytes.len() / 2]).expect("truncated");
    let error = resume_error(&fresh, dir.path());
    assert!(
        matches!(&error, CheckpointError::Corrupt { path, .. } if *path == optim),
        "{error}"
    );
    std::fs::remove_file(&optim).expect("removed");
    let error = resume_error(&fresh, dir.path());
    assert!(
        matches!(&error, CheckpointError::Missing { path, .. } if *path == optim),
        "{error}"
    );
    std::fs::write(&optim, &bytes).expect("restored");

    // A corrupt engine state names its field.
    let state_path = tag.join("engine_state.json");
    let state = std::fs::read_to_string(&state_path).expect("state");
    let broken = state.replace("\"global_step\"", "\"global_stop\"");
    std::fs::write(&state_path, broken).expect("broken");
    let error = resume_error(&fresh, dir.path());
    assert!(error.to_string().contains("global_step"), "{error}");
    std::fs::write(&state_path, &state).expect("restored");

    // `latest` naming a tag that is not there.
    std::fs::write(dir.path().join("latest"), "global_step9").expect("latest");
    let error = resume_error(&fresh, dir.path());
    assert!(
        matches!(&error, CheckpointError::Missing { path, .. } if path.ends_with("global_step9")),
        "{error}"
    );
    std::fs::write(dir.path().join("latest"), "global_step2").expect("latest");
    run(&fresh, None, Some(dir.path())).expect("the repaired checkpoint resumes");
}

/// Stage 3 with the optimizer state and every non-persistent parameter slice on NVMe: the
/// checkpoint reads them back from the swap files, and a resumed run (swapping again) equals
/// the uninterrupted one bit for bit.
#[test]
fn nvme_offloaded_state_is_checkpointed_and_resumed_bit_for_bit() {
    let swap = tempfile::tempdir().expect("swap dir");
    let offloaded = json!({"bf16": {"enabled": true}, "zero_optimization": {
        "stage": 3, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 100,
        "sub_group_size": 2000,
        "offload_optimizer": {"device": "nvme", "nvme_path": swap.path(), "buffer_count": 4},
        "offload_param": {"device": "nvme", "nvme_path": swap.path(), "max_in_cpu": 0,
            "buffer_count": 2, "buffer_size": 10000}}});
    let whole = run(&spec(3, 2, &offloaded, 6), None, None).expect("whole run");
    let nvme = whole.nvme.as_ref().expect("the run offloaded to NVMe");
    assert!(
        nvme.ranks
            .iter()
            .all(|r| r.param_bytes > 0 && r.optimizer_bytes > 0)
    );
    let dir = tempfile::tempdir().expect("checkpoint dir");
    run(
        &spec(3, 2, &offloaded, 3),
        Some((dir.path(), None, SaveFault::Never)),
        None,
    )
    .expect("first half");
    let resumed = run(&spec(3, 2, &offloaded, 6), None, Some(dir.path())).expect("second half");
    assert_continues(&whole, &resumed, 3, "bf16 stage 3, NVMe offload");
    // The same run without offload: NVMe changes where the state lives, not its values.
    let in_memory = json!({"bf16": {"enabled": true}});
    let plain = run(&spec(3, 2, &in_memory, 6), None, None).expect("in-memory run");
    assert_eq!(bits(&plain.final_params), bits(&whole.final_params));
    assert!(
        std::fs::read_dir(swap.path())
            .expect("listed")
            .next()
            .is_none()
    );
}
