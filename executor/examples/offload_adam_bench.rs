//! Parameter rate of the offload optimizer (`optim::offload`) per thread count, and the worker
//! `bench/cpu_adam_vs_deepspeed.sh` pairs with DeepSpeedCPUAdam.
//!
//! ```text
//! cargo run --release -p dsplan-executor --example offload_adam_bench -- \
//!     [sweep] [--params 67108864] [--threads 1,2,4,8,16] [--steps 10] [--warmup 3] [--isa best]
//! cargo run --release -p dsplan-executor --example offload_adam_bench -- serve --threads 2
//! ```
//!
//! `sweep` (the default) prints, for each thread count and each variant (f32 gradients with
//! no copy-out; bf16 in, bf16 out; fp16 in, fp16 out), the median Gparam/s over the timed
//! steps, the effective GB/s at the variant's bytes per parameter, and the pool's placement,
//! then one JSON line starting with `{`. Built once, the binary needs nothing else, so it can
//! be carried to a machine with more cores (`--threads` defaults to 1, 2, 4, … up to the CPUs
//! this process may use).
//!
//! `serve` holds one partition's state and runs a variant per line read from stdin
//! (`fp32`, `bf16`, `fp16`; `sum` prints the master weights' sum; `quit`), answering each
//! with one JSON line. The data are the formulas of `initial_param` and `grad`, which the
//! Python side computes the same way.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Instant;

use dsplan_executor::optim::offload::bytes::offload_step_bytes;
use dsplan_executor::optim::offload::numa::allowed_cpus;
use dsplan_executor::optim::offload::{
    AdamSlices, GradDtype, GradsIn, HostAdamState, Isa, OffloadPool, OffloadStep, OutDtype,
    ParamsOut,
};
use dsplan_executor::optim::{AdamConfig, BiasCorrection, WeightDecay};
use half::{bf16, f16};

/// Initial parameter `i`: a hash spread over [-0.5, 0.5).
fn initial_param(i: usize) -> f32 {
    let h = (i as u64).wrapping_mul(2_654_435_761) % (1 << 32);
    (h as f64 / 4_294_967_296.0 - 0.5) as f32
}

/// Gradient `i` (before rounding to 16 bits): a second hash, scaled by 1e-2.
fn grad(i: usize) -> f32 {
    let h = ((i as u64) * 40_503 + 12_345) % 65_536;
    ((h as f64 / 65_536.0 - 0.5) * 1e-2) as f32
}

/// The hyperparameters of `cpu-anchors.md` §3.
fn config() -> AdamConfig {
    AdamConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decay: WeightDecay::Decoupled,
        bias_correction: BiasCorrection::Enabled,
    }
}

const LR: f64 = 1e-3;

/// A variant of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// f32 gradients, no copy-out (fp32 training, or DeepSpeedCPUAdam's own step).
    Fp32,
    /// bf16 gradients in, bf16 parameters out.
    Bf16,
    /// fp16 gradients in, fp16 parameters out.
    Fp16,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Fp32, Variant::Bf16, Variant::Fp16];

    fn name(self) -> &'static str {
        match self {
            Variant::Fp32 => "fp32",
            Variant::Bf16 => "bf16",
            Variant::Fp16 => "fp16",
        }
    }

    fn parse(text: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == text)
    }

    fn bytes(self) -> usize {
        match self {
            Variant::Fp32 => offload_step_bytes(GradDtype::F32, OutDtype::None),
            Variant::Bf16 => offload_step_bytes(GradDtype::Bf16, OutDtype::Bf16),
            Variant::Fp16 => offload_step_bytes(GradDtype::F16, OutDtype::F16),
        }
        .total()
    }
}

/// One partition's state and every gradient and output buffer the variants use.
struct Partition {
    state: HostAdamState,
    grads_f32: Vec<f32>,
    grads_bf16: Vec<bf16>,
    grads_f16: Vec<f16>,
    out_bf16: Vec<bf16>,
    out_f16: Vec<f16>,
    steps: u64,
}

