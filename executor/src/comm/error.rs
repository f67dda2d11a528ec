//! [`CommError`]: why a collective did not complete, identical on every rank of the call.

use std::fmt;

use super::ReduceOp;

/// The kind of a collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`super::Comm::all_reduce`].
    AllReduce,
    /// [`super::Comm::reduce_scatter`].
    ReduceScatter,
    /// [`super::Comm::all_gather`].
    AllGather,
    /// [`super::Comm::broadcast`].
    Broadcast,
    /// [`super::Comm::barrier`].
    Barrier,
    /// [`super::Comm::all_reduce_scalar`].
    AllReduceScalar,
}

impl OpKind {
    /// The snake-case name of the method.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Barrier => "barrier",
            OpKind::AllReduceScalar => "all_reduce_scalar",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A phase of the training step whose device work a rank waits for (on a GPU, the phase's
/// kernels include its collectives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepPhase {
    /// The start of an optimizer step.
    Start,
    /// A micro-step's forward and backward.
    MicroStep,
    /// The gradients' norm and overflow check over the ranks.
    GradientReduction,
    /// The optimizer step and the parameters' refresh.
    OptimizerStep,
    /// Copying the training state out of (or into) the device.
    StateTransfer,
}

impl StepPhase {
    /// How messages name it.
    pub const fn name(self) -> &'static str {
        match self {
            StepPhase::Start => "the step's start",
            StepPhase::MicroStep => "the micro-step",
            StepPhase::GradientReduction => "the gradient reduction",
            StepPhase::OptimizerStep => "the optimizer step",
            StepPhase::StateTransfer => "the copy of the training state",
        }
    }
}

/// What a rank was waiting for when its wait failed: one collective, or a phase of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// One collective call.
    Collective(OpKind),
    /// A phase of the step, with every collective in it.
    Step(StepPhase),
    /// Joining the group (every rank's set-up of the communicator).
    Join,
}

impl From<OpKind> for Waiting {
    fn from(op: OpKind) -> Self {
        Waiting::Collective(op)
    }
}

impl From<StepPhase> for Waiting {
    fn from(phase: StepPhase) -> Self {
        Waiting::Step(phase)
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Collective(op) => write!(f, "{op}"),
            Waiting::Step(phase) => f.write_str(phase.name()),
            Waiting::Join => f.write_str("joining the communicator"),
        }
    }
}

/// How a rank left its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Its handle was dropped in the ordinary way (the rank finished early or gave up).
    Returned,
    /// Its handle was dropped while its thread was panicking.
    Panicked,
}

/// What one rank asked of a collective, as reported in a [`CommError::Disagreement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape {
    /// The operation.
    pub op: OpKind,
    /// The reduction, for reducing operations.
    pub reduce: Option<ReduceOp>,
    /// The root, for broadcast.
    pub root: Option<usize>,
    /// Elements of the input (or of the in-place buffer).
    pub input_len: usize,
    /// Elements of the output (equal to `input_len` for in-place operations).
    pub output_len: usize,
}

impl fmt::Display for CallShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(reduce) = self.reduce {
            write!(f, "({})", reduce.name())?;
        }
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        match self.op {
            OpKind::Barrier | OpKind::AllReduceScalar => Ok(()),
            OpKind::AllReduce | OpKind::Broadcast => write!(f, " of {} elements", self.input_len),
            OpKind::ReduceScatter | OpKind::AllGather => write!(
                f,
                " of {} input / {} output elements",
                self.input_len, self.output_len
            ),
        }
    }
}

