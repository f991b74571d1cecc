//! Shape inference at a chosen batch size: every value of the graph gets concrete dims.
//!
//! The graph inputs' declared shapes are bound first ([`bind_inputs`]): dim 0 of every input
//! becomes `--batch` when given (a fixed batch in the file is overridden; a symbolic one needs
//! `--batch`), any other symbolic dim needs `--dim NAME=N`. Then the nodes are visited in
//! topological order ([`infer`]) with one rule per operator type.
//!
//! Small integer tensors are folded along the way (`Constant`, integer initializers, `Shape`,
//! `Gather`, `Unsqueeze`, `Squeeze`, `Concat`, `Cast` and integer arithmetic), which is how
//! exported models compute `Reshape` targets. An operator without a rule is refused with its node
//! named: a lower bound that silently skipped work would not be a bound.

use std::collections::BTreeMap;

use super::proto::ValueInfoProto;
use super::{Attr, Elem, Graph, Node, OnnxError, Value};

/// Concrete dims of a value.
pub type Dims = Vec<i64>;

/// How to turn symbolic dims into numbers.
#[derive(Clone, Debug, Default)]
pub struct InferOptions {
    /// Batch size: dim 0 of every graph input.
    pub batch: Option<i64>,
    /// Values of other named (symbolic) dims, e.g. `sequence` → 128.
    pub dims: BTreeMap<String, i64>,
}

/// The operator types with a shape rule (each also costed by the lower-bound analysis).
pub const SUPPORTED: &[&str] = &rule_names();

/// Largest tensor accepted (elements): beyond this a dim is surely wrong.
const MAX_ELEMS: i64 = 1 << 48;

/// A message about shapes, cut to 300 characters: a shape of 5·10⁷ dims would otherwise make
/// a 150 MB line.
fn short(m: String) -> String {
    const MAX: usize = 300;
    match m.char_indices().nth(MAX) {
        None => m,
        Some((i, _)) => format!("{} … ({} characters in all)", &m[..i], m.chars().count()),
    }
}

/// Bind the graph inputs' shapes (see the module docs).
pub fn bind_inputs(
    g: &mut Graph,
    inputs: &[ValueInfoProto],
    opts: &InferOptions,
) -> Result<(), OnnxError> {
    let err = |message: String| OnnxError::Model {
        file: g.file.clone(),
        message: short(message),
    };
    if let Some(b) = opts.batch
        && b <= 0
    {
        return Err(err(format!("batch size must be at least 1, got {b}")));
    }
    let mut batch = None;
    for vi in inputs {
        if g.values.contains_key(&vi.name) {
            continue; // an initializer listed as an input (IR < 4 files do this)
        }
        let tt = vi
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or_else(|| err(format!("graph input `{}` is not a tensor", vi.name)))?;
        let shape = tt
            .shape
            .as_ref()
            .ok_or_else(|| err(format!("graph input `{}` declares no shape", vi.name)))?;
        let mut dims = Vec::with_capacity(shape.dim.len());
        for (k, d) in shape.dim.iter().enumerate() {
            let param = d.dim_param.clone().filter(|p| !p.is_empty());
            let v = match (k, opts.batch, d.dim_value, &param) {
                (0, Some(b), _, _) => b,
                (_, _, Some(v), _) if v > 0 => v,
                (_, _, _, Some(p)) if opts.dims.contains_key(p) => opts.dims[p],
                (0, None, _, p) => {
                    return Err(err(format!(
                        "graph input `{}` has a dynamic batch dimension{}; give the batch size \
                         with --batch N",
                        vi.name,
                        p.as_ref().map(|p| format!(" (`{p}`)")).unwrap_or_default()
                    )));
                }
                (_, _, _, Some(p)) => {
                    return Err(err(format!(
                        "graph input `{}` dim {k} (`{p}`) is dynamic; give it with --dim {p}=N",
                        vi.name
                    )));
                }
                _ => {
                    return Err(err(format!(
                        "graph input `{}` dim {k} has no size (neither a value nor a name)",
                        vi.name
                    )));
                }
            };
            if v <= 0 {
                return Err(err(format!(
                    "graph input `{}` dim {k} must be at least 1, got {v}",
                    vi.name
                )));
            }
            dims.push(v);
        }
        check_size(&dims).map_err(err)?;
        if batch.is_none() && !dims.is_empty() {
            batch = Some(dims[0]);
        }
        g.values.insert(
            vi.name.clone(),
            Value {
                dims,
                elem: Elem::from_onnx(tt.elem_type),
                initializer: false,
                ints: None,
                constant: false,
            },
        );
        g.inputs.push(vi.name.clone());
    }
    if g.inputs.is_empty() {
        return Err(err(
            "the graph has no inputs besides its initializers".into()
        ));
    }
    g.batch = batch.unwrap_or(1);
    Ok(())
}

pub(crate) fn check_size(dims: &[i64]) -> Result<(), String> {
    let mut n: i64 = 1;
    for &d in dims {
        if d < 0 {
            return Err(format!("negative dimension in {dims:?}"));
        }
        n = n.saturating_mul(d);
    }
    if n > MAX_ELEMS {
        return Err(format!("shape {dims:?} has more than 2^48 elements"));
    }
    Ok(())
}

/// Infer every node's output shapes, in order.
pub fn infer(g: &mut Graph) -> Result<(), OnnxError> {
    for idx in 0..g.nodes.len() {
        let n = &g.nodes[idx];
        let ins: Vec<Option<&Value>> = n
            .inputs
            .iter()
            .map(|i| if i.is_empty() { None } else { g.values.get(i) })
            .collect();
        let node_err = |message: String| OnnxError::Node {
            file: g.file.clone(),
            index: n.index,
            name: n.name.clone(),
            op_type: n.op_type.clone(),
            message: short(message),
        };
        for (k, i) in n.inputs.iter().enumerate() {
            if !i.is_empty() && ins[k].is_none() {
                return Err(node_err(format!("input `{i}` has no known shape")));
            }
        }
        let mut outs = infer_node(n, &ins, g.opset).map_err(node_err)?;
        let constant = matches!(n.op_type.as_str(), "Shape" | "Constant")
            || (ins.iter().any(|v| v.is_some()) && ins.iter().flatten().all(|v| v.constant));
        for o in &mut outs {
            check_size(&o.dims).map_err(node_err)?;
            o.constant = constant || o.ints.is_some();
        }
        let names = n.outputs.clone();
        for (name, v) in names.into_iter().zip(outs) {
            if !name.is_empty() {
                g.values.insert(name, v);
            }
        }
    }
    Ok(())
}

fn float(dims: Dims) -> Value {
    Value {
        dims,
        elem: Elem::Float,
        initializer: false,
        ints: None,
        constant: false,
    }
}

fn like(v: &Value, dims: Dims) -> Value {
    Value {
        dims,
        elem: v.elem,
        initializer: false,
        ints: None,
        constant: false,
    }
}

