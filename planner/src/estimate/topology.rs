//! [`Topology`]: the machine an estimate is for: GPUs per node, nodes, and DeepSpeed's fudge factor.

use std::fmt;

/// The most GPUs dsplan accepts in one estimate (2^32): far beyond any cluster, small enough
/// that every product in the estimators stays exact in 128-bit integers.
pub const MAX_TOTAL_GPUS: u64 = 1 << 32;

/// A cluster of `nodes` identical nodes with `gpus_per_node` GPUs each (both at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    gpus_per_node: u64,
    nodes: u64,
}

impl Topology {
    /// One node with one GPU, DeepSpeed's default.
    pub const SINGLE_GPU: Topology = Topology {
        gpus_per_node: 1,
        nodes: 1,
    };

    /// Checks that both counts are at least 1 and that the total stays below
    /// [`MAX_TOTAL_GPUS`].
    pub fn new(gpus_per_node: u64, nodes: u64) -> Result<Topology, TopologyError> {
        if gpus_per_node == 0 {
            return Err(TopologyError::NoGpus);
        }
        if nodes == 0 {
            return Err(TopologyError::NoNodes);
        }
        match gpus_per_node.checked_mul(nodes) {
            Some(total) if total <= MAX_TOTAL_GPUS => Ok(Topology {
                gpus_per_node,
                nodes,
            }),
            _ => Err(TopologyError::TooManyGpus {
                gpus_per_node,
                nodes,
            }),
        }
    }

    /// GPUs in each node.
    pub fn gpus_per_node(self) -> u64 {
        self.gpus_per_node
    }

    /// Number of nodes.
    pub fn nodes(self) -> u64 {
        self.nodes
    }

    /// GPUs in the whole cluster (the data-parallel world size).
    pub fn total_gpus(self) -> u64 {
        self.gpus_per_node * self.nodes
    }
}

/// Why a [`Topology`] or a [`BufferFactor`] was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum TopologyError {
    /// `gpus_per_node` was 0.
    NoGpus,
    /// `nodes` was 0.
    NoNodes,
    /// More than [`MAX_TOTAL_GPUS`] GPUs in total.
    TooManyGpus {
        /// GPUs per node asked for.
        gpus_per_node: u64,
        /// Nodes asked for.
        nodes: u64,
    },
    /// The buffer factor is negative, NaN or infinite.
    BadBufferFactor(f64),
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::NoGpus => write!(f, "the number of GPUs per node must be at least 1"),
            TopologyError::NoNodes => write!(f, "the number of nodes must be at least 1"),
            TopologyError::TooManyGpus {
                gpus_per_node,
                nodes,
            } => write!(
                f,
                "{gpus_per_node} GPUs per node x {nodes} nodes is more than the {MAX_TOTAL_GPUS} GPUs dsplan accepts"
            ),
            TopologyError::BadBufferFactor(factor) => write!(
                f,
                "the additional buffer factor must be a finite number >= 0, not {factor}"
            ),
        }
    }
}

impl std::error::Error for TopologyError {}

/// DeepSpeed's `additional_buffer_factor`: the CPU estimates are multiplied by it. A finite,
/// non-negative double; DeepSpeed's default is 1.5.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct BufferFactor(f64);

impl BufferFactor {
    /// DeepSpeed's default factor, 1.5.
    pub const DEEPSPEED_DEFAULT: BufferFactor = BufferFactor(1.5);

    /// Accepts any finite factor >= 0.
    pub fn new(factor: f64) -> Result<BufferFactor, TopologyError> {
        if factor.is_finite() && factor >= 0.0 {
            Ok(BufferFactor(factor))
        } else {
            Err(TopologyError::BadBufferFactor(factor))
        }
    }

    /// The factor as a double.
    pub fn value(self) -> f64 {
        self.0
    }
}

impl Default for BufferFactor {
    fn default() -> BufferFactor {
        BufferFactor::DEEPSPEED_DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_must_be_positive_and_bounded() {
        assert_eq!(Topology::new(0, 1), Err(TopologyError::NoGpus));
        assert_eq!(Topology::new(1, 0), Err(TopologyError::NoNodes));
        assert!(matches!(
            Topology::new(1 << 20, 1 << 20),
            Err(TopologyError::TooManyGpus { .. })
        ));
        let cluster = Topology::new(8, 4).expect("valid");
        assert_eq!(cluster.total_gpus(), 32);
    }

    #[test]
    fn buffer_factor_rejects_nonsense() {
        assert!(BufferFactor::new(f64::NAN).is_err());
        assert!(BufferFactor::new(-0.5).is_err());
        assert_eq!(BufferFactor::new(2.0).map(BufferFactor::value), Ok(2.0));
        assert_eq!(BufferFactor::default().value(), 1.5);
    }
}
