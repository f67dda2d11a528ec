//! Throughput of one CPU training step (GPT-2, or a LLaMA-shaped decoder): `zero_grad` + forward
//! (with loss) + backward + AdamW over every parameter, the step `bench/cpu_vs_pytorch.sh`
//! compares with PyTorch.
//!
//! ```text
//! cargo run --release -p dsplan-executor --example train_bench -- \
//!     --preset gpt2 --batch 4 --seq 256 --steps 5 --warmup 2 --threads 2
//! ```
//!
//! Prints one line per timed step, a summary (median tokens/s, ms per phase, GFLOP/s counted as
//! `6N` and `6N + 12 L C T` per token, as `research/cpu-anchors.md` defines them, `N` without
//! the position embedding) and, last, the same figures as one JSON line starting with `{`.
//! `--layers` instead times every GPT-2 layer function alone at the model's shapes (a profile).

use std::time::Instant;

use dsplan_executor::model::attention::{AttentionDims, attention_backward, attention_forward};
use dsplan_executor::model::classifier::{
    crossentropy_forward_backward, logits_backward, logits_forward,
};
use dsplan_executor::model::encoder::{encoder_backward, encoder_forward};
use dsplan_executor::model::gelu::{gelu_backward_inplace, gelu_forward};
use dsplan_executor::model::layernorm::{layernorm_backward, layernorm_forward};
use dsplan_executor::model::llama::{AttentionBias, Llama, LlamaConfig, LlamaFamily};
use dsplan_executor::model::matmul::{matmul_backward, matmul_forward};
use dsplan_executor::model::residual::residual_forward;
use dsplan_executor::model::rope::{Rope, RopeScaling};
use dsplan_executor::model::{
    BatchShape, Gpt2, Gpt2Config, ModelConfig, ModelError, ParamLayout, next_token_targets,
};
use dsplan_executor::optim::{AdamConfig, AdamState, BiasCorrection, WeightDecay};
use dsplan_planner::model::Embeddings;

/// The model shapes the bench knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preset {
    /// `gpt2`, 124M parameters.
    Gpt2,
    /// `gpt2-tiny` of `cpu-anchors.md`: V 256, C 128, L 4 (826,112 parameters without `wpe`).
    Tiny,
    /// `llama-100m`: a LLaMA-shaped decoder of 99.5M parameters (V 32000, C 768, L 8, 12 heads
    /// over 4 key/value heads, SwiGLU 2048, untied head, RoPE theta 10000), the shape
    /// `torch_step.py` builds as transformers' `LlamaForCausalLM`.
    Llama100m,
}

impl Preset {
    fn config(self) -> ModelConfig {
        match self {
            Preset::Gpt2 => Gpt2Config::gpt2().into(),
            Preset::Tiny => Gpt2Config {
                vocab_size: 256,
                n_positions: 1024,
                n_embd: 128,
                n_layer: 4,
                n_head: 4,
                layer_norm_epsilon: 1e-5,
            }
            .into(),
            Preset::Llama100m => LlamaConfig {
                family: LlamaFamily::Llama,
                vocab_size: 32_000,
                max_position_embeddings: 2048,
                hidden_size: 768,
                num_hidden_layers: 8,
                num_attention_heads: 12,
                num_key_value_heads: 4,
                head_dim: 64,
                intermediate_size: 2048,
                rms_norm_eps: 1e-5,
                rope: Rope {
                    theta: 10_000.0,
                    scaling: RopeScaling::Default,
                },
                attention_bias: AttentionBias::Absent,
                embeddings: Embeddings::Untied,
                sliding_window: None,
            }
            .into(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Preset::Gpt2 => "gpt2",
            Preset::Tiny => "gpt2-tiny",
            Preset::Llama100m => "llama-100m",
        }
    }
}

/// The model a bench step trains.
enum BenchModel {
    Gpt2(Box<Gpt2>),
    Llama(Box<Llama>),
}

impl BenchModel {
    fn new(config: ModelConfig, seed: u64, shape: BatchShape) -> Result<Self, ModelError> {
        let params = config.init_params(seed);
        Ok(match config {
            ModelConfig::Gpt2(c) => BenchModel::Gpt2(Box::new(Gpt2::new(c, params, shape)?)),
            ModelConfig::Llama(c) => BenchModel::Llama(Box::new(Llama::new(c, params, shape)?)),
        })
    }

    fn zero_grad(&mut self) {
        match self {
            BenchModel::Gpt2(m) => m.zero_grad(),
            BenchModel::Llama(m) => m.zero_grad(),
        }
    }

