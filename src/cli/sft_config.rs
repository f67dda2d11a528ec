//! The `SFTConfig` fields (TRL 1.16) a `--training-args` file may hold next to the
//! `TrainingArguments` ones, read when `dsplan run --data` is a fine-tuning dataset.
//!
//! Every key of the file is one of three kinds:
//! * read: the fields that shape the data and the run ([`SftConfig`]);
//! * inert: fields of `TrainingArguments` / `SFTConfig` that change nothing here (logging,
//!   saving, hub, dataloader workers, ...), named in one note;
//! * refused: a field dsplan cannot honour at a value other than its default, named with the
//!   value and the fix, as are keys that are neither (a typo).
//!
//! The fields the planner's `TrainingArgs` reads (batch sizes, learning rate, Adam, `max_steps`,
//! `warmup_steps`, ...) are read there; they count as read here.

use dsplan_planner::resolve::json_fields::JsonFields;
use dsplan_sft::{AssistantLoss, CompletionLoss, OverLength, Packing, PrepareSettings, Sampling};
use serde_json::{Map, Value};

/// What the `SFTConfig` fields of a `--training-args` file ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct SftConfig {
    /// `max_length`, `truncation_mode`, `completion_only_loss`, `assistant_only_loss`,
    /// `packing`.
    pub prepare: PrepareSettings,
    /// `dataset_text_field` (default "text").
    pub text_field: String,
    /// `eval_strategy` / `eval_steps`.
    pub eval: EvalStrategy,
    /// `per_device_eval_batch_size` (default 8).
    pub eval_batch_size: usize,
    /// `train_sampling_strategy` (default "random") with `data_seed` or `seed`.
    pub sampling: SamplingChoice,
    /// `num_train_epochs` (default 3.0): the steps when neither `--steps` nor `max_steps` say.
    pub epochs: f64,
    /// `lr_scheduler_type` (default "linear").
    pub lr_scheduler: LrScheduler,
    /// Whether `lr_scheduler_type` was given.
    pub lr_scheduler_given: bool,
    /// The inert fields the file gives (for the note).
    pub inert: Vec<String>,
}

/// When the eval loss is computed (`eval_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalStrategy {
    /// `"no"`: at the end of training only (as `trainer.evaluate()` after `train()`).
    AtEnd,
    /// `"steps"`: every `eval_steps` optimizer steps, and at the end.
    EverySteps(u64),
    /// `"epoch"`: at the end of every epoch, and at the end.
    EveryEpoch,
}

/// `train_sampling_strategy`, the seed still to be settled (`--seed` when the file has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplingChoice {
    /// `"sequential"`.
    Sequential,
    /// `"random"`, with the file's `data_seed` or `seed` if it gives one.
    Random(Option<u64>),
}

impl SamplingChoice {
    /// The sampling, `seed` standing in when the file gave none.
    pub fn with_default_seed(self, seed: u64) -> Sampling {
        match self {
            SamplingChoice::Sequential => Sampling::Sequential,
            SamplingChoice::Random(given) => Sampling::Random {
                seed: given.unwrap_or(seed),
            },
        }
    }
}

/// `lr_scheduler_type`: the Trainer's schedule, used when the DeepSpeed config has no
/// `scheduler` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LrScheduler {
    /// `"linear"` (the Trainer's default): not run by dsplan without a `scheduler` block.
    Linear,
    /// `"constant"`.
    Constant,
    /// `"constant_with_warmup"`.
    ConstantWithWarmup,
    /// Another name: not run by dsplan without a `scheduler` block.
    Other,
}

