//! Training on SFT micro-batches against TRL 1.16's `SFTTrainer` + DeepSpeed ZeRO-2 fp32 runs
//! (`reference/sft/runs/<run>`): the recorded collated batches
//! (`batches[_rankR].safetensors`) are replayed through the real training path (plan, ZeRO-2
//! engine, clipping, AdamW, schedule) with the Trainer's loss normalisation
//! ([`LossNormalisation::TokensInStep`]), and compared with `trajectory.json` (every step's
//! loss and pre-clip gradient norm within 1e-5 relative, the learning rate used exactly) and
//! `final_model.safetensors` (every parameter within 5e-5); the eval loss of the trained
//! parameters, weighted as the Trainer weighs it, within 1e-5 relative.
//!
//! The run's `ds_config_filled` is used as DeepSpeed received it (no `scheduler` block; its
//! `steps_per_print`, accelerate's "Infinity", dropped) with the Trainer's own schedule,
//! `constant_with_warmup` with `warmup_steps` 2 ([`TrainerSchedule`]: lr 0, lr/2, then lr). The Trainer's `gradient_checkpointing` (TRL's default, on in the fixtures) is on.
//! Prints the measured differences. Skips without `../shared`.

mod support;

use std::path::{Path, PathBuf};

use dsplan_executor::checkpoint::load_checkpoint;
use dsplan_executor::data::{LabelledSource, RecordedBatches};
use dsplan_executor::io::llama_pretrained::load_llama_pretrained;
use dsplan_executor::model::{ModelConfig, ModelLayout};
use dsplan_executor::train::{
    CheckpointOptions, DataChoice, EvalWeighting, LossNormalisation, SavePolicy, TrainReport,
    TrainSettings, TrainSpec, TrainerSchedule, compile_plan, eval_loss, resume_point, train,
    train_planned_with,
};
use serde_json::Value;
use support::{read_tensors, sft_run};

const FINAL_PARAM_TOL: f64 = 5e-5;
const STEP_REL_TOL: f64 = 1e-5;
const EVAL_REL_TOL: f64 = 1e-5;

/// A fixture run, read.
struct Fixture {
    dir: PathBuf,
    run: Value,
    trajectory: Value,
    world: usize,
}

impl Fixture {
    fn open(name: &str) -> Option<Self> {
        let dir = sft_run(name)?;
        let json = |file: &str| -> Value {
            let text = std::fs::read_to_string(dir.join(file)).expect("fixture file");
            serde_json::from_str(&text).expect("fixture JSON")
        };
        let (run, trajectory) = (json("run.json"), json("trajectory.json"));
        let world = trajectory["world_size"].as_u64().expect("world_size") as usize;
        Some(Self {
            dir,
            run,
            trajectory,
            world,
        })
    }

    fn batch_files(&self) -> Vec<PathBuf> {
        if self.world == 1 {
            vec![self.dir.join("batches.safetensors")]
        } else {
            (0..self.world)
                .map(|r| self.dir.join(format!("batches_rank{r}.safetensors")))
                .collect()
        }
    }

    /// `run.json`'s `model`, relative to the fixture root (`models/llama_bpe`).
    fn model_dir(&self) -> PathBuf {
        let model = self.run["model"].as_str().expect("run.json model");
        self.dir.join("../..").join(model)
    }

    /// `ds_config_filled` without accelerate's `steps_per_print` ("Infinity").
    fn config(&self) -> Value {
        let mut config = self.run["ds_config_filled"].clone();
        let object = config.as_object_mut().expect("ds_config is an object");
        object.remove("steps_per_print");
        config
    }

    /// The Trainer's `constant_with_warmup` schedule of `sft_config`.
    fn schedule(&self) -> TrainerSchedule {
        let sft = &self.run["sft_config"];
        assert_eq!(sft["lr_scheduler_type"], "constant_with_warmup");
        TrainerSchedule::ConstantWithWarmup {
            warmup_steps: sft["warmup_steps"].as_u64().expect("warmup_steps"),
        }
    }

    fn steps(&self) -> &Vec<Value> {
        self.trajectory["steps"].as_array().expect("steps")
    }

