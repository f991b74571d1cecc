//! Model + cluster → global DFG of one data-parallel training iteration.
//!
//! Per worker (all workers are identical):
//!
//! ```text
//! FW(l0) → FW(l1) → … → FW(loss) → BW(loss) → … → BW(l0) ─→ bw_done ─┐
//!                                      │                              ▼
//!                                      └→ Out(t) ─ SEND/RECV … ─→ In(t) ─→ UPDATE(t)
//! ```
//!
//! * one FW and one BW compute op per layer on the worker's GPU stream, following the layer DAG
//!   (BW edges reversed; a layer's BW also waits for its own FW);
//! * gradients become ready in backward order (wait-free backprop): each parameter tensor gets a
//!   virtual `Out` after its layer's BW, its synchronisation on the cluster's topology
//!   ([`CommTopology`](crate::graph::comm::CommTopology)), issued in reverse layer order, and a virtual `In` when done;
//! * one UPDATE op per parameter tensor after its `In` and after the whole backward
//!   (`optimizer.step()` follows `loss.backward()`);
//! * memory: weights, gradients and optimizer state are static; each layer's saved activations
//!   are allocated when its FW starts and freed when its BW ends.
//!
//! With [`BuildOptions::symmetric`] the graph holds one worker and the quotient ring chain
//! ([`CommTopology::symmetric_ring`](crate::graph::comm::CommTopology::symmetric_ring)) and stands for all of the cluster's workers.
//!
//! ## The pipeline
//!
//! [`job`] is a pipeline of named stages; each is a function of the previous stages' data (no
//! op ids yet) with its own test:
//!
//! 1. [`layers`]: the model's layer DAG — who reads whose output, the parameter tensors in
//!    gradient-ready order;
//! 2. [`worker_compute`]: one worker's GPU work — FW and BW per layer, UPDATE per tensor, each
//!    with its work, modelled duration and memory effects — and its static memory;
//! 3. [`host`]: the host thread's work — the micro-step's and the step's fixed cost, and one
//!    launch per GPU op in program order;
//! 4. [`comm_plan`]: what each gradient tensor synchronises (bytes, partitions) and the buffer
//!    it holds until the step ends;
//! 5. [`wire`]: the cluster — communication topology, workers, symmetric form, cost constants
//!    and the job's metadata.
//!
//! [`assemble`] then lays stages 2–4 out as the worker's [`LocalGraph`] in program order (op ids,
//! edges, memory effects) and its [`Sync`] list; `wire`'s job receives them.
//!
//! **Parallel layouts are not built here**: the zoo builds one data-parallel replica per
//! worker, and sharding (`passes/shard.rs`) and tensor parallelism
//! (`passes/tensor_parallel.rs`) are passes that edit the [`Job`] this pipeline returns, so
//! `whatif`, `plan` and the exports treat them like every other decision.

use crate::cost::compute::ns;
use crate::cost::config::{Cluster, Dtype, GpuSpec, SyncScheme};
use crate::cost::framework::{Framework, Math};
use crate::cost::host::HostSpec;
use crate::cost::kernel::{Gemm, KernelModel, OpClass};
use crate::graph::comm::CommSpec;
use crate::graph::job::{Job, JobError, JobMeta, LocalGraph, LocalOp, OpWork, Sync};
use crate::graph::{
    DeviceId, DeviceKind, Dfg, GraphError, LayerId, MemEffect, MemWhen, OpId, OpKind, OpSpec,
    Phase, Tensor, TensorId,
};

use super::{Model, Optimizer};

/// How to build the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildOptions {
    /// Storage and compute dtype of activations, weights and gradients (default FP32).
    pub dtype: Dtype,
    /// Build the symmetric (quotient) form: one worker standing for all (ring only).
    pub symmetric: bool,
    /// Matrix math dtypes while `dtype` is FP32 (default plain FP32).
    pub math: Math,
    /// The framework the job runs on (default PyTorch).
    pub framework: Framework,
    /// Host constants (default: the built-in ones of the framework's execution mode).
    pub host: Option<HostSpec>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            dtype: Dtype::Fp32,
            symmetric: false,
            math: Math::FP32,
            framework: Framework::Pytorch,
            host: None,
        }
    }
}

