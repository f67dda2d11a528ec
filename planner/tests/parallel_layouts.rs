//! 3D layouts: Megatron-LM's refusals name the flag, the pipeline schedule holds what the
//! timeline says, activations follow Korthikanti et al., launch flags read back to the same
//! job, and the layout search returns a fitting, fastest layout.

use dsplan_planner::estimate::full::Margins;
use dsplan_planner::memory::{AttentionKernel, Precision};
use dsplan_planner::parallel::activations::layer_activations;
use dsplan_planner::parallel::schedule::{Pass, bubble_fraction, in_flight, timeline};
use dsplan_planner::parallel::search::{SearchRequest, search};
use dsplan_planner::parallel::{
    Dropout, DropoutUse, Layout, PipelineSchedule, Recompute, SequenceParallel, launch,
    megatron_args, stages,
};
use dsplan_planner::recommend::CostModel;

const LLAMA_7B: &str = "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --vocab-size 32000 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --hidden-dropout 0 --attention-dropout 0";

fn refusal(args: &str, world: u64) -> String {
    match megatron_args::parse(args, world) {
        Ok(_) => panic!("accepted: {args}"),
        Err(errors) => errors.to_string(),
    }
}

#[test]
fn refusals_name_the_flag_and_the_fix() {
    let cases: [(String, u64, &str, &str); 8] = [
        (
            format!("{LLAMA_7B} --tensor-model-parallel-size 3"),
            24,
            "--tensor-model-parallel-size",
            "32 attention heads",
        ),
        (
            format!("{LLAMA_7B} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4"),
            12,
            "--gpus",
            "t × p × d",
        ),
        (
            format!("{LLAMA_7B} --make-vocab-size-divisible-by 0"),
            8,
            "--make-vocab-size-divisible-by",
            "cannot be padded",
        ),
        (
            format!("{LLAMA_7B} --sequence-parallel"),
            8,
            "--sequence-parallel",
            "tensor-parallel",
        ),
        (
            format!("{LLAMA_7B} --pipeline-model-parallel-size 3"),
            6,
            "--pipeline-model-parallel-size",
            "32 layers",
        ),
        (
            format!(
                "{LLAMA_7B} --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 --global-batch-size 16"
            ),
            32,
            "--global-batch-size",
            "groups",
        ),
        (
            format!("{LLAMA_7B} --pipeline-model-parallel-size 2 --zero-stage 2"),
            8,
            "--zero-stage",
            "pipeline",
        ),
        (
            format!("{LLAMA_7B} --global-batch-size 63"),
            8,
            "--global-batch-size",
            "not a multiple",
        ),
    ];
    for (args, world, flag, words) in cases {
        let error = refusal(&args, world);
        assert!(error.starts_with(flag), "{flag}: {error}");
        assert!(error.contains(words), "{words}: {error}");
    }
    let error = refusal(&format!("{LLAMA_7B} --num-experts 8"), 8);
    assert!(
        error.contains("--num-experts") && error.contains("not modelled"),
        "{error}"
    );
}

#[test]
fn unknown_flags_are_warnings() {
    let parsed = megatron_args::parse(
        &format!("{LLAMA_7B} --lr 3e-4 --my-flag 7 --other-switch"),
        8,
    )
    .expect("accepted");
    assert_eq!(parsed.warnings.len(), 2, "{:?}", parsed.warnings);
    assert!(parsed.warnings[0].contains("--my-flag") && parsed.warnings[0].contains("`7`"));
}

fn layout(p: u64, schedule: PipelineSchedule) -> Layout {
    Layout {
        tensor: 1,
        pipeline: p,
        schedule,
        sequence: SequenceParallel::Off,
        data: 1,
    }
}

#[test]
fn the_timeline_holds_what_in_flight_says_and_its_bubble() {
    for (p, m, schedule) in [
        (4, 8, PipelineSchedule::OneForwardOneBackward),
        (4, 2, PipelineSchedule::OneForwardOneBackward),
        (8, 16, PipelineSchedule::OneForwardOneBackward),
        (4, 8, PipelineSchedule::Interleaved { virtual_stages: 2 }),
        (4, 4, PipelineSchedule::Interleaved { virtual_stages: 8 }),
    ] {
        let layout = layout(p, schedule);
        let line = timeline(&layout, m, 1 << 20).expect("a timeline");
        for (rank, ops) in line.ranks.iter().enumerate() {
            assert_eq!(ops.len() as u64, 2 * m * schedule.chunks());
            let mut held: i64 = 0;
            let mut most = 0;
            for op in ops {
                held += if op.pass == Pass::Forward { 1 } else { -1 };
                most = most.max(held);
            }
            assert_eq!(
                most as u64,
                in_flight(&layout, m, rank as u64).total,
                "p{p} m{m} {schedule:?} rank {rank}"
            );
        }
        if schedule == PipelineSchedule::OneForwardOneBackward {
            assert!(
                (line.bubble_fraction - bubble_fraction(&layout, m)).abs() < 1e-12,
                "{p} {m}"
            );
        } else {
            let flat = timeline(
                &self::layout(p, PipelineSchedule::OneForwardOneBackward),
                m,
                1 << 20,
            )
            .expect("1F1B");
            assert!(line.bubble_fraction < flat.bubble_fraction);
        }
    }
}

