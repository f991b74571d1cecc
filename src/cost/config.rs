//! Hardware descriptions: GPUs, networks and clusters, read from the YAML files in `configs/`.
//!
//! The files in `configs/` are compiled into the binary (so `--cluster dpro-16xv100-rdma` works
//! from any directory); a user's own file is given by path (`--cluster my.yaml`). A cluster names
//! its GPU and networks by built-in name or by a path relative to the cluster file.
//!
//! Every error names the file, the line and the field: `configs/gpus/x.yaml:7:3: field
//! memory_gbps: must be > 0, got -1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A number format a GPU computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    Fp64,
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    Fp8,
}

impl Dtype {
    /// Bytes per element in memory (TF32 is stored as FP32).
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp64 => 8,
            Dtype::Fp32 | Dtype::Tf32 => 4,
            Dtype::Fp16 | Dtype::Bf16 => 2,
            Dtype::Fp8 => 1,
        }
    }
}

/// A GPU's datasheet (or measured) peaks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    /// Marketing name, for reports.
    pub model: String,
    pub vendor: String,
    /// Dense matrix-unit (tensor core / matrix core) peak per dtype, TFLOP/s. A dtype missing
    /// here runs its matrix math on the vector units.
    pub matrix_tflops: BTreeMap<Dtype, f64>,
    /// Vector (CUDA core / SIMD) peak per dtype, TFLOP/s.
    pub vector_tflops: BTreeMap<Dtype, f64>,
    /// Peak DRAM bandwidth, GB/s (10⁹ bytes/s).
    pub memory_gbps: f64,
    /// DRAM capacity, GiB.
    pub memory_gib: f64,
    /// GPU-side cost of one kernel launch (launch latency plus tail), µs.
    pub launch_overhead_us: f64,
    /// Architecture whose kernel-efficiency constants apply (`configs/arch/<arch>.yaml`).
    pub arch: String,
    /// Streaming multiprocessors (compute units on AMD): the wave size of a GEMM.
    pub sms: u32,
    /// Boost clock, MHz (the clock the datasheet peaks are quoted at).
    pub boost_clock_mhz: f64,
    /// Host↔device copy bandwidth over the GPU's host link (PCIe), GB/s, measured with pinned
    /// memory: what an optimizer offloaded to the CPU moves gradients and parameters at.
    /// Absent: offloading is refused, naming this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_link_gbps: Option<f64>,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
    /// The architecture's constants, resolved from `arch` when the file is loaded.
    #[serde(skip)]
    pub kernels: ArchSpec,
}

/// Fractions of a peak per math unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerUnit {
    /// Plain FP32 (or FP64) math on the CUDA cores / SIMD units.
    pub cuda_core: f64,
    /// Tensor-core (matrix-core) math: TF32, fp16, bf16, fp8.
    pub tensor_core: f64,
}

/// The kernel-efficiency constants of one GPU architecture (`configs/arch/*.yaml`): how real
/// GEMM, convolution, attention and streaming kernels reach the datasheet peaks. Each file
/// cites where every value comes from; see `cost::kernel` for the model that reads them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchSpec {
    pub name: String,
    /// CTA tiles `[rows, cols]` the GEMM libraries choose from on the CUDA cores.
    pub cuda_core_tiles: Vec<[u32; 2]>,
    /// CTA tiles on the tensor cores.
    pub tensor_core_tiles: Vec<[u32; 2]>,
    /// Fraction of the datasheet peak a large, well-shaped GEMM reaches.
    pub gemm_efficiency: PerUnit,
    /// A convolution's rate relative to a GEMM of its implicit-GEMM shape.
    pub conv_efficiency: PerUnit,
    /// A fused attention kernel's rate relative to a GEMM of the same shapes.
    pub attention_efficiency: f64,
    /// Reduction length (K per CTA) at which a tile's main loop runs at half its steady rate.
    pub reduction_half: f64,
    /// Tile intensity `rows·cols/(rows+cols)` at which a tile runs at half the rate of an
    /// unboundedly large one (smaller tiles re-read more operands per FLOP).
    pub tile_half_intensity: f64,
    /// Fraction of the DRAM bandwidth streaming (memory-bound) kernels reach.
    pub memory_efficiency: f64,
    /// Fraction of the vector peak compute-bound element-wise kernels reach.
    pub vector_efficiency: f64,
    /// Slowdown of a compute kernel that runs beside a collective on the same GPU (SMs and
    /// memory bandwidth shared with NCCL): 0.1 = 10 % longer.
    pub overlap_slowdown: f64,
    /// Fraction of the datasheet peak a tensor-core GEMM reaches when one of its dimensions is
    /// not a whole number of 16-byte vectors (an odd vocabulary): cuBLAS falls back to
    /// `align1` kernels. Absent where it was not measured: such products are priced as aligned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misaligned_gemm_efficiency: Option<f64>,
    /// Fraction of the streaming rate (`memory_efficiency`) depthwise convolutions reach,
    /// forward and backward (cuDNN's depthwise kernels, their weight gradient a reduction over
    /// the batch and pixels per channel). Absent where no row measures them: priced as
    /// streaming kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depthwise_efficiency: Option<f64>,
    /// Fraction of the streaming rate batch normalisation reaches at the model's minimum
    /// traffic (forward: read x, write y; backward: read x and dy, write dx), read off a
    /// trace's BN kernels (`experiments/gpu_truth/norm_rate.py`): their statistics pass and
    /// per-channel reductions keep them far from the bandwidth on some architectures. Absent
    /// where no trace with shapes measured it: priced as streaming kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_efficiency: Option<f64>,
    #[serde(default)]
    pub source: String,
}