/// Why a zoo graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the symmetric form needs ring all-reduce; cluster {cluster} uses {scheme:?}")]
    SymmetricNeedsRing { cluster: String, scheme: SyncScheme },
    #[error("{model}: {source}")]
    Job {
        model: String,
        #[source]
        source: JobError,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Build the global DFG of one iteration of `model` on `cluster`.
pub fn build(model: &Model, cluster: &Cluster, opts: &BuildOptions) -> Result<Dfg, BuildError> {
    job(model, cluster, opts)?
        .expand()
        .map_err(|source| BuildError::Job {
            model: model.name.clone(),
            source,
        })
}

/// Most tensors one multi-tensor (`foreach`) kernel takes: `multi_tensor_apply`'s
/// `depth_to_max_tensors` for the three tensor lists an update reads (PyTorch
/// `aten/src/ATen/native/cuda/MultiTensorApply.cuh`: 110, 64, 48, 36, 30 for depth 1–5).
pub const FOREACH_TENSORS_PER_LAUNCH: usize = 48;

/// The editable job of `model` on `cluster`: the stages of the module docs, in order.
pub fn job(model: &Model, cluster: &Cluster, opts: &BuildOptions) -> Result<Job, BuildError> {
    check_symmetric(cluster, opts)?;
    let mut host_spec = opts
        .host
        .clone()
        .unwrap_or_else(|| HostSpec::builtin(opts.framework.exec()));
    if let Some(speed) = cluster.host_speed {
        host_spec.speed = speed;
    }
    let dag = layers(model, opts.dtype);
    let compute = worker_compute(model, &dag, &cluster.gpu, opts);
    let issue = host(&host_spec, &compute, model.optimizer);
    let plan = comm_plan(&dag);
    let (local, syncs) = assemble(&dag, &compute, &issue, &plan);
    Ok(Job {
        local: local.into(),
        syncs,
        ..wire(model, cluster, opts, host_spec)
    })
}

/// The symmetric form stands for a ring only.
fn check_symmetric(cluster: &Cluster, opts: &BuildOptions) -> Result<(), BuildError> {
    if opts.symmetric && cluster.sync != SyncScheme::Ring {
        return Err(BuildError::SymmetricNeedsRing {
            cluster: cluster.name.clone(),
            scheme: cluster.sync,
        });
    }
    Ok(())
}

/// A parameter tensor whose gradient a worker synchronises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradTensor {
    /// Index into [`LayerDag::tensors`].
    pub tensor: TensorId,
    /// The layer that owns it (its BW makes the gradient ready).
    pub layer: usize,
    pub elems: u64,
}

/// Stage 1's output: the layer DAG and the parameter tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerDag {
    /// Layer names, in forward order.
    pub names: Vec<String>,
    /// `inputs[i]`: the layers whose output layer `i` reads.
    pub inputs: Vec<Vec<usize>>,
    /// `consumers[i]`: the layers that read layer `i`'s output, in forward order.
    pub consumers: Vec<Vec<usize>>,
    /// Every parameter tensor, with its bytes in the build's dtype, in gradient-ready order:
    /// last layer first, a layer's params in declaration order.
    pub tensors: Vec<Tensor>,
    /// The same tensors as the gradients to synchronise (`grads[n].tensor == n`).
    pub grads: Vec<GradTensor>,
    /// (layer, tensor): the layer computes with that tensor of another layer (a tied output
    /// layer and the word embedding's weight, [`crate::zoo::layers::Layer::tied_to`]).
    pub ties: Vec<(u32, TensorId)>,
}

/// Stage 1: the model's layer DAG and its parameter tensors in gradient-ready order.
pub fn layers(model: &Model, dtype: Dtype) -> LayerDag {
    let elem = dtype.bytes();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); model.layers.len()];
    for (i, l) in model.layers.iter().enumerate() {
        for &p in &l.inputs {
            consumers[p].push(i);
        }
    }
    let mut tensors = Vec::new();
    let mut grads = Vec::new();
    for (li, l) in model.layers.iter().enumerate().rev() {
        for p in &l.params {
            tensors.push(Tensor {
                name: p.name.clone(),
                bytes: p.elems * elem,
                layer: li as u32,
            });
            grads.push(GradTensor {
                tensor: (tensors.len() - 1) as TensorId,
                layer: li,
                elems: p.elems,
            });
        }
    }
    // A tied layer reads its owner's first parameter (the weight).
    let ties = model
        .layers
        .iter()
        .enumerate()
        .filter_map(|(li, l)| {
            let owner = l.tied_to?;
            let t = tensors.iter().position(|t| t.layer as usize == owner)?;
            Some((li as u32, t as TensorId))
        })
        .collect();
    LayerDag {
        names: model.layers.iter().map(|l| l.name.clone()).collect(),
        inputs: model.layers.iter().map(|l| l.inputs.clone()).collect(),
        consumers,
        tensors,
        grads,
        ties,
    }
}

/// A worker's local devices: every zoo op runs on one of these three.
mod device {
    use super::DeviceId;
    /// Where virtual (zero-time) ops sit.
    pub const VIRTUAL: DeviceId = 0;
    /// The worker's one GPU stream.
    pub const GPU: DeviceId = 1;
    /// The host thread that issues the GPU's work.
    pub const CPU: DeviceId = 2;
}

/// One GPU op of a worker, before it has an op id.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeOp {
    /// Phase, layer, tensor, device and modelled duration.
    pub spec: OpSpec,
    pub work: OpWork,
    /// Memory effects on the op itself, in order: bytes and when.
    pub mem: Vec<(u64, MemWhen)>,
}

