//! A data-parallel job in its editable, logical form: one worker's local graph (the template all
//! workers share), the ordered list of gradient synchronisations, and the communication
//! topology. [`Job::expand`] turns it into the global [`Dfg`] (every worker's ops plus the
//! fine-grained SEND/RECV ops of every synchronisation), which is what the replayer runs.
//!
//! Passes edit the job, never the global graph: fusing two ops edits the local graph once for all
//! workers; fusing two tensors merges two [`Sync`]s; partitioning one sets its `partitions`. The
//! local graph is small (hundreds to thousands of ops), so an edit copies it and expansion
//! rebuilds the global graph — milliseconds for 16 workers (see `benches/`).
//!
//! Edits go through [`Editor`], which implements Daydream's what-if primitives (select is the
//! caller's job; scale, remove, insert, merge, add edge, priority) over op ids that stay stable
//! during an edit: removed ops become tombstones and inserted ops are appended, and
//! [`Editor::finish`] compacts and checks the result (a cycle or an empty graph is an error and the
//! original job is untouched).
//!
//! **Invariant:** every `Sync` names live local `Out`-side ops in `ready` and `In`-side ops in
//! `done`; sync order is the collective issue order.

use crate::cost::compute::{Efficiency, Roofline, ns};
use crate::cost::config::{Dtype, GpuSpec};
use crate::cost::framework::{Exec, Framework, Math};
use crate::cost::host::HostSpec;
use crate::cost::kernel::KernelModel;
pub use crate::cost::kernel::OpWork;

pub use super::comm::{CollectiveKind, Group};
use super::comm::{CommSpec, CommTopology};
use super::{
    DeviceKind, Dfg, DfgBuilder, GraphError, MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase,
    Tensor, TensorId,
};

/// Layer name of the zero-length op that marks the end of a recorded step on the step's CPU
/// thread (a trace job): its replayed end is the predicted step, and the steady-state period
/// is measured between its copies (`replay/steady.rs`).
pub const STEP_END_LAYER: &str = "(step end)";
/// Layer name of GPU work a recorded step inherits from the previous one (still running when
/// the step opens): the previous step's tail, which a steady-state copy of the step replaces
/// with its own.
pub const CARRY_IN_LAYER: &str = "(carried in from the previous step)";

/// One op of the local graph.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalOp {
    pub spec: OpSpec,
    /// What it computes, when known (zoo ops; trace ops only have their measured duration).
    pub work: Option<OpWork>,
}

/// One worker's graph: ops on that worker's devices (device ids index `devices`, all with
/// worker 0), dependency edges, memory effects and static memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalGraph {
    pub ops: Vec<LocalOp>,
    pub edges: Vec<(OpId, OpId)>,
    pub mem: Vec<MemEffect>,
    pub devices: Vec<DeviceKind>,
    pub layers: Vec<String>,
    pub tensors: Vec<Tensor>,
    pub static_mem_bytes: u64,
    /// Ops that are the fusion of several: fused op → `layer PHASE` names of its members, in
    /// the order they were merged.
    pub fused: std::collections::BTreeMap<OpId, Vec<String>>,
    /// (layer, tensor): the layer computes with that tensor, which another layer owns (a tied
    /// output layer and the word embeddings). A pipeline that puts the two on different stages
    /// holds the weight on both (`graph/pipeline.rs`).
    pub ties: Vec<(super::LayerId, u32)>,
    /// A recorded step's gradient all-reduces as the framework issued them: each op of one
    /// call (the NCCL kernel and the host ops of the `c10d::allreduce_` that issued it) → the
    /// call's index in `TraceFacts::recorded_syncs`. Empty for zoo jobs. What `tensor-fusion`
    /// re-buckets on a trace.
    pub calls: std::collections::BTreeMap<OpId, u32>,
    /// A recorded FSDP2 step's ops that gather a unit's parameters or free them
    /// (`trace::fsdp::label`): host ops inside the hook's span and the kernels they launched.
    /// Empty for zoo jobs. What `shard` changes on a recorded FSDP2 step.
    pub fsdp: std::collections::BTreeMap<OpId, FsdpOp>,
}

/// Where an op of a recorded FSDP2 step belongs (`LocalGraph::fsdp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsdpOp {
    /// The unit: an index into `TraceSharding::units`.
    pub unit: u32,
    /// Which span of the unit's hooks.
    pub span: FsdpSpan,
    /// Which occurrence of that span in the step, in time order (an all-gather: 0 before the
    /// unit's forward, 1 before its backward when it was resharded).
    pub nth: u32,
}

/// The FSDP2 hook spans a recorded op can belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsdpSpan {
    /// `FSDP::all_gather`: the copy-in and the all-gather.
    AllGather,
    /// `FSDP::all_gather_copy_out`: the gathered parameters copied out for the compute.
    CopyOut,
    /// `FSDP::post_forward`: where the unit frees its gathered parameters after the forward.
    PostForward,
    /// `FSDP::post_backward_reshard`: where it frees them after the backward.
    PostBackwardReshard,
}