/// Fields of transformers 5.23's `TrainingArguments` and TRL 1.16's `SFTConfig` that change
/// nothing in `dsplan run` (logging, saving, hub, dataloader, distributed launch details).
const INERT: &[&str] = &[
    "output_dir",
    "optim",
    "optim_args",
    "optim_target_modules",
    "tf32",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "torch_compile",
    "torch_compile_backend",
    "torch_compile_mode",
    "liger_kernel_config",
    "use_cache",
    "torch_empty_cache_steps",
    "logging_strategy",
    "logging_steps",
    "logging_first_step",
    "log_on_each_node",
    "logging_nan_inf_filter",
    "include_num_input_tokens_seen",
    "log_level",
    "log_level_replica",
    "disable_tqdm",
    "report_to",
    "run_name",
    "project",
    "trackio_space_id",
    "trackio_bucket_id",
    "trackio_static_space_id",
    "eval_delay",
    "prediction_loss_only",
    "eval_do_concat_batches",
    "eval_use_gather_object",
    "eval_accumulation_steps",
    "include_for_metrics",
    "batch_eval_metrics",
    "save_only_model",
    "save_strategy",
    "save_steps",
    "save_on_each_node",
    "save_total_limit",
    "enable_jit_checkpoint",
    "push_to_hub",
    "hub_token",
    "hub_private_repo",
    "hub_model_id",
    "hub_strategy",
    "hub_always_push",
    "hub_revision",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "ignore_data_skip",
    "restore_callback_states_from_checkpoint",
    "full_determinism",
    "use_cpu",
    "accelerator_config",
    "parallelism_config",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context",
    "dataloader_in_order",
    "remove_unused_columns",
    "label_names",
    "length_column_name",
    "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb",
    "ddp_broadcast_buffers",
    "ddp_static_graph",
    "ddp_backend",
    "ddp_timeout",
    "fsdp",
    "fsdp_config",
    "deepspeed",
    "debug",
    "skip_memory_metrics",
    "do_train",
    "do_eval",
    "do_predict",
    "local_rank",
    "model_init_kwargs",
    "trust_remote_code",
    "router_aux_loss_coef",
    "dataset_num_proc",
];

/// Fields the planner's `TrainingArgs` reads (`super::training_args`).
const TRAINING_ARGS: &[&str] = &[
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "fp16",
    "bf16",
    "fp16_full_eval",
    "bf16_full_eval",
    "gradient_checkpointing",
    "activation_checkpointing",
    "warmup_steps",
    "warmup_ratio",
    "max_steps",
    "num_training_steps",
];

/// Fields dsplan honours only at these values (`null` stands for "not set"), and what to do
/// instead.
const FIXED: &[(&str, &[&str], &str)] = &[
    (
        "loss_type",
        &["\"nll\""],
        "dsplan trains with the token-mean NLL",
    ),
    ("use_liger_kernel", &["false"], "remove it"),
    (
        "neftune_noise_alpha",
        &["null"],
        "NEFTune noise is not implemented; remove it",
    ),
    (
        "chat_template_path",
        &["null"],
        "put the template in the model's tokenizer_config.json or chat_template.jinja (or pass --tokenizer DIR)",
    ),
    ("pad_to_multiple_of", &["null"], "remove it"),
    (
        "shuffle_dataset",
        &["false"],
        "remove it (train_sampling_strategy shuffles the order)",
    ),
    ("average_tokens_across_devices", &["true"], "remove it"),
    ("label_smoothing_factor", &["0", "0.0"], "remove it"),
    ("dataloader_drop_last", &["false"], "remove it"),
    ("eval_on_start", &["false"], "remove it"),
    (
        "activation_offloading",
        &["false"],
        "use the DeepSpeed config's offload sections",
    ),
    (
        "auto_find_batch_size",
        &["false"],
        "set per_device_train_batch_size",
    ),
    (
        "eos_token",
        &["null", "\"<EOS_TOKEN>\""],
        "set it in the tokenizer's files",
    ),
    (
        "pad_token",
        &["null", "\"<PAD_TOKEN>\""],
        "set it in the tokenizer's files",
    ),
    ("dataset_kwargs", &["null", "{}"], "remove it"),
    ("resume_from_checkpoint", &["null"], "use --resume DIR"),
    ("lr_scheduler_kwargs", &["null", "{}"], "remove it"),
];

/// Fields read here.
const READ: &[&str] = &[
    "max_length",
    "truncation_mode",
    "packing",
    "packing_strategy",
    "padding_free",
    "eval_packing",
    "completion_only_loss",
    "assistant_only_loss",
    "dataset_text_field",
    "eval_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "seed",
    "data_seed",
    "train_sampling_strategy",
    "num_train_epochs",
    "lr_scheduler_type",
];