impl GpuSpec {
    /// Matrix-math peak for `dtype` in FLOP/ns (falls back to the vector peak).
    pub fn matrix_flops_per_ns(&self, dtype: Dtype) -> f64 {
        self.matrix_tflops
            .get(&dtype)
            .or_else(|| self.vector_tflops.get(&dtype))
            .or_else(|| self.vector_tflops.get(&Dtype::Fp32))
            .copied()
            .unwrap_or(1.0)
            * 1e3
    }
    /// Vector peak for `dtype` in FLOP/ns (falls back to FP32's).
    pub fn vector_flops_per_ns(&self, dtype: Dtype) -> f64 {
        self.vector_tflops
            .get(&dtype)
            .or_else(|| self.vector_tflops.get(&Dtype::Fp32))
            .copied()
            .unwrap_or(1.0)
            * 1e3
    }
    /// DRAM bandwidth in bytes/ns.
    pub fn memory_bytes_per_ns(&self) -> f64 {
        self.memory_gbps
    }
    pub fn memory_bytes(&self) -> u64 {
        (self.memory_gib * (1u64 << 30) as f64) as u64
    }
}

/// Which side of a server a network sits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkScope {
    /// Between GPUs of one server.
    Intra,
    /// Between servers.
    Inter,
}

/// One network: a per-hop α–β model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub name: String,
    pub scope: NetworkScope,
    /// Line rate of one port/link bundle, Gb/s (10⁹ bits/s), as marketed.
    pub line_rate_gbit_s: f64,
    /// Fraction of the line rate a collective's hop achieves (protocol and NCCL overheads).
    pub efficiency: f64,
    /// Per-message latency of one hop, µs.
    pub alpha_us: f64,
    #[serde(default)]
    pub source: String,
}

impl NetworkSpec {
    /// Achieved bandwidth of one hop, bytes/ns.
    pub fn bytes_per_ns(&self) -> f64 {
        self.line_rate_gbit_s / 8.0 * self.efficiency
    }
}

/// How gradients are synchronised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncScheme {
    /// Ring all-reduce (NCCL, Horovod): 2(n−1) chunk steps per tensor.
    #[default]
    Ring,
    /// Binary-tree all-reduce: reduce up, broadcast down.
    Tree,
    /// Parameter servers (BytePS, PS-lite): push to and pull from `ps_servers` servers.
    Ps,
}

/// A cluster as written in its file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Built-in GPU name or a path relative to this file.
    pub gpu: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Network between GPUs of one node (built-in name or path).
    pub intra: String,
    /// Network between nodes (built-in name or path); may be omitted for one node.
    #[serde(default)]
    pub inter: Option<String>,
    /// NICs per node; the inter-node hop of a ring gets their aggregate bandwidth.
    #[serde(default = "one")]
    pub nics_per_node: u32,
    #[serde(default)]
    pub sync: SyncScheme,
    /// Parameter servers (only with `sync: ps`); 0 means one per node.
    #[serde(default)]
    pub ps_servers: u32,
    /// The hosts' factor on the per-operator CPU times of `configs/hosts/*.yaml` (their
    /// `speed`), where it was measured on this cluster's machines; absent: the built-in value,
    /// fitted on the published rows' hosts.
    #[serde(default)]
    pub host_speed: Option<f64>,
}

fn one() -> u32 {
    1
}

/// A cluster with its GPU and networks resolved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cluster {
    pub name: String,
    pub description: String,
    pub gpu: GpuSpec,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub intra: NetworkSpec,
    pub inter: Option<NetworkSpec>,
    pub nics_per_node: u32,
    pub sync: SyncScheme,
    pub ps_servers: u32,
    /// See [`ClusterFile::host_speed`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_speed: Option<f64>,
}

impl Cluster {
    /// Total workers (one per GPU).
    pub fn workers(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
    /// The node a worker sits on (workers are numbered node-major).
    pub fn node_of(&self, worker: u32) -> u32 {
        worker / self.gpus_per_node.max(1)
    }
    /// The same cluster with `nodes` nodes (for scaling studies).
    pub fn with_nodes(&self, nodes: u32) -> Cluster {
        Cluster {
            nodes,
            name: format!("{}@{}nodes", self.name, nodes),
            ..self.clone()
        }
    }
}

/// Errors from reading configuration files.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}:{column}: {message}")]
    At {
        file: String,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("unknown {what} `{name}`; built-in ones: {known}")]
    Unknown {
        what: &'static str,
        name: String,
        known: String,
    },
}

