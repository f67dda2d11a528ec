//! Shared helpers of the dsplan-sft tests: where the TRL reference fixtures live.

#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/reference/sft` next to the workspace (or under `$DSPLAN_SHARED_DIR`), or `None`
/// with a message saying the test is skipped.
pub fn reference() -> Option<PathBuf> {
    let shared = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    let dir = shared.join("reference/sft");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: {} not found (the TRL reference fixtures)",
            dir.display()
        );
        None
    }
}

/// A JSON file of the fixtures.
pub fn json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("fixture file");
    serde_json::from_str(&text).expect("fixture JSON")
}
