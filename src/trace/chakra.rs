//! Chakra execution traces (MLCommons): a binary stream of protobuf messages, each preceded by its
//! length as a varint — one `GlobalMetadata`, then one `Node` per operator (CPU op, GPU kernel,
//! collective, ...). The message types below are written for this crate from the field numbers of
//! the upstream schema (`schema/protobuf/et_def.proto` in mlcommons/chakra); prost derives the
//! decoding, so no `protoc` and no build script are needed. Fields this crate does not use (the
//! storage detail of STORAGE nodes) are skipped by prost as unknown fields.
//!
//! [`ChakraReader`] decodes one message at a time from any `Read` (plain or gzip, found by the
//! magic bytes), so a caller that filters nodes never holds more than one message's bytes;
//! [`read_chakra`] collects the whole trace. Errors name the file, the message index (0 = the
//! metadata) and the byte offset of the message's length prefix: a length prefix cut by the end of
//! the file, a message running past the end, an absurd length, a message that does not decode.
//!
//! **Collectives.** Chakra types both the host-side `c10d::allreduce_` / `c10d::broadcast_` ops and
//! the NCCL kernels as `COMM_COLL_NODE`; only the GPU ones (`is_cpu_op` false) move data and carry
//! `comm_type` / `comm_size` ([`Node::is_gpu_collective`]).
//!
//! **Replay** ([`build_job`]): every node becomes one op of a one-worker [`Job`] with its recorded
//! duration — CPU nodes on a CPU-thread device per `tid`, GPU nodes on a GPU-stream device per
//! `tid`, GPU collectives as `Collective` ops (with a tensor of `comm_size` bytes) on the worker's
//! comm stream. Data dependencies are the edges; a control dependency is kept only when it points
//! forward in the data-dependency topological order (in real files some are self-references,
//! name nodes that are not in the file, or would close a cycle — each kind is counted in a
//! warning). Without start times the order on each device is the replayer's (ready time, then
//! file position), as in Chakra's own simulators.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use prost::Message;

use super::TraceError;
use super::graph::TraceGraphError;
use crate::graph::job::{Job, LocalGraph, LocalOp};
use crate::graph::{DeviceKind, NONE, OpId, OpKind, OpSpec, Phase, Tensor};
use crate::input::{self, InputKind};

const FORMAT: &str = "Chakra execution trace";

/// Largest message accepted (bytes). Real nodes are a few kB; a larger length prefix means the
/// stream is corrupt (or not a Chakra trace), and refusing it avoids a huge allocation.
pub const MAX_MESSAGE_BYTES: u64 = 256 << 20;

// ---------------------------------------------------------------------------------------------
// Messages (field numbers from the upstream schema)
// ---------------------------------------------------------------------------------------------

/// One named attribute; its value is one of many scalar or list types.
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub doc_string: String,
    #[prost(
        oneof = "AttrValue",
        tags = "3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32"
    )]
    pub value: Option<AttrValue>,
}

/// The value of an [`AttributeProto`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AttrValue {
    #[prost(double, tag = "3")]
    Double(f64),
    #[prost(message, tag = "4")]
    DoubleList(DoubleList),
    #[prost(float, tag = "5")]
    Float(f32),
    #[prost(message, tag = "6")]
    FloatList(FloatList),
    #[prost(int32, tag = "7")]
    Int32(i32),
    #[prost(message, tag = "8")]
    Int32List(Int32List),
    #[prost(int64, tag = "9")]
    Int64(i64),
    #[prost(message, tag = "10")]
    Int64List(Int64List),
    #[prost(uint32, tag = "11")]
    Uint32(u32),
    #[prost(message, tag = "12")]
    Uint32List(Uint32List),
    #[prost(uint64, tag = "13")]
    Uint64(u64),
    #[prost(message, tag = "14")]
    Uint64List(Uint64List),
    #[prost(sint32, tag = "15")]
    Sint32(i32),
    #[prost(message, tag = "16")]
    Sint32List(Sint32List),
    #[prost(sint64, tag = "17")]
    Sint64(i64),
    #[prost(message, tag = "18")]
    Sint64List(Sint64List),
    #[prost(fixed32, tag = "19")]
    Fixed32(u32),
    #[prost(message, tag = "20")]
    Fixed32List(Fixed32List),
    #[prost(fixed64, tag = "21")]
    Fixed64(u64),
    #[prost(message, tag = "22")]
    Fixed64List(Fixed64List),
    #[prost(sfixed32, tag = "23")]
    Sfixed32(i32),
    #[prost(message, tag = "24")]
    Sfixed32List(Sfixed32List),
    #[prost(sfixed64, tag = "25")]
    Sfixed64(i64),
    #[prost(message, tag = "26")]
    Sfixed64List(Sfixed64List),
    #[prost(bool, tag = "27")]
    Bool(bool),
    #[prost(message, tag = "28")]
    BoolList(BoolList),
    #[prost(string, tag = "29")]
    String(String),
    #[prost(message, tag = "30")]
    StringList(StringList),
    #[prost(bytes, tag = "31")]
    Bytes(Vec<u8>),
    #[prost(message, tag = "32")]
    BytesList(BytesList),
}

