//! Every kernel launch of the GPT-2 and Llama device steps, pinned: for each op of the step
//! (one micro-step and the boundary) in f32, bf16 and f16, the kernel, entry point, grid,
//! block, dynamic shared memory and argument list it launches, compared line by line with
//! `snapshots/cuda_launches.txt`. The snapshot was written by the launchers before they became
//! table-driven, so the refactor is checked rather than trusted: none of this code has run on
//! a GPU, and a launch that changes its grid or argument order would go unnoticed until one.
//! `DSPLAN_UPDATE_SNAPSHOTS=1 cargo test -p dsplan-executor --test cuda_launch_snapshot`
//! rewrites it (only for an intended change of a launch). The same launches are then bound
//! as the device executor binds them, onto stand-ins of the step's allocations.

use std::fmt::Write as _;
use std::path::PathBuf;

use cudarc::driver::LaunchArgs;
use dsplan_executor::cuda::CudaError;
use dsplan_executor::cuda::adamw::AdamScalars;
use dsplan_executor::cuda::element::{Access, Element};
use dsplan_executor::cuda::launch::bind::{Allocation, RunValues, View, WithViews, with_operands};
use dsplan_executor::cuda::launch::{DeviceIn, DeviceOut, check_operands};
use dsplan_executor::cuda::train::region::RegionSizes;
use dsplan_executor::cuda::train::{DeviceLayout, Op, Region, StepProgram};
use dsplan_executor::model::BatchShape;
use dsplan_executor::model::llama::{AttentionBias, LlamaConfig, LlamaFamily};
use dsplan_executor::model::rope::{Rope, RopeScaling};
use dsplan_executor::optim::AdamConfig;
use dsplan_executor::tensor::Span;
use dsplan_executor::train::AttentionKernel;
use dsplan_kernels::Dtype;
use dsplan_planner::model::Embeddings;

#[path = "support/models.rs"]
mod models;
use models::small_head_64;

const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

/// A two-layer decoder with head size 64 and GQA 4:2.
fn llama(
    family: LlamaFamily,
    attention_bias: AttentionBias,
    embeddings: Embeddings,
) -> LlamaConfig {
    LlamaConfig {
        family,
        vocab_size: 300,
        max_position_embeddings: 128,
        hidden_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        intermediate_size: 688,
        rms_norm_eps: 1e-5,
        rope: Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        },
        attention_bias,
        embeddings,
        sliding_window: None,
    }
}

/// One line per launch of every op of `ops`.
fn describe<'a>(out: &mut String, name: &str, dtype: Dtype, ops: impl Iterator<Item = &'a Op>) {
    for (i, op) in ops.enumerate() {
        for launch in op.launches(dtype).expect("launches") {
            let dims = match launch.dims {
                Some(d) => format!("grid={:?} block={:?} shared=0", d.grid, d.block),
                None => "library".to_string(),
            };
            writeln!(
                out,
                "{name} {dtype} op{i} {} {} {dims} args={:?}",
                launch.kernel, launch.entry_point, launch.args
            )
            .expect("write");
        }
    }
}

/// Every program of the snapshot: its name, dtype and layout.
fn all_programs() -> Vec<(&'static str, Dtype, DeviceLayout, StepProgram)> {
    let mut all = Vec::new();
    let shape = BatchShape {
        batch: 2,
        seq_len: 32,
    };
    for dtype in DTYPES {
        let layout = DeviceLayout::new(small_head_64(), shape, dtype);
        let program = StepProgram::new(&layout);
        all.push(("gpt2", dtype, layout, program));
    }
    let llamas = [
        (
            "llama",
            llama(
                LlamaFamily::Llama,
                AttentionBias::Absent,
                Embeddings::Untied,
            ),
        ),
        (
            "qwen2",
            llama(LlamaFamily::Qwen2, AttentionBias::Qkv, Embeddings::Tied),
        ),
        (
            "llama-o-bias",
            llama(LlamaFamily::Llama, AttentionBias::QkvO, Embeddings::Tied),
        ),
    ];
    for (name, config) in llamas {
        for dtype in DTYPES {
            let layout = DeviceLayout::new(config, shape, dtype);
            let program = StepProgram::new(&layout);
            all.push((name, dtype, layout, program));
        }
    }
    // GPT-2 and a Llama with `--attention-kernel tensor-core` (16-bit only).
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let layout = DeviceLayout::new(small_head_64(), shape, dtype);
        let program = StepProgram::new(&layout).with_attention(AttentionKernel::TensorCore);
        all.push(("gpt2-tc", dtype, layout, program));
    }
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let config = llama(
            LlamaFamily::Llama,
            AttentionBias::Absent,
            Embeddings::Untied,
        );
        let layout = DeviceLayout::new(config, shape, dtype);
        let program = StepProgram::new(&layout).with_attention(AttentionKernel::TensorCore);
        all.push(("llama-tc", dtype, layout, program));
    }
    all
}

