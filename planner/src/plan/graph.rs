//! [`OpGraph`]: one optimizer step as a graph of compute, communication and copy ops on their
//! streams (petgraph), scheduled as early as dependencies and stream order allow; the critical
//! path, the step time and how much communication hides behind compute.
//!
//! Streams are FIFO: an op starts after the previous op of its stream and after every op it
//! depends on. Dependencies: a module's forward/backward on the gathers of its tensors (stage
//! 3); a gather issued at trace step s on the compute of step s − 2 (the host runs about one
//! module ahead of the GPU); a gradient bucket on the backward that launches it; the optimizer
//! on every reduction; the parameter all-gather on the optimizer. With more than
//! [`DETAILED_MICRO_STEPS`] micro-steps, the first and the last (boundary) are modelled and
//! the others are taken to last as long as the first.

use petgraph::Direction;
use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;

use super::buckets::{Buckets, Collective, FlushPoint};
use super::cluster::Cluster;
use super::cost::{self, Cost};
use super::dtype::Device;
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::settings::{Overlap, ReduceTiming, Settings};
use super::shards::Shards;
use super::stage3::{FetchCollective, Pass, Stage3Schedule, trace_step};
use crate::config::ZeroStage;

/// Micro-steps modelled op by op; beyond this, two are modelled and the rest extrapolated.
pub const DETAILED_MICRO_STEPS: u64 = 8;

/// Where an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stream {
    /// The default CUDA stream: forward, backward, GPU optimizer (and serialized reductions).
    Compute,
    /// Stage 3's all-gather stream (and the stage-1/2 parameter all-gather).
    ParamGather,
    /// The reduction stream (`overlap_comm`).
    GradReduce,
    /// Host → device copies.
    HostToDevice,
    /// Device → host copies.
    DeviceToHost,
    /// The host's CPU (DeepSpeedCPUAdam).
    Host,
    /// NVMe reads and writes.
    Nvme,
}

impl Stream {
    /// Every stream, in trace row order.
    pub const ALL: [Stream; 7] = [
        Stream::Compute,
        Stream::ParamGather,
        Stream::GradReduce,
        Stream::HostToDevice,
        Stream::DeviceToHost,
        Stream::Host,
        Stream::Nvme,
    ];

    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::ParamGather => "param all-gather",
            Stream::GradReduce => "gradient reduce",
            Stream::HostToDevice => "host to device",
            Stream::DeviceToHost => "device to host",
            Stream::Host => "host CPU",
            Stream::Nvme => "NVMe",
        }
    }
}

/// What an op does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum OpKind {
    /// A module's forward.
    Forward,
    /// A module's backward.
    Backward,
    /// An optimizer step (GPU or host).
    OptimizerStep,
    /// A collective.
    Communication {
        /// Which.
        collective: Collective,
    },
    /// A host↔device copy.
    Copy,
    /// An NVMe read or write.
    Swap,
}

/// One op, scheduled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    /// Index.
    pub id: usize,
    /// Name.
    pub name: String,
    /// What it does.
    #[serde(flatten)]
    pub kind: OpKind,
    /// Where.
    pub stream: Stream,
    /// Micro-step (0-based).
    pub micro_step: u64,
    /// Start, microseconds from the step's start.
    pub start_us: f64,
    /// Duration, microseconds.
    pub duration_us: f64,
    /// Bytes moved (communication and copies).
    pub bytes: u64,
    /// FLOPs (compute).
    pub flops: f64,
}

impl Op {
    /// End, microseconds.
    pub fn end_us(&self) -> f64 {
        self.start_us + self.duration_us
    }
}

/// The step's time and its communication overlap.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct StepTime {
    /// Predicted optimizer-step time, seconds.
    pub step_seconds: f64,
    /// Time the GPU computes (forward, backward, GPU optimizer), seconds.
    pub compute_seconds: f64,
    /// Time some collective is running, seconds.
    pub communication_seconds: f64,
    /// Of which overlapped by compute, seconds.
    pub communication_hidden_seconds: f64,
    /// Of which not overlapped (the step waits or the stream is idle), seconds.
    pub communication_exposed_seconds: f64,
    /// Hidden / total communication time (1 when there is none).
    pub hidden_fraction: f64,
    /// Host↔device and NVMe copy time (sum of durations), seconds.
    pub copy_seconds: f64,
    /// Micro-steps modelled op by op.
    pub micro_steps_modelled: u64,
    /// Micro-steps added by extrapolation.
    pub micro_steps_extrapolated: u64,
    /// Tokens per second over all ranks.
    pub tokens_per_second: f64,
}

