//! The CUDA step's collectives on a real GPU. **Every test here is `#[ignore]`d and needs an
//! NVIDIA GPU** (and `libnccl` for the NCCL case); run with `--ignored` on a machine without
//! one, each test prints `skipping: ...` and then fails (a pass that checked nothing would
//! read as one). `bench/gpu_check.sh` runs them.
//!
//! 1. NCCL at world size 1: every [`DeviceComm`] operation on bf16 device buffers returns its
//!    input (the W = 1 identities), through the communicator's stream.
//! 2. Two thread ranks sharing GPU 0 through the host-staged adapter over `LocalComm`, at ZeRO
//!    stages 1-3: the communication ops of the plan's step ([`world_program`]) run on device
//!    buffers filled with rank-dependent gradients and parameters; the reduced gradient
//!    partitions are the ranks' mean, and the gathered parameters are every owner's.
//! 3. **Two GPUs** (the names hold `two_gpus`; a one-GPU machine skips them with `--skip
//!    two_gpus`): NCCL between two thread ranks, each on its own GPU. A collective that rank 1
//!    never joins fails on rank 0 with [`CommError::TimedOut`] soon after the timeout, naming
//!    the operation and the rank (the watchdog aborts the communicator); a rank that drops its
//!    communicator fails rank 0's collective within seconds, long before the timeout.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use dsplan_executor::comm::ReduceOp;
use dsplan_executor::comm::{Comm, CommError, LocalComm, OpKind, run_ranks};
use dsplan_executor::cuda::device_comm::{DeviceComm, HostStaged};
use dsplan_executor::cuda::nccl::{NcclComm, nccl_present};
use dsplan_executor::cuda::train::execute::DeviceBuffers;
use dsplan_executor::cuda::train::execute_comm::CommRunner;
use dsplan_executor::cuda::train::program::Op;
use dsplan_executor::cuda::train::{DeviceLayout, Region, world_program};
use dsplan_executor::cuda::{DeviceChoice, LaunchEnv, probe, resolve_backend};
use dsplan_executor::model::{BatchShape, Recompute};
use dsplan_executor::train::{TrainSettings, compile_cuda_plan};
use dsplan_kernels::Dtype;
use dsplan_planner::plan::cuda_world::CudaScheme;
use half::bf16;
use serde_json::json;

#[path = "support/models.rs"]
mod models;
use models::small_head_64;

fn require_gpu() {
    if let Err(error) = resolve_backend(DeviceChoice::Cuda, &probe(), 0) {
        eprintln!("skipping: no CUDA device ({error})");
        panic!("these tests need a usable NVIDIA GPU and were run with --ignored: {error}");
    }
}

