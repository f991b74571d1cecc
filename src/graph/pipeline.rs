//! Pipeline parallelism in the global graph: a pipelined job's stages replayed as the different
//! workers they are (GPipe, Huang et al. 2019; 1F1B / PipeDream-Flush, Narayanan et al.,
//! "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2021, §2.2).
//!
//! A pipelined [`Job`] (`passes/pipeline.rs` sets [`Job::pipeline`]) keeps its local graph as
//! one micro-batch of the whole model replica. [`expand`] cuts it into `stages` workers by
//! transformer block (block `b` of `L` on stage `b / (L / stages)`, or, where the stages do not
//! divide the blocks, the first and last stage one block lighter: [`split`]; the layers before the first
//! block — embeddings — on the first stage, the layers after the last — final norm, head, loss
//! — on the last), and replays on each stage:
//!
//! ```text
//! stage s:  F(s,0) F(s,1) … ─ B(s,0) … B(s,m−1) ─ sync(stage s's gradients over its replicas) ─ UPDATE
//!             │ send (activation, link s→s+1)          ▲ send (its gradient, link s+1→s)
//! stage s+1:  F(s+1,0) …                            B(s+1,0) …
//! ```
//!
//! - Each micro-step `F(s,j)` / `B(s,j)` is a copy of the stage's forward / backward ops (their
//!   CPU launches included); ops without a layer (the micro-step's host work, the virtual
//!   joins) are on every stage. A template edge inside a stage is kept in every micro-step; an
//!   edge from a forward op of stage `s` to one of a later stage becomes a SEND of the
//!   producer's output (one per producer, micro-step and destination) on the link between the
//!   two stages, and a backward edge to an earlier stage a SEND of that activation's gradient.
//!   Other edges between stages are implied by those and dropped. A SEND costs `α + bytes/β`
//!   of the link class between the stages' ranks (the pipeline dimension is outermost, as in
//!   Megatron-LM and torchtitan: stage `s`'s ranks are `s · N / stages` onwards), with
//!   Megatron's scatter/gather optimisation under tensor parallelism (each rank of a group sends
//!   1/t of the activation; the all-gather after it, inside the node, is not modelled).
//! - Interleaved (`virtual` = V > 1): the cut has `stages × V` model chunks, chunk `c` on rank
//!   `c mod stages` (its devices, its memory, its gradient stream); sends go from a chunk to the
//!   next one's rank, the last rank's to the first's on their own link.
//! - The schedule orders each stage's micro-steps on each of its devices: a micro-step's first
//!   op on the host thread or a stream waits for the previous micro-step's last op there (the
//!   order a stage's process issues them: the host runs ahead, a stream waits for the send it
//!   receives). GPipe: all forwards, then all backwards. 1F1B: `min(stages − s − 1,
//!   m)` warm-up forwards, then one forward and one backward alternately, then the remaining
//!   backwards.
//! - Ops of the update and communication phases run once per stage, after every micro-step
//!   whose ops they follow (gradients are accumulated over the micro-batches); each stage
//!   synchronises its own tensors over its data-parallel replicas on its own communication
//!   stream, in the quotient form of [`CommTopology::symmetric_ring`] (the replicas of a
//!   stage are identical).
//! - Memory: each stage's weights and optimizer state are the job's static memory in
//!   proportion to the parameter bytes the stage holds, plus its gradient buffers (held from
//!   the first backward to the step's end), plus a copy of each tied weight another stage
//!   owns (GPT's output layer on the last stage and the word embeddings on the first); each
//!   micro-step allocates and frees its own activations, so the micro-batches a stage holds
//!   in flight (all `m` under GPipe, `stages − s` under 1F1B) come out of the replay. Tied
//!   weights' gradients are exchanged between their stages ([`Expansion::tied_sends`]).
//!
//! **Invariant:** every op of the expanded graph maps to the local op it copies
//! ([`Expanded::local_of`], [`NONE`] for sends and joins), so the critical path names local ops.

use super::comm::CommTopology;
use super::job::{Job, JobError};
use super::{
    DeviceKind, Dfg, DfgBuilder, LinkClass, MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase,
};
use crate::cost::compute::ns as ns_of;

pub use super::job::{Pipeline, Schedule};

