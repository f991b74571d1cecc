//! `op-fusion`: fuse adjacent compute ops of one device into one kernel (dPRO §5.1, Theorem 1;
//! XLA auto-clustering).
//!
//! **When it applies.** `scope=critical` (default): consecutive compute ops `p_{n−1}, p_n` of the
//! critical path (forward or backward phase, same device, never UPDATE) when Theorem 1 says the
//! fusion shortens it; chains grow as in Algorithm 1 (the fused op is the next step's
//! `p_{n−1}`) up to `max_ops` ops. `scope=all` (the XLA-default baseline): every device's fusible
//! ops in topological order, consecutive ones greedily merged into clusters of at most `max_ops`,
//! whenever the merge is legal — no cost test.
//!
//! ```text
//! before:  … → p_{n−1} → p_n → …        p_{n−1} → Out(q_{n−1}) → sync → In
//! after:   … → [p_{n−1}+p_n] → …        [p_{n−1}+p_n] → Out(q_{n−1}) → sync → In
//! ```
//!
//! The gradients of the fused ops become ready at the fused op's end (their `Out`s move to it):
//! the price of fusing backward ops.
//!
//! **Legality.** Merging a set `C` creates a cycle iff some path leaves `C` and comes back into
//! it through an op outside `C`. The check is a DFS from the successors of `C` on the local graph
//! extended with one node per sync (ready ops → sync → done ops, and sync `i` → sync `i+1`: NCCL
//! issues collectives in sync order, so a later sync's `In` waits for every earlier sync's `Out`),
//! where clusters already chosen in this proposal count as merged (entering one continues from
//! all its members). It is pruned by topological position: an op placed after every member of `C`
//! and of every earlier cluster cannot lead back. So paths through a synchronisation are refused
//! (never fuse across a sync boundary).
//!
//! **Cost model** (`opfs_time`). When every op of the cluster has an [`OpWork`] (zoo ops):
//! roofline of the merged work with ONE kernel launch in place of the sum of the ops' kernels:
//! `max(Σ_i flops_i / peak(math_i), (Σ_i elems_i − saved) · dtype_bytes / mem_bw) + 1 · launch`,
//! where `saved` is the intermediate traffic fusion removes. For every dependency edge `u → v`
//! inside the cluster the intermediate is `m = min(act_u, act_v) / 2` elements (an op's activation
//! traffic is its input read plus its output write, about half each); the consumer no longer reads
//! it back (`m`), and in the backward phase the producer no longer writes it either (`2m`: a
//! gradient flowing between two backward ops is not kept), whereas a forward intermediate is
//! still written because training saves it for the backward pass (`m` only). `saved` is capped at
//! the cluster's activation traffic. The result is multiplied by `Σ dur / Σ roofline(op)` so
//! that ops whose durations were calibrated or rescaled keep their ratio. Ops without work (trace
//! ops): `max(max_i dur_i, Σ_i dur_i − (k−1) · launch_overhead)`.
//!
//! **Theorem 1** (decision, `scope=critical`): fuse `p_{n−1}` (possibly already a fused chain)
//! and `p_n` iff `q^d_{n−1} < p^d_{n−1} + p^d_n − opfs_time(p_{n−1}, p_n)` (strict, as in
//! Algorithm 1 line 6), where `q^d_{n−1}` is the synchronisation time of the gradients `p_{n−1}`
//! produces (`sync_time::sync_time_ns` at their current partition count, summed over
//! them; 0 for forward ops, whose `q` is null). Theorem 1 holds under its own assumptions: the
//! segment is computation-bound (every gradient's sync finishes before the next compute op on
//! the path would release the next gradient) and the communication stream is idle when the
//! gradient becomes ready. The property test at the end of this file measures how often the
//! decision agrees with a full replay when those assumptions do not hold.
//!
//! **Coarsened view** (`coarsen`, dPRO §5.3 and Fig. 6; Algorithm 1 line 2). With `coarsen=1`
//! (default) `scope=critical` walks the critical path by *units*: per device and phase, in
//! topological order, the fusible ops that own no gradient tensor (activations, adds, pooling,
//! dropout, softmax: no parameters) accumulate along a chain — each the direct successor of the
//! previous — and join the next tensor-producing op (one whose backward produces a gradient,
//! or a forward op of a layer with parameters); a run that no such op closes is a unit of its
//! own; units hold at most `max_ops` ops.
//!
//! ```text
//! BW chain:  relu_bw → bn_bw(γ,β) → conv_bw(W) → relu_bw → add_bw → bn_bw …
//! units:    [relu_bw, bn_bw] [conv_bw] [relu_bw, add_bw, bn_bw] …
//! ```
//!
//! A unit is taken whole: alone it is fused when that is legal and gains (Theorem 1 with
//! `q^d = 0`, since its leading ops produce no tensor — dPRO's Theorem-3 argument: a tensor-less
//! op is a producer of a null tensor), and Theorem 1 is then applied between units (fewer,
//! larger candidates and steps). With `coarsen=0` every op is its own unit — the strawman of
//! dPRO Table 5; the search passes `coarsen=0` under `plan --no-coarsen`.
//!
//! **Block symmetry** (`twins`, dPRO §5.3 "Symmetry" applied to repeated blocks). When every
//! member of a cluster chosen on the critical path lies in one block of a repeated structure —
//! op names that differ only in the first all-digit component, `bert.encoder.layer.3.…` or
//! `layer2.1.…` ([`block_of`]) — the same patch also merges the twin cluster of every other
//! block index (the ops whose member names are the cluster's with the index replaced, each the
//! same occurrence of its names as the member it stands for: a recomputed layer's forward runs
//! twice, the original and the re-run), when all of them exist, are free and the merge is
//! legal. One candidate evaluation then fuses twelve
//! BERT layers instead of one per round. The twins include every other occurrence of the
//! same names (each micro-step of gradient accumulation, a recomputed layer's re-run): the
//! exports compile a module once for all its calls, and without them `plan --model llama3-70b
//! --cluster 512xh100-ib --framework pytorch` (8 micro-steps) took one micro-step's fusion per
//! round, 67 rounds (34 while a name that runs twice per micro-step — a tensor-parallel MLP's
//! projections — still shifted by one occurrence; 13 now). The search passes `twins=0` under
//! `plan --no-symmetry`.
//! VGG's `features.N` (each index a different op) and names without an index have no twins.
//!
//! **Where a cluster may reach** (`within`). The PyTorch exports apply a zoo plan's clusters by
//! compiling each module block ([`module_block`]: `bert.encoder.layer.3`, `layer2.0`) with
//! `torch.compile`; a fusion across two blocks' boundary is not applied, so it must not be
//! counted either. `within=auto` (default) keeps every cluster inside one module block for a
//! zoo job on a PyTorch-based framework (PyTorch, Horovod, BytePS, DeepSpeed, torchtitan) and
//! lets it reach anywhere on TF and JAX (XLA clusters the whole step) and on traces (whose
//! layers are ATen operators, not modules); `block` and `any` force either.
//!
//! **Knobs.** `scope` = `critical` | `all`; `max_ops` (default 8, 2..=1024); `coarsen` (default
//! 1, 0..=1); `twins` (default 1, 0..=1); `within` = `auto` | `block` | `any`. `coarsen` and
//! `twins` apply to `scope=critical`.
//!
//! **Framework knobs** (DESIGN.md table): PyTorch `torch.compile` per region (the only export
//! that applies a zoo plan's clusters). TF/XLA: the clusters would be a `<tf_node> <cluster_id>`
//! file for dPRO's TF fork, but a zoo plan's layer names are not a Keras model's node names, so
//! the TF export relies on XLA's own clustering (`jit_compile`, `--tf_xla_auto_jit=2`) and says
//! so; JAX: `jax.jit` fuses by itself.

