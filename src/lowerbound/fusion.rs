//! Fusion patterns (Benanza §III-B4, extended): chains of layers that one library kernel can run,
//! with one read of the chain's inputs, one write of its output and one launch.
//!
//! | pattern | chain | one kernel in practice |
//! |---|---|---|
//! | `conv+bias+act` | Conv [with bias] [→ BatchNormalization] → activation | cuDNN `ConvolutionBiasActivationForward` (BN folded into the weights at inference) |
//! | `conv+bias` | Conv with bias, or Conv → BatchNormalization | the same API with an identity activation |
//! | `gemm+bias+act` | Gemm, or MatMul → Add(1-d bias), → GELU/ReLU/... (GELU also as exporters write it before opset 20: x·(1 + erf(x/√2))·0.5) | cuBLASLt epilogue `BIAS_GELU` / `BIAS_RELU` |
//! | `gemm+bias` | MatMul → Add(1-d bias) | cuBLASLt epilogue `BIAS` |
//! | `attention` | MatMul(Q,Kᵀ) [→ Div/Mul by a scalar] [→ Add mask] → Softmax → MatMul(·,V) | flash attention: no S×S matrix in DRAM |
//!
//! Every intermediate value of a chain must have the chain's next layer as its only consumer and
//! must not be a graph output, so fusing never removes a value someone else reads. The fused
//! kernel keeps the members' FLOPs and moves only the chain's external inputs and its output.

use std::collections::{HashMap, HashSet};

use super::layers::{Kernel, Layer, WINOGRAD, is_activation, winograd, winograd_eligible};
use crate::onnx::Graph;

/// One fused group.
#[derive(Clone, Debug, PartialEq)]
pub struct Fused {
    pub pattern: &'static str,
    /// Member layers, in chain order.
    pub members: Vec<usize>,
    pub kernel: Kernel,
    /// Other implementations of the fused kernel (a Winograd conv); the bound takes the fastest.
    pub alternatives: Vec<(&'static str, Kernel)>,
}

struct Ctx<'a> {
    g: &'a Graph,
    layers: &'a [Layer],
    consumers: HashMap<&'a str, Vec<usize>>,
    outputs: HashSet<&'a str>,
    taken: Vec<bool>,
}

impl<'a> Ctx<'a> {
    /// The only consumer of layer `l`'s first output, if it has exactly one and it is free.
    fn sole_next(&self, l: usize) -> Option<usize> {
        let out = self.layers[l].outputs.first()?.as_str();
        if self.outputs.contains(out) {
            return None;
        }
        match self.consumers.get(out).map(Vec::as_slice) {
            Some([c]) if !self.taken[*c] => Some(*c),
            _ => None,
        }
    }
    fn elems(&self, name: &str) -> f64 {
        self.g.values.get(name).map_or(0.0, |v| v.elems() as f64)
    }
    fn input(&self, l: usize, k: usize) -> Option<&'a str> {
        self.layers[l]
            .inputs
            .get(k)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
    fn out_elems(&self, l: usize) -> f64 {
        self.layers[l]
            .outputs
            .first()
            .map_or(0.0, |o| self.elems(o))
    }
    fn vector_flops(&self, members: &[usize]) -> f64 {
        members
            .iter()
            .flat_map(|&m| &self.layers[m].kernels)
            .map(|k| k.vector_flops)
            .sum()
    }
    fn matrix_flops(&self, members: &[usize]) -> f64 {
        members
            .iter()
            .flat_map(|&m| &self.layers[m].kernels)
            .map(|k| k.matrix_flops)
            .sum()
    }
    fn op(&self, l: usize) -> &str {
        &self.layers[l].op_type
    }
    /// Input `k` of layer `l` is a 1-d initializer (a bias) or a scalar.
    fn is_bias(&self, l: usize, k: usize) -> bool {
        self.input(l, k)
            .and_then(|i| self.g.values.get(i))
            .is_some_and(|v| v.initializer && v.dims.len() <= 1)
    }
    fn is_scalar(&self, l: usize, k: usize) -> bool {
        self.input(l, k)
            .and_then(|i| self.g.values.get(i))
            .is_some_and(|v| v.elems() == 1)
    }
}

