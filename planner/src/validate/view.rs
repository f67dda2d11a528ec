//! A read-only view of a config document for the semantic rules: typed lookups that return
//! `None` for anything absent, `"auto"` or of the wrong type (the schema check reports those).

use serde_json::Value;

/// A borrowed config document.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    document: &'a Value,
}

/// The ZeRO stage as DeepSpeed reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Plain data parallelism.
    Disabled = 0,
    /// Optimizer state sharded.
    OptimizerStates = 1,
    /// Gradients sharded too.
    Gradients = 2,
    /// Parameters sharded too.
    Parameters = 3,
}

/// Where an offload section sends its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadTarget {
    /// No offload (`"none"`, or the section absent).
    None,
    /// Host memory.
    Cpu,
    /// NVMe through the host.
    Nvme,
}

impl<'a> View<'a> {
    /// View `document`.
    pub fn new(document: &'a Value) -> Self {
        View { document }
    }

    /// The raw value at `pointer`, if present.
    pub fn get(&self, pointer: &str) -> Option<&'a Value> {
        self.document.pointer(pointer)
    }

    /// Whether the key exists (whatever its value).
    pub fn has(&self, pointer: &str) -> bool {
        self.get(pointer).is_some()
    }

    /// A boolean, or `None` when absent, `"auto"` or not a boolean.
    pub fn bool(&self, pointer: &str) -> Option<bool> {
        self.get(pointer).and_then(Value::as_bool)
    }

    /// A number, or `None` when absent, `"auto"` or not a number.
    pub fn number(&self, pointer: &str) -> Option<f64> {
        self.get(pointer).and_then(Value::as_f64)
    }

    /// A string, or `None`.
    pub fn string(&self, pointer: &str) -> Option<&'a str> {
        self.get(pointer).and_then(Value::as_str)
    }

    /// The first of several spellings (alias, deprecated name) that is present.
    pub fn first_present(&self, pointers: &[&'static str]) -> Option<(&'static str, &'a Value)> {
        pointers.iter().find_map(|p| self.get(p).map(|v| (*p, v)))
    }

    /// The ZeRO stage: `zero_optimization.stage` (default 0), or stage 1 for the legacy
    /// `"zero_optimization": true`. `None` when the stage is unreadable.
    pub fn stage(&self) -> Option<Stage> {
        match self.get("/zero_optimization") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => Some(Stage::Disabled),
            Some(Value::Bool(true)) => Some(Stage::OptimizerStates),
            Some(Value::Object(zero)) => match zero.get("stage") {
                None => Some(Stage::Disabled),
                Some(stage) => match stage.as_f64() {
                    Some(0.0) => Some(Stage::Disabled),
                    Some(1.0) => Some(Stage::OptimizerStates),
                    Some(2.0) => Some(Stage::Gradients),
                    Some(3.0) => Some(Stage::Parameters),
                    _ => None,
                },
            },
            Some(_) => None,
        }
    }

    /// Where `zero_optimization.<section>` offloads to (also honouring the deprecated
    /// `cpu_offload` / `cpu_offload_param` booleans).
    pub fn offload(&self, section: OffloadSection) -> OffloadTarget {
        let (pointer, deprecated) = match section {
            OffloadSection::Optimizer => (
                "/zero_optimization/offload_optimizer/device",
                "/zero_optimization/cpu_offload",
            ),
            OffloadSection::Param => (
                "/zero_optimization/offload_param/device",
                "/zero_optimization/cpu_offload_param",
            ),
        };
        match self.string(pointer) {
            Some("cpu") => OffloadTarget::Cpu,
            Some("nvme") => OffloadTarget::Nvme,
            _ if self.bool(deprecated) == Some(true) => OffloadTarget::Cpu,
            _ => OffloadTarget::None,
        }
    }

    /// Whether a precision section is explicitly enabled (`"auto"` counts as unknown: no).
    pub fn enabled(&self, section: &str) -> bool {
        self.bool(&format!("/{section}/enabled")) == Some(true)
    }
}

/// The two offload sections of `zero_optimization`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadSection {
    /// `offload_optimizer`.
    Optimizer,
    /// `offload_param`.
    Param,
}

impl OffloadSection {
    /// The section's JSON pointer.
    pub fn pointer(self) -> &'static str {
        match self {
            OffloadSection::Optimizer => "/zero_optimization/offload_optimizer",
            OffloadSection::Param => "/zero_optimization/offload_param",
        }
    }
}
