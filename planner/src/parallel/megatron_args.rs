//! `--megatron-args "<pretrain_gpt.py flags>"`: a Megatron-LM (or Megatron-DeepSpeed) launch
//! line read with Megatron's own argument names and defaults.
//!
//! Flags that shape memory are read ([`FLAGS`]); flags known to change nothing dsplan models
//! (learning rate, logging, data paths, ...) pass quietly ([`NO_MEMORY_EFFECT`]); any other
//! flag gets a warning and is skipped with its value. Features dsplan does not model (mixture
//! of experts, multi-latent attention, multi-token prediction, context parallelism, uneven
//! pipeline layouts) are refused, naming the flag. Defaults are Megatron-LM's
//! (`megatron/training/arguments.py`): LayerNorm, GELU MLP of `4h`, biases on, learned
//! absolute positions, tied embeddings, vocabulary padded to a multiple of `128 × t`, dropout
//! 0.1, Transformer Engine attention (flash), gradient-accumulation fusion on, fp32 unless
//! `--bf16`/`--fp16`.

use std::collections::BTreeMap;

use super::checks::data_degree;
use super::error::{FlagNames, ParallelError, ParallelErrors};
use super::layout::{
    Batch, Dropout, DropoutUse, GradientAccumulationFusion, Job, Layout, OptimizerSharding,
    PipelineSchedule, Recompute, RecomputeMethod, Runtime, SequenceParallel, Training,
};
use super::shape::{LinearBias, Mlp, Norm, Positions, TransformerShape, VocabPadding};
use crate::config::ZeroStage;
use crate::memory::{AttentionKernel, Precision};
use crate::model::Embeddings;

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// `--flag` alone (`store_true`/`store_false`).
    Switch,
    /// `--flag VALUE`.
    Value,
}

/// Flags dsplan reads, with their arity.
pub const FLAGS: &[(&str, Arity)] = &[
    ("num-layers", Arity::Value),
    ("hidden-size", Arity::Value),
    ("ffn-hidden-size", Arity::Value),
    ("num-attention-heads", Arity::Value),
    ("kv-channels", Arity::Value),
    ("group-query-attention", Arity::Switch),
    ("num-query-groups", Arity::Value),
    ("swiglu", Arity::Switch),
    ("normalization", Arity::Value),
    ("untie-embeddings-and-output-weights", Arity::Switch),
    ("disable-bias-linear", Arity::Switch),
    ("add-bias-linear", Arity::Switch),
    ("add-qkv-bias", Arity::Switch),
    ("position-embedding-type", Arity::Value),
    ("use-rotary-position-embeddings", Arity::Switch),
    ("max-position-embeddings", Arity::Value),
    ("seq-length", Arity::Value),
    ("micro-batch-size", Arity::Value),
    ("global-batch-size", Arity::Value),
    ("vocab-size", Arity::Value),
    ("tokenizer-type", Arity::Value),
    ("make-vocab-size-divisible-by", Arity::Value),
    ("tensor-model-parallel-size", Arity::Value),
    ("pipeline-model-parallel-size", Arity::Value),
    ("num-layers-per-virtual-pipeline-stage", Arity::Value),
    ("num-virtual-stages-per-pipeline-rank", Arity::Value),
    ("sequence-parallel", Arity::Switch),
    ("use-distributed-optimizer", Arity::Switch),
    ("recompute-granularity", Arity::Value),
    ("recompute-activations", Arity::Switch),
    ("recompute-method", Arity::Value),
    ("recompute-num-layers", Arity::Value),
    ("bf16", Arity::Switch),
    ("fp16", Arity::Switch),
    ("hidden-dropout", Arity::Value),
    ("attention-dropout", Arity::Value),
    ("transformer-impl", Arity::Value),
    ("attention-backend", Arity::Value),
    ("use-flash-attn", Arity::Switch),
    ("use-flash-attn-v2", Arity::Switch),
    ("no-gradient-accumulation-fusion", Arity::Switch),
    ("deepspeed", Arity::Switch),
    ("zero-stage", Arity::Value),
    ("ds-sequence-parallel-size", Arity::Value),
    ("no-pipeline-parallel", Arity::Switch),
    // Refused: not modelled.
    ("num-experts", Arity::Value),
    ("multi-latent-attention", Arity::Switch),
    ("mtp-num-layers", Arity::Value),
    ("context-parallel-size", Arity::Value),
    ("expert-model-parallel-size", Arity::Value),
    ("hybrid-layer-pattern", Arity::Value),
    ("pipeline-model-parallel-layout", Arity::Value),
    ("decoder-first-pipeline-num-layers", Arity::Value),
    ("decoder-last-pipeline-num-layers", Arity::Value),
    ("account-for-embedding-in-pipeline-split", Arity::Switch),
    ("account-for-loss-in-pipeline-split", Arity::Switch),
];

