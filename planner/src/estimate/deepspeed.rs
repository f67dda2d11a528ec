//! DeepSpeed's model-state memory estimators, reproduced byte for byte.
//!
//! `estimate_zero2_model_states_mem_needs` (`deepspeed/runtime/zero/stage_1_and_2.py`) and
//! `estimate_zero3_model_states_mem_needs` (`deepspeed/runtime/zero/stage3.py`) count only
//! parameters, gradients and optimizer states, times a fudge factor for the CPU side. The
//! formulas are transcribed from their behaviour (research notes, deepspeed-facts §1.1-1.2)
//! with Python's operation order and number types kept, so that every `int()` truncation lands
//! on the same byte: integer products are exact, an integer meets a float only where DeepSpeed's
//! code makes it do so. The reference test checks all 2,280 rows DeepSpeed 0.19.8 produced.

use super::python_math::{PyNumber, true_divide, truncate};
use super::topology::{BufferFactor, Topology};
use serde::{Serialize, Serializer};
use std::fmt;

/// Where DeepSpeed keeps a piece of model state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OffloadDevice {
    /// On the GPU (no offload).
    None,
    /// Offloaded to CPU memory.
    Cpu,
}

impl OffloadDevice {
    fn is_offloaded(self) -> bool {
        self == OffloadDevice::Cpu
    }
}

/// Whether the model is built under `deepspeed.zero.Init` (ZeRO-3 only): partitioned at
/// construction instead of first materialised whole on every rank's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZeroInit {
    /// Built partitioned (`zero_init=1` in DeepSpeed's table).
    Enabled,
    /// Built whole, then partitioned (`zero_init=0`).
    Disabled,
}

impl ZeroInit {
    /// DeepSpeed's `1`/`0` in the printed table.
    pub fn as_digit(self) -> u8 {
        match self {
            ZeroInit::Enabled => 1,
            ZeroInit::Disabled => 0,
        }
    }
}

impl Serialize for ZeroInit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bool(*self == ZeroInit::Enabled)
    }
}

/// The options of one ZeRO-3 estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zero3Options {
    /// `offload_optimizer.device` (DeepSpeed's `cpu_offload`).
    pub offload_optimizer: OffloadDevice,
    /// `offload_param.device` (DeepSpeed's `cpu_offload_params`). DeepSpeed's function only
    /// honours it when the optimizer is offloaded too; otherwise it computes the no-offload case.
    pub offload_param: OffloadDevice,
    /// Whether `zero.Init` builds the model.
    pub zero_init: ZeroInit,
}

/// The ZeRO-2 options in the order DeepSpeed's printed table lists them.
pub const ZERO2_TABLE_ORDER: [OffloadDevice; 2] = [OffloadDevice::Cpu, OffloadDevice::None];

/// The six ZeRO-3 option sets in the order DeepSpeed's printed table lists them (parameter
/// offload without optimizer offload is skipped, as DeepSpeed skips it).
pub const ZERO3_TABLE_ORDER: [Zero3Options; 6] = {
    use OffloadDevice::{Cpu, None};
    use ZeroInit::{Disabled, Enabled};
    const fn options(
        optimizer: OffloadDevice,
        param: OffloadDevice,
        zero_init: ZeroInit,
    ) -> Zero3Options {
        Zero3Options {
            offload_optimizer: optimizer,
            offload_param: param,
            zero_init,
        }
    }
    [
        options(Cpu, Cpu, Enabled),
        options(Cpu, Cpu, Disabled),
        options(Cpu, None, Enabled),
        options(Cpu, None, Disabled),
        options(None, None, Enabled),
        options(None, None, Disabled),
    ]
};

/// What `estimate_zero2_model_states_mem_needs` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zero2MemNeeds {
    /// Bytes of CPU memory per node.
    pub cpu_bytes: u64,
    /// Bytes of GPU memory per GPU.
    pub gpu_bytes: u64,
}

/// What `estimate_zero3_model_states_mem_needs` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zero3MemNeeds {
    /// Bytes of CPU memory per node.
    pub cpu_bytes: u64,
    /// Bytes of GPU memory per GPU.
    pub gpu_bytes: u64,
    /// `4 * largest_layer_params`: the gathered 16-bit largest layer and its 16-bit gradient.
    pub largest_layer_memory_bytes: u64,
}

