//! The Hugging Face `TrainingArguments` the Trainer's `"auto"` rules read, each with where its
//! value came from: a command-line flag, a `--training-args` JSON file, or transformers 5.23's
//! own default.
//!
//! Only these fields matter to the DeepSpeed integration (`peers.md` §1.3); everything else a
//! `TrainingArguments` dump holds is ignored.

use serde::Serialize;
use serde_json::Value;

use super::json_fields::JsonFields;

/// Where a training argument's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArgOrigin {
    /// A command-line flag (`--learning-rate`).
    Flag,
    /// The `--training-args` JSON file.
    File,
    /// Not given: `TrainingArguments`' default.
    Default,
}

/// One training argument and its origin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Arg<T> {
    /// The value the Trainer would see.
    pub value: T,
    /// Where it came from.
    pub origin: ArgOrigin,
}

impl<T> Arg<T> {
    /// `TrainingArguments`' default.
    pub fn default_value(value: T) -> Self {
        Arg {
            value,
            origin: ArgOrigin::Default,
        }
    }

    /// A value the user gave.
    pub fn given(value: T, origin: ArgOrigin) -> Self {
        Arg { value, origin }
    }

    /// Whether the user gave it (flag or file).
    pub fn is_given(&self) -> bool {
        self.origin != ArgOrigin::Default
    }
}

/// `warmup_steps` as transformers 5 reads it: a whole number of steps, or (below 1) a ratio of
/// the training steps (`warmup_ratio` was folded into it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WarmupSteps {
    /// `int(warmup_steps)` steps (0 included).
    Steps(u64),
    /// `ceil(num_training_steps × ratio)` steps, 0 < ratio < 1.
    Ratio(f64),
}

impl WarmupSteps {
    /// Reads a number: ≥ 1 is truncated to whole steps (`int(x)`), 0 is no warm-up, a value
    /// strictly between 0 and 1 is a ratio. Negative and non-finite values are refused.
    pub fn from_number(value: f64) -> Result<Self, String> {
        if !value.is_finite() || value < 0.0 {
            return Err(format!(
                "warmup_steps must be a number of steps (≥ 1), 0, or a ratio below 1; got {value}"
            ));
        }
        if value == 0.0 {
            Ok(WarmupSteps::Steps(0))
        } else if value < 1.0 {
            Ok(WarmupSteps::Ratio(value))
        } else if value > 9.0e15 {
            Err(format!("warmup_steps {value} is too large"))
        } else {
            Ok(WarmupSteps::Steps(value.trunc() as u64))
        }
    }

    /// `TrainingArguments.get_warmup_steps(num_training_steps)`; `None` for a ratio when the
    /// number of training steps is not known.
    pub fn steps_for(self, num_training_steps: Option<u64>) -> Option<u64> {
        match self {
            WarmupSteps::Steps(steps) => Some(steps),
            WarmupSteps::Ratio(ratio) => {
                num_training_steps.map(|n| (n as f64 * ratio).ceil() as u64)
            }
        }
    }

    /// The value as the user wrote it (for messages).
    pub fn display(self) -> String {
        match self {
            WarmupSteps::Steps(steps) => steps.to_string(),
            WarmupSteps::Ratio(ratio) => crate::schedule::py_float_repr(ratio),
        }
    }
}

/// The training arguments the DeepSpeed integration reads. [`Default`] is transformers 5.23's
/// `TrainingArguments()`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingArgs {
    /// `per_device_train_batch_size` (default 8).
    pub per_device_train_batch_size: Arg<u64>,
    /// `gradient_accumulation_steps` (default 1).
    pub gradient_accumulation_steps: Arg<u64>,
    /// `learning_rate` (default 5e-5).
    pub learning_rate: Arg<f64>,
    /// `weight_decay` (default 0.0).
    pub weight_decay: Arg<f64>,
    /// `adam_beta1` (default 0.9).
    pub adam_beta1: Arg<f64>,
    /// `adam_beta2` (default 0.999).
    pub adam_beta2: Arg<f64>,
    /// `adam_epsilon` (default 1e-8).
    pub adam_epsilon: Arg<f64>,
    /// `max_grad_norm` (default 1.0).
    pub max_grad_norm: Arg<f64>,
    /// `warmup_steps` (default 0).
    pub warmup_steps: Arg<WarmupSteps>,
    /// `fp16` (default false).
    pub fp16: Arg<bool>,
    /// `bf16` (default false).
    pub bf16: Arg<bool>,
    /// `fp16_full_eval` (default false; the Trainer enables fp16 for either).
    pub fp16_full_eval: Arg<bool>,
    /// `bf16_full_eval` (default false; the Trainer enables bf16 for either).
    pub bf16_full_eval: Arg<bool>,
    /// The number of optimizer steps of the run (the Trainer's `max_steps`, or epochs × steps
    /// per epoch). No default: the Trainer computes it from the data.
    pub num_training_steps: Option<Arg<u64>>,
    /// `gradient_checkpointing` (default false): the model recomputes each layer's forward in
    /// backward. No `"auto"` reads it; `dsplan run` does.
    pub gradient_checkpointing: Arg<bool>,
}