impl Partition {
    /// `n` parameters placed for `pool`. The f32 gradients are the bf16 ones widened, as
    /// DeepSpeed's fp32 gradient buffer holds them.
    fn new(pool: &OffloadPool, n: usize) -> Partition {
        let init: Vec<f32> = (0..n).map(initial_param).collect();
        let grads_bf16: Vec<bf16> = (0..n).map(|i| bf16::from_f32(grad(i))).collect();
        let grads_f32: Vec<f32> =
            pool.copied(&grads_bf16.iter().map(|g| g.to_f32()).collect::<Vec<_>>());
        Partition {
            state: HostAdamState::new(pool, &init),
            grads_f16: (0..n).map(|i| f16::from_f32(grad(i))).collect(),
            grads_f32,
            grads_bf16,
            out_bf16: vec![bf16::ZERO; n],
            out_f16: vec![f16::ZERO; n],
            steps: 0,
        }
    }

    /// Runs one step of `variant`; seconds.
    fn step(&mut self, pool: &OffloadPool, variant: Variant) -> Result<f64, String> {
        self.steps += 1;
        let step = OffloadStep {
            step: self.steps,
            lr: LR,
            grad_factor: 1.0,
        };
        let state = AdamSlices {
            master: &mut self.state.master,
            exp_avg: &mut self.state.exp_avg,
            exp_avg_sq: &mut self.state.exp_avg_sq,
        };
        let (grads, out) = match variant {
            Variant::Fp32 => (GradsIn::F32(&self.grads_f32), ParamsOut::None),
            Variant::Bf16 => (
                GradsIn::Bf16(&self.grads_bf16),
                ParamsOut::Bf16(&mut self.out_bf16),
            ),
            Variant::Fp16 => (
                GradsIn::F16(&self.grads_f16),
                ParamsOut::F16(&mut self.out_f16),
            ),
        };
        let start = Instant::now();
        pool.adam_step(state, grads, out, &step, &config())
            .map_err(|e| e.to_string())?;
        Ok(start.elapsed().as_secs_f64())
    }
}

/// Command-line options.
struct Options {
    mode: Mode,
    params: usize,
    threads: Vec<usize>,
    steps: usize,
    warmup: usize,
    isa: Option<Isa>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Sweep,
    Serve,
}

fn parse_isa(text: &str) -> Result<Option<Isa>, String> {
    let isa = match text {
        "best" => return Ok(None),
        "scalar" => Isa::Scalar,
        "avx2" => Isa::Avx2,
        "avx512" => Isa::Avx512,
        "avx512+bf16" => Isa::Avx512Bf16,
        other => {
            return Err(format!(
                "--isa {other}: expected best, scalar, avx2, avx512 or avx512+bf16"
            ));
        }
    };
    if !isa.is_available() {
        return Err(format!("--isa {isa}: this CPU does not have it"));
    }
    Ok(Some(isa))
}

fn default_threads() -> Vec<usize> {
    let cpus = allowed_cpus().len().max(1);
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |t| Some(t * 2))
        .take_while(|&t| t < cpus)
        .collect();
    out.push(cpus);
    out
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        mode: Mode::Sweep,
        params: 64 << 20,
        threads: default_threads(),
        steps: 10,
        warmup: 3,
        isa: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, text: String| {
            text.parse::<usize>()
                .map_err(|_| format!("{name} {text}: expected a whole number"))
        };
        match arg.as_str() {
            "sweep" => options.mode = Mode::Sweep,
            "serve" => options.mode = Mode::Serve,
            "--params" => options.params = number("--params", value("--params")?)?,
            "--steps" => options.steps = number("--steps", value("--steps")?)?.max(1),
            "--warmup" => options.warmup = number("--warmup", value("--warmup")?)?,
            "--isa" => options.isa = parse_isa(&value("--isa")?)?,
            "--threads" => {
                options.threads = value("--threads")?
                    .split(',')
                    .map(|t| number("--threads", t.to_string()))
                    .collect::<Result<_, _>>()?;
                if options.threads.contains(&0) {
                    return Err("--threads: each count must be at least 1".to_string());
                }
            }
            other => return Err(format!("unknown argument {other} (see the file's doc)")),
        }
    }
    if options.params == 0 {
        return Err("--params must be at least 1".to_string());
    }
    Ok(options)
}