impl LocalGraph {
    /// The highest GPU stream number among the graph's devices (0 when it has none): streams a
    /// pass adds (copy streams) take the numbers after it.
    pub fn top_stream(&self) -> u32 {
        self.devices
            .iter()
            .filter_map(|d| match d {
                DeviceKind::GpuStream { stream, .. } => Some(*stream),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The first CPU thread number the graph's devices do not use (0 when it has none).
    pub fn next_cpu_thread(&self) -> u32 {
        self.devices
            .iter()
            .filter_map(|d| match d {
                DeviceKind::CpuThread { thread, .. } => Some(thread + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// `layer PHASE` name of an op (`layer3.0.conv2 BW`), or its label when it has no layer.
    pub fn op_name(&self, op: OpId) -> String {
        let Some(o) = self.ops.get(op as usize) else {
            return format!("#{op}");
        };
        let phase = match o.spec.phase {
            Phase::Fw => "FW",
            Phase::Bw => "BW",
            Phase::Update => "UPDATE",
            Phase::Comm => "COMM",
            Phase::Other => "",
        };
        match self.layers.get(o.spec.layer as usize) {
            Some(l) => format!("{l} {phase}").trim().to_string(),
            None => format!("op {op} {phase}").trim().to_string(),
        }
    }

    /// The ops an op stands for: its fusion members, or itself.
    pub fn members(&self, op: OpId) -> Vec<String> {
        self.fused
            .get(&op)
            .cloned()
            .unwrap_or_else(|| vec![self.op_name(op)])
    }
}

/// One collective: the tensors it carries, when it may start and what waits for it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sync {
    pub tensors: Vec<TensorId>,
    /// Bytes per worker (after compression, if any).
    pub bytes: u64,
    /// Independent pieces it is cut into (BytePS partitions); each is its own collective.
    pub partitions: u32,
    /// What it computes: an all-reduce (data parallelism), or a reduce-scatter / all-gather
    /// (sharded data parallelism: `passes/shard.rs`). `bytes` is the whole tensor's in each.
    pub kind: CollectiveKind,
    /// The ranks it runs over (every worker, or an HSDP shard or replica group).
    pub group: Group,
    /// Local ops whose end makes it ready (the tensors' `Out` ops).
    pub ready: Vec<OpId>,
    /// Local ops that wait for it (the tensors' `In` ops).
    pub done: Vec<OpId>,
}

/// What the job is, for reports.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct JobMeta {
    pub model: String,
    /// Samples per worker per iteration (0 when a trace does not say: see
    /// [`TraceFacts::batch`]).
    pub batch: u32,
    pub cluster: String,
    /// `zoo` or `trace`.
    pub source: String,
    /// What a recorded trace says about the job (`None` for a zoo job).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Box<TraceFacts>>,
    /// The optimizer a zoo model declares (`Adam`, `SGD`); a trace's is in
    /// [`TraceFacts::optimizer`]. Read both through [`Job::optimizer`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// Tensor-parallel degree (`passes/tensor_parallel.rs`): the workers are groups of `tp`
    /// consecutive ranks; 0 or 1 when the job has none.
    #[serde(skip_serializing_if = "is_untouched")]
    pub tp: u32,
    /// With `tp > 1`: sequence parallelism too.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sequence_parallel: bool,
    /// Context-parallel degree (`passes/context_parallel.rs`): each group of `cp` ranks (next
    /// to the tensor-parallel ones) splits every sequence; 0 or 1 when the job has none.
    #[serde(skip_serializing_if = "is_untouched")]
    pub cp: u32,
    /// The ZeRO stage of `passes/shard.rs` (1–3); 0 when the job is not sharded by that pass (a
    /// trace's recorded reduce-scatters and all-gathers leave it 0). Stage 1 reduce-scatters
    /// gradients it keeps whole, so the gradients' collectives alone do not tell it from stage 2.
    #[serde(skip_serializing_if = "is_zero")]
    pub shard_stage: u32,
    /// The optimizer state and step are on the host CPU (`shard:offload=1`).
    pub offload: bool,
    /// Micro-steps per iteration (`passes/grad_accumulation.rs`); 0 or 1 when the job has no
    /// gradient accumulation.
    #[serde(skip_serializing_if = "is_untouched")]
    pub accumulation: u32,
    /// Pipeline parallelism (`passes/pipeline.rs`): the local graph is one micro-batch of the
    /// whole model replica, cut into stages by `graph/pipeline.rs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Pipeline>,
}

/// Order of the forward and backward micro-steps on each stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Every forward, then every backward (GPipe; `torch.distributed.pipelining.ScheduleGPipe`).
    Gpipe,
    /// One forward, one backward (PipeDream-Flush; Megatron-LM's default, `Schedule1F1B`).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// 1F1B over `virtual` model chunks per rank (Narayanan et al. 2021 §2.2.2; Megatron-LM's
    /// `--num-layers-per-virtual-pipeline-stage`, `ScheduleInterleaved1F1B`).
    Interleaved,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
        }
    }
}

/// A job's pipeline: stages (ranks per model replica along the pipeline), micro-batches per
/// iteration, schedule, model chunks per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Pipeline {
    pub stages: u32,
    pub microbatches: u32,
    pub schedule: Schedule,
    /// Model chunks per rank (`virtual`): 1, or more with the interleaved schedule; chunk `c`
    /// of the `stages × virtual` runs on rank `c mod stages`.
    #[serde(rename = "virtual")]
    pub chunks_per_rank: u32,
}

impl Pipeline {
    /// Model chunks in all: the cut's pieces.
    pub fn chunks(&self) -> u32 {
        self.stages * self.chunks_per_rank.max(1)
    }
}

fn is_untouched(tp: &u32) -> bool {
    *tp <= 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a recorded trace says about the job it profiled, in one place: filled by the trace
/// importers (`src/trace/facts.rs`), printed by `replay`, `whatif` and `plan` and written in
/// their `--json` as `trace_facts`, and used for the planner's baselines (one GPU: no
/// data-parallel baselines; several: the recorded synchronisation, "as recorded").
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct TraceFacts {
    /// Samples per rank per step, from the input's shape (`None`: the trace has no `Input Dims`;
    /// record with `record_shapes=True`).
    pub batch: Option<u32>,
    /// The recorded step's span (`ProfilerStep#N`, or between optimizer steps), ns.
    pub measured_step_ns: Option<u64>,
    /// Where the batch was read (`aten::convolution input [32, 3, 224, 224]`).
    pub batch_from: Option<String>,
    /// The GPU's `deviceProperties` name, as recorded.
    pub gpu: Option<String>,
    /// The built-in GPU config (`configs/gpus`) the trace's kernels are re-costed against.
    pub gpu_config: String,
    /// Whether `gpu` is the model `gpu_config` describes (false: its nearest built-in config).
    pub gpu_config_exact: bool,
    /// `totalGlobalMem` and `numSms` of the GPU, as recorded.
    pub gpu_memory_bytes: Option<u64>,
    pub gpu_sms: Option<u32>,
    /// This trace's rank and the job's world size (`distributedInfo`); the ranks given.
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub ranks_given: u32,
    /// `distributedInfo.backend` (`nccl`).
    pub backend: Option<String>,
    /// The storage precision of the matrix ops' inputs (`fp32`, `fp16`, `bf16`): `fp16`/`bf16`
    /// means the job already ran mixed precision.
    pub precision: Option<String>,
    /// The optimizer, from `Optimizer.step#SGD.step`-style annotations (`SGD`, `Adam`, …).
    pub optimizer: Option<String>,
    /// The optimizer is already a fused one: the step runs `aten::_fused_adam_` /
    /// `_fused_adamw_` (`torch.optim.Adam(fused=True)`) or apex's `FusedAdam`.
    pub optimizer_fused: bool,
    /// The step's collective kernels by kind (`AllReduce` → 5).
    pub collectives: std::collections::BTreeMap<String, u32>,
    /// The gradient buckets the framework used, from the NCCL kernels' sizes.
    pub bucketing: Option<Bucketing>,
    /// The recorded sharding (FSDP2's units, resharding and collectives), when the step ran
    /// FSDP2's hooks (`src/trace/fsdp.rs`).
    pub sharding: Option<TraceSharding>,
    /// Device memory the trace recorded (`profile_memory=True`), or estimated from shapes.
    pub memory: Option<MemoryFacts>,
    /// How the step's GPU time can be re-costed by a pass.
    pub work: WorkCoverage,
    /// The step's gradient all-reduces as issued, in stream order (their ops in
    /// `LocalGraph::calls`); not in the JSON (`collectives` and `bucketing` say it there).
    #[serde(skip)]
    pub recorded_syncs: Vec<RecordedSync>,
    /// The link and ranks a re-bucketed all-reduce is priced on: the GPU's own NVLink (or
    /// xGMI) over the recorded world size, or `--cluster`'s ring when the rank is extrapolated.
    #[serde(skip)]
    pub sync_link: Option<SyncLink>,
    /// Recorded collectives an edit removed (`shard` on a recorded FSDP2 step drops the
    /// backward all-gathers), as (device, position among that device's recorded collectives):
    /// how the ranks of one job find their remaining collectives again
    /// (`trace::multi::with_job`).
    #[serde(skip)]
    pub removed_collectives: Vec<(crate::graph::DeviceId, u32)>,
}

/// A recorded step's sharding, read from FSDP2's hook annotations and the step's collectives.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct TraceSharding {
    /// `FSDP2 (fully_shard)`.
    pub framework: String,
    /// The modules `fully_shard` wrapped whose hooks ran, in forward order; `""` is the root.
    pub units: Vec<String>,
    /// The units all-gathered again in the backward (`reshard_after_forward=True`).
    pub resharded: Vec<String>,
    /// Per unit (as `units`), the bytes its all-gather outputs: its parameters as the compute
    /// holds them (0 when its kernel does not record a size).
    pub unit_bytes: Vec<u64>,
    /// The step's all-gather and reduce-scatter kernels.
    pub all_gathers: u32,
    pub reduce_scatters: u32,
    /// Bytes gathered (each all-gather's output) and reduce-scattered (each input), from the
    /// kernels' message sizes; `None` when a kernel does not record its size.
    pub all_gather_bytes: Option<u64>,
    pub reduce_scatter_bytes: Option<u64>,
}

impl TraceSharding {
    /// Unit `i` as reports name it: `root` for the root, else its module path with control
    /// characters escaped (the name comes from the trace: a newline must not start a line).
    pub fn unit_label(&self, i: usize) -> String {
        match self.units.get(i).map(String::as_str) {
            None | Some("") => "root".to_string(),
            Some(u) => u
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect(),
        }
    }