/// The step's ops.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct OpGraph {
    /// Every op, in issue order.
    pub ops: Vec<Op>,
    /// Data dependencies `[from, to]` (stream order not listed).
    pub edges: Vec<[usize; 2]>,
    /// Ops on the critical path, first to last.
    pub critical_path: Vec<usize>,
    /// Timing summary.
    pub step: StepTime,
}

/// Everything the graph is built from.
pub struct GraphInputs<'a> {
    /// Model.
    pub model: &'a ModelGraph,
    /// Settings.
    pub settings: &'a Settings,
    /// Cluster.
    pub cluster: &'a Cluster,
    /// Layout.
    pub layout: &'a Layout,
    /// Shards.
    pub shards: &'a Shards,
    /// Buckets.
    pub buckets: &'a Buckets,
    /// Stage 3 schedule.
    pub stage3: Option<&'a Stage3Schedule>,
}

struct Pending {
    name: String,
    kind: OpKind,
    stream: Stream,
    micro_step: u64,
    cost: Cost,
    bytes: u64,
    deps: Vec<usize>,
}

struct Builder<'a> {
    inputs: &'a GraphInputs<'a>,
    ops: Vec<Pending>,
    computes: Vec<usize>,
}

impl Builder<'_> {
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per field of the op"
    )]
    fn push(
        &mut self,
        name: String,
        kind: OpKind,
        stream: Stream,
        micro_step: u64,
        cost: Cost,
        bytes: u64,
        deps: Vec<usize>,
    ) -> usize {
        self.ops.push(Pending {
            name,
            kind,
            stream,
            micro_step,
            cost,
            bytes,
            deps,
        });
        let id = self.ops.len() - 1;
        if stream == Stream::Compute {
            self.computes.push(id);
        }
        id
    }

    fn communicate(
        &mut self,
        name: String,
        collective: Collective,
        stream: Stream,
        micro: u64,
        bytes: u64,
        deps: Vec<usize>,
    ) -> usize {
        let cost = cost::collective(self.inputs.cluster, collective, bytes);
        self.push(
            name,
            OpKind::Communication { collective },
            stream,
            micro,
            cost,
            bytes,
            deps,
        )
    }

    fn copy(
        &mut self,
        name: String,
        stream: Stream,
        micro: u64,
        bytes: u64,
        deps: Vec<usize>,
    ) -> usize {
        let cost = cost::host_copy(self.inputs.cluster, bytes);
        self.push(name, OpKind::Copy, stream, micro, cost, bytes, deps)
    }

    fn swap(&mut self, name: String, micro: u64, bytes: u64, deps: Vec<usize>) -> usize {
        let cost = cost::nvme(self.inputs.cluster, bytes);
        self.push(name, OpKind::Swap, Stream::Nvme, micro, cost, bytes, deps)
    }

    /// One micro-step; returns the reductions the optimizer must wait for.
    fn micro_step(&mut self, micro: u64, reduces: bool) -> Vec<usize> {
        let GraphInputs {
            model,
            settings,
            cluster,
            buckets,
            stage3,
            ..
        } = *self.inputs;
        let units = model.units.len();
        let world = settings.world_size;
        let params = settings.dtypes.params;
        let attention_width = model.architecture.attention_width();
        let mut gathered_by: Vec<Option<usize>> = vec![None; model.tensors.len()];
        let mut last_compute = None;
        let mut waits = Vec::new();
        let reduce_stream = match settings.overlap {
            Overlap::Overlapped => Stream::GradReduce,
            Overlap::Serialized => Stream::Compute,
        };
        for step in 0..2 * units {
            let (unit_index, pass) = trace_step(units, step);
            let unit = &model.units[unit_index];
            if let Some(schedule) = stage3 {
                let record = &schedule.steps[step];
                let host = self.computes.len().checked_sub(2).map(|i| self.computes[i]);
                let fetch = match schedule.collective {
                    FetchCollective::AllGather => Collective::AllGather,
                    FetchCollective::AllReduce => Collective::AllReduce,
                };
                for (label, batch) in [("fetch", &record.on_demand), ("prefetch", &record.prefetch)]
                {
                    if batch.is_empty() {
                        continue;
                    }
                    let partition: u64 = batch
                        .iter()
                        .map(|&t| model.tensors[t].numel.div_ceil(world))
                        .sum();
                    let mut deps: Vec<usize> = host.into_iter().collect();
                    if settings.offload_param.is_offloaded() {
                        let name = format!("{label} partitions to GPU ({})", unit.module);
                        deps.push(self.copy(
                            name,
                            Stream::HostToDevice,
                            micro,
                            partition * params.bytes(),
                            deps.clone(),
                        ));
                    }
                    let name = format!("{label} {} tensors at {}", batch.len(), unit.module);
                    let id = self.communicate(
                        name,
                        fetch,
                        Stream::ParamGather,
                        micro,
                        partition * world * params.bytes(),
                        deps,
                    );
                    for &t in batch.iter() {
                        gathered_by[t] = Some(id);
                    }
                }
            }
            let deps: Vec<usize> = unit
                .tensors
                .iter()
                .filter_map(|&t| gathered_by[t])
                .collect();
            let (kind, verb, flops) = match pass {
                Pass::Forward => (
                    OpKind::Forward,
                    "fwd",
                    cost::forward_flops(unit, settings, attention_width),
                ),
                Pass::Backward => (
                    OpKind::Backward,
                    "bwd",
                    cost::backward_flops(unit, settings, attention_width),
                ),
            };
            let cost = cost::compute(cluster, params, flops);
            let id = self.push(
                format!("{verb} {}", unit.module),
                kind,
                Stream::Compute,
                micro,
                cost,
                0,
                deps,
            );
            last_compute = Some(id);
            if reduces && pass == Pass::Backward {
                for bucket in buckets
                    .reduce
                    .iter()
                    .filter(|b| b.flush == FlushPoint::BackwardStep { step })
                {
                    waits.extend(self.reduce(bucket.index, reduce_stream, micro, vec![id]));
                }
            }
        }
        if reduces {
            let last = last_compute;
            for bucket in buckets
                .reduce
                .iter()
                .filter(|b| b.flush == FlushPoint::Epilogue)
            {
                waits.extend(self.reduce(
                    bucket.index,
                    reduce_stream,
                    micro,
                    last.into_iter().collect(),
                ));
            }
        }
        waits.extend(last_compute);
        waits
    }

    /// A bucket's reduction (and, stage 3 with optimizer offload, its copy to the host).
    fn reduce(&mut self, index: usize, stream: Stream, micro: u64, deps: Vec<usize>) -> Vec<usize> {
        let GraphInputs {
            settings,
            buckets,
            shards,
            ..
        } = *self.inputs;
        let bucket = &buckets.reduce[index];
        let name = format!("reduce bucket {index} ({} tensors)", bucket.tensors.len());
        let id = self.communicate(name, bucket.collective, stream, micro, bucket.bytes, deps);
        let host_grads = settings.stage == ZeroStage::Weights
            && shards.sub_groups.iter().any(|g| g.device != Device::Gpu);
        if host_grads {
            let bytes = bucket.bytes / settings.dtypes.communication.bytes() / settings.world_size
                * settings.dtypes.grad_accum.bytes();
            let copy = self.copy(
                format!("bucket {index} partition to host"),
                Stream::DeviceToHost,
                micro,
                bytes,
                vec![id],
            );
            return vec![id, copy];
        }
        vec![id]
    }

    /// The optimizer step and what follows it.
    fn optimizer(&mut self, micro: u64, waits: Vec<usize>) {
        let GraphInputs {
            settings,
            cluster,
            layout,
            shards,
            buckets,
            stage3,
            ..
        } = *self.inputs;
        let world = settings.world_size;
        let params = settings.dtypes.params;
        let mut after = Vec::new();
        let mut previous = waits.clone();
        for group in &shards.sub_groups {
            let elements = group.partition_numel;
            let name = format!("optimizer sub-group {}", group.index);
            let last = match group.device {
                Device::Gpu => {
                    let cost = cost::gpu_optimizer(cluster, settings, elements);
                    self.push(
                        name,
                        OpKind::OptimizerStep,
                        Stream::Compute,
                        micro,
                        cost,
                        0,
                        previous.clone(),
                    )
                }
                device => {
                    let mut deps = previous.clone();
                    if stage3.is_none() {
                        deps = vec![self.copy(
                            "fp32 gradient partition to host".into(),
                            Stream::DeviceToHost,
                            micro,
                            elements * 4,
                            deps,
                        )];
                    }
                    let state_bytes = elements
                        * (settings.dtypes.master.bytes()
                            + settings.optimizer.states * settings.dtypes.optimizer_states.bytes());
                    if device == Device::Nvme {
                        deps = vec![self.swap(
                            format!("swap in sub-group {}", group.index),
                            micro,
                            state_bytes,
                            deps,
                        )];
                    }
                    let cost = cost::cpu_optimizer(cluster, elements);
                    let mut last = self.push(
                        name,
                        OpKind::OptimizerStep,
                        Stream::Host,
                        micro,
                        cost,
                        0,
                        deps,
                    );
                    if device == Device::Nvme {
                        self.swap(
                            format!("swap out sub-group {}", group.index),
                            micro,
                            state_bytes,
                            vec![last],
                        );
                    }
                    if !settings.offload_param.is_offloaded() {
                        last = self.copy(
                            format!("sub-group {} parameters to GPU", group.index),
                            Stream::HostToDevice,
                            micro,
                            elements * params.bytes(),
                            vec![last],
                        );
                    }
                    last
                }
            };
            previous = vec![last];
            after.push(last);
        }
        if let Some(gather) = &buckets.param_gather {
            for (index, shard) in gather.shards.iter().enumerate() {
                let bytes = shard.len() * world * layout.dtype.bytes();
                self.communicate(
                    format!("parameter all-gather {index}"),
                    Collective::AllGather,
                    Stream::ParamGather,
                    micro,
                    bytes,
                    after.clone(),
                );
            }
        }
        if let (Some(_), Some(persistent)) = (stage3, &shards.persistent) {
            let partitions: u64 = persistent
                .entries
                .iter()
                .map(|&e| layout.entries[e].partition_numel)
                .sum();
            if partitions > 0 && world > 1 {
                self.communicate(
                    "re-gather persistent parameters".into(),
                    Collective::AllGather,
                    Stream::ParamGather,
                    micro,
                    partitions * world * params.bytes(),
                    after,
                );
            }
        }
    }
}

