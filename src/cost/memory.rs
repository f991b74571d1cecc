//! Device memory of one rank: the three peaks every report carries.
//!
//! ```text
//! allocated    what the framework hands out (torch.cuda.max_memory_allocated): the replay's peak
//!              of static bytes + allocation events (src/replay/memory.rs)
//! reserved   = the allocator's segments at their highest, found by playing the rank's
//!              allocation events through a model of the allocator (rounding, segment sizes,
//!              best-fit with splitting, blocks that never move: fragmentation)
//!            + library workspaces allocated through it (cuBLAS)
//! device used= reserved + CUDA context (lazy or eager module loading)
//!            + NCCL's buffers (communicators × channels × peers × NCCL_BUFFSIZE)
//!              what nvidia-smi shows, and what must fit the GPU
//! ```
//!
//! Two allocators: PyTorch's CUDA caching allocator (small requests ≤ 1 MiB packed into 2 MiB
//! segments, 1–10 MiB requests into 20 MiB segments, larger ones in a segment of their size
//! rounded to 2 MiB; a free block is split only when the rest is large enough; with
//! `expandable_segments` one segment per pool that grows by pages), and TensorFlow's BFC
//! allocator (TensorFlow and JAX/XLA: 256-byte rounding, best fit, a chunk split only when it is at
//! least twice the request, regions that double as they are added under `allow_growth`). The
//! constants are in `configs/memory/*.yaml`, each with its source in the file's header.
//!
//! [`MemoryPeaks`] is the one place the terms meet; the sharding and 3D-parallel work adds terms
//! (sharded states, unsharded buffers in flight) to [`MemoryBreakdown`] here.
//!
//! **Invariant:** `allocated ≤ reserved ≤ device_used`; the simulation does no IO and cannot fail.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::config::ConfigError;
use super::framework::Framework;

/// Which allocator model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocatorKind {
    /// PyTorch's CUDA caching allocator.
    Caching,
    /// TensorFlow's best-fit-with-coalescing allocator (also XLA's, under JAX).
    Bfc,
}

/// How CUDA loads a program's kernels (`CUDA_MODULE_LOADING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleLoading {
    /// Every kernel of every loaded library at context creation (CUDA < 11.7, or `EAGER`).
    Eager,
    /// Kernels loaded on first use (CUDA ≥ 11.7 with PyTorch ≥ 1.13: the default).
    Lazy,
}

/// The memory constants of one framework's allocator and runtime (`configs/memory/*.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    pub name: String,
    pub allocator: AllocatorKind,
    /// Every request is rounded up to a multiple of this, bytes.
    pub round_bytes: u64,
    /// Caching: requests up to this size use the small pool, bytes.
    pub small_max_bytes: u64,
    /// Caching: segment size of the small pool, bytes.
    pub small_segment_bytes: u64,
    /// Caching: requests below this size get a `mid_segment_bytes` segment, bytes.
    pub mid_max_bytes: u64,
    pub mid_segment_bytes: u64,
    /// Caching: larger requests get a segment of their size rounded up to this, bytes.
    pub large_round_bytes: u64,
    /// Caching with `expandable_segments:True`: one segment per pool, grown by pages of this size.
    pub expandable_segments: bool,
    pub page_bytes: u64,
    /// BFC: the first region under `allow_growth`, bytes (each later region doubles).
    pub bfc_first_region_bytes: u64,
    /// Library workspaces allocated through the allocator on first use (cuBLAS), bytes.
    pub workspace_bytes: u64,
    /// The CUDA context and the framework's loaded kernels, by module loading, bytes.
    pub context_lazy_bytes: u64,
    pub context_eager_bytes: u64,
    pub module_loading: ModuleLoading,
    /// NCCL: `NCCL_BUFFSIZE` (per channel, per peer connection), channels per communicator, and
    /// peer connections per channel (a ring: the previous and the next rank).
    pub nccl_buffsize_bytes: u64,
    pub nccl_channels: u32,
    pub nccl_peers_per_channel: u32,
    /// What the framework holds per byte the liveness model counts (1 for PyTorch): applied
    /// to the static bytes and every allocation before the allocator model.
    pub allocated_scale: f64,
    /// What the framework lets its allocator hold on the GPU ([`MemorySpec::pool_bytes`]);
    /// absent: everything the context and NCCL leave (PyTorch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolLimit>,
    /// Measured values that replace the ones above on one GPU architecture (`arch` of
    /// `configs/gpus/*.yaml`), applied by [`MemorySpec::for_arch`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arch: BTreeMap<String, ArchMemory>,
    #[serde(default)]
    pub source: String,
}

/// How a framework caps its allocator's pool (`pool:` in a memory file).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "kind")]
pub enum PoolLimit {
    /// The memory free after the context, less `max(min_bytes, fraction × free)` kept for the
    /// system (TensorFlow's `MinSystemMemory` when `per_process_gpu_memory_fraction` is 0).
    /// `context_bytes`: the context as it is when the framework reads the free memory, where
    /// that is measured apart from the context the job ends with (TensorFlow sizes its pool
    /// at start-up, before cuDNN and cuBLAS load); absent, the job's context.
    FreeLessReserve {
        fraction: f64,
        min_bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_bytes: Option<u64>,
    },
    /// `fraction` of the GPU's total memory (XLA's `XLA_PYTHON_CLIENT_MEM_FRACTION`, with or
    /// without preallocation).
    FractionOfTotal { fraction: f64 },
}