/// Megatron flags that change nothing in dsplan's memory model, with their arity: accepted
/// without a warning.
pub const NO_MEMORY_EFFECT: &[(&str, Arity)] = &[
    ("lr", Arity::Value),
    ("min-lr", Arity::Value),
    ("lr-decay-style", Arity::Value),
    ("lr-decay-iters", Arity::Value),
    ("lr-warmup-fraction", Arity::Value),
    ("lr-warmup-iters", Arity::Value),
    ("weight-decay", Arity::Value),
    ("clip-grad", Arity::Value),
    ("adam-beta1", Arity::Value),
    ("adam-beta2", Arity::Value),
    ("adam-eps", Arity::Value),
    ("init-method-std", Arity::Value),
    ("seed", Arity::Value),
    ("train-iters", Arity::Value),
    ("train-samples", Arity::Value),
    ("exit-interval", Arity::Value),
    ("log-interval", Arity::Value),
    ("save-interval", Arity::Value),
    ("eval-interval", Arity::Value),
    ("eval-iters", Arity::Value),
    ("save", Arity::Value),
    ("load", Arity::Value),
    ("data-path", Arity::Value),
    ("data-cache-path", Arity::Value),
    ("split", Arity::Value),
    ("vocab-file", Arity::Value),
    ("merge-file", Arity::Value),
    ("tokenizer-model", Arity::Value),
    ("tensorboard-dir", Arity::Value),
    ("distributed-backend", Arity::Value),
    ("ckpt-format", Arity::Value),
    ("dist-ckpt-strictness", Arity::Value),
    ("timing-log-level", Arity::Value),
    ("deepspeed_config", Arity::Value),
    ("deepspeed-config", Arity::Value),
    ("mock-data", Arity::Switch),
    ("log-throughput", Arity::Switch),
    ("log-params-norm", Arity::Switch),
    ("log-num-zeros-in-grad", Arity::Switch),
    ("log-validation-ppl-to-tensorboard", Arity::Switch),
    ("log-timers-to-tensorboard", Arity::Switch),
    ("log-memory-to-tensorboard", Arity::Switch),
    ("overlap-grad-reduce", Arity::Switch),
    ("overlap-param-gather", Arity::Switch),
    ("deterministic-mode", Arity::Switch),
    ("use-mcore-models", Arity::Switch),
    ("async-save", Arity::Switch),
    ("use-persistent-ckpt-worker", Arity::Switch),
    ("no-masked-softmax-fusion", Arity::Switch),
    ("no-bias-gelu-fusion", Arity::Switch),
    ("no-bias-dropout-fusion", Arity::Switch),
    ("no-bias-swiglu-fusion", Arity::Switch),
    ("no-rope-fusion", Arity::Switch),
    ("no-position-embedding", Arity::Switch),
    ("use-checkpoint-args", Arity::Switch),
    ("no-load-optim", Arity::Switch),
    ("no-load-rng", Arity::Switch),
    ("no-save-optim", Arity::Switch),
    ("no-save-rng", Arity::Switch),
    ("accumulate-allreduce-grads-in-fp32", Arity::Switch),
    ("attention-softmax-in-fp32", Arity::Switch),
    ("no-query-key-layer-scaling", Arity::Switch),
    ("rotary-percent", Arity::Value),
    ("rotary-base", Arity::Value),
    ("norm-epsilon", Arity::Value),
    ("optimizer", Arity::Value),
];

/// A launch line read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronJob {
    /// The job.
    pub job: Job,
    /// Flags dsplan does not know, each ignored with its value.
    pub warnings: Vec<String>,
}

