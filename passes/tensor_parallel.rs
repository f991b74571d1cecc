//! `tensor-parallel`: Megatron-LM tensor parallelism of a transformer's blocks (Shoeybi et al.,
//! "Megatron-LM", 2019, §3), with sequence parallelism as an option (Korthikanti et al.,
//! "Reducing Activation Recomputation in Large Transformer Models", 2022, §4.2.2).
//!
//! **What changes.** The job's workers become groups of `degree` consecutive ranks (one node's
//! GPUs: TP runs inside a node); the template worker is one rank of a group, and every rank of
//! a group does the same work, so the symmetric form stays exact.
//!
//! | layer (by its module path) | split | FW collective | BW collective |
//! |---|---|---|---|
//! | column-parallel: QKV (`attn.c_attn`, `q/k/v_proj`, `query/key/value`), MLP in (`mlp.c_fc`, `gate/up_proj`, `intermediate.dense`) | output features / degree | (SP: all-gather of the input) | all-reduce of the input gradient, once per group (SP: reduce-scatter) |
//! | attention core (the two batched matmuls, softmax, dropout, flash, rotary) and the MLP activation | heads or features / degree | — | — |
//! | row-parallel: attention out (`attn.c_proj`, `o_proj`, `attention.output.dense`), MLP out (`mlp.c_proj`, `down_proj`, `output.dense`) | input features / degree | all-reduce of the output (SP: reduce-scatter) | (SP: all-gather of the output gradient) |
//! | word embedding, LM head, loss | vocabulary / degree | embedding: all-reduce of its output (SP: reduce-scatter) | head: all-reduce of its input gradient |
//! | everything else in a block (LayerNorm, dropout, residual adds) | replicated; with `sequence=1` split over the sequence | — | — |
//!
//! Each of a group's collectives is one op (`OpKind::Collective`) on its own stream, priced as
//! a ring over the group's `degree` ranks inside a node: 2(degree−1) steps of bytes/degree for
//! an all-reduce, degree−1 for an all-gather or reduce-scatter, each step α + chunk / β of the
//! cluster's intra-node link (the same α–β as every other collective, `src/graph/comm.rs`). The
//! ops that consume the collective's result wait for it: the forward and backward are blocked
//! by it, as in Megatron (no overlap of TP communication with compute).
//!
//! Memory: the split layers' weights, gradients and optimizer state are 1/degree of theirs;
//! a split layer's saved activations and output follow the split (a column-parallel layer keeps
//! its whole input without sequence parallelism: Korthikanti's `10 + 24/t` per layer); the
//! gradient synchronisation (data parallelism) runs over the ranks `degree` apart with the
//! split tensors' bytes.
//!
//! **Not modelled**: the vocabulary-parallel cross-entropy's three small all-reduces (one float
//! per token each), recomputation re-running a segment's TP collectives, and overlap of TP
//! communication with compute. The pass applies to a zoo transformer (GPT, BERT, Llama) before
//! any other pass that rewrites the job (sharding, recomputation, accumulation).

use std::collections::{BTreeMap, HashSet};