/// A memory file's per-architecture values (each optional: absent keeps the file's own).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchMemory {
    #[serde(default)]
    pub workspace_bytes: Option<u64>,
    #[serde(default)]
    pub context_lazy_bytes: Option<u64>,
}

impl Default for MemorySpec {
    fn default() -> Self {
        MemorySpec::builtin(Framework::Pytorch)
    }
}

const PYTORCH: (&str, &str) = (
    "configs/memory/pytorch.yaml",
    include_str!("../../configs/memory/pytorch.yaml"),
);
const TENSORFLOW: (&str, &str) = (
    "configs/memory/tensorflow.yaml",
    include_str!("../../configs/memory/tensorflow.yaml"),
);

const JAX: (&str, &str) = (
    "configs/memory/jax.yaml",
    include_str!("../../configs/memory/jax.yaml"),
);

/// The built-in memory files: (path, text).
pub const BUILTIN: &[(&str, &str)] = &[PYTORCH, TENSORFLOW, JAX];

impl MemorySpec {
    /// The allocator a framework runs on: TensorFlow's BFC, XLA's (the same BFC) under JAX,
    /// else PyTorch's caching allocator (Horovod and BytePS here drive PyTorch models).
    pub fn builtin(fw: Framework) -> MemorySpec {
        let (file, text) = match fw {
            Framework::Tf => TENSORFLOW,
            Framework::Jax => JAX,
            _ => PYTORCH,
        };
        parse_memory(text, file).unwrap_or_else(|e| panic!("built-in memory config: {e}"))
    }

    /// This spec on GPUs of architecture `arch`: its per-architecture values in place of the
    /// defaults (the spec itself when the file has none for `arch`).
    pub fn for_arch(mut self, arch: &str) -> MemorySpec {
        if let Some(a) = self.arch.get(arch).cloned() {
            self.workspace_bytes = a.workspace_bytes.unwrap_or(self.workspace_bytes);
            self.context_lazy_bytes = a.context_lazy_bytes.unwrap_or(self.context_lazy_bytes);
        }
        self
    }

    /// The CUDA context for this spec's module loading, bytes.
    pub fn context_bytes(&self) -> u64 {
        match self.module_loading {
            ModuleLoading::Eager => self.context_eager_bytes,
            ModuleLoading::Lazy => self.context_lazy_bytes,
        }
    }

    /// `bytes` as the framework holds them ([`MemorySpec::allocated_scale`]).
    pub fn scaled(&self, bytes: u64) -> u64 {
        if self.allocated_scale == 1.0 {
            bytes
        } else {
            (bytes as f64 * self.allocated_scale).round() as u64
        }
    }

    /// The most the framework's allocator may hold on a GPU of `capacity` bytes: `None` when
    /// it is capped only by what the context and NCCL leave (PyTorch).
    pub fn pool_bytes(&self, capacity: u64) -> Option<u64> {
        match self.pool? {
            PoolLimit::FreeLessReserve {
                fraction,
                min_bytes,
                context_bytes,
            } => {
                let at_start = context_bytes.unwrap_or_else(|| self.context_bytes());
                let free = capacity.saturating_sub(at_start);
                let keep = ((free as f64 * fraction) as u64).max(min_bytes);
                Some(free.saturating_sub(keep))
            }
            PoolLimit::FractionOfTotal { fraction } => Some((capacity as f64 * fraction) as u64),
        }
    }

    /// Device memory the framework keeps out of its pool on a GPU of `capacity` bytes beyond
    /// the context and the NCCL buffers of `communicators` communicators (which device used
    /// already counts): the job runs while its reserved bytes stay within the pool, i.e. while
    /// device used plus this stays within `capacity`.
    pub fn kept_out_bytes(&self, capacity: u64, communicators: u32) -> u64 {
        self.pool_bytes(capacity).map_or(0, |pool| {
            capacity
                .saturating_sub(pool)
                .saturating_sub(self.context_bytes())
                .saturating_sub(self.nccl_bytes(communicators))
        })
    }

    /// NCCL's buffers for `communicators` communicators, bytes.
    pub fn nccl_bytes(&self, communicators: u32) -> u64 {
        u64::from(communicators)
            * u64::from(self.nccl_channels)
            * u64::from(self.nccl_peers_per_channel)
            * self.nccl_buffsize_bytes
    }
}