macro_rules! list_message {
    ($name:ident, $kind:ident, $t:ty) => {
        #[doc = concat!("A list attribute value (`", stringify!($kind), "`).")]
        #[derive(Clone, PartialEq, Message)]
        pub struct $name {
            #[prost($kind, repeated, tag = "1")]
            pub values: Vec<$t>,
        }
    };
}
list_message!(DoubleList, double, f64);
list_message!(FloatList, float, f32);
list_message!(Int32List, int32, i32);
list_message!(Int64List, int64, i64);
list_message!(Uint32List, uint32, u32);
list_message!(Uint64List, uint64, u64);
list_message!(Sint32List, sint32, i32);
list_message!(Sint64List, sint64, i64);
list_message!(Fixed32List, fixed32, u32);
list_message!(Fixed64List, fixed64, u64);
list_message!(Sfixed32List, sfixed32, i32);
list_message!(Sfixed64List, sfixed64, i64);
list_message!(BoolList, bool, bool);
list_message!(StringList, string, String);
list_message!(BytesList, bytes, Vec<u8>);

/// The first message of the stream.
#[derive(Clone, PartialEq, Message)]
pub struct GlobalMetadata {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, repeated, tag = "2")]
    pub attr: Vec<AttributeProto>,
}

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NodeType {
    Invalid = 0,
    Metadata = 1,
    MemLoad = 2,
    MemStore = 3,
    Comp = 4,
    CommSend = 5,
    CommRecv = 6,
    CommColl = 7,
    Storage = 8,
    Batch = 9,
    Checkpoint = 10,
}

/// A collective's type (`comm_type` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CollectiveCommType {
    AllReduce = 0,
    Reduce = 1,
    AllGather = 2,
    Gather = 3,
    Scatter = 4,
    Broadcast = 5,
    AllToAll = 6,
    ReduceScatter = 7,
    ReduceScatterBlock = 8,
    Barrier = 9,
}

/// Inputs or outputs of a node, as the strings the converter wrote (Python-literal lists).
#[derive(Clone, PartialEq, Message)]
pub struct IoInfo {
    #[prost(string, tag = "1")]
    pub values: String,
    #[prost(string, tag = "2")]
    pub shapes: String,
    #[prost(string, tag = "3")]
    pub types: String,
}

/// One node of the trace.
#[derive(Clone, PartialEq, Message)]
pub struct Node {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(enumeration = "NodeType", tag = "3")]
    pub r#type: i32,
    #[prost(uint64, repeated, tag = "4")]
    pub ctrl_deps: Vec<u64>,
    #[prost(uint64, repeated, tag = "5")]
    pub data_deps: Vec<u64>,
    #[prost(uint64, tag = "6")]
    pub start_time_micros: u64,
    #[prost(uint64, tag = "7")]
    pub duration_micros: u64,
    #[prost(message, optional, tag = "8")]
    pub inputs: Option<IoInfo>,
    #[prost(message, optional, tag = "9")]
    pub outputs: Option<IoInfo>,
    #[prost(message, repeated, tag = "10")]
    pub attr: Vec<AttributeProto>,
}