    fn step_values(&self, key: &str) -> Vec<f64> {
        self.steps()
            .iter()
            .map(|s| s[key].as_f64().expect("number"))
            .collect()
    }
}

fn max_rel(ours: &[f64], theirs: &[f64]) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "one value per step");
    ours.iter()
        .zip(theirs)
        .map(|(o, r)| (o - r).abs() / r.abs().max(1e-30))
        .fold(0.0, f64::max)
}

fn param_diff(ours: &[f32], layout: &ModelLayout, reference: &Path) -> f64 {
    let tensors = read_tensors(reference);
    let mut worst = 0.0f64;
    for entry in layout.table().entries() {
        let theirs = &tensors
            .get(&entry.name)
            .unwrap_or_else(|| panic!("{} not in final_model", entry.name))
            .floats;
        assert_eq!(entry.span.len, theirs.len(), "{}", entry.name);
        for (&o, &r) in entry.span.of(ours).iter().zip(theirs) {
            worst = worst.max((f64::from(o) - r).abs());
        }
    }
    worst
}

/// The run of `fixture` as recorded (its model, its batches, its config) for `steps` steps,
/// and its recorded batches.
fn fixture_spec(fixture: &Fixture, steps: u64) -> (TrainSpec, RecordedBatches) {
    let (model, params) = load_llama_pretrained(&fixture.model_dir()).expect("fixture model");
    let model = ModelConfig::Llama(model);
    let files = fixture.batch_files();
    let read: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|f| (f.display().to_string(), std::fs::read(f).expect("batches")))
        .collect();
    let recorded = RecordedBatches::from_files(&read).expect("recorded batches");
    let settings = TrainSettings::from_config(&fixture.config(), fixture.world)
        .expect("config")
        .with_gradient_checkpointing(true)
        .with_trainer_schedule(fixture.schedule())
        .with_loss_normalisation(LossNormalisation::TokensInStep);
    let spec = TrainSpec {
        settings,
        model,
        initial_params: params,
        data: DataChoice::Recorded { files },
        seq_len: recorded.shape().seq_len,
        steps,
        world: fixture.world,
    };
    (spec, recorded)
}

/// Trains `fixture` as recorded.
fn train_fixture(fixture: &Fixture, steps: u64) -> (TrainReport, ModelConfig, RecordedBatches) {
    let (spec, recorded) = fixture_spec(fixture, steps);
    let report = train(&spec, &|_| {}).expect("training runs");
    (report, spec.model, recorded)
}

