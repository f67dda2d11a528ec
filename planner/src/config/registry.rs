//! Data tables about DeepSpeed 0.19.8's config surface that the validator and resolver consult:
//! deprecated keys, removed features, alternative spellings, optimizers and their constructor
//! arguments, LR schedulers and their parameters, and the places the Hugging Face Trainer fills
//! `"auto"`.
//!
//! Pointers are JSON pointers (RFC 6901) into a `ds_config.json`; `""` is the top level.

use serde_json::Value;

/// A key DeepSpeed still accepts but warns about (or, for `aio.thread_count`, documents but
/// never reads), with what to write instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeprecatedKey {
    /// Pointer of the section holding the key (`""` for the top level).
    pub parent: &'static str,
    /// The deprecated key.
    pub old: &'static str,
    /// What replaces it (a key, or a key with a value).
    pub replacement: &'static str,
    /// What DeepSpeed does with the old key.
    pub note: &'static str,
    /// What happens when the old key and its replacement are both given.
    pub with_replacement: WithReplacement,
}

/// What DeepSpeed does when a deprecated key and its replacement are both present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithReplacement {
    /// It refuses the config ("Cannot provide deprecated parameter … together").
    Refused,
    /// It reads the replacement and ignores the old key.
    OldIgnored,
    /// The replacement lives elsewhere, or is a different form of the same key: no clash.
    NoClash,
}

/// Every deprecated key of DeepSpeed 0.19.8's config.
pub const DEPRECATED_KEYS: &[DeprecatedKey] = &[
    DeprecatedKey {
        parent: "/zero_optimization",
        old: "cpu_offload",
        replacement: "offload_optimizer",
        note: "`true` becomes `offload_optimizer: {\"device\": \"cpu\"}`; giving both is an error",
        with_replacement: WithReplacement::Refused,
    },
    DeprecatedKey {
        parent: "/zero_optimization",
        old: "cpu_offload_param",
        replacement: "offload_param",
        note: "`true` becomes `offload_param: {\"device\": \"cpu\"}`; giving both is an error",
        with_replacement: WithReplacement::Refused,
    },
    DeprecatedKey {
        parent: "/zero_optimization",
        old: "cpu_offload_use_pin_memory",
        replacement: "pin_memory in offload_param / offload_optimizer",
        note: "logs a warning and has no effect",
        with_replacement: WithReplacement::NoClash,
    },
    DeprecatedKey {
        parent: "/zero_optimization",
        old: "stage3_gather_fp16_weights_on_model_save",
        replacement: "stage3_gather_16bit_weights_on_model_save",
        note: "its value is moved to the new key; giving both is an error",
        with_replacement: WithReplacement::Refused,
    },
    DeprecatedKey {
        parent: "/zero_optimization",
        old: "elastic_checkpoint",
        replacement: "checkpoint.load_universal",
        note: "ZeRO-3 no longer supports elastic checkpoints (a warning); universal checkpoints replace them",
        with_replacement: WithReplacement::NoClash,
    },
    DeprecatedKey {
        parent: "",
        old: "bfloat16",
        replacement: "bf16",
        note: "read only when `bf16` is absent",
        with_replacement: WithReplacement::OldIgnored,
    },
    DeprecatedKey {
        parent: "",
        old: "zero_optimization",
        replacement: "zero_optimization: {\"stage\": N}",
        note: "the boolean form: `true` means stage 1 (with `allgather_size`), `false` stage 0; logs a warning",
        with_replacement: WithReplacement::NoClash,
    },
    DeprecatedKey {
        parent: "",
        old: "allgather_size",
        replacement: "zero_optimization.allgather_bucket_size",
        note: "read only with the boolean `zero_optimization` form",
        with_replacement: WithReplacement::NoClash,
    },
    DeprecatedKey {
        parent: "/aio",
        old: "thread_count",
        replacement: "intra_op_parallelism",
        note: "named in DeepSpeed's docs but never read: silently ignored",
        with_replacement: WithReplacement::NoClash,
    },
];

/// A key DeepSpeed 0.19.8 refuses outright: a removed feature's section, or an argument it
/// always rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedFeature {
    /// Pointer of the section holding the key (`""` for the top level).
    pub parent: &'static str,
    /// The refused key.
    pub key: &'static str,
    /// DeepSpeed's error message.
    pub message: &'static str,
    /// What to use instead, when anything.
    pub replacement: Option<&'static str>,
}

