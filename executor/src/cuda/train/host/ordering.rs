//! Whether a program's events order every pair of conflicting accesses on its two streams
//! ([`check_ordering`]). The host interpreter runs a rank's ops in list order, one thread,
//! so it computes the program's result as if the compute and communication streams never
//! overlapped; on a GPU they do, and only the events (`waits`, `record`) and the host's
//! synchronisations order them. This replays the streams as `execute_comm.rs` and
//! `rank.rs` drive them, with vector clocks:
//!
//! - a compute op runs on the compute stream; a communication op on its [`CommStream`],
//!   after joining the clocks of the events it waits for that have been recorded (in this
//!   phase or any earlier one: the runner keeps the latest recording of each id);
//! - a collective issued on the compute stream runs on the communication stream after it
//!   (`comm.join(compute)`), and the compute stream waits for it (`compute.join(comm)`);
//! - the host synchronises the compute stream after each micro-step (the losses are read
//!   back) and both streams after the norm phase and after the optimizer step.
//!
//! Two accesses of overlapping spans on different streams, one of them a write, are a race
//! unless the first happens before the second. The streams are taken to be fully
//! asynchronous (NCCL's device collectives); the host-staged collectives of ranks sharing a
//! GPU synchronise more, which can hide a race this reports.

use std::collections::HashMap;

use super::super::program::{Access, CommAction, CommOp, CommStream, EventId, Op};
use super::super::region::TensorRef;
use super::super::step::StepProgram;

/// Two accesses of one buffer span on different streams that no event orders.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderingError {
    /// Where the later access is: `step N phase[index]`.
    pub later: String,
    /// The later op.
    pub later_op: String,
    /// Where the earlier access is.
    pub earlier: String,
    /// The earlier op.
    pub earlier_op: String,
    /// The later access's tensor.
    pub tensor: TensorRef,
}

impl std::fmt::Display for OrderingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}) touches {:?} {}..{} unordered after {} ({})",
            self.later,
            self.later_op,
            self.tensor.region,
            self.tensor.span.offset,
            self.tensor.span.end(),
            self.earlier,
            self.earlier_op
        )
    }
}

type Clock = [u64; 2];

fn join(a: Clock, b: Clock) -> Clock {
    [a[0].max(b[0]), a[1].max(b[1])]
}

fn lane(stream: CommStream) -> usize {
    match stream {
        CommStream::Compute => 0,
        CommStream::Comm => 1,
    }
}

struct Access1 {
    stream: usize,
    seq: u64,
    tensor: TensorRef,
    access: Access,
    at: String,
    op: String,
}

#[derive(Default)]
struct Streams {
    clocks: [Clock; 2],
    events: HashMap<EventId, Clock>,
    history: Vec<Access1>,
    races: Vec<OrderingError>,
}

fn short(op: &Op) -> String {
    let text = format!("{op:?}");
    match text.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

impl Streams {
    /// One op's accesses on `stream`, after the clock ticked.
    fn touch(&mut self, stream: usize, accesses: Vec<(TensorRef, Access)>, at: &str, op: &Op) {
        self.clocks[stream][stream] += 1;
        let now = self.clocks[stream];
        let other = 1 - stream;
        for (tensor, access) in accesses {
            if tensor.is_empty() {
                continue;
            }
            if let Some(earlier) = self.history.iter().rev().find(|h| {
                h.stream == other
                    && h.seq > now[other]
                    && (h.access == Access::Write || access == Access::Write)
                    && h.tensor.overlaps(&tensor)
            }) {
                self.races.push(OrderingError {
                    later: at.to_string(),
                    later_op: short(op),
                    earlier: earlier.at.clone(),
                    earlier_op: earlier.op.clone(),
                    tensor,
                });
            }
            self.history.push(Access1 {
                stream,
                seq: now[stream],
                tensor,
                access,
                at: at.to_string(),
                op: short(op),
            });
        }
    }

    fn comm(&mut self, comm: &CommOp, at: &str, op: &Op) {
        let s = lane(comm.stream);
        for id in &comm.waits {
            if let Some(&clock) = self.events.get(id) {
                self.clocks[s] = join(self.clocks[s], clock);
            }
        }
        match (&comm.action, comm.stream) {
            (CommAction::Collective { .. }, CommStream::Compute) => {
                self.clocks[1] = join(self.clocks[1], self.clocks[0]);
                self.touch(1, comm.tensors(), at, op);
                self.clocks[0] = join(self.clocks[0], self.clocks[1]);
            }
            _ => self.touch(s, comm.tensors(), at, op),
        }
        if let Some(id) = comm.record {
            self.events.insert(id, self.clocks[s]);
        }
    }

    fn phase(&mut self, ops: &[Op], label: &str) {
        for (index, op) in ops.iter().enumerate() {
            let at = format!("{label}[{index}]");
            match op {
                Op::Collective(comm) => self.comm(comm, &at, op),
                compute => self.touch(0, compute.tensors(), &at, op),
            }
        }
    }

    /// The host waited for the compute stream: later work on either stream follows it.
    fn host_waits_compute(&mut self) {
        self.clocks[1] = join(self.clocks[1], self.clocks[0]);
    }

    /// The host waited for both streams.
    fn host_waits_both(&mut self) {
        let both = join(self.clocks[0], self.clocks[1]);
        self.clocks = [both, both];
    }
}

/// The races of `steps` applied optimizer steps of `program` with `grad_accum` micro-steps
/// each, run as the GPU backend runs it (see the [module documentation](self)); empty when
/// every conflicting pair of accesses is ordered.
pub fn check_ordering(
    program: &StepProgram,
    grad_accum: usize,
    steps: usize,
) -> Vec<OrderingError> {
    let mut streams = Streams::default();
    let accum = grad_accum.max(1);
    for step in 0..steps {
        streams.phase(&program.start, &format!("step {step} start"));
        for micro in 0..accum {
            let (ops, name) = if micro + 1 == accum {
                (&program.boundary_micro_step, "boundary_micro_step")
            } else {
                (&program.micro_step, "micro_step")
            };
            streams.phase(ops, &format!("step {step} micro {micro} {name}"));
            streams.host_waits_compute();
        }
        streams.phase(&program.norm, &format!("step {step} norm"));
        streams.host_waits_both();
        streams.phase(&program.update, &format!("step {step} update"));
        streams.phase(&program.after_update, &format!("step {step} after_update"));
        streams.host_waits_both();
    }
    streams.races
}