#[test]
fn activations_follow_korthikanti_table_2() {
    // GPT-3 175B style, eager attention with dropout: s·b·h·(34 + 5·a·s/h) per layer at t = 1,
    // s·b·h·(10 + 24/t + 5·a·s/(h·t)) at t = 8, s·b·h·(34/t + 5·a·s/(h·t)) with SP; dsplan also
    // counts the layer norms' fp32 statistics (16 bytes per token per layer).
    let args = "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --micro-batch-size 1 --tokenizer-type GPT2BPETokenizer --attention-backend unfused --bf16";
    let (s, b, h, a) = (2048.0, 1.0, 12288.0, 96.0);
    for (extra, t, sp) in [
        ("", 1.0, false),
        (" --tensor-model-parallel-size 8", 8.0, false),
        (
            " --tensor-model-parallel-size 8 --sequence-parallel",
            8.0,
            true,
        ),
    ] {
        let job = megatron_args::parse(&format!("{args}{extra}"), t as u64)
            .expect("accepted")
            .job;
        let ours = layer_activations(&job).full as f64;
        let paper = if sp {
            s * b * h * (34.0 / t + 5.0 * a * s / (h * t))
        } else {
            s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))
        };
        let stats = 16.0 * s * b / if sp { t } else { 1.0 };
        assert!(
            (ours - paper - stats).abs() < 1.0,
            "t{t} sp{sp}: {ours} vs {paper} + {stats}"
        );
    }
}

#[test]
fn recomputation_and_sequence_parallelism_shrink_every_stage() {
    let base = format!(
        "{LLAMA_7B} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --use-distributed-optimizer"
    );
    let peak = |extra: &str| -> Vec<u64> {
        let job = megatron_args::parse(&format!("{base} {extra}"), 16)
            .expect("accepted")
            .job;
        stages::estimate(&job, &Margins::default())
            .expect("estimate")
            .pipeline_stages
            .iter()
            .map(|s| s.peak_bytes)
            .collect()
    };
    let none = peak("");
    let sp = peak("--sequence-parallel");
    let full =
        peak("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
    let interleaved = peak("--num-layers-per-virtual-pipeline-stage 2");
    for stage in 0..4 {
        assert!(
            sp[stage] < none[stage] && full[stage] < none[stage],
            "stage {stage}"
        );
    }
    assert!(
        interleaved[0] > none[0],
        "interleaving holds more on the first stage"
    );
    assert!(
        none[0] > none[1] && none[1] > none[2],
        "earlier stages hold more micro-batches"
    );
}

#[test]
fn launch_flags_read_back_to_the_same_job() {
    let job = megatron_args::parse(&format!("{LLAMA_7B} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 --sequence-parallel --recompute-granularity selective --zero-stage 1"), 16)
        .expect("accepted")
        .job;
    let flags = launch::megatron_flags(&job);
    let back = megatron_args::parse(&flags, 16).expect("read back").job;
    assert_eq!(
        (back.shape, back.layout, back.batch, back.training),
        (job.shape, job.layout, job.batch, job.training),
        "{flags}"
    );
    let config = launch::ds_config(&job);
    assert_eq!(config["pipeline"]["stages"], 4);
    assert_eq!(config["tensor_parallel"]["autotp_size"], 2);
    assert_eq!(config["gradient_accumulation_steps"], 32);
}

fn llama_70b_request(gpus: u64, gpu_memory: u64) -> SearchRequest {
    let shape = megatron_args::parse("--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --group-query-attention --num-query-groups 8 --ffn-hidden-size 28672 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --vocab-size 128256 --seq-length 4096 --micro-batch-size 1 --bf16", 1)
        .expect("accepted")
        .job
        .shape;
    SearchRequest {
        shape,
        gpus,
        gpus_per_node: 8,
        gpu_memory,
        seq_len: 4096,
        global_batch: 1024,
        precision: Precision::Bf16,
        attention: AttentionKernel::Flash,
        dropout: Dropout {
            hidden: DropoutUse::Skipped,
            attention: DropoutUse::Skipped,
        },
        cost: CostModel::default(),
        margins: Margins::default(),
    }
}

#[test]
fn the_search_returns_the_fastest_fitting_layout() {
    let request = llama_70b_request(64, 80 << 30);
    let outcome = search(&request);
    let best = outcome.best.expect("a 70B fits on 64 GPUs of 80 GiB");
    assert!(outcome.examined > 1000, "{}", outcome.examined);
    assert!(best.reserved_bytes <= request.gpu_memory);
    assert!(
        best.job.layout.tensor * best.job.layout.pipeline > 1,
        "70B needs model parallelism"
    );
    for other in &outcome.runners_up {
        assert!(other.step.total >= best.step.total && other.reserved_bytes <= request.gpu_memory);
    }
    let nothing = search(&llama_70b_request(8, 16 << 30));
    assert!(nothing.best.is_none() && nothing.closest.is_some());
}

#[test]
fn recompute_modes_are_what_the_flags_say() {
    let job = megatron_args::parse(&format!("{LLAMA_7B} --recompute-activations"), 8)
        .expect("accepted")
        .job;
    assert_eq!(job.training.recompute, Recompute::Selective);
    let error = refusal(&format!("{LLAMA_7B} --recompute-granularity full"), 8);
    assert!(error.starts_with("--recompute-method"), "{error}");
}
