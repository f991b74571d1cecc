//! `context-parallel`: the sequence split over `degree` ranks, attention as a ring (Liu et al.,
//! "Ring Attention with Blockwise Transformers", 2023; Megatron-Core's context parallelism and
//! torchtitan's `context_parallel_degree` run it this way).
//!
//! **What changes.** Every rank of a context-parallel group holds the whole model and 1/degree
//! of each sequence's tokens: the matrix products, norms, element-wise ops, the loss and their
//! saved activations follow the tokens. Attention needs every key and value of the sequence:
//! each rank computes its queries against its own key/value chunk, then against the chunk its
//! ring neighbour sends, `degree − 1` times, sending the chunk it holds on while it computes
//! (Megatron's causal split in 2 × degree chunks gives every rank the same attention work, so
//! each step is 1/degree of the rank's attention). In the backward the ring carries the
//! key/value chunks and their gradients (twice the forward's bytes per step).
//!
//! | op | what the pass does |
//! |---|---|
//! | the flash attention kernel (forward and backward) | cut into `degree` pieces on its stream, each 1/degree of its work re-costed (smaller kernels run less efficiently), piece i waiting for step i of the ring |
//! | the ring | `degree − 1` sends on the group's own stream, each α + chunk/β on the intra-node link while the group's ranks (degree × the tensor-parallel degree) fit in a node, else the inter-node link (the ring's slowest hop); the first waits for what the attention waits for (q, k, v) |
//! | every other forward / backward op | 1/degree of its work and activations with `batch=replica`; unchanged with `batch=global` (each group of degree ranks trains degree × the per-GPU batch, so a rank holds as many tokens as before) |
//! | weights, gradients, optimizer state | whole on every rank; the gradients are reduced over the context- and data-parallel ranks together (as Megatron-LM's and torchtitan's meshes do), so the synchronisation is unchanged |
//!
//! Memory beside the activations: each piece holds the chunk arriving for the next step (its
//! key/value chunk in the forward, the chunk and its gradients in the backward).
//!
//! **Not modelled**: the first step's half-size causal (diagonal) blocks (every piece is
//! 1/degree of the kernel), all-to-all context parallelism (Ulysses; Megatron's `a2a` comm
//! type) and hierarchical rings. The pass applies to a zoo transformer with fused (flash)
//! attention, after `tensor-parallel` and before the passes that rewrite the job (sharding,
//! recomputation, accumulation, pipeline).

use std::collections::{BTreeMap, HashSet};

