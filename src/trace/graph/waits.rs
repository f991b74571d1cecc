//! Stage *waits*: blocking calls (`cudaDeviceSynchronize`, `cudaStreamSynchronize`,
//! `cudaEventSynchronize`, blocking copies and sets) get an edge from every GPU op they waited
//! for into their wait op, which keeps only the recorded time after the last of them ended; and
//! `cudaStreamWaitEvent` becomes a stream → stream edge, from its `cuda_sync` record or, without
//! one, inferred from the launching thread's order (see the module docs of `graph`).

use std::collections::{BTreeMap, BTreeSet};

use super::super::kineto::{Category, Event, Id, RuntimeCall};
use super::streams::{GpuOps, GpuWork};
use super::threads::CpuOps;
use super::{Builder, StepWindow, ns};
use crate::graph::OpId;

/// Per stream, (GPU event, op) in recorded order.
type ByStream = BTreeMap<(Id, i64), Vec<(usize, OpId)>>;

/// Launch time of a GPU event (its launch's ts; its own ts when uncorrelated).
fn launch_ts(ev: &[Event], gpu: &GpuWork, g: usize) -> i64 {
    ev[g]
        .args
        .correlation
        .and_then(|c| gpu.launch_of.get(&c))
        .map_or(ev[g].ts_ns, |&l| ev[l].ts_ns)
}

/// The last op of `stream` launched before `t`.
fn last_before(
    ev: &[Event],
    gpu: &GpuWork,
    stream: &[(usize, OpId)],
    t: i64,
) -> Option<(usize, OpId)> {
    stream
        .iter()
        .rev()
        .find(|&&(g, _)| launch_ts(ev, gpu, g) < t)
        .copied()
}

/// Streams whose id is `s` (any process).
fn streams_of_id(by_stream: &ByStream, s: i64) -> Vec<&Vec<(usize, OpId)>> {
    by_stream
        .iter()
        .filter(|((_, k), _)| *k == s)
        .map(|(_, v)| v)
        .collect()
}

/// Blocking calls: waited-for GPU ops → wait op.
pub(super) fn blocking(
    b: &mut Builder,
    ev: &[Event],
    win: &StepWindow,
    gpu: &GpuWork,
    cpu: &CpuOps,
    ops: &GpuOps,
) {
    let sync_ev: BTreeMap<i64, &Event> = ev
        .iter()
        .filter(|e| e.cat == Category::CudaSync)
        .filter_map(|e| e.args.correlation.map(|c| (c, e)))
        .collect();
    let call_by_corr: BTreeMap<i64, &Event> = ev
        .iter()
        .filter(|e| e.runtime_call().is_some())
        .filter_map(|e| e.args.correlation.map(|c| (c, e)))
        .collect();
    for (&ei, &wait) in cpu.seg_op.iter() {
        let e = &ev[ei];
        let Some(call) = e.runtime_call() else {
            continue;
        };
        if !cpu.waits.contains(&ei) {
            continue;
        }
        let mut waited: Vec<(usize, OpId)> = Vec::new();
        if let Some(c) = e.args.correlation {
            for &g in gpu.gpu_by_corr.get(&c).map_or(&[][..], Vec::as_slice) {
                if let Some(&op) = ops.gpu_op.get(&g) {
                    waited.push((g, op));
                }
            }
        }
        if waited.is_empty() {
            let se = e.args.correlation.and_then(|c| sync_ev.get(&c));
            let rec = se
                .and_then(|s| s.args.wait_on_cuda_event_record_corr_id)
                .filter(|&c| c >= 0)
                .and_then(|c| call_by_corr.get(&c));
            let on_stream = se
                .and_then(|s| s.args.wait_on_stream.filter(|&x| x >= 0))
                .or_else(|| {
                    se.and_then(|s| s.args.stream.filter(|&x| x >= 0))
                        .filter(|_| call == RuntimeCall::StreamSynchronize)
                });
            let t = rec.map_or(e.ts_ns, |r| r.ts_ns);
            let lists: Vec<&Vec<(usize, OpId)>> = match (call, on_stream) {
                (RuntimeCall::DeviceSynchronize, _) | (_, None) => ops.by_stream.values().collect(),
                (_, Some(s)) => streams_of_id(&ops.by_stream, s),
            };
            for l in lists {
                waited.extend(last_before(ev, gpu, l, t));
            }
        }
        // Only GPU work that ended before the call returned was waited for.
        waited.retain(|&(g, _)| ev[g].end_ns() <= e.end_ns() + 1_000);
        if waited.is_empty() {
            continue;
        }
        let g_end = waited
            .iter()
            .map(|&(g, _)| ev[g].end_ns())
            .max()
            .unwrap_or(0);
        let from = cpu.issue_op.get(&ei).map_or(e.ts_ns, |&i| {
            b.recorded[i as usize] + b.local.ops[i as usize].spec.dur_ns as i64
        });
        let tail = e.end_ns().min(win.end_ns) - g_end.max(from);
        b.local.ops[wait as usize].spec.dur_ns = ns(tail);
        for (_, op) in waited {
            b.local.edges.push((op, wait));
        }
    }
}

