//! ONNX import: decode a model file (protobuf through prost, messages in `proto.rs`), check it,
//! and infer every value's concrete shape at a chosen batch size (`shape.rs`), giving a
//! [`Graph`] of nodes with shapes that the lower-bound analysis turns into layers.
//!
//! What is read: the nodes, their attributes, the initializers' dims (their data only when they
//! are small integer tensors such as Reshape shapes), the graph inputs' declared shapes. Weight
//! values are never needed: a file whose initializers carry dims but no data imports the same.
//!
//! Errors are [`OnnxError`]s naming the file and the place: the byte offset of a broken protobuf
//! field, or the node's index, name and op type.

pub mod proto;
pub mod shape;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use prost::Message;

pub use shape::{Dims, InferOptions};

/// Why an ONNX file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("{file}: failed to read: {message}")]
    Io { file: String, message: String },
    /// The protobuf is malformed; `offset` is where the walk of the wire format broke.
    #[error("{file}: not a valid ONNX protobuf ({where_}): {message}")]
    Decode {
        file: String,
        where_: String,
        message: String,
    },
    /// The model is well-formed protobuf but not a usable graph.
    #[error("{file}: {message}")]
    Model { file: String, message: String },
    /// One node cannot be imported or shape-inferred.
    #[error("{file}: node #{index} `{name}` ({op_type}): {message}")]
    Node {
        file: String,
        index: usize,
        name: String,
        op_type: String,
        message: String,
    },
}

/// A node attribute, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    /// A tensor attribute (Constant's `value`): dims and, for integer tensors, the values.
    Tensor {
        dims: Vec<i64>,
        ints: Option<Vec<i64>>,
    },
    /// Any other kind (graphs, strings lists): kept by name only.
    Other,
}

/// One node of the graph, as in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Position in the file's node list.
    pub index: usize,
    /// The node's name, or `#index` when the file gives none.
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: BTreeMap<String, Attr>,
}

impl Node {
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name) {
            Some(Attr::Int(i)) => Some(*i),
            _ => None,
        }
    }
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name) {
            Some(Attr::Ints(v)) => Some(v),
            _ => None,
        }
    }
    pub fn float(&self, name: &str) -> Option<f32> {
        match self.attrs.get(name) {
            Some(Attr::Float(f)) => Some(*f),
            _ => None,
        }
    }
    pub fn string(&self, name: &str) -> Option<&str> {
        match self.attrs.get(name) {
            Some(Attr::Str(s)) => Some(s),
            _ => None,
        }
    }
    /// The `i`-th input's name, `None` when absent or omitted.
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

/// A value's element type, as far as costs care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Float,
    Int,
    Other,
}

impl Elem {
    fn from_onnx(t: i32) -> Elem {
        use proto::data_type as d;
        match t {
            d::FLOAT | d::FLOAT16 | d::BFLOAT16 | d::DOUBLE => Elem::Float,
            d::INT64 | d::INT32 | d::INT8 | d::UINT8 | d::BOOL => Elem::Int,
            _ => Elem::Other,
        }
    }
}

/// A value of the graph after shape inference.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub dims: Vec<i64>,
    pub elem: Elem,
    /// An initializer (a weight, or a constant input).
    pub initializer: bool,
    /// Known integer contents (small constants and shape computations), for Reshape and friends.
    pub ints: Option<Vec<i64>>,
    /// Computable before the model runs (from initializers, constants and shapes only): runtimes
    /// fold such values when they load a model, so the nodes making them cost nothing.
    pub constant: bool,
}

impl Value {
    /// Number of elements.
    pub fn elems(&self) -> u64 {
        self.dims
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64))
    }
}

/// A decoded graph with every value's shape inferred.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The file name, for messages.
    pub file: String,
    pub name: String,
    /// Version of the default (`ai.onnx`) operator set.
    pub opset: i64,
    /// Nodes in a topological order (the file's order when it is one).
    pub nodes: Vec<Node>,
    pub values: HashMap<String, Value>,
    /// Graph inputs that are not initializers, in file order.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// The batch size the shapes were inferred at (dim 0 of the first input).
    pub batch: i64,
    /// Non-fatal oddities (a declared output shape that disagrees with inference, ...).
    pub warnings: Vec<String>,
}

/// Decode an ONNX model from bytes (no shape inference). `file` names it in errors.
pub fn decode(bytes: &[u8], file: &str) -> Result<proto::ModelProto, OnnxError> {
    proto::ModelProto::decode(bytes).map_err(|e| {
        let where_ = match wire::locate(bytes) {
            Some((offset, what)) => format!("at byte {offset}: {what}"),
            None => "byte offset unknown".to_string(),
        };
        OnnxError::Decode {
            file: file.to_string(),
            where_,
            message: e.to_string(),
        }
    })
}

/// Read, decode and shape-infer an ONNX file.
pub fn load(path: &Path, opts: &InferOptions) -> Result<Graph, OnnxError> {
    let file = path.display().to_string();
    let bytes = crate::input::read_bytes(path, crate::input::InputKind::Onnx).map_err(|e| {
        OnnxError::Io {
            file: file.clone(),
            message: e.to_string(),
        }
    })?;
    import(&bytes, &file, opts)
}

/// Decode and shape-infer an ONNX model held in memory.
pub fn import(bytes: &[u8], file: &str, opts: &InferOptions) -> Result<Graph, OnnxError> {
    let model = decode(bytes, file)?;
    from_proto(&model, file, opts)
}

