//! PyTorch host execution traces (`torch.profiler.ExecutionTraceObserver`, JSON, plain or gzip):
//! the operator tree of one iteration with every operator's inputs and outputs (values, shapes,
//! types; tensors as `[tensor id, storage id, offset, elements, bytes per element, device]`).
//!
//! Two layouts exist in the wild and both are read into the same [`HostNode`]:
//! * schema `1.0.x`: flat fields — `parent`, `rf_id`, `tid`, `op_schema`, `inputs` (a list of
//!   values), `input_shapes`, `input_types`, and the same for outputs;
//! * schema `1.1.x` (`1.1.0-chakra.0.0.4`): `ctrl_deps` (the parent), `inputs`/`outputs` as
//!   `{values, shapes, types}` objects, and everything else as typed `attrs` (`rf_id`, `tid`,
//!   and on `record_param_comms` the collective's name, dtype, element counts and process group).
//!
//! From the nodes: [`HostEt::data_deps`] (producer → consumer by tensor id) and
//! [`HostEt::comm_calls`] (the collectives with their sizes, in issue order). The document is
//! deserialised into typed structs node by node; only operator argument values, whose type varies
//! per argument, are kept as small `serde_json::Value`s.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use serde_json::Value;

use super::TraceError;
use crate::input::{self, InputKind};

const FORMAT: &str = "PyTorch host execution trace";

/// One operator argument (input or output).
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub value: Value,
    pub shape: Value,
    /// As written: `Tensor(float)`, `GenericList[Tensor(float)]`, `Int`, `String`, ...
    pub ty: String,
}

/// A tensor as the execution trace identifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub id: u64,
    pub storage_id: u64,
    pub offset: u64,
    pub elems: u64,
    pub elem_bytes: u64,
    pub device: Option<String>,
}

impl TensorRef {
    pub fn bytes(&self) -> u64 {
        self.elems.saturating_mul(self.elem_bytes)
    }

    fn from_value(v: &Value) -> Option<TensorRef> {
        let a = v.as_array()?;
        // Five numbers, then (newer PyTorch) the device as a string.
        if !(a.len() == 5 || a.len() == 6 && a[5].is_string()) {
            return None;
        }
        let n = |i: usize| a[i].as_u64();
        Some(TensorRef {
            id: n(0)?,
            storage_id: n(1)?,
            offset: n(2)?,
            elems: n(3)?,
            elem_bytes: n(4)?,
            device: a.get(5).and_then(|d| d.as_str()).map(str::to_string),
        })
    }
}

impl Arg {
    /// The tensors in this argument (one for `Tensor(...)`, several for lists of tensors).
    pub fn tensors(&self) -> Vec<TensorRef> {
        let mut out = Vec::new();
        if self.ty.contains("Tensor") {
            collect_tensors(&self.value, &mut out, 0);
        }
        out
    }
}

fn collect_tensors(v: &Value, out: &mut Vec<TensorRef>, depth: usize) {
    if depth > 8 {
        return;
    }
    if let Some(t) = TensorRef::from_value(v) {
        out.push(t);
    } else if let Some(a) = v.as_array() {
        for x in a {
            collect_tensors(x, out, depth + 1);
        }
    }
}

/// One operator (or annotation) node.
#[derive(Clone, Debug, PartialEq)]
pub struct HostNode {
    pub id: u64,
    pub name: String,
    /// The enclosing node (`parent`, or `ctrl_deps` in schema 1.1).
    pub parent: Option<u64>,
    /// Record-function id: the same number the Kineto trace of the run writes as `Record function
    /// id` on the operator's `cpu_op` event (newer PyTorch).
    pub rf_id: Option<u64>,
    pub tid: Option<i64>,
    pub op_schema: String,
    pub inputs: Vec<Arg>,
    pub outputs: Vec<Arg>,
    /// Schema-1.1 `attrs` by name (flat fields of schema 1.0 that have no own field here too).
    pub attrs: BTreeMap<String, Value>,
}

impl HostNode {
    fn attr_str(&self, k: &str) -> Option<&str> {
        self.attrs.get(k).and_then(Value::as_str)
    }
    fn attr_u64(&self, k: &str) -> Option<u64> {
        self.attrs.get(k).and_then(Value::as_u64)
    }
}