/// Find the fused groups of a model's layers. A layer is in at most one group.
pub fn find(g: &Graph, layers: &[Layer]) -> Vec<Fused> {
    let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in layers.iter().enumerate() {
        for inp in l.inputs.iter().filter(|s| !s.is_empty()) {
            let c = consumers.entry(inp.as_str()).or_default();
            if c.last() != Some(&i) {
                c.push(i);
            }
        }
    }
    let mut cx = Ctx {
        g,
        layers,
        consumers,
        outputs: g.outputs.iter().map(String::as_str).collect(),
        taken: vec![false; layers.len()],
    };
    let mut out = Vec::new();
    for pass in 0..3 {
        for l in 0..layers.len() {
            if cx.taken[l] {
                continue;
            }
            let found = match (pass, cx.op(l)) {
                (0, "MatMul") => attention(&cx, l),
                (1, "Conv") => conv(&cx, l),
                (2, "Gemm" | "MatMul") => gemm(&cx, l),
                _ => None,
            };
            if let Some(f) = found {
                for &m in &f.members {
                    cx.taken[m] = true;
                }
                out.push(f);
            }
        }
    }
    out.sort_by_key(|f| f.members[0]);
    out
}

fn attention(cx: &Ctx, q: usize) -> Option<Fused> {
    let mut members = vec![q];
    let mut cur = cx.sole_next(q)?;
    let mut mask = 0.0;
    if matches!(cx.op(cur), "Div" | "Mul") && (cx.is_scalar(cur, 1) || cx.is_scalar(cur, 0)) {
        members.push(cur);
        cur = cx.sole_next(cur)?;
    }
    if cx.op(cur) == "Add" {
        let prev = cx.layers[*members.last()?].outputs.first()?;
        let other = (0..2).find(|&k| cx.input(cur, k) != Some(prev.as_str()))?;
        mask = cx.elems(cx.input(cur, other)?);
        members.push(cur);
        cur = cx.sole_next(cur)?;
    }
    if !matches!(cx.op(cur), "Softmax") {
        return None;
    }
    members.push(cur);
    let p = cx.sole_next(cur)?;
    if cx.op(p) != "MatMul" || cx.input(p, 0) != cx.layers[cur].outputs.first().map(String::as_str)
    {
        return None;
    }
    members.push(p);
    let qk = |k| cx.input(q, k).map_or(0.0, |i| cx.elems(i));
    let v = cx.input(p, 1).map_or(0.0, |i| cx.elems(i));
    Some(Fused {
        alternatives: Vec::new(),
        pattern: "attention",
        kernel: Kernel {
            matrix_flops: cx.matrix_flops(&members),
            vector_flops: cx.vector_flops(&members),
            elems: qk(0) + qk(1) + v + mask + cx.out_elems(p),
        },
        members,
    })
}

fn conv(cx: &Ctx, c: usize) -> Option<Fused> {
    let mut members = vec![c];
    let mut bias = cx.input(c, 2).is_some();
    let m = cx.input(c, 1).and_then(|w| cx.g.values.get(w))?.dims[0] as f64;
    let mut next = cx.sole_next(c);
    if let Some(b) = next
        && cx.op(b) == "BatchNormalization"
        && cx.input(b, 0) == cx.layers[c].outputs.first().map(String::as_str)
    {
        members.push(b);
        bias = true;
        next = cx.sole_next(b);
    }
    let mut act = false;
    if let Some(a) = next
        && is_activation(cx.op(a))
    {
        members.push(a);
        act = true;
    }
    let pattern = match (bias, act) {
        (_, true) => "conv+bias+act",
        (true, false) => "conv+bias",
        (false, false) => return None,
    };
    let x = cx.input(c, 0).map_or(0.0, |i| cx.elems(i));
    let w = cx.input(c, 1).map_or(0.0, |i| cx.elems(i));
    let y = cx.out_elems(*members.last()?);
    let kernel = Kernel {
        matrix_flops: cx.matrix_flops(&members),
        // The epilogue: a bias add per output, plus the activation's own work.
        vector_flops: if bias { y } else { 0.0 }
            + members[1..]
                .iter()
                .filter(|&&l| is_activation(cx.op(l)))
                .map(|&l| cx.vector_flops(&[l]))
                .sum::<f64>(),
        elems: x + w + if bias { m } else { 0.0 } + y,
    };
    let mut alternatives = Vec::new();
    if winograd_eligible(&cx.g.nodes[cx.layers[c].node], cx.g) {
        alternatives.push((WINOGRAD, winograd(&kernel, x, y)));
    }
    Some(Fused {
        pattern,
        kernel,
        alternatives,
        members,
    })
}