    fn forward(&mut self, tokens: &[u32], targets: &[Option<u32>]) -> Result<f32, ModelError> {
        match self {
            BenchModel::Gpt2(m) => m.forward(tokens, targets),
            BenchModel::Llama(m) => m.forward(tokens, targets),
        }
    }

    fn backward(&mut self) -> Result<(), ModelError> {
        match self {
            BenchModel::Gpt2(m) => m.backward(),
            BenchModel::Llama(m) => m.backward(),
        }
    }

    fn params_and_grads_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        match self {
            BenchModel::Gpt2(m) => m.params_and_grads_mut(),
            BenchModel::Llama(m) => m.params_and_grads_mut(),
        }
    }
}

/// What the bench runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Whole training steps.
    Train,
    /// Each layer function alone.
    Layers,
}

#[derive(Debug, Clone, Copy)]
struct Args {
    preset: Preset,
    batch: usize,
    seq: usize,
    steps: usize,
    warmup: usize,
    threads: usize,
    mode: Mode,
}

const USAGE: &str = "usage: train_bench [--preset gpt2|tiny|llama-100m] [--batch B] [--seq T] [--steps S] \
                     [--warmup W] [--threads N] [--layers]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        preset: Preset::Gpt2,
        batch: 4,
        seq: 256,
        steps: 5,
        warmup: 2,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mode: Mode::Train,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--layers" {
            args.mode = Mode::Layers;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--preset" => {
                args.preset = match value.as_str() {
                    "gpt2" => Preset::Gpt2,
                    "tiny" | "gpt2-tiny" => Preset::Tiny,
                    "llama-100m" => Preset::Llama100m,
                    other => {
                        return Err(format!(
                            "unknown preset {other:?} (gpt2, tiny or llama-100m)"
                        ));
                    }
                }
            }
            "--batch" => args.batch = number()?,
            "--seq" => args.seq = number()?,
            "--steps" => args.steps = number()?,
            "--warmup" => args.warmup = number()?,
            "--threads" => args.threads = number()?,
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    if args.batch == 0 || args.seq == 0 || args.steps == 0 || args.threads == 0 {
        return Err(format!(
            "batch, seq, steps and threads must be positive\n{USAGE}"
        ));
    }
    Ok(args)
}

/// A small deterministic generator for token ids (uniform, as the PyTorch side uses).
struct Lcg(u64);

impl Lcg {
    fn next_below(&mut self, n: usize) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as u32
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// Per-token FLOPs: `(6N, 6N + 12 L C T)`, `N` without the parameters that are only looked up
/// (GPT-2's position embedding, an untied input embedding), `C` the attention width.
fn flops_per_token(config: &ModelConfig, seq: usize) -> (f64, f64) {
    let (looked_up, layers, width) = match config {
        ModelConfig::Gpt2(c) => (c.n_positions * c.n_embd, c.n_layer, c.n_embd),
        ModelConfig::Llama(c) => {
            let input = match c.embeddings {
                Embeddings::Untied => c.vocab_size * c.hidden_size,
                Embeddings::Tied => 0,
            };
            (input, c.num_hidden_layers, c.q_width())
        }
    };
    let n = (config.layout().num_params() - looked_up) as f64;
    let attention = 12.0 * (layers * width * seq) as f64;
    (6.0 * n, 6.0 * n + attention)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
    {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("cannot build a rayon pool of {} threads: {e}", args.threads);
            std::process::exit(1);
        }
    };
    let result = pool.install(|| match args.mode {
        Mode::Train => train(&args),
        Mode::Layers => layers(&args),
    });
    if let Err(message) = result {
        eprintln!("train_bench: {message}");
        std::process::exit(1);
    }
}

/// Milliseconds of each phase of one step.
#[derive(Debug, Clone, Copy, Default)]
struct StepTimes {
    zero: f64,
    forward: f64,
    backward: f64,
    optimizer: f64,
}

impl StepTimes {
    fn total(&self) -> f64 {
        self.zero + self.forward + self.backward + self.optimizer
    }
}

