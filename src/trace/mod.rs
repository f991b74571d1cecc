//! Trace importers: readers that turn recorded training traces into normalised data for the rest
//! of the importer (graph construction, replay). This module holds the shared error type; each
//! format lives in its own submodule:
//!
//! * [`kineto`]: PyTorch profiler (Kineto) Chrome traces, streamed; [`graph`]: one rank's step of
//!   one → a `Job`, in stages; [`shapes`] and [`work`]: each kernel's work from its operator's
//!   recorded shapes (or its name); [`memory`]: the step's device memory from `[memory]` events
//!   (or shapes); [`facts`]: what the trace says about the job (batch, GPU, ranks, buckets);
//!   [`peers`]: a rank alone, whose collectives wait for absent peers. [`step`]: what a built
//!   step is (its window, job and collective kernels), the types all of these share; `phase`: the
//!   training phase an event's name implies.
//! * [`chakra`]: Chakra execution traces (protobuf, varint-length-delimited), streamed one message
//!   at a time, and a `Job` from the nodes.
//! * [`host_et`]: PyTorch host execution traces (JSON): operators, tensor data dependencies,
//!   communication calls with their sizes.
//! * [`link`]: each NCCL/RCCL kernel of a Kineto trace → its collective's kind and size (kernel
//!   args, else the host ET of the same run, else the operator's input shapes).
//! * [`horovod`]: Horovod timelines (a Chrome event array, often without its closing `]`).
//! * [`multi`], [`align`], [`extrapolate`]: several ranks in one graph, their clock alignment, and
//!   one rank standing for n workers; [`collective`]: a kernel's collective type and the kinds and
//!   sizes the one-rank-to-n model prices, shared by them and [`link`].
//!
//! Every error names the file and where in it (line/column of the JSON, or message index and
//! byte offset of a protobuf stream); ignorable oddities become warnings on the result.

pub mod align;
pub mod calls;
pub mod chakra;
pub mod collective;
pub mod extrapolate;
pub mod facts;
pub mod fsdp;
pub mod graph;
pub mod horovod;
pub mod host_et;
pub mod kineto;
pub mod link;
pub mod memory;
pub mod multi;
pub mod peers;
pub(crate) mod phase;
pub mod shapes;
pub mod step;
pub mod work;

pub use kineto::{KinetoTrace, parse_kineto, read_kineto};

/// Everything that can go wrong while reading a trace. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("failed to read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file starts with the gzip magic bytes but is not a valid gzip stream.
    #[error("failed to decompress {name} (gzip): {source}")]
    Gzip {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The gzip stream breaks part way; `location`: how far decompression got (bytes of JSON,
    /// line and column, event).
    #[error("failed to decompress {name} (gzip, {location}): {source}")]
    GzipAt {
        name: String,
        location: String,
        #[source]
        source: std::io::Error,
    },
    /// The data ends before the JSON document does.
    #[error(
        "{name} is truncated: the data ends early ({location}); the file is incomplete \
         (an interrupted download or copy, or a profiler killed while writing it)"
    )]
    Truncated { name: String, location: String },
    /// Syntax error or a value of the wrong type. `location`: line and column (of the
    /// decompressed JSON for gzip files), and the event (index in `traceEvents`, name, `ts`, field)
    /// when the error is inside one.
    #[error("malformed JSON in {name} at {location}: {message}")]
    Json {
        name: String,
        location: String,
        message: String,
    },
    /// Valid JSON holding a value the importer refuses (a wrong type, a time out of range, a
    /// negative duration, a field given twice); `location` as for [`TraceError::Json`].
    #[error("bad value in {name} at {location}: {message}")]
    BadValue {
        name: String,
        location: String,
        message: String,
    },
    /// A limit of the README's "Limits" section was reached while reading: the decompressed
    /// size of the file's kind, a JSON string's length, the memory ceiling. `location` as for
    /// [`TraceError::Json`].
    #[error("failed to read {name} ({location}): {source}")]
    Limit {
        name: String,
        location: String,
        #[source]
        source: crate::input::InputError,
    },
    /// The same file given twice as two ranks.
    #[error("{name} is given twice: give each rank's trace once")]
    Duplicate { name: String },
    /// Valid JSON, but not a Chrome / Kineto trace.
    #[error("{name} is not a Kineto/Chrome trace: {reason}")]
    NotATrace { name: String, reason: String },
    /// Readable bytes that do not make a valid trace of the expected format (a protobuf message
    /// that does not decode, a JSON document that is not an execution trace, ...).
    #[error("{name} is not a valid {format} at {location}: {message}")]
    Invalid {
        name: String,
        /// `Chakra execution trace`, `PyTorch host execution trace`, `Horovod timeline`, ...
        format: &'static str,
        location: String,
        message: String,
    },
}

/// Whether a file name looks like a Kineto / Chrome trace rather than an execution trace.
fn kineto_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    (n.ends_with(".json") || n.ends_with(".json.gz"))
        && !n.contains("execution_trace")
        && !n.contains("host_et")
        && !n.contains(".et.")
}

/// Expand `--trace` arguments: files stay as given (in order); a folder stands for the Kineto
/// traces in it (`*.json`, `*.json.gz`, execution traces excluded), sorted by name.
pub fn expand_inputs(paths: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>, TraceError> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let io = |source| TraceError::Io {
            path: p.display().to_string(),
            source,
        };
        let mut found: Vec<std::path::PathBuf> = Vec::new();
        for entry in std::fs::read_dir(p).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().to_string());
            if path.is_file() && name.is_some_and(|n| kineto_name(&n)) {
                found.push(path);
            }
        }
        if found.is_empty() {
            return Err(TraceError::NotATrace {
                name: p.display().to_string(),
                reason: "the folder holds no Kineto trace (*.json or *.json.gz that is not an \
                         execution trace)"
                    .into(),
            });
        }
        found.sort();
        out.extend(found);
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &out {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        if !seen.insert(key) {
            return Err(TraceError::Duplicate {
                name: p.display().to_string(),
            });
        }
    }
    Ok(out)
}
