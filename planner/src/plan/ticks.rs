//! [`Ticks`]: the moments of one optimizer step, in order. Buffer lifetimes, offload copies and
//! the memory timeline all refer to them.
//!
//! One micro-step is detailed: the one that ends gradient accumulation (it holds everything an
//! earlier micro-step holds, plus the boundary's reduction). Ticks: one per trace step (every
//! fetch unit forward, then backward in reverse), the backward epilogue (last bucket, stage-0
//! all-reduce), one per optimizer sub-group, and the parameter all-gather after the step.

use serde::Serialize;

use super::model_graph::ModelGraph;
use super::stage3::{Pass, trace_step};

/// The phase a tick belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Forward pass.
    Forward,
    /// Backward pass.
    Backward,
    /// After backward: the last gradient bucket and boundary reductions.
    ReduceEpilogue,
    /// The optimizer step.
    OptimizerStep,
    /// Rebuilding full parameters after the step.
    ParamGather,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 5] = [
        Phase::Forward,
        Phase::Backward,
        Phase::ReduceEpilogue,
        Phase::OptimizerStep,
        Phase::ParamGather,
    ];

    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::ReduceEpilogue => "reduce-epilogue",
            Phase::OptimizerStep => "optimizer-step",
            Phase::ParamGather => "param-gather",
        }
    }
}

/// One moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tick {
    /// Phase.
    pub phase: Phase,
    /// What happens: `forward transformer.h.0.ln_1`, `optimizer sub-group 3`, ...
    pub label: String,
}

/// The moments of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ticks {
    /// Every tick.
    pub ticks: Vec<Tick>,
    /// Fetch units (trace steps are ticks `0..2·units`).
    pub units: usize,
    /// Optimizer sub-groups.
    pub sub_groups: usize,
}

impl Ticks {
    /// The ticks for `model` with `sub_groups` optimizer sub-groups.
    pub fn new(model: &ModelGraph, sub_groups: usize) -> Ticks {
        let units = model.units.len();
        let mut ticks = Vec::with_capacity(2 * units + sub_groups + 2);
        for step in 0..2 * units {
            let (unit, pass) = trace_step(units, step);
            let (phase, verb) = match pass {
                Pass::Forward => (Phase::Forward, "forward"),
                Pass::Backward => (Phase::Backward, "backward"),
            };
            // Built as `format!("{verb} {module}")`, without the formatter: a deep model has
            // hundreds of thousands of these.
            let module = &model.units[unit].module;
            let mut label = String::with_capacity(verb.len() + 1 + module.len());
            label.push_str(verb);
            label.push(' ');
            label.push_str(module);
            ticks.push(Tick { phase, label });
        }
        ticks.push(Tick {
            phase: Phase::ReduceEpilogue,
            label: "backward epilogue".into(),
        });
        for group in 0..sub_groups {
            ticks.push(Tick {
                phase: Phase::OptimizerStep,
                label: format!("optimizer sub-group {group}"),
            });
        }
        ticks.push(Tick {
            phase: Phase::ParamGather,
            label: "parameter all-gather".into(),
        });
        Ticks {
            ticks,
            units,
            sub_groups,
        }
    }

    /// The tick of trace step `step`.
    pub fn trace(&self, step: usize) -> usize {
        step
    }

    /// The first backward tick.
    pub fn first_backward(&self) -> usize {
        self.units
    }

    /// The first backward tick after the head's: where the first parameter gradient hook has
    /// fired. The loss's backward (the head's tick, with its fp32 buffers) is over by then:
    /// a tied head's weight is the embedding's, whose gradient is whole only at the end,
    /// and an untied head's weight gradient comes after the loss gradient is complete. The
    /// first backward tick when the model is a single unit.
    pub fn first_gradient(&self) -> usize {
        if self.units > 1 {
            self.units + 1
        } else {
            self.units
        }
    }

    /// The backward epilogue.
    pub fn epilogue(&self) -> usize {
        2 * self.units
    }

    /// The tick of optimizer sub-group `group`.
    pub fn optimizer(&self, group: usize) -> usize {
        2 * self.units + 1 + group
    }

    /// The first optimizer tick.
    pub fn first_optimizer(&self) -> usize {
        self.optimizer(0)
    }

    /// The last optimizer tick (the epilogue when there is no sub-group).
    pub fn last_optimizer(&self) -> usize {
        2 * self.units + self.sub_groups
    }

    /// The parameter all-gather tick (the last).
    pub fn param_gather(&self) -> usize {
        self.ticks.len() - 1
    }

    /// Number of ticks.
    pub fn len(&self) -> usize {
        self.ticks.len()
    }

    /// Whether there are none (never: the epilogue and gather always exist).
    pub fn is_empty(&self) -> bool {
        self.ticks.is_empty()
    }
}
