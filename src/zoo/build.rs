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
//!   ([`CommTopology`]), issued in reverse layer order, and a virtual `In` when done;
//! * one UPDATE op per parameter tensor after its `In` and after the whole backward
//!   (`optimizer.step()` follows `loss.backward()`);
//! * memory: weights, gradients and optimizer state are static; each layer's saved activations
//!   are allocated when its FW starts and freed when its BW ends.
//!
//! With [`BuildOptions::symmetric`] the graph holds one worker and the quotient ring chain
//! ([`CommTopology::symmetric_ring`]) and stands for all of the cluster's workers.

use crate::cost::compute::{Efficiency, Roofline, ns};
use crate::cost::config::{Cluster, Dtype, SyncScheme};
use crate::graph::comm::{CommSpec, CommTopology};
use crate::graph::{
    DeviceKind, Dfg, DfgBuilder, GraphError, MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase,
    Tensor,
};

use super::Model;

/// How to build the graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BuildOptions {
    /// Storage and compute dtype of activations, weights and gradients (default FP32).
    pub dtype: Dtype,
    /// Build the symmetric (quotient) form: one worker standing for all (ring only).
    pub symmetric: bool,
    pub efficiency: Efficiency,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            dtype: Dtype::Fp32,
            symmetric: false,
            efficiency: Efficiency::default(),
        }
    }
}