use std::collections::BTreeSet;

use super::sync_time::{SyncTimes, scope_is_all};
use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::cost::compute::ns;
use crate::cost::framework::Framework;
use crate::graph::job::{Job, OpWork};
use crate::graph::{NONE, OpId, OpKind, Phase};

/// The `op-fusion` pass.
pub struct OpFusion;

const NAME: &str = "op-fusion";

impl Pass for OpFusion {
    fn name(&self) -> &str {
        NAME
    }
    fn granular(&self) -> bool {
        true
    }
    fn doc(&self) -> &str {
        "fuse adjacent compute ops into one kernel (dPRO Theorem 1; scope=all: XLA-style clusters)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text(
                "scope",
                "critical: pairs on the critical path by Theorem 1; all: every legal chain",
                "critical",
            ),
            KnobSpec::int("max_ops", "most ops in one fused cluster", 8, 2, 1024),
            KnobSpec::int(
                "coarsen",
                "1: units of a tensor-producing op and its tensor-less neighbours (dPRO coarsened view); 0: single ops",
                1,
                0,
                1,
            ),
            KnobSpec::int(
                "twins",
                "1: repeat a fusion inside one block in every twin block (block symmetry); 0: off",
                1,
                0,
                1,
            ),
            KnobSpec::text(
                "within",
                "block: a cluster stays inside one module block (what torch.compile of a block fuses); any; auto: block for a zoo job on a PyTorch-based framework",
                "auto",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let all = scope_is_all(NAME, knobs)?;
        let max_ops = knobs.int("max_ops") as usize;
        let coarsen = knobs.int("coarsen") != 0;
        let twins = knobs.int("twins") != 0;
        let job = &cx.job;
        let mut fz = Fuser::new(job)?;
        if confined_to_blocks(job, knobs.text("within"))? {
            fz.confine_to_blocks();
        }
        if all {
            let clusters = fz.all(max_ops);
            return Ok(clusters
                .into_iter()
                .map(|(ops, why)| fz.patch(&[ops], why))
                .collect());
        }
        let clusters = fz.critical(&cx.critical_local, max_ops, coarsen);
        let mut absorbed = vec![false; clusters.len()];
        let mut out = Vec::with_capacity(clusters.len());
        for (i, (ops, mut why)) in clusters.into_iter().enumerate() {
            if absorbed[i] {
                continue;
            }
            absorbed[i] = true;
            let mut group = vec![ops];
            if twins {
                let found = fz.twins(i, &mut absorbed);
                if !found.is_empty() {
                    why.push_str(&format!(
                        "; block symmetry: the same fusion in {} twin blocks and micro-steps",
                        found.len()
                    ));
                }
                group.extend(found);
            }
            out.push(fz.patch(&group, why));
        }
        Ok(out)
    }
}

/// Greatest common divisor (`gcd(0, n) = n`).
fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Whether the `within` knob keeps clusters inside one module block for `job`.
fn confined_to_blocks(job: &Job, within: &str) -> Result<bool, PassError> {
    match within {
        "block" => Ok(true),
        "any" => Ok(false),
        "auto" => Ok(
            job.meta.source == "zoo" && !matches!(job.framework, Framework::Tf | Framework::Jax)
        ),
        other => Err(PassError::BadKnob {
            pass: NAME.into(),
            knob: "within".into(),
            value: other.into(),
            why: "must be `auto`, `block` or `any`".into(),
        }),
    }
}

/// The module block a layer belongs to: its name up to its first block index (an all-digit
/// component followed by more, [`block_of`]: `bert.encoder.layer.3.attention.self.query` →
/// `bert.encoder.layer.3`, a child of an `nn.ModuleList` whose own `forward` runs;
/// `layer2.0.downsample.0` → `layer2.0`), else its parent (`cls.predictions.transform.dense` →
/// `cls.predictions.transform`, `features.3` → `features`), else the layer itself. The PyTorch
/// export compiles these; `within=block` keeps a cluster inside one.
pub fn module_block(layer: &str) -> String {
    if let Some((prefix, i, _)) = block_of(layer) {
        return format!("{prefix}{i}");
    }
    layer
        .rsplit_once('.')
        .map_or(layer, |(parent, _)| parent)
        .to_string()
}

/// Whether `o` may be fused at all: a forward or backward compute op.
pub fn fusible(job: &Job, o: OpId) -> bool {
    let s = &job.local.ops[o as usize].spec;
    s.kind == OpKind::Compute && matches!(s.phase, Phase::Fw | Phase::Bw)
}

pub use crate::graph::block_of;

/// `opfs_time` and the fused work of `ops` (see the module docs).
pub fn fused_cost(job: &Job, ops: &[OpId]) -> (u64, Option<OpWork>) {
    let l = &job.local;
    let sum_dur: u64 = ops.iter().map(|&o| l.ops[o as usize].spec.dur_ns).sum();
    let works: Option<Vec<OpWork>> = ops.iter().map(|&o| l.ops[o as usize].work).collect();
    let Some(works) = works else {
        let launch = ns(job.gpu.launch_overhead_us * 1e3);
        let longest = ops
            .iter()
            .map(|&o| l.ops[o as usize].spec.dur_ns)
            .max()
            .unwrap_or(0);
        let cut = launch.saturating_mul(ops.len().saturating_sub(1) as u64);
        return (sum_dur.saturating_sub(cut).max(longest), None);
    };
    let km = job.kernels();
    let members: BTreeSet<OpId> = ops.iter().copied().collect();
    let mut saved = 0.0;
    for &(a, b) in &l.edges {
        if a != b && members.contains(&a) && members.contains(&b) {
            let (wa, wb) = (l.ops[a as usize].work, l.ops[b as usize].work);
            if let (Some(wa), Some(wb)) = (wa, wb) {
                let m = wa.act_elems.min(wb.act_elems) / 2.0;
                let bw = l.ops[a as usize].spec.phase == Phase::Bw
                    && l.ops[b as usize].spec.phase == Phase::Bw;
                saved += if bw { 2.0 * m } else { m };
            }
        }
    }
    let act: f64 = works.iter().map(|w| w.act_elems).sum();
    let weight: f64 = works.iter().map(|w| w.weight_elems).sum();
    let saved = saved.min(act);
    let compute: f64 = works
        .iter()
        .map(|w| km.compute_ns(w, job.dtype, job.math))
        .sum();
    let memory = km.memory_ns((act - saved + weight) * job.dtype.bytes() as f64);
    let fused = compute.max(memory) + km.launch_floor_ns();
    let modelled: f64 = works
        .iter()
        .map(|w| km.time_ns(w, job.dtype, job.math))
        .sum();
    let ratio = if modelled > 0.0 {
        sum_dur as f64 / modelled
    } else {
        1.0
    };
    let work = works
        .iter()
        .copied()
        .reduce(|a, b| a.merged(&b))
        .map(|w| OpWork {
            act_elems: act - saved,
            weight_elems: weight,
            kernels: 1,
            ..w
        });
    (ns(fused * ratio), work)
}

/// Legality bookkeeping and cluster formation for one proposal.
struct Fuser<'a> {
    job: &'a Job,
    /// Successors in the local graph extended with one node per sync (ids `ops.len() + i`).
    succ: Vec<Vec<u32>>,
    /// Topological position of every node of the extended graph.
    pos: Vec<u32>,
    /// Cluster id of every node already in a chosen cluster.
    cluster_of: Vec<u32>,
    clusters: Vec<Vec<OpId>>,
    /// Highest position of any member of a chosen cluster.
    cluster_max_pos: u32,
    /// Syncs whose gradients each op produces.
    produces: Vec<Vec<usize>>,
    times: SyncTimes<'a>,
    /// DFS scratch: visit stamp per node.
    seen: Vec<u32>,
    stamp: u32,
    /// Fusible ops by their member names, in id order (twin lookup; filled on first use): an
    /// op's index there is its occurrence among ops of the same names — a recomputed layer has
    /// its forward twice, the original and the re-run; accumulation, once per micro-step.
    signatures: std::collections::BTreeMap<Vec<String>, Vec<OpId>>,
    /// Each fusible op's occurrence (see `signatures`; filled with it).
    occurrence: Vec<u32>,
    /// With `within=block`: each op's module block, numbered; a cluster's ops share one.
    block: Option<Vec<u32>>,
}

