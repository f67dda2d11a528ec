//! [`SftSource`]: the fine-tuning data of a run as the trainer reads it, a
//! [`LabelledSource`] over [`SftData`]: step `s`, rank `r`, micro-step `m` is TRL's collated
//! micro-batch of the rows [`SftData::order`] gives it, padded to the run's shape without
//! changing its result ([`Collated::padded`]). Step `s` is a function of `s` alone, so a resumed
//! run reads the batches it would have read.

use std::sync::Arc;

use dsplan_executor::data::{
    BatchLayout, Collated, DataError, Evaluation, LabelledBatch, LabelledSource, MicroBatchIndex,
    OpenLabelled,
};
use dsplan_executor::model::{BatchShape, RowPositions};
use dsplan_sft::{Collation, IGNORE, MicroBatch, Sampling, SftData, collate};

/// The data of a run, shared by every rank, and the shape the model is sized for.
#[derive(Clone)]
pub(super) struct SftSource {
    /// The data.
    pub data: Arc<SftData>,
    /// The largest micro-batch of the run: most rows x longest row.
    pub shape: BatchShape,
    /// One more than the largest token id.
    pub token_bound: u32,
    /// What it is called in messages and checkpoints.
    pub name: String,
    /// `--data`'s sizes: rows per micro-batch, micro-steps, ranks.
    pub layout: dsplan_sft::BatchLayout,
    /// `--eval-data`'s set and when the trainer scores it.
    pub evaluation: Option<Evaluation>,
}

impl SftSource {
    /// The source of `data` for `steps` steps of `layout`: the shape is the largest micro-batch
    /// of those steps.
    pub fn new(
        data: Arc<SftData>,
        steps: u64,
        layout: dsplan_sft::BatchLayout,
        name: String,
        evaluation: Option<Evaluation>,
    ) -> Self {
        let (mut rows, mut len, mut bound) = (1, 1, 1);
        for step in 0..steps as usize {
            for rank in data.order.step(step) {
                for indices in rank {
                    let batch = collate(&data.train.rows, &indices, data.collation);
                    rows = rows.max(batch.rows);
                    len = len.max(batch.seq_len);
                    let top = batch.input_ids.iter().copied().max().unwrap_or(0);
                    bound = bound.max(top.saturating_add(1));
                }
            }
        }
        Self {
            data,
            shape: BatchShape {
                batch: rows,
                seq_len: len,
            },
            token_bound: bound,
            name,
            layout,
            evaluation,
        }
    }
}

/// A collated micro-batch in the executor's form.
pub(super) fn collated(batch: &MicroBatch) -> Collated {
    Collated {
        rows: batch.rows,
        len: batch.seq_len,
        input_ids: batch.input_ids.clone(),
        labels: batch
            .labels
            .iter()
            .map(|&l| (l != IGNORE).then_some(l as u32))
            .collect(),
        position_ids: batch.position_ids.clone(),
        attention_mask: batch.attention_mask.clone(),
    }
}

/// The source as one run reads it.
struct Handle(SftSource);

impl LabelledSource for Handle {
    fn shape(&self) -> BatchShape {
        self.0.shape
    }

    fn positions(&self) -> RowPositions {
        match self.0.data.collation {
            Collation::PaddingFree => RowPositions::PositionIds,
            Collation::Padded { .. } => RowPositions::Arange,
        }
    }

    fn token_bound(&self) -> u32 {
        self.0.token_bound
    }

    fn steps(&self) -> Option<u64> {
        // Epochs follow one another (each its own order).
        None
    }

    fn check_layout(&self, layout: &BatchLayout) -> Result<(), DataError> {
        let ours = self.0.layout;
        if (layout.micro_batch(), layout.grad_accum(), layout.world())
            == (ours.batch_size, ours.grad_accum, ours.world_size)
        {
            return Ok(());
        }
        Err(DataError::Recorded {
            origin: self.0.name.clone(),
            tensor: "train".into(),
            message: format!(
                "the data was batched for {} row(s) x {} micro-step(s) x {} rank(s), the run has {} x {} x {}",
                ours.batch_size,
                ours.grad_accum,
                ours.world_size,
                layout.micro_batch(),
                layout.grad_accum(),
                layout.world()
            ),
        })
    }

    fn micro_batch(&mut self, at: MicroBatchIndex) -> Result<LabelledBatch, DataError> {
        let source = &self.0;
        let step = usize::try_from(at.step).map_err(|_| DataError::StepOutOfRange {
            step: at.step,
            steps: u64::MAX,
        })?;
        let rows = source.data.order.step(step);
        let rank = rows.get(at.rank).ok_or(DataError::RankOutOfRange {
            rank: at.rank,
            world: rows.len(),
        })?;
        // The last window of an epoch may hold fewer micro-batches (the Trainer's loop): the
        // missing ones are all padding, with no label, so they change neither loss nor
        // gradient.
        let batch = match rank.get(at.micro_step) {
            Some(indices) => collated(&collate(
                &source.data.train.rows,
                indices,
                source.data.collation,
            )),
            None => padding_only(source.data.collation),
        };
        Ok(batch.padded(source.shape))
    }
}

/// The micro-batch a rank reads where the last window of an epoch has fewer: one token of
/// padding with no label (id 0, masked out, or a one-token document at position 0), which
/// padded to any shape is all padding and changes neither loss nor gradient. One row, not
/// none: recorded batch files (`--save-batches`) take no batch of no rows.
pub(super) fn padding_only(collation: Collation) -> Collated {
    let (position_ids, attention_mask) = match collation {
        Collation::PaddingFree => (Some(vec![0]), None),
        Collation::Padded { .. } => (None, Some(vec![0])),
    };
    Collated {
        rows: 1,
        len: 1,
        input_ids: vec![0],
        labels: vec![None],
        position_ids,
        attention_mask,
    }
}

impl OpenLabelled for SftSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn order(&self) -> String {
        match self.data.order.sampling() {
            Sampling::Sequential => "sequential".to_string(),
            Sampling::Random { seed } => format!("shuffled:{seed}"),
        }
    }

    fn bytes(&self) -> u64 {
        let tokens: usize = self.data.train.rows.iter().map(|r| r.input_ids.len()).sum();
        (tokens * std::mem::size_of::<u32>()) as u64
    }

    fn open(&self) -> Box<dyn LabelledSource + Send> {
        Box::new(Handle(self.clone()))
    }

    fn evaluation(&self) -> Option<Evaluation> {
        self.evaluation.clone()
    }
}
