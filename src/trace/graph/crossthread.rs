//! Stage *cross-thread waits*: the step's thread blocked while another thread of the process
//! works — the main thread inside `loss.backward()` while the autograd engine's device thread
//! runs the backward (the pattern of every PyTorch training step with CUDA tensors).
//!
//! Recorded as is, the main thread shows that wait as one long annotation (`## backward ##`) or
//! as idle time, with a fixed duration: a what-if that speeds the backward up could not end the
//! wait earlier, and the step would look host-bound whatever the GPU does. Here, a *burst* of
//! another thread (its ops with no more than 1 ms of idle time between them, at least 1 ms
//! long) during which the step's thread does nothing of its own (only an annotation, or idle)
//! becomes two edges: from the step thread's last op before the burst (the call) to the burst's
//! first op, and from the burst's last op to the step thread's piece after it (the return). The
//! step thread's annotation is cut around the burst (the part before and the part after stay
//! with their recorded durations), the idle time before the burst on the other thread is
//! dropped (it waited for the call), and the idle time on the step's thread is replaced by those
//! edges. Replayed as recorded nothing moves; in a what-if the return follows the backward.

use super::super::kineto::{Category, Event};
use super::threads::CpuOps;
use super::{Builder, StepWindow};
use crate::graph::{OpId, OpKind, OpSpec};

/// Idle time that ends a burst, and the shortest burst that counts, ns.
const BURST_GAP_NS: i64 = 1_000_000;
/// Tolerance on the recorded times lining up, ns.
const SLACK_NS: i64 = 50_000;

/// The op before `op` on its device (through an explicit edge).
fn device_pred(b: &Builder, op: OpId) -> Option<OpId> {
    let dev = b.local.ops[op as usize].spec.device;
    b.local
        .edges
        .iter()
        .filter(|e| e.1 == op && b.local.ops[e.0 as usize].spec.device == dev)
        .map(|e| e.0)
        .max()
}

/// Add the waits; returns the return op of each burst linked, with its recorded end (ns on the
/// trace's clock): its duration is settled against a replay once the job is built (the other
/// thread's replay need not end exactly when it did — launches it made while the launch queue
/// was full, for one — and the step's thread must still return when it did).
pub(super) fn cross_thread(
    b: &mut Builder,
    ev: &[Event],
    win: &StepWindow,
    cpu: &mut CpuOps,
) -> Vec<(OpId, i64)> {
    let Some(main) = cpu.timeline.get(&win.tid).cloned() else {
        return Vec::new();
    };
    let idle = |b: &Builder, op: OpId| -> bool {
        let o = &b.local.ops[op as usize].spec;
        o.kind == OpKind::Gap
            || (o.kind == OpKind::CpuOther
                && b.op_event[op as usize].is_some_and(|e| ev[e].cat == Category::UserAnnotation))
    };
    let mut linked = Vec::new();
    let others: Vec<_> = cpu
        .timeline
        .iter()
        .filter(|(t, _)| **t != win.tid)
        .map(|(_, v)| v.clone())
        .collect();
    let mut main = main;
    // Bursts of every other thread: runs of ops with at most BURST_GAP_NS of idle time between
    // them, longest first — when two threads work while the step's thread waits, it waits for
    // the longer one (autograd's, not a pin-memory thread's), and each stretch of the step's
    // thread is linked to one burst at most.
    let mut bursts: Vec<(i64, i64, OpId, OpId)> = Vec::new();
    for tl in &others {
        let mut i = 0;
        while i < tl.len() {
            let mut j = i;
            while j + 1 < tl.len() && tl[j + 1].0 - tl[j].1 <= BURST_GAP_NS {
                j += 1;
            }
            if tl[j].1 - tl[i].0 >= BURST_GAP_NS {
                bursts.push((tl[i].0, tl[j].1, tl[i].2, tl[j].2));
            }
            i = j + 1;
        }
    }
    bursts.sort_by_key(|&(b0, b1, first, _)| (std::cmp::Reverse(b1 - b0), b0, first));
    let mut used: Vec<(i64, i64)> = Vec::new();
    {
        for (b0, b1, first, last) in bursts {
            if used.iter().any(|&(s, e)| s < b1 && b0 < e) {
                continue;
            }
            // The step thread's own work during the burst.
            let busy: i64 = main
                .iter()
                .filter(|&&(_, _, op)| !idle(b, op))
                .map(|&(s, e, _)| (e.min(b1) - s.max(b0)).max(0))
                .sum();
            if busy * 10 > b1 - b0 {
                continue;
            }
            // Either an annotation piece spans the burst, or the thread idles through it.
            let cover = main
                .iter()
                .position(|&(s, e, op)| s <= b0 && e + SLACK_NS >= b1 && idle(b, op));
            let (call, resume) = match cover {
                Some(k) => {
                    let (s, e, w) = main[k];
                    // Cut the annotation: W keeps [s, b0), a new piece [b1, e) follows the burst.
                    let spec = b.local.ops[w as usize].spec.clone();
                    let gap = spec.gap_ns;
                    b.local.ops[w as usize].spec.dur_ns = (b0 - s).max(0) as u64;
                    b.local.ops[w as usize].spec.gap_ns = 0;
                    let tail = b.push(
                        OpSpec {
                            dur_ns: (e - b1).max(0) as u64,
                            gap_ns: gap,
                            ..spec
                        },
                        b1,
                    );
                    if let Some(ev_w) = b.op_event[w as usize] {
                        b.set_event(tail, ev_w);
                    }
                    for edge in b.local.edges.iter_mut() {
                        if edge.0 == w
                            && b.local.ops[edge.1 as usize].spec.device
                                == b.local.ops[w as usize].spec.device
                        {
                            edge.0 = tail;
                        }
                    }
                    b.local.edges.push((w, tail));
                    main[k] = (s, b0, w);
                    main.insert(k + 1, (b1, e, tail));
                    used.push((s, e));
                    (w, tail)
                }
                None => {
                    let Some(p) = main.iter().rposition(|&(_, e, _)| e <= b0 + SLACK_NS) else {
                        continue;
                    };
                    let Some(&(n_start, _, n)) = main.get(p + 1) else {
                        continue;
                    };
                    if n_start + SLACK_NS < b1 {
                        continue;
                    }
                    let (_, p_end, pop) = main[p];
                    let dev = b.local.ops[pop as usize].spec.device;
                    // The idle time becomes two gap ops: before the burst (the call is made at
                    // its end) and after it (the return).
                    let gap = |b: &mut Builder, from: i64, to: i64| {
                        b.push(
                            OpSpec::new(
                                OpKind::Gap,
                                crate::graph::Phase::Other,
                                dev,
                                (to - from).max(0) as u64,
                            ),
                            from,
                        )
                    };
                    b.local.ops[pop as usize].spec.gap_ns = 0;
                    let pre = gap(b, p_end, b0);
                    let rest = gap(b, b1, n_start);
                    b.local.edges.retain(|e| !(e.0 == pop && e.1 == n));
                    b.local.edges.extend([(pop, pre), (pre, rest), (rest, n)]);
                    main.insert(p + 1, (b1, n_start, rest));
                    used.push((p_end, n_start));
                    (pre, rest)
                }
            };
            // The other thread waited for the call: its idle time before the burst goes.
            if let Some(prev) = device_pred(b, first) {
                let p = &mut b.local.ops[prev as usize].spec;
                if p.kind == OpKind::Gap {
                    p.dur_ns = 0;
                }
                p.gap_ns = 0;
            }
            b.local.edges.push((call, first));
            b.local.edges.push((last, resume));
            let end = b.recorded[resume as usize] + b.local.ops[resume as usize].spec.dur_ns as i64;
            linked.push((resume, end));
        }
    }
    cpu.timeline.insert(win.tid.clone(), main);
    linked
}

