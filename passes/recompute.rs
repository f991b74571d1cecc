//! `recompute`: activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear
//! Memory Cost"; dPRO Fig. 2b): drop the saved activations of chosen layers after their forward
//! and re-run those forward ops right before the backward needs them. Memory goes down, time
//! goes up.
//!
//! **When it applies.** Any job whose layers save activations (an `AllocAtStart` effect on a FW
//! compute op, freed by the layer's BW): the memory-optimisation step of dPRO's Algorithm 1
//! ("if OOM, invoke the memory optimization pass"), or `whatif --pass recompute`.
//!
//! ```text
//! before:  FW(a) FW(b) FW(c) FW(d) │ BW(d) BW(c) BW(b) BW(a)      a..d keep activations to BW
//! after:   FW(a) FW(b) FW(c) FW(d) │ BW(d) [FW'(b) FW'(c)] BW(c) BW(b) BW(a)
//!          a, d: checkpoints (kept) · b, c: one segment, freed at the end of their FW and
//!          re-created by the re-run FW'(b) FW'(c), which waits for the BW ops before the
//!          segment's backward (so it runs late) and precedes BW(b), BW(c)
//! ```
//!
//! **Selection** (knob `layers`, default `all`). The scope is every layer with a FW and a BW
//! compute op (`all`; `auto` and `sqrt` are synonyms), or the layers whose names match a glob
//! (`*` any run of characters, `?` one character; `bert.encoder.layer.*`). Layers in scope are
//! taken in forward order; every `every`-th of them stays a checkpoint (keeps its activations)
//! and the `every − 1` between two checkpoints form one dropped *segment*. `every = 0` (default)
//! is Chen's ⌈√m⌉ for `m` layers in scope: peak activation memory O(√m), one extra forward.
//! `every = 1` keeps everything (nothing to do). Layers out of scope are checkpoints too. A
//! segment that reaches the last forward op of the job is not dropped: its backward follows at
//! once, so recomputing it would cost time and save nothing (`torch.utils.checkpoint_sequential`
//! does the same with its last segment).
//!
//! **Full checkpointing** (knob `policy=full`; default `layers`, the selection above): each
//! numbered block in scope (`bert.encoder.layer.N`, `model.layers.N`: the unit sharding wraps)
//! is one segment, its first layer the checkpoint — a pre-norm block's first layer saves the
//! block's input, so what stays is one input per block and the block being back-propagated;
//! layers outside blocks are kept. What torchtitan's `activation_checkpoint.mode = "full"`
//! and Megatron's `--recompute-granularity full --recompute-method uniform
//! --recompute-num-layers 1` do.
//!
//! **Selective recomputation** (knob `policy=selective`; Korthikanti et al., "Reducing
//! Activation Recomputation in Large Transformer Models", MLSys'23 §4.2; Megatron-LM's
//! `--recompute-granularity selective`): in each numbered block in scope only the unfused
//! attention core is re-run — QKᵀ, the softmax, its dropout and the product with V — and only
//! the activations that grow with s² are dropped (the softmax's output, the dropout's mask and
//! output: Korthikanti's 5as²b per layer in 16-bit); q, k and v, the core's inputs, stay. The
//! re-run QKᵀ keeps its saved bytes. A flash-attention model has nothing to drop (its kernel
//! saves no scores): not applicable.
//!
//! **Cost model.** Each re-run op is a copy of its forward op (spec and [`OpWork`], phase FW, same
//! GPU stream, same duration), a forward collective of the layer (tensor parallelism's
//! all-reduce) included: time grows by one forward of every dropped segment, exposed where
//! the GPU is busy. Memory: the original FW allocates its saved bytes at start and frees them at
//! end (transient), the re-run allocates them at start and the BW still frees them at end, so at
//! any time only the checkpoints and the one segment being back-propagated are live. The model
//! counts a layer's saved activations only (the input a checkpoint keeps is counted as its own
//! saved bytes); workspace of the re-run is not modelled.
//!
//! **Framework knobs** (DESIGN.md table): PyTorch `torch.utils.checkpoint` with the segment's
//! layers (or a selective policy naming them), TF `tf.recompute_grad` around each segment, JAX
//! `jax.checkpoint` policy; nothing for Horovod / BytePS.
//!
//! [`OpWork`]: crate::graph::job::OpWork

use std::collections::BTreeMap;

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::job::Job;
use crate::graph::{LayerId, MemEffect, MemWhen, NONE, OpId, OpKind, Phase};

/// The `recompute` pass.
pub struct Recompute;

const NAME: &str = "recompute";

