//! `shard:prefetch=N` (N ≥ 2) on a recorded FSDP2 step: every unit's all-gather is issued `N`
//! units ahead of the unit computing, as FSDP2's explicit prefetch lists do
//! (`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` with the next `N`
//! units of each pass, what `trainplan export --to pytorch` writes).
//!
//! **What FSDP2 does** (PyTorch 2.9, `torch/distributed/fsdp/_fully_shard/_fsdp_state.py` and
//! `_fsdp_param_group.py`): a module's pre-hook all-gathers its own parameters unless a
//! prefetch already did (`FSDP::all_gather`), copies them out for the compute
//! (`FSDP::all_gather_copy_out`), then issues the all-gathers of the modules in its prefetch
//! list that are not gathered yet. Before copying out, the all-gather streams wait for the
//! copy-out before it (the event that frees the previous all-gather's buffer), so an
//! all-gather issued right after copy-out `j` waits for copy-out `j − 1`. The recorded step ran
//! FSDP2's own schedule: the forward gathers one unit ahead implicitly (the CPU reaches the next
//! pre-hook while the GPU computes), the backward prefetches one unit explicitly; `N` = 1 is
//! that step.
//!
//! **The edit.** Per pass (the forward's first all-gathers, then the backward's again-gathers,
//! each in recorded order `P_0, P_1, …`), the host ops of all-gather `P_m` (m ≥ 1) — one run on
//! the step's thread: copy-in, collective call, event records and waits — move, with the
//! kernels they launch, to just after:
//!
//! * forward: the copy-out of `P_max(m−N, 0)` (the root, `P_0`, prefetches `P_1 … P_N`);
//! * backward: the copy-out of `P_(m−N)`, or for m < N the all-gather before it (the root's
//!   pre-backward hook prefetches `P_0 … P_(N−1)`, the root itself being gathered throughout);
//!
//! and never after the all-gather before it (the collectives keep their order on their
//! streams, so the ranks still match). The thread's order is rebuilt; the moved all-gather's
//! waits for earlier copy-outs are replaced by the one FSDP2 issues before it (copy-out `j − 1`
//! when it follows copy-out `j`; none when it follows another all-gather, whose waits its
//! stream order inherits); any other wait from another stream whose waited-for op is now
//! launched after it waits for the last op of that stream launched before it instead.
//! Memory follows the ops: with `profile_memory` events each gathered buffer is allocated
//! where its all-gather now runs; the estimate from shapes has no gathered copies.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::PassError;
use crate::graph::job::{FsdpSpan, Job};
use crate::graph::{DeviceId, DeviceKind, OpId, OpKind};

/// A recorded span (unit, nth).
type Key = (u32, u32);

/// One span's ops: its host ops in thread order and the GPU ops they launched.
#[derive(Default)]
struct Span {
    host: Vec<OpId>,
    gpu: Vec<OpId>,
}

/// What `prefetch=N` changes: the edges to drop and to add, and the all-gathers moved.
pub(super) struct Prefetched {
    pub drop: Vec<(OpId, OpId)>,
    pub add: Vec<(OpId, OpId)>,
    pub moved: Vec<Key>,
}

/// A span in words for a refusal: "unit transformer.h.0's backward all-gather".
fn span_name(job: &Job, k: Key, what: &str) -> String {
    let unit = job
        .meta
        .trace
        .as_ref()
        .and_then(|t| t.sharding.as_ref())
        .map_or_else(|| k.0.to_string(), |s| s.unit_label(k.0 as usize));
    let pass = match k.1 {
        0 => "forward".to_string(),
        1 => "backward".to_string(),
        n => format!("gather #{}", n + 1),
    };
    format!("unit {unit}'s {pass} {what}")
}

fn refuse(why: String) -> PassError {
    PassError::NotApplicable {
        pass: "shard".into(),
        why,
    }
}