fn ints(dims: Dims, values: Vec<i64>) -> Value {
    Value {
        dims,
        elem: Elem::Int,
        initializer: false,
        ints: Some(values),
        constant: false,
    }
}

/// Normalise a possibly negative axis against `rank`.
fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    if (0..r).contains(&v) {
        Ok(v as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// Numpy-style broadcast of several shapes.
fn broadcast(shapes: &[&[i64]]) -> Result<Dims, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; rank];
    for s in shapes {
        let off = rank - s.len();
        for (k, &d) in s.iter().enumerate() {
            let o = &mut out[off + k];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(format!("shapes {shapes:?} do not broadcast"));
            }
        }
    }
    Ok(out)
}

/// Integer contents of input `k` when known.
fn const_ints<'a>(ins: &[Option<&'a Value>], k: usize) -> Option<&'a [i64]> {
    ins.get(k).copied().flatten()?.ints.as_deref()
}

/// Axes from the attribute (older opsets) or the second input (newer ones).
fn axes_of(n: &Node, ins: &[Option<&Value>], k: usize) -> Result<Option<Vec<i64>>, String> {
    if let Some(a) = n.ints("axes") {
        return Ok(Some(a.to_vec()));
    }
    match ins.get(k).copied().flatten() {
        None => Ok(None),
        Some(v) => match &v.ints {
            Some(a) => Ok(Some(a.clone())),
            None => Err("its axes input is not a constant the importer can compute".into()),
        },
    }
}

/// What a shape rule sees: the node, its inputs' values in order (`None` for an absent optional
/// input) and the model's opset.
struct Cx<'a> {
    n: &'a Node,
    ins: &'a [Option<&'a Value>],
    opset: i64,
}

impl<'a> Cx<'a> {
    /// The operator type.
    fn op(&self) -> &'a str {
        self.n.op_type.as_str()
    }

    /// Input `k`, which the operator needs.
    fn need(&self, k: usize) -> Result<&'a Value, String> {
        self.opt(k)
            .ok_or_else(|| format!("needs input {k}, which is missing"))
    }

    /// Input `k` when present (an optional input).
    fn opt(&self, k: usize) -> Option<&'a Value> {
        self.ins.get(k).copied().flatten()
    }
}

/// One operator's shape rule: its outputs' values from its inputs'.
type ShapeRule = fn(&Cx) -> Result<Vec<Value>, String>;

/// The shape rules, one per operator type, sorted by name (several types share a rule).
const RULES: &[(&str, ShapeRule)] = &[
    ("Abs", rule_elementwise),
    ("Add", rule_binary),
    ("And", rule_binary),
    ("AveragePool", rule_pool),
    ("BatchNormalization", rule_batch_norm),
    ("Cast", rule_cast),
    ("Ceil", rule_elementwise),
    ("Clip", rule_elementwise),
    ("Concat", rule_concat),
    ("Constant", rule_constant),
    ("ConstantOfShape", rule_constant_of_shape),
    ("Conv", rule_conv),
    ("Div", rule_binary),
    ("Dropout", rule_dropout),
    ("Elu", rule_elementwise),
    ("Equal", rule_binary),
    ("Erf", rule_elementwise),
    ("Exp", rule_elementwise),
    ("Expand", rule_expand),
    ("Flatten", rule_flatten),
    ("Floor", rule_elementwise),
    ("Gather", rule_gather),
    ("Gelu", rule_elementwise),
    ("Gemm", rule_gemm),
    ("GlobalAveragePool", rule_global_pool),
    ("GlobalMaxPool", rule_global_pool),
    ("Greater", rule_binary),
    ("GreaterOrEqual", rule_binary),
    ("HardSigmoid", rule_elementwise),
    ("HardSwish", rule_elementwise),
    ("Identity", rule_elementwise),
    ("IsInf", rule_elementwise),
    ("IsNaN", rule_elementwise),
    ("LayerNormalization", rule_layer_norm),
    ("LeakyRelu", rule_elementwise),
    ("Less", rule_binary),
    ("LessOrEqual", rule_binary),
    ("Log", rule_elementwise),
    ("LogSoftmax", rule_softmax),
    ("MatMul", rule_matmul),
    ("Max", rule_binary),
    ("MaxPool", rule_pool),
    ("Min", rule_binary),
    ("Mod", rule_binary),
    ("Mul", rule_binary),
    ("Neg", rule_elementwise),
    ("Not", rule_elementwise),
    ("Or", rule_binary),
    ("Pow", rule_binary),
    ("Range", rule_range),
    ("Reciprocal", rule_elementwise),
    ("ReduceMax", rule_reduce),
    ("ReduceMean", rule_reduce),
    ("ReduceSum", rule_reduce),
    ("Relu", rule_elementwise),
    ("Reshape", rule_reshape),
    ("Round", rule_elementwise),
    ("Shape", rule_shape),
    ("Sigmoid", rule_elementwise),
    ("Sign", rule_elementwise),
    ("Slice", rule_slice),
    ("Softmax", rule_softmax),
    ("Softplus", rule_elementwise),
    ("Split", rule_split),
    ("Sqrt", rule_elementwise),
    ("Squeeze", rule_squeeze),
    ("Sub", rule_binary),
    ("Tanh", rule_elementwise),
    ("Transpose", rule_transpose),
    ("Unsqueeze", rule_unsqueeze),
    ("Where", rule_where),
    ("Xor", rule_binary),
];

/// The names of [`RULES`], in its order.
const fn rule_names() -> [&'static str; RULES.len()] {
    let mut names = [""; RULES.len()];
    let mut i = 0;
    while i < RULES.len() {
        names[i] = RULES[i].0;
        i += 1;
    }
    names
}

/// The rule for operator type `op` (the table is sorted: a test checks it).
fn rule_for(op: &str) -> Option<ShapeRule> {
    RULES
        .binary_search_by(|&(name, _)| name.cmp(op))
        .ok()
        .map(|i| RULES[i].1)
}

/// One node's output values: the default domain only, the rule of its operator type, and at
/// least as many values as the node names outputs.
fn infer_node(n: &Node, ins: &[Option<&Value>], opset: i64) -> Result<Vec<Value>, String> {
    if !(n.domain.is_empty() || n.domain == "ai.onnx") {
        return Err(format!(
            "operators of domain `{}` are not supported (only the default ai.onnx domain)",
            n.domain
        ));
    }
    let op = n.op_type.as_str();
    let rule = rule_for(op).ok_or_else(|| {
        format!(
            "unsupported operator type `{op}`; supported: {}",
            SUPPORTED.join(", ")
        )
    })?;
    let out = rule(&Cx { n, ins, opset })?;
    if out.len() < n.outputs.iter().filter(|o| !o.is_empty()).count() {
        return Err(format!(
            "has {} outputs; the importer knows {} for this operator",
            n.outputs.len(),
            out.len()
        ));
    }
    Ok(out)
}

/// `Conv`: see [`conv`].
fn rule_conv(cx: &Cx) -> Result<Vec<Value>, String> {
    Ok(vec![conv(cx.n, cx.need(0)?, cx.need(1)?, cx.opt(2))?])
}