/// Builds and schedules the step.
pub fn op_graph(inputs: &GraphInputs<'_>) -> OpGraph {
    let settings = inputs.settings;
    let gas = settings.batch.gradient_accumulation_steps;
    let modelled: Vec<u64> = if gas <= DETAILED_MICRO_STEPS {
        (0..gas).collect()
    } else {
        vec![0, gas - 1]
    };
    let mut builder = Builder {
        inputs,
        ops: Vec::new(),
        computes: Vec::new(),
    };
    let mut waits = Vec::new();
    for &micro in &modelled {
        let boundary = micro + 1 == gas;
        let reduces = boundary || settings.reduce_timing == ReduceTiming::EveryMicroStep;
        let done = builder.micro_step(micro, reduces);
        if boundary {
            waits = done;
        }
    }
    builder.optimizer(gas - 1, waits);
    let (ops, edges, critical_path) = schedule(builder.ops);
    let step = step_time(&ops, settings, &modelled, gas);
    OpGraph {
        ops,
        edges,
        critical_path,
        step,
    }
}

/// Earliest start for every op; the critical path ends at the last op to finish.
fn schedule(pending: Vec<Pending>) -> (Vec<Op>, Vec<[usize; 2]>, Vec<usize>) {
    let mut graph: DiGraph<usize, ()> = DiGraph::with_capacity(pending.len(), pending.len() * 2);
    let nodes: Vec<NodeIndex> = (0..pending.len()).map(|i| graph.add_node(i)).collect();
    let mut edges = Vec::new();
    let mut last_on_stream: Vec<(Stream, usize)> = Vec::new();
    for (id, op) in pending.iter().enumerate() {
        let mut deps = op.deps.clone();
        deps.sort_unstable();
        deps.dedup();
        for &dep in &deps {
            graph.add_edge(nodes[dep], nodes[id], ());
            edges.push([dep, id]);
        }
        match last_on_stream.iter_mut().find(|(s, _)| *s == op.stream) {
            Some((_, last)) => {
                if !deps.contains(last) {
                    graph.add_edge(nodes[*last], nodes[id], ());
                }
                *last = id;
            }
            None => last_on_stream.push((op.stream, id)),
        }
    }
    let order = toposort(&graph, None).unwrap_or_else(|_| nodes.clone());
    let mut start = vec![0.0f64; pending.len()];
    let mut end = vec![0.0f64; pending.len()];
    let mut via: Vec<Option<usize>> = vec![None; pending.len()];
    for node in order {
        let id = graph[node];
        for pred in graph.neighbors_directed(node, Direction::Incoming) {
            let p = graph[pred];
            if end[p] > start[id] || via[id].is_none() && end[p] >= start[id] {
                start[id] = end[p];
                via[id] = Some(p);
            }
        }
        end[id] = start[id] + pending[id].cost.seconds;
    }
    let mut critical = Vec::new();
    let mut cursor = (0..pending.len()).max_by(|&a, &b| end[a].total_cmp(&end[b]).then(b.cmp(&a)));
    while let Some(id) = cursor {
        critical.push(id);
        cursor = via[id];
    }
    critical.reverse();
    let round = |seconds: f64| (seconds * 1e9).round() / 1e3;
    let ops = pending
        .into_iter()
        .enumerate()
        .map(|(id, p)| Op {
            id,
            name: p.name,
            kind: p.kind,
            stream: p.stream,
            micro_step: p.micro_step,
            start_us: round(start[id]),
            duration_us: round(end[id]) - round(start[id]),
            bytes: p.bytes,
            flops: p.cost.flops,
        })
        .collect();
    (ops, edges, critical)
}

