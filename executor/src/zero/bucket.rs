//! [`GradBuckets`]: the gradient bucket of stages 2 and 3, filled tensor by tensor during
//! backward, and the count of each planned bucket's arrived tensors that says when it is
//! complete (then the stage reduces it).

use std::rc::Rc;

use super::state::Buffer;
use crate::metrics::{Category, MemoryLedger, Tracked};

/// The bucket buffer and the arrivals per planned bucket.
pub(super) struct GradBuckets {
    /// Room for the largest planned bucket (in the stage's layout).
    pub(super) buffer: Buffer,
    /// Per planned bucket: how many of its tensors' gradients arrived in this backward.
    arrived: Vec<usize>,
}

impl GradBuckets {
    /// A bucket of `len` elements for `buckets` planned buckets.
    pub(super) fn new(ledger: &Rc<MemoryLedger>, len: usize, buckets: usize) -> Self {
        Self {
            buffer: Tracked::zeros(ledger, Category::Buckets, len),
            arrived: vec![0; buckets],
        }
    }

    /// Counts one more tensor of bucket `b`, which has `tensors`; whether it is now complete
    /// (its count then starts again).
    pub(super) fn arrive(&mut self, b: usize, tensors: usize) -> bool {
        self.arrived[b] += 1;
        let complete = self.arrived[b] == tensors;
        if complete {
            self.arrived[b] = 0;
        }
        complete
    }
}
