//! Human rendering of a 3D job: its one-line description, the per-stage memory table, the
//! busiest stage's terms, the GPU grid and the pipeline timeline.

use dsplan_planner::config::ZeroStage;
use dsplan_planner::memory::AttentionKernel;
use dsplan_planner::parallel::calculator::CalculatorReport;
use dsplan_planner::parallel::schedule::{Pass, Timeline};
use dsplan_planner::parallel::stages::{FullParallelEstimate, PeakMoment, Temporary};
use dsplan_planner::parallel::{
    Job, OptimizerSharding, PipelineSchedule, Recompute, Runtime, SequenceParallel,
};

use crate::units::gib_figure as gib;

/// The job in one line.
pub fn describe(job: &Job) -> String {
    let layout = &job.layout;
    let mut split = format!(
        "{} GPUs = tensor {} x pipeline {}",
        layout.world(),
        layout.tensor,
        layout.pipeline
    );
    if let SequenceParallel::Ulysses { degree } = layout.sequence {
        split.push_str(&format!(" x Ulysses {degree}"));
    }
    split.push_str(&format!(" x data {}", layout.data));
    let mut parts = vec![split];
    if let PipelineSchedule::Interleaved { virtual_stages } = layout.schedule {
        parts.push(format!(
            "interleaved, {virtual_stages} chunks per pipeline rank"
        ));
    } else if layout.pipeline > 1 {
        parts.push("1F1B".into());
    }
    if layout.sequence == SequenceParallel::Megatron {
        parts.push("Megatron sequence parallelism".into());
    }
    parts.push(format!(
        "seq {} x micro-batch {} x {} micro-batches per step",
        job.batch.seq_len,
        job.batch.micro_batch,
        job.micro_batches()
    ));
    parts.push(job.training.precision.name().to_owned());
    parts.push(match job.training.runtime {
        Runtime::MegatronLm {
            optimizer: OptimizerSharding::Distributed,
        } => "Megatron-LM, distributed optimizer".to_owned(),
        Runtime::MegatronLm {
            optimizer: OptimizerSharding::Replicated,
        } => "Megatron-LM".to_owned(),
        Runtime::DeepSpeed { zero, .. } => format!("DeepSpeed ZeRO-{}", zero.number()),
    });
    parts.push(match job.training.recompute {
        Recompute::None => "no recompute".to_owned(),
        Recompute::Selective => "selective recompute".to_owned(),
        Recompute::Full { layers, .. } => format!("full recompute ({layers} layer per group)"),
    });
    parts.push(
        match job.training.attention {
            AttentionKernel::Flash => "flash attention",
            AttentionKernel::Eager => "eager attention",
        }
        .to_owned(),
    );
    parts.join(", ")
}

/// Megatron's own line, with what it covers.
pub fn calculator(report: Option<&CalculatorReport>) -> String {
    match report {
        Some(report) => format!(
            "Megatron-LM's calculator (first pipeline stage; what it leaves out: README, \"3D parallelism\"):\n  {}\n",
            report.printed
        ),
        None => "Megatron-LM's calculator: not applicable (DeepSpeed-Ulysses has no Megatron-LM equivalent)\n".to_owned(),
    }
}

fn layer_ranges(ranges: &[(u64, u64)]) -> String {
    let shown: Vec<String> = ranges
        .iter()
        .take(4)
        .map(|(a, b)| {
            if b - a == 1 {
                format!("{a}")
            } else {
                format!("{a}-{}", b - 1)
            }
        })
        .collect();
    let more = if ranges.len() > 4 {
        format!(" +{} chunks", ranges.len() - 4)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(","))
}