#[cfg(test)]
mod tests {
    use super::super::tests::{doc, kernel, parse, x};
    use super::super::{Peers, build};
    use crate::graph::OpKind;
    use crate::replay::replay;

    /// Step 0–10 ms on thread 1: a forward op [0.2, 1), then `## backward ##` [1, 9.2) while
    /// thread 2 (autograd) runs the backward [1.2, 8.8) and launches a kernel; the optimizer
    /// [9.2, 9.8).
    fn trace() -> String {
        doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 10_000, None),
            x("cpu_op", "aten::mm", 1, 200, 800, None),
            x("user_annotation", "## backward ##", 1, 1_000, 8_200, None),
            x("cpu_op", "MmBackward0", 2, 1_200, 7_600, None),
            x("cuda_runtime", "cudaLaunchKernel", 2, 4_000, 4, Some(1)),
            kernel("gemm", 7, 4_010, 1_000, 1, 4_000),
            x("cpu_op", "Optimizer.step#SGD.step", 1, 9_200, 600, None),
        ])
    }

    #[test]
    fn the_step_thread_waits_for_the_backward_thread() {
        let t = build(&parse(&trace()), "t", None, Peers::Absent).unwrap();
        let g = t.job.expand().unwrap();
        let r = replay(&g);
        // As recorded.
        assert_eq!(r.end_ns[t.step_end as usize], 10_000_000);
        // Halve the backward's CPU op (the pieces of MmBackward0 on thread 2): the step thread
        // returns from the backward earlier by as much.
        let mut j = t.job.clone();
        let mut cut = 0;
        for (i, o) in j.local_mut().ops.iter_mut().enumerate() {
            if o.spec.kind == OpKind::CpuOther
                && t.op_event[i].is_some_and(|e| {
                    crate::trace::parse_kineto(trace().as_bytes(), "t")
                        .unwrap()
                        .events[e]
                        .name
                        .as_ref()
                        == "MmBackward0"
                })
            {
                cut += o.spec.dur_ns / 2;
                o.spec.dur_ns /= 2;
            }
        }
        assert!(cut > 3_000_000, "{cut}");
        let r = replay(&j.expand().unwrap());
        assert_eq!(r.end_ns[t.step_end as usize], 10_000_000 - cut);
    }
}
