//! What the dsplan-cuda backend refuses of an offload config ([`check_offload`]), each an
//! error naming the key's JSON path and the fix. Honoured, not refused: `pin_memory` (which
//! host buffers are pinned), `ratio` (stage 3: the sub-groups past `⌊ratio × groups⌋` keep
//! their optimizer on the GPU), `sub_group_size` (the host step's and the NVMe swap's unit),
//! `buffer_count` and `buffer_size` (the swap buffers), `max_in_cpu`, `super_offload` (the
//! speculative step, [`super::super::settings::OffloadStepping`]).

use super::super::settings::{OffloadStepping, OffloadTarget, Settings};
use crate::config::DsConfig;
use crate::diagnostics::{Code, Diagnostic};

/// Slots the host step of one NVMe sub-group needs at once: its master and both moments.
const NVME_STEP_BUFFERS: u64 = 3;

/// Errors for the offload settings the CUDA step does not run.
pub fn check_offload(config: &DsConfig, settings: &Settings, found: &mut Vec<Diagnostic>) {
    let zero = &config.zero_optimization;
    let mut refuse = |pointer: &str, message: String, help: &str| {
        found.push(
            Diagnostic::error(Code::IncompatibleSettings, pointer, message)
                .with_help(help.to_string()),
        );
    };
    let optimizer = zero.offload_optimizer.as_ref();
    if settings.offload_optimizer.is_offloaded() && optimizer.is_some_and(|o| o.fast_init) {
        refuse(
            "/zero_optimization/offload_optimizer/fast_init",
            "the dsplan-cuda backend does not run fast_init (DeepSpeed's direct \
             initialisation of the NVMe swap files)"
                .into(),
            "remove fast_init: it changes start-up time only, not the step",
        );
    }
    if settings.offload_param.is_offloaded() && !settings.offload_optimizer.is_offloaded() {
        refuse(
            "/zero_optimization/offload_param",
            "the dsplan-cuda backend offloads parameters only together with the optimizer \
             (its host step writes the host's parameter slices)"
                .into(),
            "add \"offload_optimizer\": {\"device\": \"cpu\"}, or remove offload_param",
        );
    }
    if let OffloadTarget::Nvme { buffer_count, .. } = settings.offload_optimizer {
        if buffer_count < NVME_STEP_BUFFERS {
            refuse(
                "/zero_optimization/offload_optimizer/buffer_count",
                format!(
                    "buffer_count {buffer_count} is below the {NVME_STEP_BUFFERS} swap buffers \
                     the host step of one NVMe sub-group holds at once (master and both moments)"
                ),
                "set offload_optimizer.buffer_count to 3 or more (DeepSpeed's default is 4)",
            );
        }
        if settings.offload_stepping == OffloadStepping::Speculative {
            refuse(
                "/zero_optimization/offload_optimizer/super_offload",
                "the speculative step (super_offload) keeps a second copy of the optimizer \
                 state in host memory; the dsplan-cuda backend does not run it with NVMe"
                    .into(),
                "remove super_offload, or offload the optimizer to \"cpu\"",
            );
        }
    }
}
