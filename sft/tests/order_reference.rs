//! The sample order equals the Trainer's for every run: sequential runs, the two ranks of
//! text_ws2 and the shuffled run (torch's `randperm` with the run's seed), step by step,
//! rank by rank and micro-batch by micro-batch, against `trajectory.json`'s sample indices.
//! Skips without `../shared`.

mod support;

use dsplan_sft::{BatchLayout, SampleOrder, Sampling, eval_batches};
use support::{RUNS, Run};

#[test]
fn sample_order_equals_the_trainers_for_every_run() {
    let Some(root) = support::reference() else {
        return;
    };
    for name in RUNS {
        let run = Run::read(&root, name);
        let rows = run.prepare("train").rows.len();
        let sampling = match run.config("train_sampling_strategy").as_str() {
            Some("sequential") => Sampling::Sequential,
            Some("random") => Sampling::Random {
                seed: run.config("seed").as_u64().expect("seed"),
            },
            other => panic!("{name}: sampling {other:?}"),
        };
        let layout = BatchLayout {
            batch_size: run
                .config("per_device_train_batch_size")
                .as_u64()
                .expect("bs") as usize,
            grad_accum: run
                .config("gradient_accumulation_steps")
                .as_u64()
                .expect("gas") as usize,
            world_size: run.world_size(),
        };
        let order = SampleOrder::new(rows, sampling, layout);
        for (step, expected) in run.sample_indices().iter().enumerate() {
            assert_eq!(&order.step(step), expected, "{name} step {step}");
        }
    }
}

#[test]
fn randperm_is_a_permutation_and_depends_on_the_seed() {
    let a = dsplan_sft::order::randperm(200, 77);
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..200).collect::<Vec<_>>());
    assert_ne!(a, dsplan_sft::order::randperm(200, 78));
}

#[test]
fn epochs_and_uneven_ends() {
    let layout = BatchLayout {
        batch_size: 4,
        grad_accum: 2,
        world_size: 1,
    };
    // 10 rows: batches of 4, 4, 2; steps of 2 micro-batches, then 1.
    let order = SampleOrder::new(10, Sampling::Sequential, layout);
    assert_eq!(order.steps_per_epoch(), 2);
    assert_eq!(order.step(1), vec![vec![vec![8, 9]]]);
    assert_eq!(order.step(2), order.step(0));
    let shuffled = SampleOrder::new(10, Sampling::Random { seed: 5 }, layout);
    assert_ne!(
        shuffled.step(0),
        shuffled.step(2),
        "a new permutation each epoch"
    );
    // Two ranks, 20 rows, batches of 8: the third batch is completed from the start and a
    // fourth is made for rank 1 (accelerate's even_batches).
    let eval = eval_batches(20, 8, 2);
    assert_eq!(eval[0][1], [16, 17, 18, 19, 0, 1, 2, 3]);
    assert_eq!(eval[1][1], [4, 5, 6, 7, 8, 9, 10, 11]);
}