impl Job {
    /// The global DFG of one iteration: the data-parallel expansion of the template
    /// ([`Job::expand_data_parallel`]), or a pipelined job's stages ([`expand`]).
    pub fn expand(&self) -> Result<Dfg, JobError> {
        match &self.meta.pipeline {
            Some(p) => expand(self, p).map(|e| e.graph),
            None => self.expand_data_parallel(),
        }
    }
}

/// One micro-step of a rank's schedule: forward (`false`) or backward (`true`), the model
/// chunk (`0..stages × virtual`) and the micro-batch.
pub fn stage_order(p: &Pipeline, stage: u32) -> Vec<(bool, u32, u32)> {
    let m = p.microbatches;
    let n = p.stages;
    match p.schedule {
        Schedule::Gpipe => (0..m)
            .map(|j| (false, stage, j))
            .chain((0..m).map(|j| (true, stage, j)))
            .collect(),
        Schedule::OneFOneB | Schedule::Interleaved => {
            let v = p.chunks_per_rank.max(1);
            let total = m * v;
            // Megatron-LM's interleaved order: the k-th forward runs chunk (k / n) mod v on
            // micro-batch (k / (n v)) n + k mod n; backwards take the chunks in reverse.
            let forward = |k: u32| {
                let local = (k / n) % v;
                (false, local * n + stage, (k / (n * v)) * n + k % n)
            };
            let backward = |k: u32| {
                let local = v - 1 - (k / n) % v;
                (true, local * n + stage, (k / (n * v)) * n + k % n)
            };
            let warm = if v == 1 {
                (n - stage - 1).min(m)
            } else if m == n {
                total
            } else {
                ((n - stage - 1) * 2 + (v - 1) * n).min(total)
            };
            let mut order: Vec<(bool, u32, u32)> = (0..warm).map(forward).collect();
            for i in 0..total - warm {
                order.push(forward(warm + i));
                order.push(backward(i));
            }
            order.extend((total - warm..total).map(backward));
            order
        }
    }
}

/// Stage of every local op (`u32::MAX`: an op without a layer, on every stage) and of every
/// layer, or why the job cannot be cut into `stages`.
pub struct Stages {
    pub of_op: Vec<u32>,
    pub of_layer: Vec<u32>,
    /// Transformer blocks the cut divides.
    pub blocks: u32,
    /// Blocks of each piece, first to last ([`split`]).
    pub sizes: Vec<u32>,
}

/// Blocks per piece when `blocks` are cut into `pieces`: equal where `pieces` divides them;
/// otherwise ⌈blocks / pieces⌉ each but the ends, one block lighter — the last where one piece
/// must be (it also holds the head and the loss), the first and the last where two must (the
/// first holds the embedding): Megatron-LM's `--decoder-first/last-pipeline-num-layers`, and
/// Llama 3 405B's 126 layers on 16 stages (7, 14 × 8, 7). None where that cannot cut them.
pub fn split(blocks: u32, pieces: u32) -> Option<Vec<u32>> {
    if pieces == 0 || blocks < pieces {
        return None;
    }
    let q = blocks.div_ceil(pieces);
    let mut sizes = vec![q; pieces as usize];
    match pieces * q - blocks {
        0 => {}
        1 => sizes[pieces as usize - 1] = q - 1,
        2 if pieces > 2 => {
            sizes[0] = q - 1;
            sizes[pieces as usize - 1] = q - 1;
        }
        _ => return None,
    }
    Some(sizes)
}

/// Every stage.
pub const ALL: u32 = u32::MAX;

