//! `grad-accumulation`: run the iteration's batch as `k` micro-batches of batch/k, forward and
//! backward `k` times, synchronise the gradients once after the last micro-batch, update once.
//! The iteration processes the same global batch; activation memory falls to about 1/k.
//!
//! **When it applies.** The memory-optimisation step of dPRO's Algorithm 1 (over the memory
//! budget: gradient accumulation or recomputation, whichever replays faster; dPRO Table 4), or
//! `whatif --pass grad-accumulation:k=K`. `k = 1` changes nothing (no patch).
//!
//! ```text
//! before:  FW ─ BW ─ Out(t) ─ sync ─ In(t) ─ UPDATE
//! after:   FW₁ ─ BW₁ ─ FW₂ ─ BW₂ ─ … ─ FWₖ ─ BWₖ ─ Out(t) ─ sync ─ In(t) ─ UPDATE
//!          (each FWᵢ/BWᵢ at batch/k; micro-step i+1's sources wait for micro-step i's sinks)
//! ```
//!
//! **Cost model.** The job is rebuilt ([`Edit::ReplaceJob`]): every op of phase FW or BW (compute
//! ops, their CPU side, the virtual "backward done") is replicated `k` times. An op with
//! [`OpWork`] is re-costed at batch/k (`Job::recost_ns(dur, work, dtype, 1/k)`: the model's time
//! on a zoo job, relative to the recorded time on a trace; FLOPs and
//! activation elements scale by 1/k, weight elements and kernel launches do not — so small
//! micro-batches lose efficiency, as on a real GPU) and its work is stored at batch/k so later
//! passes re-cost it consistently. A GPU op without work (a trace kernel) is scaled by 1/k; a CPU
//! op (launch, framework overhead) keeps its duration — it runs once per micro-step. Memory
//! effects of FW/BW ops are scaled by 1/k (rounded up): each micro-step allocates and frees its
//! own activations. The last micro-step keeps the original op ids, so the gradient syncs (ready
//! after its BW), the UPDATE ops and static memory (weights, gradients, optimizer state) are
//! unchanged; earlier micro-steps do not feed the syncs (`no_sync()` / `backward_passes_per_step`).
//!
//! **Sharded gradients** (knob `sync`). On a job sharded at stage 2 or 3 (its gradient
//! collectives are reduce-scatters: `shard` applied before this pass, which `shard` insists on),
//! `sync=auto` (the default) reduce-scatters every micro-step's gradients, as FSDP2 does unless
//! told otherwise and as DeepSpeed ZeRO-2/3 always do: each micro-step allocates its whole
//! gradients, frees them when its reduce-scatter is done, and accumulates into the rank's 1/g
//! shard, allocated once (at the first micro-step's reduce-scatter). `sync=last` holds the
//! whole gradients over the micro-steps and reduce-scatters once, after the last (FSDP2's
//! `set_requires_gradient_sync(False)`, what the PyTorch export runs): less communication, more
//! memory. All-reduced gradients (DDP, Horovod, ZeRO-1) are synchronised once either way. A
//! collective that belongs to the micro-step itself (stage 3's parameter all-gathers, issued and
//! awaited by forward and backward ops) runs again in every micro-step.
//!
//! ```text
//! stage 2/3, sync=auto:  FW₁ ─ BW₁ ─ RS₁ ┐                       (RSᵢ: reduce-scatter of
//!                        FW₂ ─ BW₂ ─ RS₂ ┼─ UPDATE (on the shard)  micro-step i's gradients)
//!                        …   FWₖ ─ BWₖ ─ RSₖ ┘
//! ```
//!
//! **Framework knobs** (DESIGN.md table): Horovod / BytePS `backward_passes_per_step=k`, TF
//! `gradient_accumulation_steps`, PyTorch DDP `no_sync()` for k−1 micro-steps, JAX
//! `optax.MultiSteps(k)`; the data loader's per-step batch becomes batch/k.

use std::collections::{BTreeMap, BTreeSet};

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::job::{CollectiveKind, Job, LocalOp, Sync};
use crate::graph::{DeviceKind, MemEffect, MemWhen, OpId, OpKind, Phase};

/// When sharded gradients are reduce-scattered under accumulation (knob `sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradSync {
    /// Every micro-step (FSDP2's default, DeepSpeed ZeRO-2/3); all-reduced gradients once.
    Auto,
    /// Once, after the last micro-step, whole gradients held until then
    /// (FSDP2 `set_requires_gradient_sync(False)`).
    Last,
}

/// The `grad-accumulation` pass.
pub struct GradAccumulation;

const NAME: &str = "grad-accumulation";