/// An estimate that cannot be expressed in 64-bit bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesOverflow;

impl fmt::Display for BytesOverflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the estimate exceeds 2^64 bytes")
    }
}

impl std::error::Error for BytesOverflow {}

/// `int(x)` of a float that must be a byte count.
fn to_bytes(x: f64) -> Result<u64, BytesOverflow> {
    truncate(x).ok_or(BytesOverflow)
}

/// An exact integer that must be a byte count.
fn int_bytes(x: u128) -> Result<u64, BytesOverflow> {
    u64::try_from(x).map_err(|_| BytesOverflow)
}

/// DeepSpeed's `int(a / b)` for integers (`b` is never zero here: [`Topology`] guarantees it).
fn int_of_quotient(a: u128, b: u128) -> Result<u128, BytesOverflow> {
    let quotient = true_divide(a, b).ok_or(BytesOverflow)?;
    truncate(quotient).map(u128::from).ok_or(BytesOverflow)
}

/// `estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes,
/// cpu_offload, additional_buffer_factor)`.
pub fn estimate_zero2_model_states_mem_needs(
    total_params: u64,
    hardware: Topology,
    offload_optimizer: OffloadDevice,
    additional_buffer_factor: BufferFactor,
) -> Result<Zero2MemNeeds, BytesOverflow> {
    let params = u128::from(total_params);
    let total_gpus = u128::from(hardware.total_gpus());
    let per_node = u128::from(hardware.gpus_per_node());
    let factor = additional_buffer_factor.value();
    let (cpu, gpu) = if offload_optimizer.is_offloaded() {
        // gpu = 2 * P;  cpu = P * max(4 * total_gpus, 16) * f
        let gpu = 2 * params;
        let cpu = PyNumber::Int((4 * total_gpus).max(16))
            .times_int(params)
            .times_float(factor);
        (cpu, gpu)
    } else {
        // gpu = 2 * P + int(18 * P / total_gpus);  cpu = P * 4 * per_node * f
        let gpu = 2 * params + int_of_quotient(18 * params, total_gpus)?;
        let cpu = (params * 4 * per_node) as f64 * factor;
        (cpu, gpu)
    };
    Ok(Zero2MemNeeds {
        cpu_bytes: to_bytes(cpu)?,
        gpu_bytes: int_bytes(gpu)?,
    })
}

/// `estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
/// num_gpus_per_node, num_nodes, cpu_offload, cpu_offload_params, zero_init,
/// additional_buffer_factor)`, for every option combination (including parameter offload
/// without optimizer offload, which DeepSpeed computes as the no-offload case).
pub fn estimate_zero3_model_states_mem_needs(
    total_params: u64,
    largest_layer_params: u64,
    hardware: Topology,
    options: Zero3Options,
    additional_buffer_factor: BufferFactor,
) -> Result<Zero3MemNeeds, BytesOverflow> {
    let params = u128::from(total_params);
    let largest = u128::from(largest_layer_params);
    let total_gpus = u128::from(hardware.total_gpus());
    let per_node = u128::from(hardware.gpus_per_node());
    let factor = additional_buffer_factor.value();
    // gpus_factor = 1 / num_nodes (a float); largest_layer_memory = 4 * L (an int)
    let gpus_factor = true_divide(1, u128::from(hardware.nodes())).ok_or(BytesOverflow)?;
    let largest_layer_memory = 4 * largest;
    let zero_init = options.zero_init == ZeroInit::Enabled;

    let (cpu, gpu) = if options.offload_optimizer.is_offloaded() {
        // 18 bytes per param on the CPU with parameter offload, 16 without.
        let (gpu, per_param) = if options.offload_param.is_offloaded() {
            (largest_layer_memory, 18)
        } else {
            (
                largest_layer_memory + int_of_quotient(2 * params, total_gpus)?,
                16,
            )
        };
        let cpu = if zero_init {
            // P * per_param * gpus_factor * f
            (params * per_param) as f64 * gpus_factor * factor
        } else {
            // P * max(4 * per_node, per_param * gpus_factor) * f
            let replicated = PyNumber::Int(4 * per_node);
            let partitioned = PyNumber::Float(per_param as f64 * gpus_factor);
            replicated
                .max(partitioned)
                .times_int(params)
                .times_float(factor)
        };
        (cpu, gpu)
    } else {
        let gpu = largest_layer_memory + int_of_quotient(18 * params, total_gpus)?;
        let cpu = if zero_init {
            // L * 4 * per_node * f
            (largest * 4 * per_node) as f64 * factor
        } else {
            // P * 4 * per_node * f
            (params * 4 * per_node) as f64 * factor
        };
        (cpu, gpu)
    };
    Ok(Zero3MemNeeds {
        cpu_bytes: to_bytes(cpu)?,
        gpu_bytes: int_bytes(gpu)?,
        largest_layer_memory_bytes: int_bytes(largest_layer_memory)?,
    })
}

