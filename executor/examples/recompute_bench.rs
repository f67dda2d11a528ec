//! The cost of activation checkpointing on the CPU GPT-2, paired: two models with the same
//! parameters, one keeping every activation and one recomputing each block in backward,
//! take turns on the same batches; the step is `zero_grad` + forward (with loss) + backward.
//!
//! ```text
//! cargo run --release -p dsplan-executor --example recompute_bench -- gpt2 4 256 3
//! ```
//!
//! Arguments: model preset (`gpt2`, `tiny-gpt2`), micro-batch, sequence length, timed steps
//! (after one warm-up step each). Prints each model's arena bytes, median tokens/s, and the
//! ratio recomputing / keeping.

use std::time::Instant;

use dsplan_executor::model::{BatchShape, Gpt2, Recompute, next_token_targets};
use dsplan_executor::train::choose_model;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if let Err(message) = run() {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| -> Result<usize, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse()
                .map_err(|_| format!("argument {} (`{a}`) is not a count", i + 1))
        })
    };
    let preset = args.first().map_or("tiny-gpt2", String::as_str);
    let shape = BatchShape {
        batch: number(1, 4)?,
        seq_len: number(2, 256)?,
    };
    let steps = number(3, 3)?.max(1);
    let source = choose_model(Some(preset), 1).map_err(|e| e.to_string())?;
    let config = *source
        .config
        .gpt2()
        .ok_or("recompute_bench times GPT-2 presets only")?;
    let mut models = [Recompute::Nothing, Recompute::EachLayer]
        .map(|recompute| Gpt2::with_recompute(config, source.params.clone(), shape, recompute));
    let [kept, recomputed] = &mut models;
    let (kept, recomputed) = (
        kept.as_mut().map_err(|e| e.to_string())?,
        recomputed.as_mut().map_err(|e| e.to_string())?,
    );
    let vocab = config.vocab_size as u32;
    let tokens: Vec<u32> = (0..shape.tokens() as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect();
    let targets = next_token_targets(&tokens, shape.seq_len);
    let step = |model: &mut Gpt2| -> Result<f64, String> {
        let started = Instant::now();
        model.zero_grad();
        model
            .forward(&tokens, &targets)
            .map_err(|e| e.to_string())?;
        model.backward().map_err(|e| e.to_string())?;
        Ok(started.elapsed().as_secs_f64())
    };
    step(kept)?;
    step(recomputed)?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        a.push(step(kept)?);
        b.push(step(recomputed)?);
    }
    let same = kept.grads() == recomputed.grads();
    let tokens_per_s = |seconds: f64| shape.tokens() as f64 / seconds;
    let (ta, tb) = (tokens_per_s(median(&mut a)), tokens_per_s(median(&mut b)));
    let bytes = |m: &Gpt2| m.activation_layout().total_len() * 4;
    println!(
        "{preset} B={} T={} steps={steps}: keep every activation {:.1} tok/s (arena {} B); recompute each block {:.1} tok/s (arena {} B); ratio {:.3}; gradients equal: {same}",
        shape.batch,
        shape.seq_len,
        ta,
        bytes(kept),
        tb,
        bytes(recomputed),
        tb / ta
    );
    Ok(())
}