/// Splits a launch line into words: whitespace separates, single and double quotes group,
/// a backslash before a newline continues the line.
pub fn split_words(text: &str) -> Result<Vec<String>, ParallelError> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => match chars.peek() {
                Some('\n') => {
                    chars.next();
                }
                Some(&next) => {
                    current.push(next);
                    chars.next();
                    in_word = true;
                }
                None => {}
            },
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(ParallelError::new(
            "--megatron-args",
            "an opening quote is never closed",
            "close the quote",
        ));
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

fn arity_of(name: &str) -> Option<Arity> {
    FLAGS
        .iter()
        .chain(NO_MEMORY_EFFECT.iter())
        .find(|(flag, _)| *flag == name)
        .map(|&(_, arity)| arity)
}

/// The flags of a launch line: each known flag with its value (`""` for a switch), in order,
/// the last occurrence winning as with argparse; unknown flags as warnings.
fn collect(words: &[String]) -> Result<(BTreeMap<String, String>, Vec<String>), ParallelError> {
    let mut values = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        i += 1;
        let Some(flag) = word.strip_prefix("--") else {
            warnings.push(format!(
                "`{word}` is not a flag (a value without its flag?); ignored"
            ));
            continue;
        };
        let (raw, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        let name = raw.replace('_', "-");
        let name = if name == "deepspeed-config" {
            "deepspeed_config".to_owned()
        } else {
            name
        };
        match arity_of(&name) {
            Some(Arity::Switch) => {
                if inline.is_some() {
                    return Err(ParallelError::new(
                        &format!("--{raw}"),
                        "this flag takes no value",
                        format!("write --{raw} alone"),
                    ));
                }
                values.insert(name, String::new());
            }
            Some(Arity::Value) => {
                let value = match inline {
                    Some(value) => value,
                    None => match words.get(i) {
                        Some(value) if !value.starts_with("--") => {
                            i += 1;
                            value.clone()
                        }
                        _ => {
                            return Err(ParallelError::new(
                                &format!("--{raw}"),
                                "this flag needs a value",
                                format!("write --{raw} VALUE"),
                            ));
                        }
                    },
                };
                values.insert(name, value);
            }
            None => {
                let mut skipped = String::new();
                if inline.is_none()
                    && let Some(value) = words.get(i)
                    && !value.starts_with("--")
                {
                    skipped = format!(" and its value `{value}`");
                    i += 1;
                }
                warnings.push(format!(
                    "--{raw} is not a Megatron-LM flag dsplan knows; ignored{skipped}"
                ));
            }
        }
    }
    Ok((values, warnings))
}

/// Typed access to the collected flags.
struct Flags {
    values: BTreeMap<String, String>,
}

impl Flags {
    fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    fn count(&self, name: &str) -> Result<Option<u64>, ParallelError> {
        match self.values.get(name) {
            None => Ok(None),
            Some(value) => value.parse::<u64>().map(Some).map_err(|_| {
                ParallelError::new(
                    &format!("--{name}"),
                    format!("`{value}` is not a whole number"),
                    "give an integer, as Megatron-LM's parser requires",
                )
            }),
        }
    }

    fn required(&self, name: &str) -> Result<u64, ParallelError> {
        self.count(name)?.ok_or_else(|| {
            ParallelError::new(
                &format!("--{name}"),
                "missing",
                format!("add --{name} to --megatron-args"),
            )
        })
    }

    fn probability(&self, name: &str, default: f64) -> Result<f64, ParallelError> {
        match self.values.get(name) {
            None => Ok(default),
            Some(value) => value
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    ParallelError::new(
                        &format!("--{name}"),
                        format!("`{value}` is not a probability"),
                        "give a number between 0 and 1",
                    )
                }),
        }
    }
}