fn build_pool(threads: usize, isa: Option<Isa>) -> Result<OffloadPool, String> {
    let mut pool = OffloadPool::new(threads).map_err(|e| e.to_string())?;
    if let Some(isa) = isa {
        pool.set_isa(isa)
            .map_err(|isa| format!("this CPU does not run {isa}"))?;
    }
    Ok(pool)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn sweep(options: &Options) -> Result<(), String> {
    let n = options.params;
    println!(
        "offload Adam, {n} parameters, {} timed steps after {} warm-up, isa {}",
        options.steps,
        options.warmup,
        options.isa.unwrap_or_else(Isa::best)
    );
    println!(
        "{:>7} {:>8} {:>10} {:>9} {:>8} {:>9}  placement",
        "threads", "variant", "Gparam/s", "GB/s", "B/param", "ms/step"
    );
    let mut rows = Vec::new();
    for &threads in &options.threads {
        let pool = build_pool(threads, options.isa)?;
        let mut partition = Partition::new(&pool, n);
        for variant in Variant::ALL {
            for _ in 0..options.warmup {
                partition.step(&pool, variant)?;
            }
            let times: Vec<f64> = (0..options.steps)
                .map(|_| partition.step(&pool, variant))
                .collect::<Result<_, _>>()?;
            let t = median(times);
            let rate = n as f64 / t / 1e9;
            let bytes = variant.bytes();
            println!(
                "{threads:>7} {:>8} {rate:>10.3} {:>9.1} {bytes:>8} {:>9.2}  {:?} {:?}, {} node(s), {} pin failure(s)",
                variant.name(),
                rate * bytes as f64,
                t * 1e3,
                pool.placement(),
                pool.affinity(),
                pool.topology().nodes.len(),
                pool.pin_failures(),
            );
            rows.push(serde_json::json!({
                "threads": threads,
                "variant": variant.name(),
                "gparam_per_s": rate,
                "gb_per_s": rate * bytes as f64,
                "bytes_per_param": bytes,
                "ms_per_step": t * 1e3,
                "isa": pool.isa().to_string(),
                "placement": format!("{:?}", pool.placement()),
                "numa_nodes": pool.topology().nodes.len(),
            }));
        }
    }
    println!("{}", serde_json::json!({ "params": n, "rows": rows }));
    Ok(())
}

fn serve(options: &Options) -> Result<(), String> {
    let threads = options.threads.last().copied().unwrap_or(1);
    let pool = build_pool(threads, options.isa)?;
    let mut partition = Partition::new(&pool, options.params);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let reply = |out: &mut std::io::StdoutLock<'_>, value: serde_json::Value| {
        writeln!(out, "{value}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))
    };
    reply(
        &mut out,
        serde_json::json!({"ready": true, "threads": threads, "isa": pool.isa().to_string(),
            "placement": format!("{:?}", pool.placement())}),
    )?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let command = line.trim();
        if command == "quit" {
            break;
        }
        if command == "sum" {
            let sum: f64 = partition.state.master.iter().map(|&x| f64::from(x)).sum();
            reply(
                &mut out,
                serde_json::json!({"sum": sum, "steps": partition.steps}),
            )?;
            continue;
        }
        let variant = Variant::parse(command)
            .ok_or_else(|| format!("unknown command {command:?}: fp32, bf16, fp16, sum, quit"))?;
        let seconds = partition.step(&pool, variant)?;
        reply(&mut out, serde_json::json!({"seconds": seconds}))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|options| match options.mode {
        Mode::Sweep => sweep(&options),
        Mode::Serve => serve(&options),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("offload_adam_bench: {e}");
            ExitCode::from(2)
        }
    }
}