/// `MaxPool` / `AveragePool`: see [`pool`]; MaxPool's optional indices output has the same
/// dims, integer elements.
fn rule_pool(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let mut outs = vec![pool(cx.n, x)?];
    if cx.op() == "MaxPool" && cx.n.outputs.len() > 1 {
        let d = outs[0].dims.clone();
        outs.push(ints(d, Vec::new()));
        outs[1].ints = None;
    }
    Ok(outs)
}

/// `GlobalAveragePool` / `GlobalMaxPool`: N×C×1×…×1.
fn rule_global_pool(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    if x.dims.len() < 3 {
        return Err(format!("input must be N×C×spatial, got {:?}", x.dims));
    }
    let mut d = x.dims[..2].to_vec();
    d.extend(std::iter::repeat_n(1, x.dims.len() - 2));
    Ok(vec![like(x, d)])
}

/// `Gemm`: see [`gemm`].
fn rule_gemm(cx: &Cx) -> Result<Vec<Value>, String> {
    Ok(vec![gemm(cx.n, cx.need(0)?, cx.need(1)?, cx.opt(2))?])
}

/// `MatMul`: see [`matmul_dims`].
fn rule_matmul(cx: &Cx) -> Result<Vec<Value>, String> {
    Ok(vec![matmul(cx.need(0)?, cx.need(1)?)?])
}

/// `BatchNormalization`: the input's shape; scale, bias, mean and variance must be `[C]`, and
/// so are the optional running-statistics outputs.
fn rule_batch_norm(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    if x.dims.len() < 2 {
        return Err(format!("input must be N×C×..., got {:?}", x.dims));
    }
    let c = x.dims[1];
    for k in 1..5 {
        let p = cx.need(k)?;
        if p.dims != [c] {
            return Err(format!(
                "input {k} must have shape [{c}] (the channels), got {:?}",
                p.dims
            ));
        }
    }
    let mut outs = vec![like(x, x.dims.clone())];
    for _ in 1..cx.n.outputs.len() {
        outs.push(float(vec![c]));
    }
    Ok(outs)
}

/// `LayerNormalization`: the input's shape; the optional mean / inverse-deviation outputs keep
/// the dims before `axis` and are 1 from it on.
fn rule_layer_norm(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let a = axis(cx.n.int("axis").unwrap_or(-1), x.dims.len())?;
    let mut outs = vec![like(x, x.dims.clone())];
    let mut stat = x.dims.clone();
    for d in stat.iter_mut().skip(a) {
        *d = 1;
    }
    for _ in 1..cx.n.outputs.len() {
        outs.push(float(stat.clone()));
    }
    Ok(outs)
}

/// Element-wise unary operators: the input's shape; `Identity`, `Neg` and `Abs` fold integer
/// contents.
fn rule_elementwise(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let op = cx.op();
    let mut v = like(x, x.dims.clone());
    if matches!(op, "Identity" | "Neg" | "Abs") {
        v.ints = x.ints.as_ref().and_then(|i| {
            i.iter()
                .map(|&a| match op {
                    "Neg" => a.checked_neg(),
                    "Abs" => a.checked_abs(),
                    _ => Some(a),
                })
                .collect()
        });
    }
    Ok(vec![v])
}

/// `Softmax` / `LogSoftmax`: the input's shape; the axis (default 1 before opset 13, -1 from
/// it) must exist.
fn rule_softmax(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let default = if cx.opset >= 13 { -1 } else { 1 };
    axis(cx.n.int("axis").unwrap_or(default), x.dims.len())?;
    Ok(vec![like(x, x.dims.clone())])
}

/// `Dropout`: the input's shape, and an integer mask of the same shape when asked for.
fn rule_dropout(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let mut outs = vec![like(x, x.dims.clone())];
    if cx.n.outputs.len() > 1 {
        let mut m = like(x, x.dims.clone());
        m.elem = Elem::Int;
        outs.push(m);
    }
    Ok(outs)
}

/// `Cast`: the input's shape in the element type `to`; integer contents survive a cast to an
/// integer type.
fn rule_cast(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let to = cx.n.int("to").ok_or("needs the attribute `to`")?;
    let mut v = like(x, x.dims.clone());
    v.elem = Elem::from_onnx(to as i32);
    if v.elem == Elem::Int {
        v.ints = x.ints.clone();
    }
    Ok(vec![v])
}

/// Binary element-wise operators: the broadcast shape; comparisons and logic give integers;
/// integer arithmetic on known contents is folded ([`fold_binary`]).
fn rule_binary(cx: &Cx) -> Result<Vec<Value>, String> {
    let op = cx.op();
    let (a, b) = (cx.need(0)?, cx.need(1)?);
    let dims = broadcast(&[&a.dims, &b.dims])?;
    let mut v = like(a, dims);
    if matches!(
        op,
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor"
    ) {
        v.elem = Elem::Int;
    }
    if let (Some(x), Some(y)) = (&a.ints, &b.ints) {
        let n = v.dims.iter().fold(1i64, |n, &d| n.saturating_mul(d));
        v.ints = fold_binary(op, x, y, n as usize);
    }
    Ok(vec![v])
}

/// `Where`: the broadcast of the condition and both branches, in the first branch's type.
fn rule_where(cx: &Cx) -> Result<Vec<Value>, String> {
    let (c, a, b) = (cx.need(0)?, cx.need(1)?, cx.need(2)?);
    Ok(vec![like(a, broadcast(&[&c.dims, &a.dims, &b.dims])?)])
}

/// `Concat`: the inputs agree off `axis` and add up on it; 1-d integer contents are joined.
fn rule_concat(cx: &Cx) -> Result<Vec<Value>, String> {
    let first = cx.need(0)?;
    let rank = first.dims.len();
    let a = axis(cx.n.int("axis").ok_or("needs the attribute `axis`")?, rank)?;
    let mut dims = first.dims.clone();
    dims[a] = 0;
    let mut folded: Option<Vec<i64>> = Some(Vec::new());
    for k in 0..cx.n.inputs.len() {
        let v = cx.need(k)?;
        if v.dims.len() != rank
            || v.dims
                .iter()
                .zip(&first.dims)
                .enumerate()
                .any(|(i, (x, y))| i != a && x != y)
        {
            return Err(format!(
                "input {k} has shape {:?}, which does not concatenate with {:?} on axis {a}",
                v.dims, first.dims
            ));
        }
        dims[a] = dims[a].saturating_add(v.dims[a]);
        folded = match (folded, &v.ints) {
            (Some(mut f), Some(i)) if rank == 1 => {
                f.extend(i);
                Some(f)
            }
            _ => None,
        };
    }
    let mut v = like(first, dims);
    v.ints = folded;
    Ok(vec![v])
}

