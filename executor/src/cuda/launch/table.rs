//! Every kernel launch described as data, one function per kernel shape: the registry name and
//! entry point, grid and block from the registry's rule, and the argument list in the `.cu`
//! signature's order, each argument under its `.cu` parameter name. A buffer argument carries
//! its element type, whether the kernel writes it, the length the shape needs and which of the
//! op's operands it binds ([`Source`]: by name, at an offset); a shape-derived scalar carries
//! its value; a run-time value (the normalisation epsilon, the loss scale, Adam's scalars) is a
//! slot the caller fills.
//!
//! Every user reads these descriptions: [`super::Launcher::launch_bound`] binds device views
//! to them and launches (the device step's ops and the kernel checks alike), and the device
//! step's [`crate::cuda::train::Op`] checks its operands' shapes against them and lists them on
//! the host, where they are checked against the `.cu` signatures (types, names, `const`) and
//! pinned by a snapshot. An op that launches several kernels (a norm's backward and its partial
//! sums) is one function returning them in order, each argument naming the operand it binds.

use dsplan_kernels::{Dtype, LaunchDims, Work, kernel};

pub use crate::cuda::element::Access;
use crate::cuda::element::{Element, strided_len};
use crate::cuda::error::CudaError;
use crate::train::AttentionKernel;

/// How a buffer's length must relate to the shape's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Exactly this many elements.
    Exact(usize),
    /// At least this many (the kernel reads a prefix, or indexes by data).
    AtLeast(usize),
    /// Exactly this many, or a null pointer (the kernel skips it).
    ExactOrNull(usize),
    /// A whole number of rows of this many elements, at least one (a table indexed by data).
    Rows(usize),
}

impl Fit {
    /// Whether `len` elements fit.
    pub fn accepts(self, len: usize) -> bool {
        match self {
            Fit::Exact(n) | Fit::ExactOrNull(n) => len == n,
            Fit::AtLeast(n) => len >= n,
            Fit::Rows(n) => n > 0 && len >= n && len.is_multiple_of(n),
        }
    }

    /// The elements the shape needs at the least.
    pub fn len(self) -> usize {
        match self {
            Fit::Exact(n) | Fit::ExactOrNull(n) | Fit::AtLeast(n) | Fit::Rows(n) => n,
        }
    }

    /// Whether the shape needs no element.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// Which elements of its operand a buffer argument binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// From the offset to the operand's end.
    Rest,
    /// Exactly the fit's length from the offset (the live part of a buffer sized for the
    /// largest batch: the token buckets).
    Fit,
}

/// The operand a buffer argument binds: the `item`-th of the op's operands named `operand`
/// (a list operand, the biases of one gradient, repeats its name), from element `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The operand's name (the argument's own `.cu` name unless it says otherwise).
    pub operand: &'static str,
    /// Which of the operands of that name.
    pub item: usize,
    /// Its first element bound.
    pub offset: usize,
    /// How far the binding reaches.
    pub extent: Extent,
}

/// A value only the run knows, bound at launch time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunValue {
    /// The normalisation epsilon (`float eps`).
    Eps,
    /// The classifier's loss multiplier (`float dloss`).
    Dloss,
    /// The norm pass's `1 / loss scale` (`float inv_scale`).
    InvScale,
    /// Adam's scalars of the step (`AdamScalars s`).
    AdamScalars,
}

/// One argument's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A device buffer: a view the caller binds.
    Buffer {
        /// Its element type.
        element: Element,
        /// Whether the kernel writes it.
        access: Access,
        /// Its length.
        fit: Fit,
        /// The operand it binds.
        source: Source,
    },
    /// `int`, from the shape.
    Int(i32),
    /// `long long`, from the shape.
    Long(i64),
    /// `float`, from the shape.
    Float(f32),
    /// `float` or `AdamScalars`, bound at run time.
    Run(RunValue),
}

/// One argument: its `.cu` parameter name and value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    /// The parameter's name in the `.cu` signature.
    pub name: &'static str,
    /// Its value or slot.
    pub value: Value,
}

impl Param {
    /// The buffer argument's fields changed by `change` (nothing for a scalar).
    fn buffer(mut self, change: impl FnOnce(&mut Access, &mut Source)) -> Self {
        if let Value::Buffer { access, source, .. } = &mut self.value {
            change(access, source);
        }
        self
    }

