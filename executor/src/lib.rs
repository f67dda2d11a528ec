//! dsplan's executor: trains a GPT-2 or a Llama-family decoder the way a DeepSpeed config says.
//!
//! * [`model`]: the hand-written GPT-2 and Llama family (forward and backward over flat
//!   buffers, matching `transformers`), reading their parameters unit by unit so they can live
//!   sharded, optionally recomputing each block in backward (activation checkpointing);
//! * [`tensor`]: named spans of flat buffers; [`io`]: Hugging Face `config.json` and
//!   `model.safetensors`;
//! * [`optim`]: Adam/AdamW and gradient clipping on flat slices;
//! * [`comm`]: collectives, with ranks as threads ([`comm::LocalComm`]) or, with the `mpi`
//!   feature, as processes over MPI;
//! * [`launch`]: where this process sits in a multi-process job, read from the environment
//!   torchrun, the DeepSpeed launcher, `mpirun` or `srun` set;
//! * [`data`]: token batches split across ranks and micro-steps as DeepSpeed's runs split them;
//! * [`zero`]: ZeRO stages 0-3 over those ranks, fp32/bf16/fp16 with fp32 master weights and
//!   DeepSpeed's loss scaling, each stage's clipping arithmetic, and measured memory per
//!   buffer category next to the prediction;
//! * [`train`]: a whole run from a resolved `ds_config.json` and its plan (settings, model,
//!   data, steps, ranks);
//! * [`metrics`]: per-step metrics and the per-rank memory ledger;
//! * [`checkpoint`]: consolidating the fp32 master weights and writing them atomically;
//! * [`preflight`]: the plan's memory against what the machine has, before allocating.
//!
//! * [`cuda`]: the CUDA backend (device probe and inventory, kernels and their check against the
//!   CPU, cuBLASLt, NCCL, a one-GPU device step), not yet run on hardware.
//!
//! Runs follow the execution plan (`planner::plan`): [`train`] compiles it from the resolved
//! config and the engines read its layout, shards, buckets and stage 3 fetch units through
//! [`zero::partition`].

pub mod checkpoint;
pub mod comm;
pub mod cuda;
pub mod data;
pub mod io;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod preflight;
pub mod tensor;
pub mod train;
pub mod zero;