impl<'a> Fuser<'a> {
    fn new(job: &'a Job) -> Result<Self, PassError> {
        let n = job.local.ops.len();
        let total = n + job.syncs.len();
        let mut succ = vec![Vec::new(); total];
        for &(a, b) in &job.local.edges {
            succ[a as usize].push(b);
        }
        let mut produces = vec![Vec::new(); n];
        let preds = {
            let mut p = vec![Vec::new(); n];
            for &(a, b) in &job.local.edges {
                p[b as usize].push(a);
            }
            p
        };
        for (i, s) in job.syncs.iter().enumerate() {
            let node = (n + i) as u32;
            for &r in &s.ready {
                succ[r as usize].push(node);
                if job.local.ops[r as usize].spec.kind == OpKind::Compute {
                    produces[r as usize].push(i);
                } else {
                    for &p in &preds[r as usize] {
                        produces[p as usize].push(i);
                    }
                }
            }
            for &d in &s.done {
                succ[node as usize].push(d);
            }
            if i + 1 < job.syncs.len() {
                succ[node as usize].push(node + 1);
            }
        }
        for p in produces.iter_mut() {
            p.sort_unstable();
            p.dedup();
        }
        // Kahn's algorithm, smallest id first among ready nodes: deterministic.
        let mut indeg = vec![0u32; total];
        for s in &succ {
            for &v in s {
                indeg[v as usize] += 1;
            }
        }
        let mut ready: BTreeSet<u32> = (0..total as u32)
            .filter(|&v| indeg[v as usize] == 0)
            .collect();
        let mut pos = vec![u32::MAX; total];
        let mut next = 0u32;
        while let Some(v) = ready.pop_first() {
            pos[v as usize] = next;
            next += 1;
            for &w in &succ[v as usize] {
                indeg[w as usize] -= 1;
                if indeg[w as usize] == 0 {
                    ready.insert(w);
                }
            }
        }
        if next as usize != total {
            return Err(PassError::NotApplicable {
                pass: NAME.into(),
                why: "the job's local graph with its synchronisations has a cycle".into(),
            });
        }
        Ok(Fuser {
            job,
            succ,
            pos,
            cluster_of: vec![NONE; total],
            clusters: Vec::new(),
            cluster_max_pos: 0,
            produces,
            times: SyncTimes::new(job),
            seen: vec![0; total],
            stamp: 0,
            signatures: Default::default(),
            occurrence: Vec::new(),
            block: None,
        })
    }

    /// Keep every cluster inside one module block ([`module_block`] of the op's layer).
    fn confine_to_blocks(&mut self) {
        let mut ids: std::collections::HashMap<String, u32> = Default::default();
        let by_layer: Vec<u32> = self
            .job
            .local
            .layers
            .iter()
            .map(|l| {
                let n = ids.len() as u32;
                *ids.entry(module_block(l)).or_insert(n)
            })
            .collect();
        self.block = Some(
            self.job
                .local
                .ops
                .iter()
                .map(|o| {
                    by_layer
                        .get(o.spec.layer as usize)
                        .copied()
                        .unwrap_or(u32::MAX)
                })
                .collect(),
        );
    }

    /// Whether `set` lies inside one module block (always, unless confined).
    fn one_block(&self, set: &[OpId]) -> bool {
        let Some(block) = &self.block else {
            return true;
        };
        let b = |o: OpId| block[o as usize];
        set.iter().all(|&o| b(o) == b(set[0]) && b(o) != u32::MAX)
    }

    /// Whether merging `set` (plus the clusters already chosen) keeps the graph acyclic, and
    /// `set` inside one module block when the pass is confined to blocks.
    fn legal(&mut self, set: &[OpId]) -> bool {
        if !self.one_block(set) {
            return false;
        }
        self.stamp += 1;
        let stamp = self.stamp;
        let inside: BTreeSet<u32> = set.iter().copied().collect();
        let top = set
            .iter()
            .map(|&o| self.pos[o as usize])
            .max()
            .unwrap_or(0)
            .max(self.cluster_max_pos);
        let mut stack: Vec<u32> = Vec::new();
        for &o in set {
            for &w in &self.succ[o as usize] {
                if !inside.contains(&w) {
                    stack.push(w);
                }
            }
        }
        while let Some(v) = stack.pop() {
            if inside.contains(&v) {
                return false;
            }
            if self.seen[v as usize] == stamp || self.pos[v as usize] > top {
                continue;
            }
            self.seen[v as usize] = stamp;
            let c = self.cluster_of[v as usize];
            if c == NONE {
                stack.extend(self.succ[v as usize].iter().copied());
            } else {
                for &m in &self.clusters[c as usize] {
                    self.seen[m as usize] = stamp;
                    stack.extend(self.succ[m as usize].iter().copied());
                }
            }
        }
        true
    }

    fn commit(&mut self, ops: Vec<OpId>) {
        let id = self.clusters.len() as u32;
        for &o in &ops {
            self.cluster_of[o as usize] = id;
            self.cluster_max_pos = self.cluster_max_pos.max(self.pos[o as usize]);
        }
        self.clusters.push(ops);
    }

    fn dur(&self, ops: &[OpId]) -> u64 {
        if let [one] = ops {
            self.job.local.ops[*one as usize].spec.dur_ns
        } else {
            fused_cost(self.job, ops).0
        }
    }

    /// `q^d` of a (fused) op: sync time of the gradients its members produce.
    fn q_d(&mut self, ops: &[OpId]) -> u64 {
        let syncs: BTreeSet<usize> = ops
            .iter()
            .flat_map(|&o| self.produces[o as usize].iter().copied())
            .collect();
        syncs
            .into_iter()
            .map(|s| {
                let sy = &self.job.syncs[s];
                self.times.get(sy.bytes, sy.partitions)
            })
            .sum()
    }

    /// Theorem 1 along the critical path (Algorithm 1, lines 5–7, chains included), between
    /// units of the coarsened view when `coarsen` (single ops otherwise).
    fn critical(
        &mut self,
        path: &[OpId],
        max_ops: usize,
        coarsen: bool,
    ) -> Vec<(Vec<OpId>, String)> {
        let (units, unit_of) = if coarsen {
            self.units(max_ops)
        } else {
            (Vec::new(), Vec::new())
        };
        let mut taken: BTreeSet<u32> = BTreeSet::new();
        let mut out = Vec::new();
        let mut cur: Vec<OpId> = Vec::new();
        let mut why = String::new();
        let mut close = |s: &mut Self, cur: &mut Vec<OpId>, why: &mut String| {
            if cur.len() >= 2 {
                let ops = std::mem::take(cur);
                s.commit(ops.clone());
                out.push((ops, std::mem::take(why)));
            }
            cur.clear();
            why.clear();
        };
        for &p in path {
            if (p as usize) >= self.job.local.ops.len()
                || !fusible(self.job, p)
                || self.cluster_of[p as usize] != NONE
            {
                close(self, &mut cur, &mut why);
                continue;
            }
            if cur.contains(&p) {
                continue; // already in, with its unit
            }
            // The next step: p's whole unit (coarsened view) or p alone.
            let u = unit_of.get(p as usize).copied().unwrap_or(NONE);
            let step: Vec<OpId> = if u != NONE && taken.insert(u) {
                let ops = &units[u as usize];
                if ops.iter().all(|&o| self.cluster_of[o as usize] == NONE) {
                    ops.clone()
                } else {
                    vec![p]
                }
            } else {
                vec![p]
            };
            let same_device = cur.first().is_none_or(|&c| {
                self.job.local.ops[c as usize].spec.device
                    == self.job.local.ops[step[0] as usize].spec.device
            });
            if cur.is_empty() || !same_device || cur.len() + step.len() > max_ops {
                close(self, &mut cur, &mut why);
                self.start(&mut cur, &mut why, step, p);
                continue;
            }
            let mut cand = cur.clone();
            cand.extend(&step);
            let (a, b) = (self.dur(&cur), self.dur(&step));
            let fused = self.dur(&cand);
            let q = self.q_d(&cur);
            let gain = (a + b) as i64 - fused as i64;
            if (q as i64) < gain && self.legal(&cand) {
                why = format!(
                    "Theorem 1 on the critical path: q^d_(n-1) = {q} ns < p^d_(n-1) + p^d_n − opfs_time = {a} + {b} − {fused} ns ({} ops fused)",
                    cand.len()
                );
                cur = cand;
            } else {
                close(self, &mut cur, &mut why);
                self.start(&mut cur, &mut why, step, p);
            }
        }
        close(self, &mut cur, &mut why);
        out
    }

