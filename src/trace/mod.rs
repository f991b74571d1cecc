//! Trace importers: readers that turn recorded training traces (PyTorch profiler / Kineto Chrome
//! traces for now) into normalised event lists for the rest of the importer (graph construction,
//! replay). This module holds the shared error type; each format lives in its own submodule.

pub mod align;
pub mod graph;
pub mod kineto;
pub mod multi;

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
    /// The data ends before the JSON document does.
    #[error(
        "{name} is truncated: the data ends early ({location}); the file is incomplete \
         (an interrupted download or copy, or a profiler killed while writing it)"
    )]
    Truncated { name: String, location: String },
    /// Syntax error or a value of the wrong type.
    #[error("malformed JSON in {name} at {location}: {message}")]
    Json {
        name: String,
        location: String,
        message: String,
    },
    /// Valid JSON, but not a Chrome / Kineto trace.
    #[error("{name} is not a Kineto/Chrome trace: {reason}")]
    NotATrace { name: String, reason: String },
}