/// The step's all-gather and copy-out spans, and the thread their host ops run on.
fn spans(job: &Job) -> Result<(BTreeMap<Key, Span>, BTreeMap<Key, Span>, DeviceId), PassError> {
    let l = &job.local;
    let (mut ag, mut co): (BTreeMap<Key, Span>, BTreeMap<Key, Span>) = Default::default();
    let mut threads = BTreeSet::new();
    for (&op, lab) in &l.fsdp {
        let map = match lab.span {
            FsdpSpan::AllGather => &mut ag,
            FsdpSpan::CopyOut => &mut co,
            _ => continue,
        };
        let span = map.entry((lab.unit, lab.nth)).or_default();
        let dev = l.ops[op as usize].spec.device;
        if matches!(
            l.devices.get(dev as usize),
            Some(DeviceKind::CpuThread { .. })
        ) {
            threads.insert(dev);
            span.host.push(op);
        } else {
            span.gpu.push(op);
        }
    }
    match threads.len() {
        1 => Ok((ag, co, threads.into_iter().next().unwrap_or_default())),
        0 => Err(refuse(
            "prefetch: the recorded step ran no FSDP2 all-gather to issue earlier (on a world of one FSDP2 gathers nothing)".into(),
        )),
        _ => Err(refuse(
            "prefetch: the recorded FSDP2 hooks ran on several host threads; only one thread's order can be rebuilt".into(),
        )),
    }
}

/// The thread's ops in order, their positions, and each GPU op's launch.
struct Thread {
    order: Vec<OpId>,
    launch: HashMap<OpId, OpId>,
}

impl Thread {
    fn new(job: &Job, dev: DeviceId) -> Result<Thread, PassError> {
        let l = &job.local;
        let dfg = job.local_dfg().map_err(|e| {
            refuse(format!(
                "prefetch: the recorded step's graph does not order: {e}"
            ))
        })?;
        let order: Vec<OpId> = dfg
            .topo_order()
            .iter()
            .copied()
            .filter(|&o| l.ops[o as usize].spec.device == dev)
            .collect();
        let launch = l
            .edges
            .iter()
            .filter(|&&(a, b)| {
                l.ops[a as usize].spec.kind == OpKind::Launch
                    && l.ops[a as usize].spec.device == dev
                    && l.ops[b as usize].spec.device != dev
            })
            .map(|&(a, b)| (b, a))
            .collect();
        Ok(Thread { order, launch })
    }

    fn positions(&self) -> HashMap<OpId, usize> {
        self.order
            .iter()
            .enumerate()
            .map(|(i, &o)| (o, i))
            .collect()
    }

    fn index(&self, op: OpId) -> usize {
        self.order.iter().position(|&o| o == op).unwrap_or(0)
    }
}

/// Where each moved all-gather went: after which host op, and the copy-out whose wait it
/// now comes after (`None`: it follows another all-gather).
struct Moved {
    key: Key,
    after_copy_out: Option<Key>,
}

/// Moves the all-gathers of one pass (`list`, recorded order) in `t.order`.
fn move_pass(
    job: &Job,
    t: &mut Thread,
    list: &[Key],
    forward: bool,
    n: usize,
    ag: &BTreeMap<Key, Span>,
    co: &BTreeMap<Key, Span>,
    out: &mut Vec<Moved>,
) -> Result<(), PassError> {
    let last = |s: Option<&Span>, what: &str, k: Key| {
        s.and_then(|s| s.host.last().copied()).ok_or_else(|| {
            refuse(format!(
                "prefetch: {} was not recorded (no FSDP:: hook span of it in the step)",
                span_name(job, k, what)
            ))
        })
    };
    for m in 1..list.len() {
        let anchor = if forward {
            Some(list[m.saturating_sub(n)])
        } else if m >= n {
            Some(list[m - n])
        } else {
            None
        };
        let prev_end = last(ag.get(&list[m - 1]), "all-gather", list[m - 1])?;
        let (at, after_copy_out) = match anchor {
            Some(k) => {
                let a = last(co.get(&k), "copy-out", k)?;
                if t.index(a) >= t.index(prev_end) {
                    (a, Some(k))
                } else {
                    (prev_end, None)
                }
            }
            None => (prev_end, None),
        };
        let span = &ag[&list[m]];
        let first = t.index(span.host[0]);
        let at_i = t.index(at);
        if at_i + 1 >= first {
            continue;
        }
        let len = span.host.len();
        let ops: Vec<OpId> = t.order.drain(first..first + len).collect();
        t.order.splice(at_i + 1..at_i + 1, ops);
        out.push(Moved {
            key: list[m],
            after_copy_out,
        });
    }
    Ok(())
}

