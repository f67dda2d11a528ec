//! Stage 3 offload to NVMe (ZeRO-Infinity) on the CPU backend: the master weights, Adam's
//! moments and the parameter slices past `max_in_cpu` live in files under `nvme_path`, swapped
//! sub-group by sub-group. The runs give bit for bit the parameters and losses of the same run
//! without offload (fp32 and bf16, one and two ranks); the swap directory exists while the run
//! lasts and is gone after; the bytes moved per step are what the plan's sub-groups imply; a bad
//! `nvme_path` is an error naming it, with nothing left behind.

use std::path::Path;
use std::sync::Mutex;

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use dsplan_executor::train::{
    DataChoice, TrainError, TrainReport, TrainSettings, TrainSpec, compile_plan, train,
};
use dsplan_executor::zero::ZeroError;
use serde_json::{Value, json};

const MODEL: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 32,
    n_embd: 32,
    n_layer: 2,
    n_head: 4,
    layer_norm_epsilon: 1e-5,
};
const SEQ_LEN: usize = 16;
const STEPS: u64 = 3;
/// Small enough that the shard is cut into several sub-groups.
const SUB_GROUP: u64 = 3000;

fn config(world: u64, precision: &str, offload: Value) -> Value {
    let mut config = json!({
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 4 / world / 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 20000,
            "stage3_param_persistence_threshold": 100,
            "sub_group_size": SUB_GROUP,
        },
    });
    if precision == "bf16" {
        config["bf16"] = json!({"enabled": true});
    }
    if let (Some(zero), Some(extra)) = (
        config["zero_optimization"].as_object_mut(),
        offload.as_object(),
    ) {
        for (key, value) in extra {
            zero.insert(key.clone(), value.clone());
        }
    }
    config
}

/// Both offloads to `dir`, every non-persistent parameter slice on NVMe.
fn nvme_everything(dir: &Path) -> Value {
    json!({
        "offload_optimizer": {"device": "nvme", "nvme_path": dir, "buffer_count": 4},
        "offload_param": {"device": "nvme", "nvme_path": dir, "max_in_cpu": 0,
            "buffer_count": 2, "buffer_size": 10000},
    })
}

fn spec(config: &Value, world: u64) -> Result<TrainSpec, dsplan_executor::train::SettingsError> {
    let settings = TrainSettings::from_config(config, world as usize)?;
    let layout = ParamLayout::new(&MODEL);
    Ok(TrainSpec {
        settings,
        model: MODEL.into(),
        initial_params: init_params(&MODEL, &layout, 11),
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 5 },
        },
        seq_len: SEQ_LEN,
        steps: STEPS,
        world: world as usize,
    })
}

fn run(config: &Value, world: u64) -> TrainReport {
    train(&spec(config, world).expect("config"), &|_| {}).expect("training runs")
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn losses(report: &TrainReport) -> Vec<u64> {
    report.steps.iter().map(|s| s.loss.to_bits()).collect()
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).expect("listed").next().is_none()
}

#[test]
fn nvme_offload_gives_bit_identical_parameters_and_losses() {
    for precision in ["fp32", "bf16"] {
        for world in [1, 2] {
            let dir = tempfile::tempdir().expect("temp dir");
            let in_memory = run(&config(world, precision, json!({})), world);
            let swapped = run(
                &config(world, precision, nvme_everything(dir.path())),
                world,
            );
            let what = format!("{precision}, {world} rank(s)");
            assert_eq!(
                bits(&swapped.final_params),
                bits(&in_memory.final_params),
                "{what}"
            );
            assert_eq!(losses(&swapped), losses(&in_memory), "{what}");
            assert!(is_empty(dir.path()), "{what}: swap files left behind");
            let nvme = swapped.nvme.as_ref().expect("NVMe report");
            assert_eq!(nvme.ranks.len(), world as usize);
            assert!(in_memory.nvme.is_none());
            // The states are on disk: the optimizer's memory is its swap buffers, no master.
            for memory in &swapped.memory {
                assert_eq!(memory.peak.get(Category::Master), 0, "{what}");
            }
        }
    }
}

