//! Measured memory: every buffer a rank allocates is registered, by category, in its
//! [`MemoryLedger`], which keeps the current and peak bytes per category and the peak of their
//! sum. [`Tracked`] ties a buffer's registration to its lifetime (registered when made, released
//! when dropped), so the ledger cannot drift from what is really held.
//!
//! These are explicit counts of the executor's own buffers (their element bytes), not of the
//! process allocator: the numbers a plan predicts, measured the same way.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

use serde::Serialize;

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The rank's own parameters in the model dtype: all of them (stages 0-2) or its shard
    /// (stage 3, plus the persistent tensors every rank keeps whole).
    Params,
    /// Parameters made available for computing: stage 3's gathered units, and the `f32` copies
    /// of 16-bit units the CPU model computes with. Transient.
    Gathered,
    /// fp32 master weights (the optimizer's copy; absent in fp32 stage 0).
    Master,
    /// Gradients: accumulation buffers, partitions, and the per-unit gradients of a backward.
    Grads,
    /// Optimizer state (Adam's two moments).
    Optimizer,
    /// Communication buffers: gradient buckets and gather/reduce staging.
    Buckets,
    /// The fp32 copy of the owned gradients the optimizer steps with (DeepSpeed's fp32
    /// gradient partition, made before the step whenever there is a separate master).
    StepScratch,
    /// The model's activation arena.
    Activations,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; COUNT] = [
        Category::Params,
        Category::Gathered,
        Category::Master,
        Category::Grads,
        Category::Optimizer,
        Category::Buckets,
        Category::StepScratch,
        Category::Activations,
    ];

    /// The lower-case name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Category::Params => "params",
            Category::Gathered => "gathered",
            Category::Master => "master",
            Category::Grads => "grads",
            Category::Optimizer => "optimizer",
            Category::Buckets => "buckets",
            Category::StepScratch => "step_scratch",
            Category::Activations => "activations",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// The number of categories.
const COUNT: usize = 8;

/// Bytes per category, indexed like [`Category::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByCategory(pub [u64; COUNT]);

impl ByCategory {
    /// The bytes of `category`.
    pub fn get(&self, category: Category) -> u64 {
        self.0[category.index()]
    }

    /// Sets the bytes of `category`.
    pub fn set(&mut self, category: Category, bytes: u64) {
        self.0[category.index()] = bytes;
    }

    /// The sum over categories.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(category, bytes)` pairs in report order.
    pub fn iter(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

impl Serialize for ByCategory {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(COUNT))?;
        for (category, bytes) in self.iter() {
            map.serialize_entry(category.name(), &bytes)?;
        }
        map.end()
    }
}

/// One rank's measured memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MemoryReport {
    /// The highest total held at any moment.
    pub peak_total: u64,
    /// The highest each category reached (at possibly different moments).
    pub peak: ByCategory,
    /// What each category held at the moment of `peak_total`.
    pub at_peak: ByCategory,
}

/// The running byte counts of one rank (single-threaded: a rank's buffers live on its thread).
#[derive(Debug, Default)]
pub struct MemoryLedger {
    current: [Cell<u64>; COUNT],
    peak: [Cell<u64>; COUNT],
    total: Cell<u64>,
    peak_total: Cell<u64>,
    at_peak: Cell<[u64; COUNT]>,
}

impl MemoryLedger {
    /// An empty ledger, shared by the buffers that report to it.
    pub fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    /// Registers `bytes` more in `category`.
    pub fn alloc(&self, category: Category, bytes: u64) {
        let i = category.index();
        let now = self.current[i].get() + bytes;
        self.current[i].set(now);
        self.peak[i].set(self.peak[i].get().max(now));
        let total = self.total.get() + bytes;
        self.total.set(total);
        if total > self.peak_total.get() {
            self.peak_total.set(total);
            self.at_peak.set(self.current.each_ref().map(Cell::get));
        }
    }

    /// Registers that `bytes` of `category` were released.
    pub fn free(&self, category: Category, bytes: u64) {
        let i = category.index();
        self.current[i].set(self.current[i].get().saturating_sub(bytes));
        self.total.set(self.total.get().saturating_sub(bytes));
    }

    /// What is held now, per category.
    pub fn current(&self) -> ByCategory {
        ByCategory(self.current.each_ref().map(Cell::get))
    }

    /// The peaks so far.
    pub fn report(&self) -> MemoryReport {
        MemoryReport {
            peak_total: self.peak_total.get(),
            peak: ByCategory(self.peak.each_ref().map(Cell::get)),
            at_peak: ByCategory(self.at_peak.get()),
        }
    }
}

/// A buffer whose size cannot change once made.
pub trait FixedBuffer {
    /// Bytes of its elements.
    fn bytes(&self) -> u64;
}

impl FixedBuffer for Box<[f32]> {
    fn bytes(&self) -> u64 {
        (self.len() * std::mem::size_of::<f32>()) as u64
    }
}

/// A buffer registered in a ledger for as long as it lives.
#[derive(Debug)]
pub struct Tracked<B: FixedBuffer> {
    buffer: B,
    bytes: u64,
    category: Category,
    ledger: Rc<MemoryLedger>,
}

impl<B: FixedBuffer> Tracked<B> {
    /// Registers `buffer` under `category`.
    pub fn new(ledger: &Rc<MemoryLedger>, category: Category, buffer: B) -> Self {
        let bytes = buffer.bytes();
        ledger.alloc(category, bytes);
        Self {
            buffer,
            bytes,
            category,
            ledger: Rc::clone(ledger),
        }
    }
}

impl Tracked<Box<[f32]>> {
    /// `len` zeros under `category`.
    pub fn zeros(ledger: &Rc<MemoryLedger>, category: Category, len: usize) -> Self {
        Self::new(ledger, category, vec![0.0; len].into_boxed_slice())
    }
}

impl<B: FixedBuffer> Deref for Tracked<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.buffer
    }
}

impl<B: FixedBuffer> DerefMut for Tracked<B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.buffer
    }
}

impl<B: FixedBuffer> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.ledger.free(self.category, self.bytes);
    }
}

/// Bytes held by something the ledger cannot wrap (the optimizer's moments, the model's
/// activation arena), registered for as long as the reservation lives.
#[derive(Debug)]
pub struct Reservation {
    bytes: u64,
    category: Category,
    ledger: Rc<MemoryLedger>,
}

impl Reservation {
    /// Registers `bytes` under `category`.
    pub fn new(ledger: &Rc<MemoryLedger>, category: Category, bytes: u64) -> Self {
        ledger.alloc(category, bytes);
        Self {
            bytes,
            category,
            ledger: Rc::clone(ledger),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.free(self.category, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_follow_allocations_and_drops() {
        let ledger = MemoryLedger::new();
        let a = Tracked::zeros(&ledger, Category::Grads, 10);
        {
            let _b = Tracked::zeros(&ledger, Category::Buckets, 5);
            assert_eq!(ledger.current().total(), 60);
        }
        let _c = Reservation::new(&ledger, Category::Optimizer, 8);
        drop(a);
        let report = ledger.report();
        assert_eq!(report.peak_total, 60);
        assert_eq!(report.peak.get(Category::Grads), 40);
        assert_eq!(report.peak.get(Category::Buckets), 20);
        assert_eq!(report.at_peak.get(Category::Optimizer), 0);
        assert_eq!(ledger.current().total(), 8);
    }
}