fn refuse_unmodelled(flags: &Flags) -> Result<(), ParallelError> {
    let refusals: [(&str, &str); 9] = [
        ("num-experts", "mixture-of-experts layers"),
        ("multi-latent-attention", "multi-latent attention"),
        ("mtp-num-layers", "multi-token prediction"),
        ("hybrid-layer-pattern", "hybrid Mamba-Transformer models"),
        ("pipeline-model-parallel-layout", "custom pipeline layouts"),
        (
            "decoder-first-pipeline-num-layers",
            "uneven pipeline stages",
        ),
        ("decoder-last-pipeline-num-layers", "uneven pipeline stages"),
        (
            "account-for-embedding-in-pipeline-split",
            "uneven pipeline stages",
        ),
        (
            "account-for-loss-in-pipeline-split",
            "uneven pipeline stages",
        ),
    ];
    for (flag, what) in refusals {
        if flags.has(flag) {
            return Err(ParallelError::new(
                &format!("--{flag}"),
                format!("{what} are not modelled by dsplan's 3D estimate"),
                format!("drop --{flag} (the estimate would be wrong with it)"),
            ));
        }
    }
    for (flag, what) in [
        ("context-parallel-size", "context parallelism"),
        ("expert-model-parallel-size", "expert parallelism"),
    ] {
        if flags.count(flag)?.is_some_and(|size| size > 1) {
            return Err(ParallelError::new(
                &format!("--{flag}"),
                format!("{what} is not modelled by dsplan's 3D estimate"),
                format!("use --{flag} 1"),
            ));
        }
    }
    Ok(())
}

fn shape(flags: &Flags) -> Result<TransformerShape, ParallelError> {
    let layers = flags.required("num-layers")?;
    let hidden = flags.required("hidden-size")?;
    let heads = flags.required("num-attention-heads")?;
    if layers == 0 || hidden == 0 || heads == 0 {
        return Err(ParallelError::new(
            "--num-layers",
            "layers, hidden size and heads must be at least 1",
            "give positive sizes",
        ));
    }
    let mlp = if flags.has("swiglu") {
        Mlp::SwiGlu
    } else {
        Mlp::Gelu
    };
    let ffn_hidden = match flags.count("ffn-hidden-size")? {
        Some(ffn) => ffn,
        // arguments.py: a multiple of 64 near 8h/3 for SwiGLU, 4h otherwise.
        None => match mlp {
            Mlp::SwiGlu => (4 * hidden * 2 / 3) / 64 * 64,
            Mlp::Gelu => 4 * hidden,
        },
    };
    let kv_channels = match flags.count("kv-channels")? {
        Some(channels) => channels,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(ParallelError::new(
                "--kv-channels",
                format!(
                    "--hidden-size {hidden} is not a multiple of --num-attention-heads {heads}, so the head width must be given"
                ),
                "add --kv-channels",
            ));
        }
    };
    let query_groups = if flags.has("group-query-attention") {
        flags.count("num-query-groups")?.unwrap_or(1)
    } else {
        heads
    };
    if query_groups == 0 || !heads.is_multiple_of(query_groups) {
        return Err(ParallelError::new(
            "--num-query-groups",
            format!("{heads} heads cannot be grouped over {query_groups} query groups"),
            "give a number of groups that divides the heads",
        ));
    }
    let norm = match flags.text("normalization") {
        None | Some("LayerNorm") => Norm::LayerNorm,
        Some("RMSNorm") => Norm::RmsNorm,
        Some(other) => {
            return Err(ParallelError::new(
                "--normalization",
                format!("`{other}` is not modelled"),
                "use LayerNorm or RMSNorm",
            ));
        }
    };
    let bias = if flags.has("disable-bias-linear") {
        if flags.has("add-qkv-bias") {
            LinearBias::QkvOnly
        } else {
            LinearBias::None
        }
    } else {
        LinearBias::All
    };
    let seq = flags.required("seq-length")?;
    let positions = match flags.text("position-embedding-type") {
        _ if flags.has("use-rotary-position-embeddings") => Positions::Rotary,
        None | Some("learned_absolute") => Positions::Learned {
            rows: flags.count("max-position-embeddings")?.unwrap_or(seq),
        },
        Some("rope" | "mrope" | "yarn" | "none" | "relative") => Positions::Rotary,
        Some(other) => {
            return Err(ParallelError::new(
                "--position-embedding-type",
                format!("`{other}` is not a position embedding type dsplan knows"),
                "use learned_absolute, rope or none",
            ));
        }
    };
    let vocab = match (flags.count("vocab-size")?, flags.text("tokenizer-type")) {
        (Some(vocab), _) => vocab,
        (None, Some("GPT2BPETokenizer")) => 50257,
        (None, tokenizer) => {
            return Err(ParallelError::new(
                "--vocab-size",
                format!(
                    "the vocabulary size is unknown ({})",
                    tokenizer.map_or("no --tokenizer-type".to_owned(), |t| format!(
                        "dsplan cannot read tokenizer {t}"
                    ))
                ),
                "add --vocab-size with the tokenizer's vocabulary (before padding)",
            ));
        }
    };
    if vocab == 0 {
        return Err(ParallelError::new(
            "--vocab-size",
            "an empty vocabulary",
            "give the tokenizer's vocabulary",
        ));
    }
    let divisible_by = match flags.values.get("make-vocab-size-divisible-by") {
        None => 128,
        Some(value) => value
            .parse::<i64>()
            .ok()
            .filter(|v| *v > 0)
            .map(|v| v as u64)
            .ok_or_else(|| {
                ParallelError::new(
                    "--make-vocab-size-divisible-by",
                    format!("the vocabulary cannot be padded to a multiple of `{value}`"),
                    "give a positive integer (Megatron-LM's default is 128)",
                )
            })?,
    };
    Ok(TransformerShape {
        layers,
        hidden,
        heads,
        query_groups,
        kv_channels,
        ffn_hidden,
        vocab,
        padding: VocabPadding::DivisibleBy { divisible_by },
        mlp,
        norm,
        bias,
        positions,
        embeddings: if flags.has("untie-embeddings-and-output-weights") {
            Embeddings::Untied
        } else {
            Embeddings::Tied
        },
    })
}

