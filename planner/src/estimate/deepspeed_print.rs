//! The text DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs_all_cold` print,
//! character for character.
//!
//! Layout (deepspeed-facts §1.4): a three-line header, the column titles, then one row per
//! option set: `" {cpu/2**30:7.2f}GB | {gpu/2**30:6.2f}GB | {options}"`. The values are GiB
//! although the label says GB; the division is Python's correctly rounded `int / int` and the
//! two-decimal formatting rounds the exact double half to even, which Rust's `{:.2}` also does.
//!
//! One detail depends on the Python version DeepSpeed runs on: the offload device is printed
//! with `f'{OffloadDeviceEnum.cpu:4}'`. Up to Python 3.10 that gives `cpu ` (the value padded
//! to four characters), as in DeepSpeed's documentation; from Python 3.11 on, formatting a
//! `(str, Enum)` member gives `OffloadDeviceEnum.cpu`. [`EnumSpelling`] picks either.

use super::deepspeed::{
    BytesOverflow, OffloadDevice, ZERO2_TABLE_ORDER, ZERO3_TABLE_ORDER, Zero3Options,
    estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs,
};
use super::python_math::{true_divide, truncate};
use super::topology::{BufferFactor, Topology};
use std::fmt::Write;

/// How the `cpu` offload device is spelled in the options column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnumSpelling {
    /// `cpu ` (padded to four characters): DeepSpeed's documentation and Python <= 3.10.
    #[default]
    Padded,
    /// `OffloadDeviceEnum.cpu`: what DeepSpeed prints on Python >= 3.11.
    Qualified,
}

impl EnumSpelling {
    fn device(self, device: OffloadDevice) -> &'static str {
        match (device, self) {
            (OffloadDevice::None, _) => "none",
            (OffloadDevice::Cpu, EnumSpelling::Padded) => "cpu ",
            (OffloadDevice::Cpu, EnumSpelling::Qualified) => "OffloadDeviceEnum.cpu",
        }
    }
}

const TITLE: &str = "Estimated memory needed for params, optim states and gradients for a:";
const COLUMNS: &str = "  per CPU  |  per GPU |   Options";
const GIB: u128 = 1 << 30;

/// `HW: Setup with 1 node, 8 GPUs per node.`
fn hardware_line(hardware: Topology) -> String {
    let nodes = hardware.nodes();
    let gpus = hardware.gpus_per_node();
    let nodes_word = if nodes > 1 { "nodes" } else { "node" };
    let gpus_word = if gpus > 1 { "GPUs" } else { "GPU" };
    format!("HW: Setup with {nodes} {nodes_word}, {gpus} {gpus_word} per node.")
}

/// Python's `int(params / 1e6)`: the int is converted to a double first, then divided.
fn millions(params: u64) -> u64 {
    truncate(params as f64 / 1e6).unwrap_or(u64::MAX)
}

/// `" {cpu/2**30:7.2f}GB | {gpu/2**30:6.2f}GB | {options}"`
fn row(text: &mut String, cpu_bytes: u64, gpu_bytes: u64, options: &str) {
    let gib = |bytes: u64| true_divide(u128::from(bytes), GIB).unwrap_or(f64::NAN);
    // Writing to a String cannot fail.
    let _ = writeln!(
        text,
        " {:7.2}GB | {:6.2}GB | {options}",
        gib(cpu_bytes),
        gib(gpu_bytes)
    );
}

/// What `estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node,
/// num_nodes, additional_buffer_factor)` prints, newline-terminated lines.
pub fn zero2_all_cold_text(
    total_params: u64,
    hardware: Topology,
    factor: BufferFactor,
    spelling: EnumSpelling,
) -> Result<String, BytesOverflow> {
    let mut text = String::new();
    let _ = writeln!(text, "{TITLE}");
    let _ = writeln!(text, "{}", hardware_line(hardware));
    let _ = writeln!(
        text,
        "SW: Model with {}M total params.",
        millions(total_params)
    );
    let _ = writeln!(text, "{COLUMNS}");
    for offload_optimizer in ZERO2_TABLE_ORDER {
        let needs = estimate_zero2_model_states_mem_needs(
            total_params,
            hardware,
            offload_optimizer,
            factor,
        )?;
        let options = format!("offload_optimizer={}", spelling.device(offload_optimizer));
        row(&mut text, needs.cpu_bytes, needs.gpu_bytes, &options);
    }
    Ok(text)
}

/// What `estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params,
/// num_gpus_per_node, num_nodes, additional_buffer_factor)` prints, newline-terminated lines.
pub fn zero3_all_cold_text(
    total_params: u64,
    largest_layer_params: u64,
    hardware: Topology,
    factor: BufferFactor,
    spelling: EnumSpelling,
) -> Result<String, BytesOverflow> {
    let mut text = String::new();
    let _ = writeln!(text, "{TITLE}");
    let _ = writeln!(text, "{}", hardware_line(hardware));
    let _ = writeln!(
        text,
        "SW: Model with {}M total params, {}M largest layer params.",
        millions(total_params),
        millions(largest_layer_params)
    );
    let _ = writeln!(text, "{COLUMNS}");
    for options in ZERO3_TABLE_ORDER {
        let needs = estimate_zero3_model_states_mem_needs(
            total_params,
            largest_layer_params,
            hardware,
            options,
            factor,
        )?;
        row(
            &mut text,
            needs.cpu_bytes,
            needs.gpu_bytes,
            &zero3_options_text(options, spelling),
        );
    }
    Ok(text)
}

/// `offload_param=X, offload_optimizer=Y, zero_init=Z`
fn zero3_options_text(options: Zero3Options, spelling: EnumSpelling) -> String {
    format!(
        "offload_param={}, offload_optimizer={}, zero_init={}",
        spelling.device(options.offload_param),
        spelling.device(options.offload_optimizer),
        options.zero_init.as_digit()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t0_3b_table_is_the_documented_one() {
        let text = zero3_all_cold_text(
            2_783_959_040,
            65_798_144,
            Topology::SINGLE_GPU,
            BufferFactor::default(),
            EnumSpelling::Padded,
        )
        .expect("fits");
        let expected = "\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 1 GPU per node.
SW: Model with 2783M total params, 65M largest layer params.
  per CPU  |  per GPU |   Options
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=1
   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1
   15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0
";
        assert_eq!(text, expected);
    }

    #[test]
    fn plurals_follow_the_counts() {
        assert_eq!(
            hardware_line(Topology::SINGLE_GPU),
            "HW: Setup with 1 node, 1 GPU per node."
        );
        let cluster = Topology::new(8, 2).expect("valid");
        assert_eq!(
            hardware_line(cluster),
            "HW: Setup with 2 nodes, 8 GPUs per node."
        );
    }

    #[test]
    fn millions_truncate() {
        assert_eq!(millions(2_783_959_040), 2783);
        assert_eq!(millions(999_999), 0);
    }
}