impl Pass for Recompute {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "activation checkpointing: drop saved activations of layer segments and re-run their forward before the backward (Chen et al.; dPRO)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text(
                "layers",
                "scope: all (= auto = sqrt) or a glob on layer names (bert.encoder.layer.*)",
                "all",
            ),
            KnobSpec::int(
                "every",
                "every n-th layer in scope stays a checkpoint; 0 = ceil(sqrt(layers in scope))",
                0,
                0,
                1_000_000,
            ),
            KnobSpec::text(
                "policy",
                "layers: segments of `every` layers; full: every numbered block (transformer layer) is one segment, its first layer (which saves the block's input) the checkpoint: torchtitan's and Megatron's full activation checkpointing; selective: each block's attention core re-run, its s²-sized activations dropped (Megatron's --recompute-granularity selective)",
                "layers",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let pattern = knobs.text("layers").trim();
        if pattern.is_empty() {
            return Err(PassError::BadKnob {
                pass: NAME.into(),
                knob: "layers".into(),
                value: String::new(),
                why: "give `all` or a glob on layer names".into(),
            });
        }
        let every = knobs.int("every");
        let seg = match knobs.text("policy").trim() {
            "layers" => Segmenting::Every(every as usize),
            "full" => Segmenting::Blocks,
            "selective" => Segmenting::AttentionCore,
            other => {
                return Err(PassError::BadKnob {
                    pass: NAME.into(),
                    knob: "policy".into(),
                    value: other.into(),
                    why: "expected layers, full or selective".into(),
                });
            }
        };
        Ok(plan(&cx.job, pattern, seg)?
            .iter()
            .map(Segment::patch)
            .collect())
    }
}

/// One layer's forward and backward compute ops in one micro-step.
#[derive(Clone, Debug, Default)]
struct Unit {
    layer: LayerId,
    /// The micro-step (after gradient accumulation, a layer has one FW and one BW op per
    /// micro-step: the j-th of each, by id, belong together).
    step: usize,
    fw: Vec<OpId>,
    bw: Vec<OpId>,
    saved_bytes: u64,
}

/// One dropped segment and the ids its re-run ops get.
#[derive(Clone, Debug)]
struct Segment {
    /// FW ops to re-run, in id (forward) order, with the id each copy gets.
    reruns: Vec<(OpId, OpId)>,
    /// BW ops that must wait for the copies of a unit's FW ops.
    bw_of: BTreeMap<OpId, Vec<OpId>>,
    /// Ops the first re-run waits for (the backward before the segment's).
    after: Vec<OpId>,
    names: Vec<String>,
    saved_bytes: u64,
    rerun_ns: u64,
    edits: Vec<Edit>,
}

impl Segment {
    fn patch(&self) -> Patch {
        let first = self.names.first().map(String::as_str).unwrap_or("?");
        let last = self.names.last().map(String::as_str).unwrap_or("?");
        Patch {
            pass: NAME.into(),
            why: format!(
                "recompute {} layer(s) {first} .. {last}: {:.1} MB of saved activations dropped after FW, re-run ({:.2} ms) before their BW",
                self.names.len(),
                self.saved_bytes as f64 / 1e6,
                self.rerun_ns as f64 / 1e6
            ),
            edits: self.edits.clone(),
        }
    }
}

/// Layers with their FW/BW compute ops, per micro-step, in forward order within each
/// micro-step (by their first FW op id). A layer's compute ops of one phase are told apart by
/// micro-step through weight tensors: one op per (layer, phase, tensor) and micro-step, so the
/// j-th op of each (layer, phase, tensor) by id is micro-step j (gradient accumulation appends
/// its copies in order; AMP's casts carry their tensor).
fn units(job: &Job) -> Vec<Unit> {
    let mut by_key: BTreeMap<(LayerId, usize), Unit> = BTreeMap::new();
    let mut seen: BTreeMap<(LayerId, Phase, u32, OpKind), usize> = BTreeMap::new();
    let mut step_of: BTreeMap<OpId, (LayerId, usize)> = BTreeMap::new();
    for (i, op) in job.local.ops.iter().enumerate() {
        let s = &op.spec;
        // A layer's forward collective (tensor parallelism's all-reduce) runs again with it;
        // its backward collectives belong to its backward (the segment's backward is told
        // from the backward before it by them too).
        let ours = s.kind == OpKind::Compute || s.kind == OpKind::Collective;
        if !ours || s.layer == NONE || !matches!(s.phase, Phase::Fw | Phase::Bw) {
            continue;
        }
        let n = seen
            .entry((s.layer, s.phase, s.tensor, s.kind))
            .or_insert(0);
        let step = *n;
        *n += 1;
        let u = by_key.entry((s.layer, step)).or_insert_with(|| Unit {
            layer: s.layer,
            step,
            ..Unit::default()
        });
        match s.phase {
            Phase::Fw => u.fw.push(i as OpId),
            _ => u.bw.push(i as OpId),
        }
        step_of.insert(i as OpId, (s.layer, step));
    }
    for m in &job.local.mem {
        let s = &job.local.ops[m.op as usize].spec;
        if s.kind == OpKind::Compute
            && s.phase == Phase::Fw
            && m.when == MemWhen::AllocAtStart
            && let Some(key) = step_of.get(&m.op)
            && let Some(u) = by_key.get_mut(key)
        {
            u.saved_bytes += m.bytes;
        }
    }
    let mut v: Vec<Unit> = by_key
        .into_values()
        .filter(|u| !u.fw.is_empty() && !u.bw.is_empty())
        .collect();
    v.sort_by_key(|u| (u.step, u.fw[0]));
    v
}

