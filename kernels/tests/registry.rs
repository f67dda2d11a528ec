//! The registry and the `.cu` sources agree: every registered entry point is defined in its
//! file, every `__global__` function of every file is registered exactly once, the launch
//! constants match the files' `#define`s, and every kernel names a CPU reference.

use std::collections::HashMap;

use dsplan_kernels::{KERNELS, SOURCES, scan};

#[test]
fn every_entry_point_is_defined_in_its_source() {
    for spec in KERNELS {
        let defined = scan::global_functions(spec.source.text);
        for entry in spec.entry_points {
            assert!(
                defined.contains(entry),
                "{} lists `{entry}`, which {} does not define",
                spec.name,
                spec.source.file_name
            );
            assert!(
                entry.starts_with(spec.name),
                "entry `{entry}` does not start with its kernel's name `{}`",
                spec.name
            );
        }
    }
}

#[test]
fn every_global_function_is_registered_once() {
    let mut registered: HashMap<&str, &str> = HashMap::new();
    for spec in KERNELS {
        for entry in spec.entry_points {
            let previous = registered.insert(entry, spec.source.file_name);
            assert!(previous.is_none(), "`{entry}` is registered twice");
        }
    }
    let mut count = 0;
    for source in SOURCES {
        for name in scan::global_functions(source.text) {
            count += 1;
            assert_eq!(
                registered.get(name),
                Some(&source.file_name),
                "__global__ `{name}` in {} is not registered (under that file)",
                source.file_name
            );
        }
    }
    assert_eq!(count, registered.len());
    assert!(count >= 60, "only {count} entry points");
}

#[test]
fn launch_constants_match_the_sources() {
    for spec in KERNELS {
        for (name, value) in spec.source_constants {
            assert_eq!(
                scan::integer_define(spec.source.text, name),
                Some(*value),
                "{}: #define {name} in {}",
                spec.name,
                spec.source.file_name
            );
        }
        let work = dsplan_kernels::Work::Attention {
            batch: 1,
            seq_len: 1,
            heads: 1,
            head_dim: 64,
        };
        let threads = spec.launch.threads(work).expect("threads");
        assert!(
            threads > 0 && threads <= 1024 && threads % 32 == 0,
            "{}: {threads} threads per block",
            spec.name
        );
    }
}

#[test]
fn every_kernel_has_a_cpu_reference_and_dtypes() {
    let files_with_kernels: Vec<&str> = KERNELS.iter().map(|k| k.source.file_name).collect();
    for source in SOURCES {
        assert!(
            files_with_kernels.contains(&source.file_name),
            "{} has no registered kernel",
            source.file_name
        );
        assert!(
            source.text.contains("CPU reference"),
            "{} does not name its CPU reference in its header",
            source.file_name
        );
    }
    for spec in KERNELS {
        assert!(!spec.cpu_reference.is_empty(), "{}", spec.name);
        assert!(!spec.dtypes.is_empty(), "{}", spec.name);
        for path in spec.cpu_reference {
            assert!(
                path.starts_with("executor::") || path.starts_with("half::"),
                "{}: reference `{path}` is not a path",
                spec.name
            );
        }
        // Every dtype-suffixed entry point uses a dtype the spec declares.
        for entry in spec.entry_points {
            assert!(
                spec.dtypes
                    .iter()
                    .any(|d| entry.ends_with(d.suffix())
                        || entry.contains(&format!("_{}_", d.suffix()))),
                "{}: `{entry}` matches none of {:?}",
                spec.name,
                spec.dtypes
            );
        }
    }
}

#[test]
fn entry_points_are_found_by_dtype_and_head_dim() {
    use dsplan_kernels::{Dtype, kernel};
    let layernorm = kernel("layernorm_forward").expect("registered");
    assert_eq!(
        layernorm.entry_point(Dtype::Bf16),
        Ok("layernorm_forward_bf16")
    );
    assert!(layernorm.entry_point(Dtype::F64).is_err());
    let attention = kernel("attention_forward").expect("registered");
    assert_eq!(
        attention.entry_point_for_head_dim(Dtype::F16, 128),
        Ok("attention_forward_hs128_f16")
    );
    assert!(attention.entry_point_for_head_dim(Dtype::F32, 96).is_err());
}

