//! Gradient buckets whose tensors do not arrive in reverse flat order, on the CPU backend.
//!
//! A Llama layer stores its norms after its projections, but its backward produces the
//! post-attention norm's gradient between the MLP's and the attention's, so with buckets cut
//! inside a layer (a small `reduce_bucket_size`) the tensors of several buckets arrive
//! interleaved when a layer's gradients are handed over. Stages 2 and 3 fill one bucket
//! buffer per rank; they must fill it one bucket at a time, else a bucket is reduced with
//! another's values in it (the post-attention norms then stepped the wrong way). Every stage
//! and bucket size computes the same averaged gradients, so the final parameters equal the
//! stage-1 run with one bucket: bit for bit at stage 1, within float reordering at stages 2-3
//! (they average each micro-step, stage 1 the accumulated sum). Without the fix the norms are
//! off by 4e-3.

use dsplan_executor::cuda::check::step::{SmallLlama, small_llama_spec};
use dsplan_executor::data::WindowOrder;
use dsplan_executor::train::{DataChoice, TrainSettings, TrainSpec, train};
use serde_json::json;

fn final_params(which: SmallLlama, stage: u8, bucket: u64) -> Vec<f32> {
    let llama = small_llama_spec(which, &json!({}), 2).expect("the small model");
    let config = json!({
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-6, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket},
    });
    let spec = TrainSpec {
        settings: TrainSettings::from_config(&config, 2).expect("settings"),
        model: llama.model,
        initial_params: llama.initial_params,
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 7 },
        },
        seq_len: 64,
        steps: 2,
        world: 2,
    };
    train(&spec, &|_| {}).expect("the CPU run").final_params
}

fn largest_difference(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max)
}

#[test]
fn small_buckets_cut_inside_llama_layers_give_the_one_bucket_result() {
    for which in [SmallLlama::Llama, SmallLlama::Qwen2] {
        let one_bucket = final_params(which, 1, 1_000_000);
        for (stage, limit) in [(1u8, 0.0), (2, 1e-6), (3, 1e-6)] {
            let small = final_params(which, stage, 20_000);
            let difference = largest_difference(&one_bucket, &small);
            eprintln!(
                "{which:?} stage {stage}, buckets of 20,000: {difference:.3e} from one bucket"
            );
            assert!(
                difference <= limit,
                "{which:?} stage {stage}: {difference:e} > {limit:e}"
            );
        }
    }
}