fn check_run(name: &str) {
    let Some(fixture) = Fixture::open(name) else {
        return;
    };
    let steps = fixture.steps().len() as u64;
    let (report, model, recorded) = train_fixture(&fixture, steps);
    let ours = |f: fn(&dsplan_executor::metrics::StepMetrics) -> f64| -> Vec<f64> {
        report.steps.iter().map(f).collect()
    };
    let loss = max_rel(&ours(|s| s.loss), &fixture.step_values("loss"));
    let norm = max_rel(
        &ours(|s| s.grad_norm.unwrap_or(f64::NAN)),
        &fixture.step_values("grad_norm"),
    );
    let lr_used = fixture.step_values("lr_used");
    let lr = ours(|s| s.lr)
        .iter()
        .zip(&lr_used)
        .map(|(o, r)| (o - r).abs())
        .fold(0.0, f64::max);
    let layout = model.layout();
    let params = param_diff(
        &report.final_params,
        &layout,
        &fixture.dir.join("final_model.safetensors"),
    );
    let eval_rows = std::fs::read_to_string(fixture.dir.join("prepared_eval.jsonl"))
        .expect("prepared_eval.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    let batches: Vec<_> = (0..fixture.world)
        .map(|r| recorded.eval_batches(r))
        .collect();
    let weighting = EvalWeighting {
        per_device_batch: fixture.run["sft_config"]["per_device_eval_batch_size"]
            .as_u64()
            .expect("per_device_eval_batch_size") as usize,
        world: fixture.world,
        rows: eval_rows,
    };
    let evaluated = eval_loss(&model, &report.final_params, &batches, weighting).expect("eval");
    let reference_eval = fixture.trajectory["eval"]["eval_loss"]
        .as_f64()
        .expect("eval_loss");
    let eval = (evaluated.loss - reference_eval).abs() / reference_eval;
    eprintln!(
        "{name:24} loss max rel {loss:.2e} | grad-norm max rel {norm:.2e} | lr max|Δ| {lr:.1e} | final params max|Δ| {params:.2e} | eval loss rel {eval:.2e} ({:.6} vs {reference_eval:.6})",
        evaluated.loss
    );
    assert_eq!(report.steps.len() as u64, steps);
    assert!(report.steps.iter().all(|s| !s.skipped));
    assert!(loss < STEP_REL_TOL, "{name}: step loss {loss:e}");
    assert!(norm < STEP_REL_TOL, "{name}: grad norm {norm:e}");
    assert!(lr < 1e-12, "{name}: learning rate {lr:e}");
    assert!(params < FINAL_PARAM_TOL, "{name}: final params {params:e}");
    assert!(eval < EVAL_REL_TOL, "{name}: eval loss {eval:e}");
}

#[test]
fn text_matches_sft_trainer() {
    check_run("text");
}

#[test]
fn text_shuffled_matches_sft_trainer() {
    check_run("text_shuffled");
}

#[test]
fn text_packed_matches_sft_trainer() {
    check_run("text_packed");
}

#[test]
fn prompt_completion_matches_sft_trainer() {
    check_run("prompt_completion");
}

#[test]
fn messages_matches_sft_trainer() {
    check_run("messages");
}

#[test]
fn messages_assistant_only_matches_sft_trainer() {
    check_run("messages_assistant_only");
}

#[test]
fn text_ws2_matches_sft_trainer() {
    check_run("text_ws2");
}

/// Runs `spec` by its plan, saving a checkpoint into `save` at the end, resuming from `resume`.
fn run_with_checkpoints(
    spec: &TrainSpec,
    save: Option<&Path>,
    resume: Option<&Path>,
) -> TrainReport {
    let plan = compile_plan(&spec.settings, &spec.model, spec.seq_len, spec.world).expect("plan");
    let resume = resume.map(|path| {
        let loaded = load_checkpoint(path).expect("checkpoint");
        resume_point(spec, &plan, &loaded).expect("resume point")
    });
    let options = CheckpointOptions {
        save: save.map(|dir| SavePolicy::new(dir, None)),
        resume,
    };
    train_planned_with(spec, &plan, &options, &|_| {}).expect("training runs")
}

#[test]
fn recorded_batches_resume_bit_for_bit() {
    // Two ranks, labelled batches: 3 steps, a checkpoint, 3 more equal 6 steps in one go.
    let Some(fixture) = Fixture::open("text_ws2") else {
        return;
    };
    let (whole_spec, _) = fixture_spec(&fixture, 6);
    let (first_spec, _) = fixture_spec(&fixture, 3);
    let whole = run_with_checkpoints(&whole_spec, None, None);
    let dir = tempfile::tempdir().expect("temp dir");
    let first = run_with_checkpoints(&first_spec, Some(dir.path()), None);
    assert_eq!(first.checkpoints.len(), 1);
    let resumed = run_with_checkpoints(&whole_spec, None, Some(dir.path()));
    assert_eq!(resumed.first_step, 3);
    let bits = |steps: &[dsplan_executor::metrics::StepMetrics]| -> Vec<(u64, u64, u64)> {
        steps
            .iter()
            .map(|s| {
                (
                    s.loss.to_bits(),
                    s.lr.to_bits(),
                    s.grad_norm.unwrap_or(f64::NAN).to_bits(),
                )
            })
            .collect()
    };
    assert_eq!(bits(&resumed.steps), bits(&whole.steps[3..]), "steps 4-6");
    let params = |r: &TrainReport| {
        r.final_params
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert!(
        params(&resumed) == params(&whole),
        "final parameters differ"
    );
    eprintln!(
        "text_ws2 resumed at step 3: steps 4-6 and {} final parameters equal bit for bit",
        whole.final_params.len()
    );
}
