//! Streamed reader for PyTorch-profiler (Kineto) Chrome traces, `.json` or `.json.gz` (gzip is
//! detected from the magic bytes `1f 8b`, not from the name), of every vintage: 2021 legacy
//! categories (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`, `async` flows, `"stream 7"`
//! thread ids), 2022 (`async_cpu_to_gpu` flows), 2023+ (`cpu_op`, `cuda_runtime`, `kernel`,
//! `ac2g`/`fwdbwd` flows, ...) and ROCm/HIP traces (same categories, `hip*` runtime names).
//!
//! The file is never deserialised into a whole `serde_json::Value`, nor held whole in memory: a
//! visitor walks the top-level object through a 1 MiB buffer, streams `traceEvents` element by
//! element straight into compact [`Event`]s (names and string ids interned, the common ids inline,
//! other args boxed only when present: a 300 MB trace takes 0.96–1.39× its size in memory),
//! reads `deviceProperties` / `distributedInfo` into small structs and skips everything else.
//! A bare top-level array of events (Chrome's array format, Horovod timelines) is accepted too, and
//! a missing closing `]` after at least one complete event is tolerated (with a warning).
//!
//! Errors say where: line and column (of the decompressed JSON for gzip input; the number of bytes
//! decompressed when the gzip stream breaks) and, inside `traceEvents`, the event's index, its name
//! and `ts` when already read, and the field. Values the graph cannot trust are refused there
//! (times beyond ±3·10^15 µs, durations that are negative or beyond 10^15 µs, a field given twice).
//!
//! Timestamps are µs in the file, integers or fractional numbers; they are converted to integer
//! ns. Integer µs (and numbers written as strings) are converted exactly. A fractional µs number is
//! first parsed by serde_json into an f64, so its precision is that of the f64: the integral µs part
//! is exact and the fraction is rounded to the nearest ns *of the f64 value*. For boot-relative
//! clocks (~4e12 µs) that is ~1 ns; for Unix-epoch µs (~1.7e15) an f64 only resolves 0.25 µs, so the
//! sub-µs part is kept to within ±125 ns (±375 ns counting serde_json's best-effort float parsing).
//!
//! Building the dependency graph from these events is not this module's job.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, BufReader, Read};
use std::ops::Deref;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, LazyLock};

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::TraceError;
use crate::input::{self, InputKind};

/// Size of the read buffers (decompressed JSON and compressed input).
const READ_BUF: usize = 1 << 20;

/// Largest |`ts`| accepted, ns: 3·10^18 (a Unix-epoch clock reaches it in 2065). With
/// [`MAX_DUR_NS`], every end is within ±4·10^18 ns, so the difference of any two event times fits
/// in an `i64`: the graph builder's time arithmetic cannot overflow, whatever the file says.
pub const MAX_ABS_TS_NS: i64 = 3_000_000_000_000_000_000;

/// Largest `dur` accepted, ns: 10^18 (~31 years).
pub const MAX_DUR_NS: i64 = 1_000_000_000_000_000_000;

// ---------------------------------------------------------------------------------------------
// Normalised model
// ---------------------------------------------------------------------------------------------

/// An interned string. A trace has ~10^6 events but only thousands of distinct names,
/// categories and string ids, so every event shares one allocation per distinct string (16 bytes
/// per event instead of a `String` and its heap block).
pub type Name = Arc<str>;

/// One `Name` per distinct string seen while reading a file.
#[derive(Default)]
struct Interner(HashSet<Name>);

impl Interner {
    fn get(&mut self, s: &str) -> Name {
        if let Some(n) = self.0.get(s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.0.insert(n.clone());
        n
    }
}

/// A process or thread id: Kineto writes ints, but also strings (`"stream 7"` GPU threads in 2021
/// traces, `"Spans"`, `"Traces"`, `""` on the profiler's own events). Integral floats become `Num`.
/// A missing id is `Str("")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Id {
    Num(i64),
    Str(Name),
}

impl Default for Id {
    fn default() -> Self {
        Id::Str(Name::from(""))
    }
}

impl Id {
    /// The number, when the id is numeric.
    pub fn as_num(&self) -> Option<i64> {
        match self {
            Id::Num(n) => Some(*n),
            Id::Str(_) => None,
        }
    }

    /// The number, or the trailing number of a string id (`"stream 7"` → 7).
    pub fn trailing_number(&self) -> Option<i64> {
        match self {
            Id::Num(n) => Some(*n),
            Id::Str(s) => {
                let t = s.trim_end();
                let start = t
                    .char_indices()
                    .rev()
                    .take_while(|(_, c)| c.is_ascii_digit())
                    .last()
                    .map(|(i, _)| i)?;
                t[start..].parse().ok()
            }
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => f.write_str(s),
        }
    }
}

/// Chrome trace event phase (`ph`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// `X`
    Complete,
    /// `i` or `I`
    Instant,
    /// `s`
    FlowStart,
    /// `t`
    FlowStep,
    /// `f`
    FlowEnd,
    /// `B`
    Begin,
    /// `E`
    End,
    /// `C`
    Counter,
    /// `M`
    Metadata,
    /// Anything else, as written (empty when missing).
    Other(Name),
}

impl Phase {
    /// The phase written as `s`.
    pub fn parse(s: &str) -> Phase {
        Phase::parse_known(s).unwrap_or_else(|| Phase::Other(s.into()))
    }

    fn parse_known(s: &str) -> Option<Phase> {
        Some(match s {
            "X" => Phase::Complete,
            "i" | "I" => Phase::Instant,
            "s" => Phase::FlowStart,
            "t" => Phase::FlowStep,
            "f" => Phase::FlowEnd,
            "B" => Phase::Begin,
            "E" => Phase::End,
            "C" => Phase::Counter,
            "M" => Phase::Metadata,
            _ => return None,
        })
    }

    /// `s`, `t` or `f`.
    pub fn is_flow(&self) -> bool {
        matches!(self, Phase::FlowStart | Phase::FlowStep | Phase::FlowEnd)
    }
}

/// What a flow (`s`/`t`/`f`) event links.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FlowKind {
    /// CPU launch → GPU activity: `ac2g` (2023+), `async_cpu_to_gpu` (2022), `async` (2021).
    LaunchToGpu,
    /// Forward op → its backward op: `fwdbwd`.
    FwdBwd,
    /// Any other flow category, as written.
    Other(Name),
}

/// Normalised event category, the same across trace vintages and vendors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Category {
    CpuOp,
    UserAnnotation,
    CudaRuntime,
    CudaDriver,
    Kernel,
    Memcpy,
    Memset,
    GpuUserAnnotation,
    CudaSync,
    PythonFunction,
    Flow(FlowKind),
    /// The profiler's own spans (`cat: "Trace"`, e.g. "PyTorch Profiler (0)").
    Trace,
    /// Anything else, as written (empty when the event has no `cat`, e.g. metadata events).
    Other(Name),
}

impl Category {
    /// Maps a raw `cat` of any vintage. Matching ignores case and treats spaces as underscores.
    pub fn parse(cat: &str, ph: &Phase) -> Category {
        Category::known(cat, ph).unwrap_or_else(|| {
            if ph.is_flow() {
                Category::Flow(FlowKind::Other(cat.into()))
            } else {
                Category::Other(cat.into())
            }
        })
    }