/// Total length of the union of intervals.
fn union_length(mut intervals: Vec<(f64, f64)>) -> f64 {
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for (s, e) in intervals {
        match &mut current {
            Some((_, ce)) if s <= *ce => *ce = ce.max(e),
            _ => {
                if let Some((cs, ce)) = current {
                    total += ce - cs;
                }
                current = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

/// Communication, compute and their overlap over some ops, in seconds.
fn overlap<'a>(ops: impl Iterator<Item = &'a Op> + Clone) -> (f64, f64, f64, f64) {
    let span = |op: &Op| (op.start_us / 1e6, op.end_us() / 1e6);
    let is_comm =
        |op: &&Op| matches!(op.kind, OpKind::Communication { .. }) && op.duration_us > 0.0;
    let is_compute = |op: &&Op| {
        matches!(
            op.kind,
            OpKind::Forward | OpKind::Backward | OpKind::OptimizerStep
        ) && op.stream == Stream::Compute
    };
    let compute: Vec<(f64, f64)> = ops.clone().filter(is_compute).map(span).collect();
    let comm: Vec<(f64, f64)> = ops.clone().filter(is_comm).map(span).collect();
    let copies: f64 = ops
        .clone()
        .filter(|o| matches!(o.kind, OpKind::Copy | OpKind::Swap))
        .fold(0.0, |total, o| total + o.duration_us / 1e6);
    let compute_total = union_length(compute.clone());
    let comm_total = union_length(comm.clone());
    let both = compute_total + comm_total - union_length([compute, comm].concat());
    (compute_total, comm_total, both, copies)
}

fn step_time(ops: &[Op], settings: &Settings, modelled: &[u64], gas: u64) -> StepTime {
    let makespan = ops.iter().map(|o| o.end_us()).fold(0.0, f64::max) / 1e6;
    let (mut compute, mut comm, mut hidden, mut copies) = overlap(ops.iter());
    let extrapolated = gas - modelled.len() as u64;
    let mut step_seconds = makespan;
    if extrapolated > 0 {
        let first_compute = |micro: u64| {
            ops.iter()
                .find(|o| o.micro_step == micro && o.stream == Stream::Compute)
                .map_or(0.0, |o| o.start_us / 1e6)
        };
        let span = first_compute(gas - 1) - first_compute(0);
        let first = overlap(ops.iter().filter(|o| o.micro_step == 0));
        let extra = extrapolated as f64;
        step_seconds += extra * span;
        compute += extra * first.0;
        comm += extra * first.1;
        hidden += extra * first.2;
        copies += extra * first.3;
    }
    let tokens = (settings.batch.train_batch_size * settings.batch.sequence_length) as f64;
    StepTime {
        step_seconds,
        compute_seconds: compute,
        communication_seconds: comm,
        communication_hidden_seconds: hidden,
        communication_exposed_seconds: (comm - hidden).max(0.0),
        hidden_fraction: if comm > 0.0 { hidden / comm } else { 1.0 },
        copy_seconds: copies,
        micro_steps_modelled: modelled.len() as u64,
        micro_steps_extrapolated: extrapolated,
        tokens_per_second: if step_seconds > 0.0 {
            tokens / step_seconds
        } else {
            0.0
        },
    }
}
