//! [`TrainSpec`]: everything one training run needs, and where its data comes from.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use super::{TrainError, TrainSettings};
use crate::data::{
    BatchLayout, DEFAULT_TENSOR, DataError, DataFormat, LabelledSource, RecordedBatches,
    SharedLabelled, TokenLabels, TokenSource, WindowOrder, bundled_corpus, open, read_data_file,
};
use crate::model::ModelConfig;

/// Where the tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataChoice {
    /// The small text corpus compiled into dsplan (byte-level tokens).
    Bundled {
        /// The window order.
        order: WindowOrder,
    },
    /// A file: text, an llm.c `.bin`, or a `.safetensors` of stored batches.
    File {
        /// The file.
        path: PathBuf,
        /// The window order (token streams only).
        order: WindowOrder,
    },
    /// Micro-batches as a Hugging Face collator produced them, one safetensors file per rank
    /// (`train.stepSS.microM.*`, see [`crate::data::recorded`]).
    Recorded {
        /// The files, in rank order.
        files: Vec<PathBuf>,
    },
    /// Labelled micro-batches made outside the executor (the fine-tuning data of
    /// `dsplan run --data train.jsonl`).
    Labelled(SharedLabelled),
}

impl DataChoice {
    /// Opens the token source for `layout` (recorded micro-batches are not token rows: they
    /// are opened by [`DataChoice::open_labelled`]).
    pub fn open(&self, layout: BatchLayout) -> Result<Box<dyn TokenSource + Send>, DataError> {
        match self {
            DataChoice::Bundled { order } => Ok(Box::new(bundled_corpus(layout, *order)?)),
            DataChoice::File { path, order } => open(path, layout, *order),
            DataChoice::Recorded { files } => Err(DataError::Recorded {
                origin: files
                    .first()
                    .map_or_else(String::new, |f| f.display().to_string()),
                tensor: "train".into(),
                message: "recorded micro-batches carry labels and masks, not token rows;                           open them as labelled batches"
                    .into(),
            }),
            DataChoice::Labelled(data) => Err(DataError::Recorded {
                origin: data.0.name(),
                tensor: "train".into(),
                message: "labelled micro-batches are not token rows; open them as labelled batches"
                    .into(),
            }),
        }
    }

    /// The eval set the data carries, and when to score it (fine-tuning data given
    /// `--eval-data`; `None` for every other source).
    pub fn evaluation(&self) -> Option<crate::data::Evaluation> {
        match self {
            DataChoice::Labelled(data) => data.0.evaluation(),
            DataChoice::Bundled { .. } | DataChoice::File { .. } | DataChoice::Recorded { .. } => {
                None
            }
        }
    }

    /// Opens the data for `layout` as labelled micro-batches: token sources converted
    /// (`labels = input_ids`), recorded batches as recorded (checked against the layout's
    /// ranks and accumulation steps).
    pub fn open_labelled(
        &self,
        layout: BatchLayout,
    ) -> Result<Box<dyn LabelledSource + Send>, DataError> {
        let source: Box<dyn LabelledSource + Send> = match self {
            DataChoice::Recorded { files } => {
                let read = files
                    .iter()
                    .map(|path| Ok((path.display().to_string(), read_data_file(path)?)))
                    .collect::<Result<Vec<_>, DataError>>()?;
                Box::new(RecordedBatches::from_files(&read)?)
            }
            DataChoice::Labelled(data) => data.0.open(),
            DataChoice::Bundled { .. } | DataChoice::File { .. } => {
                Box::new(TokenLabels(self.open(layout)?))
            }
        };
        source.check_layout(&layout)?;
        Ok(source)
    }
}

/// One training run.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    /// What the config asks for.
    pub settings: TrainSettings,
    /// The model's family and shape.
    pub model: ModelConfig,
    /// Its initial parameters (flat, in the order of `model.layout()`), read by every rank.
    pub initial_params: Vec<f32>,
    /// The data.
    pub data: DataChoice,
    /// Predicted positions per row (the model reads `seq_len` tokens at a time).
    pub seq_len: usize,
    /// Optimizer steps to run (skipped steps count).
    pub steps: u64,
    /// Data-parallel ranks (threads).
    pub world: usize,
}

/// The shape of stored batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredShape {
    /// Steps stored.
    pub steps: u64,
    /// Rows per step (the global batch).
    pub global_batch: usize,
    /// Predicted positions per row (row length minus one).
    pub seq_len: usize,
}

/// For a `.safetensors` data file, the shape of its stored batches; `None` for token streams,
/// whose windows take any length.
pub fn stored_shape(path: &Path) -> Result<Option<StoredShape>, TrainError> {
    if DataFormat::from_path(path) != DataFormat::Safetensors {
        return Ok(None);
    }
    let origin = path.display().to_string();
    let bytes = crate::data::read_data_file(path)?;
    let file = SafeTensors::deserialize(&bytes).map_err(|error| DataError::Safetensors {
        origin: origin.clone(),
        message: error.to_string(),
    })?;
    let view = file
        .tensor(DEFAULT_TENSOR)
        .map_err(|_| DataError::MissingTensor {
            origin: origin.clone(),
            name: DEFAULT_TENSOR.to_owned(),
            available: file.names().into_iter().map(str::to_owned).collect(),
        })?;
    Ok(match *view.shape() {
        [steps, batch, row] => Some(StoredShape {
            steps: steps as u64,
            global_batch: batch,
            seq_len: row.saturating_sub(1),
        }),
        [batch, row] => Some(StoredShape {
            steps: 1,
            global_batch: batch,
            seq_len: row.saturating_sub(1),
        }),
        _ => None,
    })
}