    /// The category of a name we know (`None` for anything else). The spellings real traces use
    /// match without allocating; others are normalised first.
    fn known(cat: &str, ph: &Phase) -> Option<Category> {
        if let Some(c) = Category::known_normalised(cat, ph) {
            return Some(c);
        }
        if !cat
            .bytes()
            .any(|b| b == b' ' || b.is_ascii_uppercase() || b.is_ascii_whitespace())
        {
            return None;
        }
        let norm: String = cat
            .trim()
            .chars()
            .map(|c| {
                if c == ' ' {
                    '_'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        Category::known_normalised(&norm, ph)
    }

    fn known_normalised(norm: &str, ph: &Phase) -> Option<Category> {
        Some(match norm {
            "cpu_op" | "operator" => Category::CpuOp,
            "user_annotation" => Category::UserAnnotation,
            "cuda_runtime" | "runtime" => Category::CudaRuntime,
            "cuda_driver" | "driver" => Category::CudaDriver,
            "kernel" => Category::Kernel,
            "gpu_memcpy" | "memcpy" => Category::Memcpy,
            "gpu_memset" | "memset" => Category::Memset,
            "gpu_user_annotation" => Category::GpuUserAnnotation,
            "cuda_sync" => Category::CudaSync,
            "python_function" | "python" => Category::PythonFunction,
            "ac2g" | "async_cpu_to_gpu" => Category::Flow(FlowKind::LaunchToGpu),
            "async" if ph.is_flow() => Category::Flow(FlowKind::LaunchToGpu),
            "fwdbwd" | "forward_backward" => Category::Flow(FlowKind::FwdBwd),
            "trace" => Category::Trace,
            _ => return None,
        })
    }

    /// Work executed on the GPU that a host call launched: kernels, memcpys, memsets.
    pub fn is_gpu_activity(&self) -> bool {
        matches!(self, Category::Kernel | Category::Memcpy | Category::Memset)
    }
}

/// A CUDA / HIP runtime (or driver) API call, recognised by name across spellings
/// (`cudaLaunchKernel`, `cudaLaunchKernelExC`, `cuLaunchKernel`, `hipLaunchKernel`,
/// `hipExtModuleLaunchKernel`, `_v2` / `_ptsz` suffixes, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeCall {
    LaunchKernel,
    /// A synchronous-API memcpy (`cudaMemcpy`, `hipMemcpyWithStream`, `cuMemcpyDtoH`): `blocking`
    /// is true, meaning the host may wait for the copy (CUDA lets device-to-device ones return
    /// early, which the name cannot tell).
    Memcpy {
        blocking: bool,
    },
    MemcpyAsync,
    Memset {
        blocking: bool,
    },
    MemsetAsync,
    DeviceSynchronize,
    StreamSynchronize,
    EventSynchronize,
    EventRecord,
    StreamWaitEvent,
    GraphLaunch,
    Other,
}

/// Normalises a runtime/driver API name (see [`RuntimeCall`]).
pub fn runtime_call(name: &str) -> RuntimeCall {
    let n = name.trim();
    let n = n
        .strip_prefix("cuda")
        .or_else(|| n.strip_prefix("hip"))
        .or_else(|| n.strip_prefix("cu"))
        .unwrap_or(n);
    let mut n = n;
    for suffix in ["_v2", "_v3", "_ptsz", "_ptds", "_spt"] {
        if let Some(s) = n.strip_suffix(suffix) {
            n = s;
        }
    }
    if n.contains("LaunchKernel") || n.contains("LaunchCooperativeKernel") {
        RuntimeCall::LaunchKernel
    } else if n.starts_with("GraphLaunch") {
        RuntimeCall::GraphLaunch
    } else if n.starts_with("Memcpy") {
        if n.contains("Async") {
            RuntimeCall::MemcpyAsync
        } else {
            RuntimeCall::Memcpy { blocking: true }
        }
    } else if n.starts_with("Memset") {
        if n.contains("Async") {
            RuntimeCall::MemsetAsync
        } else {
            RuntimeCall::Memset { blocking: true }
        }
    } else {
        match n {
            "DeviceSynchronize" | "CtxSynchronize" => RuntimeCall::DeviceSynchronize,
            "StreamSynchronize" => RuntimeCall::StreamSynchronize,
            "EventSynchronize" => RuntimeCall::EventSynchronize,
            "EventRecord" | "EventRecordWithFlags" => RuntimeCall::EventRecord,
            "StreamWaitEvent" => RuntimeCall::StreamWaitEvent,
            _ => RuntimeCall::Other,
        }
    }
}

/// The event arguments we keep. Numeric ones accept ints, floats and numeric strings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct EventArgs {
    /// `External id`: links a CPU op to the runtime calls it made.
    #[serde(rename = "External id", deserialize_with = "lenient_i64")]
    pub external_id: Option<i64>,
    /// `correlation`: links a runtime call to the GPU activity it launched.
    #[serde(deserialize_with = "lenient_i64")]
    pub correlation: Option<i64>,
    #[serde(deserialize_with = "lenient_i64")]
    pub stream: Option<i64>,
    /// `device` of GPU events; `Device Id` of `[memory]` events.
    #[serde(alias = "Device Id", deserialize_with = "lenient_i64")]
    pub device: Option<i64>,
    #[serde(deserialize_with = "lenient_i64")]
    pub context: Option<i64>,
    #[serde(rename = "Collective name", deserialize_with = "lenient_string")]
    pub collective_name: Option<String>,
    #[serde(rename = "In msg nelems", deserialize_with = "lenient_i64")]
    pub in_msg_nelems: Option<i64>,
    #[serde(rename = "Out msg nelems", deserialize_with = "lenient_i64")]
    pub out_msg_nelems: Option<i64>,
    #[serde(rename = "Group size", deserialize_with = "lenient_i64")]
    pub group_size: Option<i64>,
    #[serde(deserialize_with = "lenient_string")]
    pub dtype: Option<String>,
    #[serde(rename = "Process Group Name", deserialize_with = "lenient_string")]
    pub process_group_name: Option<String>,
    #[serde(
        rename = "Process Group Description",
        deserialize_with = "lenient_string"
    )]
    pub process_group_desc: Option<String>,
    /// `Process Group Ranks`, as written (e.g. `"[0, 1]"`).
    #[serde(rename = "Process Group Ranks", deserialize_with = "lenient_string")]
    pub process_group_ranks: Option<String>,
    /// `Sequence number` (autograd sequence number of a CPU op).
    #[serde(rename = "Sequence number", deserialize_with = "lenient_i64")]
    pub seq: Option<i64>,
    #[serde(rename = "Fwd thread id", deserialize_with = "lenient_i64")]
    pub fwd_thread_id: Option<i64>,
    /// Bytes moved by a memcpy / set by a memset; `Bytes` allocated (> 0) or freed (< 0) by a
    /// `[memory]` event.
    #[serde(alias = "Bytes", deserialize_with = "lenient_i64")]
    pub bytes: Option<i64>,
    #[serde(deserialize_with = "lenient_i64")]
    pub rank: Option<i64>,
    /// `name` of `process_name` / `thread_name` metadata events.
    #[serde(deserialize_with = "lenient_string")]
    pub name: Option<String>,
    /// `labels` of `process_labels` metadata events (e.g. `"GPU 0"`).
    #[serde(deserialize_with = "lenient_string")]
    pub labels: Option<String>,
    #[serde(deserialize_with = "lenient_i64")]
    pub sort_index: Option<i64>,
    /// `cuda_sync_kind` of `cuda_sync` events (e.g. "Event Sync", "Stream Wait Event").
    #[serde(rename = "cuda_sync_kind", deserialize_with = "lenient_string")]
    pub sync_kind: Option<String>,
    /// `wait_on_stream` of `cuda_sync` events.
    #[serde(deserialize_with = "lenient_i64")]
    pub wait_on_stream: Option<i64>,
    /// `wait_on_cuda_event_record_corr_id`: correlation of the `cudaEventRecord` waited on.
    #[serde(deserialize_with = "lenient_i64")]
    pub wait_on_cuda_event_record_corr_id: Option<i64>,
    /// `Record function id` of a CPU op: the host execution trace's `rf_id` (newer PyTorch).
    #[serde(rename = "Record function id", deserialize_with = "lenient_i64")]
    pub rf_id: Option<i64>,
    /// `Input Dims` and `Input type` of a CPU op, as the JSON text written (e.g. `[[6144], []]`,
    /// `["float", ""]`; sizes of collectives' inputs). Text, not a `serde_json::Value`: a tree of
    /// 32-byte nodes takes ~15× the text, and traces recorded with shapes have them on every op.
    /// PyTorch has spelt it `Input Dims` (2022 on) and `Input dims` (2021): both are read
    /// (issue 27: a 2021 trace's shapes were all missed).
    #[serde(
        rename = "Input Dims",
        alias = "Input dims",
        deserialize_with = "raw_json"
    )]
    pub input_dims: Option<String>,
    #[serde(rename = "Input type", deserialize_with = "raw_json")]
    pub input_type: Option<String>,
    /// `shape` of a Horovod timeline's end-of-operation event (e.g. `"[256, 128]"`).
    #[serde(deserialize_with = "lenient_string")]
    pub shape: Option<String>,
    /// `Concrete Inputs` of a CPU op (PyTorch ≥ 2.1): the values of its scalar and int-list
    /// inputs as written (a convolution's stride and padding), JSON text like `Input Dims`.
    #[serde(rename = "Concrete Inputs", deserialize_with = "raw_json")]
    pub concrete_inputs: Option<String>,
    /// The other args of a `[memory]` event (`profile_memory=True`; its `Bytes` and `Device Id`
    /// share `bytes` and `device`). Read here, moved into [`KinetoTrace::memory`] and cleared, so
    /// that memory events stay unboxed; fields every boxed event pays for, so few and small.
    #[serde(rename = "Total Allocated", deserialize_with = "lenient_i64")]
    pub mem_total_allocated: Option<i64>,
    #[serde(rename = "Total Reserved", deserialize_with = "lenient_i64")]
    pub mem_total_reserved: Option<i64>,
    #[serde(rename = "Addr", deserialize_with = "lenient_i64")]
    pub mem_addr: Option<i64>,
    #[serde(rename = "Device Type", deserialize_with = "lenient_i32")]
    pub mem_device_type: Option<i32>,
}

/// One allocator event of a `profile_memory=True` trace (`[memory]`, an instant event): `bytes`
/// allocated (> 0) or freed (< 0) at `ts_ns` on the thread that asked. 48 bytes each, beside
/// the event itself (which stays in [`KinetoTrace::events`] so that event indices are the
/// file's).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryEvent {
    pub ts_ns: i64,
    pub bytes: i64,
    /// `Total Allocated` / `Total Reserved` after the event (newer traces; 2021 traces carry only
    /// `Bytes`).
    pub total_allocated: Option<i64>,
    pub total_reserved: Option<i64>,
    /// The block's address (newer traces): pairs an allocation with its free.
    pub addr: Option<i64>,
    /// PyTorch's `c10::DeviceType` (0 CPU, 1 CUDA — ROCm reports CUDA too) and device index.
    pub device_type: i16,
    pub device_id: i16,
    /// Index of the event in `traceEvents` (its pid/tid are there).
    pub event: u32,
}

impl MemoryEvent {
    /// Device (GPU) memory rather than host memory.
    pub fn on_device(&self) -> bool {
        self.device_type != 0
    }
}

