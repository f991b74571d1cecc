//! `shard` on a recorded FSDP2 step (`whatif --trace` / `plan --trace` of a `fully_shard` run):
//! the trace already shards, so the pass changes how, from what the step recorded
//! (`TraceFacts::sharding`, and each op's hook span in `LocalGraph::fsdp`, both from
//! `trace::fsdp`).
//!
//! **`reshard=0`** (FSDP2's `reshard_after_forward=False`; `stage=2`, SHARD_GRAD_OP, says the
//! same): every unit the step all-gathered again before its backward keeps its parameters
//! gathered from its forward instead. Its second `FSDP::all_gather` and
//! `FSDP::all_gather_copy_out` go — the host ops inside those spans (the copy-in, the
//! collective call, the event records and waits) and the kernels they launched — with the order
//! they imposed kept (`Edit::Remove`). Memory: the unit's gathered bytes (its first all-gather's
//! output) stay allocated from its `FSDP::post_forward`, which no longer frees them, to its
//! `FSDP::post_backward_reshard`, which does. With `profile_memory` events that is one
//! allocation added where the forward's copy was freed (the backward's allocation went with
//! its all-gather, the recorded free after the backward stays); with the estimate from shapes
//! (which has no gathered copies) the allocation and the free are both added.
//!
//! **`prefetch=N`**, N ≥ 2: every all-gather issued `N` units ahead of the unit computing, as
//! FSDP2's explicit prefetch lists do (`super::fsdp_prefetch`). With `reshard=0` too, the
//! backward all-gathers go first, then the rest move.
//!
//! **As recorded** (`stage=3`, `reshard=1`, `prefetch=1`, the defaults): nothing to change.
//!
//! **Refused, with the reason** (exit 3): `stage=1` (FSDP2 has no optimizer-only sharding),
//! `prefetch=0` (FSDP2 always gathers the next unit while one computes), `replicas` (HSDP),
//! `offload`, and `units` other than the recorded ones.

use std::collections::{BTreeMap, BTreeSet};

use super::{Edit, Evaluated, PassError, Patch};
use crate::graph::job::{FsdpSpan, Job, TraceSharding};
use crate::graph::{DeviceId, MemEffect, MemWhen, OpId, OpKind};

const NAME: &str = "shard";

/// What the `shard` knobs ask of a recorded step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Requested {
    pub stage: u32,
    pub reshard: bool,
    pub prefetch: u32,
    pub replicas: u32,
    pub offload: bool,
    /// `units=auto` (the recorded units).
    pub units_auto: bool,
}

fn refuse(why: String) -> PassError {
    PassError::NotApplicable {
        pass: NAME.into(),
        why,
    }
}

/// The first op (lowest id) of `unit`'s `nth` `span`.
fn first_of(cx: &Evaluated, unit: u32, span: FsdpSpan, nth: u32) -> Option<OpId> {
    cx.job
        .local
        .fsdp
        .iter()
        .find(|(_, l)| l.unit == unit && l.span == span && l.nth == nth)
        .map(|(&op, _)| op)
}

/// `op`'s memory effects plus `extra`.
fn with_effect(cx: &Evaluated, op: OpId, extra: MemEffect) -> Edit {
    let mut effects: Vec<MemEffect> = cx
        .job
        .local
        .mem
        .iter()
        .filter(|m| m.op == op)
        .copied()
        .collect();
    effects.push(extra);
    Edit::SetMem { op, effects }
}

/// Why the recorded FSDP2 step `s` cannot become `r`, if it cannot.
fn refusal(s: &TraceSharding, r: Requested) -> Option<String> {
    if r.stage == 1 {
        return Some("the trace ran FSDP2, which has no optimizer-only sharding: a recorded FSDP2 step cannot become stage 1 (stage=2 or reshard=0 keeps the parameters gathered from the forward to the backward)".into());
    }
    if r.prefetch == 0 {
        return Some("prefetch=0 cannot apply to a recorded FSDP2 step: FSDP2 always gathers the next unit while one computes (the recorded step is prefetch=1; prefetch=2 or more issues each all-gather that many units ahead)".into());
    }
    if r.replicas > 1 {
        return Some("replicas (HSDP) on a recorded FSDP2 step is not modelled: its collectives span the recorded shard group".into());
    }
    if r.offload {
        return Some("offload on a recorded FSDP2 step is not modelled: the recorded step runs its optimizer on the GPU".into());
    }
    if !r.units_auto {
        return Some(format!(
            "units cannot re-wrap a recorded FSDP2 step: its units are the ones fully_shard wrapped ({})",
            s.unit_labels(0..s.units.len())
        ));
    }
    None
}

