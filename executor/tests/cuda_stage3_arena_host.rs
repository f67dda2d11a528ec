//! Stage 3's gathered-parameter arena on the CUDA step, checked on the host (no GPU): the
//! rank allocates the arena the plan places (to the byte), and a static dataflow check walks
//! two steps of the rank's program in order, following every element of the arena through
//! the gathers (shard slice → all-gather input → each rank's output → its place), the
//! releases and the two streams' events. It holds that every compute op reads each parameter
//! element from the bytes that tensor's gather last wrote (not released, nothing written over
//! them since, the gather's event waited for), and that no gather overwrites a place before
//! the compute stream has finished reading what was there. Breaking either order in the
//! program makes the check fail. Prints the memory per rank before and after the arena with
//! `--nocapture`.

use std::collections::BTreeMap;

use dsplan_executor::cuda::train::program::{CommAction, CommStream, EventId};
use dsplan_executor::cuda::train::{DeviceLayout, Op, Region, StepProgram, world_program};
use dsplan_executor::metrics::{Category, PlanMemory};
use dsplan_executor::model::{BatchShape, Gpt2Config, Recompute};
use dsplan_executor::train::{TrainSettings, compile_cuda_plan};
use dsplan_kernels::Dtype;
use dsplan_planner::plan::{Collective, ModelGraph, Plan};
use serde_json::{Value, json};

#[path = "support/models.rs"]
mod models;
use models::{gpt2, small_head_64};

/// DeepSpeed's defaults (gpt2 124M keeps almost everything for reuse), a schedule that
/// releases after every unit, and one without persistent tensors that prefetches little
/// (tiny-gpt2's tensors are all persistent otherwise).
fn variants() -> [(&'static str, Value); 3] {
    [
        ("defaults", json!({})),
        (
            "releasing",
            json!({
                "stage3_max_reuse_distance": 0,
                "stage3_max_live_parameters": 30_000_000,
                "stage3_prefetch_bucket_size": 5_000_000,
                "overlap_comm": true,
            }),
        ),
        (
            "no persistence",
            json!({
                "stage3_max_reuse_distance": 0,
                "stage3_prefetch_bucket_size": 50_000,
                "stage3_param_persistence_threshold": 0,
                "reduce_bucket_size": 1_000_000,
            }),
        ),
    ]
}

fn plan_for(zero: &Value, model: Gpt2Config, seq_len: usize, world: usize) -> Plan {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
    });
    if let (Some(target), Some(extra)) = (
        config["zero_optimization"].as_object_mut(),
        zero.as_object(),
    ) {
        target.extend(extra.clone());
    }
    let settings = TrainSettings::from_config(&config, world).expect("settings");
    compile_cuda_plan(&settings, &model.into(), seq_len, world).expect("plan")
}

fn layout_for(plan: &Plan, model: Gpt2Config, seq_len: usize, rank: usize) -> DeviceLayout {
    DeviceLayout::for_plan_rank(
        model,
        BatchShape { batch: 2, seq_len },
        Dtype::Bf16,
        Recompute::Nothing,
        plan,
        rank,
    )
    .expect("layout")
}

/// What an element of a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Unknown,
    /// Element `at` of model tensor `t`.
    Tensor {
        t: usize,
        at: usize,
    },
    /// Element `at` of this rank's slice of tensor `t`.
    Slice {
        t: usize,
        at: usize,
    },
    /// Tensor `t`'s place after its release.
    Released {
        t: usize,
    },
}

impl Held {
    fn shifted(self, by: usize) -> Held {
        match self {
            Held::Tensor { t, at } => Held::Tensor { t, at: at + by },
            Held::Slice { t, at } => Held::Slice { t, at: at + by },
            other => other,
        }
    }
}

/// A run of elements: what its first element holds (the rest follow), its last writer
/// (stream, position) and the position of its last read on the compute stream.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: usize,
    end: usize,
    held: Held,
    written: Option<(CommStream, usize)>,
    read: Option<usize>,
}