/// `Reshape` to a computable target: `0` copies the input dim (unless `allowzero`), one `-1`
/// takes what is left; the element count must not change.
fn rule_reshape(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let target = const_ints(cx.ins, 1)
        .ok_or("its shape input is not a constant the importer can compute")?;
    let allowzero = cx.n.int("allowzero").unwrap_or(0) != 0;
    let mut dims = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (k, &t) in target.iter().enumerate() {
        match t {
            0 if !allowzero => dims.push(
                *x.dims
                    .get(k)
                    .ok_or(format!("target dim {k} copies an input dim that is absent"))?,
            ),
            -1 if infer_at.is_none() => {
                infer_at = Some(k);
                dims.push(1);
            }
            t if t >= 0 => dims.push(t),
            t => return Err(format!("invalid target dim {t} in {target:?}")),
        }
    }
    let total = x.elems() as i64;
    let known = dims
        .iter()
        .try_fold(1i64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("target shape {target:?} is too large"))?;
    if let Some(k) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(format!(
                "cannot reshape {:?} ({total} elements) to {target:?}",
                x.dims
            ));
        }
        dims[k] = total / known;
    } else if known != total {
        return Err(format!(
            "cannot reshape {:?} ({total} elements) to {target:?} ({known} elements)",
            x.dims
        ));
    }
    let mut v = like(x, dims);
    v.ints = x.ints.clone();
    Ok(vec![v])
}

/// `Flatten`: a matrix of the dims before `axis` (default 1) by the dims from it.
fn rule_flatten(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let r = x.dims.len();
    let a = cx.n.int("axis").unwrap_or(1);
    let a = if a == r as i64 { r } else { axis(a, r.max(1))? };
    let outer: i64 = x.dims[..a].iter().product();
    let inner: i64 = x.dims[a..].iter().product();
    Ok(vec![like(x, vec![outer, inner])])
}

/// `Transpose` by `perm` (default: reversed axes), which must be a permutation.
fn rule_transpose(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let r = x.dims.len();
    let perm: Vec<usize> = match cx.n.ints("perm") {
        Some(p) => p
            .iter()
            .map(|&a| axis(a, r))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..r).rev().collect(),
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(format!("perm {perm:?} is not a permutation of {r} axes"));
    }
    Ok(vec![like(x, perm.iter().map(|&p| x.dims[p]).collect())])
}

/// `Squeeze` the given axes (each must be 1), or every 1 when none are given.
fn rule_squeeze(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let r = x.dims.len();
    let dims: Dims = match axes_of(cx.n, cx.ins, 1)? {
        Some(a) => {
            let a: Vec<usize> = a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?;
            for &k in &a {
                if x.dims[k] != 1 {
                    return Err(format!("cannot squeeze axis {k} of {:?}", x.dims));
                }
            }
            (0..r)
                .filter(|k| !a.contains(k))
                .map(|k| x.dims[k])
                .collect()
        }
        None => x.dims.iter().copied().filter(|&d| d != 1).collect(),
    };
    let mut v = like(x, dims);
    v.ints = x.ints.clone();
    Ok(vec![v])
}

/// `Unsqueeze`: a 1 at each of the axes (of the output's rank).
fn rule_unsqueeze(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let a = axes_of(cx.n, cx.ins, 1)?.ok_or("needs axes")?;
    let r = x.dims.len() + a.len();
    let mut a: Vec<usize> = a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?;
    a.sort_unstable();
    a.dedup();
    let mut src = x.dims.iter();
    let dims = (0..r)
        .map(|k| {
            if a.contains(&k) {
                1
            } else {
                *src.next().unwrap_or(&1)
            }
        })
        .collect();
    let mut v = like(x, dims);
    v.ints = x.ints.clone();
    Ok(vec![v])
}

/// `Shape`: the input's dims from `start` to `end` (clamped), as a folded integer vector.
fn rule_shape(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let r = x.dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clamp(cx.n.int("start").unwrap_or(0));
    let e = clamp(cx.n.int("end").unwrap_or(r));
    let d = x.dims[s..e.max(s)].to_vec();
    Ok(vec![ints(vec![d.len() as i64], d)])
}

/// `Constant`: see [`constant`].
fn rule_constant(cx: &Cx) -> Result<Vec<Value>, String> {
    Ok(vec![constant(cx.n)?])
}

/// `ConstantOfShape` with a computable shape; an integer fill of at most 2¹⁶ elements is
/// folded.
fn rule_constant_of_shape(cx: &Cx) -> Result<Vec<Value>, String> {
    let target = const_ints(cx.ins, 0)
        .ok_or("its shape input is not a constant the importer can compute")?
        .to_vec();
    check_size(&target)?;
    let mut v = float(target.clone());
    if let Some(Attr::Tensor { ints: Some(i), .. }) = cx.n.attrs.get("value") {
        let count = target.iter().product::<i64>();
        if count <= 1 << 16 && i.len() == 1 {
            v = ints(target, vec![i[0]; count as usize]);
        } else {
            v.elem = Elem::Int;
        }
    }
    Ok(vec![v])
}

/// `Expand`: the input broadcast with a computable target shape.
fn rule_expand(cx: &Cx) -> Result<Vec<Value>, String> {
    let x = cx.need(0)?;
    let target = const_ints(cx.ins, 1)
        .ok_or("its shape input is not a constant the importer can compute")?;
    Ok(vec![like(x, broadcast(&[&x.dims, target])?)])
}

/// `Slice`: see [`slice`].
fn rule_slice(cx: &Cx) -> Result<Vec<Value>, String> {
    Ok(vec![slice(cx.n, cx.ins, cx.need(0)?)?])
}

/// `Range` of integer constants: its length, and its contents up to 2¹⁶ elements.
fn rule_range(cx: &Cx) -> Result<Vec<Value>, String> {
    let scalar = |k: usize| const_ints(cx.ins, k).and_then(|v| v.first().copied());
    let (start, limit, delta) = match (scalar(0), scalar(1), scalar(2)) {
        (Some(a), Some(b), Some(c)) if c != 0 => (a, b, c),
        _ => {
            return Err("start, limit and delta must be integer constants, delta ≠ 0".into());
        }
    };
    let n = ((limit.saturating_sub(start) as f64) / delta as f64)
        .ceil()
        .max(0.0) as i64;
    check_size(&[n])?;
    let v = if n <= 1 << 16 {
        ints(vec![n], (0..n).map(|i| start + i * delta).collect())
    } else {
        let mut v = float(vec![n]);
        v.elem = Elem::Int;
        v
    };
    Ok(vec![v])
}

