//! The global data-flow graph (DFG) of one training iteration across all workers.
//!
//! An arena in struct-of-arrays form: ops are dense `u32` indices, their attributes live in
//! parallel vectors, and dependency edges are stored twice in compressed-sparse-row form
//! (successors and predecessors). This is what the replayer walks millions of times per second;
//! petgraph's algorithms run on it directly through the visit traits in [`petgraph_impl`].
//!
//! A graph is made with [`DfgBuilder`] and frozen by [`DfgBuilder::build`], which checks the
//! invariants (acyclic, every op on exactly one existing device) and returns a
//! [`GraphError`] naming the offending op otherwise. A frozen [`Dfg`] is never mutated: passes
//! propose patches and the driver builds a new graph.
//!
//! **Invariant:** `topo` is a topological order of all ops; `succ`/`pred` hold the same edge set.
//! **Invariant:** every op's device exists; virtual ops sit on a [`DeviceKind::Virtual`] device.

pub mod bounds;
pub mod comm;
pub mod job;
pub mod petgraph_impl;
pub mod pipeline;

use std::fmt;

/// Index of an op in a [`Dfg`].
pub type OpId = u32;
/// Index of a device in a [`Dfg`].
pub type DeviceId = u32;
/// Index of a tensor in a [`Dfg`]'s tensor table.
pub type TensorId = u32;
/// Index of a layer in a [`Dfg`]'s layer table.
pub type LayerId = u32;
/// "No tensor / no layer / no worker" marker for the compact `u32` columns.
pub const NONE: u32 = u32::MAX;

/// Training phase of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Forward pass.
    Fw,
    /// Backward pass.
    Bw,
    /// Optimizer update.
    Update,
    /// Gradient synchronisation.
    Comm,
    /// Anything else (data loading, host work outside the step's phases).
    Other,
}

/// What an op does. Durations of virtual ops are zero by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A GPU kernel or a layer's worth of kernels.
    Compute,
    /// A CPU kernel-launch call (cudaLaunchKernel and friends).
    Launch,
    /// Other CPU work (framework overhead, an operator's host side).
    CpuOther,
    /// An idle gap on a CPU thread that the trace showed and that replay keeps.
    Gap,
    /// A host↔device or device↔device copy.
    Memcpy,
    /// Producer half of one fine-grained transfer (a ring step's chunk, a PS push or pull).
    Send,
    /// Consumer half of one fine-grained transfer (receive, and reduce where the step reduces).
    Recv,
    /// A parameter server's aggregation of one partition.
    Aggregate,
    /// A whole collective as one op (a NCCL kernel seen in a trace).
    Collective,
    /// Virtual: the tensor's synchronisation starts (dPRO Fig. 4 "In" of the comm topology).
    In,
    /// Virtual: the tensor's synchronisation is done.
    Out,
}

impl OpKind {
    /// True for communication ops (the suffix of dPRO's critical path).
    pub fn is_comm(self) -> bool {
        matches!(
            self,
            OpKind::Send | OpKind::Recv | OpKind::Aggregate | OpKind::Collective
        )
    }
    /// True for the zero-duration bookkeeping ops.
    pub fn is_virtual(self) -> bool {
        matches!(self, OpKind::In | OpKind::Out)
    }
}

/// Class of a communication link, which selects its α–β parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Inside one server (NVLink, xGMI, PCIe).
    IntraNode,
    /// Between servers (RDMA, TCP, InfiniBand).
    InterNode,
}

/// A device: one FIFO queue with one clock in the replayer (dPRO §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceKind {
    /// A GPU stream of a worker (stream 0 is the compute stream).
    GpuStream { worker: u32, stream: u32 },
    /// A CPU thread of a worker.
    CpuThread { worker: u32, thread: u32 },
    /// The stream that runs a worker's communication kernels (NCCL's stream).
    CommStream { worker: u32 },
    /// A directed link between two workers (ring or tree hop).
    Link {
        from: u32,
        to: u32,
        class: LinkClass,
    },
    /// A worker's or a server's network transmit queue (parameter server push/pull).
    NicTx { node: u32, server: bool },
    /// A parameter server's aggregation thread.
    Server { server: u32 },
    /// Not a resource: ops on it start as soon as they are ready, in parallel.
    Virtual,
}

