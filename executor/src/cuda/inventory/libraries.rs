//! The CUDA libraries dsplan loads at run time (NVRTC, cuBLASLt, NCCL; cuBLAS for
//! completeness): every copy on disk, and whether dsplan's loader can open one.
//!
//! Copies are searched in `LD_LIBRARY_PATH`, the loader cache (`ldconfig -p`), the usual
//! system directories and Python's `site-packages/nvidia/*/lib` (where NVIDIA's pip wheels put
//! them, and where PyTorch finds them). A copy that exists but cannot be loaded gets a reason
//! with the fix: typically a wheel's directory that is not on the loader path, or NCCL's
//! `libnccl.so.2`, a name cudarc's loader does not try.
//!
//! The search is a pure function of a [`SearchPath`], so it is tested on fabricated
//! directories; [`SearchPath::of_this_machine`] reads the environment.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

/// One library dsplan's CUDA backend loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CudaLibrary {
    /// Run-time compilation of the kernels.
    Nvrtc,
    /// Matrix products (the executor uses cuBLASLt only).
    Cublas,
    /// Matrix products with fused bias.
    CublasLt,
    /// Collectives between GPUs.
    Nccl,
}

/// What a library is needed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    /// Every GPU run.
    Always,
    /// Runs on more than one GPU.
    SeveralGpus,
    /// Not loaded by dsplan; listed because other tools (PyTorch, DeepSpeed) load it.
    Listed,
}

impl CudaLibrary {
    /// Every library, in report order.
    pub const ALL: [CudaLibrary; 4] = [
        CudaLibrary::Nvrtc,
        CudaLibrary::CublasLt,
        CudaLibrary::Cublas,
        CudaLibrary::Nccl,
    ];

    /// The file name stem, e.g. `libnvrtc`.
    pub fn stem(self) -> &'static str {
        match self {
            CudaLibrary::Nvrtc => "libnvrtc",
            CudaLibrary::Cublas => "libcublas",
            CudaLibrary::CublasLt => "libcublasLt",
            CudaLibrary::Nccl => "libnccl",
        }
    }

    /// What it is needed for.
    pub fn need(self) -> Need {
        match self {
            CudaLibrary::Nvrtc | CudaLibrary::CublasLt => Need::Always,
            CudaLibrary::Nccl => Need::SeveralGpus,
            CudaLibrary::Cublas => Need::Listed,
        }
    }

    /// The pip wheel that ships it (for CUDA 13).
    pub fn wheel(self) -> &'static str {
        match self {
            CudaLibrary::Nvrtc => "nvidia-cuda-nvrtc",
            CudaLibrary::Cublas | CudaLibrary::CublasLt => "nvidia-cublas",
            CudaLibrary::Nccl => "nvidia-nccl-cu13",
        }
    }

    /// Whether dsplan's loader (cudarc's list of names) can open it here.
    pub fn loadable(self) -> bool {
        // SAFETY: each call only tries to open the library by its candidate names.
        unsafe {
            match self {
                CudaLibrary::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                CudaLibrary::Cublas => cudarc::cublas::sys::is_culib_present(),
                CudaLibrary::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
                CudaLibrary::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }

    /// The version the loaded library reports about itself (`None`: not loadable, or it has
    /// no version call dsplan makes).
    pub fn loaded_version(self) -> Option<String> {
        if !self.loadable() {
            return None;
        }
        match self {
            CudaLibrary::Nvrtc => dsplan_kernels::nvrtc::nvrtc_version()
                .ok()
                .map(|(major, minor)| format!("{major}.{minor}")),
            CudaLibrary::CublasLt => {
                // SAFETY: the library is present (checked above); the call takes no arguments.
                let code = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
                Some(format!(
                    "{}.{}.{}",
                    code / 10000,
                    (code / 100) % 100,
                    code % 100
                ))
            }
            CudaLibrary::Nccl => {
                let mut code = 0;
                // SAFETY: the library is present (checked above); `code` is valid for writes.
                let status = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut code) };
                (status == cudarc::nccl::sys::ncclResult_t::ncclSuccess)
                    .then(|| format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100))
            }
            CudaLibrary::Cublas => None,
        }
    }
}

