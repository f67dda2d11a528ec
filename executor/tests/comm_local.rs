//! `LocalComm`: every collective against a serial reference at world sizes 1-8, bit-identical
//! results across ranks, traffic counters, collective error handling, and failure propagation.

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dsplan_executor::comm::{Comm, CommError, Departure, LocalComm, OpKind, ReduceOp, run_ranks};

const WORLDS: [usize; 5] = [1, 2, 3, 4, 8];
const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max];

/// A SplitMix64 step: deterministic test data without a dependency.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Values of mixed magnitude (1e-3 .. 1e3, both signs), so that a different summation order
/// would change the rounding and fail a bit-exact comparison.
fn rank_data(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    let mut state = salt.wrapping_mul(1_000_003) ^ rank as u64;
    (0..len)
        .map(|_| {
            let bits = next_random(&mut state);
            let unit = (bits >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * [1e-3, 1.0, 1e3][(bits % 3) as usize]
        })
        .collect()
}

/// The definition: rank 0's value, then ranks 1.. in order, then the average's division.
fn serial(inputs: &[Vec<f32>], op: ReduceOp) -> Vec<f32> {
    let mut acc = inputs[0].clone();
    for input in &inputs[1..] {
        for (a, &x) in acc.iter_mut().zip(input) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Avg => *a + x,
                ReduceOp::Max => a.max(x),
            };
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a /= inputs.len() as f32;
        }
    }
    acc
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn all_inputs(world: usize, len: usize, salt: u64) -> Vec<Vec<f32>> {
    (0..world).map(|rank| rank_data(rank, len, salt)).collect()
}

/// Runs `body` with a deadline, so that a deadlock fails the test instead of hanging CI.
fn within<T: Send + 'static>(seconds: u64, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(body());
    });
    wait.recv_timeout(Duration::from_secs(seconds))
        .expect("collectives did not finish in time: deadlock?")
}

#[test]
fn all_reduce_matches_the_serial_reference_bit_for_bit_on_every_rank() {
    for world in WORLDS {
        for len in [0, 1, 7, 2048, 5003] {
            for op in OPS {
                let inputs = all_inputs(world, len, 11);
                let expected = bits(&serial(&inputs, op));
                let results = run_ranks(world, |mut comm| {
                    let mut data = inputs[comm.rank()].clone();
                    comm.all_reduce(&mut data, op).expect("all_reduce");
                    bits(&data)
                })
                .expect("ranks");
                for (rank, result) in results.iter().enumerate() {
                    assert_eq!(
                        result, &expected,
                        "world {world}, len {len}, {op:?}: rank {rank} differs"
                    );
                }
            }
        }
    }
}

#[test]
fn summation_order_is_visible_and_fixed_to_rank_order() {
    // 1e8 + 1 - 1e8 in f32: rank order gives (1e8 + 1) - 1e8 = 0, other orders give 1.
    let inputs = [vec![1.0e8_f32], vec![1.0], vec![-1.0e8]];
    let results = run_ranks(3, |mut comm| {
        let mut data = inputs[comm.rank()].clone();
        comm.all_reduce(&mut data, ReduceOp::Sum)
            .expect("all_reduce");
        data[0]
    })
    .expect("ranks");
    assert_eq!(results, vec![0.0; 3]);
}

