//! [`RecordedBatches`]: micro-batches exactly as a Hugging Face collator produced them, one
//! safetensors file per rank, replayed step by step.
//!
//! This is how the TRL fixtures (`reference/sft/runs/<run>/batches[_rankR].safetensors`) keep
//! their data, and what the SFT data path hands the trainer. Tensor names:
//!
//! * `train.stepSS.microM.<key>`: optimizer step `SS` (0-based), micro-batch `M` of this rank;
//! * `eval.batchBB.<key>`: this rank's eval batch `BB`, in order;
//! * `<key>`: `input_ids` and `labels` (`[rows, len]`, `-100` = no loss), and either
//!   `attention_mask` (right padding) or `position_ids` (padding-free packing, one row; the
//!   documents restart at position 0). `cu_seq_lens_q/k` and `seq_idx` are derived from
//!   `position_ids` and are not read.
//!
//! Integer dtypes I64 or I32. Micro-batches differ in shape (each is padded to its own longest
//! row); the model is sized for the largest rows x the longest length of every training
//! micro-batch, and each is padded to it without changing its result: appended tokens are
//! padding (`attention_mask` 0) or, in packed rows, one-token documents at position 0, and
//! none has a label. Step `s` is a function of `s` alone, so a resumed run reads exactly the
//! batches it would have read.

use std::collections::BTreeMap;

use safetensors::{Dtype, SafeTensors};

use super::{BatchLayout, DataError, LabelledBatch, LabelledSource, MicroBatchIndex};
use crate::model::{BatchShape, RowPositions};

/// The label id that means "no loss" (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// One collated batch as a collator returned it, `[rows, len]`: read from a recorded file, or
/// made by `dsplan-sft` for `dsplan run --data train.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collated {
    /// Rows.
    pub rows: usize,
    /// Tokens per row.
    pub len: usize,
    /// `input_ids` `[rows, len]`.
    pub input_ids: Vec<u32>,
    /// `labels` `[rows, len]`, not shifted; `None` for `-100`.
    pub labels: Vec<Option<u32>>,
    /// `position_ids` (padding-free packing).
    pub position_ids: Option<Vec<u32>>,
    /// `attention_mask` (right padding).
    pub attention_mask: Option<Vec<u8>>,
}

impl Collated {
    /// The batch at its own shape, as the model reads it.
    pub fn batch(&self) -> LabelledBatch {
        pad(
            self,
            BatchShape {
                batch: self.rows,
                seq_len: self.len,
            },
        )
    }

    /// The batch padded to `shape` (at least its own) without changing its result; see
    /// [`pad`].
    pub fn padded(&self, shape: BatchShape) -> LabelledBatch {
        pad(self, shape)
    }
}

/// One rank's file.
#[derive(Debug, Clone)]
struct RankFile {
    train: Vec<Vec<Collated>>,
    eval: Vec<Collated>,
}

/// Every rank's recorded micro-batches; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct RecordedBatches {
    ranks: Vec<RankFile>,
    shape: BatchShape,
    positions: RowPositions,
    grad_accum: usize,
    token_bound: u32,
}

