//! An on-disk cache of compiled CUBINs, so NVRTC runs once per kernel file, architecture and
//! NVRTC version rather than once per process (attention alone takes seconds to compile).
//!
//! Entries are files named `<file>-<arch>-<key>.cubin`, where the key is a 64-bit FNV-1a hash
//! of everything that changes the output: the program text (prelude included), the compile
//! options, the architecture and NVRTC's version. A stale or corrupt entry can at worst fail
//! to load, and the executor then recompiles; writes go to a temporary file renamed into place,
//! so concurrent processes never see half a file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::nvrtc::{GpuArch, NvrtcError, compile_options};
use crate::source::CudaSource;

/// FNV-1a, 64 bits: stable across Rust versions and platforms (unlike `DefaultHasher`).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in *part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts, so ("ab", "c") and ("a", "bc") differ.
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Where a CUBIN came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from the cache.
    Hit,
    /// Compiled and stored.
    Compiled,
    /// Compiled, but it could not be stored (the reason); the next process compiles again.
    CompiledNotStored(String),
}

/// A directory of cached CUBINs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinCache {
    dir: PathBuf,
}

impl CubinCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default directory: `$DSPLAN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/dsplan/kernels`,
    /// else `$HOME/.cache/dsplan/kernels`; `None` when none of those is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = var("DSPLAN_KERNEL_CACHE") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = var("XDG_CACHE_HOME") {
            return Some(Path::new(&dir).join("dsplan").join("kernels"));
        }
        var("HOME").map(|home| {
            Path::new(&home)
                .join(".cache")
                .join("dsplan")
                .join("kernels")
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file an entry for `source` compiled for `arch` by NVRTC `nvrtc_version` lives in.
    pub fn entry_path(
        &self,
        source: &CudaSource,
        arch: GpuArch,
        nvrtc_version: (i32, i32),
    ) -> PathBuf {
        let text = source.program_text();
        let options = compile_options(arch).join(" ");
        let version = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
        let key = fnv1a(&[text.as_bytes(), options.as_bytes(), version.as_bytes()]);
        let stem = source.file_name.trim_end_matches(".cu");
        self.dir.join(format!("{stem}-{arch}-{key:016x}.cubin"))
    }

    /// The cached CUBIN, or `compile()`'s result, stored for next time.
    pub fn get_or_compile(
        &self,
        source: &CudaSource,
        arch: GpuArch,
        nvrtc_version: (i32, i32),
        compile: impl FnOnce() -> Result<Vec<u8>, NvrtcError>,
    ) -> Result<(Vec<u8>, CacheOutcome), NvrtcError> {
        let path = self.entry_path(source, arch, nvrtc_version);
        if let Ok(bytes) = fs::read(&path)
            && !bytes.is_empty()
        {
            return Ok((bytes, CacheOutcome::Hit));
        }
        let cubin = compile()?;
        let outcome = match store(&path, &cubin) {
            Ok(()) => CacheOutcome::Compiled,
            Err(e) => CacheOutcome::CompiledNotStored(format!("{}: {e}", path.display())),
        };
        Ok((cubin, outcome))
    }
}

impl CubinCache {
    /// Overwrites the entry for `source` on `arch` (after the cached one failed to load);
    /// returns whether it was stored.
    pub fn replace(
        &self,
        source: &CudaSource,
        arch: GpuArch,
        nvrtc_version: (i32, i32),
        cubin: &[u8],
    ) -> bool {
        store(&self.entry_path(source, arch, nvrtc_version), cubin).is_ok()
    }
}

fn store(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("cache entry has no directory"))?;
    fs::create_dir_all(dir)?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&temporary, bytes)?;
    fs::rename(&temporary, path).inspect_err(|_| {
        let _ = fs::remove_file(&temporary);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{CAST, GELU};

    #[test]
    fn compiles_once_then_hits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache = CubinCache::new(dir.path().join("k"));
        let first = cache
            .get_or_compile(&GELU, GpuArch::SM90, (13, 5), || Ok(vec![1, 2, 3]))
            .expect("compiles");
        assert_eq!(first, (vec![1, 2, 3], CacheOutcome::Compiled));
        let second = cache
            .get_or_compile(&GELU, GpuArch::SM90, (13, 5), || {
                Err(NvrtcError::LibraryMissing)
            })
            .expect("hit, no compile");
        assert_eq!(second, (vec![1, 2, 3], CacheOutcome::Hit));
        // Another architecture, NVRTC version or file is another entry.
        let paths = [
            cache.entry_path(&GELU, GpuArch::SM90, (13, 5)),
            cache.entry_path(&GELU, GpuArch::SM80, (13, 5)),
            cache.entry_path(&GELU, GpuArch::SM90, (13, 0)),
            cache.entry_path(&CAST, GpuArch::SM90, (13, 5)),
        ];
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(
            paths[0]
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gelu-sm_90-") && n.ends_with(".cubin"))
        );
        // A replaced entry is what the next lookup returns.
        assert!(cache.replace(&GELU, GpuArch::SM90, (13, 5), &[4, 5]));
        let replaced = cache
            .get_or_compile(&GELU, GpuArch::SM90, (13, 5), || Ok(vec![9]))
            .expect("hit");
        assert_eq!(replaced, (vec![4, 5], CacheOutcome::Hit));
        // A failed compile is returned, not cached.
        let failed = cache.get_or_compile(&CAST, GpuArch::SM90, (13, 5), || {
            Err(NvrtcError::LibraryMissing)
        });
        assert_eq!(failed, Err(NvrtcError::LibraryMissing));
    }

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }
}