/// Cut `job`'s layers into `stages` by transformer block (see the module docs).
pub fn stages(job: &Job, stages: u32) -> Result<Stages, String> {
    let l = &job.local;
    // The block stack: the prefix with the most block indices (`model.layers.`, `transformer.h.`).
    let mut by_prefix: std::collections::BTreeMap<&str, u32> = Default::default();
    let block: Vec<Option<(&str, u32)>> = l
        .layers
        .iter()
        .map(|name| super::block_of(name).map(|(prefix, i, _)| (prefix, i)))
        .collect();
    for &(prefix, i) in block.iter().flatten() {
        let e = by_prefix.entry(prefix).or_insert(0);
        *e = (*e).max(i + 1);
    }
    let (prefix, blocks) = by_prefix
        .iter()
        .max_by_key(|&(p, n)| (*n, std::cmp::Reverse(*p)))
        .map(|(p, n)| (*p, *n))
        .ok_or_else(|| {
            "pipeline stages are cut by transformer block; this job's layers have no block index (a zoo transformer: --model gpt, bert-*, llama*)".to_string()
        })?;
    let attention = l.layers.iter().zip(&block).any(|(name, b)| {
        b.is_some_and(|(p, _)| p == prefix) && (name.contains("attn") || name.contains("attention"))
    });
    if !attention {
        return Err(format!(
            "pipeline stages are cut by transformer block; the blocks of this model ({prefix}0 …) have no attention (a zoo transformer: --model gpt, bert-*, llama*)"
        ));
    }
    let sizes = split(blocks, stages).ok_or_else(|| {
        format!(
            "stages = {stages} must divide the model's {blocks} blocks ({prefix}0 … {prefix}{}), or leave the first and the last stage one block lighter than the rest",
            blocks - 1
        )
    })?;
    // The piece of each block.
    let piece_of: Vec<u32> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| std::iter::repeat_n(i as u32, n as usize))
        .collect();
    // The first op of each phase of each layer, and of the block stack.
    let first = |phase: Phase, layer: u32| {
        l.ops
            .iter()
            .position(|o| o.spec.layer == layer && o.spec.phase == phase)
    };
    let block_fw = l
        .ops
        .iter()
        .position(|o| {
            o.spec.phase == Phase::Fw
                && o.spec.layer != NONE
                && block[o.spec.layer as usize].is_some_and(|(p, _)| p == prefix)
        })
        .unwrap_or(0);
    let of_layer: Vec<u32> = (0..l.layers.len() as u32)
        .map(|layer| match block[layer as usize] {
            Some((p, i)) if p == prefix => piece_of[i as usize],
            // Before the block stack in the forward (embeddings): the first stage; after it
            // (final norm, head, loss) or with no forward: the last.
            _ => match first(Phase::Fw, layer) {
                Some(at) if at < block_fw => 0,
                _ => stages - 1,
            },
        })
        .collect();
    let of_op = l
        .ops
        .iter()
        .map(|o| {
            if o.spec.layer == NONE {
                ALL
            } else {
                of_layer[o.spec.layer as usize]
            }
        })
        .collect();
    Ok(Stages {
        of_op,
        of_layer,
        blocks,
        sizes,
    })
}

/// The expanded graph of a pipelined job and, per op, the local op it copies.
pub struct Expanded {
    pub graph: Dfg,
    pub local_of: Vec<OpId>,
}