/// `Split` along `axis` into the given sizes (attribute or input), else into equal parts (the
/// last one smaller when the axis does not divide); the sizes must cover the axis.
fn rule_split(cx: &Cx) -> Result<Vec<Value>, String> {
    let n = cx.n;
    let x = cx.need(0)?;
    let a = axis(n.int("axis").unwrap_or(0), x.dims.len())?;
    let parts = n.outputs.len().max(1) as i64;
    let sizes: Vec<i64> = match n
        .ints("split")
        .map(<[i64]>::to_vec)
        .or_else(|| const_ints(cx.ins, 1).map(<[i64]>::to_vec))
    {
        Some(s) => s,
        None if x.dims[a] % parts == 0 => vec![x.dims[a] / parts; parts as usize],
        None => {
            let chunk = (x.dims[a] + parts - 1) / parts;
            (0..parts)
                .map(|i| chunk.min(x.dims[a] - i * chunk).max(0))
                .collect()
        }
    };
    if sizes.len() != n.outputs.len()
        || sizes.iter().sum::<i64>() != x.dims[a]
        || sizes.iter().any(|&s| s < 0)
    {
        return Err(format!(
            "split sizes {sizes:?} do not cover axis {a} of {:?} in {} outputs",
            x.dims,
            n.outputs.len()
        ));
    }
    Ok(sizes
        .iter()
        .map(|&s| {
            let mut d = x.dims.clone();
            d[a] = s;
            like(x, d)
        })
        .collect())
}

/// `Gather` along `axis`: the data's dims with the indices' dims in place of the axis; a 1-d
/// integer gather with known contents is folded.
fn rule_gather(cx: &Cx) -> Result<Vec<Value>, String> {
    let (data, idx) = (cx.need(0)?, cx.need(1)?);
    let a = axis(cx.n.int("axis").unwrap_or(0), data.dims.len())?;
    let mut dims = data.dims[..a].to_vec();
    dims.extend(&idx.dims);
    dims.extend(&data.dims[a + 1..]);
    let mut v = like(data, dims);
    if let (Some(d), Some(i), 1) = (&data.ints, &idx.ints, data.dims.len()) {
        let len = d.len() as i64;
        v.ints = i
            .iter()
            .map(|&k| {
                let k = if k < 0 { k + len } else { k };
                d.get(k as usize).copied()
            })
            .collect();
    }
    Ok(vec![v])
}

/// `ReduceMean` / `ReduceSum` / `ReduceMax` over the given axes (all when none, none with
/// `noop_with_empty_axes`), kept as 1s unless `keepdims=0`.
fn rule_reduce(cx: &Cx) -> Result<Vec<Value>, String> {
    let n = cx.n;
    let x = cx.need(0)?;
    let r = x.dims.len();
    let keep = n.int("keepdims").unwrap_or(1) != 0;
    let axes: Vec<usize> = match axes_of(n, cx.ins, 1)? {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
        _ if n.int("noop_with_empty_axes").unwrap_or(0) != 0 => Vec::new(),
        _ => (0..r).collect(),
    };
    let dims = (0..r)
        .filter_map(|k| match (axes.contains(&k), keep) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(x.dims[k]),
        })
        .collect();
    Ok(vec![like(x, dims)])
}