/// Stage 2's output: one worker's GPU work and static memory.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerCompute {
    /// Weights and optimizer state, live all the time.
    pub static_mem_bytes: u64,
    /// FW op of each layer, in forward order.
    pub fw: Vec<ComputeOp>,
    /// BW op of each layer, indexed by layer (issued in reverse order).
    pub bw: Vec<ComputeOp>,
    /// UPDATE op of each gradient tensor, in [`LayerDag::grads`] order.
    pub update: Vec<ComputeOp>,
}

/// Stage 2: one worker's GPU work — FW and BW per layer and UPDATE per tensor, costed on
/// `gpu` — and its static memory.
pub fn worker_compute(
    model: &Model,
    dag: &LayerDag,
    gpu: &GpuSpec,
    opts: &BuildOptions,
) -> WorkerCompute {
    let elem = opts.dtype.bytes();
    let kernels = KernelModel::new(gpu);
    let cost = |w: &OpWork| ns(kernels.time_ns(w, opts.dtype, opts.math));
    let fw = (0..model.layers.len())
        .map(|i| forward_op(model, i, elem, &cost))
        .collect();
    let bw = (0..model.layers.len())
        .map(|i| backward_op(model, i, elem, &cost))
        .collect();
    let update = dag
        .grads
        .iter()
        .enumerate()
        .map(|(n, g)| update_op(model.optimizer, n, g, &cost))
        .collect();
    WorkerCompute {
        // Weights and optimizer state live all the time; gradients are allocated during the
        // backward (`zero_grad(set_to_none=True)`, PyTorch's default, frees them every step).
        static_mem_bytes: model.param_elems() * (elem + 4 * model.optimizer.states_per_param()),
        fw,
        bw,
        update,
    }
}

/// Layer `i`'s forward: its output is live while it runs (kept afterwards only as someone's
/// saved tensor); its saved activations are allocated when it starts.
fn forward_op(model: &Model, i: usize, elem: u64, cost: &dyn Fn(&OpWork) -> u64) -> ComputeOp {
    let l = &model.layers[i];
    let p = l.param_elems() as f64;
    let work = OpWork {
        math: l.math,
        class: l.kind.class(),
        flops: l.fw_flops,
        act_elems: (l.fw_elems - p).max(0.0),
        weight_elems: p.min(l.fw_elems),
        kernels: l.fw_kernels,
        gemms: [l.gemm.unwrap_or(Gemm::NONE), Gemm::NONE],
    };
    let mut mem = vec![(l.out_elems * elem, MemWhen::During)];
    if l.saved_elems > 0 {
        mem.push((l.saved_elems * elem, MemWhen::AllocAtStart));
    }
    ComputeOp {
        spec: OpSpec::compute(device::GPU, Phase::Fw, i as LayerId, cost(&work)),
        work,
        mem,
    }
}

/// Layer `i`'s backward: the gradient of its output (from its consumers) and of its inputs
/// (for its producers) are live while it runs; its saved activations are freed when it ends.
fn backward_op(model: &Model, i: usize, elem: u64, cost: &dyn Fn(&OpWork) -> u64) -> ComputeOp {
    let l = &model.layers[i];
    let p = 2.0 * l.param_elems() as f64;
    let work = OpWork {
        math: l.math,
        class: l.kind.class(),
        flops: l.bw_flops,
        act_elems: (l.bw_elems - p).max(0.0),
        weight_elems: p.min(l.bw_elems),
        kernels: l.bw_kernels,
        gemms: match l.gemm {
            // The first layer (no input to differentiate) computes its weight gradient only.
            Some(g) if l.inputs.is_empty() => [g.backward()[1], Gemm::NONE],
            Some(g) => g.backward(),
            None => [Gemm::NONE; 2],
        },
    };
    let grads: u64 = l.out_elems
        + l.bw_scratch_elems
        + l.inputs
            .iter()
            .map(|&p| model.layers[p].out_elems)
            .sum::<u64>();
    let mut mem = vec![(grads * elem, MemWhen::During)];
    if l.saved_elems > 0 {
        mem.push((l.saved_elems * elem, MemWhen::FreeAtEnd));
    }
    ComputeOp {
        spec: OpSpec::compute(device::GPU, Phase::Bw, i as LayerId, cost(&work)),
        work,
        mem,
    }
}

/// Whether the `n`th tensor of the update opens a new multi-tensor launch.
fn opens_launch(n: usize) -> bool {
    n.is_multiple_of(FOREACH_TENSORS_PER_LAUNCH)
}

/// The update of the `n`th gradient tensor. The update is the optimizer's multi-tensor
/// (`foreach`) kernels: `update_kernels` passes over the parameters, one launch per pass for
/// every [`FOREACH_TENSORS_PER_LAUNCH`] tensors, counted on the group's first tensor.
fn update_op(opt: Optimizer, n: usize, g: &GradTensor, cost: &dyn Fn(&OpWork) -> u64) -> ComputeOp {
    let work = OpWork::new(
        OpClass::Optimizer,
        g.elems as f64 * opt.update_flops_per_param(),
        0.0,
        (g.elems * opt.update_elems_per_param()) as f64,
        if opens_launch(n) {
            opt.update_kernels()
        } else {
            0
        },
    );
    ComputeOp {
        spec: OpSpec {
            tensor: g.tensor,
            ..OpSpec::compute(device::GPU, Phase::Update, g.layer as LayerId, cost(&work))
        },
        work,
        mem: Vec::new(),
    }
}

