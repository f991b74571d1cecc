//! Stage *threads*: the step's CPU threads, each flattened into non-overlapping segments
//! attributed to their innermost event, and turned into ops (`Launch`, `CpuOther`, a leading
//! `Gap`, the step-end marker) with the host's idle time kept as gaps. Blocking calls and
//! launches whose GPU work started before they returned are split into an issue op and the
//! rest (the *waits* and *launches* stages add their edges).
//!
//! Layers: a CPU operator that autograd recorded carries a sequence number, and the backward
//! node autograd runs for it carries the same one. Ops are grouped into one layer per sequence
//! number, named after the forward operator that spans it longest (`aten::conv2d #17`: the 17th
//! `aten::conv2d` of the step's forward), so a layer has forward and backward ops like a zoo
//! layer (what recomputation works on). Operators without a sequence number inherit their
//! enclosing operator's layer, else take their own name.

use std::collections::BTreeMap;

use super::super::kineto::{Category, Event, Id, RuntimeCall};
use super::super::phase::name_phase;
use super::{Builder, StepWindow, is_cpu, launches_gpu, ns};
use crate::graph::{DeviceKind, NONE, OpId, OpKind, OpSpec, Phase};

/// The step's CPU threads (the step marker's process only): thread → its events in the window,
/// the step markers themselves excluded. The step's own thread is always present.
pub(super) fn collect(ev: &[Event], win: &StepWindow) -> BTreeMap<Id, Vec<usize>> {
    let (lo, hi) = (win.start_ns, win.end_ns);
    let mut threads: BTreeMap<Id, Vec<usize>> = BTreeMap::new();
    for (i, e) in ev.iter().enumerate() {
        if !is_cpu(e) || e.pid != win.pid || e.end_ns() <= lo || e.ts_ns >= hi {
            continue;
        }
        if e.profiler_step().is_some() {
            continue;
        }
        threads.entry(e.tid.clone()).or_default().push(i);
    }
    threads.entry(win.tid.clone()).or_default();
    threads
}

/// Layer names by autograd sequence number, from the forward operators of the window.
#[derive(Clone, Debug, Default)]
pub(super) struct SeqLayers {
    /// Sequence number → layer name.
    pub names: BTreeMap<i64, String>,
}

impl SeqLayers {
    /// Name each sequence number after the forward operator with the longest span carrying it,
    /// numbered per operator name in forward order.
    pub fn new(ev: &[Event], threads: &BTreeMap<Id, Vec<usize>>) -> SeqLayers {
        // seq → (span, first ts, name)
        let mut best: BTreeMap<i64, (i64, i64, &str)> = BTreeMap::new();
        for &i in threads.values().flatten() {
            let e = &ev[i];
            let Some(s) = e.args.seq.filter(|&s| s >= 0) else {
                continue;
            };
            if e.cat != Category::CpuOp || name_phase(&e.name).is_some() {
                continue;
            }
            let slot = best.entry(s).or_insert((e.dur_ns, e.ts_ns, &e.name));
            if e.dur_ns > slot.0 {
                *slot = (e.dur_ns, slot.1.min(e.ts_ns), &e.name);
            } else {
                slot.1 = slot.1.min(e.ts_ns);
            }
        }
        let mut order: Vec<(i64, i64, &str)> = best.iter().map(|(&s, v)| (v.1, s, v.2)).collect();
        order.sort_unstable();
        let mut count: BTreeMap<&str, u32> = BTreeMap::new();
        let names = order
            .into_iter()
            .map(|(_, s, n)| {
                let k = count.entry(n).or_default();
                *k += 1;
                (s, format!("{n} #{k}"))
            })
            .collect();
        SeqLayers { names }
    }
}

/// One flattened piece of a CPU thread: `[start, end)` of event `ev` (index into the trace).
#[derive(Clone, Copy, Debug)]
pub(super) struct Seg {
    pub start: i64,
    pub end: i64,
    pub ev: usize,
    /// The last piece of its event.
    pub last: bool,
    pub phase: Phase,
    pub layer: u32,
}

/// An open event while flattening: (index, clipped end, phase, layer, layer from a sequence
/// number).
type Open = (usize, i64, Phase, u32, bool);