/// Parse and validate a memory file.
pub fn parse_memory(text: &str, file: &str) -> Result<MemorySpec, ConfigError> {
    let m: MemorySpec = super::config::parse_yaml(text, file)?;
    let bad = |field: &str, why: &str| ConfigError::File {
        file: file.to_string(),
        message: format!("field {field}: {why}"),
    };
    const TIB: u64 = 1 << 40;
    for (field, v) in [
        ("round_bytes", m.round_bytes),
        ("small_segment_bytes", m.small_segment_bytes),
        ("mid_segment_bytes", m.mid_segment_bytes),
        ("large_round_bytes", m.large_round_bytes),
        ("page_bytes", m.page_bytes),
        ("bfc_first_region_bytes", m.bfc_first_region_bytes),
    ] {
        if v == 0 || v > TIB {
            return Err(bad(field, "must be between 1 byte and 1 TiB"));
        }
    }
    for (field, v) in [
        ("small_max_bytes", m.small_max_bytes),
        ("mid_max_bytes", m.mid_max_bytes),
        ("workspace_bytes", m.workspace_bytes),
        ("context_lazy_bytes", m.context_lazy_bytes),
        ("context_eager_bytes", m.context_eager_bytes),
        ("nccl_buffsize_bytes", m.nccl_buffsize_bytes),
    ] {
        if v > TIB {
            return Err(bad(field, "must be at most 1 TiB"));
        }
    }
    for (arch, a) in &m.arch {
        for (field, v) in [
            ("workspace_bytes", a.workspace_bytes),
            ("context_lazy_bytes", a.context_lazy_bytes),
        ] {
            if v.is_some_and(|v| v > TIB) {
                return Err(bad(
                    &format!("arch.{arch}.{field}"),
                    "must be at most 1 TiB",
                ));
            }
        }
    }
    if m.small_max_bytes > m.small_segment_bytes {
        return Err(bad(
            "small_max_bytes",
            "must not exceed small_segment_bytes",
        ));
    }
    if m.mid_max_bytes > m.mid_segment_bytes {
        return Err(bad("mid_max_bytes", "must not exceed mid_segment_bytes"));
    }
    if !(m.allocated_scale.is_finite() && (1.0..=4.0).contains(&m.allocated_scale)) {
        return Err(bad("allocated_scale", "must be between 1 and 4"));
    }
    match m.pool {
        Some(PoolLimit::FreeLessReserve {
            fraction,
            min_bytes,
            context_bytes,
        }) if !(fraction.is_finite() && (0.0..0.5).contains(&fraction))
            || min_bytes > TIB
            || context_bytes.is_some_and(|c| c > TIB) =>
        {
            return Err(bad(
                "pool",
                "free_less_reserve needs a fraction in [0, 0.5), and min_bytes and context_bytes of at most 1 TiB",
            ));
        }
        Some(PoolLimit::FractionOfTotal { fraction })
            if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) =>
        {
            return Err(bad("pool", "fraction_of_total needs a fraction in (0, 1]"));
        }
        _ => {}
    }
    if m.nccl_channels > 64 || m.nccl_peers_per_channel > 64 {
        return Err(bad("nccl_channels", "at most 64 channels and 64 peers"));
    }
    Ok(m)
}

/// What makes up a rank's device memory at its peaks, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryBreakdown {
    /// Weights, gradients kept across the step, optimizer state (the replay's static bytes).
    /// `static + dynamic + workspace = allocated`; `+ allocator slack = reserved`;
    /// `+ context + nccl = device used`.
    pub static_bytes: u64,
    /// What the replay's events add at the allocated peak (activations, gradients in flight,
    /// transients, communication buffers).
    pub dynamic_bytes: u64,
    /// Reserved beyond allocated: rounding, segment sizes and fragmentation.
    pub allocator_slack_bytes: u64,
    /// Library workspaces through the allocator (cuBLAS).
    pub workspace_bytes: u64,
    /// The CUDA context and loaded kernels.
    pub context_bytes: u64,
    /// NCCL's communicator buffers.
    pub nccl_bytes: u64,
    /// Device memory the framework keeps out of its allocator's pool, beyond the context and
    /// NCCL ([`MemorySpec::kept_out_bytes`]: TensorFlow's system reserve, the quarter of the
    /// GPU XLA leaves; 0 for PyTorch). The job needs device used plus this.
    pub kept_out_bytes: u64,
}

/// The three peaks of one rank, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryPeaks {
    /// `torch.cuda.max_memory_allocated`.
    pub allocated: u64,
    /// `torch.cuda.max_memory_reserved`: the allocator's segments.
    pub reserved: u64,
    /// What `nvidia-smi` shows: reserved + context + NCCL.
    pub device_used: u64,
    pub breakdown: MemoryBreakdown,
}

impl MemoryPeaks {
    /// The device memory the job needs to run: device used plus what the framework keeps out
    /// of its allocator's pool. Compared with the GPU (and, through
    /// [`MemoryPeaks::against_budget`], with `--memory-budget`).
    pub fn needed(&self) -> u64 {
        self.device_used
            .saturating_add(self.breakdown.kept_out_bytes)
    }

    /// The peak compared with a memory budget of `budget` bytes on a GPU of `capacity`: at
    /// most `budget` of device memory used, and the whole need within the GPU (what the
    /// framework keeps out of its pool lies in the room between the budget and the GPU first).
    /// Equals [`MemoryPeaks::needed`] when the budget is the GPU.
    pub fn against_budget(&self, capacity: u64, budget: u64) -> u64 {
        self.device_used.max(
            self.needed()
                .saturating_sub(capacity.saturating_sub(budget)),
        )
    }

