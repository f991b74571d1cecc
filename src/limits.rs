//! Limits: how large each kind of input may be, and the memory ceiling trainplan keeps itself
//! under. These are the figures of the README's "Limits" section; a test reads the README and
//! checks that the two agree.
//!
//! * **Per-kind caps** ([`InputKind`]): the size of the file on disk and, for gzip-compressed
//!   traces, of the decompressed stream. Enforced by the `input` module, the one way to open an
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
//! * **Address space** ([`set_address_space_limit`]; `ulimit -v`, `RLIMIT_AS`): virtual memory
//!   counts what the process has *mapped* (thread stacks, the allocator's arenas, reserved but
//!   untouched pages), not what is resident. When the limit is finite, [`check`] also compares the
//!   mapped size (`VmSize`) plus the allocation plus [`ADDRESS_SPACE_HEADROOM`] with it, and the
//!   CLI caps glibc's malloc arenas ([`limit_malloc_arenas`]: each reserves 64 MiB of address
//!   space per thread that allocates), so an allocation the limit would refuse — an abort,
//!   "memory allocation of N bytes failed" — becomes the same one-line exit 3 first.
//!
//! **Invariant:** the ceiling is process-wide and set once, by the CLI, before any work; the
//! library's default is no ceiling (tests and benches run unbounded unless they set one).
//! The default ceiling is the smallest of 75 % of RAM, 75 % of the cgroup's limit and the
//! address-space limit.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Largest cluster accepted: beyond this the fine-grained graph would not fit in memory.
pub const MAX_WORKERS: u32 = 1 << 16;

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

    /// Most YAML values (scalars, lists and maps: the parser's nodes) in a YAML file of this
    /// kind. A plan names every tensor and op it groups, so it may hold many more than a config.
    pub fn max_yaml_nodes(self) -> usize {
        match self {
            InputKind::Plan => MAX_PLAN_YAML_NODES,
            _ => MAX_YAML_NODES,
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

/// Most YAML values in a config or pass file (the YAML parser's default).
pub const MAX_YAML_NODES: usize = 250_000;

/// Most YAML values in a plan (a plan that groups 100,000 tensors holds ~0.5 M).
pub const MAX_PLAN_YAML_NODES: usize = 8_000_000;

/// Most rules in one declarative pass file.
pub const MAX_PASS_RULES: usize = 1_000;

/// Most edges one application of a declarative pass may add: `add_edge` joins every op it
/// selects to every op `to` selects, n × m edges from two lines of YAML.
pub const MAX_PASS_EDGES: u64 = 100_000;

/// Longest JSON string accepted in a trace, bytes (names, kernel names, shapes as text).
pub const MAX_JSON_STRING_BYTES: u64 = 16 * MIB;

/// Default memory ceiling: this percentage of the machine's RAM (or of the cgroup's memory limit
/// when that is lower).
pub const DEFAULT_CEILING_PERCENT: u64 = 75;

/// The ceiling in bytes; `u64::MAX` = none.
static CEILING: AtomicU64 = AtomicU64::new(u64::MAX);

/// The address-space limit enforced by [`check`], bytes; `u64::MAX` = none.
static ADDRESS_SPACE: AtomicU64 = AtomicU64::new(u64::MAX);

/// Address space kept free under a finite `RLIMIT_AS` for what the process maps without asking
/// (thread stacks, the allocator's arenas, the buffers of a reader), bytes.
pub const ADDRESS_SPACE_HEADROOM: u64 = 256 * MIB;

/// Set the process's memory ceiling (bytes; None: no ceiling).
pub fn set_ceiling(bytes: Option<u64>) {
    CEILING.store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Set the address-space limit [`check`] compares the mapped size with (bytes; None: none).
/// The CLI sets it to [`address_space_limit`], and says whether the ceiling it set is that limit
/// (so that a message names `ulimit -v`, not `--max-memory`).
pub fn set_address_space_limit(bytes: Option<u64>, ceiling_is_it: bool) {
    ADDRESS_SPACE.store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    CEILING_FROM_ULIMIT.store(ceiling_is_it, Ordering::Relaxed);
}

/// Whether the ceiling is the address-space limit (for messages).
static CEILING_FROM_ULIMIT: AtomicBool = AtomicBool::new(false);

/// The address-space limit [`check`] enforces, when one is set.
pub fn enforced_address_space() -> Option<u64> {
    let a = ADDRESS_SPACE.load(Ordering::Relaxed);
    (a != u64::MAX).then_some(a)
}

/// The process's soft `RLIMIT_AS` (`ulimit -v`), bytes; None when unlimited or unreadable.
pub fn address_space_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Cap glibc's malloc arenas at `n`: each thread that allocates may otherwise get its own arena,
/// and each arena reserves 64 MiB of address space — 16 on two cores, 1 GiB of `VmSize` that a
/// `ulimit -v` counts. No-op on other C libraries.
pub fn limit_malloc_arenas(n: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    set_malloc_tunable(libc::M_ARENA_MAX, n);
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = n;
}

/// glibc's `mallopt(param, value)`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_malloc_tunable(param: libc::c_int, value: i32) {
    // SAFETY: mallopt only changes a tunable of the allocator.
    unsafe {
        libc::mallopt(param, value);
    }
}

/// Fix glibc's mmap threshold at `bytes`: allocations at least that large are mapped on their
/// own and unmapped when freed. Setting it turns off glibc's dynamic threshold, which otherwise
/// rises to the size of the largest block freed (up to 32 MiB on 64-bit) and then keeps such
/// blocks in the heap after they are freed. No-op on other C libraries.
pub fn fix_mmap_threshold(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    set_malloc_tunable(libc::M_MMAP_THRESHOLD, bytes);
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// Mapped size of this process (`VmSize`: the first field of `/proc/self/statm`), bytes.
pub fn mapped_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    Some(pages.saturating_mul(page_size()))
}

/// The memory ceiling in bytes, when one is set.
pub fn ceiling() -> Option<u64> {
    let c = CEILING.load(Ordering::Relaxed);
    (c != u64::MAX).then_some(c)
}

/// [`DEFAULT_CEILING_PERCENT`] of the RAM this process may use (the smaller of `MemTotal` and the
/// cgroup (v2 or v1) memory limit), or the address-space limit (`ulimit -v`) when that is lower.
/// None where none can be read.
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
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    };
    let of_ram = ram.map(|r| r / 100 * DEFAULT_CEILING_PERCENT);
    match (of_ram, address_space_limit()) {
        (Some(r), Some(a)) => Some(r.min(a)),
        (r, a) => r.or(a),
    }
}

