//! Shared helpers of the plan tests: configs from JSON, compiling presets, snapshot files.

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::path::PathBuf;

use dsplan_planner::config::{self, DsConfig};
use dsplan_planner::model::presets;
use dsplan_planner::plan::{self, Cluster, ModelGraph, Plan, Workload};
use serde_json::Value;

/// A typed config from JSON.
pub fn config(value: Value) -> DsConfig {
    config::from_value(&value).expect("valid config")
}

/// The graph of a preset.
pub fn preset(name: &str) -> ModelGraph {
    let preset = presets::lookup(name).expect("preset");
    ModelGraph::from_architecture(name, &preset.architecture).expect("graph")
}

/// Compiles `config` for `model` on `world` ranks (8 per node).
pub fn compile(config: &DsConfig, model: &ModelGraph, world: u64) -> Plan {
    let cluster = Cluster::new(world, 8).expect("cluster");
    plan::compile(config, model, &cluster, &Workload::default()).unwrap_or_else(|diagnostics| {
        panic!("refused: {diagnostics:#?}");
    })
}

/// Compares `actual` with the stored snapshot `name`; `DSPLAN_UPDATE_SNAPSHOTS=1` rewrites it.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("DSPLAN_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("snapshot dir");
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {}; run with DSPLAN_UPDATE_SNAPSHOTS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a)
            .map_or(expected.lines().count().min(actual.lines().count()), |l| l);
        panic!(
            "snapshot {name} differs from line {}:\n  expected: {}\n  actual:   {}\n(DSPLAN_UPDATE_SNAPSHOTS=1 rewrites it)",
            line + 1,
            expected.lines().nth(line).unwrap_or("<end>"),
            actual.lines().nth(line).unwrap_or("<end>")
        );
    }
}
