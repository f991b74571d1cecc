//! Limits: how large each kind of input may be, and the memory ceiling trainplan keeps itself
//! under. These are the figures of the README's "Limits" section; a test reads the README and
//! checks that the two agree.
//!
//! * **Per-kind caps** ([`InputKind`]): the size of the file on disk and, for gzip-compressed
//!   traces, of the decompressed stream. Enforced by [`crate::input`], the one way to open an
//!   input file.
//! * **JSON strings** in traces: at most [`MAX_JSON_STRING_BYTES`] each (a 4 GiB string in a 4 MB
//!   gzip would otherwise be buffered whole by the parser).
//! * **Workers and ranks**: at most [`MAX_WORKERS`] workers in a cluster and as many rank files.
//! * **Memory ceiling** ([`set_ceiling`], `--max-memory`; default [`DEFAULT_CEILING_PERCENT`] %
//!   of the machine's RAM, or of the cgroup's limit when that is lower): readers check the
//!   process's resident memory as they go ([`check`]), and stages that allocate in bulk check
//!   what they are about to allocate before they do, so an input that would need more becomes a
//!   one-line "would need N GB" error (exit 3) instead of an abort.
//!
//! **Invariant:** the ceiling is process-wide and set once, by the CLI, before any work; the
//! library's default is no ceiling (tests and benches run unbounded unless they set one).

use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::cost::config::MAX_WORKERS;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A kind of input file, with its caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A GPU, network or cluster YAML file (`--cluster FILE`, `gpu:`, `intra:`, `--gpu FILE`).
    Config,
    /// A declarative pass (`--pass-file`).
    PassFile,
    /// A plan (`trainplan export PLAN.yaml`).
    Plan,
    /// The performance database of `lower-bound --db`.
    PerfDb,
    /// An nccl-tests output table (communication calibration).
    NcclTests,
    /// An ONNX model (`lower-bound MODEL.onnx`). Protobuf's own limit is 2 GiB.
    Onnx,
    /// A Kineto (PyTorch profiler) trace or Horovod timeline, `.json` or `.json.gz`.
    KinetoTrace,
    /// A PyTorch host execution trace, named or found beside a Kineto trace.
    HostEt,
    /// A Chakra execution trace (protobuf stream, optionally gzip).
    ChakraTrace,
}

impl InputKind {
    /// Every kind, in the README's order.
    pub const ALL: [InputKind; 9] = [
        InputKind::Config,
        InputKind::PassFile,
        InputKind::Plan,
        InputKind::PerfDb,
        InputKind::NcclTests,
        InputKind::Onnx,
        InputKind::KinetoTrace,
        InputKind::HostEt,
        InputKind::ChakraTrace,
    ];

    /// What the file is, for messages and the README table.
    pub fn what(self) -> &'static str {
        match self {
            InputKind::Config => "config file",
            InputKind::PassFile => "pass file",
            InputKind::Plan => "plan",
            InputKind::PerfDb => "performance database",
            InputKind::NcclTests => "nccl-tests table",
            InputKind::Onnx => "ONNX model",
            InputKind::KinetoTrace => "Kineto trace",
            InputKind::HostEt => "host execution trace",
            InputKind::ChakraTrace => "Chakra execution trace",
        }
    }

    /// Largest file accepted, bytes.
    pub fn max_file_bytes(self) -> u64 {
        match self {
            InputKind::Config | InputKind::PassFile => 4 * MIB,
            InputKind::Plan | InputKind::PerfDb => 256 * MIB,
            InputKind::NcclTests => 64 * MIB,
            InputKind::Onnx => 2 * GIB,
            InputKind::KinetoTrace => 16 * GIB,
            InputKind::HostEt | InputKind::ChakraTrace => 4 * GIB,
        }
    }

    /// Largest decompressed stream accepted for a gzip file of this kind, bytes; None when the
    /// kind is never compressed.
    pub fn max_decompressed_bytes(self) -> Option<u64> {
        match self {
            InputKind::KinetoTrace => Some(32 * GIB),
            InputKind::HostEt | InputKind::ChakraTrace => Some(16 * GIB),
            _ => None,
        }
    }
}