impl AttributeProto {
    /// Any integer-typed (or bool) value as an `i64`; `None` for other types or overflow.
    pub fn as_i64(&self) -> Option<i64> {
        match self.value.as_ref()? {
            AttrValue::Int32(v) | AttrValue::Sint32(v) | AttrValue::Sfixed32(v) => Some(*v as i64),
            AttrValue::Int64(v) | AttrValue::Sint64(v) | AttrValue::Sfixed64(v) => Some(*v),
            AttrValue::Uint32(v) | AttrValue::Fixed32(v) => Some(*v as i64),
            AttrValue::Uint64(v) | AttrValue::Fixed64(v) => i64::try_from(*v).ok(),
            AttrValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// Any unsigned-representable integer value as a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self.value.as_ref()? {
            AttrValue::Uint64(v) | AttrValue::Fixed64(v) => Some(*v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// A bool value (integers: non-zero is true).
    pub fn as_bool(&self) -> Option<bool> {
        match self.value.as_ref()? {
            AttrValue::Bool(b) => Some(*b),
            _ => self.as_i64().map(|v| v != 0),
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self.value.as_ref()? {
            AttrValue::String(s) => Some(s),
            _ => None,
        }
    }
}

impl Node {
    /// The node type (`Invalid` for a number the schema does not define).
    pub fn node_type(&self) -> NodeType {
        NodeType::try_from(self.r#type).unwrap_or(NodeType::Invalid)
    }

    /// The first attribute called `name`.
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.attr.iter().find(|a| a.name == name)
    }

    /// `is_cpu_op`: true for host-side operators, false for GPU kernels (`None` when absent).
    pub fn is_cpu_op(&self) -> Option<bool> {
        self.attr("is_cpu_op").and_then(AttributeProto::as_bool)
    }

    /// `comm_type` of a collective.
    pub fn comm_type(&self) -> Option<CollectiveCommType> {
        let v = self.attr("comm_type")?.as_i64()?;
        CollectiveCommType::try_from(i32::try_from(v).ok()?).ok()
    }

    /// `comm_size`: bytes the collective moves (per rank, as the converter wrote it).
    pub fn comm_size(&self) -> Option<u64> {
        self.attr("comm_size").and_then(AttributeProto::as_u64)
    }

    /// `pg_name`: the process group, when the converter wrote it.
    pub fn pg_name(&self) -> Option<&str> {
        self.attr("pg_name").and_then(AttributeProto::as_str)
    }

    /// `involved_dim`: which dimensions of the topology take part, when written.
    pub fn involved_dim(&self) -> Option<Vec<bool>> {
        match self.attr("involved_dim")?.value.as_ref()? {
            AttrValue::BoolList(l) => Some(l.values.clone()),
            _ => None,
        }
    }

    /// The recording thread (`tid`), 0 when absent.
    pub fn tid(&self) -> i64 {
        self.attr("tid")
            .and_then(AttributeProto::as_i64)
            .unwrap_or(0)
    }

    /// `rf_id`: the PyTorch record-function id of a host op.
    pub fn rf_id(&self) -> Option<u64> {
        self.attr("rf_id").and_then(AttributeProto::as_u64)
    }

    /// A collective that runs on the GPU and moves data: `COMM_COLL_NODE` and not a CPU op.
    /// (The host-side `c10d::` ops are typed as collectives too but move nothing themselves.)
    pub fn is_gpu_collective(&self) -> bool {
        self.node_type() == NodeType::CommColl && self.is_cpu_op() == Some(false)
    }
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// A whole Chakra trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChakraTrace {
    pub metadata: GlobalMetadata,
    /// Every node, in file order.
    pub nodes: Vec<Node>,
}

impl ChakraTrace {
    /// A metadata attribute (`schema`, `pid`, `start_ts`, ...).
    pub fn metadata_attr(&self, name: &str) -> Option<&AttributeProto> {
        self.metadata.attr.iter().find(|a| a.name == name)
    }

    /// The schema version: `version`, else the `schema` attribute.
    pub fn schema(&self) -> Option<&str> {
        if !self.metadata.version.is_empty() {
            return Some(&self.metadata.version);
        }
        self.metadata_attr("schema")
            .and_then(AttributeProto::as_str)
    }
}

/// Streams the messages of a Chakra trace: the metadata on construction, then one node per
/// [`Iterator::next`]. After an error the iterator is finished.
pub struct ChakraReader<R: Read> {
    input: R,
    name: String,
    /// Byte offset of the next length prefix.
    offset: u64,
    /// Index of the next message (0 = metadata).
    index: u64,
    metadata: GlobalMetadata,
    done: bool,
    buf: Vec<u8>,
}

/// A boxed byte source (plain or gzip-decoded).
pub type AnyRead = Box<dyn Read>;

impl ChakraReader<AnyRead> {
    /// Opens a file (plain, or gzip-compressed: detected from the magic bytes).
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let name = path.display().to_string();
        let file = input::open(path, InputKind::ChakraTrace).map_err(|e| TraceError::Io {
            path: name.clone(),
            source: e.into(),
        })?;
        Self::from_reader(file, &name)
    }

    /// Reads from any source (plain or gzip); `name` is used in messages.
    pub fn from_reader<R: Read + 'static>(reader: R, name: &str) -> Result<Self, TraceError> {
        let mut reader = BufReader::new(reader);
        let gz = {
            use io::BufRead;
            let head = reader.fill_buf().map_err(|source| TraceError::Io {
                path: name.to_string(),
                source,
            })?;
            head.starts_with(&[0x1f, 0x8b])
        };
        let input: AnyRead = if gz {
            Box::new(BufReader::new(input::decompressed(
                MultiGzDecoder::new(reader),
                InputKind::ChakraTrace,
            )))
        } else {
            Box::new(reader)
        };
        ChakraReader::new(input, name)
    }
}

impl<R: Read> ChakraReader<R> {
    /// Reads the `GlobalMetadata` from an (uncompressed) stream.
    pub fn new(input: R, name: &str) -> Result<Self, TraceError> {
        let mut r = ChakraReader {
            input,
            name: name.to_string(),
            offset: 0,
            index: 0,
            metadata: GlobalMetadata::default(),
            done: false,
            buf: Vec::new(),
        };
        let at = r.offset;
        if !r.next_message()? {
            return Err(r.invalid(
                0,
                at,
                "the file is empty (no GlobalMetadata message)".into(),
            ));
        }
        r.metadata = GlobalMetadata::decode(r.buf.as_slice())
            .map_err(|e| r.invalid(0, at, format!("GlobalMetadata does not decode: {e}")))?;
        r.index = 1;
        Ok(r)
    }

    /// The stream's metadata.
    pub fn metadata(&self) -> &GlobalMetadata {
        &self.metadata
    }

    fn invalid(&self, index: u64, offset: u64, message: String) -> TraceError {
        TraceError::Invalid {
            name: self.name.clone(),
            format: FORMAT,
            location: format!("message {index} (length prefix at byte {offset})"),
            message,
        }
    }

    fn io_error(&self, source: io::Error) -> TraceError {
        if input::InputError::from_io(&source).is_some() {
            TraceError::Limit {
                name: self.name.clone(),
                location: format!("message {} at byte {}", self.index, self.offset),
                source: input::unwrap_io(source),
            }
        } else if source.kind() == io::ErrorKind::UnexpectedEof {
            TraceError::Truncated {
                name: self.name.clone(),
                location: format!("in message {} at byte {}", self.index, self.offset),
            }
        } else if source.kind() == io::ErrorKind::InvalidInput
            || source.kind() == io::ErrorKind::InvalidData
        {
            TraceError::Gzip {
                name: self.name.clone(),
                source,
            }
        } else {
            TraceError::Io {
                path: self.name.clone(),
                source,
            }
        }
    }

    /// Reads one byte; `None` at the end of the input.
    fn byte(&mut self) -> Result<Option<u8>, TraceError> {
        let mut b = [0u8; 1];
        loop {
            match self.input.read(&mut b) {
                Ok(0) => return Ok(None),
                Ok(_) => return Ok(Some(b[0])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(e)),
            }
        }
    }

    /// Reads the next length-prefixed message into `buf`; false at a clean end of the stream.
    fn next_message(&mut self) -> Result<bool, TraceError> {
        let start = self.offset;
        let mut len: u64 = 0;
        let mut shift = 0u32;
        let mut n = 0u64;
        loop {
            let Some(b) = self.byte()? else {
                if n == 0 {
                    return Ok(false);
                }
                return Err(TraceError::Truncated {
                    name: self.name.clone(),
                    location: format!(
                        "the length prefix of message {} at byte {start} is cut after {n} byte(s)",
                        self.index
                    ),
                });
            };
            n += 1;
            if shift >= 64 || (shift == 63 && b > 1) {
                return Err(self.invalid(
                    self.index,
                    start,
                    "the length prefix is not a valid varint (longer than 10 bytes)".into(),
                ));
            }
            len |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(self.invalid(
                self.index,
                start,
                format!(
                    "the length prefix claims {len} bytes (more than the {MAX_MESSAGE_BYTES} \
                     accepted): the stream is corrupt or not a Chakra trace"
                ),
            ));
        }
        self.buf.clear();
        let got = (&mut self.input)
            .take(len)
            .read_to_end(&mut self.buf)
            .map_err(|e| self.io_error(e))? as u64;
        if got < len {
            return Err(TraceError::Truncated {
                name: self.name.clone(),
                location: format!(
                    "message {} at byte {start} needs {len} bytes but only {got} remain",
                    self.index
                ),
            });
        }
        self.offset = start + n + len;
        Ok(true)
    }

    /// The next node, or `None` at the end of the stream.
    pub fn next_node(&mut self) -> Result<Option<Node>, TraceError> {
        if self.done {
            return Ok(None);
        }
        let at = self.offset;
        let res = match self.next_message() {
            Ok(false) => Ok(None),
            Ok(true) => Node::decode(self.buf.as_slice())
                .map(Some)
                .map_err(|e| self.invalid(self.index, at, format!("Node does not decode: {e}"))),
            Err(e) => Err(e),
        };
        match &res {
            Ok(Some(_)) => self.index += 1,
            _ => self.done = true,
        }
        res
    }
}

impl<R: Read> Iterator for ChakraReader<R> {
    type Item = Result<Node, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_node().transpose()
    }
}

/// Reads a whole Chakra trace file.
pub fn read_chakra(path: &Path) -> Result<ChakraTrace, TraceError> {
    collect(ChakraReader::open(path)?)
}

/// Parses a whole Chakra trace from bytes (plain or gzip); `name` is used in messages.
pub fn parse_chakra(bytes: &[u8], name: &str) -> Result<ChakraTrace, TraceError> {
    collect(ChakraReader::from_reader(
        io::Cursor::new(bytes.to_vec()),
        name,
    )?)
}

/// All nodes, refusing a node id given twice as soon as it is read (a stream of empty messages
/// — every one node 0 — would otherwise fill memory before `build_job` refused it) and checking
/// the memory ceiling before the node vector grows.
fn collect<R: Read>(mut r: ChakraReader<R>) -> Result<ChakraTrace, TraceError> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut ids = std::collections::HashMap::new();
    loop {
        let (index, at) = (r.index, r.offset);
        let Some(n) = r.next_node()? else { break };
        if let Some(first) = ids.insert(n.id, index) {
            return Err(r.invalid(
                index,
                at,
                format!("node id {} appears twice (first in message {first})", n.id),
            ));
        }
        if nodes.len() == nodes.capacity() {
            let extra = (nodes.capacity().max(1024) * std::mem::size_of::<Node>()) as u64;
            crate::limits::check(|| format!("reading {} Chakra nodes", nodes.len()), extra)
                .map_err(|m| TraceError::Limit {
                    name: r.name.clone(),
                    location: format!("message {index} at byte {at}"),
                    source: m.into(),
                })?;
        }
        nodes.push(n);
    }
    Ok(ChakraTrace {
        metadata: std::mem::take(&mut r.metadata),
        nodes,
    })
}

