//! [`CommOp`]: the step's communication as data, an [`Op::Collective`] each. A collective
//! (all-reduce, reduce-scatter, all-gather over spans of the device buffers), the copies
//! that pack its input and unpack its output, and the events that order the compute and
//! communication streams, each tagged with its [`CommStream`] and the events it waits on.
//! [`Marker`] ops mark where the compute of each plan unit (and the optimizer) was issued,
//! so a collective's position in the step is read off the op list ([`collective_sequence`]),
//! in the same coordinates as the plan's op graph.
//!
//! On the host these ops are what tests read; `execute.rs` runs them through the device
//! collectives (`cuda::device_comm`) on the communication stream.

use dsplan_kernels::Dtype;
use dsplan_planner::plan::Collective;

use super::{Access, Op, ShapeError};
use crate::comm::ReduceOp;
use crate::cuda::train::region::TensorRef;

/// The stream an op runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommStream {
    /// The stream of the compute kernels (and of serialized reductions).
    Compute,
    /// The communication stream: collectives that overlap compute.
    Comm,
}

/// An event recorded on one stream and waited for on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub usize);

/// Why a collective runs: the plan's item it carries out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Gradient bucket `bucket` of the plan's `buckets.reduce`.
    ReduceBucket {
        /// Its index.
        bucket: usize,
    },
    /// Stage 3: the on-demand fetch of trace step `step`.
    Fetch {
        /// Trace step.
        step: usize,
    },
    /// Stage 3: the prefetch issued at trace step `step`.
    Prefetch {
        /// Trace step.
        step: usize,
    },
    /// Stages 1-2: piece `shard` of the plan's `buckets.param_gather`.
    ParamGather {
        /// Its index.
        shard: usize,
    },
    /// Stage 3: the persistent tensors gathered again after the optimizer step.
    PersistentRegather,
    /// The gradient norm's sum of squares and the overflow flag over the ranks' partitions
    /// (8 and 4 bytes; the plan's op graph does not list them).
    StepScalars,
}

/// A point of the step the position of a collective is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The compute of trace step `step` (a plan unit's forward or backward) has been issued.
    Unit {
        /// Trace step.
        step: usize,
    },
    /// The optimizer step has been issued.
    Optimizer,
}

/// One copy between device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPiece {
    /// Written.
    pub dst: TensorRef,
    /// Read (same length).
    pub src: TensorRef,
}

/// What a [`CommOp`] does.
#[derive(Debug, Clone, PartialEq)]
pub enum CommAction {
    /// A collective over `world` ranks. `input` inside `output` (or equal) is in place.
    Collective {
        /// All-reduce, reduce-scatter or all-gather.
        kind: Collective,
        /// What this rank sends.
        input: TensorRef,
        /// What it receives.
        output: TensorRef,
        /// The combination (reductions only).
        reduction: Option<ReduceOp>,
        /// The plan's item.
        purpose: Purpose,
        /// Ranks.
        world: usize,
    },
    /// Device-to-device copies (a collective's pack or unpack).
    Copy {
        /// The pieces.
        pieces: Vec<CopyPiece>,
    },
    /// `dst += src` per piece (a reduced bucket added into the rank's gradient partition).
    Accumulate {
        /// The pieces (`dst` written, `src` read, same lengths).
        pieces: Vec<CopyPiece>,
    },
    /// Zeroes a staging span (a reduce-scatter's padding).
    Zero {
        /// The span.
        tensor: TensorRef,
    },
    /// Only the stream bookkeeping (waits and record) of the op.
    Sync,
    /// Stage 3: the tensors' places in the parameter arena are free after their module: a
    /// later gather the plan places there reuses them (no device call; the op records the
    /// event that gather waits for).
    Release {
        /// The parameter spans released.
        tensors: Vec<TensorRef>,
    },
    /// A position marker (no device work).
    Mark(Marker),
}

/// One communication-side op with its stream and events.
#[derive(Debug, Clone, PartialEq)]
pub struct CommOp {
    /// Where it runs.
    pub stream: CommStream,
    /// Events (recorded on the other stream) waited for before it.
    pub waits: Vec<EventId>,
    /// The event recorded on its stream after it.
    pub record: Option<EventId>,
    /// What it does.
    pub action: CommAction,
}

impl CommOp {
    /// An op on `stream` without events.
    pub fn on(stream: CommStream, action: CommAction) -> Self {
        Self {
            stream,
            waits: Vec::new(),
            record: None,
            action,
        }
    }

    /// An op on `stream` that waits for `waits` and records `record` after it.
    pub fn with_events(
        stream: CommStream,
        waits: Vec<EventId>,
        record: Option<EventId>,
        action: CommAction,
    ) -> Self {
        Self {
            stream,
            waits,
            record,
            action,
        }
    }

    /// Every device tensor it touches, with whether it writes it (an in-place collective
    /// lists its output only).
    pub fn tensors(&self) -> Vec<(TensorRef, Access)> {
        let mut op = self.clone();
        op.tensors_mut().into_iter().map(|(t, a)| (*t, a)).collect()
    }