/// Whether the recorded step's memory comes from `profile_memory` events (each gathered copy
/// an allocation of its own) rather than the estimate from shapes (which has none).
fn measured_memory(job: &Job) -> bool {
    job.meta
        .trace
        .as_ref()
        .and_then(|f| f.memory.as_ref())
        .is_some_and(|m| m.source.starts_with("profile_memory"))
}

/// What `reshard=0` changes for the resharded units of `s`: the ops to remove, the memory
/// edits, the units (indices into `units`) and the bytes they hold.
struct Unshard {
    gone: Vec<OpId>,
    mem: Vec<Edit>,
    units: Vec<usize>,
    held: u64,
}

fn unshard(cx: &Evaluated, s: &TraceSharding) -> Result<Unshard, PassError> {
    let estimated = !measured_memory(&cx.job);
    let mut out = Unshard {
        gone: Vec::new(),
        mem: Vec::new(),
        units: Vec::new(),
        held: 0,
    };
    for name in &s.resharded {
        let Some(unit) = s.units.iter().position(|u| u == name) else {
            continue;
        };
        let u = unit as u32;
        let ops: Vec<OpId> = cx
            .job
            .local
            .fsdp
            .iter()
            .filter(|(_, l)| {
                l.unit == u
                    && l.nth == 1
                    && matches!(l.span, FsdpSpan::AllGather | FsdpSpan::CopyOut)
            })
            .map(|(&op, _)| op)
            .collect();
        if ops.is_empty() {
            return Err(refuse(format!(
                "unit {} was resharded but its backward all-gather has no ops in the step",
                s.unit_label(unit)
            )));
        }
        // A fused op carries other kernels' work too: removing it would drop them.
        if ops.iter().any(|op| cx.job.local.fused.contains_key(op)) {
            return Err(refuse(format!(
                "an earlier pass fused unit {}'s backward all-gather or copy-out with other kernels: apply shard before op-fusion",
                s.unit_label(unit)
            )));
        }
        out.gone.extend(ops);
        out.units.push(unit);
        let bytes = s.unit_bytes.get(unit).copied().unwrap_or(0);
        let (Some(after_fw), Some(after_bw)) = (
            first_of(cx, u, FsdpSpan::PostForward, 0),
            first_of(cx, u, FsdpSpan::PostBackwardReshard, 0),
        ) else {
            continue;
        };
        if bytes == 0 {
            continue;
        }
        out.held += bytes;
        let effect = |op, when| MemEffect {
            op,
            worker: 0,
            bytes,
            when,
        };
        out.mem.push(with_effect(
            cx,
            after_fw,
            effect(after_fw, MemWhen::AllocAtStart),
        ));
        if estimated {
            out.mem.push(with_effect(
                cx,
                after_bw,
                effect(after_bw, MemWhen::FreeAtEnd),
            ));
        }
    }
    Ok(out)
}

