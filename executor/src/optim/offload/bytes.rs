//! Bytes moved to and from host memory per parameter by an offload step, STREAM-style (bytes
//! read plus bytes written; write-allocate reads not counted), for the benchmark's figures.

use super::io::{GradDtype, OutDtype};

/// Bytes per parameter one pass over host memory moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesPerParam {
    /// Read.
    pub read: usize,
    /// Written.
    pub written: usize,
}

impl BytesPerParam {
    /// Read plus written.
    pub fn total(self) -> usize {
        self.read + self.written
    }
}

/// dsplan's one-pass step: master, `exp_avg` and `exp_avg_sq` read and written (24 B), the
/// gradient read in its own dtype, the 16-bit copy written.
pub fn offload_step_bytes(grads: GradDtype, out: OutDtype) -> BytesPerParam {
    let grad = match grads {
        GradDtype::F32 => 4,
        GradDtype::Bf16 | GradDtype::F16 => 2,
    };
    let copy = match out {
        OutDtype::None => 0,
        OutDtype::Bf16 | OutDtype::F16 => 2,
    };
    BytesPerParam {
        read: 12 + grad,
        written: 12 + copy,
    }
}

/// DeepSpeed 0.19.8's ZeRO-Offload step on the host, per parameter, with 16-bit gradients
/// from the device: the gradient lands widened in an fp32 buffer, `unscale_and_clip_grads`
/// multiplies that buffer in place (when clipping or loss scaling is on: 4 B read, 4 B
/// written), `DeepSpeedCPUAdam` steps in fp32 (16 B read, 12 B written), and
/// `bit16_buffer.copy_(fp32_partition)` writes the 16-bit copy (4 B read, 2 B written).
/// The fp32 gradient's 4 B arrive by DMA before the step and are not counted.
pub fn deepspeed_offload_bytes(unscale_pass: UnscalePass) -> BytesPerParam {
    let (r, w) = match unscale_pass {
        UnscalePass::Run => (4, 4),
        UnscalePass::Skipped => (0, 0),
    };
    BytesPerParam {
        read: r + 16 + 4,
        written: w + 12 + 2,
    }
}

/// Whether DeepSpeed runs its separate gradient pass (it does whenever `gradient_clipping`
/// is set or the loss scale is not 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnscalePass {
    /// `grad.mul_(1 / combined_scale)` runs.
    Run,
    /// bf16 without clipping: no pass.
    Skipped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_of_the_issue() {
        assert_eq!(
            offload_step_bytes(GradDtype::F32, OutDtype::None).total(),
            28
        );
        assert_eq!(
            offload_step_bytes(GradDtype::Bf16, OutDtype::Bf16).total(),
            28
        );
        assert_eq!(deepspeed_offload_bytes(UnscalePass::Run).total(), 42);
        assert_eq!(deepspeed_offload_bytes(UnscalePass::Skipped).total(), 34);
    }
}