/// Stage 3's output: what the host thread spends, in ns.
#[derive(Clone, Debug, PartialEq)]
pub struct HostWork {
    /// The micro-step's fixed host work, before the first launch.
    pub micro_step_ns: u64,
    /// `optimizer.step()`'s fixed host work, before the first update launch.
    pub step_ns: u64,
    /// The launch of each op of [`WorkerCompute::fw`], [`WorkerCompute::bw`] and
    /// [`WorkerCompute::update`], index for index.
    pub fw_launch_ns: Vec<u64>,
    pub bw_launch_ns: Vec<u64>,
    pub update_launch_ns: Vec<u64>,
}

/// Stage 3: the host thread's cost of issuing `compute` (PyTorch's Python, dispatcher and
/// autograd work per op; the optimizer's `foreach` call once per launch group).
pub fn host(spec: &HostSpec, compute: &WorkerCompute, opt: Optimizer) -> HostWork {
    let launch = |backward: bool| {
        move |o: &ComputeOp| ns(spec.op_ns(o.work.class, backward, o.work.kernels))
    };
    let passes = f64::from(opt.update_kernels());
    let update_launch_ns = (0..compute.update.len())
        .map(|n| {
            let call = if opens_launch(n) {
                passes * spec.foreach_ns(0)
            } else {
                0.0
            };
            ns(call + passes * spec.foreach_ns(1) - passes * spec.foreach_ns(0))
        })
        .collect();
    HostWork {
        micro_step_ns: ns(spec.micro_step_ns()),
        step_ns: ns(spec.step_ns()),
        fw_launch_ns: compute.fw.iter().map(launch(false)).collect(),
        bw_launch_ns: compute.bw.iter().map(launch(true)).collect(),
        update_launch_ns,
    }
}

/// One gradient's synchronisation, before it has ops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradSync {
    pub tensor: TensorId,
    pub layer: usize,
    /// Bytes each worker synchronises.
    pub bytes: u64,
    /// Independent pieces it is cut into.
    pub partitions: u32,
    /// The gradient buffer, held from its layer's backward to the end of the step.
    pub buffer_bytes: u64,
}

/// Stage 4's output: the syncs in issue order (gradient-ready order).
pub type CommPlan = Vec<GradSync>;

/// Stage 4: one all-reduce per gradient tensor, whole, in gradient-ready order.
pub fn comm_plan(dag: &LayerDag) -> CommPlan {
    dag.grads
        .iter()
        .map(|g| {
            let bytes = dag.tensors[g.tensor as usize].bytes;
            GradSync {
                tensor: g.tensor,
                layer: g.layer,
                bytes,
                partitions: 1,
                buffer_bytes: bytes,
            }
        })
        .collect()
}

/// Stage 5: the job of `model` on `cluster` with no ops yet — communication topology, workers,
/// symmetric form, GPU and host constants, and the metadata reports show.
pub fn wire(model: &Model, cluster: &Cluster, opts: &BuildOptions, host: HostSpec) -> Job {
    Job {
        local: Default::default(),
        syncs: Vec::new(),
        comm: CommSpec::from_cluster(cluster),
        workers: cluster.workers(),
        symmetric: opts.symmetric,
        gpu: cluster.gpu.clone(),
        dtype: opts.dtype,
        math: opts.math,
        framework: opts.framework,
        exec: opts.framework.exec(),
        host: std::sync::Arc::new(host),
        memory: std::sync::Arc::new(
            crate::cost::memory::MemorySpec::builtin(opts.framework).for_arch(&cluster.gpu.arch),
        ),
        meta: JobMeta {
            model: model.name.clone(),
            batch: model.batch,
            cluster: cluster.name.clone(),
            source: "zoo".into(),
            trace: None,
            optimizer: Some(
                match model.optimizer {
                    Optimizer::Adam => "Adam",
                    Optimizer::SgdMomentum => "SGD",
                }
                .to_string(),
            ),
            ..JobMeta::default()
        },
    }
}

/// Lays ops out in program order: the host thread issues every GPU op, its launch op
/// preceding the op and following the previous launch.
struct Emitter {
    g: LocalGraph,
    last_launch: Option<OpId>,
}

impl Emitter {
    fn push(&mut self, spec: OpSpec, work: Option<OpWork>) -> OpId {
        self.g.ops.push(LocalOp { spec, work });
        (self.g.ops.len() - 1) as OpId
    }

    /// A GPU op and its memory effects.
    fn compute(&mut self, c: &ComputeOp) -> OpId {
        let o = self.push(c.spec.clone(), Some(c.work));
        for &(bytes, when) in &c.mem {
            self.g.mem.push(MemEffect {
                op: o,
                worker: 0,
                bytes,
                when,
            });
        }
        o
    }