    /// Begin a chain with `step`: a unit of several ops stays whole when fusing it is legal and
    /// gains (Theorem 1 with `q = 0`: its leading ops produce no tensor); else `p` alone.
    fn start(&mut self, cur: &mut Vec<OpId>, why: &mut String, step: Vec<OpId>, p: OpId) {
        if step.len() >= 2 {
            let sum: u64 = step.iter().map(|&o| self.dur(&[o])).sum();
            let fused = self.dur(&step);
            if fused < sum && self.legal(&step) {
                *why = format!(
                    "coarsened view: a tensor-producing op and its {} tensor-less neighbours as one unit: {sum} → {fused} ns",
                    step.len() - 1
                );
                *cur = step;
                return;
            }
        }
        *cur = vec![p];
    }

    /// Whether `o` produces (backward) or owns (forward) a gradient tensor.
    fn has_tensor(&self, o: OpId, layer_has_tensor: &[bool]) -> bool {
        let s = &self.job.local.ops[o as usize].spec;
        !self.produces[o as usize].is_empty()
            || (s.phase == Phase::Fw
                && layer_has_tensor
                    .get(s.layer as usize)
                    .copied()
                    .unwrap_or(false))
    }

    /// The coarsened view's op units (dPRO §5.3, Fig. 6): per device and phase, in topological
    /// order, tensor-less fusible ops accumulate along a chain (each the direct successor of
    /// the previous) and join the next tensor-producing op; a run not closed by one is a unit
    /// of its own. At most `max_ops` ops per unit. Returns the units of two ops or more and
    /// each op's unit (`NONE`: alone).
    fn units(&self, max_ops: usize) -> (Vec<Vec<OpId>>, Vec<u32>) {
        let l = &self.job.local;
        let mut layer_has_tensor = vec![false; l.layers.len()];
        for t in &l.tensors {
            if let Some(x) = layer_has_tensor.get_mut(t.layer as usize) {
                *x = true;
            }
        }
        let mut lists: std::collections::BTreeMap<(u32, u8), Vec<OpId>> = Default::default();
        for o in 0..l.ops.len() as OpId {
            if fusible(self.job, o) {
                let s = &l.ops[o as usize].spec;
                lists.entry((s.device, s.phase as u8)).or_default().push(o);
            }
        }
        let mut units: Vec<Vec<OpId>> = Vec::new();
        let mut unit_of = vec![NONE; l.ops.len()];
        let mut emit = |run: &mut Vec<OpId>| {
            if run.len() >= 2 {
                for &o in run.iter() {
                    unit_of[o as usize] = units.len() as u32;
                }
                units.push(std::mem::take(run));
            }
            run.clear();
        };
        for (_, mut ops) in lists {
            ops.sort_by_key(|&o| self.pos[o as usize]);
            let mut run: Vec<OpId> = Vec::new();
            for o in ops {
                let chained = run
                    .last()
                    .is_some_and(|&last| self.succ[last as usize].contains(&o));
                if !chained || run.len() >= max_ops {
                    emit(&mut run);
                }
                run.push(o);
                if self.has_tensor(o, &layer_has_tensor) {
                    emit(&mut run);
                }
            }
            emit(&mut run);
        }
        (units, unit_of)
    }

    /// Block symmetry: the same fusion as walk cluster `me` in every twin block (see the module
    /// docs). A twin made of free ops is checked for legality and committed; a twin that the
    /// walk already chose as one of its clusters (exactly the same ops) is absorbed: marked in
    /// `absorbed` so that it is not proposed again on its own. Returns the twins.
    fn twins(&mut self, me: usize, absorbed: &mut [bool]) -> Vec<Vec<OpId>> {
        let cluster = self.clusters[me].clone();
        let l = &self.job.local;
        let names: Vec<Vec<String>> = cluster.iter().map(|&o| l.members(o)).collect();
        // The cluster's block structure: one prefix, its block indices; none when a member has
        // no index or two prefixes mix (then only the other occurrences are twins).
        let mut prefix: Option<&str> = None;
        let mut mine: BTreeSet<u32> = BTreeSet::new();
        let mut blocked = true;
        for n in names.iter().flatten() {
            match block_of(n) {
                Some((p, idx, _)) if prefix.is_none_or(|q| q == p) => {
                    prefix = Some(p);
                    mine.insert(idx);
                }
                _ => blocked = false,
            }
        }
        let prefix = prefix.filter(|_| blocked).map(str::to_string);
        // A trace's names are operators (`aten::mm`), repeated across unrelated layers: no
        // twins without a block index there.
        if prefix.is_none() && self.job.meta.source != "zoo" {
            return Vec::new();
        }
        let lo = mine.first().copied().unwrap_or(0);
        if self.signatures.is_empty() {
            self.occurrence = vec![0; l.ops.len()];
            for o in 0..l.ops.len() as OpId {
                if fusible(self.job, o) {
                    let same = self.signatures.entry(l.members(o)).or_default();
                    self.occurrence[o as usize] = same.len() as u32;
                    same.push(o);
                }
            }
        }
        let indices: BTreeSet<u32> = match &prefix {
            Some(prefix) => self
                .signatures
                .keys()
                .flatten()
                .filter_map(|n| block_of(n).filter(|b| b.0 == prefix).map(|b| b.1))
                .collect(),
            None => [lo].into(),
        };
        // Occurrence shifts: the same names run again in every micro-step of gradient
        // accumulation (and a recomputed layer's re-run), and the compiled module is the same
        // for every call, so each later or earlier occurrence of the cluster is a twin too.
        // A name may run several times per micro-step (a tensor-parallel layer's two ops):
        // with K the gcd of the members' occurrence counts, a name run c times moves c/K
        // occurrences per step; one occurrence per step (re-runs, which follow all originals)
        // is tried too. Every twin is still checked: same names, free ops, a legal merge.
        let counts: Vec<u32> = names
            .iter()
            .map(|n| self.signatures.get(n).map_or(1, |v| v.len() as u32))
            .collect();
        let k = counts.iter().copied().fold(0, gcd).max(1);
        let steps: Vec<i64> = counts.iter().map(|&c| i64::from(c / k)).collect();
        let ones = vec![1i64; names.len()];
        // No member has an occurrence past its count.
        let last_occ = i64::from(counts.iter().copied().max().unwrap_or(1));
        let mut out = Vec::new();
        for &j in &indices {
            let d = j as i64 - lo as i64;
            if !mine
                .iter()
                .all(|&i| indices.contains(&((i as i64 + d) as u32)))
            {
                continue;
            }
            // The members' names `d` blocks away.
            let renamed: Vec<Vec<String>> = names
                .iter()
                .map(|member| {
                    member
                        .iter()
                        .map(|n| match block_of(n) {
                            Some((p, i, rest)) if d != 0 => format!("{p}{}{rest}", i as i64 + d),
                            _ => n.clone(),
                        })
                        .collect()
                })
                .collect();
            for per in [&steps, &ones] {
                for e in -last_occ..=last_occ {
                    if d == 0 && e == 0 {
                        continue;
                    }
                    self.twin_at(&cluster, &renamed, e, per, me, absorbed, &mut out);
                }
                if steps == ones {
                    break;
                }
            }
        }
        out
    }