    /// Combine the allocated peak (with its static part), the allocator's simulated segment
    /// peak and the runtime terms.
    pub fn combine(
        spec: &MemorySpec,
        allocated: u64,
        static_bytes: u64,
        segments_peak: u64,
        communicators: u32,
    ) -> MemoryPeaks {
        let segments = segments_peak.max(allocated);
        // The workspace is allocated through the allocator: in allocated and reserved both.
        let ws = spec.workspace_bytes;
        let reserved = segments.saturating_add(ws);
        let context = spec.context_bytes();
        let nccl = spec.nccl_bytes(communicators);
        MemoryPeaks {
            allocated: allocated.saturating_add(ws),
            reserved,
            device_used: reserved.saturating_add(context).saturating_add(nccl),
            breakdown: MemoryBreakdown {
                static_bytes: static_bytes.min(allocated),
                dynamic_bytes: allocated.saturating_sub(static_bytes),
                allocator_slack_bytes: segments - allocated,
                workspace_bytes: ws,
                context_bytes: context,
                nccl_bytes: nccl,
                kept_out_bytes: 0,
            },
        }
    }
}

/// One allocation event of a rank, in time order: `Alloc(bytes)` or `Free(bytes)` (a free
/// releases the most recent live allocation of that size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Alloc(u64),
    Free(u64),
}

/// What the allocator model saw, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorPeaks {
    /// The highest total of its segments (reserved).
    pub segments: u64,
    /// The highest total of the blocks it handed out, as it counts them (rounded sizes, and a
    /// block it did not split counted whole): what `max_memory_allocated` / BFC's
    /// `peak_bytes_in_use` report.
    pub in_use: u64,
}

/// The highest total of the allocator's segments when `events` are played through it, bytes.
pub fn segments_peak(spec: &MemorySpec, events: impl IntoIterator<Item = Event>) -> u64 {
    run_allocator(spec, u64::MAX, events).segments
}

/// [`segments_peak`] on a device with `limit` bytes for the allocator: when a new segment would
/// pass the limit, the allocator first releases its cached segments that hold no live block (as
/// PyTorch's does when `cudaMalloc` fails, and TensorFlow's BFC with garbage collection), so the
/// peak passes `limit` only when the live blocks and the segments they pin do: an
/// out-of-memory.
pub fn segments_peak_within(
    spec: &MemorySpec,
    limit: u64,
    events: impl IntoIterator<Item = Event>,
) -> u64 {
    run_allocator(spec, limit, events).segments
}

/// Play `events` through the allocator model with `limit` bytes (see [`segments_peak_within`]).
pub fn run_allocator(
    spec: &MemorySpec,
    limit: u64,
    events: impl IntoIterator<Item = Event>,
) -> AllocatorPeaks {
    let mut a = Allocator::new(spec);
    a.limit = limit;
    let mut live: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Alloc(0) | Event::Free(0) => {}
            Event::Alloc(b) => {
                let addr = a.alloc(b);
                live.entry(b).or_default().push(addr);
            }
            Event::Free(b) => {
                if let Some(addr) = live.get_mut(&b).and_then(Vec::pop) {
                    a.free(addr);
                }
            }
        }
    }
    AllocatorPeaks {
        segments: a.peak,
        in_use: a.in_use_peak,
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to).saturating_mul(to)
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    free: bool,
    segment: u32,
    pool: u8,
}

/// The allocator model: blocks in one address space (segments never touch), free blocks by
/// (pool, size, address) for best fit.
struct Allocator<'a> {
    spec: &'a MemorySpec,
    blocks: BTreeMap<u64, Block>,
    free: BTreeSet<(u8, u64, u64)>,
    /// Segment sizes (index = segment id), and the pool's growing segment when expandable.
    segments: Vec<(u64, u64)>,
    growing: [Option<u32>; 2],
    /// Segments (not growing) whose whole range is one free block: what a release under
    /// pressure frees, kept as blocks change so a release costs the idle segments, not every
    /// segment ever made (a job far over its GPU released on every new segment).
    idle: BTreeSet<u32>,
    next_addr: u64,
    total: u64,
    peak: u64,
    /// BFC: the next region's size.
    region: u64,
    /// Bytes the allocator may hold before it releases cached segments.
    limit: u64,
    /// Bytes of the blocks handed out, now and at most.
    in_use: u64,
    in_use_peak: u64,
}

impl<'a> Allocator<'a> {
    fn new(spec: &'a MemorySpec) -> Self {
        Allocator {
            spec,
            blocks: BTreeMap::new(),
            free: BTreeSet::new(),
            segments: Vec::new(),
            growing: [None, None],
            idle: BTreeSet::new(),
            // Above the expandable segments' ranges (pool + 1) << 52.
            next_addr: 3 << 52,
            total: 0,
            peak: 0,
            region: spec.bfc_first_region_bytes,
            limit: u64::MAX,
            in_use: 0,
            in_use_peak: 0,
        }
    }

