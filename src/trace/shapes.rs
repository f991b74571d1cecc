//! What an operator of a trace computes, so that a pass can re-cost the kernels it launched:
//! [`OpWork`] (class, FLOPs, elements moved, GEMM shapes) from the `Input Dims` / `Input type`
//! a `record_shapes=True` trace writes on every operator, and a class from the kernel's name when
//! there are no shapes.
//!
//! **From shapes** ([`op_work`]): one rule per ATen operator family, by its name without the
//! `aten::` prefix (a table, not one big `match`):
//!
//! | operator | class | FLOPs | elements (act + weight) |
//! |---|---|---|---|
//! | `mm(a[M,K], b[K,N])`, `addmm(c, a, b)`, `linear(x[…,K], w[N,K], b)`, `matmul` | GEMM | 2·M·N·K | a, b, c read, M·N written |
//! | `bmm(a[B,M,K], b[B,K,N])`, `baddbmm` | GEMM, count B | 2·B·M·N·K | all three |
//! | convolution forward (`convolution`, `_convolution`, `cudnn_convolution`, `miopen_convolution`, …) | Conv | 2·N·Co·Ho·Wo·(Ci/g)·kh·kw | x, w, y |
//! | convolution backward input / weight (cuDNN/MIOpen names, or `convolution_backward`) | Conv | the same per product | dy, w, dx / dy, x, dw |
//! | scaled-dot-product / flash / efficient attention, forward and backward | Attention | 4·B·H·S·Sk·D, ×2.5 backward | q, k, v, o (and their gradients) |
//! | batch / layer / group norm, forward and backward | Norm | 8 / 10 per element | 3 / 5 passes over the activation |
//! | softmax, log-softmax and their backward | Softmax | 5 per element | 3 passes |
//! | embedding, embedding bag and their backward | Embedding | — | the rows gathered (indices × dim) |
//! | pooling (max / avg / adaptive) and backward | Pool | ~window per output | input + output |
//! | element-wise (add, mul, relu, gelu, dropout, threshold_backward, copy_, fill_, …) | Elementwise / Copy | 1 per element | inputs + output |
//! | optimizer `_foreach_*` and fused optimizer ops, `addcdiv_`-style updates in the step | Optimizer | ~4 per element | every list's tensors |
//!
//! A rule reads what it needs and returns `None` when the shapes do not fit (a scalar where a
//! tensor was expected, a rank it does not know): the kernel then falls back to its name's
//! class. Elements are split into activations (they grow with the batch: what gradient
//! accumulation shrinks) and weights (they do not): weights are the parameter operand of
//! matrix ops, everything an UPDATE-phase op touches, and gradient accumulation (`AccumulateGrad`).
//!
//! A convolution's output size needs its stride and padding, which old traces do not record
//! (`Input Dims` has `[]` for int lists): it comes from `Concrete Inputs` when present, else
//! from the operator's backward (the same autograd sequence number: its first input is the
//! gradient of the output), else the convolution is taken as stride 1, "same" padding (the
//! caller marks the work approximate).
//!
//! **From kernel names** ([`kernel_class`], [`class_work`]): `gemm`/`cutlass`/`Cijk_` → GEMM,
//! `conv`/`dgrad`/`wgrad`/`implicit` → Conv, `flash`/`fmha` → Attention, `norm`/`bn_` → Norm,
//! `softmax` → Softmax, `embedding`/`index_select` → Embedding, `multi_tensor`/`adam`/`sgd` →
//! Optimizer, `reduce` → Reduction, `pool` → Pool, everything else element-wise. Without shapes
//! the size is unknown, so the work is *sized to the recorded time*: the smallest work of the
//! class (a square GEMM; `n` elements read and written) whose modelled time reaches the
//! recorded one. A pass then re-costs it at that operating point; the uncertainty is wider
//! (the same time could be a smaller, less efficient kernel), which `whatif` states.
//!
//! Re-costing itself is not here: a pass calls [`crate::graph::job::Job::recost_ns`], which
//! keeps the recorded time's efficiency (`recorded × model(new) / model(old)`).

use crate::cost::config::Dtype;
use crate::cost::kernel::{BatchDim, Gemm, OpClass, OpWork};
use crate::graph::Phase;
use crate::graph::job::Job;

/// One operator input as recorded: a tensor's dims, a list of tensors' dims, or anything else
/// (a scalar, an int list whose values are not recorded, `None`).
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Tensor(Vec<i64>),
    List(Vec<Vec<i64>>),
    Other,
}

impl Input {
    /// Dims of a tensor input (a 0-d tensor is `[]`, which reads as `Other`).
    pub fn dims(&self) -> Option<&[i64]> {
        match self {
            Input::Tensor(d) => Some(d),
            _ => None,
        }
    }
    /// Elements of a tensor, or of every tensor of a list.
    pub fn elems(&self) -> f64 {
        match self {
            Input::Tensor(d) => numel(d),
            Input::List(l) => l.iter().map(|d| numel(d)).sum(),
            Input::Other => 0.0,
        }
    }
}

/// Product of dims (negative dims, which no real tensor has, count as 0).
pub fn numel(d: &[i64]) -> f64 {
    d.iter().map(|&x| x.max(0) as f64).product()
}

/// Parse `Input Dims` JSON text (`[[32, 3, 224, 224], [64, 3, 7, 7], [], []]`; a tensor list is
/// a list of dims lists). `None` when the text is not such a list.
pub fn parse_dims(text: &str) -> Option<Vec<Input>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let arr = v.as_array()?;
    let ints = |a: &[serde_json::Value]| -> Option<Vec<i64>> {
        a.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>()
    };
    Some(
        arr.iter()
            .map(|x| match x.as_array() {
                Some(a) if a.is_empty() => Input::Other,
                Some(a) if a.iter().all(|y| y.is_i64() || y.is_u64()) => {
                    ints(a).map_or(Input::Other, Input::Tensor)
                }
                Some(a) if a.iter().all(|y| y.is_array()) => Input::List(
                    a.iter()
                        .filter_map(|y| y.as_array().and_then(|b| ints(b)))
                        .collect(),
                ),
                _ => Input::Other,
            })
            .collect(),
    )
}