/// Every key DeepSpeed 0.19.8 refuses (the first twelve at config parsing, `max_grad_norm`
/// when it builds the optimizer).
pub const REMOVED_FEATURES: &[RemovedFeature] = &[
    RemovedFeature {
        parent: "",
        key: "nebula",
        message: "Nebula checkpointing has been removed. A leftover 'nebula' block would be ignored and checkpoints would silently fall back to local torch.save. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "compression_training",
        message: "The DeepSpeed compression library has been removed. A leftover 'compression_training' block would be ignored and the model would train unquantized. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "amp",
        message: "NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' instead. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: Some("fp16, bf16 or torch_autocast"),
    },
    RemovedFeature {
        parent: "",
        key: "quantize_training",
        message: "Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "sparse_gradients",
        message: "Sparse compression of dense torch.nn.Embedding gradients has been removed. A leftover 'sparse_gradients' flag would be ignored and those gradients would be reduced dense. Gradients from an embedding constructed with sparse=True are still reduced sparsely and need no config flag. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "eigenvalue",
        message: "Eigenvalue-based Mixture-of-Quantization (MoQ) has been removed; the standalone 'eigenvalue' configuration block is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "sparse_attention",
        message: "DeepSpeed Sparse Attention has been removed; the 'sparse_attention' configuration block is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "elasticity",
        message: "Elastic training has been removed; the 'elasticity' configuration block is no longer supported. Set train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps directly. ",
        replacement: Some(
            "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps",
        ),
    },
    RemovedFeature {
        parent: "",
        key: "graph_harvesting",
        message: "Graph harvesting has been removed; the 'graph_harvesting' configuration option is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "",
        key: "curriculum_learning",
        message: "Legacy top-level 'curriculum_learning' has been removed. Use 'data_efficiency.data_sampling.curriculum_learning' instead. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: Some("data_efficiency.data_sampling.curriculum_learning"),
    },
    RemovedFeature {
        parent: "",
        key: "progressive_layer_drop",
        message: "Progressive Layer Dropping has been removed; the 'progressive_layer_drop' configuration block is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "/zero_optimization",
        key: "mics_shard_size",
        message: "MiCS ZeRO-3 sharding has been removed; 'zero_optimization.mics_shard_size' is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "/zero_optimization",
        key: "mics_hierarchical_params_gather",
        message: "MiCS ZeRO-3 sharding has been removed; 'zero_optimization.mics_hierarchical_params_gather' is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "/zero_optimization",
        key: "zeropp_loco_param",
        message: "LoCo-Zero++ has been removed; 'zero_optimization.zeropp_loco_param' is no longer supported. Remove this key to use standard ZeRO++ quantized gradients without LoCo error feedback. See https://github.com/deepspeedai/DeepSpeed/issues/8489.",
        replacement: None,
    },
    RemovedFeature {
        parent: "/optimizer/params",
        key: "max_grad_norm",
        message: "'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed parameter 'gradient_clipping' see: https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details",
        replacement: Some("gradient_clipping"),
    },
];

/// A second spelling of a key: DeepSpeed's pydantic models accept a field by its name and by
/// its alias (`populate_by_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAlias {
    /// Pointer of the section holding the key.
    pub parent: &'static str,
    /// The other spelling.
    pub alias: &'static str,
    /// The spelling dsplan writes (and the Hugging Face Trainer reads).
    pub canonical: &'static str,
}

/// Every alternative spelling of a key. The `stage3_*` spellings are canonical: DeepSpeed's
/// docs and the Hugging Face Trainer use them.
pub const ALIASES: &[KeyAlias] = &[
    KeyAlias {
        parent: "/zero_optimization",
        alias: "prefetch_bucket_size",
        canonical: "stage3_prefetch_bucket_size",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "param_persistence_threshold",
        canonical: "stage3_param_persistence_threshold",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "model_persistence_threshold",
        canonical: "stage3_model_persistence_threshold",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "max_live_parameters",
        canonical: "stage3_max_live_parameters",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "max_reuse_distance",
        canonical: "stage3_max_reuse_distance",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "gather_16bit_weights_on_model_save",
        canonical: "stage3_gather_16bit_weights_on_model_save",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "module_granularity_threshold",
        canonical: "stage3_module_granularity_threshold",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "use_all_reduce_for_fetch_params",
        canonical: "stage3_use_all_reduce_for_fetch_params",
    },
    KeyAlias {
        parent: "/zero_optimization",
        alias: "allgather_sequential",
        canonical: "stage3_allgather_sequential",
    },
    KeyAlias {
        parent: "/tensor_parallel",
        alias: "tp",
        canonical: "tensor_parallel",
    },
    KeyAlias {
        parent: "/tensor_parallel",
        alias: "kernel_inject",
        canonical: "replace_with_kernel_inject",
    },
];

