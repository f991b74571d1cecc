//! The performance database (Benanza §III-C): the latency of each unique layer (and each fused
//! chain) on a GPU in a dtype, by implementation, as a versioned JSON file.
//!
//! ```json
//! {"version": 1, "entries": [
//!   {"gpu": "v100-32gb", "dtype": "fp32", "layer": "Conv[...](...)->...", "implementation": "roofline",
//!    "source": "analytic", "ms": 0.0123, "flops": 1.8e9, "bytes": 1.2e6}]}
//! ```
//!
//! Entries are keyed by (gpu, dtype, layer, implementation). Analytic entries are recomputed on
//! every run from the GPU config (so they never go stale when a config changes); measured ones
//! (`trainplan lower-bound --measure`, built with the `gpu` feature) are kept. A lookup takes the
//! fastest measured implementation when the layer has one, else the analytic entry. Entries are
//! written sorted, so the same database gives a byte-identical file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cost::config::Dtype;

/// The file format version this build reads and writes.
pub const VERSION: u32 = 1;

/// Where a latency comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The roofline model over the GPU config (`crate::cost::compute`).
    Analytic,
    /// Timed on the GPU.
    Measured,
}

/// One database entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub gpu: String,
    pub dtype: Dtype,
    /// The layer's canonical key (`fused:<pattern>:<member keys>` for a fused chain).
    pub layer: String,
    /// `roofline` for analytic entries; the kernel or library for measured ones.
    pub implementation: String,
    pub source: Source,
    pub ms: f64,
    #[serde(default)]
    pub flops: f64,
    #[serde(default)]
    pub bytes: f64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    entries: Vec<Entry>,
}

type Key = (String, Dtype, String, String);

/// Why a database file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{file}: failed to read: {message}")]
    Io { file: String, message: String },
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

/// The database in memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerfDb {
    entries: BTreeMap<Key, Entry>,
}

impl PerfDb {
    pub fn new() -> Self {
        Self::default()
    }