/// Integer contents of a tensor proto, when it is an integer tensor with its data inline.
fn tensor_ints(t: &proto::TensorProto) -> Option<Vec<i64>> {
    use proto::data_type as d;
    let n: i64 = t.dims.iter().product();
    if n > 1 << 16 {
        return None;
    }
    let v: Vec<i64> = match t.data_type {
        d::INT64 if !t.int64_data.is_empty() => t.int64_data.clone(),
        d::INT64 if !t.raw_data.is_empty() => t
            .raw_data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        d::INT32 if !t.int32_data.is_empty() => t.int32_data.iter().map(|&x| x as i64).collect(),
        d::INT32 if !t.raw_data.is_empty() => t
            .raw_data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
            .collect(),
        _ => return None,
    };
    (v.len() as i64 == n).then_some(v)
}

fn decode_attr(a: &proto::AttributeProto) -> Attr {
    use proto::attribute_type as t;
    match a.r#type {
        t::INT => Attr::Int(a.i),
        t::FLOAT => Attr::Float(a.f),
        t::STRING => Attr::Str(String::from_utf8_lossy(&a.s).into_owned()),
        t::INTS => Attr::Ints(a.ints.clone()),
        t::FLOATS => Attr::Floats(a.floats.clone()),
        t::TENSOR => match &a.t {
            Some(tp) => Attr::Tensor {
                dims: tp.dims.clone(),
                ints: tensor_ints(tp),
            },
            None => Attr::Other,
        },
        // IR version 1 files carry no type: guess from the field that is set.
        0 if !a.ints.is_empty() => Attr::Ints(a.ints.clone()),
        0 if !a.floats.is_empty() => Attr::Floats(a.floats.clone()),
        0 if !a.s.is_empty() => Attr::Str(String::from_utf8_lossy(&a.s).into_owned()),
        _ => Attr::Other,
    }
}

/// Build the graph from a decoded model and infer its shapes.
pub fn from_proto(
    model: &proto::ModelProto,
    file: &str,
    opts: &InferOptions,
) -> Result<Graph, OnnxError> {
    let model_err = |message: String| OnnxError::Model {
        file: file.to_string(),
        message,
    };
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| model_err("the model has no graph (field 7 of ModelProto)".into()))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .unwrap_or(if model.opset_import.is_empty() { 1 } else { 0 });
    if opset == 0 {
        return Err(model_err(
            "the model imports no version of the default operator set (ai.onnx)".into(),
        ));
    }
    let mut values: HashMap<String, Value> = HashMap::new();
    for t in &g.initializer {
        if let Err(m) = shape::check_size(&t.dims) {
            return Err(model_err(format!("initializer `{}`: {m}", t.name)));
        }
        values.insert(
            t.name.clone(),
            Value {
                dims: t.dims.clone(),
                elem: Elem::from_onnx(t.data_type),
                initializer: true,
                ints: tensor_ints(t),
                constant: true,
            },
        );
    }
    let nodes: Vec<Node> = g
        .node
        .iter()
        .enumerate()
        .map(|(index, n)| Node {
            index,
            name: if n.name.is_empty() {
                format!("#{index}")
            } else {
                n.name.clone()
            },
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            inputs: n.input.clone(),
            outputs: n.output.clone(),
            attrs: n
                .attribute
                .iter()
                .map(|a| (a.name.clone(), decode_attr(a)))
                .collect(),
        })
        .collect();
    let nodes = topo_order(nodes, &values, g, file)?;
    let mut graph = Graph {
        file: file.to_string(),
        name: g.name.clone(),
        opset,
        nodes,
        values,
        inputs: Vec::new(),
        outputs: g.output.iter().map(|o| o.name.clone()).collect(),
        batch: 0,
        warnings: Vec::new(),
    };
    shape::bind_inputs(&mut graph, &g.input, opts)?;
    shape::infer(&mut graph)?;
    Ok(graph)
}

/// The nodes in a topological order: the file's when it is one (the ONNX rule), else Kahn's with
/// the file order as tie-break. A value no node, input or initializer makes is an error.
fn topo_order(
    nodes: Vec<Node>,
    values: &HashMap<String, Value>,
    g: &proto::GraphProto,
    file: &str,
) -> Result<Vec<Node>, OnnxError> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for n in &nodes {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            if producer.insert(o, n.index).is_some() || values.contains_key(o.as_str()) {
                return Err(OnnxError::Node {
                    file: file.into(),
                    index: n.index,
                    name: n.name.clone(),
                    op_type: n.op_type.clone(),
                    message: format!("output `{o}` is produced twice"),
                });
            }
        }
    }
    let graph_inputs: std::collections::HashSet<&str> =
        g.input.iter().map(|i| i.name.as_str()).collect();
    let mut indeg = vec![0usize; nodes.len()];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for n in &nodes {
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            match producer.get(i.as_str()) {
                Some(&p) => {
                    indeg[n.index] += 1;
                    succ[p].push(n.index);
                }
                None if values.contains_key(i.as_str()) || graph_inputs.contains(i.as_str()) => {}
                None => {
                    return Err(OnnxError::Node {
                        file: file.into(),
                        index: n.index,
                        name: n.name.clone(),
                        op_type: n.op_type.clone(),
                        message: format!(
                            "input `{i}` is neither a graph input, an initializer nor another \
                             node's output"
                        ),
                    });
                }
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert(s);
            }
        }
    }
    if order.len() < nodes.len() {
        let stuck = (0..nodes.len()).find(|&i| indeg[i] > 0).unwrap_or(0);
        let n = &nodes[stuck];
        return Err(OnnxError::Node {
            file: file.into(),
            index: n.index,
            name: n.name.clone(),
            op_type: n.op_type.clone(),
            message: "the graph has a cycle through this node".into(),
        });
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each node once"))
        .collect())
}
