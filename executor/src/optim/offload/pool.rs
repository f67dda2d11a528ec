//! The offload optimizer's threads: a pool sized to the cores it is given, each thread
//! streaming one contiguous part of a call's range, NUMA-aware where there are several nodes.
//!
//! * [`Placement::Spread`] (one node): every call's range is split evenly over the threads
//!   (fewer for a small range), at 64-byte boundaries.
//! * [`Placement::NodeLocal`] (several nodes): the whole partition is divided into per-node
//!   home ranges (page-aligned, in proportion to each node's threads), threads are pinned to
//!   their node's CPUs, and a call's range is worked on only by the threads of the node whose
//!   home range holds it. The buffers are first-touched the same way ([`OffloadPool::zeroed`],
//!   [`OffloadPool::copied`]), so each node streams its own memory. Pinned host memory must
//!   keep that placement: allocate it with these helpers, then register it with the device
//!   (`cudaHostRegister`) instead of allocating it pinned from one thread.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::isa::Isa;
use super::numa::{Topology, pin_current_thread};

/// Elements per 64-byte line: thread boundaries fall on multiples of it.
const LINE: usize = 16;
/// Elements per 4 KiB page: node boundaries fall on multiples of it.
const PAGE: usize = 1024;
/// The fewest elements worth handing to one more thread.
const MIN_PER_THREAD: usize = 1 << 14;

/// How a call's range is divided among the threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Evenly over all threads (one NUMA node).
    Spread,
    /// Over the threads of the node whose home range holds each element.
    NodeLocal,
}

/// Whether the pool's threads are pinned to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// The OS schedules them.
    Free,
    /// Thread `i` runs on CPU `cpus[i]` of its node.
    Pinned,
}

/// How to build a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Threads (at least 1).
    pub threads: usize,
    /// Pinned or not.
    pub affinity: Affinity,
    /// Split of each call.
    pub placement: Placement,
    /// The CPUs by node.
    pub topology: Topology,
}

impl PoolOptions {
    /// `threads` on this machine: pinned and node-local where there are several NUMA nodes,
    /// free and spread otherwise.
    pub fn for_this_machine(threads: usize) -> PoolOptions {
        let topology = Topology::detect();
        let several = topology.nodes.len() > 1;
        PoolOptions {
            threads,
            affinity: if several {
                Affinity::Pinned
            } else {
                Affinity::Free
            },
            placement: if several {
                Placement::NodeLocal
            } else {
                Placement::Spread
            },
            topology,
        }
    }
}

/// One thread's CPU and node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSlot {
    /// The CPU it is pinned to (with [`Affinity::Pinned`]) or meant for.
    pub cpu: usize,
    /// Index into the topology's nodes.
    pub node: usize,
}

/// Why a pool could not be built.
#[derive(Debug)]
pub enum PoolError {
    /// Zero threads asked for.
    NoThreads,
    /// rayon could not start the threads.
    Spawn(rayon::ThreadPoolBuildError),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::NoThreads => write!(f, "the offload optimizer needs at least 1 thread"),
            PoolError::Spawn(e) => write!(f, "cannot start the offload optimizer's threads: {e}"),
        }
    }
}

impl std::error::Error for PoolError {}

/// The threads of the offload optimizer.
pub struct OffloadPool {
    pool: rayon::ThreadPool,
    slots: Vec<ThreadSlot>,
    placement: Placement,
    affinity: Affinity,
    topology: Topology,
    pin_failures: Arc<AtomicUsize>,
    isa: Isa,
}

impl std::fmt::Debug for OffloadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadPool")
            .field("slots", &self.slots)
            .field("placement", &self.placement)
            .field("affinity", &self.affinity)
            .field("isa", &self.isa)
            .finish()
    }
}