/// Ops [`expand`] builds for `job` (an upper estimate, for the memory ceiling).
pub fn expanded_ops(job: &Job, p: &Pipeline) -> u64 {
    let l = &job.local;
    let micro = l
        .ops
        .iter()
        .filter(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
        .count() as u64;
    let once = l.ops.len() as u64 - micro;
    // Every op at most once per stage (ops without a layer: on every stage), micro-step ops
    // once per micro-batch; sends, joins and two ops per sync.
    let m = u64::from(p.microbatches);
    let s = u64::from(p.chunks());
    (micro * m + once) * 2 + s * (2 * m + 2) + 2 * m * s * 8 + 2 * job.syncs.len() as u64
}

/// The global graph of one iteration of pipelined `job` (see the module docs).
pub fn expand(job: &Job, p: &Pipeline) -> Result<Expanded, JobError> {
    if job.comm.scheme != crate::cost::config::SyncScheme::Ring && !job.syncs.is_empty() {
        return Err(JobError::SymmetricNeedsRing);
    }
    let cut = stages(job, p.chunks()).map_err(JobError::Invalid)?;
    let micro: Vec<bool> = job
        .local
        .ops
        .iter()
        .map(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
        .collect();
    let tasks = micro_tasks(job, &micro);
    let mut x = Expansion {
        job,
        p: *p,
        cut,
        micro,
        b: DfgBuilder::new(),
        id: Vec::new(),
        local_of: Vec::new(),
        virt: 0,
    };
    x.ops();
    x.edges_and_sends();
    x.schedule(&tasks);
    x.memory();
    x.syncs();
    debug_assert_eq!(x.local_of.len(), x.b.op_count());
    Ok(Expanded {
        graph: x.b.build()?,
        local_of: x.local_of,
    })
}

/// A pipelined job being expanded: the builder and where each template op's copies are.
struct Expansion<'a> {
    job: &'a Job,
    p: Pipeline,
    cut: Stages,
    /// Template ops copied per micro-batch (forward and backward phases).
    micro: Vec<bool>,
    b: DfgBuilder,
    /// Global op of (stage, micro-batch, template op): `id[at(s, j, o)]` (`j = 0` for ops
    /// that run once per stage); `NONE` where the stage has no such op.
    id: Vec<OpId>,
    local_of: Vec<OpId>,
    virt: u32,
}

impl Expansion<'_> {
    /// Index of (model chunk `s`, micro-batch `j`, template op `o`) in `id`.
    fn at(&self, s: u32, j: u32, o: usize) -> usize {
        (s as usize * self.p.microbatches as usize + j as usize) * self.job.local.ops.len() + o
    }

    fn on(&self, o: usize, s: u32) -> bool {
        self.cut.of_op[o] == ALL || self.cut.of_op[o] == s
    }

    /// The link between the ranks of model chunks `a` and `b` (chunk c on rank c mod stages,
    /// the pipeline dimension outermost): inside a node or between nodes.
    fn link_class(&self, a: u32, b: u32) -> LinkClass {
        let ns = self.p.stages;
        let per_node = self.job.comm.gpus_per_node.max(1);
        let node_of = |c: u32| (c % ns) * (self.job.workers / ns) / per_node;
        if node_of(a) == node_of(b) {
            LinkClass::IntraNode
        } else {
            LinkClass::InterNode
        }
    }

    fn copies(&self, o: usize) -> u32 {
        if self.micro[o] {
            self.p.microbatches
        } else {
            1
        }
    }

    fn op(&self, s: u32, j: u32, o: usize) -> OpId {
        self.id[self.at(s, j, o)]
    }

    /// An op that copies no template op (a send, a join, a collective's step).
    fn extra(&mut self, spec: OpSpec) -> OpId {
        self.local_of.push(NONE);
        self.b.add_op(spec)
    }

    /// Devices per rank (a worker each) and every model chunk's copies of its template ops,
    /// on its rank's devices.
    fn ops(&mut self) {
        let (job, l, ns) = (self.job, &self.job.local, self.p.stages);
        let chunks = self.p.chunks();
        for t in &l.tensors {
            self.b.add_tensor(t.clone());
        }
        for name in &l.layers {
            self.b.add_layer(name.clone());
        }
        let b = &mut self.b;
        let virt = b.add_device(DeviceKind::Virtual);
        self.virt = virt;
        let dev_map: Vec<Vec<u32>> = (0..ns)
            .map(|w| b.add_worker_devices(&l.devices, w, virt))
            .collect();
        b.set_workers(ns);
        b.set_represents(job.workers);
        if job.workers > 1 && !job.is_recorded() {
            b.set_contention_ppm((job.gpu.kernels.overlap_slowdown * 1e6).round() as u32);
        }
        self.id = vec![NONE; chunks as usize * self.p.microbatches as usize * l.ops.len()];
        for s in 0..chunks {
            for (o, op) in l.ops.iter().enumerate() {
                if !self.on(o, s) {
                    continue;
                }
                for j in 0..self.copies(o) {
                    let mut spec = op.spec.clone();
                    spec.device = dev_map[(s % ns) as usize][spec.device as usize];
                    let at = self.at(s, j, o);
                    self.id[at] = self.b.add_op(spec);
                    self.local_of.push(o as OpId);
                }
            }
        }
    }

    /// Template edges inside each stage, per micro-step; sends between stages.
    fn edges_and_sends(&mut self) {
        let (job, l, ns, m) = (
            self.job,
            &self.job.local,
            self.p.stages,
            self.p.microbatches,
        );
        let tp = job.meta.tp.max(1);
        let fw_out = forward_outputs(job);
        let spec = &job.comm;
        let chunks = self.p.chunks();
        let mut links: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
        let mut sends: std::collections::HashMap<(u32, u32, u32), OpId> = Default::default();
        for &(a, c) in &l.edges {
            let (a, c) = (a as usize, c as usize);
            let (sa, sc) = (self.cut.of_op[a], self.cut.of_op[c]);
            if sa == sc || sa == ALL || sc == ALL {
                for s in 0..chunks {
                    if !(self.on(a, s) && self.on(c, s)) {
                        continue;
                    }
                    match (self.micro[a], self.micro[c]) {
                        (false, false) => self.b.add_edge(self.op(s, 0, a), self.op(s, 0, c)),
                        (ma, mc) => {
                            for j in 0..m {
                                let from = self.op(s, if ma { j } else { 0 }, a);
                                let to = self.op(s, if mc { j } else { 0 }, c);
                                self.b.add_edge(from, to);
                            }
                        }
                    }
                }
                continue;
            }
            let bytes = match (l.ops[a].spec.phase, l.ops[c].spec.phase) {
                (Phase::Fw, Phase::Fw) if sc > sa => fw_out[l.ops[a].spec.layer as usize],
                (Phase::Bw, Phase::Bw) if sc < sa => fw_out[l.ops[c].spec.layer as usize],
                // Implied by the sends (a forward's output reaches a later stage's backward
                // through the later stage's forward).
                _ => continue,
            };
            let bytes = if job.meta.sequence_parallel {
                bytes
            } else {
                bytes.div_ceil(u64::from(tp))
            };
            let class = self.link_class(sa, sc);
            let b = &mut self.b;
            let (ra, rc) = (sa % ns, sc % ns);
            let link = *links.entry((ra, rc)).or_insert_with(|| {
                b.add_device(DeviceKind::Link {
                    from: ra,
                    to: rc,
                    class,
                })
            });
            let dur = ns_of(spec.cost.link(class).time_ns(bytes as f64));
            for j in 0..m {
                let send = match sends.get(&(a as u32, sc, j)) {
                    Some(&x) => x,
                    None => {
                        let x = self.extra(OpSpec {
                            layer: l.ops[a].spec.layer,
                            step: j,
                            ..OpSpec::new(OpKind::Send, Phase::Comm, link, dur)
                        });
                        self.b.add_edge(self.op(sa, j, a), x);
                        sends.insert((a as u32, sc, j), x);
                        x
                    }
                };
                self.b.add_edge(send, self.op(sc, j, c));
            }
        }
    }

    /// The schedule: on each of a stage's devices, a micro-step's first op after the previous
    /// micro-step's last (program order on the host thread, stream order on the GPU: the host
    /// runs ahead, the streams wait for the sends).
    fn schedule(&mut self, tasks: &[(Task, u32)]) {
        // Per model chunk: the first and last op of its forward and backward on each device.
        let ends: Vec<[Vec<Option<(OpId, OpId)>>; 2]> = (0..self.p.chunks())
            .map(|c| {
                let on = |o: usize| self.on(o, c);
                [
                    device_ends(self.job, tasks, &on, Task::Forward),
                    device_ends(self.job, tasks, &on, Task::Backward),
                ]
            })
            .collect();
        for s in 0..self.p.stages {
            let mut last: Vec<Option<OpId>> = vec![None; self.job.local.devices.len()];
            for (backward, c, j) in stage_order(&self.p, s) {
                for (d, e) in ends[c as usize][usize::from(backward)].iter().enumerate() {
                    let Some((first, end)) = *e else { continue };
                    if let Some(prev) = last[d] {
                        self.b.add_edge(prev, self.op(c, j, first as usize));
                    }
                    last[d] = Some(self.op(c, j, end as usize));
                }
            }
        }
    }

    /// Each stage's share of the static memory, its gradient buffers, its micro-steps'
    /// activations.
    fn memory(&mut self) {
        let l = &self.job.local;
        let stage_static = stage_static_memory(self.job, &self.cut, self.p.chunks());
        let mut held = vec![0u64; self.p.stages as usize];
        // The FP32 gradients of the step, each chunk's by its kernels' share of the step's work.
        let master = self.job.master_grad_bytes();
        let kernels = if master > 0 {
            self.job.step_kernels()
        } else {
            Vec::new()
        };
        let work = |o: OpId| l.ops[o as usize].work.map_or(0.0, |w| w.weight_elems);
        let total: f64 = kernels.iter().map(|&o| work(o)).sum();
        for s in 0..self.p.chunks() {
            let rank = s % self.p.stages;
            let mine: Vec<OpId> = kernels
                .iter()
                .copied()
                .filter(|&o| self.on(o as usize, s))
                .collect();
            let share = if total > 0.0 {
                let w: f64 = mine.iter().map(|&o| work(o)).sum();
                (master as f64 * w / total).ceil() as u64
            } else {
                0
            };
            for e in Job::master_grad_effects(&mine, share) {
                self.b.add_mem(MemEffect {
                    op: self.op(s, 0, e.op as usize),
                    worker: rank,
                    ..e
                });
            }
            let mut grads = 0u64;
            for e in &l.mem {
                let o = e.op as usize;
                if !self.on(o, s) {
                    continue;
                }
                if !self.micro[o]
                    && l.ops[o].spec.phase == Phase::Comm
                    && e.when == MemWhen::AllocAtStart
                {
                    grads = grads.saturating_add(e.bytes);
                    continue;
                }
                for j in 0..self.copies(o) {
                    self.b.add_mem(MemEffect {
                        op: self.op(s, j, o),
                        worker: rank,
                        ..*e
                    });
                }
            }
            let h = &mut held[rank as usize];
            *h = h.saturating_add(stage_static[s as usize].saturating_add(grads));
        }
        for (rank, bytes) in tied_copies(self.job, &self.cut, self.p.stages) {
            let h = &mut held[rank as usize];
            *h = h.saturating_add(bytes);
        }
        for (rank, &bytes) in held.iter().enumerate() {
            self.b.set_static_memory(rank as u32, bytes);
        }
    }

    /// Each stage's gradients over its data-parallel replicas, on its own stream.
    fn syncs(&mut self) {
        let mut tied = self.tied_sends();
        let (job, l, ns) = (self.job, &self.job.local, self.p.stages);
        let mut topos: Vec<CommTopology> = (0..ns)
            .map(|w| {
                let stream = self.b.add_device(DeviceKind::CommStream { worker: w });
                CommTopology::symmetric_ring(&mut self.b, &job.comm, job.workers, stream)
            })
            .collect();
        // A rank's later chunks finish their backward first.
        for s in (0..self.p.chunks()).rev() {
            let topo = &mut topos[(s % ns) as usize];
            for sync in &job.syncs {
                let stage = sync
                    .tensors
                    .first()
                    .map(|&t| l.tensors[t as usize].layer)
                    .filter(|&x| x != NONE)
                    .map_or(0, |x| self.cut.of_layer[x as usize]);
                if stage != s {
                    continue;
                }
                let tensor = sync.tensors.first().copied().unwrap_or(NONE);
                let virt = self.virt;
                let at = |kind| OpSpec {
                    tensor,
                    ..OpSpec::new(kind, Phase::Comm, virt, 0)
                };
                let r = self.extra(at(OpKind::Out));
                let d = self.extra(at(OpKind::In));
                // A tied weight's copy: its gradient joins this one before the replicas sync,
                // and the sum goes back to the copy's stage after.
                for &t in &sync.tensors {
                    if let Some(x) = tied.remove(&t) {
                        self.b.add_edge(x.arrived, r);
                        let back = self.extra(x.back);
                        self.b.add_edge(d, back);
                    }
                }
                for &o in &sync.ready {
                    for j in 0..self.copies(o as usize) {
                        self.b.add_edge(self.op(s, j, o as usize), r);
                    }
                }
                for &o in &sync.done {
                    for j in 0..self.copies(o as usize) {
                        self.b.add_edge(d, self.op(s, j, o as usize));
                    }
                }
                topo.set_priority(
                    sync.ready
                        .iter()
                        .map(|&r| l.ops[r as usize].spec.priority)
                        .min()
                        .unwrap_or(0),
                );
                let k = sync.partitions.max(1) as u64;
                let before = self.b.op_count();
                for _ in 0..k {
                    let bytes = sync.bytes.div_ceil(k);
                    topo.collective(
                        &mut self.b,
                        sync.kind,
                        sync.group,
                        tensor,
                        bytes,
                        &[r],
                        &[d],
                    );
                }
                let added = self.b.op_count() - before;
                self.local_of.resize(self.local_of.len() + added, NONE);
            }
        }
        // A tied tensor no replica syncs (one data-parallel rank): the exchange alone.
        for x in tied.into_values() {
            let back = self.extra(x.back);
            self.b.add_edge(x.arrived, back);
        }
    }
}