/// A whole host execution trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostEt {
    pub schema: String,
    pub pid: Option<i64>,
    pub start_ts: Option<i64>,
    pub finish_ts: Option<i64>,
    /// Nodes sorted by id (ids are assigned when an operator starts, so this is issue order).
    pub nodes: Vec<HostNode>,
}

/// The type of a collective, the same across host ETs, Kineto kernel names and Chakra.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum CollectiveKind {
    AllReduce,
    AllToAll,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    Send,
    Recv,
    /// NCCL's point-to-point kernel (`SendRecv`): all-to-all, send/recv, gather/scatter.
    SendRecv,
    Barrier,
    Other(String),
}

impl CollectiveKind {
    /// From a collective name as PyTorch writes it (`allreduce`, `all_to_allv`, `nccl:all_reduce`,
    /// `_allgather_base`, `reduce_scatter_tensor_coalesced`, ...).
    pub fn parse(name: &str) -> CollectiveKind {
        let n: String = name
            .trim()
            .trim_start_matches("nccl:")
            .trim_start_matches("c10d::")
            .chars()
            .filter(|c| *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        let has = |s: &str| n.contains(s);
        if has("alltoall") {
            CollectiveKind::AllToAll
        } else if has("allreduce") {
            CollectiveKind::AllReduce
        } else if has("allgather") {
            CollectiveKind::AllGather
        } else if has("reducescatter") {
            CollectiveKind::ReduceScatter
        } else if has("broadcast") {
            CollectiveKind::Broadcast
        } else if has("sendrecv") {
            CollectiveKind::SendRecv
        } else if has("reduce") {
            CollectiveKind::Reduce
        } else if has("gather") {
            CollectiveKind::Gather
        } else if has("scatter") {
            CollectiveKind::Scatter
        } else if has("barrier") {
            CollectiveKind::Barrier
        } else if n.starts_with("send") {
            CollectiveKind::Send
        } else if n.starts_with("recv") {
            CollectiveKind::Recv
        } else {
            CollectiveKind::Other(name.to_string())
        }
    }

    /// Whether a GPU kernel of kind `self` can implement a host call of kind `call`.
    pub fn kernel_runs(&self, call: &CollectiveKind) -> bool {
        use CollectiveKind::*;
        self == call
            || *self == SendRecv && matches!(call, AllToAll | Send | Recv | Gather | Scatter)
            || *self == AllReduce && *call == Barrier
    }
}

/// Bytes per element of a dtype as PyTorch names it in traces (`Float`, `float`, `c10::Half`,
/// `long int`, `BFloat16`, ...); `None` when unknown.
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    let d = dtype
        .trim()
        .trim_start_matches("c10::")
        .to_ascii_lowercase()
        .replace([' ', '_'], "");
    Some(match d.as_str() {
        "float" | "float32" | "int" | "int32" | "uint32" | "unsignedint" | "complexhalf" => 4,
        "double" | "float64" | "long" | "longint" | "int64" | "uint64" | "complexfloat"
        | "unsignedlong" | "longlongint" => 8,
        "half" | "float16" | "bfloat16" | "short" | "int16" | "shortint" | "uint16" => 2,
        "byte" | "char" | "uint8" | "int8" | "unsignedchar" | "signedchar" | "bool"
        | "float8e4m3fn" | "float8e5m2" | "float8e4m3fnuz" | "float8e5m2fnuz" => 1,
        "complexdouble" => 16,
        _ => return None,
    })
}

/// One communication call of the host ET, with its size.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CommCall {
    pub kind: CollectiveKind,
    /// The collective's name as written (`allreduce`, `all_to_allv`, ...).
    pub name: String,
    /// Bytes this rank sends (the input message).
    pub bytes: u64,
    /// Bytes this rank receives, when known (differs from `bytes` for uneven all-to-all).
    pub out_bytes: Option<u64>,
    pub dtype: Option<String>,
    /// Process group: its name (schema 1.1), or the number recorded in its place (schema 1.0
    /// writes the group object's address).
    pub pg: Option<String>,
    /// Global ranks of the group, when recorded.
    pub ranks: Option<Vec<u32>>,
    /// Group size, when recorded (ranks, or the number of all-to-all splits).
    pub group_size: Option<u32>,
    pub host_et_node_id: u64,
    pub rf_id: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// Raw serde layout (both schemas)
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct RawEt {
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    start_ts: Option<i64>,
    #[serde(default)]
    finish_ts: Option<i64>,
    nodes: Option<Vec<RawNode>>,
}