    /// Read a database file; a missing file is an empty database.
    pub fn open(path: &Path) -> Result<PerfDb, DbError> {
        let file = path.display().to_string();
        let text = match crate::input::read_to_string(path, crate::input::InputKind::PerfDb) {
            Ok(t) => t,
            Err(crate::input::InputError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PerfDb::new());
            }
            Err(e) => {
                return Err(DbError::Io {
                    file,
                    message: e.to_string(),
                });
            }
        };
        Self::parse(&text, &file)
    }

    /// Parse database text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<PerfDb, DbError> {
        // Check the version first, so a future file is refused for its version, not its fields.
        let head: serde_json::Value = serde_json::from_str(text).map_err(|e| DbError::Parse {
            file: file.into(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        match head.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == VERSION as u64 => {}
            Some(v) => {
                return Err(DbError::Invalid {
                    file: file.into(),
                    message: format!(
                        "version {v} is not supported (this trainplan reads version {VERSION})"
                    ),
                });
            }
            None => {
                return Err(DbError::Invalid {
                    file: file.into(),
                    message: "not a trainplan performance database: no `version` number".into(),
                });
            }
        }
        let f: File = serde_json::from_str(text).map_err(|e| DbError::Parse {
            file: file.into(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let mut db = PerfDb::new();
        for (i, e) in f.entries.into_iter().enumerate() {
            // One layer's latency is at most one op's physical bound (2^50 ns, ~13 days): a
            // larger entry would become the bound with no warning.
            let max_ms = crate::graph::bounds::MAX_OP_NS as f64 / 1e6;
            if !(e.ms.is_finite() && e.ms >= 0.0 && e.ms <= max_ms) {
                return Err(DbError::Invalid {
                    file: file.into(),
                    message: format!(
                        "entries[{i}] ({}): ms must be between 0 and {max_ms:e} (one layer's physical bound), got {}",
                        e.layer, e.ms
                    ),
                });
            }
            let key = (
                e.gpu.clone(),
                e.dtype,
                e.layer.clone(),
                e.implementation.clone(),
            );
            if db.entries.insert(key, e).is_some() {
                return Err(DbError::Invalid {
                    file: file.into(),
                    message: format!("entries[{i}] repeats an earlier entry's key"),
                });
            }
        }
        Ok(db)
    }

    /// The file text (pretty JSON, entries sorted by key, trailing newline).
    pub fn to_json(&self) -> String {
        let f = File {
            version: VERSION,
            entries: self.entries.values().cloned().collect(),
        };
        let mut s = serde_json::to_string_pretty(&f).expect("plain data serialises");
        s.push('\n');
        s
    }

    /// Insert or replace an entry.
    pub fn upsert(&mut self, e: Entry) {
        self.entries.insert(
            (
                e.gpu.clone(),
                e.dtype,
                e.layer.clone(),
                e.implementation.clone(),
            ),
            e,
        );
    }

    /// The best entry for a layer: the fastest measured one, else the fastest analytic one.
    pub fn best(&self, gpu: &str, dtype: Dtype, layer: &str) -> Option<&Entry> {
        let lo = (gpu.to_string(), dtype, layer.to_string(), String::new());
        let all = || {
            self.entries
                .range(lo.clone()..)
                .take_while(|(k, _)| k.0 == gpu && k.1 == dtype && k.2 == layer)
                .map(|(_, e)| e)
        };
        let by_ms = |a: &&Entry, b: &&Entry| a.ms.total_cmp(&b.ms);
        all()
            .filter(|e| e.source == Source::Measured)
            .min_by(by_ms)
            .or_else(|| all().min_by(by_ms))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }
    /// Number of measured entries.
    pub fn measured(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.source == Source::Measured)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(layer: &str, imp: &str, source: Source, ms: f64) -> Entry {
        Entry {
            gpu: "v100-32gb".into(),
            dtype: Dtype::Fp32,
            layer: layer.into(),
            implementation: imp.into(),
            source,
            ms,
            flops: 1.0,
            bytes: 2.0,
        }
    }

    #[test]
    fn measured_beats_analytic_and_the_fastest_measured_wins() {
        let mut db = PerfDb::new();
        db.upsert(entry("L", "roofline", Source::Analytic, 0.5));
        assert_eq!(db.best("v100-32gb", Dtype::Fp32, "L").unwrap().ms, 0.5);
        db.upsert(entry("L", "cublas", Source::Measured, 0.9));
        db.upsert(entry("L", "nvrtc", Source::Measured, 0.7));
        let b = db.best("v100-32gb", Dtype::Fp32, "L").unwrap();
        assert_eq!((b.implementation.as_str(), b.ms), ("nvrtc", 0.7));
        assert!(db.best("v100-32gb", Dtype::Fp16, "L").is_none());
        assert!(db.best("v100-32gb", Dtype::Fp32, "L2").is_none());
    }

    #[test]
    fn round_trip_is_byte_identical() {
        let mut db = PerfDb::new();
        db.upsert(entry("b", "roofline", Source::Analytic, 0.25));
        db.upsert(entry("a", "cublas", Source::Measured, 1.5));
        let text = db.to_json();
        let back = PerfDb::parse(&text, "db.json").unwrap();
        assert_eq!(back, db);
        assert_eq!(back.to_json(), text);
        assert!(text.find("\"a\"").unwrap() < text.find("\"b\"").unwrap());
        assert_eq!(back.measured(), 1);
    }

    #[test]
    fn bad_files_name_the_place() {
        let e = PerfDb::parse("{\"version\": 1,\n \"entries\": [}", "db.json")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("db.json:2:"), "{e}");
        let e = PerfDb::parse("{\"version\": 2, \"entries\": []}", "db.json")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "db.json: version 2 is not supported (this trainplan reads version 1)"
        );
        let mut db = PerfDb::new();
        db.upsert(entry("L", "roofline", Source::Analytic, 0.5));
        let bad = db.to_json().replace("0.5", "-1.0");
        let e = PerfDb::parse(&bad, "db.json").unwrap_err().to_string();
        assert!(
            e.contains("entries[0] (L): ms must be between 0 and 1.125899906842624e9"),
            "{e}"
        );
        assert!(e.ends_with("got -1"), "{e}");
        // A latency past the physical bound would become the bound: refused, naming the entry.
        let huge = db.to_json().replace("0.5", "1e300");
        let e = PerfDb::parse(&huge, "db.json").unwrap_err().to_string();
        assert!(e.starts_with("db.json: entries[0] (L): ms must be"), "{e}");
        let e = PerfDb::parse("[1, 2]", "db.json").unwrap_err().to_string();
        assert!(e.contains("no `version`"), "{e}");
    }
}