    /// Every unit's [`TraceSharding::unit_label`], comma-separated.
    pub fn unit_labels(&self, units: impl Iterator<Item = usize>) -> String {
        units
            .map(|i| self.unit_label(i))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One gradient all-reduce of a recorded step, as the framework issued it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedSync {
    /// Position among the step's collective kernels (stream order): all-reduces whose
    /// positions follow each other had no other collective between them.
    pub position: u32,
    /// The kernel's name.
    pub kernel: String,
    /// Bytes reduced, from the kernel's args (`In msg nelems` × dtype), when it has them.
    pub bytes: Option<u64>,
}

/// Where re-bucketed all-reduces of a recorded step are priced.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncLink {
    /// The network config (`nvlink-v100`) or cluster (`64xh100-ib`) the link comes from.
    pub name: String,
    pub link: crate::cost::comm::AlphaBeta,
    /// Ranks in the ring.
    pub ranks: u32,
}

/// Gradient all-reduces of a step, read from the NCCL kernels (`In msg nelems` × dtype).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Bucketing {
    /// Bytes of each gradient all-reduce in issue order (backward: last layers first).
    pub sizes_bytes: Vec<u64>,
    pub total_bytes: u64,
    /// The bucket cap the sizes imply (DDP closes a bucket once it reaches the cap, so every
    /// bucket but the first and the last holds at least the cap): whole MiB, `None` with fewer
    /// than three buckets.
    pub cap_bytes: Option<u64>,
    /// Where the sizes come from (`kernel args`, `host execution trace`).
    pub source: String,
}

/// Device memory of the recorded step.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct MemoryFacts {
    /// `profile_memory` events (`[memory]`), or `shapes` (an estimate from `Input Dims`).
    pub source: String,
    /// Allocated bytes at the step's highest point (the events' own running total).
    pub peak_bytes: u64,
    /// Allocated when the step starts.
    pub at_start_bytes: u64,
    /// `Total Reserved` at its highest, when the events carry it.
    pub reserved_peak_bytes: Option<u64>,
    /// Device memory events in the step.
    pub events: u64,
    /// False when the events carry only `Bytes` (2021 traces): the running total then starts at
    /// the profiler's start, and memory allocated before it (weights, optimizer state) is not in
    /// it.
    pub absolute: bool,
}

/// The step's GPU kernel time by how a pass can re-cost it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkCoverage {
    /// Kernels of an operator with recorded shapes: FLOPs and bytes from the shapes.
    pub shapes_ns: u64,
    /// Kernels classed by their name only (GEMM, convolution, element-wise, …): work sized to
    /// the recorded time at the class's efficiency; wider uncertainty.
    pub names_ns: u64,
    /// Kernels with no work (re-costed by duration rules).
    pub none_ns: u64,
}

/// A data-parallel job: `workers` copies of `local` joined by `syncs` over `comm`.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub local: std::sync::Arc<LocalGraph>,
    pub syncs: Vec<Sync>,
    pub comm: CommSpec,
    pub workers: u32,
    /// Expand to the symmetric form (one worker standing for all; ring only).
    pub symmetric: bool,
    pub gpu: GpuSpec,
    /// Storage dtype of activations, weights and gradients (FP32, or fp16/bf16 under AMP).
    pub dtype: Dtype,
    /// Dtypes of the matrix math while `dtype` is FP32 (TF32 per class, by framework default or
    /// `--precision`).
    pub math: Math,
    /// The framework the job runs on (`--framework`).
    pub framework: Framework,
    /// How its kernels are issued (eager, or a compiled graph).
    pub exec: Exec,
    /// The host's constants (CPU time to issue each operator).
    pub host: std::sync::Arc<HostSpec>,
    /// The allocator and runtime constants of the framework (reserved and device-used memory).
    pub memory: std::sync::Arc<crate::cost::memory::MemorySpec>,
    pub meta: JobMeta,
}

/// Why a job could not be expanded or edited.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobError {
    #[error("the symmetric form needs ring all-reduce")]
    SymmetricNeedsRing,
    #[error(
        "{workers} workers would need about {ops} ops in the fine-grained graph (limit {limit}); use the symmetric form or fewer workers"
    )]
    TooLarge { workers: u32, ops: u64, limit: u64 },
    #[error("the edit would leave no compute op")]
    Empty,
    #[error("the edit names op {0}, which does not exist or was removed")]
    NoSuchOp(OpId),
    #[error("the edit names synchronisation {0}, which does not exist")]
    NoSuchSync(usize),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Most ops an expanded (non-symmetric) graph may have: ~60 bytes of arrays per op.
pub const MAX_OPS: u64 = 200_000_000;

impl Job {
    /// The worker graph, to change: copied first when another job shares it (jobs share their
    /// graph until one of them is edited, so cloning a job is cheap).
    pub fn local_mut(&mut self) -> &mut LocalGraph {
        std::sync::Arc::make_mut(&mut self.local)
    }

    /// The optimizer the job steps with and whether it is already fused: a zoo model's
    /// declared one, or what a trace's annotations say; `None` when nothing says (a trace
    /// without `Optimizer.step#…` annotations).
    pub fn optimizer(&self) -> Option<(&str, bool)> {
        if let Some(o) = &self.meta.optimizer {
            return Some((o.as_str(), false));
        }
        let f = self.meta.trace.as_deref()?;
        f.optimizer.as_deref().map(|o| (o, f.optimizer_fused))
    }

    /// NCCL communicators a rank of this job holds: one for data parallelism over several
    /// workers (the recorded world size for a trace), none alone; one more for its
    /// tensor-parallel group, one for its context-parallel ring.
    pub fn communicators(&self) -> u32 {
        let world = self
            .meta
            .trace
            .as_deref()
            .and_then(|t| t.world_size)
            .unwrap_or(self.workers);
        let tp = self.meta.tp.max(1);
        u32::from(world / tp > 1) + u32::from(tp > 1) + u32::from(self.meta.cp > 1)
    }