/// Parse `Input type` JSON text (`["float", "c10::Half", "", "Scalar"]`).
pub fn parse_types(text: &str) -> Vec<String> {
    serde_json::from_str::<Vec<serde_json::Value>>(text)
        .map(|v| {
            v.into_iter()
                .map(|x| x.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The floating-point storage dtype an `Input type` names (`float`, `c10::Half`, `c10::BFloat16`,
/// `double`); `None` for integers, lists, scalars and unknown names.
pub fn float_dtype(t: &str) -> Option<Dtype> {
    let t = t.trim().to_ascii_lowercase();
    let t = t.strip_prefix("c10::").unwrap_or(&t);
    match t {
        "float" | "float32" => Some(Dtype::Fp32),
        "half" | "float16" => Some(Dtype::Fp16),
        "bfloat16" => Some(Dtype::Bf16),
        "double" | "float64" => Some(Dtype::Fp64),
        _ if t.starts_with("float8") => Some(Dtype::Fp8),
        _ => None,
    }
}

/// What a rule knows besides the operator's own inputs.
#[derive(Clone, Debug, Default)]
pub struct OpContext {
    pub phase: Option<Phase>,
    /// Output dims when known from elsewhere (for a forward convolution: the first input of its
    /// backward, the gradient of its output).
    pub output: Option<Vec<i64>>,
    /// For a backward operator: the input and weight dims of its forward (same autograd
    /// sequence number), which backward ops record only as unvalued int lists.
    pub fw_input: Option<Vec<i64>>,
    pub fw_weight: Option<Vec<i64>>,
    /// `Concrete Inputs` values as text (`"[2, 2]"`, `"1"`), one per input, when recorded.
    pub concrete: Vec<String>,
    /// Leading sizes of the step's forward activations (the batch, tokens): which operand of a
    /// backward GEMM carries the batch.
    pub batch_like: Vec<i64>,
    /// The operator runs under `AccumulateGrad` (a weight-sized gradient).
    pub weight_grad: bool,
}

impl OpContext {
    fn update(&self) -> bool {
        self.phase == Some(Phase::Update) || self.weight_grad
    }
}

/// Work of an operator from its shapes, and whether it is approximate (a convolution whose
/// stride was assumed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShapedWork {
    pub work: OpWork,
    pub approximate: bool,
}

type Rule = fn(&[Input], &OpContext) -> Option<ShapedWork>;

/// Operator name (without `aten::`) → rule. Looked up by exact name.
const RULES: &[(&str, Rule)] = &[
    ("mm", mm),
    ("addmm", addmm),
    ("linear", linear),
    ("matmul", matmul),
    ("bmm", bmm),
    ("baddbmm", baddbmm),
    ("convolution", conv_fw),
    ("_convolution", conv_fw),
    ("conv1d", conv_fw),
    ("conv2d", conv_fw),
    ("conv3d", conv_fw),
    ("cudnn_convolution", conv_fw),
    ("miopen_convolution", conv_fw),
    ("mkldnn_convolution", conv_fw),
    ("convolution_overrideable", conv_fw),
    ("_convolution_mode", conv_fw),
    ("cudnn_convolution_backward_input", conv_bw_input),
    ("miopen_convolution_backward_input", conv_bw_input),
    ("cudnn_convolution_backward_weight", conv_bw_weight),
    ("miopen_convolution_backward_weight", conv_bw_weight),
    ("convolution_backward", conv_bw_both),
    ("convolution_backward_overrideable", conv_bw_both),
    ("scaled_dot_product_attention", attention_fw),
    ("_scaled_dot_product_flash_attention", attention_fw),
    ("_scaled_dot_product_efficient_attention", attention_fw),
    ("_scaled_dot_product_cudnn_attention", attention_fw),
    ("_flash_attention_forward", attention_fw),
    ("_efficient_attention_forward", attention_fw),
    ("_scaled_dot_product_flash_attention_backward", attention_bw),
    (
        "_scaled_dot_product_efficient_attention_backward",
        attention_bw,
    ),
    ("_scaled_dot_product_cudnn_attention_backward", attention_bw),
    ("_flash_attention_backward", attention_bw),
    ("_efficient_attention_backward", attention_bw),
    ("batch_norm", norm_fw),
    ("_batch_norm_impl_index", norm_fw),
    ("native_batch_norm", norm_fw),
    ("cudnn_batch_norm", norm_fw),
    ("miopen_batch_norm", norm_fw),
    ("_native_batch_norm_legit", norm_fw),
    ("_native_batch_norm_legit_functional", norm_fw),
    ("layer_norm", norm_fw),
    ("native_layer_norm", norm_fw),
    ("group_norm", norm_fw),
    ("native_group_norm", norm_fw),
    ("rms_norm", norm_fw),
    ("_fused_rms_norm", norm_fw),
    ("native_batch_norm_backward", norm_bw),
    ("cudnn_batch_norm_backward", norm_bw),
    ("miopen_batch_norm_backward", norm_bw),
    ("batch_norm_backward", norm_bw),
    ("native_layer_norm_backward", norm_bw),
    ("native_group_norm_backward", norm_bw),
    ("softmax", softmax_fw),
    ("_softmax", softmax_fw),
    ("log_softmax", softmax_fw),
    ("_log_softmax", softmax_fw),
    ("_softmax_backward_data", softmax_bw),
    ("_log_softmax_backward_data", softmax_bw),
    ("embedding", embedding),
    ("embedding_bag", embedding_bag),
    ("_embedding_bag", embedding_bag),
    ("_embedding_bag_forward_only", embedding_bag),
    ("embedding_dense_backward", embedding_bw),
    ("embedding_backward", embedding_bw),
    ("_embedding_bag_backward", embedding_bag_bw),
    ("_embedding_bag_dense_backward", embedding_bag_bw),
    ("index_select", embedding_like_index),
    ("max_pool2d_with_indices", pool_fw),
    ("max_pool2d", pool_fw),
    ("max_pool3d_with_indices", pool_fw),
    ("avg_pool2d", pool_fw),
    ("adaptive_avg_pool2d", pool_fw),
    ("_adaptive_avg_pool2d", pool_fw),
    ("adaptive_max_pool2d", pool_fw),
    ("max_pool2d_with_indices_backward", pool_bw),
    ("avg_pool2d_backward", pool_bw),
    ("_adaptive_avg_pool2d_backward", pool_bw),
    ("adaptive_max_pool2d_backward", pool_bw),
    ("copy_", copy),
    ("_to_copy", copy),
    ("clone", copy),
    ("contiguous", copy),
    ("cat", cat),
    ("stack", cat),
    ("fill_", fill),
    ("zero_", fill),
    ("ones_like", fill),
    ("zeros_like", fill),
    ("sum", reduction),
    ("mean", reduction),
    ("norm", reduction),
    ("linalg_vector_norm", reduction),
    ("nll_loss_forward", reduction),
    ("nll_loss2d_forward", reduction),
    ("mse_loss", reduction),
    ("binary_cross_entropy_with_logits", reduction),
];

/// Element-wise operators: one FLOP per output element (more for transcendental ones is within
/// the noise of a memory-bound kernel).
const ELEMENTWISE: &[&str] = &[
    "add",
    "add_",
    "sub",
    "sub_",
    "mul",
    "mul_",
    "div",
    "div_",
    "neg",
    "exp",
    "exp_",
    "log",
    "log_",
    "sqrt",
    "rsqrt",
    "pow",
    "pow_",
    "relu",
    "relu_",
    "clamp",
    "clamp_",
    "clamp_min",
    "clamp_min_",
    "clamp_max",
    "threshold",
    "threshold_",
    "threshold_backward",
    "gelu",
    "gelu_backward",
    "silu",
    "silu_",
    "silu_backward",
    "sigmoid",
    "sigmoid_",
    "sigmoid_backward",
    "tanh",
    "tanh_",
    "tanh_backward",
    "hardtanh",
    "hardtanh_",
    "hardtanh_backward",
    "leaky_relu",
    "leaky_relu_",
    "leaky_relu_backward",
    "dropout",
    "native_dropout",
    "native_dropout_backward",
    "where",
    "masked_fill",
    "masked_fill_",
    "addcmul",
    "addcmul_",
    "addcdiv",
    "addcdiv_",
    "lerp",
    "lerp_",
    "mse_loss_backward",
    "nll_loss_backward",
    "binary_cross_entropy_with_logits_backward",
    "abs",
    "sign",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "gt",
    "lt",
    "ge",
    "le",
];

/// Work of an operator from its name (`aten::addmm`) and recorded inputs.
pub fn op_work(name: &str, inputs: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let short = name.strip_prefix("aten::").unwrap_or(name);
    if let Some((_, rule)) = RULES.iter().find(|(n, _)| *n == short) {
        return rule(inputs, cx);
    }
    if short.starts_with("_foreach_") || short.starts_with("_fused_") {
        return optimizer(inputs, cx);
    }
    if ELEMENTWISE.contains(&short) {
        return elementwise(inputs, cx);
    }
    None
}

/// Whether an operator name has a rule (so that a caller can prefer the innermost operator with
/// one).
pub fn has_rule(name: &str) -> bool {
    let short = name.strip_prefix("aten::").unwrap_or(name);
    RULES.iter().any(|(n, _)| *n == short)
        || short.starts_with("_foreach_")
        || short.starts_with("_fused_")
        || ELEMENTWISE.contains(&short)
}

fn exact(work: OpWork) -> Option<ShapedWork> {
    Some(ShapedWork {
        work,
        approximate: false,
    })
}

fn tensor(inputs: &[Input], i: usize) -> Option<&[i64]> {
    inputs.get(i)?.dims()
}

/// A GEMM's work: `count` products of (M×K)·(K×N), `act`/`weight` elements.
fn gemm_work(g: Gemm, act: f64, weight: f64) -> OpWork {
    let mut w = OpWork::new(OpClass::Gemm, g.flops(), act, weight, 1);
    w.gemms[0] = g;
    w
}

/// Which dimension of an (M×K)·(K×N) product carries the batch: forward products carry it in
/// M; a backward product carries it in M (data gradient) or K (weight gradient) — whichever
/// equals a forward activation's leading size.
fn gemm_batch_dim(m: i64, k: i64, cx: &OpContext) -> BatchDim {
    if cx.update() {
        return BatchDim::None;
    }
    if cx.phase == Some(Phase::Bw) {
        if cx.batch_like.contains(&m) {
            return BatchDim::M;
        }
        if cx.batch_like.contains(&k) {
            return BatchDim::K;
        }
        return BatchDim::None;
    }
    BatchDim::M
}

/// The elements of a product split by which operands grow with the batch.
fn gemm_elems(m: f64, n: f64, k: f64, batch: BatchDim) -> (f64, f64) {
    let (a, b, c) = (m * k, k * n, m * n);
    match batch {
        // x(M×K) · w(K×N) = y(M×N): w is the weight.
        BatchDim::M => (a + c, b),
        // xᵀ(K×M)… the reduction carries the batch: both inputs are activations, the output is
        // weight-sized (a weight gradient).
        BatchDim::K => (a + b, c),
        BatchDim::Count => (a + b + c, 0.0),
        BatchDim::None => (0.0, a + b + c),
    }
}

fn mm2(a: &[i64], b: &[i64], cx: &OpContext, extra_out: f64) -> Option<ShapedWork> {
    let ([m, k], [k2, n]) = (a, b) else {
        return None;
    };
    if k != k2 {
        return None;
    }
    let bd = gemm_batch_dim(*m, *k, cx);
    let (mf, nf, kf) = (*m as f64, *n as f64, *k as f64);
    let (act, weight) = gemm_elems(mf, nf, kf, bd);
    exact(gemm_work(
        Gemm::new(mf, nf, kf, 1.0, bd),
        act + extra_out,
        weight,
    ))
}

fn mm(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    mm2(tensor(i, 0)?, tensor(i, 1)?, cx, 0.0)
}

fn addmm(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let bias = i.first().map_or(0.0, Input::elems);
    mm2(tensor(i, 1)?, tensor(i, 2)?, cx, bias)
}

/// `linear(x[…, K], w[N, K], b[N])`: M = the product of x's leading dims.
fn linear(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let x = tensor(i, 0)?;
    let w = tensor(i, 1)?;
    let (&k, lead) = x.split_last()?;
    let [n, k2] = w else { return None };
    if k != *k2 {
        return None;
    }
    let m = numel(lead).max(1.0);
    let bias = i.get(2).map_or(0.0, Input::elems);
    let bd = if cx.update() {
        BatchDim::None
    } else {
        BatchDim::M
    };
    let (act, weight) = gemm_elems(m, *n as f64, k as f64, bd);
    exact(gemm_work(
        Gemm::new(m, *n as f64, k as f64, 1.0, bd),
        act,
        weight + bias,
    ))
}

/// `matmul`: 2-D × 2-D is `mm`, N-D × 2-D folds the leading dims into M, batched otherwise.
fn matmul(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let a = tensor(i, 0)?;
    let b = tensor(i, 1)?;
    match (a.len(), b.len()) {
        (2, 2) => mm2(a, b, cx, 0.0),
        (r, 2) if r > 2 => {
            let (&k, lead) = a.split_last()?;
            mm2(&[numel(lead) as i64, k], b, cx, 0.0)
        }
        (ra, rb) if ra >= 3 && rb >= 3 => {
            let (m, k) = (a[ra - 2], a[ra - 1]);
            let (k2, n) = (b[rb - 2], b[rb - 1]);
            if k != k2 {
                return None;
            }
            let count = numel(&a[..ra - 2]).max(numel(&b[..rb - 2]));
            batched(count, m as f64, n as f64, k as f64, 0.0)
        }
        _ => None,
    }
}

fn batched(count: f64, m: f64, n: f64, k: f64, extra: f64) -> Option<ShapedWork> {
    let g = Gemm::new(m, n, k, count, BatchDim::Count);
    exact(gemm_work(g, count * (m * k + k * n + m * n) + extra, 0.0))
}

fn bmm(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let ([b, m, k], [b2, k2, n]) = (tensor(i, 0)?, tensor(i, 1)?) else {
        return None;
    };
    if b != b2 || k != k2 {
        return None;
    }
    batched(*b as f64, *m as f64, *n as f64, *k as f64, 0.0)
}

fn baddbmm(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let ([b, m, k], [b2, k2, n]) = (tensor(i, 1)?, tensor(i, 2)?) else {
        return None;
    };
    if b != b2 || k != k2 {
        return None;
    }
    let c = i.first().map_or(0.0, Input::elems);
    batched(*b as f64, *m as f64, *n as f64, *k as f64, c)
}

/// One convolution's products: x[N, Ci, spatial…], w[Co, Ci/g, k…], y[N, Co, out…].
struct Conv {
    n: f64,
    ci: f64,
    co: f64,
    /// Ci/g · kh · kw (the reduction per output element).
    red: f64,
    in_spatial: f64,
    out_spatial: f64,
    approximate: bool,
    /// One input channel per group and as many outputs as inputs (`groups == Ci == Co`): a
    /// depthwise conv, priced as a stencil (`OpClass::DepthwiseConv`), not as products.
    depthwise: bool,
}

impl Conv {
    /// From input and weight dims, with the output dims when known (else stride 1, "same").
    fn new(x: &[i64], w: &[i64], out: Option<&[i64]>, concrete: &[String]) -> Option<Conv> {
        if x.len() < 3 || w.len() != x.len() {
            return None;
        }
        let n = x[0] as f64;
        let ci = x[1] as f64;
        let co = w[0] as f64;
        let red = numel(&w[1..]);
        let in_spatial = numel(&x[2..]);
        if n <= 0.0 || co <= 0.0 || red <= 0.0 {
            return None;
        }
        let (out_spatial, approximate) = match out {
            Some(o) if o.len() == x.len() && o[1] as f64 == co => (numel(&o[2..]), false),
            _ => match spatial_from_concrete(x, w, concrete) {
                Some(s) => (s, false),
                None => (in_spatial, true),
            },
        };
        Some(Conv {
            depthwise: w[1] == 1 && ci == co && ci > 1.0,
            n,
            ci,
            co,
            red,
            in_spatial,
            out_spatial,
            approximate,
        })
    }
    /// The implicit GEMM of the forward: M = N·out, N = Co, K = Ci/g·k.
    fn gemm(&self) -> Gemm {
        Gemm::new(
            self.n * self.out_spatial,
            self.co,
            self.red,
            1.0,
            BatchDim::M,
        )
    }
    fn class(&self) -> OpClass {
        if self.depthwise {
            OpClass::DepthwiseConv
        } else {
            OpClass::Conv
        }
    }
    fn x(&self) -> f64 {
        self.n * self.ci * self.in_spatial
    }
    fn y(&self) -> f64 {
        self.n * self.co * self.out_spatial
    }
    fn w(&self) -> f64 {
        self.co * self.red
    }
    fn work(&self, g: Gemm, act: f64, weight: f64) -> Option<ShapedWork> {
        let mut w = OpWork::new(self.class(), g.flops(), act, weight, 1);
        if !self.depthwise {
            w.gemms[0] = g;
        }
        Some(ShapedWork {
            work: w,
            approximate: self.approximate,
        })
    }
}

/// Output spatial size from `Concrete Inputs` (stride, padding, dilation as written: inputs 3,
/// 4, 5 of `convolution`-style ops).
fn spatial_from_concrete(x: &[i64], w: &[i64], concrete: &[String]) -> Option<f64> {
    let list = |i: usize| -> Option<Vec<i64>> {
        let t = concrete.get(i)?;
        let v: Vec<i64> = serde_json::from_str(t).ok()?;
        Some(v)
    };
    let (stride, padding, dilation) = (list(3)?, list(4)?, list(5)?);
    let dims = x.len() - 2;
    let pick = |v: &[i64], d: usize| v.get(d).or(v.first()).copied().unwrap_or(1);
    let mut out = 1.0;
    for d in 0..dims {
        let (i, k) = (x[2 + d], w[2 + d]);
        let (s, p, dl) = (pick(&stride, d), pick(&padding, d), pick(&dilation, d));
        if s <= 0 {
            return None;
        }
        let o = (i + 2 * p - dl * (k - 1) - 1) / s + 1;
        if o <= 0 {
            return None;
        }
        out *= o as f64;
    }
    Some(out)
}

fn conv_fw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let c = Conv::new(
        tensor(i, 0)?,
        tensor(i, 1)?,
        cx.output.as_deref(),
        &cx.concrete,
    )?;
    let bias = i.get(2).map_or(0.0, Input::elems);
    c.work(c.gemm(), c.x() + c.y(), c.w() + bias)
}

/// The data-gradient product of a convolution: dx(N·in × Ci) from dy and w, the same FLOPs.
fn conv_bw_input(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    // (input_size, grad_output, weight, …): grad_output's dims are the output's.
    let dy = tensor(i, 1)?;
    let w = tensor(i, 2)?;
    let x = input_like(dy, w, cx)?;
    let c = Conv::new(&x, w, Some(dy), &[])?;
    let f = c.gemm();
    c.work(
        Gemm::new(f.m, f.k, f.n, 1.0, BatchDim::M),
        c.x() + c.y(),
        c.w(),
    )
}

/// The weight-gradient product: dw(Co × Ci/g·k) with the batch in the reduction.
fn conv_bw_weight(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    // (weight_size, grad_output, input, …): the weight's own dims come from the forward.
    let dy = tensor(i, 1)?;
    let x = tensor(i, 2)?;
    let w = cx.fw_weight.as_deref()?;
    let c = Conv::new(x, w, Some(dy), &[])?;
    let f = c.gemm();
    c.work(
        Gemm::new(f.n, f.k, f.m, 1.0, BatchDim::K),
        c.x() + c.y(),
        c.w(),
    )
}

/// `convolution_backward(grad_output, input, weight, …)`: both products in one op.
fn conv_bw_both(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let dy = tensor(i, 0)?;
    let x = tensor(i, 1)?;
    let w = tensor(i, 2)?;
    let c = Conv::new(x, w, Some(dy), &[])?;
    let f = c.gemm();
    let [dgrad, wgrad] = f.backward();
    let mut w_ = OpWork::new(
        c.class(),
        dgrad.flops() + wgrad.flops(),
        2.0 * (c.x() + c.y()),
        2.0 * c.w(),
        1,
    );
    if !c.depthwise {
        w_.gemms = [dgrad, wgrad];
    }
    Some(ShapedWork {
        work: w_,
        approximate: false,
    })
}

/// The forward input of a data-gradient product, from its output gradient and the weight
/// (stride 1 unless the caller knows the input from elsewhere).
fn input_like(dy: &[i64], w: &[i64], cx: &OpContext) -> Option<Vec<i64>> {
    if let Some(x) = &cx.fw_input
        && x.len() == dy.len()
    {
        return Some(x.clone());
    }
    let mut x = dy.to_vec();
    *x.get_mut(1)? = *w.get(1)?;
    Some(x)
}

/// Attention forward: q[B, H, S, D], k[B, H, Sk, D], v[B, H, Sk, Dv].
fn attention_dims(i: &[Input]) -> Option<(f64, f64, f64, f64, f64)> {
    let q = tensor(i, 0)?;
    let k = tensor(i, 1)?;
    if q.len() != 4 || k.len() != 4 {
        return None;
    }
    Some((
        (q[0] * q[1]) as f64,
        q[2] as f64,
        k[2] as f64,
        q[3] as f64,
        numel(q) + 2.0 * numel(k),
    ))
}

fn attention_fw(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let (bh, s, sk, d, qkv) = attention_dims(i)?;
    let mut w = OpWork::new(
        OpClass::Attention,
        4.0 * bh * s * sk * d,
        qkv + bh * s * d,
        0.0,
        1,
    );
    w.gemms = [
        Gemm::new(s, sk, d, bh, BatchDim::Count),
        Gemm::new(s, d, sk, bh, BatchDim::Count),
    ];
    exact(w)
}

fn attention_bw(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    // (grad_out, q, k, v, out, …)
    let (bh, s, sk, d, qkv) = attention_dims(&i[1.min(i.len())..])?;
    let mut w = OpWork::new(
        OpClass::Attention,
        10.0 * bh * s * sk * d,
        2.0 * (qkv + bh * s * d),
        0.0,
        1,
    );
    w.gemms = [
        Gemm::new(s, sk, d, 2.0 * bh, BatchDim::Count),
        Gemm::new(s, d, sk, 3.0 * bh, BatchDim::Count),
    ];
    exact(w)
}

/// Elements of the largest tensor among the inputs (the activation a vector op streams).
fn largest(i: &[Input]) -> f64 {
    i.iter().map(Input::elems).fold(0.0, f64::max)
}

fn vector(class: OpClass, flops_per: f64, passes: f64, n: f64, cx: &OpContext) -> OpWork {
    if cx.update() {
        OpWork::new(class, flops_per * n, 0.0, passes * n, 1)
    } else {
        OpWork::new(class, flops_per * n, passes * n, 0.0, 1)
    }
}

fn positive(w: OpWork) -> Option<ShapedWork> {
    (w.act_elems + w.weight_elems > 0.0).then_some(ShapedWork {
        work: w,
        approximate: false,
    })
}

fn norm_fw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let x = tensor(i, 0)?;
    let params: f64 = i[1..].iter().map(Input::elems).sum();
    let mut w = vector(OpClass::Norm, 8.0, 3.0, numel(x), cx);
    w.weight_elems += params;
    positive(w)
}

fn norm_bw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let n = largest(i);
    positive(vector(OpClass::Norm, 10.0, 5.0, n, cx))
}

fn softmax_fw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    positive(vector(OpClass::Softmax, 5.0, 3.0, numel(tensor(i, 0)?), cx))
}