/// Why a zoo graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the symmetric form needs ring all-reduce; cluster {cluster} uses {scheme:?}")]
    SymmetricNeedsRing { cluster: String, scheme: SyncScheme },
    #[error(
        "{model} on {workers} workers would have about {ops} ops in its fine-grained graph (limit {limit}); use the symmetric form or fewer workers"
    )]
    TooLarge {
        model: String,
        workers: u32,
        ops: u64,
        limit: u64,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Most ops a full (non-symmetric) graph may have: ~60 bytes of arrays per op.
pub const MAX_OPS: u64 = 200_000_000;

/// Build the global DFG of one iteration of `model` on `cluster`.
pub fn build(model: &Model, cluster: &Cluster, opts: &BuildOptions) -> Result<Dfg, BuildError> {
    let n = cluster.workers();
    if opts.symmetric && cluster.sync != SyncScheme::Ring {
        return Err(BuildError::SymmetricNeedsRing {
            cluster: cluster.name.clone(),
            scheme: cluster.sync,
        });
    }
    let graph_workers = if opts.symmetric { 1 } else { n };
    let roof = Roofline::new(&cluster.gpu, opts.dtype, opts.efficiency);
    let elem = opts.dtype.bytes();

    // Per-layer and per-tensor costs, shared by all workers.
    let fw: Vec<u64> = model
        .layers
        .iter()
        .map(|l| ns(roof.time_ns(l.math, l.fw_flops, l.fw_elems, l.fw_kernels)))
        .collect();
    let bw: Vec<u64> = model
        .layers
        .iter()
        .map(|l| ns(roof.time_ns(l.math, l.bw_flops, l.bw_elems, l.bw_kernels)))
        .collect();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); model.layers.len()];
    for (i, l) in model.layers.iter().enumerate() {
        for &p in &l.inputs {
            consumers[p].push(i);
        }
    }
    let opt = model.optimizer;
    let params = model.param_elems();
    let static_bytes = params * (2 * elem + 4 * opt.states_per_param());

    let mut b = DfgBuilder::new();
    // Tensors in gradient-ready order: last layer first, a layer's params in declaration order.
    let mut tensors = Vec::new();
    for (li, l) in model.layers.iter().enumerate().rev() {
        for p in &l.params {
            let t = b.add_tensor(Tensor {
                name: p.name.clone(),
                bytes: p.elems * elem,
                layer: NONE,
            });
            tensors.push((t, li, p.elems));
        }
    }
    let layer_ids: Vec<u32> = model
        .layers
        .iter()
        .map(|l| b.add_layer(l.name.clone()))
        .collect();
    let v = b.add_device(DeviceKind::Virtual);
    let gpus: Vec<u32> = (0..graph_workers)
        .map(|w| {
            b.add_device(DeviceKind::GpuStream {
                worker: w,
                stream: 0,
            })
        })
        .collect();
    let streams: Vec<u32> = (0..graph_workers)
        .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
        .collect();
    let spec = CommSpec::from_cluster(cluster);
    let mut topo = if opts.symmetric {
        CommTopology::symmetric_ring(&mut b, &spec, n, streams[0])
    } else {
        CommTopology::new(&mut b, &spec, streams.clone())
    };
    let local_ops = 2 * model.layers.len() + 1 + 3 * tensors.len();
    let total = graph_workers as u64 * local_ops as u64
        + tensors.len() as u64 * topo.ops_per_tensor() as u64;
    if total > MAX_OPS {
        return Err(BuildError::TooLarge {
            model: model.name.clone(),
            workers: n,
            ops: total,
            limit: MAX_OPS,
        });
    }
    b.reserve(total as usize, total as usize * 2);
    b.set_workers(graph_workers);
    if opts.symmetric {
        b.set_represents(n);
    }

    let mut outs = vec![vec![0 as OpId; graph_workers as usize]; tensors.len()];
    let mut ins = vec![vec![0 as OpId; graph_workers as usize]; tensors.len()];
    let mut bw_done = vec![0 as OpId; graph_workers as usize];
    let mut bw_op_of_layer = vec![vec![0 as OpId; model.layers.len()]; graph_workers as usize];
    for w in 0..graph_workers {
        b.set_static_memory(w, static_bytes);
        let gpu = gpus[w as usize];
        let mut fw_op = vec![0 as OpId; model.layers.len()];
        for (i, l) in model.layers.iter().enumerate() {
            let o = b.add_op(OpSpec::compute(gpu, Phase::Fw, layer_ids[i], fw[i]));
            for &p in &l.inputs {
                b.add_edge(fw_op[p], o);
            }
            if l.saved_elems > 0 {
                b.add_mem(MemEffect {
                    op: o,
                    worker: w,
                    bytes: l.saved_elems * elem,
                    when: MemWhen::AllocAtStart,
                });
            }
            fw_op[i] = o;
        }
        let bw_op = &mut bw_op_of_layer[w as usize];
        for i in (0..model.layers.len()).rev() {
            let l = &model.layers[i];
            let o = b.add_op(OpSpec::compute(gpu, Phase::Bw, layer_ids[i], bw[i]));
            b.add_edge(fw_op[i], o);
            for &c in &consumers[i] {
                b.add_edge(bw_op[c], o);
            }
            if l.saved_elems > 0 {
                b.add_mem(MemEffect {
                    op: o,
                    worker: w,
                    bytes: l.saved_elems * elem,
                    when: MemWhen::FreeAtEnd,
                });
            }
            bw_op[i] = o;
        }
        let done = b.add_op(OpSpec::new(OpKind::Out, Phase::Bw, v, 0));
        for (i, l) in model.layers.iter().enumerate() {
            if l.inputs.is_empty() {
                b.add_edge(bw_op[i], done);
            }
        }
        bw_done[w as usize] = done;
        for (k, &(t, li, _)) in tensors.iter().enumerate() {
            let out = b.add_op(OpSpec {
                tensor: t,
                layer: layer_ids[li],
                ..OpSpec::new(OpKind::Out, Phase::Comm, v, 0)
            });
            b.add_edge(bw_op[li], out);
            outs[k][w as usize] = out;
            ins[k][w as usize] = b.add_op(OpSpec {
                tensor: t,
                layer: layer_ids[li],
                ..OpSpec::new(OpKind::In, Phase::Comm, v, 0)
            });
        }
    }
    for (k, &(t, _, elems)) in tensors.iter().enumerate() {
        topo.allreduce(&mut b, t, elems * elem, &outs[k], &ins[k]);
    }
    for w in 0..graph_workers as usize {
        for (k, &(t, li, elems)) in tensors.iter().enumerate() {
            let dur = ns(roof.time_ns(
                crate::zoo::MathClass::Vector,
                elems as f64 * opt.update_flops_per_param(),
                (elems * opt.update_elems_per_param()) as f64,
                1,
            ));
            let u = b.add_op(OpSpec {
                tensor: t,
                ..OpSpec::compute(gpus[w], Phase::Update, layer_ids[li], dur)
            });
            b.add_edge(ins[k][w], u);
            b.add_edge(bw_done[w], u);
        }
    }
    Ok(b.build()?)
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
        let expect = n * (2 * layers + 1 + 3 * tensors) + tensors * 4 * n * (n - 1);
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
        // SGD-momentum: weights + grads + momentum = 12 B/param; all activations are live at the
        // FW/BW turn.
        let expect = m.param_elems() * 12 + m.saved_elems() * 4;
        assert_eq!(mem.peak_bytes, expect);
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