impl SftConfig {
    /// Reads the `SFTConfig` fields of `object` (a `--training-args` file) over TRL 1.16's
    /// defaults; every problem is reported, each naming its field.
    pub fn from_json(object: &Map<String, Value>) -> Result<SftConfig, Vec<String>> {
        let mut reader = Fields(JsonFields::new(object));
        let mut inert = Vec::new();
        for (key, value) in object {
            if let Some((_, allowed, help)) = FIXED.iter().find(|(name, _, _)| name == key) {
                if !allowed.iter().any(|a| value_is(value, a)) {
                    reader.problems.push(format!(
                        "`{key}` is {value}; dsplan supports only {} ({help})",
                        allowed.join(" or ")
                    ));
                }
            } else if INERT.contains(&key.as_str()) {
                inert.push(key.clone());
            } else if !READ.contains(&key.as_str()) && !TRAINING_ARGS.contains(&key.as_str()) {
                reader.problems.push(format!(
                    "unknown field `{key}`: not a field of TRL 1.16's SFTConfig or transformers 5.23's TrainingArguments (a typo?)"
                ));
            }
        }
        let packing = reader.packing();
        let prepare = PrepareSettings {
            max_length: reader.max_length(),
            over_length: reader.truncation(),
            completion_loss: match reader.optional_flag("completion_only_loss") {
                None => CompletionLoss::Default,
                Some(true) => CompletionLoss::CompletionOnly,
                Some(false) => CompletionLoss::AllTokens,
            },
            assistant_loss: match reader.optional_flag("assistant_only_loss") {
                Some(true) => AssistantLoss::AssistantOnly,
                _ => AssistantLoss::WholeConversation,
            },
            packing,
        };
        reader.padding_free(packing);
        let config = SftConfig {
            prepare,
            text_field: reader
                .text("dataset_text_field")
                .unwrap_or_else(|| "text".to_string()),
            eval: reader.eval_strategy(),
            eval_batch_size: reader.whole("per_device_eval_batch_size").unwrap_or(8) as usize,
            sampling: reader.sampling(),
            epochs: reader.number("num_train_epochs").unwrap_or(3.0),
            lr_scheduler_given: object.contains_key("lr_scheduler_type"),
            lr_scheduler: match reader.text("lr_scheduler_type").as_deref() {
                None | Some("linear") => LrScheduler::Linear,
                Some("constant") => LrScheduler::Constant,
                Some("constant_with_warmup") => LrScheduler::ConstantWithWarmup,
                Some(_) => LrScheduler::Other,
            },
            inert,
        };
        if config.eval_batch_size == 0 {
            reader
                .problems
                .push("`per_device_eval_batch_size` must be at least 1".to_string());
        }
        if !(config.epochs.is_finite() && config.epochs > 0.0) {
            reader
                .problems
                .push("`num_train_epochs` must be a positive number".to_string());
        }
        if reader.problems.is_empty() {
            Ok(config)
        } else {
            Err(reader.0.problems)
        }
    }
}

/// Whether `value` is the JSON text `allowed`.
fn value_is(value: &Value, allowed: &str) -> bool {
    match serde_json::from_str::<Value>(allowed) {
        Ok(Value::Number(n)) => value.as_f64() == n.as_f64(),
        Ok(expected) => *value == expected,
        Err(_) => false,
    }
}

/// Typed fields of the file, problems collected (the shared reader, and the SFT config's
/// own kinds of field).
struct Fields<'a>(JsonFields<'a>);

impl<'a> std::ops::Deref for Fields<'a> {
    type Target = JsonFields<'a>;
    fn deref(&self) -> &JsonFields<'a> {
        &self.0
    }
}