/// Longest JSON string accepted in a trace, bytes (names, kernel names, shapes as text).
pub const MAX_JSON_STRING_BYTES: u64 = 16 * MIB;

/// Default memory ceiling: this percentage of the machine's RAM (or of the cgroup's memory limit
/// when that is lower).
pub const DEFAULT_CEILING_PERCENT: u64 = 75;

/// The ceiling in bytes; `u64::MAX` = none.
static CEILING: AtomicU64 = AtomicU64::new(u64::MAX);

/// Set the process's memory ceiling (bytes; None: no ceiling).
pub fn set_ceiling(bytes: Option<u64>) {
    CEILING.store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// The memory ceiling in bytes, when one is set.
pub fn ceiling() -> Option<u64> {
    let c = CEILING.load(Ordering::Relaxed);
    (c != u64::MAX).then_some(c)
}

/// [`DEFAULT_CEILING_PERCENT`] of the RAM this process may use: the smaller of `MemTotal` and the
/// cgroup (v2 or v1) memory limit. None where neither can be read (not Linux).
pub fn default_ceiling() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|t| t.trim().parse::<u64>().ok())
    .min();
    let ram = match (total, cgroup) {
        (Some(t), Some(c)) => t.min(c),
        (t, c) => t.or(c)?,
    };
    Some(ram / 100 * DEFAULT_CEILING_PERCENT)
}

/// Memory one evaluation (expanded graph, replay, critical path, memory report) needs per op
/// of the graph, bytes: `replay --symmetric` of BERT-base on 8,192 GPUs (6.75 M ops) peaks at
/// 680 MB, ~100 bytes an op with the process; 120 leaves room.
pub const EVAL_BYTES_PER_OP: u64 = 120;

/// Whether `bytes` more fit under the ceiling now (always, without one).
pub fn fits(bytes: u64) -> bool {
    match ceiling() {
        None => true,
        Some(c) => resident_bytes().unwrap_or(0).saturating_add(bytes) <= c,
    }
}

/// Bytes the ceiling leaves now (`u64::MAX` without one).
pub fn available() -> u64 {
    match ceiling() {
        None => u64::MAX,
        Some(c) => c.saturating_sub(resident_bytes().unwrap_or(0)),
    }
}

/// Resident memory of this process, bytes (`/proc/self/statm`); None where unavailable.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(page_size()))
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// More memory than the ceiling allows.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "{what} would need {} of memory, more than the ceiling of {} (--max-memory; default {DEFAULT_CEILING_PERCENT} % of RAM)",
    gb(*need),
    gb(*ceiling)
)]
pub struct MemoryError {
    /// What was being done (`reading r0.json`, `building the 65,536-worker graph`).
    pub what: String,
    /// Bytes it would have needed in all (resident + about to allocate).
    pub need: u64,
    pub ceiling: u64,
}