    /// Written by the kernel.
    fn written(self) -> Self {
        self.buffer(|access, _| *access = Access::Write)
    }

    /// Bound to the `item`-th operand named `operand` from element `offset` on.
    fn bound(self, operand: &'static str, item: usize, offset: usize) -> Self {
        self.buffer(|_, source| {
            *source = Source {
                operand,
                item,
                offset,
                ..*source
            }
        })
    }

    /// Bound to exactly the fit's length of its operand.
    fn live_prefix(self) -> Self {
        self.buffer(|_, source| source.extent = Extent::Fit)
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCall {
    /// The registry name.
    pub kernel: &'static str,
    /// The entry point launched.
    pub entry_point: String,
    /// Grid and block from the registry's rule.
    pub dims: LaunchDims,
    /// Dynamic shared memory in bytes (no kernel uses any).
    pub shared_mem_bytes: u32,
    /// The arguments in order.
    pub params: Vec<Param>,
}

/// `<name>_<dtype>`.
pub fn entry(name: &str, dtype: Dtype) -> String {
    format!("{name}_{}", dtype.suffix())
}

/// `<name>_hs<head_dim>_<dtype>`.
pub fn attention_entry(name: &str, dtype: Dtype, head_dim: usize) -> String {
    format!("{name}_hs{head_dim}_{}", dtype.suffix())
}

fn shape_error(message: String) -> CudaError {
    CudaError::Shape(message)
}

/// Grid and block of `name` over `work` (for a size that depends on the grid).
fn dims_of(name: &'static str, work: Work) -> Result<LaunchDims, CudaError> {
    let spec = kernel(name).ok_or_else(|| shape_error(format!("no kernel `{name}`")))?;
    Ok(spec.launch.dims(work)?)
}

impl KernelCall {
    /// `name`'s launch at `entry_point` over `work` (the shape alone: whether the entry point
    /// is compiled is [`Self::compiled`]'s question).
    pub fn new(
        name: &'static str,
        entry_point: String,
        work: Work,
        params: Vec<Param>,
    ) -> Result<Self, CudaError> {
        Ok(Self {
            kernel: name,
            entry_point,
            dims: dims_of(name, work)?,
            shared_mem_bytes: 0,
            params,
        })
    }

    /// `name` at its `dtype` entry point.
    fn typed(
        name: &'static str,
        dtype: Dtype,
        work: Work,
        params: Vec<Param>,
    ) -> Result<Self, CudaError> {
        Self::new(name, entry(name, dtype), work, params)
    }

    /// Whether the registry compiles its entry point (a head size or dtype a kernel is not
    /// built for is refused here, naming what it is built for).
    pub fn compiled(&self) -> Result<(), CudaError> {
        let name = self.kernel;
        let spec = kernel(name).ok_or_else(|| shape_error(format!("no kernel `{name}`")))?;
        if spec.entry_points.contains(&self.entry_point.as_str()) {
            return Ok(());
        }
        let built: Vec<&str> = spec.dtypes.iter().map(|d| d.suffix()).collect();
        let built = match built.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => "no dtype".to_string(),
        };
        Err(shape_error(format!(
            "{name}: no entry point `{}` is compiled (it is built for {built})",
            self.entry_point
        )))
    }

    /// `self` with its `acc` bound to the `item`-th operand `acc` and its `partials` read from
    /// element `offset` (an `add_partials` of a group).
    fn bind(mut self, acc: &'static str, item: usize, offset: usize) -> Self {
        for param in &mut self.params {
            *param = match param.name {
                "acc" => param.bound(acc, item, 0),
                "partials" => param.bound("partials", 0, offset),
                _ => *param,
            };
        }
        self
    }

    /// The buffer slots in order, with their names.
    pub fn buffers(&self) -> impl Iterator<Item = (&'static str, Element, Fit)> + '_ {
        self.params.iter().filter_map(|p| match p.value {
            Value::Buffer { element, fit, .. } => Some((p.name, element, fit)),
            _ => None,
        })
    }
}

/// A buffer of `n` elements of `element`, read.
fn buf(name: &'static str, element: Element, n: usize) -> Param {
    at(name, element, Fit::Exact(n))
}

/// A buffer of `element` fitting `fit`, read, bound to the operand of its own name.
fn at(name: &'static str, element: Element, fit: Fit) -> Param {
    Param {
        name,
        value: Value::Buffer {
            element,
            access: Access::Read,
            fit,
            source: Source {
                operand: name,
                item: 0,
                offset: 0,
                extent: Extent::Rest,
            },
        },
    }
}

/// `n` elements of the model dtype.
fn model(name: &'static str, n: usize) -> Param {
    buf(name, Element::Model, n)
}

/// `n` f32.
fn f32s(name: &'static str, n: usize) -> Param {
    buf(name, Element::F32, n)
}

/// An `int` from the shape (an error above `i32::MAX`).
fn int(name: &'static str, value: usize) -> Result<Param, CudaError> {
    let value =
        i32::try_from(value).map_err(|_| shape_error(format!("{name} = {value} exceeds i32")))?;
    Ok(Param {
        name,
        value: Value::Int(value),
    })
}

/// A `long long` from the shape.
fn long(name: &'static str, value: usize) -> Param {
    Param {
        name,
        value: Value::Long(value as i64),
    }
}

/// A value bound at run time.
fn run(name: &'static str, value: RunValue) -> Param {
    Param {
        name,
        value: Value::Run(value),
    }
}

fn rows(rows: usize, cols: usize) -> Work {
    Work::Rows {
        rows: rows as u64,
        cols: cols as u64,
    }
}

fn elements(n: usize) -> Work {
    Work::Elements(n as u64)
}

/// Rows of `part` elements in `whole`, or an error naming `what`.
pub fn rows_of(what: &str, whole: usize, part: usize) -> Result<usize, CudaError> {
    if part == 0 || !whole.is_multiple_of(part) {
        return Err(shape_error(format!(
            "{what}: {whole} elements are not rows of {part}"
        )));
    }
    Ok(whole / part)
}

/// `encoder_forward`: `out (N, C) = wte[tokens] + wpe[t]` over `rows` tokens in rows of
/// `seq_len`.
pub fn encoder_forward(
    dtype: Dtype,
    rows: usize,
    seq_len: usize,
    channels: usize,
) -> Result<KernelCall, CudaError> {
    if seq_len == 0 || !rows.is_multiple_of(seq_len) {
        return Err(shape_error(format!(
            "{rows} tokens do not form rows of T = {seq_len}"
        )));
    }
    KernelCall::typed(
        "encoder_forward",
        dtype,
        elements(rows * channels),
        vec![
            model("out", rows * channels).written(),
            buf("tokens", Element::U32, rows),
            at("wte", Element::Model, Fit::Rows(channels)),
            at("wpe", Element::Model, Fit::AtLeast(seq_len * channels)),
            int("rows", rows)?,
            int("seq_len", seq_len)?,
            int("channels", channels)?,
        ],
    )
}

/// `encoder_backward_wte` over `groups` token buckets of `rows` rows (no launch without a
/// bucket).
fn embedding_backward_call(
    dtype: Dtype,
    rows: usize,
    groups: usize,
    channels: usize,
) -> Result<Option<KernelCall>, CudaError> {
    if groups == 0 {
        return Ok(None);
    }
    KernelCall::typed(
        "encoder_backward_wte",
        dtype,
        Work::Groups {
            groups: groups as u64,
            cols: channels as u64,
        },
        vec![
            at("dwte", Element::Model, Fit::Rows(channels)).written(),
            model("dout", rows * channels),
            buf("bucket_token", Element::U32, groups).live_prefix(),
            buf("bucket_start", Element::I32, groups + 1).live_prefix(),
            buf("bucket_rows", Element::I32, rows),
            int("channels", channels)?,
        ],
    )
    .map(Some)
}

/// The embedding gradient alone (the Llama family): `encoder_backward_wte` when there are
/// buckets.
pub fn embedding_backward(
    dtype: Dtype,
    rows: usize,
    groups: usize,
    channels: usize,
) -> Result<Vec<KernelCall>, CudaError> {
    Ok(embedding_backward_call(dtype, rows, groups, channels)?
        .into_iter()
        .collect())
}

/// GPT-2's encoder backward: `encoder_backward_wpe`, then `encoder_backward_wte` when there
/// are buckets.
pub fn encoder_backward(
    dtype: Dtype,
    rows: usize,
    groups: usize,
    seq_len: usize,
    channels: usize,
) -> Result<Vec<KernelCall>, CudaError> {
    if seq_len == 0 || !rows.is_multiple_of(seq_len) {
        return Err(shape_error(format!(
            "{rows} rows do not form a batch of T = {seq_len}"
        )));
    }
    let mut calls = vec![KernelCall::typed(
        "encoder_backward_wpe",
        dtype,
        elements(seq_len * channels),
        vec![
            at("dwpe", Element::Model, Fit::AtLeast(seq_len * channels)).written(),
            model("dout", rows * channels),
            int("batch", rows / seq_len)?,
            int("seq_len", seq_len)?,
            int("channels", channels)?,
        ],
    )?];
    calls.extend(embedding_backward_call(dtype, rows, groups, channels)?);
    Ok(calls)
}

/// `layernorm_forward`: `out = LN(inp)` over `(rows, channels)`, saving mean and rstd.
pub fn layernorm_forward(
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<KernelCall, CudaError> {
    normalising(
        ("layernorm_forward", Norm::Layer),
        dtype,
        (rows, channels),
        &[],
        &["inp"],
    )
}

/// `residual_layernorm_forward`: `residual = a + b`, `out = LN(residual)`.
pub fn residual_layernorm_forward(
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<KernelCall, CudaError> {
    normalising(
        ("residual_layernorm_forward", Norm::Layer),
        dtype,
        (rows, channels),
        &["residual"],
        &["a", "b"],
    )
}

/// Which normalisation a forward kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Norm {
    /// LayerNorm: saves the mean too, adds a bias.
    Layer,
    /// RMSNorm: the rstd only, no bias.
    Rms,
}

/// A normalisation forward kernel `name` over `(rows, channels)`: the `written` rows, then
/// `out`, the mean (LayerNorm) and rstd, then the `read` rows, the weight and bias
/// (LayerNorm), the sizes and the epsilon.
fn normalising(
    (name, norm): (&'static str, Norm),
    dtype: Dtype,
    (rows, channels): (usize, usize),
    written: &[&'static str],
    read: &[&'static str],
) -> Result<KernelCall, CudaError> {
    let n = rows * channels;
    let layer = norm == Norm::Layer;
    let mut args: Vec<Param> = written.iter().map(|w| model(w, n).written()).collect();
    args.push(model("out", n).written());
    args.extend(layer.then(|| f32s("mean", rows).written()));
    args.push(f32s("rstd", rows).written());
    args.extend(read.iter().map(|r| model(r, n)));
    args.push(model("weight", channels));
    args.extend(layer.then(|| model("bias", channels)));
    args.extend([
        int("rows", rows)?,
        int("channels", channels)?,
        run("eps", RunValue::Eps),
    ]);
    KernelCall::typed(name, dtype, self::rows(rows, channels), args)
}

/// `add_partials`: `acc[c] += partials[k * stride + c]` for `k < chunks`, `c < width`.
pub fn add_partials(
    dtype: Dtype,
    chunks: usize,
    width: usize,
    stride: usize,
) -> Result<KernelCall, CudaError> {
    let needed = if chunks == 0 {
        0
    } else {
        (chunks - 1) * stride + width
    };
    KernelCall::typed(
        "add_partials",
        dtype,
        rows(chunks, width),
        vec![
            model("acc", width).written(),
            at("partials", Element::F32, Fit::AtLeast(needed)),
            int("chunks", chunks)?,
            int("width", width)?,
            long("stride", stride),
        ],
    )
}

/// A norm's backward kernel `name` over `(rows, channels)` whose partial sums hold `sums`
/// rows of `channels` per chunk, then one `add_partials` per sum into the operand it names
/// (`dweight`, and `dbias` from the partials' second row): LayerNorm's two (weight and bias;
/// it reads the saved mean), RMSNorm's one (weight).
fn norm_backward(
    name: &'static str,
    dtype: Dtype,
    rows: usize,
    channels: usize,
    sums: usize,
) -> Result<Vec<KernelCall>, CudaError> {
    let n = rows * channels;
    let work = self::rows(rows, channels);
    let chunks = dims_of(name, work)?.grid.0 as usize;
    let mut params = vec![
        model("dinp", n).written(),
        f32s("partials", chunks * sums * channels).written(),
        model("dout", n),
        model("inp", n),
        model("weight", channels),
    ];
    if sums == 2 {
        params.push(f32s("mean", rows));
    }
    params.extend([
        f32s("rstd", rows),
        int("rows", rows)?,
        int("channels", channels)?,
    ]);
    let mut calls = vec![KernelCall::typed(name, dtype, work, params)?];
    for (k, sum) in ["dweight", "dbias"].into_iter().take(sums).enumerate() {
        let call = add_partials(dtype, chunks, channels, sums * channels)?;
        calls.push(call.bind(sum, 0, k * channels));
    }
    Ok(calls)
}

/// `layernorm_backward` then `add_partials` for the weight and the bias.
pub fn layernorm_backward(
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<Vec<KernelCall>, CudaError> {
    norm_backward("layernorm_backward", dtype, rows, channels, 2)
}

/// `rmsnorm_forward`: `out = weight * (inp * rstd)`, saving `rstd`.
pub fn rmsnorm_forward(
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<KernelCall, CudaError> {
    normalising(
        ("rmsnorm_forward", Norm::Rms),
        dtype,
        (rows, channels),
        &[],
        &["inp"],
    )
}

/// `rmsnorm_backward` then `add_partials` for the weight.
pub fn rmsnorm_backward(
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<Vec<KernelCall>, CudaError> {
    norm_backward("rmsnorm_backward", dtype, rows, channels, 1)
}

/// Bias gradients from one `(rows, W)` output gradient: `column_partials` over all `W`
/// columns, then one `add_partials` per bias of `widths` into the `i`-th operand `dbias`
/// (the columns after the earlier biases'; their sum is `W`).
pub fn bias_backward(
    dtype: Dtype,
    rows: usize,
    widths: &[usize],
) -> Result<Vec<KernelCall>, CudaError> {
    let width: usize = widths.iter().sum();
    let work = self::rows(rows, width);
    let chunks = dims_of("column_partials", work)?.grid.1 as usize;
    let mut calls = vec![KernelCall::typed(
        "column_partials",
        dtype,
        work,
        vec![
            f32s("partials", chunks * width).written(),
            model("data", rows * width),
            int("rows", rows)?,
            int("width", width)?,
        ],
    )?];
    let mut column = 0;
    for (i, &w) in widths.iter().enumerate() {
        calls.push(add_partials(dtype, chunks, w, width)?.bind("dbias", i, column));
        column += w;
    }
    Ok(calls)
}

/// `bias_gelu_forward`: `pre += bias` per column, `out = gelu(pre)` over `(rows, width)`.
pub fn bias_gelu_forward(dtype: Dtype, rows: usize, width: usize) -> Result<KernelCall, CudaError> {
    let n = rows * width;
    KernelCall::typed(
        "bias_gelu_forward",
        dtype,
        elements(n),
        vec![
            model("pre", n).written(),
            model("out", n).written(),
            model("bias", width),
            int("rows", rows)?,
            int("width", width)?,
        ],
    )
}

/// An elementwise kernel `(out, inp, long long n)`: `gelu_forward` (`out`, `inp`) or
/// `gelu_backward_inplace` (`d`, `inp`).
fn unary(
    name: &'static str,
    dtype: Dtype,
    names: [&'static str; 2],
    n: usize,
) -> Result<KernelCall, CudaError> {
    KernelCall::typed(
        name,
        dtype,
        elements(n),
        vec![
            model(names[0], n).written(),
            model(names[1], n),
            long("n", n),
        ],
    )
}

/// `accumulate`: `dst += src` over `n` elements.
pub fn accumulate(dtype: Dtype, n: usize) -> Result<KernelCall, CudaError> {
    unary("accumulate", dtype, ["dst", "src"], n)
}

/// `gelu_forward`: `out = gelu(inp)` over `n` elements.
pub fn gelu_forward(dtype: Dtype, n: usize) -> Result<KernelCall, CudaError> {
    unary("gelu_forward", dtype, ["out", "inp"], n)
}

/// `gelu_backward_inplace`: `d *= gelu'(inp)` over `n` elements.
pub fn gelu_backward(dtype: Dtype, n: usize) -> Result<KernelCall, CudaError> {
    unary("gelu_backward_inplace", dtype, ["d", "inp"], n)
}

/// `cast`: `out = inp` converted from `from` to `to` (f32 to and from bf16/f16) over `n`.
pub fn cast(from: Dtype, to: Dtype, n: usize) -> Result<KernelCall, CudaError> {
    let side = |d: Dtype| {
        if d == Dtype::F32 {
            Element::F32
        } else {
            Element::Model
        }
    };
    KernelCall::new(
        "cast",
        format!("cast_{}_to_{}", from.suffix(), to.suffix()),
        elements(n),
        vec![
            buf("out", side(to), n).written(),
            buf("inp", side(from), n),
            long("n", n),
        ],
    )
}

/// `swiglu_forward`: `out (N, I) = silu(gate) * up` from `gate_up (N, 2I)`.
pub fn swiglu_forward(dtype: Dtype, rows: usize, inner: usize) -> Result<KernelCall, CudaError> {
    KernelCall::typed(
        "swiglu_forward",
        dtype,
        elements(rows * inner),
        vec![
            model("out", rows * inner).written(),
            model("gate_up", rows * 2 * inner),
            int("rows", rows)?,
            int("inner", inner)?,
        ],
    )
}

/// `swiglu_backward`: `dgate_up (N, 2I)` from `dout (N, I)` and `gate_up`.
pub fn swiglu_backward(dtype: Dtype, rows: usize, inner: usize) -> Result<KernelCall, CudaError> {
    KernelCall::typed(
        "swiglu_backward",
        dtype,
        elements(rows * inner),
        vec![
            model("dgate_up", rows * 2 * inner).written(),
            model("dout", rows * inner),
            model("gate_up", rows * 2 * inner),
            int("rows", rows)?,
            int("inner", inner)?,
        ],
    )
}

/// Which way a RoPE launch turns the pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// By `+angle`: `rope_forward` (`executor::model::rope::rope_forward`).
    Forward,
    /// By `-angle`, the transpose: `rope_backward` on the gradient.
    Backward,
}

/// The sizes of one RoPE launch: rows `width` wide whose first `heads` heads turn at the
/// positions `r % seq_len` by a table of `half` angles per position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeShape {
    /// Elements of the rotated tensor.
    pub len: usize,
    /// Elements of the cos (and of the sin) table, `T * hs/2`.
    pub table: usize,
    /// Row width.
    pub width: usize,
    /// Heads turned per row.
    pub heads: usize,
    /// `T`.
    pub seq_len: usize,
}

/// `rope_forward` or `rope_backward`, in place.
pub fn rope(dtype: Dtype, shape: RopeShape, rotation: Rotation) -> Result<KernelCall, CudaError> {
    let RopeShape {
        len,
        table,
        width,
        heads,
        seq_len,
    } = shape;
    if seq_len == 0 || !table.is_multiple_of(seq_len) || width == 0 || !len.is_multiple_of(width) {
        return Err(shape_error(format!(
            "the table ({table} values) is not (T = {seq_len}, hs/2), or the rows not {width} wide"
        )));
    }
    let half = table / seq_len;
    let n_rows = len / width;
    if heads * 2 * half > width || !n_rows.is_multiple_of(seq_len) {
        return Err(shape_error(format!(
            "{heads} heads of {} in rows of {width}, {n_rows} rows of T = {seq_len}",
            2 * half
        )));
    }
    let name = match rotation {
        Rotation::Forward => "rope_forward",
        Rotation::Backward => "rope_backward",
    };
    KernelCall::typed(
        name,
        dtype,
        elements(n_rows * heads * half),
        vec![
            model("rows", len).written(),
            f32s("cos_t", table),
            f32s("sin_t", table),
            int("n_rows", n_rows)?,
            int("width", width)?,
            int("heads", heads)?,
            int("half", half)?,
            int("seq_len", seq_len)?,
        ],
    )
}

/// Whether attention's keys and values have their own head count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heads {
    /// One key/value head per query head (GPT-2): the plain entry points.
    Shared,
    /// `kv_heads` key/value heads (grouped-query): the `*_gqa` entry points, which take the
    /// count.
    Grouped,
}

/// The sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedAttention {
    /// `B`.
    pub batch: usize,
    /// `T`.
    pub seq_len: usize,
    /// `NH`, query heads.
    pub n_head: usize,
    /// `KV`, key/value heads (divides `NH`; equals it for [`Heads::Shared`]).
    pub kv_heads: usize,
    /// `hs`.
    pub head_dim: usize,
}

impl GroupedAttention {
    /// Elements of a `[q | k | v]` row: `(NH + 2 KV) hs`.
    fn width(&self) -> usize {
        (self.n_head + 2 * self.kv_heads) * self.head_dim
    }

    /// Elements of `qkv`.
    pub fn qkv_len(&self) -> usize {
        self.batch * self.seq_len * self.width()
    }

    /// Elements of the output `(B, T, NH hs)`.
    fn out_len(&self) -> usize {
        self.batch * self.seq_len * self.n_head * self.head_dim
    }

    /// Elements of `lse` and `delta`, `(B, NH, T)`.
    fn stats_len(&self) -> usize {
        self.batch * self.n_head * self.seq_len
    }

    fn check(&self, heads: Heads) -> Result<(), CudaError> {
        if self.kv_heads == 0 || !self.n_head.is_multiple_of(self.kv_heads) {
            return Err(shape_error(format!(
                "{} key/value heads do not divide {} query heads",
                self.kv_heads, self.n_head
            )));
        }
        if heads == Heads::Shared && self.kv_heads != self.n_head {
            return Err(shape_error(format!(
                "{} key/value heads for {} query heads need the grouped-query kernels",
                self.kv_heads, self.n_head
            )));
        }
        Ok(())
    }

    /// The work of `heads` blocks per batch row.
    fn work(&self, heads: usize) -> Work {
        Work::Attention {
            batch: self.batch as u64,
            seq_len: self.seq_len as u64,
            heads: heads as u64,
            head_dim: self.head_dim as u64,
        }
    }

    /// `seq_len`, `n_head` and (grouped) `kv_heads`.
    fn head_params(&self, heads: Heads) -> Result<Vec<Param>, CudaError> {
        let mut params = vec![int("seq_len", self.seq_len)?, int("n_head", self.n_head)?];
        if heads == Heads::Grouped {
            params.push(int("kv_heads", self.kv_heads)?);
        }
        params.push(Param {
            name: "scale",
            value: Value::Float(attention_scale(self.head_dim)),
        });
        Ok(params)
    }
}

/// `head_dim^-0.5`, rounded as the CPU attention rounds it.
pub fn attention_scale(head_dim: usize) -> f32 {
    (head_dim as f64).powf(-0.5) as f32
}

/// An attention kernel's name for `heads` and `kernel`: `names` holds the scalar kernel's
/// `[shared, grouped]` names, then the tensor-core kernel's.
fn attention_name(names: [&'static str; 4], heads: Heads, kernel: AttentionKernel) -> &'static str {
    let [scalar, scalar_gqa, tc, tc_gqa] = names;
    match (kernel, heads) {
        (AttentionKernel::Scalar, Heads::Shared) => scalar,
        (AttentionKernel::Scalar, Heads::Grouped) => scalar_gqa,
        (AttentionKernel::TensorCore, Heads::Shared) => tc,
        (AttentionKernel::TensorCore, Heads::Grouped) => tc_gqa,
    }
}

const FORWARD_NAMES: [&str; 4] = [
    "attention_forward",
    "attention_forward_gqa",
    "attention_tc_forward",
    "attention_tc_forward_gqa",
];
const DKDV_NAMES: [&str; 4] = [
    "attention_backward_dkdv",
    "attention_backward_dkdv_gqa",
    "attention_tc_backward_dkdv",
    "attention_tc_backward_dkdv_gqa",
];
const DQ_NAMES: [&str; 4] = [
    "attention_backward_dq",
    "attention_backward_dq_gqa",
    "attention_tc_backward_dq",
    "attention_tc_backward_dq_gqa",
];

/// `attention_forward` (or `_gqa`; `attention_tc_*` for [`AttentionKernel::TensorCore`]):
/// `out (B, T, NH hs)` and `lse (B, NH, T)` from `qkv`.
pub fn attention_forward(
    dtype: Dtype,
    dims: GroupedAttention,
    heads: Heads,
    kernel: AttentionKernel,
) -> Result<KernelCall, CudaError> {
    dims.check(heads)?;
    let name = attention_name(FORWARD_NAMES, heads, kernel);
    let mut params = vec![
        model("out", dims.out_len()).written(),
        f32s("lse", dims.stats_len()).written(),
        model("qkv", dims.qkv_len()),
    ];
    params.extend(dims.head_params(heads)?);
    KernelCall::new(
        name,
        attention_entry(name, dtype, dims.head_dim),
        dims.work(dims.n_head),
        params,
    )
}

/// Attention backward: `attention_backward_preprocess` (`delta`), then dk/dv (one block per
/// key/value head) and dq into `dqkv` (written, not accumulated), by `kernel`'s kernels (the
/// preprocess is shared; the tensor-core kernels are built for bf16 and f16 only).
pub fn attention_backward(
    dtype: Dtype,
    dims: GroupedAttention,
    heads: Heads,
    kernel: AttentionKernel,
) -> Result<Vec<KernelCall>, CudaError> {
    dims.check(heads)?;
    let mut calls = vec![KernelCall::typed(
        "attention_backward_preprocess",
        dtype,
        rows(dims.stats_len(), dims.head_dim),
        vec![
            f32s("delta", dims.stats_len()).written(),
            model("dout", dims.out_len()),
            model("out", dims.out_len()),
            int("batch", dims.batch)?,
            int("seq_len", dims.seq_len)?,
            int("n_head", dims.n_head)?,
            int("head_dim", dims.head_dim)?,
        ],
    )?];
    for (name, work_heads) in [
        (attention_name(DKDV_NAMES, heads, kernel), dims.kv_heads),
        (attention_name(DQ_NAMES, heads, kernel), dims.n_head),
    ] {
        let mut params = vec![
            model("dqkv", dims.qkv_len()).written(),
            model("dout", dims.out_len()),
            model("qkv", dims.qkv_len()),
            f32s("lse", dims.stats_len()),
            f32s("delta", dims.stats_len()),
        ];
        params.extend(dims.head_params(heads)?);
        calls.push(KernelCall::new(
            name,
            attention_entry(name, dtype, dims.head_dim),
            dims.work(work_heads),
            params,
        )?);
    }
    Ok(calls)
}

/// `fused_classifier`: logits `(rows, vocab)` with rows `stride` elements apart to
/// `dloss * (softmax - onehot)` in place, the losses `(rows)`; `targets` holds -1 for rows
/// without a target. The `stride - vocab` padding columns are not touched.
pub fn fused_classifier(
    dtype: Dtype,
    rows: usize,
    vocab: usize,
    stride: usize,
) -> Result<KernelCall, CudaError> {
    if stride < vocab {
        return Err(shape_error(format!(
            "logits: rows {stride} apart cannot hold {vocab} columns"
        )));
    }
    KernelCall::typed(
        "fused_classifier",
        dtype,
        self::rows(rows, vocab),
        vec![
            model("logits", strided_len(rows, vocab, stride)).written(),
            f32s("losses", rows).written(),
            buf("targets", Element::I32, rows),
            run("dloss", RunValue::Dloss),
            int("rows", rows)?,
            int("vocab", vocab)?,
            int("stride", stride)?,
        ],
    )
}

/// `unscale_norm_partials` over `n` gradients then `sum_partials`: `grads *= inv_scale`, the
/// sum of squares into `out[0]` (f64), `found_inf[0]` set on inf/NaN.
pub fn unscale_and_norm(dtype: Dtype, n: usize) -> Result<Vec<KernelCall>, CudaError> {
    let blocks = dims_of("unscale_norm_partials", elements(n))?.grid.0 as usize;
    let partials = KernelCall::typed(
        "unscale_norm_partials",
        dtype,
        elements(n),
        vec![
            model("grads", n).written(),
            long("n", n),
            run("inv_scale", RunValue::InvScale),
            buf("partials", Element::F64, blocks).written(),
            buf("found_inf", Element::I32, 1).written(),
        ],
    )?;
    let sum = KernelCall::new(
        "sum_partials",
        "sum_partials_f64".to_string(),
        elements(blocks),
        vec![
            buf("out", Element::F64, 1).written().bound("total", 0, 0),
            buf("partials", Element::F64, blocks),
            int("count", blocks)?,
        ],
    )?;
    Ok(vec![partials, sum])
}

/// `adamw`: one step over `n` parameters in `segments` segments; `params_out` (the 16-bit
/// copy) may be null in f32 training.
pub fn adamw(dtype: Dtype, n: usize, segments: usize) -> Result<KernelCall, CudaError> {
    KernelCall::typed(
        "adamw",
        dtype,
        Work::Segments(segments as u64),
        vec![
            f32s("master", n).written(),
            at("params_out", Element::Model, Fit::ExactOrNull(n)).written(),
            model("grads", n),
            f32s("exp_avg", n).written(),
            f32s("exp_avg_sq", n).written(),
            buf("segments", Element::AdamSegment, segments),
            run("s", RunValue::AdamScalars),
        ],
    )
}
