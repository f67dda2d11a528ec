//! Numeric knobs with a meaningful range that DeepSpeed 0.19.8 takes without complaint though
//! the value cannot work. [`RANGES`] is the list: each entry names the key, the values that
//! break, when the key matters, what happens (error: the run fails or cannot train; warning:
//! it trains, but not as the value suggests) and the 0.19.8 source line that shows why (paths
//! are inside the `deepspeed-0.19.8` source distribution; `csrc/` is its C++ part).
//!
//! Ranges DeepSpeed checks itself are elsewhere: the schema's integer bounds
//! (`NonNegativeInt`, `PositiveInt`: `reduce_bucket_size > 0`, `sub_group_size >= 0`,
//! `decay_step_size >= 0`, ...), `allgather_bucket_size` even ([`super::zero`]),
//! `fp16.loss_scale >= 0` (the typed section), the dynamic scaler's window and floor
//! ([`super::precision`]) and the schedulers' own refusals (`warmup_num_steps`,
//! `cycle_first_step_size`, `lr_range_test_step_size`: `crate::schedule`).
//!
//! Knobs reviewed and deliberately not listed, because every value in their schema range is a
//! working choice:
//! * `zero_optimization.stage3_prefetch_bucket_size: 0` turns prefetching off on purpose
//!   (`runtime/zero/partitioned_param_coordinator.py:452`, `if self.__prefetch_bucket_sz > 0`);
//! * `stage3_max_reuse_distance: 0` releases each parameter right after use, the memory-saving
//!   end of the trade (`partitioned_param_coordinator.py:658`);
//! * `stage3_param_persistence_threshold` / `stage3_model_persistence_threshold`: any size only
//!   moves parameters between persistent and partitioned (`runtime/zero/parameter_offload.py:187`);
//! * `allgather_bucket_size: 0`: with `all_gather_into_tensor` (every supported torch) the size
//!   is not used (`runtime/utils.py:1021-1022`);
//! * OneCycle's `decay_mom_rate`: DeepSpeed multiplies β₁ by `1 + rate × interval`
//!   (`runtime/lr_schedules.py:635-636`) with no bound either way; it is reported where the
//!   schedule is stepped, not here;
//! * `aio.thread_count`: never read (a deprecated key, [`super::keys`]).

use serde_json::Value;

use crate::config::registry::ALIASES;
use crate::diagnostics::{Diagnostic, Severity};
use crate::validate::view::{OffloadSection, OffloadTarget, Stage, View};
use crate::{Code, json_pointer};

/// Which values of a knob break.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Broken {
    /// Below zero.
    Negative,
    /// Exactly zero.
    Zero,
    /// Above one.
    AboveOne,
    /// Outside `[0, 1)`.
    OutsideUnitInterval,
}

impl Broken {
    fn holds(self, value: f64) -> bool {
        match self {
            Broken::Negative => value < 0.0,
            Broken::Zero => value == 0.0,
            Broken::AboveOne => value > 1.0,
            Broken::OutsideUnitInterval => !(0.0..1.0).contains(&value),
        }
    }

    fn wanted(self) -> &'static str {
        match self {
            Broken::Negative => "at least 0",
            Broken::Zero => "above 0",
            Broken::AboveOne => "at most 1",
            Broken::OutsideUnitInterval => "in [0, 1)",
        }
    }
}

/// When DeepSpeed uses the knob at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Whenever it is given.
    Always,
    /// Only at ZeRO stage 3 (below it, `ineffective-at-stage` already says it is unused).
    ZeroStage3,
    /// Only when `offload_param` goes to NVMe.
    ParamOffloadToNvme,
}

impl Applies {
    fn holds(self, view: View<'_>) -> bool {
        match self {
            Applies::Always => true,
            Applies::ZeroStage3 => view.stage() == Some(Stage::Parameters),
            Applies::ParamOffloadToNvme => {
                view.offload(OffloadSection::Param) == OffloadTarget::Nvme
            }
        }
    }
}

/// One knob and why some of its values cannot work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    /// The key. A key with a second spelling (`stage3_max_live_parameters` /
    /// `max_live_parameters`) is checked under both; a list value is checked item by item.
    pub pointer: &'static str,
    /// Which values break.
    pub broken: Broken,
    /// When the key matters.
    pub applies: Applies,
    /// Error or warning.
    pub severity: Severity,
    /// What the value does.
    pub reason: &'static str,
    /// The DeepSpeed 0.19.8 source that uses the value.
    pub source: &'static str,
}