impl Pass for GradAccumulation {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "k micro-batches of batch/k, one gradient synchronisation and update per iteration (dPRO Table 4)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::int(
                "k",
                "micro-batches per iteration; must divide the per-GPU batch (batch/k whole samples per micro-step)",
                2,
                1,
                i64::from(u32::MAX),
            ),
            KnobSpec::text(
                "sync",
                "sharded gradients (shard stage 2/3): auto reduce-scatters every micro-step (FSDP2's default, DeepSpeed ZeRO-2/3); last holds them whole and reduce-scatters once (FSDP2 set_requires_gradient_sync(False))",
                "auto",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let k = knobs.int("k");
        let sync = match knobs.text("sync").trim() {
            "auto" => GradSync::Auto,
            "last" => GradSync::Last,
            other => {
                return Err(PassError::BadKnob {
                    pass: NAME.into(),
                    knob: "sync".into(),
                    value: other.into(),
                    why: "expected auto or last".into(),
                });
            }
        };
        let bad = |why: String| PassError::BadKnob {
            pass: NAME.into(),
            knob: "k".into(),
            value: k.to_string(),
            why,
        };
        if !(1..=i64::from(u32::MAX)).contains(&k) {
            return Err(bad("must be at least 1".into()));
        }

        let batch = i64::from(cx.job.meta.batch);
        if batch > 0 && batch % k != 0 {
            let divisors: Vec<String> = (1..=batch)
                .filter(|d| batch % d == 0)
                .take(12)
                .map(|d| d.to_string())
                .collect();
            // Not applicable (the search skips it; `whatif` refuses it, exit 3): no micro-step
            // is fed a fraction of a sample.
            return Err(PassError::NotApplicable {
                pass: NAME.into(),
                why: format!(
                    "knob k = {k} must divide the per-GPU batch of {batch} (every micro-step a whole number of samples; {k} would give {:.3}); divisors: {}",
                    batch as f64 / k as f64,
                    divisors.join(", ")
                ),
            });
        }
        // Bounded by the work: the replicated graph must stay within the graph's op limit.
        let ops = (cx.job.local.ops.len() as u64).saturating_mul(k as u64);
        if ops > crate::graph::job::MAX_OPS {
            return Err(bad(format!(
                "{k} micro-steps would make a worker's graph of about {ops} ops (limit {})",
                crate::graph::job::MAX_OPS
            )));
        }
        if k == 1 {
            return Ok(Vec::new());
        }
        let job = accumulate_with(&cx.job, k as u32, sync);
        let scattered = |j: &Job| {
            j.syncs
                .iter()
                .filter(|s| s.kind == CollectiveKind::ReduceScatter)
                .count()
        };
        let fw_bw = |j: &Job| -> u64 {
            j.local
                .ops
                .iter()
                .filter(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
                .map(|o| o.spec.dur_ns)
                .sum()
        };
        let per = match cx.job.meta.batch {
            0 => format!("batch/{k}"),
            b => format!("{} samples", i64::from(b) / k),
        };
        let syncs = if scattered(&job) > scattered(&cx.job) {
            "gradients reduce-scattered after every micro-batch into the rank's shard"
        } else {
            "one sync after the last micro-batch"
        };
        let why = format!(
            "{k} micro-batches of {per}: FW+BW GPU/CPU time {:.2} ms → {:.2} ms, activations ÷ {k}, {syncs}",
            fw_bw(&cx.job) as f64 / 1e6,
            fw_bw(&job) as f64 / 1e6,
        );
        Ok(vec![Patch {
            pass: NAME.into(),
            why,
            edits: vec![Edit::ReplaceJob(Box::new(job))],
        }])
    }
}

/// `job` with its FW/BW replicated into `k` micro-steps, sharded gradients reduce-scattered
/// every micro-step (`sync=auto`; see the module docs).
pub fn accumulate(job: &Job, k: u32) -> Job {
    accumulate_with(job, k, GradSync::Auto)
}

