//! Launch shapes: how a kernel's grid and block follow from the size of the problem.
//!
//! Each [`crate::KernelSpec`] names a [`LaunchRule`]; given the [`Work`] of one call, the rule
//! gives the [`LaunchDims`]. The constants in the rules are the ones the `.cu` files assume
//! (tests compare them with the files' `#define`s).

use std::fmt;

/// The largest `gridDim.x`.
const MAX_GRID_X: u64 = (1 << 31) - 1;
/// The largest `gridDim.y` and `gridDim.z`.
const MAX_GRID_YZ: u64 = 65_535;

/// How a kernel maps work onto threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchRule {
    /// One thread per element: grid `ceil(elements / threads)`. Work: [`Work::Elements`].
    PerElement {
        /// Threads per block.
        threads: u32,
    },
    /// A grid-stride loop: grid `min(ceil(elements / threads), max_blocks)`.
    /// Work: [`Work::Elements`].
    GridStride {
        /// Threads per block.
        threads: u32,
        /// At most this many blocks.
        max_blocks: u32,
    },
    /// A fixed grid whatever the size (so partial sums are ordered the same on every device).
    /// Any work.
    FixedGrid {
        /// Threads per block.
        threads: u32,
        /// Blocks.
        blocks: u32,
    },
    /// One warp per row: grid `ceil(rows / (threads / 32))`. Work: [`Work::Rows`].
    WarpPerRow {
        /// Threads per block (a multiple of 32).
        threads: u32,
    },
    /// One block per row: grid `rows`. Work: [`Work::Rows`].
    BlockPerRow {
        /// Threads per block.
        threads: u32,
    },
    /// Blocks of `rows_per_block` consecutive rows: grid `ceil(rows / rows_per_block)`.
    /// Work: [`Work::Rows`].
    RowChunks {
        /// Threads per block.
        threads: u32,
        /// Rows each block handles.
        rows_per_block: u32,
    },
    /// One thread per column and chunk of rows: grid
    /// `(ceil(cols / threads), ceil(rows / rows_per_chunk))`. Work: [`Work::Rows`].
    ColumnsByRowChunks {
        /// Threads per block.
        threads: u32,
        /// Rows summed by one thread.
        rows_per_chunk: u32,
    },
    /// One thread per column: grid `ceil(cols / threads)`. Work: [`Work::Rows`] (rows unused).
    Columns {
        /// Threads per block.
        threads: u32,
    },
    /// One thread per column and group: grid `(ceil(cols / threads), groups)`.
    /// Work: [`Work::Groups`].
    ColumnsByGroup {
        /// Threads per block.
        threads: u32,
    },
    /// A grid-stride loop inside each segment: grid `(blocks_per_segment, segments)`.
    /// Work: [`Work::Segments`].
    Segments {
        /// Threads per block.
        threads: u32,
        /// Blocks per segment.
        blocks_per_segment: u32,
    },
    /// One thread per query row: grid `(ceil(T / threads), NH, B)`. Work: [`Work::Attention`].
    AttentionQueries {
        /// Threads (query rows) per block.
        threads: u32,
    },
    /// One thread per key row, `threads_times_head_dim / head_dim` per block (so the staged
    /// tiles fit in shared memory): grid `(ceil(T / threads), NH, B)`. Work: [`Work::Attention`].
    AttentionKeys {
        /// Threads per block times the head size.
        threads_times_head_dim: u32,
    },
    /// Tensor-core attention: warps of 32 threads owning 16 rows (queries or keys) each,
    /// `min(max_rows, rows_times_head_dim / head_dim)` rows per block (a multiple of 16, so the
    /// shared tiles fit): block `rows * 2` threads, grid `(ceil(T / rows), heads, B)`.
    /// Work: [`Work::Attention`].
    AttentionWarpRows {
        /// Rows per block times the head size.
        rows_times_head_dim: u32,
        /// At most this many rows per block.
        max_rows: u32,
    },
    /// A single block.
    SingleBlock {
        /// Threads in it.
        threads: u32,
    },
}

/// The size of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A flat number of elements.
    Elements(u64),
    /// A `(rows, cols)` matrix.
    Rows {
        /// Rows.
        rows: u64,
        /// Columns.
        cols: u64,
    },
    /// `groups` independent groups of `cols` columns (e.g. one per distinct token).
    Groups {
        /// Groups.
        groups: u64,
        /// Columns.
        cols: u64,
    },
    /// A number of segments of a flat buffer.
    Segments(u64),
    /// Attention sizes.
    Attention {
        /// `B`.
        batch: u64,
        /// `T`.
        seq_len: u64,
        /// `NH`.
        heads: u64,
        /// `hs`.
        head_dim: u64,
    },
}

/// Grid and block sizes of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// `gridDim` (x, y, z).
    pub grid: (u32, u32, u32),
    /// `blockDim` (x, y, z).
    pub block: (u32, u32, u32),
}

