//! Stages *streams*, *carry-in* and *collectives*: which GPU work belongs to the step (launched
//! from it, or uncorrelated and starting in it), each stream's ops in recorded order with an
//! explicit edge between consecutive ones, the launch → GPU op edges, the work still running
//! from the previous step when the window opens (carried in, first on its stream), and the
//! NCCL/RCCL kernels as `Collective` ops — on the worker's comm stream when their stream runs
//! nothing else.

use std::collections::{BTreeMap, BTreeSet};

use super::super::kineto::{Category, Event, Id};
use super::threads::CpuOps;
use super::{Builder, StepWindow, TraceCollective, is_gpu, ns};
use crate::graph::{DeviceKind, NONE, OpId, OpKind, OpSpec, Phase};

/// GPU stream key of a GPU event: (pid, stream).
pub(super) fn stream_key(e: &Event) -> (Id, i64) {
    let s = e
        .args
        .stream
        .or_else(|| e.tid.trailing_number())
        .unwrap_or(0);
    (e.pid.clone(), s)
}

pub(super) fn is_nccl(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("nccl") || n.contains("rccl")
}

/// The step's GPU work, by stream, and how it links to the CPU.
#[derive(Clone, Debug, Default)]
pub(super) struct GpuWork {
    /// Runtime calls in the window by correlation id.
    pub launch_of: BTreeMap<i64, usize>,
    /// The step's GPU events per stream (unsorted).
    pub streams: BTreeMap<(Id, i64), Vec<usize>>,
    /// The step's GPU events by the correlation id of their launch.
    pub gpu_by_corr: BTreeMap<i64, Vec<usize>>,
}

/// Stage *streams* (selection): GPU events launched from the window's threads, or uncorrelated
/// and starting in the window.
pub(super) fn collect(
    ev: &[Event],
    win: &StepWindow,
    threads: &BTreeMap<Id, Vec<usize>>,
) -> GpuWork {
    let (lo, hi) = (win.start_ns, win.end_ns);
    let mut out = GpuWork::default();
    for idx in threads.values() {
        for &i in idx {
            if let (Some(_), Some(c)) = (ev[i].runtime_call(), ev[i].args.correlation) {
                out.launch_of.insert(c, i);
            }
        }
    }
    let corr_anywhere: BTreeSet<i64> = ev
        .iter()
        .filter(|e| e.runtime_call().is_some())
        .filter_map(|e| e.args.correlation)
        .collect();
    for (i, e) in ev.iter().enumerate() {
        if !is_gpu(e) {
            continue;
        }
        let inside = match e.args.correlation {
            Some(c) if out.launch_of.contains_key(&c) => true,
            Some(c) if corr_anywhere.contains(&c) => false,
            _ => e.ts_ns >= lo && e.ts_ns < hi,
        };
        if inside {
            out.streams.entry(stream_key(e)).or_default().push(i);
        }
    }
    for &g in out.streams.values().flatten() {
        if let Some(c) = ev[g].args.correlation {
            out.gpu_by_corr.entry(c).or_default().push(g);
        }
    }
    out
}

/// GPU events whose link to their launch cannot be trusted, as warnings with counts: several
/// GPU events on one correlation id of a launch that starts one (every call but a graph launch),
/// and GPU events that start before their launch did (the replay starts them after it, so the
/// step may replay longer than it was measured).
pub(super) fn oddities(ev: &[Event], gpu: &GpuWork) -> Vec<String> {
    let mut out = Vec::new();
    let (mut shared, mut extra) = (0usize, 0usize);
    let mut first_shared: Option<(i64, usize, usize)> = None;
    let (mut early, mut lead_ns) = (0usize, 0i64);
    let mut first_early: Option<usize> = None;
    for (&c, list) in &gpu.gpu_by_corr {
        let Some(&l) = gpu.launch_of.get(&c) else {
            continue;
        };
        let graph = matches!(
            ev[l].runtime_call(),
            Some(super::super::kineto::RuntimeCall::GraphLaunch)
        );
        if list.len() > 1 && !graph {
            shared += 1;
            extra += list.len() - 1;
            first_shared.get_or_insert((c, list[0], list[1]));
        }
        for &g in list {
            let lead = ev[l].ts_ns - ev[g].ts_ns;
            if lead > 0 {
                early += 1;
                lead_ns = lead_ns.max(lead);
                first_early.get_or_insert(g);
            }
        }
    }
    if let Some((c, a, b)) = first_shared {
        out.push(format!(
            "{shared} launch(es) have more than one GPU event with their correlation id ({extra} \
             extra; first: correlation {c}, \"{}\" event #{a} and \"{}\" event #{b}): each is \
             placed after the launch, but a launch starts one kernel — the trace may be merged or \
             corrupt",
            ev[a].name, ev[b].name
        ));
    }
    if let Some(g) = first_early {
        out.push(format!(
            "{early} GPU event(s) start before their launch (by up to {:.3} µs; first: \"{}\" \
             event #{g}): the replay starts them after it, so the step may replay longer than \
             measured (CPU and GPU clocks disagree)",
            lead_ns as f64 / 1e3,
            ev[g].name
        ));
    }
    out
}

