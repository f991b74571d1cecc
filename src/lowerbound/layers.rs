//! From ONNX nodes to costed layers: each node becomes a [`Layer`] with the kernels its best
//! unfused implementation launches ([`Kernel`]: FLOPs on the matrix and vector units, elements
//! moved) and a canonical key; layers with equal keys are the same unique layer (Benanza §III-A:
//! same type, shape and parameters).
//!
//! Work per operator (n = output elements; elements moved count each tensor once; one
//! multiply-add = 2 FLOPs, as in `crate::zoo`):
//!
//! | op | kernels | matrix FLOPs | vector FLOPs | elements |
//! |---|---|---|---|---|
//! | Conv | conv, then bias add when it has a bias | 2·N·M·C/g·ΠK·ΠOut | bias: n | x+w+y; bias: 2n+M |
//! | Gemm | 1 (bias in the epilogue) | 2·M·N·K | C: n | A+B+C+Y |
//! | MatMul | 1 | 2·batch·M·N·K | — | A+B+Y |
//! | BatchNormalization (inference) | 1 | — | 2n | 2n+4C |
//! | LayerNormalization | 1 | — | 7n | 2n + scale + bias |
//! | Relu 1, LeakyRelu/Clip/Abs/Neg 2, Sigmoid/Tanh/Exp/Log/Erf/Softplus/Elu 4, Gelu 8 ·n | 1 | — | c·n | 2n |
//! | Add/Sub/Mul/Div/Pow/Max/Min/Mod/compare/logic/Where | 1 | — | n | inputs + n |
//! | Softmax / LogSoftmax | 1 | — | 5n | 2n |
//! | MaxPool / AveragePool k | 1 | — | ΠK·n | x+y |
//! | GlobalAveragePool / GlobalMaxPool / Reduce* | 1 | — | x | x+y |
//! | Concat, Transpose, Cast, Slice, Split, Gather, Expand, ConstantOfShape, Range | 1 | — | — | reads + writes |
//! | Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout, Shape, Constant | 0 (views, or inference no-ops) | | | |
//!
//! A node whose outputs are all constant — computable from initializers, constants and the (now
//! concrete) shapes alone, like shape arithmetic or a scale `1/√d` — costs nothing: runtimes fold
//! such nodes when they load the model.

use std::collections::HashMap;
use std::fmt::Write;

use crate::onnx::{Attr, Graph, Node, Value};

/// One kernel's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Kernel {
    pub matrix_flops: f64,
    pub vector_flops: f64,
    /// Elements read plus written.
    pub elems: f64,
}

