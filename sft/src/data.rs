//! [`SftData`]: what `dsplan run` asks for: a tokenizer, the train (and eval) data prepared
//! (from the cache when current), and per optimizer step each rank's collated micro-batches,
//! with the step's label count (`num_items_in_batch`, README point 7).

use std::path::PathBuf;

use crate::cache::{CacheDir, CacheUse, open_prepared, open_split};
use crate::collate::{Collation, MicroBatch, collate};
use crate::dataset::DatasetOptions;
use crate::error::SftError;
use crate::order::{BatchLayout, SampleOrder, Sampling, eval_batches};
use crate::prepare::{HeldOut, PrepareSettings, PreparedSet};
use crate::tokenizer::HfTokenizer;

/// Everything [`SftData::open`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSettings {
    /// The directory with `tokenizer.json` (`--tokenizer`, else `--model`).
    pub tokenizer_dir: PathBuf,
    /// `--data`: a file or a directory of shards.
    pub train: PathBuf,
    /// Where the eval set comes from.
    pub eval: EvalData,
    /// How the datasets are read.
    pub dataset: DatasetOptions,
    /// How rows are prepared.
    pub prepare: PrepareSettings,
    /// Micro-batch size, accumulation and ranks.
    pub layout: BatchLayout,
    /// `per_device_eval_batch_size`.
    pub eval_batch_size: usize,
    /// `train_sampling_strategy` (and the seed).
    pub sampling: Sampling,
    /// Where the token caches go.
    pub cache: CacheDir,
}

/// Where a run's eval set comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalData {
    /// No eval set.
    None,
    /// Its own dataset (`--eval-data`).
    File(PathBuf),
    /// The last records of the train data, held out of training (`--eval-split`).
    HeldOut(HeldOut),
}

/// The fine-tuning data of a run.
#[derive(Debug, Clone)]
pub struct SftData {
    /// The tokenizer.
    pub tokenizer: HfTokenizer,
    /// The prepared train rows.
    pub train: PreparedSet,
    /// How the train set was obtained.
    pub train_cache: CacheUse,
    /// The prepared eval rows, if eval data was given.
    pub eval: Option<PreparedSet>,
    /// How rows become micro-batches.
    pub collation: Collation,
    /// Which rows each step reads.
    pub order: SampleOrder,
    eval_batch_size: usize,
    world_size: usize,
}

impl SftData {
    /// Reads the tokenizer and prepares (or reads back) the datasets.
    pub fn open(settings: &SftSettings) -> Result<Self, SftError> {
        let tokenizer = HfTokenizer::from_dir(&settings.tokenizer_dir)?;
        let collation = Collation::for_run(&tokenizer, &settings.prepare)?;
        let open = |path: &PathBuf| {
            open_prepared(
                path,
                &settings.dataset,
                &tokenizer,
                &settings.prepare,
                &settings.cache,
            )
        };
        let ((train, train_cache), eval) = match &settings.eval {
            EvalData::None => (open(&settings.train)?, None),
            EvalData::File(path) => (open(&settings.train)?, Some(open(path)?.0)),
            EvalData::HeldOut(held_out) => {
                let ((train, eval), cache) = open_split(
                    &settings.train,
                    &settings.dataset,
                    &tokenizer,
                    &settings.prepare,
                    &settings.cache,
                    *held_out,
                )?;
                ((train, cache), Some(eval))
            }
        };
        let order = SampleOrder::new(train.rows.len(), settings.sampling, settings.layout);
        Ok(Self {
            tokenizer,
            train,
            train_cache,
            eval,
            collation,
            order,
            eval_batch_size: settings.eval_batch_size.max(1),
            world_size: settings.layout.world_size.max(1),
        })
    }

    /// Rank `rank`'s micro-batches of optimizer step `step` (from 0).
    pub fn step_batches(&self, step: usize, rank: usize) -> Vec<MicroBatch> {
        let rows = self.order.step(step);
        rows.get(rank)
            .map(|micro| {
                micro
                    .iter()
                    .map(|indices| collate(&self.train.rows, indices, self.collation))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `num_items_in_batch` of step `step`: the label tokens the loss counts, over every
    /// micro-batch of every rank.
    pub fn step_label_tokens(&self, step: usize) -> usize {
        (0..self.world_size)
            .flat_map(|rank| self.step_batches(step, rank))
            .map(|batch| batch.label_tokens())
            .sum()
    }

    /// Rank `rank`'s eval batches (none without eval data).
    pub fn eval_batches(&self, rank: usize) -> Vec<MicroBatch> {
        let Some(eval) = &self.eval else {
            return Vec::new();
        };
        eval_batches(eval.rows.len(), self.eval_batch_size, self.world_size)
            .get(rank)
            .map(|batches| {
                batches
                    .iter()
                    .map(|indices| collate(&eval.rows, indices, self.collation))
                    .collect()
            })
            .unwrap_or_default()
    }
}