    /// The twin of walk cluster `me` (`cluster`; `renamed`, its members' names in the twin's
    /// block) `shift` × `per[member]` occurrences away, when every member has one: committed
    /// when its ops are free and the merge is legal, absorbed when the walk chose exactly it;
    /// pushed onto `out`.
    #[allow(clippy::too_many_arguments)]
    fn twin_at(
        &mut self,
        cluster: &[OpId],
        renamed: &[Vec<String>],
        shift: i64,
        per: &[i64],
        me: usize,
        absorbed: &mut [bool],
        out: &mut Vec<Vec<OpId>>,
    ) {
        let mut twin: Vec<OpId> = Vec::with_capacity(cluster.len());
        for ((member, &op), &step) in renamed.iter().zip(cluster).zip(per) {
            let Ok(occ) = u32::try_from(i64::from(self.occurrence[op as usize]) + shift * step)
            else {
                break;
            };
            match self
                .signatures
                .get(member)
                .and_then(|v| v.get(occ as usize))
            {
                Some(&t) if !twin.contains(&t) => twin.push(t),
                _ => break,
            }
        }
        if twin.len() != cluster.len() {
            return;
        }
        let owners: BTreeSet<u32> = twin.iter().map(|&t| self.cluster_of[t as usize]).collect();
        match owners.into_iter().collect::<Vec<_>>().as_slice() {
            [NONE] if self.legal(&twin) => {
                self.commit(twin.clone());
                out.push(twin);
            }
            &[c] if (c as usize) < absorbed.len()
                && c as usize != me
                && !absorbed[c as usize]
                && self.clusters[c as usize].len() == twin.len() =>
            {
                absorbed[c as usize] = true;
                out.push(self.clusters[c as usize].clone());
            }
            _ => {}
        }
    }

    /// XLA-style: on each device, in topological order, greedy legal clusters of ≤ `max_ops`.
    fn all(&mut self, max_ops: usize) -> Vec<(Vec<OpId>, String)> {
        let l = &self.job.local;
        let mut by_device: Vec<Vec<OpId>> = vec![Vec::new(); l.devices.len()];
        for (i, o) in l.ops.iter().enumerate() {
            if let Some(d) = by_device.get_mut(o.spec.device as usize) {
                d.push(i as OpId);
            }
        }
        let mut out = Vec::new();
        for mut ops in by_device {
            ops.sort_by_key(|&o| self.pos[o as usize]);
            let mut cur: Vec<OpId> = Vec::new();
            for o in ops {
                if !fusible(self.job, o) {
                    self.flush(&mut cur, &mut out);
                    continue;
                }
                if !cur.is_empty() && cur.len() < max_ops {
                    let mut cand = cur.clone();
                    cand.push(o);
                    if self.legal(&cand) {
                        cur = cand;
                        continue;
                    }
                }
                self.flush(&mut cur, &mut out);
                cur.push(o);
            }
            self.flush(&mut cur, &mut out);
        }
        out
    }

    fn flush(&mut self, cur: &mut Vec<OpId>, out: &mut Vec<(Vec<OpId>, String)>) {
        if cur.len() >= 2 {
            let ops = std::mem::take(cur);
            let sum: u64 = ops
                .iter()
                .map(|&o| self.job.local.ops[o as usize].spec.dur_ns)
                .sum();
            let why = format!(
                "XLA-style cluster of {} consecutive ops: {sum} ns → {} ns",
                ops.len(),
                self.dur(&ops)
            );
            self.commit(ops.clone());
            out.push((ops, why));
        }
        cur.clear();
    }