impl RecordedBatches {
    /// Reads one file per rank, in rank order: `(name for errors, bytes)`.
    pub fn from_files(files: &[(String, Vec<u8>)]) -> Result<Self, DataError> {
        let ranks = files
            .iter()
            .map(|(origin, bytes)| read_rank(origin, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = ranks.first() else {
            return Err(DataError::Recorded {
                origin: "(no file)".into(),
                tensor: "train".into(),
                message: "no batch file was given".into(),
            });
        };
        let grad_accum = first.train[0].len();
        let steps = first.train.len();
        for (rank, file) in ranks.iter().enumerate() {
            let origin = &files[rank].0;
            if file.train.len() != steps {
                return Err(recorded(
                    origin,
                    "train",
                    format!(
                        "holds {} steps, rank 0's file holds {steps}; every rank records the same steps",
                        file.train.len()
                    ),
                ));
            }
            if let Some(step) = file
                .train
                .iter()
                .position(|micro| micro.len() != grad_accum)
            {
                return Err(recorded(
                    origin,
                    &format!("train.step{step:02}"),
                    format!(
                        "holds {} micro-batches, step 0 of rank 0 holds {grad_accum}; every step has \
                     gradient_accumulation_steps micro-batches",
                        file.train[step].len()
                    ),
                ));
            }
        }
        let train = || ranks.iter().flat_map(|r| r.train.iter().flatten());
        let shape = BatchShape {
            batch: train().map(|c| c.rows).max().unwrap_or(1),
            seq_len: train().map(|c| c.len).max().unwrap_or(1),
        };
        let positions = if train().any(|c| c.position_ids.is_some()) {
            RowPositions::PositionIds
        } else {
            RowPositions::Arange
        };
        let token_bound = ranks
            .iter()
            .flat_map(|r| r.train.iter().flatten().chain(&r.eval))
            .flat_map(|c| {
                c.input_ids
                    .iter()
                    .copied()
                    .chain(c.labels.iter().flatten().copied())
            })
            .max()
            .map_or(0, |max| max.saturating_add(1));
        Ok(Self {
            ranks,
            shape,
            positions,
            grad_accum,
            token_bound,
        })
    }

    /// Ranks recorded (one file each).
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Micro-batches per optimizer step.
    pub fn grad_accum(&self) -> usize {
        self.grad_accum
    }

    /// Rank `rank`'s eval batches, in order, each at its own shape.
    pub fn eval_batches(&self, rank: usize) -> Vec<LabelledBatch> {
        self.ranks.get(rank).map_or_else(Vec::new, |file| {
            file.eval.iter().map(Collated::batch).collect()
        })
    }
}

impl LabelledSource for RecordedBatches {
    fn shape(&self) -> BatchShape {
        self.shape
    }

    fn positions(&self) -> RowPositions {
        self.positions
    }

    fn token_bound(&self) -> u32 {
        self.token_bound
    }

    fn steps(&self) -> Option<u64> {
        Some(self.ranks[0].train.len() as u64)
    }

    fn check_layout(&self, layout: &BatchLayout) -> Result<(), DataError> {
        let problem = if layout.world() != self.ranks.len() {
            Some(format!(
                "the batches were recorded for {} rank(s), the run has {}; give one file per rank",
                self.ranks.len(),
                layout.world()
            ))
        } else if layout.grad_accum() != self.grad_accum {
            Some(format!(
                "each step holds {} micro-batches, the config's gradient_accumulation_steps is {}; \
                 set it to {}",
                self.grad_accum,
                layout.grad_accum(),
                self.grad_accum
            ))
        } else {
            None
        };
        problem.map_or(Ok(()), |message| {
            Err(DataError::Recorded {
                origin: "the recorded batches".into(),
                tensor: "train".into(),
                message,
            })
        })
    }

    fn micro_batch(&mut self, at: MicroBatchIndex) -> Result<LabelledBatch, DataError> {
        let world = self.ranks.len();
        let file = self.ranks.get(at.rank).ok_or(DataError::RankOutOfRange {
            rank: at.rank,
            world,
        })?;
        let steps = file.train.len() as u64;
        let micro = usize::try_from(at.step)
            .ok()
            .and_then(|step| file.train.get(step))
            .ok_or(DataError::StepOutOfRange {
                step: at.step,
                steps,
            })?;
        let collated = micro
            .get(at.micro_step)
            .ok_or(DataError::MicroStepOutOfRange {
                micro_step: at.micro_step,
                grad_accum: self.grad_accum,
            })?;
        Ok(pad(collated, self.shape))
    }
}

fn recorded(origin: &str, tensor: &str, message: String) -> DataError {
    DataError::Recorded {
        origin: origin.to_owned(),
        tensor: tensor.to_owned(),
        message,
    }
}

/// `collated` padded to `shape` (at least its own): appended tokens have no label and are
/// padding (`attention_mask` 0, one is added when the batch has neither a mask nor positions)
/// or, with `position_ids` and no mask, one-token documents at position 0.
fn pad(collated: &Collated, shape: BatchShape) -> LabelledBatch {
    let (rows, len) = (shape.batch, shape.seq_len);
    let grow = |values: &[u32], fill: u32| -> Vec<u32> {
        let mut out = vec![fill; rows * len];
        for (r, row) in values.chunks(collated.len).enumerate() {
            out[r * len..r * len + row.len()].copy_from_slice(row);
        }
        out
    };
    let padded = rows != collated.rows || len != collated.len;
    let mut labels = vec![None; rows * len];
    for (r, row) in collated.labels.chunks(collated.len).enumerate() {
        labels[r * len..r * len + row.len()].copy_from_slice(row);
    }
    let mut batch = LabelledBatch::from_labels(rows, len, grow(&collated.input_ids, 0), &labels);
    batch.position_ids = collated.position_ids.as_deref().map(|ids| grow(ids, 0));
    let ones = || vec![1u8; collated.rows * collated.len];
    batch.attention_mask = match (&collated.attention_mask, &collated.position_ids) {
        (Some(mask), _) => Some(mask.clone()),
        (None, None) if padded => Some(ones()),
        (None, _) => None,
    }
    .map(|mask| {
        let mut out = vec![0u8; rows * len];
        for (r, row) in mask.chunks(collated.len).enumerate() {
            out[r * len..r * len + row.len()].copy_from_slice(row);
        }
        out
    });
    batch
}

/// The bytes of one rank's file holding `train` (step by step, each step's micro-batches in
/// order) as [`RecordedBatches::from_files`] reads it back: every tensor I64, named
/// `train.stepSS.microM.<key>`. A micro-batch of no rows cannot be recorded (the reader refuses
/// one): give a one-row batch of padding instead.
pub fn encode_rank(train: &[Vec<Collated>]) -> Result<Vec<u8>, DataError> {
    let fail = |message: String| DataError::Safetensors {
        origin: "the batches to record".into(),
        message,
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (step, micros) in train.iter().enumerate() {
        for (micro, batch) in micros.iter().enumerate() {
            if batch.rows == 0 || batch.len == 0 {
                return Err(fail(format!(
                    "train.step{step:02}.micro{micro} holds no token"
                )));
            }
            let prefix = format!("train.step{step:02}.micro{micro}");
            let bytes = |values: &mut dyn Iterator<Item = i64>| -> Vec<u8> {
                values.flat_map(i64::to_le_bytes).collect()
            };
            let mut push = |key: &str, data: Vec<u8>| {
                tensors.push((format!("{prefix}.{key}"), vec![batch.rows, batch.len], data));
            };
            push(
                "input_ids",
                bytes(&mut batch.input_ids.iter().map(|&v| i64::from(v))),
            );
            push(
                "labels",
                bytes(
                    &mut batch
                        .labels
                        .iter()
                        .map(|l| l.map_or(IGNORE_INDEX, i64::from)),
                ),
            );
            if let Some(positions) = &batch.position_ids {
                push(
                    "position_ids",
                    bytes(&mut positions.iter().map(|&v| i64::from(v))),
                );
            }
            if let Some(mask) = &batch.attention_mask {
                push(
                    "attention_mask",
                    bytes(&mut mask.iter().map(|&v| i64::from(v))),
                );
            }
        }
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            safetensors::tensor::TensorView::new(Dtype::I64, shape.clone(), data)
                .map(|view| (name.clone(), view))
                .map_err(|e| fail(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| fail(e.to_string()))
}

/// Which batch a tensor name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Train { step: usize, micro: usize },
    Eval { batch: usize },
}

fn parse_name(name: &str) -> Option<(Slot, &str)> {
    let number = |part: &str, prefix: &str| part.strip_prefix(prefix)?.parse::<usize>().ok();
    let (section, rest) = name.split_once('.')?;
    match section {
        "train" => {
            let mut parts = rest.splitn(3, '.');
            let step = number(parts.next()?, "step")?;
            let micro = number(parts.next()?, "micro")?;
            Some((Slot::Train { step, micro }, parts.next()?))
        }
        "eval" => {
            let (batch, key) = rest.split_once('.')?;
            Some((
                Slot::Eval {
                    batch: number(batch, "batch")?,
                },
                key,
            ))
        }
        _ => None,
    }
}

fn read_rank(origin: &str, bytes: &[u8]) -> Result<RankFile, DataError> {
    let file = SafeTensors::deserialize(bytes).map_err(|error| DataError::Safetensors {
        origin: origin.to_owned(),
        message: error.to_string(),
    })?;
    let mut slots: BTreeMap<Slot, Tensors> = BTreeMap::new();
    for (name, view) in file.tensors() {
        let Some((slot, key)) = parse_name(&name) else {
            return Err(recorded(
                origin,
                &name,
                "is neither train.stepSS.microM.<key> nor \
                eval.batchBB.<key>; a file of recorded batches holds only those"
                    .into(),
            ));
        };
        if !matches!(
            key,
            "input_ids" | "labels" | "attention_mask" | "position_ids"
        ) {
            continue;
        }
        let values = integers(view.dtype(), view.data()).ok_or_else(|| {
            recorded(
                origin,
                &name,
                format!(
                    "has dtype {:?}; recorded batches are I64 or I32",
                    view.dtype()
                ),
            )
        })?;
        slots
            .entry(slot)
            .or_default()
            .insert(key.to_owned(), (view.shape().to_vec(), values));
    }
    let mut train: Vec<Vec<Collated>> = Vec::new();
    let mut eval = Vec::new();
    for (slot, tensors) in slots {
        let prefix = match slot {
            Slot::Train { step, micro } => format!("train.step{step:02}.micro{micro}"),
            Slot::Eval { batch } => format!("eval.batch{batch:02}"),
        };
        let collated = collate(origin, &prefix, &tensors)?;
        match slot {
            Slot::Train { step, micro } => {
                if step == train.len() {
                    train.push(Vec::new());
                }
                let steps = train.len();
                let Some(micros) = train.get_mut(step).filter(|_| step + 1 == steps) else {
                    return Err(recorded(
                        origin,
                        &prefix,
                        format!(
                            "follows {} step(s); steps are numbered 0, 1, 2, ... without gaps",
                            steps
                        ),
                    ));
                };
                if micro != micros.len() {
                    return Err(recorded(
                        origin,
                        &prefix,
                        format!(
                            "micro-batch {micro} follows {} others; micro-batches are numbered 0, 1, ... without gaps",
                            micros.len()
                        ),
                    ));
                }
                micros.push(collated);
            }
            Slot::Eval { batch } => {
                if batch != eval.len() {
                    return Err(recorded(
                        origin,
                        &prefix,
                        "eval batches are numbered 0, 1, ... without gaps".into(),
                    ));
                }
                eval.push(collated);
            }
        }
    }
    if train.is_empty() {
        return Err(recorded(
            origin,
            "train.step00.micro0",
            "no training micro-batch is recorded".into(),
        ));
    }
    Ok(RankFile { train, eval })
}

/// A batch's tensors by key: shape and elements.
type Tensors = BTreeMap<String, (Vec<usize>, Vec<i64>)>;

fn collate(origin: &str, prefix: &str, tensors: &Tensors) -> Result<Collated, DataError> {
    let fail = |key: &str, message: String| recorded(origin, &format!("{prefix}.{key}"), message);
    let get = |key: &str| tensors.get(key);
    let (shape, ids) = get("input_ids").ok_or_else(|| fail("input_ids", "is missing".into()))?;
    let [rows, len] = shape[..] else {
        return Err(fail(
            "input_ids",
            format!("has shape {shape:?}; expected [rows, len]"),
        ));
    };
    if rows == 0 || len == 0 {
        return Err(fail("input_ids", "is empty".into()));
    }
    for key in ["labels", "attention_mask", "position_ids"] {
        if let Some((other, _)) = get(key)
            && other != shape
        {
            return Err(fail(
                key,
                format!("has shape {other:?}, input_ids {shape:?}; they must agree"),
            ));
        }
    }
    let (_, labels) = get("labels").ok_or_else(|| fail("labels", "is missing".into()))?;
    let as_u32 = |key: &str, values: &[i64]| -> Result<Vec<u32>, DataError> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                u32::try_from(v).map_err(|_| {
                    fail(
                        key,
                        format!(
                            "element {i} is {v}, not a token id or position (0 ..= 4294967295)"
                        ),
                    )
                })
            })
            .collect()
    };
    let input_ids = as_u32("input_ids", ids)?;
    let labels = labels
        .iter()
        .enumerate()
        .map(|(i, &v)| match v {
            IGNORE_INDEX => Ok(None),
            v => u32::try_from(v).map(Some).map_err(|_| {
                fail(
                    "labels",
                    format!("element {i} is {v}; a label is a token id or -100 (no loss)"),
                )
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let position_ids = get("position_ids")
        .map(|(_, v)| as_u32("position_ids", v))
        .transpose()?;
    let attention_mask = get("attention_mask")
        .map(|(_, values)| {
            values
                .iter()
                .enumerate()
                .map(|(i, &v)| match v {
                    0 | 1 => Ok(v as u8),
                    v => Err(fail(
                        "attention_mask",
                        format!("element {i} is {v}; the mask is 1 (token) or 0 (padding)"),
                    )),
                })
                .collect::<Result<Vec<u8>, _>>()
        })
        .transpose()?;
    Ok(Collated {
        rows,
        len,
        input_ids,
        labels,
        position_ids,
        attention_mask,
    })
}

/// A little-endian I64 or I32 tensor's elements.
fn integers(dtype: Dtype, data: &[u8]) -> Option<Vec<i64>> {
    match dtype {
        Dtype::I64 => Some(
            data.chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect(),
        ),
        Dtype::I32 => Some(
            data.chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))))
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// A file of `(name, shape, values)` int64 tensors.
    fn file(tensors: &[(&str, Vec<usize>, Vec<i64>)]) -> (String, Vec<u8>) {
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape, values)| {
                let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                ((*name).to_owned(), shape.clone(), data)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(name, shape, data)| {
                let view = TensorView::new(Dtype::I64, shape.clone(), data).expect("view");
                (name.clone(), view)
            })
            .collect();
        let serialized = safetensors::serialize(views, None).expect("serialize");
        ("batches.safetensors".into(), serialized)
    }

    fn error_of(tensors: &[(&str, Vec<usize>, Vec<i64>)]) -> String {
        RecordedBatches::from_files(&[file(tensors)])
            .expect_err("bad batches")
            .to_string()
    }

    #[test]
    fn short_micro_batches_are_padded_without_a_label_and_packed_rows_with_one_token_documents() {
        let padded = [
            ("train.step00.micro0.input_ids", vec![1, 3], vec![5, 6, 7]),
            ("train.step00.micro0.labels", vec![1, 3], vec![5, 6, 7]),
            (
                "train.step00.micro0.attention_mask",
                vec![1, 3],
                vec![1, 1, 1],
            ),
            (
                "train.step00.micro1.input_ids",
                vec![2, 2],
                vec![8, 9, 4, 0],
            ),
            (
                "train.step00.micro1.labels",
                vec![2, 2],
                vec![8, 9, 4, -100],
            ),
            (
                "train.step00.micro1.attention_mask",
                vec![2, 2],
                vec![1, 1, 1, 0],
            ),
        ];
        let mut source = RecordedBatches::from_files(&[file(&padded)]).expect("valid");
        assert_eq!(
            source.shape(),
            BatchShape {
                batch: 2,
                seq_len: 3
            }
        );
        let at = |micro_step| MicroBatchIndex {
            step: 0,
            rank: 0,
            micro_step,
        };
        let first = source.micro_batch(at(0)).expect("micro 0");
        assert_eq!(first.input_ids, [5, 6, 7, 0, 0, 0]);
        assert_eq!(first.targets, [Some(6), Some(7), None, None, None, None]);
        assert_eq!(
            first.attention_mask.as_deref(),
            Some(&[1, 1, 1, 0, 0, 0][..])
        );
        let second = source.micro_batch(at(1)).expect("micro 1");
        assert_eq!(second.targets, [Some(9), None, None, None, None, None]);
        assert_eq!(second.label_tokens(), 1);

        let packed = [
            (
                "train.step00.micro0.input_ids",
                vec![1, 4],
                vec![1, 2, 3, 4],
            ),
            (
                "train.step00.micro0.labels",
                vec![1, 4],
                vec![-100, 2, -100, 4],
            ),
            (
                "train.step00.micro0.position_ids",
                vec![1, 4],
                vec![0, 1, 0, 1],
            ),
            ("train.step01.micro0.input_ids", vec![1, 2], vec![1, 2]),
            ("train.step01.micro0.labels", vec![1, 2], vec![-100, 2]),
            ("train.step01.micro0.position_ids", vec![1, 2], vec![0, 1]),
        ];
        let mut source = RecordedBatches::from_files(&[file(&packed)]).expect("valid");
        assert_eq!(source.positions(), RowPositions::PositionIds);
        let short = source
            .micro_batch(MicroBatchIndex {
                step: 1,
                rank: 0,
                micro_step: 0,
            })
            .expect("step 1");
        assert_eq!(short.position_ids.as_deref(), Some(&[0, 1, 0, 0][..]));
        assert_eq!(short.attention_mask, None);
        assert_eq!(short.targets, [Some(2), None, None, None]);
        let past = source.micro_batch(MicroBatchIndex {
            step: 2,
            rank: 0,
            micro_step: 0,
        });
        assert!(past.expect_err("no step 2").to_string().contains("step 2"));
    }

    #[test]
    fn bad_batches_are_errors_naming_the_tensor() {
        let ids = ("train.step00.micro0.input_ids", vec![1, 2], vec![1, 2]);
        let missing = error_of(std::slice::from_ref(&ids));
        assert!(
            missing.contains("train.step00.micro0.labels") && missing.contains("missing"),
            "{missing}"
        );
        let label = error_of(&[
            ids.clone(),
            ("train.step00.micro0.labels", vec![1, 2], vec![1, -5]),
        ]);
        assert!(label.contains("-5") && label.contains("-100"), "{label}");
        let shape = error_of(&[
            ids.clone(),
            ("train.step00.micro0.labels", vec![2, 1], vec![1, 2]),
        ]);
        assert!(shape.contains("must agree"), "{shape}");
        let mask = error_of(&[
            ids.clone(),
            ("train.step00.micro0.labels", vec![1, 2], vec![1, 2]),
            ("train.step00.micro0.attention_mask", vec![1, 2], vec![1, 2]),
        ]);
        assert!(
            mask.contains("attention_mask") && mask.contains("0 (padding)"),
            "{mask}"
        );
        let gap = error_of(&[
            ids.clone(),
            ("train.step00.micro0.labels", vec![1, 2], vec![1, 2]),
            ("train.step02.micro0.input_ids", vec![1, 2], vec![1, 2]),
            ("train.step02.micro0.labels", vec![1, 2], vec![1, 2]),
        ]);
        assert!(
            gap.contains("train.step02.micro0") && gap.contains("without gaps"),
            "{gap}"
        );
        let stray = error_of(&[ids, ("input_ids", vec![1, 2], vec![1, 2])]);
        assert!(
            stray.contains("`input_ids`") && stray.contains("train.stepSS"),
            "{stray}"
        );
    }

    /// What [`encode_rank`] writes reads back as the same micro-batches.
    #[test]
    fn encoded_batches_read_back_unchanged() {
        let padded = Collated {
            rows: 2,
            len: 3,
            input_ids: vec![5, 6, 7, 8, 9, 0],
            labels: vec![None, Some(6), Some(7), None, Some(9), None],
            position_ids: None,
            attention_mask: Some(vec![1, 1, 1, 1, 1, 0]),
        };
        let packed = Collated {
            rows: 1,
            len: 4,
            input_ids: vec![1, 2, 3, 4],
            labels: vec![None, Some(2), None, Some(4)],
            position_ids: Some(vec![0, 1, 0, 1]),
            attention_mask: None,
        };
        let train = vec![vec![padded.clone()], vec![packed.clone()]];
        let bytes = encode_rank(&train).expect("encodes");
        let back = read_rank("batches.safetensors", &bytes).expect("reads");
        assert_eq!(back.train, train);
        let empty = Collated {
            rows: 0,
            input_ids: Vec::new(),
            labels: Vec::new(),
            ..packed
        };
        assert!(encode_rank(&[vec![empty]]).is_err());
    }
}