/// Stage *carry-in* (selection): per stream of the step, the GPU work launched before the window
/// that still runs when it opens.
pub(super) fn carry_in(
    ev: &[Event],
    win: &StepWindow,
    gpu: &GpuWork,
) -> BTreeMap<(Id, i64), Vec<usize>> {
    let (lo, hi) = (win.start_ns, win.end_ns);
    let launch_ts_any: BTreeMap<i64, i64> = ev
        .iter()
        .filter(|e| e.runtime_call().is_some())
        .filter_map(|e| e.args.correlation.map(|c| (c, e.ts_ns)))
        .collect();
    let mut out: BTreeMap<(Id, i64), Vec<usize>> = BTreeMap::new();
    for (i, e) in ev.iter().enumerate() {
        if !(is_gpu(e) && e.end_ns() > lo && e.ts_ns < hi) {
            continue;
        }
        let Some(c) = e.args.correlation else {
            continue;
        };
        if gpu.launch_of.contains_key(&c) || launch_ts_any.get(&c).is_none_or(|&t| t >= lo) {
            continue;
        }
        let k = stream_key(e);
        if gpu.streams.contains_key(&k) {
            out.entry(k).or_default().push(i);
        }
    }
    out
}

/// What the GPU side of the step became.
#[derive(Clone, Debug, Default)]
pub(super) struct GpuOps {
    /// GPU event → its op.
    pub gpu_op: BTreeMap<usize, OpId>,
    /// Per stream, (event, op) in recorded order.
    pub by_stream: BTreeMap<(Id, i64), Vec<(usize, OpId)>>,
    /// GPU work carried in from the previous step: (event, op).
    pub carried: Vec<(usize, OpId)>,
    /// The step's NCCL/RCCL kernels.
    pub collectives: Vec<TraceCollective>,
}

/// The carried-in work of one stream as its first ops: each with its recorded duration (the
/// part inside the window for the one running when it opens) and the idle time between them
/// as `Gap` ops, so that launches of this step blocked on a full queue can wait for them.
/// Returns the stream's last op.
fn carry_in_ops(
    b: &mut Builder,
    ev: &[Event],
    dev: u32,
    lo: i64,
    list: &mut [usize],
    carried: &mut Vec<(usize, OpId)>,
) -> Option<OpId> {
    list.sort_by_key(|&i| (ev[i].ts_ns, i));
    let carry_layer = b.layer(crate::graph::job::CARRY_IN_LAYER);
    let mut prev: Option<OpId> = None;
    let mut t = lo;
    for &i in list.iter() {
        let e = &ev[i];
        let start = e.ts_ns.max(t);
        if start > t {
            let g = b.push(
                OpSpec {
                    layer: carry_layer,
                    ..OpSpec::new(OpKind::Gap, Phase::Other, dev, ns(start - t))
                },
                t,
            );
            if let Some(p) = prev {
                b.local.edges.push((p, g));
            }
            prev = Some(g);
        }
        let kind = if is_nccl(&e.name) {
            OpKind::Collective
        } else if e.cat == Category::Memcpy {
            OpKind::Memcpy
        } else {
            OpKind::Compute
        };
        let phase = if kind == OpKind::Collective {
            Phase::Comm
        } else {
            Phase::Other
        };
        let op = b.push(
            OpSpec {
                layer: carry_layer,
                ..OpSpec::new(kind, phase, dev, ns(e.end_ns() - start))
            },
            start,
        );
        b.set_event(op, i);
        if let Some(p) = prev {
            b.local.edges.push((p, op));
        }
        prev = Some(op);
        carried.push((i, op));
        t = e.end_ns().max(t);
    }
    prev
}

