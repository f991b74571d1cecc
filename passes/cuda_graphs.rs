//! `cuda-graphs`: capture the step's kernels in CUDA Graphs, so the host launches one graph per
//! region instead of one kernel at a time — PyTorch `torch.compile(mode="reduce-overhead")` or
//! `torch.cuda.make_graphed_callables`, TF/JAX's compiled executables.
//!
//! **When it applies.** A job whose host work is in the graph: a recorded step (a trace), whose
//! CPU threads launch every kernel. The zoo does not model launches (nothing to remove:
//! refused). It pays where the step is *host-bound* — the critical path runs through the CPU's
//! launches — and gains nothing where the GPU is the bottleneck.
//!
//! ```text
//! before:  CPU  launch k1 ─ launch k2 ─ launch k3 ─ …        GPU  k1 ·gap· k2 ·gap· k3 …
//! after:   CPU  graph launch (FW) ─ graph launch (BW) ─ …     GPU  k1 k2 k3 …  (back to back)
//! ```
//!
//! **Cost model** — priced from the trace's own launches: every kernel launch of the captured
//! phases (forward, backward, optimizer update; `scope=fw-bw` leaves the update out) takes no
//! host time, except one launch per region (a CPU thread's run of one phase), which becomes the
//! graph launch and costs the step's median launch — what one launch call costs on this host.
//! Launches of collectives stay (NCCL kernels of DDP's overlapped all-reduce are issued from its
//! reducer outside the captured region), and so do blocking calls: a synchronisation ends a
//! capture. With `host=1`, the framework's own CPU work in the captured phases (operator
//! dispatch, the gaps between operators; data loading excluded) goes too, as `torch.compile`
//! replaces the Python that issued it — an upper bound on what compilation removes; the default
//! keeps it (CUDA Graphs alone). The GPU side keeps its kernels' times;
//! the per-kernel launch latency a graph also saves on the GPU is not modelled (a few µs per
//! kernel: an underestimate of the gain).
//!
//! **Knobs.** `scope` = `all` (default) | `fw-bw`; `host` = 0 (default) | 1.
//!
//! **Framework knobs.** PyTorch `torch.compile(model, mode="reduce-overhead")` (or
//! `torch.cuda.make_graphed_callables` around the model); static input shapes and no host
//! synchronisation inside the captured region.

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::{DeviceKind, OpId, OpKind, Phase};

/// The `cuda-graphs` pass.
pub struct CudaGraphs;

const NAME: &str = "cuda-graphs";

impl Pass for CudaGraphs {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "capture kernels in CUDA Graphs (torch.compile reduce-overhead): per-kernel launch cost on the host removed, priced from the trace's own launches"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text(
                "scope",
                "phases captured: all (forward, backward, update) or fw-bw",
                "all",
            ),
            KnobSpec::int(
                "host",
                "1: the framework's CPU work in captured phases goes too (torch.compile); 0: launches only",
                0,
                0,
                1,
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let scope = knobs.text("scope").trim().to_ascii_lowercase();
        let phases: &[Phase] = match scope.as_str() {
            "all" => &[Phase::Fw, Phase::Bw, Phase::Update],
            "fw-bw" | "fwbw" => &[Phase::Fw, Phase::Bw],
            _ => {
                return Err(PassError::BadKnob {
                    pass: NAME.into(),
                    knob: "scope".into(),
                    value: scope,
                    why: "must be all or fw-bw".into(),
                });
            }
        };
        let host = knobs.int("host") == 1;
        patch(cx, phases, host).map(|p| vec![p])
    }
}

