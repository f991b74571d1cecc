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

use crate::cost::compute::ns;
use crate::cost::config::{Cluster, Dtype, SyncScheme};
use crate::cost::framework::{Framework, Math};
use crate::cost::host::HostSpec;
use crate::cost::kernel::{Gemm, OpClass};
use crate::graph::comm::CommSpec;
use crate::graph::job::{Job, JobError, JobMeta, LocalGraph, LocalOp, OpWork, Sync};
use crate::graph::{
    DeviceKind, Dfg, GraphError, MemEffect, MemWhen, OpId, OpKind, OpSpec, Phase, Tensor,
};

use super::Model;

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

/// The editable job of `model` on `cluster` (see the module docs for its shape).
pub fn job(model: &Model, cluster: &Cluster, opts: &BuildOptions) -> Result<Job, BuildError> {
    if opts.symmetric && cluster.sync != SyncScheme::Ring {
        return Err(BuildError::SymmetricNeedsRing {
            cluster: cluster.name.clone(),
            scheme: cluster.sync,
        });
    }
    let elem = opts.dtype.bytes();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); model.layers.len()];
    for (i, l) in model.layers.iter().enumerate() {
        for &p in &l.inputs {
            consumers[p].push(i);
        }
    }
    let opt = model.optimizer;
    let host = opts
        .host
        .clone()
        .unwrap_or_else(|| HostSpec::builtin(opts.framework.exec()));
    let mut g = LocalGraph {
        // Weights and optimizer state live all the time; gradients are allocated during the
        // backward (`zero_grad(set_to_none=True)`, PyTorch's default, frees them every step).
        static_mem_bytes: model.param_elems() * (elem + 4 * opt.states_per_param()),
        layers: model.layers.iter().map(|l| l.name.clone()).collect(),
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
    };
    let (v, gpu, cpu) = (0u32, 1u32, 2u32);
    // Tensors in gradient-ready order: last layer first, a layer's params in declaration order.
    let mut tensors = Vec::new();
    for (li, l) in model.layers.iter().enumerate().rev() {
        for p in &l.params {
            g.tensors.push(Tensor {
                name: p.name.clone(),
                bytes: p.elems * elem,
                layer: li as u32,
            });
            tensors.push(((g.tensors.len() - 1) as u32, li, p.elems));
        }
    }
    let push = |g: &mut LocalGraph, spec: OpSpec, work: Option<OpWork>| -> OpId {
        g.ops.push(LocalOp { spec, work });
        (g.ops.len() - 1) as OpId
    };
    // The host thread issues every GPU op in program order: its launch op precedes the op and
    // follows the previous launch.
    let mut last_launch: Option<OpId>;
    let launch = |g: &mut LocalGraph, last: &mut Option<OpId>, op: OpId, dur_ns: f64| {
        let s = &g.ops[op as usize].spec;
        let spec = OpSpec {
            layer: s.layer,
            tensor: s.tensor,
            ..OpSpec::new(OpKind::Launch, s.phase, cpu, ns(dur_ns))
        };
        let l = push(g, spec, None);
        if let Some(p) = *last {
            g.edges.push((p, l));
        }
        g.edges.push((l, op));
        *last = Some(l);
    };
    let job_stub = Job {
        local: LocalGraph::default(),
        syncs: Vec::new(),
        comm: CommSpec::from_cluster(cluster),
        workers: cluster.workers(),
        symmetric: opts.symmetric,
        gpu: cluster.gpu.clone(),
        dtype: opts.dtype,
        math: opts.math,
        framework: opts.framework,
        exec: opts.framework.exec(),
        host: std::sync::Arc::new(host.clone()),
        memory: std::sync::Arc::new(crate::cost::memory::MemorySpec::builtin(opts.framework)),
        meta: JobMeta {
            model: model.name.clone(),
            batch: model.batch,
            cluster: cluster.name.clone(),
            source: "zoo".into(),
            trace: None,
            optimizer: Some(
                match model.optimizer {
                    crate::zoo::Optimizer::Adam => "Adam",
                    crate::zoo::Optimizer::SgdMomentum => "SGD",
                }
                .to_string(),
            ),
        },
    };
    let cost = |w: &OpWork| job_stub.cost_ns(w, opts.dtype, 1.0);
    // The micro-step's fixed host work comes first (its forward phase: accumulation repeats it).
    let start = push(
        &mut g,
        OpSpec::new(OpKind::CpuOther, Phase::Fw, cpu, ns(host.micro_step_ns())),
        None,
    );
    last_launch = Some(start);
    let mut fw_op = vec![0 as OpId; model.layers.len()];
    for (i, l) in model.layers.iter().enumerate() {
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
        let o = push(
            &mut g,
            OpSpec::compute(gpu, Phase::Fw, i as u32, cost(&work)),
            Some(work),
        );
        launch(
            &mut g,
            &mut last_launch,
            o,
            host.op_ns(work.class, false, work.kernels),
        );
        for &inp in &l.inputs {
            g.edges.push((fw_op[inp], o));
        }
        // Its output exists while it runs (kept afterwards only as someone's saved tensor).
        g.mem.push(MemEffect {
            op: o,
            worker: 0,
            bytes: l.out_elems * elem,
            when: MemWhen::During,
        });
        if l.saved_elems > 0 {
            g.mem.push(MemEffect {
                op: o,
                worker: 0,
                bytes: l.saved_elems * elem,
                when: MemWhen::AllocAtStart,
            });
        }
        fw_op[i] = o;
    }
    let mut bw_op = vec![0 as OpId; model.layers.len()];
    for i in (0..model.layers.len()).rev() {
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
        let o = push(
            &mut g,
            OpSpec::compute(gpu, Phase::Bw, i as u32, cost(&work)),
            Some(work),
        );
        launch(
            &mut g,
            &mut last_launch,
            o,
            host.op_ns(work.class, true, work.kernels),
        );
        g.edges.push((fw_op[i], o));
        for &c in &consumers[i] {
            g.edges.push((bw_op[c], o));
        }
        // The gradient of its output (from its consumers) and of its inputs (for its producers)
        // are live while it runs.
        let grads: u64 = l.out_elems
            + l.inputs
                .iter()
                .map(|&p| model.layers[p].out_elems)
                .sum::<u64>();
        g.mem.push(MemEffect {
            op: o,
            worker: 0,
            bytes: grads * elem,
            when: MemWhen::During,
        });
        if l.saved_elems > 0 {
            g.mem.push(MemEffect {
                op: o,
                worker: 0,
                bytes: l.saved_elems * elem,
                when: MemWhen::FreeAtEnd,
            });
        }
        bw_op[i] = o;
    }
    let bw_done = push(&mut g, OpSpec::new(OpKind::Out, Phase::Bw, v, 0), None);
    for (i, l) in model.layers.iter().enumerate() {
        if l.inputs.is_empty() {
            g.edges.push((bw_op[i], bw_done));
        }
    }
    // `optimizer.step()` starts once every gradient is synchronised: one virtual op after every
    // tensor's `In`, and the step's fixed host work.
    // (A virtual join of the update phase, not a tensor's `In`: passes select those by kind.)
    let all_synced = push(&mut g, OpSpec::new(OpKind::Out, Phase::Update, v, 0), None);
    g.edges.push((bw_done, all_synced));
    let step = push(
        &mut g,
        // Phase Other (as a trace's zero_grad): a fused optimizer keeps this fixed work.
        OpSpec::new(OpKind::CpuOther, Phase::Other, cpu, ns(host.step_ns())),
        None,
    );
    if let Some(p) = last_launch {
        g.edges.push((p, step));
    }
    last_launch = Some(step);
    // The update is the optimizer's multi-tensor (`foreach`) kernels: `update_kernels` passes
    // over the parameters, one launch per pass for every `FOREACH_TENSORS_PER_LAUNCH` tensors.
    let passes = opt.update_kernels();
    let mut syncs = Vec::with_capacity(tensors.len());
    for (n, &(t, li, elems)) in tensors.iter().enumerate() {
        let out = push(
            &mut g,
            OpSpec {
                tensor: t,
                layer: li as u32,
                ..OpSpec::new(OpKind::Out, Phase::Comm, v, 0)
            },
            None,
        );
        g.edges.push((bw_op[li], out));
        // The parameter's gradient, from its layer's backward to the end of the step.
        g.mem.push(MemEffect {
            op: out,
            worker: 0,
            bytes: elems * elem,
            when: MemWhen::AllocAtStart,
        });
        let inn = push(
            &mut g,
            OpSpec {
                tensor: t,
                layer: li as u32,
                ..OpSpec::new(OpKind::In, Phase::Comm, v, 0)
            },
            None,
        );
        g.edges.push((inn, all_synced));
        let first_of_launch = n % FOREACH_TENSORS_PER_LAUNCH == 0;
        let work = OpWork::new(
            OpClass::Optimizer,
            elems as f64 * opt.update_flops_per_param(),
            0.0,
            (elems * opt.update_elems_per_param()) as f64,
            if first_of_launch { passes } else { 0 },
        );
        let u = push(
            &mut g,
            OpSpec {
                tensor: t,
                ..OpSpec::compute(gpu, Phase::Update, li as u32, cost(&work))
            },
            Some(work),
        );
        g.edges.push((inn, u));
        g.edges.push((all_synced, u));
        g.edges.push((bw_done, u));
        let call = if first_of_launch {
            f64::from(passes) * host.foreach_ns(0)
        } else {
            0.0
        };
        launch(
            &mut g,
            &mut last_launch,
            u,
            call + f64::from(passes) * host.foreach_ns(1) - f64::from(passes) * host.foreach_ns(0),
        );
        syncs.push(Sync {
            tensors: vec![t],
            bytes: elems * elem,
            partitions: 1,
            kind: crate::graph::comm::CollectiveKind::AllReduce,
            group: crate::graph::comm::Group::ALL,
            ready: vec![out],
            done: vec![inn],
        });
    }
    Ok(Job {
        local: g,
        syncs,
        ..job_stub
    })
}

/// Test helper: a zoo model at `batch` and its job (symmetric form) on a built-in cluster.
#[cfg(test)]
pub(crate) fn test_job(model: &str, batch: u32, cluster: &str) -> (Model, Job) {
    let m = super::model(
        model,
        &super::ModelOptions {
            batch: Some(batch),
            ..Default::default()
        },
    )
    .expect("zoo model");
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
    use crate::zoo::{ModelOptions, model};

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
}