fn softmax_bw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    positive(vector(OpClass::Softmax, 5.0, 3.0, largest(i), cx))
}

/// `embedding(weight[V, D], indices[…])`: the rows gathered, written out.
fn embedding(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let w = tensor(i, 0)?;
    let idx = i.get(1)?.elems();
    let d = *w.last()? as f64;
    positive(OpWork::new(
        OpClass::Embedding,
        0.0,
        2.0 * idx * d + idx,
        0.0,
        1,
    ))
}

/// `embedding_bag(weight[V, D], indices[L], offsets[B], …)`.
fn embedding_bag(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let w = tensor(i, 0)?;
    let idx = i.get(1)?.elems();
    let bags = i.get(2).map_or(0.0, Input::elems);
    let d = *w.last()? as f64;
    positive(OpWork::new(
        OpClass::Embedding,
        idx * d,
        idx * d + idx + bags * d,
        0.0,
        1,
    ))
}

/// `embedding_dense_backward(grad[…, D], indices, num_weights, …)`: scatter-add of the rows.
fn embedding_bw(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let g = tensor(i, 0)?;
    let n = numel(g);
    let idx = i.get(1).map_or(0.0, Input::elems);
    positive(OpWork::new(OpClass::Embedding, n, 2.0 * n + idx, 0.0, 1))
}