fn patch(cx: &Evaluated, phases: &[Phase], host: bool) -> Result<Patch, PassError> {
    let l = &cx.job.local;
    let on = |d: u32, f: fn(&DeviceKind) -> bool| l.devices.get(d as usize).is_some_and(f);
    let cpu = |d: u32| on(d, |k| matches!(k, DeviceKind::CpuThread { .. }));
    let gpu = |d: u32| {
        on(d, |k| {
            matches!(
                k,
                DeviceKind::GpuStream { .. } | DeviceKind::CommStream { .. }
            )
        })
    };
    // What the edges say about each op, three flags rather than adjacency lists (the advice
    // step proposes this pass on the best plan from several threads at once).
    let n = l.ops.len();
    let (mut starts_gpu, mut feeds_collective, mut after_gpu) =
        (vec![false; n], vec![false; n], vec![false; n]);
    for &(a, b) in &l.edges {
        let (a, b) = (a as usize, b as usize);
        let (Some(from), Some(to)) = (l.ops.get(a), l.ops.get(b)) else {
            continue;
        };
        starts_gpu[a] |= gpu(to.spec.device);
        feeds_collective[a] |= to.spec.kind == OpKind::Collective;
        after_gpu[b] |= gpu(from.spec.device);
    }
    // The host's usual launch: the median launch that starts GPU work.
    let mut launches: Vec<u64> = l
        .ops
        .iter()
        .enumerate()
        .filter(|(i, o)| o.spec.kind == OpKind::Launch && starts_gpu[*i])
        .map(|(_, o)| o.spec.dur_ns)
        .collect();
    if launches.is_empty() {
        return Err(PassError::NotApplicable {
            pass: NAME.into(),
            why: "the job has no CPU kernel launches to capture (a zoo model does not model the \
                  host; give a trace)"
                .into(),
        });
    }
    launches.sort_unstable();
    let usual = launches[launches.len() / 2];
    let mut edits = Vec::new();
    let (mut removed, mut count) = (0u64, 0usize);
    let mut regions: std::collections::BTreeSet<(u32, Phase)> = Default::default();
    let mut order: Vec<usize> = (0..l.ops.len()).collect();
    order.sort_by_key(|&i| (l.ops[i].spec.device, i));
    for i in order {
        let s = &l.ops[i].spec;
        if !cpu(s.device) || !phases.contains(&s.phase) {
            continue;
        }
        let collective = feeds_collective[i];
        // A wait on the GPU (a blocking call's tail) ends a capture: it stays.
        let waits = after_gpu[i];
        // Data loading is not in the captured region.
        let loading = l
            .layers
            .get(s.layer as usize)
            .is_some_and(|n| n.contains("DataLoader"));
        let captured = match s.kind {
            OpKind::Launch => !collective,
            OpKind::CpuOther => host && !waits && !loading,
            _ => false,
        };
        if !captured {
            continue;
        }
        let first = regions.insert((s.device, s.phase)) && s.kind == OpKind::Launch;
        let dur = if first { usual.min(s.dur_ns) } else { 0 };
        removed += s.dur_ns - dur;
        if host {
            removed += s.gap_ns;
        }
        count += 1;
        edits.push(Edit::SetDuration {
            op: i as OpId,
            dur_ns: dur,
        });
    }
    if host {
        edits.push(Edit::ClearGaps {
            ops: edits
                .iter()
                .filter_map(|e| match e {
                    Edit::SetDuration { op, .. } => Some(*op),
                    _ => None,
                })
                .collect(),
        });
    }
    Ok(Patch {
        pass: NAME.into(),
        why: format!(
            "{count} host {} in {} captured region(s) replaced by one graph launch each ({:.1} µs, the step's median launch): {:.2} ms of host time removed",
            if host {
                "operations and launches"
            } else {
                "kernel launches"
            },
            regions.len(),
            usual as f64 / 1e3,
            removed as f64 / 1e6
        ),
        edits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::job::{JobMeta, LocalGraph, LocalOp};
    use crate::graph::{NONE, OpSpec};
    use crate::passes::{apply_all, evaluate, find, registry, resolve_knobs};

    /// A host-bound step: 4 launches of 20 µs each, every kernel 5 µs, then the step end.
    fn host_bound() -> crate::graph::job::Job {
        let mut g = LocalGraph {
            devices: vec![
                DeviceKind::Virtual,
                DeviceKind::CpuThread {
                    worker: 0,
                    thread: 0,
                },
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                },
            ],
            layers: vec![crate::graph::job::STEP_END_LAYER.into()],
            ..LocalGraph::default()
        };
        let mut prev_l: Option<OpId> = None;
        let mut prev_k: Option<OpId> = None;
        for _ in 0..4 {
            g.ops.push(LocalOp {
                spec: OpSpec::new(OpKind::Launch, Phase::Fw, 1, 20_000),
                work: None,
            });
            let l = (g.ops.len() - 1) as OpId;
            g.ops.push(LocalOp {
                spec: OpSpec::compute(2, Phase::Fw, NONE, 5_000),
                work: None,
            });
            let k = (g.ops.len() - 1) as OpId;
            g.edges.push((l, k));
            if let Some(p) = prev_l {
                g.edges.push((p, l));
            }
            if let Some(p) = prev_k {
                g.edges.push((p, k));
            }
            prev_l = Some(l);
            prev_k = Some(k);
        }
        g.ops.push(LocalOp {
            spec: OpSpec {
                layer: 0,
                ..OpSpec::new(OpKind::Gap, Phase::Other, 1, 0)
            },
            work: None,
        });
        let end = (g.ops.len() - 1) as OpId;
        g.edges.push((prev_l.unwrap(), end));
        let mut j = crate::passes::recompute::tests::chain(&[1000], &[0]);
        j.local = g.into();
        j.syncs.clear();
        j.meta = JobMeta {
            source: "trace".into(),
            ..JobMeta::default()
        };
        j
    }

    #[test]
    fn launches_collapse_to_one_graph_launch() {
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        let base = evaluate(host_bound()).unwrap();
        // Host-bound: four 20 µs launches, the last kernel ends at 85 µs.
        assert_eq!(base.makespan_ns(), 85_000);
        assert_eq!(base.iteration_ns(), 80_000);
        let patches = p.propose(&base, &resolve_knobs(p, &[]).unwrap()).unwrap();
        let after = evaluate(apply_all(&base.job, &patches).unwrap()).unwrap();
        // One graph launch of 20 µs (the median launch), then the kernels back to back.
        assert_eq!(after.makespan_ns(), 20_000 + 4 * 5_000);
        assert!(patches[0].why.contains("0.06 ms"), "{}", patches[0].why);
        // A zoo job has no launches: refused.
        let zoo = evaluate(crate::passes::recompute::tests::chain(&[1000], &[0])).unwrap();
        assert!(matches!(
            p.propose(&zoo, &resolve_knobs(p, &[]).unwrap()),
            Err(PassError::NotApplicable { .. })
        ));
        assert!(resolve_knobs(p, &[("host".into(), "2".into())]).is_err());
    }
}