/// `*` matches any run of characters, `?` one character; everything else itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// ⌈√m⌉, at least 1.
fn sqrt_ceil(m: usize) -> usize {
    let mut s = (m as f64).sqrt() as usize;
    while s * s < m {
        s += 1;
    }
    s.max(1)
}

/// How the layers in scope are cut into segments.
#[derive(Clone, Copy, Debug)]
enum Segmenting {
    /// Every n-th layer a checkpoint (0: ⌈√m⌉), the layers between one segment.
    Every(usize),
    /// One segment per numbered block ([`super::unit_of`]), its first layer the
    /// checkpoint; layers outside blocks (embeddings, head) kept.
    Blocks,
    /// Each block's attention core re-run, its s²-sized activations dropped
    /// ([`super::attention_core`]).
    AttentionCore,
}

/// The segments to drop and their edits. Inserted ids count on from `job.local.ops.len()`
/// across segments, in order, as [`super::apply_all`] assigns them.
fn plan(job: &Job, pattern: &str, seg: Segmenting) -> Result<Vec<Segment>, PassError> {
    let all = units(job);
    // Forward ops re-run whose saved activations stay (selective: QKᵀ, which saves q, k, v).
    let mut rerun_only: std::collections::BTreeSet<OpId> = Default::default();
    let dropped = match seg {
        Segmenting::Every(every) => dropped_units(job, &all, pattern, every)?,
        Segmenting::Blocks => dropped_blocks(job, &all, pattern)?,
        Segmenting::AttentionCore => {
            let (dropped, keep) = dropped_cores(job, &all, pattern)?;
            rerun_only = keep;
            dropped
        }
    };
    let last_unit = last_unit_per_step(&all);
    let mut preds: Vec<Vec<OpId>> = vec![Vec::new(); job.local.ops.len()];
    for &(a, b) in &job.local.edges {
        preds[b as usize].push(a);
    }
    let mut segments = Vec::new();
    let mut next_id = job.local.ops.len() as OpId;
    for run in dropped_runs(&all, &dropped) {
        let seg = &all[run.clone()];
        if last_unit[seg[0].step].is_some_and(|l| run.contains(&l)) {
            continue;
        }
        let Some(after) = rerun_after(job, &preds, seg) else {
            continue;
        };
        segments.push(rerun_segment(job, seg, after, &rerun_only, &mut next_id));
    }
    Ok(segments)
}

/// A layer's name (empty when the layer has none).
fn layer_name(job: &Job, l: LayerId) -> String {
    job.local
        .layers
        .get(l as usize)
        .cloned()
        .unwrap_or_default()
}

/// Micro-steps in `all` (at least 1).
fn step_count(all: &[Unit]) -> usize {
    all.iter().map(|u| u.step + 1).max().unwrap_or(1)
}

/// Which units drop their saved activations: in scope (`pattern` matches the layer, or
/// `all`/`auto`/`sqrt`), holding saved bytes, and not every `every`-th of its micro-step (the
/// last of each group is kept; `every = 0` means ⌈√m⌉ of the m layers per micro-step in scope).
/// Not applicable when no layer is in scope.
fn dropped_units(
    job: &Job,
    all: &[Unit],
    pattern: &str,
    every: usize,
) -> Result<Vec<bool>, PassError> {
    let whole = matches!(pattern, "all" | "auto" | "sqrt");
    let in_scope: Vec<bool> = all
        .iter()
        .map(|u| whole || glob_match(pattern, &layer_name(job, u.layer)))
        .collect();
    let m = in_scope.iter().filter(|&&x| x).count();
    if m == 0 {
        return Err(PassError::NotApplicable {
            pass: NAME.into(),
            why: format!("no layer with a forward and a backward op matches `{pattern}`"),
        });
    }
    let steps = step_count(all);
    let m = m / steps.max(1);
    let every = if every == 0 { sqrt_ceil(m) } else { every };
    let mut dropped = vec![false; all.len()];
    let mut pos = vec![0usize; steps];
    for (i, &s) in in_scope.iter().enumerate() {
        if s {
            let p = &mut pos[all[i].step];
            dropped[i] = *p % every != every - 1 && all[i].saved_bytes > 0;
            *p += 1;
        }
    }
    Ok(dropped)
}

/// Full checkpointing: in each micro-step, every layer in scope inside a numbered block but
/// the block's first (its checkpoint, which saves the block's input) is dropped, so each
/// block is one segment re-run whole before its backward. Not applicable without blocks.
fn dropped_blocks(job: &Job, all: &[Unit], pattern: &str) -> Result<Vec<bool>, PassError> {
    let whole = matches!(pattern, "all" | "auto" | "sqrt");
    let mut dropped = vec![false; all.len()];
    let mut first_seen: std::collections::BTreeSet<(usize, String)> = Default::default();
    for (i, u) in all.iter().enumerate() {
        let name = layer_name(job, u.layer);
        let block = super::unit_of(&name);
        if block.is_empty() || !(whole || glob_match(pattern, &name)) {
            continue;
        }
        // The block's first layer in forward order (units are sorted so) is its checkpoint;
        // every other layer of it re-runs, those that save nothing too (the whole block's
        // forward runs again).
        dropped[i] = !first_seen.insert((u.step, block.to_string()));
    }
    let saves = all
        .iter()
        .zip(&dropped)
        .any(|(u, &d)| d && u.saved_bytes > 0);
    if !saves {
        return Err(PassError::NotApplicable {
            pass: NAME.into(),
            why: format!(
                "policy=full checkpoints numbered blocks (model.layers.N, transformer.h.N); no block of layers matching `{pattern}` saves activations past its first layer"
            ),
        });
    }
    Ok(dropped)
}

