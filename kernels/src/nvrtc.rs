//! Compiling a kernel file with NVRTC, loaded at run time.
//!
//! `libnvrtc` is opened by cudarc on first use. cudarc panics when the library cannot be found,
//! so every entry here first asks [`nvrtc_available`] (which only tries to open it) and returns
//! [`NvrtcError::LibraryMissing`] instead. The library is found by its usual names
//! (`libnvrtc.so`, `libnvrtc.so.13`, ...) on the dynamic loader's path: for the pip wheel
//! `nvidia-cuda-nvrtc`, put its `nvidia/cu13/lib` directory on `LD_LIBRARY_PATH` before the
//! process starts (see `.ci/run`).
//!
//! One compilation yields both PTX (text, inspectable, JIT-compiled by the driver) and a CUBIN
//! for the exact architecture. Load the CUBIN: a driver older than the NVRTC that produced the
//! PTX refuses the PTX (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), while a CUBIN of the same major
//! CUDA version loads.

use std::ffi::{CString, c_char, c_int};
use std::fmt;

use cudarc::nvrtc::{result, sys};

use crate::source::CudaSource;

/// A GPU architecture (compute capability), e.g. `sm_90` for H100/H200.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuArch {
    /// Major compute capability.
    pub major: u32,
    /// Minor compute capability.
    pub minor: u32,
}

impl GpuArch {
    /// Ampere A100 (`sm_80`): the oldest architecture the kernels target (bf16 conversions).
    pub const SM80: GpuArch = GpuArch::new(8, 0);
    /// Hopper H100/H200 (`sm_90`).
    pub const SM90: GpuArch = GpuArch::new(9, 0);

    /// The architecture of compute capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// `sm_<major><minor>`, as NVRTC's `--gpu-architecture` takes it.
    pub fn sm_name(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }

    /// Whether the kernels can run on it (they use `cvt.rn.bf16.f32`, sm_80 and newer).
    pub fn is_supported(&self) -> bool {
        *self >= GpuArch::SM80
    }
}

impl fmt::Display for GpuArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sm_name())
    }
}

/// The result of compiling one file for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledModule {
    /// The file compiled.
    pub file_name: &'static str,
    /// The architecture compiled for.
    pub arch: GpuArch,
    /// The PTX text.
    pub ptx: String,
    /// The CUBIN (machine code for `arch`); what the executor loads.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings; empty when there are none).
    pub log: String,
}

impl CompiledModule {
    /// Whether the PTX defines the kernel entry `name` (`.entry name(`).
    pub fn ptx_has_entry(&self, name: &str) -> bool {
        self.ptx.contains(&format!(".entry {name}("))
    }
}

/// Why a compilation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvrtcError {
    /// `libnvrtc` could not be opened.
    LibraryMissing,
    /// The architecture is older than the kernels need.
    UnsupportedArch(GpuArch),
    /// NVRTC refused to create the program.
    Create(String),
    /// The source did not compile.
    Compile {
        /// The file.
        file_name: &'static str,
        /// The architecture.
        arch: GpuArch,
        /// NVRTC's status.
        status: String,
        /// The compiler log with the errors.
        log: String,
    },
    /// Compilation succeeded but the PTX, CUBIN or log could not be read back.
    Output(String),
}

impl fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvrtcError::LibraryMissing => write!(
                f,
                "libnvrtc not found (pip install nvidia-cuda-nvrtc, then put its nvidia/cu13/lib \
                 directory on LD_LIBRARY_PATH)"
            ),
            NvrtcError::UnsupportedArch(arch) => {
                write!(
                    f,
                    "{arch} is not supported: the kernels need sm_80 or newer"
                )
            }
            NvrtcError::Create(e) => write!(f, "NVRTC could not create the program: {e}"),
            NvrtcError::Compile {
                file_name,
                arch,
                status,
                log,
            } => write!(
                f,
                "{file_name} failed to compile for {arch} ({status}):\n{log}"
            ),
            NvrtcError::Output(e) => write!(f, "NVRTC output could not be read: {e}"),
        }
    }
}

impl std::error::Error for NvrtcError {}

/// Whether `libnvrtc` can be opened (tries every name cudarc tries; does not panic).
pub fn nvrtc_available() -> bool {
    // SAFETY: only attempts to open the library by name; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), NvrtcError> {
    if !nvrtc_available() {
        return Err(NvrtcError::LibraryMissing);
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present; both pointers are valid for writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| NvrtcError::Output(format!("{e:?}")))?;
    Ok((major, minor))
}

/// The options every file is compiled with for `arch`.
pub fn compile_options(arch: GpuArch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.sm_name()),
        "-std=c++17".to_string(),
        "-lineinfo".to_string(),
    ]
}

/// Owns an `nvrtcProgram` and destroys it when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        // A failure to destroy leaks the program; there is nothing better to do in a drop.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `source` (with the prelude) for `arch`, returning PTX and CUBIN.
pub fn compile(source: &CudaSource, arch: GpuArch) -> Result<CompiledModule, NvrtcError> {
    if !arch.is_supported() {
        return Err(NvrtcError::UnsupportedArch(arch));
    }
    if !nvrtc_available() {
        return Err(NvrtcError::LibraryMissing);
    }
    let text = CString::new(source.program_text())
        .map_err(|_| NvrtcError::Create(format!("{} contains a NUL byte", source.file_name)))?;
    let name = CString::new(source.file_name)
        .map_err(|_| NvrtcError::Create("file name contains a NUL byte".to_string()))?;
    let program = Program(
        result::create_program(&text, Some(&name))
            .map_err(|e| NvrtcError::Create(format!("{e:?}")))?,
    );
    let options = compile_options(arch);
    // SAFETY: `program` is live; options contain no NUL bytes (built above from plain text).
    let compiled = unsafe { result::compile_program(program.0, &options) };
    // SAFETY: `program` is live.
    let log = unsafe { result::get_program_log(program.0) }
        .map(|chars| c_chars_to_string(&chars))
        .map_err(|e| NvrtcError::Output(format!("log: {e:?}")))?;
    if let Err(status) = compiled {
        return Err(NvrtcError::Compile {
            file_name: source.file_name,
            arch,
            status: format!("{:?}", status.0),
            log,
        });
    }
    // SAFETY: `program` is live and compiled.
    let ptx = unsafe { result::get_ptx(program.0) }
        .map(|chars| c_chars_to_string(&chars))
        .map_err(|e| NvrtcError::Output(format!("PTX: {e:?}")))?;
    let cubin = get_cubin(&program)?;
    Ok(CompiledModule {
        file_name: source.file_name,
        arch,
        ptx,
        cubin,
        log,
    })
}

fn get_cubin(program: &Program) -> Result<Vec<u8>, NvrtcError> {
    let mut size: usize = 0;
    // SAFETY: the program is live and compiled; `size` is valid for writes.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| NvrtcError::Output(format!("CUBIN size: {e:?}")))?;
    if size == 0 {
        return Err(NvrtcError::Output(
            "NVRTC produced no CUBIN (compiled for a virtual architecture?)".to_string(),
        ));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| NvrtcError::Output(format!("CUBIN: {e:?}")))?;
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_and_support() {
        assert_eq!(GpuArch::SM90.sm_name(), "sm_90");
        assert_eq!(GpuArch::new(8, 6).to_string(), "sm_86");
        assert!(GpuArch::SM80.is_supported());
        assert!(!GpuArch::new(7, 5).is_supported());
        assert_eq!(
            compile(&crate::source::CAST, GpuArch::new(7, 0)),
            Err(NvrtcError::UnsupportedArch(GpuArch::new(7, 0)))
        );
    }
}