use super::{ATTENTION_MODULES, Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::cost::kernel::{BatchDim, Gemm, OpWork};
use crate::graph::comm::{CollectiveKind, Group};
use crate::graph::job::Job;
use crate::graph::{MemWhen, NONE, OpId, OpKind, OpSpec, Phase};

/// The `tensor-parallel` pass.
pub struct TensorParallel;

const NAME: &str = "tensor-parallel";

impl Pass for TensorParallel {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "Megatron tensor parallelism of the transformer blocks inside a node (column/row-parallel attention and MLP, vocabulary-parallel embedding and head); sequence=1 adds sequence parallelism"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::int(
                "degree",
                "ranks per tensor-parallel group (consecutive ranks of one node); must divide the heads, the KV heads and the workers",
                2,
                1,
                1024,
            ),
            KnobSpec::text(
                "batch",
                "global: keep the global batch (each group of degree ranks trains degree x the per-GPU batch); replica: keep the batch per model replica (Megatron's --micro-batch-size; the global batch shrinks by degree)",
                "global",
            ),
            KnobSpec::int(
                "sequence",
                "1: sequence parallelism (LayerNorm, dropout and residuals split over the sequence; all-gather / reduce-scatter instead of all-reduce)",
                0,
                0,
                1,
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let t = knobs.int("degree") as u32;
        let sequence = knobs.int("sequence") == 1;
        let keep_global = super::keeps_global_batch(NAME, knobs)?;
        if t == 1 {
            return Ok(Vec::new());
        }
        let job = tensor_parallel(&cx.job, t, sequence, keep_global)?;
        let dp = cx.job.workers / t;
        Ok(vec![Patch {
            pass: NAME.into(),
            why: format!(
                "tensor parallelism over groups of {t} ranks in a node{}, data parallelism over {dp} group{}: each rank holds 1/{t} of the blocks' weights and computes 1/{t} of their matrix products",
                if sequence {
                    " with sequence parallelism"
                } else {
                    ""
                },
                if dp == 1 { "" } else { "s" },
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

/// What tensor parallelism does to one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Output features split; `attn` tells the attention's group from the MLP's.
    Column { attn: bool },
    /// Input features split.
    Row,
    /// Heads or intermediate features split (no weights, or none split).
    Inner,
    /// The word embedding: its weight split over the vocabulary.
    Embedding,
    /// The LM head: column-parallel over the vocabulary.
    Head,
    /// The loss over the vocabulary-parallel logits.
    Loss,
    /// Replicated (split over the sequence with sequence parallelism, inside a block).
    Block,
    /// Outside the blocks and replicated.
    Other,
}

impl Split {
    fn weights_split(self) -> bool {
        matches!(
            self,
            Split::Column { .. } | Split::Row | Split::Embedding | Split::Head
        )
    }
}

/// Whether the parameter `name` of a layer split as `split` is split: the weights of the
/// split layers and the column-parallel biases; a row-parallel bias is whole on every rank
/// (Megatron's `RowParallelLinear` adds it after the all-reduce).
pub fn param_split(split: Split, name: &str) -> bool {
    split.weights_split() && !(split == Split::Row && name.ends_with(".bias"))
}

const COLUMN_ATTN: [&str; 7] = [
    "attn.c_attn",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
];
const COLUMN_MLP: [&str; 4] = [
    "mlp.c_fc",
    "mlp.gate_proj",
    "mlp.up_proj",
    "intermediate.dense",
];
const ROW: [&str; 6] = [
    "attn.c_proj",
    "self_attn.o_proj",
    "attention.output.dense",
    "mlp.c_proj",
    "mlp.down_proj",
    "output.dense",
];
const ATTENTION_INNER: [&str; 7] = [
    "matmul_qk",
    "softmax",
    "dropout",
    "attn_dropout",
    "matmul_av",
    "core",
    "rotary_emb",
];
const MLP_INNER: [&str; 4] = [
    "mlp.act",
    "mlp.act_fn",
    "mlp.mul",
    "intermediate.intermediate_act_fn",
];
const EMBEDDINGS: [&str; 3] = [
    "transformer.wte",
    "model.embed_tokens",
    "bert.embeddings.word_embeddings",
];
const HEADS: [&str; 2] = ["lm_head", "cls.predictions.decoder"];
const LOSSES: [&str; 2] = ["loss", "loss.masked_lm"];

/// How tensor parallelism splits the layer named `name` (a zoo module path).
pub fn split_of(name: &str) -> Split {
    let block = super::shard::unit_of(name);
    if block.is_empty() {
        return if EMBEDDINGS.contains(&name) {
            Split::Embedding
        } else if HEADS.contains(&name) {
            Split::Head
        } else if LOSSES.contains(&name) {
            Split::Loss
        } else {
            Split::Other
        };
    }
    let rest = name[block.len()..].trim_start_matches('.');
    if COLUMN_ATTN.contains(&rest) {
        return Split::Column { attn: true };
    }
    if COLUMN_MLP.contains(&rest) {
        return Split::Column { attn: false };
    }
    if ROW.contains(&rest) {
        return Split::Row;
    }
    if MLP_INNER.contains(&rest) {
        return Split::Inner;
    }
    if let Some((module, last)) = rest.rsplit_once('.')
        && ATTENTION_MODULES.contains(&module)
        && ATTENTION_INNER.contains(&last)
    {
        return Split::Inner;
    }
    Split::Block
}

/// The sizes tensor parallelism must divide, read from the job's attention and projections.
struct Shape {
    heads: u64,
    kv_heads: u64,
}

fn shape_of(job: &Job, splits: &[Split]) -> Result<Shape, PassError> {
    let batch = u64::from(job.meta.batch.max(1));
    let mut heads = None;
    let mut head_dim = 0.0;
    let mut kv_out = None;
    for op in &job.local.ops {
        let s = &op.spec;
        if s.kind != OpKind::Compute || s.phase != Phase::Fw || s.layer == NONE {
            continue;
        }
        let Some(w) = op.work.as_ref() else { continue };
        let name = &job.local.layers[s.layer as usize];
        let g = w.gemms[0];
        if heads.is_none()
            && splits[s.layer as usize] == Split::Inner
            && g.batch_dim == BatchDim::Count
            && !g.is_none()
        {
            heads = Some((g.count as u64 / batch).max(1));
            head_dim = if name.ends_with("matmul_av") {
                g.n
            } else {
                g.k
            };
        }
        if kv_out.is_none() && name.ends_with("self_attn.k_proj") && !g.is_none() {
            kv_out = Some(g.n);
        }
    }
    let heads = heads.ok_or_else(|| {
        refuse("tensor parallelism splits attention heads; this job has no attention".into())
    })?;
    let kv_heads = match kv_out {
        Some(n) if head_dim > 0.0 => (n / head_dim).round().max(1.0) as u64,
        _ => heads,
    };
    Ok(Shape { heads, kv_heads })
}

/// Why `job` cannot take tensor parallelism of `t`, if it cannot.
fn check(job: &Job, t: u32, splits: &[Split]) -> Result<(), PassError> {
    if job.is_recorded() {
        return Err(refuse(
            "tensor parallelism needs the model's layers (a zoo transformer: --model gpt, bert-*, llama*); a trace's kernels are not split".into(),
        ));
    }
    if job.meta.tp > 1 {
        return Err(refuse(format!(
            "the job is already tensor-parallel (degree {})",
            job.meta.tp
        )));
    }
    if !splits.iter().any(|s| matches!(s, Split::Row)) {
        return Err(refuse(
            "tensor parallelism splits transformer blocks (attention and MLP projections); this model has none".into(),
        ));
    }
    if job.workers % t != 0 {
        return Err(refuse(format!(
            "degree = {t} must divide the {} workers",
            job.workers
        )));
    }
    if t > job.comm.gpus_per_node {
        return Err(refuse(format!(
            "degree = {t} is more than the {} GPUs of a node: tensor parallelism runs inside a node",
            job.comm.gpus_per_node
        )));
    }
    let shape = shape_of(job, splits)?;
    if shape.heads % u64::from(t) != 0 {
        return Err(refuse(format!(
            "degree = {t} must divide the {} attention heads",
            shape.heads
        )));
    }
    if shape.kv_heads % u64::from(t) != 0 {
        return Err(refuse(format!(
            "degree = {t} must divide the {} KV heads",
            shape.kv_heads
        )));
    }
    if job
        .syncs
        .iter()
        .any(|s| s.kind != CollectiveKind::AllReduce || !s.group.is_all(job.workers))
    {
        return Err(refuse(
            "apply tensor-parallel before sharding: the job's gradients are already synchronised over groups".into(),
        ));
    }
    Ok(())
}

/// The degrees the layout step tries on `job`: 2, 4, 8, … up to a node's GPUs, those the pass
/// takes (dividing the heads, the KV heads and the workers; a zoo transformer not yet
/// tensor-parallel or sharded). Empty for every other job.
pub fn degrees(job: &Job) -> Vec<u32> {
    let splits: Vec<Split> = job.local.layers.iter().map(|n| split_of(n)).collect();
    (1..32)
        .map(|i| 1u32 << i)
        .take_while(|&t| t <= job.comm.gpus_per_node)
        .filter(|&t| check(job, t, &splits).is_ok())
        .collect()
}

/// `job` with tensor parallelism of degree `t` (sequence parallelism with `sequence`). With
/// `keep_global` each group of `t` ranks trains `t` times the job's per-worker batch, so the
/// global batch stays; otherwise the batch per model replica stays.
pub fn tensor_parallel(
    job: &Job,
    t: u32,
    sequence: bool,
    keep_global: bool,
) -> Result<Job, PassError> {
    let splits: Vec<Split> = job.local.layers.iter().map(|n| split_of(n)).collect();
    check(job, t, &splits)?;
    let mut j = job.clone();
    let tf = f64::from(t);
    if keep_global {
        replica_batch(&mut j, t);
    }
    let split_tensor: Vec<bool> = j
        .local
        .tensors
        .iter()
        .map(|x| x.layer != NONE && param_split(splits[x.layer as usize], &x.name))
        .collect();
    split_static_memory(&mut j, &split_tensor, t);
    split_syncs(&mut j, job, t);
    for i in 0..j.local.ops.len() {
        let s = &j.local.ops[i].spec;
        if s.kind != OpKind::Compute || s.layer == NONE {
            continue;
        }
        let split = splits[s.layer as usize];
        if s.phase == Phase::Update {
            if s.tensor != NONE && split_tensor[s.tensor as usize] {
                scale_op(&mut j, i, &|w| split_update(w, tf));
            }
            continue;
        }
        if let Some(f) = work_split(split, sequence) {
            let bw = s.phase == Phase::Bw;
            scale_op(&mut j, i, &|w| f(w, tf, bw));
        }
    }
    split_memory(&mut j, &splits, &split_tensor, t, sequence);
    add_collectives(&mut j, &splits, t, sequence)?;
    j.meta.tp = t;
    j.meta.sequence_parallel = sequence;
    Ok(j)
}

/// Each model replica (a group of `t` ranks) trains `t` times the batch: the forward and
/// backward work and their activations scale by `t`.
fn replica_batch(j: &mut Job, t: u32) {
    let tf = f64::from(t);
    let mut grew = vec![false; j.local.ops.len()];
    for (i, g) in grew.iter_mut().enumerate() {
        let s = &j.local.ops[i].spec;
        if s.kind == OpKind::Compute && matches!(s.phase, Phase::Fw | Phase::Bw) {
            *g = true;
            scale_op(j, i, &|w| w.scaled(tf));
        }
    }
    for m in &mut j.local_mut().mem {
        if grew[m.op as usize] {
            m.bytes = m.bytes.saturating_mul(u64::from(t));
        }
    }
    j.meta.batch = j.meta.batch.saturating_mul(t);
}

/// Static bytes (weights, optimizer state) of the split tensors become 1/t; each split
/// tensor's bytes too.
fn split_static_memory(j: &mut Job, split: &[bool], t: u32) {
    let total: u64 = j.local.tensors.iter().map(|x| x.bytes).sum();
    let kept: u64 = j
        .local
        .tensors
        .iter()
        .zip(split)
        .map(|(x, &s)| {
            if s {
                x.bytes.div_ceil(u64::from(t))
            } else {
                x.bytes
            }
        })
        .sum();
    if total > 0 {
        let f = kept as f64 / total as f64;
        let l = j.local_mut();
        l.static_mem_bytes = (l.static_mem_bytes as f64 * f).ceil() as u64;
    }
    for (x, &s) in j.local_mut().tensors.iter_mut().zip(split) {
        if s {
            x.bytes = x.bytes.div_ceil(u64::from(t));
        }
    }
}

/// Gradient synchronisation over the data-parallel ranks (`t` apart), with the split tensors'
/// bytes.
fn split_syncs(j: &mut Job, before: &Job, t: u32) {
    let dp = Group {
        size: j.workers / t,
        stride: t,
    };
    for s in &mut j.syncs {
        let old: u64 = s
            .tensors
            .iter()
            .map(|&x| before.local.tensors[x as usize].bytes)
            .sum();
        let new: u64 = s
            .tensors
            .iter()
            .map(|&x| j.local.tensors[x as usize].bytes)
            .sum();
        if old > 0 && new != old {
            s.bytes = ((s.bytes as u128 * new as u128).div_ceil(old as u128) as u64).max(1);
        }
        s.group = dp;
    }
}

type WorkSplit = fn(&OpWork, f64, bool) -> OpWork;

/// How an op of a layer split as `split` changes: `None` when it does not.
fn work_split(split: Split, sequence: bool) -> Option<WorkSplit> {
    match split {
        Split::Column { .. } | Split::Head => Some(column_work),
        Split::Row => Some(row_work),
        Split::Inner | Split::Loss => Some(inner_work),
        Split::Embedding => Some(embedding_work),
        Split::Block if sequence => Some(inner_work),
        Split::Block | Split::Other => None,
    }
}

/// A column-parallel GEMM: output features / t. Forward `x(M×K)·w(K×N)` → N/t; backward data
/// gradient (M×K, reduction N) → reduction / t; weight gradient (K×N) → N/t.
fn column_work(w: &OpWork, t: f64, bw: bool) -> OpWork {
    let mut g = w.gemms;
    if bw {
        if g[1].is_none() {
            g[0].n /= t; // the first layer: weight gradient only
        } else {
            g[0].k /= t;
            g[1].n /= t;
        }
    } else {
        g[0].n /= t;
    }
    gemm_split(w, g, t)
}

/// A row-parallel GEMM: input features / t. Forward K/t; data gradient (M×K) → K/t (its N);
/// weight gradient (K×N, reduction M) → its M.
fn row_work(w: &OpWork, t: f64, bw: bool) -> OpWork {
    let mut g = w.gemms;
    if bw {
        g[0].n /= t;
        g[1].m /= t;
    } else {
        g[0].k /= t;
    }
    gemm_split(w, g, t)
}

/// FLOPs and weights / t; activations moved: the split side's share (half of them, as a
/// split GEMM reads or writes one whole and one split activation).
fn gemm_split(w: &OpWork, gemms: [Gemm; 2], t: f64) -> OpWork {
    OpWork {
        flops: w.flops / t,
        act_elems: w.act_elems * (0.5 + 0.5 / t),
        weight_elems: w.weight_elems / t,
        gemms,
        ..*w
    }
}

/// Heads (attention), features (activation) or tokens (sequence parallelism) / t.
fn inner_work(w: &OpWork, t: f64, _bw: bool) -> OpWork {
    let mut g = w.gemms;
    for x in &mut g {
        if !x.is_none() {
            match x.batch_dim {
                BatchDim::Count => x.count /= t,
                BatchDim::M => x.m /= t,
                BatchDim::K => x.k /= t,
                BatchDim::None => x.m /= t,
            }
        }
    }
    OpWork {
        flops: w.flops / t,
        act_elems: w.act_elems / t,
        gemms: g,
        ..*w
    }
}

/// The vocabulary-parallel embedding: its table (and its gradient) / t; the lookup writes the
/// whole output (the other ranks' rows as zeros, then the all-reduce).
fn embedding_work(w: &OpWork, t: f64, _bw: bool) -> OpWork {
    OpWork {
        weight_elems: w.weight_elems / t,
        ..*w
    }
}

/// The optimizer's step over a split tensor: 1/t of its elements.
fn split_update(w: &OpWork, t: f64) -> OpWork {
    OpWork {
        flops: w.flops / t,
        act_elems: w.act_elems / t,
        weight_elems: w.weight_elems / t,
        ..*w
    }
}

/// Re-cost op `i` with its work mapped by `f`.
fn scale_op(j: &mut Job, i: usize, f: &dyn Fn(&OpWork) -> OpWork) {
    let Some(w) = j.local.ops[i].work else { return };
    let new = f(&w);
    let dur = j.recost_ns(j.local.ops[i].spec.dur_ns, &new, j.dtype, 1.0);
    let op = &mut j.local_mut().ops[i];
    op.work = Some(new);
    op.spec.dur_ns = dur;
}

/// Activation memory: what each op allocates while it runs and saves for its backward follows
/// the split (factors from [`memory_factors`]); the split tensors' gradient buffers / t.
fn split_memory(j: &mut Job, splits: &[Split], split_tensor: &[bool], t: u32, sequence: bool) {
    let tf = f64::from(t);
    let factors: Vec<Option<Factors>> = (0..j.local.ops.len())
        .map(|i| {
            let s = &j.local.ops[i].spec;
            if s.kind == OpKind::Compute && s.layer != NONE && s.phase != Phase::Update {
                let w = j.local.ops[i].work.as_ref();
                Some(memory_factors(
                    splits[s.layer as usize],
                    sequence,
                    tf,
                    w,
                    s.phase,
                ))
            } else if s.tensor != NONE && split_tensor[s.tensor as usize] {
                Some(Factors {
                    during: 1.0 / tf,
                    saved: 1.0 / tf,
                })
            } else {
                None
            }
        })
        .collect();
    for m in &mut j.local_mut().mem {
        let Some(f) = factors[m.op as usize] else {
            continue;
        };
        let k = match m.when {
            MemWhen::During => f.during,
            MemWhen::AllocAtStart | MemWhen::FreeAtEnd => f.saved,
        };
        if k != 1.0 {
            m.bytes = (m.bytes as f64 * k).ceil() as u64;
        }
    }
}

/// Scale factors of an op's memory effects: while it runs, and saved from forward to backward.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Factors {
    during: f64,
    saved: f64,
}

/// A layer's activations under the split (Korthikanti et al. Table 2's terms): a
/// column-parallel GEMM saves its whole input (split over the sequence with SP) and writes
/// 1/t of its output; a row-parallel one saves its split input and writes the whole output;
/// the attention core and the MLP activation are split; the rest of a block is replicated
/// (split with SP).
fn memory_factors(
    split: Split,
    sequence: bool,
    t: f64,
    w: Option<&OpWork>,
    phase: Phase,
) -> Factors {
    let one = Factors {
        during: 1.0,
        saved: 1.0,
    };
    let all = Factors {
        during: 1.0 / t,
        saved: 1.0 / t,
    };
    // Input and output features of a GEMM, from its forward product (M×K)·(K×N).
    let io = |w: Option<&OpWork>| -> Option<(f64, f64)> {
        let g = w?.gemms;
        let fw = match phase {
            Phase::Bw if !g[1].is_none() => Gemm::new(g[0].m, g[0].k, g[0].n, 1.0, BatchDim::M),
            Phase::Bw => return None,
            _ => g[0],
        };
        (!fw.is_none()).then_some((fw.k, fw.n))
    };
    let seq = if sequence { 1.0 / t } else { 1.0 };
    match split {
        Split::Column { .. } | Split::Head => {
            let during = match (phase, io(w)) {
                // Backward: the output's gradient (split) and the input's (whole).
                (Phase::Bw, Some((fin, fout))) => (fout / t + fin) / (fout + fin),
                _ => 1.0 / t,
            };
            Factors { during, saved: seq }
        }
        Split::Row => {
            let during = match (phase, io(w)) {
                (Phase::Bw, Some((fin, fout))) => (fout + fin / t) / (fout + fin),
                _ => 1.0,
            };
            Factors {
                during,
                saved: 1.0 / t,
            }
        }
        Split::Inner | Split::Loss => all,
        Split::Block if sequence => all,
        Split::Embedding | Split::Block | Split::Other => one,
    }
}

/// The tensor-parallel collectives: one op each on the group's stream, between the ops that
/// produce what it reduces or gathers and the ops that read the result.
fn add_collectives(j: &mut Job, splits: &[Split], t: u32, sequence: bool) -> Result<(), PassError> {
    let elem = j.dtype.bytes() as f64;
    let ops = j.local.ops.len();
    let succ = j.local_succs();
    let mut pred: Vec<Vec<OpId>> = vec![Vec::new(); ops];
    for (a, next) in succ.iter().enumerate() {
        for &b in next {
            pred[b as usize].push(a as OpId);
        }
    }
    let mut cuts: Vec<Cut> = Vec::new();
    // Column groups: the forward and backward ops of each block's attention / MLP inputs.
    let mut groups: BTreeMap<(String, bool, Phase), Vec<OpId>> = BTreeMap::new();
    for o in 0..ops as OpId {
        let s = &j.local.ops[o as usize].spec;
        if s.kind != OpKind::Compute || s.layer == NONE || s.phase == Phase::Update {
            continue;
        }
        let name = &j.local.layers[s.layer as usize];
        let w = j.local.ops[o as usize].work;
        let gemm_bytes = |fin: bool| -> f64 {
            let g = w.map_or(Gemm::NONE, |w| w.gemms[0]);
            match s.phase {
                // Forward product (M×K)·(K×N/t or K/t×N) after the split: M rows.
                Phase::Fw => g.m * if fin { g.k } else { g.n } * elem,
                _ => g.m * if fin { g.n } else { g.k } * elem,
            }
        };
        match (splits[s.layer as usize], s.phase) {
            (Split::Column { attn }, p) => {
                let block = super::shard::unit_of(name).to_string();
                groups.entry((block, attn, p)).or_default().push(o);
            }
            (Split::Head, Phase::Bw) => cuts.push(Cut::after(o, gemm_bytes(true), s.phase)),
            (Split::Row, Phase::Fw) => {
                // The output is whole: M × N (N not split).
                cuts.push(Cut::after(o, gemm_bytes(false), s.phase));
            }
            (Split::Row, Phase::Bw) if sequence => {
                // Backward data product (M×N)·(N×K/t): the output gradient is M × N.
                let g = w.map_or(Gemm::NONE, |w| w.gemms[0]);
                cuts.push(Cut::before(o, g.m * g.k * elem, s.phase));
            }
            (Split::Embedding, Phase::Fw) => {
                let out = j
                    .local
                    .mem
                    .iter()
                    .filter(|m| m.op == o && m.when == MemWhen::During)
                    .map(|m| m.bytes)
                    .max()
                    .unwrap_or(0);
                cuts.push(Cut::after(o, out as f64, s.phase));
            }
            _ => {}
        }
    }
    for ((_, _, phase), members) in groups {
        let w = j.local.ops[members[0] as usize].work;
        let g = w.map_or(Gemm::NONE, |w| w.gemms[0]);
        match phase {
            Phase::Fw if sequence => cuts.push(Cut {
                producers: members.clone(),
                before: true,
                bytes: g.m * g.k * elem,
                phase,
            }),
            // Backward data product (M×N/t)·(N/t×K): the input gradient is M × K.
            Phase::Bw => cuts.push(Cut {
                producers: members.clone(),
                before: false,
                bytes: g.m * g.n * elem,
                phase,
            }),
            _ => {}
        }
    }
    splice(j, cuts, &pred, &succ, t, sequence)
}

/// Each cut's collective op, spliced between the ops it joins; with a host thread, its call
/// takes the host's collective-call time in program order (`HostSpec::collective_call_ns`).
fn splice(
    j: &mut Job,
    cuts: Vec<Cut>,
    pred: &[Vec<OpId>],
    succ: &[Vec<OpId>],
    t: u32,
    sequence: bool,
) -> Result<(), PassError> {
    let is_data = |j: &Job, o: OpId, phase: Phase| {
        let s = &j.local.ops[o as usize].spec;
        s.kind == OpKind::Compute && s.phase == phase
    };
    let stream = super::new_stream(j);
    let has_host = j.local.ops.iter().any(|o| o.spec.kind == OpKind::Launch);
    let call_ns = has_host.then(|| j.host.collective_call_ns().round() as u64);
    let mut joins: Vec<(Vec<OpId>, Vec<OpId>, OpSpec)> = Vec::with_capacity(cuts.len());
    let mut remove: HashSet<(OpId, OpId)> = HashSet::new();
    for cut in cuts {
        let members: HashSet<OpId> = cut.producers.iter().copied().collect();
        // `before`: the collective sits between the members' data predecessors and them;
        // otherwise between the members and their data successors.
        let (from, to): (Vec<OpId>, Vec<OpId>) = if cut.before {
            let from: Vec<OpId> = cut
                .producers
                .iter()
                .flat_map(|&m| pred[m as usize].iter().copied())
                .filter(|&p| !members.contains(&p) && is_data(j, p, cut.phase))
                .collect();
            (from, cut.producers.clone())
        } else {
            let to: Vec<OpId> = cut
                .producers
                .iter()
                .flat_map(|&m| succ[m as usize].iter().copied())
                .filter(|&s| !members.contains(&s) && is_data(j, s, cut.phase))
                .collect();
            (cut.producers.clone(), to)
        };
        let kind = match (sequence, cut.before) {
            (false, _) => CollectiveKind::AllReduce,
            (true, true) => CollectiveKind::AllGather,
            (true, false) => CollectiveKind::ReduceScatter,
        };
        for &a in &from {
            for &b in &to {
                remove.insert((a, b));
            }
        }
        let spec = OpSpec {
            layer: j.local.ops[cut.producers[0] as usize].spec.layer,
            ..OpSpec::new(
                OpKind::Collective,
                cut.phase,
                stream,
                collective_ns(j, kind, t, cut.bytes),
            )
        };
        joins.push((from, to, spec));
    }
    j.local_mut().edges.retain(|e| !remove.contains(e));
    let mut ed = j.edit();
    for (from, to, spec) in joins {
        ed.insert(spec, None, &from, &to, call_ns)
            .map_err(edit_error)?;
    }
    *j = ed.finish().map_err(edit_error)?;
    Ok(())
}

fn edit_error(source: crate::graph::job::JobError) -> PassError {
    PassError::Edit {
        pass: NAME.into(),
        source,
    }
}

/// Where one collective goes: after `producers` (their data successors wait for it) or, with
/// `before`, between their data predecessors and them.
struct Cut {
    producers: Vec<OpId>,
    before: bool,
    bytes: f64,
    phase: Phase,
}

impl Cut {
    fn after(op: OpId, bytes: f64, phase: Phase) -> Cut {
        Cut {
            producers: vec![op],
            before: false,
            bytes,
            phase,
        }
    }
    fn before(op: OpId, bytes: f64, phase: Phase) -> Cut {
        Cut {
            producers: vec![op],
            before: true,
            bytes,
            phase,
        }
    }
}

/// A ring collective over `t` ranks of one node: each step sends bytes/t on the intra-node
/// link (α + chunk/β), 2(t−1) steps for an all-reduce, t−1 for the halves.
pub fn collective_ns(j: &Job, kind: CollectiveKind, t: u32, bytes: f64) -> u64 {
    let chunk = bytes / f64::from(t.max(1));
    let step = j.comm.cost.intra.time_ns(chunk);
    (f64::from(kind.ring_steps(t)) * step).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo::build::test_job;

    fn count(j: &Job, phase: Phase) -> usize {
        j.local
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Collective && o.spec.phase == phase)
            .count()
    }

    /// Megatron §3: per block two all-reduces forward (after the attention's and the MLP's
    /// row-parallel GEMM) and two backward (the input gradients of the column-parallel
    /// QKV and MLP-in GEMMs); the vocabulary-parallel embedding adds one forward, the head one
    /// backward. Sequence parallelism turns each into an all-gather and a reduce-scatter.
    #[test]
    fn two_collectives_per_block_each_way_or_four_with_sequence_parallelism() {
        let (_, job) = test_job("gpt", 4, "8xh200");
        let layers = 12;
        let tp = tensor_parallel(&job, 4, false, true).expect("tp");
        assert_eq!(count(&tp, Phase::Fw), 2 * layers + 1);
        assert_eq!(count(&tp, Phase::Bw), 2 * layers + 1);
        let sp = tensor_parallel(&job, 4, true, true).expect("sp");
        assert_eq!(count(&sp, Phase::Fw), 4 * layers + 1);
        assert_eq!(count(&sp, Phase::Bw), 4 * layers + 1);
        // Every collective sits between ops: something before it, something waiting for it.
        for j in [&tp, &sp] {
            for (i, o) in j.local.ops.iter().enumerate() {
                if o.spec.kind == OpKind::Collective {
                    let i = i as OpId;
                    assert!(j.local.edges.iter().any(|&(_, b)| b == i));
                    assert!(j.local.edges.iter().any(|&(a, _)| a == i));
                }
            }
            assert!(j.local_dfg().is_ok(), "acyclic");
        }
        // Each collective is called from the host in program order, at the host's cost of a
        // collective call (`c10d::allreduce_`).
        let call = tp.host.collective_call_ns().round() as u64;
        assert!(call > 0);
        let launched = tp
            .local
            .edges
            .iter()
            .filter(|&&(a, b)| {
                tp.local.ops[b as usize].spec.kind == OpKind::Collective
                    && tp.local.ops[a as usize].spec.kind == OpKind::Launch
                    && tp.local.ops[a as usize].spec.dur_ns == call
            })
            .count();
        assert_eq!(launched, 4 * layers + 2);
    }

    /// Weights, gradients and optimizer state of the split layers (QKV, attention out, MLP in
    /// and out, the word embedding) are 1/t per rank; LayerNorms, position embeddings and
    /// row-parallel biases stay whole, so the static bytes follow that arithmetic.
    #[test]
    fn static_memory_splits_the_block_matrices_and_the_vocabulary() {
        let (m, job) = test_job("gpt", 4, "8xh200");
        let in_split_layers: u64 = m
            .layers
            .iter()
            .filter(|l| split_of(&l.name).weights_split())
            .map(|l| l.param_elems())
            .sum();
        // Row-parallel biases stay whole: two per block of `hidden` elements each.
        let row_bias: u64 = m
            .layers
            .iter()
            .filter(|l| split_of(&l.name) == Split::Row)
            .flat_map(|l| &l.params)
            .filter(|p| p.name.ends_with(".bias"))
            .map(|p| p.elems)
            .sum();
        assert_eq!(row_bias, 2 * 12 * 768);
        let split = in_split_layers - row_bias;
        let tp = tensor_parallel(&job, 4, false, true).expect("tp");
        for (before, after) in job.local.tensors.iter().zip(&tp.local.tensors) {
            let whole = before.name.ends_with("c_proj.bias") || before.name.contains("ln_");
            let want = if whole {
                before.bytes
            } else if before.name.contains(".h.") || before.name.contains("wte") {
                before.bytes.div_ceil(4)
            } else {
                before.bytes
            };
            assert_eq!(after.bytes, want, "{}", before.name);
        }
        let psi = m.param_elems();
        assert!(split > psi * 9 / 10, "{split} of {psi}");
        for t in [2u64, 4] {
            let j = tensor_parallel(&job, t as u32, false, true).expect("tp");
            let expect = job.local.static_mem_bytes as f64
                * ((psi - split) as f64 + split as f64 / t as f64)
                / psi as f64;
            let got = j.local.static_mem_bytes as f64;
            assert!(
                (got / expect - 1.0).abs() < 1e-3,
                "t={t}: {got} vs {expect}"
            );
            // The data-parallel gradient synchronisation runs over the ranks t apart, with the
            // rank's share of the gradients.
            let before: u64 = job.syncs.iter().map(|s| s.bytes).sum();
            let after: u64 = j.syncs.iter().map(|s| s.bytes).sum();
            let want =
                (before as f64) * ((psi - split) as f64 + split as f64 / t as f64) / psi as f64;
            assert!(
                (after as f64 / want - 1.0).abs() < 1e-2,
                "{after} vs {want}"
            );
            assert!(j.syncs.iter().all(|s| s.group
                == Group {
                    size: job.workers / t as u32,
                    stride: t as u32
                }));
        }
    }

    /// The block's matrix products are 1/t per rank at the same batch per replica; the
    /// LayerNorms are not (and are 1/t with sequence parallelism).
    #[test]
    fn matrix_flops_split_and_replicated_work_stays_without_sequence_parallelism() {
        let (_, job) = test_job("gpt", 4, "8xh200");
        let flops = |j: &Job, pick: &dyn Fn(Split) -> bool| -> f64 {
            j.local
                .ops
                .iter()
                .filter(|o| o.spec.kind == OpKind::Compute && o.spec.layer != NONE)
                .filter(|o| o.spec.phase != Phase::Update)
                .filter(|o| pick(split_of(&j.local.layers[o.spec.layer as usize])))
                .filter_map(|o| o.work.map(|w| w.flops))
                .sum()
        };
        let matrix = |s: Split| matches!(s, Split::Column { .. } | Split::Row | Split::Inner);
        let block = |s: Split| s == Split::Block;
        for t in [2.0, 4.0] {
            let tp = tensor_parallel(&job, t as u32, false, false).expect("tp");
            let sp = tensor_parallel(&job, t as u32, true, false).expect("sp");
            assert!((flops(&tp, &matrix) * t / flops(&job, &matrix) - 1.0).abs() < 1e-9);
            assert!((flops(&tp, &block) / flops(&job, &block) - 1.0).abs() < 1e-9);
            assert!((flops(&sp, &block) * t / flops(&job, &block) - 1.0).abs() < 1e-9);
            // Keeping the global batch: each rank computes what one GPU did before.
            let g = tensor_parallel(&job, t as u32, false, true).expect("global");
            assert!((flops(&g, &matrix) / flops(&job, &matrix) - 1.0).abs() < 1e-9);
            assert_eq!(g.meta.batch, job.meta.batch * t as u32);
            assert_eq!(tp.meta.batch, job.meta.batch);
        }
    }

    /// Korthikanti et al. (2022) Table 2, as a test oracle on one GPT block's saved
    /// activations at the same batch per replica: with sequence parallelism every term is
    /// 1/t (their `sbh(34 + 5as/h)/t`); without it the replicated terms — the two LayerNorm
    /// inputs, the two column-parallel GEMM inputs and the two dropout masks after the
    /// row-parallel GEMMs (their `10 sbh` in 16-bit; 18 sbh in FP32, a mask being one byte) —
    /// stay whole and the rest is 1/t.
    #[test]
    fn block_activations_follow_korthikanti_with_and_without_sequence_parallelism() {
        let (m, job) = test_job("gpt", 2, "8xh200");
        let saved = |j: &Job, block: &str| -> f64 {
            j.local
                .mem
                .iter()
                .filter(|e| e.when == MemWhen::AllocAtStart)
                .filter(|e| {
                    let s = &j.local.ops[e.op as usize].spec;
                    s.kind == OpKind::Compute
                        && s.phase == Phase::Fw
                        && s.layer != NONE
                        && super::super::shard::unit_of(&j.local.layers[s.layer as usize]) == block
                })
                .map(|e| e.bytes as f64)
                .sum()
        };
        let sbh = f64::from(m.batch) * 1024.0 * 768.0; // gpt: seq 1024, hidden 768
        let whole = saved(&job, "transformer.h.3");
        for t in [2.0, 4.0] {
            let sp = tensor_parallel(&job, t as u32, true, false).expect("sp");
            assert!((saved(&sp, "transformer.h.3") * t / whole - 1.0).abs() < 1e-3);
            let tp = tensor_parallel(&job, t as u32, false, false).expect("tp");
            let replicated = 18.0 * sbh;
            let want = replicated + (whole - replicated) / t;
            let got = saved(&tp, "transformer.h.3");
            // LayerNorm keeps a mean and an inverse deviation per token besides its input.
            assert!((got / want - 1.0).abs() < 0.01, "t={t}: {got} vs {want}");
        }
    }

    #[test]
    fn impossible_layouts_are_refused_naming_the_constraint() {
        let (_, job) = test_job("gpt", 4, "8xh200");
        let why = |t: u32| match tensor_parallel(&job, t, false, true) {
            Err(PassError::NotApplicable { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert!(
            why(8).contains("must divide the 12 attention heads"),
            "{}",
            why(8)
        );
        assert!(why(16).contains("must divide the 8 workers"), "{}", why(16));
        let (_, big) = test_job("gpt", 4, "64xh100-ib");
        match tensor_parallel(&big, 16, false, true) {
            Err(PassError::NotApplicable { why, .. }) => {
                assert!(why.contains("8 GPUs of a node"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let (_, cnn) = test_job("resnet50", 4, "8xh200");
        assert!(matches!(
            tensor_parallel(&cnn, 2, false, true),
            Err(PassError::NotApplicable { .. })
        ));
        let tp = tensor_parallel(&job, 2, false, true).expect("tp");
        assert!(matches!(
            tensor_parallel(&tp, 2, false, true),
            Err(PassError::NotApplicable { .. })
        ));
    }
}