/// A buffer as runs, covering `0..len`.
struct Runs(Vec<Run>);

impl Runs {
    fn new(len: usize) -> Self {
        Runs(vec![Run {
            start: 0,
            end: len,
            held: Held::Unknown,
            written: None,
            read: None,
        }])
    }

    fn split_at(&mut self, x: usize) {
        if let Some(i) = self.0.iter().position(|r| r.start < x && x < r.end) {
            let run = self.0[i];
            self.0[i].end = x;
            self.0.insert(
                i + 1,
                Run {
                    start: x,
                    held: run.held.shifted(x - run.start),
                    ..run
                },
            );
        }
    }

    /// The runs of `a..b`, split at its ends.
    fn range(&mut self, a: usize, b: usize) -> Result<std::ops::Range<usize>, String> {
        let len = self.0.last().map_or(0, |r| r.end);
        if b > len || a > b {
            return Err(format!("{a}..{b} outside a buffer of {len}"));
        }
        self.split_at(a);
        self.split_at(b);
        let first = self
            .0
            .iter()
            .position(|r| r.start >= a)
            .unwrap_or(self.0.len());
        if a == b {
            return Ok(first..first);
        }
        let last = self
            .0
            .iter()
            .position(|r| r.end >= b)
            .map_or(first, |i| i + 1);
        Ok(first..last.max(first))
    }

    fn write(
        &mut self,
        a: usize,
        runs: Vec<(usize, usize, Held)>,
        by: (CommStream, usize),
    ) -> Result<Vec<Run>, String> {
        let b = runs.last().map_or(a, |r| a + r.1);
        let at = self.range(a, b)?;
        let old: Vec<Run> = self.0.splice(at.clone(), []).collect();
        let new: Vec<Run> = runs
            .into_iter()
            .map(|(from, to, held)| Run {
                start: a + from,
                end: a + to,
                held,
                written: Some(by),
                read: None,
            })
            .collect();
        self.0.splice(at.start..at.start, new);
        Ok(old)
    }

    /// The runs of `a..b` as (start, end, held) relative to `a`.
    fn read(&mut self, a: usize, b: usize) -> Result<Vec<(usize, usize, Held)>, String> {
        let at = self.range(a, b)?;
        Ok(self.0[at]
            .iter()
            .map(|r| (r.start - a, r.end - a, r.held))
            .collect())
    }
}

/// The walk's state: the arena and the gather staging, the events, what each stream has
/// seen of the other.
struct Walk<'a> {
    layout: &'a DeviceLayout,
    arena_len: usize,
    arena: Runs,
    gather_in: Runs,
    gather_out: Runs,
    events: BTreeMap<EventId, (CommStream, usize)>,
    compute_saw_comm: Option<usize>,
    comm_saw_compute: Option<usize>,
    /// Model tensor of each flat parameter entry, and its slice length.
    tensor_of_entry: Vec<usize>,
    slice_of_tensor: BTreeMap<usize, usize>,
    names: Vec<String>,
    position: usize,
    reads: usize,
}

impl<'a> Walk<'a> {
    fn new(layout: &'a DeviceLayout, graph: &ModelGraph) -> Self {
        let entries = layout.param_table().entries();
        let tensor_of_entry: Vec<usize> = entries
            .iter()
            .map(|e| {
                graph
                    .tensors
                    .iter()
                    .position(|t| t.name == e.name)
                    .expect("a plan tensor")
            })
            .collect();
        let slice_of_tensor = tensor_of_entry
            .iter()
            .zip(&layout.shard_spans)
            .map(|(&t, s)| (t, s.len))
            .collect();
        let arena_len = layout.shares.params as usize;
        let mut arena = Runs::new(arena_len);
        for &(flat, place) in &layout.persistent_places {
            let i = entries.iter().position(|e| e.span == flat).expect("entry");
            let t = tensor_of_entry[i];
            arena
                .write(
                    place.offset,
                    vec![(0, place.len, Held::Tensor { t, at: 0 })],
                    (CommStream::Compute, 0),
                )
                .expect("persistent place");
        }
        Walk {
            layout,
            arena_len,
            arena,
            gather_in: Runs::new(layout.len(Region::GatherIn)),
            gather_out: Runs::new(layout.len(Region::GatherOut)),
            events: BTreeMap::new(),
            compute_saw_comm: None,
            comm_saw_compute: None,
            tensor_of_entry,
            slice_of_tensor,
            names: graph.tensors.iter().map(|t| t.name.clone()).collect(),
            position: 1,
            reads: 0,
        }
    }