/// Whether a file looks like a Chakra trace: its name ends in `.et` (optionally `.et.gz`), or its
/// first message decodes as a `GlobalMetadata` with a `schema` attribute and the second as a
/// `Node`.
pub fn is_chakra(path: &Path) -> bool {
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if n.ends_with(".et") || n.ends_with(".et.gz") {
        return true;
    }
    if n.ends_with(".json") || n.ends_with(".json.gz") {
        return false;
    }
    let Ok(mut r) = ChakraReader::open(path) else {
        return false;
    };
    let has_schema = r.metadata().attr.iter().any(|a| a.name == "schema");
    has_schema && matches!(r.next_node(), Ok(Some(_)))
}

// ---------------------------------------------------------------------------------------------
// Replay: a Job from the nodes
// ---------------------------------------------------------------------------------------------

/// Longest node duration accepted (µs): 30 days. Longer ones mean a corrupt file, and would
/// overflow the replayer's integer-ns clock when summed.
pub const MAX_DURATION_US: u64 = 30 * 24 * 3600 * 1_000_000;

/// A job built from a Chakra trace.
#[derive(Clone, Debug)]
pub struct ChakraJob {
    pub job: Job,
    /// Node id of each local op.
    pub node_of_op: Vec<u64>,
    /// Recorded span of the nodes (last end − first start), when the trace has start times.
    pub measured_ns: Option<u64>,
    /// GPU collectives (ops of kind `Collective`) and the bytes they move in all.
    pub gpu_collectives: usize,
    pub collective_bytes: u64,
    /// Ignorable oddities met while building (dropped dependencies, ...).
    pub warnings: Vec<String>,
}