#[test]
fn bytes_on_nvme_and_per_step_are_what_the_sub_groups_imply() {
    let dir = tempfile::tempdir().expect("temp dir");
    let world = 2;
    let optimizer_only = json!({"offload_optimizer": {"device": "nvme", "nvme_path": dir.path()}});
    let config = config(world, "bf16", optimizer_only);
    let spec = spec(&config, world).expect("config");
    let plan = compile_plan(&spec.settings, &MODEL.into(), SEQ_LEN, world as usize)
        .expect("plan compiles");
    let groups = &plan.shards.sub_groups;
    assert!(groups.len() > 2, "{} sub-groups", groups.len());
    let shard: u64 = groups.iter().map(|g| g.partition_numel).sum();
    assert_eq!(shard, plan.layout.partition_numel);
    let report = train(&spec, &|_| {}).expect("training runs");
    let nvme = report.nvme.as_ref().expect("NVMe report");
    // Master, exp_avg and exp_avg_sq: 4 bytes each per element, read and written once a step.
    let per_step = 3 * 4 * shard;
    for usage in &nvme.ranks {
        assert_eq!(usage.resident_bytes, per_step);
        assert_eq!(usage.optimizer_bytes, per_step);
        assert_eq!(usage.init.written_bytes, per_step);
        assert_eq!(usage.steps.written_bytes, STEPS * per_step);
        assert_eq!(usage.steps.read_bytes, STEPS * per_step);
    }
    assert_eq!(nvme.plan_bytes, per_step);
    // The optimizer's memory is the swap buffers: buffer_count (4) × the largest sub-group.
    let largest = groups.iter().map(|g| g.partition_numel).max().unwrap_or(0);
    for memory in &report.memory {
        assert_eq!(memory.peak.get(Category::Optimizer), 4 * 4 * largest);
    }
    assert!(is_empty(dir.path()));
}

#[test]
fn parameter_slices_on_nvme_are_counted_like_the_plan() {
    let dir = tempfile::tempdir().expect("temp dir");
    let world = 2;
    let report = run(&config(world, "bf16", nvme_everything(dir.path())), world);
    let nvme = report.nvme.as_ref().expect("NVMe report");
    for usage in &nvme.ranks {
        assert!(usage.param_bytes > 0);
        assert_eq!(usage.resident_bytes, nvme.plan_bytes);
        // Written back once per step (the refreshed slices), read at every gather.
        assert_eq!(
            usage.steps.written_bytes,
            STEPS * (usage.optimizer_bytes + usage.param_bytes)
        );
        assert!(usage.steps.read_bytes > STEPS * (usage.optimizer_bytes + usage.param_bytes));
    }
}

#[test]
fn the_swap_directory_exists_during_the_run_and_is_gone_after() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(2, "fp32", nvme_everything(dir.path()));
    let spec = spec(&config, 2).expect("config");
    let seen: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let process_dir = dir.path().join(format!("dsplan-{}", std::process::id()));
    let report = train(&spec, &|_| {
        let files = walk(&process_dir);
        seen.lock().expect("lock").push(files);
    })
    .expect("training runs");
    let seen = seen.into_inner().expect("lock");
    assert_eq!(seen.len(), STEPS as usize);
    // Per rank: master, exp_avg, exp_avg_sq and the parameters' file. After the last step the
    // other rank may already have finished and removed its files; rank 0's are still there.
    let (last, before) = seen.split_last().expect("steps observed");
    assert!(before.iter().all(|&files| files == 2 * 4), "{seen:?}");
    assert!((4..=8).contains(last), "{seen:?}");
    for usage in &report.nvme.expect("NVMe report").ranks {
        assert!(
            usage
                .directories
                .iter()
                .all(|d| d.starts_with(&process_dir))
        );
        assert!(usage.directories.iter().all(|d| !d.exists()));
    }
    assert!(!process_dir.exists());
    assert!(is_empty(dir.path()));
}

/// Files under `dir`, recursively (0 when it does not exist).
fn walk(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let path = e.path();
            if path.is_dir() { walk(&path) } else { 1 }
        })
        .sum()
}

#[test]
fn a_bad_nvme_path_is_an_error_naming_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-such-drive");
    let error =
        spec(&config(1, "fp32", nvme_everything(&missing)), 1).expect_err("missing nvme_path");
    assert_eq!(
        error.pointer,
        "/zero_optimization/offload_optimizer/nvme_path"
    );
    assert!(error.message.contains("no-such-drive"), "{error}");

    // A path that disappears after the settings were read: the rank fails to set up, cleanly.
    let vanishing = dir.path().join("vanishing");
    std::fs::create_dir(&vanishing).expect("made");
    let spec = spec(&config(2, "fp32", nvme_everything(&vanishing)), 2).expect("config");
    std::fs::remove_dir(&vanishing).expect("removed");
    let error = train(&spec, &|_| {}).expect_err("nvme_path gone");
    let TrainError::Rank {
        error: ZeroError::Swap(swap),
        ..
    } = &error
    else {
        panic!("a swap error expected, got {error}");
    };
    assert_eq!(swap.kind, Some(std::io::ErrorKind::NotFound));
    assert!(
        error
            .to_string()
            .contains("/zero_optimization/offload_optimizer/nvme_path"),
        "{error}"
    );
    assert!(is_empty(dir.path()));

    // Parameter slices larger than the swap buffers: DeepSpeed's "More elements than buffer
    // size", as an error on the buffer size.
    let mut small = nvme_everything(dir.path());
    small["offload_param"]["buffer_size"] = json!(16);
    let spec = self::spec(&config(1, "fp32", small), 1).expect("config");
    let error = train(&spec, &|_| {}).expect_err("buffers too small");
    assert!(
        error
            .to_string()
            .contains("/zero_optimization/offload_param/buffer_size"),
        "{error}"
    );
    assert!(is_empty(dir.path()));
}