impl std::ops::DerefMut for Fields<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Fields<'_> {
    fn optional_flag(&mut self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                self.problems.push(format!(
                    "`{key}` must be true, false or null, found {other}"
                ));
                None
            }
        }
    }

    fn text(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.problems
                    .push(format!("`{key}` must be a string, found {other}"));
                None
            }
        }
    }

    /// One of `choices` (the first is the default).
    fn choice(&mut self, key: &str, choices: &[&'static str], help: &str) -> &'static str {
        let Some(given) = self.text(key) else {
            return choices[0];
        };
        match choices.iter().find(|c| **c == given) {
            Some(choice) => choice,
            None => {
                self.problems.push(format!(
                    "`{key}` is \"{given}\"; dsplan supports {} ({help})",
                    choices
                        .iter()
                        .map(|c| format!("\"{c}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                choices[0]
            }
        }
    }

    fn max_length(&mut self) -> Option<usize> {
        match self.object.get("max_length") {
            None => Some(1024),
            Some(Value::Null) => None,
            Some(_) => match self.whole("max_length") {
                Some(0) => {
                    self.problems
                        .push("`max_length` must be at least 1 (or null: no limit)".to_string());
                    None
                }
                other => other.map(|n| n as usize),
            },
        }
    }

    fn truncation(&mut self) -> OverLength {
        self.choice(
            "truncation_mode",
            &["keep_start"],
            "keep_end is not implemented",
        );
        OverLength::KeepStart
    }

    fn packing(&mut self) -> Packing {
        let packing = self.optional_flag("packing").unwrap_or(false);
        self.choice(
            "packing_strategy",
            &["bfd"],
            "bfd_split and wrapped are not implemented",
        );
        if let Some(eval_packing) = self.optional_flag("eval_packing")
            && eval_packing != packing
        {
            self.problems.push(format!(
                "`eval_packing` is {eval_packing} and `packing` {packing}; dsplan packs the eval set as the train set (remove eval_packing)"
            ));
        }
        if packing { Packing::Bfd } else { Packing::Off }
    }

    fn padding_free(&mut self, packing: Packing) {
        if self.optional_flag("padding_free") == Some(true) && packing == Packing::Off {
            self.problems.push(
                "`padding_free` is true without packing; dsplan is padding-free only with packing (set packing: true, or remove padding_free)"
                    .to_string(),
            );
        }
    }

    fn eval_strategy(&mut self) -> EvalStrategy {
        let strategy = self.choice(
            "eval_strategy",
            &["no", "steps", "epoch"],
            "the eval loss is also computed at the end of training",
        );
        let steps = self.number("eval_steps");
        match strategy {
            "steps" => match steps {
                Some(n) if n >= 1.0 && n.fract() == 0.0 => EvalStrategy::EverySteps(n as u64),
                Some(n) => {
                    self.problems.push(format!(
                        "`eval_steps` is {n}; dsplan takes a whole number of steps (a ratio below 1 is not supported)"
                    ));
                    EvalStrategy::AtEnd
                }
                None => {
                    self.problems.push(
                        "`eval_strategy` is \"steps\" but `eval_steps` is not set; give eval_steps"
                            .to_string(),
                    );
                    EvalStrategy::AtEnd
                }
            },
            "epoch" => EvalStrategy::EveryEpoch,
            _ => EvalStrategy::AtEnd,
        }
    }

    fn sampling(&mut self) -> SamplingChoice {
        let seed = self.whole("data_seed").or_else(|| self.whole("seed"));
        match self.choice(
            "train_sampling_strategy",
            &["random", "sequential"],
            "group_by_length is not implemented",
        ) {
            "sequential" => SamplingChoice::Sequential,
            _ => SamplingChoice::Random(seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: Value) -> Result<SftConfig, Vec<String>> {
        SftConfig::from_json(value.as_object().expect("an object"))
    }

    #[test]
    fn fields_are_read_inert_or_refused_by_name() {
        let config = read(json!({
            "max_length": 96, "packing": true, "eval_strategy": "steps", "eval_steps": 5,
            "per_device_eval_batch_size": 4, "seed": 77, "logging_steps": 1,
            "learning_rate": 0.001, "lr_scheduler_type": "constant_with_warmup"
        }))
        .expect("valid");
        assert_eq!(config.prepare.max_length, Some(96));
        assert_eq!(config.prepare.packing, Packing::Bfd);
        assert_eq!(config.eval, EvalStrategy::EverySteps(5));
        assert_eq!(config.eval_batch_size, 4);
        assert_eq!(config.sampling, SamplingChoice::Random(Some(77)));
        assert_eq!(config.lr_scheduler, LrScheduler::ConstantWithWarmup);
        assert_eq!(config.inert, ["logging_steps"]);
        let defaults = read(json!({})).expect("valid");
        assert_eq!(defaults.prepare, PrepareSettings::default());
        assert_eq!(defaults.eval, EvalStrategy::AtEnd);
        assert_eq!(defaults.lr_scheduler, LrScheduler::Linear);

        let problems = read(json!({
            "packing_strategy": "wrapped", "loss_type": "dft", "max_lenght": 5,
            "truncation_mode": "keep_end", "padding_free": true
        }))
        .expect_err("refused");
        let all = problems.join("\n");
        for field in [
            "`packing_strategy`",
            "`loss_type`",
            "`max_lenght`",
            "`truncation_mode`",
            "`padding_free`",
        ] {
            assert!(all.contains(field), "{field} not named in {all}");
        }
    }
}