/// `Slice`: starts/ends/axes/steps from inputs (opset ≥ 10) or attributes (older).
fn slice(n: &Node, ins: &[Option<&Value>], x: &Value) -> Result<Value, String> {
    let get = |k: usize, attr: &str| -> Result<Option<Vec<i64>>, String> {
        if let Some(a) = n.ints(attr) {
            return Ok(Some(a.to_vec()));
        }
        match ins.get(k).copied().flatten() {
            None => Ok(None),
            Some(v) => v.ints.clone().map(Some).ok_or_else(|| {
                format!("its {attr} input is not a constant the importer can compute")
            }),
        }
    };
    let starts = get(1, "starts")?.ok_or("needs starts")?;
    let ends = get(2, "ends")?.ok_or("needs ends")?;
    let r = x.dims.len();
    let axes: Vec<usize> = match get(3, "axes")? {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = get(4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let mut dims = x.dims.clone();
    let mut folded = x.ints.clone().filter(|_| r == 1);
    for k in 0..starts.len() {
        let (a, step) = (axes[k], steps[k]);
        if step == 0 {
            return Err("a step of 0".into());
        }
        let d = x.dims[a];
        let clamp = |v: i64, lo: i64, hi: i64| {
            let v = if v < 0 { v.saturating_add(d) } else { v };
            v.clamp(lo, hi)
        };
        let (s, e) = if step > 0 {
            (clamp(starts[k], 0, d), clamp(ends[k], 0, d))
        } else {
            (clamp(starts[k], -1, d - 1), clamp(ends[k], -1, d - 1))
        };
        let len = if step > 0 {
            (e - s + step - 1).max(0) / step
        } else {
            (s - e - step - 1).max(0) / -step
        };
        dims[a] = len;
        folded = folded.map(|f| {
            (0..len)
                .filter_map(|i| f.get((s + i * step) as usize).copied())
                .collect()
        });
    }
    let mut v = like(x, dims);
    v.ints = folded;
    Ok(v)
}

fn fold_binary(op: &str, x: &[i64], y: &[i64], n: usize) -> Option<Vec<i64>> {
    if n > 1 << 16 || x.is_empty() || y.is_empty() {
        return None;
    }
    let at = |v: &[i64], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    if (x.len() != 1 && x.len() != n) || (y.len() != 1 && y.len() != n) {
        return None;
    }
    (0..n)
        .map(|i| {
            let (a, b) = (at(x, i), at(y, i));
            match op {
                "Add" => a.checked_add(b),
                "Sub" => a.checked_sub(b),
                "Mul" => a.checked_mul(b),
                "Div" => a.checked_div_euclid(b),
                "Max" => Some(a.max(b)),
                "Min" => Some(a.min(b)),
                _ => None,
            }
        })
        .collect()
}

fn constant(n: &Node) -> Result<Value, String> {
    if let Some(Attr::Tensor { dims, ints: i }) = n.attrs.get("value") {
        let mut v = float(dims.clone());
        if let Some(i) = i {
            v.elem = Elem::Int;
            v.ints = Some(i.clone());
        }
        return Ok(v);
    }
    if let Some(i) = n.int("value_int") {
        return Ok(ints(Vec::new(), vec![i]));
    }
    if let Some(i) = n.ints("value_ints") {
        return Ok(ints(vec![i.len() as i64], i.to_vec()));
    }
    if n.float("value_float").is_some() {
        return Ok(float(Vec::new()));
    }
    if let Some(Attr::Floats(f)) = n.attrs.get("value_floats") {
        return Ok(float(vec![f.len() as i64]));
    }
    Err("has no value attribute the importer reads (value, value_int(s), value_float(s))".into())
}

/// Spatial attributes of a conv or pool over `s` spatial dims: (kernel, strides, dilations,
/// pads begin, pads end).
type Window = (Dims, Dims, Dims, Dims, Dims);

fn window(n: &Node, x: &[i64], kernel: Dims) -> Result<(Window, Dims), String> {
    let s = kernel.len();
    if x.len() != s + 2 {
        return Err(format!(
            "input {x:?} does not have 2 + {s} dims for a {s}-d window"
        ));
    }
    let get = |name: &str, default: i64, len: usize| -> Result<Dims, String> {
        match n.ints(name) {
            Some(v) if v.len() == len => Ok(v.to_vec()),
            Some(v) => Err(format!(
                "attribute {name} has {} values, expected {len}",
                v.len()
            )),
            None => Ok(vec![default; len]),
        }
    };
    let strides = get("strides", 1, s)?;
    let dil = get("dilations", 1, s)?;
    let pads = get("pads", 0, 2 * s)?;
    if strides.iter().chain(&dil).chain(&kernel).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) {
        return Err("kernel, strides and dilations must be ≥ 1 and pads ≥ 0".into());
    }
    let auto = n.string("auto_pad").unwrap_or("NOTSET");
    let ceil = n.int("ceil_mode").unwrap_or(0) != 0;
    let (mut pb, mut pe) = (pads[..s].to_vec(), pads[s..].to_vec());
    let mut out = Vec::with_capacity(s);
    for k in 0..s {
        let inp = x[k + 2];
        let ek = (kernel[k] - 1).saturating_mul(dil[k]).saturating_add(1);
        let o = match auto {
            "SAME_UPPER" | "SAME_LOWER" => {
                let o = inp.saturating_add(strides[k] - 1) / strides[k];
                let total = ((o - 1).saturating_mul(strides[k]).saturating_add(ek) - inp).max(0);
                let (small, big) = (total / 2, total - total / 2);
                (pb[k], pe[k]) = if auto == "SAME_UPPER" {
                    (small, big)
                } else {
                    (big, small)
                };
                o
            }
            "VALID" => {
                (pb[k], pe[k]) = (0, 0);
                if inp < ek {
                    return Err(format!(
                        "window {ek} is larger than the input {inp} on spatial axis {k}"
                    ));
                }
                (inp - ek) / strides[k] + 1
            }
            "NOTSET" | "" => {
                let padded = inp.saturating_add(pb[k]).saturating_add(pe[k]);
                let span = padded - ek;
                if span < 0 {
                    return Err(format!(
                        "window {ek} is larger than the padded input {padded} on spatial axis {k}"
                    ));
                }
                let mut o = if ceil {
                    span.saturating_add(strides[k] - 1) / strides[k] + 1
                } else {
                    span / strides[k] + 1
                };
                if ceil && (o - 1).saturating_mul(strides[k]) >= inp.saturating_add(pb[k]) {
                    o -= 1;
                }
                o
            }
            other => return Err(format!("unknown auto_pad `{other}`")),
        };
        if o < 1 {
            return Err(format!("spatial axis {k} would have {o} outputs"));
        }
        out.push(o);
    }
    Ok(((kernel, strides, dil, pb, pe), out))
}

fn conv(n: &Node, x: &Value, w: &Value, b: Option<&Value>) -> Result<Value, String> {
    if w.dims.len() < 3 || w.dims.len() != x.dims.len() {
        return Err(format!(
            "weight {:?} and input {:?} must have the same rank ≥ 3",
            w.dims, x.dims
        ));
    }
    let g = n.int("group").unwrap_or(1);
    let (m, cg) = (w.dims[0], w.dims[1]);
    if g < 1 || Some(x.dims[1]) != cg.checked_mul(g) || m % g != 0 {
        return Err(format!(
            "input channels {} do not match weight {:?} with group {g}",
            x.dims[1], w.dims
        ));
    }
    let kernel = w.dims[2..].to_vec();
    if let Some(k) = n.ints("kernel_shape")
        && k != kernel.as_slice()
    {
        return Err(format!(
            "kernel_shape {k:?} disagrees with the weight {:?}",
            w.dims
        ));
    }
    if let Some(b) = b
        && b.dims != [m]
    {
        return Err(format!("bias {:?} must have shape [{m}]", b.dims));
    }
    let (_, spatial) = window(n, &x.dims, kernel)?;
    let mut d = vec![x.dims[0], m];
    d.extend(spatial);
    Ok(like(x, d))
}

fn pool(n: &Node, x: &Value) -> Result<Value, String> {
    let kernel = n
        .ints("kernel_shape")
        .ok_or("needs the attribute kernel_shape")?
        .to_vec();
    let (_, spatial) = window(n, &x.dims, kernel)?;
    let mut d = x.dims[..2].to_vec();
    d.extend(spatial);
    Ok(like(x, d))
}

/// (M, K, N) of a Gemm with its transposes.
pub fn gemm_mkn(n: &Node, a: &[i64], b: &[i64]) -> Result<(i64, i64, i64), String> {
    if a.len() != 2 || b.len() != 2 {
        return Err(format!("A {a:?} and B {b:?} must be matrices"));
    }
    let (m, k) = if n.int("transA").unwrap_or(0) != 0 {
        (a[1], a[0])
    } else {
        (a[0], a[1])
    };
    let (k2, nn) = if n.int("transB").unwrap_or(0) != 0 {
        (b[1], b[0])
    } else {
        (b[0], b[1])
    };
    if k != k2 {
        return Err(format!(
            "inner dims differ: A {a:?} gives K = {k}, B {b:?} gives K = {k2}"
        ));
    }
    Ok((m, k, nn))
}

fn gemm(n: &Node, a: &Value, b: &Value, c: Option<&Value>) -> Result<Value, String> {
    let (m, _, nn) = gemm_mkn(n, &a.dims, &b.dims)?;
    if let Some(c) = c {
        broadcast(&[&c.dims, &[m, nn]]).map_err(|_| {
            format!(
                "C {:?} does not broadcast to the output [{m}, {nn}]",
                c.dims
            )
        })?;
    }
    Ok(like(a, vec![m, nn]))
}

/// Batch dims, M, K, N of a numpy matmul.
pub fn matmul_dims(a: &[i64], b: &[i64]) -> Result<(Dims, i64, i64, i64, Dims), String> {
    if a.is_empty() || b.is_empty() {
        return Err("MatMul of a scalar".into());
    }
    let a2: Dims = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Dims = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, nn) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(format!("inner dims differ: {a:?} × {b:?}"));
    }
    let batch = broadcast(&[&a2[..a2.len() - 2], &b2[..b2.len() - 2]])?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(nn);
    }
    Ok((batch, m, k, nn, out))
}

