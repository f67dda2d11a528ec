//! [`SftData::open`] with each run's settings: every step's label count (over all micro-batches
//! and ranks) equals the Trainer's `num_items_in_batch`, the micro-batches are those of the
//! sample order, and the eval batches are there. Skips without `../shared`.

mod support;

use dsplan_sft::{BatchLayout, CacheDir, CacheUse, EvalData, Sampling, SftData, SftSettings};
use support::{RUNS, Run};

fn settings(run: &Run, cache: &std::path::Path) -> SftSettings {
    let number = |field: &str| run.config(field).as_u64().expect(field) as usize;
    SftSettings {
        tokenizer_dir: run.root.join(run.json["model"].as_str().expect("model")),
        train: run.data("train_file"),
        eval: EvalData::File(run.data("eval_file")),
        dataset: Default::default(),
        prepare: run.settings(),
        layout: BatchLayout {
            batch_size: number("per_device_train_batch_size"),
            grad_accum: number("gradient_accumulation_steps"),
            world_size: run.world_size(),
        },
        eval_batch_size: number("per_device_eval_batch_size"),
        sampling: match run.config("train_sampling_strategy").as_str() {
            Some("random") => Sampling::Random {
                seed: number("seed") as u64,
            },
            _ => Sampling::Sequential,
        },
        cache: CacheDir::At(cache.to_path_buf()),
    }
}

#[test]
fn every_step_counts_the_trainers_label_tokens() {
    let Some(root) = support::reference() else {
        return;
    };
    let cache = tempfile::tempdir().expect("temp dir");
    for name in RUNS {
        let run = Run::read(&root, name);
        let data = SftData::open(&settings(&run, cache.path())).expect("opens");
        let trajectory = run.trajectory();
        for (step, expected) in trajectory["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            let items = expected["num_items_in_batch"].as_f64().expect("items") as usize;
            assert_eq!(data.step_label_tokens(step), items, "{name} step {step}");
        }
        let batches: usize = (0..run.world_size())
            .map(|rank| data.eval_batches(rank).len())
            .sum();
        let expected = trajectory["eval"]["num_batches"]
            .as_u64()
            .expect("eval batches") as usize;
        assert_eq!(batches, expected * run.world_size(), "{name}: eval batches");
        let indices = &run.sample_indices()[0][0][1];
        assert_eq!(
            &data.step_batches(0, 0)[1].sample_indices,
            indices,
            "{name}"
        );
    }
    // The prompt_completion and messages runs share their data: the second open is cached.
    let run = Run::read(&root, "messages");
    let again = SftData::open(&settings(&run, cache.path())).expect("opens");
    assert_eq!(again.train_cache, CacheUse::Hit);
}