impl DeviceKind {
    /// The worker this device belongs to, if any.
    pub fn worker(self) -> Option<u32> {
        match self {
            DeviceKind::GpuStream { worker, .. }
            | DeviceKind::CpuThread { worker, .. }
            | DeviceKind::CommStream { worker } => Some(worker),
            DeviceKind::Link { from, .. } => Some(from),
            DeviceKind::NicTx {
                node,
                server: false,
            } => Some(node),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DeviceKind::GpuStream { worker, stream } => write!(f, "w{worker}.gpu.s{stream}"),
            DeviceKind::CpuThread { worker, thread } => write!(f, "w{worker}.cpu.t{thread}"),
            DeviceKind::CommStream { worker } => write!(f, "w{worker}.comm"),
            DeviceKind::Link { from, to, class } => {
                let c = match class {
                    LinkClass::IntraNode => "intra",
                    LinkClass::InterNode => "inter",
                };
                write!(f, "link.w{from}->w{to}.{c}")
            }
            DeviceKind::NicTx { node, server } => {
                write!(f, "{}{node}.nic.tx", if server { "ps" } else { "w" })
            }
            DeviceKind::Server { server } => write!(f, "ps{server}.agg"),
            DeviceKind::Virtual => write!(f, "virtual"),
        }
    }
}

/// A named tensor whose synchronisation the graph models (a gradient, usually).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Tensor {
    pub name: String,
    pub bytes: u64,
    /// The layer whose backward op produces it, or [`NONE`].
    pub layer: LayerId,
}

/// A memory effect of an op on its worker: `bytes` allocated when the op starts, or freed when
/// it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemEffect {
    pub op: OpId,
    pub worker: u32,
    pub bytes: u64,
    pub when: MemWhen,
}

/// When a [`MemEffect`] happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemWhen {
    /// Allocated at the op's start.
    AllocAtStart,
    /// Freed at the op's end.
    FreeAtEnd,
    /// Live only while the op runs: allocated at its start, freed at its end (an op's output
    /// before its consumer takes it, gradient buffers, workspaces).
    During,
}

/// What an op is, for display and for the passes: its kind, phase, device, duration and labels.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSpec {
    pub kind: OpKind,
    pub phase: Phase,
    pub device: DeviceId,
    pub dur_ns: u64,
    /// Time the device stays busy after the op ends (a CPU gap the trace showed).
    pub gap_ns: u64,
    pub layer: LayerId,
    pub tensor: TensorId,
    /// Communication step (ring step, tree level, push/pull) or kernel index; 0 otherwise.
    pub step: u32,
    /// Scheduling priority on the device: lower runs first among ready ops; 0 by default.
    pub priority: i32,
}

impl OpSpec {
    /// A compute op of `layer` in `phase` on `device`.
    pub fn compute(device: DeviceId, phase: Phase, layer: LayerId, dur_ns: u64) -> Self {
        OpSpec {
            kind: OpKind::Compute,
            phase,
            device,
            dur_ns,
            gap_ns: 0,
            layer,
            tensor: NONE,
            step: 0,
            priority: 0,
        }
    }
    /// An op of any kind with no labels.
    pub fn new(kind: OpKind, phase: Phase, device: DeviceId, dur_ns: u64) -> Self {
        OpSpec {
            kind,
            phase,
            device,
            dur_ns,
            gap_ns: 0,
            layer: NONE,
            tensor: NONE,
            step: 0,
            priority: 0,
        }
    }
}