    /// The roofline of this job's GPU in `dtype` (plain ceilings, for memory-traffic estimates).
    pub fn roofline(&self, dtype: Dtype) -> Roofline {
        Roofline::new(&self.gpu, dtype, Efficiency::default())
    }

    /// The GPU's dense matrix peak, FLOP/ns, in the dtype this job's GEMMs run in (its storage
    /// dtype under AMP, TF32 or FP32 per [`Job::math`] otherwise): MFU's denominator.
    pub fn matrix_peak_flops_per_ns(&self) -> f64 {
        let gemm = OpWork::new(crate::cost::kernel::OpClass::Gemm, 1.0, 0.0, 0.0, 1);
        self.gpu
            .matrix_flops_per_ns(KernelModel::math_dtype(&gemm, self.dtype, self.math))
    }

    /// The kernel cost model of this job's GPU.
    pub fn kernels(&self) -> KernelModel<'_> {
        KernelModel::new(&self.gpu)
    }

    /// Modelled GPU duration of `work` stored in `dtype` with the batch scaled by
    /// `batch_scale` (matrix math per [`Job::math`] while `dtype` is FP32).
    pub fn cost_ns(&self, work: &OpWork, dtype: Dtype, batch_scale: f64) -> u64 {
        let w = if batch_scale == 1.0 {
            *work
        } else {
            work.scaled(batch_scale)
        };
        ns(self.kernels().time_ns(&w, dtype, self.math))
    }

    /// Whether op durations were recorded (a trace) rather than modelled (the zoo).
    pub fn is_recorded(&self) -> bool {
        self.meta.source == "trace"
    }

    /// The optimizer step's GPU kernels that do work (an offloaded step leaves none), in the
    /// order the host issues them.
    pub fn step_kernels(&self) -> Vec<OpId> {
        self.step_kernel_ids().collect()
    }

    fn step_kernel_ids(&self) -> impl Iterator<Item = OpId> + '_ {
        let l = &self.local;
        (0..l.ops.len() as OpId).filter(move |&o| {
            let op = &l.ops[o as usize];
            op.spec.phase == Phase::Update
                && op.spec.kind == OpKind::Compute
                && op.work.is_some()
                && matches!(
                    l.devices.get(op.spec.device as usize),
                    Some(DeviceKind::GpuStream { .. })
                )
        })
    }

    /// Bytes of FP32 gradients a rank's optimizer step materialises beside the model's own
    /// when the model is kept in half precision ([`Math::pure_half`]): 4 B for every parameter
    /// element the rank's step updates (its shard when sharded), live from the first update
    /// kernel to the last. DeepSpeed's fp16/bf16 optimizers convert the rank's half gradients
    /// into one FP32 flat partition before `step()` and drop it after (ZeRO stages 0-2:
    /// `stage_1_and_2.py`, `single_grad_partition = flatten(averaged_gradients).to(fp32)`;
    /// stage 3: `_prepare_fp32_grad_for_sub_group`, per sub-group of `sub_group_size`
    /// elements, which Lightning's DeepSpeed strategy sets to 1e12, one group); Megatron-LM's
    /// `--fp16` optimizer copies each half gradient into its FP32 main parameter's `.grad`
    /// (`Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads`), freed by the next
    /// `zero_grad`, before the forward; apex O2 likewise. Megatron-LM's bf16 models accumulate
    /// in FP32 already ([`Framework::keeps_fp32_grads`]), autocast keeps FP32 gradients, an
    /// offloaded step runs on the host, and a trace's memory is recorded: 0 for those.
    pub fn master_grad_bytes(&self) -> u64 {
        let half = matches!(self.dtype, Dtype::Fp16 | Dtype::Bf16 | Dtype::Fp8);
        if self.is_recorded()
            || !self.math.pure_half
            || !half
            || self.framework.keeps_fp32_grads(self.dtype)
            || self.step_kernel_ids().next().is_none()
        {
            return 0;
        }
        // The zoo's tensors keep their FP32 bytes (the master weights'); ZeRO shards the master
        // weights over the parameter all-gather's group (Rajbhandari et al. §5).
        let fp32: u64 = self.local.tensors.iter().map(|t| t.bytes).sum();
        let shards = self
            .syncs
            .iter()
            .find(|s| s.kind == CollectiveKind::AllGather)
            .map_or(1, |s| {
                if s.group.size == 0 {
                    self.workers
                } else {
                    s.group.size
                }
            })
            .max(1);
        fp32.div_ceil(u64::from(shards))
    }

    /// [`Job::master_grad_bytes`] as the worker graph's memory effects: allocated when the
    /// first of `kernels` starts, freed when the last ends (they run in issue order on one
    /// stream). Empty when there is nothing to hold.
    pub fn master_grad_effects(kernels: &[OpId], bytes: u64) -> Vec<MemEffect> {
        match (kernels.first(), kernels.last()) {
            (Some(&first), Some(&last)) if bytes > 0 => vec![
                MemEffect {
                    op: first,
                    worker: 0,
                    bytes,
                    when: MemWhen::AllocAtStart,
                },
                MemEffect {
                    op: last,
                    worker: 0,
                    bytes,
                    when: MemWhen::FreeAtEnd,
                },
            ],
            _ => Vec::new(),
        }
    }

    /// New duration of an op that now lasts `dur_ns` and computes `work` in the job's dtype,
    /// once its work runs in `dtype` at `batch_scale` times its batch. A recorded op (a trace
    /// kernel) is re-costed relative to itself, `dur × model(new) / model(old)`, so the
    /// efficiency the trace measured is kept; a modelled op (the zoo) takes the model's time,
    /// [`Job::cost_ns`].
    pub fn recost_ns(&self, dur_ns: u64, work: &OpWork, dtype: Dtype, batch_scale: f64) -> u64 {
        if !self.is_recorded() {
            return self.cost_ns(work, dtype, batch_scale);
        }
        let m = self.kernels();
        let new = if batch_scale == 1.0 {
            *work
        } else {
            work.scaled(batch_scale)
        };
        let before = m.time_ns(work, self.dtype, self.math);
        let after = m.time_ns(&new, dtype, self.math);
        if !(before > 0.0 && after.is_finite()) {
            return dur_ns;
        }
        ns(dur_ns as f64 * after / before)
    }

    /// The CPU time of the `Launch` op that issues `op` (its host side), if it has one.
    pub fn launch_ns_of(&self, op: OpId) -> Option<u64> {
        self.local
            .edges
            .iter()
            .filter(|&&(_, b)| b == op)
            .map(|&(a, _)| &self.local.ops[a as usize].spec)
            .find(|s| s.kind == OpKind::Launch)
            .map(|s| s.dur_ns)
    }

    /// Workers whose ops the expanded graph holds.
    pub fn graph_workers(&self) -> u32 {
        if self.symmetric { 1 } else { self.workers }
    }

    /// The global DFG of one iteration of a job without a pipeline: the template replicated
    /// per worker (or once, in the symmetric form) and every sync wired through its topology.
    /// [`Job::expand`] (in `pipeline.rs`) calls it, or expands a pipelined job's stages.
    pub fn expand_data_parallel(&self) -> Result<Dfg, JobError> {
        let n = self.workers;
        if self.symmetric && self.comm.scheme != crate::cost::config::SyncScheme::Ring {
            return Err(JobError::SymmetricNeedsRing);
        }
        let gw = self.graph_workers();
        let l = &self.local;
        let mut b = DfgBuilder::new();
        for t in &l.tensors {
            b.add_tensor(t.clone());
        }
        for name in &l.layers {
            b.add_layer(name.clone());
        }
        let virt = b.add_device(DeviceKind::Virtual);
        // Local device d of worker w → global device.
        let mut dev_map: Vec<Vec<u32>> = Vec::with_capacity(gw as usize);
        for w in 0..gw {
            dev_map.push(b.add_worker_devices(&l.devices, w, virt));
        }
        let streams: Vec<u32> = (0..gw)
            .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
            .collect();
        let mut topo = if self.symmetric {
            CommTopology::symmetric_ring(&mut b, &self.comm, n, streams[0])
        } else {
            CommTopology::new(&mut b, &self.comm, streams)
        };
        let pieces: u64 = self.syncs.iter().map(|s| s.partitions.max(1) as u64).sum();
        let total = gw as u64 * (l.ops.len() as u64 + 2 * self.syncs.len() as u64)
            + pieces * topo.ops_per_tensor() as u64;
        if total > MAX_OPS {
            return Err(JobError::TooLarge {
                workers: n,
                ops: total,
                limit: MAX_OPS,
            });
        }
        b.reserve(total as usize, total as usize * 2);
        b.set_workers(gw);
        if self.symmetric {
            b.set_represents(n);
        }
        // Recorded durations already contain the contention their run had.
        if n > 1 && !self.is_recorded() {
            b.set_contention_ppm((self.gpu.kernels.overlap_slowdown * 1e6).round() as u32);
        }
        let per = l.ops.len() as u32;
        let master = match self.master_grad_bytes() {
            0 => Vec::new(),
            bytes => Self::master_grad_effects(&self.step_kernels(), bytes),
        };
        for w in 0..gw {
            b.set_static_memory(w, l.static_mem_bytes);
            for op in &l.ops {
                let mut s = op.spec.clone();
                s.device = dev_map[w as usize][s.device as usize];
                b.add_op(s);
            }
            let base = w * per;
            for &(a, c) in &l.edges {
                b.add_edge(base + a, base + c);
            }
            for m in l.mem.iter().chain(&master) {
                b.add_mem(MemEffect {
                    op: base + m.op,
                    worker: w,
                    ..*m
                });
            }
        }
        for s in &self.syncs {
            let tensor = s.tensors.first().copied().unwrap_or(NONE);
            let join = |b: &mut DfgBuilder, ops: &[OpId], kind: OpKind, w: u32| -> OpId {
                match ops {
                    [one] => w * per + one,
                    _ => b.add_op(OpSpec {
                        tensor,
                        ..OpSpec::new(kind, Phase::Comm, virt, 0)
                    }),
                }
            };
            let mut ready = Vec::with_capacity(gw as usize);
            let mut done = Vec::with_capacity(gw as usize);
            for w in 0..gw {
                let r = join(&mut b, &s.ready, OpKind::Out, w);
                if s.ready.len() != 1 {
                    for &o in &s.ready {
                        b.add_edge(w * per + o, r);
                    }
                }
                let d = join(&mut b, &s.done, OpKind::In, w);
                if s.done.len() != 1 {
                    for &o in &s.done {
                        b.add_edge(d, w * per + o);
                    }
                }
                ready.push(r);
                done.push(d);
            }
            topo.set_priority(
                s.ready
                    .iter()
                    .map(|&r| l.ops[r as usize].spec.priority)
                    .min()
                    .unwrap_or(0),
            );
            let k = s.partitions.max(1) as u64;
            let piece = s.bytes.div_ceil(k);
            for _ in 0..k {
                topo.collective(&mut b, s.kind, s.group, tensor, piece, &ready, &done);
            }
        }
        Ok(b.build()?)
    }

    /// Start an edit of this job.
    pub fn edit(&self) -> Editor {
        Editor {
            job: self.clone(),
            alive: vec![true; self.local.ops.len()],
        }
    }

    /// Local ops that are compute ops (not virtual, not communication).
    pub fn compute_ops(&self) -> impl Iterator<Item = OpId> + '_ {
        self.local
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| o.spec.kind == OpKind::Compute)
            .map(|(i, _)| i as OpId)
    }

    /// Which local ops depend on any of `from` (through local edges; `from` included).
    pub fn reachable_from(&self, from: &[OpId]) -> Vec<bool> {
        let succ = self.local_succs();
        let mut seen = vec![false; self.local.ops.len()];
        let mut stack: Vec<OpId> = from.to_vec();
        while let Some(o) = stack.pop() {
            if std::mem::replace(&mut seen[o as usize], true) {
                continue;
            }
            stack.extend(succ[o as usize].iter().copied());
        }
        seen
    }

    /// Successor lists of the local graph (built on demand; small).
    pub fn local_succs(&self) -> Vec<Vec<OpId>> {
        let mut s = vec![Vec::new(); self.local.ops.len()];
        for &(a, b) in &self.local.edges {
            s[a as usize].push(b);
        }
        s
    }
}