    /// One patch merging every cluster of `group` (a cluster and its twins).
    fn patch(&self, group: &[Vec<OpId>], why: String) -> Patch {
        let mut edits = Vec::new();
        for ops in group {
            let (dur_ns, work) = fused_cost(self.job, ops);
            edits.push(Edit::Merge {
                ops: ops.to_vec(),
                dur_ns,
            });
            if work.is_some() {
                edits.push(Edit::SetWork { op: ops[0], work });
            }
        }
        Patch {
            pass: NAME.into(),
            why,
            edits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::SyncScheme;
    use crate::graph::comm::CommSpec;
    use crate::graph::job::LocalOp;
    use crate::graph::{DeviceKind, OpSpec};
    use crate::passes::testkit::{chain_job, spec};
    use crate::passes::{apply_all, evaluate, resolve_knobs};

    fn ring() -> CommSpec {
        spec(SyncScheme::Ring)
    }

    fn knobs(kv: &[(&str, &str)]) -> Knobs {
        let kv: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve_knobs(&OpFusion, &kv).unwrap()
    }

    fn merged(p: &[Patch]) -> Vec<Vec<OpId>> {
        p.iter()
            .map(|p| match &p.edits[0] {
                Edit::Merge { ops, .. } => ops.clone(),
                e => panic!("{e:?}"),
            })
            .collect()
    }

    #[test]
    fn trace_ops_fuse_minus_launches() {
        // v100 launch overhead: read from the config so the test follows it.
        let job = chain_job(
            &[(50_000, false), (30_000, false), (20_000, false)],
            0,
            ring(),
            2,
        );
        let l = ns(job.gpu.launch_overhead_us * 1e3);
        assert!(l > 0);
        assert_eq!(fused_cost(&job, &[0, 1]).0, 80_000 - l);
        assert_eq!(fused_cost(&job, &[0, 1, 2]).0, 100_000 - 2 * l);
        // Never below the longest op.
        let tiny = chain_job(&[(50_000, false), (1, false)], 0, ring(), 2);
        assert_eq!(fused_cost(&tiny, &[0, 1]).0, 50_000);
    }

    #[test]
    fn roofline_fusion_saves_launch_and_intermediate() {
        // Two memory-bound vector ops of 1.8e6 activation elements each, FP32 on a V100: 7.2e6 B
        // at the achieved bandwidth (900 GB/s × the Volta memory efficiency) plus one launch
        // floor each (1e6 FLOPs on the vector units are far shorter: memory-bound).
        let mut job = chain_job(&[(0, false), (0, false)], 0, ring(), 2);
        let bw = 900.0 * job.gpu.kernels.memory_efficiency;
        let l = job.gpu.launch_overhead_us * 1e3;
        let t = |elems: f64| (elems * 4.0 / bw + l).round() as u64;
        let w = OpWork::new(
            crate::cost::kernel::OpClass::Elementwise,
            1e6,
            1.8e6,
            0.0,
            1,
        );
        let one = t(1.8e6);
        for o in &mut job.local_mut().ops {
            o.work = Some(w);
            o.spec.dur_ns = one;
        }
        assert_eq!(job.cost_ns(&w, job.dtype, 1.0), one);
        // Backward pair: intermediate m = 0.9e6 elements, read and write removed → 1.8e6 of
        // 3.6e6 elements left, one launch.
        let (f, work) = fused_cost(&job, &[0, 1]);
        assert_eq!(f, t(1.8e6));
        let work = work.unwrap();
        assert_eq!(work.kernels, 1);
        assert_eq!(work.act_elems, 1.8e6);
        assert_eq!(work.flops, 2e6);
        // Forward pair: only the read is removed → 2.7e6 elements, one launch.
        for o in &mut job.local_mut().ops {
            o.spec.phase = Phase::Fw;
        }
        assert!(fused_cost(&job, &[0, 1]).0.abs_diff(t(2.7e6)) <= 1);
        // Durations calibrated 10 % above the model keep their ratio.
        for o in &mut job.local_mut().ops {
            o.spec.dur_ns = (one as f64 * 1.1).round() as u64;
        }
        let expect = (2.7e6 * 4.0 / bw + l) * 1.1;
        assert!((fused_cost(&job, &[0, 1]).0 as f64 - expect).abs() <= 2.0);
    }

    #[test]
    fn theorem_1_on_a_hand_built_chain() {
        // Chain A(100 µs, grad 4000 B) → B(50 µs) → C(50 µs), 4 workers on the ring spec
        // (t_sync(4000 B) = 12,000 ns). Critical path: A, B, C (compute-bound).
        // (A, B): q^d = 12,000 ≥ gain = launch (4 µs on a V100) → no fusion.
        // (B, C): q^d = 0 < gain = 4 µs → fuse B and C into 96 µs.
        let job = chain_job(
            &[(100_000, true), (50_000, false), (50_000, false)],
            4000,
            ring(),
            4,
        );
        let l = ns(job.gpu.launch_overhead_us * 1e3);
        assert_eq!(l, 4000);
        let cx = evaluate(job.clone()).unwrap();
        assert_eq!(cx.iteration_ns(), 200_000);
        let p = OpFusion.propose(&cx, &knobs(&[])).unwrap();
        // Op ids: A = 0, Out = 1, In = 2, B = 3, C = 4.
        assert_eq!(merged(&p), vec![vec![3, 4]]);
        assert_eq!(
            p[0].edits[0],
            Edit::Merge {
                ops: vec![3, 4],
                dur_ns: 96_000
            }
        );
        let after = evaluate(apply_all(&job, &p).unwrap()).unwrap();
        assert_eq!(after.iteration_ns(), 196_000);
        // With a tiny gradient (t_sync 6 × (1000 + 1) = 6006 ns) still ≥ 4000: A stays alone.
        // With 2 workers and 2 B: t_sync = 2 × (1000 + 1) = 2002 < 4000 → A joins: one cluster.
        let job = chain_job(
            &[(100_000, true), (50_000, false), (50_000, false)],
            2,
            ring(),
            2,
        );
        let cx = evaluate(job).unwrap();
        let p = OpFusion.propose(&cx, &knobs(&[])).unwrap();
        assert_eq!(merged(&p), vec![vec![0, 3, 4]]);
        assert_eq!(
            p[0].edits[0],
            Edit::Merge {
                ops: vec![0, 3, 4],
                dur_ns: 200_000 - 2 * l
            }
        );
    }

    #[test]
    fn legality_refuses_a_path_through_another_op_or_a_sync() {
        // a → x → b and a → b, all on the GPU; x is an UPDATE (not fusible): merging a and b
        // would make a cycle through x.
        let mut job = chain_job(
            &[(10_000, false), (10_000, false), (10_000, false)],
            0,
            ring(),
            2,
        );
        job.local_mut().ops[1].spec.phase = Phase::Update;
        job.local_mut().edges.push((0, 2));
        let mut f = Fuser::new(&job).unwrap();
        assert!(!f.legal(&[0, 2]));
        assert!(f.legal(&[0, 1]));
        let cx = evaluate(job.clone()).unwrap();
        assert!(
            OpFusion
                .propose(&cx, &knobs(&[("scope", "all")]))
                .unwrap()
                .is_empty()
        );
        // Across a sync: A → Out → sync → In → C; merging A and C is a cycle.
        let mut job = chain_job(
            &[(10_000, true), (10_000, false), (10_000, false)],
            8,
            ring(),
            2,
        );
        job.local_mut().edges.push((2, 4)); // In(A's grad) → C
        let mut f = Fuser::new(&job).unwrap();
        assert!(!f.legal(&[0, 4]));
        assert!(f.legal(&[0, 3]));
        // … and through the NCCL order: sync 1's In waits for sync 0's Out.
        let mut job = chain_job(
            &[(10_000, true), (10_000, true), (10_000, false)],
            8,
            ring(),
            2,
        );
        // ops: A=0 Out0=1 In0=2 B=3 Out1=4 In1=5 C=6; make C wait for In1 and drop B → C.
        job.local_mut().edges.retain(|&e| e != (3, 6));
        job.local_mut().edges.push((5, 6));
        let mut f = Fuser::new(&job).unwrap();
        assert!(!f.legal(&[0, 6]), "A → Out0 → sync0 → sync1 → In1 → C");
        assert!(f.legal(&[0, 3]));
    }

    #[test]
    fn earlier_clusters_count_as_merged() {
        // Two chains on two GPU streams with cross edges a1 → b2 and b1 → a2 … merging {a1, a2}
        // is legal alone (b1 does not depend on a1), and so is {b1, b2}; together they form a
        // cycle a → b → a, which the second check must see.
        let mut job = chain_job(&[(10_000, false), (10_000, false)], 0, ring(), 2);
        job.local_mut().devices.push(DeviceKind::GpuStream {
            worker: 0,
            stream: 1,
        });
        for d in [10_000, 10_000] {
            job.local_mut().ops.push(LocalOp {
                spec: OpSpec::compute(2, Phase::Bw, 0, d),
                work: None,
            });
        }
        // a1 = 0, a2 = 1 (edge 0 → 1); b1 = 2, b2 = 3.
        job.local_mut().edges.extend([(2, 3), (0, 3), (2, 1)]);
        let mut f = Fuser::new(&job).unwrap();
        assert!(f.legal(&[0, 1]));
        assert!(f.legal(&[2, 3]));
        f.commit(vec![0, 1]);
        // a2's cluster contains a1 → b2; b1 → a2: {b1, b2} now closes a cycle.
        assert!(!f.legal(&[2, 3]));
        let cx = evaluate(job.clone()).unwrap();
        let p = OpFusion.propose(&cx, &knobs(&[("scope", "all")])).unwrap();
        assert_eq!(merged(&p), vec![vec![0, 1]]);
        assert!(apply_all(&job, &p).is_ok());
    }

    #[test]
    fn scope_all_respects_max_ops() {
        let job = chain_job(&[(10_000, false); 5], 0, ring(), 2);
        let cx = evaluate(job.clone()).unwrap();
        let p = OpFusion
            .propose(&cx, &knobs(&[("scope", "all"), ("max_ops", "2")]))
            .unwrap();
        assert_eq!(merged(&p), vec![vec![0, 1], vec![2, 3]]);
        let after = evaluate(apply_all(&job, &p).unwrap()).unwrap();
        // 5 × 10 µs − 2 launches.
        assert_eq!(after.iteration_ns(), 50_000 - 2 * 4000);
        assert!(resolve_knobs(&OpFusion, &[("max_ops".into(), "1".into())]).is_err());
    }

    #[test]
    fn coarsened_units_on_a_hand_built_chain() {
        // BW chain X0 → X1 → A(grad) → X2 → B(grad) → X3, 50 µs each, 4000 B gradients on a
        // 4-worker ring (t_sync = 12,000 ns ≥ one 4 µs launch). Op ids: X0 = 0, X1 = 1, A = 2
        // (Out 3, In 4), X2 = 5, B = 6 (Out 7, In 8), X3 = 9.
        let job = chain_job(
            &[
                (50_000, false),
                (50_000, false),
                (50_000, true),
                (50_000, false),
                (50_000, true),
                (50_000, false),
            ],
            4000,
            ring(),
            4,
        );
        let f = Fuser::new(&job).unwrap();
        let (units, unit_of) = f.units(8);
        // Tensor-less ops join the next tensor-producing op; X3 is alone (no unit).
        assert_eq!(units, vec![vec![0, 1, 2], vec![5, 6]]);
        assert_eq!(unit_of[9], NONE);
        // max_ops = 2 cuts the first run before A: [X0, X1], A alone.
        assert_eq!(
            Fuser::new(&job).unwrap().units(2).0,
            vec![vec![0, 1], vec![5, 6]]
        );
        // Both views reach the same clusters here (Theorem 1: q^d = 0 < 4000 ns inside a
        // unit; 12,000 ns ≥ 4000 ns after A and after B), the coarsened one in two steps.
        let cx = evaluate(job.clone()).unwrap();
        assert_eq!(cx.iteration_ns(), 300_000);
        let fine = OpFusion.propose(&cx, &knobs(&[("coarsen", "0")])).unwrap();
        let coarse = OpFusion.propose(&cx, &knobs(&[])).unwrap();
        assert_eq!(merged(&fine), vec![vec![0, 1, 2], vec![5, 6]]);
        assert_eq!(merged(&coarse), merged(&fine));
        assert!(
            coarse[0].why.starts_with("coarsened view"),
            "{}",
            coarse[0].why
        );
        assert!(fine[0].why.starts_with("Theorem 1"), "{}", fine[0].why);
        // 300 µs − 3 launches of 4 µs.
        let after = evaluate(apply_all(&job, &coarse).unwrap()).unwrap();
        assert_eq!(after.iteration_ns(), 288_000);
        for (k, v) in [("coarsen", "2"), ("twins", "-1")] {
            assert!(resolve_knobs(&OpFusion, &[(k.into(), v.into())]).is_err());
        }
    }

    #[test]
    fn block_names_split_at_the_first_index() {
        assert_eq!(
            block_of("bert.encoder.layer.3.output.dense BW"),
            Some(("bert.encoder.layer.", 3, ".output.dense BW"))
        );
        assert_eq!(
            block_of("layer2.1.conv1 FW"),
            Some(("layer2.", 1, ".conv1 FW"))
        );
        assert_eq!(
            block_of("layer2.0.downsample.1 FW"),
            Some(("layer2.", 0, ".downsample.1 FW"))
        );
        assert_eq!(block_of("features.0 FW"), None);
        assert_eq!(block_of("12.fc FW"), None);
        assert_eq!(block_of("bert.embeddings.word_embeddings FW"), None);
    }

    /// With recomputation a dropped layer's forward runs twice (the original and the re-run,
    /// same names): a twin is the op of the same occurrence in the other block, so a fusion of
    /// checkpointed or re-run forward ops still repeats in every block. (Keyed by names alone,
    /// the twins of a checkpoint layer's ops were the other layers' re-runs and none applied:
    /// `plan --model llama3-70b --cluster 512xh100-ib` took 157 rounds of one layer each.)
    #[test]
    fn twins_survive_recomputation() {
        let base = evaluate(bert_base_symmetric()).unwrap();
        let reg = super::super::registry();
        let rc = super::super::find(&reg, "recompute").unwrap();
        let k = super::super::resolve_knobs(rc, &[]).unwrap();
        let patches = super::super::propose(rc, &base, &k).unwrap();
        let rec = evaluate(apply_all(&base.job, &patches).unwrap()).unwrap();
        let twin = OpFusion.propose(&rec, &knobs(&[])).unwrap();
        let widest = twin.iter().map(merges).max().unwrap();
        eprintln!(
            "bert-base + recompute: {} moves, widest {widest}",
            twin.len()
        );
        assert_eq!(widest, 12, "a fusion repeated in all 12 encoder layers");
    }

    /// With gradient accumulation every micro-step runs the same ops again (same names, the
    /// next occurrence): a fusion repeats in every block of every micro-step in one move.
    #[test]
    fn twins_span_the_micro_steps_of_accumulation() {
        let base = evaluate(bert_base_symmetric()).unwrap();
        let reg = super::super::registry();
        let ga = super::super::find(&reg, "grad-accumulation").unwrap();
        let k = super::super::resolve_knobs(ga, &[("k".into(), "2".into())]).unwrap();
        let patches = super::super::propose(ga, &base, &k).unwrap();
        let acc = evaluate(apply_all(&base.job, &patches).unwrap()).unwrap();
        let twin = OpFusion.propose(&acc, &knobs(&[])).unwrap();
        let widest = twin.iter().map(merges).max().unwrap();
        assert_eq!(widest, 24, "12 encoder layers x 2 micro-steps");
        // Fewer moves than one per micro-step of each fusion (measured: 16 moves with k = 2,
        // 12 without accumulation; the walk's clusters near the micro-steps' ends differ).
        let one = OpFusion.propose(&base, &knobs(&[])).unwrap();
        assert!(
            twin.len() < 2 * one.len(),
            "{} moves with k = 2, {} without",
            twin.len(),
            one.len()
        );
    }

    /// BERT-base on dPRO's 16 V100s, symmetric form.
    fn bert_base_symmetric() -> Job {
        let model = crate::zoo::model("bert-base", &Default::default()).unwrap();
        let cluster = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        let mut job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
        job.symmetric = true;
        job
    }

    /// Clusters a patch merges.
    fn merges(p: &Patch) -> usize {
        p.edits
            .iter()
            .filter(|e| matches!(e, Edit::Merge { .. }))
            .count()
    }

    #[test]
    fn zoo_bert_base_twins_fuse_every_block_in_one_move() {
        let sym = bert_base_symmetric();
        let base = evaluate(sym.clone()).unwrap();
        let solo = OpFusion.propose(&base, &knobs(&[("twins", "0")])).unwrap();
        let twin = OpFusion.propose(&base, &knobs(&[])).unwrap();
        let widest = twin.iter().map(merges).max().unwrap();
        eprintln!(
            "bert-base: {} patches without twins, {} with; widest patch merges {} clusters",
            solo.len(),
            twin.len(),
            widest
        );
        assert!(solo.iter().all(|p| merges(p) == 1));
        // 12 encoder layers: a fusion inside one block is repeated in the 11 others.
        assert_eq!(widest, 12);
        // Measured: 88 single-cluster patches become 13 moves (the walk's clusters repeat
        // block by block; twins the walk already chose are absorbed; 89 and 12 before Volta's
        // GEMM rates came from DeepBench's kernels). Before clusters were kept inside one
        // block (`within=auto` on PyTorch), 84 became 16: some clusters spanned two blocks and
        // repeated with a period of two.
        assert_eq!((solo.len(), twin.len()), (88, 13));
        // A move with twins gains what its first cluster alone gains, once per block, when
        // the cluster is a coarsened unit on the compute-bound forward path. (The first moves
        // are Theorem-1 chains whose single cluster moves the critical path: measured, the
        // first alone is 75 µs slower and its twelve 2.97 ms faster.)
        let i = twin
            .iter()
            .position(|p| merges(p) == 12 && p.why.starts_with("coarsened view"))
            .unwrap();
        let first = Patch {
            edits: twin[i].edits[..2].to_vec(),
            ..twin[i].clone()
        };
        let one = evaluate(apply_all(&sym, &[first]).unwrap()).unwrap();
        let all = evaluate(apply_all(&sym, &[twin[i].clone()]).unwrap()).unwrap();
        let (g1, g12) = (
            base.iteration_ns() as i64 - one.iteration_ns() as i64,
            base.iteration_ns() as i64 - all.iteration_ns() as i64,
        );
        eprintln!("gain of one cluster {g1} ns, with its twins {g12} ns");
        // Twelve identical blocks on a compute-bound forward path: exactly 12 times.
        assert!(g1 > 0, "{g1}");
        assert_eq!(g12, 12 * g1);
    }

    #[test]
    fn zoo_resnet50_all_fuses_and_gets_faster() {
        let model = crate::zoo::model("resnet50", &Default::default()).unwrap();
        let cluster = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        let job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
        let base = evaluate(job.clone()).unwrap();
        let p = OpFusion
            .propose(&base, &knobs(&[("scope", "all")]))
            .unwrap();
        assert!(p.len() > 20, "{}", p.len());
        for patch in &p {
            if let Edit::Merge { ops, .. } = &patch.edits[0] {
                assert!(ops.len() <= 8);
                assert!(ops.iter().all(|&o| fusible(&job, o)));
            }
        }
        let after = evaluate(apply_all(&job, &p).unwrap()).unwrap();
        assert!(after.iteration_ns() < base.iteration_ns());
        // The critical scope never makes it slower on this model either.
        let p = OpFusion.propose(&base, &knobs(&[])).unwrap();
        let crit = evaluate(apply_all(&job, &p).unwrap()).unwrap();
        assert!(crit.iteration_ns() <= base.iteration_ns());
    }

    /// Issue 27: the PyTorch export compiles one module block per region, so on a PyTorch zoo
    /// job (`within=auto`) no cluster crosses two blocks; `within=any` (and JAX's auto) does
    /// cross ResNet-50's residual blocks, and a bad value is a knob error.
    #[test]
    fn clusters_stay_inside_a_module_block_where_the_export_compiles_blocks() {
        let model = crate::zoo::model("resnet50", &Default::default()).unwrap();
        let cluster = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        let mut job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
        let crossing = |job: &Job, within: &str| {
            let base = evaluate(job.clone()).unwrap();
            let p = OpFusion
                .propose(&base, &knobs(&[("scope", "all"), ("within", within)]))
                .unwrap();
            assert!(p.len() > 20, "{within}: {}", p.len());
            merged(&p)
                .iter()
                .filter(|ops| {
                    let blocks: BTreeSet<String> = ops
                        .iter()
                        .map(|&o| {
                            module_block(
                                &job.local.layers[job.local.ops[o as usize].spec.layer as usize],
                            )
                        })
                        .collect();
                    blocks.len() > 1
                })
                .count()
        };
        assert_eq!(job.framework, Framework::Pytorch);
        assert_eq!(crossing(&job, "auto"), 0);
        assert_eq!(crossing(&job, "block"), 0);
        let any = crossing(&job, "any");
        assert!(any > 0, "{any}");
        job.framework = Framework::Jax;
        assert_eq!(crossing(&job, "auto"), any);
        let base = evaluate(job).unwrap();
        let bad = OpFusion.propose(&base, &knobs(&[("within", "layer")]));
        assert!(matches!(bad, Err(PassError::BadKnob { .. })), "{bad:?}");
    }
}

/// Numerical check of Theorems 1 and 3 against full replay on random chains (proptest).
#[cfg(test)]
mod theorem_checks {
    use super::*;
    use crate::cost::config::SyncScheme;
    use crate::passes::tensor_fusion::TensorFusion;
    use crate::passes::testkit::chain_job_sizes;
    use crate::passes::{apply_all, evaluate, resolve_knobs};
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    /// Random backward chains: 2–6 ops of 1–100 µs, each with a gradient of 1 B – 200 kB or
    /// none, on 2–4 workers (ring, α = 1 µs, 1 B/ns).
    fn chains() -> impl Strategy<Value = (Vec<(u64, Option<u64>)>, u32)> {
        (
            prop::collection::vec((1_000u64..100_000, prop::option::of(1u64..200_000)), 2..7),
            2u32..5,
        )
    }

    fn runner() -> TestRunner {
        TestRunner::new_with_rng(
            Config {
                cases: 64,
                ..Config::default()
            },
            TestRng::deterministic_rng(RngAlgorithm::ChaCha),
        )
    }

    fn spec() -> crate::graph::comm::CommSpec {
        crate::passes::testkit::spec(SyncScheme::Ring)
    }

    /// Theorem 1: every fusion it decides never makes the full replay slower.
    #[test]
    fn theorem_1_agrees_with_full_replay() {
        let (mut decided, mut agree) = (0u32, 0u32);
        let mut r = runner();
        let strat = chains();
        for _ in 0..64 {
            let (ops, workers) = strat.new_tree(&mut r).unwrap().current();
            let job = chain_job_sizes(&ops, spec(), workers);
            let cx = evaluate(job.clone()).unwrap();
            let k = resolve_knobs(&OpFusion, &[]).unwrap();
            for p in OpFusion.propose(&cx, &k).unwrap() {
                decided += 1;
                let after = evaluate(apply_all(&job, &[p]).unwrap()).unwrap();
                if after.iteration_ns() <= cx.iteration_ns() {
                    agree += 1;
                }
            }
        }
        eprintln!("Theorem 1: {agree}/{decided} fusions not slower in full replay");
        assert!(decided > 0);
        assert_eq!(agree, decided);
    }

    /// Theorem 3: for two adjacent ops that both produce a gradient, fusing the ops and their
    /// tensors is no slower than either fusion alone.
    #[test]
    fn theorem_3_agrees_with_full_replay() {
        let (mut cases, mut agree) = (0u32, 0u32);
        let mut r = runner();
        let strat = chains();
        for _ in 0..64 {
            let (mut ops, workers) = strat.new_tree(&mut r).unwrap().current();
            ops[0].1.get_or_insert(1000);
            ops[1].1.get_or_insert(1000);
            let job = chain_job_sizes(&ops, spec(), workers);
            // ops: p0 = 0, Out0 = 1, In0 = 2, p1 = 3; syncs 0 and 1.
            let (dur, _) = fused_cost(&job, &[0, 3]);
            let opfs = Patch {
                pass: "t".into(),
                why: String::new(),
                edits: vec![Edit::Merge {
                    ops: vec![0, 3],
                    dur_ns: dur,
                }],
            };
            let tsfs = Patch {
                pass: "t".into(),
                why: String::new(),
                edits: vec![Edit::FuseSyncs { syncs: vec![0, 1] }],
            };
            let t = |p: &[Patch]| {
                evaluate(apply_all(&job, p).unwrap())
                    .unwrap()
                    .iteration_ns()
            };
            let both = t(&[tsfs.clone(), opfs.clone()]);
            cases += 1;
            if both <= t(&[opfs]) && both <= t(&[tsfs]) {
                agree += 1;
            }
        }
        eprintln!("Theorem 3: {agree}/{cases} cases agree with full replay");
        assert_eq!(agree, cases);
    }

    /// Theorem 2 (decisions of `tensor-fusion` on the critical path) against full replay.
    #[test]
    fn theorem_2_agrees_with_full_replay() {
        let (mut decided, mut agree) = (0u32, 0u32);
        let mut r = runner();
        let strat = chains();
        for _ in 0..64 {
            let (ops, workers) = strat.new_tree(&mut r).unwrap().current();
            let job = chain_job_sizes(&ops, spec(), workers);
            let cx = evaluate(job.clone()).unwrap();
            let k = resolve_knobs(&TensorFusion, &[]).unwrap();
            let p = TensorFusion.propose(&cx, &k).unwrap();
            if p.is_empty() {
                continue;
            }
            decided += 1;
            let after = evaluate(apply_all(&job, &p).unwrap()).unwrap();
            if after.iteration_ns() <= cx.iteration_ns() {
                agree += 1;
            }
        }
        eprintln!("Theorem 2: {agree}/{decided} proposals not slower in full replay");
        assert!(decided > 0);
        assert_eq!(agree, decided);
    }
}