/// The arguments of one event as stored. The ids nearly every event carries (`External id`,
/// `correlation`, `stream`, `device`, `context`, `Sequence number`, `Fwd thread id`,
/// `Record function id`) are fields here; the complete [`EventArgs`] is boxed only for the few events with anything else (NCCL
/// kernels, copies, metadata, `cuda_sync`, ...), which keeps a typical event at ~260 bytes instead
/// of ~700. Every [`EventArgs`] field reads the same: `e.args.correlation` is a field of `Args`,
/// `e.args.collective_name` is reached through `Deref`.
///
/// Through `Deref` (an explicit `&EventArgs`), the inline ids read `None` unless the event also
/// had other args: use the fields of `Args` (or [`Args::to_event_args`]) for them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Args {
    pub external_id: Option<i64>,
    pub correlation: Option<i64>,
    pub stream: Option<i64>,
    pub device: Option<i64>,
    pub context: Option<i64>,
    pub seq: Option<i64>,
    pub fwd_thread_id: Option<i64>,
    pub rf_id: Option<i64>,
    /// Every argument, when the event has any beyond the inline ids.
    full: Option<Box<EventArgs>>,
}

static NO_ARGS: LazyLock<EventArgs> = LazyLock::new(EventArgs::default);

impl Deref for Args {
    type Target = EventArgs;
    fn deref(&self) -> &EventArgs {
        self.full.as_deref().unwrap_or(&NO_ARGS)
    }
}

impl EventArgs {
    /// Whether any argument beyond the inline ids is present. The pattern names every field (no
    /// `..`), so a field added to `EventArgs` and not listed here does not compile.
    fn has_extra(&self) -> bool {
        let EventArgs {
            external_id: _,
            correlation: _,
            stream: _,
            device: _,
            context: _,
            collective_name,
            in_msg_nelems,
            out_msg_nelems,
            group_size,
            dtype,
            process_group_name,
            process_group_desc,
            process_group_ranks,
            seq: _,
            fwd_thread_id: _,
            bytes,
            rank,
            name,
            labels,
            sort_index,
            sync_kind,
            wait_on_stream,
            wait_on_cuda_event_record_corr_id,
            rf_id: _,
            input_dims,
            input_type,
            shape,
            concrete_inputs,
            mem_total_allocated,
            mem_total_reserved,
            mem_addr,
            mem_device_type,
        } = self;
        collective_name.is_some()
            || in_msg_nelems.is_some()
            || out_msg_nelems.is_some()
            || group_size.is_some()
            || dtype.is_some()
            || process_group_name.is_some()
            || process_group_desc.is_some()
            || process_group_ranks.is_some()
            || bytes.is_some()
            || rank.is_some()
            || name.is_some()
            || labels.is_some()
            || sort_index.is_some()
            || sync_kind.is_some()
            || wait_on_stream.is_some()
            || wait_on_cuda_event_record_corr_id.is_some()
            || input_dims.is_some()
            || input_type.is_some()
            || shape.is_some()
            || concrete_inputs.is_some()
            || mem_total_allocated.is_some()
            || mem_total_reserved.is_some()
            || mem_addr.is_some()
            || mem_device_type.is_some()
    }
}

impl From<EventArgs> for Args {
    fn from(a: EventArgs) -> Args {
        let extra = a.has_extra();
        Args {
            external_id: a.external_id,
            correlation: a.correlation,
            stream: a.stream,
            device: a.device,
            context: a.context,
            seq: a.seq,
            fwd_thread_id: a.fwd_thread_id,
            rf_id: a.rf_id,
            full: extra.then(|| Box::new(a)),
        }
    }
}

impl Args {
    /// All the arguments as one [`EventArgs`].
    pub fn to_event_args(&self) -> EventArgs {
        EventArgs {
            external_id: self.external_id,
            correlation: self.correlation,
            stream: self.stream,
            device: self.device,
            context: self.context,
            seq: self.seq,
            fwd_thread_id: self.fwd_thread_id,
            rf_id: self.rf_id,
            ..(**self).clone()
        }
    }
}

/// One normalised trace event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub ph: Phase,
    pub cat: Category,
    /// Interned: events with the same name share it.
    pub name: Name,
    pub pid: Id,
    pub tid: Id,
    /// Start, integer ns on the file's clock (0 when the event has no `ts`).
    pub ts_ns: i64,
    /// Duration in ns (0 when absent).
    pub dur_ns: i64,
    /// `id` of flow events (string ids are parsed as numbers, or hashed when not numeric).
    pub flow_id: Option<u64>,
    pub args: Args,
}

impl Event {
    pub fn end_ns(&self) -> i64 {
        self.ts_ns.saturating_add(self.dur_ns)
    }

    /// `N` of a `ProfilerStep#N` span.
    pub fn profiler_step(&self) -> Option<u64> {
        self.name.strip_prefix("ProfilerStep#")?.trim().parse().ok()
    }

    /// The runtime call, for runtime / driver API events.
    pub fn runtime_call(&self) -> Option<RuntimeCall> {
        matches!(self.cat, Category::CudaRuntime | Category::CudaDriver)
            .then(|| runtime_call(&self.name))
    }
}

/// One entry of `deviceProperties`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DeviceProps {
    #[serde(deserialize_with = "lenient_i64")]
    pub id: Option<i64>,
    #[serde(deserialize_with = "lenient_string")]
    pub name: Option<String>,
    #[serde(rename = "totalGlobalMem", deserialize_with = "lenient_i64")]
    pub total_global_mem: Option<i64>,
    #[serde(rename = "computeMajor", deserialize_with = "lenient_i64")]
    pub compute_major: Option<i64>,
    #[serde(rename = "computeMinor", deserialize_with = "lenient_i64")]
    pub compute_minor: Option<i64>,
    #[serde(rename = "numSms", deserialize_with = "lenient_i64")]
    pub num_sms: Option<i64>,
}

/// `distributedInfo`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DistributedInfo {
    #[serde(deserialize_with = "lenient_i64")]
    pub rank: Option<i64>,
    #[serde(deserialize_with = "lenient_i64")]
    pub world_size: Option<i64>,
    #[serde(deserialize_with = "lenient_string")]
    pub backend: Option<String>,
    #[serde(deserialize_with = "lenient_string")]
    pub nccl_version: Option<String>,
}

/// A whole Kineto trace, normalised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KinetoTrace {
    /// Every event, in file order.
    pub events: Vec<Event>,
    pub device_properties: Vec<DeviceProps>,
    pub distributed: Option<DistributedInfo>,
    /// Earliest `ts` of a non-metadata event, in ns.
    pub trace_start_ns: Option<i64>,
    /// `baseTimeNanoseconds` (newer traces): Unix-epoch ns of the trace clock's zero. Newer traces
    /// write boot-relative `ts`; add this to get wall-clock time.
    pub base_time_ns: Option<i64>,
    /// True when the trace has GPU activity but no launch→GPU flow events at all: it was sampled or
    /// filtered when recorded (see [`KinetoTrace::replayable`]).
    pub sampled: bool,
    /// `schemaVersion`.
    pub schema_version: Option<i64>,
    /// `traceName`.
    pub trace_name: Option<String>,
    /// True when the file was a bare array of events rather than an object.
    pub bare_array: bool,
    /// Things tolerated while reading (e.g. a missing closing `]`).
    pub warnings: Vec<String>,
    /// The `[memory]` events (allocator), in file order.
    pub memory: Vec<MemoryEvent>,
}