    /// The model tensor and element of flat parameter element `x`.
    fn flat(&self, x: usize) -> Option<(usize, usize)> {
        let entries = self.layout.param_table().entries();
        let i = entries
            .iter()
            .position(|e| e.span.offset <= x && x < e.span.end())?;
        Some((self.tensor_of_entry[i], x - entries[i].span.offset))
    }

    /// The model tensor and slice element of shard element `x` (from the shard's start).
    fn shard(&self, x: usize) -> Option<(usize, usize)> {
        let i = self
            .layout
            .shard_spans
            .iter()
            .position(|s| s.offset <= x && x < s.end())?;
        Some((
            self.tensor_of_entry[i],
            x - self.layout.shard_spans[i].offset,
        ))
    }

    fn wait(&mut self, stream: CommStream, events: &[EventId]) {
        for e in events {
            let Some(&(on, at)) = self.events.get(e) else {
                continue;
            };
            match (stream, on) {
                (CommStream::Compute, CommStream::Comm) => {
                    self.compute_saw_comm = self.compute_saw_comm.max(Some(at));
                }
                (CommStream::Comm, CommStream::Compute) => {
                    self.comm_saw_compute = self.comm_saw_compute.max(Some(at));
                }
                _ => {}
            }
        }
    }

    /// A write by `stream` into `a..` of the arena: nothing read there on the compute
    /// stream may be unfinished when it is on the communication stream.
    fn write_arena(
        &mut self,
        a: usize,
        runs: Vec<(usize, usize, Held)>,
        stream: CommStream,
    ) -> Result<(), String> {
        let old = self.arena.write(a, runs, (stream, self.position))?;
        if stream == CommStream::Comm {
            for run in old {
                if run.read.is_some_and(|r| self.comm_saw_compute < Some(r)) {
                    return Err(format!(
                        "op {}: a gather overwrites arena {}..{} ({:?}) before the compute stream has finished reading it at op {:?}",
                        self.position, run.start, run.end, run.held, run.read
                    ));
                }
            }
        }
        Ok(())
    }

