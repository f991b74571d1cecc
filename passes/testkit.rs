//! Fixtures the synchronisation passes' tests share (compiled for tests only): a chain job with
//! gradients synchronised in chain order, a one-node communication spec with round numbers, and
//! the recorded FSDP2 fixture's rank 0.

use crate::cost::comm::AlphaBeta;
use crate::cost::config::SyncScheme;
use crate::graph::comm::{CommCost, CommSpec};
use crate::graph::job::{Job, JobMeta, LocalGraph, LocalOp, Sync};
use crate::graph::{DeviceKind, OpId, OpKind, OpSpec, Phase, Tensor};

/// A one-node, 8-GPU, 2-server spec of `scheme` whose links all cost α = 1000 ns and 1 B/ns.
pub(crate) fn spec(scheme: SyncScheme) -> CommSpec {
    let link = AlphaBeta {
        alpha_ns: 1000.0,
        bytes_per_ns: 1.0,
    };
    CommSpec {
        scheme,
        gpus_per_node: 8,
        nodes: 1,
        ps_servers: 2,
        cost: CommCost {
            intra: link,
            inter: link,
            aggregate_bytes_per_ns: 10.0,
        },
    }
}

/// A chain of backward compute ops on GPU device 1 (trace-like: no work); op `i` with
/// `grads[i] = (dur, true)` produces a gradient of `bytes` B: `op → Out → sync → In`.
/// Syncs are in chain order. `workers` copies over `spec`.
pub(crate) fn chain_job(ops: &[(u64, bool)], bytes: u64, spec: CommSpec, workers: u32) -> Job {
    let sizes: Vec<(u64, Option<u64>)> =
        ops.iter().map(|&(d, g)| (d, g.then_some(bytes))).collect();
    chain_job_sizes(&sizes, spec, workers)
}

/// Like [`chain_job`] with a gradient size per op.
pub(crate) fn chain_job_sizes(ops: &[(u64, Option<u64>)], spec: CommSpec, workers: u32) -> Job {
    let mut g = LocalGraph {
        devices: vec![
            DeviceKind::Virtual,
            DeviceKind::GpuStream {
                worker: 0,
                stream: 0,
            },
        ],
        layers: (0..ops.len()).map(|i| format!("l{i}")).collect(),
        ..LocalGraph::default()
    };
    let mut syncs = Vec::new();
    let mut prev: Option<OpId> = None;
    for (i, &(dur, grad)) in ops.iter().enumerate() {
        let o = g.ops.len() as OpId;
        g.ops.push(LocalOp {
            spec: OpSpec::compute(1, Phase::Bw, i as u32, dur),
            work: None,
        });
        if let Some(p) = prev {
            g.edges.push((p, o));
        }
        prev = Some(o);
        if let Some(bytes) = grad {
            let t = g.tensors.len() as u32;
            g.tensors.push(Tensor {
                name: format!("w{i}"),
                bytes,
                layer: i as u32,
            });
            let out = g.ops.len() as OpId;
            g.ops.push(LocalOp {
                spec: OpSpec {
                    tensor: t,
                    ..OpSpec::new(OpKind::Out, Phase::Comm, 0, 0)
                },
                work: None,
            });
            let inn = out + 1;
            g.ops.push(LocalOp {
                spec: OpSpec {
                    tensor: t,
                    ..OpSpec::new(OpKind::In, Phase::Comm, 0, 0)
                },
                work: None,
            });
            g.edges.push((o, out));
            syncs.push(Sync {
                tensors: vec![t],
                bytes,
                partitions: 1,
                kind: crate::graph::comm::CollectiveKind::AllReduce,
                group: crate::graph::comm::Group::ALL,
                ready: vec![out],
                done: vec![inn],
            });
        }
    }
    Job {
        local: g.into(),
        syncs,
        comm: spec,
        workers,
        symmetric: false,
        gpu: crate::cost::config::load_gpu("v100-32gb").unwrap(),
        dtype: crate::cost::config::Dtype::Fp32,
        math: Default::default(),
        framework: Default::default(),
        exec: Default::default(),
        host: Default::default(),
        memory: Default::default(),
        meta: JobMeta::default(),
    }
}

/// `job` with the registered pass `name` applied with `knobs` (proposed from `job`
/// evaluated), or why it does not apply.
pub(crate) fn try_pass(
    job: &Job,
    name: &str,
    knobs: &[(&str, &str)],
) -> Result<Job, crate::passes::PassError> {
    use crate::passes::{apply_all, evaluate, find, propose, registry, resolve_knobs};
    let all = registry();
    let e = evaluate(job.clone()).expect("evaluates");
    let p = find(&all, name).unwrap();
    let kv: Vec<(String, String)> = knobs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let k = resolve_knobs(p, &kv).unwrap();
    propose(p, &e, &k).and_then(|ps| apply_all(job, &ps))
}

/// The committed FSDP2 fixture's rank 0 (`tests/fixtures/kineto/fsdp2`, `record.py` there):
/// PyTorch's `fully_shard` on a two-block GPT-2, its units the root and both blocks.
pub(crate) fn fsdp2_rank0() -> Job {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kineto/fsdp2/rank0.json.gz");
    let f = std::fs::File::open(&p).expect("the fixture is committed");
    let t = crate::trace::parse_kineto(flate2::read::GzDecoder::new(f), "rank0")
        .expect("the fixture parses");
    crate::trace::graph::build_job(&t, "rank0", None)
        .expect("the fixture builds")
        .job
}