/// Where a copy was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// A directory of `LD_LIBRARY_PATH`.
    LdLibraryPath,
    /// The loader cache (`ldconfig -p`).
    LoaderCache,
    /// A usual system directory (`/usr/local/cuda/lib64`, ...).
    SystemDirectory,
    /// `site-packages/nvidia/*/lib` of a Python.
    PythonWheel,
}

/// One copy of a library on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryFile {
    /// The path as found (a link, often).
    pub path: String,
    /// The version read off the file it resolves to (`libcublas.so.13.0.2.14` gives
    /// `13.0.2.14`); `None` when the name carries none.
    pub version: Option<String>,
    /// Where it was found.
    pub origin: Origin,
}

/// One library: whether it loads, its version, and every copy found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryReport {
    /// Which library.
    pub library: CudaLibrary,
    /// Its file name stem.
    pub name: &'static str,
    /// What dsplan needs it for.
    pub need: Need,
    /// Whether dsplan's loader opens it.
    pub loadable: bool,
    /// The version the loaded library reports.
    pub version: Option<String>,
    /// Copies on disk, first the loader's own.
    pub files: Vec<LibraryFile>,
}

impl LibraryReport {
    /// Why this library keeps (part of) the CUDA backend from running, with the fix; `None`
    /// when it loads or is not needed.
    pub fn missing_reason(&self) -> Option<String> {
        if self.loadable || self.need == Need::Listed {
            return None;
        }
        let purpose = match self.need {
            Need::SeveralGpus => " (needed for runs on more than one GPU)",
            _ => "",
        };
        let name = self.name;
        let wheel = self.library.wheel();
        Some(match self.files.first() {
            None => format!(
                "{name} not found{purpose}: pip install {wheel}, or install the CUDA toolkit, \
                 and put its lib directory on LD_LIBRARY_PATH"
            ),
            Some(file) => {
                let path = Path::new(&file.path);
                let dir = path.parent().unwrap_or(Path::new(".")).display();
                let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                let loader_names = loader_tries(name, file_name.as_deref());
                if !loader_names {
                    format!(
                        "{name} is at {} but dsplan's loader does not try that name{purpose}: \
                         link it as {name}.so in a directory on LD_LIBRARY_PATH (ln -s {} \
                         DIR/{name}.so)",
                        file.path, file.path
                    )
                } else {
                    format!(
                        "{name} is at {} but cannot be loaded from there{purpose}: export \
                         LD_LIBRARY_PATH={dir}:$LD_LIBRARY_PATH",
                        file.path
                    )
                }
            }
        })
    }
}

/// Whether cudarc's loader tries the file name `file_name` for `stem` (its names are
/// `stem.so`, `stem.so.N` for N in the CUDA major version, 12, 11, 10, 9 and 1, and
/// `stem64_*` forms).
fn loader_tries(stem: &str, file_name: Option<&str>) -> bool {
    let Some(file_name) = file_name else {
        return false;
    };
    let Some(rest) = file_name.strip_prefix(stem) else {
        return false;
    };
    rest == ".so"
        || rest
            .strip_prefix(".so.")
            .is_some_and(|n| [CUDA_MAJOR, "12", "11", "10", "9", "1"].contains(&n))
}

/// The CUDA major version dsplan is built against (cudarc's `cuda-13000` feature).
const CUDA_MAJOR: &str = "13";

/// The directories (and loader-cache files) searched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchPath {
    /// Directories, in search order, with where each came from.
    pub dirs: Vec<(PathBuf, Origin)>,
    /// Files the loader cache lists.
    pub cached_files: Vec<PathBuf>,
}

/// Directories where CUDA libraries usually live.
const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
];

impl SearchPath {
    /// This machine's: [`SearchPath::of_loader`], and `nvidia/*/lib` under the site-packages
    /// of `$DSPLAN_PYTHON` (default `python3`).
    pub fn of_this_machine() -> Self {
        let mut path = SearchPath::of_loader();
        for site in python_site_dirs() {
            for lib in wheel_lib_dirs(&site) {
                path.dirs.push((lib, Origin::PythonWheel));
            }
        }
        path
    }