/// `job` with its FW/BW replicated into `k` micro-steps, sharded gradients synchronised as
/// `sync` says (see the module docs).
pub fn accumulate_with(job: &Job, k: u32, sync: GradSync) -> Job {
    let scale = 1.0 / k as f64;
    let l = &job.local;
    let n = l.ops.len();
    let micro: Vec<bool> = l
        .ops
        .iter()
        .map(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
        .collect();
    // Where a reduce-scatter leaves the rank's shard of the gradient (its done ops): the shard
    // is allocated once, at the first micro-step's.
    let shard_kept = scatter_ends(job);
    // Sharded gradients reduce-scattered every micro-step: the copies get their own
    // reduce-scatters (and, with HSDP, the all-reduces across replicas that follow them).
    let each = sync == GradSync::Auto && !shard_kept.is_empty();
    let mut out = job.clone();
    out.meta.accumulation = job.meta.accumulation.max(1).saturating_mul(k);
    let mut copied_syncs: Vec<Sync> = Vec::new();
    let g = out.local_mut();
    for (i, o) in g.ops.iter_mut().enumerate() {
        if micro[i] {
            *o = micro_op(job, o, scale);
        }
    }
    for m in g.mem.iter_mut() {
        if micro[m.op as usize] {
            m.bytes = m.bytes.div_ceil(k as u64);
        }
    }
    // Gradients (allocated when a tensor's gradient is ready) live from the first micro-step's
    // backward to the update: over the micro-steps they are static memory.
    let is_grad = |m: &MemEffect| {
        let s = &l.ops[m.op as usize].spec;
        s.kind == OpKind::Out && s.phase == Phase::Comm && m.when == MemWhen::AllocAtStart
    };
    // Reduce-scattered every micro-step, they are allocated and freed by each micro-step.
    if !each {
        let grad_bytes: u64 = g.mem.iter().filter(|m| is_grad(m)).map(|m| m.bytes).sum();
        g.mem.retain(|m| !is_grad(m));
        g.static_mem_bytes = g.static_mem_bytes.saturating_add(grad_bytes);
    }
    let (sources, sinks) = step_ends(l, &micro);
    let bridges = bridges(l, &micro);
    let micro_mem: Vec<MemEffect> = g
        .mem
        .iter()
        .filter(|m| micro[m.op as usize])
        .copied()
        .collect();
    let downstream = downstream_of(job, &micro);
    // Micro-steps 0..k−1 are copies appended in order; the original ops are the last one.
    let mut prev_sinks: Option<Vec<OpId>> = None;
    for copy in 0..k - 1 {
        let mut map = vec![OpId::MAX; n];
        for i in 0..n {
            if micro[i] {
                map[i] = g.ops.len() as OpId;
                let copy = g.ops[i].clone();
                g.ops.push(copy);
            }
        }
        for &(a, b) in &l.edges {
            match (micro[a as usize], micro[b as usize]) {
                (true, true) => g.edges.push((map[a as usize], map[b as usize])),
                // Inputs of the step (data loading, …) feed every micro-step.
                (false, true) if !downstream[a as usize] => g.edges.push((a, map[b as usize])),
                // An op that runs once per iteration between micro-step ops (a collective
                // launched in the backward, a marker on a recorded thread): the copies keep the
                // order it imposed, from the micro-step ops before it to the one after.
                (false, true) => {
                    for &m in bridges[a as usize].iter().flatten() {
                        g.edges.push((map[m as usize], map[b as usize]));
                    }
                }
                // Only the last micro-step feeds the syncs and the update.
                _ => {}
            }
        }
        for m in &micro_mem {
            g.mem.push(MemEffect {
                op: map[m.op as usize],
                ..*m
            });
        }
        copied_syncs.extend(copy_syncs(
            g,
            l,
            &job.syncs,
            &CopyOf {
                micro: &micro,
                map: &map,
                downstream: &downstream,
                each,
                shard_kept: &shard_kept,
                first: copy == 0,
                offload: job.meta.offload,
            },
        ));
        if let Some(ps) = &prev_sinks {
            for &a in ps {
                for &b in &sources {
                    g.edges.push((a, map[b as usize]));
                }
            }
        }
        prev_sinks = Some(sinks.iter().map(|&s| map[s as usize]).collect());
    }
    if each && k > 1 {
        // The shards were allocated at the first micro-step's reduce-scatters.
        g.mem.retain(|m| {
            !(m.when == MemWhen::AllocAtStart && (m.op as usize) < n && shard_kept.contains(&m.op))
        });
    }
    if let Some(ps) = &prev_sinks {
        for &a in ps {
            for &b in &sources {
                g.edges.push((a, b));
            }
        }
    }
    // Issue order: each micro-step's collectives before the next one's; the last micro-step's
    // (the original syncs, with whatever runs once per iteration) last.
    copied_syncs.append(&mut out.syncs);
    out.syncs = copied_syncs;
    out
}

/// The done ops of `job`'s reduce-scatters: where each leaves the rank's gradient shard. None
/// at ZeRO stage 1, whose reduce-scatters leave the gradients whole (reduced once, after the
/// last micro-step, as Megatron-LM's distributed optimizer and DeepSpeed ZeRO-1 do).
fn scatter_ends(job: &Job) -> BTreeSet<OpId> {
    if job.meta.shard_stage == 1 {
        return BTreeSet::new();
    }
    job.syncs
        .iter()
        .filter(|s| s.kind == CollectiveKind::ReduceScatter)
        .flat_map(|s| s.done.iter().copied())
        .collect()
}

/// One micro-step's version of op `o` of `job` (durations and work at `scale` = 1/k).
pub(crate) fn micro_op(job: &Job, o: &LocalOp, scale: f64) -> LocalOp {
    let mut o = o.clone();
    if o.spec.kind.is_virtual() {
        return o;
    }
    let on_cpu = matches!(
        job.local.devices.get(o.spec.device as usize),
        Some(DeviceKind::CpuThread { .. })
    );
    match o.work {
        Some(w) => {
            o.spec.dur_ns = job.recost_ns(o.spec.dur_ns, &w, job.dtype, scale);
            o.work = Some(w.scaled(scale));
        }
        None if on_cpu => {}
        None => o.spec.dur_ns = (o.spec.dur_ns as f64 * scale).round() as u64,
    }
    o
}

/// Sources and sinks of one micro-step (within the FW/BW sub-graph), in id order.
fn step_ends(l: &crate::graph::job::LocalGraph, micro: &[bool]) -> (Vec<OpId>, Vec<OpId>) {
    let n = l.ops.len();
    let mut has_pred = vec![false; n];
    let mut has_succ = vec![false; n];
    for &(a, b) in &l.edges {
        if micro[a as usize] && micro[b as usize] {
            has_succ[a as usize] = true;
            has_pred[b as usize] = true;
        }
    }
    let ends = |has: &[bool]| -> Vec<OpId> {
        (0..n)
            .filter(|&i| micro[i] && !has[i])
            .map(|i| i as OpId)
            .collect()
    };
    (ends(&has_pred), ends(&has_succ))
}

/// Ops outside the micro-step that come after part of it (the gradients' syncs and what waits
/// for them, copies into a bucket, the update): an edge from one of them into the micro-step is
/// not an input of the step, and the earlier copies must not wait for it.
fn downstream_of(job: &Job, micro: &[bool]) -> Vec<bool> {
    let n = micro.len();
    let mut downstream = vec![false; n];
    let succs = job.local_succs();
    let mut stack: Vec<usize> = (0..n).filter(|&i| micro[i]).collect();
    while let Some(i) = stack.pop() {
        for &s in &succs[i] {
            let s = s as usize;
            if !micro[s] && !downstream[s] {
                downstream[s] = true;
                stack.push(s);
            }
        }
    }
    downstream
}

/// What one micro-step's copy needs to copy the collectives it runs: which ops are micro-step
/// ops and their copies, which ops run after the micro-step, and how gradients are synchronised.
struct CopyOf<'a> {
    micro: &'a [bool],
    map: &'a [OpId],
    downstream: &'a [bool],
    /// Reduce-scatters (and the all-reduces that follow them) every micro-step.
    each: bool,
    /// Done ops of reduce-scatters, where the rank's gradient shard is allocated.
    shard_kept: &'a BTreeSet<OpId>,
    /// The first micro-step: it allocates the gradient shards.
    first: bool,
    /// The optimizer is offloaded (`shard:offload=1`): each micro-step's gradient shard is
    /// copied to the host as its collective ends, as DeepSpeed accumulates them there.
    offload: bool,
}