fn recompute(flags: &Flags) -> Result<Recompute, ParallelError> {
    let granularity = match (
        flags.text("recompute-granularity"),
        flags.has("recompute-activations"),
    ) {
        (None, false) => return Ok(Recompute::None),
        (None, true) | (Some("selective"), _) => return Ok(Recompute::Selective),
        (Some("full"), _) => "full",
        (Some(other), _) => {
            return Err(ParallelError::new(
                "--recompute-granularity",
                format!("`{other}` is not a granularity"),
                "use full or selective",
            ));
        }
    };
    debug_assert_eq!(granularity, "full");
    let method = match flags.text("recompute-method") {
        Some("uniform") => RecomputeMethod::Uniform,
        Some("block") => RecomputeMethod::Block,
        Some(other) => {
            return Err(ParallelError::new(
                "--recompute-method",
                format!("`{other}` is not a method"),
                "use uniform or block",
            ));
        }
        None => {
            return Err(ParallelError::new(
                "--recompute-method",
                "full recomputation needs a method (Megatron-LM raises \"Invalid activation recompute method\")",
                "add --recompute-method uniform (or block) and --recompute-num-layers",
            ));
        }
    };
    Ok(Recompute::Full {
        method,
        layers: flags.count("recompute-num-layers")?.unwrap_or(1),
    })
}