    /// Under pressure: release every segment whose one block is free (expandable segments are
    /// kept).
    fn release_cached(&mut self) {
        debug_assert_eq!(self.idle, self.idle_by_scan(), "the idle set drifted");
        for id in std::mem::take(&mut self.idle) {
            let id = id as usize;
            if self.growing.contains(&Some(id as u32)) {
                continue;
            }
            let (base, len) = self.segments[id];
            if len == 0 {
                continue;
            }
            if let Some(b) = self.blocks.get(&base).copied()
                && b.free
                && b.size == len
            {
                self.blocks.remove(&base);
                self.free.remove(&(b.pool, b.size, base));
                self.segments[id].1 = 0;
                self.total -= len;
            }
        }
    }

    /// The idle segments found the slow way, by looking at every segment (what `idle` keeps
    /// up to date; checked against it in debug builds).
    fn idle_by_scan(&self) -> BTreeSet<u32> {
        (0..self.segments.len() as u32)
            .filter(|id| !self.growing.contains(&Some(*id)))
            .filter(|&id| {
                let (base, len) = self.segments[id as usize];
                len > 0
                    && self
                        .blocks
                        .get(&base)
                        .is_some_and(|b| b.free && b.size == len)
            })
            .collect()
    }

    fn bfc(&self) -> bool {
        self.spec.allocator == AllocatorKind::Bfc
    }

    fn pool_of(&self, size: u64) -> u8 {
        u8::from(!self.bfc() && size <= self.spec.small_max_bytes)
    }

    /// Whether a free block of `block` bytes is split for a request of `size`.
    fn splits(&self, pool: u8, block: u64, size: u64) -> bool {
        let rest = block - size;
        if self.bfc() {
            // BFC: split when the chunk is at least twice the request, or the waste is large.
            block >= 2 * size || rest >= 128 << 20
        } else if pool == 1 {
            rest >= self.spec.round_bytes
        } else {
            rest > self.spec.small_max_bytes
        }
    }

    fn new_segment(&mut self, pool: u8, size: u64) -> u64 {
        if self.total.saturating_add(size) > self.limit {
            self.release_cached();
        }
        let addr = self.next_addr;
        // A gap after every segment: blocks of different segments never merge.
        self.next_addr = addr + size + 1;
        let id = self.segments.len() as u32;
        self.segments.push((addr, size));
        self.blocks.insert(
            addr,
            Block {
                size,
                free: true,
                segment: id,
                pool,
            },
        );
        self.free.insert((pool, size, addr));
        self.idle.insert(id);
        self.total += size;
        self.peak = self.peak.max(self.total);
        addr
    }

    /// Room for `size` more bytes when nothing cached fits: a new segment or region, or the
    /// pool's expandable segment grown by pages.
    fn grow(&mut self, pool: u8, size: u64) {
        let s = self.spec;
        if self.bfc() {
            while self.region < size {
                self.region = self.region.saturating_mul(2);
            }
            // Near the limit the region backs off to what is left (BFCAllocator::Extend's
            // backpedal), never below the request.
            let left = self.limit.saturating_sub(self.total);
            let r = if self.region <= left {
                self.region
            } else {
                left.max(size)
            };
            self.region = self.region.saturating_mul(2);
            self.new_segment(pool, r);
            return;
        }
        if s.expandable_segments {
            // One segment per pool in its own virtual range, grown in place by pages.
            let id = match self.growing[pool as usize] {
                Some(id) => id,
                None => {
                    let id = self.segments.len() as u32;
                    self.segments.push(((u64::from(pool) + 1) << 52, 0));
                    self.growing[pool as usize] = Some(id);
                    id
                }
            };
            let (base, len) = self.segments[id as usize];
            let end = base + len;
            // The free block at the end of the segment, if any, is extended.
            let tail = self
                .blocks
                .range(base..end)
                .next_back()
                .map(|(&a, b)| (a, *b))
                .filter(|(a, b)| b.free && a + b.size == end);
            let have = tail.map_or(0, |(_, b)| b.size);
            let page = if pool == 1 {
                s.small_segment_bytes
            } else {
                s.page_bytes
            };
            let more = round_up(size - have.min(size), page);
            match tail {
                Some((a, b)) => {
                    self.free.remove(&(pool, b.size, a));
                    let nb = Block {
                        size: b.size + more,
                        ..b
                    };
                    self.blocks.insert(a, nb);
                    self.free.insert((pool, nb.size, a));
                }
                None => {
                    self.blocks.insert(
                        end,
                        Block {
                            size: more,
                            free: true,
                            segment: id,
                            pool,
                        },
                    );
                    self.free.insert((pool, more, end));
                }
            }
            self.segments[id as usize].1 += more;
            self.total += more;
            self.peak = self.peak.max(self.total);
            return;
        }
        let len = if pool == 1 {
            s.small_segment_bytes
        } else if size < s.mid_max_bytes {
            s.mid_segment_bytes
        } else {
            round_up(size, s.large_round_bytes)
        };
        self.new_segment(pool, len);
    }

