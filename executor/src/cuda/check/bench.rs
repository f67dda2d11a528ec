//! [`Bench`]: a kernel check's device buffers, each under the name of the operand it stands
//! for, launched through the launch table's bindings ([`Launcher::launch_bound`]) as the
//! device step's ops are. A check states its inputs, the kernels it launches and the rows it
//! compares; the uploads, the views and the downloads are here, once.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::compare::CheckRow;
use super::gpu::Gpu;
use crate::cuda::adamw::AdamSegment;
use crate::cuda::error::CudaError;
use crate::cuda::launch::bind::{Allocation, RunValues, resolve};
use crate::cuda::launch::{KernelCall, Launcher, Storage};

/// Run-time values for a launch that takes none (the epsilon, the loss multiplier, the norm
/// pass's scale and Adam's scalars are set where a case takes them).
pub const NO_RUN: RunValues = RunValues {
    eps: 0.0,
    dloss: 0.0,
    inv_scale: 1.0,
    adam: None,
};

/// One named buffer, in the element type of the operand it stands for.
enum Buffer<T> {
    Model(CudaSlice<T>),
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
    U32(CudaSlice<u32>),
    I32(CudaSlice<i32>),
    Segments(CudaSlice<AdamSegment>),
}

impl<T: Storage> Buffer<T> {
    fn len(&self) -> usize {
        match self {
            Buffer::Model(s) => s.len(),
            Buffer::F32(s) => s.len(),
            Buffer::F64(s) => s.len(),
            Buffer::U32(s) => s.len(),
            Buffer::I32(s) => s.len(),
            Buffer::Segments(s) => s.len(),
        }
    }

    fn allocation(&mut self) -> &mut dyn Allocation {
        match self {
            Buffer::Model(s) => s,
            Buffer::F32(s) => s,
            Buffer::F64(s) => s,
            Buffer::U32(s) => s,
            Buffer::I32(s) => s,
            Buffer::Segments(s) => s,
        }
    }
}

/// A check's buffers on one GPU, for a model stored in `T`.
pub struct Bench<'g, T: Storage> {
    gpu: &'g Gpu,
    buffers: Vec<(&'static str, Buffer<T>)>,
}

impl<'g, T: Storage> Bench<'g, T> {
    /// No buffers yet.
    pub fn new(gpu: &'g Gpu) -> Self {
        Self {
            gpu,
            buffers: Vec::new(),
        }
    }