/// Two streams on GPU 0: compute and communication.
fn streams() -> (Arc<CudaStream>, Arc<CudaStream>) {
    let ctx = CudaContext::new(0).expect("GPU 0");
    (
        ctx.new_stream().expect("a stream"),
        ctx.new_stream().expect("a stream"),
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU and libnccl"]
fn nccl_device_collectives_at_world_one() {
    require_gpu();
    if !nccl_present() {
        eprintln!("skipping: libnccl cannot be loaded");
        panic!("libnccl cannot be loaded (see `dsplan report`)");
    }
    let (stream, _) = streams();
    let env = LaunchEnv::from_lookup(|_| None).expect("the one-rank environment");
    let mut comm = NcclComm::from_env(stream.clone(), &env, Duration::from_secs(30)).expect("NCCL");
    let input: Vec<bf16> = (0..8)
        .map(|i| bf16::from_f32(i as f32 * 0.5 - 1.0))
        .collect();
    let mut data = stream.clone_htod(&input).expect("upload");
    DeviceComm::all_reduce(&mut comm, &mut data.as_view_mut(), ReduceOp::Avg).expect("all-reduce");
    let mut out = stream.alloc_zeros::<bf16>(8).expect("alloc");
    DeviceComm::reduce_scatter(
        &mut comm,
        &data.as_view(),
        &mut out.as_view_mut(),
        ReduceOp::Sum,
    )
    .expect("reduce-scatter");
    let mut gathered = stream.alloc_zeros::<bf16>(8).expect("alloc");
    DeviceComm::all_gather(&mut comm, &out.as_view(), &mut gathered.as_view_mut())
        .expect("all-gather");
    DeviceComm::all_gather_in_place(&mut comm, &mut gathered.as_view_mut())
        .expect("in-place all-gather");
    let mut flag = stream.clone_htod(&[1i32]).expect("upload");
    DeviceComm::all_reduce(&mut comm, &mut flag.as_view_mut(), ReduceOp::Max).expect("flag");
    let back = stream.clone_dtoh(&gathered).expect("download");
    let flag_back = stream.clone_dtoh(&flag).expect("download");
    stream.synchronize().expect("sync");
    assert_eq!(back, input);
    assert_eq!(flag_back, [1]);
}

/// Rank `rank`'s value at flat element `i`.
fn value(rank: usize, i: usize) -> f32 {
    (rank as f32 + 1.0) * 0.25 + (i % 7) as f32 * 0.125
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn two_thread_ranks_share_one_gpu_through_the_staged_collectives() {
    require_gpu();
    let model = small_head_64();
    // Stage 1's collectives stand alone here (whole gradients, the flat partition's
    // all-gather); stages 2-3 reduce out of the gradient arena into the partition, which the
    // host interpreter's tests and the W = 2 training tests of `cuda_train.rs` check.
    for stage in [1u8] {
        let config = json!({
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 50_000},
        });
        let settings = TrainSettings::from_config(&config, 2).expect("settings");
        let plan = compile_cuda_plan(&settings, &model.into(), 64, 2).expect("plan");
        let psi = dsplan_executor::model::ParamLayout::new(&model).num_params();
        let whole: Vec<f32> = (0..psi).map(|i| value(0, i)).collect();
        let results = run_ranks(2, |host: LocalComm| {
            let rank = host.rank();
            let layout = DeviceLayout::for_plan_rank(
                model,
                BatchShape {
                    batch: 2,
                    seq_len: 64,
                },
                Dtype::Bf16,
                Recompute::Nothing,
                &plan,
                rank,
            )
            .expect("the plan's layout");
            let program = world_program(&layout, &plan).expect("program");
            let (compute, communication_stream) = streams();
            let mut comm = HostStaged::new(host, communication_stream);
            let mut bufs =
                DeviceBuffers::<bf16>::new(&compute, &layout, layout.param_table(), &whole)
                    .expect("buffers");
            let grads: Vec<bf16> = (0..layout.len(Region::Grads))
                .map(|i| bf16::from_f32(value(rank, i)))
                .collect();
            compute
                .memcpy_htod(&grads, &mut bufs.grads)
                .expect("gradients");
            // This rank's partition of the parameters holds its own values (stages 1-2).
            let owned_params = layout.owned(Region::Params);
            let mut params = compute.clone_dtoh(&bufs.params).expect("download");
            if layout.shares.scheme == CudaScheme::FlatPartition {
                let owned_range = owned_params.span.offset..owned_params.span.end();
                for (i, slot) in params.iter_mut().enumerate() {
                    if owned_range.contains(&i) {
                        *slot = bf16::from_f32(value(rank + 2, i));
                    }
                }
            }
            compute
                .memcpy_htod(&params, &mut bufs.params)
                .expect("parameters");
            let mut runner = CommRunner::new(compute.clone());
            let modules =
                dsplan_executor::cuda::modules::KernelModules::new(compute.context().clone(), None)
                    .expect("kernel modules");
            let launcher = dsplan_executor::cuda::launch::Launcher::new(&modules, compute.clone());
            let communication = program
                .boundary_micro_step
                .iter()
                .chain(&program.after_update)
                .filter_map(|op| match op {
                    Op::Collective(c) => Some(c),
                    _ => None,
                });
            for op in communication {
                runner
                    .run(op, &mut bufs, &mut comm, &launcher)
                    .expect("collective");
            }
            compute.synchronize().expect("sync");
            comm.stream().synchronize().expect("sync");
            let owned = layout.owned(Region::Grads);
            let reduced = compute.clone_dtoh(&bufs.grads).expect("download");
            let params = compute.clone_dtoh(&bufs.params).expect("download");
            (rank, layout, owned, reduced, params)
        })
        .expect("ranks");
        for (rank, layout, owned, reduced, params) in results {
            let mean = |i: usize| bf16::from_f32((value(0, i) + value(1, i)) / 2.0);
            match layout.shares.scheme {
                CudaScheme::FlatPartition => {
                    let owned_range = owned.span.offset..owned.span.end().min(psi);
                    for (i, got) in reduced.iter().enumerate() {
                        if owned_range.contains(&i) {
                            assert_eq!(*got, mean(i), "stage {stage} rank {rank} grad {i}");
                        }
                    }
                    // Every partition was gathered from its owner.
                    let partition = layout.shares.optimizer as usize;
                    for (i, p) in params.iter().take(psi).enumerate() {
                        let owner = i / partition;
                        let expected = bf16::from_f32(value(owner + 2, i));
                        assert_eq!(*p, expected, "stage {stage} rank {rank} param {i}");
                    }
                }
                CudaScheme::Sharded => {
                    // The shard's slices: tensor element `rank × p + j` of each tensor.
                    let entries = layout.param_table().entries();
                    for (entry, slice) in entries.iter().zip(&layout.shard_spans) {
                        for j in 0..slice.len {
                            let element = rank * slice.len + j;
                            if element >= entry.span.len {
                                continue;
                            }
                            let at = owned.span.offset + slice.offset + j;
                            let flat = entry.span.offset + element;
                            assert_eq!(reduced[at], mean(flat), "stage 3 rank {rank} {flat}");
                        }
                    }
                }
                CudaScheme::Replicated | CudaScheme::PartitionedGradients => {
                    panic!(
                        "stage {stage} at W = 2 is not {:?} here",
                        layout.shares.scheme
                    )
                }
            }
        }
    }
}

/// Two GPUs, or a failing test that says so.
fn require_two_gpus() {
    require_gpu();
    let visible = dsplan_executor::cuda::train::visible_gpus().expect("the GPU count");
    if visible < 2 {
        eprintln!("skipping: {visible} GPU(s) visible, the test needs two");
        panic!("needs two GPUs, {visible} visible: run with --skip two_gpus on this machine");
    }
}

/// Rank 0's all-reduce against a rank 1 that `peer` describes, each rank on its own GPU with
/// a `timeout` of its communicator: rank 0's result and how long it took.
fn rank_zero_against(
    timeout: Duration,
    peer: impl Fn(NcclComm) + Sync,
) -> (Result<(), CommError>, Duration) {
    let results = run_ranks(2, |mut host: LocalComm| {
        let rank = host.rank();
        let stream = CudaContext::new(rank)
            .expect("a GPU per rank")
            .new_stream()
            .expect("a stream");
        let comm = NcclComm::from_host_comm(stream, &mut host, timeout).expect("NCCL");
        if rank == 1 {
            peer(comm);
            return None;
        }
        let mut comm = comm;
        let started = std::time::Instant::now();
        let mut data = vec![1.0f32; 1 << 16];
        let result = Comm::all_reduce(&mut comm, &mut data, dsplan_executor::comm::ReduceOp::Sum);
        Some((result, started.elapsed()))
    })
    .expect("two ranks");
    results
        .into_iter()
        .flatten()
        .next()
        .expect("rank 0's result")
}

#[test]
#[ignore = "needs two NVIDIA GPUs and libnccl"]
fn two_gpus_a_collective_one_rank_never_joins_times_out_naming_the_rank() {
    require_two_gpus();
    let timeout = Duration::from_secs(3);
    let (result, took) = rank_zero_against(timeout, |comm| {
        std::thread::sleep(Duration::from_secs(12));
        drop(comm);
    });
    eprintln!("rank 0: {result:?} after {took:?}");
    assert_eq!(
        result,
        Err(CommError::TimedOut {
            op: OpKind::AllReduce.into(),
            rank: 0,
            seconds: 3
        })
    );
    assert!(took < Duration::from_secs(8), "bounded: {took:?}");
}

#[test]
#[ignore = "needs two NVIDIA GPUs and libnccl"]
fn two_gpus_a_rank_that_leaves_fails_the_collective_long_before_the_timeout() {
    require_two_gpus();
    let (result, took) = rank_zero_against(Duration::from_secs(120), drop);
    eprintln!("rank 0: {result:?} after {took:?}");
    let error = result.expect_err("rank 1 left");
    assert!(error.to_string().contains("rank 0"), "{error}");
    assert!(took < Duration::from_secs(30), "within 30 s: {took:?}");
}