fn train(args: &Args) -> Result<(), String> {
    let config = args.preset.config();
    let shape = BatchShape {
        batch: args.batch,
        seq_len: args.seq,
    };
    let num_params = config.layout().num_params();
    let mut model = BenchModel::new(config, 1, shape).map_err(|e| e.to_string())?;
    let mut rng = Lcg(42);
    let tokens: Vec<u32> = (0..shape.tokens())
        .map(|_| rng.next_below(config.vocab_size()))
        .collect();
    let targets = next_token_targets(&tokens, shape.seq_len);
    // cpu-anchors.md §3/§4: AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01).
    let adam = AdamConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decay: WeightDecay::Decoupled,
        bias_correction: BiasCorrection::Enabled,
    };
    let mut state = AdamState::new(num_params);

    let mut times = Vec::with_capacity(args.steps);
    let mut losses = Vec::with_capacity(args.steps);
    for step in 0..args.warmup + args.steps {
        let t0 = Instant::now();
        model.zero_grad();
        let t1 = Instant::now();
        let loss = model
            .forward(&tokens, &targets)
            .map_err(|e| e.to_string())?;
        let t2 = Instant::now();
        model.backward().map_err(|e| e.to_string())?;
        let t3 = Instant::now();
        let (p, g) = model.params_and_grads_mut();
        state.step(p, g, &adam, 1e-3).map_err(|e| e.to_string())?;
        let t4 = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let t = StepTimes {
            zero: ms(t0, t1),
            forward: ms(t1, t2),
            backward: ms(t2, t3),
            optimizer: ms(t3, t4),
        };
        let kind = if step < args.warmup {
            "warm-up"
        } else {
            times.push(t);
            losses.push(loss);
            "timed"
        };
        eprintln!(
            "step {step:>2} ({kind}): loss {loss:.4}  zero {:.1} ms  fwd {:.1} ms  bwd {:.1} ms  opt {:.1} ms  total {:.1} ms  {:.1} tokens/s",
            t.zero,
            t.forward,
            t.backward,
            t.optimizer,
            t.total(),
            shape.tokens() as f64 / t.total() * 1e3
        );
    }

    let tokens_per_s: Vec<f64> = times
        .iter()
        .map(|t| shape.tokens() as f64 / t.total() * 1e3)
        .collect();
    let med = |f: fn(&StepTimes) -> f64| median(&times.iter().map(f).collect::<Vec<_>>());
    let (zero, forward, backward, optimizer) = (
        med(|t| t.zero),
        med(|t| t.forward),
        med(|t| t.backward),
        med(|t| t.optimizer),
    );
    let rate = median(&tokens_per_s);
    let min = tokens_per_s.iter().copied().fold(f64::INFINITY, f64::min);
    let max = tokens_per_s.iter().copied().fold(0.0, f64::max);
    let (flops_6n, flops_attn) = flops_per_token(&config, shape.seq_len);
    let gflops_6n = rate * flops_6n / 1e9;
    let gflops_attn = rate * flops_attn / 1e9;
    let threads = rayon::current_num_threads();
    println!(
        "dsplan {} train B={} T={} threads={threads}: {rate:.1} tokens/s [{min:.1}-{max:.1}], {gflops_6n:.1} GFLOP/s (6N), {gflops_attn:.1} GFLOP/s (6N+attn); zero/fwd/bwd/opt {zero:.1} / {forward:.1} / {backward:.1} / {optimizer:.1} ms",
        args.preset.name(),
        shape.batch,
        shape.seq_len,
    );
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "{{\"impl\":\"dsplan\",\"model\":\"{}\",\"batch\":{},\"seq\":{},\"threads\":{threads},\"steps\":{},\"warmup\":{},\"tokens_per_s\":{rate:.3},\"tokens_per_s_min\":{min:.3},\"tokens_per_s_max\":{max:.3},\"samples_tokens_per_s\":[{}],\"gflops_6n\":{gflops_6n:.3},\"gflops_6n_attn\":{gflops_attn:.3},\"zero_ms\":{zero:.3},\"fwd_ms\":{forward:.3},\"bwd_ms\":{backward:.3},\"opt_ms\":{optimizer:.3},\"last_loss\":{:.6}}}",
        args.preset.name(),
        shape.batch,
        shape.seq_len,
        args.steps,
        args.warmup,
        list(&tokens_per_s),
        losses.last().copied().unwrap_or(f32::NAN),
    );
    Ok(())
}

/// CPU time this process has run, over all its threads, in milliseconds (Linux
/// `/proc/self/task/*/schedstat`); `None` where that is not readable.
fn process_cpu_ms() -> Option<f64> {
    let mut total_ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total_ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total_ns as f64 / 1e6)
}