/// Why a rule could not size a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchError {
    /// The work is not the kind the rule sizes.
    WrongWork {
        /// The rule.
        rule: LaunchRule,
        /// The work given.
        work: Work,
    },
    /// Nothing to do: the caller skips the launch.
    Empty,
    /// The grid would exceed the device's limits.
    GridTooLarge {
        /// Which dimension (`x`, `y`, `z`).
        dimension: char,
        /// The size asked for.
        blocks: u64,
    },
    /// The head size does not divide the rule's thread budget.
    UnsupportedHeadDim(u64),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::WrongWork { rule, work } => {
                write!(f, "launch rule {rule:?} cannot size work {work:?}")
            }
            LaunchError::Empty => write!(f, "nothing to launch: the work is empty"),
            LaunchError::GridTooLarge { dimension, blocks } => {
                write!(f, "grid dimension {dimension} would need {blocks} blocks")
            }
            LaunchError::UnsupportedHeadDim(hs) => {
                write!(f, "head size {hs} is not supported by this kernel")
            }
        }
    }
}

impl std::error::Error for LaunchError {}

fn ceil_div(a: u64, b: u32) -> u64 {
    a.div_ceil(u64::from(b.max(1)))
}

fn dims(x: u64, y: u64, z: u64, threads: u32) -> Result<LaunchDims, LaunchError> {
    if x == 0 || y == 0 || z == 0 {
        return Err(LaunchError::Empty);
    }
    let check = |dimension: char, blocks: u64, max: u64| {
        if blocks > max {
            Err(LaunchError::GridTooLarge { dimension, blocks })
        } else {
            Ok(blocks as u32)
        }
    };
    Ok(LaunchDims {
        grid: (
            check('x', x, MAX_GRID_X)?,
            check('y', y, MAX_GRID_YZ)?,
            check('z', z, MAX_GRID_YZ)?,
        ),
        block: (threads, 1, 1),
    })
}

impl LaunchRule {
    /// Threads per block for `work` (only [`LaunchRule::AttentionKeys`] depends on it).
    pub fn threads(&self, work: Work) -> Result<u32, LaunchError> {
        Ok(match *self {
            LaunchRule::PerElement { threads }
            | LaunchRule::GridStride { threads, .. }
            | LaunchRule::FixedGrid { threads, .. }
            | LaunchRule::WarpPerRow { threads }
            | LaunchRule::BlockPerRow { threads }
            | LaunchRule::RowChunks { threads, .. }
            | LaunchRule::ColumnsByRowChunks { threads, .. }
            | LaunchRule::Columns { threads }
            | LaunchRule::ColumnsByGroup { threads }
            | LaunchRule::Segments { threads, .. }
            | LaunchRule::AttentionQueries { threads }
            | LaunchRule::SingleBlock { threads } => threads,
            LaunchRule::AttentionKeys {
                threads_times_head_dim,
            } => {
                let Work::Attention { head_dim, .. } = work else {
                    return Err(LaunchError::WrongWork { rule: *self, work });
                };
                let budget = u64::from(threads_times_head_dim);
                if head_dim == 0 || budget % head_dim != 0 {
                    return Err(LaunchError::UnsupportedHeadDim(head_dim));
                }
                (budget / head_dim) as u32
            }
            LaunchRule::AttentionWarpRows { .. } => self.rows_per_block(work)? * 2,
        })
    }

    /// Rows per block of [`LaunchRule::AttentionWarpRows`] (16 per warp), or the threads of
    /// any other rule.
    fn rows_per_block(&self, work: Work) -> Result<u32, LaunchError> {
        let LaunchRule::AttentionWarpRows {
            rows_times_head_dim,
            max_rows,
        } = *self
        else {
            return self.threads(work);
        };
        let Work::Attention { head_dim, .. } = work else {
            return Err(LaunchError::WrongWork { rule: *self, work });
        };
        let budget = u64::from(rows_times_head_dim);
        if head_dim == 0 || budget % head_dim != 0 {
            return Err(LaunchError::UnsupportedHeadDim(head_dim));
        }
        let rows = (budget / head_dim).min(u64::from(max_rows));
        if rows == 0 || rows % 16 != 0 {
            return Err(LaunchError::UnsupportedHeadDim(head_dim));
        }
        Ok(rows as u32)
    }

