//! The Python the transformers round trips run: one that imports torch, transformers and
//! safetensors. Shared by the executor's and the CLI's integration tests (the CLI's include
//! this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `DSPLAN_PYTHON`, the benchmarks' `bench/.venv` (beside `workspace`), or `python3`,
/// whichever first imports torch, transformers and safetensors; `None` (after the skip line)
/// when none does.
pub fn python_with_transformers(workspace: &Path) -> Option<PathBuf> {
    let venv = workspace.join("bench/.venv/bin/python");
    let candidates = std::env::var_os("DSPLAN_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv, PathBuf::from("python3")]);
    for python in candidates {
        let imports = Command::new(&python)
            .args(["-c", "import torch, transformers, safetensors"])
            .output();
        if imports.is_ok_and(|out| out.status.success()) {
            return Some(python);
        }
    }
    eprintln!(
        "skipping: no Python with torch, transformers and safetensors (set DSPLAN_PYTHON, or run \
         bench/cpu_vs_pytorch.sh once to make bench/.venv)"
    );
    None
}