/// Times `f` (after one untimed call): median wall milliseconds over `repeats`, and the
/// median CPU milliseconds the process spent meanwhile (NaN where unknown).
fn time_ms(repeats: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let samples: Vec<(f64, f64)> = (0..repeats.max(1))
        .map(|_| {
            let cpu0 = process_cpu_ms();
            let start = Instant::now();
            f();
            let wall = start.elapsed().as_secs_f64() * 1e3;
            let cpu = match (cpu0, process_cpu_ms()) {
                (Some(a), Some(b)) => b - a,
                _ => f64::NAN,
            };
            (wall, cpu)
        })
        .collect();
    let walls: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let cpus: Vec<f64> = samples.iter().map(|s| s.1).collect();
    (median(&walls), median(&cpus))
}

/// Buffers of pseudo-random values in `[-1, 1)`.
fn noise(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Lcg(seed);
    (0..len)
        .map(|_| rng.next_below(1 << 20) as f32 / (1 << 19) as f32 - 1.0)
        .collect()
}

/// One row of the layer profile.
struct LayerRow {
    name: &'static str,
    calls_per_step: usize,
    wall_ms: f64,
    cpu_ms: f64,
    flops_per_call: f64,
}

/// The layer profile being collected.
struct Profile {
    repeats: usize,
    rows: Vec<LayerRow>,
}

impl Profile {
    /// Times `f`, which runs `calls_per_step` times per training step and does `flops` FLOPs.
    fn time(&mut self, name: &'static str, calls_per_step: usize, flops: f64, f: impl FnMut()) {
        let (wall_ms, cpu_ms) = time_ms(self.repeats, f);
        self.rows.push(LayerRow {
            name,
            calls_per_step,
            wall_ms,
            cpu_ms,
            flops_per_call: flops,
        });
    }

    fn print(&self, title: &str, tokens: usize) {
        let total: f64 = self
            .rows
            .iter()
            .map(|r| r.wall_ms * r.calls_per_step as f64)
            .sum();
        let total_cpu: f64 = self
            .rows
            .iter()
            .map(|r| r.cpu_ms * r.calls_per_step as f64)
            .sum();
        println!("{title}");
        println!(
            "{:<22} {:>5} {:>9} {:>9} {:>9} {:>5} {:>8}",
            "layer", "calls", "ms/call", "cpu ms", "ms/step", "%", "GFLOP/s"
        );
        for r in &self.rows {
            let per_step = r.wall_ms * r.calls_per_step as f64;
            let gflops = if r.flops_per_call > 0.0 {
                format!("{:.1}", r.flops_per_call / r.wall_ms / 1e6)
            } else {
                "-".to_string()
            };
            println!(
                "{:<22} {:>5} {:>9.3} {:>9.3} {:>9.1} {:>5.1} {:>8}",
                r.name,
                r.calls_per_step,
                r.wall_ms,
                r.cpu_ms,
                per_step,
                100.0 * per_step / total,
                gflops
            );
        }
        println!(
            "sum of layers: {total:.1} ms/step wall ({:.1} tokens/s), {total_cpu:.1} ms/step CPU",
            tokens as f64 / total * 1e3
        );
    }
}