    /// The grid and block for `work`.
    pub fn dims(&self, work: Work) -> Result<LaunchDims, LaunchError> {
        let threads = self.threads(work)?;
        let wrong = || LaunchError::WrongWork { rule: *self, work };
        match (*self, work) {
            (LaunchRule::PerElement { .. }, Work::Elements(n)) => {
                dims(ceil_div(n, threads), 1, 1, threads)
            }
            (LaunchRule::GridStride { max_blocks, .. }, Work::Elements(n)) => dims(
                ceil_div(n, threads).min(u64::from(max_blocks)),
                1,
                1,
                threads,
            ),
            (LaunchRule::FixedGrid { blocks, .. }, _) => dims(u64::from(blocks), 1, 1, threads),
            (LaunchRule::WarpPerRow { .. }, Work::Rows { rows, .. }) => {
                dims(ceil_div(rows, (threads / 32).max(1)), 1, 1, threads)
            }
            (LaunchRule::BlockPerRow { .. }, Work::Rows { rows, .. }) => dims(rows, 1, 1, threads),
            (LaunchRule::RowChunks { rows_per_block, .. }, Work::Rows { rows, .. }) => {
                dims(ceil_div(rows, rows_per_block), 1, 1, threads)
            }
            (LaunchRule::ColumnsByRowChunks { rows_per_chunk, .. }, Work::Rows { rows, cols }) => {
                dims(
                    ceil_div(cols, threads),
                    ceil_div(rows, rows_per_chunk),
                    1,
                    threads,
                )
            }
            (LaunchRule::Columns { .. }, Work::Rows { cols, .. }) => {
                dims(ceil_div(cols, threads), 1, 1, threads)
            }
            (LaunchRule::ColumnsByGroup { .. }, Work::Groups { groups, cols }) => {
                dims(ceil_div(cols, threads), groups, 1, threads)
            }
            (
                LaunchRule::Segments {
                    blocks_per_segment, ..
                },
                Work::Segments(count),
            ) => dims(u64::from(blocks_per_segment), count, 1, threads),
            (
                LaunchRule::AttentionQueries { .. } | LaunchRule::AttentionKeys { .. },
                Work::Attention {
                    batch,
                    seq_len,
                    heads,
                    ..
                },
            ) => dims(ceil_div(seq_len, threads), heads, batch, threads),
            (
                LaunchRule::AttentionWarpRows { .. },
                Work::Attention {
                    batch,
                    seq_len,
                    heads,
                    ..
                },
            ) => dims(
                ceil_div(seq_len, self.rows_per_block(work)?),
                heads,
                batch,
                threads,
            ),
            (LaunchRule::SingleBlock { .. }, _) => dims(1, 1, 1, threads),
            _ => Err(wrong()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_size_grids_from_the_problem() {
        let per_element = LaunchRule::PerElement { threads: 256 };
        assert_eq!(
            per_element.dims(Work::Elements(1000)),
            Ok(LaunchDims {
                grid: (4, 1, 1),
                block: (256, 1, 1)
            })
        );
        assert_eq!(per_element.dims(Work::Elements(0)), Err(LaunchError::Empty));
        let warp = LaunchRule::WarpPerRow { threads: 256 };
        assert_eq!(
            warp.dims(Work::Rows {
                rows: 17,
                cols: 768
            })
            .map(|d| d.grid),
            Ok((3, 1, 1))
        );
        let chunks = LaunchRule::ColumnsByRowChunks {
            threads: 256,
            rows_per_chunk: 64,
        };
        assert_eq!(
            chunks
                .dims(Work::Rows {
                    rows: 129,
                    cols: 2304
                })
                .map(|d| d.grid),
            Ok((9, 3, 1))
        );
        let keys = LaunchRule::AttentionKeys {
            threads_times_head_dim: 4096,
        };
        let attention = |head_dim| Work::Attention {
            batch: 4,
            seq_len: 1024,
            heads: 12,
            head_dim,
        };
        assert_eq!(
            keys.dims(attention(64)),
            Ok(LaunchDims {
                grid: (16, 12, 4),
                block: (64, 1, 1)
            })
        );
        assert_eq!(keys.dims(attention(128)).map(|d| d.block.0), Ok(32));
        assert_eq!(
            keys.dims(attention(96)),
            Err(LaunchError::UnsupportedHeadDim(96))
        );
        // Tensor-core attention: 16 rows per warp.
        let tc_keys = LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 4096,
            max_rows: 64,
        };
        assert_eq!(
            tc_keys.dims(attention(64)),
            Ok(LaunchDims {
                grid: (16, 12, 4),
                block: (128, 1, 1)
            })
        );
        assert_eq!(
            tc_keys.dims(attention(128)),
            Ok(LaunchDims {
                grid: (32, 12, 4),
                block: (64, 1, 1)
            })
        );
        let tc_queries = LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 8192,
            max_rows: 64,
        };
        assert_eq!(tc_queries.dims(attention(128)).map(|d| d.block.0), Ok(128));
        assert_eq!(
            tc_queries.dims(attention(96)),
            Err(LaunchError::UnsupportedHeadDim(96))
        );
        assert!(matches!(
            tc_queries.dims(Work::Elements(5)),
            Err(LaunchError::WrongWork { .. })
        ));
        assert!(matches!(
            warp.dims(Work::Elements(5)),
            Err(LaunchError::WrongWork { .. })
        ));
        assert_eq!(
            LaunchRule::Segments {
                threads: 256,
                blocks_per_segment: 128
            }
            .dims(Work::Segments(70_000)),
            Err(LaunchError::GridTooLarge {
                dimension: 'y',
                blocks: 70_000
            })
        );
        assert_eq!(
            LaunchRule::GridStride {
                threads: 256,
                max_blocks: 4096
            }
            .dims(Work::Elements(1 << 40))
            .map(|d| d.grid.0),
            Ok(4096)
        );
    }
}