impl Default for TrainingArgs {
    fn default() -> Self {
        TrainingArgs {
            per_device_train_batch_size: Arg::default_value(8),
            gradient_accumulation_steps: Arg::default_value(1),
            learning_rate: Arg::default_value(5e-5),
            weight_decay: Arg::default_value(0.0),
            adam_beta1: Arg::default_value(0.9),
            adam_beta2: Arg::default_value(0.999),
            adam_epsilon: Arg::default_value(1e-8),
            max_grad_norm: Arg::default_value(1.0),
            warmup_steps: Arg::default_value(WarmupSteps::Steps(0)),
            fp16: Arg::default_value(false),
            bf16: Arg::default_value(false),
            fp16_full_eval: Arg::default_value(false),
            bf16_full_eval: Arg::default_value(false),
            num_training_steps: None,
            gradient_checkpointing: Arg::default_value(false),
        }
    }
}

impl TrainingArgs {
    /// Reads a `TrainingArguments` JSON object (e.g. `TrainingArguments.to_json_string()`, or a
    /// hand-written subset) over the defaults; keys the DeepSpeed integration does not read are
    /// ignored. `max_steps > 0` (or dsplan's own `num_training_steps`) gives the number of
    /// training steps; an older `warmup_ratio > 0` with `warmup_steps` 0 becomes a ratio.
    /// Every problem is reported, not only the first.
    pub fn from_json(value: &Value) -> Result<TrainingArgs, Vec<String>> {
        let Some(object) = value.as_object() else {
            return Err(vec!["training arguments must be a JSON object".to_string()]);
        };
        let mut reader = Reader {
            fields: JsonFields::new(object),
        };
        let mut args = TrainingArgs::default();
        reader.count(
            "per_device_train_batch_size",
            &mut args.per_device_train_batch_size,
        );
        reader.count(
            "gradient_accumulation_steps",
            &mut args.gradient_accumulation_steps,
        );
        reader.float("learning_rate", &mut args.learning_rate);
        reader.float("weight_decay", &mut args.weight_decay);
        reader.float("adam_beta1", &mut args.adam_beta1);
        reader.float("adam_beta2", &mut args.adam_beta2);
        reader.float("adam_epsilon", &mut args.adam_epsilon);
        reader.float("max_grad_norm", &mut args.max_grad_norm);
        reader.flag("fp16", &mut args.fp16);
        reader.flag("bf16", &mut args.bf16);
        reader.flag("fp16_full_eval", &mut args.fp16_full_eval);
        reader.flag("bf16_full_eval", &mut args.bf16_full_eval);
        reader.flag("gradient_checkpointing", &mut args.gradient_checkpointing);
        reader.warmup(&mut args.warmup_steps);
        args.num_training_steps = reader.training_steps();
        if reader.fields.problems.is_empty() {
            Ok(args)
        } else {
            Err(reader.fields.problems)
        }
    }

    /// Whether any argument was given (by flag or file).
    pub fn any_given(&self) -> bool {
        self.per_device_train_batch_size.is_given()
            || self.gradient_accumulation_steps.is_given()
            || self.learning_rate.is_given()
            || self.weight_decay.is_given()
            || self.adam_beta1.is_given()
            || self.adam_beta2.is_given()
            || self.adam_epsilon.is_given()
            || self.max_grad_norm.is_given()
            || self.warmup_steps.is_given()
            || self.fp16.is_given()
            || self.bf16.is_given()
            || self.fp16_full_eval.is_given()
            || self.bf16_full_eval.is_given()
            || self.num_training_steps.is_some()
            || self.gradient_checkpointing.is_given()
    }
}