/// Reads a launch line for `world` GPUs.
pub fn parse(text: &str, world: u64) -> Result<MegatronJob, ParallelErrors> {
    let words = split_words(text)?;
    let (values, warnings) = collect(&words)?;
    let flags = Flags { values };
    refuse_unmodelled(&flags)?;
    let shape = shape(&flags)?;
    let mut names = FlagNames::megatron();
    let tensor = flags.count("tensor-model-parallel-size")?.unwrap_or(1);
    let pipeline = flags.count("pipeline-model-parallel-size")?.unwrap_or(1);
    let ulysses = flags.count("ds-sequence-parallel-size")?.unwrap_or(1);
    if tensor == 0 || pipeline == 0 || ulysses == 0 {
        return Err(ParallelError::new(
            "--tensor-model-parallel-size",
            "parallel sizes must be at least 1",
            "give positive sizes",
        )
        .into());
    }
    let sequence = match (flags.has("sequence-parallel"), ulysses) {
        (false, 1) => SequenceParallel::Off,
        (true, 1) => SequenceParallel::Megatron,
        (false, degree) => {
            names.sequence = "--ds-sequence-parallel-size".into();
            SequenceParallel::Ulysses { degree }
        }
        (true, _) => {
            return Err(ParallelError::new(
                "--ds-sequence-parallel-size",
                "DeepSpeed's sequence parallelism cannot be combined with --sequence-parallel (Megatron-DeepSpeed refuses)",
                "keep one of the two",
            )
            .into());
        }
    };
    let schedule = match (
        flags.count("num-layers-per-virtual-pipeline-stage")?,
        flags.count("num-virtual-stages-per-pipeline-rank")?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ParallelError::new(
                "--num-virtual-stages-per-pipeline-rank",
                "only one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank may be set",
                "keep one",
            )
            .into());
        }
        (Some(per_stage), None) => {
            if per_stage == 0
                || !shape.layers.is_multiple_of(pipeline)
                || !(shape.layers / pipeline).is_multiple_of(per_stage)
            {
                return Err(ParallelError::new(
                    "--num-layers-per-virtual-pipeline-stage",
                    format!(
                        "{} layers over {pipeline} pipeline stages do not make virtual stages of {per_stage} layers",
                        shape.layers
                    ),
                    "give a number of layers that divides the layers per pipeline stage",
                )
                .into());
            }
            match shape.layers / pipeline / per_stage {
                1 => PipelineSchedule::OneForwardOneBackward,
                virtual_stages => PipelineSchedule::Interleaved { virtual_stages },
            }
        }
        (None, Some(virtual_stages)) => {
            names.virtual_stages = "--num-virtual-stages-per-pipeline-rank".into();
            match virtual_stages {
                0 => {
                    return Err(ParallelError::new(
                        "--num-virtual-stages-per-pipeline-rank",
                        "0 virtual stages",
                        "give at least 1",
                    )
                    .into());
                }
                1 => PipelineSchedule::OneForwardOneBackward,
                virtual_stages => PipelineSchedule::Interleaved { virtual_stages },
            }
        }
        (None, None) => PipelineSchedule::OneForwardOneBackward,
    };
    let data = data_degree(world, tensor, pipeline, ulysses, &names)?;
    let micro_batch = flags.required("micro-batch-size")?;
    let global_batch = flags
        .count("global-batch-size")?
        .unwrap_or(micro_batch * data);
    let precision = match (flags.has("bf16"), flags.has("fp16")) {
        (true, true) => {
            return Err(
                ParallelError::new("--fp16", "--bf16 and --fp16 are both set", "keep one").into(),
            );
        }
        (true, false) => Precision::Bf16,
        (false, true) => Precision::Fp16,
        (false, false) => Precision::Fp32,
    };
    let runtime = match flags.count("zero-stage")? {
        Some(stage) => {
            let zero = ZeroStage::from_number(stage).ok_or_else(|| {
                ParallelError::new(
                    "--zero-stage",
                    format!("ZeRO stage {stage} does not exist"),
                    "use 0, 1, 2 or 3",
                )
            })?;
            names.sharding = "--zero-stage".into();
            Runtime::DeepSpeed {
                zero,
                reduce_bucket: 500_000_000,
            }
        }
        None => Runtime::MegatronLm {
            optimizer: if flags.has("use-distributed-optimizer") {
                OptimizerSharding::Distributed
            } else {
                OptimizerSharding::Replicated
            },
        },
    };
    let attention = match (
        flags.text("transformer-impl"),
        flags.text("attention-backend"),
    ) {
        (_, Some("unfused" | "local")) | (Some("local"), None)
            if !flags.has("use-flash-attn") && !flags.has("use-flash-attn-v2") =>
        {
            AttentionKernel::Eager
        }
        _ => AttentionKernel::Flash,
    };
    let dropout = Dropout {
        hidden: if flags.probability("hidden-dropout", 0.1)? > 0.0 {
            DropoutUse::Applied
        } else {
            DropoutUse::Skipped
        },
        attention: if flags.probability("attention-dropout", 0.1)? > 0.0 {
            DropoutUse::Applied
        } else {
            DropoutUse::Skipped
        },
    };
    let job = Job {
        shape,
        layout: Layout {
            tensor,
            pipeline,
            schedule,
            sequence,
            data,
        },
        batch: Batch {
            seq_len: flags.required("seq-length")?,
            micro_batch,
            global_batch,
        },
        training: Training {
            precision,
            runtime,
            recompute: recompute(&flags)?,
            attention,
            dropout,
            gradient_fusion: if flags.has("no-gradient-accumulation-fusion") {
                GradientAccumulationFusion::Unfused
            } else {
                GradientAccumulationFusion::Fused
            },
        },
        names,
    };
    super::checks::check(&job)?;
    Ok(MegatronJob { job, warnings })
}
