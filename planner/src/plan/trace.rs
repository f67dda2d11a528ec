//! Chrome trace-event JSON of one step ([`chrome_trace`]): opens in Perfetto (ui.perfetto.dev)
//! and chrome://tracing. One process (a rank: every rank runs the same plan), one thread row per
//! stream, one complete event (`"ph": "X"`) per op with its bytes and FLOPs, and a counter of
//! the rank's planned GPU memory at each compute op of the boundary micro-step.

use serde_json::{Value, json};

use super::Plan;
use super::dtype::Device;
use super::graph::{OpGraph, OpKind, Stream};

/// The trace of `plan`'s step (process metadata only for a memory-only plan, which has no
/// ops).
pub fn chrome_trace(plan: &Plan) -> Value {
    let empty = OpGraph::default();
    let graph = plan.graph.as_ref().unwrap_or(&empty);
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0, "tid": 0,
        "args": {"name": format!("rank 0 of {} ({})", plan.cluster.world_size, plan.model.name)},
    })];
    for (index, stream) in Stream::ALL.iter().enumerate() {
        if !graph.ops.iter().any(|op| op.stream == *stream) {
            continue;
        }
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": index,
            "args": {"name": stream.as_str()},
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": index,
            "args": {"sort_index": index},
        }));
    }
    let critical: std::collections::HashSet<usize> = graph.critical_path.iter().copied().collect();
    for op in &graph.ops {
        let tid = Stream::ALL
            .iter()
            .position(|s| *s == op.stream)
            .unwrap_or(0);
        let category = match op.kind {
            OpKind::Forward | OpKind::Backward => "compute",
            OpKind::OptimizerStep => "optimizer",
            OpKind::Communication { .. } => "communication",
            OpKind::Copy | OpKind::Swap => "copy",
        };
        events.push(json!({
            "name": op.name, "cat": category, "ph": "X", "pid": 0, "tid": tid,
            "ts": op.start_us, "dur": op.duration_us,
            "args": {
                "id": op.id, "micro_step": op.micro_step, "bytes": op.bytes, "flops": op.flops,
                "critical_path": critical.contains(&op.id),
            },
        }));
    }
    if let Some(gpu) = plan.timeline.device(Device::Gpu) {
        let boundary = plan.settings.batch.gradient_accumulation_steps - 1;
        let units = plan.ticks.units;
        let computes = graph.ops.iter().filter(|op| {
            op.micro_step == boundary && matches!(op.kind, OpKind::Forward | OpKind::Backward)
        });
        for (step, op) in computes.enumerate().take(2 * units) {
            events.push(json!({
                "name": "planned GPU memory", "ph": "C", "pid": 0, "tid": 0, "ts": op.start_us,
                "args": {"GiB": gpu.live_bytes[step] as f64 / f64::from(1u32 << 30)},
            }));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "dsplan plan --format trace",
            "model": plan.model.name,
            "zero_stage": plan.settings.stage.number(),
            "world_size": plan.cluster.world_size,
            "predicted_step_seconds": graph.step.step_seconds,
        },
    })
}