const fn always(
    pointer: &'static str,
    broken: Broken,
    severity: Severity,
    reason: &'static str,
    source: &'static str,
) -> Range {
    Range {
        pointer,
        broken,
        applies: Applies::Always,
        severity,
        reason,
        source,
    }
}

/// Every knob checked here.
pub const RANGES: &[Range] = &[
    // The fp16 dynamic loss scaler: DeepSpeed accepts any hysteresis, but below 1 an overflow
    // only counts it down (0, -1, ...) and never reaches the branch that lowers the scale.
    always(
        "/fp16/hysteresis",
        Broken::Zero,
        Severity::Warning,
        "after an overflow the scaler lowers the scale only when its hysteresis counter is 1; from 0 it counts down forever, so the scale is never lowered and every step overflows",
        "deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale (the scale drops only when delayed_shift or cur_hysteresis is 1)",
    ),
    always(
        "/fp16/hysteresis",
        Broken::Negative,
        Severity::Warning,
        "after an overflow the scaler lowers the scale only when its hysteresis counter is 1; below 0 it counts down forever, so the scale is never lowered and every step overflows",
        "deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale (the scale drops only when delayed_shift or cur_hysteresis is 1)",
    ),
    // The optimizer.
    always(
        "/optimizer/params/lr",
        Broken::Negative,
        Severity::Error,
        "DeepSpeed's optimizers use it as given (no check), so a negative rate steps up the gradient and the loss grows",
        "deepspeed/ops/adam/fused_adam.py:89 (defaults = dict(lr=lr, ...), no range check)",
    ),
    always(
        "/optimizer/params/betas",
        Broken::OutsideUnitInterval,
        Severity::Error,
        "Adam's moment decay: with beta >= 1 the bias correction 1 - beta^t is 0 or negative (a division by zero or a sign flip), below 0 the averages oscillate",
        "deepspeed/ops/adam/fused_adam.py:128 (beta1, beta2 = group['betas'], passed to the kernel unchecked)",
    ),
    always(
        "/optimizer/params/eps",
        Broken::Negative,
        Severity::Error,
        "it keeps Adam's denominator sqrt(v) + eps away from zero; a negative eps can make it zero or negative",
        "deepspeed/ops/adam/fused_adam.py:89 (eps stored unchecked)",
    ),
    always(
        "/optimizer/params/weight_decay",
        Broken::Negative,
        Severity::Warning,
        "a negative decay grows every weight at each step instead of shrinking it",
        "deepspeed/ops/adam/fused_adam.py:89 (weight_decay stored unchecked)",
    ),
    always(
        "/gradient_clipping",
        Broken::Negative,
        Severity::Warning,
        "DeepSpeed clips only when it is above 0, so a negative value silently turns clipping off",
        "deepspeed/runtime/engine.py:3506 (if self.gradient_clipping() > 0.0)",
    ),
    // WarmupLR and WarmupDecayLR.
    always(
        "/scheduler/params/warmup_min_lr",
        Broken::Negative,
        Severity::Error,
        "the warm-up starts at this rate, taken as given, so the first steps run with a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:741 (min_lrs = _format_param(..., warmup_min_lr, ...)) and :762 (lr = min_lr + delta_lr * gamma)",
    ),
    always(
        "/scheduler/params/warmup_max_lr",
        Broken::Negative,
        Severity::Error,
        "the warm-up climbs to this rate, taken as given, so training runs with a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:742 (max_lrs = _format_param(..., warmup_max_lr, ...)) and :762",
    ),
    // WarmupCosineLR.
    always(
        "/scheduler/params/warmup_min_ratio",
        Broken::Negative,
        Severity::Error,
        "the warm-up starts at this fraction of the optimizer's lr, so the first steps run with a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:915 (ratio = warmup_min_ratio + ratio * (1 - warmup_min_ratio)) and :941 (lr = org_lr * ratio)",
    ),
    always(
        "/scheduler/params/warmup_min_ratio",
        Broken::AboveOne,
        Severity::Warning,
        "the warm-up starts above the optimizer's lr and comes down to it, the opposite of a warm-up",
        "deepspeed/runtime/lr_schedules.py:914-915 (ratio_delta = 1 - warmup_min_ratio is negative)",
    ),
    always(
        "/scheduler/params/cos_min_ratio",
        Broken::Negative,
        Severity::Warning,
        "the cosine aims below 0 and is clamped there, so the learning rate is 0 for the last part of the run",
        "deepspeed/runtime/lr_schedules.py:927 (ratio = max(0.0, cos_min_ratio + ratio_delta * ratio))",
    ),
    always(
        "/scheduler/params/cos_min_ratio",
        Broken::AboveOne,
        Severity::Warning,
        "the cosine \"decay\" ends above the optimizer's lr, so the learning rate rises after the warm-up",
        "deepspeed/runtime/lr_schedules.py:925-927 (ratio_delta = 1 - cos_min_ratio is negative)",
    ),
    // OneCycle.
    always(
        "/scheduler/params/cycle_min_lr",
        Broken::Negative,
        Severity::Error,
        "the cycle starts and ends at this rate, taken as given, so parts of the run use a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:548 (min_lrs = _format_param(..., cycle_min_lr, ...)) and :625 (lr = cycle_min_lr + base_height)",
    ),
    always(
        "/scheduler/params/cycle_max_lr",
        Broken::Negative,
        Severity::Error,
        "the cycle peaks at this rate, taken as given, so parts of the run use a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:549 (max_lrs = _format_param(..., cycle_max_lr, ...)) and :624-625",
    ),
    always(
        "/scheduler/params/decay_lr_rate",
        Broken::Negative,
        Severity::Error,
        "after the cycle the rate is cycle_min_lr / (1 + decay_lr_rate * interval); a negative rate drives the divisor to 0 (ZeroDivisionError) and then makes the learning rate negative",
        "deepspeed/runtime/lr_schedules.py:649-650 (lr_decay_factor = 1 + decay_lr_rate * decay_interval; cycle_min_lr / lr_decay_factor)",
    ),
    always(
        "/scheduler/params/cycle_min_mom",
        Broken::OutsideUnitInterval,
        Severity::Error,
        "it becomes the optimizer's beta1 during the cycle; beta1 >= 1 or < 0 breaks Adam's moment estimates as a bad `betas` does",
        "deepspeed/runtime/lr_schedules.py:572 (min_moms = [(mom, 0.99) ...]) and :577 (group['betas'] = momentum)",
    ),
    always(
        "/scheduler/params/cycle_max_mom",
        Broken::OutsideUnitInterval,
        Severity::Error,
        "it becomes the optimizer's beta1 during the cycle; beta1 >= 1 or < 0 breaks Adam's moment estimates as a bad `betas` does",
        "deepspeed/runtime/lr_schedules.py:573 (max_moms = [(mom, 0.99) ...]) and :615-617",
    ),
    // LRRangeTest.
    always(
        "/scheduler/params/lr_range_test_min_lr",
        Broken::Negative,
        Severity::Error,
        "the test grows the rate from this value by a positive factor, so every step runs with a negative learning rate",
        "deepspeed/runtime/lr_schedules.py:393 (lr = lr_range_test_min_lr * lr_increase)",
    ),
    always(
        "/scheduler/params/lr_range_test_step_rate",
        Broken::Negative,
        Severity::Error,
        "the factor 1 + step_rate * interval falls through 0, so the learning rate shrinks to 0 and then turns negative",
        "deepspeed/runtime/lr_schedules.py:389 (return 1 + self.step_rate * self.interval_fn())",
    ),
    // ZeRO stage 3 buckets.
    Range {
        pointer: "/zero_optimization/sub_group_size",
        broken: Broken::Zero,
        applies: Applies::ZeroStage3,
        severity: Severity::Warning,
        reason: "every parameter becomes its own optimizer sub-group, so the optimizer steps (and, with offload, swaps) once per parameter",
        source: "deepspeed/runtime/zero/stage3.py:1226 (if local_sub_group_size >= sub_group_size: close the sub-group)",
    },
    Range {
        pointer: "/zero_optimization/stage3_max_live_parameters",
        broken: Broken::Zero,
        applies: Applies::ZeroStage3,
        severity: Severity::Warning,
        reason: "the prefetch budget is max_live_parameters minus what is already gathered, so with 0 nothing is ever prefetched and every gather waits",
        source: "deepspeed/runtime/zero/partitioned_param_coordinator.py:453-454 (max_params_to_prefetch = min(max_n_available_params - n_available_params, prefetch_bucket_sz))",
    },
    // Parameter offload to NVMe.
    Range {
        pointer: "/zero_optimization/offload_param/buffer_count",
        broken: Broken::Zero,
        applies: Applies::ParamOffloadToNvme,
        severity: Severity::Error,
        reason: "the parameter swapper has no buffer to read a swapped parameter into, so the first swap-in fails",
        source: "deepspeed/runtime/swap_tensor/partitioned_param_swapper.py:108 (available_buffer_ids = range(buffer_count)) and :333 (assert len(self.available_buffer_ids) > 0)",
    },
    Range {
        pointer: "/zero_optimization/offload_param/buffer_size",
        broken: Broken::Zero,
        applies: Applies::ParamOffloadToNvme,
        severity: Severity::Error,
        reason: "no parameter fits a swap buffer of 0 elements, so the first swap-in fails",
        source: "deepspeed/runtime/swap_tensor/partitioned_param_swapper.py:357 (assert numel <= self.elements_per_buffer)",
    },
    // The asynchronous I/O engine.
    always(
        "/aio/block_size",
        Broken::Zero,
        Severity::Error,
        "each transfer is cut into num_bytes / block_size requests: a division by zero in the C++ engine",
        "csrc/aio/common/deepspeed_aio_common.cpp:138 (ceil(num_bytes / aio_ctxt->_block_size))",
    ),
    always(
        "/aio/queue_depth",
        Broken::Zero,
        Severity::Error,
        "the submit loop advances by queue_depth requests at a time, so with 0 it never advances and the first swap hangs",
        "csrc/aio/common/deepspeed_aio_common.cpp:151 (for (...; iocb_index < num_io_blocks; iocb_index += aio_ctxt->_queue_depth))",
    ),
    always(
        "/aio/intra_op_parallelism",
        Broken::Zero,
        Severity::Error,
        "each request is split across this many threads and swap sizes are aligned to 1024 bytes × it: an integer division by zero (SIGFPE) in the C++ engine and a ZeroDivisionError in the swapper",
        "csrc/aio/py_lib/deepspeed_py_io_handle.cpp:244 (num_bytes % get_intra_op_parallelism()) and deepspeed/runtime/swap_tensor/optimizer_utils.py:181-182 (aligned_bytes = AIO_ALIGNED_BYTES * intra_op_parallelism)",
    ),
];