/// Why a collective (or a group of ranks) failed.
///
/// Errors raised by a collective are decided from what *all* ranks posted, so every rank of the
/// call returns the same error and the group stays in step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommError {
    /// A group needs at least one rank.
    EmptyGroup,
    /// A shard-moving operation was called with lengths that do not split into equal shards.
    UnevenShards {
        /// The operation.
        op: OpKind,
        /// The rank that passed the lengths.
        rank: usize,
        /// Elements of the input.
        input_len: usize,
        /// Elements of the output.
        output_len: usize,
        /// The world size.
        world: usize,
    },
    /// A broadcast named a root outside the group.
    RootOutOfRange {
        /// The rank that passed it.
        rank: usize,
        /// The root asked for.
        root: usize,
        /// The world size.
        world: usize,
    },
    /// Ranks entered the same collective step with different operations or lengths.
    Disagreement {
        /// Rank 0's call.
        expected: CallShape,
        /// The first rank whose call differs.
        rank: usize,
        /// Its call.
        found: CallShape,
    },
    /// A rank left the group, so the collective cannot complete.
    PeerLeft {
        /// The operation that was waiting.
        op: OpKind,
        /// The lowest rank that had left.
        rank: usize,
        /// How it left.
        departure: Departure,
    },
    /// A rank's thread panicked (reported by [`super::run_ranks`] after joining every rank).
    RankPanicked {
        /// The lowest rank that panicked.
        rank: usize,
        /// Its panic message, when it was a string.
        message: String,
        /// Every rank that panicked.
        ranks: Vec<usize>,
    },
    /// The communication library or the device under it failed (an NCCL or CUDA driver
    /// error). Unlike the errors above it is decided by one rank alone: the others may see a
    /// different backend error, or a timeout of the backend's own.
    Backend {
        /// The operation (or the phase of the step) that failed.
        op: Waiting,
        /// The rank that saw the failure.
        rank: usize,
        /// The backend's name (`NCCL`).
        backend: &'static str,
        /// The backend's error text.
        message: String,
    },
    /// A collective did not complete within the group's timeout: a peer is stuck, or gone
    /// without the backend noticing.
    TimedOut {
        /// The operation (or the phase of the step) that was waiting.
        op: Waiting,
        /// The rank that gave up waiting.
        rank: usize,
        /// The timeout, in seconds.
        seconds: u64,
    },
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommError::EmptyGroup => write!(f, "a communication group needs at least one rank"),
            CommError::UnevenShards {
                op,
                rank,
                input_len,
                output_len,
                world,
            } => {
                let (whole, shard, rule) = match op {
                    OpKind::AllGather => (output_len, input_len, "output = world size x input"),
                    _ => (input_len, output_len, "input = world size x output"),
                };
                write!(
                    f,
                    "{op} on rank {rank}: {input_len} input and {output_len} output elements do \
                     not split into {world} equal shards ({whole} != {world} x {shard}); \
                     the rule is {rule}, so pad the flat buffer to a multiple of {world} first"
                )
            }
            CommError::RootOutOfRange { rank, root, world } => write!(
                f,
                "broadcast on rank {rank}: root {root} is not a rank of a group of {world}"
            ),
            CommError::Disagreement {
                expected,
                rank,
                found,
            } => write!(
                f,
                "ranks disagree on a collective: rank 0 called {expected}, rank {rank} called \
                 {found}; every rank must issue the same collectives in the same order"
            ),
            CommError::PeerLeft {
                op,
                rank,
                departure,
            } => {
                let how = match departure {
                    Departure::Returned => "returned without finishing its collectives",
                    Departure::Panicked => "panicked",
                };
                write!(f, "{op} cannot complete: rank {rank} {how}")
            }
            CommError::RankPanicked {
                rank,
                message,
                ranks,
            } => {
                write!(f, "rank {rank} panicked: {message}")?;
                if ranks.len() > 1 {
                    write!(f, " (ranks that panicked: {ranks:?})")?;
                }
                Ok(())
            }
            CommError::Backend {
                op,
                rank,
                backend,
                message,
            } => write!(f, "{op} on rank {rank}: {backend} failed: {message}"),
            CommError::TimedOut { op, rank, seconds } => write!(
                f,
                "{op} on rank {rank} did not complete within {seconds} s: another rank is stuck \
                 or gone"
            ),
        }
    }
}

impl std::error::Error for CommError {}