/// Stream → stream edges of `cudaStreamWaitEvent`; returns the warnings (waits that could not
/// be modelled).
pub(super) fn stream_waits(
    b: &mut Builder,
    ev: &[Event],
    win: &StepWindow,
    gpu: &GpuWork,
    ops: &GpuOps,
    name: &str,
) -> Vec<String> {
    let (lo, hi) = (win.start_ns, win.end_ns);
    let mut warnings = Vec::new();
    let call_by_corr: BTreeMap<i64, &Event> = ev
        .iter()
        .filter(|e| e.runtime_call().is_some())
        .filter_map(|e| e.args.correlation.map(|c| (c, e)))
        .collect();
    // cuda_sync "Wait Event" records: recorded stream → waiting stream.
    let mut from_records = 0usize;
    let mut handled: BTreeSet<i64> = BTreeSet::new();
    for s in ev.iter().filter(|e| e.cat == Category::CudaSync) {
        let is_wait = s
            .args
            .sync_kind
            .as_deref()
            .or(Some(&*s.name))
            .is_some_and(|k| k.contains("Wait Event"));
        if !is_wait {
            continue;
        }
        let (Some(a), Some(rec), Some(c)) = (
            s.args.wait_on_stream.filter(|&x| x >= 0),
            s.args
                .wait_on_cuda_event_record_corr_id
                .and_then(|c| call_by_corr.get(&c)),
            s.args.correlation,
        ) else {
            continue;
        };
        let Some(call) = gpu.launch_of.get(&c).map(|&i| &ev[i]) else {
            continue;
        };
        let waiting = s.args.stream.or_else(|| s.tid.trailing_number());
        let Some(wb) = waiting else { continue };
        let from = streams_of_id(&ops.by_stream, a)
            .into_iter()
            .filter_map(|l| last_before(ev, gpu, l, rec.ts_ns))
            .max_by_key(|&(g, _)| ev[g].end_ns());
        let to = streams_of_id(&ops.by_stream, wb)
            .into_iter()
            .filter_map(|l| {
                l.iter()
                    .find(|&&(g, _)| launch_ts(ev, gpu, g) > call.ts_ns)
                    .copied()
            })
            .min_by_key(|&(g, _)| ev[g].ts_ns);
        handled.insert(c);
        if let (Some((_, f)), Some((_, t))) = (from, to)
            && f != t
        {
            b.local.edges.push((f, t));
            from_records += 1;
        }
    }
    // Without a cuda_sync record: inferred from the launching thread's order. The waiting stream
    // is the stream of the thread's next launch after the wait; the recorded stream is the stream
    // of its last launch before the preceding cudaEventRecord on another stream (the pattern of
    // c10d: record on the compute stream, wait on the NCCL stream, and back; when the trace has no
    // cudaEventRecord, the wait's own time stands for the record). An inferred edge is kept only
    // if the recorded times satisfy it.
    // Per launching thread: (launch time, stream, GPU event, GPU op), in launch order.
    type Launched = (i64, (Id, i64), usize, OpId);
    let mut by_thread: BTreeMap<(Id, Id), Vec<Launched>> = BTreeMap::new();
    for (key, list) in &ops.by_stream {
        for &(g, op) in list {
            if let Some(&l) = ev[g].args.correlation.and_then(|c| gpu.launch_of.get(&c)) {
                by_thread
                    .entry((ev[l].pid.clone(), ev[l].tid.clone()))
                    .or_default()
                    .push((ev[l].ts_ns, key.clone(), g, op));
            }
        }
    }
    for v in by_thread.values_mut() {
        v.sort_by_key(|&(t, _, g, _)| (t, g));
    }
    let mut records: BTreeMap<(Id, Id), Vec<i64>> = BTreeMap::new();
    for e in ev.iter().filter(|e| {
        e.runtime_call() == Some(RuntimeCall::EventRecord) && e.ts_ns < hi && e.pid == win.pid
    }) {
        records
            .entry((e.pid.clone(), e.tid.clone()))
            .or_default()
            .push(e.ts_ns);
    }
    for v in records.values_mut() {
        v.sort_unstable();
    }
    let (mut inferred, mut unmodelled) = (0usize, 0usize);
    for e in ev.iter().filter(|e| {
        e.runtime_call() == Some(RuntimeCall::StreamWaitEvent)
            && e.ts_ns >= lo
            && e.ts_ns < hi
            && e.pid == win.pid
            && e.args.correlation.is_none_or(|c| !handled.contains(&c))
    }) {
        let th = (e.pid.clone(), e.tid.clone());
        let launches = by_thread.get(&th).map_or(&[][..], Vec::as_slice);
        let rec = records
            .get(&th)
            .and_then(|r| {
                let i = r.partition_point(|&t| t < e.ts_ns);
                i.checked_sub(1).map(|i| r[i])
            })
            .or(Some(e.ts_ns));
        let next = launches.iter().find(|x| x.0 > e.ts_ns);
        let edge = match (rec, next) {
            (Some(rt), Some(to)) => launches
                .iter()
                .rev()
                .find(|x| x.0 < rt && x.1 != to.1)
                .map(|from| (from, to)),
            _ => None,
        };
        match edge {
            Some((from, to)) if ev[from.2].end_ns() <= ev[to.2].ts_ns + 1_000 => {
                b.local.edges.push((from.3, to.3));
                inferred += 1;
            }
            _ => unmodelled += 1,
        }
    }
    if inferred + from_records > 0 {
        tracing::info!(
            file = name,
            from_cuda_sync = from_records,
            inferred,
            "cudaStreamWaitEvent without cuda_sync records: stream → stream edges inferred from \
             the launch order"
        );
    }
    if unmodelled > 0 {
        warnings.push(format!(
            "{unmodelled} cudaStreamWaitEvent calls in the step have no cuda_sync record and no \
             stream pair could be inferred from the launch order; their stream → stream edges are \
             not modelled"
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, sync_trace, wait_trace};
    use super::super::{pick_step, streams, threads};
    use super::*;
    use crate::graph::OpKind;

    /// The stages up to *waits* on a trace.
    fn staged(json: &str) -> (Builder, Vec<String>, Vec<Event>) {
        let t = parse(json);
        let win = pick_step(&t, "t", None).unwrap();
        let mut th = threads::collect(&t.events, &win);
        let mut gpu = streams::collect(&t.events, &win, &th);
        let mut carry = streams::carry_in(&t.events, &win, &gpu);
        let mut b = Builder::default();
        b.local.devices.push(crate::graph::DeviceKind::Virtual);
        let cpu = threads::build(&mut b, &t.events, &mut th, &win, &gpu.gpu_by_corr);
        let ops = streams::build(&mut b, &t.events, &win, &mut gpu, &mut carry, &cpu);
        blocking(&mut b, &t.events, &win, &gpu, &cpu, &ops);
        let w = stream_waits(&mut b, &t.events, &win, &gpu, &ops, "t");
        (b, w, t.events)
    }

    #[test]
    fn a_device_synchronize_waits_for_the_kernel() {
        let (b, w, _) = staged(&sync_trace());
        assert!(w.is_empty());
        let l = &b.local;
        let k = l
            .ops
            .iter()
            .position(|o| o.spec.kind == OpKind::Compute)
            .unwrap() as OpId;
        // The wait op: 80 − 75 = 5 µs after the kernel's end, with an edge from the kernel.
        let waits: Vec<u64> = l
            .edges
            .iter()
            .filter(|e| e.0 == k && l.ops[e.1 as usize].spec.kind == OpKind::CpuOther)
            .map(|e| l.ops[e.1 as usize].spec.dur_ns)
            .collect();
        assert_eq!(waits, vec![5_000]);
    }

    #[test]
    fn an_unrecorded_stream_wait_is_inferred_or_reported() {
        let (b, w, _) = staged(&wait_trace(61));
        assert!(w.is_empty());
        let l = &b.local;
        let cross = l.edges.iter().filter(|e| {
            l.ops[e.0 as usize].spec.kind == OpKind::Compute
                && l.ops[e.1 as usize].spec.kind == OpKind::Compute
                && l.ops[e.0 as usize].spec.device != l.ops[e.1 as usize].spec.device
        });
        assert_eq!(cross.count(), 1);
        let (_, w, _) = staged(&wait_trace(45));
        assert_eq!(w.len(), 1);
    }
}