fn embedding_bag_bw(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let g = tensor(i, 0)?;
    let idx = i.get(1).map_or(0.0, Input::elems);
    let d = *g.last()? as f64;
    positive(OpWork::new(
        OpClass::Embedding,
        idx * d,
        numel(g) + 2.0 * idx * d + idx,
        0.0,
        1,
    ))
}

/// `index_select(self[V, D], dim, index[L])`: a gather of L rows.
fn embedding_like_index(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let s = tensor(i, 0)?;
    let idx = i.get(2)?.elems();
    let row = numel(s.get(1..).unwrap_or(&[]));
    positive(OpWork::new(
        OpClass::Embedding,
        0.0,
        2.0 * idx * row + idx,
        0.0,
        1,
    ))
}

/// Pooling: every input element read once, the output written (a 2×2/3×3 window reduces the
/// output 4×; an adaptive pool to 1×1 almost entirely).
fn pool_fw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let n = numel(tensor(i, 0)?);
    positive(vector(OpClass::Pool, 2.0, 1.25, n, cx))
}

fn pool_bw(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    positive(vector(OpClass::Pool, 1.0, 2.25, largest(i), cx))
}

fn copy(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    positive(vector(OpClass::Copy, 0.0, 2.0, largest(i), cx))
}

fn cat(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let n: f64 = i.iter().map(Input::elems).sum();
    positive(vector(OpClass::Copy, 0.0, 2.0, n, cx))
}

