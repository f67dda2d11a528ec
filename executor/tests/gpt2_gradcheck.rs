//! Self-consistency of the CPU GPT-2 without any fixture: analytic gradients against central
//! finite differences for a few entries of every parameter tensor of a tiny model, plus the
//! contract of the forward/backward API (accumulation, errors instead of panics).

use dsplan_executor::model::{
    BatchShape, Gpt2, Gpt2Config, ModelError, ParamLayout, init_params, next_token_targets,
};

const CONFIG: Gpt2Config = Gpt2Config {
    vocab_size: 23,
    n_positions: 8,
    n_embd: 8,
    n_layer: 2,
    n_head: 2,
    layer_norm_epsilon: 1e-5,
};
const SHAPE: BatchShape = BatchShape {
    batch: 2,
    seq_len: 6,
};

/// A small deterministic generator (64-bit LCG) for test data.
struct Lcg(u64);

impl Lcg {
    fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn next_below(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

/// Parameters with O(0.3) noise everywhere (biases and LayerNorm included), so that every
/// gradient is large enough for an f32 finite difference to resolve.
fn noisy_params(seed: u64) -> Vec<f32> {
    let layout = ParamLayout::new(&CONFIG);
    let mut params = init_params(&CONFIG, &layout, seed);
    let mut rng = Lcg(seed);
    for p in &mut params {
        *p += 0.3 * rng.next_f32();
    }
    params
}

fn batch(seed: u64) -> (Vec<u32>, Vec<Option<u32>>) {
    let mut rng = Lcg(seed);
    let tokens: Vec<u32> = (0..SHAPE.tokens())
        .map(|_| rng.next_below(CONFIG.vocab_size as u32))
        .collect();
    let targets = next_token_targets(&tokens, SHAPE.seq_len);
    (tokens, targets)
}

#[test]
fn gradients_match_finite_differences_for_every_tensor() {
    let (tokens, targets) = batch(11);
    let mut model = Gpt2::new(CONFIG, noisy_params(5), SHAPE).expect("model");
    model.forward(&tokens, &targets).expect("forward");
    model.backward().expect("backward");
    let grads = model.grads().to_vec();
    let layout = model.param_layout().clone();
    let h = 1e-2f32;
    let mut worst = 0.0f64;
    for entry in layout.table().entries() {
        let span = entry.span;
        let g = span.of(&grads);
        // The three largest-magnitude entries and two spread-out ones.
        let mut order: Vec<usize> = (0..span.len).collect();
        order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        let mut picks: Vec<usize> = order.iter().take(3).copied().collect();
        picks.extend([span.len / 3, (2 * span.len) / 3]);
        for i in picks {
            let at = span.offset + i;
            let original = model.params()[at];
            model.params_mut()[at] = original + h;
            let plus = model.forward(&tokens, &targets).expect("forward +h");
            model.params_mut()[at] = original - h;
            let minus = model.forward(&tokens, &targets).expect("forward -h");
            model.params_mut()[at] = original;
            let fd = (f64::from(plus) - f64::from(minus)) / (2.0 * f64::from(h));
            let analytic = f64::from(g[i]);
            let error = (fd - analytic).abs();
            worst = worst.max(error / (1e-3 + analytic.abs()));
            assert!(
                error <= 1e-3 + 2e-2 * analytic.abs(),
                "{}[{i}]: analytic {analytic:.6e}, finite difference {fd:.6e}",
                entry.name
            );
        }
    }
    eprintln!("finite-difference check: worst |fd - analytic| / (1e-3 + |analytic|) = {worst:.3e}");
}

#[test]
fn backward_accumulates_and_zero_grad_resets() {
    let (tokens, targets) = batch(3);
    let mut model = Gpt2::new(CONFIG, noisy_params(9), SHAPE).expect("model");
    model.forward(&tokens, &targets).expect("forward");
    model.backward().expect("backward");
    let once = model.grads().to_vec();
    model.forward(&tokens, &targets).expect("forward");
    model.backward().expect("backward");
    for (twice, once) in model.grads().iter().zip(&once) {
        assert!((twice - 2.0 * once).abs() <= 1e-6 * (1.0 + once.abs()));
    }
    model.zero_grad();
    let half_scaled = model
        .forward_scaled(&tokens, &targets, 0.5)
        .expect("forward");
    model.backward().expect("backward");
    for (half, once) in model.grads().iter().zip(&once) {
        assert!((half - 0.5 * once).abs() <= 1e-6 * (1.0 + once.abs()));
    }
    assert!(half_scaled.is_finite());
}

#[test]
fn inference_logits_agree_with_training_loss() {
    let (tokens, targets) = batch(4);
    let mut model = Gpt2::new(CONFIG, noisy_params(2), SHAPE).expect("model");
    let logits = model.forward_logits(&tokens).expect("logits").to_vec();
    assert!(model.logits().is_some());
    let v = CONFIG.vocab_size;
    let (mut total, mut count) = (0.0f64, 0usize);
    for (row, target) in logits.chunks(v).zip(&targets) {
        let Some(target) = target else { continue };
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&x| f64::from(x - max).exp())
                .sum::<f64>()
                .ln();
        total += lse - f64::from(row[*target as usize]);
        count += 1;
    }
    let loss = model.forward(&tokens, &targets).expect("forward");
    assert!(
        model.logits().is_none(),
        "a training forward overwrites the logits"
    );
    assert!((f64::from(loss) - total / count as f64).abs() < 1e-5);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let (tokens, targets) = batch(1);
    let mut model = Gpt2::new(CONFIG, noisy_params(1), SHAPE).expect("model");
    assert_eq!(model.backward(), Err(ModelError::BackwardWithoutForward));

    let mut bad = tokens.clone();
    bad[7] = 23;
    assert_eq!(
        model.forward(&bad, &targets),
        Err(ModelError::OutOfVocabulary {
            what: "token",
            position: 7,
            id: 23,
            vocab_size: 23
        })
    );
    assert!(matches!(
        model.forward(&tokens[1..], &targets),
        Err(ModelError::BatchLength {
            what: "tokens",
            expected: 12,
            found: 11
        })
    ));
    assert_eq!(
        model.forward(&tokens, &[None; 12]),
        Err(ModelError::NoTargets)
    );

    let long = BatchShape {
        batch: 1,
        seq_len: 9,
    };
    assert!(matches!(
        Gpt2::new(CONFIG, noisy_params(1), long),
        Err(ModelError::SequenceTooLong {
            seq_len: 9,
            n_positions: 8
        })
    ));
    assert!(matches!(
        Gpt2::new(CONFIG, vec![0.0; 3], SHAPE),
        Err(ModelError::ParamCount { found: 3, .. })
    ));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Big enough that gemm and the chunked reductions actually split work.
    let config = Gpt2Config {
        vocab_size: 300,
        n_positions: 64,
        n_embd: 64,
        n_layer: 1,
        n_head: 4,
        layer_norm_epsilon: 1e-5,
    };
    let shape = BatchShape {
        batch: 4,
        seq_len: 64,
    };
    let layout = ParamLayout::new(&config);
    let params = init_params(&config, &layout, 3);
    let mut rng = Lcg(8);
    let tokens: Vec<u32> = (0..shape.tokens()).map(|_| rng.next_below(300)).collect();
    let targets = next_token_targets(&tokens, shape.seq_len);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| {
            let mut model = Gpt2::new(config, params.clone(), shape).expect("model");
            let loss = model.forward(&tokens, &targets).expect("forward");
            model.backward().expect("backward");
            (loss, model.grads().to_vec())
        })
    };
    let (loss1, grads1) = run(1);
    let (loss3, grads3) = run(3);
    assert_eq!(loss1.to_bits(), loss3.to_bits());
    let differing = grads1
        .iter()
        .zip(&grads3)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differing, 0,
        "{differing} gradient entries differ between 1 and 3 threads"
    );
}