/// A number as a message shows it: plainly in the usual range, in scientific notation when it
/// is huge or tiny (`1e308`, not 309 digits; `1e-320`, not 320 zeros).
pub fn show(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// Bytes in GB (10⁹) with one decimal.
pub fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// Check that the process's resident memory plus `extra` bytes it is about to allocate stays
/// under the ceiling. Cheap (one read of `/proc/self/statm`); call it every few MB of input or
/// before a bulk allocation, not per item.
pub fn check(what: impl FnOnce() -> String, extra: u64) -> Result<(), MemoryError> {
    let Some(ceiling) = ceiling() else {
        return Ok(());
    };
    let need = resident_bytes().unwrap_or(0).saturating_add(extra);
    if need > ceiling {
        return Err(MemoryError {
            what: what(),
            need,
            ceiling,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_ordered_and_compressed_kinds_have_a_decompressed_cap() {
        for k in InputKind::ALL {
            assert!(k.max_file_bytes() >= MIB, "{k:?}");
            if let Some(d) = k.max_decompressed_bytes() {
                assert!(d >= k.max_file_bytes(), "{k:?}");
            }
        }
        assert_eq!(InputKind::Config.max_file_bytes(), 4 << 20);
    }

    #[test]
    fn resident_memory_and_default_ceiling_are_read_on_linux() {
        if !std::path::Path::new("/proc/self/statm").exists() {
            crate::skip_note!("no /proc: skipping");
            return;
        }
        let r = resident_bytes().unwrap();
        assert!(r > 1 << 20, "{r}");
        let c = default_ceiling().unwrap();
        assert!(c > 64 << 20, "{c}");
    }

    /// The README's "Limits" table says what the code enforces.
    #[test]
    fn the_readme_states_the_limits_the_code_enforces() {
        let readme = include_str!("../README.md");
        let start = readme.find("## Limits").expect("a Limits section");
        let section = &readme[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
        let row = |label: &str| -> &str {
            section
                .lines()
                .find(|l| l.starts_with(&format!("| {label}")))
                .unwrap_or_else(|| panic!("no row `{label}` in the README's Limits"))
        };
        let human = crate::input::human;
        for k in InputKind::ALL {
            let r = row(k.what());
            assert!(r.contains(&human(k.max_file_bytes())), "{k:?}: {r}");
            if let Some(d) = k.max_decompressed_bytes() {
                assert!(
                    r.contains(&format!("{} decompressed", human(d))),
                    "{k:?}: {r}"
                );
            } else {
                assert!(!r.contains("decompressed"), "{k:?}: {r}");
            }
        }
        assert!(row("a JSON string").contains(&human(MAX_JSON_STRING_BYTES)));
        let workers = crate::cli::output::thousands(MAX_WORKERS as u64);
        assert!(row("workers in a cluster").contains(&workers));
        let ops = crate::cli::output::thousands(crate::graph::job::MAX_OPS);
        assert!(row("ops in an expanded graph").contains(&ops));
        assert!(row("memory ceiling").contains(&format!("{DEFAULT_CEILING_PERCENT} % of RAM")));
        use crate::graph::bounds;
        assert_eq!(bounds::MAX_OP_NS, 1 << 50);
        assert!(row("one op's duration").contains("2^50 ns"));
        assert_eq!(bounds::MAX_TENSOR_BYTES, 16 << 40);
        assert!(row("one tensor").contains("16 TiB"));
        assert_eq!(bounds::MAX_MEMORY_BYTES, 1 << 50);
        assert!(row("one worker's memory").contains("1 PiB"));
        let min_rate = crate::cost::config::MIN_RATE;
        assert!(row("GPU rates").contains(&show(min_rate)));
        let f = crate::passes::declarative::MAX_FACTOR;
        assert!(row("pass factors").contains(&show(f)));
        let days = crate::cli::plan::MAX_BUDGET.as_secs() / 86_400;
        assert!(row("`--budget`").contains(&format!("{days} days")));
        let chars = crate::cli::output::MAX_MESSAGE;
        assert!(row("an error message").contains(&format!("{chars} characters")));
    }

    #[test]
    fn numbers_in_messages_stay_short() {
        assert_eq!(show(1e308), "1e308");
        assert_eq!(show(1e-320), "1e-320");
        assert_eq!(show(0.001), "0.001");
        assert_eq!(show(100000.0), "100000");
        assert_eq!(show(-3.0), "-3");
        assert_eq!(show(0.0), "0");
    }

    #[test]
    fn a_ceiling_error_says_what_and_how_much() {
        let e = MemoryError {
            what: "reading r0.json".into(),
            need: 9_100_000_000,
            ceiling: 8_000_000_000,
        };
        assert_eq!(
            e.to_string(),
            "reading r0.json would need 9.1 GB of memory, more than the ceiling of 8.0 GB (--max-memory; default 75 % of RAM)"
        );
    }
}
