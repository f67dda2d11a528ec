//! Kernel launches held against the `.cu` signatures: the argument types and names an op
//! passes, and the buffers it says the kernel writes, equal the parameter list its entry
//! point declares (its non-`const` pointers). Shared by the device-step host tests.

use dsplan_executor::cuda::element::Element;
use dsplan_executor::cuda::train::Op;
use dsplan_executor::cuda::train::program::ArgType;
use dsplan_kernels::{Dtype, KERNELS};

/// Checks every kernel launch of `ops` in `dtype` against its entry point's signature;
/// returns how many launches it checked (library calls have none).
pub fn check_launch_signatures<'a>(ops: impl Iterator<Item = &'a Op>, dtype: Dtype) -> usize {
    let mut checked = 0;
    for op in ops {
        for launch in op.launches(dtype).expect("launches") {
            if launch.entry_point.is_empty() {
                continue;
            }
            let spec = KERNELS
                .iter()
                .find(|k| k.name == launch.kernel)
                .expect("registered");
            assert!(
                spec.entry_points.contains(&launch.entry_point.as_str()),
                "{}",
                launch.entry_point
            );
            let params = signature(spec.source.text, &launch.entry_point);
            let declared: Vec<ArgType> = params.iter().map(|p| arg_type(p, dtype)).collect();
            // In f32 training the model dtype is float: compare element types as stored.
            let stored = |a: &ArgType| match a {
                ArgType::Pointer(Element::Model) if dtype == Dtype::F32 => {
                    ArgType::Pointer(Element::F32)
                }
                other => *other,
            };
            let launched: Vec<ArgType> = launch.args.iter().map(stored).collect();
            assert_eq!(declared, launched, "{} ({op:?})", launch.entry_point);
            // The names too, so two arguments of one type cannot trade places unnoticed.
            let names: Vec<&str> = params.iter().map(|p| param_name(p)).collect();
            assert_eq!(names, launch.names, "{} ({op:?})", launch.entry_point);
            // And which buffers it writes: every pointer the `.cu` does not declare `const`.
            let written: Vec<&str> = params
                .iter()
                .filter(|p| {
                    let pointer = matches!(arg_type(p, dtype), ArgType::Pointer(_));
                    pointer && !p.split_whitespace().any(|w| w == "const")
                })
                .map(|p| param_name(p))
                .collect();
            assert_eq!(written, launch.written, "{} ({op:?})", launch.entry_point);
            checked += 1;
        }
    }
    checked
}

/// The parameter list of `extern "C" __global__ void <entry>(...)` in `text`.
pub fn signature(text: &str, entry: &str) -> Vec<String> {
    let needle = format!(" {entry}(");
    let line = text
        .lines()
        .find(|l| l.contains("__global__") && l.contains(&needle))
        .unwrap_or_else(|| panic!("{entry} not defined"));
    let start = line.find(&needle).expect("found") + needle.len();
    let end = start + line[start..].find(')').expect("closing parenthesis");
    line[start..end]
        .split(',')
        .map(|p| p.trim().to_string())
        .collect()
}

/// The [`ArgType`] a `.cu` parameter declares when the model is stored in `model`.
pub fn arg_type(param: &str, model: Dtype) -> ArgType {
    let words: Vec<&str> = param
        .split_whitespace()
        .filter(|w| *w != "const" && *w != "__restrict__")
        .collect();
    let ty = words[..words.len() - 1].join(" ");
    let pointer = ty.ends_with('*') || words[words.len() - 1].starts_with('*');
    let base = ty.trim_end_matches('*').trim();
    let model_name = match model {
        Dtype::F32 => "float",
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F64 => "double",
    };
    if pointer {
        let element = match base {
            b if b == model_name && model != Dtype::F32 => Element::Model,
            "float" => Element::F32,
            "double" => Element::F64,
            "int" => Element::I32,
            "unsigned int" | "uint32_t" | "unsigned" => Element::U32,
            "AdamSegment" => Element::AdamSegment,
            other => panic!("pointer to {other} in `{param}`"),
        };
        ArgType::Pointer(element)
    } else {
        match base {
            "int" => ArgType::Int,
            "long long" | "int64_t" => ArgType::Long,
            "float" => ArgType::Float,
            "AdamScalars" => ArgType::Scalars,
            other => panic!("scalar {other} in `{param}`"),
        }
    }
}

/// The name a `.cu` parameter declares (`const float* __restrict__ inp` is `inp`).
pub fn param_name(param: &str) -> &str {
    param
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .trim_start_matches('*')
}