fn fill(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    positive(vector(
        OpClass::Elementwise,
        0.0,
        1.0,
        numel(tensor(i, 0)?),
        cx,
    ))
}

fn reduction(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let n: f64 = i
        .iter()
        .filter_map(Input::dims)
        .map(numel)
        .fold(0.0, f64::max);
    positive(vector(OpClass::Reduction, 1.0, 1.0, n, cx))
}

/// Element-wise: the largest operand's elements, each operand read once and the output
/// written.
fn elementwise(i: &[Input], cx: &OpContext) -> Option<ShapedWork> {
    let n = largest(i);
    let moved: f64 = i.iter().map(Input::elems).sum::<f64>() + n;
    let mut w = vector(OpClass::Elementwise, 1.0, 1.0, n, cx);
    if cx.update() {
        w.weight_elems = moved;
    } else {
        w.act_elems = moved;
    }
    positive(w)
}

/// Optimizer `_foreach_*` / `_fused_*` ops: every tensor of every list read, the first list
/// written.
fn optimizer(i: &[Input], _cx: &OpContext) -> Option<ShapedWork> {
    let lists: Vec<f64> = i.iter().map(Input::elems).filter(|&n| n > 0.0).collect();
    let first = *lists.first()?;
    let moved: f64 = lists.iter().sum::<f64>() + first;
    positive(OpWork::new(OpClass::Optimizer, 4.0 * first, 0.0, moved, 1))
}

