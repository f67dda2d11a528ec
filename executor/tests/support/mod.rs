//! Shared helpers of the executor's integration tests: locating the reference fixtures,
//! reading safetensors files into plain vectors, and measuring differences.

#![allow(dead_code)]

pub mod python;

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors::SafeTensors;
use safetensors::tensor::Dtype;

/// `../shared` next to the workspace (or `$DSPLAN_SHARED_DIR`), if it exists.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.is_dir().then_some(dir)
}

/// The GPT-2 fixture directory, or `None` after printing the skip line.
pub fn gpt2_reference() -> Option<PathBuf> {
    match shared_dir() {
        Some(dir) => Some(dir.join("reference/gpt2")),
        None => {
            eprintln!("skipping: ../shared not found");
            None
        }
    }
}

/// One tensor of a safetensors file, widened to f64 (floats) or kept as i64 (integers).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub shape: Vec<usize>,
    pub floats: Vec<f64>,
    pub ints: Vec<i64>,
}

/// Every tensor of a safetensors file, by name.
pub fn read_tensors(path: &std::path::Path) -> BTreeMap<String, Loaded> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    file.iter()
        .map(|(name, view)| {
            let data = view.data();
            let (floats, ints) = match view.dtype() {
                Dtype::F32 => (
                    data.chunks_exact(4)
                        .map(|b| f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes"))))
                        .collect(),
                    vec![],
                ),
                Dtype::F64 => (
                    data.chunks_exact(8)
                        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .collect(),
                    vec![],
                ),
                Dtype::I64 => (
                    vec![],
                    data.chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .collect(),
                ),
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (
                name.to_string(),
                Loaded {
                    shape: view.shape().to_vec(),
                    floats,
                    ints,
                },
            )
        })
        .collect()
}

/// How far `ours` is from `reference`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Diff {
    /// `max |ours - ref|`.
    pub max_abs: f64,
    /// `max |ours - ref| / max |ref|`.
    pub max_abs_over_scale: f64,
    /// `||ours - ref|| / ||ref||`.
    pub norm_rel: f64,
    /// `max |ours - ref| / |ref|` over entries with `|ref| >= 1e-3 * max |ref|`.
    pub max_rel: f64,
}

/// Compares `ours` with `reference` over the indices `keep` accepts.
pub fn diff_where(ours: &[f32], reference: &[f64], keep: impl Fn(usize) -> bool) -> Diff {
    assert_eq!(ours.len(), reference.len(), "length mismatch");
    let scale = reference
        .iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .fold(0.0f64, |m, (_, r)| m.max(r.abs()));
    let (mut max_abs, mut max_rel, mut err2, mut ref2) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (i, (&o, &r)) in ours.iter().zip(reference).enumerate() {
        if !keep(i) {
            continue;
        }
        let d = (f64::from(o) - r).abs();
        max_abs = max_abs.max(d);
        err2 += d * d;
        ref2 += r * r;
        if r.abs() >= 1e-3 * scale {
            max_rel = max_rel.max(d / r.abs());
        }
    }
    Diff {
        max_abs,
        max_abs_over_scale: if scale > 0.0 {
            max_abs / scale
        } else {
            max_abs
        },
        norm_rel: if ref2 > 0.0 {
            (err2 / ref2).sqrt()
        } else {
            err2.sqrt()
        },
        max_rel,
    }
}

/// Compares all entries.
pub fn diff(ours: &[f32], reference: &[f64]) -> Diff {
    diff_where(ours, reference, |_| true)
}

/// The worst of several differences, entry by entry.
pub fn worst(a: Diff, b: Diff) -> Diff {
    Diff {
        max_abs: a.max_abs.max(b.max_abs),
        max_abs_over_scale: a.max_abs_over_scale.max(b.max_abs_over_scale),
        norm_rel: a.norm_rel.max(b.norm_rel),
        max_rel: a.max_rel.max(b.max_rel),
    }
}

/// Whether flat index `i` of tensor `name` is a key-bias entry (true gradient exactly 0).
pub fn is_key_bias(name: &str, i: usize, n_embd: usize) -> bool {
    name.ends_with("attn.c_attn.bias") && (n_embd..2 * n_embd).contains(&i)
}

/// The LLaMA-family fixture directory of `model` (`llama`, `qwen2`, `llama3_rope`), or `None`
/// after printing the skip line.
pub fn llama_reference(model: &str) -> Option<PathBuf> {
    match shared_dir() {
        Some(dir) => Some(dir.join("reference/llama").join(model)),
        None => {
            eprintln!("skipping: ../shared not found");
            None
        }
    }
}

/// The TRL SFT fixture run `run` (`reference/sft/runs/<run>`), or `None` after printing the
/// skip line.
pub fn sft_run(run: &str) -> Option<PathBuf> {
    match shared_dir() {
        Some(dir) => Some(dir.join("reference/sft/runs").join(run)),
        None => {
            eprintln!("skipping: ../shared not found (reference/sft/runs/{run})");
            None
        }
    }
}