/// The edits of `prefetch=n` (n ≥ 2) on `job`, a recorded FSDP2 step.
pub(super) fn prefetch(job: &Job, n: u32) -> Result<Prefetched, PassError> {
    let (mut ag, mut co, dev) = spans(job)?;
    if let Some((k, _)) = ag.iter().find(|(_, s)| {
        s.host
            .iter()
            .chain(&s.gpu)
            .any(|o| job.local.fused.contains_key(o))
    }) {
        return Err(refuse(format!(
            "an earlier pass fused {} with other ops: apply shard before op-fusion",
            span_name(job, *k, "all-gather")
        )));
    }
    let mut t = Thread::new(job, dev)?;
    let pos = t.positions();
    let spans = ag
        .iter_mut()
        .map(|(k, s)| (k, s, "all-gather"))
        .chain(co.iter_mut().map(|(k, s)| (k, s, "copy-out")));
    for (k, s, what) in spans {
        s.host
            .sort_by_key(|o| pos.get(o).copied().unwrap_or(usize::MAX));
        // A span with no host op (its launch removed by an earlier pass) is refused here too:
        // every later use of `host[0]` rests on this check.
        let (a, b) = (
            s.host.first().and_then(|o| pos.get(o)),
            s.host.last().and_then(|o| pos.get(o)),
        );
        if !matches!((a, b), (Some(&a), Some(&b)) if b - a + 1 == s.host.len()) {
            return Err(refuse(format!(
                "prefetch: {}'s hook span is not one run of host ops on its thread",
                span_name(job, *k, what)
            )));
        }
    }
    let by_pos = |m: &BTreeMap<Key, Span>, keep: &dyn Fn(&Key) -> bool| {
        let mut v: Vec<Key> = m.keys().copied().filter(|k| keep(k)).collect();
        v.sort_by_key(|k| pos[&m[k].host[0]]);
        v
    };
    let forward = by_pos(&ag, &|k| k.1 == 0);
    let backward = by_pos(&ag, &|k| k.1 >= 1);
    let copy_outs = by_pos(&co, &|_| true);
    let mut moved = Vec::new();
    let n = n as usize;
    move_pass(job, &mut t, &forward, true, n, &ag, &co, &mut moved)?;
    move_pass(job, &mut t, &backward, false, n, &ag, &co, &mut moved)?;
    let mut out = Prefetched {
        drop: Vec::new(),
        add: Vec::new(),
        moved: moved.iter().map(|m| m.key).collect(),
    };
    if moved.is_empty() {
        return Ok(out);
    }
    rechain(job, dev, &t, &mut out);
    let new_pos = t.positions();
    for m in &moved {
        rewait(job, &t, &new_pos, &ag[&m.key], &co, &copy_outs, m, &mut out);
    }
    Ok(out)
}

/// The thread's order edges: the recorded ones that no longer hold go, the new ones come.
fn rechain(job: &Job, dev: DeviceId, t: &Thread, out: &mut Prefetched) {
    let l = &job.local;
    let on = |o: OpId| l.ops[o as usize].spec.device == dev;
    let old: BTreeSet<(OpId, OpId)> = l
        .edges
        .iter()
        .copied()
        .filter(|&(a, b)| on(a) && on(b))
        .collect();
    let new: BTreeSet<(OpId, OpId)> = t.order.windows(2).map(|w| (w[0], w[1])).collect();
    out.drop.extend(old.difference(&new).copied());
    out.add.extend(new.difference(&old).copied());
}