#[test]
fn attention_key_blocks_match_the_template_arguments() {
    use dsplan_kernels::{Work, kernel};
    for name in ["attention_backward_dkdv", "attention_backward_dkdv_gqa"] {
        let dkdv = kernel(name).expect("registered");
        for head_dim in [64u64, 128] {
            let threads = dkdv
                .launch
                .threads(Work::Attention {
                    batch: 1,
                    seq_len: 1,
                    heads: 1,
                    head_dim,
                })
                .expect("threads");
            // Every instantiation for this head size names the same key count as its KEYS.
            let needle = format!(", {head_dim}, {threads}, ");
            let wrappers: Vec<&str> = dkdv
                .source
                .text
                .lines()
                .filter(|l| l.contains(&format!("void {name}_hs{head_dim}_")))
                .collect();
            assert_eq!(wrappers.len(), 3, "{name} hs{head_dim} wrappers");
            for line in wrappers {
                assert!(
                    line.contains(&needle),
                    "{name} hs{head_dim}: expected KEYS = {threads} in {line}"
                );
            }
        }
    }
}

#[test]
fn the_llama_family_kernels_are_registered_against_their_cpu_twins() {
    use dsplan_kernels::kernel;
    for (name, reference) in [
        (
            "rmsnorm_forward",
            "executor::model::rmsnorm::rmsnorm_forward",
        ),
        (
            "rmsnorm_backward",
            "executor::model::rmsnorm::rmsnorm_backward",
        ),
        ("rope_forward", "executor::model::rope::rope_forward"),
        ("rope_backward", "executor::model::rope::rope_backward"),
        ("swiglu_forward", "executor::model::swiglu::swiglu_forward"),
        (
            "swiglu_backward",
            "executor::model::swiglu::swiglu_backward",
        ),
        (
            "attention_forward_gqa",
            "executor::model::attention::grouped_attention_forward",
        ),
        (
            "attention_backward_dkdv_gqa",
            "executor::model::attention::grouped_attention_backward",
        ),
        (
            "attention_backward_dq_gqa",
            "executor::model::attention::grouped_attention_backward",
        ),
    ] {
        let spec = kernel(name).unwrap_or_else(|| panic!("`{name}` is not registered"));
        assert_eq!(spec.cpu_reference, [reference], "{name}");
        assert_eq!(spec.dtypes.len(), 3, "{name}: f32, bf16, f16");
        // The reference is a public function of the executor's model module.
        let (module, function) = reference
            .trim_start_matches("executor::model::")
            .split_once("::")
            .expect("module::function");
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../executor/src/model")
            .join(format!("{module}.rs"));
        let text = std::fs::read_to_string(&file).expect("the reference's file");
        assert!(
            text.contains(&format!("pub fn {function}(")),
            "{name}: {} has no `pub fn {function}`",
            file.display()
        );
    }
}

#[test]
fn tensor_core_key_blocks_match_the_template_arguments() {
    use dsplan_kernels::{Dtype, Work, kernel};
    for name in [
        "attention_tc_backward_dkdv",
        "attention_tc_backward_dkdv_gqa",
    ] {
        let dkdv = kernel(name).expect("registered");
        assert_eq!(
            dkdv.dtypes,
            [Dtype::Bf16, Dtype::F16],
            "{name}: 16-bit only"
        );
        for head_dim in [64u64, 128] {
            let threads = dkdv
                .launch
                .threads(Work::Attention {
                    batch: 1,
                    seq_len: 1,
                    heads: 1,
                    head_dim,
                })
                .expect("threads");
            // 16 key rows per warp of 32 threads: the WARPS template argument.
            let warps = threads / 32;
            let needle = format!(", {head_dim}, {warps}, ");
            let wrappers: Vec<&str> = dkdv
                .source
                .text
                .lines()
                .filter(|l| l.contains(&format!("void {name}_hs{head_dim}_")))
                .collect();
            assert_eq!(wrappers.len(), 2, "{name} hs{head_dim} wrappers");
            for line in wrappers {
                assert!(
                    line.contains(&needle),
                    "{name} hs{head_dim}: expected WARPS = {warps} in {line}"
                );
            }
        }
    }
    // Forward and dq: 4 warps of 16 query rows, the file's ATTENTION_TC_QUERY_BLOCK.
    for name in [
        "attention_tc_forward",
        "attention_tc_backward_dq",
        "attention_tc_forward_gqa",
        "attention_tc_backward_dq_gqa",
    ] {
        let spec = kernel(name).expect("registered");
        for head_dim in [64u64, 128] {
            let dims = spec
                .launch
                .dims(Work::Attention {
                    batch: 2,
                    seq_len: 70,
                    heads: 3,
                    head_dim,
                })
                .expect("dims");
            assert_eq!(dims.block.0, 128, "{name}");
            assert_eq!(dims.grid, (2, 3, 2), "{name}: ceil(70 / 64) query blocks");
        }
    }
}
