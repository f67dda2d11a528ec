//! Saving and loading: `checkpoint` (tag validation, universal checkpoints, writers) and `aio`
//! (the asynchronous I/O engine used for NVMe offload and fast checkpoint writing).
//!
//! Both are plain dictionary lookups in DeepSpeed: string choices are upper-cased before they
//! are compared, and unknown keys are ignored, so a misspelt key silently keeps its default.
//! dsplan refuses unknown keys in `checkpoint`, `checkpoint.parallel_write` (`runtime/config.py`
//! 387-401 and 545-569 in 0.19.8), `checkpoint.writer`
//! (`runtime/model_checkpointing/config.py:35-58`) and `aio`
//! (`runtime/swap_tensor/aio_config.py:25-35`), as in the pydantic sections.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::primitives::{NonNegativeInt, case_insensitive_enum};

case_insensitive_enum! {
    /// What happens when ranks disagree on a checkpoint tag.
    pub enum TagValidation {
        /// Log a warning (default).
        Warn => "WARN",
        /// Do not check.
        Ignore => "IGNORE",
        /// Raise an error.
        Fail => "FAIL",
    }
}

/// `checkpoint`: how checkpoints are validated, written and loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Check that every rank saves under the same tag.
    pub tag_validation: TagValidation,
    /// Load a universal checkpoint (converted with `ds_to_universal.py`), which can resume with
    /// a different parallel layout.
    pub load_universal: bool,
    /// Each node saves to its own local storage (the Hugging Face Trainer forces this with
    /// `--save_on_each_node`).
    pub use_node_local_storage: bool,
    /// Parallel checkpoint writing.
    pub parallel_write: ParallelWriteConfig,
    /// Serialise with torch's zip format.
    pub checkpoint_serialization: bool,
    /// The checkpoint writer engine; absent means the default torch writer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<CheckpointWriterConfig>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            tag_validation: TagValidation::Warn,
            load_universal: false,
            use_node_local_storage: false,
            parallel_write: ParallelWriteConfig::default(),
            checkpoint_serialization: true,
            writer: None,
        }
    }
}

/// `checkpoint.parallel_write`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelWriteConfig {
    /// Pipeline parallelism: every stage writes its own part (must be a boolean).
    pub pipeline_stage: bool,
}

case_insensitive_enum! {
    /// The checkpoint writer implementation.
    pub enum CheckpointWriterType {
        /// Writes nothing (testing).
        Mock => "MOCK",
        /// Plain Python file writes.
        Python => "PYTHON",
        /// DeepSpeed's fast writer over async I/O (default).
        Fast => "FAST",
    }
}

case_insensitive_enum! {
    /// Which ranks share the work of writing a data-parallel replica's checkpoint.
    pub enum CheckpointDataParallel {
        /// One writer per replica.
        Replica => "REPLICA",
        /// One writer per CPU socket.
        Socket => "SOCKET",
        /// One writer per machine.
        Machine => "MACHINE",
    }
}

/// `checkpoint.writer`: the checkpoint writer engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointWriterConfig {
    /// The writer implementation.
    #[serde(rename = "type")]
    pub kind: CheckpointWriterType,
    /// Size in bytes of the I/O buffer.
    pub io_buffer_size: NonNegativeInt,
    /// Double-buffer the I/O.
    pub io_buffer_double: bool,
    /// Print I/O statistics.
    pub show_statistics: bool,
    /// How data-parallel ranks share the writing; absent means rank 0 writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<CheckpointDataParallel>,
    /// Write in a background process (decoupled from training).
    pub decoupled: bool,
    /// I/O parallelism multiplier.
    pub io_multiplier: NonNegativeInt,
}

impl Default for CheckpointWriterConfig {
    fn default() -> Self {
        CheckpointWriterConfig {
            kind: CheckpointWriterType::Fast,
            io_buffer_size: NonNegativeInt(64 * 1024 * 1024),
            io_buffer_double: true,
            show_statistics: false,
            data_parallel: None,
            decoupled: false,
            io_multiplier: NonNegativeInt(1),
        }
    }
}

/// `aio`: the asynchronous I/O engine behind NVMe offload (used only when the section is
/// present). I/O is aligned to 1024 bytes × `intra_op_parallelism`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AioConfig {
    /// Bytes per I/O request.
    pub block_size: NonNegativeInt,
    /// Requests in flight per thread.
    pub queue_depth: NonNegativeInt,
    /// I/O threads per request. (The docs call this `thread_count`, which DeepSpeed never
    /// reads.)
    pub intra_op_parallelism: NonNegativeInt,
    /// Submit requests one at a time instead of in batches.
    pub single_submit: bool,
    /// Overlap submission and completion events.
    pub overlap_events: bool,
    /// Use GPUDirect Storage (CUDA only).
    pub use_gds: bool,
    /// Documented in DeepSpeed's docs but never read: DeepSpeed silently ignores it. Use
    /// `intra_op_parallelism`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub thread_count: Option<NonNegativeInt>,
}

impl Default for AioConfig {
    fn default() -> Self {
        AioConfig {
            block_size: NonNegativeInt(1_048_576),
            queue_depth: NonNegativeInt(8),
            intra_op_parallelism: NonNegativeInt(1),
            single_submit: false,
            overlap_events: true,
            use_gds: false,
            thread_count: None,
        }
    }
}