/// An edit in progress: Daydream's primitives over stable op ids. See the module docs.
#[derive(Clone, Debug)]
pub struct Editor {
    job: Job,
    alive: Vec<bool>,
}

impl Editor {
    /// The job as edited so far (tombstoned ops still listed).
    pub fn job(&self) -> &Job {
        &self.job
    }

    fn check(&self, op: OpId) -> Result<(), JobError> {
        match self.alive.get(op as usize) {
            Some(true) => Ok(()),
            _ => Err(JobError::NoSuchOp(op)),
        }
    }

    /// Multiply durations by `factor` (shrink below 1, stretch above).
    pub fn scale(&mut self, ops: &[OpId], factor: f64) -> Result<(), JobError> {
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(JobError::Invalid(format!(
                "scale factor must be finite and ≥ 0, got {factor}"
            )));
        }
        for &o in ops {
            self.check(o)?;
            let s = &mut self.job.local_mut().ops[o as usize].spec;
            if !s.kind.is_virtual() {
                s.dur_ns = ns(s.dur_ns as f64 * factor);
            }
        }
        Ok(())
    }

    /// Set one op's duration.
    pub fn set_duration(&mut self, op: OpId, dur_ns: u64) -> Result<(), JobError> {
        self.check(op)?;
        let s = &mut self.job.local_mut().ops[op as usize].spec;
        if !s.kind.is_virtual() {
            s.dur_ns = dur_ns;
        }
        Ok(())
    }

    /// Remove ops; their predecessors are connected to their successors so that the order they
    /// imposed survives. Their memory effects go with them.
    pub fn remove(&mut self, ops: &[OpId]) -> Result<(), JobError> {
        for &o in ops {
            self.check(o)?;
        }
        if ops.is_empty() {
            return Ok(());
        }
        let gone: std::collections::BTreeSet<OpId> = ops.iter().copied().collect();
        if gone.len() != ops.len() {
            // Named twice: the second time it is already removed.
            let mut seen = std::collections::BTreeSet::new();
            let dup = ops.iter().find(|o| !seen.insert(**o)).copied();
            return Err(JobError::NoSuchOp(dup.unwrap_or(ops[0])));
        }
        // Neighbour sets built once for the whole removal (issue 28: re-scanning and
        // re-sorting every edge per removed op was 17 % of a plan's time). Ops are removed in
        // the order given, each bridging its remaining predecessors to its remaining
        // successors, exactly as one removal at a time would.
        use std::collections::{BTreeMap, BTreeSet};
        let mut pred: BTreeMap<OpId, BTreeSet<OpId>> = BTreeMap::new();
        let mut succ: BTreeMap<OpId, BTreeSet<OpId>> = BTreeMap::new();
        for &(a, b) in &self.job.local.edges {
            if gone.contains(&a) || gone.contains(&b) {
                succ.entry(a).or_default().insert(b);
                pred.entry(b).or_default().insert(a);
            }
        }
        let mut bridges: BTreeSet<(OpId, OpId)> = BTreeSet::new();
        let mut bridged = false;
        for &o in ops {
            let ps = pred.remove(&o).unwrap_or_default();
            let ss = succ.remove(&o).unwrap_or_default();
            for &p in &ps {
                if let Some(v) = succ.get_mut(&p) {
                    v.remove(&o);
                }
                bridges.remove(&(p, o));
            }
            for &s in &ss {
                if let Some(v) = pred.get_mut(&s) {
                    v.remove(&o);
                }
                bridges.remove(&(o, s));
            }
            if !ps.is_empty() && !ss.is_empty() {
                bridged = true;
                for &p in &ps {
                    for &s in &ss {
                        bridges.insert((p, s));
                        // A bridge to or from an op removed later is that op's edge now.
                        if gone.contains(&p) || gone.contains(&s) {
                            succ.entry(p).or_default().insert(s);
                            pred.entry(s).or_default().insert(p);
                        }
                    }
                }
            }
            self.alive[o as usize] = false;
        }
        let edges = &mut self.job.local_mut().edges;
        edges.retain(|e| !gone.contains(&e.0) && !gone.contains(&e.1));
        edges.extend(
            bridges
                .into_iter()
                .filter(|(a, b)| !gone.contains(a) && !gone.contains(b)),
        );
        if bridged {
            // As one removal at a time left it: sorted, without repeats.
            edges.sort_unstable();
            edges.dedup();
        }
        self.job.local_mut().mem.retain(|m| !gone.contains(&m.op));
        Ok(())
    }

    /// Insert an op after `after` and before `before`; returns its id. With `launch_ns`, a GPU
    /// task brings its CPU launch: a `Launch` op on the host thread that issues `before` (the
    /// worker's first CPU thread, created if the graph has none). The launch keeps the host's
    /// program order: it follows the launches of `after` (or `after` themselves when they have
    /// none) and precedes the launches of `before`, so the host never waits for the GPU.
    pub fn insert(
        &mut self,
        spec: OpSpec,
        work: Option<OpWork>,
        after: &[OpId],
        before: &[OpId],
        launch_ns: Option<u64>,
    ) -> Result<OpId, JobError> {
        for &o in after.iter().chain(before) {
            self.check(o)?;
        }
        if spec.device as usize >= self.job.local.devices.len() {
            return Err(JobError::Invalid(format!(
                "inserted op names device {}, the worker has {}",
                spec.device,
                self.job.local.devices.len()
            )));
        }
        let id = self.push(LocalOp { spec, work });
        for &a in after {
            self.job.local_mut().edges.push((a, id));
        }
        for &c in before {
            self.job.local_mut().edges.push((id, c));
        }
        if let Some(l) = launch_ns {
            let launch_of = |ed: &Self, op: OpId| -> Option<OpId> {
                ed.job
                    .local
                    .edges
                    .iter()
                    .filter(|&&(a, b)| b == op && ed.alive[a as usize])
                    .map(|&(a, _)| a)
                    .find(|&a| ed.job.local.ops[a as usize].spec.kind == OpKind::Launch)
            };
            let before_launches: Vec<OpId> =
                before.iter().filter_map(|&b| launch_of(self, b)).collect();
            let cpu = match before_launches.first() {
                Some(&b) => self.job.local.ops[b as usize].spec.device,
                None => self.cpu_thread(),
            };
            // A virtual op (a gradient's `Out`) is anchored on the host by the launches of the
            // ops it waits for: an autograd hook runs when the producing op is issued.
            let mut after_launches: Vec<OpId> = Vec::new();
            for &a in after {
                match launch_of(self, a) {
                    Some(l) => after_launches.push(l),
                    None if self.job.local.ops[a as usize].spec.kind.is_virtual() => {
                        let preds: Vec<OpId> = self
                            .job
                            .local
                            .edges
                            .iter()
                            .filter(|&&(p, b)| b == a && self.alive[p as usize])
                            .map(|&(p, _)| p)
                            .collect();
                        for p in preds {
                            after_launches.push(launch_of(self, p).unwrap_or(p));
                        }
                    }
                    None => after_launches.push(a),
                }
            }
            after_launches.sort_unstable();
            after_launches.dedup();
            let launch = self.push(LocalOp {
                spec: OpSpec {
                    layer: self.job.local.ops[id as usize].spec.layer,
                    ..OpSpec::new(
                        OpKind::Launch,
                        self.job.local.ops[id as usize].spec.phase,
                        cpu,
                        l,
                    )
                },
                work: None,
            });
            for a in after_launches {
                self.job.local_mut().edges.push((a, launch));
            }
            for b in before_launches {
                self.job.local_mut().edges.push((launch, b));
            }
            self.job.local_mut().edges.push((launch, id));
        }
        Ok(id)
    }

    /// The CPU time of the `Launch` op that issues `op`, if it has one.
    pub fn launch_ns_of(&self, op: OpId) -> Option<u64> {
        self.job.launch_ns_of(op)
    }

    fn push(&mut self, op: LocalOp) -> OpId {
        self.job.local_mut().ops.push(op);
        self.alive.push(true);
        (self.job.local.ops.len() - 1) as OpId
    }

    fn cpu_thread(&mut self) -> u32 {
        let devs = &mut self.job.local_mut().devices;
        if let Some(i) = devs
            .iter()
            .position(|d| matches!(d, DeviceKind::CpuThread { .. }))
        {
            return i as u32;
        }
        devs.push(DeviceKind::CpuThread {
            worker: 0,
            thread: 0,
        });
        (devs.len() - 1) as u32
    }

    /// Merge `ops` into the first of them, which takes `dur_ns`; edges and memory effects move to
    /// it, edges between the merged ops disappear. Whether the merge is legal (no cycle) is
    /// checked by [`Editor::finish`]; passes check it before proposing.
    pub fn merge(&mut self, ops: &[OpId], dur_ns: u64) -> Result<OpId, JobError> {
        let Some(&keep) = ops.first() else {
            return Err(JobError::Invalid("merge of no ops".into()));
        };
        for &o in ops {
            self.check(o)?;
        }
        let gone: Vec<OpId> = ops[1..].to_vec();
        for e in self.job.local_mut().edges.iter_mut() {
            if gone.contains(&e.0) {
                e.0 = keep;
            }
            if gone.contains(&e.1) {
                e.1 = keep;
            }
        }
        self.job.local_mut().edges.retain(|e| e.0 != e.1);
        for m in self.job.local_mut().mem.iter_mut() {
            if gone.contains(&m.op) {
                m.op = keep;
            }
        }
        // A fused kernel never materialises its members' intermediate buffers: of their
        // transient (`During`) buffers only the largest remains.
        let largest = self
            .job
            .local
            .mem
            .iter()
            .filter(|m| m.op == keep && m.when == MemWhen::During)
            .map(|m| m.bytes)
            .max();
        if let Some(b) = largest {
            let mut kept = false;
            self.job.local_mut().mem.retain(|m| {
                if m.op != keep || m.when != MemWhen::During {
                    return true;
                }
                if !kept && m.bytes == b {
                    kept = true;
                    return true;
                }
                false
            });
        }
        for s in self.job.syncs.iter_mut() {
            for r in s.ready.iter_mut().chain(s.done.iter_mut()) {
                if gone.contains(r) {
                    *r = keep;
                }
            }
        }
        let merged_work = ops
            .iter()
            .filter_map(|&o| self.job.local.ops[o as usize].work)
            .reduce(|a, b| a.merged(&b));
        let members: Vec<String> = ops
            .iter()
            .flat_map(|&o| self.job.local.members(o))
            .collect();
        for &o in ops {
            self.job.local_mut().fused.remove(&o);
        }
        self.job.local_mut().fused.insert(keep, members);
        let k = &mut self.job.local_mut().ops[keep as usize];
        k.spec.dur_ns = dur_ns;
        k.work = merged_work;
        for &o in &gone {
            self.alive[o as usize] = false;
        }
        Ok(keep)
    }

    /// `to` waits for `from`.
    pub fn add_edge(&mut self, from: OpId, to: OpId) -> Result<(), JobError> {
        self.check(from)?;
        self.check(to)?;
        self.job.local_mut().edges.push((from, to));
        Ok(())
    }

    /// `to` no longer waits for `from` (every copy of the edge goes).
    pub fn drop_edge(&mut self, from: OpId, to: OpId) -> Result<(), JobError> {
        self.check(from)?;
        self.check(to)?;
        self.job.local_mut().edges.retain(|&e| e != (from, to));
        Ok(())
    }

    /// Scheduling priority (lower runs first among ready ops on a device; P3-style).
    pub fn set_priority(&mut self, ops: &[OpId], priority: i32) -> Result<(), JobError> {
        for &o in ops {
            self.check(o)?;
            self.job.local_mut().ops[o as usize].spec.priority = priority;
        }
        Ok(())
    }

    /// Direct access for edits the primitives do not cover (memory, syncs, static memory).
    pub fn job_mut(&mut self) -> &mut Job {
        &mut self.job
    }

    /// Whether an op is still alive in the edit.
    pub fn is_alive(&self, op: OpId) -> bool {
        self.alive.get(op as usize).copied().unwrap_or(false)
    }

    /// Compact tombstones, drop duplicate edges, and check the result expands to a valid graph
    /// (acyclic, not empty). Errors leave the original job untouched (it was cloned).
    pub fn finish(self) -> Result<Job, JobError> {
        let Editor { mut job, alive } = self;
        // No op removed and the edges sorted, without repeats or self-loops: compacting would
        // change nothing, and the worker graph stays shared with the job it came from (an edit
        // of the syncs alone copies no graph).
        let untouched = alive.iter().all(|&a| a)
            && job.local.edges.windows(2).all(|w| w[0] < w[1])
            && job.local.edges.iter().all(|e| e.0 != e.1);
        if !untouched {
            compact(&mut job, &alive)?;
        } else if !job.local.ops.iter().any(|o| o.spec.kind == OpKind::Compute) {
            return Err(JobError::Empty);
        }
        job.syncs
            .retain(|s| !s.ready.is_empty() && !s.done.is_empty());
        // A cycle shows up when the one-worker graph is frozen.
        job.check_local()?;
        Ok(job)
    }
}