    fn alloc(&mut self, bytes: u64) -> u64 {
        let size = round_up(bytes.max(1), self.spec.round_bytes);
        let pool = self.pool_of(size);
        let found = self.best_fit(pool, size).or_else(|| {
            self.grow(pool, size);
            self.best_fit(pool, size)
        });
        let Some((addr, block)) = found else {
            // Unreachable: growth always makes room; count the request as its own segment.
            return self.new_segment(pool, size);
        };
        self.free.remove(&(pool, block.size, addr));
        self.idle.remove(&block.segment);
        let handed = if self.splits(pool, block.size, size) {
            size
        } else {
            block.size
        };
        self.in_use += handed;
        self.in_use_peak = self.in_use_peak.max(self.in_use);
        if self.splits(pool, block.size, size) {
            let rest = Block {
                size: block.size - size,
                free: true,
                ..block
            };
            self.blocks.insert(addr + size, rest);
            self.free.insert((pool, rest.size, addr + size));
            self.blocks.insert(
                addr,
                Block {
                    size,
                    free: false,
                    ..block
                },
            );
        } else {
            self.blocks.insert(
                addr,
                Block {
                    free: false,
                    ..block
                },
            );
        }
        addr
    }

    fn best_fit(&self, pool: u8, size: u64) -> Option<(u64, Block)> {
        let &(p, _, addr) = self.free.range((pool, size, 0)..).next()?;
        (p == pool).then(|| (addr, self.blocks[&addr]))
    }