/// The configuration files compiled into the binary: (path under `configs/`, text).
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "arch/volta.yaml",
        include_str!("../../configs/arch/volta.yaml"),
    ),
    (
        "arch/ampere.yaml",
        include_str!("../../configs/arch/ampere.yaml"),
    ),
    (
        "arch/hopper.yaml",
        include_str!("../../configs/arch/hopper.yaml"),
    ),
    (
        "arch/cdna3.yaml",
        include_str!("../../configs/arch/cdna3.yaml"),
    ),
    (
        "gpus/v100-32gb.yaml",
        include_str!("../../configs/gpus/v100-32gb.yaml"),
    ),
    (
        "gpus/v100-16gb.yaml",
        include_str!("../../configs/gpus/v100-16gb.yaml"),
    ),
    (
        "gpus/a100-40gb.yaml",
        include_str!("../../configs/gpus/a100-40gb.yaml"),
    ),
    (
        "gpus/a100-80gb.yaml",
        include_str!("../../configs/gpus/a100-80gb.yaml"),
    ),
    (
        "gpus/h100-sxm.yaml",
        include_str!("../../configs/gpus/h100-sxm.yaml"),
    ),
    (
        "gpus/h200.yaml",
        include_str!("../../configs/gpus/h200.yaml"),
    ),
    (
        "gpus/mi300x.yaml",
        include_str!("../../configs/gpus/mi300x.yaml"),
    ),
    (
        "networks/nvlink-v100.yaml",
        include_str!("../../configs/networks/nvlink-v100.yaml"),
    ),
    (
        "networks/nvlink-a100.yaml",
        include_str!("../../configs/networks/nvlink-a100.yaml"),
    ),
    (
        "networks/nvlink-h100.yaml",
        include_str!("../../configs/networks/nvlink-h100.yaml"),
    ),
    (
        "networks/xgmi-mi300x.yaml",
        include_str!("../../configs/networks/xgmi-mi300x.yaml"),
    ),
    (
        "networks/rdma-100g.yaml",
        include_str!("../../configs/networks/rdma-100g.yaml"),
    ),
    (
        "networks/opa-100g.yaml",
        include_str!("../../configs/networks/opa-100g.yaml"),
    ),
    (
        "networks/tcp-25g.yaml",
        include_str!("../../configs/networks/tcp-25g.yaml"),
    ),
    (
        "networks/ib-400g.yaml",
        include_str!("../../configs/networks/ib-400g.yaml"),
    ),
    (
        "networks/shm-host.yaml",
        include_str!("../../configs/networks/shm-host.yaml"),
    ),
    (
        "clusters/dpro-16xv100-rdma.yaml",
        include_str!("../../configs/clusters/dpro-16xv100-rdma.yaml"),
    ),
    (
        "clusters/dpro-16xv100-tcp.yaml",
        include_str!("../../configs/clusters/dpro-16xv100-tcp.yaml"),
    ),
    (
        "clusters/128xv100-rdma.yaml",
        include_str!("../../configs/clusters/128xv100-rdma.yaml"),
    ),
    (
        "clusters/8xh200.yaml",
        include_str!("../../configs/clusters/8xh200.yaml"),
    ),
    (
        "clusters/8xv100.yaml",
        include_str!("../../configs/clusters/8xv100.yaml"),
    ),
    (
        "clusters/2xa100.yaml",
        include_str!("../../configs/clusters/2xa100.yaml"),
    ),
    (
        "clusters/64xh100-ib.yaml",
        include_str!("../../configs/clusters/64xh100-ib.yaml"),
    ),
    (
        "clusters/512xh100-ib.yaml",
        include_str!("../../configs/clusters/512xh100-ib.yaml"),
    ),
    (
        "clusters/16384xh100-ib.yaml",
        include_str!("../../configs/clusters/16384xh100-ib.yaml"),
    ),
];

fn builtin_names(dir: &str) -> Vec<&'static str> {
    BUILTIN
        .iter()
        .filter_map(|(p, _)| {
            p.strip_prefix(dir)?
                .strip_prefix('/')?
                .strip_suffix(".yaml")
        })
        .collect()
}

/// Names of the built-in GPUs, networks or clusters (`dir` = `gpus`, `networks`, `clusters`).
pub fn builtins(dir: &str) -> Vec<&'static str> {
    builtin_names(dir)
}

/// Parse YAML text of a config file into `T`, turning errors into one line naming file, line,
/// column and field.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<T, ConfigError> {
    parse_yaml_as(text, file, crate::limits::InputKind::Config)
}

/// Parse YAML text of a file of `kind` into `T`, within the kind's YAML limits
/// ([`crate::limits::InputKind::max_yaml_nodes`]: values, and as many parser events and bytes of
/// text as such a file can hold); a file beyond them is refused naming the limit.
pub fn parse_yaml_as<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    kind: crate::limits::InputKind,
) -> Result<T, ConfigError> {
    let nodes = kind.max_yaml_nodes();
    let mut budget = serde_saphyr::budget::Budget::default();
    budget.max_nodes = nodes;
    budget.max_events = nodes.saturating_mul(2).saturating_add(64);
    budget.max_total_scalar_bytes = budget
        .max_total_scalar_bytes
        .max(kind.max_file_bytes() as usize);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    serde_saphyr::from_str_with_options::<T>(text, options).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        let message = match e.without_snippet() {
            serde_saphyr::Error::Budget { breach, .. } => budget_message(breach, kind),
            _ => one_line_message(&e.to_string()),
        };
        ConfigError::At {
            file: file.to_string(),
            line,
            column,
            message,
        }
    })
}