#[derive(Deserialize, Default)]
#[serde(untagged)]
enum RawIo {
    Object {
        #[serde(default)]
        values: Vec<Value>,
        #[serde(default)]
        shapes: Vec<Value>,
        #[serde(default)]
        types: Vec<Value>,
    },
    List(Vec<Value>),
    #[default]
    Missing,
}

#[derive(Deserialize)]
struct RawAttr {
    name: String,
    #[serde(default)]
    value: Value,
}

#[derive(Deserialize)]
struct RawNode {
    id: u64,
    #[serde(default)]
    name: String,
    #[serde(default)]
    parent: Option<i64>,
    #[serde(default)]
    ctrl_deps: Option<Value>,
    #[serde(default)]
    rf_id: Option<u64>,
    #[serde(default)]
    tid: Option<i64>,
    #[serde(default)]
    op_schema: Option<String>,
    #[serde(default)]
    inputs: RawIo,
    #[serde(default)]
    input_shapes: Vec<Value>,
    #[serde(default)]
    input_types: Vec<Value>,
    #[serde(default)]
    outputs: RawIo,
    #[serde(default)]
    output_shapes: Vec<Value>,
    #[serde(default)]
    output_types: Vec<Value>,
    #[serde(default)]
    attrs: Vec<RawAttr>,
}

fn args(io: RawIo, shapes: Vec<Value>, types: Vec<Value>) -> Vec<Arg> {
    let (values, shapes, types) = match io {
        RawIo::Object {
            values,
            shapes,
            types,
        } => (values, shapes, types),
        RawIo::List(values) => (values, shapes, types),
        RawIo::Missing => (Vec::new(), shapes, types),
    };
    let mut shapes = shapes.into_iter();
    let mut types = types.into_iter();
    values
        .into_iter()
        .map(|value| Arg {
            value,
            shape: shapes.next().unwrap_or(Value::Null),
            ty: match types.next() {
                Some(Value::String(s)) => s,
                _ => String::new(),
            },
        })
        .collect()
}