    /// A host op (not a launch) next in the host thread's order.
    fn host_step(&mut self, spec: OpSpec) -> OpId {
        let s = self.push(spec, None);
        if let Some(p) = self.last_launch {
            self.g.edges.push((p, s));
        }
        self.last_launch = Some(s);
        s
    }

    /// The launch of GPU op `op`, taking `dur_ns` on the host thread.
    fn launch(&mut self, op: OpId, dur_ns: u64) {
        let s = &self.g.ops[op as usize].spec;
        let spec = OpSpec {
            layer: s.layer,
            tensor: s.tensor,
            ..OpSpec::new(OpKind::Launch, s.phase, device::CPU, dur_ns)
        };
        self.host_step(spec);
        self.g
            .edges
            .push((self.last_launch.expect("just launched"), op));
    }
}

/// Stages 2–4 as the worker's local graph, in program order: the micro-step's host work,
/// forward, backward, the step's joins and host work, then each tensor's sync ops and update;
/// and the syncs that join the workers.
pub fn assemble(
    dag: &LayerDag,
    compute: &WorkerCompute,
    host: &HostWork,
    plan: &CommPlan,
) -> (LocalGraph, Vec<Sync>) {
    let mut e = Emitter {
        g: LocalGraph {
            static_mem_bytes: compute.static_mem_bytes,
            layers: dag.names.clone(),
            tensors: dag.tensors.clone(),
            ties: dag.ties.clone(),
            devices: vec![
                DeviceKind::Virtual,
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                },
                DeviceKind::CpuThread {
                    worker: 0,
                    thread: 0,
                },
            ],
            ..LocalGraph::default()
        },
        last_launch: None,
    };
    // The micro-step's fixed host work comes first (its forward phase: accumulation repeats it).
    e.host_step(OpSpec::new(
        OpKind::CpuOther,
        Phase::Fw,
        device::CPU,
        host.micro_step_ns,
    ));
    let fw = emit_forward(&mut e, dag, compute, host);
    let bw = emit_backward(&mut e, dag, compute, host, &fw);
    let joins = emit_step(&mut e, dag, host, &bw);
    let syncs = emit_syncs(&mut e, compute, host, plan, &bw, joins);
    (e.g, syncs)
}

/// Each layer's FW after its launch and the FW of its inputs; returns their op ids.
fn emit_forward(
    e: &mut Emitter,
    dag: &LayerDag,
    compute: &WorkerCompute,
    host: &HostWork,
) -> Vec<OpId> {
    let mut fw_op = Vec::with_capacity(compute.fw.len());
    for (i, c) in compute.fw.iter().enumerate() {
        let o = e.compute(c);
        e.launch(o, host.fw_launch_ns[i]);
        for &inp in &dag.inputs[i] {
            e.g.edges.push((fw_op[inp], o));
        }
        fw_op.push(o);
    }
    fw_op
}

/// Each layer's BW, last layer first, after its launch, its own FW and its consumers' BW;
/// returns their op ids by layer.
fn emit_backward(
    e: &mut Emitter,
    dag: &LayerDag,
    compute: &WorkerCompute,
    host: &HostWork,
    fw_op: &[OpId],
) -> Vec<OpId> {
    let mut bw_op = vec![0 as OpId; compute.bw.len()];
    for i in (0..compute.bw.len()).rev() {
        let o = e.compute(&compute.bw[i]);
        e.launch(o, host.bw_launch_ns[i]);
        e.g.edges.push((fw_op[i], o));
        for &c in &dag.consumers[i] {
            e.g.edges.push((bw_op[c], o));
        }
        bw_op[i] = o;
    }
    bw_op
}

/// The virtual joins between backward and update.
#[derive(Clone, Copy)]
struct StepJoins {
    /// After every first layer's BW: the backward is done.
    bw_done: OpId,
    /// After every tensor's `In`: `optimizer.step()` may start.
    all_synced: OpId,
}

/// The backward's end, the join of every sync, and the step's fixed host work.
fn emit_step(e: &mut Emitter, dag: &LayerDag, host: &HostWork, bw_op: &[OpId]) -> StepJoins {
    let bw_done = e.push(
        OpSpec::new(OpKind::Out, Phase::Bw, device::VIRTUAL, 0),
        None,
    );
    for (i, inputs) in dag.inputs.iter().enumerate() {
        if inputs.is_empty() {
            e.g.edges.push((bw_op[i], bw_done));
        }
    }
    // `optimizer.step()` starts once every gradient is synchronised: one virtual op after every
    // tensor's `In`, and the step's fixed host work.
    // (A virtual join of the update phase, not a tensor's `In`: passes select those by kind.)
    let all_synced = e.push(
        OpSpec::new(OpKind::Out, Phase::Update, device::VIRTUAL, 0),
        None,
    );
    e.g.edges.push((bw_done, all_synced));
    // Phase Other (as a trace's zero_grad): a fused optimizer keeps this fixed work.
    e.host_step(OpSpec::new(
        OpKind::CpuOther,
        Phase::Other,
        device::CPU,
        host.step_ns,
    ));
    StepJoins {
        bw_done,
        all_synced,
    }
}