/// One ONNX node with its unfused work.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Position in the graph's topological node list.
    pub node: usize,
    pub name: String,
    pub op_type: String,
    /// Canonical key: op type, attributes, input and output shapes.
    pub key: String,
    /// Kernels of the default unfused implementation (empty for views).
    pub kernels: Vec<Kernel>,
    /// The default implementation's name (`implicit-gemm` for convolutions, `roofline` else).
    pub implementation: &'static str,
    /// Other implementations of the same layer (Winograd for eligible convolutions); the bound
    /// takes the fastest.
    pub alternatives: Vec<(&'static str, Vec<Kernel>)>,
    /// Layers whose outputs this one reads.
    pub preds: Vec<usize>,
    /// Value names of its data inputs and outputs (for fusion matching).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

impl Layer {
    pub fn flops(&self) -> f64 {
        self.kernels
            .iter()
            .map(|k| k.matrix_flops + k.vector_flops)
            .sum()
    }
}

fn shape_str(d: &[i64]) -> String {
    if d.is_empty() {
        "scalar".into()
    } else {
        d.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("x")
    }
}

fn attr_str(a: &Attr) -> String {
    let join = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join("x");
    match a {
        Attr::Int(i) => i.to_string(),
        Attr::Float(f) => format!("{f}"),
        Attr::Str(s) => s.clone(),
        Attr::Ints(v) => join(&mut v.iter().map(|x| x.to_string())),
        Attr::Floats(v) => join(&mut v.iter().map(|x| format!("{x}"))),
        Attr::Tensor { dims, .. } => format!("tensor{}", shape_str(dims)),
        Attr::Other => "?".into(),
    }
}

/// The canonical key of a node: `Conv[group=1,kernel_shape=3x3](32x64x56x56,64x64x3x3,-)->32x64x56x56`.
pub fn key(n: &Node, g: &Graph) -> String {
    let mut s = n.op_type.clone();
    if !n.attrs.is_empty() {
        s.push('[');
        for (i, (k, v)) in n.attrs.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{k}={}", attr_str(v));
        }
        s.push(']');
    }
    let shapes = |names: &[String]| {
        names
            .iter()
            .map(|i| match g.values.get(i) {
                Some(v) if !i.is_empty() => shape_str(&v.dims),
                _ => "-".into(),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let _ = write!(s, "({})->{}", shapes(&n.inputs), shapes(&n.outputs));
    s
}

/// Winograd F(2×2, 3×3) computes a 2×2 output tile of a 3×3 convolution with 16 multiplies
/// instead of 36.
pub const WINOGRAD_SAVING: f64 = 2.25;
/// The implementation name of the Winograd variant.
pub const WINOGRAD: &str = "winograd-f2x2-3x3";

/// Whether a convolution has a Winograd F(2×2, 3×3) implementation: 2-d, 3×3, stride 1,
/// dilation 1, one group (cuDNN's `WINOGRAD` algorithms).
pub fn winograd_eligible(n: &Node, g: &Graph) -> bool {
    let Some(w) = n.input(1).and_then(|w| g.values.get(w)) else {
        return false;
    };
    let ones = |name: &str| n.ints(name).is_none_or(|v| v.iter().all(|&x| x == 1));
    w.dims.len() == 4
        && w.dims[2..] == [3, 3]
        && n.int("group").unwrap_or(1) == 1
        && ones("strides")
        && ones("dilations")
}

/// The Winograd variant of a convolution kernel reading `x` and writing `y` elements: the
/// multiplies shrink by [`WINOGRAD_SAVING`]; the input and output tile transforms add about 8
/// vector FLOPs per input element and 6 per output element (adds of the 4×4 and 2×2 transforms);
/// the transforms stay on chip (cuDNN's fused Winograd), so the bytes moved do not change.
pub fn winograd(k: &Kernel, x: f64, y: f64) -> Kernel {
    Kernel {
        matrix_flops: k.matrix_flops / WINOGRAD_SAVING,
        vector_flops: k.vector_flops + 8.0 * x + 6.0 * y,
        elems: k.elems,
    }
}

/// Vector FLOPs per output element of the element-wise activations.
fn act_cost(op: &str) -> Option<f64> {
    Some(match op {
        "Relu" => 1.0,
        "LeakyRelu" | "Clip" | "Abs" | "Neg" | "Reciprocal" | "Sqrt" | "HardSigmoid"
        | "HardSwish" => 2.0,
        "Not" | "IsNaN" | "IsInf" | "Sign" | "Floor" | "Ceil" | "Round" => 1.0,
        "Sigmoid" | "Tanh" | "Exp" | "Log" | "Erf" | "Softplus" | "Elu" => 4.0,
        "Gelu" => 8.0,
        _ => return None,
    })
}

/// Whether an op is an activation the fused conv/GEMM epilogues apply.
pub fn is_activation(op: &str) -> bool {
    matches!(
        op,
        "Relu" | "LeakyRelu" | "Clip" | "Sigmoid" | "Tanh" | "Elu" | "Gelu" | "HardSwish"
    )
}

/// The unfused kernels of one node (see the module table).
pub fn kernels(n: &Node, g: &Graph) -> Vec<Kernel> {
    let v = |i: usize| -> Option<&Value> { n.input(i).and_then(|name| g.values.get(name)) };
    let e = |i: usize| v(i).map_or(0.0, |x| x.elems() as f64);
    let outs: Vec<&Value> = n.outputs.iter().filter_map(|o| g.values.get(o)).collect();
    let y = outs.first().map_or(0.0, |o| o.elems() as f64);
    if !outs.is_empty() && outs.iter().all(|o| o.constant) {
        return Vec::new(); // folded when the model is loaded (shape arithmetic, constant weights)
    }
    let vec_k = |flops: f64, elems: f64| Kernel {
        matrix_flops: 0.0,
        vector_flops: flops,
        elems,
    };
    let op = n.op_type.as_str();
    match op {
        "Conv" => {
            let (x, w) = (v(0), v(1));
            let (Some(x), Some(w)) = (x, w) else {
                return Vec::new();
            };
            let g_ = n.int("group").unwrap_or(1).max(1) as f64;
            let c = x.dims[1] as f64;
            let ksz: f64 = w.dims[2..].iter().map(|&d| d as f64).product();
            let mf = 2.0 * y * (c / g_) * ksz;
            let mut ks = vec![Kernel {
                matrix_flops: mf,
                vector_flops: 0.0,
                elems: x.elems() as f64 + w.elems() as f64 + y,
            }];
            if n.input(2).is_some() {
                ks.push(vec_k(y, 2.0 * y + e(2)));
            }
            ks
        }
        "Gemm" => {
            let (Some(a), Some(b)) = (v(0), v(1)) else {
                return Vec::new();
            };
            let (m, k, nn) = crate::onnx::shape::gemm_mkn(n, &a.dims, &b.dims).unwrap_or((0, 0, 0));
            let bias = n.input(2).is_some();
            vec![Kernel {
                matrix_flops: 2.0 * m as f64 * k as f64 * nn as f64,
                vector_flops: if bias { y } else { 0.0 },
                elems: e(0) + e(1) + e(2) + y,
            }]
        }
        "MatMul" => {
            let (Some(a), Some(b)) = (v(0), v(1)) else {
                return Vec::new();
            };
            let (batch, m, k, nn, _) =
                crate::onnx::shape::matmul_dims(&a.dims, &b.dims).unwrap_or_default();
            let nb: f64 = batch.iter().map(|&d| d as f64).product();
            vec![Kernel {
                matrix_flops: 2.0 * nb * m as f64 * k as f64 * nn as f64,
                vector_flops: 0.0,
                elems: e(0) + e(1) + y,
            }]
        }
        "BatchNormalization" => vec![vec_k(2.0 * y, 2.0 * y + 4.0 * e(1))],
        "LayerNormalization" => vec![vec_k(7.0 * y, 2.0 * y + e(1) + e(2))],
        "Softmax" | "LogSoftmax" => vec![vec_k(5.0 * y, 2.0 * y)],
        "MaxPool" | "AveragePool" => {
            let k: f64 = n
                .ints("kernel_shape")
                .unwrap_or(&[1])
                .iter()
                .map(|&d| d as f64)
                .product();
            vec![vec_k(k * y, e(0) + y)]
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "ReduceMean" | "ReduceSum" | "ReduceMax" => {
            vec![vec_k(e(0), e(0) + y)]
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Mod" | "Equal" | "Less"
        | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Where" => {
            let ins: f64 = (0..n.inputs.len()).map(e).sum();
            vec![vec_k(y, ins + y)]
        }
        "Concat" | "Transpose" | "Cast" | "Slice" => vec![vec_k(0.0, 2.0 * y)],
        // Every output written once after one read of the input.
        "Split" => vec![vec_k(0.0, 2.0 * e(0))],
        "Range" => vec![vec_k(y, y)],
        "Expand" => vec![vec_k(0.0, e(0) + y)],
        "ConstantOfShape" => vec![vec_k(0.0, y)],
        "Gather" => vec![vec_k(0.0, e(1) + 2.0 * y)],
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "Dropout" | "Shape"
        | "Constant" => Vec::new(),
        _ => match act_cost(op) {
            Some(c) => vec![vec_k(c * y, 2.0 * y)],
            // Every op with a shape rule has a cost above; this is a bug if reached.
            None => {
                debug_assert!(false, "no cost for {op}");
                Vec::new()
            }
        },
    }
}

/// The layers of a graph (every node but `Constant`), in topological order, with their
/// dependencies.
pub fn layers(g: &Graph) -> Vec<Layer> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(g.nodes.len());
    for (pos, n) in g.nodes.iter().enumerate() {
        if n.op_type == "Constant" {
            continue;
        }
        let mut preds: Vec<usize> = n
            .inputs
            .iter()
            .filter_map(|i| producer.get(i.as_str()).copied())
            .collect();
        preds.sort_unstable();
        preds.dedup();
        let idx = out.len();
        for o in &n.outputs {
            producer.insert(o, idx);
        }
        let ks = kernels(n, g);
        let conv = n.op_type == "Conv";
        let mut alternatives = Vec::new();
        if conv && !ks.is_empty() && winograd_eligible(n, g) {
            let size = |v: Option<&str>| {
                v.and_then(|v| g.values.get(v))
                    .map_or(0.0, |v| v.elems() as f64)
            };
            let mut w = ks.clone();
            w[0] = winograd(
                &ks[0],
                size(n.input(0)),
                size(n.outputs.first().map(String::as_str)),
            );
            alternatives.push((WINOGRAD, w));
        }
        out.push(Layer {
            node: pos,
            name: n.name.clone(),
            op_type: n.op_type.clone(),
            key: key(n, g),
            kernels: ks,
            implementation: if conv { "implicit-gemm" } else { "roofline" },
            alternatives,
            preds,
            inputs: n.inputs.clone(),
            outputs: n.outputs.clone(),
        });
    }
    out
}