/// Builds a one-worker job from a Chakra trace (see the module docs for the rules): the nodes
/// checked and indexed, put in data-dependency order, one op per node, the edges, then what was
/// dropped or missing as warnings.
pub fn build_job(trace: &ChakraTrace, name: &str) -> Result<ChakraJob, TraceGraphError> {
    let invalid = |message: String| TraceGraphError::Invalid {
        name: name.to_string(),
        message,
    };
    let nodes = &trace.nodes;
    let index = index_nodes(nodes).map_err(invalid)?;
    let data = data_order(nodes, &index).map_err(invalid)?;
    let mut local = LocalGraph {
        devices: vec![DeviceKind::Virtual],
        ..Default::default()
    };
    let ops = push_ops(nodes, &data.order, &mut local);
    let ctrl = push_edges(nodes, &index, &data, &mut local.edges);
    let mut warnings = dependency_warnings(&data, &ctrl);
    let measured_ns = measured_ns(nodes);
    if measured_ns.is_none() {
        warnings.push(
            "the nodes have no start times: there is no measured iteration to compare with, and \
             the order on each device is the replayer's (dependencies, then file order)"
                .into(),
        );
    }
    let gpu = crate::cost::config::load_gpu("a100-80gb").map_err(|e| invalid(e.to_string()))?;
    let job = super::graph::one_worker_job(local, gpu, name);
    job.local_dfg()
        .map_err(|e| invalid(format!("the dependency graph is invalid: {e}")))?;
    Ok(ChakraJob {
        job,
        node_of_op: ops.node_of_op,
        measured_ns,
        gpu_collectives: ops.gpu_collectives,
        collective_bytes: ops.collective_bytes,
        warnings,
    })
}

/// Node id → index in the file, after refusing what cannot be a real trace: no nodes, durations
/// adding up to more than 100 × [`MAX_DURATION_US`], a node id given twice, a node whose start or
/// duration is not plausible. `Err` holds the message.
fn index_nodes(nodes: &[Node]) -> Result<HashMap<u64, usize>, String> {
    if nodes.is_empty() {
        return Err("the trace has no nodes".into());
    }
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(nodes.len());
    let total_us = nodes
        .iter()
        .fold(0u64, |acc, n| acc.saturating_add(n.duration_micros));
    if total_us > 100 * MAX_DURATION_US {
        return Err(format!(
            "the node durations add up to {total_us} µs: not plausible (the file is corrupt)"
        ));
    }
    for (i, n) in nodes.iter().enumerate() {
        if index.insert(n.id, i).is_some() {
            return Err(format!("node id {} appears twice", n.id));
        }
        if n.duration_micros > MAX_DURATION_US || n.start_time_micros > MAX_DURATION_US * 1000 {
            return Err(format!(
                "node {} (message {}) has start {} µs and duration {} µs: not plausible times \
                 (the file is corrupt)",
                n.id,
                i + 1,
                n.start_time_micros,
                n.duration_micros
            ));
        }
    }
    Ok(index)
}

/// The nodes in data-dependency order, and what that order ignored.
struct DataOrder {
    /// Each node's data successors (node indices).
    succ: Vec<Vec<usize>>,
    /// Node indices in topological order (Kahn, lowest node id first): op `p` is node `order[p]`.
    order: Vec<usize>,
    /// Each node's position in `order`, i.e. its op id.
    pos: Vec<usize>,
    /// Data dependencies on nodes that are not in the file.
    dangling: usize,
    /// Data dependencies of a node on itself.
    self_refs: usize,
}

/// The data dependencies → a topological order (Kahn, lowest node id first); a cycle is refused
/// (`Err` holds the message, naming a node on or behind it).
fn data_order(nodes: &[Node], index: &HashMap<u64, usize>) -> Result<DataOrder, String> {
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut indeg = vec![0usize; nodes.len()];
    let (mut dangling, mut self_refs) = (0usize, 0usize);
    for (i, n) in nodes.iter().enumerate() {
        let deps: BTreeSet<u64> = n.data_deps.iter().copied().collect();
        for d in deps {
            match index.get(&d) {
                Some(&j) if j == i => self_refs += 1,
                Some(&j) => {
                    succ[j].push(i);
                    indeg[i] += 1;
                }
                None => dangling += 1,
            }
        }
    }
    let mut ready: BTreeSet<(u64, usize)> = (0..nodes.len())
        .filter(|&i| indeg[i] == 0)
        .map(|i| (nodes[i].id, i))
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some((_, i)) = ready.pop_first() {
        order.push(i);
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert((nodes[s].id, s));
            }
        }
    }
    if order.len() < nodes.len() {
        let stuck = (0..nodes.len()).find(|&i| indeg[i] > 0).unwrap_or(0);
        return Err(format!(
            "the data dependencies form a cycle ({} of {} nodes are on or behind one, e.g. node {})",
            nodes.len() - order.len(),
            nodes.len(),
            nodes[stuck].id
        ));
    }
    let mut pos = vec![0usize; nodes.len()];
    for (p, &i) in order.iter().enumerate() {
        pos[i] = p;
    }
    Ok(DataOrder {
        succ,
        order,
        pos,
        dangling,
        self_refs,
    })
}