#[test]
fn reduce_scatter_gives_each_rank_its_shard_of_the_reduction() {
    for world in WORLDS {
        for shard in [0, 1, 5, 2500] {
            for op in OPS {
                let inputs = all_inputs(world, world * shard, 12);
                let expected = serial(&inputs, op);
                let results = run_ranks(world, |mut comm| {
                    let mut output = vec![f32::NAN; shard];
                    comm.reduce_scatter(&inputs[comm.rank()], &mut output, op)
                        .expect("reduce_scatter");
                    bits(&output)
                })
                .expect("ranks");
                for (rank, result) in results.iter().enumerate() {
                    let want = bits(&expected[rank * shard..(rank + 1) * shard]);
                    assert_eq!(
                        result, &want,
                        "world {world}, shard {shard}, {op:?}, rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for world in WORLDS {
        for shard in [0, 1, 3, 3000] {
            let inputs = all_inputs(world, shard, 13);
            let expected: Vec<u32> = inputs.iter().flat_map(|input| bits(input)).collect();
            let results = run_ranks(world, |mut comm| {
                let mut output = vec![f32::NAN; world * shard];
                comm.all_gather(&inputs[comm.rank()], &mut output)
                    .expect("all_gather");
                bits(&output)
            })
            .expect("ranks");
            assert!(
                results.iter().all(|result| result == &expected),
                "world {world}"
            );
        }
    }
}

#[test]
fn broadcast_copies_the_roots_buffer_from_every_root() {
    for world in WORLDS {
        for root in 0..world {
            let inputs = all_inputs(world, 1001, 14 + root as u64);
            let expected = bits(&inputs[root]);
            let results = run_ranks(world, |mut comm| {
                let mut data = inputs[comm.rank()].clone();
                comm.broadcast(&mut data, root).expect("broadcast");
                bits(&data)
            })
            .expect("ranks");
            assert!(
                results.iter().all(|result| result == &expected),
                "world {world}, root {root}"
            );
        }
    }
}

#[test]
fn scalar_all_reduce_is_the_rank_ordered_reduction() {
    for world in WORLDS {
        let values: Vec<f64> = (0..world)
            .map(|rank| 0.1 * (rank as f64 + 1.0).powi(3) - 0.7)
            .collect();
        for op in OPS {
            let mut expected = values[0];
            for &value in &values[1..] {
                expected = match op {
                    ReduceOp::Sum | ReduceOp::Avg => expected + value,
                    ReduceOp::Max => expected.max(value),
                };
            }
            if op == ReduceOp::Avg {
                expected /= world as f64;
            }
            let results = run_ranks(world, |mut comm| {
                comm.all_reduce_scalar(values[comm.rank()], op)
                    .expect("scalar")
            })
            .expect("ranks");
            for result in results {
                assert_eq!(
                    result.to_bits(),
                    expected.to_bits(),
                    "world {world}, {op:?}"
                );
            }
        }
    }
}

#[test]
fn max_propagates_nan_so_an_overflow_is_never_missed() {
    let results = run_ranks(4, |mut comm| {
        let flag = if comm.rank() == 2 { f64::NAN } else { 1.0 };
        let scalar = comm.all_reduce_scalar(flag, ReduceOp::Max).expect("scalar");
        let mut data = vec![comm.rank() as f32; 3];
        if comm.rank() == 3 {
            data[1] = f32::NAN;
        }
        comm.all_reduce(&mut data, ReduceOp::Max)
            .expect("all_reduce");
        (scalar.is_nan(), data[0], data[1].is_nan())
    })
    .expect("ranks");
    assert!(
        results.iter().all(|&r| r == (true, 3.0, true)),
        "{results:?}"
    );
}

#[test]
fn reduce_scatter_then_all_gather_equals_all_reduce() {
    for world in WORLDS {
        let shard = 1234;
        for op in OPS {
            let inputs = all_inputs(world, world * shard, 15);
            let results = run_ranks(world, |mut comm| {
                let input = &inputs[comm.rank()];
                let mut reduced = input.clone();
                comm.all_reduce(&mut reduced, op).expect("all_reduce");
                let mut mine = vec![0.0; shard];
                comm.reduce_scatter(input, &mut mine, op)
                    .expect("reduce_scatter");
                let mut gathered = vec![0.0; world * shard];
                comm.all_gather(&mine, &mut gathered).expect("all_gather");
                bits(&reduced) == bits(&gathered)
            })
            .expect("ranks");
            assert!(results.iter().all(|&same| same), "world {world}, {op:?}");
        }
    }
}

#[test]
fn traffic_counts_the_bandwidth_optimal_volume() {
    for world in WORLDS {
        let n = 840; // divisible by every world size tested
        let odd = 1001; // divisible by none but 1
        let w = world as u64;
        let results = run_ranks(world, |mut comm| {
            let mut data = vec![1.0; n];
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("all_reduce");
            let even = comm.traffic().all_reduce.bytes_sent;
            let mut data = vec![1.0; odd];
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("all_reduce");
            let uneven = comm.traffic().all_reduce.bytes_sent - even;
            let mut shard = vec![0.0; 10];
            comm.reduce_scatter(&vec![1.0; world * 10], &mut shard, ReduceOp::Sum)
                .expect("reduce_scatter");
            let mut gathered = vec![0.0; world * 10];
            comm.all_gather(&shard, &mut gathered).expect("all_gather");
            comm.broadcast(&mut data, world - 1).expect("broadcast");
            comm.all_reduce_scalar(1.0, ReduceOp::Sum).expect("scalar");
            comm.barrier().expect("barrier");
            (comm.rank(), even, uneven, comm.traffic().clone())
        })
        .expect("ranks");
        let mut uneven_total = 0;
        for (rank, even, uneven, traffic) in results {
            assert_eq!(even, 2 * (w - 1) * n as u64 / w * 4, "world {world}");
            uneven_total += uneven;
            assert_eq!(traffic.all_reduce.calls, 2);
            assert_eq!(
                traffic.of(OpKind::ReduceScatter).bytes_sent,
                (w - 1) * 10 * 4
            );
            assert_eq!(traffic.all_gather.bytes_sent, (w - 1) * 10 * 4);
            let root_bytes = if rank == world - 1 {
                (w - 1) * odd as u64 * 4
            } else {
                0
            };
            assert_eq!(traffic.broadcast.bytes_sent, root_bytes);
            assert_eq!(traffic.all_reduce_scalar.bytes_sent, (w - 1) * 8);
            assert_eq!(traffic.barrier.calls, 1);
            assert_eq!(traffic.barrier.bytes_sent, 0);
        }
        // Over all ranks an all-reduce moves 2 (W-1) n elements, shards even or not.
        assert_eq!(uneven_total, 2 * (w - 1) * odd as u64 * 4, "world {world}");
    }
}

#[test]
fn many_mixed_collectives_run_without_deadlock() {
    let checksums = within(120, || {
        let mut per_world = Vec::new();
        for (world, iterations) in [(2, 1500), (3, 600), (8, 200)] {
            let results = run_ranks(world, |mut comm| {
                let mut checksum = 0.0f64;
                for iteration in 0..iterations {
                    let len = 1 + iteration % 37;
                    let mut data = vec![(comm.rank() + iteration) as f32; len * world];
                    comm.all_reduce(&mut data, ReduceOp::Sum)
                        .expect("all_reduce");
                    let mut shard = vec![0.0; len];
                    comm.reduce_scatter(&data, &mut shard, ReduceOp::Max)
                        .expect("reduce_scatter");
                    comm.all_gather(&shard, &mut data).expect("all_gather");
                    comm.broadcast(&mut data, iteration % world)
                        .expect("broadcast");
                    checksum += comm
                        .all_reduce_scalar(f64::from(data[0]), ReduceOp::Sum)
                        .expect("scalar");
                    if iteration % 10 == 0 {
                        comm.barrier().expect("barrier");
                    }
                }
                checksum
            })
            .expect("ranks");
            per_world.push((world, iterations, results));
        }
        per_world
    });
    for (world, iterations, results) in checksums {
        // data[0] after the sum is sum_r (r + i) = W i + W (W-1) / 2, and the scalar sums W of them.
        let w = world as f64;
        let expected: f64 = (0..iterations)
            .map(|i| w * (w * i as f64 + w * (w - 1.0) / 2.0))
            .sum();
        assert!(
            results.iter().all(|&c| c == expected),
            "world {world}: {results:?} vs {expected}"
        );
    }
}

#[test]
fn uneven_shards_are_an_error_on_every_rank_and_the_group_stays_usable() {
    let results = run_ranks(3, |mut comm| {
        // Rank 1 alone passes an input that is not 3 x its output.
        let input_len = if comm.rank() == 1 { 10 } else { 9 };
        let mut output = vec![0.0; 3];
        let first = comm.reduce_scatter(&vec![1.0; input_len], &mut output, ReduceOp::Sum);
        let mut gathered = vec![0.0; 8];
        let second = comm.all_gather(&[1.0, 2.0, 3.0], &mut gathered);
        let mut data = vec![2.0; 4];
        comm.all_reduce(&mut data, ReduceOp::Sum)
            .expect("the group is still usable");
        (first, second, data)
    })
    .expect("no rank panics");
    for (first, second, data) in results {
        assert_eq!(
            first,
            Err(CommError::UnevenShards {
                op: OpKind::ReduceScatter,
                rank: 1,
                input_len: 10,
                output_len: 3,
                world: 3
            })
        );
        let message = first.expect_err("error").to_string();
        assert!(
            message.contains("pad the flat buffer to a multiple of 3"),
            "{message}"
        );
        assert!(matches!(
            second,
            Err(CommError::UnevenShards {
                op: OpKind::AllGather,
                rank: 0,
                input_len: 3,
                output_len: 8,
                world: 3
            })
        ));
        assert_eq!(data, vec![6.0; 4]);
    }
}

#[test]
fn disagreeing_calls_and_bad_roots_are_errors_not_hangs() {
    let results = within(30, || {
        run_ranks(2, |mut comm| {
            let mut data = vec![1.0; 4 + comm.rank()];
            let lengths = comm.all_reduce(&mut data, ReduceOp::Sum);
            let kinds = if comm.rank() == 0 {
                comm.barrier()
            } else {
                comm.all_reduce(&mut data, ReduceOp::Sum)
            };
            let mut data = vec![1.0; 2];
            let ops = comm.all_reduce(
                &mut data,
                if comm.rank() == 0 {
                    ReduceOp::Sum
                } else {
                    ReduceOp::Max
                },
            );
            let root = comm.broadcast(&mut data, 2);
            (lengths, kinds, ops, root)
        })
        .expect("no rank panics")
    });
    for (lengths, kinds, ops, root) in results {
        let lengths = lengths.expect_err("lengths differ");
        assert!(
            matches!(lengths, CommError::Disagreement { rank: 1, .. }),
            "{lengths:?}"
        );
        let message = lengths.to_string();
        assert!(
            message.contains("all_reduce(sum) of 4 elements"),
            "{message}"
        );
        assert!(
            message.contains("all_reduce(sum) of 5 elements"),
            "{message}"
        );
        assert!(matches!(kinds, Err(CommError::Disagreement { .. })));
        assert!(matches!(ops, Err(CommError::Disagreement { .. })));
        assert_eq!(
            root,
            Err(CommError::RootOutOfRange {
                rank: 0,
                root: 2,
                world: 2
            })
        );
    }
}

#[test]
fn a_panicking_rank_fails_the_others_instead_of_hanging_them() {
    let seen: &'static Mutex<Vec<(usize, CommError)>> = Box::leak(Box::new(Mutex::new(Vec::new())));
    let outcome = within(30, move || {
        run_ranks(4, |mut comm| {
            let mut data = vec![1.0; 100];
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("first all_reduce");
            if comm.rank() == 2 {
                panic!("rank 2 gives up");
            }
            // The others keep going; every collective must now fail, not block.
            for _ in 0..3 {
                let error = comm
                    .all_reduce(&mut data, ReduceOp::Sum)
                    .expect_err("rank 2 is gone");
                seen.lock().expect("lock").push((comm.rank(), error));
            }
        })
    });
    match outcome {
        Err(CommError::RankPanicked {
            rank,
            message,
            ranks,
        }) => {
            assert_eq!(
                (rank, message.as_str(), ranks),
                (2, "rank 2 gives up", vec![2])
            );
        }
        other => panic!("expected RankPanicked, got {other:?}"),
    }
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 9);
    for (rank, error) in seen.iter() {
        assert_ne!(*rank, 2);
        assert_eq!(
            error,
            &CommError::PeerLeft {
                op: OpKind::AllReduce,
                rank: 2,
                departure: Departure::Panicked
            }
        );
    }
}

#[test]
fn a_rank_that_returns_early_is_reported_as_having_left() {
    let results = within(30, || {
        run_ranks(3, |mut comm| {
            if comm.rank() == 0 {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
            Some(comm.barrier())
        })
        .expect("no rank panics")
    });
    assert_eq!(results[0], None);
    for result in &results[1..] {
        assert_eq!(
            result,
            &Some(Err(CommError::PeerLeft {
                op: OpKind::Barrier,
                rank: 0,
                departure: Departure::Returned
            }))
        );
    }
}

#[test]
fn groups_need_a_rank() {
    assert_eq!(
        LocalComm::group(0).map(|g| g.len()),
        Err(CommError::EmptyGroup)
    );
    assert_eq!(run_ranks(0, |_| ()), Err(CommError::EmptyGroup));
    let group = LocalComm::group(3).expect("group");
    assert_eq!(
        group
            .iter()
            .map(|c| (c.rank(), c.world_size()))
            .collect::<Vec<_>>(),
        vec![(0, 3), (1, 3), (2, 3)]
    );
}

/// `cargo test -p dsplan-executor --test comm_local -- --ignored --nocapture`
#[test]
#[ignore = "throughput measurement; prints GB/s"]
fn all_reduce_throughput_world_2_64_mb() {
    let world = 2;
    let len = 64 * 1024 * 1024 / 4;
    let iterations = 10;
    let seconds = run_ranks(world, |mut comm| {
        let mut data = vec![comm.rank() as f32; len];
        comm.all_reduce(&mut data, ReduceOp::Sum).expect("warm-up");
        comm.barrier().expect("barrier");
        let start = Instant::now();
        for _ in 0..iterations {
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("all_reduce");
        }
        start.elapsed().as_secs_f64()
    })
    .expect("ranks");
    let per_call = seconds.iter().cloned().fold(0.0, f64::max) / iterations as f64;
    let bytes = (len * 4) as f64;
    let algorithm_bw = bytes / per_call / 1e9;
    let bus_bw = algorithm_bw * 2.0 * (world as f64 - 1.0) / world as f64;
    println!(
        "all_reduce world {world}, {} MiB: {:.2} ms per call, {algorithm_bw:.2} GB/s algorithm \
         bandwidth, {bus_bw:.2} GB/s bus bandwidth",
        bytes / (1024.0 * 1024.0),
        per_call * 1e3
    );
    assert!(per_call > 0.0);
}
