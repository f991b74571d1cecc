//! Several ranks' traces of one step → one global DFG (dPRO §4.1 on recorded traces).
//!
//! **Ranks.** Each file is one rank's Kineto trace; its rank is `distributedInfo.rank` (file order
//! when absent). Every rank's step is built by [`super::graph::build_job`]'s stages; all ranks replay the
//! same `ProfilerStep#N` (by default the last one complete on every rank). Two files claiming the
//! same rank, or disagreeing on the world size, are refused; fewer files than the world size is a
//! warning (the missing ranks' arrivals are unknown, so collectives wait only for the ranks given).
//!
//! **Matching.** A rank's collectives are grouped by the stream their kernels run on (one NCCL
//! communicator = one stream; groups are numbered by first use, so stream ids may differ between
//! ranks) and matched by position: the k-th collective of group g on every rank is one collective.
//! A rank with a different number of collectives in a group, or a k-th kernel of another type
//! (AllReduce against SendRecv), is refused with both files, the group and the kernel's event index.
//!
//! **Semantics.** A collective ends when its last rank arrives: on each rank the kernel's op keeps
//! its local predecessors, and one virtual barrier op per matched collective joins the predecessors
//! of every rank's kernel and precedes every rank's kernel. The kernel's duration becomes the
//! collective's *transfer* time, the shortest recorded duration over the ranks (the rank that
//! arrived last did not wait; every other rank's recorded duration includes waiting for it). This
//! needs no clock: durations are differences on one rank's clock.
//!
//! **Clocks.** Ranks start their step at different times. Rank r's ops are released at
//! `start_r + θ_r − min_j (start_j + θ_j)`, where `start_r` is its step's recorded start on its own
//! clock and `θ_r` its clock offset (see [`super::align`]; zero when the clocks are trusted). The
//! predicted step of rank r is the replayed end of its step-end op minus its release time.

use std::collections::BTreeMap;

use crate::graph::{DeviceKind, Dfg, DfgBuilder, GraphError, NONE, OpId, OpKind, OpSpec, Phase};
use crate::replay::{self, Replay};

use super::collective::collective_type;
use super::graph::{Peers, TraceGraphError, build, steps};
use super::kineto::KinetoTrace;
use super::step::{TraceCollective, TraceJob};