fn matmul(a: &Value, b: &Value) -> Result<Value, String> {
    let (_, _, _, _, out) = matmul_dims(&a.dims, &b.dims)?;
    Ok(like(a, out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::proto::{self, *};
    use super::super::{Graph, InferOptions, OnnxError, from_proto};

    /// An attribute of a test node.
    pub enum A {
        I(i64),
        Is(&'static [i64]),
        S(&'static str),
    }

    pub fn node(op: &str, ins: &[&str], outs: &[&str], attrs: &[(&str, A)]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: outs[0].into(),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs
                .iter()
                .map(|(n, a)| {
                    let mut p = AttributeProto {
                        name: n.to_string(),
                        ..Default::default()
                    };
                    match a {
                        A::I(i) => (p.r#type, p.i) = (attribute_type::INT, *i),
                        A::Is(v) => (p.r#type, p.ints) = (attribute_type::INTS, v.to_vec()),
                        A::S(s) => {
                            (p.r#type, p.s) = (attribute_type::STRING, s.as_bytes().to_vec())
                        }
                    }
                    p
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A float weight with dims only, or an int64 tensor with values.
    pub fn init(name: &str, dims: &[i64], ints: Option<&[i64]>) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: if ints.is_some() {
                data_type::INT64
            } else {
                data_type::FLOAT
            },
            int64_data: ints.map(|v| v.to_vec()).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// An input with dims (negative = symbolic named `d<k>`).
    pub fn input(name: &str, dims: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeTensor {
                    elem_type: data_type::FLOAT,
                    shape: Some(TensorShapeProto {
                        dim: dims
                            .iter()
                            .enumerate()
                            .map(|(k, &d)| Dimension {
                                dim_value: (d >= 0).then_some(d),
                                dim_param: (d < 0).then(|| format!("d{k}")),
                            })
                            .collect(),
                    }),
                }),
            }),
            ..Default::default()
        }
    }

    pub fn model(
        nodes: Vec<NodeProto>,
        inputs: Vec<ValueInfoProto>,
        inits: Vec<TensorProto>,
        opset: i64,
    ) -> proto::ModelProto {
        let out = nodes
            .last()
            .map(|n| n.output[0].clone())
            .unwrap_or_default();
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(GraphProto {
                node: nodes,
                initializer: inits,
                input: inputs,
                output: vec![ValueInfoProto {
                    name: out,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn infer(m: &proto::ModelProto, batch: Option<i64>) -> Result<Graph, OnnxError> {
        from_proto(
            m,
            "t.onnx",
            &InferOptions {
                batch,
                ..Default::default()
            },
        )
    }

    /// Shape of value `v` after inferring a one-node model.
    fn check(
        n: NodeProto,
        inputs: &[(&str, &[i64])],
        inits: Vec<TensorProto>,
        opset: i64,
        expect: &[i64],
    ) {
        let out = n.output[0].clone();
        let m = model(
            vec![n],
            inputs.iter().map(|(n, d)| input(n, d)).collect(),
            inits,
            opset,
        );
        let g = infer(&m, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.values[&out].dims, expect);
    }

    fn check_err(n: NodeProto, inputs: &[(&str, &[i64])], inits: Vec<TensorProto>, expect: &str) {
        let m = model(
            vec![n],
            inputs.iter().map(|(n, d)| input(n, d)).collect(),
            inits,
            13,
        );
        let e = infer(&m, None).unwrap_err().to_string();
        assert!(e.contains(expect), "{e}");
    }

    #[test]
    fn conv_padding_modes() {
        let w = || vec![init("w", &[8, 3, 3, 3], None)];
        let x: &[(&str, &[i64])] = &[("x", &[2, 3, 15, 15])];
        let c = |attrs: &[(&str, A)]| node("Conv", &["x", "w"], &["y"], attrs);
        check(c(&[]), x, w(), 13, &[2, 8, 13, 13]);
        check(
            c(&[("pads", A::Is(&[1, 1, 1, 1])), ("strides", A::Is(&[2, 2]))]),
            x,
            w(),
            13,
            &[2, 8, 8, 8],
        );
        check(
            c(&[
                ("auto_pad", A::S("SAME_UPPER")),
                ("strides", A::Is(&[2, 2])),
            ]),
            x,
            w(),
            13,
            &[2, 8, 8, 8],
        );
        check(
            c(&[("auto_pad", A::S("VALID")), ("dilations", A::Is(&[2, 2]))]),
            x,
            w(),
            13,
            &[2, 8, 11, 11],
        );
        check_err(
            c(&[("group", A::I(2))]),
            x,
            w(),
            "input channels 3 do not match weight [8, 3, 3, 3] with group 2",
        );
    }

    #[test]
    fn pooling_floor_and_ceil() {
        let x: &[(&str, &[i64])] = &[("x", &[1, 4, 10, 10])];
        let p = |ceil| {
            node(
                "MaxPool",
                &["x"],
                &["y"],
                &[
                    ("kernel_shape", A::Is(&[3, 3])),
                    ("strides", A::Is(&[2, 2])),
                    ("ceil_mode", A::I(ceil)),
                ],
            )
        };
        check(p(0), x, vec![], 13, &[1, 4, 4, 4]);
        check(p(1), x, vec![], 13, &[1, 4, 5, 5]);
    }

    #[test]
    fn matmul_broadcasts_and_gemm_transposes() {
        check(
            node("MatMul", &["a", "b"], &["y"], &[]),
            &[("a", &[2, 1, 5, 3]), ("b", &[4, 3, 6])],
            vec![],
            13,
            &[2, 4, 5, 6],
        );
        check(
            node("MatMul", &["a", "b"], &["y"], &[]),
            &[("a", &[3]), ("b", &[2, 3, 6])],
            vec![],
            13,
            &[2, 6],
        );
        check(
            node(
                "Gemm",
                &["a", "b"],
                &["y"],
                &[("transA", A::I(1)), ("transB", A::I(1))],
            ),
            &[("a", &[7, 5]), ("b", &[9, 7])],
            vec![],
            13,
            &[5, 9],
        );
        check_err(
            node("MatMul", &["a", "b"], &["y"], &[]),
            &[("a", &[5, 3]), ("b", &[4, 6])],
            vec![],
            "inner dims differ",
        );
    }

    #[test]
    fn reshape_copies_zeros_and_infers_minus_one() {
        let x: &[(&str, &[i64])] = &[("x", &[2, 3, 4, 5])];
        let r = || node("Reshape", &["x", "s"], &["y"], &[]);
        check(
            r(),
            x,
            vec![init("s", &[3], Some(&[0, -1, 5]))],
            13,
            &[2, 12, 5],
        );
        check_err(
            r(),
            x,
            vec![init("s", &[2], Some(&[7, -1]))],
            "cannot reshape [2, 3, 4, 5] (120 elements) to [7, -1]",
        );
        check_err(
            r(),
            x,
            vec![init("s", &[2], None)],
            "its shape input is not a constant",
        );
    }

    #[test]
    fn unsqueeze_and_squeeze_by_attribute_or_input() {
        let x: &[(&str, &[i64])] = &[("x", &[3, 4])];
        check(
            node("Unsqueeze", &["x"], &["y"], &[("axes", A::Is(&[0, -1]))]),
            x,
            vec![],
            11,
            &[1, 3, 4, 1],
        );
        check(
            node("Unsqueeze", &["x", "a"], &["y"], &[]),
            x,
            vec![init("a", &[1], Some(&[1]))],
            13,
            &[3, 1, 4],
        );
        check(
            node("Squeeze", &["x"], &["y"], &[]),
            &[("x", &[1, 3, 1])],
            vec![],
            13,
            &[3],
        );
    }

    #[test]
    fn shape_arithmetic_is_folded_into_a_reshape_target() {
        // y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0) * Gather(Shape(x), 1)), [-1]))
        let nodes = vec![
            node("Shape", &["x"], &["s"], &[]),
            node("Gather", &["s", "i0"], &["a"], &[]),
            node("Gather", &["s", "i1"], &["b"], &[]),
            node("Mul", &["a", "b"], &["ab"], &[]),
            node("Unsqueeze", &["ab", "ax"], &["u"], &[]),
            node("Concat", &["u", "m1"], &["t"], &[("axis", A::I(0))]),
            node("Reshape", &["x", "t"], &["y"], &[]),
        ];
        let inits = vec![
            init("i0", &[], Some(&[0])),
            init("i1", &[], Some(&[1])),
            init("ax", &[1], Some(&[0])),
            init("m1", &[1], Some(&[-1])),
        ];
        let m = model(nodes, vec![input("x", &[-1, 5, 6])], inits, 13);
        let g = infer(&m, Some(4)).unwrap();
        assert_eq!(g.values["t"].ints.as_deref(), Some(&[20, -1][..]));
        assert_eq!(g.values["y"].dims, [20, 6]);
        assert_eq!(g.batch, 4);
    }

    #[test]
    fn symbolic_dims_need_sizes() {
        let m = model(
            vec![node("Relu", &["x"], &["y"], &[])],
            vec![input("x", &[-1, -1])],
            vec![],
            13,
        );
        let e = infer(&m, None).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.onnx: graph input `x` has a dynamic batch dimension (`d0`); give the batch size with --batch N"
        );
        let e = infer(&m, Some(2)).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.onnx: graph input `x` dim 1 (`d1`) is dynamic; give it with --dim d1=N"
        );
        let g = from_proto(
            &m,
            "t.onnx",
            &InferOptions {
                batch: Some(2),
                dims: [("d1".to_string(), 9)].into_iter().collect(),
            },
        )
        .unwrap();
        assert_eq!(g.values["y"].dims, [2, 9]);
        let e = infer(&m, Some(0)).unwrap_err().to_string();
        assert!(e.contains("batch size must be at least 1"), "{e}");
    }

    #[test]
    fn graph_errors_name_the_node() {
        let m = model(
            vec![node("Relu", &["nope"], &["y"], &[])],
            vec![input("x", &[1])],
            vec![],
            13,
        );
        let e = infer(&m, None).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.onnx: node #0 `y` (Relu): input `nope` is neither a graph input, an initializer nor another node's output"
        );
        let mut n = node("Relu", &["x"], &["y"], &[]);
        n.domain = "com.microsoft".into();
        let m = model(vec![n], vec![input("x", &[1])], vec![], 13);
        let e = infer(&m, None).unwrap_err().to_string();
        assert!(
            e.contains("domain `com.microsoft` are not supported"),
            "{e}"
        );
        // A cycle: a → b → a.
        let m = model(
            vec![
                node("Add", &["x", "b"], &["a"], &[]),
                node("Relu", &["a"], &["b"], &[]),
            ],
            vec![input("x", &[1])],
            vec![],
            13,
        );
        assert!(infer(&m, None).unwrap_err().to_string().contains("cycle"));
    }

    #[test]
    fn nodes_out_of_order_are_sorted() {
        let m = model(
            vec![
                node("Relu", &["a"], &["b"], &[]),
                node("Neg", &["x"], &["a"], &[]),
            ],
            vec![input("x", &[3])],
            vec![],
            13,
        );
        let g = infer(&m, None).unwrap();
        assert_eq!(
            g.nodes
                .iter()
                .map(|n| n.op_type.as_str())
                .collect::<Vec<_>>(),
            ["Neg", "Relu"]
        );
        assert_eq!(g.values["b"].dims, [3]);
    }

    #[test]
    fn slice_and_expand() {
        let x: &[(&str, &[i64])] = &[("x", &[2, 10, 6])];
        let sl = || node("Slice", &["x", "s", "e", "a", "st"], &["y"], &[]);
        let c = |name: &str, v: &'static [i64]| init(name, &[v.len() as i64], Some(v));
        check(
            sl(),
            x,
            vec![c("s", &[1]), c("e", &[-1]), c("a", &[1]), c("st", &[1])],
            13,
            &[2, 8, 6],
        );
        // Backwards by 2 from the last element: indices 5, 3, 1.
        check(
            sl(),
            x,
            vec![c("s", &[-1]), c("e", &[-100]), c("a", &[2]), c("st", &[-2])],
            13,
            &[2, 10, 3],
        );
        check(
            node(
                "Slice",
                &["x"],
                &["y"],
                &[
                    ("starts", A::Is(&[0])),
                    ("ends", A::Is(&[1])),
                    ("axes", A::Is(&[0])),
                ],
            ),
            x,
            vec![],
            9,
            &[1, 10, 6],
        );
        check(
            node("Expand", &["x", "t"], &["y"], &[]),
            &[("x", &[3, 1])],
            vec![c("t", &[2, 3, 4])],
            13,
            &[2, 3, 4],
        );
        check_err(
            node("Expand", &["x", "t"], &["y"], &[]),
            &[("x", &[3, 2])],
            vec![c("t", &[3, 4])],
            "do not broadcast",
        );
    }

    #[test]
    fn every_supported_operator_has_a_rule() {
        // An op without a shape rule fails with "unsupported operator type"; every listed one
        // gets past that check (it may still want inputs the one-input graph lacks).
        for op in super::SUPPORTED {
            let m = model(
                vec![node(op, &["x"], &["y"], &[])],
                vec![input("x", &[2, 3])],
                vec![],
                13,
            );
            if let Err(e) = infer(&m, None) {
                assert!(
                    !e.to_string().contains("unsupported operator type"),
                    "{op}: {e}"
                );
            }
        }
        let m = model(
            vec![node("NonMaxSuppression", &["x"], &["y"], &[])],
            vec![input("x", &[2])],
            vec![],
            13,
        );
        let e = infer(&m, None).unwrap_err().to_string();
        assert!(
            e.contains("unsupported operator type `NonMaxSuppression`; supported: Abs, Add, And,"),
            "{e}"
        );
        assert!(super::SUPPORTED.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn split_and_range() {
        let mut n = node("Split", &["x"], &["a", "b", "c"], &[("axis", A::I(1))]);
        let m = model(vec![n.clone()], vec![input("x", &[2, 9])], vec![], 13);
        let g = infer(&m, None).unwrap();
        assert_eq!(
            [&g.values["a"].dims, &g.values["c"].dims],
            [&[2, 3], &[2, 3]]
        );
        n.attribute.push(
            node("X", &[], &["z"], &[("split", A::Is(&[2, 3, 4]))])
                .attribute
                .remove(0),
        );
        let m = model(vec![n], vec![input("x", &[2, 9])], vec![], 11);
        let g = infer(&m, None).unwrap();
        assert_eq!(g.values["c"].dims, [2, 4]);
        let r = node("Range", &["s", "l", "d"], &["y"], &[]);
        let c = |name: &str, v: i64| init(name, &[], Some(&[v][..]));
        let m = model(
            vec![r],
            vec![input("x", &[1])],
            vec![c("s", 2), c("l", 11), c("d", 3)],
            13,
        );
        let g = infer(&m, None).unwrap();
        assert_eq!(g.values["y"].ints.as_deref(), Some(&[2, 5, 8][..]));
    }
}