/// Memory one evaluation (expanded graph, replay, critical path, memory report) needs per op
/// of the graph, bytes: `replay --symmetric` of BERT-base on 8,192 GPUs (6.75 M ops) peaks at
/// 680 MB, ~100 bytes an op with the process; 120 leaves room.
pub const EVAL_BYTES_PER_OP: u64 = 120;

/// Whether `bytes` more fit under the ceiling (and the address-space limit) now.
pub fn fits(bytes: u64) -> bool {
    bytes <= available()
}

/// Bytes the ceiling and the address-space limit leave now (`u64::MAX` without either).
pub fn available() -> u64 {
    let rss = match ceiling() {
        None => u64::MAX,
        Some(c) => c.saturating_sub(resident_bytes().unwrap_or(0)),
    };
    let mapped = match enforced_address_space() {
        None => u64::MAX,
        Some(a) => a.saturating_sub(
            mapped_bytes()
                .unwrap_or(0)
                .saturating_add(ADDRESS_SPACE_HEADROOM),
        ),
    };
    rss.min(mapped)
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

/// Which limit a [`MemoryError`] hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Limit {
    /// Resident memory against the ceiling (`--max-memory`).
    #[default]
    Ceiling,
    /// Mapped memory against the address-space limit (`ulimit -v`).
    AddressSpace,
}