    fn comm(&mut self, op: &dsplan_executor::cuda::train::program::CommOp) -> Result<(), String> {
        self.wait(op.stream, &op.waits);
        let base = self.arena_len;
        match &op.action {
            CommAction::Copy { pieces } => {
                for piece in pieces {
                    let (dst, src) = (piece.dst, piece.src);
                    let n = src.len();
                    let runs = match src.region {
                        Region::Params if src.span.offset >= base => {
                            let (t, at) = self.shard(src.span.offset - base).ok_or("shard")?;
                            vec![(0, n, Held::Slice { t, at })]
                        }
                        Region::GatherIn => self.gather_in.read(src.span.offset, src.span.end())?,
                        Region::GatherOut => {
                            self.gather_out.read(src.span.offset, src.span.end())?
                        }
                        _ => vec![(0, n, Held::Unknown)],
                    };
                    let by = (op.stream, self.position);
                    match dst.region {
                        Region::Params if dst.span.end() <= base => {
                            self.write_arena(dst.span.offset, runs, op.stream)?;
                        }
                        Region::GatherIn => {
                            self.gather_in.write(dst.span.offset, runs, by)?;
                        }
                        Region::GatherOut => {
                            self.gather_out.write(dst.span.offset, runs, by)?;
                        }
                        _ => {}
                    }
                }
            }
            CommAction::Collective {
                kind: Collective::AllGather,
                input,
                output,
                world,
                ..
            } if input.region == Region::GatherIn => {
                let pieces = self.gather_in.read(input.span.offset, input.span.end())?;
                let total = input.len();
                let by = (op.stream, self.position);
                for rank in 0..*world {
                    let runs: Vec<(usize, usize, Held)> = pieces
                        .iter()
                        .map(|&(a, b, held)| {
                            let held = match held {
                                Held::Slice { t, at } => Held::Tensor {
                                    t,
                                    at: rank * self.slice_of_tensor[&t] + at,
                                },
                                _ => Held::Unknown,
                            };
                            (a, b, held)
                        })
                        .collect();
                    self.gather_out
                        .write(output.span.offset + rank * total, runs, by)?;
                }
            }
            CommAction::Release { tensors } => {
                for tensor in tensors {
                    let held = self.arena.read(tensor.span.offset, tensor.span.end())?;
                    let t = match held.first() {
                        Some(&(_, _, Held::Tensor { t, .. } | Held::Released { t })) => t,
                        _ => usize::MAX,
                    };
                    let old = self.arena.write(
                        tensor.span.offset,
                        vec![(0, tensor.len(), Held::Released { t })],
                        (op.stream, self.position),
                    )?;
                    // A release keeps the place's readers: the next gather there waits for them.
                    let read = old.iter().filter_map(|r| r.read).max();
                    let at = self.arena.range(tensor.span.offset, tensor.span.end())?;
                    for run in &mut self.arena.0[at] {
                        run.read = read;
                    }
                }
            }
            _ => {
                for (tensor, access) in op.tensors() {
                    if tensor.region == Region::Params
                        && tensor.span.offset < base
                        && access == dsplan_executor::cuda::train::program::Access::Write
                    {
                        self.write_arena(
                            tensor.span.offset,
                            vec![(0, tensor.len(), Held::Unknown)],
                            op.stream,
                        )?;
                    }
                }
            }
        }
        if let Some(e) = op.record {
            self.events.insert(e, (op.stream, self.position));
        }
        Ok(())
    }

    /// A compute op of the rank's program; `flat` the same op of the one-GPU step (built
    /// over the flat parameters) when it is a micro-step's.
    fn compute(&mut self, op: &Op, flat: Option<&Op>) -> Result<(), String> {
        let ours = op.tensors();
        let theirs = flat.map(Op::tensors);
        if let Some(theirs) = &theirs
            && (theirs.len() != ours.len()
                || std::mem::discriminant(op) != std::mem::discriminant(flat.expect("flat")))
        {
            return Err(format!(
                "op {}: {op:?} is not the one-GPU {flat:?}",
                self.position
            ));
        }
        for (i, &(tensor, access)) in ours.iter().enumerate() {
            let in_arena = tensor.region == Region::Params && tensor.span.offset < self.arena_len;
            let original = theirs.as_ref().map(|t| t[i].0);
            if !in_arena {
                // Gradients move to their places in the gradient arena (its own test).
                if original.is_some_and(|o| o != tensor && o.region != Region::Grads) {
                    return Err(format!(
                        "op {}: {tensor:?} moved from {original:?}",
                        self.position
                    ));
                }
                continue;
            }
            if access == dsplan_executor::cuda::train::program::Access::Write {
                self.write_arena(
                    tensor.span.offset,
                    vec![(0, tensor.len(), Held::Unknown)],
                    CommStream::Compute,
                )?;
                continue;
            }
            let Some(original) = original.filter(|o| o.region == Region::Params) else {
                return Err(format!(
                    "op {}: reads the arena outside a micro-step",
                    self.position
                ));
            };
            let (t, at) = self.flat(original.span.offset).ok_or("flat parameter")?;
            let a = tensor.span.offset;
            let at_run = self.arena.range(a, tensor.span.end())?;
            for run in &mut self.arena.0[at_run] {
                let want = Held::Tensor {
                    t,
                    at: at + (run.start - a),
                };
                if run.held != want {
                    return Err(format!(
                        "op {}: reads `{}` element {} at arena {}, which holds {:?}",
                        self.position,
                        self.names[t],
                        at + (run.start - a),
                        run.start,
                        run.held
                    ));
                }
                if let Some((CommStream::Comm, w)) = run.written
                    && self.compute_saw_comm < Some(w)
                {
                    return Err(format!(
                        "op {}: reads `{}` before its gather (op {w}) has finished",
                        self.position, self.names[t]
                    ));
                }
                run.read = Some(self.position);
            }
            self.reads += 1;
        }
        Ok(())
    }