impl KinetoTrace {
    /// Whether the trace can be replayed faithfully; `Err` explains why not.
    ///
    /// Rule, from the real files: every complete Kineto trace with GPU work has launch→GPU flow
    /// events (`ac2g` / `async_cpu_to_gpu` / `async`), one pair per launch, plus the profiler's
    /// `Record Window End` instant. The sampled multi-rank traces have kernels, memcpys and runtime
    /// calls (still carrying `correlation` ids) but no flow events at all, no window markers, and
    /// only launch/copy runtime calls (every synchronisation call was filtered out).
    pub fn replayable(&self) -> Result<(), String> {
        if self.events.is_empty() {
            return Err("the trace has no events".into());
        }
        if !self.sampled {
            return Ok(());
        }
        let gpu = self
            .events
            .iter()
            .filter(|e| e.cat.is_gpu_activity())
            .count();
        let gpu_corr = self
            .events
            .iter()
            .filter(|e| e.cat.is_gpu_activity() && e.args.correlation.is_some())
            .count();
        let syncs = self
            .events
            .iter()
            .filter(|e| {
                matches!(
                    e.runtime_call(),
                    Some(
                        RuntimeCall::DeviceSynchronize
                            | RuntimeCall::StreamSynchronize
                            | RuntimeCall::EventSynchronize
                            | RuntimeCall::StreamWaitEvent
                    )
                )
            })
            .count();
        Err(format!(
            "the trace has {gpu} GPU kernels/memcpys/memsets but no launch→GPU flow events \
             (ac2g / async_cpu_to_gpu / async){corr}{sync}: the trace was sampled or filtered when \
             it was recorded, so launches, synchronisations and idle gaps are missing; it cannot be \
             replayed faithfully",
            corr = if gpu_corr > 0 {
                format!(
                    " ({gpu_corr} of them carry correlation ids, but the events around them were dropped)"
                )
            } else {
                " and no correlation ids".to_string()
            },
            sync = if syncs == 0 {
                ", and no synchronisation runtime calls at all"
            } else {
                ""
            },
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Reads a Kineto trace file (`.json` or gzip-compressed, detected by content).
pub fn read_kineto(path: &Path) -> Result<KinetoTrace, TraceError> {
    let name = path.display().to_string();
    if path.is_dir() {
        return Err(TraceError::NotATrace {
            name,
            reason: "it is a directory; give the trace file itself (one --trace FILE per rank)"
                .into(),
        });
    }
    let file = input::open(path, InputKind::KinetoTrace).map_err(|e| TraceError::Io {
        path: name.clone(),
        source: e.into(),
    })?;
    parse_kineto(file, &name)
}

/// Parses a Kineto trace from a reader (plain or gzip JSON); `name` is used in messages.
pub fn parse_kineto<R: Read>(mut reader: R, name: &str) -> Result<KinetoTrace, TraceError> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < magic.len() {
        match reader.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(TraceError::Io {
                    path: name.to_string(),
                    source,
                });
            }
        }
    }
    if n == 0 {
        return Err(TraceError::NotATrace {
            name: name.to_string(),
            reason: "the file is empty".into(),
        });
    }
    let head = magic[..n].to_vec();
    let input = io::Cursor::new(head.clone()).chain(reader);
    if head.starts_with(&[0x1f, 0x8b]) {
        let count = Rc::new(Cell::new(0));
        let gz = Counted {
            inner: input::json_strings(input::decompressed(
                MultiGzDecoder::new(BufReader::with_capacity(READ_BUF / 4, input)),
                InputKind::KinetoTrace,
            )),
            count: count.clone(),
        };
        parse_json(
            BufReader::with_capacity(READ_BUF, gz),
            name,
            Source::Gzip(count),
        )
    } else {
        parse_json(
            BufReader::with_capacity(READ_BUF, input::json_strings(input)),
            name,
            Source::Plain(head),
        )
    }
}

/// What the JSON is read from, for error messages.
enum Source {
    /// A plain file and its first bytes.
    Plain(Vec<u8>),
    /// A gzip stream and the number of bytes decompressed so far.
    Gzip(Rc<Cell<u64>>),
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

fn parse_json<R: Read>(reader: R, name: &str, src: Source) -> Result<KinetoTrace, TraceError> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let mut st = State::default();
    let res = (&mut de)
        .deserialize_any(TopVisitor(&mut st))
        .and_then(|()| de.end());
    if let Err(e) = res {
        if st.trace.bare_array && e.is_eof() && !st.trace.events.is_empty() {
            st.trace.warnings.push(format!(
                "{name}: the event array is not closed (no final `]`, as in Horovod timelines); \
                 kept the {} complete events",
                st.trace.events.len()
            ));
        } else if let Some(m) = st.limit.take() {
            return Err(TraceError::Limit {
                name: name.to_string(),
                location: format!("line {} column {}", e.line(), e.column()),
                source: m.into(),
            });
        } else {
            return Err(json_error(e, name, &src, &st));
        }
    }
    if !st.trace.bare_array && !st.saw_trace_events {
        let mut keys = st.top_keys.join(", ");
        if keys.is_empty() {
            keys = "none".into();
        }
        let has = |k: &str| st.top_keys.iter().any(|t| t == k);
        let hint = if has("nodes") && has("schema") {
            "; it looks like a PyTorch host execution trace: give the Kineto trace of the same run \
             (an execution trace named like rankN.execution_trace.json.gz beside \
             rankN.kineto.json.gz is read for collective sizes)"
        } else {
            ""
        };
        return Err(TraceError::NotATrace {
            name: name.to_string(),
            reason: format!("the top-level object has no `traceEvents` (keys: {keys}){hint}"),
        });
    }
    if !st.unknown_cats.is_empty() {
        let total: usize = st.unknown_cats.values().map(|v| v.0).sum();
        let mut list: Vec<_> = st.unknown_cats.iter().collect();
        list.sort_by_key(|(_, (n, first))| (std::cmp::Reverse(*n), *first));
        let shown: Vec<String> = list
            .iter()
            .take(5)
            .map(|(c, (n, first))| format!("`{c}` ({n}, first event #{first})"))
            .collect();
        let more = list.len().saturating_sub(5);
        st.trace.warnings.push(format!(
            "{name}: {total} events have categories this importer does not know; they are \
             ignored: {}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if let Some(d) = &st.trace.distributed
        && let (Some(r), Some(w)) = (d.rank, d.world_size)
        && (r < 0 || w <= 0 || r >= w)
    {
        st.trace.warnings.push(format!(
            "{name}: `distributedInfo` says rank {r} of world size {w}, which cannot be; ignored"
        ));
    }
    let mut trace = st.trace;
    trace.trace_start_ns = st.min_ts;
    trace.sampled = st.gpu_activity > 0 && st.launch_flows == 0;
    Ok(trace)
}

/// Where the reader was when it failed: the event (index in `traceEvents`, its name and `ts` when
/// already read, the field being read) or the section.
fn reader_context(st: &State) -> String {
    if let Some(c) = &st.ctx {
        let mut s = format!("event #{} of traceEvents", c.index);
        let mut about = Vec::new();
        if let Some(n) = &c.name {
            let short: String = n.chars().take(60).collect();
            let dots = if short.len() < n.len() { "…" } else { "" };
            about.push(format!("{short:?}{dots}"));
        }
        if let Some(ts) = c.ts_ns {
            about.push(format!("ts {} µs", ts as f64 / 1e3));
        }
        if let Some(f) = c.field {
            about.push(format!("field `{f}`"));
        }
        if !about.is_empty() {
            s.push_str(&format!(" ({})", about.join(", ")));
        }
        s
    } else if let Some(sec) = st.section {
        format!("in `{sec}`")
    } else {
        String::new()
    }
}

fn json_error(e: serde_json::Error, name: &str, src: &Source, st: &State) -> TraceError {
    let (line, column) = (e.line(), e.column());
    let ctx = reader_context(st);
    let with_ctx = |loc: String| {
        if ctx.is_empty() {
            loc
        } else {
            format!("{loc}, {ctx}")
        }
    };
    let location = with_ctx(match src {
        Source::Gzip(_) => format!("line {line} column {column} of the decompressed JSON"),
        Source::Plain(_) => format!("line {line} column {column}"),
    });
    let empty = line == 1 && column == 0;
    match e.classify() {
        serde_json::error::Category::Io => {
            let source: io::Error = e.into();
            if input::InputError::from_io(&source).is_some() {
                return TraceError::Limit {
                    name: name.to_string(),
                    location,
                    source: input::unwrap_io(source),
                };
            }
            match src {
                Source::Gzip(count) => {
                    let at = with_ctx(format!(
                        "after {} bytes of decompressed JSON (line {line} column {column})",
                        count.get()
                    ));
                    if source.kind() == io::ErrorKind::UnexpectedEof {
                        TraceError::Truncated {
                            name: name.to_string(),
                            location: format!("the gzip stream ends early, {at}"),
                        }
                    } else {
                        TraceError::GzipAt {
                            name: name.to_string(),
                            location: at,
                            source,
                        }
                    }
                }
                Source::Plain(_) => TraceError::Io {
                    path: name.to_string(),
                    source,
                },
            }
        }
        serde_json::error::Category::Eof if empty => TraceError::NotATrace {
            name: name.to_string(),
            reason: "the gzip stream decompresses to nothing".into(),
        },
        serde_json::error::Category::Eof => TraceError::Truncated {
            name: name.to_string(),
            location,
        },
        serde_json::error::Category::Syntax if line == 1 && column <= 1 => TraceError::NotATrace {
            name: name.to_string(),
            reason: match src {
                Source::Plain(head) => format!(
                    "it is not JSON (it starts with the bytes {})",
                    head.iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                Source::Gzip(_) => "its decompressed content is not JSON".into(),
            },
        },
        cat @ (serde_json::error::Category::Syntax | serde_json::error::Category::Data) => {
            let full = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
            let name = name.to_string();
            if cat == serde_json::error::Category::Syntax {
                TraceError::Json {
                    name,
                    location,
                    message,
                }
            } else {
                TraceError::BadValue {
                    name,
                    location,
                    message,
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Streaming visitors
// ---------------------------------------------------------------------------------------------

/// The event being read, for error messages.
#[derive(Default)]
struct EventCtx {
    index: usize,
    name: Option<Name>,
    ts_ns: Option<i64>,
    field: Option<&'static str>,
}

/// Categories Kineto writes that the importer knowingly does not use (no warning for them).
const UNUSED_CATEGORIES: &[&str] = &[
    "overhead",
    "cpu_instant_event",
    "cuda_profiler_range",
    "external_correlation",
    "gpu_pm_counter",
    "collective_comm",
    "glow_runtime",
    "mtia_runtime",
    "mtia_ccp_events",
    "mtia_insight",
    "privateuse1_runtime",
    "privateuse1_driver",
    "hpu_op",
    "xpu_runtime",
    "xpu_driver",
    "cpu_to_cuda",
];

#[derive(Default)]
struct State {
    trace: KinetoTrace,
    saw_trace_events: bool,
    top_keys: Vec<String>,
    min_ts: Option<i64>,
    gpu_activity: usize,
    launch_flows: usize,
    names: Interner,
    /// The event being read (`None` between events and outside `traceEvents`).
    ctx: Option<EventCtx>,
    /// The top-level section being read, outside `traceEvents`.
    section: Option<&'static str>,
    /// Unknown categories: events, first event index.
    unknown_cats: HashMap<Name, (usize, usize)>,
    /// The memory ceiling stopped the read.
    limit: Option<crate::limits::MemoryError>,
}

/// An event's fields as read, before normalisation.
#[derive(Default)]
struct RawEvent {
    ph: Option<Name>,
    cat: Option<Name>,
    name: Option<Name>,
    pid: Option<Id>,
    tid: Option<Id>,
    ts: Option<i64>,
    dur: Option<i64>,
    id: Option<u64>,
    args: Option<EventArgs>,
}

impl State {
    fn push(&mut self, raw: RawEvent) {
        let index = self.trace.events.len();
        let ph =
            raw.ph.as_deref().map_or(
                Phase::Other(self.names.get("")),
                |p| match Phase::parse_known(p) {
                    Some(ph) => ph,
                    None => Phase::Other(raw.ph.clone().unwrap_or_default()),
                },
            );
        let cat = match raw.cat {
            Some(c) => Category::known(&c, &ph).unwrap_or_else(|| {
                if !UNUSED_CATEGORIES.contains(&&*c) {
                    self.unknown_cats.entry(c.clone()).or_insert((0, index)).0 += 1;
                }
                if ph.is_flow() {
                    Category::Flow(FlowKind::Other(c))
                } else {
                    Category::Other(c)
                }
            }),
            None if ph.is_flow() => Category::Flow(FlowKind::Other(self.names.get(""))),
            None => Category::Other(self.names.get("")),
        };
        if ph != Phase::Metadata
            && let Some(ts) = raw.ts
        {
            self.min_ts = Some(self.min_ts.map_or(ts, |m| m.min(ts)));
        }
        if cat.is_gpu_activity() {
            self.gpu_activity += 1;
        }
        if cat == Category::Flow(FlowKind::LaunchToGpu) {
            self.launch_flows += 1;
        }
        let mut args = raw.args;
        if let Some(a) = args.as_mut()
            && raw.name.as_deref() == Some("[memory]")
            && let Some(bytes) = a.bytes.take()
        {
            let m = MemoryEvent {
                ts_ns: raw.ts.unwrap_or(0),
                bytes,
                total_allocated: a.mem_total_allocated.take(),
                total_reserved: a.mem_total_reserved.take(),
                addr: a.mem_addr.take(),
                // Without `Device Type`, a device index (≥ 0) says it is device memory.
                device_type: a
                    .mem_device_type
                    .take()
                    .unwrap_or(i32::from(a.device.is_some_and(|d| d >= 0)))
                    .clamp(0, 255) as i16,
                device_id: a.device.take().unwrap_or(-1).clamp(-1, 1 << 14) as i16,
                event: index.min(u32::MAX as usize) as u32,
            };
            self.trace.memory.push(m);
        }
        let names = &mut self.names;
        self.trace.events.push(Event {
            ph,
            cat,
            name: raw.name.unwrap_or_else(|| names.get("")),
            pid: raw.pid.unwrap_or_else(|| Id::Str(names.get(""))),
            tid: raw.tid.unwrap_or_else(|| Id::Str(names.get(""))),
            ts_ns: raw.ts.unwrap_or(0),
            dur_ns: raw.dur.unwrap_or(0),
            flow_id: raw.id,
            args: args.map(Args::from).unwrap_or_default(),
        });
    }
}

struct TopVisitor<'a>(&'a mut State);

impl<'de> Visitor<'de> for TopVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kineto trace (an object with `traceEvents`, or an array of events)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let st = self.0;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => {
                    if st.saw_trace_events {
                        return Err(de::Error::custom("a second `traceEvents`"));
                    }
                    st.saw_trace_events = true;
                    st.section = Some("traceEvents");
                    map.next_value_seed(EventsSeed(st))?;
                }
                "deviceProperties" => {
                    st.section = Some("deviceProperties");
                    let props: Option<Vec<DeviceProps>> = map.next_value()?;
                    st.trace.device_properties.extend(props.unwrap_or_default());
                }
                "distributedInfo" => {
                    st.section = Some("distributedInfo");
                    st.trace.distributed = map.next_value::<Option<DistributedInfo>>()?;
                }
                "schemaVersion" => st.trace.schema_version = map.next_value::<Lenient64>()?.0,
                "baseTimeNanoseconds" => {
                    st.trace.base_time_ns = map.next_value::<Lenient64>()?.0;
                }
                "traceName" => st.trace.trace_name = map.next_value::<LenientStr>()?.0,
                _ => {
                    if st.top_keys.len() < 12 {
                        st.top_keys.push(key);
                    }
                    map.next_value::<IgnoredAny>()?;
                }
            }
            st.section = None;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.0.trace.bare_array = true;
        EventsVisitor(self.0).visit_seq(seq)
    }
}

struct EventsSeed<'a>(&'a mut State);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(EventsVisitor(self.0))
    }
}

struct EventsVisitor<'a>(&'a mut State);

impl<'de> Visitor<'de> for EventsVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of trace events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let st = self.0;
        if let Some(n) = seq.size_hint() {
            st.trace.events.reserve(n.min(1 << 20));
        }
        loop {
            st.ctx = Some(EventCtx {
                index: st.trace.events.len(),
                ..EventCtx::default()
            });
            if seq.next_element_seed(EventSeed(st))?.is_none() {
                break;
            }
        }
        st.ctx = None;
        Ok(())
    }
}