fn all_launches() -> String {
    let mut out = String::new();
    for (name, dtype, _, program) in all_programs() {
        describe(&mut out, name, dtype, program.ops(1));
    }
    out
}

#[test]
fn every_launch_of_the_gpt2_and_llama_steps_equals_the_snapshot() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/cuda_launches.txt");
    let now = all_launches();
    if std::env::var_os("DSPLAN_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("snapshot folder");
        std::fs::write(&path, &now).expect("snapshot written");
    }
    let pinned = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; DSPLAN_UPDATE_SNAPSHOTS=1 writes it",
            path.display()
        )
    });
    let (now_lines, pinned_lines): (Vec<&str>, Vec<&str>) =
        (now.lines().collect(), pinned.lines().collect());
    for (i, (a, b)) in now_lines.iter().zip(&pinned_lines).enumerate() {
        assert_eq!(a, b, "launch {i} differs from the snapshot");
    }
    assert_eq!(now_lines.len(), pinned_lines.len(), "number of launches");
    // Every launching op of both families is in it, in every dtype.
    assert!(pinned_lines.len() > 500, "{} launches", pinned_lines.len());
}

/// A stand-in for one of the step's allocations (its length and element type) and its views.
struct Fake {
    len: usize,
    element: Element,
}

impl Fake {
    /// Whether a view of it binds `element` when the model is stored in `model`, as the
    /// device's typed views answer (`Bindable::is`): the model-dtype and f32 allocations are
    /// one type in f32 training.
    fn holds(&self, element: Element, model: Dtype) -> bool {
        let float = [Element::Model, Element::F32];
        self.element == element
            || (model == Dtype::F32 && float.contains(&self.element) && float.contains(&element))
    }
}

impl DeviceIn for Fake {
    fn elements(&self) -> usize {
        self.len
    }
    fn is(&self, element: Element, model: Dtype) -> bool {
        self.holds(element, model)
    }
    fn push<'a>(&'a self, _: &mut LaunchArgs<'a>) {}
}

impl DeviceOut for Fake {
    fn elements(&self) -> usize {
        self.len
    }
    fn is(&self, element: Element, model: Dtype) -> bool {
        self.holds(element, model)
    }
    fn push<'a>(&'a mut self, _: &mut LaunchArgs<'a>) {}
}

impl Allocation for Fake {
    fn views(
        &mut self,
        pieces: &[(usize, Span, Access)],
        bound: Vec<(usize, View<'_>)>,
        then: &mut WithViews<'_>,
    ) -> Result<(), CudaError> {
        let mut all = bound;
        for &(i, span, access) in pieces {
            assert!(span.end() <= self.len, "{span:?} past {}", self.len);
            let view = Fake {
                len: span.len,
                element: self.element,
            };
            all.push((
                i,
                match access {
                    Access::Read => View::Read(Box::new(view)),
                    Access::Write => View::Write(Box::new(view)),
                },
            ));
        }
        then(all)
    }
}

/// Every kernel launch of every snapshot program, bound as the device executor binds it
/// (`Op::bindings` onto the step's allocations, then `with_operands`), passes the launcher's
/// check of every operand: element type, length, read or written, null and run-time values
/// where due. Only the views are fakes: this is the device's binding path without a GPU.
#[test]
fn every_launch_binds_its_operands_to_the_devices_allocations() {
    let mut bound = 0;
    for (name, dtype, layout, program) in all_programs() {
        let mut allocations: Vec<Fake> = Region::ALL
            .iter()
            .map(|&region| Fake {
                len: layout.region_len(region).max(1),
                element: region.element(),
            })
            .collect();
        let adam = AdamScalars::new(&AdamConfig::default(), 1, 1e-3, 1.0);
        let run = RunValues {
            eps: 1e-5,
            dloss: 0.5,
            inv_scale: 1.0,
            adam: Some(adam),
        };
        for op in program.ops(1) {
            for (call, slots) in op.bindings(dtype, op.largest_groups()).expect("bindings") {
                let mut views: Vec<&mut dyn Allocation> = allocations
                    .iter_mut()
                    .map(|a| a as &mut dyn Allocation)
                    .collect();
                with_operands(&call, &slots, &mut views, &run, &mut |operands| {
                    check_operands(&call, dtype, operands)
                })
                .unwrap_or_else(|e| panic!("{name} {dtype} {op:?}: {e}"));
                bound += 1;
            }
        }
    }
    assert!(bound > 500, "{bound} launches bound");
}