/// The per-stage table and the busiest stage's terms.
pub fn stages(job: &Job, estimate: &FullParallelEstimate, rows: usize) -> String {
    let mut text = format!(
        "dsplan full estimate, per GPU of each pipeline stage (GiB; vocabulary padded to {}):\n",
        estimate.padded_vocab
    );
    text.push_str(&format!(
        "  {:<6} {:<22} {:>14} {:>10} {:>9} {:>11} {:>9}\n",
        "stage", "layers", "params/GPU", "in flight", "peak", "after step", "reserved"
    ));
    let count = estimate.pipeline_stages.len();
    for (i, stage) in estimate.pipeline_stages.iter().enumerate() {
        if count > rows && i >= rows / 2 && i < count - rows / 2 {
            if i == rows / 2 {
                text.push_str(&format!("  ... {} more stages\n", count - 2 * (rows / 2)));
            }
            continue;
        }
        text.push_str(&format!(
            "  {:<6} {:<22} {:>14} {:>10} {:>9} {:>11} {:>9}\n",
            stage.stage,
            layer_ranges(&stage.layers),
            dsplan_planner::model::notes::thousands(stage.params),
            stage.in_flight.total,
            gib(stage.peak_bytes),
            gib(stage.after_step_bytes),
            gib(stage.reserved_bytes)
        ));
    }
    if let Some(busiest) = estimate.pipeline_stages.get(estimate.peak_stage as usize) {
        text.push_str(&format!(
            "Stage {} peaks highest ({}; largest temporary: {}):\n",
            busiest.stage,
            match busiest.peak_moment {
                PeakMoment::Activations => "with the most micro-batches in flight",
                PeakMoment::Step => "in the optimizer step",
            },
            match busiest.temporary {
                Temporary::Logits => "the 16-bit logits next to the fp32 ones",
                Temporary::WeightGradient => "a 16-bit weight gradient",
                Temporary::LayerBackward => "a layer's backward and recomputation",
            }
        ));
        for term in &busiest.terms {
            if term.peak_bytes == 0 && term.after_step_bytes == 0 {
                continue;
            }
            text.push_str(&format!(
                "    {:<34} {:>9} peak {:>9} after step\n",
                term.term.label(),
                gib(term.peak_bytes),
                gib(term.after_step_bytes)
            ));
        }
        let zero3 = matches!(
            job.training.runtime,
            Runtime::DeepSpeed {
                zero: ZeroStage::Weights,
                ..
            }
        );
        text.push_str(&format!(
            "    reserved adds fragmentation and the CUDA context{}\n",
            if zero3 {
                "; ZeRO-3 gathers are the two largest weights"
            } else {
                ""
            }
        ));
    }
    text
}

/// The GPU grid: which global ranks form each stage and each tensor-parallel group, in
/// Megatron's `tp-cp-ep-dp-pp` order.
pub fn grid(job: &Job) -> String {
    let layout = &job.layout;
    let per_stage = layout.tensor * layout.sequence.ulysses_degree() * layout.data;
    let mut text = format!(
        "GPU grid (Megatron's order: tensor fastest, then sequence, then data, then pipeline; {} GPUs per stage):\n",
        per_stage
    );
    for stage in 0..layout.pipeline.min(8) {
        let first = stage * per_stage;
        text.push_str(&format!(
            "  stage {stage}: GPUs {first}-{}; tensor groups of {} consecutive GPUs ({first}-{}, ...); data-parallel peers every {} GPUs\n",
            first + per_stage - 1,
            layout.tensor,
            first + layout.tensor - 1,
            layout.tensor * layout.sequence.ulysses_degree()
        ));
    }
    if layout.pipeline > 8 {
        text.push_str(&format!("  ... {} more stages\n", layout.pipeline - 8));
    }
    text
}

/// The timeline as text: one row per stage, `F`/`B` ticks (digits: micro-batch mod 10), `.`
/// idle.
pub fn timeline(line: &Timeline, width: u64) -> String {
    let mut text = format!(
        "Pipeline timeline: {} ticks per step; a forward of one chunk takes 1 tick, its backward 2 (3 ticks per micro-batch and chunk); bubble {:.1} % of the step\n",
        line.makespan,
        line.bubble_fraction * 100.0
    );
    if line.makespan > width {
        text.push_str(&format!(
            "  (the step is {} ticks long; rows are drawn up to {width})\n",
            line.makespan
        ));
        return text;
    }
    text.push_str("  forward ticks show the micro-batch (mod 10), backward ticks `b`, idle `.`\n");
    for (rank, ops) in line.ranks.iter().enumerate() {
        let mut row = vec!['.'; line.makespan as usize];
        for op in ops {
            for tick in op.start..op.end {
                row[tick as usize] = match op.pass {
                    Pass::Forward => {
                        char::from_digit((op.micro_batch % 10) as u32, 10).unwrap_or('F')
                    }
                    Pass::Backward => 'b',
                };
            }
        }
        text.push_str(&format!(
            "  stage {rank:<3}|{}|\n",
            row.into_iter().collect::<String>()
        ));
    }
    text
}