/// Flatten one thread's events (indices, any order) within `[lo, hi)`. Records each event's
/// enclosing event in `b.parent`.
pub(super) fn flatten(
    ev: &[Event],
    idx: &mut [usize],
    lo: i64,
    hi: i64,
    b: &mut Builder,
    seq: &SeqLayers,
) -> Vec<Seg> {
    idx.sort_by_key(|&i| (ev[i].ts_ns, std::cmp::Reverse(ev[i].end_ns()), i));
    let mut stack: Vec<Open> = Vec::new();
    let mut out: Vec<Seg> = Vec::new();
    let mut t = lo;
    let emit = |out: &mut Vec<Seg>, s: i64, e: i64, top: &Open, last: bool| {
        if e > s || last {
            out.push(Seg {
                start: s,
                end: e.max(s),
                ev: top.0,
                last,
                phase: top.2,
                layer: top.3,
            });
        }
    };
    let close_until = |stack: &mut Vec<Open>, out: &mut Vec<Seg>, t: &mut i64, until: i64| {
        while let Some(top) = stack.last().copied() {
            if top.1 > until {
                break;
            }
            emit(out, *t, top.1, &top, true);
            *t = (*t).max(top.1);
            stack.pop();
        }
    };
    for &i in idx.iter() {
        let e = &ev[i];
        let (s, mut end) = (e.ts_ns.max(lo), e.end_ns().min(hi));
        if end < s {
            continue;
        }
        close_until(&mut stack, &mut out, &mut t, s);
        if let Some(top) = stack.last().copied() {
            if t < s {
                emit(&mut out, t, s, &top, false);
            }
            end = end.min(top.1);
            b.parent.insert(i, top.0);
        }
        t = t.max(s);
        let parent_phase = stack.last().map_or(Phase::Fw, |p| p.2);
        let phase = name_phase(&e.name).unwrap_or(parent_phase);
        let named = e
            .args
            .seq
            .filter(|&s| s >= 0)
            .filter(|_| e.cat == Category::CpuOp)
            .map(|s| {
                seq.names
                    .get(&s)
                    .cloned()
                    .unwrap_or_else(|| format!("{} #{s}", e.name))
            });
        let (layer, from_seq) = match (named, stack.last()) {
            (Some(n), _) => (b.layer(&n), true),
            (None, Some(p)) if p.4 || e.cat != Category::CpuOp => (p.3, p.4),
            (None, _) if e.cat == Category::CpuOp => (b.layer(&e.name), false),
            (None, _) => (NONE, false),
        };
        stack.push((i, end, phase, layer, from_seq));
    }
    close_until(&mut stack, &mut out, &mut t, i64::MAX);
    out
}

/// What the CPU side of the step became.
#[derive(Clone, Debug, Default)]
pub(super) struct CpuOps {
    /// Event → op of its last piece.
    pub seg_op: BTreeMap<usize, OpId>,
    /// Blocking or split event → its issue op.
    pub issue_op: BTreeMap<usize, OpId>,
    /// Blocking calls (events) whose wait op gets edges from the GPU work they waited for.
    pub waits: std::collections::BTreeSet<usize>,
    /// Launches slow enough to have been blocked on a full launch queue: (launch op, recorded
    /// start, recorded end, launch event).
    pub stalled: Vec<(OpId, i64, i64, usize)>,
    /// The zero-length op ending the step on the step's thread.
    pub step_end: OpId,
    /// The window's usual (median) launch time, ns.
    pub usual_launch: i64,
    /// Per CPU-thread device: its ops with their recorded `[start, end)`, in order (the memory
    /// stage finds the op running at an allocator event).
    pub timeline: BTreeMap<Id, Vec<(i64, i64, OpId)>>,
}