/// A tied weight's gradient exchange between the stage of a layer using it and the stage owning
/// it ([`Expansion::tied_sends`]).
struct TiedSend {
    /// The copy's gradient sent to the owner (after the user's last backward of it).
    arrived: OpId,
    /// The summed gradient sent back (after the owner's sync of the tensor).
    back: OpSpec,
}

impl Expansion<'_> {
    /// The exchange of each tied weight's gradients between its two stages (Megatron-LM's
    /// embedding-group all-reduce of the first and last stage's `word_embeddings` grads; an
    /// all-reduce of two ranks moves the whole gradient each way): a send of the copy's
    /// gradient to the owner once every micro-step's backward of the using layer is done, and,
    /// once the owner's sync of the tensor is done, one back ([`TiedSend::back`], added with that
    /// sync). Each on a link of its own between the two ranks. Keyed by tensor.
    fn tied_sends(&mut self) -> std::collections::BTreeMap<u32, TiedSend> {
        let (job, l, ns) = (self.job, &self.job.local, self.p.stages);
        let mut out = std::collections::BTreeMap::new();
        for &(user, t) in &l.ties {
            let Some(tensor) = l.tensors.get(t as usize) else {
                continue;
            };
            let cu = self.cut.of_layer[user as usize];
            let co = if tensor.layer == NONE {
                0
            } else {
                self.cut.of_layer[tensor.layer as usize]
            };
            let (ru, ro) = (cu % ns, co % ns);
            if ru == ro || out.contains_key(&t) {
                continue;
            }
            let class = self.link_class(cu, co);
            let dur = ns_of(job.comm.cost.link(class).time_ns(tensor.bytes as f64));
            let mut link = |from, to| self.b.add_device(DeviceKind::Link { from, to, class });
            let (up, down) = (link(ru, ro), link(ro, ru));
            let at = |device| OpSpec {
                tensor: t,
                layer: user,
                ..OpSpec::new(OpKind::Send, Phase::Comm, device, dur)
            };
            let arrived = self.extra(at(up));
            for (o, op) in l.ops.iter().enumerate() {
                if op.spec.layer == user && op.spec.phase == Phase::Bw && self.on(o, cu) {
                    for j in 0..self.copies(o) {
                        self.b.add_edge(self.op(cu, j, o), arrived);
                    }
                }
            }
            out.insert(
                t,
                TiedSend {
                    arrived,
                    back: at(down),
                },
            );
        }
        out
    }
}

