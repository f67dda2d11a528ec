//! [`ActivationFloor`]: the GPU bytes a plan's activation buffers alone hold at their highest
//! tick, without compiling the rest of the plan (no buckets, stage-3 schedule, offload copies
//! or per-tensor buffers).
//!
//! Every plan buffer holds a non-negative number of bytes and the full plan's activation
//! buffers are exactly [`activation_buffers`] of the same settings and ticks, so at every tick
//! the floor is at most what the full plan holds on the GPU: a lower bound of
//! [`super::Timeline::peak_bytes`] (and of the memory estimate's GPU peak, which adds margins
//! to the plan's phase peaks). `recommend` uses it to skip the full estimate of micro-batches
//! whose activations alone overflow the GPU.
//!
//! The ticks depend only on the model and the optimizer's sub-group count; they are built once
//! per count and reused while one model is floored at many batch sizes.

use super::activations::activation_buffers;
use super::buffers::{BufferList, Lifetime, Names};
use super::cluster::Cluster;
use super::decide::{Workload, decide};
use super::dtype::Device;
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::settings::{Batch, Settings};
use super::shards::Shards;
use super::ticks::Ticks;
use crate::config::DsConfig;
use crate::diagnostics::Diagnostic;

/// Floors of one model: its graph, the ticks of the last sub-group count seen, and the
/// sub-group count of the last settings seen.
#[derive(Debug)]
pub struct ActivationFloor<'a> {
    model: &'a ModelGraph,
    ticks: Option<Ticks>,
    /// Settings with their batch cleared, and their optimizer sub-group count: the layout and
    /// shards the count comes from read no batch setting, so the micro-batches of one
    /// strategy share it.
    sub_groups: Option<(Settings, usize)>,
}

impl<'a> ActivationFloor<'a> {
    /// Floors of `model`.
    pub fn new(model: &'a ModelGraph) -> Self {
        ActivationFloor {
            model,
            ticks: None,
            sub_groups: None,
        }
    }

    /// The most bytes the activations of `config` hold on one GPU at any tick; `None` when the
    /// settings are refused (the full compile then reports why).
    pub fn gpu_bytes(
        &mut self,
        config: &DsConfig,
        cluster: &Cluster,
        workload: &Workload,
    ) -> Option<u64> {
        let (settings, diagnostics) = decide(config, self.model, cluster, workload);
        let settings = settings.filter(|_| !diagnostics.iter().any(Diagnostic::is_error))?;
        let sub_groups = self.sub_groups(&settings);
        let ticks = match self.ticks.take() {
            Some(ticks) if ticks.sub_groups == sub_groups => ticks,
            _ => Ticks::new(self.model, sub_groups),
        };
        let mut list = BufferList::with_names(Names::Dropped);
        activation_buffers(self.model, &settings, &ticks, &mut list);
        let buffers = list.into_buffers();
        // Bytes live at each tick, as the estimate's rows count them (`Lifetime::live_at`).
        let mut delta = vec![0u128; ticks.len() + 1];
        let mut falling = vec![0u128; ticks.len() + 1];
        let mut always = 0u128;
        for buffer in buffers.iter().filter(|b| b.device == Device::Gpu) {
            let bytes = u128::from(buffer.bytes);
            match buffer.lifetime {
                Lifetime::Persistent | Lifetime::Steady => always += bytes,
                Lifetime::Ticks { first, last } if first < ticks.len() => {
                    delta[first] += bytes;
                    falling[last.min(ticks.len() - 1) + 1] += bytes;
                }
                Lifetime::Ticks { .. } => {}
            }
        }
        let mut running = 0u128;
        let mut highest = 0u128;
        for tick in 0..ticks.len() {
            running = running + delta[tick] - falling[tick];
            highest = highest.max(running);
        }
        self.ticks = Some(ticks);
        Some(u64::try_from(always + highest).unwrap_or(u64::MAX))
    }

    /// The optimizer sub-group count of `settings` (from its layout and shards, or from the
    /// last settings that differ from it in the batch only).
    fn sub_groups(&mut self, settings: &Settings) -> usize {
        let mut key = settings.clone();
        key.batch = Batch {
            micro_batch: 0,
            gradient_accumulation_steps: 0,
            train_batch_size: 0,
            sequence_length: 0,
        };
        if let Some((seen, count)) = &self.sub_groups
            && *seen == key
        {
            return *count;
        }
        let layout = Layout::new(self.model, settings);
        let count = Shards::new(&layout, settings).sub_groups.len();
        self.sub_groups = Some((key, count));
        count
    }
}