/// Why several rank traces could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum MultiRankError {
    #[error(transparent)]
    Rank(#[from] TraceGraphError),
    #[error("{0}")]
    Mismatch(String),
    #[error("the global graph of the ranks is invalid: {0}")]
    Graph(#[from] GraphError),
}

/// One rank's step, built.
#[derive(Clone, Debug)]
pub struct RankStep {
    pub file: String,
    pub rank: u32,
    /// World size the trace declares, if any.
    pub world: Option<u32>,
    pub built: TraceJob,
    /// Collective groups: the rank's collectives by communicator stream, in issue order.
    pub groups: Vec<Vec<TraceCollective>>,
}

impl RankStep {
    /// Recorded step start on this rank's clock (ns).
    pub fn start_ns(&self) -> i64 {
        self.built.window.start_ns
    }
    /// Measured step duration (ns).
    pub fn measured_ns(&self) -> u64 {
        self.built.window.measured_ns()
    }
}

/// The last step number complete in every trace (`ProfilerStep#N` numbers).
pub fn common_step(traces: &[(String, &KinetoTrace)]) -> Result<u64, MultiRankError> {
    let mut common: Option<std::collections::BTreeSet<u64>> = None;
    for (name, t) in traces {
        let all = steps(t);
        let s: std::collections::BTreeSet<u64> = all
            .iter()
            .filter(|w| w.complete)
            .map(|w| w.number)
            .collect();
        if s.is_empty() {
            return Err(TraceGraphError::NoStep {
                name: name.clone(),
                what: if all.is_empty() {
                    "(no ProfilerStep or Optimizer.step iteration)".into()
                } else {
                    format!("(it has {})", crate::trace::graph::step_list(&all))
                },
            }
            .into());
        }
        common = Some(match common {
            None => s,
            Some(c) => c.intersection(&s).copied().collect(),
        });
    }
    common.and_then(|c| c.last().copied()).ok_or_else(|| {
        MultiRankError::Mismatch(format!(
            "the traces have no complete step in common ({}); give --step N",
            traces
                .iter()
                .map(|(n, t)| format!(
                    "{n}: {}",
                    steps(t)
                        .iter()
                        .filter(|w| w.complete)
                        .map(|w| w.number.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })
}

/// Build every rank's step (the same step on all ranks) and check that the ranks fit together.
pub fn rank_steps(
    traces: &[(String, &KinetoTrace)],
    step: Option<u64>,
) -> Result<(Vec<RankStep>, Vec<String>), MultiRankError> {
    let step = match step {
        Some(s) => s,
        None => common_step(traces)?,
    };
    let mut warnings = Vec::new();
    let mut out: Vec<RankStep> = Vec::with_capacity(traces.len());
    for (i, (name, t)) in traces.iter().enumerate() {
        let built = build(t, name, Some(step), Peers::Present)?;
        let info = t.distributed.as_ref();
        let rank = info
            .and_then(|d| d.rank)
            .map_or(i as u32, |r| r.clamp(0, u32::MAX as i64) as u32);
        let world = info
            .and_then(|d| d.world_size)
            .map(|w| w.clamp(0, u32::MAX as i64) as u32);
        // Group collectives by their stream, groups numbered by first use.
        let mut by_dev: BTreeMap<u32, usize> = BTreeMap::new();
        let mut groups: Vec<Vec<TraceCollective>> = Vec::new();
        let mut colls = built.collectives.clone();
        colls.sort_by_key(|c| (c.start_ns, c.event));
        for c in colls {
            let dev = built.job.local.ops[c.op as usize].spec.device;
            let g = *by_dev.entry(dev).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(c);
        }
        out.push(RankStep {
            file: name.clone(),
            rank,
            world,
            built,
            groups,
        });
    }
    out.sort_by_key(|r| r.rank);
    for w in out.windows(2) {
        if w[0].rank == w[1].rank {
            return Err(MultiRankError::Mismatch(format!(
                "{} and {} are both rank {} (distributedInfo.rank): give each rank's trace once",
                w[0].file, w[1].file, w[0].rank
            )));
        }
    }
    let worlds: Vec<(u32, &str)> = out
        .iter()
        .filter_map(|r| r.world.map(|w| (w, r.file.as_str())))
        .collect();
    if let Some(&(w0, f0)) = worlds.first() {
        if let Some(&(w, f)) = worlds.iter().find(|(w, _)| *w != w0) {
            return Err(MultiRankError::Mismatch(format!(
                "{f0} is from a job of world size {w0} but {f} is from one of world size {w}: \
                 these traces are not from the same run"
            )));
        }
        if (out.len() as u32) < w0 {
            warnings.push(format!(
                "{} of {w0} ranks given: collectives wait only for the ranks given",
                out.len()
            ));
        }
        if let Some(r) = out.iter().find(|r| r.rank >= w0) {
            return Err(MultiRankError::Mismatch(format!(
                "{} is rank {} but the job has world size {w0}",
                r.file, r.rank
            )));
        }
    }
    check_matching(&out)?;
    warnings.extend(gpu_models(&out));
    Ok((out, warnings))
}

/// A warning when the ranks were recorded on different GPU models (`deviceProperties`), with
/// how many ranks ran each and the first rank of each: the job is not homogeneous.
fn gpu_models(ranks: &[RankStep]) -> Option<String> {
    let mut by: BTreeMap<&str, (usize, &RankStep)> = BTreeMap::new();
    for r in ranks {
        let gpu = r
            .built
            .job
            .meta
            .trace
            .as_ref()
            .and_then(|f| f.gpu.as_deref())
            .unwrap_or("an unrecorded GPU");
        by.entry(gpu).or_insert((0, r)).0 += 1;
    }
    if by.len() < 2 {
        return None;
    }
    let list: Vec<String> = by
        .iter()
        .map(|(gpu, (n, r))| format!("{n} on {gpu} (first: rank {}, {})", r.rank, r.file))
        .collect();
    Some(format!(
        "the ranks were recorded on {} different GPU models: {}. Each rank replays its own \
         recorded times and is re-costed on its own GPU, but the job is not homogeneous: a \
         collective runs at the pace of its slowest rank",
        by.len(),
        list.join("; ")
    ))
}

/// Every rank has the same collectives, group by group, position by position: what
/// [`global_graph`] needs (checked at load, and again after passes edit each rank).
pub fn check_matching(ranks: &[RankStep]) -> Result<(), MultiRankError> {
    let Some(first) = ranks.first() else {
        return Ok(());
    };
    for r in &ranks[1..] {
        if r.groups.len() != first.groups.len() {
            return Err(MultiRankError::Mismatch(format!(
                "{} (rank {}) runs collectives on {} stream(s) but {} (rank {}) on {}: \
                 the ranks' process groups do not match",
                r.file,
                r.rank,
                r.groups.len(),
                first.file,
                first.rank,
                first.groups.len()
            )));
        }
        for (g, (a, b)) in first.groups.iter().zip(&r.groups).enumerate() {
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                if collective_type(&x.name) != collective_type(&y.name) {
                    return Err(MultiRankError::Mismatch(format!(
                        "collective #{k} of group {g} differs: {} (rank {}) runs {} (event #{}) \
                         but {} (rank {}) runs {} (event #{})",
                        first.file, first.rank, x.name, x.event, r.file, r.rank, y.name, y.event
                    )));
                }
            }
            if a.len() != b.len() {
                let (long, short) = if a.len() > b.len() {
                    ((first, a), (r, b))
                } else {
                    ((r, b), (first, a))
                };
                let extra = &long.1[short.1.len()];
                return Err(MultiRankError::Mismatch(format!(
                    "{} (rank {}) has {} collectives in group {g} but {} (rank {}) has {}: \
                     collective #{} ({}, event #{}) has no match (a missing collective — \
                     a truncated trace or a step that differs between ranks)",
                    long.0.file,
                    long.0.rank,
                    long.1.len(),
                    short.0.file,
                    short.0.rank,
                    short.1.len(),
                    short.1.len(),
                    extra.name,
                    extra.event
                )));
            }
        }
    }
    Ok(())
}

/// One collective matched across ranks.
#[derive(Clone, Debug)]
pub struct Matched {
    pub group: usize,
    pub index: usize,
    pub name: String,
    /// Global op of each rank's kernel (in the order of the ranks given).
    pub ops: Vec<OpId>,
    /// Transfer time: the shortest recorded duration over the ranks.
    pub transfer_ns: u64,
}

/// The ranks' global graph.
#[derive(Clone, Debug)]
pub struct GlobalTrace {
    pub graph: Dfg,
    /// First global op of each rank (ranks in [`RankStep`] order); its local op `i` is `base + i`.
    pub base: Vec<OpId>,
    /// Global step-end op of each rank.
    pub step_end: Vec<OpId>,
    pub matched: Vec<Matched>,
}

/// Build the global graph of the ranks' steps.
pub fn global_graph(ranks: &[RankStep]) -> Result<GlobalTrace, MultiRankError> {
    check_matching(ranks)?;
    let mut b = DfgBuilder::new();
    let virt = b.add_device(DeviceKind::Virtual);
    let mut layer_ids: BTreeMap<String, u32> = BTreeMap::new();
    let mut base = Vec::with_capacity(ranks.len());
    let mut step_end = Vec::with_capacity(ranks.len());
    let total: usize = ranks.iter().map(|r| r.built.job.local.ops.len()).sum();
    b.reserve(total, total * 2);
    b.set_workers(ranks.len() as u32);
    // Transfer time of each matched collective, and each rank's kernel ops' new durations.
    let groups0 = ranks.first().map_or(&[][..], |r| r.groups.as_slice());
    let transfer: Vec<Vec<u64>> = groups0
        .iter()
        .enumerate()
        .map(|(g, group)| {
            (0..group.len())
                .map(|k| {
                    ranks
                        .iter()
                        .map(|r| r.groups[g][k].dur_ns)
                        .min()
                        .unwrap_or(0)
                })
                .collect()
        })
        .collect();
    let mut preds: Vec<Vec<Vec<OpId>>> = Vec::with_capacity(ranks.len());
    for (w, r) in ranks.iter().enumerate() {
        let mut new_dur: BTreeMap<OpId, u64> = BTreeMap::new();
        for (g, group) in r.groups.iter().enumerate() {
            for (k, c) in group.iter().enumerate() {
                new_dur.insert(c.op, transfer[g][k]);
            }
        }
        let w = w as u32;
        let l = &r.built.job.local;
        let devs: Vec<u32> = b.add_worker_devices(&l.devices, w, virt);
        let layers: Vec<u32> = l
            .layers
            .iter()
            .map(|n| {
                *layer_ids
                    .entry(n.clone())
                    .or_insert_with(|| b.add_layer(n.clone()))
            })
            .collect();
        let first = b.op_count() as OpId;
        base.push(first);
        b.set_static_memory(w, l.static_mem_bytes);
        for (i, op) in l.ops.iter().enumerate() {
            let mut s = op.spec.clone();
            if let Some(&d) = new_dur.get(&(i as OpId)) {
                s.dur_ns = d;
            }
            s.device = devs[s.device as usize];
            if s.layer != NONE {
                s.layer = layers.get(s.layer as usize).copied().unwrap_or(NONE);
            }
            s.tensor = NONE;
            b.add_op(s);
        }
        let mut p = vec![Vec::new(); l.ops.len()];
        for &(a, c) in &l.edges {
            b.add_edge(first + a, first + c);
            p[c as usize].push(first + a);
        }
        preds.push(p);
        step_end.push(first + r.built.step_end);
    }
    let mut matched = Vec::new();
    if let Some(r0) = ranks.first() {
        for (g, group) in r0.groups.iter().enumerate() {
            for (k, c0) in group.iter().enumerate() {
                let ops: Vec<OpId> = ranks
                    .iter()
                    .enumerate()
                    .map(|(w, r)| base[w] + r.groups[g][k].op)
                    .collect();
                let transfer_ns = transfer[g][k];
                let barrier = b.add_op(OpSpec::new(OpKind::In, Phase::Comm, virt, 0));
                for (w, r) in ranks.iter().enumerate() {
                    let local = r.groups[g][k].op;
                    for &p in &preds[w][local as usize] {
                        b.add_edge(p, barrier);
                    }
                    b.add_edge(barrier, ops[w]);
                }
                matched.push(Matched {
                    group: g,
                    index: k,
                    name: c0.name.clone(),
                    ops,
                    transfer_ns,
                });
            }
        }
    }
    Ok(GlobalTrace {
        graph: b.build()?,
        base,
        step_end,
        matched,
    })
}

/// A replay of the global graph with each rank released at its (aligned) step start.
#[derive(Clone, Debug)]
pub struct RankReplay {
    pub replay: Replay,
    /// Release time of each rank (ns after the earliest rank's step start).
    pub release_ns: Vec<u64>,
    /// Predicted step of each rank (ns).
    pub predicted_ns: Vec<u64>,
}

/// Replay `g` with rank r released at `start_r + offset_r` (offsets in ns on top of each rank's
/// own clock; all zero to trust the recorded clocks).
pub fn replay_ranks(ranks: &[RankStep], g: &GlobalTrace, offsets_ns: &[i64]) -> RankReplay {
    let starts: Vec<i64> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| r.start_ns() + offsets_ns.get(i).copied().unwrap_or(0))
        .collect();
    let t0 = starts.iter().copied().min().unwrap_or(0);
    let release_ns: Vec<u64> = starts.iter().map(|&s| (s - t0) as u64).collect();
    let n = g.graph.op_count();
    let mut release = vec![0u64; n];
    for (w, &first) in g.base.iter().enumerate() {
        let end = g.base.get(w + 1).copied().unwrap_or(n as OpId);
        for r in &mut release[first as usize..end as usize] {
            *r = release_ns[w];
        }
    }
    // Barrier ops (after the last rank's ops) need no release.
    if let Some(&last) = g.base.last() {
        let l = ranks.last().map_or(0, |r| r.built.job.local.ops.len());
        for r in &mut release[last as usize + l..] {
            *r = 0;
        }
    }
    let replay = replay::replay_with_release(&g.graph, &release);
    let predicted_ns = g
        .step_end
        .iter()
        .zip(&release_ns)
        .map(|(&op, &rel)| replay.end_ns[op as usize].saturating_sub(rel))
        .collect();
    RankReplay {
        replay,
        release_ns,
        predicted_ns,
    }
}

/// `r` with its job replaced by `job`, an edit of it (passes keep collectives, devices and
/// their order, but move op ids): the collectives are found again on their streams in order, the
/// step end by its marker.
pub fn with_job(r: &RankStep, job: crate::graph::job::Job) -> Result<RankStep, MultiRankError> {
    let old = &r.built.job.local;
    let l = &job.local;
    let mut on_dev: BTreeMap<u32, Vec<OpId>> = BTreeMap::new();
    for (i, o) in l.ops.iter().enumerate() {
        if o.spec.kind == OpKind::Collective {
            on_dev.entry(o.spec.device).or_default().push(i as OpId);
        }
    }
    // Collectives an edit removed on purpose (the same positions on every rank, or the ranks
    // no longer match): skipped in the recorded order.
    let removed: std::collections::BTreeSet<(u32, u32)> = job
        .meta
        .trace
        .as_ref()
        .map(|f| f.removed_collectives.iter().copied().collect())
        .unwrap_or_default();
    let mut groups = Vec::with_capacity(r.groups.len());
    let mut kept_old: Vec<&TraceCollective> = Vec::new();
    for g in &r.groups {
        let dev = g
            .first()
            .map(|c| old.ops[c.op as usize].spec.device)
            .unwrap_or(0);
        let kept: Vec<&TraceCollective> = g
            .iter()
            .enumerate()
            .filter(|(k, _)| !removed.contains(&(dev, *k as u32)))
            .map(|(_, c)| c)
            .collect();
        let ops = on_dev.get(&dev).map_or(&[][..], Vec::as_slice);
        if ops.len() != kept.len() {
            return Err(MultiRankError::Mismatch(format!(
                "{} (rank {}): the edit changed the collectives of a stream ({} → {}); passes \
                 must keep every recorded collective they do not remove on purpose",
                r.file,
                r.rank,
                kept.len(),
                ops.len()
            )));
        }
        groups.push(
            kept.iter()
                .zip(ops)
                .map(|(c, &op)| TraceCollective { op, ..(*c).clone() })
                .collect::<Vec<_>>(),
        );
        kept_old.extend(kept);
    }
    let end_layer = l
        .layers
        .iter()
        .position(|n| n == crate::graph::job::STEP_END_LAYER)
        .map(|p| p as u32);
    let step_end = l
        .ops
        .iter()
        .position(|o| o.spec.kind == OpKind::Gap && Some(o.spec.layer) == end_layer)
        .ok_or_else(|| {
            MultiRankError::Mismatch(format!("{}: the edit removed the step's end", r.file))
        })? as OpId;
    let mut built = r.built.clone();
    built.job = job;
    built.step_end = step_end;
    let moved: BTreeMap<OpId, OpId> = kept_old
        .iter()
        .zip(groups.iter().flatten())
        .map(|(a, b): (&&TraceCollective, &TraceCollective)| (a.op, b.op))
        .collect();
    let grouped: std::collections::BTreeSet<OpId> =
        r.groups.iter().flatten().map(|c| c.op).collect();
    built
        .collectives
        .retain(|c| !grouped.contains(&c.op) || moved.contains_key(&c.op));
    for c in built.collectives.iter_mut() {
        if let Some(&n) = moved.get(&c.op) {
            c.op = n;
        }
    }
    Ok(RankStep {
        built,
        groups,
        ..r.clone()
    })
}

/// The ranks' steps replayed together: each rank's predicted step, the slowest, and the
/// makespan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RanksPrediction {
    pub predicted_ns: Vec<u64>,
    /// The slowest rank's step: the job's step (collectives hold every rank to it).
    pub step_ns: u64,
    pub makespan_ns: u64,
}

/// Build and replay the ranks' global graph with clock offsets `offsets_ns`.
pub fn predict(ranks: &[RankStep], offsets_ns: &[i64]) -> Result<RanksPrediction, MultiRankError> {
    let g = global_graph(ranks)?;
    let rr = replay_ranks(ranks, &g, offsets_ns);
    Ok(RanksPrediction {
        step_ns: rr.predicted_ns.iter().copied().max().unwrap_or(0),
        makespan_ns: rr.replay.iteration_ns,
        predicted_ns: rr.predicted_ns,
    })
}

/// Per-collective recorded (start, end) of every rank on its own clock, for [`super::align`]:
/// `result[rank][k]` over all groups' collectives in group order.
pub fn collective_times(ranks: &[RankStep]) -> Vec<Vec<(i64, i64)>> {
    ranks
        .iter()
        .map(|r| {
            r.groups
                .iter()
                .flatten()
                .map(|c| (c.start_ns, c.start_ns + c.dur_ns as i64))
                .collect()
        })
        .collect()
}