use super::{ATTENTION_MODULES, Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::cost::kernel::OpWork;
use crate::graph::comm::CollectiveKind;
use crate::graph::job::Job;
use crate::graph::{MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase};

/// The `context-parallel` pass.
pub struct ContextParallel;

const NAME: &str = "context-parallel";

impl Pass for ContextParallel {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "context parallelism: the sequence split over degree ranks, attention as a ring that passes key/value chunks (and their gradients) while each rank computes on the chunk it holds"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::int(
                "degree",
                "ranks per context-parallel group (next to the tensor-parallel ranks); 2 x degree must divide the sequence",
                2,
                1,
                1024,
            ),
            KnobSpec::text(
                "batch",
                "global: keep the global batch (each group of degree ranks trains degree x the per-GPU batch); replica: keep the batch per group (each rank holds 1/degree of its tokens; the global batch shrinks by degree)",
                "global",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let cp = knobs.int("degree") as u32;
        let keep_global = super::keeps_global_batch(NAME, knobs)?;
        if cp == 1 {
            return Ok(Vec::new());
        }
        let job = context_parallel(&cx.job, cp, keep_global)?;
        let seq = sequence(&cx.job).unwrap_or(0);
        Ok(vec![Patch {
            pass: NAME.into(),
            why: format!(
                "the sequence of {seq} tokens split over groups of {cp} ranks: each rank holds {} tokens of a sequence and its activations; attention passes key/value chunks round a ring of {cp} while it computes",
                seq / u64::from(cp)
            ),
            edits: vec![Edit::ReplaceJob(Box::new(job))],
        }])
    }
}

fn refuse(why: String) -> PassError {
    PassError::NotApplicable {
        pass: NAME.into(),
        why,
    }
}

/// Whether `name` is a fused attention kernel (`….attn.core`, `….self_attn.core`).
fn is_core(name: &str) -> bool {
    let block = super::unit_of(name);
    if block.is_empty() {
        return false;
    }
    let rest = name[block.len()..].trim_start_matches('.');
    rest.rsplit_once('.')
        .is_some_and(|(module, last)| last == "core" && ATTENTION_MODULES.contains(&module))
}

/// The forward and backward ops of the fused attention kernels, in id order.
fn cores(job: &Job) -> Vec<OpId> {
    (0..job.local.ops.len() as OpId)
        .filter(|&o| {
            let s = &job.local.ops[o as usize].spec;
            s.kind == OpKind::Compute
                && matches!(s.phase, Phase::Fw | Phase::Bw)
                && s.layer != NONE
                && is_core(&job.local.layers[s.layer as usize])
        })
        .collect()
}

/// The sequence length: the query rows of the first fused attention kernel's product.
fn sequence(job: &Job) -> Option<u64> {
    cores(job).into_iter().find_map(|o| {
        let op = &job.local.ops[o as usize];
        let g = op.work?.gemms[0];
        (op.spec.phase == Phase::Fw && !g.is_none()).then_some(g.m.round() as u64)
    })
}

/// Key/value heads over query heads: Llama's grouped-query `k_proj` against `q_proj` (1 where
/// the projections are fused or whole).
fn kv_ratio(job: &Job) -> f64 {
    let out = |suffix: &str| {
        job.local.ops.iter().find_map(|op| {
            let s = &op.spec;
            (s.kind == OpKind::Compute
                && s.phase == Phase::Fw
                && s.layer != NONE
                && job.local.layers[s.layer as usize].ends_with(suffix))
            .then(|| op.work.map(|w| w.gemms[0].n))
            .flatten()
        })
    };
    match (out("self_attn.k_proj"), out("self_attn.q_proj")) {
        (Some(k), Some(q)) if q > 0.0 => (k / q).min(1.0),
        _ => 1.0,
    }
}

/// Why `job` cannot take context parallelism of `cp`, if it cannot.
fn check(job: &Job, cp: u32) -> Result<(), PassError> {
    if job.is_recorded() {
        return Err(refuse(
            "context parallelism needs the model's layers (a zoo transformer: --model gpt, bert-*, llama*); a trace's kernels are not split".into(),
        ));
    }
    if job.meta.cp > 1 {
        return Err(refuse(format!(
            "the job is already context-parallel (degree {})",
            job.meta.cp
        )));
    }
    if job.meta.accumulation > 1 {
        return Err(refuse(
            "apply context-parallel before grad-accumulation: the micro-steps are already cut"
                .into(),
        ));
    }
    let Some(seq) = sequence(job) else {
        let eager = job
            .local
            .layers
            .iter()
            .any(|n| super::attention_core(n).is_some());
        return Err(refuse(if eager {
            "context parallelism runs ring attention over a fused attention kernel, as Megatron-LM (Transformer Engine) and torchtitan (SDPA) do: build the model with --attention flash".into()
        } else {
            "context parallelism splits a transformer's sequence; this model has no attention"
                .into()
        }));
    };
    let tp = job.meta.tp.max(1);
    if !job.workers.is_multiple_of(tp.saturating_mul(cp)) {
        return Err(refuse(format!(
            "degree = {cp}{} must divide the {} workers",
            if tp > 1 {
                format!(" x the tensor-parallel degree {tp}")
            } else {
                String::new()
            },
            job.workers
        )));
    }
    // Megatron-LM and torchtitan cut each sequence into 2 x degree chunks (the causal load
    // balance); with sequence parallelism the tensor-parallel ranks split each chunk again.
    let sp = if job.meta.sequence_parallel { tp } else { 1 };
    let div = 2 * u64::from(cp) * u64::from(sp);
    if !seq.is_multiple_of(div) {
        return Err(refuse(format!(
            "2 x degree{} = {div} must divide the sequence of {seq} tokens",
            if sp > 1 {
                " x the tensor-parallel degree (sequence parallelism)"
            } else {
                ""
            }
        )));
    }
    if job
        .syncs
        .iter()
        .any(|s| s.kind != CollectiveKind::AllReduce)
    {
        return Err(refuse(
            "apply context-parallel before sharding: the job's gradients are already sharded"
                .into(),
        ));
    }
    Ok(())
}

/// The degrees the layout step tries on `job`: 2, 4, 8, … that the pass takes, at most
/// [`MAX_DEGREE`]. Empty for a job that is not a zoo transformer with fused attention.
pub fn degrees(job: &Job) -> Vec<u32> {
    degrees_after_tp(job, 1)
}

/// [`degrees`] after a tensor parallelism of degree `tp` with sequence parallelism (the layout
/// step's): the group of `tp` × degree ranks divides the workers, 2 × degree × `tp` the
/// sequence.
pub fn degrees_after_tp(job: &Job, tp: u32) -> Vec<u32> {
    let tp = tp.max(1);
    let seq = sequence(job).unwrap_or(0);
    (1..32)
        .map(|i| 1u32 << i)
        .take_while(|&c| c <= MAX_DEGREE && c <= job.workers)
        .filter(|&c| check(job, c).is_ok())
        .filter(|&c| {
            job.workers.is_multiple_of(tp.saturating_mul(c))
                && seq.is_multiple_of(2 * u64::from(c) * u64::from(tp))
        })
        .collect()
}

/// Largest context-parallel degree the layout step tries (Llama 3 405B's 128k-token stage ran
/// 16: Dubey et al. 2024, Table 4).
pub const MAX_DEGREE: u32 = 16;

/// `job` with context parallelism of degree `cp`. With `keep_global` each group of `cp` ranks
/// trains `cp` times the job's per-worker batch (a rank's tokens stay as many), otherwise the
/// batch per group stays and each rank holds 1/cp of the tokens.
pub fn context_parallel(job: &Job, cp: u32, keep_global: bool) -> Result<Job, PassError> {
    check(job, cp)?;
    let mut j = job.clone();
    let cores = cores(job);
    if keep_global {
        j.meta.batch = j.meta.batch.saturating_mul(cp);
    } else {
        split_tokens(&mut j, cp, &cores);
    }
    for &c in &cores {
        let op = &j.local.ops[c as usize];
        if let Some(w) = op.work {
            let w = rank_work(&w, op.spec.phase, f64::from(cp), keep_global);
            let dur = j.recost_ns(op.spec.dur_ns, &w, j.dtype, 1.0);
            let op = &mut j.local_mut().ops[c as usize];
            op.work = Some(w);
            op.spec.dur_ns = dur;
        }
    }
    ring(&mut j, cp)?;
    j.meta.cp = cp;
    Ok(j)
}

/// Each forward and backward op computes, and each activation holds, 1/cp of the tokens (the
/// attention kernels' work is [`rank_work`]'s).
fn split_tokens(j: &mut Job, cp: u32, cores: &[OpId]) {
    let s = 1.0 / f64::from(cp);
    let mut split = vec![false; j.local.ops.len()];
    for (i, cut) in split.iter_mut().enumerate() {
        let op = &j.local.ops[i];
        if op.spec.kind != OpKind::Compute || !matches!(op.spec.phase, Phase::Fw | Phase::Bw) {
            continue;
        }
        *cut = true;
        // `cores` is in id order.
        if cores.binary_search(&(i as OpId)).is_ok() {
            continue;
        }
        let dur = match op.work {
            Some(w) => j.recost_ns(op.spec.dur_ns, &w, j.dtype, s),
            None => (op.spec.dur_ns as f64 * s).round() as u64,
        };
        let op = &mut j.local_mut().ops[i];
        op.work = op.work.map(|w| w.scaled(s));
        op.spec.dur_ns = dur;
    }
    for m in &mut j.local_mut().mem {
        if split[m.op as usize] {
            m.bytes = m.bytes.div_ceil(u64::from(cp));
        }
    }
}

/// An attention kernel's work on one rank (the zoo's products: forward QKᵀ·V as `(s_q × s_kv,
/// reduction d)` batched over batch × heads; backward `(s_q × d, reduction s_kv)` and
/// `(d × s_kv, reduction s_q)`): the rank's queries are 1/cp of the sequence against every
/// key; with `global` the group's cp × batch is in the batched count (so the FLOPs stay, and
/// accumulation, which divides the count, keeps whole samples), otherwise the FLOPs are 1/cp.
fn rank_work(w: &OpWork, phase: Phase, cp: f64, global: bool) -> OpWork {
    let mut g = w.gemms;
    if phase == Phase::Fw {
        g[0].m /= cp;
    } else {
        g[0].m /= cp;
        g[1].k /= cp;
    }
    for x in g.iter_mut().filter(|x| !x.is_none()) {
        if global {
            x.count *= cp;
        }
    }
    let f = if global { 1.0 } else { 1.0 / cp };
    OpWork {
        flops: w.flops * f,
        act_elems: w.act_elems * f,
        gemms: g,
        ..*w
    }
}

/// One of a ring's `cp` pieces of a rank's attention work: its queries against one key/value
/// chunk.
fn piece_work(w: &OpWork, phase: Phase, cp: f64) -> OpWork {
    let mut g = w.gemms;
    if phase == Phase::Fw {
        g[0].n /= cp;
    } else {
        g[0].k /= cp;
        g[1].n /= cp;
    }
    OpWork {
        flops: w.flops / cp,
        act_elems: w.act_elems / cp,
        gemms: g,
        ..*w
    }
}

/// Each attention kernel cut into `cp` pieces behind the ring's `cp − 1` steps.
fn ring(j: &mut Job, cp: u32) -> Result<(), PassError> {
    let cores = cores(j);
    let elem = j.dtype.bytes() as f64;
    let ratio = kv_ratio(j);
    // A layer's key/value chunk per rank: its forward product's query elements (count × rows ×
    // head dimension: this rank's tokens and heads) at the key/value heads' share, K and V.
    let mut chunk: BTreeMap<u32, f64> = BTreeMap::new();
    for &o in &cores {
        let op = &j.local.ops[o as usize];
        if op.spec.phase == Phase::Fw
            && let Some(w) = op.work
        {
            let g = w.gemms[0];
            chunk.insert(op.spec.layer, 2.0 * ratio * g.count * g.m * g.k * elem);
        }
    }
    let tp = j.meta.tp.max(1);
    let link = if tp.saturating_mul(cp) <= j.comm.gpus_per_node {
        j.comm.cost.intra
    } else {
        j.comm.cost.inter
    };
    let stream = super::new_stream(j);
    let has_host = j.local.ops.iter().any(|o| o.spec.kind == OpKind::Launch);
    let call_ns = has_host.then(|| j.host.collective_call_ns().round() as u64);
    let succ = j.local_succs();
    let mut pred: Vec<Vec<OpId>> = vec![Vec::new(); j.local.ops.len()];
    for (a, next) in succ.iter().enumerate() {
        for &b in next {
            pred[b as usize].push(a as OpId);
        }
    }
    let moved: HashSet<OpId> = cores.iter().copied().collect();
    j.local_mut().edges.retain(|&(a, _)| !moved.contains(&a));
    let s = 1.0 / f64::from(cp);
    let mut buffers: Vec<(OpId, u64)> = Vec::new();
    let mut ed = j.edit();
    for &c in &cores {
        let op = ed.job().local.ops[c as usize].clone();
        let launch = ed.launch_ns_of(c);
        let bytes = chunk.get(&op.spec.layer).copied().unwrap_or(0.0)
            * if op.spec.phase == Phase::Bw { 2.0 } else { 1.0 };
        let step_ns = link.time_ns(bytes).round() as u64;
        let work = op
            .work
            .map(|w| piece_work(&w, op.spec.phase, f64::from(cp)));
        let piece_ns = match work {
            Some(w) => ed.job().recost_ns(op.spec.dur_ns, &w, ed.job().dtype, 1.0),
            None => (op.spec.dur_ns as f64 * s).round() as u64,
        };
        ed.set_duration(c, piece_ns).map_err(edit_error)?;
        ed.job_mut().local_mut().ops[c as usize].work = work;
        // Where the kernel's inputs come from: its GPU-side predecessors (q, k, v).
        let inputs: Vec<OpId> = pred[c as usize]
            .iter()
            .copied()
            .filter(|&p| ed.job().local.ops[p as usize].spec.kind != OpKind::Launch)
            .collect();
        let (mut piece, mut step) = (c, None::<OpId>);
        buffers.push((c, bytes.ceil() as u64));
        for i in 1..cp {
            let after: Vec<OpId> = match step {
                Some(x) => vec![x],
                None => inputs.clone(),
            };
            let spec = OpSpec {
                layer: op.spec.layer,
                step: i,
                ..OpSpec::new(OpKind::Collective, op.spec.phase, stream, step_ns)
            };
            let x = ed
                .insert(spec, None, &after, &[], call_ns)
                .map_err(edit_error)?;
            let last = i + 1 == cp;
            let before: &[OpId] = if last { &succ[c as usize] } else { &[] };
            let spec = OpSpec {
                dur_ns: piece_ns,
                step: i,
                ..op.spec
            };
            piece = ed
                .insert(spec, work, &[piece, x], before, launch)
                .map_err(edit_error)?;
            if !last {
                buffers.push((piece, bytes.ceil() as u64));
            }
            step = Some(x);
        }
    }
    *j = ed.finish().map_err(edit_error)?;
    // The chunk arriving while a piece computes (none after the last).
    let mem = &mut j.local_mut().mem;
    for (op, bytes) in buffers {
        mem.push(MemEffect {
            op,
            worker: 0,
            bytes,
            when: MemWhen::During,
        });
    }
    Ok(())
}

fn edit_error(source: crate::graph::job::JobError) -> PassError {
    PassError::Edit {
        pass: NAME.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo::build::test_job_with;
    use crate::zoo::{Attention, ModelOptions};

    /// A two-block Llama (grouped-query attention: 8 KV heads of 32, flash attention) at
    /// `seq` tokens, batch 1, on the 8-GPU H200 node.
    fn llama(seq: u32, cluster: &str) -> Job {
        let opts = ModelOptions {
            batch: Some(1),
            layers: Some(2),
            seq: Some(seq),
            ..Default::default()
        };
        test_job_with("llama", &opts, cluster).1
    }

    fn ring_ops(j: &Job, phase: Phase) -> Vec<&crate::graph::job::LocalOp> {
        j.local
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Collective && o.spec.phase == phase)
            .collect()
    }

    fn fw_bw_ns(j: &Job) -> u64 {
        j.local
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Compute)
            .filter(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
            .map(|o| o.spec.dur_ns)
            .sum()
    }

    /// Each attention kernel becomes `cp` pieces behind `cp − 1` ring steps, forward and
    /// backward; a step carries the rank's key/value chunk (K and V at the KV heads' share:
    /// 2 × tokens/cp × 8 × 128 elements in bf16 for Llama 3 8B's shape), twice that in the
    /// backward (the chunk and its gradients), over the node's link.
    #[test]
    fn each_attention_is_a_ring_of_degree_pieces_and_degree_minus_one_steps() {
        let job = llama(8192, "8xh200");
        let blocks = 2;
        for cp in [2u32, 4, 8] {
            let j = context_parallel(&job, cp, false).expect("cp");
            assert_eq!(j.meta.cp, cp);
            let fw = ring_ops(&j, Phase::Fw);
            let bw = ring_ops(&j, Phase::Bw);
            assert_eq!(fw.len(), blocks * (cp as usize - 1));
            assert_eq!(bw.len(), blocks * (cp as usize - 1));
            assert_eq!(cores(&j).len(), 2 * blocks * cp as usize);
            // The chunk: tokens of this rank × KV heads × head dim, K and V, in the job's dtype.
            let tokens = 8192.0 / f64::from(cp);
            let chunk = 2.0 * tokens * 8.0 * 128.0 * job.dtype.bytes() as f64;
            let link = job.comm.cost.intra;
            assert_eq!(fw[0].spec.dur_ns, link.time_ns(chunk).round() as u64);
            assert_eq!(bw[0].spec.dur_ns, link.time_ns(2.0 * chunk).round() as u64);
            assert!(j.local_dfg().is_ok(), "acyclic");
        }
    }

    /// With `batch=replica` a rank computes 1/cp of every forward and backward op (the
    /// kernel model re-costs the smaller products, so a little more than 1/cp of the time)
    /// and holds 1/cp of the activations; with `batch=global` each group trains cp times the
    /// batch, so a rank's compute is what it was and its batch is the group's.
    #[test]
    fn tokens_per_rank_follow_the_batch_semantics() {
        let job = llama(8192, "8xh200");
        let before = fw_bw_ns(&job) as f64;
        let activations = |j: &Job| -> u64 {
            j.local
                .mem
                .iter()
                .filter(|m| m.when == MemWhen::AllocAtStart)
                .filter(|m| j.local.ops[m.op as usize].spec.phase == Phase::Fw)
                .map(|m| m.bytes)
                .sum()
        };
        for cp in [2u32, 4] {
            let r = context_parallel(&job, cp, false).expect("replica");
            let share = fw_bw_ns(&r) as f64 / before;
            let ideal = 1.0 / f64::from(cp);
            assert!(
                share >= ideal * 0.999 && share < ideal * 1.25,
                "cp={cp}: {share}"
            );
            let a = activations(&r) as f64 / activations(&job) as f64;
            assert!((a * f64::from(cp) - 1.0).abs() < 0.01, "cp={cp}: {a}");
            assert_eq!(r.meta.batch, job.meta.batch);
            assert_eq!(r.local.static_mem_bytes, job.local.static_mem_bytes);
            assert_eq!(r.syncs, job.syncs, "gradients reduced as before");
            let g = context_parallel(&job, cp, true).expect("global");
            assert_eq!(g.meta.batch, job.meta.batch * cp);
            assert_eq!(activations(&g), activations(&job));
            // Only the attention kernels were cut (into pieces re-costed smaller).
            let others = |j: &Job| -> u64 {
                let c: HashSet<OpId> = cores(j).into_iter().collect();
                j.local
                    .ops
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !c.contains(&(*i as OpId)))
                    .filter(|(_, o)| o.spec.kind == OpKind::Compute)
                    .map(|(_, o)| o.spec.dur_ns)
                    .sum()
            };
            assert_eq!(others(&g), others(&job));
        }
    }

    /// The ring overlaps: on the node's fast link a step is shorter than a piece, so the ring
    /// costs the iteration at most one step per attention (the first, when its chunk arrives
    /// after the first piece); on a link 10⁴ times slower the steps are exposed.
    #[test]
    fn ring_steps_hide_behind_the_pieces_unless_the_link_is_slow() {
        let job = llama(16384, "8xh200");
        let cp = 4;
        // Iteration time with and without the ring's time (its steps made instant), without
        // the gradient synchronisation (the slow link would slow it too).
        let cost_of_ring = |j: &Job| -> (u64, u64) {
            let mut j = context_parallel(j, cp, false).expect("cp");
            j.syncs.clear();
            let steps: u64 = ring_ops(&j, Phase::Fw)
                .iter()
                .chain(ring_ops(&j, Phase::Bw).iter())
                .map(|o| o.spec.dur_ns)
                .sum();
            let with = crate::passes::evaluate(j.clone())
                .expect("replay")
                .iteration_ns();
            for o in &mut j.local_mut().ops {
                if o.spec.kind == OpKind::Collective {
                    o.spec.dur_ns = 0;
                }
            }
            let without = crate::passes::evaluate(j).expect("replay").iteration_ns();
            (with - without, steps)
        };
        let (exposed, steps) = cost_of_ring(&job);
        // One step of each ring (forward and backward of each block) at most.
        assert!(steps > 0);
        assert!(
            exposed <= steps / (u64::from(cp) - 1),
            "{exposed} of {steps} ns exposed"
        );
        let mut slow = job.clone();
        slow.comm.cost.intra.bytes_per_ns /= 1e4;
        let (exposed, steps) = cost_of_ring(&slow);
        assert!(exposed >= steps * 9 / 10, "{exposed} of {steps} ns exposed");
    }

    #[test]
    fn impossible_layouts_are_refused_naming_the_constraint() {
        let job = llama(8192, "8xh200");
        let why = |j: &Job, cp: u32| match context_parallel(j, cp, false) {
            Err(PassError::NotApplicable { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(&job, 16).contains("must divide the 8 workers"));
        let odd = llama(8200, "8xh200");
        assert!(
            why(&odd, 8).contains("16 must divide the sequence of 8200"),
            "{}",
            why(&odd, 8)
        );
        let cp = context_parallel(&job, 2, false).expect("cp");
        assert!(why(&cp, 2).contains("already context-parallel"));
        let eager = test_job_with(
            "gpt",
            &ModelOptions {
                batch: Some(1),
                layers: Some(2),
                attention: Some(Attention::Eager),
                ..Default::default()
            },
            "8xh200",
        )
        .1;
        assert!(
            why(&eager, 2).contains("--attention flash"),
            "{}",
            why(&eager, 2)
        );
        let (_, cnn) = crate::zoo::build::test_job("resnet50", 4, "8xh200");
        assert!(why(&cnn, 2).contains("no attention"));
        assert_eq!(degrees(&job), vec![2, 4, 8]);
        assert!(degrees(&cnn).is_empty());
        // After tensor parallelism (4 ranks, sequence parallel): 2 x 2 x 4 divides 8192, and
        // the group of 4 x 2 ranks fills the node.
        let tp = crate::passes::tensor_parallel::tensor_parallel(&job, 4, true, false).expect("tp");
        assert_eq!(degrees(&tp), vec![2]);
        let both = context_parallel(&tp, 2, false).expect("tp x cp");
        assert_eq!(
            both.syncs.iter().map(|s| s.group).collect::<Vec<_>>(),
            tp.syncs.iter().map(|s| s.group).collect::<Vec<_>>()
        );
    }
}