impl RawNode {
    fn normalise(self) -> HostNode {
        let mut attrs: BTreeMap<String, Value> = BTreeMap::new();
        for a in self.attrs {
            attrs.entry(a.name).or_insert(a.value);
        }
        let parent =
            self.parent
                .and_then(|p| u64::try_from(p).ok())
                .or_else(|| match &self.ctrl_deps {
                    Some(Value::Number(n)) => n.as_u64(),
                    Some(Value::Array(a)) => a.first().and_then(Value::as_u64),
                    _ => None,
                });
        let rf_id = self
            .rf_id
            .or_else(|| attrs.get("rf_id").and_then(Value::as_u64));
        let tid = self
            .tid
            .or_else(|| attrs.get("tid").and_then(Value::as_i64));
        let op_schema = self
            .op_schema
            .or_else(|| {
                attrs
                    .get("op_schema")
                    .and_then(Value::as_str)
                    .map(Into::into)
            })
            .unwrap_or_default();
        HostNode {
            id: self.id,
            name: self.name,
            parent,
            rf_id,
            tid,
            op_schema,
            inputs: args(self.inputs, self.input_shapes, self.input_types),
            outputs: args(self.outputs, self.output_shapes, self.output_types),
            attrs,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Reads a host execution trace (`.json` or gzip, detected by content).
pub fn read_host_et(path: &Path) -> Result<HostEt, TraceError> {
    let name = path.display().to_string();
    let file = input::open(path, InputKind::HostEt).map_err(|e| TraceError::Io {
        path: name.clone(),
        source: e.into(),
    })?;
    parse_host_et(file, &name)
}

/// Parses a host execution trace from a reader; `name` is used in messages.
pub fn parse_host_et<R: Read>(reader: R, name: &str) -> Result<HostEt, TraceError> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let gz = {
        use io::BufRead;
        let head = reader.fill_buf().map_err(|source| TraceError::Io {
            path: name.to_string(),
            source,
        })?;
        head.starts_with(&[0x1f, 0x8b])
    };
    let raw: Result<RawEt, serde_json::Error> = if gz {
        let r = BufReader::with_capacity(
            1 << 20,
            input::json_strings(input::decompressed(
                MultiGzDecoder::new(reader),
                InputKind::HostEt,
            )),
        );
        serde_json::from_reader(r)
    } else {
        serde_json::from_reader(BufReader::with_capacity(
            1 << 16,
            input::json_strings(reader),
        ))
    };
    let raw = raw.map_err(|e| json_error(e, name, gz))?;
    let Some(nodes) = raw.nodes else {
        return Err(TraceError::Invalid {
            name: name.to_string(),
            format: FORMAT,
            location: "the top-level object".into(),
            message: "there is no `nodes` list (a Kineto trace has `traceEvents` instead; pass it \
                      as the Kineto side)"
                .into(),
        });
    };
    crate::limits::check(
        || format!("reading the {} nodes of {name}", nodes.len()),
        (nodes.len() * std::mem::size_of::<HostNode>()) as u64,
    )
    .map_err(|m| TraceError::Limit {
        name: name.to_string(),
        location: "after reading the nodes".into(),
        source: m.into(),
    })?;
    let mut nodes: Vec<HostNode> = nodes.into_iter().map(RawNode::normalise).collect();
    nodes.sort_by_key(|n| n.id);
    let schema = match raw.schema {
        Some(Value::String(s)) => s,
        Some(v) => v.to_string(),
        None => String::new(),
    };
    Ok(HostEt {
        schema,
        pid: raw.pid,
        start_ts: raw.start_ts,
        finish_ts: raw.finish_ts,
        nodes,
    })
}

fn json_error(e: serde_json::Error, name: &str, gz: bool) -> TraceError {
    let location = format!(
        "line {} column {}{}",
        e.line(),
        e.column(),
        if gz { " of the decompressed JSON" } else { "" }
    );
    match e.classify() {
        serde_json::error::Category::Eof => TraceError::Truncated {
            name: name.to_string(),
            location,
        },
        serde_json::error::Category::Io => {
            let source: io::Error = e.into();
            if input::InputError::from_io(&source).is_some() {
                TraceError::Limit {
                    name: name.to_string(),
                    location,
                    source: input::unwrap_io(source),
                }
            } else if source.kind() == io::ErrorKind::UnexpectedEof {
                TraceError::Truncated {
                    name: name.to_string(),
                    location: "in the gzip stream".into(),
                }
            } else if gz {
                TraceError::Gzip {
                    name: name.to_string(),
                    source,
                }
            } else {
                TraceError::Io {
                    path: name.to_string(),
                    source,
                }
            }
        }
        _ => TraceError::Json {
            name: name.to_string(),
            location,
            message: e.to_string(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Derived views
// ---------------------------------------------------------------------------------------------

impl HostEt {
    /// The node with this id.
    pub fn node(&self, id: u64) -> Option<&HostNode> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Data dependencies `(producer, consumer)` by tensor id: each input tensor of a node depends
    /// on the last node before it (in id order) that output the same tensor id, unless that node
    /// encloses the consumer (an operator's output is also written on its parents). Sorted.
    pub fn data_deps(&self) -> Vec<(u64, u64)> {
        let parent: HashMap<u64, u64> = self
            .nodes
            .iter()
            .filter_map(|n| Some((n.id, n.parent?)))
            .collect();
        let encloses = |a: u64, mut b: u64| {
            for _ in 0..10_000 {
                match parent.get(&b) {
                    Some(&p) if p == a => return true,
                    Some(&p) if p != b => b = p,
                    _ => return false,
                }
            }
            false
        };
        let mut producer: HashMap<u64, u64> = HashMap::new();
        let mut out = Vec::new();
        for n in &self.nodes {
            for a in &n.inputs {
                for t in a.tensors() {
                    if let Some(&p) = producer.get(&t.id)
                        && p != n.id
                        && !encloses(p, n.id)
                    {
                        out.push((p, n.id));
                    }
                }
            }
            for a in &n.outputs {
                for t in a.tensors() {
                    producer.insert(t.id, n.id);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The collectives with their sizes, in issue order: one per `record_param_comms` node that
    /// names a collective (its `wait` records are skipped); when a trace has no such node, one per
    /// `nccl:*` node.
    pub fn comm_calls(&self) -> Vec<CommCall> {
        let rpc: Vec<CommCall> = self
            .nodes
            .iter()
            .filter(|n| n.name == "record_param_comms")
            .filter_map(record_param_comms)
            .collect();
        if !rpc.is_empty() {
            return rpc;
        }
        self.nodes
            .iter()
            .filter(|n| n.name.starts_with("nccl:"))
            .map(|n| {
                let tensors: Vec<TensorRef> = n.inputs.iter().flat_map(Arg::tensors).collect();
                let bytes = tensors.iter().map(TensorRef::bytes).sum();
                CommCall {
                    kind: CollectiveKind::parse(&n.name),
                    name: n.name.trim_start_matches("nccl:").to_string(),
                    bytes,
                    out_bytes: None,
                    dtype: n.inputs.iter().find_map(|a| tensor_dtype(&a.ty)),
                    pg: None,
                    ranks: None,
                    group_size: None,
                    host_et_node_id: n.id,
                    rf_id: n.rf_id,
                }
            })
            .collect()
    }
}

/// `float` of `Tensor(float)` / `GenericList[Tensor(float)]`.
fn tensor_dtype(ty: &str) -> Option<String> {
    let i = ty.find("Tensor(")? + "Tensor(".len();
    let j = ty[i..].find(')')? + i;
    Some(ty[i..j].to_string())
}

fn int_list(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

/// A `record_param_comms` node → its collective (`None` for `wait` records and unreadable ones).
fn record_param_comms(n: &HostNode) -> Option<CommCall> {
    // The collective name: the attribute (schema 1.1), else the first string input.
    let name_pos = n.inputs.iter().position(|a| a.ty == "String");
    let name = n
        .attr_str("collective_name")
        .map(str::to_string)
        .or_else(|| Some(n.inputs[name_pos?].value.as_str()?.to_string()))?;
    if name.is_empty() || name == "wait" {
        return None;
    }
    let tensors: Vec<TensorRef> = n
        .inputs
        .first()
        .map(Arg::tensors)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let dtype = n
        .attr_str("dtype")
        .map(str::to_string)
        .or_else(|| n.inputs.first().and_then(|a| tensor_dtype(&a.ty)));
    let tensor_bytes: u64 = tensors.iter().map(TensorRef::bytes).sum();
    let size = dtype.as_deref().and_then(dtype_bytes);
    let bytes = match (n.attr_u64("in_msg_nelems"), size) {
        (Some(e), Some(s)) => e.saturating_mul(s),
        _ => tensor_bytes,
    };
    // Splits: the two integer lists after the name (in, out), as elements along dim 0.
    let splits: Vec<Vec<u64>> = name_pos
        .map(|p| {
            n.inputs[p + 1..]
                .iter()
                .take(2)
                .filter_map(|a| int_list(&a.value))
                .collect()
        })
        .unwrap_or_default();
    let out_bytes = match (n.attr_u64("out_msg_nelems"), size) {
        (Some(e), Some(s)) => Some(e.saturating_mul(s)),
        _ => match splits.as_slice() {
            [i, o] if !i.is_empty() && i.iter().sum::<u64>() > 0 => {
                let rows: u64 = i.iter().sum();
                Some(o.iter().sum::<u64>().saturating_mul(tensor_bytes / rows))
            }
            _ => Some(bytes),
        },
    };
    let pg = n.attr_str("pg_name").map(str::to_string).or_else(|| {
        // Schema 1.1 without the attribute: a (name, description) tuple input; schema 1.0: the
        // integer right after the sequence number.
        let p = name_pos?;
        n.inputs[..p].iter().skip(1).find_map(|a| match &a.value {
            Value::Array(t) if a.ty.starts_with("Tuple") => {
                t.first().and_then(Value::as_str).map(str::to_string)
            }
            _ => None,
        })
    });
    let pg = pg.or_else(|| {
        let p = name_pos?;
        (p >= 3)
            .then(|| n.inputs[2].value.as_u64())
            .flatten()
            .map(|v| v.to_string())
    });
    let group_size = n
        .attr_u64("pg_size")
        .and_then(|v| u32::try_from(v).ok())
        .or_else(|| {
            splits
                .first()
                .filter(|s| !s.is_empty())
                .map(|s| s.len() as u32)
        });
    let ranks = match (
        n.attr_u64("global_rank_start"),
        n.attr_u64("global_rank_stride"),
        group_size,
    ) {
        (Some(s), Some(d), Some(g)) if g > 0 && g < 1 << 20 => (0..g as u64)
            .map(|k| u32::try_from(s.checked_add(k.checked_mul(d)?)?).ok())
            .collect(),
        _ => None,
    };
    Some(CommCall {
        kind: CollectiveKind::parse(&name),
        name,
        bytes,
        out_bytes,
        dtype,
        pg,
        ranks,
        group_size,
        host_et_node_id: n.id,
        rf_id: n.rf_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const V10: &str = r#"{"schema": "1.0.1", "pid": 7, "nodes": [
      {"name": "[pytorch|profiler|execution_trace|thread]", "id": 2, "rf_id": 0, "parent": 1, "tid": 1,
       "op_schema": "", "inputs": [], "input_shapes": [], "input_types": [], "outputs": [], "output_shapes": [], "output_types": []},
      {"name": "aten::mul", "id": 3, "rf_id": 1, "parent": 2, "tid": 1, "op_schema": "",
       "inputs": [[10, 11, 0, 4, 4, "cuda:0"], 2.0], "input_shapes": [[4], []], "input_types": ["Tensor(float)", "Double"],
       "outputs": [[12, 13, 0, 4, 4, "cuda:0"]], "output_shapes": [[4]], "output_types": ["Tensor(float)"]},
      {"name": "record_param_comms", "id": 5, "rf_id": 3, "parent": 4, "tid": 1, "op_schema": "",
       "inputs": [[12, 13, 0, 4, 4, "cuda:0"], 9, 140000, 0, "all_to_allv", [1, 3], [2, 2]],
       "input_shapes": [[4], [], [], [], [], [[], []], [[], []]],
       "input_types": ["Tensor(float)", "Int", "Int", "Int", "String", "GenericList[Int,Int]", "GenericList[Int,Int]"],
       "outputs": [[14, 15, 0, 4, 4, "cuda:0"]], "output_shapes": [[4]], "output_types": ["Tensor(float)"]},
      {"name": "c10d::alltoall_base_", "id": 4, "rf_id": 2, "parent": 2, "tid": 1, "op_schema": "",
       "inputs": [[14, 15, 0, 4, 4, "cuda:0"], [12, 13, 0, 4, 4, "cuda:0"]], "input_shapes": [[4], [4]],
       "input_types": ["Tensor(float)", "Tensor(float)"], "outputs": [], "output_shapes": [], "output_types": []},
      {"name": "record_param_comms", "id": 6, "rf_id": 4, "parent": 2, "tid": 1, "op_schema": "",
       "inputs": [9, 0, 0, "wait", [], []], "input_shapes": [[], [], [], [], [], []],
       "input_types": ["Int", "Int", "Int", "String", "GenericList[]", "GenericList[]"],
       "outputs": [], "output_shapes": [], "output_types": []},
      {"name": "aten::add", "id": 7, "rf_id": 5, "parent": 2, "tid": 1, "op_schema": "",
       "inputs": [[14, 15, 0, 4, 4, "cuda:0"], [12, 13, 0, 4, 4, "cuda:0"]], "input_shapes": [[4], [4]],
       "input_types": ["Tensor(float)", "Tensor(float)"], "outputs": [], "output_shapes": [], "output_types": []}
    ]}"#;

    const V11: &str = r#"{"schema": "1.1.0-chakra.0.0.4", "nodes": [
      {"id": 5, "name": "record_param_comms", "ctrl_deps": 4,
       "inputs": {"values": [[[20, 21, 0, 1000, 2, "cuda:1"]], 33, ["3", "default_pg"], 1, "allreduce", [], [], 0, 1, 2],
                  "shapes": [[[1000]], [], [[], []], [], [], [], [], [], [], []],
                  "types": ["GenericList[Tensor(c10::Half)]", "Int", "Tuple[String,String]", "Int", "String", "GenericList[]", "GenericList[]", "Int", "Int", "Int"]},
       "outputs": {"values": [], "shapes": [], "types": []},
       "attrs": [{"name": "rf_id", "type": "uint64", "value": 115}, {"name": "tid", "type": "uint64", "value": 1},
                 {"name": "collective_name", "type": "string", "value": "allreduce"},
                 {"name": "dtype", "type": "string", "value": "Half"},
                 {"name": "in_msg_nelems", "type": "uint64", "value": 1000},
                 {"name": "out_msg_nelems", "type": "uint64", "value": 1000},
                 {"name": "global_rank_start", "type": "uint64", "value": 2},
                 {"name": "global_rank_stride", "type": "uint64", "value": 2},
                 {"name": "pg_name", "type": "string", "value": "3"},
                 {"name": "pg_size", "type": "uint64", "value": 2}]},
      {"id": 6, "name": "nccl:all_reduce", "ctrl_deps": 5,
       "inputs": {"values": [[20, 21, 0, 1000, 2, "cuda:1"]], "shapes": [[1000]], "types": ["Tensor(c10::Half)"]},
       "outputs": {"values": [], "shapes": [], "types": []},
       "attrs": [{"name": "rf_id", "type": "uint64", "value": 116}]}
    ]}"#;

    #[test]
    fn schema_1_0_comm_calls_and_deps() {
        let et = parse_host_et(V10.as_bytes(), "v10.json").unwrap();
        assert_eq!(et.schema, "1.0.1");
        assert_eq!(
            et.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
            [2, 3, 4, 5, 6, 7]
        );
        let calls = et.comm_calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        let c = &calls[0];
        assert_eq!(c.kind, CollectiveKind::AllToAll);
        assert_eq!(c.bytes, 16);
        // 4 elements along dim 0 in, 4 out (splits [1, 3] / [2, 2]), 4 bytes each.
        assert_eq!(c.out_bytes, Some(16));
        assert_eq!(c.dtype.as_deref(), Some("float"));
        assert_eq!(c.pg.as_deref(), Some("140000"));
        assert_eq!((c.group_size, c.ranks.clone()), (Some(2), None));
        assert_eq!((c.host_et_node_id, c.rf_id), (5, Some(3)));
        // mul's output (tensor 12) feeds alltoall_base_, record_param_comms and add;
        // record_param_comms' output (tensor 14) feeds add.
        assert_eq!(et.data_deps(), vec![(3, 4), (3, 5), (3, 7), (5, 7)]);
    }

    #[test]
    fn schema_1_1_comm_calls() {
        let et = parse_host_et(V11.as_bytes(), "v11.json").unwrap();
        assert_eq!(et.nodes[0].parent, Some(4));
        assert_eq!(et.nodes[0].rf_id, Some(115));
        let c = &et.comm_calls()[0];
        assert_eq!(c.kind, CollectiveKind::AllReduce);
        assert_eq!((c.bytes, c.out_bytes), (2000, Some(2000)));
        assert_eq!(c.pg.as_deref(), Some("3"));
        assert_eq!(c.ranks, Some(vec![2, 4]));
    }

    /// Regression (found in review): `global_rank_start + k * stride` overflowed (a panic in
    /// debug builds) on absurd attribute values; such ranks are now left unknown.
    #[test]
    fn absurd_rank_attributes() {
        let text = V11.replace(
            r#""name": "global_rank_start", "type": "uint64", "value": 2"#,
            r#""name": "global_rank_start", "type": "uint64", "value": 18446744073709551615"#,
        );
        assert_ne!(text, V11);
        let et = parse_host_et(text.as_bytes(), "v11.json").unwrap();
        assert_eq!(et.comm_calls()[0].ranks, None);
    }

    #[test]
    fn errors_name_file_and_place() {
        let cut = &V10[..V10.len() / 2];
        let e = parse_host_et(cut.as_bytes(), "cut.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.json") && e.contains("truncated"), "{e}");
        let e = parse_host_et(&b"{\"traceEvents\": []}"[..], "k.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("k.json") && e.contains("no `nodes`"), "{e}");
        let e = parse_host_et(&b"{\"nodes\": [{\"id\": \"x\"}]}"[..], "bad.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.json") && e.contains("line 1 column"), "{e}");
    }

    #[test]
    fn kinds_and_dtypes() {
        use CollectiveKind::*;
        for (s, k) in [
            ("allreduce", AllReduce),
            ("nccl:all_reduce", AllReduce),
            ("all_to_allv", AllToAll),
            ("c10d::alltoall_base_", AllToAll),
            ("_allgather_base", AllGather),
            ("reduce_scatter_tensor_coalesced", ReduceScatter),
            ("broadcast", Broadcast),
            ("reduce", Reduce),
            ("barrier", Barrier),
            ("send", Send),
            ("recv", Recv),
        ] {
            assert_eq!(CollectiveKind::parse(s), k, "{s}");
        }
        assert!(SendRecv.kernel_runs(&AllToAll) && !AllReduce.kernel_runs(&AllToAll));
        assert_eq!(dtype_bytes("Float"), Some(4));
        assert_eq!(dtype_bytes("long int"), Some(8));
        assert_eq!(dtype_bytes("c10::BFloat16"), Some(2));
        assert_eq!(dtype_bytes("Byte"), Some(1));
        assert_eq!(dtype_bytes("quux"), None);
    }

    pub(crate) fn shared() -> Option<PathBuf> {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
        if d.is_dir() {
            Some(d)
        } else {
            crate::skip_note!(
                "skipping: ../shared/traces is absent (the real host-ET tests need it)"
            );
            None
        }
    }

    #[test]
    fn real_files() {
        let Some(d) = shared() else { return };
        // Facts counted independently with python3 (json + gzip).
        let et = read_host_et(&d.join("execution-traces/simple_add.host_et.json.gz")).unwrap();
        assert_eq!((et.schema.as_str(), et.nodes.len()), ("1.0.1", 38));
        assert!(et.comm_calls().is_empty());
        // Data dependencies recounted with the same rule in python3.
        assert_eq!(et.data_deps().len(), 14);

        let et = read_host_et(&d.join("execution-traces/resnet_ddp_2gpu.host_et.json.gz")).unwrap();
        assert_eq!(
            (et.schema.as_str(), et.nodes.len()),
            ("1.1.0-chakra.0.0.4", 14392)
        );
        assert_eq!(et.data_deps().len(), 14769);
        let calls = et.comm_calls();
        let kinds = |k: CollectiveKind| calls.iter().filter(|c| c.kind == k).count();
        assert_eq!(
            (
                calls.len(),
                kinds(CollectiveKind::AllReduce),
                kinds(CollectiveKind::Broadcast)
            ),
            (21, 15, 6)
        );
        let first: Vec<u64> = calls.iter().take(7).map(|c| c.bytes).collect();
        assert_eq!(
            first,
            vec![212480, 424, 8196000, 31502336, 26255360, 26550272, 9724160]
        );
        assert!(calls.iter().all(|c| c.ranks == Some(vec![0, 1])));
        assert!(calls.iter().all(|c| c.pg.as_deref() == Some("0")));

        let send = [24576, 192, 1536, 13568, 1576964, 24576, 448, 907840];
        let recv4 = [768, 1792, 2304, 13312, 4736, 768, 1536, 1920];
        for (r, recv) in recv4.into_iter().enumerate() {
            let f = d.join(format!("multi-rank-dlrm/rank{r}.execution_trace.json.gz"));
            let et = read_host_et(&f).unwrap();
            assert_eq!(et.nodes.len(), 1675, "rank {r}");
            if r == 0 {
                assert_eq!(et.data_deps().len(), 1525);
            }
            let calls = et.comm_calls();
            let bytes: Vec<u64> = calls.iter().map(|c| c.bytes).collect();
            assert_eq!(bytes, send, "rank {r}");
            use CollectiveKind::*;
            let kinds: Vec<_> = calls.iter().map(|c| c.kind.clone()).collect();
            assert_eq!(
                kinds,
                [
                    AllToAll, AllToAll, AllToAll, AllToAll, AllReduce, AllToAll, AllReduce,
                    AllReduce
                ]
            );
            // The uneven all-to-all: what each rank receives differs (int32 elements × 4).
            assert_eq!(calls[3].out_bytes, Some(recv * 4), "rank {r}");
            assert_eq!(calls[0].group_size, Some(8));
        }
    }
}
