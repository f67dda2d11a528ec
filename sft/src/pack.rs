//! Best-fit-decreasing packing as TRL 1.16's `pack_dataset(..., strategy="bfd")` does it
//! (README point 6): in batches of [`MAP_BATCH`] prepared rows (one `datasets.map` call each),
//! empty rows dropped, each row cut to its first `max_length` tokens, the rows sorted by
//! length, longest first (stable), then each placed in the open bin with the least free space
//! that still holds it (of bins with equal free space, the one that reached it first) or in a
//! new bin. Bins come out in creation order, documents in insertion order.

use std::collections::{BTreeMap, VecDeque};

use smallvec::SmallVec;

use crate::prepare::{Labels, PreparedRow};

/// Rows per `datasets.map(batched=True)` call: bins never mix rows of two such batches.
pub const MAP_BATCH: usize = 1000;

/// Packs `rows` into bins of at most `max_length` tokens.
pub fn pack_bfd(rows: Vec<PreparedRow>, max_length: usize) -> Vec<PreparedRow> {
    let mut bins = Vec::new();
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let batch: Vec<PreparedRow> = rows.by_ref().take(MAP_BATCH).collect();
        bins.extend(pack_batch(batch, max_length));
    }
    bins
}

/// The documents (indices into `lengths`) of each bin, by best-fit decreasing.
pub fn bfd_bins(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    // Free space -> the bins with that much free space, in the order they reached it.
    let mut by_space: BTreeMap<usize, VecDeque<usize>> = BTreeMap::new();
    for document in order {
        let length = lengths[document];
        let fitting = by_space
            .range_mut(length..)
            .find_map(|(&space, queue)| queue.pop_front().map(|bin| (space, bin)));
        let (space, bin) = match fitting {
            Some((space, bin)) => {
                if by_space.get(&space).is_some_and(VecDeque::is_empty) {
                    by_space.remove(&space);
                }
                (space, bin)
            }
            None => {
                bins.push(Vec::new());
                (capacity, bins.len() - 1)
            }
        };
        bins[bin].push(document);
        by_space.entry(space - length).or_default().push_back(bin);
    }
    bins
}

fn pack_batch(batch: Vec<PreparedRow>, max_length: usize) -> Vec<PreparedRow> {
    let mut documents: Vec<PreparedRow> = batch
        .into_iter()
        .filter(|row| !row.is_empty())
        .map(|mut row| {
            row.input_ids.truncate(max_length);
            row.labels.truncate(max_length);
            row
        })
        .collect();
    let lengths: Vec<usize> = documents.iter().map(PreparedRow::len).collect();
    let mut taken: Vec<Option<PreparedRow>> = documents.drain(..).map(Some).collect();
    bfd_bins(&lengths, max_length)
        .into_iter()
        .map(|members| {
            let mut bin = PreparedRow {
                input_ids: Vec::new(),
                labels: Labels::Every,
                source_rows: SmallVec::new(),
                seq_lengths: SmallVec::new(),
            };
            for document in members.into_iter().filter_map(|at| taken[at].take()) {
                let length = document.len();
                bin.seq_lengths.push(length as u32);
                bin.labels
                    .append(bin.input_ids.len(), document.labels, length);
                bin.input_ids.extend(document.input_ids);
                bin.source_rows.extend(document.source_rows);
            }
            bin
        })
        .collect()
}