/// The collectives of one micro-step's copy: those whose ready and done ops are all micro-step
/// ops (stage 3's all-gathers), and with `each` the gradient reduce-scatters (their ready and
/// done ops copied, with their memory effects) and what waits for them (an HSDP all-reduce
/// across replicas). New ops and edges go into `g`; the copied syncs are returned in the
/// original issue order.
fn copy_syncs(
    g: &mut crate::graph::job::LocalGraph,
    l: &crate::graph::job::LocalGraph,
    syncs: &[Sync],
    c: &CopyOf,
) -> Vec<Sync> {
    let mut fresh: BTreeMap<OpId, OpId> = BTreeMap::new();
    let mut out = Vec::new();
    for sy in syncs {
        let own = sy
            .ready
            .iter()
            .chain(&sy.done)
            .all(|&o| c.micro[o as usize]);
        let grad = c.each
            && (sy.kind == CollectiveKind::ReduceScatter
                || (sy.kind == CollectiveKind::AllReduce
                    && !sy.ready.is_empty()
                    && sy.ready.iter().all(|r| fresh.contains_key(r))));
        if !own && !grad {
            continue;
        }
        let mut copy_of = |o: OpId, g: &mut crate::graph::job::LocalGraph| -> OpId {
            if c.micro[o as usize] {
                return c.map[o as usize];
            }
            *fresh.entry(o).or_insert_with(|| {
                g.ops.push(l.ops[o as usize].clone());
                (g.ops.len() - 1) as OpId
            })
        };
        let ready = sy.ready.iter().map(|&o| copy_of(o, g)).collect();
        let done = sy.done.iter().map(|&o| copy_of(o, g)).collect();
        out.push(Sync {
            ready,
            done,
            ..sy.clone()
        });
    }
    if fresh.is_empty() {
        return out;
    }
    // The copied ready/done ops keep their place: fed by this micro-step's ops (or the step's
    // inputs), feeding this micro-step's ops and what runs once after the micro-steps (the
    // update).
    let at = |o: OpId| -> Option<OpId> {
        if c.micro[o as usize] {
            Some(c.map[o as usize])
        } else {
            fresh.get(&o).copied()
        }
    };
    for &(a, b) in &l.edges {
        let (fa, fb) = (fresh.contains_key(&a), fresh.contains_key(&b));
        if !fa && !fb {
            continue;
        }
        let from = at(a).or_else(|| (!c.downstream[a as usize]).then_some(a));
        let to = at(b).unwrap_or(b);
        if let Some(from) = from {
            g.edges.push((from, to));
        }
    }
    for m in &l.mem {
        let Some(&op) = fresh.get(&m.op) else {
            continue;
        };
        let shard = m.when == MemWhen::AllocAtStart && c.shard_kept.contains(&m.op);
        if !shard || c.first {
            g.mem.push(MemEffect { op, ..*m });
        }
    }
    if c.offload {
        host_copies(g, l, &fresh);
    }
    out
}