/// Threads per node for `threads` threads, in proportion to each node's CPUs (largest
/// remainders first), then each thread's CPU: a node's threads take its CPUs in order.
pub fn thread_slots(topology: &Topology, threads: usize) -> Vec<ThreadSlot> {
    let total_cpus = topology.cpu_count().max(1);
    let mut counts: Vec<usize> = topology
        .nodes
        .iter()
        .map(|n| threads * n.cpus.len() / total_cpus)
        .collect();
    let mut by_remainder: Vec<usize> = (0..topology.nodes.len()).collect();
    by_remainder
        .sort_by_key(|&k| std::cmp::Reverse((threads * topology.nodes[k].cpus.len()) % total_cpus));
    let mut missing = threads - counts.iter().sum::<usize>();
    for &k in by_remainder.iter().cycle() {
        if missing == 0 {
            break;
        }
        counts[k] += 1;
        missing -= 1;
    }
    let mut slots = Vec::with_capacity(threads);
    for (node, (count, n)) in counts.iter().zip(&topology.nodes).enumerate() {
        for i in 0..*count {
            slots.push(ThreadSlot {
                cpu: n.cpus[i % n.cpus.len()],
                node,
            });
        }
    }
    slots
}

/// `range` split into `parts` pieces at multiples of `align` (counted from 0), in order.
fn split_even(range: Range<usize>, parts: usize, align: usize) -> Vec<Range<usize>> {
    let len = range.len();
    let cut = |k: usize| {
        if k == 0 {
            return range.start;
        }
        if k == parts {
            return range.end;
        }
        let at = range.start + len * k / parts;
        (at / align * align).clamp(range.start, range.end)
    };
    (0..parts).map(|k| cut(k)..cut(k + 1)).collect()
}

/// The part of `range` (within a partition of `total` elements) each thread works on, by
/// thread index (empty for idle threads).
pub fn thread_ranges(
    range: Range<usize>,
    total: usize,
    slots: &[ThreadSlot],
    nodes: usize,
    placement: Placement,
) -> Vec<Range<usize>> {
    let threads = slots.len();
    let mut out = vec![range.start..range.start; threads];
    let fill = |out: &mut Vec<Range<usize>>, sub: Range<usize>, members: &[usize]| {
        let used = (sub.len() / MIN_PER_THREAD).clamp(1, members.len());
        for (&t, part) in members.iter().zip(split_even(sub, used, LINE)) {
            out[t] = part;
        }
    };
    match placement {
        Placement::Spread => {
            let all: Vec<usize> = (0..threads).collect();
            fill(&mut out, range, &all);
        }
        Placement::NodeLocal => {
            let mut before = 0;
            for node in 0..nodes {
                let members: Vec<usize> = (0..threads).filter(|&t| slots[t].node == node).collect();
                if members.is_empty() {
                    continue;
                }
                let home_at = |threads_before: usize| {
                    if threads_before == threads {
                        total
                    } else {
                        total * threads_before / threads / PAGE * PAGE
                    }
                };
                let home = home_at(before)..home_at(before + members.len());
                before += members.len();
                let sub = range.start.max(home.start)..range.end.min(home.end);
                if !sub.is_empty() {
                    fill(&mut out, sub, &members);
                }
            }
        }
    }
    out
}

impl OffloadPool {
    /// A pool of `threads` threads for this machine ([`PoolOptions::for_this_machine`]).
    pub fn new(threads: usize) -> Result<OffloadPool, PoolError> {
        OffloadPool::with_options(PoolOptions::for_this_machine(threads))
    }