/// The class a kernel's name suggests (`None` for names that say nothing: the caller treats
/// them as element-wise only when it has to).
pub fn kernel_class(name: &str) -> OpClass {
    let n = name.to_ascii_lowercase();
    let has = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
    if has(&["flash", "fmha", "attention", "attn"]) {
        OpClass::Attention
    } else if has(&[
        "conv",
        "dgrad",
        "wgrad",
        "implicit_gemm",
        "winograd",
        "implicit_convolve",
        "fprop",
        "bprop",
        "igemm",
        "naive_conv",
    ]) {
        OpClass::Conv
    } else if has(&[
        "gemm", "cutlass", "cublas", "cijk_", "matmul", "_nn_", "_tn_", "_nt_",
    ]) {
        OpClass::Gemm
    } else if has(&[
        "batch_norm",
        "batchnorm",
        "bn_fw",
        "bn_bw",
        "layer_norm",
        "layernorm",
        "group_norm",
        "rms_norm",
        "welford",
    ]) {
        OpClass::Norm
    } else if has(&["softmax"]) {
        OpClass::Softmax
    } else if has(&[
        "embedding",
        "index_select",
        "indexselect",
        "gather",
        "lookup",
    ]) {
        OpClass::Embedding
    } else if has(&["multi_tensor", "adam", "sgd", "lamb", "adagrad", "foreach"]) {
        OpClass::Optimizer
    } else if has(&["pool"]) {
        OpClass::Pool
    } else if has(&["reduce", "reduction", "sum_kernel", "norm_kernel"]) {
        OpClass::Reduction
    } else if has(&["memcpy", "copy"]) {
        OpClass::Copy
    } else {
        OpClass::Elementwise
    }
}

/// FLOPs per element a vector class's kernel does (matrix classes are sized as GEMMs).
fn flops_per_elem(class: OpClass) -> f64 {
    match class {
        OpClass::Norm => 8.0,
        OpClass::Softmax => 5.0,
        OpClass::Optimizer => 4.0,
        OpClass::Pool => 2.0,
        OpClass::Elementwise | OpClass::Reduction => 1.0,
        _ => 0.0,
    }
}