impl Job {
    /// Whether [`Job::local_dfg`] would succeed, without building it (the check every edit
    /// ends with): ops on existing devices, virtual ops without duration, edges between
    /// existing ops, no cycle. A failure builds the graph for the error, which names the op.
    pub fn check_local(&self) -> Result<(), GraphError> {
        if self.local_is_valid() {
            return Ok(());
        }
        self.local_dfg().map(|_| ())
    }

    /// [`Job::check_local`]'s test on the edge lists alone: the sync nodes `local_dfg` appends
    /// (ids from `local.ops.len()` on) with their ready → node → done edges and, except under
    /// a parameter server, each node after the one issued before it.
    fn local_is_valid(&self) -> bool {
        let l = &self.local;
        let n = l.ops.len() + self.syncs.len();
        // `local_dfg` appends the virtual device after the local ones.
        let devices = l.devices.len() + 1;
        if n >= u32::MAX as usize
            || l.ops.iter().any(|o| {
                o.spec.device as usize >= devices || o.spec.kind.is_virtual() && o.spec.dur_ns != 0
            })
        {
            return false;
        }
        let ps = self.comm.scheme == crate::cost::config::SyncScheme::Ps;
        let mut edges: Vec<(u32, u32)> = l.edges.clone();
        for (i, s) in self.syncs.iter().enumerate() {
            let node = (l.ops.len() + i) as u32;
            edges.extend(s.ready.iter().map(|&r| (r, node)));
            edges.extend(s.done.iter().map(|&d| (node, d)));
            if i > 0 && !ps {
                edges.push((node - 1, node));
            }
        }
        if edges
            .iter()
            .any(|&(a, b)| a as usize >= n || b as usize >= n)
        {
            return false;
        }
        acyclic(n, &edges)
    }