/// Why a graph could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GraphError {
    #[error("the graph has a cycle through op {op} ({label})")]
    Cycle { op: OpId, label: String },
    #[error("op {op} ({label}) is on device {device}, but the graph has {devices} devices")]
    NoSuchDevice {
        op: OpId,
        label: String,
        device: DeviceId,
        devices: usize,
    },
    #[error("edge {from} -> {to} names an op that does not exist (the graph has {ops} ops)")]
    NoSuchOp { from: OpId, to: OpId, ops: usize },
    #[error("virtual op {op} ({label}) has a duration of {dur_ns} ns; virtual ops take no time")]
    VirtualWithDuration {
        op: OpId,
        label: String,
        dur_ns: u64,
    },
    #[error("the graph has {0} ops; at most {max} fit", max = u32::MAX - 1)]
    TooLarge(usize),
}

/// Collects ops, devices and edges; [`DfgBuilder::build`] freezes them into a [`Dfg`].
#[derive(Clone, Debug, Default)]
pub struct DfgBuilder {
    g: Dfg,
    edges: Vec<(OpId, OpId)>,
}

impl DfgBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserve room for `ops` ops and `edges` edges.
    pub fn with_capacity(ops: usize, edges: usize) -> Self {
        let mut b = Self::default();
        b.reserve(ops, edges);
        b
    }

    /// Reserve room for `ops` more ops and `edges` more edges.
    pub fn reserve(&mut self, ops: usize, edges: usize) {
        let g = &mut self.g;
        g.kind.reserve(ops);
        g.phase.reserve(ops);
        g.device.reserve(ops);
        g.dur_ns.reserve(ops);
        g.gap_ns.reserve(ops);
        g.layer.reserve(ops);
        g.tensor.reserve(ops);
        g.step.reserve(ops);
        g.priority.reserve(ops);
        self.edges.reserve(edges);
    }

    /// Number of workers the graph describes (for memory accounting and reports).
    pub fn set_workers(&mut self, workers: u32) {
        self.g.workers = workers;
        self.g.static_mem_bytes.resize(workers as usize, 0);
    }

    /// Bytes a worker holds for the whole iteration (weights, gradients, optimizer state).
    pub fn set_static_memory(&mut self, worker: u32, bytes: u64) {
        if self.g.static_mem_bytes.len() <= worker as usize {
            self.g.static_mem_bytes.resize(worker as usize + 1, 0);
        }
        self.g.static_mem_bytes[worker as usize] = bytes;
    }

    /// When this graph is the symmetric (quotient) form, the number of workers it stands for.
    pub fn set_represents(&mut self, workers: u32) {
        self.g.represents = workers;
    }

    /// Slowdown of GPU compute that overlaps its worker's communication (parts per million).
    pub fn set_contention_ppm(&mut self, ppm: u32) {
        self.g.contention_ppm = ppm;
    }

    pub fn add_device(&mut self, kind: DeviceKind) -> DeviceId {
        self.g.devices.push(kind);
        (self.g.devices.len() - 1) as DeviceId
    }

    /// Worker `w`'s copy of a template's devices (`local`, all with worker 0): a stream, host
    /// thread or communication stream of `w` each; virtual devices map to `virt`; others are
    /// added as they are. Returns the global device of each local one.
    pub fn add_worker_devices(
        &mut self,
        local: &[DeviceKind],
        w: u32,
        virt: DeviceId,
    ) -> Vec<DeviceId> {
        local
            .iter()
            .map(|&d| match d {
                DeviceKind::Virtual => virt,
                DeviceKind::GpuStream { stream, .. } => {
                    self.add_device(DeviceKind::GpuStream { worker: w, stream })
                }
                DeviceKind::CpuThread { thread, .. } => {
                    self.add_device(DeviceKind::CpuThread { worker: w, thread })
                }
                DeviceKind::CommStream { .. } => {
                    self.add_device(DeviceKind::CommStream { worker: w })
                }
                other => self.add_device(other),
            })
            .collect()
    }

    pub fn add_layer(&mut self, name: impl Into<String>) -> LayerId {
        self.g.layers.push(name.into());
        (self.g.layers.len() - 1) as LayerId
    }

    pub fn add_tensor(&mut self, tensor: Tensor) -> TensorId {
        self.g.tensors.push(tensor);
        (self.g.tensors.len() - 1) as TensorId
    }

    pub fn add_op(&mut self, op: OpSpec) -> OpId {
        let g = &mut self.g;
        g.kind.push(op.kind);
        g.phase.push(op.phase);
        g.device.push(op.device);
        g.dur_ns.push(op.dur_ns);
        g.gap_ns.push(op.gap_ns);
        g.layer.push(op.layer);
        g.tensor.push(op.tensor);
        g.step.push(op.step);
        g.priority.push(op.priority);
        (g.kind.len() - 1) as OpId
    }

    /// `to` cannot start before `from` has ended.
    #[inline]
    pub fn add_edge(&mut self, from: OpId, to: OpId) {
        self.edges.push((from, to));
    }

    pub fn add_mem(&mut self, effect: MemEffect) {
        self.g.mem.push(effect);
    }

    /// Ops added so far.
    pub fn op_count(&self) -> usize {
        self.g.kind.len()
    }

    /// The device table so far.
    pub fn devices(&self) -> &[DeviceKind] {
        &self.g.devices
    }

    /// Duplicate edges are kept; they cost a little replay time and change nothing else.
    pub fn build(self) -> Result<Dfg, GraphError> {
        let DfgBuilder { mut g, edges } = self;
        let n = g.kind.len();
        if n >= u32::MAX as usize {
            return Err(GraphError::TooLarge(n));
        }
        for (i, &d) in g.device.iter().enumerate() {
            if d as usize >= g.devices.len() {
                return Err(GraphError::NoSuchDevice {
                    op: i as OpId,
                    label: g.op_label(i as OpId),
                    device: d,
                    devices: g.devices.len(),
                });
            }
        }
        for (i, k) in g.kind.iter().enumerate() {
            if k.is_virtual() && g.dur_ns[i] != 0 {
                return Err(GraphError::VirtualWithDuration {
                    op: i as OpId,
                    label: g.op_label(i as OpId),
                    dur_ns: g.dur_ns[i],
                });
            }
        }
        for &(a, b) in &edges {
            if a as usize >= n || b as usize >= n {
                return Err(GraphError::NoSuchOp {
                    from: a,
                    to: b,
                    ops: n,
                });
            }
        }
        g.succ = Csr::from_edges(n, edges.iter().copied());
        g.pred = Csr::from_edges(n, edges.iter().map(|&(a, b)| (b, a)));
        drop(edges);
        g.topo = g.kahn()?;
        g.mem.sort_by_key(|m| (m.op, m.worker));
        if g.workers == 0 {
            g.workers = g
                .devices
                .iter()
                .filter_map(|d| d.worker())
                .max()
                .map_or(0, |w| w + 1);
            g.static_mem_bytes.resize(g.workers as usize, 0);
        }
        g.debug_check();
        Ok(g)
    }
}