/// The layers of `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)` applied to layer `x`'s output,
/// the GELU that exporters write for opsets before 20.
fn erf_gelu(cx: &Ctx, x: usize) -> Option<Vec<usize>> {
    let out = cx.layers[x].outputs.first()?.as_str();
    if cx.outputs.contains(out) {
        return None;
    }
    let cons = cx.consumers.get(out)?;
    let [p, q] = cons.as_slice() else {
        return None;
    };
    let (div, mul) = match (cx.op(*p), cx.op(*q)) {
        ("Div", "Mul") => (*p, *q),
        ("Mul", "Div") => (*q, *p),
        _ => return None,
    };
    if cx.taken[div] || cx.taken[mul] || !cx.is_scalar(div, 1) {
        return None;
    }
    let erf = cx.sole_next(div).filter(|&e| cx.op(e) == "Erf")?;
    let add = cx.sole_next(erf).filter(|&a| cx.op(a) == "Add")?;
    if !(cx.is_scalar(add, 0) || cx.is_scalar(add, 1)) || cx.sole_next(add) != Some(mul) {
        return None;
    }
    let half = cx.sole_next(mul).filter(|&h| cx.op(h) == "Mul")?;
    if !(cx.is_scalar(half, 0) || cx.is_scalar(half, 1)) {
        return None;
    }
    Some(vec![div, erf, add, mul, half])
}

fn gemm(cx: &Ctx, g: usize) -> Option<Fused> {
    let mut members = vec![g];
    let mut bias_elems = 0.0;
    let mut bias = false;
    if cx.op(g) == "Gemm" && cx.input(g, 2).is_some() {
        bias = true;
        bias_elems = cx.input(g, 2).map_or(0.0, |i| cx.elems(i));
    }
    let mut next = cx.sole_next(g);
    if !bias
        && let Some(a) = next
        && cx.op(a) == "Add"
    {
        let prev = cx.layers[g].outputs.first()?.as_str();
        let other = (0..2).find(|&k| cx.input(a, k) != Some(prev))?;
        if cx.is_bias(a, other) {
            bias = true;
            bias_elems = cx.input(a, other).map_or(0.0, |i| cx.elems(i));
            members.push(a);
            next = cx.sole_next(a);
        }
    }
    let mut act = false;
    if let Some(a) = next
        && is_activation(cx.op(a))
    {
        members.push(a);
        act = true;
    } else if let Some(gelu) = erf_gelu(cx, *members.last()?) {
        members.extend(gelu);
        act = true;
    }
    let pattern = match (bias, act) {
        (_, true) => "gemm+bias+act",
        (true, false) if members.len() > 1 => "gemm+bias",
        _ => return None,
    };
    let a = cx.input(g, 0).map_or(0.0, |i| cx.elems(i));
    let b = cx.input(g, 1).map_or(0.0, |i| cx.elems(i));
    Some(Fused {
        pattern,
        alternatives: Vec::new(),
        kernel: Kernel {
            matrix_flops: cx.matrix_flops(&members),
            vector_flops: cx.vector_flops(&members),
            elems: a + b + bias_elems + cx.out_elems(*members.last()?),
        },
        members,
    })
}