/// One element of `traceEvents`, read straight into the state.
struct EventSeed<'a>(&'a mut State);

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

/// The event fields we read; everything else is skipped unparsed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Id,
    Args,
    Other,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Ph => "ph",
            Key::Cat => "cat",
            Key::Name => "name",
            Key::Pid => "pid",
            Key::Tid => "tid",
            Key::Ts => "ts",
            Key::Dur => "dur",
            Key::Id => "id",
            Key::Args => "args",
            Key::Other => "",
        }
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "ph" => Key::Ph,
            "cat" => Key::Cat,
            "name" => Key::Name,
            "pid" => Key::Pid,
            "tid" => Key::Tid,
            "ts" => Key::Ts,
            "dur" => Key::Dur,
            "id" => Key::Id,
            "args" => Key::Args,
            _ => Key::Other,
        })
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let st = self.0;
        let mut raw = RawEvent::default();
        let mut seen = 0u16;
        while let Some(key) = map.next_key::<Key>()? {
            if key == Key::Other {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let bit = 1u16 << (key as u16);
            if seen & bit != 0 {
                return Err(de::Error::custom(format!(
                    "duplicate field `{}` (which one holds?)",
                    key.name()
                )));
            }
            seen |= bit;
            if let Some(c) = st.ctx.as_mut() {
                c.field = Some(key.name());
            }
            let names = &mut st.names;
            match key {
                Key::Ph => raw.ph = map.next_value_seed(TextSeed(names))?,
                Key::Cat => raw.cat = map.next_value_seed(TextSeed(names))?,
                Key::Name => {
                    raw.name = map.next_value_seed(TextSeed(names))?;
                    if let Some(c) = st.ctx.as_mut() {
                        c.name.clone_from(&raw.name);
                    }
                }
                Key::Pid => raw.pid = map.next_value_seed(IdSeed(names))?,
                Key::Tid => raw.tid = map.next_value_seed(IdSeed(names))?,
                Key::Ts => {
                    raw.ts = map.next_value_seed(TimeSeed)?;
                    if let Some(t) = raw.ts.filter(|t| t.abs() > MAX_ABS_TS_NS) {
                        return Err(de::Error::custom(format!(
                            "time {} µs is out of range (trace times are within ±{} µs of \
                             the clock's zero, ~95 years)",
                            t as f64 / 1e3,
                            MAX_ABS_TS_NS / 1000
                        )));
                    }
                    if let Some(c) = st.ctx.as_mut() {
                        c.ts_ns = raw.ts;
                    }
                }
                Key::Dur => {
                    raw.dur = map.next_value_seed(TimeSeed)?;
                    if let Some(d) = raw.dur.filter(|&d| d < 0) {
                        return Err(de::Error::custom(format!(
                            "negative duration ({} µs): an event cannot end before it starts",
                            d as f64 / 1e3
                        )));
                    }
                    if let Some(d) = raw.dur.filter(|&d| d > MAX_DUR_NS) {
                        return Err(de::Error::custom(format!(
                            "duration {} µs is out of range (at most {} µs, ~31 years)",
                            d as f64 / 1e3,
                            MAX_DUR_NS / 1000
                        )));
                    }
                }
                Key::Id => raw.id = map.next_value_seed(FlowIdSeed)?,
                Key::Args => raw.args = map.next_value()?,
                Key::Other => {}
            }
        }
        if st.trace.events.len() == st.trace.events.capacity() {
            // The events vector is about to double: check the memory ceiling first.
            let extra =
                (st.trace.events.capacity().max(1024) * std::mem::size_of::<Event>()) as u64;
            let n = st.trace.events.len();
            if let Err(e) = crate::limits::check(|| format!("reading {n} events"), extra) {
                st.limit = Some(e);
                return Err(de::Error::custom("memory ceiling"));
            }
        }
        st.push(raw);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Lenient scalar helpers
// ---------------------------------------------------------------------------------------------

/// Any JSON value, kept as compact JSON text (`null` → None). Through a transient `Value`: serde_json's
/// `raw_value` feature would keep the text as written, but it costs every byte of every trace
/// ~30 % more parsing time.
fn raw_json<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<serde_json::Value>::deserialize(d)?;
    Ok(v.map(|v| v.to_string()))
}

/// Integer from an int, an (integral-ish, rounded) float or a numeric string; anything else → None.
struct Lenient64(Option<i64>);

impl<'de> Deserialize<'de> for Lenient64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(I64Visitor).map(Lenient64)
    }
}

fn lenient_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    d.deserialize_any(I64Visitor)
}

fn lenient_i32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    Ok(d.deserialize_any(I64Visitor)?
        .map(|v| v.clamp(i32::MIN as i64, i32::MAX as i64) as i32))
}

fn f64_to_i64(v: f64) -> Option<i64> {
    (v.is_finite() && v.abs() < 9.2e18).then(|| v.round() as i64)
}

fn str_to_i64(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<i64>() {
        return Some(v);
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return i64::from_str_radix(h, 16).ok();
    }
    s.parse::<f64>().ok().and_then(f64_to_i64)
}

struct I64Visitor;

impl<'de> Visitor<'de> for I64Visitor {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(i64::try_from(v).ok())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(f64_to_i64(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(str_to_i64(v))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| None)
    }
}