/// The job's devices as the nodes ask for them, numbered in first-use order: a CPU thread per CPU
/// node `tid`, a GPU stream per GPU node `tid`, one comm stream for the GPU collectives.
#[derive(Default)]
struct Devices {
    cpu: BTreeMap<i64, u32>,
    gpu: BTreeMap<i64, u32>,
    comm: Option<u32>,
}

impl Devices {
    /// The device of node `n`, appended to `devices` on first use.
    fn of(&mut self, devices: &mut Vec<DeviceKind>, n: &Node) -> u32 {
        if n.is_gpu_collective() {
            return *self.comm.get_or_insert_with(|| {
                devices.push(DeviceKind::CommStream { worker: 0 });
                (devices.len() - 1) as u32
            });
        }
        let gpu = n.is_cpu_op() == Some(false);
        let map = if gpu { &mut self.gpu } else { &mut self.cpu };
        let next = map.len() as u32;
        *map.entry(n.tid()).or_insert_with(|| {
            devices.push(if gpu {
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: next,
                }
            } else {
                DeviceKind::CpuThread {
                    worker: 0,
                    thread: next,
                }
            });
            (devices.len() - 1) as u32
        })
    }
}

/// What the ops of the nodes hold beside the graph.
struct NodeOps {
    /// Node id of each local op.
    node_of_op: Vec<u64>,
    /// GPU collectives and the bytes they move in all.
    gpu_collectives: usize,
    collective_bytes: u64,
}

/// One op per node, in data order (`order`), on its device, in a layer named after the node, with
/// its recorded duration.
fn push_ops(nodes: &[Node], order: &[usize], local: &mut LocalGraph) -> NodeOps {
    let mut devices = Devices::default();
    let mut layers: HashMap<String, u32> = HashMap::new();
    let mut out = NodeOps {
        node_of_op: Vec::with_capacity(nodes.len()),
        gpu_collectives: 0,
        collective_bytes: 0,
    };
    for &i in order {
        let n = &nodes[i];
        let device = devices.of(&mut local.devices, n);
        let label = n.name.clone();
        let layer = *layers.entry(label.clone()).or_insert_with(|| {
            local.layers.push(label);
            (local.layers.len() - 1) as u32
        });
        let (kind, phase, tensor) = op_kind(n, layer, &mut local.tensors);
        if n.is_gpu_collective() {
            out.gpu_collectives += 1;
            out.collective_bytes += local.tensors[tensor as usize].bytes;
        }
        local.ops.push(LocalOp {
            spec: OpSpec {
                kind,
                phase,
                device,
                dur_ns: n.duration_micros.saturating_mul(1000),
                gap_ns: 0,
                layer,
                tensor,
                step: 0,
                priority: 0,
            },
            work: None,
        });
        out.node_of_op.push(n.id);
    }
    out
}

/// A node's op kind, phase and tensor: a GPU collective is a `Collective` of a new tensor of
/// `comm_size` bytes (pushed onto `tensors`); a GPU copy or set a `Memcpy`, another GPU node a
/// `Compute`; a CPU node `CpuOther` (in the comm phase for a host-side collective).
fn op_kind(n: &Node, layer: u32, tensors: &mut Vec<Tensor>) -> (OpKind, Phase, u32) {
    if n.is_gpu_collective() {
        tensors.push(Tensor {
            name: format!("node {} {}", n.id, n.name),
            bytes: n.comm_size().unwrap_or(0),
            layer,
        });
        (OpKind::Collective, Phase::Comm, (tensors.len() - 1) as u32)
    } else if n.is_cpu_op() == Some(false) {
        let copy = n.name.starts_with("Memcpy") || n.name.starts_with("Memset");
        let kind = if copy {
            OpKind::Memcpy
        } else {
            OpKind::Compute
        };
        (kind, Phase::Other, NONE)
    } else if n.node_type() == NodeType::CommColl {
        (OpKind::CpuOther, Phase::Comm, NONE)
    } else {
        (OpKind::CpuOther, Phase::Other, NONE)
    }
}

/// Control dependencies that [`push_edges`] dropped.
struct DroppedControl {
    /// On the node itself.
    self_refs: usize,
    /// On nodes that are not in the file.
    missing: usize,
    /// Against the data-dependency order (they would close a cycle).
    backward: usize,
}