/// Every place Hugging Face replaces `"auto"`: the Trainer (transformers'
/// `HfTrainerDeepSpeedConfig`) with a value from the training arguments or the model, and
/// Accelerate's `_prepare_deepspeed` (which the Trainer also goes through) for
/// `stage3_gather_16bit_weights_on_model_save` (false) and `gradient_clipping` (1.0 when the
/// Trainer left it). dsplan accepts `"auto"` exactly here (and under the canonical spelling
/// only).
pub const AUTO_KEYS: &[&str] = &[
    "/train_batch_size",
    "/train_micro_batch_size_per_gpu",
    "/gradient_accumulation_steps",
    "/gradient_clipping",
    "/optimizer/params/lr",
    "/optimizer/params/betas",
    "/optimizer/params/eps",
    "/optimizer/params/weight_decay",
    "/scheduler/params/warmup_min_lr",
    "/scheduler/params/warmup_max_lr",
    "/scheduler/params/total_num_steps",
    "/scheduler/params/warmup_num_steps",
    "/fp16/enabled",
    "/bf16/enabled",
    "/zero_optimization/reduce_bucket_size",
    "/zero_optimization/stage3_prefetch_bucket_size",
    "/zero_optimization/stage3_param_persistence_threshold",
    "/zero_optimization/stage3_gather_16bit_weights_on_model_save",
];

/// How DeepSpeed matches an optimizer `type` against a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameMatching {
    /// Any letter case (DeepSpeed lower-cases its own optimizer names).
    CaseInsensitive,
    /// Exactly (a `torch.optim` attribute).
    Exact,
}

/// Who implements an optimizer DeepSpeed builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerOrigin {
    /// DeepSpeed itself (fused GPU kernels, or its CPU version under optimizer offload).
    DeepSpeed,
    /// The `mup` package (must be installed).
    Mup,
    /// `torch.optim`.
    Torch,
    /// Removed from DeepSpeed: the name now falls through to `torch.optim` and fails.
    Removed,
}

/// An optimizer `type` DeepSpeed 0.19.8 can build, and the `params` names its constructor (or
/// DeepSpeed, for the switches it consumes) takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerSpec {
    /// The name as usually written.
    pub name: &'static str,
    /// How `type` is compared with `name`.
    pub matching: NameMatching,
    /// Who implements it.
    pub origin: OptimizerOrigin,
    /// Accepted `params` names; anything else fails in the constructor.
    pub params: &'static [&'static str],
    /// What is worth knowing.
    pub note: &'static str,
}

const ADAM_PARAMS: &[&str] = &[
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "bias_correction",
    "amsgrad",
    "set_grad_none",
    "adam_w_mode",
    "torch_adam",
    "fp32_optimizer_states",
    "foreach",
];

const TORCH_ADAM_PARAMS: &[&str] = &[
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "foreach",
    "maximize",
    "capturable",
    "differentiable",
    "fused",
];