/// String from a string, or a number / bool written as text; null, arrays, objects → None.
struct LenientStr(Option<String>);

impl<'de> Deserialize<'de> for LenientStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor).map(LenientStr)
    }
}

fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    d.deserialize_any(StrVisitor)
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(v.to_string()))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(v.to_string()))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| None)
    }
}

/// A process or thread id, string ids interned.
struct IdSeed<'a>(&'a mut Interner);

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = Option<Id>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdSeed<'_> {
    type Value = Option<Id>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a process or thread id (number or string)")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Id::Num(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(match i64::try_from(v) {
            Ok(n) => Id::Num(n),
            Err(_) => Id::Str(self.0.get(&v.to_string())),
        }))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(if v.fract() == 0.0 && v.abs() < 9.2e18 {
            Id::Num(v as i64)
        } else {
            Id::Str(self.0.get(&v.to_string()))
        }))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Id::Str(self.0.get(v))))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(Id::Str(self.0.get(if v { "true" } else { "false" }))))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Text, interned: a string, or a number / bool written as text; null → None; an array or an
/// object is an error.
struct TextSeed<'a>(&'a mut Interner);

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = Option<Name>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = Option<Name>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(self.0.get(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(self.0.get(&v.to_string())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(self.0.get(&v.to_string())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(self.0.get(&v.to_string())))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(self.0.get(if v { "true" } else { "false" })))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

struct FlowIdSeed;

impl<'de> DeserializeSeed<'de> for FlowIdSeed {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(FlowIdVisitor)
    }
}

struct TimeSeed;

impl<'de> DeserializeSeed<'de> for TimeSeed {
    type Value = Option<i64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(TimeVisitor)
    }
}

/// FNV-1a, so that non-numeric string flow ids still pair up.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct FlowIdVisitor;

impl<'de> Visitor<'de> for FlowIdVisitor {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a flow id")
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(v as u64))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(if v.fract() == 0.0 && (0.0..1.8e19).contains(&v) {
            v as u64
        } else {
            v.to_bits()
        }))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        let t = v.trim();
        Ok(Some(
            t.parse::<u64>()
                .ok()
                .or_else(|| {
                    let h = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
                    u64::from_str_radix(h, 16).ok()
                })
                .unwrap_or_else(|| fnv1a(t)),
        ))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// µs as an f64 → ns, exact on the f64's value: integral part and fraction are converted apart,
/// so no product beyond 2^53 is ever formed in floating point.
fn f64_us_to_ns(v: f64) -> Option<i64> {
    if !v.is_finite() {
        return None;
    }
    let int = v.trunc();
    if int.abs() >= (i64::MAX / 1000) as f64 {
        return None;
    }
    let frac_ns = ((v - int) * 1000.0).round() as i64;
    (int as i64).checked_mul(1000)?.checked_add(frac_ns)
}

/// Decimal text in µs → ns, exact (rounded half away from zero at the ns digit).
fn str_us_to_ns(s: &str) -> Option<i64> {
    let s = s.trim();
    if s.contains(['e', 'E']) {
        return f64_us_to_ns(s.parse().ok()?);
    }
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int_s, frac_s) = body.split_once('.').unwrap_or((body, ""));
    if (int_s.is_empty() && frac_s.is_empty())
        || !int_s.bytes().all(|b| b.is_ascii_digit())
        || !frac_s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let int: i64 = if int_s.is_empty() {
        0
    } else {
        int_s.parse().ok()?
    };
    let digits = frac_s.as_bytes();
    let mut frac = 0i64;
    for i in 0..3 {
        frac = frac * 10 + digits.get(i).map_or(0, |d| i64::from(d - b'0'));
    }
    if digits.get(3).is_some_and(|d| *d >= b'5') {
        frac += 1;
    }
    let ns = int.checked_mul(1000)?.checked_add(frac)?;
    Some(if neg { -ns } else { ns })
}

struct TimeVisitor;

impl<'de> Visitor<'de> for TimeVisitor {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a time in µs (number)")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        v.checked_mul(1000)
            .map(Some)
            .ok_or_else(|| E::custom(format!("time {v} µs is out of range")))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i64::try_from(v)
            .ok()
            .and_then(|v| v.checked_mul(1000))
            .map(Some)
            .ok_or_else(|| E::custom(format!("time {v} µs is out of range")))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        f64_us_to_ns(v).map(Some).ok_or_else(|| {
            E::custom(format!(
                "time {} µs is out of range",
                crate::limits::show(v)
            ))
        })
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        str_us_to_ns(v)
            .map(Some)
            .ok_or_else(|| E::custom(format!("time {v:?} is not a number of µs")))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::PathBuf;