/// The edges between the ops: every data dependency, then each control dependency that points
/// forward in the data order; sorted, without duplicates.
fn push_edges(
    nodes: &[Node],
    index: &HashMap<u64, usize>,
    data: &DataOrder,
    edges: &mut Vec<(OpId, OpId)>,
) -> DroppedControl {
    let pos = &data.pos;
    for (i, s) in data.succ.iter().enumerate() {
        for &j in s {
            edges.push((pos[i] as OpId, pos[j] as OpId));
        }
    }
    let mut dropped = DroppedControl {
        self_refs: 0,
        missing: 0,
        backward: 0,
    };
    for (i, n) in nodes.iter().enumerate() {
        for d in &n.ctrl_deps {
            match index.get(d) {
                Some(&j) if j == i => dropped.self_refs += 1,
                Some(&j) if pos[j] < pos[i] => {
                    edges.push((pos[j] as OpId, pos[i] as OpId));
                }
                Some(_) => dropped.backward += 1,
                None => dropped.missing += 1,
            }
        }
    }
    edges.sort_unstable();
    edges.dedup();
    dropped
}

/// One warning per kind of dependency ignored (data, control), when there are any.
fn dependency_warnings(data: &DataOrder, ctrl: &DroppedControl) -> Vec<String> {
    let mut warnings = Vec::new();
    let (dangling_data, self_data) = (data.dangling, data.self_refs);
    if dangling_data + self_data > 0 {
        warnings.push(format!(
            "{dangling_data} data dependencies name nodes that are not in the file and \
             {self_data} name their own node; they were ignored"
        ));
    }
    let (ctrl_self, ctrl_missing, ctrl_backward) = (ctrl.self_refs, ctrl.missing, ctrl.backward);
    if ctrl_self + ctrl_missing + ctrl_backward > 0 {
        warnings.push(format!(
            "ignored control dependencies: {ctrl_self} on the node itself, {ctrl_missing} on nodes \
             not in the file, {ctrl_backward} against the data-dependency order (they would close \
             a cycle or contradict the data flow)"
        ));
    }
    warnings
}