/// The moved all-gather's waits on other streams, as FSDP2 issues them from its new place.
#[allow(clippy::too_many_arguments)]
fn rewait(
    job: &Job,
    t: &Thread,
    pos: &HashMap<OpId, usize>,
    span: &Span,
    co: &BTreeMap<Key, Span>,
    copy_outs: &[Key],
    m: &Moved,
    out: &mut Prefetched,
) {
    let l = &job.local;
    let dev_of = |o: OpId| l.ops[o as usize].spec.device;
    let launched = |o: OpId| t.launch.get(&o).and_then(|a| pos.get(a)).copied();
    let here = pos.get(&span.host[0]).copied().unwrap_or(0);
    let mine: BTreeSet<OpId> = span.host.iter().chain(&span.gpu).copied().collect();
    let copy_out_op = |o: OpId| l.fsdp.get(&o).is_some_and(|f| f.span == FsdpSpan::CopyOut);
    for &(src, dst) in &l.edges {
        if mine.contains(&src) || dev_of(src) == dev_of(dst) {
            continue;
        }
        if span.host.contains(&dst) {
            // A GPU op the span's launch waited for (a full launch queue): one launched after
            // the span's new place would make a cycle; the wait it stood for is gone.
            if launched(src).is_some_and(|p| p > here) {
                out.drop.push((src, dst));
            }
            continue;
        }
        if !span.gpu.contains(&dst) {
            continue;
        }
        if matches!(
            l.devices.get(dev_of(src) as usize),
            Some(DeviceKind::CpuThread { .. })
        ) {
            continue;
        }
        if copy_out_op(src) {
            out.drop.push((src, dst));
            continue;
        }
        if launched(src).is_some_and(|p| p > here) {
            out.drop.push((src, dst));
            // The last op of that stream launched before the all-gather's new place.
            let earlier = l
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.spec.device == dev_of(src))
                .filter_map(|(i, _)| launched(i as OpId).map(|p| (p, i as OpId)))
                .filter(|&(p, _)| p < here)
                .max();
            if let Some((_, e)) = earlier {
                out.add.push((e, dst));
            }
        }
    }
    // FSDP2's wait before this all-gather: the copy-out before the one it follows.
    let Some(k) = m.after_copy_out else {
        return;
    };
    let Some(i) = copy_outs.iter().position(|c| *c == k).filter(|&i| i > 0) else {
        return;
    };
    let Some(src) = co[&copy_outs[i - 1]]
        .gpu
        .iter()
        .copied()
        .max_by_key(|&o| launched(o))
    else {
        return;
    };
    // The first op of the all-gather on each of its streams.
    let mut first: BTreeMap<DeviceId, (usize, OpId)> = BTreeMap::new();
    for &g in &span.gpu {
        let p = launched(g).unwrap_or(usize::MAX);
        let e = first.entry(dev_of(g)).or_insert((p, g));
        if p < e.0 {
            *e = (p, g);
        }
    }
    out.add.extend(first.values().map(|&(_, g)| (src, g)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::fsdp_trace::{Requested, propose};
    use crate::passes::{Edit, Patch, evaluate};

    /// Units root, transformer.h.0 (1), transformer.h.1 (2), both blocks resharded.
    fn rank0() -> Job {
        crate::passes::testkit::fsdp2_rank0()
    }

    /// The first and last host op of (unit, span, nth) in the step thread's order.
    fn host_run(job: &Job, unit: u32, span: FsdpSpan, nth: u32) -> (usize, usize) {
        let (_, _, dev) = spans(job).unwrap();
        let t = Thread::new(job, dev).unwrap();
        let pos = t.positions();
        let ps: Vec<usize> = job
            .local
            .fsdp
            .iter()
            .filter(|(o, l)| {
                l.unit == unit && l.span == span && l.nth == nth && pos.contains_key(o)
            })
            .map(|(o, _)| pos[o])
            .collect();
        (*ps.iter().min().unwrap(), *ps.iter().max().unwrap())
    }

    /// Waits on `job`'s edges from a copy-out into the GPU ops of (unit, all-gather, nth).
    fn copy_out_waits(job: &Job, unit: u32, nth: u32) -> usize {
        let l = &job.local;
        let is = |o: &OpId, span: FsdpSpan, u: Option<u32>| {
            l.fsdp
                .get(o)
                .is_some_and(|f| f.span == span && u.is_none_or(|u| f.unit == u && f.nth == nth))
        };
        l.edges
            .iter()
            .filter(|(a, b)| {
                is(a, FsdpSpan::CopyOut, None)
                    && is(b, FsdpSpan::AllGather, Some(unit))
                    && l.ops[*a as usize].spec.device != l.ops[*b as usize].spec.device
            })
            .count()
    }

    /// `prefetch=2`: the root's pre-forward issues both blocks' all-gathers right after its
    /// copy-out, the root's pre-backward both blocks' backward all-gathers one after the
    /// other; block 1's forward all-gather no longer waits for the root's copy-out (FSDP2
    /// issued no wait before it there); nothing is lost and the step is not slower.
    #[test]
    fn prefetch_2_issues_each_gather_two_units_ahead() {
        let job = rank0();
        let cx = evaluate(job.clone()).unwrap();
        let s = job.meta.trace.as_ref().unwrap().sharding.clone().unwrap();
        let r = Requested {
            stage: 3,
            replicas: 1,
            reshard: true,
            prefetch: 2,
            offload: false,
            units_auto: true,
        };
        let p = propose(&cx, &s, r).unwrap();
        let [Patch { edits, why, .. }] = &p[..] else {
            panic!("one patch: {p:?}")
        };
        assert!(
            why.contains("2 forward and 1 backward all-gathers issued 2 units ahead"),
            "{why}"
        );
        let [Edit::ReplaceJob(after)] = &edits[..] else {
            panic!("a replaced job: {edits:?}")
        };
        assert_eq!(after.local.ops.len(), job.local.ops.len());
        let fw = FsdpSpan::AllGather;
        // Recorded: block 1 is gathered in its own pre-forward, after block 0's copy-out.
        let (_, co1) = host_run(&job, 1, FsdpSpan::CopyOut, 0);
        assert!(host_run(&job, 2, fw, 0).0 > co1);
        assert_eq!(
            copy_out_waits(&job, 2, 0),
            2,
            "the recorded wait, on both streams"
        );
        // Planned: root copy-out, block 0's all-gather, block 1's all-gather, in a row.
        let (_, root_co) = host_run(after, 0, FsdpSpan::CopyOut, 0);
        let (b0, b0_end) = host_run(after, 1, fw, 0);
        let (b1, _) = host_run(after, 2, fw, 0);
        assert_eq!((b0, b1), (root_co + 1, b0_end + 1));
        assert_eq!(copy_out_waits(after, 2, 0), 0);
        // Backward: block 0's all-gather follows block 1's at once.
        let (_, b1_bw_end) = host_run(after, 2, fw, 1);
        assert_eq!(host_run(after, 1, fw, 1).0, b1_bw_end + 1);
        let planned = evaluate((**after).clone()).unwrap();
        assert!(planned.iteration_ns() <= cx.iteration_ns() + cx.iteration_ns() / 1000);
        // prefetch=1 is the recorded step; 3 moves the same gathers (there are three units).
        let one = propose(&cx, &s, Requested { prefetch: 1, ..r }).unwrap();
        assert!(one.is_empty());
        let three = propose(&cx, &s, Requested { prefetch: 3, ..r }).unwrap();
        assert!(
            three[0].why.contains("2 forward and 1 backward"),
            "{}",
            three[0].why
        );
    }

    /// An all-gather an earlier pass fused with other ops cannot move alone.
    #[test]
    fn a_fused_gather_is_refused() {
        let mut job = rank0();
        let op = job
            .local
            .fsdp
            .iter()
            .find(|(_, l)| l.span == FsdpSpan::AllGather && l.unit == 2)
            .map(|(&o, _)| o)
            .unwrap();
        job.local_mut()
            .fused
            .insert(op, vec!["a".into(), "b".into()]);
        let Err(PassError::NotApplicable { why, .. }) = prefetch(&job, 2) else {
            panic!("refused")
        };
        assert!(why.contains("apply shard before op-fusion"), "{why}");
    }
}