/// Reads typed fields out of a JSON object, collecting problems.
struct Reader<'a> {
    fields: JsonFields<'a>,
}

impl Reader<'_> {
    fn count(&mut self, key: &str, target: &mut Arg<u64>) {
        if let Some(value) = self.fields.whole(key) {
            *target = Arg::given(value, ArgOrigin::File);
        }
    }

    fn float(&mut self, key: &str, target: &mut Arg<f64>) {
        if let Some(value) = self.fields.number(key) {
            *target = Arg::given(value, ArgOrigin::File);
        }
    }

    fn flag(&mut self, key: &str, target: &mut Arg<bool>) {
        match self.fields.get(key) {
            None => {}
            Some(Value::Bool(value)) => *target = Arg::given(*value, ArgOrigin::File),
            Some(other) => self
                .fields
                .problems
                .push(format!("`{key}` must be true or false, found {other}")),
        }
    }

    fn warmup(&mut self, target: &mut Arg<WarmupSteps>) {
        let steps = self.fields.number("warmup_steps");
        let ratio = self.fields.number("warmup_ratio").filter(|r| *r > 0.0);
        let chosen = match (steps, ratio) {
            (Some(steps), _) if steps != 0.0 => Some(steps),
            (_, Some(ratio)) => Some(ratio),
            (steps, None) => steps,
        };
        if let Some(value) = chosen {
            match WarmupSteps::from_number(value) {
                Ok(warmup) => *target = Arg::given(warmup, ArgOrigin::File),
                Err(problem) => self.fields.problems.push(problem),
            }
        }
    }

    fn training_steps(&mut self) -> Option<Arg<u64>> {
        if let Some(steps) = self.fields.whole("num_training_steps") {
            return Some(Arg::given(steps, ArgOrigin::File));
        }
        let max_steps = self.fields.number("max_steps")?;
        (max_steps > 0.0 && max_steps.fract() == 0.0)
            .then(|| Arg::given(max_steps as u64, ArgOrigin::File))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn warmup_follows_transformers_5() {
        assert_eq!(WarmupSteps::from_number(100.0), Ok(WarmupSteps::Steps(100)));
        assert_eq!(WarmupSteps::from_number(2.7), Ok(WarmupSteps::Steps(2)));
        assert_eq!(WarmupSteps::from_number(0.0), Ok(WarmupSteps::Steps(0)));
        assert_eq!(WarmupSteps::from_number(0.03), Ok(WarmupSteps::Ratio(0.03)));
        assert!(WarmupSteps::from_number(-1.0).is_err());
        assert_eq!(WarmupSteps::Ratio(0.03).steps_for(Some(5000)), Some(150));
        assert_eq!(WarmupSteps::Ratio(0.015).steps_for(Some(100)), Some(2));
        assert_eq!(WarmupSteps::Ratio(0.1).steps_for(None), None);
        assert_eq!(WarmupSteps::Steps(0).steps_for(None), Some(0));
    }

    #[test]
    fn json_overrides_defaults_and_reports_every_problem() {
        let args = TrainingArgs::from_json(&json!({
            "learning_rate": 2e-5, "bf16": true, "max_steps": 500, "warmup_ratio": 0.1,
            "warmup_steps": 0, "output_dir": "out", "per_device_train_batch_size": 4,
            "gradient_checkpointing": true
        }))
        .expect("valid");
        assert_eq!(
            args.gradient_checkpointing,
            Arg::given(true, ArgOrigin::File)
        );
        assert_eq!(args.learning_rate, Arg::given(2e-5, ArgOrigin::File));
        assert_eq!(args.adam_beta2, Arg::default_value(0.999));
        assert_eq!(args.warmup_steps.value, WarmupSteps::Ratio(0.1));
        assert_eq!(args.num_training_steps.map(|a| a.value), Some(500));
        assert!(args.any_given());
        assert!(!TrainingArgs::default().any_given());
        let problems =
            TrainingArgs::from_json(&json!({"fp16": "yes", "gradient_accumulation_steps": 2.5}))
                .expect_err("invalid");
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