/// Selective recomputation: in each micro-step, the attention-core layers of every block in
/// scope are one segment; the forward ops of its QKᵀ are returned too (re-run, memory kept).
/// Not applicable when no block has an unfused attention core.
fn dropped_cores(
    job: &Job,
    all: &[Unit],
    pattern: &str,
) -> Result<(Vec<bool>, std::collections::BTreeSet<OpId>), PassError> {
    let whole = matches!(pattern, "all" | "auto" | "sqrt");
    let mut dropped = vec![false; all.len()];
    let mut keep = std::collections::BTreeSet::new();
    for (i, u) in all.iter().enumerate() {
        let name = layer_name(job, u.layer);
        let Some(kept) = super::attention_core(&name) else {
            continue;
        };
        if !(whole || glob_match(pattern, &name)) {
            continue;
        }
        dropped[i] = true;
        if kept {
            keep.extend(u.fw.iter().copied());
        }
    }
    let saves = all
        .iter()
        .zip(&dropped)
        .any(|(u, &d)| d && u.saved_bytes > 0 && !u.fw.iter().all(|f| keep.contains(f)));
    if !saves {
        return Err(PassError::NotApplicable {
            pass: NAME.into(),
            why: format!(
                "policy=selective re-runs a block's unfused attention core (QKᵀ, softmax, dropout, ·V); no block of layers matching `{pattern}` has one (a flash-attention kernel saves no scores to drop)"
            ),
        });
    }
    Ok((dropped, keep))
}

/// The last unit of each micro-step in forward order (units are sorted by their first FW op,
/// which is in forward order; inserted ops such as casts come later by id): a segment reaching
/// it is not dropped.
fn last_unit_per_step(all: &[Unit]) -> Vec<Option<usize>> {
    let mut last_unit: Vec<Option<usize>> = vec![None; step_count(all)];
    for (i, u) in all.iter().enumerate() {
        last_unit[u.step] = Some(i);
    }
    last_unit
}