    /// The dtype its rows are labelled with.
    pub fn dtype(&self) -> &'static str {
        T::DTYPE.suffix()
    }

    fn put(&mut self, name: &'static str, buffer: Buffer<T>) {
        match self.buffers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, slot)) => *slot = buffer,
            None => self.buffers.push((name, buffer)),
        }
    }

    fn get(&self, name: &str) -> Result<&Buffer<T>, CudaError> {
        self.buffers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| CudaError::Shape(format!("the check has no buffer `{name}`")))
    }

    fn up<U: DeviceRepr>(&self, host: &[U]) -> Result<CudaSlice<U>, CudaError> {
        self.gpu.up(host)
    }

    fn zeros_of<U: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<U>, CudaError> {
        self.gpu.zeros(n)
    }

    /// `host` rounded to `T` as `name`; returns the rounded values (what the CPU reference is
    /// fed).
    pub fn model(&mut self, name: &'static str, host: &[f32]) -> Result<Vec<f32>, CudaError> {
        let typed: Vec<T> = host.iter().map(|&x| T::from_f32(x)).collect();
        let buffer = Buffer::Model(self.up(&typed)?);
        self.put(name, buffer);
        Ok(typed.iter().map(|&x| x.to_f32()).collect())
    }

    /// `n` zeros of `T` as `name`.
    pub fn zeros(&mut self, name: &'static str, n: usize) -> Result<(), CudaError> {
        let buffer = Buffer::Model(self.zeros_of(n)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `host` as the f32 buffer `name`.
    pub fn f32s(&mut self, name: &'static str, host: &[f32]) -> Result<(), CudaError> {
        let buffer = Buffer::F32(self.up(host)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `n` f32 zeros as `name`.
    pub fn f32_zeros(&mut self, name: &'static str, n: usize) -> Result<(), CudaError> {
        let buffer = Buffer::F32(self.zeros_of(n)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `n` f64 zeros as `name`.
    pub fn f64_zeros(&mut self, name: &'static str, n: usize) -> Result<(), CudaError> {
        let buffer = Buffer::F64(self.zeros_of(n)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `host` as the u32 buffer `name`.
    pub fn u32s(&mut self, name: &'static str, host: &[u32]) -> Result<(), CudaError> {
        let buffer = Buffer::U32(self.up(host)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `host` as the i32 buffer `name`.
    pub fn i32s(&mut self, name: &'static str, host: &[i32]) -> Result<(), CudaError> {
        let buffer = Buffer::I32(self.up(host)?);
        self.put(name, buffer);
        Ok(())
    }

    /// `host` as the AdamW segment table `name`.
    pub fn segments(&mut self, name: &'static str, host: &[AdamSegment]) -> Result<(), CudaError> {
        let buffer = Buffer::Segments(self.up(host)?);
        self.put(name, buffer);
        Ok(())
    }

    /// The buffer `from` renamed `to` (a kernel's output read by the next kernel under its
    /// own argument's name), replacing any buffer of that name.
    pub fn rename(&mut self, from: &str, to: &'static str) -> Result<(), CudaError> {
        let at = self
            .buffers
            .iter()
            .position(|(n, _)| *n == from)
            .ok_or_else(|| CudaError::Shape(format!("the check has no buffer `{from}`")))?;
        let (_, buffer) = self.buffers.remove(at);
        self.put(to, buffer);
        Ok(())
    }

    /// Launches `calls` in order, each argument bound to the buffer named as its source says.
    pub fn launch(&mut self, calls: &[KernelCall], run: RunValues) -> Result<(), CudaError> {
        let launcher = Launcher::new(&self.gpu.modules, self.gpu.stream.clone());
        for call in calls {
            let named: Vec<(&'static str, usize)> =
                self.buffers.iter().map(|(n, b)| (*n, b.len())).collect();
            let slots = resolve(call, &named)?;
            let mut allocations: Vec<&mut dyn Allocation> = self
                .buffers
                .iter_mut()
                .map(|(_, b)| b.allocation())
                .collect();
            launcher.launch_bound(call, T::DTYPE, &slots, &mut allocations, &run)?;
        }
        Ok(())
    }

    /// The buffer `name` (of `T` or f32) as f32, after the stream's work is done.
    pub fn f32_out(&self, name: &str) -> Result<Vec<f32>, CudaError> {
        match self.get(name)? {
            Buffer::Model(s) => Ok(self.gpu.down(s)?.iter().map(|&x| x.to_f32()).collect()),
            Buffer::F32(s) => self.gpu.down(s),
            _ => Err(CudaError::Shape(format!("`{name}` is not a float buffer"))),
        }
    }

    /// The model-dtype buffer `name` as stored.
    pub fn model_out(&self, name: &str) -> Result<Vec<T>, CudaError> {
        match self.get(name)? {
            Buffer::Model(s) => self.gpu.down(s),
            _ => Err(CudaError::Shape(format!(
                "`{name}` is not of the model dtype"
            ))),
        }
    }

    /// The f64 buffer `name`.
    pub fn f64_out(&self, name: &str) -> Result<Vec<f64>, CudaError> {
        match self.get(name)? {
            Buffer::F64(s) => self.gpu.down(s),
            _ => Err(CudaError::Shape(format!("`{name}` is not an f64 buffer"))),
        }
    }

    /// The i32 buffer `name`.
    pub fn i32_out(&self, name: &str) -> Result<Vec<i32>, CudaError> {
        match self.get(name)? {
            Buffer::I32(s) => self.gpu.down(s),
            _ => Err(CudaError::Shape(format!("`{name}` is not an i32 buffer"))),
        }
    }

    /// The row `label`: buffer `name` against `want`, relative to `tol`.
    pub fn relative(
        &self,
        label: &str,
        name: &str,
        want: &[f32],
        tol: f64,
    ) -> Result<CheckRow, CudaError> {
        Ok(CheckRow::relative(
            label,
            self.dtype(),
            &self.f32_out(name)?,
            want,
            tol,
        ))
    }
}