/// A YAML limit a file broke, as a user reads it.
fn budget_message(
    breach: &serde_saphyr::budget::BudgetBreach,
    kind: crate::limits::InputKind,
) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    let what = kind.what();
    let nodes = crate::units::thousands(kind.max_yaml_nodes() as u64);
    match breach {
        B::Nodes { .. } | B::Events { .. } => format!(
            "more than {nodes} YAML values (keys, values, lists, maps), the limit for a {what} (README, Limits)"
        ),
        B::Depth { .. } => format!("YAML nested too deeply for a {what}"),
        B::ScalarBytes { .. } => {
            format!("more text in values than a {what} may hold (README, Limits)")
        }
        _ => format!("too many YAML documents, anchors, aliases or merge keys for a {what}"),
    }
}

/// serde-saphyr renders a snippet under a first line `error: line L column C: message`; keep
/// only the message.
fn one_line_message(rendered: &str) -> String {
    let first = rendered.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let message = match first.find(": ") {
        Some(i) if first.starts_with("line ") => &first[i + 2..],
        _ => first,
    };
    // The parser's advice to programmers is not for users.
    redact_quoted(
        message
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(message),
    )
}

/// The parser quotes what it found (`unknown field `x``, `invalid type: string "x"`). When the file
/// is not the expected format at all (`gpu: /etc/shadow`), that is the file's content: a quoted
/// piece is kept only when it looks like a field name or a value of a config (≤ 40 characters of
/// `[A-Za-z0-9_.+-]`), else it becomes `…`. So a typo in a real config is still named
/// (`unknown field `memory_gbs``) and a secret never is.
pub fn redact_quoted(message: &str) -> String {
    let plain = |t: &str| {
        t.chars().count() <= 40
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
    };
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(['`', '"']) {
        let open = rest.as_bytes()[i] as char;
        out.push_str(&rest[..=i]);
        let after = &rest[i + 1..];
        // A backquote is closed by a backquote or a straight quote (`x'), a double quote by one.
        let close = if open == '`' {
            &['`', '\''][..]
        } else {
            &['"'][..]
        };
        match after.find(close) {
            Some(j) => {
                let inner = &after[..j];
                out.push_str(if plain(inner) { inner } else { "…" });
                out.push(after[j..].chars().next().unwrap_or(open));
                rest = &after[j + 1..];
            }
            None => {
                out.push('…');
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// 1-based line and column of the first `key:` in `text`, for validation errors.
fn locate_key(text: &str, key: &str) -> (u64, u64) {
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with(key) && t[key.len()..].trim_start().starts_with(':') {
            return ((i + 1) as u64, (line.len() - t.len() + 1) as u64);
        }
    }
    (0, 0)
}

fn invalid(text: &str, file: &str, field: &str, message: String) -> ConfigError {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    let (line, column) = locate_key(text, leaf);
    ConfigError::At {
        file: file.to_string(),
        line,
        column,
        message: format!("field {field}: {message}"),
    }
}

/// `value` of `field` must be a finite number in `[min, max]`: the one range check of config
/// fields (file, line and field named on error). Ranges are physical: a rate of 1e-320 or a
/// line rate of 1e-20 Gb/s would make every modelled time infinite, which the integer clock
/// cannot hold.
pub fn check_range(
    text: &str,
    file: &str,
    field: &str,
    value: f64,
    min: f64,
    max: f64,
) -> Result<(), ConfigError> {
    if !(value.is_finite() && value >= min && value <= max) {
        return Err(invalid(
            text,
            file,
            field,
            format!(
                "must be between {} and {}, got {}",
                crate::limits::show(min),
                crate::limits::show(max),
                crate::limits::show(value)
            ),
        ));
    }
    Ok(())
}

/// Smallest rate a config may give (TFLOP/s, GB/s, Gb/s) and smallest memory (GiB): 10⁻³.
pub const MIN_RATE: f64 = 1e-3;

/// Parse and validate a GPU file.
pub fn parse_gpu(text: &str, file: &str) -> Result<GpuSpec, ConfigError> {
    let g: GpuSpec = parse_yaml(text, file)?;
    for (d, v) in g.matrix_tflops.iter() {
        check_range(
            text,
            file,
            &format!("matrix_tflops.{}", dtype_key(*d)),
            *v,
            MIN_RATE,
            1e5,
        )?;
    }
    for (d, v) in g.vector_tflops.iter() {
        check_range(
            text,
            file,
            &format!("vector_tflops.{}", dtype_key(*d)),
            *v,
            MIN_RATE,
            1e5,
        )?;
    }
    if !g.vector_tflops.contains_key(&Dtype::Fp32) {
        return Err(invalid(
            text,
            file,
            "vector_tflops",
            "must give an fp32 peak".into(),
        ));
    }
    check_range(text, file, "memory_gbps", g.memory_gbps, MIN_RATE, 1e6)?;
    check_range(text, file, "memory_gib", g.memory_gib, MIN_RATE, 1e5)?;
    check_range(
        text,
        file,
        "launch_overhead_us",
        g.launch_overhead_us,
        0.0,
        1e4,
    )?;
    if g.sms == 0 || g.sms > 4096 {
        return Err(invalid(
            text,
            file,
            "sms",
            format!("must be between 1 and 4096, got {}", g.sms),
        ));
    }
    check_range(text, file, "boost_clock_mhz", g.boost_clock_mhz, 1.0, 1e5)?;
    if let Some(h) = g.host_link_gbps {
        check_range(text, file, "host_link_gbps", h, MIN_RATE, 1e5)?;
    }
    let mut g = g;
    g.kernels = load_arch(&g.arch, file).map_err(|e| {
        let (line, column) = locate_key(text, "arch");
        ConfigError::At {
            file: file.to_string(),
            line,
            column,
            message: format!("field arch: {e}"),
        }
    })?;
    Ok(g)
}

/// The architecture `name` (built-in, or a `.yaml` path relative to the GPU file `gpu_file`).
fn load_arch(name: &str, gpu_file: &str) -> Result<ArchSpec, ConfigError> {
    let base = Path::new(gpu_file).parent();
    load_ref(name, "arch", "architecture", base, parse_arch)
}

/// Parse and validate an architecture file (`configs/arch/*.yaml`).
pub fn parse_arch(text: &str, file: &str) -> Result<ArchSpec, ConfigError> {
    let a: ArchSpec = parse_yaml(text, file)?;
    for (field, tiles) in [
        ("cuda_core_tiles", &a.cuda_core_tiles),
        ("tensor_core_tiles", &a.tensor_core_tiles),
    ] {
        if tiles.is_empty() {
            return Err(invalid(
                text,
                file,
                field,
                "must list at least one tile".into(),
            ));
        }
        if let Some(t) = tiles
            .iter()
            .find(|t| t.iter().any(|&d| !(8..=1024).contains(&d)))
        {
            return Err(invalid(
                text,
                file,
                field,
                format!("tile dimensions must be between 8 and 1024, got {t:?}"),
            ));
        }
    }
    for (field, v) in [
        ("gemm_efficiency.cuda_core", a.gemm_efficiency.cuda_core),
        ("gemm_efficiency.tensor_core", a.gemm_efficiency.tensor_core),
        ("conv_efficiency.cuda_core", a.conv_efficiency.cuda_core),
        ("conv_efficiency.tensor_core", a.conv_efficiency.tensor_core),
        ("attention_efficiency", a.attention_efficiency),
        ("memory_efficiency", a.memory_efficiency),
        ("vector_efficiency", a.vector_efficiency),
    ] {
        check_range(text, file, field, v, MIN_RATE, 1.0)?;
    }
    for (field, v) in [
        ("depthwise_efficiency", a.depthwise_efficiency),
        ("norm_efficiency", a.norm_efficiency),
    ] {
        if let Some(v) = v {
            check_range(text, file, field, v, MIN_RATE, 1.0)?;
        }
    }
    if let Some(v) = a.misaligned_gemm_efficiency {
        check_range(text, file, "misaligned_gemm_efficiency", v, MIN_RATE, 1.0)?;
    }
    if !(a.overlap_slowdown.is_finite() && (0.0..=4.0).contains(&a.overlap_slowdown)) {
        return Err(invalid(
            text,
            file,
            "overlap_slowdown",
            format!("must be between 0 and 4, got {}", a.overlap_slowdown),
        ));
    }
    for (field, v) in [
        ("reduction_half", a.reduction_half),
        ("tile_half_intensity", a.tile_half_intensity),
    ] {
        if !(v.is_finite() && (0.0..=1e5).contains(&v)) {
            return Err(invalid(
                text,
                file,
                field,
                format!("must be between 0 and 100000, got {v}"),
            ));
        }
    }
    Ok(a)
}

fn dtype_key(d: Dtype) -> &'static str {
    match d {
        Dtype::Fp64 => "fp64",
        Dtype::Fp32 => "fp32",
        Dtype::Tf32 => "tf32",
        Dtype::Fp16 => "fp16",
        Dtype::Bf16 => "bf16",
        Dtype::Fp8 => "fp8",
    }
}

/// Parse and validate a network file.
pub fn parse_network(text: &str, file: &str) -> Result<NetworkSpec, ConfigError> {
    let n: NetworkSpec = parse_yaml(text, file)?;
    check_range(
        text,
        file,
        "line_rate_gbit_s",
        n.line_rate_gbit_s,
        MIN_RATE,
        1e6,
    )?;
    check_range(text, file, "efficiency", n.efficiency, MIN_RATE, 1.0)?;
    check_range(text, file, "alpha_us", n.alpha_us, 0.0, 1e6)?;
    Ok(n)
}

/// Largest cluster accepted (defined with the other input limits).
pub use crate::limits::MAX_WORKERS;

/// Where a referenced file is looked up: built-ins first, then a path next to the referrer.
fn load_ref<T>(
    name: &str,
    dir: &'static str,
    what: &'static str,
    base: Option<&Path>,
    parse: fn(&str, &str) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    if let Some((path, text)) = BUILTIN.iter().find(|(p, _)| {
        p.strip_prefix(dir).and_then(|r| r.strip_prefix('/')) == Some(&format!("{name}.yaml"))
    }) {
        return parse(text, &format!("configs/{path}"));
    }
    let candidate = match base {
        Some(b) => b.join(name),
        None => PathBuf::from(name),
    };
    // A path (not a built-in name): opened through the guard, which refuses what is not a
    // regular file.
    if name.ends_with(".yaml") || name.ends_with(".yml") || name.contains('/') || candidate.exists()
    {
        let text = crate::input::read_to_string(&candidate, crate::input::InputKind::Config)
            .map_err(|e| ConfigError::File {
                file: candidate.display().to_string(),
                message: format!("failed to read: {e}"),
            })?;
        return parse(&text, &candidate.display().to_string());
    }
    Err(ConfigError::Unknown {
        what,
        name: name.to_string(),
        known: builtin_names(dir).join(", "),
    })
}

/// Parse and validate a cluster file, resolving its GPU and networks.
pub fn parse_cluster(text: &str, file: &str, base: Option<&Path>) -> Result<Cluster, ConfigError> {
    let c: ClusterFile = parse_yaml(text, file)?;
    let count = |field: &str, v: u32, max: u32| -> Result<(), ConfigError> {
        if v == 0 || v > max {
            return Err(invalid(
                text,
                file,
                field,
                format!("must be between 1 and {max}, got {v}"),
            ));
        }
        Ok(())
    };
    count("nodes", c.nodes, MAX_WORKERS)?;
    count("gpus_per_node", c.gpus_per_node, 64)?;
    count("nics_per_node", c.nics_per_node, 64)?;
    let workers = c.nodes as u64 * c.gpus_per_node as u64;
    if workers > MAX_WORKERS as u64 {
        return Err(invalid(
            text,
            file,
            "nodes",
            format!("{workers} workers in all; at most {MAX_WORKERS} are supported"),
        ));
    }
    let at = |field: &str, e: ConfigError| -> ConfigError {
        let (line, column) = locate_key(text, field);
        ConfigError::At {
            file: file.to_string(),
            line,
            column,
            message: format!("field {field}: {e}"),
        }
    };
    let gpu = load_ref(&c.gpu, "gpus", "GPU", base, parse_gpu).map_err(|e| at("gpu", e))?;
    let intra = load_ref(&c.intra, "networks", "network", base, parse_network)
        .map_err(|e| at("intra", e))?;
    let inter = match &c.inter {
        Some(n) => Some(
            load_ref(n, "networks", "network", base, parse_network).map_err(|e| at("inter", e))?,
        ),
        None if c.nodes > 1 => {
            return Err(invalid(
                text,
                file,
                "nodes",
                format!("{} nodes need an `inter` network", c.nodes),
            ));
        }
        None => None,
    };
    if c.sync != SyncScheme::Ps && c.ps_servers != 0 {
        return Err(invalid(
            text,
            file,
            "ps_servers",
            "only meaningful with `sync: ps`".into(),
        ));
    }
    if c.ps_servers > MAX_WORKERS {
        return Err(invalid(
            text,
            file,
            "ps_servers",
            format!("at most {MAX_WORKERS}"),
        ));
    }
    if let Some(h) = c.host_speed {
        // The same bounds as a host file's `speed` (src/cost/host.rs).
        if !(h.is_finite() && h > 0.0 && h <= 100.0) {
            return Err(invalid(
                text,
                file,
                "host_speed",
                format!("must be > 0 and ≤ 100, got {h}"),
            ));
        }
    }
    let ps_servers = if c.sync == SyncScheme::Ps && c.ps_servers == 0 {
        c.nodes
    } else {
        c.ps_servers
    };
    Ok(Cluster {
        name: c.name,
        description: c.description,
        gpu,
        nodes: c.nodes,
        gpus_per_node: c.gpus_per_node,
        intra,
        inter,
        nics_per_node: c.nics_per_node,
        sync: c.sync,
        ps_servers,
        host_speed: c.host_speed,
    })
}

/// A cluster by built-in name or by file path.
pub fn load_cluster(name_or_path: &str) -> Result<Cluster, ConfigError> {
    if let Some((path, text)) = BUILTIN.iter().find(|(p, _)| {
        p.strip_prefix("clusters/")
            .and_then(|r| r.strip_suffix(".yaml"))
            == Some(name_or_path)
    }) {
        return parse_cluster(text, &format!("configs/{path}"), None);
    }
    let p = Path::new(name_or_path);
    if p.exists()
        || name_or_path.contains('/')
        || name_or_path.ends_with(".yaml")
        || name_or_path.ends_with(".yml")
    {
        let text =
            crate::input::read_to_string(p, crate::input::InputKind::Config).map_err(|e| {
                ConfigError::File {
                    file: name_or_path.to_string(),
                    message: format!("failed to read: {e}"),
                }
            })?;
        return parse_cluster(&text, name_or_path, p.parent());
    }
    Err(ConfigError::Unknown {
        what: "cluster",
        name: name_or_path.to_string(),
        known: builtin_names("clusters").join(", "),
    })
}

/// A built-in architecture's kernel constants (`volta`, `ampere`, `hopper`, `cdna3`).
pub fn load_gpu_arch(name: &str) -> Result<ArchSpec, ConfigError> {
    load_ref(name, "arch", "architecture", None, parse_arch)
}

/// A network by built-in name (`nvlink-v100`) or file path.
pub fn load_network(name_or_path: &str) -> Result<NetworkSpec, ConfigError> {
    load_ref(name_or_path, "networks", "network", None, parse_network)
}

/// The GPU-to-GPU link a server of an architecture's SXM/OAM parts carries, as a built-in
/// network: what a recorded step's collectives are priced on when no `--cluster` says
/// otherwise (V100 SXM2: NVLink 2; A100 SXM4: NVLink 3; H100/H200 SXM5: NVLink 4; MI300X:
/// Infinity Fabric). `None` for an architecture without one here.
pub fn server_link_network(arch: &str) -> Option<&'static str> {
    Some(match arch {
        "volta" => "nvlink-v100",
        "ampere" => "nvlink-a100",
        "hopper" => "nvlink-h100",
        "cdna3" => "xgmi-mi300x",
        _ => return None,
    })
}

/// A GPU by built-in name or file path.
pub fn load_gpu(name_or_path: &str) -> Result<GpuSpec, ConfigError> {
    load_ref(name_or_path, "gpus", "GPU", None, parse_gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file over its kind's YAML limit is refused naming the limit and the kind, not with the
    /// parser's "budget breached: Nodes { nodes: 250001 }"; a plan may hold far more.
    #[test]
    fn yaml_limits_are_per_kind_and_named() {
        use crate::limits::{InputKind, MAX_YAML_NODES};
        let list = |n: usize| format!("[{}]", vec!["1"; n].join(","));
        let over = list(MAX_YAML_NODES + 10);
        let e = parse_yaml_as::<Vec<u32>>(&over, "c.yaml", InputKind::Config).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("c.yaml:1:")
                && m.contains("more than 250,000 YAML values")
                && m.contains("the limit for a config file (README, Limits)"),
            "{m}"
        );
        let v = parse_yaml_as::<Vec<u32>>(&over, "p.yaml", InputKind::Plan).unwrap();
        assert_eq!(v.len(), MAX_YAML_NODES + 10);
        let e = parse_yaml_as::<Vec<u32>>(&over, "f.yaml", InputKind::PassFile).unwrap_err();
        assert!(e.to_string().contains("the limit for a pass file"), "{e}");
    }

    #[test]
    fn parser_messages_never_echo_what_is_not_a_config_value() {
        assert_eq!(
            redact_quoted("unknown field `memory_gbs`, expected one of `memory_gbps`"),
            "unknown field `memory_gbs`, expected one of `memory_gbps`"
        );
        assert_eq!(
            redact_quoted("unknown field `root:$6$secret:19000:0:99999:7::`, expected one of name"),
            "unknown field `…`, expected one of name"
        );
        assert_eq!(
            redact_quoted("invalid type: string \"hunter2 is my password\", expected u32"),
            "invalid type: string \"…\", expected u32"
        );
        assert_eq!(
            redact_quoted("unexpected character: `\u{1b}'"),
            "unexpected character: `…'"
        );
        assert_eq!(redact_quoted("cut `open"), "cut `…");
        // `gpu: /etc/shadow`-like files: the first line is never in the message.
        let e = parse_gpu("root:$6$secret:19000:0:99999:7:::\n", "shadow").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn every_builtin_parses() {
        for (path, text) in BUILTIN {
            let file = format!("configs/{path}");
            let res: Result<(), ConfigError> = if path.starts_with("arch/") {
                parse_arch(text, &file).map(drop)
            } else if path.starts_with("gpus/") {
                parse_gpu(text, &file).map(drop)
            } else if path.starts_with("networks/") {
                parse_network(text, &file).map(drop)
            } else {
                parse_cluster(text, &file, None).map(drop)
            };
            res.unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn names_match_file_names() {
        for (path, text) in BUILTIN {
            let stem = path.rsplit('/').next().unwrap().trim_end_matches(".yaml");
            assert!(
                text.contains(&format!("name: {stem}\n")),
                "{path}: name must be {stem}"
            );
        }
    }

    #[test]
    fn every_file_in_configs_is_builtin() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        for dir in ["arch", "gpus", "networks", "clusters"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                let key = format!("{dir}/{name}");
                assert!(
                    BUILTIN.iter().any(|(p, _)| *p == key),
                    "{key} is not in BUILTIN"
                );
            }
        }
    }

    #[test]
    fn dpro_testbed_is_two_by_eight_v100() {
        let c = load_cluster("dpro-16xv100-rdma").unwrap();
        assert_eq!((c.nodes, c.gpus_per_node, c.workers()), (2, 8, 16));
        assert_eq!(c.gpu.name, "v100-32gb");
        assert_eq!(c.inter.as_ref().unwrap().line_rate_gbit_s, 100.0);
        assert_eq!(c.node_of(7), 0);
        assert_eq!(c.node_of(8), 1);
    }

    fn err(text: &str) -> String {
        parse_cluster(text, "my.yaml", None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let base = "name: x\ngpu: v100-32gb\nnodes: 2\ngpus_per_node: 8\nintra: nvlink-v100\ninter: rdma-100g\n";
        assert_eq!(
            err(&base.replace("nodes: 2", "nodes: 0")),
            "my.yaml:3:1: field nodes: must be between 1 and 65536, got 0"
        );
        let e = err(&base.replace("gpu: v100-32gb", "gpu: v200"));
        assert!(
            e.starts_with("my.yaml:2:1: field gpu: unknown GPU `v200`; built-in ones: v100-32gb,"),
            "{e}"
        );
        let e = err(&format!("{base}colour: red\n"));
        assert!(e.starts_with("my.yaml:7:1: unknown field `colour`"), "{e}");
        let e = err(&format!("{base}name: y\n"));
        assert_eq!(e, "my.yaml:7:1: duplicate mapping key: name");
        let e = err("name: [x\n");
        assert!(e.starts_with("my.yaml:1:"), "{e}");
        let e = err(&base.replace("inter: rdma-100g\n", ""));
        assert!(
            e.contains("field nodes: 2 nodes need an `inter` network"),
            "{e}"
        );
        let e = err(&base.replace("nodes: 2", "nodes: 65536"));
        assert!(e.contains("524288 workers in all"), "{e}");
    }

    #[test]
    fn gpu_validation_names_the_dtype() {
        let t = "name: g\nmodel: G\nvendor: x\nmatrix_tflops: {fp16: -3}\nvector_tflops: {fp32: 1}\nmemory_gbps: 1\nmemory_gib: 1\nlaunch_overhead_us: 1\narch: volta\nsms: 80\nboost_clock_mhz: 1530\n";
        let e = parse_gpu(t, "g.yaml").unwrap_err().to_string();
        assert!(
            e.contains("field matrix_tflops.fp16: must be between 0.001 and 100000, got -3"),
            "{e}"
        );
    }

    /// Issue 14: rates so small that every modelled time is infinite passed `> 0`.
    #[test]
    fn rates_outside_physical_ranges_are_refused() {
        let gpu = "name: g\nmodel: G\nvendor: x\nmatrix_tflops: {fp16: 100}\nvector_tflops: {fp32: 10}\nmemory_gbps: 1000\nmemory_gib: 16\nlaunch_overhead_us: 4\narch: hopper\nsms: 132\nboost_clock_mhz: 1980\n";
        parse_gpu(gpu, "g.yaml").unwrap();
        for (from, to, field) in [
            ("fp16: 100", "fp16: 1e-320", "matrix_tflops.fp16"),
            ("fp32: 10", "fp32: 1e-320", "vector_tflops.fp32"),
            ("memory_gbps: 1000", "memory_gbps: 1e-320", "memory_gbps"),
            ("memory_gib: 16", "memory_gib: 1e-30", "memory_gib"),
            ("memory_gbps: 1000", "memory_gbps: .inf", "memory_gbps"),
            (
                "boost_clock_mhz: 1980",
                "boost_clock_mhz: 1e-320",
                "boost_clock_mhz",
            ),
        ] {
            let e = parse_gpu(&gpu.replace(from, to), "g.yaml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("field {field}: must be between")),
                "{e}"
            );
        }
        let net = "name: n\nscope: inter\nline_rate_gbit_s: 100\nefficiency: 0.9\nalpha_us: 5\n";
        parse_network(net, "n.yaml").unwrap();
        for (from, to, field) in [
            (
                "line_rate_gbit_s: 100",
                "line_rate_gbit_s: 1e-20",
                "line_rate_gbit_s",
            ),
            ("efficiency: 0.9", "efficiency: 1e-9", "efficiency"),
            ("alpha_us: 5", "alpha_us: -1", "alpha_us"),
        ] {
            let e = parse_network(&net.replace(from, to), "n.yaml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("field {field}: must be between")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_gpu_without_the_kernel_constants_names_the_field() {
        let t = "name: g\nmodel: G\nvendor: x\nmatrix_tflops: {}\nvector_tflops: {fp32: 1}\nmemory_gbps: 1\nmemory_gib: 1\nlaunch_overhead_us: 1\narch: volta\nsms: 80\nboost_clock_mhz: 1530\n";
        assert_eq!(parse_gpu(t, "g.yaml").unwrap().kernels.name, "volta");
        let e = parse_gpu(&t.replace("sms: 80\n", ""), "g.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("g.yaml:") && e.contains("missing field `sms`"),
            "{e}"
        );
        let e = parse_gpu(&t.replace("sms: 80", "sms: 0"), "g.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "g.yaml:10:1: field sms: must be between 1 and 4096, got 0"
        );
        let e = parse_gpu(&t.replace("arch: volta", "arch: kepler"), "g.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("g.yaml:9:1: field arch: unknown architecture `kepler`; built-in ones: ")
                && e.contains("volta"),
            "{e}"
        );
        let volta = BUILTIN
            .iter()
            .find(|(p, _)| *p == "arch/volta.yaml")
            .unwrap()
            .1;
        let out_of_range: String = volta
            .lines()
            .map(|l| {
                if l.starts_with("memory_efficiency:") {
                    "memory_efficiency: 1.5"
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let e = parse_arch(&out_of_range, "v.yaml").unwrap_err().to_string();
        assert!(
            e.contains("field memory_efficiency: must be between 0.001 and 1, got 1.5"),
            "{e}"
        );
        let e = parse_arch(
            &volta.replace("reduction_half: ", "reduction_halve: "),
            "v.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("reduction_halve"), "{e}");
    }

    #[test]
    fn a_clusters_host_speed_is_checked() {
        let text =
            "name: c\ngpu: h200\nnodes: 1\ngpus_per_node: 1\nintra: nvlink-h100\nhost_speed: 1.5\n";
        assert_eq!(
            parse_cluster(text, "c.yaml", None).unwrap().host_speed,
            Some(1.5)
        );
        let e = parse_cluster(&text.replace("1.5", "0"), "c.yaml", None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "c.yaml:6:1: field host_speed: must be > 0 and ≤ 100, got 0"
        );
        let plain = text.replace("host_speed: 1.5\n", "");
        assert_eq!(
            parse_cluster(&plain, "c.yaml", None).unwrap().host_speed,
            None
        );
    }

    #[test]
    fn unknown_cluster_lists_the_known_ones() {
        let e = load_cluster("nope").unwrap_err().to_string();
        assert!(
            e.contains("dpro-16xv100-rdma") && e.contains("8xh200"),
            "{e}"
        );
    }
}