/// The maximal runs of consecutive dropped units within one micro-step, in order.
fn dropped_runs(all: &[Unit], dropped: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < all.len() {
        if !dropped[i] {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < all.len() && dropped[j] && all[j].step == all[i].step {
            j += 1;
        }
        runs.push(i..j);
        i = j;
    }
    runs
}

/// What a segment's first re-run waits for: the non-forward, non-launch predecessors of its
/// backward ops outside it (the backward before the segment's), sorted. `None` when one of
/// them is reachable from the segment's backward: a recorded step can interleave a layer's
/// backward with host work that waits on it (a synchronising copy), and re-running the forward
/// after it would close a cycle, so such a segment is kept.
fn rerun_after(job: &Job, preds: &[Vec<OpId>], seg: &[Unit]) -> Option<Vec<OpId>> {
    let seg_bw: Vec<OpId> = seg.iter().flat_map(|u| u.bw.iter().copied()).collect();
    let mut after: Vec<OpId> = seg_bw
        .iter()
        .flat_map(|&b| preds[b as usize].iter().copied())
        .filter(|p| {
            let s = &job.local.ops[*p as usize].spec;
            !seg_bw.contains(p) && s.phase != Phase::Fw && s.kind != OpKind::Launch
        })
        .collect();
    after.sort_unstable();
    after.dedup();
    let reach = job.reachable_from(&seg_bw);
    if after.iter().any(|&a| reach[a as usize]) {
        return None;
    }
    Some(after)
}

/// The segment `seg` dropped: its forward ops re-run in id order, the first after `after`,
/// each before the backward ops of its unit (see [`rerun_op`]); ids from `next_id` on.
fn rerun_segment(
    job: &Job,
    seg: &[Unit],
    after: Vec<OpId>,
    rerun_only: &std::collections::BTreeSet<OpId>,
    next_id: &mut OpId,
) -> Segment {
    let mut fw: Vec<OpId> = seg.iter().flat_map(|u| u.fw.iter().copied()).collect();
    fw.sort_unstable();
    let mut seg_out = Segment {
        reruns: Vec::new(),
        bw_of: BTreeMap::new(),
        after,
        names: seg.iter().map(|u| layer_name(job, u.layer)).collect(),
        saved_bytes: seg
            .iter()
            .filter(|u| !u.fw.iter().all(|f| rerun_only.contains(f)))
            .map(|u| u.saved_bytes)
            .sum(),
        rerun_ns: fw
            .iter()
            .map(|&f| job.local.ops[f as usize].spec.dur_ns)
            .sum(),
        edits: Vec::new(),
    };
    for u in seg {
        for &f in &u.fw {
            seg_out.bw_of.insert(f, u.bw.clone());
        }
    }
    let mut prev: Option<OpId> = None;
    for &f in &fw {
        let id = rerun_op(job, f, prev, rerun_only.contains(&f), &mut seg_out, next_id);
        seg_out.reruns.push((f, id));
        prev = Some(id);
    }
    seg_out
}

/// The re-run of forward op `f` (after the previous re-run, or the segment's `after` for the
/// first), with its launch when it had one; the original's saved activations then live only
/// while it runs, and the re-run allocates them again (unless it `keeps_memory`: re-run for
/// what it computes, its saved activations kept). Pushes the edits to `seg`; returns the
/// re-run's id.
fn rerun_op(
    job: &Job,
    f: OpId,
    prev: Option<OpId>,
    keeps_memory: bool,
    seg: &mut Segment,
    next_id: &mut OpId,
) -> OpId {
    let op = &job.local.ops[f as usize];
    let mut spec = op.spec.clone();
    spec.phase = Phase::Fw;
    // The original first: `search::describe` names the recomputed layers by it.
    let mut after_r = vec![f];
    match prev {
        Some(p) => after_r.push(p),
        None => after_r.extend(&seg.after),
    }
    let before = seg.bw_of.get(&f).cloned().unwrap_or_default();
    // The re-run is dispatched again by the host (checkpointing re-runs the forward code), at
    // the cost the original forward op's launch had. The editor appends the op, then its
    // launch: both take an id.
    let launch_ns = job.launch_ns_of(f);
    let id = *next_id;
    *next_id += if launch_ns.is_some() { 2 } else { 1 };
    seg.edits.push(Edit::Insert {
        spec,
        work: op.work,
        after: after_r,
        before,
        launch_ns,
    });
    // The original FW: its saved activations live only while it runs.
    let (alloc, mut rest): (Vec<MemEffect>, Vec<MemEffect>) = job
        .local
        .mem
        .iter()
        .filter(|m| m.op == f)
        .partition(|m| m.when == MemWhen::AllocAtStart);
    let bytes: u64 = alloc.iter().map(|m| m.bytes).sum();
    if bytes > 0 && !keeps_memory {
        let mut fx = alloc.clone();
        fx.push(MemEffect {
            op: f,
            worker: 0,
            bytes,
            when: MemWhen::FreeAtEnd,
        });
        fx.append(&mut rest);
        seg.edits.push(Edit::SetMem { op: f, effects: fx });
        seg.edits.push(Edit::SetMem {
            op: id,
            effects: vec![MemEffect {
                op: id,
                worker: 0,
                bytes,
                when: MemWhen::AllocAtStart,
            }],
        });
    }
    id
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cost::comm::AlphaBeta;
    use crate::cost::config::{Dtype, SyncScheme, load_gpu};
    use crate::graph::comm::{CommCost, CommSpec};
    use crate::graph::job::{JobMeta, LocalGraph, LocalOp, OpWork, Sync};
    use crate::graph::{DeviceKind, OpSpec, Tensor};
    use crate::passes::{apply_all, evaluate, registry, resolve_knobs};

    /// A ring of `workers` with α = 1 µs and 1 byte/ns links.
    pub(crate) fn ring_spec() -> CommSpec {
        let link = AlphaBeta {
            alpha_ns: 1000.0,
            bytes_per_ns: 1.0,
        };
        CommSpec {
            scheme: SyncScheme::Ring,
            gpus_per_node: 8,
            nodes: 1,
            ps_servers: 1,
            cost: CommCost {
                intra: link,
                inter: link,
                aggregate_bytes_per_ns: 10.0,
            },
        }
    }

    /// A chain of `n` layers `l0..l{n-1}`: FW(i) of `fw_ns[i]`, BW(i) of `2·fw_ns[i]`, layer i
    /// saves `saved[i]` bytes (alloc at FW start, free at BW end), layer 0 has one weight tensor of
    /// 1,000 bytes (Out after BW(0), ring sync, In, a 1 µs UPDATE after bw_done). One worker.
    /// Op ids: FW i = i, BW i = 2n−1−i, bw_done = 2n, Out = 2n+1, In = 2n+2, UPDATE = 2n+3.
    pub(crate) fn chain(fw_ns: &[u64], saved: &[u64]) -> Job {
        let n = fw_ns.len();
        let mut g = LocalGraph {
            devices: vec![
                DeviceKind::Virtual,
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                },
            ],
            layers: (0..n).map(|i| format!("l{i}")).collect(),
            tensors: vec![Tensor {
                name: "l0.weight".into(),
                bytes: 1000,
                layer: 0,
            }],
            static_mem_bytes: 1_000_000,
            fused: Default::default(),
            ..LocalGraph::default()
        };
        let work = |t: u64| {
            OpWork::new(
                crate::cost::kernel::OpClass::Gemm,
                t as f64 * 1e4,
                t as f64,
                0.0,
                1,
            )
        };
        for (i, &t) in fw_ns.iter().enumerate() {
            g.ops.push(LocalOp {
                spec: OpSpec::compute(1, Phase::Fw, i as u32, t),
                work: Some(work(t)),
            });
            if i > 0 {
                g.edges.push((i as OpId - 1, i as OpId));
            }
        }
        for i in (0..n).rev() {
            let id = g.ops.len() as OpId;
            g.ops.push(LocalOp {
                spec: OpSpec::compute(1, Phase::Bw, i as u32, 2 * fw_ns[i]),
                work: Some(work(2 * fw_ns[i])),
            });
            g.edges.push((i as OpId, id));
            if i + 1 < n {
                g.edges.push((id - 1, id));
            }
        }
        for (i, &b) in saved.iter().enumerate() {
            if b > 0 {
                g.mem.push(MemEffect {
                    op: i as OpId,
                    worker: 0,
                    bytes: b,
                    when: MemWhen::AllocAtStart,
                });
                g.mem.push(MemEffect {
                    op: (2 * n - 1 - i) as OpId,
                    worker: 0,
                    bytes: b,
                    when: MemWhen::FreeAtEnd,
                });
            }
        }
        let n = n as OpId;
        let push = |g: &mut LocalGraph, spec: OpSpec| {
            g.ops.push(LocalOp { spec, work: None });
        };
        push(&mut g, OpSpec::new(OpKind::Out, Phase::Bw, 0, 0));
        g.edges.push((2 * n - 1, 2 * n));
        push(
            &mut g,
            OpSpec {
                tensor: 0,
                layer: 0,
                ..OpSpec::new(OpKind::Out, Phase::Comm, 0, 0)
            },
        );
        g.edges.push((2 * n - 1, 2 * n + 1));
        push(
            &mut g,
            OpSpec {
                tensor: 0,
                layer: 0,
                ..OpSpec::new(OpKind::In, Phase::Comm, 0, 0)
            },
        );
        g.ops.push(LocalOp {
            spec: OpSpec {
                tensor: 0,
                ..OpSpec::compute(1, Phase::Update, 0, 1000)
            },
            work: Some(OpWork::new(
                crate::cost::kernel::OpClass::Elementwise,
                250.0,
                0.0,
                1250.0,
                1,
            )),
        });
        g.edges.push((2 * n + 2, 2 * n + 3));
        g.edges.push((2 * n, 2 * n + 3));
        Job {
            local: g.into(),
            syncs: vec![Sync {
                tensors: vec![0],
                bytes: 1000,
                partitions: 1,
                kind: crate::graph::comm::CollectiveKind::AllReduce,
                group: crate::graph::comm::Group::ALL,
                ready: vec![2 * n + 1],
                done: vec![2 * n + 2],
            }],
            comm: ring_spec(),
            workers: 1,
            symmetric: false,
            gpu: load_gpu("v100-32gb").unwrap(),
            dtype: Dtype::Fp32,
            math: Default::default(),
            framework: Default::default(),
            exec: Default::default(),
            host: Default::default(),
            memory: Default::default(),
            meta: JobMeta::default(),
        }
    }

    fn run(job: Job, args: &[(&str, &str)]) -> (Evaluated, Evaluated, Vec<Patch>) {
        let reg = registry();
        let p = crate::passes::find(&reg, NAME).unwrap();
        let given: Vec<(String, String)> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let knobs = resolve_knobs(p, &given).unwrap();
        let base = evaluate(job).unwrap();
        let patches = p.propose(&base, &knobs).unwrap();
        let after = evaluate(apply_all(&base.job, &patches).unwrap()).unwrap();
        (base, after, patches)
    }

    #[test]
    fn glob_matches_like_a_shell() {
        assert!(glob_match(
            "bert.encoder.layer.*",
            "bert.encoder.layer.11.output.dense"
        ));
        assert!(!glob_match(
            "bert.encoder.layer.*",
            "bert.embeddings.word_embeddings"
        ));
        assert!(glob_match("l?", "l3"));
        assert!(!glob_match("l?", "l10"));
        assert!(glob_match("*dense", "a.dense"));
        assert!(glob_match("*", ""));
        assert_eq!(sqrt_ceil(9), 3);
        assert_eq!(sqrt_ceil(10), 4);
        assert_eq!(sqrt_ceil(1), 1);
    }

    #[test]
    fn sqrt_schedule_on_a_chain_of_four() {
        // 4 layers, FW 1000/2000/3000/4000 ns, each saves 100 MB-ish (distinct sizes).
        // ⌈√4⌉ = 2: layers 1 and 3 (0-based) are checkpoints; segments {0} and {2}.
        // Segment {2} does not reach the last FW (3), so both are dropped.
        let saved = [100, 200, 400, 800];
        let job = chain(&[1000, 2000, 3000, 4000], &saved);
        let (base, after, patches) = run(job, &[]);
        assert_eq!(patches.len(), 2);
        // Baseline: FW 10 µs, BW 20 µs, then UPDATE 1 µs after the sync of 1,000 bytes on one
        // worker (a ring of one has no steps) → 31 µs.
        assert_eq!(base.iteration_ns(), 31_000);
        // One extra FW of layers 0 and 2: +1 µs +3 µs.
        assert_eq!(after.iteration_ns(), 35_000);
        // Baseline peak: static + all saved = 1,000,000 + 1,500.
        assert_eq!(base.memory.peak_bytes, 1_001_500);
        // After: checkpoints 1 and 3 (200 + 800) stay; during FW(2) its 400 are live too
        // (1,400); in BW, FW'(2) re-allocates 400 while 200 + 800 are still held before BW(3)
        // ends? No: FW'(2) waits for BW(3), which frees 800 at its end → 200 + 400 = 600.
        // The peak is at the FW/BW turn: 200 + 800 (+ nothing transient) = 1,000, or during
        // FW(2): 200 + 400 = 600, or FW(3): 200 + 800 = 1,000 → 1,000.
        assert_eq!(after.memory.peak_bytes, 1_001_000);
        // The re-run ops are FW compute ops of layers 0 and 2, placed before their BW.
        let j = &after.job;
        let reruns: Vec<_> = j
            .local
            .ops
            .iter()
            .enumerate()
            .skip(base.job.local.ops.len())
            .map(|(i, o)| (i, o.spec.layer, o.spec.phase, o.spec.dur_ns))
            .collect();
        assert_eq!(
            reruns,
            vec![(12, 0, Phase::Fw, 1000), (13, 2, Phase::Fw, 3000)]
        );
        // Re-run of layer 2 (op 13) waits for BW(3) (op 4) and precedes BW(2) (op 5).
        assert!(j.local.edges.contains(&(4, 13)));
        assert!(j.local.edges.contains(&(13, 5)));
        assert!(j.local.edges.contains(&(6, 12)));
        assert!(j.local.edges.contains(&(12, 7)));
    }

    #[test]
    fn every_and_glob_choose_the_segments() {
        let job = chain(&[1000, 2000, 3000, 4000, 5000], &[10, 20, 30, 40, 50]);
        // every=5: layers 0..3 one segment, 4 kept (and the last FW anyway).
        let (_, after, patches) = run(job.clone(), &[("every", "5")]);
        assert_eq!(patches.len(), 1);
        assert_eq!(after.iteration_ns(), 45_000 + 1000 + 10_000);
        // The whole segment is re-created at once in BW: static + 50 (kept) ... BW(4) frees its
        // 50 at its end before the re-run starts → peak = FW/BW turn with 50 live, or the
        // re-run's 10+20+30+40 = 100 → 100.
        assert_eq!(after.memory.peak_bytes, 1_000_100);
        // A glob naming one layer: l1 alone (every=0 → ⌈√1⌉ = 1 keeps it!) → nothing dropped.
        let (_, after, patches) = run(job.clone(), &[("layers", "l1")]);
        assert!(patches.is_empty());
        assert_eq!(after.iteration_ns(), 46_000);
        // every=2 over the glob l? (all 5): dropped 0, 2, 4 → 4 is the last FW, skipped.
        let (_, after, patches) = run(job.clone(), &[("layers", "l?"), ("every", "2")]);
        assert_eq!(patches.len(), 2);
        assert_eq!(after.iteration_ns(), 46_000 + 1000 + 3000);
        // every=1 keeps every layer.
        let (_, _, patches) = run(job, &[("every", "1")]);
        assert!(patches.is_empty());
    }

    #[test]
    fn a_glob_matching_nothing_is_refused() {
        let job = chain(&[1000, 2000], &[1, 1]);
        let reg = registry();
        let p = crate::passes::find(&reg, NAME).unwrap();
        let knobs = resolve_knobs(p, &[("layers".into(), "nope.*".into())]).unwrap();
        let e = p.propose(&evaluate(job).unwrap(), &knobs).unwrap_err();
        assert!(e.to_string().contains("nope.*"), "{e}");
    }

    #[test]
    fn full_policy_re_runs_each_block_whole_from_its_input() {
        // SQuAD fine-tuning at batch 32: the pre-training head's logits (held by the loop, with
        // a scratch as large in the loss's backward) would set the peak outside the blocks, and
        // at a small batch the gradients (0.44 GB) would.
        let opts = crate::zoo::ModelOptions {
            batch: Some(32),
            head: Some(crate::zoo::Head::Squad),
            ..Default::default()
        };
        let (_, job) = crate::zoo::build::test_job_with("bert-base", &opts, "dpro-16xv100-rdma");
        let (base, after, patches) = run(job.clone(), &[("policy", "full")]);
        // One segment per encoder block, each inside its block, its first layer kept.
        assert_eq!(patches.len(), 12, "{patches:#?}");
        for (i, p) in patches.iter().enumerate() {
            let block = format!("bert.encoder.layer.{i}.");
            let names: Vec<&str> = p
                .why
                .split(' ')
                .filter(|w| w.starts_with("bert."))
                .collect();
            assert_eq!(names.len(), 2, "{}", p.why);
            assert!(names.iter().all(|n| n.starts_with(&block)), "{}", p.why);
            assert!(
                !p.why.contains(&format!("{block}attention.self.query ")),
                "{}",
                p.why
            );
        }
        // Kept: the block inputs, one block being back-propagated, and what lies outside
        // the blocks (the embeddings, the SQuAD head), with the gradients made so far. (The
        // sqrt schedule's segments can be smaller than a block, so its peak can be lower or
        // higher than this one's, depending on the batch and the head.)
        let act = |e: &Evaluated| e.memory.peak_bytes - e.job.local.static_mem_bytes;
        assert!(
            act(&after) * 2 < act(&base),
            "{} vs {}",
            act(&after),
            act(&base)
        );
        // About one forward of the blocks more.
        assert!(after.iteration_ns() > base.iteration_ns());
        // A model without numbered blocks has nothing to checkpoint this way.
        let chain = chain(&[1000, 2000, 3000], &[10, 20, 30]);
        let reg = registry();
        let p = crate::passes::find(&reg, NAME).unwrap();
        let knobs = resolve_knobs(p, &[("policy".into(), "full".into())]).unwrap();
        let e = evaluate(chain).unwrap();
        assert!(matches!(
            p.propose(&e, &knobs),
            Err(PassError::NotApplicable { .. })
        ));
        let bad = resolve_knobs(p, &[("policy".into(), "sideways".into())]).unwrap();
        assert!(matches!(
            p.propose(&e, &bad),
            Err(PassError::BadKnob { .. })
        ));
    }

    /// Korthikanti et al. §4.2: selective recomputation drops, per layer, the activations that
    /// grow with s² — the softmax's output, the dropout's mask and its output (5as²b in 16 bit;
    /// 4 + 1 + 4 bytes per score in FP32) — and re-runs QKᵀ, the softmax, the dropout and ·V,
    /// keeping q, k and v.
    #[test]
    fn selective_policy_drops_the_attention_scores_korthikanti_counts() {
        let (a, s, b, layers) = (16u64, 512u64, 2u64, 4u32);
        let opts = crate::zoo::ModelOptions {
            batch: Some(b as u32),
            hidden: Some(1024),
            heads: Some(a as u32),
            layers: Some(layers),
            seq: Some(s as u32),
            ..Default::default()
        };
        let (_, job) = crate::zoo::build::test_job_with("gpt", &opts, "8xv100");
        let segs = plan(&job, "all", Segmenting::AttentionCore).expect("selective");
        assert_eq!(segs.len(), layers as usize);
        for (i, sg) in segs.iter().enumerate() {
            let core = format!("transformer.h.{i}.attn.");
            let want: Vec<String> = ["matmul_qk", "softmax", "attn_dropout", "matmul_av"]
                .iter()
                .map(|l| format!("{core}{l}"))
                .collect();
            assert_eq!(sg.names, want);
            assert_eq!(sg.saved_bytes, 9 * a * s * s * b, "block {i}");
            assert_eq!(sg.reruns.len(), 4, "the four forward ops re-run");
            // QKᵀ re-runs with its saved q, k, v kept: no memory edit names it.
            let qk = sg.reruns[0].0;
            assert!(
                !sg.edits
                    .iter()
                    .any(|e| matches!(e, Edit::SetMem { op, .. } if *op == qk))
            );
        }
        // Applied: the s² activations leave the peak, at far less time than full blocks.
        let (base, sel, _) = run(job.clone(), &[("policy", "selective")]);
        let (_, full, _) = run(job.clone(), &[("policy", "full")]);
        assert!(sel.memory.peak_bytes < base.memory.peak_bytes);
        assert!(sel.iteration_ns() > base.iteration_ns());
        assert!(sel.iteration_ns() < full.iteration_ns());
        // Flash attention saves no scores: nothing to drop.
        let flash = crate::zoo::ModelOptions {
            attention: Some(crate::zoo::Attention::Flash),
            ..opts
        };
        let (_, fj) = crate::zoo::build::test_job_with("gpt", &flash, "8xv100");
        let e = plan(&fj, "all", Segmenting::AttentionCore).unwrap_err();
        assert!(e.to_string().contains("flash"), "{e}");
    }

    #[test]
    fn bert_base_memory_falls_time_rises() {
        let (_, job) = crate::zoo::build::test_job("bert-base", 8, "dpro-16xv100-rdma");
        let fw_total: u64 = job
            .local
            .ops
            .iter()
            .filter(|o| o.spec.phase == Phase::Fw)
            .map(|o| o.spec.dur_ns)
            .sum();
        let (base, after, patches) = run(job, &[]);
        assert!(!patches.is_empty());
        let act_before = base.memory.peak_bytes - base.job.local.static_mem_bytes;
        let act_after = after.memory.peak_bytes - after.job.local.static_mem_bytes;
        // √-checkpointing keeps well under half of the activations live.
        assert!(act_after * 2 < act_before, "{act_after} vs {act_before}");
        // Time grows, by at most one forward.
        let dt = after.iteration_ns() - base.iteration_ns();
        assert!(dt > 0 && dt <= fw_total, "{dt} vs FW {fw_total}");
    }
}