/// Work of class `class` at size `s`: a square product of side `s` for matrix classes, `s`
/// elements read and written for the others.
fn class_work_at(class: OpClass, s: f64, update: bool) -> OpWork {
    match class {
        OpClass::Conv | OpClass::Gemm | OpClass::Attention => {
            // A square product's FLOPs and elements, without its shape: the kernel's tiles and
            // waves are unknown, so it runs at the class's large-product rate (a continuous
            // model, which the sizing below needs).
            let mut w = OpWork::new(class, 2.0 * s * s * s, 2.0 * s * s, s * s, 1);
            if update {
                w.weight_elems += w.act_elems;
                w.act_elems = 0.0;
            }
            w
        }
        _ => {
            let f = flops_per_elem(class) * s;
            if update || class == OpClass::Optimizer {
                OpWork::new(class, f, 0.0, 2.0 * s, 1)
            } else {
                OpWork::new(class, f, 2.0 * s, 0.0, 1)
            }
        }
    }
}

/// Work of class `class` sized so that `job`'s model gives it `dur_ns` (the smallest such
/// size: bisection on a monotone model). A kernel shorter than the model's smallest one (its
/// launch floor) gets the smallest work.
pub fn class_work(job: &Job, class: OpClass, dur_ns: u64, update: bool) -> OpWork {
    let t = |s: f64| {
        job.kernels()
            .time_ns(&class_work_at(class, s, update), job.dtype, job.math)
    };
    let target = dur_ns as f64;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    if t(lo) >= target {
        return class_work_at(class, 0.0, update);
    }
    while t(hi) < target && hi < 1e15 {
        lo = hi;
        hi *= 4.0;
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if t(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-6 * hi {
            break;
        }
    }
    class_work_at(class, hi, update)
}

/// `work` split over the kernels an operator launched: a kernel that took `share` of the
/// operator's recorded GPU time gets that share of its FLOPs, elements and products (the
/// products keep their shape; their count is scaled), and one launch.
pub fn share(work: &OpWork, share: f64) -> OpWork {
    OpWork {
        kernels: 1,
        ..work.times(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(t: &str) -> Vec<Input> {
        parse_dims(t).unwrap()
    }

    fn fw() -> OpContext {
        OpContext {
            phase: Some(Phase::Fw),
            ..OpContext::default()
        }
    }

    #[test]
    fn dims_and_types_parse() {
        assert_eq!(
            dims("[[32, 3, 224, 224], [], [[2, 3], [4]]]"),
            vec![
                Input::Tensor(vec![32, 3, 224, 224]),
                Input::Other,
                Input::List(vec![vec![2, 3], vec![4]])
            ]
        );
        assert!(parse_dims("{\"a\": 1}").is_none());
        assert_eq!(dims("[[0]]")[0].elems(), 0.0);
        assert_eq!(float_dtype("c10::Half"), Some(Dtype::Fp16));
        assert_eq!(float_dtype("c10::BFloat16"), Some(Dtype::Bf16));
        assert_eq!(float_dtype("float"), Some(Dtype::Fp32));
        assert_eq!(float_dtype("long int"), None);
        assert_eq!(parse_types("[\"float\", \"\", \"Scalar\"]").len(), 3);
    }

    #[test]
    fn addmm_flops_and_elements_by_hand() {
        // ResNet-50's classifier: bias[1000], x[32, 2048], w[2048, 1000].
        let w = op_work(
            "aten::addmm",
            &dims("[[1000], [32, 2048], [2048, 1000], [], []]"),
            &fw(),
        )
        .unwrap()
        .work;
        assert_eq!(w.class, OpClass::Gemm);
        assert_eq!(w.flops, 2.0 * 32.0 * 1000.0 * 2048.0);
        // x and y grow with the batch (+ the bias read), w does not.
        assert_eq!(w.act_elems, 32.0 * 2048.0 + 32.0 * 1000.0 + 1000.0);
        assert_eq!(w.weight_elems, 2048.0 * 1000.0);
        assert_eq!(
            (w.gemms[0].m, w.gemms[0].n, w.gemms[0].k),
            (32.0, 1000.0, 2048.0)
        );
        assert_eq!(w.gemms[0].batch_dim, BatchDim::M);
    }

    #[test]
    fn backward_gemms_find_the_batch_in_m_or_k() {
        let bw = OpContext {
            phase: Some(Phase::Bw),
            batch_like: vec![32],
            ..OpContext::default()
        };
        // dgrad: dy[32, 1000] · w[1000, 2048]
        let d = op_work("aten::mm", &dims("[[32, 1000], [1000, 2048]]"), &bw)
            .unwrap()
            .work;
        assert_eq!(d.gemms[0].batch_dim, BatchDim::M);
        assert_eq!(d.weight_elems, 1000.0 * 2048.0);
        // wgrad: dyᵀ[1000, 32] · x[32, 2048]: the batch is the reduction; the output is weight-sized.
        let g = op_work("aten::mm", &dims("[[1000, 32], [32, 2048]]"), &bw)
            .unwrap()
            .work;
        assert_eq!(g.gemms[0].batch_dim, BatchDim::K);
        assert_eq!(g.weight_elems, 1000.0 * 2048.0);
        assert_eq!(g.act_elems, 1000.0 * 32.0 + 32.0 * 2048.0);
        // Accumulation at batch/2 halves the wgrad's reduction.
        assert_eq!(g.scaled(0.5).gemms[0].k, 16.0);
    }

    #[test]
    fn convolution_output_from_the_backward_or_concrete_inputs() {
        // conv1 of ResNet-50: x[32, 3, 224, 224], w[64, 3, 7, 7], stride 2 → y[32, 64, 112, 112].
        let d = dims("[[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []]");
        let mut cx = fw();
        let guess = op_work("aten::cudnn_convolution", &d, &cx).unwrap();
        assert!(guess.approximate);
        assert_eq!(
            guess.work.flops,
            2.0 * 32.0 * 64.0 * 224.0 * 224.0 * 3.0 * 49.0
        );
        cx.output = Some(vec![32, 64, 112, 112]);
        let w = op_work("aten::cudnn_convolution", &d, &cx).unwrap();
        assert!(!w.approximate);
        assert_eq!(w.work.flops, 2.0 * 32.0 * 64.0 * 112.0 * 112.0 * 3.0 * 49.0);
        assert_eq!(w.work.weight_elems, 64.0 * 3.0 * 49.0);
        // The same from Concrete Inputs: stride 2, padding 3, dilation 1.
        let cx = OpContext {
            concrete: ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..fw()
        };
        let c = op_work("aten::convolution", &d, &cx).unwrap();
        assert_eq!(c.work.flops, w.work.flops);
        // Backward: data and weight gradients have the forward's FLOPs each.
        let bw = OpContext {
            phase: Some(Phase::Bw),
            fw_weight: Some(vec![64, 3, 7, 7]),
            ..OpContext::default()
        };
        let wg = op_work(
            "aten::cudnn_convolution_backward_weight",
            &dims("[[], [32, 64, 112, 112], [32, 3, 224, 224], [], []]"),
            &bw,
        )
        .unwrap();
        assert_eq!(wg.work.flops, w.work.flops);
        assert_eq!(wg.work.gemms[0].batch_dim, BatchDim::K);
    }

    /// A recorded depthwise conv (`w[C, 1, k, k]`, `C` in and out) is a stencil, as the zoo
    /// prices it; a grouped conv with several channels per group stays one implicit GEMM whose
    /// columns reduce over their own group.
    #[test]
    fn depthwise_and_grouped_convs_from_their_weights() {
        let mut cx = fw();
        cx.output = Some(vec![32, 144, 28, 28]);
        let d = dims("[[32, 144, 56, 56], [144, 1, 5, 5], [], [], [], [], [], [], []]");
        let w = op_work("aten::cudnn_convolution", &d, &cx).unwrap().work;
        assert_eq!(w.class, OpClass::DepthwiseConv);
        assert_eq!(w.math, crate::cost::kernel::MathClass::Vector);
        assert!(w.gemms.iter().all(Gemm::is_none));
        assert_eq!(w.flops, 2.0 * 32.0 * 144.0 * 28.0 * 28.0 * 25.0);
        cx.output = Some(vec![32, 128, 56, 56]);
        let d = dims("[[32, 128, 56, 56], [128, 4, 3, 3], [], [], [], [], [], [], []]");
        let g = op_work("aten::cudnn_convolution", &d, &cx).unwrap().work;
        assert_eq!(g.class, OpClass::Conv);
        assert_eq!((g.gemms[0].n, g.gemms[0].k), (128.0, 36.0));
    }

    #[test]
    fn vector_ops_and_optimizer_lists() {
        let e = op_work(
            "aten::add_",
            &dims("[[32, 256, 56, 56], [32, 256, 56, 56], []]"),
            &fw(),
        )
        .unwrap()
        .work;
        let n = 32.0 * 256.0 * 56.0 * 56.0;
        assert_eq!(e.class, OpClass::Elementwise);
        assert_eq!(e.act_elems, 3.0 * n);
        let up = OpContext {
            phase: Some(Phase::Update),
            ..OpContext::default()
        };
        let o = op_work(
            "aten::_foreach_add_",
            &dims("[[[128, 128], [128]], [[128, 128], [128]], []]"),
            &up,
        )
        .unwrap()
        .work;
        assert_eq!(o.class, OpClass::Optimizer);
        assert_eq!(o.weight_elems, 3.0 * (128.0 * 128.0 + 128.0));
        assert_eq!(o.act_elems, 0.0);
        assert!(op_work("aten::view", &dims("[[64], []]"), &fw()).is_none());
        assert!(op_work("aten::mm", &dims("[[3, 4], [5, 6]]"), &fw()).is_none());
    }

    #[test]
    fn kernel_names_give_classes() {
        assert_eq!(kernel_class("volta_sgemm_128x64_nn"), OpClass::Gemm);
        assert_eq!(
            kernel_class("void cudnn::detail::implicit_convolve_sgemm<float>"),
            OpClass::Conv
        );
        assert_eq!(
            kernel_class("sm80_xmma_fprop_implicit_gemm_tf32"),
            OpClass::Conv
        );
        assert_eq!(
            kernel_class("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>"),
            OpClass::Norm
        );
        assert_eq!(
            kernel_class("void at::native::(anonymous namespace)::cunn_SoftMaxForward"),
            OpClass::Softmax
        );
        assert_eq!(
            kernel_class("void at::native::vectorized_elementwise_kernel<4, add>"),
            OpClass::Elementwise
        );
        assert_eq!(
            kernel_class("void at::native::multi_tensor_apply_kernel<SGD>"),
            OpClass::Optimizer
        );
        assert_eq!(kernel_class("Cijk_Alik_Bljk_SB_MT64x64"), OpClass::Gemm);
    }

    #[test]
    fn class_work_is_sized_to_the_recorded_time() {
        let job = crate::passes::recompute::tests::chain(&[1000], &[0]);
        for class in [OpClass::Gemm, OpClass::Elementwise, OpClass::Norm] {
            for dur in [50_000u64, 2_000_000] {
                let w = class_work(&job, class, dur, false);
                let t = job.kernels().time_ns(&w, job.dtype, job.math);
                assert!(
                    (t - dur as f64).abs() < 1e-3 * dur as f64,
                    "{class:?} {dur}: {t}"
                );
            }
        }
        // Shorter than a launch: the smallest work.
        let w = class_work(&job, OpClass::Gemm, 10, false);
        assert_eq!(w.flops, 0.0);
    }

    #[test]
    fn shares_keep_shapes_and_split_work() {
        let w = op_work("aten::mm", &dims("[[64, 32], [32, 16]]"), &fw())
            .unwrap()
            .work;
        let a = share(&w, 0.25);
        assert_eq!(a.flops, w.flops * 0.25);
        assert_eq!(a.gemms[0].m, 64.0);
        assert_eq!(a.gemms[0].count, 0.25);
        assert_eq!(a.kernels, 1);
    }
}