/// One row of DeepSpeed's estimate tables, as dsplan reports it in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeepSpeedRow {
    /// ZeRO stage: 2 or 3.
    pub stage: u8,
    /// Optimizer state placement.
    pub offload_optimizer: OffloadDevice,
    /// Parameter placement (ZeRO-3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_param: Option<OffloadDevice>,
    /// Whether `zero.Init` is assumed (ZeRO-3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_init: Option<ZeroInit>,
    /// Bytes of CPU memory per node.
    pub cpu_bytes: u64,
    /// Bytes of GPU memory per GPU.
    pub gpu_bytes: u64,
}

/// The two ZeRO-2 rows of DeepSpeed's printed table, in its order.
pub fn zero2_table(
    total_params: u64,
    hardware: Topology,
    factor: BufferFactor,
) -> Result<Vec<DeepSpeedRow>, BytesOverflow> {
    ZERO2_TABLE_ORDER
        .iter()
        .map(|&offload_optimizer| {
            let needs = estimate_zero2_model_states_mem_needs(
                total_params,
                hardware,
                offload_optimizer,
                factor,
            )?;
            Ok(DeepSpeedRow {
                stage: 2,
                offload_optimizer,
                offload_param: None,
                zero_init: None,
                cpu_bytes: needs.cpu_bytes,
                gpu_bytes: needs.gpu_bytes,
            })
        })
        .collect()
}