/// `removed` (the recorded collectives earlier edits removed) plus those among `gone`, as
/// (device, position among the device's recorded collectives).
fn removed_positions(
    cx: &Evaluated,
    gone: &[OpId],
    mut removed: Vec<(DeviceId, u32)>,
) -> Vec<(DeviceId, u32)> {
    let mut by_device: BTreeMap<DeviceId, Vec<OpId>> = BTreeMap::new();
    for (i, o) in cx.job.local.ops.iter().enumerate() {
        if o.spec.kind == OpKind::Collective {
            by_device.entry(o.spec.device).or_default().push(i as OpId);
        }
    }
    let gone: BTreeSet<OpId> = gone.iter().copied().collect();
    let mut newly = Vec::new();
    for (&dev, ops) in &by_device {
        let earlier: BTreeSet<u32> = removed
            .iter()
            .filter(|(d, _)| *d == dev)
            .map(|&(_, k)| k)
            .collect();
        // The recorded positions still present, in order.
        let recorded = (0u32..).filter(|k| !earlier.contains(k));
        for (&op, k) in ops.iter().zip(recorded) {
            if gone.contains(&op) {
                newly.push((dev, k));
            }
        }
    }
    removed.extend(newly);
    removed
}

/// The patch that changes the recorded FSDP2 sharding `s` of `cx` to `r`; empty when `r` is
/// what the step ran.
pub(super) fn propose(
    cx: &Evaluated,
    s: &TraceSharding,
    r: Requested,
) -> Result<Vec<Patch>, PassError> {
    if let Some(why) = refusal(s, r) {
        return Err(refuse(why));
    }
    if cx.job.meta.accumulation > 1 {
        // The copies of the micro-steps carry no hook labels: only the first would change.
        return Err(refuse(format!(
            "apply shard before grad-accumulation (this recorded step already runs {} micro-steps)",
            cx.job.meta.accumulation
        )));
    }
    let unsharded = !(r.stage == 3 && r.reshard);
    if !unsharded && r.prefetch <= 1 {
        return Ok(Vec::new());
    }
    let mut job = cx.job.clone();
    let mut whys = Vec::new();
    if unsharded && let Some((j, why)) = unshard_job(cx, s)? {
        job = j;
        whys.push(why);
    }
    if r.prefetch >= 2
        && let Some((j, why)) = prefetch_job(&job, s, r.prefetch)?
    {
        job = j;
        whys.push(why);
    }
    if whys.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![Patch {
        pass: NAME.into(),
        why: whys.join("; "),
        edits: vec![Edit::ReplaceJob(Box::new(job))],
    }])
}

/// `reshard=0` applied to the recorded step: the job and what changed, or `None` when no unit
/// was resharded.
fn unshard_job(cx: &Evaluated, s: &TraceSharding) -> Result<Option<(Job, String)>, PassError> {
    let Unshard {
        gone,
        mem,
        units,
        held,
    } = unshard(cx, s)?;
    if gone.is_empty() {
        return Ok(None);
    }
    // The recorded collectives removed: what lets the ranks of one job, each edited alike,
    // match the collectives they kept (`trace::multi::with_job`).
    let earlier = cx
        .job
        .meta
        .trace
        .as_ref()
        .map(|f| f.removed_collectives.clone())
        .unwrap_or_default();
    let removed = removed_positions(cx, &gone, earlier);
    let mut edits = mem;
    edits.push(Edit::Remove { ops: gone });
    let mut job = super::apply(
        &cx.job,
        &Patch {
            pass: NAME.into(),
            why: String::new(),
            edits,
        },
    )?;
    if let Some(f) = job.meta.trace.as_mut() {
        f.removed_collectives = removed;
    }
    let n = units.len();
    let (s1, s2, its) = if n == 1 {
        ("", "s", "its")
    } else {
        ("s", "", "their")
    };
    let why = format!(
        "reshard=0 on the recorded FSDP2 step: {n} unit{s1} ({}) keep{s2} {its} gathered parameters ({:.2} MB) from the forward to the end of the backward; {its} backward all-gather{s1} and copy-out{s1} removed",
        s.unit_labels(units.into_iter()),
        held as f64 / 1e6,
    );
    Ok(Some((job, why)))
}