    fn op(&mut self, op: &Op, flat: Option<&Op>) -> Result<(), String> {
        let result = match op {
            Op::Collective(comm) => self.comm(comm),
            other => self.compute(other, flat),
        };
        self.position += 1;
        result
    }
}

/// Walks `steps` applied steps of `program` (one micro-step each).
fn dataflow(
    program: &StepProgram,
    layout: &DeviceLayout,
    graph: &ModelGraph,
    one_gpu: &StepProgram,
    steps: usize,
) -> Result<usize, String> {
    let mut walk = Walk::new(layout, graph);
    for _ in 0..steps {
        for op in &program.start {
            walk.op(op, None)?;
        }
        let mut flat = one_gpu.boundary_micro_step.iter();
        for op in &program.boundary_micro_step {
            let twin = match op {
                // Communication, and the zero of a gradient place before its first write: the
                // rank's own ops.
                Op::Collective(_) => None,
                Op::Zero { tensor } if tensor.region == Region::Grads => None,
                _ => Some(
                    flat.next()
                        .ok_or("more compute ops than the one-GPU step")?,
                ),
            };
            walk.op(op, twin)?;
        }
        if flat.next().is_some() {
            return Err("fewer compute ops than the one-GPU step".into());
        }
        for op in program
            .norm
            .iter()
            .chain(&program.update)
            .chain(&program.after_update)
        {
            walk.op(op, None)?;
        }
    }
    Ok(walk.reads)
}

fn one_gpu(model: Gpt2Config, seq_len: usize) -> StepProgram {
    StepProgram::new(&DeviceLayout::new(
        model,
        BatchShape { batch: 2, seq_len },
        Dtype::Bf16,
    ))
}

/// Every rank's arena is the plan's to the byte, and its program passes the dataflow check:
/// a head-64 tiny-gpt2 and gpt2 124M, W = 2, 4, 8, three schedules, first and last rank.
#[test]
fn every_parameter_read_sees_its_own_gather() {
    for (model, seq_len) in [(small_head_64(), 64), (gpt2(), 64)] {
        let flat = one_gpu(model, seq_len);
        for world in [2, 4, 8] {
            for (name, zero) in variants() {
                let plan = plan_for(&zero, model, seq_len, world);
                let predicted = PlanMemory::of(&plan);
                for rank in [0, world - 1] {
                    let what = format!("C={} W={world} {name} rank {rank}", model.n_embd);
                    let layout = layout_for(&plan, model, seq_len, rank);
                    let ours = layout.bytes_by_category();
                    for category in Category::ALL {
                        assert_eq!(ours.get(category), predicted.peak.get(category), "{what}");
                    }
                    let arena = plan.stage3.as_ref().and_then(|s| s.arena.as_ref());
                    assert_eq!(
                        Some(layout.bytes(Region::Params) - layout.shares.param_shard * 2),
                        arena.map(|a| a.numel * 2),
                        "{what}"
                    );
                    let program = world_program(&layout, &plan).expect("program");
                    program
                        .check(&layout)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let reads = dataflow(&program, &layout, &plan.model_graph, &flat, 2)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(reads > 0, "{what}: the walk checked parameter reads");
                }
            }
        }
    }
}