/// The six ZeRO-3 rows of DeepSpeed's printed table, in its order.
pub fn zero3_table(
    total_params: u64,
    largest_layer_params: u64,
    hardware: Topology,
    factor: BufferFactor,
) -> Result<Vec<DeepSpeedRow>, BytesOverflow> {
    ZERO3_TABLE_ORDER
        .iter()
        .map(|&options| {
            let needs = estimate_zero3_model_states_mem_needs(
                total_params,
                largest_layer_params,
                hardware,
                options,
                factor,
            )?;
            Ok(DeepSpeedRow {
                stage: 3,
                offload_optimizer: options.offload_optimizer,
                offload_param: Some(options.offload_param),
                zero_init: Some(options.zero_init),
                cpu_bytes: needs.cpu_bytes,
                gpu_bytes: needs.gpu_bytes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0_3B_PARAMS: u64 = 2_783_959_040;
    const T0_3B_LARGEST: u64 = 65_798_144;

    #[test]
    fn t0_3b_single_gpu_matches_the_worked_example() {
        let rows = zero3_table(
            T0_3B_PARAMS,
            T0_3B_LARGEST,
            Topology::SINGLE_GPU,
            BufferFactor::default(),
        )
        .expect("fits in u64");
        let bytes: Vec<(u64, u64)> = rows
            .iter()
            .map(|row| (row.cpu_bytes, row.gpu_bytes))
            .collect();
        assert_eq!(
            bytes,
            [
                (75_166_894_080, 263_192_576),
                (75_166_894_080, 263_192_576),
                (66_815_016_960, 5_831_110_656),
                (66_815_016_960, 5_831_110_656),
                (394_788_864, 50_374_455_296),
                (16_703_754_240, 50_374_455_296),
            ]
        );
    }

    /// (params, largest layer, GPUs per node, nodes, options, factor, (cpu, gpu) bytes)
    type Zero3Case = (u64, u64, u64, u64, Zero3Options, f64, (u64, u64));

    /// Cases where a different association or an early int-to-float conversion changes the
    /// bytes, with the values DeepSpeed's own function code returns for them (run in Python).
    #[test]
    fn operation_order_matters_at_large_counts() {
        use OffloadDevice::{Cpu, None};
        use ZeroInit::{Disabled, Enabled};
        let zero3: [Zero3Case; 4] = [
            (
                337_731_480_475_340,
                15_256_092_975_963,
                6,
                1,
                Zero3Options {
                    offload_optimizer: Cpu,
                    offload_param: Cpu,
                    zero_init: Enabled,
                },
                1.3,
                (7_902_916_643_122_956, 61_024_371_903_852),
            ),
            (
                7_732_395_322_603_582,
                326_070_194_126_510,
                6,
                3,
                Zero3Options {
                    offload_optimizer: Cpu,
                    offload_param: None,
                    zero_init: Enabled,
                },
                2.2,
                (90_726_771_785_215_360, 2_163_435_812_350_882),
            ),
            (
                5_144_952_511_766_673,
                105_762_018_809_160,
                3,
                1,
                Zero3Options {
                    offload_optimizer: None,
                    offload_param: None,
                    zero_init: Enabled,
                },
                2.2,
                (2_792_117_296_561_824, 31_292_763_145_836_680),
            ),
            (
                4_081_923_804_399_751,
                168_755_113_011_545,
                2,
                3,
                Zero3Options {
                    offload_optimizer: None,
                    offload_param: None,
                    zero_init: Disabled,
                },
                1.05,
                (34_288_159_956_957_908, 12_920_791_865_245_432),
            ),
        ];
        for (params, largest, per_node, nodes, options, factor, expected) in zero3 {
            let hardware = Topology::new(per_node, nodes).expect("valid");
            let factor = BufferFactor::new(factor).expect("valid");
            let needs =
                estimate_zero3_model_states_mem_needs(params, largest, hardware, options, factor)
                    .expect("fits");
            assert_eq!(
                (needs.cpu_bytes, needs.gpu_bytes),
                expected,
                "{params} {options:?}"
            );
        }
        let zero2 = [
            (
                3_093_754_701_341_639,
                6,
                5,
                None,
                1.1,
                (81_675_124_115_419_264, 8_043_762_223_488_261),
            ),
            (
                6_018_756_652_090_100,
                1,
                5,
                Cpu,
                0.7,
                (84_262_593_129_261_392, 12_037_513_304_180_200),
            ),
        ];
        for (params, per_node, nodes, offload, factor, expected) in zero2 {
            let hardware = Topology::new(per_node, nodes).expect("valid");
            let factor = BufferFactor::new(factor).expect("valid");
            let needs = estimate_zero2_model_states_mem_needs(params, hardware, offload, factor)
                .expect("fits");
            assert_eq!((needs.cpu_bytes, needs.gpu_bytes), expected, "{params}");
        }
    }

    #[test]
    fn zero2_uses_total_gpus_for_offloaded_cpu_memory() {
        let cluster = Topology::new(8, 2).expect("valid");
        let needs = estimate_zero2_model_states_mem_needs(
            1_000,
            cluster,
            OffloadDevice::Cpu,
            BufferFactor::default(),
        )
        .expect("small");
        // max(4 * 16, 16) = 64 bytes per param, times 1.5.
        assert_eq!(
            needs,
            Zero2MemNeeds {
                cpu_bytes: 96_000,
                gpu_bytes: 2_000
            }
        );
    }

    #[test]
    fn param_offload_without_optimizer_offload_is_the_no_offload_case() {
        let hardware = Topology::new(4, 1).expect("valid");
        let factor = BufferFactor::default();
        let with = |offload_param| {
            let options = Zero3Options {
                offload_optimizer: OffloadDevice::None,
                offload_param,
                zero_init: ZeroInit::Enabled,
            };
            estimate_zero3_model_states_mem_needs(1_000_003, 1_000, hardware, options, factor)
                .expect("small")
        };
        assert_eq!(with(OffloadDevice::Cpu), with(OffloadDevice::None));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let options = ZERO3_TABLE_ORDER[1];
        let huge = BufferFactor::new(1e9).expect("finite");
        assert_eq!(
            estimate_zero3_model_states_mem_needs(
                u64::MAX / 2,
                1,
                Topology::SINGLE_GPU,
                options,
                huge
            ),
            Err(BytesOverflow)
        );
    }
}