/// With the optimizer offloaded, a micro-step's gradient collectives (their done ops copied
/// to `fresh`) each get their own device-to-host copy of the shard: a copy of the last
/// micro-step's (the offload's update-phase memcpy after the original done op), feeding what
/// it feeds (the host's step). The shard stays allocated from the first micro-step to the last
/// copy (what DeepSpeed frees after each copy is not given back here).
fn host_copies(
    g: &mut crate::graph::job::LocalGraph,
    l: &crate::graph::job::LocalGraph,
    fresh: &BTreeMap<OpId, OpId>,
) {
    let is_copy = |o: OpId| {
        let sp = &l.ops[o as usize].spec;
        sp.kind == OpKind::Memcpy && sp.phase == Phase::Update
    };
    for (&orig, &op) in fresh {
        for &(a, b) in &l.edges {
            if a != orig || !is_copy(b) {
                continue;
            }
            g.ops.push(l.ops[b as usize].clone());
            let c = (g.ops.len() - 1) as OpId;
            g.edges.push((op, c));
            for &(x, y) in &l.edges {
                if x == b {
                    g.edges.push((c, y));
                }
            }
        }
    }
}

/// Most micro-step ops a bridge remembers (the latest ones in topological order): a bound on
/// the work for ops that join many branches; dropping older ones only loosens the copies' order.
const MAX_BRIDGE: usize = 64;