/// `prefetch=n` (n ≥ 2) applied to `job` (`super::fsdp_prefetch`): the job and what changed,
/// or `None` when every all-gather already runs that far ahead.
fn prefetch_job(job: &Job, s: &TraceSharding, n: u32) -> Result<Option<(Job, String)>, PassError> {
    let p = super::fsdp_prefetch::prefetch(job, n)?;
    if p.moved.is_empty() {
        return Ok(None);
    }
    let mut edits: Vec<Edit> = p
        .drop
        .iter()
        .map(|&(from, to)| Edit::DropEdge { from, to })
        .collect();
    edits.extend(p.add.iter().map(|&(from, to)| Edit::AddEdge { from, to }));
    let out = super::apply(
        job,
        &Patch {
            pass: NAME.into(),
            why: String::new(),
            edits,
        },
    )?;
    let units: BTreeSet<usize> = p.moved.iter().map(|&(u, _)| u as usize).collect();
    let (fw, bw) = (
        p.moved.iter().filter(|k| k.1 == 0).count(),
        p.moved.iter().filter(|k| k.1 >= 1).count(),
    );
    let memory = if measured_memory(job) {
        "each gathered buffer allocated where its all-gather now runs"
    } else {
        "the memory estimate from shapes has no gathered copies, so its peak does not show the buffers held longer"
    };
    let why = format!(
        "prefetch={n} on the recorded FSDP2 step: {fw} forward and {bw} backward all-gather{} issued {n} units ahead of the unit computing, as FSDP2's explicit prefetch lists do (units {}); {memory}",
        if fw + bw == 1 { "" } else { "s" },
        s.unit_labels(units.into_iter()),
    );
    Ok(Some((out, why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank0() -> Job {
        crate::passes::testkit::fsdp2_rank0()
    }

    fn sharding(stage: u32, reshard: bool) -> Requested {
        Requested {
            stage,
            replicas: 1,
            reshard,
            prefetch: 1,
            offload: false,
            units_auto: true,
        }
    }

    /// `reshard=0` removes exactly the ops of the blocks' second all-gather and copy-out spans
    /// (2 of the 5 all-gather kernels), and holds each block's gathered bytes from its
    /// post-forward hook to its post-backward reshard (the estimate from shapes has no copy).
    #[test]
    fn reshard_0_drops_the_backward_gathers_and_holds_the_forward_copy() {
        let job = rank0();
        let cx = crate::passes::evaluate(job.clone()).unwrap();
        let s = job.meta.trace.as_ref().unwrap().sharding.clone().unwrap();
        assert_eq!(s.unit_bytes, vec![73_856 * 4, 49_984 * 4, 49_984 * 4]);
        let second: Vec<OpId> = job
            .local
            .fsdp
            .iter()
            .filter(|(_, l)| {
                l.nth == 1 && matches!(l.span, FsdpSpan::AllGather | FsdpSpan::CopyOut)
            })
            .map(|(&op, _)| op)
            .collect();
        assert!(!second.is_empty());
        let p = propose(&cx, &s, sharding(3, false)).unwrap();
        let [Patch { edits, .. }] = &p[..] else {
            panic!("one patch: {p:?}")
        };
        let [Edit::ReplaceJob(after)] = &edits[..] else {
            panic!("a replaced job: {edits:?}")
        };
        assert_eq!(after.local.ops.len(), job.local.ops.len() - second.len());
        let gathers = |j: &Job| {
            j.local
                .ops
                .iter()
                .filter(|o| o.spec.kind == OpKind::Collective)
                .count()
        };
        assert_eq!(gathers(&job) - gathers(after), 2);
        // The memory: +bytes at each block's post-forward, −bytes at its post-backward reshard.
        let held: i64 = after
            .local
            .mem
            .iter()
            .filter(|m| m.bytes == 49_984 * 4)
            .map(|m| match m.when {
                MemWhen::AllocAtStart => 1,
                MemWhen::FreeAtEnd => -1,
                _ => 0,
            })
            .sum();
        let allocs = after
            .local
            .mem
            .iter()
            .filter(|m| m.bytes == 49_984 * 4 && m.when == MemWhen::AllocAtStart)
            .count();
        assert_eq!((allocs, held), (2, 0));
        let f = after.meta.trace.as_ref().unwrap();
        assert_eq!(f.removed_collectives.len(), 2);
        // The defaults are the recorded sharding.
        assert!(propose(&cx, &s, sharding(3, true)).unwrap().is_empty());
    }
}