    /// A pool as `options` say.
    pub fn with_options(options: PoolOptions) -> Result<OffloadPool, PoolError> {
        if options.threads == 0 {
            return Err(PoolError::NoThreads);
        }
        let slots = thread_slots(&options.topology, options.threads);
        let pin_failures = Arc::new(AtomicUsize::new(0));
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads)
            .thread_name(|i| format!("dsplan-offload-adam-{i}"));
        if options.affinity == Affinity::Pinned {
            let cpus: Vec<usize> = slots.iter().map(|s| s.cpu).collect();
            let failures = Arc::clone(&pin_failures);
            builder = builder.start_handler(move |i| {
                if !cpus.get(i).is_some_and(|&cpu| pin_current_thread(cpu)) {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let pool = builder.build().map_err(PoolError::Spawn)?;
        Ok(OffloadPool {
            pool,
            slots,
            placement: options.placement,
            affinity: options.affinity,
            topology: options.topology,
            pin_failures,
            isa: Isa::best(),
        })
    }

    /// The kernel variant the steps run ([`Isa::best`] unless set).
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Runs the steps with `isa` instead; `Err` (and no change) where this CPU lacks it.
    pub fn set_isa(&mut self, isa: Isa) -> Result<(), Isa> {
        if !isa.is_available() {
            return Err(isa);
        }
        self.isa = isa;
        Ok(())
    }

    /// Threads.
    pub fn threads(&self) -> usize {
        self.slots.len()
    }

    /// Each thread's CPU and node.
    pub fn slots(&self) -> &[ThreadSlot] {
        &self.slots
    }

    /// How calls are split.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Pinned or not.
    pub fn affinity(&self) -> Affinity {
        self.affinity
    }

    /// The CPUs by node it was built for.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Threads that could not be pinned (0 unless [`Affinity::Pinned`] failed).
    pub fn pin_failures(&self) -> usize {
        self.pin_failures.load(Ordering::Relaxed)
    }

    /// The part of `range` (of a partition of `total` elements) each thread works on.
    pub fn ranges(&self, range: Range<usize>, total: usize) -> Vec<Range<usize>> {
        thread_ranges(
            range,
            total,
            &self.slots,
            self.topology.nodes.len(),
            self.placement,
        )
    }

    /// Runs `work(part)` for every non-empty part of `range` on its thread (on the calling
    /// thread when only one part is busy and placement does not matter).
    pub(crate) fn for_each_part<F>(&self, range: Range<usize>, total: usize, work: F)
    where
        F: Fn(Range<usize>) + Sync,
    {
        let ranges = self.ranges(range, total);
        let busy = ranges.iter().filter(|r| !r.is_empty()).count();
        if busy == 0 {
            return;
        }
        if busy == 1 && self.placement == Placement::Spread {
            if let Some(r) = ranges.into_iter().find(|r| !r.is_empty()) {
                work(r);
            }
            return;
        }
        self.pool.broadcast(|ctx| {
            if let Some(r) = ranges.get(ctx.index()).filter(|r| !r.is_empty()) {
                work(r.clone());
            }
        });
    }

    /// `len` zeros, each page first written by the thread that will update it.
    pub fn zeroed(&self, len: usize) -> Vec<f32> {
        // SAFETY: `write_bytes` writes exactly the part it is given.
        self.filled(len, |range, dst| unsafe {
            std::ptr::write_bytes(dst, 0, range.len())
        })
    }

    /// A copy of `src`, each page first written by the thread that will update it.
    pub fn copied(&self, src: &[f32]) -> Vec<f32> {
        self.filled(src.len(), |range, dst| {
            // SAFETY: `dst` has room for the part, and `src[range]` is that long.
            unsafe { std::ptr::copy_nonoverlapping(src[range.clone()].as_ptr(), dst, range.len()) }
        })
    }

    /// A vector of `len` whose parts `fill(range, start_of_part)` writes in full, each on its
    /// thread.
    fn filled<F>(&self, len: usize, fill: F) -> Vec<f32>
    where
        F: Fn(Range<usize>, *mut f32) + Sync,
    {
        let mut out: Vec<f32> = Vec::with_capacity(len);
        let base = SendPtr(out.as_mut_ptr());
        let written = AtomicUsize::new(0);
        self.for_each_part(0..len, len, |range| {
            let base = &base;
            // SAFETY: the parts are disjoint and within the capacity.
            fill(range.clone(), unsafe { base.0.add(range.start) });
            written.fetch_add(range.len(), Ordering::Relaxed);
        });
        assert_eq!(written.into_inner(), len, "the parts of 0..{len} cover it");
        // SAFETY: every element was written (the parts cover 0..len, checked just above).
        unsafe { out.set_len(len) };
        out
    }
}

/// A raw pointer handed to the pool's threads, each of which writes a disjoint part.
struct SendPtr(*mut f32);
// SAFETY: see `OffloadPool::filled`: disjoint parts only.
unsafe impl Sync for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::offload::numa::Node;

    fn two_nodes() -> Topology {
        Topology {
            nodes: vec![
                Node {
                    id: 0,
                    cpus: (0..8).collect(),
                },
                Node {
                    id: 1,
                    cpus: (8..16).collect(),
                },
            ],
            source: super::super::numa::TopologySource::Sysfs,
        }
    }

    fn assert_cover(ranges: &[Range<usize>], whole: Range<usize>) {
        let mut busy: Vec<Range<usize>> =
            ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        busy.sort_by_key(|r| r.start);
        let mut at = whole.start;
        for r in &busy {
            assert_eq!(
                r.start, at,
                "{ranges:?} covers {whole:?} without gaps or overlaps"
            );
            at = r.end;
        }
        assert_eq!(at, whole.end, "{ranges:?} covers {whole:?}");
    }

    #[test]
    fn threads_go_to_nodes_in_proportion() {
        let slots = thread_slots(&two_nodes(), 16);
        assert_eq!(slots.iter().filter(|s| s.node == 0).count(), 8);
        assert_eq!(slots[0].cpu, 0);
        assert_eq!(slots[8], ThreadSlot { cpu: 8, node: 1 });
        let three = thread_slots(&two_nodes(), 3);
        assert_eq!(three.len(), 3);
    }

    #[test]
    fn spread_splits_a_range_over_every_thread_at_lines() {
        let slots = thread_slots(&two_nodes(), 16);
        let total = 64 << 20;
        let ranges = thread_ranges(0..total, total, &slots, 2, Placement::Spread);
        assert_cover(&ranges, 0..total);
        assert!(ranges.iter().all(|r| r.len() == total / 16));
        let small = thread_ranges(
            1000..1000 + 3 * MIN_PER_THREAD + 5,
            total,
            &slots,
            2,
            Placement::Spread,
        );
        assert_eq!(small.iter().filter(|r| !r.is_empty()).count(), 3);
        assert_cover(&small, 1000..1000 + 3 * MIN_PER_THREAD + 5);
        assert!(
            small
                .iter()
                .skip(1)
                .all(|r| r.is_empty() || r.start % LINE == 0)
        );
    }

    #[test]
    fn node_local_keeps_each_element_on_its_home_node() {
        let slots = thread_slots(&two_nodes(), 16);
        let total = 10_000_000;
        let whole = thread_ranges(0..total, total, &slots, 2, Placement::NodeLocal);
        assert_cover(&whole, 0..total);
        let home_end_0 = whole[..8].iter().map(|r| r.end).max().unwrap_or(0);
        assert_eq!(home_end_0 % PAGE, 0);
        // A bucket inside node 1's home range runs on node 1's threads only.
        let bucket = home_end_0 + 5..home_end_0 + 5 + 4 * MIN_PER_THREAD;
        let parts = thread_ranges(bucket.clone(), total, &slots, 2, Placement::NodeLocal);
        assert_cover(&parts, bucket);
        for (t, r) in parts.iter().enumerate() {
            if !r.is_empty() {
                assert_eq!(slots[t].node, 1, "thread {t} works on {r:?}");
            }
        }
        // A bucket across the boundary is split at it.
        let across = home_end_0 - 100..home_end_0 + 100;
        let parts = thread_ranges(across.clone(), total, &slots, 2, Placement::NodeLocal);
        assert_cover(&parts, across);
        assert!(parts.iter().any(|r| r.end == home_end_0));
    }

    #[test]
    fn first_touch_helpers_fill_every_element() {
        let pool = OffloadPool::new(2).expect("2 threads");
        let src: Vec<f32> = (0..100_003).map(|i| i as f32).collect();
        assert_eq!(pool.copied(&src), src);
        assert!(pool.zeroed(77_777).iter().all(|&x| x == 0.0));
        assert!(pool.zeroed(0).is_empty());
    }
}