    /// The local graph frozen with one virtual op per sync appended (ids from
    /// `local.ops.len()` on), standing for the collective and its issue order: for legality
    /// checks and the cycle check after edits.
    pub fn local_dfg(&self) -> Result<Dfg, GraphError> {
        let mut b = DfgBuilder::with_capacity(self.local.ops.len(), self.local.edges.len());
        for d in &self.local.devices {
            b.add_device(*d);
        }
        for t in &self.local.tensors {
            b.add_tensor(t.clone());
        }
        for l in &self.local.layers {
            b.add_layer(l.clone());
        }
        for o in &self.local.ops {
            b.add_op(o.spec.clone());
        }
        for &(a, c) in &self.local.edges {
            b.add_edge(a, c);
        }
        // A synchronisation orders its ready ops before its done ops; with NCCL-style
        // collectives (ring, tree) each one also waits for the one issued before it. One virtual
        // node per sync stands for the collective.
        let virt = b.add_device(DeviceKind::Virtual);
        let mut prev = None;
        for s in &self.syncs {
            let node = b.add_op(OpSpec {
                tensor: s.tensors.first().copied().unwrap_or(NONE),
                ..OpSpec::new(OpKind::In, Phase::Comm, virt, 0)
            });
            for &r in &s.ready {
                b.add_edge(r, node);
            }
            for &d in &s.done {
                b.add_edge(node, d);
            }
            if let Some(p) = prev {
                b.add_edge(p, node);
            }
            if self.comm.scheme != crate::cost::config::SyncScheme::Ps {
                prev = Some(node);
            }
        }
        for m in &self.local.mem {
            b.add_mem(*m);
        }
        b.set_workers(1);
        b.set_static_memory(0, self.local.static_mem_bytes);
        b.build()
    }
}