/// More memory than the ceiling allows.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryError {
    /// What was being done (`reading r0.json`, `building the 65,536-worker graph`).
    pub what: String,
    /// Bytes it would have needed in all (resident + about to allocate; or mapped + about to
    /// allocate + [`ADDRESS_SPACE_HEADROOM`]).
    pub need: u64,
    pub ceiling: u64,
    pub limit: Limit,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, need, ceiling) = (&self.what, gb(self.need), gb(self.ceiling));
        match self.limit {
            Limit::Ceiling if CEILING_FROM_ULIMIT.load(Ordering::Relaxed) => write!(
                f,
                "{what} would need {need} of memory, more than the ceiling of {ceiling} \
                 (ulimit -v, lower than {DEFAULT_CEILING_PERCENT} % of RAM; --max-memory)"
            ),
            Limit::Ceiling => write!(
                f,
                "{what} would need {need} of memory, more than the ceiling of {ceiling} \
                 (--max-memory; default {DEFAULT_CEILING_PERCENT} % of RAM)"
            ),
            Limit::AddressSpace => write!(
                f,
                "{what} would need {need} of address space, more than the limit of {ceiling} \
                 (ulimit -v; {} of it kept for threads and the allocator)",
                gb(ADDRESS_SPACE_HEADROOM)
            ),
        }
    }
}

impl std::error::Error for MemoryError {}

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
/// under the ceiling, and its mapped size plus `extra` under the address-space limit. Cheap (one read of `/proc/self/statm`); call it every few MB of input or
/// before a bulk allocation, not per item.
pub fn check(what: impl FnOnce() -> String, extra: u64) -> Result<(), MemoryError> {
    if let Some(ceiling) = ceiling() {
        let need = resident_bytes().unwrap_or(0).saturating_add(extra);
        if need > ceiling {
            return Err(MemoryError {
                what: what(),
                need,
                ceiling,
                limit: Limit::Ceiling,
            });
        }
    }
    if let Some(limit) = enforced_address_space() {
        let need = mapped_bytes()
            .unwrap_or(0)
            .saturating_add(extra)
            .saturating_add(ADDRESS_SPACE_HEADROOM);
        if need > limit {
            return Err(MemoryError {
                what: what(),
                need,
                ceiling: limit,
                limit: Limit::AddressSpace,
            });
        }
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
        assert!(row("memory ceiling").contains("ulimit -v"));
        assert!(row("address space").contains(&human(ADDRESS_SPACE_HEADROOM)));
        let t = |n: u64| crate::cli::output::thousands(n);
        assert!(row("YAML values in a config or pass file").contains(&t(MAX_YAML_NODES as u64)));
        for k in [InputKind::Config, InputKind::PassFile] {
            assert_eq!(k.max_yaml_nodes(), MAX_YAML_NODES);
        }
        assert_eq!(InputKind::Plan.max_yaml_nodes(), MAX_PLAN_YAML_NODES);
        assert!(row("YAML values in a plan").contains(&t(MAX_PLAN_YAML_NODES as u64)));
        assert!(row("rules in a pass file").contains(&t(MAX_PASS_RULES as u64)));
        assert!(row("edges a pass may add").contains(&t(MAX_PASS_EDGES)));
        use crate::graph::bounds;
        assert_eq!(bounds::MAX_OP_NS, 1 << 50);
        assert!(row("one op's duration").contains("2^50 ns"));
        assert_eq!(bounds::MAX_TENSOR_BYTES, 16 << 40);
        assert!(row("one tensor").contains("16 TiB"));
        assert_eq!(bounds::MAX_MEMORY_BYTES, 1 << 56);
        assert!(row("one worker's memory").contains("64 PiB"));
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
            limit: Limit::Ceiling,
        };
        assert_eq!(
            e.to_string(),
            "reading r0.json would need 9.1 GB of memory, more than the ceiling of 8.0 GB (--max-memory; default 75 % of RAM)"
        );
    }
}