    fn parse(s: &str) -> KinetoTrace {
        parse_kineto(s.as_bytes(), "inline").unwrap()
    }

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    const LEGACY_2021: &str = r#"{"schemaVersion": 1, "traceEvents": [
      {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 12, "tid": 12, "ts": 100, "dur": 5, "args": {"External id": 3}},
      {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 12, "tid": 12, "ts": 101, "dur": 2, "args": {"External id": 3, "correlation": 77}},
      {"ph": "X", "cat": "Kernel", "name": "add_kernel", "pid": 0, "tid": "stream 7", "ts": 110, "dur": 3, "args": {"correlation": "77", "stream": 7, "device": 0}},
      {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "stream 7", "ts": 120, "dur": 1, "args": {"bytes": 4096.0}},
      {"ph": "s", "cat": "async", "name": "launch", "id": 77, "pid": 12, "tid": 12, "ts": 101},
      {"ph": "f", "cat": "async", "name": "launch", "id": "77", "pid": 0, "tid": "stream 7", "ts": 110, "bp": "e"}
    ]}"#;

    #[test]
    fn legacy_2021() {
        let t = parse(LEGACY_2021);
        let cats: Vec<_> = t.events.iter().map(|e| e.cat.clone()).collect();
        assert_eq!(
            cats,
            vec![
                Category::CpuOp,
                Category::CudaRuntime,
                Category::Kernel,
                Category::Memcpy,
                Category::Flow(FlowKind::LaunchToGpu),
                Category::Flow(FlowKind::LaunchToGpu),
            ]
        );
        assert_eq!(t.events[2].tid, Id::Str("stream 7".into()));
        assert_eq!(t.events[2].tid.trailing_number(), Some(7));
        assert_eq!(t.events[2].pid, Id::Num(0));
        assert_eq!(t.events[2].args.correlation, Some(77));
        assert_eq!(t.events[3].args.bytes, Some(4096));
        assert_eq!(t.events[4].flow_id, Some(77));
        assert_eq!(t.events[5].flow_id, Some(77));
        assert_eq!(t.events[5].ph, Phase::FlowEnd);
        assert_eq!(t.events[1].runtime_call(), Some(RuntimeCall::LaunchKernel));
        assert_eq!(t.events[0].ts_ns, 100_000);
        assert_eq!(t.events[0].dur_ns, 5_000);
        assert_eq!(t.trace_start_ns, Some(100_000));
        assert!(!t.sampled);
        assert!(t.replayable().is_ok());
    }

    #[test]
    fn v2022_and_2023() {
        let t = parse(
            r#"{"traceEvents": [
              {"ph": "s", "cat": "async_cpu_to_gpu", "id": 5, "pid": 1, "tid": 1, "ts": 1},
              {"ph": "s", "cat": "ac2g", "id": 6, "pid": 1, "tid": 1, "ts": 1},
              {"ph": "f", "cat": "fwdbwd", "id": 7, "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 1, "tid": 1, "ts": 1,
               "args": {"cuda_sync_kind": "Event Sync", "wait_on_cuda_event_record_corr_id": 9}},
              {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 1},
              {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "ts": 0, "args": {"labels": "GPU 0"}},
              {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 2},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 3,
               "args": {"Collective name": "allreduce", "In msg nelems": 10, "Group size": 2, "dtype": "Float",
                        "Process Group Name": "0", "Process Group Description": "default_pg", "grid": [1,1,1]}}
            ], "distributedInfo": {"backend": "nccl", "rank": "3", "world_size": 8.0}}"#,
        );
        let c: Vec<_> = t.events.iter().map(|e| e.cat.clone()).collect();
        assert_eq!(c[0], Category::Flow(FlowKind::LaunchToGpu));
        assert_eq!(c[1], Category::Flow(FlowKind::LaunchToGpu));
        assert_eq!(c[2], Category::Flow(FlowKind::FwdBwd));
        assert_eq!(c[3], Category::CudaDriver);
        assert_eq!(c[4], Category::Memset);
        assert_eq!(c[5], Category::GpuUserAnnotation);
        assert_eq!(t.events[5].profiler_step(), Some(4));
        assert_eq!(c[6], Category::CudaSync);
        assert_eq!(t.events[6].args.wait_on_cuda_event_record_corr_id, Some(9));
        assert_eq!(c[7], Category::PythonFunction);
        assert_eq!(c[8], Category::Trace);
        assert_eq!(t.events[8].pid, Id::Str("Spans".into()));
        assert_eq!(t.events[9].ph, Phase::Metadata);
        assert_eq!(t.events[9].args.labels.as_deref(), Some("GPU 0"));
        assert_eq!(t.events[10].ph, Phase::Instant);
        let k = &t.events[11].args;
        assert_eq!(k.collective_name.as_deref(), Some("allreduce"));
        assert_eq!((k.in_msg_nelems, k.group_size), (Some(10), Some(2)));
        assert_eq!(k.process_group_desc.as_deref(), Some("default_pg"));
        let d = t.distributed.unwrap();
        assert_eq!((d.rank, d.world_size), (Some(3), Some(8)));
        assert_eq!(d.backend.as_deref(), Some("nccl"));
        // metadata at ts 0 is not the trace start
        assert_eq!(t.trace_start_ns, Some(1000));
    }

    #[test]
    fn timestamps_ns() {
        let t = parse(
            r#"{"traceEvents": [
              {"ph": "X", "ts": 1.5, "dur": 0.0004, "pid": 1.0, "tid": 2},
              {"ph": "X", "ts": 1700000000123456.789, "dur": 2.25, "pid": 1, "tid": 2},
              {"ph": "X", "ts": 1700000000123456, "pid": 1, "tid": 2},
              {"ph": "X", "ts": "1700000000123456.789", "pid": 1, "tid": 2},
              {"ph": "X", "ts": 4458676522690.655, "pid": 1, "tid": 2}
            ]}"#,
        );
        let e = &t.events;
        assert_eq!(e[0].ts_ns, 1500);
        assert_eq!(e[0].dur_ns, 0);
        assert_eq!(e[0].pid, Id::Num(1));
        // f64 resolves 0.25 µs at this magnitude: the integral µs are exact, the fraction is kept
        // to within ±375 ns (nearest f64 is ...456.75 → 750 ns).
        let exact = 1_700_000_000_123_456_789i64;
        assert!((e[1].ts_ns - exact).abs() <= 375, "{}", e[1].ts_ns);
        assert_eq!(e[1].ts_ns / 1000, 1_700_000_000_123_456);
        assert_eq!(e[1].dur_ns, 2250);
        assert_eq!(e[2].ts_ns, 1_700_000_000_123_456_000);
        assert_eq!(e[3].ts_ns, exact); // string timestamps are exact
        assert_eq!(e[4].ts_ns, 4_458_676_522_690_655); // boot-relative clock: ns exact
        assert!(parse_kineto(r#"{"traceEvents":[{"ts": 1e300}]}"#.as_bytes(), "x").is_err());
        assert!(
            parse_kineto(
                r#"{"traceEvents":[{"ts": 9223372036854775807}]}"#.as_bytes(),
                "x"
            )
            .is_err()
        );
    }

    #[test]
    fn runtime_names() {
        use RuntimeCall::*;
        for (n, c) in [
            ("cudaLaunchKernel", LaunchKernel),
            ("cudaLaunchKernelExC", LaunchKernel),
            ("cuLaunchKernel", LaunchKernel),
            ("hipLaunchKernel", LaunchKernel),
            ("hipExtModuleLaunchKernel", LaunchKernel),
            ("cudaMemcpyAsync", MemcpyAsync),
            ("cuMemcpyHtoDAsync_v2", MemcpyAsync),
            ("cudaMemcpy", Memcpy { blocking: true }),
            ("hipMemcpyWithStream", Memcpy { blocking: true }),
            ("cudaMemsetAsync", MemsetAsync),
            ("cudaDeviceSynchronize", DeviceSynchronize),
            ("hipDeviceSynchronize", DeviceSynchronize),
            ("cudaStreamSynchronize", StreamSynchronize),
            ("hipStreamSynchronize", StreamSynchronize),
            ("cudaEventSynchronize", EventSynchronize),
            ("cudaEventRecord", EventRecord),
            ("hipEventRecord", EventRecord),
            ("cudaStreamWaitEvent", StreamWaitEvent),
            ("hipStreamWaitEvent", StreamWaitEvent),
            ("cudaGraphLaunch", GraphLaunch),
            ("cudaOccupancyMaxActiveBlocksPerMultiprocessor", Other),
            ("cudaStreamIsCapturing", Other),
            ("hipGetDevicePropertiesR0600", Other),
            ("INVALID", Other),
        ] {
            assert_eq!(runtime_call(n), c, "{n}");
        }
    }

    #[test]
    fn errors_name_file_and_position() {
        let e = parse_kineto(
            "{\"traceEvents\": [\n {\"ph\": \"X\",}\n]}".as_bytes(),
            "bad.json",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bad.json") && e.contains("line 2"), "{e}");
        let gz = gzip(b"{\"traceEvents\": [\n\n {\"ph\": X}]}");
        let e = parse_kineto(&gz[..], "bad.json.gz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("decompressed"), "{e}");
        let e = parse_kineto(&LEGACY_2021.as_bytes()[..200], "cut.json").unwrap_err();
        assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
        assert!(e.to_string().contains("cut.json is truncated"), "{e}");
        let gz = gzip(LEGACY_2021.as_bytes());
        let e = parse_kineto(&gz[..gz.len() - 10], "cut.json.gz").unwrap_err();
        assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
        let e = parse_kineto(r#"{"nodes": []}"#.as_bytes(), "et.json").unwrap_err();
        assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
        assert!(e.to_string().contains("nodes"), "{e}");
        let e = read_kineto(Path::new("/nonexistent/x.json")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("failed to read /nonexistent/x.json"),
            "{e}"
        );
    }

    /// The memory bound rests on this: the args of cpu ops, runtime calls and kernels stay inline
    /// (add an id that most events carry to `Args`, not only to `EventArgs`).
    #[test]
    fn memory_events_are_kept_compact_beside_the_events() {
        // A 2021 event (Bytes, device type and id) and a newer one (totals and address).
        let t = parse(
            r#"{"traceEvents":[
              {"ph":"i","s":"t","name":"[memory]","pid":1,"tid":2,"ts":10,
               "args":{"Device Type":1,"Device Id":0,"Bytes":512}},
              {"ph":"i","s":"t","cat":"cpu_instant_event","name":"[memory]","pid":1,"tid":"2","ts":11,
               "args":{"Total Reserved":2097152,"Total Allocated":1536,"Bytes":1024,"Addr":139637219459072,
                       "Device Type":1,"Device Id":0}},
              {"ph":"i","s":"t","name":"[memory]","pid":1,"tid":2,"ts":12,
               "args":{"Device Type":0,"Device Id":-1,"Bytes":-16}},
              {"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD","pid":0,"tid":7,"ts":13,"dur":1,
               "args":{"bytes":4096,"correlation":3}}
            ]}"#,
        );
        assert_eq!(t.events.len(), 4, "event indices stay the file's");
        assert_eq!(t.memory.len(), 3);
        let (a, b, c) = (&t.memory[0], &t.memory[1], &t.memory[2]);
        assert_eq!(
            (a.bytes, a.device_type, a.device_id, a.event),
            (512, 1, 0, 0)
        );
        assert_eq!(a.total_allocated, None);
        assert_eq!(
            (b.bytes, b.total_allocated, b.total_reserved, b.addr),
            (1024, Some(1536), Some(2_097_152), Some(139_637_219_459_072))
        );
        assert!(a.on_device() && b.on_device() && !c.on_device());
        for e in &t.events[..3] {
            assert!(e.args.full.is_none(), "a memory event stays unboxed");
        }
        // A memcpy keeps its own bytes.
        assert_eq!(t.events[3].args.bytes, Some(4096));
    }

    #[test]
    fn common_events_keep_their_args_inline() {
        let t = parse(
            r#"{"traceEvents":[
              {"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1,"dur":1,
               "args":{"External id":2,"Record function id":3,"Sequence number":4,"Fwd thread id":0,"Ev Idx":5}},
              {"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":1,"dur":1,
               "args":{"External id":2,"cbid":211,"correlation":7}},
              {"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":2,"dur":1,
               "args":{"External id":2,"queued":0,"device":0,"context":1,"stream":7,"correlation":7,
                       "registers per thread":40,"shared memory":0,"grid":[1,1,1],"block":[64,1,1]}},
              {"ph":"X","cat":"kernel","name":"ncclKernel","pid":0,"tid":7,"ts":2,"dur":1,
               "args":{"correlation":8,"stream":7,"Collective name":"allreduce"}}
            ]}"#,
        );
        for e in &t.events[..3] {
            assert!(e.args.full.is_none(), "{}", e.name);
        }
        let nccl = &t.events[3].args;
        assert!(nccl.full.is_some());
        assert_eq!(nccl.collective_name.as_deref(), Some("allreduce"));
        assert_eq!((nccl.correlation, nccl.stream), (Some(8), Some(7)));
        let cpu = &t.events[0].args;
        assert_eq!(
            (cpu.rf_id, cpu.seq, cpu.fwd_thread_id),
            (Some(3), Some(4), Some(0))
        );
        assert_eq!(cpu.to_event_args().external_id, Some(2));
        // Free-form args are kept as compact JSON text.
        let t = parse(
            r#"[{"name":"c10d::allreduce_","args":{"Input Dims": [[6144], [ ]], "Input type": ["float", ""]}}]"#,
        );
        assert_eq!(t.events[0].args.input_dims.as_deref(), Some("[[6144],[]]"));
        assert_eq!(
            t.events[0].args.input_type.as_deref(),
            Some(r#"["float",""]"#)
        );
        // Two events with one name share it.
        let t = parse(r#"[{"name":"aten::mm"},{"name":"aten::mm"}]"#);
        assert!(Arc::ptr_eq(&t.events[0].name, &t.events[1].name));
        assert!(
            std::mem::size_of::<Event>() <= 288,
            "{}",
            std::mem::size_of::<Event>()
        );
    }

    #[test]
    fn bare_array_and_unclosed_array() {
        let t = parse(r#"[{"ph": "X", "name": "a", "ts": 1, "pid": 1, "tid": 1}]"#);
        assert!(t.bare_array && t.warnings.is_empty());
        assert_eq!(t.events.len(), 1);
        let t = parse("[{\"ph\": \"X\", \"ts\": 1}, {\"ph\": \"B\", \"ts\": 2},\n");
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.warnings.len(), 1);
        assert_eq!(t.events[1].ph, Phase::Begin);
        assert!(parse_kineto("[".as_bytes(), "x").is_err());
        assert!(parse_kineto("42".as_bytes(), "x").is_err());
    }

    #[test]
    fn never_panics_on_truncation_or_garbage() {
        let plain = LEGACY_2021.as_bytes();
        for n in 0..=plain.len() {
            let _ = parse_kineto(&plain[..n], "t");
        }
        let gz = gzip(plain);
        for n in 0..=gz.len() {
            let _ = parse_kineto(&gz[..n], "t");
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in [1usize, 2, 3, 10, 100, 1000] {
            for prefix in [&b""[..], &[0x1f, 0x8b][..], &b"{\"traceEvents\":["[..]] {
                let mut v = prefix.to_vec();
                for _ in 0..len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    v.push(x as u8);
                }
                let _ = parse_kineto(&v[..], "garbage");
            }
        }
        let deep = "[".repeat(100_000);
        assert!(parse_kineto(deep.as_bytes(), "deep").is_err());
        let deep = format!("{{\"traceEvents\": [{{\"args\": {}", "[".repeat(100_000));
        assert!(parse_kineto(deep.as_bytes(), "deep").is_err());
    }

    // ---- real files --------------------------------------------------------------------------

    fn traces_dir() -> Option<PathBuf> {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
        if d.is_dir() {
            Some(d)
        } else {
            crate::skip_note!("skipping: ../shared/traces not found");
            None
        }
    }

    fn kernels(t: &KinetoTrace) -> usize {
        t.events
            .iter()
            .filter(|e| e.cat == Category::Kernel)
            .count()
    }

    fn cpu_steps(t: &KinetoTrace) -> usize {
        t.events
            .iter()
            .filter(|e| e.cat == Category::UserAnnotation && e.profiler_step().is_some())
            .count()
    }

    #[test]
    fn real_pytorch_kineto_files() {
        let Some(dir) = traces_dir() else { return };
        let d = dir.join("pytorch-kineto");
        // (file, events, kernels, CPU ProfilerStep spans, launch→GPU flow events, nccl kernels),
        // all counted independently with python3.
        let facts = [
            ("alexnet_a100_cuda_sync.json.gz", 1408, 79, 0, 500, 0),
            (
                "linear_rtx2080ti_no_profilerstep.json.gz",
                86859,
                8716,
                0,
                24871,
                0,
            ),
            (
                "resnet18like_rtx2080ti_no_profilerstep.json.gz",
                111631,
                9628,
                0,
                36041,
                0,
            ),
            (
                "resnet50_ddp_a100_rank0of2.json.gz",
                40573,
                2700,
                3,
                12514,
                21,
            ),
            (
                "resnet50_v100_1gpu_ns_timestamps.json.gz",
                68692,
                4350,
                5,
                21424,
                0,
            ),
            (
                "sampled_events_rank0of128_NOT_REPLAYABLE.json.gz",
                4855,
                1154,
                2,
                0,
                10,
            ),
            (
                "sampled_events_rank1of128_NOT_REPLAYABLE.json.gz",
                4720,
                1104,
                2,
                0,
                10,
            ),
            ("toy_cuda_event_sync.json.gz", 92, 4, 1, 21, 0),
            ("toy_cuda_event_sync_multi_stream.json.gz", 149, 3, 0, 50, 0),
            ("toy_train_mi250_rocm.json.gz", 220, 14, 2, 37, 0),
        ];
        for (f, n, k, steps, l2g, nccl) in facts {
            let t = read_kineto(&d.join(f)).unwrap();
            assert_eq!(t.events.len(), n, "{f}");
            assert_eq!(kernels(&t), k, "{f}");
            assert_eq!(cpu_steps(&t), steps, "{f}");
            let flows = t
                .events
                .iter()
                .filter(|e| e.cat == Category::Flow(FlowKind::LaunchToGpu))
                .count();
            assert_eq!(flows, l2g, "{f}");
            let nc = t
                .events
                .iter()
                .filter(|e| e.cat == Category::Kernel && e.name.to_lowercase().contains("nccl"))
                .count();
            assert_eq!(nc, nccl, "{f}");
            assert_eq!(t.schema_version, Some(1), "{f}");
            if f.contains("NOT_REPLAYABLE") {
                assert!(t.sampled, "{f}");
                let why = t.replayable().unwrap_err();
                assert!(why.contains("cannot be replayed"), "{why}");
                eprintln!("{f}: {why}");
            } else {
                assert!(!t.sampled, "{f}");
                t.replayable().unwrap();
            }
            // Every trace carries the profiler's own string-id span.
            assert!(
                t.events.iter().any(|e| e.pid == Id::Str("Spans".into())),
                "{f}"
            );
        }
    }

    #[test]
    fn real_ddp_trace_metadata_and_collectives() {
        let Some(dir) = traces_dir() else { return };
        let d = dir.join("pytorch-kineto");
        let t = read_kineto(&d.join("resnet50_ddp_a100_rank0of2.json.gz")).unwrap();
        let dist = t.distributed.as_ref().unwrap();
        assert_eq!((dist.rank, dist.world_size), (Some(0), Some(2)));
        assert_eq!(dist.backend.as_deref(), Some("nccl"));
        assert_eq!(
            t.device_properties[0].name.as_deref(),
            Some("NVIDIA A100-PG509-200")
        );
        assert_eq!(t.device_properties[0].total_global_mem, Some(42297524224));
        assert_eq!(t.base_time_ns, Some(1711964646000000000));
        assert_eq!(t.trace_start_ns, Some(4_458_676_388_068_751));
        let nccl: Vec<_> = t
            .events
            .iter()
            .filter(|e| e.cat == Category::Kernel && e.name.contains("nccl"))
            .collect();
        let ar = nccl
            .iter()
            .filter(|e| e.args.collective_name.as_deref() == Some("allreduce"))
            .count();
        assert_eq!(ar, 15);
        assert!(
            nccl.iter()
                .all(|e| e.args.stream == Some(40) && e.args.group_size == Some(2))
        );
        let step4 = t
            .events
            .iter()
            .find(|e| e.cat == Category::UserAnnotation && e.profiler_step() == Some(4))
            .unwrap();
        assert_eq!(step4.dur_ns, 222_442_191);
    }

    #[test]
    fn real_rocm_ns_and_sampled_traces() {
        let Some(dir) = traces_dir() else { return };
        let d = dir.join("pytorch-kineto");
        let t = read_kineto(&d.join("toy_train_mi250_rocm.json.gz")).unwrap();
        let rt: Vec<_> = t
            .events
            .iter()
            .filter_map(|e| e.runtime_call().map(|c| (e, c)))
            .collect();
        // 12 hipLaunchKernel + 2 hipExtModuleLaunchKernel = 14 = kernels
        let launches = rt
            .iter()
            .filter(|(_, c)| *c == RuntimeCall::LaunchKernel)
            .count();
        assert_eq!(launches, 14);
        assert!(rt.iter().all(|(e, c)| e.name.starts_with("hip")
            && (*c != RuntimeCall::Other || e.name.starts_with("hipGetDeviceProperties"))));
        assert_eq!(
            t.device_properties[0].name.as_deref(),
            Some("AMD Radeon Graphics")
        );

        let t = read_kineto(&d.join("resnet50_v100_1gpu_ns_timestamps.json.gz")).unwrap();
        assert_eq!(
            t.trace_start_ns.map(|v| v / 1000),
            Some(1_712_195_495_406_752)
        );
        let durs: Vec<_> = t
            .events
            .iter()
            .filter(|e| e.cat == Category::UserAnnotation && e.profiler_step().is_some())
            .map(|e| e.dur_ns)
            .collect();
        assert_eq!(
            durs,
            vec![35_115_869, 72_077_474, 95_697_341, 95_551_087, 95_699_037]
        );

        let t = read_kineto(&d.join("sampled_events_rank1of128_NOT_REPLAYABLE.json.gz")).unwrap();
        let dist = t.distributed.unwrap();
        assert_eq!((dist.rank, dist.world_size), (Some(1), Some(128)));
    }

    #[test]
    fn real_dlrm_and_simple_add() {
        let Some(dir) = traces_dir() else { return };
        // (kernels, events) per rank, counted with python3
        let facts = [
            (245, 3290),
            (310, 3424),
            (246, 3268),
            (315, 3474),
            (251, 3310),
            (245, 3250),
            (246, 3272),
            (246, 3250),
        ];
        for (r, (k, n)) in facts.into_iter().enumerate() {
            let f = dir.join(format!("multi-rank-dlrm/rank{r}.kineto.json.gz"));
            let t = read_kineto(&f).unwrap();
            let d = t.distributed.as_ref().unwrap();
            assert_eq!((d.rank, d.world_size), (Some(r as i64), Some(8)));
            assert_eq!((kernels(&t), t.events.len()), (k, n), "rank {r}");
            assert_eq!(cpu_steps(&t), 1);
            let nccl = t
                .events
                .iter()
                .filter(|e| e.cat == Category::Kernel && e.name.starts_with("ncclKernel"))
                .count();
            assert_eq!(nccl, 8, "rank {r}");
            assert_eq!(
                t.device_properties[0].name.as_deref(),
                Some("Tesla V100-SXM2-32GB")
            );
            t.replayable().unwrap();
        }
        let t = read_kineto(&dir.join("execution-traces/simple_add.kineto.json.gz")).unwrap();
        assert_eq!((t.events.len(), kernels(&t)), (111, 4));
        t.replayable().unwrap();
    }
}