/// Recorded span of the nodes that have a start time (last end − first start), ns; `None` when
/// none has.
fn measured_ns(nodes: &[Node]) -> Option<u64> {
    let starts: Vec<(u64, u64)> = nodes
        .iter()
        .filter(|n| n.start_time_micros > 0)
        .map(|n| {
            (
                n.start_time_micros,
                n.start_time_micros.saturating_add(n.duration_micros),
            )
        })
        .collect();
    match (
        starts.iter().map(|s| s.0).min(),
        starts.iter().map(|s| s.1).max(),
    ) {
        (Some(a), Some(b)) => Some((b - a).saturating_mul(1000)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Encodes messages as a Chakra stream.
    fn stream(meta: &GlobalMetadata, nodes: &[Node]) -> Vec<u8> {
        let mut out = Vec::new();
        meta.encode_length_delimited(&mut out).unwrap();
        for n in nodes {
            n.encode_length_delimited(&mut out).unwrap();
        }
        out
    }

    fn attr(name: &str, value: AttrValue) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            doc_string: String::new(),
            value: Some(value),
        }
    }

    fn node(id: u64, name: &str, cpu: bool, tid: i64, dur_us: u64, data: &[u64]) -> Node {
        Node {
            id,
            name: name.into(),
            r#type: NodeType::Comp as i32,
            data_deps: data.to_vec(),
            duration_micros: dur_us,
            attr: vec![
                attr("is_cpu_op", AttrValue::Bool(cpu)),
                attr("tid", AttrValue::Uint64(tid as u64)),
            ],
            ..Default::default()
        }
    }

    fn meta() -> GlobalMetadata {
        GlobalMetadata {
            version: String::new(),
            attr: vec![attr("schema", AttrValue::String("1.0.1".into()))],
        }
    }

    /// A launch (CPU, 10 µs) → kernel (GPU, 100 µs) → NCCL all-reduce of 4 MB (GPU, 50 µs), and a
    /// second CPU op after the launch.
    fn tiny() -> Vec<Node> {
        let mut coll = node(3, "ncclKernel_AllReduce", false, 9, 50, &[2]);
        coll.r#type = NodeType::CommColl as i32;
        coll.attr.push(attr("comm_type", AttrValue::Int64(0)));
        coll.attr.push(attr("comm_size", AttrValue::Int64(4 << 20)));
        let mut host = node(4, "c10d::allreduce_", true, 1, 5, &[1]);
        host.r#type = NodeType::CommColl as i32;
        vec![
            node(1, "aten::mm", true, 1, 10, &[]),
            node(2, "gemm", false, 7, 100, &[1]),
            coll,
            host,
        ]
    }

    #[test]
    fn decodes_a_stream() {
        let t = parse_chakra(&stream(&meta(), &tiny()), "tiny.et").unwrap();
        assert_eq!(t.schema(), Some("1.0.1"));
        assert_eq!(t.nodes.len(), 4);
        let c = &t.nodes[2];
        assert!(c.is_gpu_collective());
        assert_eq!(c.comm_type(), Some(CollectiveCommType::AllReduce));
        assert_eq!(c.comm_size(), Some(4 << 20));
        assert_eq!(c.tid(), 9);
        assert!(!t.nodes[3].is_gpu_collective());
        assert_eq!(t.nodes[3].node_type(), NodeType::CommColl);
        assert_eq!(t.nodes[1].data_deps, vec![1]);
    }

    #[test]
    fn job_replays_the_dependency_chain() {
        let t = parse_chakra(&stream(&meta(), &tiny()), "tiny.et").unwrap();
        let j = build_job(&t, "tiny").unwrap();
        assert_eq!(j.gpu_collectives, 1);
        assert_eq!(j.collective_bytes, 4 << 20);
        assert_eq!(j.measured_ns, None);
        let g = j.job.local_dfg().unwrap();
        let r = crate::replay::replay(&g);
        // 10 µs launch, 100 µs kernel, 50 µs all-reduce in a chain.
        assert_eq!(r.iteration_ns, 160_000);
        // CPU thread, GPU stream, comm stream + the virtual device.
        assert_eq!(j.job.local.devices.len(), 4);
    }

    #[test]
    fn errors_name_message_and_offset() {
        let bytes = stream(&meta(), &tiny());
        // Cut in the middle of the last message.
        let cut = &bytes[..bytes.len() - 3];
        let e = parse_chakra(cut, "cut.et").unwrap_err().to_string();
        assert!(e.contains("cut.et") && e.contains("message 4"), "{e}");
        assert!(e.contains("truncated"), "{e}");
        // An absurd length prefix.
        let mut bad = bytes.clone();
        let meta_len = bytes[0] as usize + 1;
        bad.splice(meta_len..meta_len, [0xff, 0xff, 0xff, 0xff, 0x7f]);
        let e = parse_chakra(&bad, "bad.et").unwrap_err().to_string();
        assert!(
            e.contains(&format!("message 1 (length prefix at byte {meta_len})")),
            "{e}"
        );
        // A message that does not decode: wire type 7 does not exist.
        let mut bad = bytes[..meta_len].to_vec();
        bad.extend([2, 0x0f, 0x00]);
        let e = parse_chakra(&bad, "wire.et").unwrap_err().to_string();
        assert!(e.contains("Node does not decode"), "{e}");
        let e = parse_chakra(&[], "empty.et").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    /// Regression (found in review, not yet by the fuzzer): a corrupt duration near `u64::MAX`
    /// used to reach the replayer and overflow its ns clock; it is now refused.
    #[test]
    fn absurd_durations_are_refused() {
        let mut nodes = tiny();
        nodes[1].duration_micros = u64::MAX / 2;
        let t = parse_chakra(&stream(&meta(), &nodes), "huge.et").unwrap();
        let e = build_job(&t, "huge.et").unwrap_err().to_string();
        assert!(e.contains("huge.et") && e.contains("not plausible"), "{e}");
    }

    fn shared() -> Option<PathBuf> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/traces/execution-traces/resnet_ddp_rank0.chakra.et");
        if p.is_file() {
            Some(p)
        } else {
            crate::skip_note!(
                "skipping: ../shared/traces is absent (the real Chakra test needs it)"
            );
            None
        }
    }

    #[test]
    fn real_resnet_ddp_rank0() {
        let Some(p) = shared() else { return };
        assert!(is_chakra(&p));
        let t = read_chakra(&p).unwrap();
        // All counted independently with a stdlib-only Python varint/protobuf walker.
        assert_eq!(t.schema(), Some("1.0.1"));
        assert_eq!(t.nodes.len(), 3664);
        let count = |ty: NodeType| t.nodes.iter().filter(|n| n.node_type() == ty).count();
        assert_eq!(
            (count(NodeType::Comp), count(NodeType::CommColl)),
            (3643, 21)
        );
        let gpu: Vec<_> = t.nodes.iter().filter(|n| n.is_gpu_collective()).collect();
        let sizes: Vec<u64> = gpu.iter().map(|n| n.comm_size().unwrap()).collect();
        assert_eq!(
            sizes,
            vec![212480, 424, 8196000, 31502336, 26255360, 26550272, 9724160]
        );
        let types: Vec<_> = gpu.iter().map(|n| n.comm_type().unwrap()).collect();
        use CollectiveCommType::*;
        assert_eq!(
            types,
            vec![
                Broadcast, Broadcast, AllReduce, AllReduce, AllReduce, AllReduce, AllReduce
            ]
        );
        assert!(gpu.iter().all(|n| n.name.starts_with("ncclKernel_")));
        // The CPU-side c10d ops typed as collectives.
        let host = t
            .nodes
            .iter()
            .filter(|n| n.node_type() == NodeType::CommColl && !n.is_gpu_collective())
            .count();
        assert_eq!(host, 14);
        assert_eq!(
            t.nodes.iter().filter(|n| n.duration_micros > 0).count(),
            3507
        );
        let data: usize = t.nodes.iter().map(|n| n.data_deps.len()).sum();
        let ctrl: usize = t.nodes.iter().map(|n| n.ctrl_deps.len()).sum();
        assert_eq!((data, ctrl), (181878, 3664));
        assert!(t.nodes.iter().all(|n| n.start_time_micros == 0));

        let j = build_job(&t, "resnet").unwrap();
        assert_eq!(j.job.local.ops.len(), 3664);
        assert_eq!(j.gpu_collectives, 7);
        assert_eq!(j.collective_bytes, sizes.iter().sum::<u64>());
        assert_eq!(j.measured_ns, None);
        // Edges and the dependency bound recomputed with the same rule in python3 (data deps,
        // plus control deps forward in the data-dependency order, Kahn by lowest id).
        assert_eq!(j.job.local.edges.len(), 182_626);
        assert!(
            j.warnings[0]
                .contains("383 on the node itself, 1277 on nodes not in the file, 554 against")
        );
        let g = j.job.local_dfg().unwrap();
        assert_eq!(crate::replay::dependency_bound_ns(&g), 82_269_000);
    }
}