/// Compressed sparse rows: the neighbours of node `i` are `targets[offsets[i]..offsets[i+1]]`.
#[derive(Clone, Debug, Default)]
pub struct Csr {
    offsets: Vec<u32>,
    targets: Vec<u32>,
}

impl Csr {
    fn from_edges(n: usize, edges: impl Iterator<Item = (u32, u32)> + Clone) -> Csr {
        let mut offsets = vec![0u32; n + 1];
        for (a, _) in edges.clone() {
            offsets[a as usize + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut targets = vec![0u32; offsets[n] as usize];
        for (a, b) in edges {
            let slot = &mut fill[a as usize];
            targets[*slot as usize] = b;
            *slot += 1;
        }
        Csr { offsets, targets }
    }

    /// Neighbours of `i`, in insertion order.
    #[inline]
    pub fn of(&self, i: OpId) -> &[u32] {
        let a = self.offsets[i as usize] as usize;
        let b = self.offsets[i as usize + 1] as usize;
        &self.targets[a..b]
    }

    /// Number of edges.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// A frozen global data-flow graph. See the module docs for the invariants.
#[derive(Clone, Debug, Default)]
pub struct Dfg {
    kind: Vec<OpKind>,
    phase: Vec<Phase>,
    device: Vec<DeviceId>,
    dur_ns: Vec<u64>,
    gap_ns: Vec<u64>,
    layer: Vec<LayerId>,
    tensor: Vec<TensorId>,
    step: Vec<u32>,
    priority: Vec<i32>,
    succ: Csr,
    pred: Csr,
    topo: Vec<OpId>,
    devices: Vec<DeviceKind>,
    layers: Vec<String>,
    tensors: Vec<Tensor>,
    mem: Vec<MemEffect>,
    static_mem_bytes: Vec<u64>,
    workers: u32,
    represents: u32,
    /// Slowdown of a GPU compute op that starts while its worker's collectives run (SMs and
    /// memory bandwidth shared with NCCL), in parts per million.
    contention_ppm: u32,
}

impl Dfg {
    /// Slowdown of a compute op that starts while its worker communicates, parts per million.
    pub fn contention_ppm(&self) -> u32 {
        self.contention_ppm
    }
    /// Change the contention slowdown (`benches/replay_floor.rs` replays a graph with and
    /// without it).
    pub fn set_contention_ppm(&mut self, ppm: u32) {
        self.contention_ppm = ppm;
    }
    pub fn op_count(&self) -> usize {
        self.kind.len()
    }
    pub fn edge_count(&self) -> usize {
        self.succ.len()
    }
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
    /// Workers whose ops this graph holds.
    pub fn workers(&self) -> u32 {
        self.workers
    }
    /// Workers this graph stands for: more than [`Dfg::workers`] in the symmetric form.
    pub fn represented_workers(&self) -> u32 {
        self.represents.max(self.workers)
    }
    /// True when this is the quotient graph of a symmetric job.
    pub fn is_symmetric_form(&self) -> bool {
        self.represents > self.workers
    }

    #[inline]
    pub fn kind(&self, op: OpId) -> OpKind {
        self.kind[op as usize]
    }
    #[inline]
    pub fn phase(&self, op: OpId) -> Phase {
        self.phase[op as usize]
    }
    #[inline]
    pub fn device(&self, op: OpId) -> DeviceId {
        self.device[op as usize]
    }
    #[inline]
    pub fn dur_ns(&self, op: OpId) -> u64 {
        self.dur_ns[op as usize]
    }
    #[inline]
    pub fn gap_ns(&self, op: OpId) -> u64 {
        self.gap_ns[op as usize]
    }
    #[inline]
    pub fn layer(&self, op: OpId) -> LayerId {
        self.layer[op as usize]
    }
    #[inline]
    pub fn tensor(&self, op: OpId) -> TensorId {
        self.tensor[op as usize]
    }
    #[inline]
    pub fn step(&self, op: OpId) -> u32 {
        self.step[op as usize]
    }
    #[inline]
    pub fn priority(&self, op: OpId) -> i32 {
        self.priority[op as usize]
    }
    #[inline]
    pub fn succs(&self, op: OpId) -> &[OpId] {
        self.succ.of(op)
    }
    #[inline]
    pub fn preds(&self, op: OpId) -> &[OpId] {
        self.pred.of(op)
    }
    /// All durations, indexed by op.
    pub fn durations(&self) -> &[u64] {
        &self.dur_ns
    }
    pub fn gaps(&self) -> &[u64] {
        &self.gap_ns
    }
    pub fn device_of_ops(&self) -> &[DeviceId] {
        &self.device
    }
    pub fn priorities(&self) -> &[i32] {
        &self.priority
    }
    /// A topological order of all ops (sources first, stable: among ready ops, lowest id first).
    pub fn topo_order(&self) -> &[OpId] {
        &self.topo
    }
    pub fn devices(&self) -> &[DeviceKind] {
        &self.devices
    }
    pub fn device_kind(&self, d: DeviceId) -> DeviceKind {
        self.devices[d as usize]
    }
    pub fn layers(&self) -> &[String] {
        &self.layers
    }
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
    pub fn mem_effects(&self) -> &[MemEffect] {
        &self.mem
    }
    pub fn static_memory(&self) -> &[u64] {
        &self.static_mem_bytes
    }
    /// The attributes of one op.
    pub fn spec(&self, op: OpId) -> OpSpec {
        let i = op as usize;
        OpSpec {
            kind: self.kind[i],
            phase: self.phase[i],
            device: self.device[i],
            dur_ns: self.dur_ns[i],
            gap_ns: self.gap_ns[i],
            layer: self.layer[i],
            tensor: self.tensor[i],
            step: self.step[i],
            priority: self.priority[i],
        }
    }

    /// A human-readable name: layer or tensor, phase, kind, step and device.
    pub fn op_label(&self, op: OpId) -> String {
        let i = op as usize;
        let Some(&kind) = self.kind.get(i) else {
            return format!("#{op}");
        };
        let dev = self
            .devices
            .get(self.device[i] as usize)
            .map_or_else(|| "?".to_string(), |d| d.to_string());
        let what = if self.tensor[i] != NONE {
            self.tensors
                .get(self.tensor[i] as usize)
                .map_or("?", |t| t.name.as_str())
        } else if self.layer[i] != NONE {
            self.layers
                .get(self.layer[i] as usize)
                .map_or("?", String::as_str)
        } else {
            ""
        };
        let phase = match self.phase[i] {
            Phase::Fw => "FW",
            Phase::Bw => "BW",
            Phase::Update => "UPDATE",
            Phase::Comm => "COMM",
            Phase::Other => "",
        };
        let kind_s = match kind {
            OpKind::Compute => "",
            OpKind::Launch => " launch",
            OpKind::CpuOther => " cpu",
            OpKind::Gap => " gap",
            OpKind::Memcpy => " memcpy",
            OpKind::Send => " SEND",
            OpKind::Recv => " RECV",
            OpKind::Aggregate => " AGG",
            OpKind::Collective => " collective",
            OpKind::In => " In",
            OpKind::Out => " Out",
        };
        let step = if kind.is_comm() && !matches!(kind, OpKind::Collective) {
            format!(" step {}", self.step[i])
        } else {
            String::new()
        };
        format!("{what} {phase}{kind_s}{step} @{dev}")
            .trim()
            .to_string()
    }

    /// Kahn's algorithm with a FIFO of ready ops; the queue starts sorted by id, so the order is
    /// stable. Errors with an op on a cycle when not every op can be ordered.
    fn kahn(&self) -> Result<Vec<OpId>, GraphError> {
        let n = self.op_count();
        let mut indeg: Vec<u32> = (0..n as u32)
            .map(|i| self.pred.of(i).len() as u32)
            .collect();
        let mut order = Vec::with_capacity(n);
        order.extend((0..n as u32).filter(|&i| indeg[i as usize] == 0));
        let mut head = 0;
        while head < order.len() {
            let u = order[head];
            head += 1;
            for &v in self.succ.of(u) {
                let d = &mut indeg[v as usize];
                *d -= 1;
                if *d == 0 {
                    order.push(v);
                }
            }
        }
        if order.len() == n {
            return Ok(order);
        }
        // Every op left with indeg > 0 is on a cycle or downstream of one; walk predecessors
        // that are still blocked until one repeats, which is then on a cycle.
        let start = (0..n).find(|&i| indeg[i] > 0).expect("some op is blocked") as u32;
        let mut seen = vec![false; n];
        let mut u = start;
        while !seen[u as usize] {
            seen[u as usize] = true;
            u = *self
                .pred
                .of(u)
                .iter()
                .find(|&&p| indeg[p as usize] > 0)
                .expect("a blocked op has a blocked predecessor");
        }
        Err(GraphError::Cycle {
            op: u,
            label: self.op_label(u),
        })
    }

    /// Debug-only consistency check of the invariants; free in release builds.
    #[inline]
    pub fn debug_check(&self) {
        if cfg!(debug_assertions) {
            self.check()
                .unwrap_or_else(|e| panic!("broken DFG invariant: {e}"));
        }
    }

    /// Full invariant check: acyclic (the topological order is complete and respects every
    /// edge), every op on exactly one existing device, virtual ops take no time, succ/pred agree.
    pub fn check(&self) -> Result<(), String> {
        let n = self.op_count();
        for col in [
            self.phase.len(),
            self.device.len(),
            self.dur_ns.len(),
            self.gap_ns.len(),
            self.layer.len(),
            self.tensor.len(),
            self.step.len(),
            self.priority.len(),
        ] {
            if col != n {
                return Err(format!("column length {col} != op count {n}"));
            }
        }
        if self.topo.len() != n {
            return Err(format!(
                "topological order has {} of {n} ops",
                self.topo.len()
            ));
        }
        let mut pos = vec![u32::MAX; n];
        for (i, &op) in self.topo.iter().enumerate() {
            if pos[op as usize] != u32::MAX {
                return Err(format!("op {op} twice in the topological order"));
            }
            pos[op as usize] = i as u32;
        }
        for u in 0..n as u32 {
            if self.device[u as usize] as usize >= self.devices.len() {
                return Err(format!("op {u} on a missing device"));
            }
            if self.kind[u as usize].is_virtual() && self.dur_ns[u as usize] != 0 {
                return Err(format!("virtual op {u} has a duration"));
            }
            for &v in self.succ.of(u) {
                if pos[u as usize] >= pos[v as usize] {
                    return Err(format!("edge {u} -> {v} goes backwards: a cycle"));
                }
                if !self.pred.of(v).contains(&u) {
                    return Err(format!(
                        "edge {u} -> {v} missing from the predecessor lists"
                    ));
                }
            }
        }
        if self.succ.len() != self.pred.len() {
            return Err("successor and predecessor edge counts differ".into());
        }
        for m in &self.mem {
            if m.op as usize >= n {
                return Err(format!("memory effect names missing op {}", m.op));
            }
        }
        Ok(())
    }

    /// The sub-graph induced by `ops` (ids in the new graph follow the order of `ops`), plus for
    /// each new op its id in `self`. Devices, layers and tensors are kept whole so that ids in
    /// them stay valid; memory effects of the kept ops are kept.
    pub fn induced(&self, ops: &[OpId]) -> (Dfg, Vec<OpId>) {
        let mut new_id = vec![NONE; self.op_count()];
        let mut b = DfgBuilder::with_capacity(ops.len(), ops.len() * 2);
        b.g.devices = self.devices.clone();
        b.g.layers = self.layers.clone();
        b.g.tensors = self.tensors.clone();
        b.g.static_mem_bytes = self.static_mem_bytes.clone();
        b.g.workers = self.workers;
        b.g.represents = self.represents;
        b.g.contention_ppm = self.contention_ppm;
        for &op in ops {
            new_id[op as usize] = b.add_op(self.spec(op));
        }
        for &op in ops {
            for &s in self.succs(op) {
                let t = new_id[s as usize];
                if t != NONE {
                    b.add_edge(new_id[op as usize], t);
                }
            }
        }
        for m in &self.mem {
            let t = new_id[m.op as usize];
            if t != NONE {
                b.add_mem(MemEffect { op: t, ..*m });
            }
        }
        let g = b
            .build()
            .expect("an induced sub-graph of a valid graph is valid");
        (g, ops.to_vec())
    }
}

/// `(prefix, block index, rest)` of an op name whose first all-digit dot component (followed by
/// more components) is a block index: `bert.encoder.layer.3.output.dense BW` →
/// (`bert.encoder.layer.`, 3, `.output.dense BW`); `layer2.1.conv1 FW` → (`layer2.`, 1,
/// `.conv1 FW`). `features.0 FW` (VGG: each index a different op) has none.
pub fn block_of(name: &str) -> Option<(&str, u32, &str)> {
    let mut at = 0;
    for comp in name.split('.') {
        let end = at + comp.len();
        if at > 0 && !comp.is_empty() && comp.bytes().all(|b| b.is_ascii_digit()) {
            let rest = &name[end..];
            return rest
                .starts_with('.')
                .then_some(())
                .and_then(|_| comp.parse().ok())
                .map(|i| (&name[..at], i, rest));
        }
        at = end + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_dev() -> (DfgBuilder, DeviceId, DeviceId) {
        let mut b = DfgBuilder::new();
        let g = b.add_device(DeviceKind::GpuStream {
            worker: 0,
            stream: 0,
        });
        let c = b.add_device(DeviceKind::CpuThread {
            worker: 0,
            thread: 0,
        });
        (b, g, c)
    }

    #[test]
    fn builds_csr_both_ways() {
        let (mut b, g, c) = two_dev();
        let a = b.add_op(OpSpec::new(OpKind::Launch, Phase::Fw, c, 5));
        let k = b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 10));
        let k2 = b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 10));
        b.add_edge(a, k);
        b.add_edge(a, k2);
        b.add_edge(k, k2);
        let dfg = b.build().unwrap();
        assert_eq!(dfg.succs(a), &[k, k2]);
        assert_eq!(dfg.preds(k2), &[a, k]);
        assert_eq!(dfg.topo_order(), &[a, k, k2]);
        assert_eq!(dfg.workers(), 1);
        dfg.check().unwrap();
    }

