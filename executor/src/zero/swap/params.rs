//! [`ParamSwap`]: the stage 3 parameter slices the plan puts on NVMe, in one file of the model
//! dtype, read into (and written from) the parameter swap buffers.

use std::path::Path;
use std::rc::Rc;

use super::file::{decode, encode};
use super::{PARAM_PATH_POINTER, SwapDir, SwapError, SwapFile, SwapTraffic};
use crate::metrics::{Category, FixedBuffer, MemoryLedger, Tracked};
use crate::zero::partition::{ParamNvme, ParamShards};
use crate::zero::precision::{Dtype, DtypeVec};

/// JSON pointer of the parameters' `buffer_size`.
const BUFFER_SIZE_POINTER: &str = "/zero_optimization/offload_param/buffer_size";
/// JSON pointer of the parameters' `buffer_count`.
const BUFFER_COUNT_POINTER: &str = "/zero_optimization/offload_param/buffer_count";

/// One swap buffer: `buffer_size` elements of the model dtype, as bytes.
#[derive(Debug)]
struct SwapBytes(Box<[u8]>);

impl FixedBuffer for SwapBytes {
    fn bytes(&self) -> u64 {
        self.0.len() as u64
    }
}

/// The slices of a rank's stage 3 shard that live on NVMe.
#[derive(Debug)]
pub struct ParamSwap {
    file: SwapFile,
    /// Per tensor: where its slice starts in the file (elements), when it lives there.
    file_offset: Vec<Option<usize>>,
    /// `buffer_count` buffers of `buffer_size` elements (counted as parameters).
    buffers: Vec<Tracked<SwapBytes>>,
    /// The buffer the next read or write goes through (round robin).
    next: usize,
    init: SwapTraffic,
    // Last, so that the file is closed before the directory is removed.
    dir: SwapDir,
}

impl ParamSwap {
    /// Creates rank `rank`'s file under the plan's `nvme_path` and writes the resident slices
    /// of `shard` (the rank's whole shard, laid out as `shards` says) into it.
    pub fn create(
        layout: &ParamNvme,
        rank: usize,
        shards: &ParamShards,
        shard: &DtypeVec,
        ledger: &Rc<MemoryLedger>,
    ) -> Result<Self, SwapError> {
        let base = Path::new(&layout.path);
        let dtype = shard.dtype();
        let resident: Vec<usize> = (0..layout.resident.len())
            .filter(|&t| layout.resident[t])
            .collect();
        if let Some(&t) = resident
            .iter()
            .find(|&&t| shards.chunk(t) >= layout.buffer_size)
        {
            return Err(SwapError::invalid(
                BUFFER_SIZE_POINTER,
                base,
                format!(
                    "a parameter slice on NVMe has {} elements, more than buffer_size {} (DeepSpeed: \"More elements than buffer size\")",
                    shards.chunk(t),
                    layout.buffer_size
                ),
            ));
        }
        if layout.buffer_count == 0 {
            return Err(SwapError::invalid(
                BUFFER_COUNT_POINTER,
                base,
                "buffer_count 0 leaves no buffer to read parameters from NVMe into",
            ));
        }
        let buffers = (0..layout.buffer_count)
            .map(|_| {
                let bytes = vec![0u8; layout.buffer_size * dtype.bytes()].into_boxed_slice();
                Tracked::new(ledger, Category::Params, SwapBytes(bytes))
            })
            .collect();
        let dir = SwapDir::create(base, rank, PARAM_PATH_POINTER)?;
        let file = SwapFile::create(
            &dir.file(&format!("{}_params.swp", dtype.name())),
            dtype,
            PARAM_PATH_POINTER,
        )?;
        let mut file_offset = vec![None; layout.resident.len()];
        let mut at = 0;
        for &t in &resident {
            file_offset[t] = Some(at);
            at += shards.chunk(t);
        }
        let mut swap = Self {
            file,
            file_offset,
            buffers,
            next: 0,
            init: SwapTraffic::default(),
            dir,
        };
        let mut values = vec![0.0f32; resident.iter().map(|&t| shards.chunk(t)).max().unwrap_or(0)];
        for &t in &resident {
            let values = &mut values[..shards.chunk(t)];
            shard.read(shards.offset(t), values);
            swap.write(t, values)?;
        }
        swap.init = swap.file.traffic();
        Ok(swap)
    }

    /// Whether tensor `t`'s slice lives in the file.
    pub fn is_resident(&self, t: usize) -> bool {
        self.file_offset.get(t).copied().flatten().is_some()
    }

    /// The directory holding the file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes moved so far (set-up included).
    pub fn traffic(&self) -> SwapTraffic {
        self.file.traffic()
    }

    /// Bytes written while setting up.
    pub fn init_traffic(&self) -> SwapTraffic {
        self.init
    }

    /// The file's size on disk.
    pub fn resident_bytes(&self) -> Result<u64, SwapError> {
        self.file.size()
    }

    /// Reads tensor `t`'s slice (`out.len()` elements) into the next swap buffer and widens it
    /// into `out`. A tensor that is not resident reads nothing.
    pub fn read(&mut self, t: usize, out: &mut [f32]) -> Result<(), SwapError> {
        let Some(at) = self.file_offset.get(t).copied().flatten() else {
            return Ok(());
        };
        let dtype = self.file.dtype();
        let index = self.next;
        self.next = (index + 1) % self.buffers.len();
        let buffer = &mut self.buffers[index].0[..out.len() * dtype.bytes()];
        self.file.read_raw(at, buffer)?;
        decode(dtype, buffer, out);
        Ok(())
    }

    /// Writes `values` (rounded to the model dtype) as tensor `t`'s slice, through the next
    /// swap buffer. A tensor that is not resident writes nothing.
    pub fn write(&mut self, t: usize, values: &[f32]) -> Result<(), SwapError> {
        let Some(at) = self.file_offset.get(t).copied().flatten() else {
            return Ok(());
        };
        let dtype: Dtype = self.file.dtype();
        let index = self.next;
        self.next = (index + 1) % self.buffers.len();
        let buffer = &mut self.buffers[index].0[..values.len() * dtype.bytes()];
        encode(dtype, values, buffer);
        self.file.write_raw(at, buffer)
    }
}