/// Turn every thread's segments into ops (see the module docs of `graph`).
pub(super) fn build(
    b: &mut Builder,
    ev: &[Event],
    threads: &mut BTreeMap<Id, Vec<usize>>,
    win: &StepWindow,
    gpu_by_corr: &BTreeMap<i64, Vec<usize>>,
) -> CpuOps {
    let (lo, hi) = (win.start_ns, win.end_ns);
    let seq = SeqLayers::new(ev, threads);
    let mut out = CpuOps {
        step_end: NONE,
        ..CpuOps::default()
    };
    // Launch back-pressure: a launch far slower than the thread's usual one, while the GPU is
    // busy, was blocked on a full launch queue. Typical launch time: the median over the window.
    let mut launch_durs: Vec<i64> = threads
        .values()
        .flatten()
        .filter(|&&i| {
            ev[i].runtime_call().is_some_and(launches_gpu)
                && ev[i]
                    .args
                    .correlation
                    .is_some_and(|c| gpu_by_corr.contains_key(&c))
        })
        .map(|&i| ev[i].dur_ns)
        .collect();
    launch_durs.sort_unstable();
    out.usual_launch = launch_durs.get(launch_durs.len() / 2).copied().unwrap_or(0);
    let stall_threshold = (4 * out.usual_launch).max(30_000);

    for (thread_no, (tid, idx)) in threads.iter_mut().enumerate() {
        let dev = b.local.devices.len() as u32;
        b.local.devices.push(DeviceKind::CpuThread {
            worker: 0,
            thread: thread_no as u32,
        });
        let segs = flatten(ev, idx, lo, hi, b, &seq);
        let timeline = out.timeline.entry(tid.clone()).or_default();
        let mut prev: Option<(OpId, i64)> = None; // op, recorded end
        let mut chain = |b: &mut Builder, op: OpId, start: i64, end: i64| {
            match prev {
                Some((p, pend)) => {
                    b.local.ops[p as usize].spec.gap_ns = ns(start - pend);
                    b.local.edges.push((p, op));
                }
                None if start > lo => {
                    let g = b.push(
                        OpSpec::new(OpKind::Gap, Phase::Other, dev, ns(start - lo)),
                        lo,
                    );
                    b.local.edges.push((g, op));
                }
                None => {}
            }
            timeline.push((start, end, op));
            prev = Some((op, end));
        };
        for s in &segs {
            let e = &ev[s.ev];
            let call = e.runtime_call();
            let own: &[usize] = match (call, e.args.correlation) {
                (Some(c), Some(corr)) if launches_gpu(c) => {
                    gpu_by_corr.get(&corr).map_or(&[], Vec::as_slice)
                }
                _ => &[],
            };
            let launches = !own.is_empty();
            let dur = s.end - s.start;
            // Part of the call before its GPU work started (all of it when the work was queued).
            let pre = own
                .iter()
                .map(|&g| ev[g].ts_ns)
                .min()
                .map_or(0, |t| (t - s.start).clamp(0, dur));
            // Blocking by name, or in effect: its GPU work ended before it returned (a
            // cudaMemcpyAsync from pageable memory).
            let block = s.last
                && (call.is_some_and(blocking)
                    || launches && own.iter().all(|&g| ev[g].end_ns() <= s.end));
            let split = s.last && launches && pre < dur;
            if block || split {
                let kind = if launches {
                    OpKind::Launch
                } else {
                    OpKind::CpuOther
                };
                let issue = b.push(
                    OpSpec {
                        layer: s.layer,
                        ..OpSpec::new(kind, s.phase, dev, ns(pre))
                    },
                    s.start,
                );
                chain(b, issue, s.start, s.start + pre);
                out.issue_op.insert(s.ev, issue);
                if block {
                    out.waits.insert(s.ev);
                }
            }
            // The rest of a split launch is launch time too; a blocking call's rest is a wait.
            let kind = if launches && !block {
                OpKind::Launch
            } else {
                OpKind::CpuOther
            };
            let start = if block || split {
                s.start + pre
            } else {
                s.start
            };
            let op = b.push(
                OpSpec {
                    layer: s.layer,
                    ..OpSpec::new(kind, s.phase, dev, ns(s.end - start))
                },
                start,
            );
            b.set_event(op, s.ev);
            chain(b, op, start, s.end);
            if s.last {
                out.seg_op.insert(s.ev, op);
                if kind == OpKind::Launch && s.end - start > stall_threshold {
                    out.stalled.push((op, start, s.end, s.ev));
                }
            }
        }
        if *tid == win.tid {
            let m = b.push(OpSpec::new(OpKind::Gap, Phase::Other, dev, 0), hi);
            let step_end = b.layer(crate::graph::job::STEP_END_LAYER);
            b.local.ops[m as usize].spec.layer = step_end;
            chain(b, m, hi, hi);
            out.step_end = m;
        }
    }
    out
}