/// For each op that is not part of a micro-step but runs after some micro-step op (it is
/// reachable from one), the micro-step ops it follows through non-micro-step ops only; `None`
/// for ops that precede every micro-step op (the step's inputs).
///
/// Why: a recorded step interleaves once-per-iteration ops with the forward and backward on the
/// same thread or stream (a collective launched during the backward, a gap or marker op). Wiring
/// such an op into every micro-step's copy — as for a real input — would make the copies wait
/// for an op that itself waits for the last micro-step: a cycle (issue 15: "the graph has a cycle
/// through op 22294 (FW cpu @w0.cpu.t1)" on the ResNet-50 DDP trace).
fn bridges(l: &crate::graph::job::LocalGraph, micro: &[bool]) -> Vec<Option<Vec<OpId>>> {
    let n = l.ops.len();
    let mut preds: Vec<Vec<OpId>> = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    let mut succs: Vec<Vec<OpId>> = vec![Vec::new(); n];
    for &(a, b) in &l.edges {
        preds[b as usize].push(a);
        succs[a as usize].push(b);
        indeg[b as usize] += 1;
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: std::collections::VecDeque<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &s in &succs[i] {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                ready.push_back(s as usize);
            }
        }
    }
    let mut pos = vec![0usize; n];
    for (k, &i) in order.iter().enumerate() {
        pos[i] = k;
    }
    let mut out: Vec<Option<Vec<OpId>>> = vec![None; n];
    for &i in &order {
        if micro[i] {
            continue;
        }
        let mut acc: Option<Vec<OpId>> = None;
        for &p in &preds[i] {
            let from: Option<Vec<OpId>> = if micro[p as usize] {
                Some(vec![p])
            } else {
                out[p as usize].clone()
            };
            if let Some(v) = from {
                acc.get_or_insert_with(Vec::new).extend(v);
            }
        }
        if let Some(v) = acc.as_mut() {
            v.sort_unstable_by_key(|&o| (pos[o as usize], o));
            v.dedup();
            if v.len() > MAX_BRIDGE {
                v.drain(..v.len() - MAX_BRIDGE);
            }
        }
        out[i] = acc;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::recompute::tests::chain;
    use crate::passes::{apply_all, evaluate, find, registry, resolve_knobs};

    fn run(job: Job, k: &str) -> (Evaluated, Evaluated, Vec<Patch>) {
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        let knobs = resolve_knobs(p, &[("k".into(), k.into())]).unwrap();
        let base = evaluate(job).unwrap();
        let patches = p.propose(&base, &knobs).unwrap();
        let after = evaluate(apply_all(&base.job, &patches).unwrap()).unwrap();
        (base, after, patches)
    }

    #[test]
    fn k_zero_and_too_large_are_refused_by_the_knob_range() {
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        for bad in ["0", "4294967296", "-3", "two"] {
            assert!(
                resolve_knobs(p, &[("k".into(), bad.into())]).is_err(),
                "{bad}"
            );
        }
        let knobs = resolve_knobs(p, &[]).unwrap();
        assert_eq!(knobs.int("k"), 2);
    }

    /// Issue 21: a k that does not divide the per-GPU batch is refused (no fractional sample);
    /// accumulation in the thousands is accepted when it divides.
    #[test]
    fn k_must_divide_the_batch_and_may_be_in_the_thousands() {
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        let mut job = chain(&[1000, 3000], &[1000, 3000]);
        job.meta.batch = 3;
        let base = evaluate(job.clone()).unwrap();
        let k4 = resolve_knobs(p, &[("k".into(), "4".into())]).unwrap();
        let e = p.propose(&base, &k4).unwrap_err().to_string();
        assert!(
            e.contains("divide the per-GPU batch of 3") && e.contains("0.750"),
            "{e}"
        );
        let k3 = resolve_knobs(p, &[("k".into(), "3".into())]).unwrap();
        let patches = p.propose(&base, &k3).unwrap();
        assert!(
            patches[0].why.starts_with("3 micro-batches of 1 samples"),
            "{}",
            patches[0].why
        );
        // 65,536 sequences per GPU in 2,048 micro-steps of 32 (DLE BERT phase-1 recipes).
        job.meta.batch = 65_536;
        let base = evaluate(job).unwrap();
        let k = resolve_knobs(p, &[("k".into(), "2048".into())]).unwrap();
        let patches = p.propose(&base, &k).unwrap();
        let after = apply_all(&base.job, &patches).unwrap();
        assert_eq!(
            after.local.ops.len(),
            base.job.local.ops.len() * 2048
                - (base.job.local.ops.len()
                    - base
                        .job
                        .local
                        .ops
                        .iter()
                        .filter(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
                        .count())
                    * 2047
        );
    }

    #[test]
    fn two_micro_batches_on_a_chain() {
        // Two layers: FW 1000 / 3000 ns, BW 2000 / 6000 ns; layer work: flops = 1e4·t (matrix,
        // no shapes) on the V100's CUDA cores (15.7 TFLOP/s × Volta's CUDA-core GEMM
        // efficiency), act elems t · 4 B at 900 GB/s × its memory efficiency, one 4 µs launch.
        let job = chain(&[1000, 3000], &[1000, 3000]);
        let a = job.gpu.kernels.clone();
        let (rate, bw) = (
            15.7e3 * a.gemm_efficiency.cuda_core,
            900.0 * a.memory_efficiency,
        );
        let cost = |t: f64, s: f64| (1e4 * t * s / rate).max(4.0 * t * s / bw) + 4000.0;
        let (base, after, patches) = run(job, "2");
        assert_eq!(patches.len(), 1);
        // Baseline replay: the ops carry the hand-set durations: 4 µs + 8 µs, then UPDATE 1 µs.
        assert_eq!(base.iteration_ns(), 13_000);
        // After: each micro-step re-costed at batch 1/2, twice, then the update (unchanged).
        let micro: f64 = [1000.0, 3000.0, 2000.0, 6000.0]
            .iter()
            .map(|&t| cost(t, 0.5).round())
            .sum();
        assert_eq!(after.iteration_ns(), (2.0 * micro) as u64 + 1000);
        // Ops: 8 (4 FW/BW, bw_done, Out, In, UPDATE) + one more copy of the 4 FW/BW and bw_done.
        assert_eq!(after.job.local.ops.len(), 13);
        // Memory: static + (1000 + 3000)/2 at the FW/BW turn of a micro-step.
        assert_eq!(base.memory.peak_bytes, 1_004_000);
        assert_eq!(after.memory.peak_bytes, 1_002_000);
        // The sync still carries the full gradient, once.
        assert_eq!(after.job.syncs, base.job.syncs);
    }

    #[test]
    fn once_per_iteration_ops_between_micro_step_ops_close_no_cycle() {
        // Regression (issue 15: "the graph has a cycle through op 22294 (FW cpu @w0.cpu.t1)"): a
        // recorded step interleaves ops that run once per iteration with the forward and
        // backward on one device. Here a 500 ns op of phase Other between the last forward
        // (op 1) and the first backward (op 2) on the GPU stream.
        use crate::graph::{OpKind, OpSpec};
        let mut job = chain(&[1000, 3000], &[1000, 3000]);
        let x = job.local.ops.len() as OpId;
        job.local_mut().ops.push(LocalOp {
            spec: OpSpec::new(OpKind::Compute, Phase::Other, 1, 500),
            work: None,
        });
        job.local_mut().edges.push((1, x));
        job.local_mut().edges.push((x, 2));
        let (base, after, _) = run(job, "2");
        // The op runs once (it is not copied), between the last micro-step's forward and
        // backward; the first micro-step's backward follows its forward directly.
        assert_eq!(after.job.local.ops.len(), base.job.local.ops.len() + 5);
        assert!(after.iteration_ns() > base.iteration_ns());
        let copies_of_x = after
            .job
            .local
            .ops
            .iter()
            .filter(|o| o.spec.phase == Phase::Other && o.spec.dur_ns == 500)
            .count();
        assert_eq!(copies_of_x, 1);
    }

    #[test]
    fn k_one_changes_nothing() {
        let job = chain(&[1000, 3000], &[1000, 3000]);
        let (base, after, patches) = run(job, "1");
        assert!(patches.is_empty());
        assert_eq!(base.iteration_ns(), after.iteration_ns());
    }

    fn sharded(stage: u32) -> Job {
        let (_, job) = crate::zoo::build::test_job("gpt", 4, "8xv100");
        crate::passes::shard::shard(
            &job,
            crate::passes::shard::Sharding {
                stage,
                replicas: 1,
                reshard: true,
                prefetch: 1,
                offload: false,
            },
        )
        .unwrap()
    }

    fn count(j: &Job, kind: CollectiveKind) -> usize {
        j.syncs.iter().filter(|s| s.kind == kind).count()
    }

    fn run_knobs(job: Job, knobs: &[(&str, &str)]) -> (Evaluated, Evaluated) {
        let after = crate::passes::testkit::try_pass(&job, NAME, knobs).unwrap();
        (evaluate(job).unwrap(), evaluate(after).unwrap())
    }

    /// Issue 23: FSDP and ZeRO-2/3 reduce-scatter every micro-step's gradients into the rank's
    /// shard (`sync=auto`): k times the reduce-scatters, the whole gradients never held past
    /// their micro-step, the shard allocated once. `sync=last` (FSDP2's
    /// set_requires_gradient_sync(False)) holds them whole and reduce-scatters once: fewer
    /// collectives, more memory. Stage 3's all-gathers run in every micro-step either way (they
    /// used to run once, the earlier micro-steps computing with parameters never gathered).
    #[test]
    fn sharded_gradients_reduce_scatter_every_micro_step_unless_held() {
        for stage in [2, 3] {
            let job = sharded(stage);
            let rs = count(&job, CollectiveKind::ReduceScatter);
            let ag = count(&job, CollectiveKind::AllGather);
            assert!(rs > 0 && ag > 0, "stage {stage}");
            let (base, each) = run_knobs(job.clone(), &[("k", "4")]);
            let (_, last) = run_knobs(job.clone(), &[("k", "4"), ("sync", "last")]);
            assert_eq!(each.job.meta.accumulation, 4);
            assert_eq!(count(&each.job, CollectiveKind::ReduceScatter), 4 * rs);
            assert_eq!(count(&last.job, CollectiveKind::ReduceScatter), rs);
            // Stage 3 gathers per micro-step; stage 2's one gather after the update stays one.
            let gathers = if stage == 3 { 4 * ag } else { ag };
            assert_eq!(count(&each.job, CollectiveKind::AllGather), gathers);
            assert_eq!(count(&last.job, CollectiveKind::AllGather), gathers);
            // Held whole: the gradients are static memory over the micro-steps; reduce-scattered
            // each micro-step they are not, and the peak is lower.
            let grads: u64 = job
                .local
                .mem
                .iter()
                .filter(|m| {
                    let sp = &job.local.ops[m.op as usize].spec;
                    sp.kind == OpKind::Out
                        && sp.phase == Phase::Comm
                        && m.when == MemWhen::AllocAtStart
                })
                .map(|m| m.bytes)
                .sum();
            assert!(grads > 0);
            assert_eq!(
                last.job.local.static_mem_bytes,
                job.local.static_mem_bytes + grads,
                "stage {stage}"
            );
            assert_eq!(each.job.local.static_mem_bytes, job.local.static_mem_bytes);
            assert!(
                each.memory.peak_bytes + grads / 2 < last.memory.peak_bytes,
                "stage {stage}: {} vs {}",
                each.memory.peak_bytes,
                last.memory.peak_bytes
            );
            assert!(each.memory.peak_bytes < base.memory.peak_bytes);
            // The rank's shards are allocated once, not once per micro-step: the allocations at
            // reduce-scatter ends add up to what the sharded job allocates there.
            let kept = |j: &Job| -> u64 {
                let done = scatter_ends(j);
                j.local
                    .mem
                    .iter()
                    .filter(|m| m.when == MemWhen::AllocAtStart && done.contains(&m.op))
                    .map(|m| m.bytes)
                    .sum()
            };
            assert!(kept(&job) > 0);
            assert_eq!(kept(&each.job), kept(&job), "stage {stage}");
            // More communication than once per iteration: slower on this slow network.
            assert!(each.iteration_ns() > last.iteration_ns(), "stage {stage}");
            each.job.expand().expect("acyclic");
        }
    }

    /// ZeRO stage 1 (Megatron-LM's distributed optimizer, DeepSpeed ZeRO-1) reduce-scatters
    /// gradients it keeps whole: accumulated, they are reduced once, after the last micro-step,
    /// whatever `sync` says, and held whole over the micro-steps.
    #[test]
    fn stage_1_reduces_once_after_the_last_micro_step() {
        let job = sharded(1);
        let rs = count(&job, CollectiveKind::ReduceScatter);
        assert!(rs > 0);
        let (_, each) = run_knobs(job.clone(), &[("k", "4")]);
        let (_, last) = run_knobs(job.clone(), &[("k", "4"), ("sync", "last")]);
        for j in [&each.job, &last.job] {
            assert_eq!(j.meta.accumulation, 4);
            assert_eq!(count(j, CollectiveKind::ReduceScatter), rs);
            assert_eq!(count(j, CollectiveKind::AllGather), 1);
            assert!(j.local.static_mem_bytes > job.local.static_mem_bytes);
        }
        assert_eq!(each.iteration_ns(), last.iteration_ns());
        assert_eq!(each.memory.peak_bytes, last.memory.peak_bytes);
    }

    /// All-reduced gradients (DDP) are synchronised once whatever `sync` says.
    #[test]
    fn all_reduced_gradients_sync_once_either_way() {
        let (_, job) = crate::zoo::build::test_job("gpt", 4, "8xv100");
        let (_, each) = run_knobs(job.clone(), &[("k", "2")]);
        let (_, last) = run_knobs(job.clone(), &[("k", "2"), ("sync", "last")]);
        assert_eq!(each.job.syncs, job.syncs);
        assert_eq!(last.job.syncs, job.syncs);
        assert_eq!(each.iteration_ns(), last.iteration_ns());
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        let bad = resolve_knobs(p, &[("sync".into(), "every".into())]).unwrap();
        let e = p
            .propose(&evaluate(job).unwrap(), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected auto or last"), "{e}");
    }

    #[test]
    fn resnet50_k4_quarter_activations_same_syncs() {
        let (_, job) = crate::zoo::build::test_job("resnet50", 32, "dpro-16xv100-rdma");
        let (base, after, _) = run(job, "4");
        // The gradients live across the micro-steps: static memory from the start.
        let stat = base.job.local.static_mem_bytes;
        let grads: u64 = base.job.local.tensors.iter().map(|t| t.bytes).sum();
        assert_eq!(after.job.local.static_mem_bytes, stat + grads);
        // Each micro-step saves a quarter of the activations (rounded up per effect).
        let saved = |e: &Evaluated, ops: usize| -> u64 {
            e.job
                .local
                .mem
                .iter()
                .filter(|m| (m.op as usize) < ops && m.when == MemWhen::AllocAtStart)
                .filter(|m| e.job.local.ops[m.op as usize].spec.phase == Phase::Fw)
                .map(|m| m.bytes)
                .sum()
        };
        let n = base.job.local.ops.len();
        let (a0, a1) = (saved(&base, n), saved(&after, n));
        assert!(a1 >= a0 / 4 && a1 <= a0 / 4 + 200, "{a1} vs {a0}/4");
        assert!(after.memory.peak_bytes < base.memory.peak_bytes);
        // Four smaller micro-steps are slower than one big step (launches and weight traffic
        // repeat), but not by 4×.
        assert!(after.iteration_ns() > base.iteration_ns());
        assert!(after.iteration_ns() < 2 * base.iteration_ns());
        assert_eq!(after.job.syncs.len(), base.job.syncs.len());
    }
}