/// The bytes of each layer's forward output (its first `During` effect), 0 when unknown.
fn forward_outputs(job: &Job) -> Vec<u64> {
    let l = &job.local;
    let mut out = vec![0u64; l.layers.len()];
    let mut seen = vec![false; l.layers.len()];
    for e in &l.mem {
        let s = &l.ops[e.op as usize].spec;
        if s.phase == Phase::Fw
            && s.kind == OpKind::Compute
            && s.layer != NONE
            && e.when == MemWhen::During
        {
            let i = s.layer as usize;
            if !std::mem::replace(&mut seen[i], true) {
                out[i] = e.bytes;
            }
        }
    }
    out
}

/// Which micro-step an op of the template belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Task {
    /// Not replicated per micro-batch (update, synchronisation, the step's host work).
    Once,
    Forward,
    /// Backward ops and the forward ops recomputed in the backward (`recompute`'s copies,
    /// which depend on a backward op).
    Backward,
}

/// Each op's micro-step task, and its rank in a topological order of the template (program
/// order on the host thread, whose ops form a chain).
fn micro_tasks(job: &Job, micro: &[bool]) -> Vec<(Task, u32)> {
    let l = &job.local;
    let n = l.ops.len();
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut indeg = vec![0u32; n];
    for &(a, c) in &l.edges {
        succ[a as usize].push(c);
        indeg[c as usize] += 1;
    }
    // Kahn's order, lowest id first among the ready: program order where the template has it.
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = (0..n as u32)
        .filter(|&o| indeg[o as usize] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut rank = vec![0u32; n];
    let mut in_bw = vec![false; n];
    let mut next = 0;
    while let Some(std::cmp::Reverse(o)) = ready.pop() {
        let o = o as usize;
        rank[o] = next;
        next += 1;
        in_bw[o] |= micro[o] && l.ops[o].spec.phase == Phase::Bw;
        for &c in &succ[o] {
            let c = c as usize;
            if in_bw[o] && micro[c] {
                in_bw[c] = true;
            }
            indeg[c] -= 1;
            if indeg[c] == 0 {
                ready.push(std::cmp::Reverse(c as u32));
            }
        }
    }
    (0..n)
        .map(|o| {
            let t = match (micro[o], in_bw[o]) {
                (false, _) => Task::Once,
                (true, false) => Task::Forward,
                (true, true) => Task::Backward,
            };
            (t, rank[o])
        })
        .collect()
}

/// Per local device (none for the virtual one): the first and last op, in the template's
/// topological order, of one micro-step of `task` on a stage (`on`).
fn device_ends(
    job: &Job,
    tasks: &[(Task, u32)],
    on: &dyn Fn(usize) -> bool,
    task: Task,
) -> Vec<Option<(OpId, OpId)>> {
    let l = &job.local;
    let mut ends: Vec<Option<(OpId, OpId)>> = vec![None; l.devices.len()];
    for (o, op) in l.ops.iter().enumerate() {
        let d = op.spec.device as usize;
        if tasks[o].0 != task || !on(o) || l.devices[d] == DeviceKind::Virtual {
            continue;
        }
        let rank = tasks[o].1;
        let e = ends[d].get_or_insert((o as OpId, o as OpId));
        if rank < tasks[e.0 as usize].1 {
            e.0 = o as OpId;
        }
        if rank > tasks[e.1 as usize].1 {
            e.1 = o as OpId;
        }
    }
    ends
}

/// The copies of tied weights: a layer that computes with a tensor another layer owns (a tied
/// output layer and the word embeddings, [`super::job::LocalGraph::ties`]) on another rank
/// holds its own copy there, as Megatron-LM (the last stage's `word_embeddings` copy) and
/// DeepSpeed's `TiedLayerSpec` do: the tensor's share of the static memory (weights and
/// optimizer state, which each copy's stage updates) and its gradient buffer. (rank, bytes)
/// per copy. The two copies' gradients are exchanged by [`Expansion::tied_sends`].
fn tied_copies(job: &Job, cut: &Stages, stages: u32) -> Vec<(u32, u64)> {
    let l = &job.local;
    let total: u64 = l.tensors.iter().map(|t| t.bytes).sum();
    let rank_of = |layer: u32| -> u32 {
        if layer == NONE {
            0
        } else {
            cut.of_layer[layer as usize] % stages
        }
    };
    l.ties
        .iter()
        .filter_map(|&(user, t)| {
            let tensor = l.tensors.get(t as usize)?;
            let (here, owner) = (rank_of(user), rank_of(tensor.layer));
            if here == owner || total == 0 {
                return None;
            }
            let share = (l.static_mem_bytes as u128 * tensor.bytes as u128).div_ceil(total as u128);
            Some((here, (share as u64).saturating_add(tensor.bytes)))
        })
        .collect()
}

/// Each stage's share of the job's static memory (weights, optimizer state): in proportion to
/// the bytes of the tensors whose layers it holds.
fn stage_static_memory(job: &Job, cut: &Stages, stages: u32) -> Vec<u64> {
    let l = &job.local;
    let stages = stages as usize;
    let mut bytes = vec![0u64; stages];
    for t in &l.tensors {
        let s = if t.layer == NONE {
            0
        } else {
            cut.of_layer[t.layer as usize] as usize
        };
        bytes[s] = bytes[s].saturating_add(t.bytes);
    }
    let total: u64 = bytes.iter().sum();
    bytes
        .iter()
        .map(|&x| {
            if total == 0 {
                l.static_mem_bytes / stages as u64
            } else {
                (l.static_mem_bytes as u128 * x as u128).div_ceil(total as u128) as u64
            }
        })
        .collect()
}