/// Whether a runtime call waits for the GPU.
pub(super) fn blocking(c: RuntimeCall) -> bool {
    matches!(
        c,
        RuntimeCall::DeviceSynchronize
            | RuntimeCall::StreamSynchronize
            | RuntimeCall::EventSynchronize
            | RuntimeCall::Memcpy { blocking: true }
            | RuntimeCall::Memset { blocking: true }
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{doc, parse, x};
    use super::*;

    fn x_seq(name: &str, tid: u32, ts: u64, dur: u64, seq: u32) -> String {
        format!(
            r#"{{"ph":"X","cat":"cpu_op","name":"{name}","pid":100,"tid":{tid},"ts":{ts},"dur":{dur},"args":{{"Sequence number":{seq}}}}}"#
        )
    }

    #[test]
    fn threads_of_the_step_process_only() {
        let t = parse(&doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("cpu_op", "aten::mm", 1, 10, 30, None),
            x("cpu_op", "aten::add", 2, 20, 10, None),
            // Another process, and an event after the window.
            r#"{"ph":"X","cat":"cpu_op","name":"other","pid":7,"tid":1,"ts":10,"dur":5}"#.into(),
            x("cpu_op", "late", 1, 150, 5, None),
        ]));
        let win = StepWindow {
            label: "ProfilerStep#1".into(),
            number: 1,
            start_ns: 0,
            end_ns: 100_000,
            pid: Id::Num(100),
            tid: Id::Num(1),
            complete: true,
        };
        let th = collect(&t.events, &win);
        let names: Vec<Vec<&str>> = th
            .values()
            .map(|v| v.iter().map(|&i| &*t.events[i].name).collect())
            .collect();
        assert_eq!(names, vec![vec!["aten::mm"], vec!["aten::add"]]);
    }

    #[test]
    fn forward_and_backward_share_a_layer_by_sequence_number() {
        // Forward conv2d ⊃ cudnn_convolution (seq 5), then its backward node (seq 5) on another
        // thread; a view without a sequence number inside the conv inherits its layer.
        let t = parse(&doc(&[
            x_seq("aten::conv2d", 1, 0, 50, 5),
            x_seq("aten::cudnn_convolution", 1, 10, 30, 5),
            x("cpu_op", "aten::view", 1, 15, 5, None),
            x_seq("aten::relu", 1, 60, 10, 6),
            x_seq("CudnnConvolutionBackward", 2, 100, 40, 5),
            x(
                "cpu_op",
                "aten::cudnn_convolution_backward",
                2,
                110,
                20,
                None,
            ),
        ]));
        let win = StepWindow {
            label: "w".into(),
            number: 1,
            start_ns: 0,
            end_ns: 200_000,
            pid: Id::Num(100),
            tid: Id::Num(1),
            complete: true,
        };
        let mut th = collect(&t.events, &win);
        let seq = SeqLayers::new(&t.events, &th);
        assert_eq!(
            seq.names.get(&5).map(String::as_str),
            Some("aten::conv2d #1")
        );
        let mut b = Builder::default();
        let mut layers = Vec::new();
        for idx in th.values_mut() {
            for s in flatten(&t.events, idx, 0, 200_000, &mut b, &seq) {
                layers.push((
                    t.events[s.ev].name.to_string(),
                    b.local.layers[s.layer as usize].clone(),
                    s.phase,
                ));
            }
        }
        let of = |n: &str| layers.iter().find(|l| l.0 == n).cloned().unwrap();
        assert_eq!(of("aten::view").1, "aten::conv2d #1");
        assert_eq!(of("aten::relu").1, "aten::relu #1");
        let bw = of("aten::cudnn_convolution_backward");
        assert_eq!((bw.1.as_str(), bw.2), ("aten::conv2d #1", Phase::Bw));
        // The view's parent is recorded (the conv).
        let view = t
            .events
            .iter()
            .position(|e| &*e.name == "aten::view")
            .unwrap();
        assert_eq!(
            t.events[b.parent[&view]].name.as_ref(),
            "aten::cudnn_convolution"
        );
    }
}