/// Every optimizer name DeepSpeed 0.19.8 resolves (its own, case-insensitively), the common
/// `torch.optim` classes (exact names), and the 1-bit optimizers it no longer has.
pub const OPTIMIZERS: &[OptimizerSpec] = &[
    OptimizerSpec {
        name: "Adam",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: ADAM_PARAMS,
        note: "FusedAdam on GPU, DeepSpeedCPUAdam under optimizer offload, torch.optim.Adam(W) with torch_adam; AdamW (decoupled weight decay) unless adam_w_mode is false; amsgrad unsupported",
    },
    OptimizerSpec {
        name: "AdamW",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: ADAM_PARAMS,
        note: "as Adam, always with decoupled weight decay",
    },
    OptimizerSpec {
        name: "Adagrad",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: &[
            "lr",
            "eps",
            "weight_decay",
            "amsgrad",
            "fp32_optimizer_states",
            "lr_decay",
            "initial_accumulator_value",
            "foreach",
            "maximize",
            "differentiable",
            "fused",
        ],
        note: "DeepSpeedCPUAdagrad under optimizer offload (lr, eps, weight_decay, amsgrad, fp32_optimizer_states), torch.optim.Adagrad otherwise",
    },
    OptimizerSpec {
        name: "Lamb",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: &[
            "lr",
            "betas",
            "eps",
            "eps_inside_sqrt",
            "weight_decay",
            "bias_correction",
            "max_coeff",
            "min_coeff",
            "amsgrad",
        ],
        note: "FusedLamb; needs dynamic loss scaling (fails under bf16) and zero_allow_untested_optimizer under ZeRO",
    },
    OptimizerSpec {
        name: "Lion",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: &[
            "lr",
            "betas",
            "weight_decay",
            "set_grad_none",
            "fp32_optimizer_states",
        ],
        note: "FusedLion on GPU, DeepSpeedCPULion under optimizer offload",
    },
    OptimizerSpec {
        name: "Muon",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::DeepSpeed,
        params: &[
            "lr",
            "momentum",
            "weight_decay",
            "ns_method",
            "betas",
            "eps",
            "muon_lr",
            "adam_lr",
            "adam_w_mode",
            "torch_adam",
            "fp32_optimizer_states",
        ],
        note: "Muon for parameters tagged use_muon, an auxiliary Adam for the rest",
    },
    OptimizerSpec {
        name: "MuAdam",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Mup,
        params: TORCH_ADAM_PARAMS,
        note: "from the mup package",
    },
    OptimizerSpec {
        name: "MuAdamW",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Mup,
        params: TORCH_ADAM_PARAMS,
        note: "from the mup package",
    },
    OptimizerSpec {
        name: "MuSGD",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Mup,
        params: &["lr", "momentum", "dampening", "weight_decay", "nesterov"],
        note: "from the mup package",
    },
    OptimizerSpec {
        name: "SGD",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "momentum",
            "dampening",
            "weight_decay",
            "nesterov",
            "maximize",
            "foreach",
            "differentiable",
            "fused",
        ],
        note: "torch.optim.SGD; untested under ZeRO (needs zero_allow_untested_optimizer)",
    },
    OptimizerSpec {
        name: "RMSprop",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "alpha",
            "eps",
            "weight_decay",
            "momentum",
            "centered",
            "capturable",
            "foreach",
            "maximize",
            "differentiable",
        ],
        note: "torch.optim.RMSprop",
    },
    OptimizerSpec {
        name: "Adadelta",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "rho",
            "eps",
            "weight_decay",
            "foreach",
            "capturable",
            "maximize",
            "differentiable",
        ],
        note: "torch.optim.Adadelta",
    },
    OptimizerSpec {
        name: "Adamax",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "foreach",
            "maximize",
            "differentiable",
            "capturable",
        ],
        note: "torch.optim.Adamax",
    },
    OptimizerSpec {
        name: "NAdam",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "momentum_decay",
            "decoupled_weight_decay",
            "foreach",
            "maximize",
            "capturable",
            "differentiable",
        ],
        note: "torch.optim.NAdam",
    },
    OptimizerSpec {
        name: "RAdam",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "decoupled_weight_decay",
            "foreach",
            "maximize",
            "capturable",
            "differentiable",
        ],
        note: "torch.optim.RAdam",
    },
    OptimizerSpec {
        name: "Adafactor",
        matching: NameMatching::Exact,
        origin: OptimizerOrigin::Torch,
        params: &[
            "lr",
            "beta2_decay",
            "eps",
            "d",
            "weight_decay",
            "foreach",
            "maximize",
        ],
        note: "torch.optim.Adafactor",
    },
    OptimizerSpec {
        name: "OneBitAdam",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Removed,
        params: &[],
        note: "the 1-bit optimizers were removed before 0.19.8: the config still parses, but building the optimizer fails (no such torch.optim class)",
    },
    OptimizerSpec {
        name: "ZeroOneAdam",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Removed,
        params: &[],
        note: "removed with the other 1-bit optimizers",
    },
    OptimizerSpec {
        name: "OneBitLamb",
        matching: NameMatching::CaseInsensitive,
        origin: OptimizerOrigin::Removed,
        params: &[],
        note: "removed with the other 1-bit optimizers",
    },
];

/// The optimizer entry a `type` string selects, applying DeepSpeed's matching rules.
pub fn optimizer_spec(kind: &str) -> Option<&'static OptimizerSpec> {
    OPTIMIZERS.iter().find(|spec| match spec.matching {
        NameMatching::CaseInsensitive => spec.name.eq_ignore_ascii_case(kind),
        NameMatching::Exact => spec.name == kind,
    })
}

