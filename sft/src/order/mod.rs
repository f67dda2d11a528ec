//! Which prepared rows each optimizer step, rank and micro-step reads, as the HF `Trainer`
//! with accelerate hands them out (README point 11):
//!
//! * each epoch's order is `0..n` (`train_sampling_strategy="sequential"`) or
//!   `randperm(n)` drawn with seed `seed + epoch` ([`randperm`], accelerate's
//!   `SeedableRandomSampler`);
//! * the order is cut into batches of `per_device_train_batch_size` (the last one may be
//!   short); with several ranks, accelerate's `even_batches` completes the epoch with rows from
//!   its start until every rank has as many full batches, and rank `r` takes batches
//!   `r, r + world, ...`;
//! * an optimizer step takes `gradient_accumulation_steps` of a rank's batches; accumulation
//!   windows do not cross epochs (the last window of an epoch may be shorter).
//!
//! Matched against the fixtures' `sample_indices` (sequential, 2 ranks and shuffled). Not
//! covered by the fixtures: epochs after the first and an epoch ending inside a window.

pub mod randperm;

pub use randperm::randperm;

use std::sync::{Arc, Mutex};

/// How each epoch orders the rows (`train_sampling_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sampling {
    /// `"sequential"`: `0..n` every epoch.
    Sequential,
    /// `"random"` (the Trainer's default): `randperm(n)` seeded with `seed + epoch`.
    Random {
        /// `TrainingArguments.seed` (or `data_seed`).
        seed: u64,
    },
}

/// How rows are grouped into micro-batches and steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchLayout {
    /// Rows per micro-batch and rank (`per_device_train_batch_size`).
    pub batch_size: usize,
    /// Micro-batches per optimizer step and rank (`gradient_accumulation_steps`).
    pub grad_accum: usize,
    /// Ranks.
    pub world_size: usize,
}

/// The rows of one step: `[rank][micro-step][rows]`.
pub type StepRows = Vec<Vec<Vec<usize>>>;

/// The sample order of a training run over `rows` prepared rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleOrder {
    rows: usize,
    sampling: Sampling,
    layout: BatchLayout,
    drawn: Drawn,
}

/// The last epoch's drawn permutation, kept so that each step's rows cost their own number,
/// not a new `randperm` of every row (the trainer asks for every micro-batch of every rank).
/// Not part of the order's identity: clones start empty and every memo compares equal.
#[derive(Debug, Default)]
struct Drawn(Mutex<Option<(usize, Arc<[usize]>)>>);

impl Clone for Drawn {
    fn clone(&self) -> Self {
        Drawn::default()
    }
}

impl PartialEq for Drawn {
    fn eq(&self, _: &Drawn) -> bool {
        true
    }
}

impl Eq for Drawn {}

impl SampleOrder {
    /// The order of `rows` rows (at least one; every count in `layout` at least one).
    pub fn new(rows: usize, sampling: Sampling, layout: BatchLayout) -> Self {
        let layout = BatchLayout {
            batch_size: layout.batch_size.max(1),
            grad_accum: layout.grad_accum.max(1),
            world_size: layout.world_size.max(1),
        };
        Self {
            rows: rows.max(1),
            sampling,
            layout,
            drawn: Drawn::default(),
        }
    }

    /// How rows are drawn each epoch.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Micro-batches per rank in one epoch.
    pub fn batches_per_epoch(&self) -> usize {
        rank_batches(self.rows, self.layout.batch_size, self.layout.world_size)
    }