    /// Where the loader looks: `LD_LIBRARY_PATH`, `ldconfig -p` and [`SYSTEM_DIRS`].
    pub fn of_loader() -> Self {
        let mut path = SearchPath::default();
        if let Some(value) = std::env::var_os("LD_LIBRARY_PATH") {
            for dir in std::env::split_paths(&value).filter(|d| !d.as_os_str().is_empty()) {
                path.dirs.push((dir, Origin::LdLibraryPath));
            }
        }
        path.cached_files = loader_cache_files();
        for dir in SYSTEM_DIRS {
            path.dirs
                .push((PathBuf::from(dir), Origin::SystemDirectory));
        }
        path
    }
}

/// The files `ldconfig -p` lists (empty when it cannot run).
fn loader_cache_files() -> Vec<PathBuf> {
    let output = Command::new("ldconfig")
        .arg("-p")
        .output()
        .or_else(|_| Command::new("/sbin/ldconfig").arg("-p").output());
    match output {
        Ok(output) if output.status.success() => {
            parse_ldconfig(&String::from_utf8_lossy(&output.stdout))
        }
        _ => Vec::new(),
    }
}

/// The paths of `ldconfig -p`'s lines (`\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/libnccl.so.2`).
pub fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| line.split_once("=> ").map(|(_, path)| path.trim()))
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The site-packages directories of `$DSPLAN_PYTHON` (default `python3`); empty without one.
fn python_site_dirs() -> Vec<PathBuf> {
    let python = std::env::var("DSPLAN_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let script = "import site, sys\n\
                  dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
                  dirs.append(site.getusersitepackages())\n\
                  print('\\n'.join(dirs + sys.path))";
    match Command::new(python).arg("-c").arg(script).output() {
        Ok(output) if output.status.success() => {
            let mut seen = BTreeSet::new();
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .map(PathBuf::from)
                .filter(|d| d.is_dir() && seen.insert(d.clone()))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// `site/nvidia/*/lib` directories, sorted.
pub fn wheel_lib_dirs(site: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(site.join("nvidia")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("lib"))
        .filter(|d| d.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Whether `file_name` is a copy of `stem` (`stem.so` or `stem.so.*`; `libcublasLt.so` is not
/// a copy of `libcublas`, nor `libnvrtc-builtins.so` of `libnvrtc`).
pub fn is_copy_of(stem: &str, file_name: &str) -> bool {
    file_name
        .strip_prefix(stem)
        .is_some_and(|rest| rest == ".so" || rest.starts_with(".so."))
}

/// The version in a library file name: `libcublas.so.13.0.2.14` gives `13.0.2.14`.
pub fn version_of_file_name(stem: &str, file_name: &str) -> Option<String> {
    file_name
        .strip_prefix(stem)?
        .strip_prefix(".so.")
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Every copy of every library on `path`, each library's loader check and version.
pub fn search(path: &SearchPath) -> Vec<LibraryReport> {
    CudaLibrary::ALL
        .iter()
        .map(|&library| {
            let loadable = library.loadable();
            LibraryReport {
                library,
                name: library.stem(),
                need: library.need(),
                loadable,
                version: if loadable {
                    library.loaded_version()
                } else {
                    None
                },
                files: copies(library.stem(), path),
            }
        })
        .collect()
}

/// The copies of `stem` on `path`, one per file they resolve to, loader-path ones first.
pub fn copies(stem: &str, path: &SearchPath) -> Vec<LibraryFile> {
    let mut candidates: Vec<(PathBuf, Origin)> = Vec::new();
    for (dir, origin) in &path.dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| is_copy_of(stem, name))
            .collect();
        names.sort();
        candidates.extend(names.into_iter().map(|n| (dir.join(n), *origin)));
    }
    for file in &path.cached_files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| is_copy_of(stem, &n)) {
            candidates.push((file.clone(), Origin::LoaderCache));
        }
    }
    candidates.sort_by_key(|(_, origin)| *origin);
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    for (file, origin) in candidates {
        let Ok(target) = std::fs::canonicalize(&file) else {
            continue;
        };
        if !seen.insert(target.clone()) {
            continue;
        }
        let target_name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let found_name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        files.push(LibraryFile {
            path: file.display().to_string(),
            version: version_of_file_name(stem, &target_name)
                .or_else(|| version_of_file_name(stem, &found_name)),
            origin,
        });
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_told_apart_by_their_exact_stem() {
        assert!(is_copy_of("libcublas", "libcublas.so.13"));
        assert!(is_copy_of("libcublas", "libcublas.so"));
        assert!(!is_copy_of("libcublas", "libcublasLt.so.13"));
        assert!(!is_copy_of("libnvrtc", "libnvrtc-builtins.so.13.0"));
        assert!(!is_copy_of("libnccl", "libnccl_static.a"));
        assert_eq!(
            version_of_file_name("libcublas", "libcublas.so.13.0.2.14").as_deref(),
            Some("13.0.2.14")
        );
        assert_eq!(version_of_file_name("libnccl", "libnccl.so"), None);
    }

    #[test]
    fn ldconfig_lines_give_their_paths() {
        let text = "3 libs found in cache `/etc/ld.so.cache'\n\
                    \tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2\n\
                    \tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(
            parse_ldconfig(text),
            vec![
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libnccl.so.2"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
            ]
        );
    }

    #[test]
    fn a_wheel_layout_is_found_deduplicated_and_versioned() {
        let site = tempfile::tempdir().expect("tempdir");
        let cu13 = site.path().join("nvidia/cu13/lib");
        let nccl = site.path().join("nvidia/nccl/lib");
        std::fs::create_dir_all(&cu13).expect("mkdir");
        std::fs::create_dir_all(&nccl).expect("mkdir");
        std::fs::write(cu13.join("libcublas.so.13.0.2.14"), b"elf").expect("write");
        std::os::unix::fs::symlink("libcublas.so.13.0.2.14", cu13.join("libcublas.so.13"))
            .expect("link");
        std::fs::write(cu13.join("libcublasLt.so.13"), b"elf").expect("write");
        std::fs::write(nccl.join("libnccl.so.2"), b"elf").expect("write");
        let path = SearchPath {
            dirs: wheel_lib_dirs(site.path())
                .into_iter()
                .map(|d| (d, Origin::PythonWheel))
                .collect(),
            cached_files: Vec::new(),
        };
        let cublas = copies("libcublas", &path);
        assert_eq!(cublas.len(), 1, "{cublas:?}");
        assert_eq!(cublas[0].version.as_deref(), Some("13.0.2.14"));
        assert_eq!(cublas[0].origin, Origin::PythonWheel);
        assert_eq!(copies("libcublasLt", &path).len(), 1);
        assert!(copies("libnvrtc", &path).is_empty());

        // A library the loader could not open, with the copies found on `path`.
        let unloadable = |library, name, need| LibraryReport {
            library,
            name,
            need,
            loadable: false,
            version: None,
            files: copies(name, &path),
        };
        // NCCL's wheel names its library libnccl.so.2, which the loader does not try.
        let report = unloadable(CudaLibrary::Nccl, "libnccl", Need::SeveralGpus);
        let why = report.missing_reason().expect("not loadable");
        assert!(
            why.contains("does not try that name") && why.contains("ln -s"),
            "{why}"
        );
        // A loadable name in a directory off the loader path: the fix is LD_LIBRARY_PATH.
        let report = unloadable(CudaLibrary::CublasLt, "libcublasLt", Need::Always);
        let why = report.missing_reason().expect("not loadable");
        assert!(why.contains("export LD_LIBRARY_PATH="), "{why}");
        // Nothing at all: the wheel to install.
        let report = LibraryReport {
            files: Vec::new(),
            ..report
        };
        let why = report.missing_reason().expect("not loadable");
        assert!(why.contains("pip install nvidia-cublas"), "{why}");
    }
}