    /// [`Self::tensors`], each to be moved.
    pub fn tensors_mut(&mut self) -> Vec<(&mut TensorRef, Access)> {
        match &mut self.action {
            CommAction::Collective { input, output, .. } => {
                if contains(output, input) {
                    vec![(output, Access::Write)]
                } else {
                    vec![(input, Access::Read), (output, Access::Write)]
                }
            }
            CommAction::Copy { pieces } | CommAction::Accumulate { pieces } => pieces
                .iter_mut()
                .flat_map(|p| [(&mut p.dst, Access::Write), (&mut p.src, Access::Read)])
                .collect(),
            CommAction::Zero { tensor } => vec![(tensor, Access::Write)],
            CommAction::Release { .. } | CommAction::Sync | CommAction::Mark(_) => Vec::new(),
        }
    }

    /// Bytes of the collective's whole buffer (all-reduce: the data; reduce-scatter: its
    /// input; all-gather: its output), as the plan counts them; `None` for other ops.
    pub fn collective_bytes(&self, dtype: Dtype) -> Option<u64> {
        let CommAction::Collective {
            kind,
            input,
            output,
            ..
        } = &self.action
        else {
            return None;
        };
        let whole = match kind {
            Collective::AllGather => output,
            _ => input,
        };
        let size = whole.region.element().size(dtype) as u64;
        Some(whole.len() as u64 * size)
    }

    /// The collective's size rules: all-reduce `input == output`; reduce-scatter
    /// `input = world × output`; all-gather `output = world × input`; an in-place
    /// reduce-scatter or all-gather keeps this rank's piece at `rank × piece`; copies of
    /// equal lengths, within one op disjoint destinations.
    pub fn check_shapes(&self) -> Result<(), ShapeError> {
        match &self.action {
            CommAction::Collective {
                kind,
                input,
                output,
                world,
                ..
            } => {
                let (whole, piece) = match kind {
                    Collective::AllReduce => {
                        if input != output {
                            return Err(ShapeError(format!(
                                "all-reduce of {input:?} into {output:?}: only in place"
                            )));
                        }
                        return Ok(());
                    }
                    Collective::ReduceScatter => (input, output),
                    Collective::AllGather => (output, input),
                    Collective::Reduce => {
                        return Err(ShapeError("a reduce per rank is not run".into()));
                    }
                };
                if whole.len() != world * piece.len() {
                    return Err(ShapeError(format!(
                        "{}: {} elements are not {world} pieces of {}",
                        kind.as_str(),
                        whole.len(),
                        piece.len()
                    )));
                }
                if whole.region == piece.region && whole.overlaps(piece) {
                    let at = piece.span.offset.checked_sub(whole.span.offset);
                    if !contains(whole, piece) || at.is_none_or(|a| a % piece.len().max(1) != 0) {
                        return Err(ShapeError(format!(
                            "{}: the in-place piece {piece:?} is not a rank's place in {whole:?}",
                            kind.as_str()
                        )));
                    }
                }
                Ok(())
            }
            CommAction::Copy { pieces } | CommAction::Accumulate { pieces } => {
                for piece in pieces {
                    if piece.dst.len() != piece.src.len() {
                        return Err(ShapeError(format!(
                            "copy of {} elements into {}",
                            piece.src.len(),
                            piece.dst.len()
                        )));
                    }
                }
                Ok(())
            }
            CommAction::Zero { .. }
            | CommAction::Sync
            | CommAction::Release { .. }
            | CommAction::Mark(_) => Ok(()),
        }
    }
}

/// Whether `inner` lies within `outer`.
fn contains(outer: &TensorRef, inner: &TensorRef) -> bool {
    outer.region == inner.region
        && outer.span.offset <= inner.span.offset
        && inner.span.end() <= outer.span.end()
}

/// One collective of a step as the plan's op graph describes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveRecord {
    /// All-reduce, reduce-scatter or all-gather.
    pub kind: Collective,
    /// Bytes of its whole buffer.
    pub bytes: u64,
    /// Its stream.
    pub stream: CommStream,
    /// Compute ops (plan units' forward or backward, the optimizer) issued before it.
    pub position: usize,
    /// The plan's item.
    pub purpose: Purpose,
}

/// The collectives of `ops` in order, each with its position: the number of [`Marker`]s
/// before it in the list.
pub fn collective_sequence<'a>(
    ops: impl IntoIterator<Item = &'a Op>,
    dtype: Dtype,
) -> Vec<CollectiveRecord> {
    let mut position = 0;
    let mut sequence = Vec::new();
    for op in ops {
        let Op::Collective(comm) = op else {
            continue;
        };
        match &comm.action {
            CommAction::Mark(_) => position += 1,
            CommAction::Collective { kind, purpose, .. } => sequence.push(CollectiveRecord {
                kind: *kind,
                bytes: comm.collective_bytes(dtype).unwrap_or(0),
                stream: comm.stream,
                position,
                purpose: *purpose,
            }),
            _ => {}
        }
    }
    sequence
}