/// Drop the ops `alive` marks removed and renumber the rest, in the graph and the syncs; sort the
/// edges without repeats or self-loops.
fn compact(job: &mut Job, alive: &[bool]) -> Result<(), JobError> {
    let mut map = vec![NONE; alive.len()];
    let l = job.local_mut();
    let mut ops = Vec::with_capacity(alive.len());
    for (i, op) in l.ops.drain(..).enumerate() {
        if alive[i] {
            map[i] = ops.len() as OpId;
            ops.push(op);
        }
    }
    if !ops.iter().any(|o| o.spec.kind == OpKind::Compute) {
        return Err(JobError::Empty);
    }
    l.ops = ops;
    l.edges = l
        .edges
        .iter()
        .filter_map(|&(a, b)| {
            let (a, b) = (map[a as usize], map[b as usize]);
            (a != NONE && b != NONE && a != b).then_some((a, b))
        })
        .collect();
    l.edges.sort_unstable();
    l.edges.dedup();
    l.fused = std::mem::take(&mut l.fused)
        .into_iter()
        .filter(|(op, _)| map[*op as usize] != NONE)
        .map(|(op, m)| (map[op as usize], m))
        .collect();
    l.calls = std::mem::take(&mut l.calls)
        .into_iter()
        .filter(|(op, _)| map[*op as usize] != NONE)
        .map(|(op, c)| (map[op as usize], c))
        .collect();
    l.fsdp = std::mem::take(&mut l.fsdp)
        .into_iter()
        .filter(|(op, _)| map[*op as usize] != NONE)
        .map(|(op, c)| (map[op as usize], c))
        .collect();
    l.mem.retain(|m| map[m.op as usize] != NONE);
    for m in l.mem.iter_mut() {
        m.op = map[m.op as usize];
    }
    for s in job.syncs.iter_mut() {
        for r in s.ready.iter_mut().chain(s.done.iter_mut()) {
            *r = map[*r as usize];
        }
        s.ready.retain(|&r| r != NONE);
        s.done.retain(|&r| r != NONE);
    }
    Ok(())
}

/// Whether the graph of `n` nodes and `edges` has no cycle (Kahn's algorithm on a compressed
/// successor list).
fn acyclic(n: usize, edges: &[(u32, u32)]) -> bool {
    let mut start = vec![0u32; n + 1];
    let mut indeg = vec![0u32; n];
    for &(a, b) in edges {
        start[a as usize + 1] += 1;
        indeg[b as usize] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut succ = vec![0u32; edges.len()];
    for &(a, b) in edges {
        succ[fill[a as usize] as usize] = b;
        fill[a as usize] += 1;
    }
    let mut stack: Vec<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
    let mut seen = 0;
    while let Some(v) = stack.pop() {
        seen += 1;
        for &w in &succ[start[v as usize] as usize..start[v as usize + 1] as usize] {
            indeg[w as usize] -= 1;
            if indeg[w as usize] == 0 {
                stack.push(w);
            }
        }
    }
    seen == n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The removal as it was (issue 28's baseline): one op at a time, bridging, re-sorting.
    fn remove_one_at_a_time(edges: &mut Vec<(OpId, OpId)>, ops: &[OpId]) {
        for &o in ops {
            let preds: Vec<OpId> = edges.iter().filter(|e| e.1 == o).map(|e| e.0).collect();
            let succs: Vec<OpId> = edges.iter().filter(|e| e.0 == o).map(|e| e.1).collect();
            edges.retain(|e| e.0 != o && e.1 != o);
            for &p in &preds {
                for &s in &succs {
                    edges.push((p, s));
                }
            }
            if !preds.is_empty() && !succs.is_empty() {
                edges.sort_unstable();
                edges.dedup();
            }
        }
    }

    /// `check_local` (edge lists only) accepts and refuses exactly what building the one-worker
    /// graph does: a real job, and the same job broken each way the build refuses.
    #[test]
    fn the_light_check_agrees_with_building_the_graph() {
        let (_, job) = crate::zoo::build::test_job("resnet50", 4, "8xv100");
        let agree = |j: &Job| {
            let built = j.local_dfg().map(|_| ());
            assert_eq!(j.local_is_valid(), built.is_ok(), "{built:?}");
            assert_eq!(j.check_local(), built);
        };
        agree(&job);
        let n = job.local.ops.len() as OpId;
        let s = &job.syncs[0];
        // A done op of the first sync made to precede one of its ready ops: a cycle through the
        // sync node.
        let mut cyc = job.clone();
        cyc.local_mut().edges.push((s.done[0], s.ready[0]));
        agree(&cyc);
        assert!(!cyc.local_is_valid());
        // Later syncs wait for earlier ones (ring): a done op of the last feeding the first.
        let mut order = job.clone();
        let last = job.syncs.last().unwrap();
        order.local_mut().edges.push((last.done[0], s.ready[0]));
        agree(&order);
        assert!(!order.local_is_valid());
        let mut range = job.clone();
        range
            .local_mut()
            .edges
            .push((0, n + job.syncs.len() as OpId));
        agree(&range);
        let mut dev = job.clone();
        dev.local_mut().ops[0].spec.device = job.local.devices.len() as crate::graph::DeviceId + 1;
        agree(&dev);
        let mut virt = job.clone();
        let first = &mut virt.local_mut().ops[0].spec;
        first.kind = OpKind::In;
        first.dur_ns = 1;
        agree(&virt);
        assert!(!virt.local_is_valid());
    }

    #[test]
    fn removing_ops_together_leaves_the_edges_one_at_a_time_would() {
        use rand::{RngExt, SeedableRng};
        let (_, job) = crate::zoo::build::test_job("resnet50", 4, "8xv100");
        let n = job.local.ops.len() as OpId;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for round in 0..40 {
            // Runs of neighbours (a launch chain) and scattered ops, in random order.
            let mut ops: Vec<OpId> = Vec::new();
            let start = rng.random_range(0..n - 20);
            ops.extend(start..start + rng.random_range(1..20));
            for _ in 0..rng.random_range(0..30) {
                let o = rng.random_range(0..n);
                if !ops.contains(&o) {
                    ops.push(o);
                }
            }
            if round % 2 == 1 {
                ops.reverse();
            }
            let mut want = job.local.edges.clone();
            remove_one_at_a_time(&mut want, &ops);
            let mut ed = job.edit();
            ed.remove(&ops).expect("live ops");
            assert_eq!(ed.job_mut().local.edges, want, "round {round}: {ops:?}");
        }
        let mut ed = job.edit();
        assert_eq!(ed.remove(&[3, 4, 3]), Err(JobError::NoSuchOp(3)));
    }
}
