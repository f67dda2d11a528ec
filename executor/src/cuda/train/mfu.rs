//! Model FLOPs utilisation: the model's training FLOPs per token (PaLM, appendix B:
//! `6N + 12 L H Q T`, with N every trainable parameter, as nanoGPT and llm.c count it; `L` layers, `H` heads, `Q` head size, `T` sequence length) times tokens
//! per second, over the device's dense 16-bit peak.

use crate::model::{Gpt2Config, ParamLayout};

/// Dense bf16/fp16 tensor-core peaks (FLOP/s, without sparsity) by device-name fragment,
/// most specific first.
pub const PEAK_FLOPS: &[(&str, f64)] = &[
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("A100", 312e12),
];

/// The peak of the device called `name` (`None`: not in [`PEAK_FLOPS`]).
pub fn peak_flops(name: &str) -> Option<f64> {
    PEAK_FLOPS
        .iter()
        .find(|(fragment, _)| name.contains(fragment))
        .map(|(_, peak)| *peak)
}

/// Training FLOPs per token of `config` on rows of `seq_len`.
pub fn flops_per_token(config: &Gpt2Config, seq_len: usize) -> f64 {
    let n = ParamLayout::new(config).num_params() as f64;
    let (l, h, q, t) = (
        config.n_layer as f64,
        config.n_head as f64,
        config.head_dim() as f64,
        seq_len as f64,
    );
    6.0 * n + 12.0 * l * h * q * t
}

/// A model on a device with a known peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mfu {
    /// FLOPs per token.
    pub flops_per_token: f64,
    /// The device's peak.
    pub peak: f64,
}

impl Mfu {
    /// `None` when the device is not in the table.
    pub fn of(config: &Gpt2Config, seq_len: usize, device: &str) -> Option<Self> {
        Some(Self {
            flops_per_token: flops_per_token(config, seq_len),
            peak: peak_flops(device)?,
        })
    }

    /// The fraction of the peak reached at `tokens_per_s`.
    pub fn utilisation(&self, tokens_per_s: f64) -> f64 {
        self.flops_per_token * tokens_per_s / self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_by_name() {
        assert_eq!(peak_flops("NVIDIA H100 80GB HBM3"), Some(989.4e12));
        assert_eq!(peak_flops("NVIDIA H100 PCIe"), Some(756e12));
        assert_eq!(peak_flops("NVIDIA H200"), Some(989.4e12));
        assert_eq!(peak_flops("NVIDIA A100-SXM4-80GB"), Some(312e12));
        assert_eq!(peak_flops("NVIDIA GeForce RTX 4090"), None);
    }

    #[test]
    fn gpt2_small_flops_per_token() {
        let config = Gpt2Config::gpt2();
        // 124.4M parameters: 6N = 746.5 MFLOP, attention 12 * 12 * 12 * 64 * 1024 = 113.2 M.
        let flops = flops_per_token(&config, 1024);
        let n = ParamLayout::new(&config).num_params() as f64;
        assert!((n - 124.44e6).abs() < 0.01e6, "{n}");
        assert!((flops - (6.0 * n + 113_246_208.0)).abs() < 1.0);
        let mfu = Mfu::of(&config, 1024, "NVIDIA H100 80GB HBM3").expect("known");
        assert!((mfu.utilisation(1e6) - flops * 1e6 / 989.4e12).abs() < 1e-12);
    }
}