/// Stages *streams*, *carry-in* and *collectives* (ops): one device per stream (the first stream
/// running only NCCL/RCCL kernels is the comm stream), its carried-in work, then its step's GPU
/// ops in recorded order, each after its launch.
pub(super) fn build(
    b: &mut Builder,
    ev: &[Event],
    win: &StepWindow,
    gpu: &mut GpuWork,
    carry: &mut BTreeMap<(Id, i64), Vec<usize>>,
    cpu: &CpuOps,
) -> GpuOps {
    let mut out = GpuOps::default();
    let mut comm_taken = false;
    let mut stream_no = 0u32;
    for (key, idx) in gpu.streams.iter_mut() {
        idx.sort_by_key(|&i| (ev[i].ts_ns, i));
        let all_nccl = idx.iter().all(|&i| is_nccl(&ev[i].name));
        let dev = b.local.devices.len() as u32;
        if all_nccl && !comm_taken {
            comm_taken = true;
            b.local.devices.push(DeviceKind::CommStream { worker: 0 });
        } else {
            b.local.devices.push(DeviceKind::GpuStream {
                worker: 0,
                stream: stream_no,
            });
            stream_no += 1;
        }
        let mut prev = match carry.get_mut(key) {
            Some(list) => carry_in_ops(b, ev, dev, win.start_ns, list, &mut out.carried),
            None => None,
        };
        let list = out.by_stream.entry(key.clone()).or_default();
        for &i in idx.iter() {
            let e = &ev[i];
            let launch = e
                .args
                .correlation
                .and_then(|c| gpu.launch_of.get(&c))
                .copied();
            let (kind, phase, layer) = if is_nccl(&e.name) {
                let l = b.layer(&e.name);
                (OpKind::Collective, Phase::Comm, l)
            } else {
                let kind = match e.cat {
                    Category::Memcpy => OpKind::Memcpy,
                    _ => OpKind::Compute,
                };
                let (ph, l) = launch
                    .and_then(|l| cpu.seg_op.get(&l).or_else(|| cpu.issue_op.get(&l)))
                    .map_or((Phase::Other, NONE), |&o| {
                        let s = &b.local.ops[o as usize].spec;
                        (s.phase, s.layer)
                    });
                (kind, ph, l)
            };
            let op = b.push(
                OpSpec {
                    layer,
                    ..OpSpec::new(kind, phase, dev, ns(e.dur_ns))
                },
                e.ts_ns,
            );
            b.set_event(op, i);
            if let Some(p) = prev {
                b.local.edges.push((p, op));
            }
            prev = Some(op);
            if let Some(l) = launch {
                // A blocking call launches from its issue op.
                if let Some(&from) = cpu.issue_op.get(&l).or_else(|| cpu.seg_op.get(&l)) {
                    b.local.edges.push((from, op));
                }
            }
            out.gpu_op.insert(i, op);
            list.push((i, op));
            if kind == OpKind::Collective {
                out.collectives.push(TraceCollective {
                    op,
                    event: i,
                    name: e.name.to_string(),
                    start_ns: e.ts_ns,
                    dur_ns: ns(e.dur_ns),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{doc, kernel, parse, x};
    use super::super::{build_job, pick_step};
    use super::*;

    /// Step [100, 200) µs; kernel A (launched at 50, before the step) runs [90, 130): carried
    /// in; kernel B launched at 110 runs [130, 150); a NCCL kernel on its own stream.
    fn trace() -> String {
        doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("user_annotation", "ProfilerStep#2", 1, 100, 100, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 50, 5, Some(1)),
            kernel("A", 7, 90, 40, 1, 50),
            x("cuda_runtime", "cudaLaunchKernel", 1, 110, 5, Some(2)),
            kernel("B", 7, 130, 20, 2, 110),
            x("cuda_runtime", "cudaLaunchKernel", 1, 120, 5, Some(3)),
            kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 9, 140, 30, 3, 120),
        ])
    }

    #[test]
    fn selection_and_carry_in() {
        let t = parse(&trace());
        let win = pick_step(&t, "t", Some(2)).unwrap();
        let th = super::super::threads::collect(&t.events, &win);
        let gpu = collect(&t.events, &win, &th);
        let names = |v: &[usize]| -> Vec<String> {
            v.iter().map(|&i| t.events[i].name.to_string()).collect()
        };
        let streams: Vec<Vec<String>> = gpu.streams.values().map(|v| names(v)).collect();
        assert_eq!(
            streams,
            vec![
                vec!["B".to_string()],
                vec!["ncclKernel_AllReduce_RING_LL_Sum_float".to_string()]
            ]
        );
        let carry = carry_in(&t.events, &win, &gpu);
        let carried: Vec<Vec<String>> = carry.values().map(|v| names(v)).collect();
        assert_eq!(carried, vec![vec!["A".to_string()]]);
    }

    #[test]
    fn streams_carry_in_and_collectives_as_ops() {
        let t = build_job(&parse(&trace()), "t", Some(2)).unwrap();
        let l = &t.job.local;
        // The carried-in kernel: 30 µs of it inside the window, first on stream 7.
        let carried: Vec<&crate::graph::job::LocalOp> = l
            .ops
            .iter()
            .filter(|o| {
                l.layers.get(o.spec.layer as usize).map(String::as_str)
                    == Some(crate::graph::job::CARRY_IN_LAYER)
            })
            .collect();
        assert_eq!(carried.len(), 1);
        assert_eq!(carried[0].spec.dur_ns, 30_000);
        assert_eq!(t.collectives.len(), 1);
        let c = &l.ops[t.collectives[0].op as usize];
        assert_eq!(
            (c.spec.kind, c.spec.phase),
            (OpKind::Collective, Phase::Comm)
        );
        assert!(matches!(
            l.devices[c.spec.device as usize],
            DeviceKind::CommStream { .. }
        ));
        // B waits for the carried-in A (stream order) and for its launch.
        let b_op = l
            .ops
            .iter()
            .position(|o| o.spec.kind == OpKind::Compute && o.spec.dur_ns == 20_000)
            .unwrap() as OpId;
        let preds: Vec<OpKind> = l
            .edges
            .iter()
            .filter(|e| e.1 == b_op)
            .map(|e| l.ops[e.0 as usize].spec.kind)
            .collect();
        assert!(
            preds.contains(&OpKind::Compute) && preds.contains(&OpKind::Launch),
            "{preds:?}"
        );
    }
}