/// Every value in `view` that [`RANGES`] says cannot work.
pub fn check(view: View<'_>) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for range in RANGES {
        if !range.applies.holds(view) {
            continue;
        }
        for spelling in spellings(range.pointer) {
            for (at, value) in numbers(view, &spelling) {
                if range.broken.holds(value) {
                    found.push(diagnostic(range, &at, value));
                }
            }
        }
    }
    found
}

/// The key's pointer and, when it has one, its second spelling's.
fn spellings(pointer: &'static str) -> Vec<String> {
    let mut all = vec![pointer.to_string()];
    let parent = json_pointer::parent(pointer);
    let key = json_pointer::last_token(pointer);
    for alias in ALIASES.iter().filter(|a| a.parent == parent) {
        if alias.canonical == key {
            all.push(json_pointer::child(parent, alias.alias));
        }
    }
    all
}

/// The number at `pointer`, or each number of the list there, with its own pointer.
fn numbers(view: View<'_>, pointer: &str) -> Vec<(String, f64)> {
    match view.get(pointer) {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(at, v)| v.as_f64().map(|n| (json_pointer::index(pointer, at), n)))
            .collect(),
        Some(value) => value
            .as_f64()
            .map(|n| vec![(pointer.to_string(), n)])
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

fn diagnostic(range: &Range, at: &str, value: f64) -> Diagnostic {
    Diagnostic::new(
        range.severity,
        Code::OutOfRange,
        at,
        format!(
            "`{}` is {value}, but it must be {}: {}",
            json_pointer::tokens(at).join("."),
            range.broken.wanted(),
            range.reason
        ),
    )
    .with_help(format!("DeepSpeed 0.19.8 uses it in {}", range.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_names_a_source_line_and_a_reason() {
        for range in RANGES {
            assert!(
                range.source.contains(".py:") || range.source.contains(".cpp:"),
                "{range:?}"
            );
            assert!(!range.reason.is_empty(), "{range:?}");
        }
    }
}