/// Per tensor: its `Out` after its layer's BW (holding the gradient buffer), its `In`, and its
/// UPDATE after the `In`, the backward and every sync; returns the syncs between them.
fn emit_syncs(
    e: &mut Emitter,
    compute: &WorkerCompute,
    host: &HostWork,
    plan: &CommPlan,
    bw_op: &[OpId],
    joins: StepJoins,
) -> Vec<Sync> {
    let mut syncs = Vec::with_capacity(plan.len());
    for (n, s) in plan.iter().enumerate() {
        let at = |kind| OpSpec {
            tensor: s.tensor,
            layer: s.layer as LayerId,
            ..OpSpec::new(kind, Phase::Comm, device::VIRTUAL, 0)
        };
        let out = e.push(at(OpKind::Out), None);
        e.g.edges.push((bw_op[s.layer], out));
        e.g.mem.push(MemEffect {
            op: out,
            worker: 0,
            bytes: s.buffer_bytes,
            when: MemWhen::AllocAtStart,
        });
        let inn = e.push(at(OpKind::In), None);
        e.g.edges.push((inn, joins.all_synced));
        let u = e.compute(&compute.update[n]);
        e.g.edges.push((inn, u));
        e.g.edges.push((joins.all_synced, u));
        e.g.edges.push((joins.bw_done, u));
        e.launch(u, host.update_launch_ns[n]);
        syncs.push(Sync {
            tensors: vec![s.tensor],
            bytes: s.bytes,
            partitions: s.partitions,
            kind: crate::graph::comm::CollectiveKind::AllReduce,
            group: crate::graph::comm::Group::ALL,
            ready: vec![out],
            done: vec![inn],
        });
    }
    syncs
}

/// Test helper: a zoo model at `batch` and its job (symmetric form) on a built-in cluster.
#[cfg(test)]
pub(crate) fn test_job(model: &str, batch: u32, cluster: &str) -> (Model, Job) {
    test_job_with(
        model,
        &super::ModelOptions {
            batch: Some(batch),
            ..Default::default()
        },
        cluster,
    )
}