    fn free(&mut self, addr: u64) {
        let Some(mut b) = self.blocks.get(&addr).copied() else {
            return;
        };
        if b.free {
            return;
        }
        self.in_use -= b.size;
        let mut start = addr;
        // Merge with the next block of the same segment.
        if let Some(n) = self.blocks.get(&(addr + b.size)).copied()
            && n.free
            && n.segment == b.segment
        {
            self.free.remove(&(n.pool, n.size, addr + b.size));
            self.blocks.remove(&(addr + b.size));
            b.size += n.size;
        }
        // And with the previous one.
        if let Some((&pa, &p)) = self.blocks.range(..addr).next_back()
            && p.free
            && p.segment == b.segment
            && pa + p.size == addr
        {
            self.free.remove(&(p.pool, p.size, pa));
            self.blocks.remove(&addr);
            b.size += p.size;
            start = pa;
        }
        b.free = true;
        self.blocks.insert(start, b);
        self.free.insert((b.pool, b.size, start));
        if self.segments[b.segment as usize] == (start, b.size)
            && !self.growing.contains(&Some(b.segment))
        {
            self.idle.insert(b.segment);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn caching() -> MemorySpec {
        MemorySpec::builtin(Framework::Pytorch)
    }

    /// Under pressure the allocator releases its idle segments from a set it keeps as blocks
    /// change (debug builds check it against a scan of every segment at each release): random
    /// allocations and frees of mixed sizes on a small limit, for both allocators, release
    /// often and end with every block freed, the cache emptied by a last release.
    #[test]
    fn idle_segments_are_tracked_through_random_allocations_under_pressure() {
        let mut bfc = MemorySpec::builtin(Framework::Tf);
        bfc.allocator = AllocatorKind::Bfc;
        for spec in [caching(), bfc] {
            let mut a = Allocator::new(&spec);
            a.limit = 64 * MIB;
            let mut live: Vec<u64> = Vec::new();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            for _ in 0..4000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if live.len() > 40 || (x % 3 == 0 && !live.is_empty()) {
                    let i = (x >> 8) as usize % live.len();
                    a.free(live.swap_remove(i));
                } else {
                    let bytes = match x % 4 {
                        0 => (x >> 20) % MIB,
                        1 => (x >> 20) % (8 * MIB),
                        2 => 2 * MIB + (x >> 20) % (30 * MIB),
                        _ => 512,
                    };
                    live.push(a.alloc(bytes.max(1)));
                }
            }
            for addr in live.drain(..) {
                a.free(addr);
            }
            assert_eq!(a.in_use, 0);
            a.release_cached();
            assert_eq!(a.total, 0, "every segment idle and released");
        }
    }

    #[test]
    fn architecture_values_replace_the_defaults_on_that_architecture_only() {
        let p = caching();
        let hopper = p.clone().for_arch("hopper");
        // configs/memory/pytorch.yaml: measured on an H200 (experiments/gpu_truth/h200).
        assert_eq!(hopper.context_lazy_bytes, 808_255_488);
        assert_eq!(hopper.workspace_bytes, 32 * MIB + MIB);
        assert_eq!(hopper.context_eager_bytes, p.context_eager_bytes);
        assert_eq!(p.clone().for_arch("volta"), p);
        let bad = "name: x\nallocator: caching\nround_bytes: 512\nsmall_max_bytes: 1\nsmall_segment_bytes: 2\nmid_max_bytes: 1\nmid_segment_bytes: 2\nlarge_round_bytes: 2\nexpandable_segments: false\npage_bytes: 2\nbfc_first_region_bytes: 2\nworkspace_bytes: 0\ncontext_lazy_bytes: 0\ncontext_eager_bytes: 0\nmodule_loading: lazy\nnccl_buffsize_bytes: 0\nnccl_channels: 1\nnccl_peers_per_channel: 1\nallocated_scale: 1.0\narch:\n  hopper:\n    context_lazy_bytes: 10000000000000\n";
        let e = parse_memory(bad, "m.yaml").unwrap_err().to_string();
        assert!(
            e.contains("m.yaml") && e.contains("arch.hopper.context_lazy_bytes"),
            "{e}"
        );
        let unknown = bad.replace("context_lazy_bytes: 10000000000000", "context_bytes: 1");
        assert!(parse_memory(&unknown, "m.yaml").is_err());
    }

    #[test]
    fn builtins_parse_and_every_file_is_builtin() {
        for (file, text) in BUILTIN {
            parse_memory(text, file).unwrap_or_else(|e| panic!("{e}"));
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/memory");
        for e in std::fs::read_dir(root).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let key = format!("configs/memory/{name}");
            assert!(BUILTIN.iter().any(|(p, _)| *p == key), "{key} not built in");
        }
        assert_eq!(caching().allocator, AllocatorKind::Caching);
        assert_eq!(
            MemorySpec::builtin(Framework::Tf).allocator,
            AllocatorKind::Bfc
        );
    }

    #[test]
    fn small_requests_share_a_2_mib_segment() {
        // 1000 B rounds to 1024; three of them fit one 2 MiB small segment.
        let s = caching();
        let p = segments_peak(&s, [Event::Alloc(1000); 3]);
        assert_eq!(p, 2 * MIB);
    }

    #[test]
    fn mid_requests_take_20_mib_segments_and_large_ones_round_to_2_mib() {
        let s = caching();
        // 3 MiB: a 20 MiB segment, split; a second 3 MiB request fits in its rest.
        assert_eq!(
            segments_peak(&s, [Event::Alloc(3 * MIB), Event::Alloc(3 * MIB)]),
            20 * MIB
        );
        // 11 MiB + 1 byte: its own segment of 12 MiB.
        assert_eq!(segments_peak(&s, [Event::Alloc(11 * MIB + 1)]), 12 * MIB);
    }

    #[test]
    fn a_freed_block_is_reused_and_fragmentation_is_counted() {
        let s = caching();
        // 100 MiB freed, then 60 MiB (split from it) and 60 MiB more: the second cannot use the
        // 40 MiB rest, so a new 60 MiB segment: 160 MiB reserved for 120 MiB in use.
        let ev = [
            Event::Alloc(100 * MIB),
            Event::Free(100 * MIB),
            Event::Alloc(60 * MIB),
            Event::Alloc(60 * MIB),
        ];
        assert_eq!(segments_peak(&s, ev), 160 * MIB);
        // Freed neighbours merge: 2 × 50 MiB freed serve one 100 MiB request.
        let ev = [
            Event::Alloc(100 * MIB),
            Event::Free(100 * MIB),
            Event::Alloc(50 * MIB),
            Event::Alloc(50 * MIB),
            Event::Free(50 * MIB),
            Event::Free(50 * MIB),
            Event::Alloc(100 * MIB),
        ];
        assert_eq!(segments_peak(&s, ev), 100 * MIB);
    }

    #[test]
    fn under_pressure_cached_segments_are_released() {
        let s = caching();
        // 100 MiB freed, then 60 + 60 MiB: the first segment is split and holds a live 60 MiB
        // block, so nothing can be released: 160 MiB, over a 130 MiB limit — out of memory.
        let ev = [
            Event::Alloc(100 * MIB),
            Event::Free(100 * MIB),
            Event::Alloc(60 * MIB),
            Event::Alloc(60 * MIB),
        ];
        assert_eq!(segments_peak_within(&s, 130 * MIB, ev), 160 * MIB);
        // 100 MiB freed, then 120 MiB: the empty 100 MiB segment is released first.
        let ev = [
            Event::Alloc(100 * MIB),
            Event::Free(100 * MIB),
            Event::Alloc(120 * MIB),
        ];
        assert_eq!(segments_peak(&s, ev), 220 * MIB);
        assert_eq!(segments_peak_within(&s, 150 * MIB, ev), 120 * MIB);
    }

    #[test]
    fn expandable_segments_grow_in_place() {
        let s = MemorySpec {
            expandable_segments: true,
            ..caching()
        };
        // The same 160-for-120 case: the segment grows from 100 MiB by 20 MiB (the 40 MiB rest
        // at its end is extended), no second segment.
        let ev = [
            Event::Alloc(100 * MIB),
            Event::Free(100 * MIB),
            Event::Alloc(60 * MIB),
            Event::Alloc(60 * MIB),
        ];
        assert_eq!(segments_peak(&s, ev), 120 * MIB);
    }

    #[test]
    fn bfc_regions_double_and_chunks_split_only_at_twice_the_request() {
        let s = MemorySpec::builtin(Framework::Tf);
        assert_eq!(s.bfc_first_region_bytes, 2 * MIB);
        // 3 MiB: regions of 2 MiB too small → 4 MiB region (next is 8 MiB); a second 3 MiB
        // does not fit the 1 MiB rest → an 8 MiB region: 12 MiB for 6 MiB.
        assert_eq!(
            segments_peak(&s, [Event::Alloc(3 * MIB), Event::Alloc(3 * MIB)]),
            12 * MIB
        );
    }

    #[test]
    fn bfc_regions_back_off_near_the_limit() {
        let s = MemorySpec::builtin(Framework::Tf);
        // 3 MiB → a 4 MiB region; 3 MiB more with 10 MiB for the allocator: the next region
        // would be 8 MiB, 6 MiB are left, so a 6 MiB region: 10 MiB in all.
        let ev = [Event::Alloc(3 * MIB), Event::Alloc(3 * MIB)];
        assert_eq!(segments_peak_within(&s, 10 * MIB, ev), 10 * MIB);
        // Not even the request fits: the region is the request, over the limit.
        let ev = [Event::Alloc(3 * MIB), Event::Alloc(9 * MIB)];
        assert_eq!(segments_peak_within(&s, 10 * MIB, ev), 13 * MIB);
    }

    #[test]
    fn peaks_add_the_runtime_terms() {
        let s = caching();
        let p = MemoryPeaks::combine(&s, 1000 * MIB, 400 * MIB, 1100 * MIB, 1);
        // cuBLAS's workspace is in both allocated and reserved.
        assert_eq!(s.workspace_bytes, 8_519_680 + MIB);
        assert_eq!(p.allocated, 1000 * MIB + s.workspace_bytes);
        assert_eq!(p.reserved, 1100 * MIB + s.workspace_bytes);
        let nccl = u64::from(s.nccl_channels) * u64::from(s.nccl_peers_per_channel) * 4 * MIB;
        assert_eq!(s.nccl_bytes(1), nccl);
        assert_eq!(p.device_used, p.reserved + s.context_bytes() + nccl);
        assert_eq!(p.breakdown.allocator_slack_bytes, 100 * MIB);
        assert_eq!(p.breakdown.dynamic_bytes, 600 * MIB);
        // One GPU: no communicator, no NCCL buffers.
        assert_eq!(MemoryPeaks::combine(&s, 1, 0, 0, 0).breakdown.nccl_bytes, 0);
    }

    #[test]
    fn bad_values_name_the_field() {
        let t = PYTORCH.1.replace("round_bytes: 512", "round_bytes: 0");
        let e = parse_memory(&t, "m.yaml").unwrap_err().to_string();
        assert!(e.contains("m.yaml") && e.contains("round_bytes"), "{e}");
        let t = TENSORFLOW.1.replace("fraction: 0.05", "fraction: 0.7");
        let e = parse_memory(&t, "tf.yaml").unwrap_err().to_string();
        assert!(e.contains("tf.yaml") && e.contains("field pool"), "{e}");
    }

    #[test]
    fn pools_are_capped_as_each_framework_caps_them() {
        const GIB: u64 = 1 << 30;
        // PyTorch: no cap of its own.
        assert_eq!(caching().pool_bytes(16 * GIB), None);
        assert_eq!(caching().kept_out_bytes(16 * GIB, 1), 0);
        // TensorFlow: the memory free after the context it starts with (420 MiB, from its
        // start-up logs), less max(300 MiB, 5 % of it).
        let tf = MemorySpec::builtin(Framework::Tf);
        let free = 16 * GIB - 420 * MIB;
        let pool = free - free / 20;
        let got = tf.pool_bytes(16 * GIB).unwrap();
        assert!(got.abs_diff(pool) <= 1, "{got} vs {pool}");
        // A small GPU keeps the 300 MiB floor.
        let small = 4 * GIB - 420 * MIB;
        assert_eq!(tf.pool_bytes(4 * GIB), Some(small - 300 * MIB));
        // Without a start-up context the pool follows the job's own.
        let mut own = tf.clone();
        own.pool = Some(PoolLimit::FreeLessReserve {
            fraction: 0.05,
            min_bytes: 300 * MIB,
            context_bytes: None,
        });
        let free = 16 * GIB - own.context_bytes();
        assert!(own.pool_bytes(16 * GIB).unwrap().abs_diff(free - free / 20) <= 1);
        // What the job needs: the pool's bytes plus everything outside the pool.
        let (reserved, used) = (10 * GIB, 10 * GIB + tf.context_bytes());
        assert_eq!(
            used + tf.kept_out_bytes(16 * GIB, 0),
            reserved + (16 * GIB - got)
        );
        // XLA: 75 % of the total, with or without preallocation.
        let jax = MemorySpec::builtin(Framework::Jax);
        assert_eq!(jax.pool_bytes(80 * GIB), Some(60 * GIB));
        let used = 61 * GIB + jax.context_bytes();
        assert!(used + jax.kept_out_bytes(80 * GIB, 0) > 80 * GIB);
    }
}
