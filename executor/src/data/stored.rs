//! [`StoredBatchSource`]: global batches stored step by step in a safetensors file.
//!
//! This is how the reference fixtures keep their data:
//! `reference/gpt2/adamw_trajectory/batches.safetensors` holds `input_ids`, int64
//! `[20, 4, 32]` (20 steps, global batch 4, rows of 32 tokens), and
//! `forward_backward/inputs.safetensors` holds one step as `input_ids` int64 `[4, 32]`. Step `t`
//! uses `input_ids[t]` whole; its rows are split among ranks and micro-steps by the rule in
//! [`super::layout`], so the layout must have `micro_batch * grad_accum * world` equal to the
//! stored global batch and `seq_len + 1` equal to the stored row length (31 + 1 = 32 for the
//! fixtures, which Hugging Face trains with `labels = input_ids`).
//!
//! Accepted: any integer dtype (I64, I32, I16, I8, U64, U32, U16, U8) with every value in
//! `0 ..= u32::MAX` (so `-100`-padded label tensors are rejected), shape `[steps, global_batch,
//! row]` or `[global_batch, row]` (one step). Steps past the end are an error, not a wrap-around.

use safetensors::{Dtype, SafeTensors};

use super::{BatchLayout, DataError, TokenSource};

/// The tensor name the fixtures use.
pub const DEFAULT_TENSOR: &str = "input_ids";

/// Global batches read from a safetensors tensor; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct StoredBatchSource {
    origin: String,
    layout: BatchLayout,
    steps: u64,
    tokens: Vec<u32>,
    token_bound: u32,
}

impl StoredBatchSource {
    /// Reads tensor `name` of the safetensors file `bytes`; `origin` names the file in errors.
    pub fn from_safetensors(
        origin: impl Into<String>,
        bytes: &[u8],
        name: &str,
        layout: BatchLayout,
    ) -> Result<Self, DataError> {
        let origin = origin.into();
        let file = SafeTensors::deserialize(bytes).map_err(|error| DataError::Safetensors {
            origin: origin.clone(),
            message: error.to_string(),
        })?;
        let Ok(view) = file.tensor(name) else {
            let mut available: Vec<String> = file.names().into_iter().map(str::to_owned).collect();
            available.sort();
            return Err(DataError::MissingTensor {
                origin,
                name: name.to_owned(),
                available,
            });
        };
        let shape = view.shape().to_vec();
        let (steps, stored_batch, stored_row) = match shape[..] {
            [steps, batch, row] => (steps, batch, row),
            [batch, row] => (1, batch, row),
            _ => (0, 0, 0),
        };
        if steps == 0 || stored_batch == 0 || stored_row == 0 {
            return Err(DataError::WrongShape {
                origin,
                name: name.to_owned(),
                shape,
            });
        }
        let tokens =
            integer_tokens(view.dtype(), view.data()).map_err(|problem| match problem {
                TokenProblem::Dtype => DataError::UnsupportedDtype {
                    origin: origin.clone(),
                    name: name.to_owned(),
                    dtype: format!("{:?}", view.dtype()),
                },
                TokenProblem::Value { index, value } => DataError::InvalidToken {
                    origin: origin.clone(),
                    index,
                    value,
                },
            })?;
        if stored_row != layout.row_len() {
            return Err(DataError::RowLength {
                origin,
                stored: stored_row,
                expected: layout.row_len(),
            });
        }
        if stored_batch != layout.global_batch() {
            return Err(DataError::GlobalBatch {
                origin,
                stored: stored_batch,
                expected: layout.global_batch(),
            });
        }
        let token_bound = tokens.iter().max().map_or(0, |&max| max.saturating_add(1));
        Ok(StoredBatchSource {
            origin,
            layout,
            steps: steps as u64,
            tokens,
            token_bound,
        })
    }

    /// Where the batches came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

impl TokenSource for StoredBatchSource {
    fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    fn token_bound(&self) -> u32 {
        self.token_bound
    }

    fn steps(&self) -> Option<u64> {
        Some(self.steps)
    }

    fn fill_row(&mut self, step: u64, row: usize, out: &mut [u32]) -> Result<(), DataError> {
        let row_len = self.layout.row_len();
        let global_batch = self.layout.global_batch();
        if out.len() != row_len {
            return Err(DataError::RowBuffer {
                found: out.len(),
                expected: row_len,
            });
        }
        if step >= self.steps {
            return Err(DataError::StepOutOfRange {
                step,
                steps: self.steps,
            });
        }
        if row >= global_batch {
            return Err(DataError::RowOutOfRange { row, global_batch });
        }
        // `step < steps` and the tensor holds `steps * global_batch * row_len` elements.
        let start = (step as usize * global_batch + row) * row_len;
        out.copy_from_slice(&self.tokens[start..start + row_len]);
        Ok(())
    }
}

enum TokenProblem {
    Dtype,
    Value { index: usize, value: i128 },
}

/// The elements of a little-endian integer tensor as token ids.
fn integer_tokens(dtype: Dtype, data: &[u8]) -> Result<Vec<u32>, TokenProblem> {
    fn convert<const N: usize>(
        data: &[u8],
        decode: impl Fn([u8; N]) -> i128,
    ) -> Result<Vec<u32>, TokenProblem> {
        data.chunks_exact(N)
            .enumerate()
            .map(|(index, chunk)| {
                let mut raw = [0u8; N];
                raw.copy_from_slice(chunk);
                let value = decode(raw);
                u32::try_from(value).map_err(|_| TokenProblem::Value { index, value })
            })
            .collect()
    }
    match dtype {
        Dtype::I64 => convert(data, |b| i128::from(i64::from_le_bytes(b))),
        Dtype::I32 => convert(data, |b| i128::from(i32::from_le_bytes(b))),
        Dtype::I16 => convert(data, |b| i128::from(i16::from_le_bytes(b))),
        Dtype::I8 => convert(data, |b| i128::from(i8::from_le_bytes(b))),
        Dtype::U64 => convert(data, |b| i128::from(u64::from_le_bytes(b))),
        Dtype::U32 => convert(data, |b| i128::from(u32::from_le_bytes(b))),
        Dtype::U16 => convert(data, |b| i128::from(u16::from_le_bytes(b))),
        Dtype::U8 => convert(data, |b: [u8; 1]| i128::from(b[0])),
        _ => Err(TokenProblem::Dtype),
    }
}
