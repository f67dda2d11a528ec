//! The host side of the report: the CPU's model, cores and SIMD (what dsplan's CPU backend
//! and DeepSpeed's CPU Adam use), MPI when present, the NVIDIA kernel module's version, and
//! the NVRTC kernel cache.

use std::path::Path;
use std::process::Command;

use dsplan_kernels::cache::CubinCache;
use serde::Serialize;

/// The CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuReport {
    /// `model name` of `/proc/cpuinfo` (`None` elsewhere).
    pub model: Option<String>,
    /// Logical CPUs this process may use.
    pub logical_cpus: usize,
    /// AVX2.
    pub avx2: bool,
    /// FMA3.
    pub fma: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 BF16 (bf16 dot products).
    pub avx512_bf16: bool,
}

/// Whether each SIMD extension is there (always `false` off x86-64).
pub fn cpu() -> CpuReport {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpuinfo_model(&text));
    let logical_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_arch = "x86_64")]
    let (avx2, fma, avx512f, avx512_bf16) = (
        std::is_x86_feature_detected!("avx2"),
        std::is_x86_feature_detected!("fma"),
        std::is_x86_feature_detected!("avx512f"),
        std::is_x86_feature_detected!("avx512bf16"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (avx2, fma, avx512f, avx512_bf16) = (false, false, false, false);
    CpuReport {
        model,
        logical_cpus,
        avx2,
        fma,
        avx512f,
        avx512_bf16,
    }
}

/// The first `model name` of a `/proc/cpuinfo` text.
pub fn cpuinfo_model(text: &str) -> Option<String> {
    text.lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_string())
}

/// MPI: the launcher's first version line and the `libmpi` copies on the loader path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MpiReport {
    /// `mpirun --version`'s first line (`None`: no `mpirun` on PATH).
    pub mpirun: Option<String>,
    /// `libmpi.so*` files the loader cache lists.
    pub libraries: Vec<String>,
}

/// MPI, or `None` when neither `mpirun` nor `libmpi` is found.
pub fn mpi() -> Option<MpiReport> {
    let mpirun = Command::new("mpirun")
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| {
            let text = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            text.lines()
                .map(str::trim)
                .find(|line| !line.is_empty())
                .map(str::to_string)
        });
    let search = super::libraries::SearchPath::of_loader();
    let libraries: Vec<String> = super::libraries::copies("libmpi", &search)
        .into_iter()
        .map(|file| file.path)
        .collect();
    (mpirun.is_some() || !libraries.is_empty()).then_some(MpiReport { mpirun, libraries })
}

/// The NVIDIA kernel module's version: `/proc/driver/nvidia/version`, else `nvidia-smi`.
pub fn driver_version() -> Option<String> {
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|text| proc_driver_version(&text))
        .or_else(|| {
            let output = Command::new("nvidia-smi")
                .args(["--query-gpu=driver_version", "--format=csv,noheader"])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&output.stdout);
            text.lines()
                .next()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        })
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ...`.
pub fn proc_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    line.split_whitespace()
        .find(|word| {
            word.contains('.')
                && word
                    .split('.')
                    .all(|p| p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// The NVRTC kernel cache: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelCacheReport {
    /// The directory (`None`: neither `DSPLAN_KERNEL_CACHE`, `XDG_CACHE_HOME` nor `HOME` is
    /// set; kernels are compiled every run).
    pub dir: Option<String>,
    /// Cached CUBINs in it.
    pub entries: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// The cache of [`CubinCache::default_dir`].
pub fn kernel_cache() -> KernelCacheReport {
    let dir = CubinCache::default_dir();
    let (entries, bytes) = dir.as_deref().map_or((0, 0), cubins_in);
    KernelCacheReport {
        dir: dir.map(|d| d.display().to_string()),
        entries,
        bytes,
    }
}

/// The `.cubin` files in `dir` and their bytes (none when it does not exist).
pub fn cubins_in(dir: &Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "cubin"))
        .fold((0, 0), |(n, bytes), e| {
            (n + 1, bytes + e.metadata().map_or(0, |m| m.len()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_version_is_read_off_the_proc_line() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct  7 \
                    10:00:00 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(proc_driver_version(text).as_deref(), Some("580.159.04"));
        assert_eq!(proc_driver_version("GCC version: 12"), None);
    }

    #[test]
    fn cpuinfo_gives_the_model_and_cubins_are_counted() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\nflags\t: fpu\n";
        assert_eq!(
            cpuinfo_model(text).as_deref(),
            Some("AMD EPYC 9R14 96-Core Processor")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("gelu-sm_90-00.cubin"), [0u8; 100]).expect("write");
        std::fs::write(dir.path().join("notes.txt"), b"x").expect("write");
        assert_eq!(cubins_in(dir.path()), (1, 100));
        assert_eq!(cubins_in(&dir.path().join("absent")), (0, 0));
    }
}