fn layers(args: &Args) -> Result<(), String> {
    let config = *args.preset.config().gpt2().ok_or_else(|| {
        format!(
            "--layers profiles GPT-2's layer functions; {} is not GPT-2",
            args.preset.name()
        )
    })?;
    let (b, t, c) = (args.batch, args.seq, config.n_embd);
    let (nh, v, l) = (config.n_head, config.vocab_size, config.n_layer);
    let n = b * t;
    let dims = AttentionDims {
        batch: b,
        seq_len: t,
        n_head: nh,
        head_dim: c / nh,
    };
    let mut profile = Profile {
        repeats: args.steps,
        rows: Vec::new(),
    };
    let gemm_flops = |m: usize, k: usize, n: usize| 2.0 * (m * k * n) as f64;

    let x = noise(n * 4 * c, 1);
    let dy = noise(n * 4 * c, 2);
    let w = noise(4 * c * c, 3);
    let bias = noise(4 * c, 4);
    let mut out = vec![0.0f32; n * 4 * c];
    let mut dx = vec![0.0f32; n * 4 * c];
    let mut dw = vec![0.0f32; 4 * c * c];
    let mut db = vec![0.0f32; 4 * c];
    for (name_f, name_b, ic, oc) in [
        ("c_attn fwd", "c_attn bwd", c, 3 * c),
        ("attn c_proj fwd", "attn c_proj bwd", c, c),
        ("c_fc fwd", "c_fc bwd", c, 4 * c),
        ("mlp c_proj fwd", "mlp c_proj bwd", 4 * c, c),
    ] {
        profile.time(name_f, l, gemm_flops(n, ic, oc), || {
            matmul_forward(&mut out[..n * oc], &x[..n * ic], &w[..ic * oc], &bias[..oc])
        });
        profile.time(name_b, l, 2.0 * gemm_flops(n, ic, oc), || {
            matmul_backward(
                &mut dx[..n * ic],
                &mut dw[..ic * oc],
                &mut db[..oc],
                &dy[..n * oc],
                &x[..n * ic],
                &w[..ic * oc],
            )
        });
    }

    let qkv = noise(n * 3 * c, 5);
    let mut att = vec![0.0f32; b * nh * t * t];
    let mut datt = vec![0.0f32; b * nh * t * t];
    let mut atty = vec![0.0f32; n * c];
    let mut dqkv = vec![0.0f32; n * 3 * c];
    // Counted as eager attention computes it: the full T x T square.
    let attn_flops = 4.0 * (b * nh * t * t * (c / nh)) as f64;
    profile.time("attention fwd", l, attn_flops, || {
        attention_forward(&mut atty, &mut att, &qkv, dims)
    });
    profile.time("attention bwd", l, 2.0 * attn_flops, || {
        attention_backward(&mut dqkv, &mut datt, &dy[..n * c], &qkv, &att, dims)
    });

    let mut mean = vec![0.0f32; n];
    let mut rstd = vec![0.0f32; n];
    let ln_w = noise(c, 6);
    let ln_b = noise(c, 7);
    profile.time("layernorm fwd", 2 * l + 1, 0.0, || {
        layernorm_forward(
            &mut out[..n * c],
            &mut mean,
            &mut rstd,
            &x[..n * c],
            &ln_w,
            &ln_b,
            1e-5,
        )
    });
    profile.time("layernorm bwd", 2 * l + 1, 0.0, || {
        layernorm_backward(
            &mut dx[..n * c],
            &mut dw[..c],
            &mut db[..c],
            &dy[..n * c],
            &x[..n * c],
            &ln_w,
            &mean,
            &rstd,
        )
    });
    profile.time("gelu fwd", l, 0.0, || gelu_forward(&mut out, &x));
    profile.time("gelu bwd", l, 0.0, || gelu_backward_inplace(&mut dx, &x));
    profile.time("residual fwd", 2 * l, 0.0, || {
        residual_forward(&mut out[..n * c], &x[..n * c], &dy[..n * c])
    });

    let wte = noise(v * c, 8);
    let wpe = noise(t * c, 9);
    let mut dwte = vec![0.0f32; v * c];
    let mut dwpe = vec![0.0f32; t * c];
    let mut rng = Lcg(10);
    let tokens: Vec<u32> = (0..n).map(|_| rng.next_below(v)).collect();
    let targets = next_token_targets(&tokens, t);
    profile.time("encoder fwd", 1, 0.0, || {
        encoder_forward(&mut out[..n * c], &tokens, &wte, &wpe, t)
    });
    profile.time("encoder bwd", 1, 0.0, || {
        encoder_backward(&mut dwte, &mut dwpe, &dy[..n * c], &tokens, t)
    });
    let mut logits = vec![0.0f32; n * v];
    let mut losses = vec![0.0f32; n];
    profile.time("logits fwd", 1, gemm_flops(n, c, v), || {
        logits_forward(&mut logits, &x[..n * c], &wte, c)
    });
    // Repeated calls see already-converted rows: the same arithmetic on other numbers.
    profile.time("crossentropy", 1, 0.0, || {
        crossentropy_forward_backward(&mut logits, &mut losses, &targets, 1.0 / n as f32)
    });
    profile.time("logits bwd", 1, 2.0 * gemm_flops(n, c, v), || {
        logits_backward(&mut dx[..n * c], &mut dwte, &logits, &x[..n * c], &wte, c)
    });
    let layout = ParamLayout::new(&config);
    let np = layout.num_params();
    let mut params = noise(np, 11);
    let grads = noise(np, 12);
    let mut state = AdamState::new(np);
    let adam = AdamConfig {
        weight_decay: 0.01,
        ..AdamConfig::default()
    };
    profile.time("adamw", 1, 0.0, || {
        let _ = state.step(&mut params, &grads, &adam, 1e-3);
    });
    let mut zeros = vec![1.0f32; np];
    profile.time("zero_grad", 1, 0.0, || zeros.fill(0.0));

    profile.print(
        &format!(
            "layer profile: {} B={b} T={t}, {} threads, median of {} calls each (cpu ms: all threads)",
            args.preset.name(),
            rayon::current_num_threads(),
            args.steps
        ),
        n,
    );
    Ok(())
}