/// [`test_job`] with the model's options given.
#[cfg(test)]
pub(crate) fn test_job_with(
    model: &str,
    opts: &super::ModelOptions,
    cluster: &str,
) -> (Model, Job) {
    let m = super::model(model, opts).expect("zoo model");
    let c = crate::cost::config::load_cluster(cluster).expect("built-in cluster");
    let j = job(
        &m,
        &c,
        &BuildOptions {
            symmetric: true,
            ..Default::default()
        },
    )
    .expect("zoo job");
    (m, j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_cluster;
    use crate::replay::{peak_memory, replay};
    use crate::zoo::{Layer, LayerKind, MathClass, ModelOptions, Param, model};

    fn resnet(batch: u32) -> Model {
        model(
            "resnet50",
            &ModelOptions {
                batch: Some(batch),
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn graph_has_every_layer_tensor_and_ring_step() {
        let m = resnet(8);
        let c = load_cluster("8xh200").unwrap();
        let g = build(&m, &c, &BuildOptions::default()).unwrap();
        let layers = m.layers.len();
        let tensors: usize = m.layers.iter().map(|l| l.params.len()).sum();
        let n = 8;
        // Per worker: FW and BW per layer, each with its host launch; the micro-step's host
        // work, backward done, all synchronised, the optimizer step's host work; per tensor Out,
        // In, UPDATE and the UPDATE's launch. Ring: 2(n−1) steps of SEND and RECV per tensor
        // and worker.
        let expect = n * (4 * layers + 4 + 4 * tensors) + tensors * 4 * n * (n - 1);
        assert_eq!(g.op_count(), expect);
        assert_eq!(g.tensors().len(), tensors);
        // The first tensor to synchronise is the classifier's (last layer, ready first).
        assert_eq!(g.tensors()[0].name, "fc.weight");
    }

    /// A cluster's measured `host_speed` replaces the host file's factor: the file's own value
    /// changes nothing, a host twice as slow stretches a host-bound step (ResNet-50 at batch 1
    /// on H200s).
    #[test]
    fn a_clusters_host_speed_replaces_the_host_files() {
        let m = resnet(1);
        let mut c = load_cluster("8xh200").unwrap();
        let step =
            |c: &Cluster| replay(&build(&m, c, &BuildOptions::default()).unwrap()).iteration_ns;
        let default = step(&c);
        let file = HostSpec::builtin(Framework::Pytorch.exec()).speed;
        c.host_speed = Some(file);
        assert_eq!(step(&c), default);
        c.host_speed = Some(2.0 * file);
        let slow = step(&c);
        assert!(slow as f64 > 1.8 * default as f64, "{slow} vs {default}");
    }

    #[test]
    fn symmetric_form_equals_full_replay_on_one_node() {
        let m = resnet(4);
        let c = load_cluster("8xh200").unwrap();
        let full = build(&m, &c, &BuildOptions::default()).unwrap();
        let sym = build(
            &m,
            &c,
            &BuildOptions {
                symmetric: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(sym.is_symmetric_form());
        assert_eq!(sym.represented_workers(), 8);
        let (rf, rs) = (replay(&full), replay(&sym));
        assert_eq!(rf.iteration_ns, rs.iteration_ns);
        assert_eq!(
            peak_memory(&full, &rf).peak_bytes,
            peak_memory(&sym, &rs).peak_bytes
        );
    }

    #[test]
    fn peak_memory_counts_weights_states_and_activations() {
        let m = resnet(32);
        let c = load_cluster("8xh200").unwrap();
        let g = build(
            &m,
            &c,
            &BuildOptions {
                symmetric: true,
                ..Default::default()
            },
        )
        .unwrap();
        let r = replay(&g);
        let mem = peak_memory(&g, &r);
        // SGD-momentum: weights + momentum = 8 B/param all the time; all saved activations are
        // live at the FW/BW turn: a lower bound. Gradients (4 B/param) appear during the
        // backward while activations are freed, and each op's transient buffers (its output,
        // or its gradients in and out) come on top: an upper bound.
        let p = m.param_elems();
        let low = p * 8 + m.saved_elems() * 4;
        let transient = m
            .layers
            .iter()
            .map(|l| l.out_elems + l.inputs.iter().map(|&i| m.layers[i].out_elems).sum::<u64>())
            .max()
            .unwrap()
            * 4;
        assert!(mem.peak_bytes >= low, "{} < {low}", mem.peak_bytes);
        assert!(
            mem.peak_bytes <= low + p * 4 + transient,
            "{} > {}",
            mem.peak_bytes,
            low + p * 4 + transient
        );
    }

    #[test]
    fn symmetric_needs_a_ring() {
        let m = resnet(1);
        let mut c = load_cluster("8xh200").unwrap();
        c.sync = SyncScheme::Tree;
        let e = build(
            &m,
            &c,
            &BuildOptions {
                symmetric: true,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs ring"), "{e}");
    }

    /// fc1 (weight 6, bias 2) → relu → fc2 (weight 4) → loss, SGD with momentum.
    fn tiny() -> Model {
        let layer = |name: &str, kind, inputs: Vec<usize>, params: &[(&str, u64)]| Layer {
            name: name.into(),
            kind,
            math: MathClass::Vector,
            inputs,
            fw_flops: 100.0,
            fw_elems: 20.0,
            bw_flops: 200.0,
            bw_elems: 40.0,
            fw_kernels: 1,
            bw_kernels: 2,
            saved_elems: 5,
            out_elems: 3,
            bw_scratch_elems: 0,
            params: params
                .iter()
                .map(|&(p, elems)| Param {
                    name: format!("{name}.{p}"),
                    elems,
                })
                .collect(),
            gemm: None,
            tied_to: None,
        };
        Model {
            name: "tiny".into(),
            batch: 2,
            optimizer: Optimizer::SgdMomentum,
            layers: vec![
                layer(
                    "fc1",
                    LayerKind::Gemm,
                    vec![],
                    &[("weight", 6), ("bias", 2)],
                ),
                layer("relu", LayerKind::Elementwise, vec![0], &[]),
                layer("fc2", LayerKind::Gemm, vec![1], &[("weight", 4)]),
                layer("loss", LayerKind::Loss, vec![2], &[]),
            ],
            tokens_per_sample: 0,
        }
    }

    fn tiny_stages() -> (Model, LayerDag, WorkerCompute, HostWork, CommPlan) {
        let m = tiny();
        let c = load_cluster("8xh200").unwrap();
        let opts = BuildOptions::default();
        let dag = layers(&m, opts.dtype);
        let compute = worker_compute(&m, &dag, &c.gpu, &opts);
        let spec = HostSpec::builtin(opts.framework.exec());
        let issue = host(&spec, &compute, m.optimizer);
        let plan = comm_plan(&dag);
        (m, dag, compute, issue, plan)
    }

    #[test]
    fn layers_stage_finds_consumers_and_gradient_ready_order() {
        let dag = layers(&tiny(), Dtype::Fp32);
        assert_eq!(dag.consumers, vec![vec![1], vec![2], vec![3], vec![]]);
        let names: Vec<_> = dag.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["fc2.weight", "fc1.weight", "fc1.bias"]);
        let bytes: Vec<_> = dag.tensors.iter().map(|t| t.bytes).collect();
        assert_eq!(bytes, [16, 24, 8]);
        let owners: Vec<_> = dag.grads.iter().map(|g| (g.tensor, g.layer)).collect();
        assert_eq!(owners, [(0, 2), (1, 0), (2, 0)]);
    }

    #[test]
    fn worker_compute_stage_costs_every_layer_and_tensor() {
        let (_, _, compute, _, _) = tiny_stages();
        assert_eq!(
            (compute.fw.len(), compute.bw.len(), compute.update.len()),
            (4, 4, 3)
        );
        // 12 parameters × (FP32 weight + one FP32 momentum).
        assert_eq!(compute.static_mem_bytes, 12 * 8);
        let all = compute.fw.iter().chain(&compute.bw).chain(&compute.update);
        assert!(all.clone().all(|o| o.spec.device == device::GPU));
        assert!(
            compute
                .fw
                .iter()
                .chain(&compute.bw)
                .all(|o| o.spec.dur_ns > 0)
        );
        assert_eq!(
            compute.fw[1].mem,
            [(3 * 4, MemWhen::During), (5 * 4, MemWhen::AllocAtStart)]
        );
        // A BW holds its output's and its input's gradients (3 + 3 elements).
        assert_eq!(
            compute.bw[1].mem,
            [(6 * 4, MemWhen::During), (5 * 4, MemWhen::FreeAtEnd)]
        );
        // The first update of a launch group counts the group's kernels.
        let kernels: Vec<_> = compute.update.iter().map(|o| o.work.kernels).collect();
        assert_eq!(kernels, [4, 0, 0]);
        assert_eq!(compute.update[0].spec.tensor, 0);
        assert_eq!(compute.update[0].spec.layer, 2);
    }

    #[test]
    fn host_stage_launches_every_gpu_op_and_calls_foreach_once_per_group() {
        let (m, _, compute, _, _) = tiny_stages();
        let spec = HostSpec {
            foreach_call_us: 10.0,
            foreach_tensor_us: 1.0,
            speed: 1.0,
            ..HostSpec::default()
        };
        let issue = host(&spec, &compute, m.optimizer);
        assert_eq!(issue.fw_launch_ns.len(), compute.fw.len());
        assert_eq!(issue.bw_launch_ns.len(), compute.bw.len());
        assert_eq!(issue.update_launch_ns.len(), compute.update.len());
        assert!(issue.fw_launch_ns.iter().all(|&t| t > 0));
        assert!(issue.micro_step_ns > 0 && issue.step_ns > 0);
        let u = &issue.update_launch_ns;
        // Four `foreach` passes: the group's call once, then 1 µs per tensor and pass.
        assert_eq!(u, &[44_000, 4_000, 4_000]);
    }

    #[test]
    fn comm_plan_stage_syncs_every_gradient_whole() {
        let (m, _, _, _, plan) = tiny_stages();
        assert_eq!(plan.len(), 3);
        assert_eq!(
            plan.iter().map(|s| s.bytes).sum::<u64>(),
            m.param_elems() * 4
        );
        assert!(
            plan.iter()
                .all(|s| s.partitions == 1 && s.buffer_bytes == s.bytes)
        );
        assert_eq!(plan[0].layer, 2);
    }

    #[test]
    fn wire_stage_takes_the_cluster_and_no_ops() {
        let c = load_cluster("2xa100").unwrap();
        let j = wire(
            &tiny(),
            &c,
            &BuildOptions::default(),
            HostSpec::builtin(Framework::Pytorch.exec()),
        );
        assert_eq!(j.workers, c.workers());
        assert_eq!(j.comm.scheme, c.sync);
        assert!(j.local.ops.is_empty() && j.syncs.is_empty());
        assert_eq!(j.meta.source, "zoo");
        assert_eq!(j.meta.optimizer.as_deref(), Some("SGD"));
        assert_eq!((j.meta.model.as_str(), j.meta.batch), ("tiny", 2));
    }

    #[test]
    fn assemble_lays_out_ops_in_program_order() {
        let (_, dag, compute, issue, plan) = tiny_stages();
        let (g, syncs) = assemble(&dag, &compute, &issue, &plan);
        // Micro-step; FW + launch and BW + launch per layer; bw_done, all_synced, step; per
        // tensor Out, In, UPDATE and its launch.
        assert_eq!(g.ops.len(), 1 + 2 * 4 + 2 * 4 + 3 + 4 * 3);
        let on = |d| g.ops.iter().filter(|o| o.spec.device == d).count();
        assert_eq!(
            (on(device::VIRTUAL), on(device::GPU), on(device::CPU)),
            (2 + 2 * 3, 4 + 4 + 3, 1 + 4 + 4 + 1 + 3)
        );
        // The host thread is one chain: every CPU op but the first follows the previous one.
        let cpu: Vec<OpId> = (0..g.ops.len() as OpId)
            .filter(|&o| g.ops[o as usize].spec.device == device::CPU)
            .collect();
        for w in cpu.windows(2) {
            assert!(g.edges.contains(&(w[0], w[1])), "{w:?}");
        }
        assert_eq!(g.ops[1].spec.phase, Phase::Fw);
        assert_eq!(g.ops[2].spec.kind, OpKind::Launch);
        assert_eq!(syncs.len(), 3);
        assert_eq!(
            syncs.iter().map(|s| s.bytes).collect::<Vec<_>>(),
            [16, 24, 8]
        );
        for s in &syncs {
            assert_eq!(g.ops[s.ready[0] as usize].spec.kind, OpKind::Out);
            assert_eq!(g.ops[s.done[0] as usize].spec.kind, OpKind::In);
        }
        assert_eq!(g.static_mem_bytes, compute.static_mem_bytes);
    }
}