    /// Optimizer steps in one epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.batches_per_epoch().div_ceil(self.layout.grad_accum)
    }

    /// The rows of optimizer step `step` (from 0), `[rank][micro-step][rows]`: rank `r`'s
    /// `k`-th batch of an epoch is batch `r + k * world` of the epoch's order (completed from
    /// its start with several ranks), as [`shard`] deals the whole epoch.
    pub fn step(&self, step: usize) -> StepRows {
        let per_epoch = self.steps_per_epoch();
        let (epoch, window) = (step / per_epoch, step % per_epoch);
        let drawn = self.epoch_order(epoch);
        let row = |sample: usize| {
            let at = sample % self.rows;
            drawn.as_ref().map_or(at, |order| order[at])
        };
        let BatchLayout {
            batch_size,
            grad_accum,
            world_size,
        } = self.layout;
        let samples = if world_size > 1 {
            self.batches_per_epoch() * batch_size * world_size
        } else {
            self.rows
        };
        let batches = samples.div_ceil(batch_size);
        (0..world_size)
            .map(|rank| {
                (window * grad_accum..(window + 1) * grad_accum)
                    .map(|k| rank + k * world_size)
                    .filter(|&batch| batch < batches)
                    .map(|batch| {
                        (batch * batch_size..((batch + 1) * batch_size).min(samples))
                            .map(row)
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    /// Epoch `epoch`'s permutation of the rows (`None`: sequential, `0..n`).
    fn epoch_order(&self, epoch: usize) -> Option<Arc<[usize]>> {
        let Sampling::Random { seed } = self.sampling else {
            return None;
        };
        let mut drawn = self
            .drawn
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((kept, order)) = drawn.as_ref()
            && *kept == epoch
        {
            return Some(Arc::clone(order));
        }
        let order: Arc<[usize]> = randperm(self.rows, seed.wrapping_add(epoch as u64)).into();
        *drawn = Some((epoch, Arc::clone(&order)));
        Some(order)
    }
}

/// The evaluation batches of `rows` rows: sequential, `batch_size` rows each, sharded over
/// ranks as training is: `[rank][batch][rows]`.
pub fn eval_batches(rows: usize, batch_size: usize, world_size: usize) -> StepRows {
    let order: Vec<usize> = (0..rows).collect();
    shard(&order, batch_size.max(1), world_size.max(1))
}

fn rank_batches(rows: usize, batch_size: usize, world_size: usize) -> usize {
    if world_size == 1 {
        rows.div_ceil(batch_size)
    } else {
        rows.div_ceil(batch_size * world_size)
    }
}

/// One epoch's `order` cut into batches and dealt to the ranks (`even_batches` padding from
/// the start of the order when there are several ranks).
fn shard(order: &[usize], batch_size: usize, world_size: usize) -> StepRows {
    let mut samples = order.to_vec();
    if world_size > 1 && !order.is_empty() {
        let total = rank_batches(order.len(), batch_size, world_size) * batch_size * world_size;
        samples.extend(order.iter().cycle().take(total - order.len()));
    }
    let mut ranks: StepRows = vec![Vec::new(); world_size];
    for (at, batch) in samples.chunks(batch_size).enumerate() {
        ranks[at % world_size].push(batch.to_vec());
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step by step, the rows equal those of the whole epoch dealt by [`shard`] (the rule as
    /// written), over epochs, ranks, short last batches and windows.
    #[test]
    fn each_step_takes_the_rows_the_dealt_epoch_gives_it() {
        for rows in [1, 7, 24, 25, 103] {
            for (batch_size, grad_accum, world_size) in [(1, 1, 1), (4, 2, 1), (3, 1, 2), (2, 3, 4)]
            {
                for sampling in [Sampling::Sequential, Sampling::Random { seed: 9 }] {
                    let layout = BatchLayout {
                        batch_size,
                        grad_accum,
                        world_size,
                    };
                    let order = SampleOrder::new(rows, sampling, layout);
                    let per_epoch = order.steps_per_epoch();
                    for step in 0..3 * per_epoch {
                        let (epoch, window) = (step / per_epoch, step % per_epoch);
                        let epoch_order: Vec<usize> = match sampling {
                            Sampling::Sequential => (0..rows).collect(),
                            Sampling::Random { seed } => randperm(rows, seed + epoch as u64),
                        };
                        let dealt: StepRows = shard(&epoch_order, batch_size, world_size)
                            .into_iter()
                            .map(|rank| {
                                rank.into_iter()
                                    .skip(window * grad_accum)
                                    .take(grad_accum)
                                    .collect()
                            })
                            .collect();
                        assert_eq!(
                            order.step(step),
                            dealt,
                            "{rows} rows, {layout:?}, {sampling:?}, step {step}"
                        );
                    }
                }
            }
        }
    }
}