/// Each stream order the check relies on is real: without the gathers' waits for the
/// compute stream a gather overwrites a place still being read; without the compute
/// stream's waits for the gathers a parameter is read before its gather ends; releasing a
/// tensor before its unit's last read of it is caught.
#[test]
fn the_dataflow_check_catches_each_broken_order() {
    let model = small_head_64();
    let flat = one_gpu(model, 64);
    let plan = plan_for(&variants()[2].1, model, 64, 2);
    let layout = layout_for(&plan, model, 64, 0);
    let program = world_program(&layout, &plan).expect("program");
    dataflow(&program, &layout, &plan.model_graph, &flat, 2).expect("the program itself passes");

    let mut no_comm_waits = program.clone();
    for op in &mut no_comm_waits.boundary_micro_step {
        if let Op::Collective(c) = op
            && c.stream == CommStream::Comm
        {
            c.waits.clear();
        }
    }
    let error = dataflow(&no_comm_waits, &layout, &plan.model_graph, &flat, 2).expect_err("caught");
    assert!(error.contains("overwrites"), "{error}");

    let mut no_compute_waits = program.clone();
    for op in &mut no_compute_waits.boundary_micro_step {
        if let Op::Collective(c) = op
            && c.stream == CommStream::Compute
            && matches!(c.action, CommAction::Sync)
        {
            c.waits.clear();
        }
    }
    let error =
        dataflow(&no_compute_waits, &layout, &plan.model_graph, &flat, 2).expect_err("caught");
    assert!(error.contains("before its gather"), "{error}");

    let mut early_release = program.clone();
    let ops = &mut early_release.boundary_micro_step;
    let reads_params = |op: &Op| {
        op.tensors()
            .into_iter()
            .filter_map(|(t, _)| {
                (!matches!(op, Op::Collective(_)) && t.region == Region::Params).then_some(t)
            })
            .collect::<Vec<_>>()
    };
    let (release, reader) = ops
        .iter()
        .enumerate()
        .find_map(|(r, op)| {
            let Op::Collective(c) = op else { return None };
            let CommAction::Release { tensors } = &c.action else {
                return None;
            };
            let reader = (0..r).rev().find(|&i| !reads_params(&ops[i]).is_empty())?;
            reads_params(&ops[reader])
                .iter()
                .any(|read| tensors.iter().any(|t| t.overlaps(read)))
                .then_some((r, reader))
        })
        .expect("a release right after a read of a released tensor");
    let moved = ops.remove(release);
    ops.insert(reader, moved);
    let error = dataflow(&early_release, &layout, &plan.model_graph, &flat, 2).expect_err("caught");
    assert!(error.contains("Released"), "{error}");
}

/// The arena's saving for gpt2 124M bf16 at W = 8 (B = 2, T = 1024): device bytes per rank
/// with the whole model gathered (before: the arena replaced by `Ψ`, everything else equal)
/// and with the plan's arena (after), at DeepSpeed's defaults and a releasing schedule.
#[test]
fn gpt2_stage3_device_bytes_before_and_after_the_arena() {
    let model = gpt2();
    for (name, zero) in variants() {
        let plan = plan_for(&zero, model, 1024, 8);
        let layout = layout_for(&plan, model, 1024, 0);
        let after = layout.bytes_by_category().total();
        assert_eq!(after, PlanMemory::of(&plan).peak_total);
        let psi = layout.param_table().total_len() as u64;
        let arena = layout.shares.params;
        assert!(arena <= psi);
        let before = after + (psi - arena) * 2;
        eprintln!(
            "gpt2 bf16 W=8 stage 3 {name}: arena {arena} of {psi} elements; device bytes per rank {:.1} MB before, {:.1} MB after ({:.1}% less); gathered parameters {:.1} MB → {:.1} MB",
            before as f64 / 1e6,
            after as f64 / 1e6,
            100.0 * (before - after) as f64 / before as f64,
            (psi * 2) as f64 / 1e6,
            (arena * 2) as f64 / 1e6
        );
    }
}