/// Whether a scheduler parameter must be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// The constructor fails without it.
    Required,
    /// It has a default.
    Optional,
}

/// One constructor parameter of a DeepSpeed LR scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerParam {
    /// The `params` key.
    pub name: &'static str,
    /// Whether it must be given.
    pub requirement: Requirement,
    /// The default, as DeepSpeed writes it (`""` when required).
    pub default: &'static str,
}

/// A DeepSpeed LR scheduler and its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerSpec {
    /// The `type` (case-sensitive).
    pub name: &'static str,
    /// Its constructor parameters (besides the optimizer).
    pub params: &'static [SchedulerParam],
}

const fn required(name: &'static str) -> SchedulerParam {
    SchedulerParam {
        name,
        requirement: Requirement::Required,
        default: "",
    }
}

const fn optional(name: &'static str, default: &'static str) -> SchedulerParam {
    SchedulerParam {
        name,
        requirement: Requirement::Optional,
        default,
    }
}

/// DeepSpeed 0.19.8's five LR schedulers (`runtime/lr_schedules.py`).
pub const SCHEDULERS: &[SchedulerSpec] = &[
    SchedulerSpec {
        name: "LRRangeTest",
        params: &[
            optional("lr_range_test_min_lr", "0.001"),
            optional("lr_range_test_step_size", "2000"),
            optional("lr_range_test_step_rate", "1.0"),
            optional("lr_range_test_staircase", "false"),
            optional("last_batch_iteration", "-1"),
        ],
    },
    SchedulerSpec {
        name: "OneCycle",
        params: &[
            required("cycle_min_lr"),
            required("cycle_max_lr"),
            optional("decay_lr_rate", "0.0"),
            optional("cycle_first_step_size", "2000"),
            optional("cycle_second_step_size", "null (= cycle_first_step_size)"),
            optional("cycle_first_stair_count", "0"),
            optional("cycle_second_stair_count", "null"),
            optional("decay_step_size", "0"),
            optional("cycle_momentum", "true"),
            optional("cycle_min_mom", "0.8"),
            optional("cycle_max_mom", "0.9"),
            optional("decay_mom_rate", "0.0"),
            optional("last_batch_iteration", "-1"),
        ],
    },
    SchedulerSpec {
        name: "WarmupLR",
        params: &[
            optional("warmup_min_lr", "0.0"),
            optional("warmup_max_lr", "null (= the optimizer's lr)"),
            optional("warmup_num_steps", "1000"),
            optional("warmup_type", "log"),
            optional("last_batch_iteration", "-1"),
        ],
    },
    SchedulerSpec {
        name: "WarmupDecayLR",
        params: &[
            required("total_num_steps"),
            optional("warmup_min_lr", "0.0"),
            optional("warmup_max_lr", "0.001"),
            optional("warmup_num_steps", "1000"),
            optional("warmup_type", "log"),
            optional("last_batch_iteration", "-1"),
        ],
    },
    SchedulerSpec {
        name: "WarmupCosineLR",
        params: &[
            required("total_num_steps"),
            optional("warmup_min_ratio", "0.0"),
            optional("warmup_num_steps", "1000"),
            optional("cos_min_ratio", "0.0001"),
            optional("warmup_type", "log"),
            optional("last_batch_iteration", "-1"),
        ],
    },
];

/// The DeepSpeed scheduler named `kind` (case-sensitive, as DeepSpeed looks it up).
pub fn scheduler_spec(kind: &str) -> Option<&'static SchedulerSpec> {
    SCHEDULERS.iter().find(|spec| spec.name == kind)
}

/// The removed feature at `parent`/`key`, if that key is refused.
pub fn removed_feature(parent: &str, key: &str) -> Option<&'static RemovedFeature> {
    REMOVED_FEATURES
        .iter()
        .find(|f| f.parent == parent && f.key == key)
}

/// The deprecation entry of `parent`/`key`, if that key is deprecated.
pub fn deprecated_key(parent: &str, key: &str) -> Option<&'static DeprecatedKey> {
    DEPRECATED_KEYS
        .iter()
        .find(|d| d.parent == parent && d.old == key)
}

/// Every top-level key DeepSpeed 0.19.8 reads (deprecated ones included, removed ones and
/// `$schema` excluded), in schema order.
pub fn known_top_level_keys() -> Vec<String> {
    let schema = super::schema::schema();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .keys()
                .filter(|key| key.as_str() != "$schema" && removed_feature("", key).is_none())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}
