//! Throughput of one forward + backward of the real 124M `gpt2` shape (random init) at
//! B=4, T=64. Ignored by default (about a gigabyte of memory and seconds of CPU); run with
//! `cargo test -p dsplan-executor --test gpt2_timing -- --ignored --nocapture`.

use std::time::Instant;

use dsplan_executor::model::{
    BatchShape, Gpt2, Gpt2Config, ParamLayout, init_params, next_token_targets,
};

#[test]
#[ignore = "timing run: 124M parameters, ~1.5 GB of buffers"]
fn gpt2_124m_forward_backward_throughput() {
    let config = Gpt2Config::gpt2();
    let shape = BatchShape {
        batch: 4,
        seq_len: 64,
    };
    let layout = ParamLayout::new(&config);
    let params = init_params(&config, &layout, 1);
    let mut model = Gpt2::new(config, params, shape).expect("model");
    let tokens: Vec<u32> = (0..shape.tokens() as u32)
        .map(|i| (i * 7919 + 13) % config.vocab_size as u32)
        .collect();
    let targets = next_token_targets(&tokens, shape.seq_len);

    let loss = model.forward(&tokens, &targets).expect("warm-up forward");
    model.backward().expect("warm-up backward");
    assert!(
        (loss - (config.vocab_size as f32).ln()).abs() < 0.5,
        "random init loss {loss}"
    );

    let iterations = 3;
    let (mut forward_s, mut backward_s) = (0.0f64, 0.0f64);
    for _ in 0..iterations {
        let start = Instant::now();
        model.forward(&tokens, &targets).expect("forward");
        let mid = Instant::now();
        model.backward().expect("backward");
        forward_s += (mid - start).as_secs_f64();
        backward_s += mid.elapsed().as_secs_f64();
    }
    let (forward_s, backward_s) = (
        forward_s / iterations as f64,
        backward_s / iterations as f64,
    );
    let total = forward_s + backward_s;
    let flops = 6.0 * layout.num_params() as f64 * shape.tokens() as f64;
    eprintln!(
        "buffers: params {} + grads {} + activation arena {} f32 elements ({:.0} MiB in all)",
        layout.num_params(),
        layout.num_params(),
        model.activation_layout().total_len(),
        (2 * layout.num_params() + model.activation_layout().total_len()) as f64 * 4.0
            / (1 << 20) as f64
    );
    eprintln!(
        "gpt2 124M, B={} T={}, {} rayon threads: forward {:.1} ms, backward {:.1} ms, {:.0} tokens/s, ~{:.0} GFLOP/s (6N per token)",
        shape.batch,
        shape.seq_len,
        rayon::current_num_threads(),
        forward_s * 1e3,
        backward_s * 1e3,
        shape.tokens() as f64 / total,
        flops / total / 1e9
    );
}