    #[test]
    fn cycle_is_an_error_naming_an_op_on_it() {
        let (mut b, g, _) = two_dev();
        let x = b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 1));
        let y = b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 1));
        let z = b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 1));
        b.add_edge(x, y);
        b.add_edge(y, z);
        b.add_edge(z, y);
        match b.build() {
            Err(GraphError::Cycle { op, .. }) => assert!(op == y || op == z, "{op}"),
            other => panic!("expected a cycle, got {other:?}"),
        }
    }

    #[test]
    fn missing_device_and_virtual_duration_are_errors() {
        let (mut b, _, _) = two_dev();
        b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, 7, 1));
        assert!(matches!(
            b.build(),
            Err(GraphError::NoSuchDevice { device: 7, .. })
        ));
        let (mut b, g, _) = two_dev();
        b.add_op(OpSpec::new(OpKind::In, Phase::Comm, g, 3));
        assert!(matches!(
            b.build(),
            Err(GraphError::VirtualWithDuration { dur_ns: 3, .. })
        ));
    }

    #[test]
    fn induced_keeps_internal_edges_only() {
        let (mut b, g, _) = two_dev();
        let ops: Vec<_> = (0..4)
            .map(|_| b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, g, 1)))
            .collect();
        b.add_edge(ops[0], ops[1]);
        b.add_edge(ops[1], ops[2]);
        b.add_edge(ops[2], ops[3]);
        let dfg = b.build().unwrap();
        let (sub, map) = dfg.induced(&[ops[1], ops[2]]);
        assert_eq!(sub.op_count(), 2);
        assert_eq!(sub.edge_count(), 1);
        assert_eq!(map, vec![ops[1], ops[2]]);
    }
}
