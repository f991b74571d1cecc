//! The pass registry: one file per optimization pass, listed in [`registry`] in sorted order.
//!
//! A pass is a rule (egg-style): a name, a one-line doc, its knobs with defaults, and
//! [`Pass::propose`], which looks at the job, its replay and its critical path and returns
//! [`Patch`]es — data, never a mutated graph, never IO. The driver ([`apply`]) applies a patch to a
//! copy of the job through the what-if primitives of [`Editor`], checks the result (acyclic, not
//! empty) and hands back a new job; the original is untouched, so undo is dropping the copy.
//!
//! A patch's op ids are the job's ids before the patch; ops it inserts get the ids that follow
//! (`local.ops.len()`, `+1`, … in insertion order, a launch right after its GPU task).

pub mod amp;
pub mod context_parallel;
pub mod cuda_graphs;
pub mod declarative;
mod fsdp_prefetch;
mod fsdp_trace;
pub mod grad_accumulation;
pub mod op_fusion;
pub mod pipeline;
mod rebucket;
pub mod recompute;
pub mod shard;
mod sync_time;
pub mod tensor_fusion;
pub mod tensor_parallel;
pub mod tensor_partition;
#[cfg(test)]
pub(crate) mod testkit;

use std::collections::BTreeMap;

use crate::cost::config::Dtype;
use crate::graph::job::{Editor, Job, JobError, OpWork};
use crate::graph::{Dfg, MemEffect, NONE, OpId, OpSpec};
use crate::replay::{self, CriticalPath, MemoryReport, Replay};

/// A knob's type and range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KnobKind {
    Int {
        min: i64,
        max: i64,
    },
    Float {
        min: f64,
        max: f64,
    },
    /// Free text (a name pattern, a list).
    Text,
}

/// One knob of a pass: `--pass NAME:knob=value`.
#[derive(Clone, Debug, PartialEq)]
pub struct KnobSpec {
    pub name: String,
    pub doc: String,
    /// Default, as it would be written on the command line.
    pub default: String,
    pub kind: KnobKind,
}

impl KnobSpec {
    pub fn int(name: &str, doc: &str, default: i64, min: i64, max: i64) -> Self {
        KnobSpec {
            name: name.into(),
            doc: doc.into(),
            default: default.to_string(),
            kind: KnobKind::Int { min, max },
        }
    }
    pub fn float(name: &str, doc: &str, default: f64, min: f64, max: f64) -> Self {
        KnobSpec {
            name: name.into(),
            doc: doc.into(),
            default: default.to_string(),
            kind: KnobKind::Float { min, max },
        }
    }
    pub fn text(name: &str, doc: &str, default: &str) -> Self {
        KnobSpec {
            name: name.into(),
            doc: doc.into(),
            default: default.into(),
            kind: KnobKind::Text,
        }
    }
}

/// A knob's value.
#[derive(Clone, Debug, PartialEq)]
pub enum KnobValue {
    Int(i64),
    Float(f64),
    Text(String),
}

/// Knob values of one pass application, defaults filled in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Knobs(pub BTreeMap<String, KnobValue>);

impl Knobs {
    /// An integer knob (panics if the pass asks for a knob it did not declare: a bug).
    pub fn int(&self, name: &str) -> i64 {
        match self.0.get(name) {
            Some(KnobValue::Int(v)) => *v,
            other => panic!("pass asked for undeclared int knob {name}: {other:?}"),
        }
    }
    pub fn float(&self, name: &str) -> f64 {
        match self.0.get(name) {
            Some(KnobValue::Float(v)) => *v,
            Some(KnobValue::Int(v)) => *v as f64,
            other => panic!("pass asked for undeclared float knob {name}: {other:?}"),
        }
    }
    pub fn text(&self, name: &str) -> &str {
        match self.0.get(name) {
            Some(KnobValue::Text(v)) => v,
            other => panic!("pass asked for undeclared text knob {name}: {other:?}"),
        }
    }
}

/// Errors of the pass layer. User-facing ones (unknown names, bad knob values, bad pass files,
/// edits that would break the graph) are bad input (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("unknown pass `{name}`; known passes: {known}")]
    UnknownPass { name: String, known: String },
    #[error("pass {pass} has no knob `{knob}`; its knobs: {known}")]
    UnknownKnob {
        pass: String,
        knob: String,
        known: String,
    },
    #[error("pass {pass}: knob {knob} = {value}: {why}")]
    BadKnob {
        pass: String,
        knob: String,
        value: String,
        why: String,
    },
    #[error("pass {pass}: {source}")]
    Edit {
        pass: String,
        #[source]
        source: JobError,
    },
    #[error("pass {pass}: {why}")]
    NotApplicable { pass: String, why: String },
    #[error("{0}")]
    File(String),
    /// A bug, not bad input: a pass was shown a lean evaluation (its graph and replay dropped,
    /// see `search::LEAN_OPS`). Every caller goes through [`propose`], which refuses one.
    #[error("internal error: pass {pass} was shown an evaluation without its graph and replay")]
    Lean { pass: String },
}

/// One edit of a patch. Op ids as described in the module docs; sync indices into `job.syncs`.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    /// Multiply durations.
    Scale {
        ops: Vec<OpId>,
        factor: f64,
    },
    SetDuration {
        op: OpId,
        dur_ns: u64,
    },
    /// Drop the idle time recorded after ops (a host whose Python work went away).
    ClearGaps {
        ops: Vec<OpId>,
    },
    /// Also set what the op computes (after a re-costing).
    SetWork {
        op: OpId,
        work: Option<OpWork>,
    },
    /// Remove ops, keeping the order they imposed (preds → succs).
    Remove {
        ops: Vec<OpId>,
    },
    /// Insert an op; `launch_ns` adds its CPU launch (Daydream: a GPU task brings its launch).
    Insert {
        spec: OpSpec,
        work: Option<OpWork>,
        after: Vec<OpId>,
        before: Vec<OpId>,
        launch_ns: Option<u64>,
    },
    /// Merge ops into the first, which takes `dur_ns`.
    Merge {
        ops: Vec<OpId>,
        dur_ns: u64,
    },
    AddEdge {
        from: OpId,
        to: OpId,
    },
    /// `to` no longer waits for `from` (a wait that belonged to a call a rewrite removed).
    DropEdge {
        from: OpId,
        to: OpId,
    },
    Priority {
        ops: Vec<OpId>,
        priority: i32,
    },
    /// Replace the memory effects of `op` with `effects` (ops named inside must exist).
    SetMem {
        op: OpId,
        effects: Vec<MemEffect>,
    },
    StaticMemory {
        bytes: u64,
    },
    /// Fuse these syncs into one (placed where the last of them was; tensors in order).
    FuseSyncs {
        syncs: Vec<usize>,
    },
    /// Cut a sync into `k` pieces.
    PartitionSync {
        sync: usize,
        k: u32,
    },
    /// Multiply the bytes a sync moves (compression, AMP gradients).
    ScaleSyncBytes {
        syncs: Vec<usize>,
        factor: f64,
    },
    /// Change the dtype the job is costed in (AMP).
    Dtype(Dtype),
    /// Change how the job's math is costed (AMP's pure-half style: the FP32 operator classes
    /// in half).
    Math(crate::cost::framework::Math),
    /// Replace the whole job: for rewrites no local primitive expresses (gradient accumulation
    /// replicates the forward and backward k times).
    ReplaceJob(Box<Job>),
}

/// What a pass proposes at one site: edits plus the reason, for the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Patch {
    pub pass: String,
    /// Why: which theorem or cost model said yes, at which site.
    pub why: String,
    pub edits: Vec<Edit>,
}

/// A job with its global graph, replay, critical path and memory: what a pass looks at.
#[derive(Clone, Debug)]
pub struct Evaluated {
    pub job: Job,
    pub graph: Dfg,
    pub replay: Replay,
    pub critical: CriticalPath,
    pub memory: MemoryReport,
    /// Local op ids (the worker template) whose copies lie on the critical path, in path order,
    /// without repeats.
    pub critical_local: Vec<OpId>,
    /// Syncs with communication ops on the critical path, in path order, without repeats.
    pub critical_syncs: Vec<usize>,
    /// A recorded step's steady state (`None` for zoo jobs): see [`crate::replay::steady`].
    pub steady: Option<replay::steady::Steady>,
}

impl Evaluated {
    /// Whether the graph, replay and critical path were dropped once scored (a real
    /// evaluation always has ops; see `search::lean_from`).
    pub fn is_lean(&self) -> bool {
        self.graph.op_count() == 0
    }
}

impl Evaluated {
    /// The iteration time passes and the search compare: a recorded step's steady-state
    /// period (the step-to-step time a training loop sees), else the replay's latest end.
    pub fn iteration_ns(&self) -> u64 {
        match self.steady {
            Some(s) => s.period_ns,
            None => self.replay.iteration_ns,
        }
    }

    /// The replay's latest end: one step from its start until its last work (GPU work launched
    /// in it included) drains.
    pub fn makespan_ns(&self) -> u64 {
        self.replay.iteration_ns
    }
}

/// Expand, replay and analyse a job.
pub fn evaluate(job: Job) -> Result<Evaluated, JobError> {
    crate::graph::bounds::check(&job).map_err(JobError::Invalid)?;
    // A large evaluation is checked against the memory ceiling first: the search skips a
    // candidate that would not fit, a command says what it would need (exit 3).
    let ops = crate::graph::bounds::expanded_ops(&job);
    let need = ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP);
    if need >= 64 << 20 {
        // The full graph of a ring job has a symmetric form a user can ask for (plan uses it).
        let hint = if !job.symmetric
            && job.workers > 1
            && job.comm.scheme == crate::cost::config::SyncScheme::Ring
        {
            format!(
                " (all {} workers; --symmetric replays one and the quotient ring)",
                job.workers
            )
        } else {
            String::new()
        };
        crate::limits::check(|| format!("evaluating a graph of {ops} ops{hint}"), need)
            .map_err(|e| JobError::Invalid(e.to_string()))?;
    }
    let (graph, local_of) = match &job.meta.pipeline {
        Some(p) => {
            let e = crate::graph::pipeline::expand(&job, p)?;
            (e.graph, Some(e.local_of))
        }
        None => (job.expand()?, None),
    };
    let replay = replay::replay(&graph);
    crate::graph::bounds::check_replayed(replay.iteration_ns).map_err(JobError::Invalid)?;
    let critical = replay::critical_path(&graph, &replay);
    let memory = replay::peak_memory(&graph, &replay).with_peaks(
        &graph,
        &replay,
        &job.memory,
        job.communicators(),
        job.gpu.memory_bytes(),
    );
    let per = job.local.ops.len() as u32;
    let local_total = per * job.graph_workers();
    let mut sync_of_tensor = vec![usize::MAX; job.local.tensors.len()];
    for (i, s) in job.syncs.iter().enumerate() {
        for &t in &s.tensors {
            sync_of_tensor[t as usize] = i;
        }
    }
    let mut seen_op = vec![false; per as usize];
    let mut seen_sync = vec![false; job.syncs.len()];
    let (mut critical_local, mut critical_syncs) = (Vec::new(), Vec::new());
    for &op in &critical.ops {
        let local = match &local_of {
            Some(map) => map[op as usize],
            None if op < local_total => op % per,
            None => NONE,
        };
        if local != NONE {
            let l = local;
            if !std::mem::replace(&mut seen_op[l as usize], true) {
                critical_local.push(l);
            }
        } else if graph.kind(op).is_comm() && graph.tensor(op) != NONE {
            let s = sync_of_tensor[graph.tensor(op) as usize];
            if s != usize::MAX && !std::mem::replace(&mut seen_sync[s], true) {
                critical_syncs.push(s);
            }
        }
    }
    let steady = if job.is_recorded() {
        replay::steady::steady(&job)
    } else {
        None
    };
    Ok(Evaluated {
        job,
        graph,
        replay,
        critical,
        memory,
        critical_local,
        critical_syncs,
        steady,
    })
}

/// A rule that proposes patches. See the module docs.
pub trait Pass: Send + Sync {
    /// Registry name (`op-fusion`).
    fn name(&self) -> &str;
    /// One line for `trainplan passes`.
    fn doc(&self) -> &str;
    /// Knobs with defaults; none by default.
    fn knobs(&self) -> Vec<KnobSpec> {
        Vec::new()
    }
    /// Patches at candidate sites of `cx` (empty when the pass has nothing to do). `whatif`
    /// applies all of them at once, so they must not conflict with each other.
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError>;
    /// True when each proposed patch is an independent site the search may take alone (fusion,
    /// partition); false when the proposals only make sense together (AMP, recomputation):
    /// the search then treats the pass as one on/off move. Default false.
    fn granular(&self) -> bool {
        false
    }
}

/// Ask `pass` for its patches on `cx`: the one way the search, the baselines and the commands
/// call [`Pass::propose`]. A pass reads the replay and the critical path of the graph it is
/// shown; an evaluation made lean (`search::lean_from`) has neither, so it is refused here
/// with [`PassError::Lean`] instead of letting a pass index an empty replay (issue 20: the
/// advice step showed `tensor-fusion` the lean final evaluation of every job above
/// `search::LEAN_OPS` ops, and the search panicked).
pub fn propose(pass: &dyn Pass, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
    if cx.is_lean() {
        return Err(PassError::Lean {
            pass: pass.name().to_string(),
        });
    }
    if let Some(p) = cx.job.meta.pipeline {
        // Passes read the replay by the template's op ids; a pipelined job's graph is its
        // stages and micro-steps (`graph::pipeline`).
        return Err(PassError::NotApplicable {
            pass: pass.name().to_string(),
            why: format!(
                "the job is already pipelined ({} stages): apply {} before pipeline",
                p.stages,
                pass.name()
            ),
        });
    }
    pass.propose(cx, knobs)
}

/// Every built-in pass, sorted by name.
pub fn registry() -> Vec<Box<dyn Pass>> {
    let mut v: Vec<Box<dyn Pass>> = vec![
        Box::new(amp::Amp),
        Box::new(context_parallel::ContextParallel),
        Box::new(cuda_graphs::CudaGraphs),
        Box::new(grad_accumulation::GradAccumulation),
        Box::new(op_fusion::OpFusion),
        Box::new(pipeline::Pipeline),
        Box::new(recompute::Recompute),
        Box::new(shard::Shard),
        Box::new(tensor_fusion::TensorFusion),
        Box::new(tensor_partition::TensorPartition),
        Box::new(tensor_parallel::TensorParallel),
    ];
    v.extend(declarative::builtins());
    v.sort_by(|a, b| a.name().cmp(b.name()));
    v
}

/// Find a pass by name among `passes`.
pub fn find<'a>(passes: &'a [Box<dyn Pass>], name: &str) -> Result<&'a dyn Pass, PassError> {
    passes
        .iter()
        .find(|p| p.name() == name)
        .map(|p| p.as_ref())
        .ok_or_else(|| PassError::UnknownPass {
            name: name.to_string(),
            known: passes
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Parse `NAME[:k=v,...]` into the pass name and its knob assignments (their names and values
/// unvalidated). Refused: a knob without `=` (`shard:stage`) and a knob given twice
/// (`grad-accumulation:k=2,k=4`), which would otherwise leave one of the two silently unused.
/// Empty entries (`amp:`, a trailing comma) are ignored.
pub fn parse_pass_arg(arg: &str) -> Result<(String, Vec<(String, String)>), PassError> {
    let (name, rest) = arg.split_once(':').unwrap_or((arg, ""));
    let name = name.trim().to_string();
    let mut kv: Vec<(String, String)> = Vec::new();
    for s in rest.split(',').filter(|s| !s.trim().is_empty()) {
        let bad = |knob: &str, value: &str, why: String| PassError::BadKnob {
            pass: name.clone(),
            knob: knob.to_string(),
            value: value.to_string(),
            why,
        };
        let Some((k, v)) = s.split_once('=') else {
            let k = s.trim();
            return Err(bad(k, "", format!("no value; write {k}=VALUE")));
        };
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        if let Some((_, first)) = kv.iter().find(|(q, _)| *q == k) {
            return Err(bad(
                &k,
                &v,
                format!("given twice (first {k}={first}); give each knob once"),
            ));
        }
        kv.push((k, v));
    }
    Ok((name, kv))
}

/// Check knob assignments against a pass's declared knobs and fill in defaults.
pub fn resolve_knobs(pass: &dyn Pass, given: &[(String, String)]) -> Result<Knobs, PassError> {
    resolve_specs(pass.name(), &pass.knobs(), given)
}

/// Check knob assignments against `specs` (the knobs of pass `pass`) and fill in defaults: what
/// [`resolve_knobs`] does, for knobs that are not a registered pass's (a baseline's settings in
/// a plan, `search::baselines::knob_specs`). The plan reader checks a plan's knobs with it, so
/// a hand-edited plan meets the same ranges as the command line.
pub fn resolve_specs(
    pass: &str,
    specs: &[KnobSpec],
    given: &[(String, String)],
) -> Result<Knobs, PassError> {
    let mut out = BTreeMap::new();
    let bad = |k: &KnobSpec, v: &str, why: String| PassError::BadKnob {
        pass: pass.to_string(),
        knob: k.name.clone(),
        value: v.to_string(),
        why,
    };
    for (k, _) in given {
        if !specs.iter().any(|s| &s.name == k) {
            return Err(PassError::UnknownKnob {
                pass: pass.to_string(),
                knob: k.clone(),
                known: if specs.is_empty() {
                    "(none)".into()
                } else {
                    specs
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            });
        }
    }
    for s in specs {
        let raw = given
            .iter()
            .rev()
            .find(|(k, _)| k == &s.name)
            .map_or(s.default.as_str(), |(_, v)| v.as_str());
        let value = match s.kind {
            KnobKind::Int { min, max } => {
                let v: i64 = raw
                    .parse()
                    .map_err(|_| bad(s, raw, "not an integer".into()))?;
                if v < min || v > max {
                    return Err(bad(s, raw, format!("must be between {min} and {max}")));
                }
                KnobValue::Int(v)
            }
            KnobKind::Float { min, max } => {
                let v: f64 = raw
                    .parse()
                    .map_err(|_| bad(s, raw, "not a number".into()))?;
                if !(v.is_finite() && v >= min && v <= max) {
                    return Err(bad(s, raw, format!("must be between {min} and {max}")));
                }
                KnobValue::Float(v)
            }
            KnobKind::Text => KnobValue::Text(raw.to_string()),
        };
        out.insert(s.name.clone(), value);
    }
    Ok(Knobs(out))
}

/// Apply one patch to a copy of `job`.
pub fn apply(job: &Job, patch: &Patch) -> Result<Job, PassError> {
    let wrap = |source: JobError| PassError::Edit {
        pass: patch.pass.clone(),
        source,
    };
    let mut ed: Editor = job.edit();
    for e in &patch.edits {
        apply_edit(&mut ed, e).map_err(wrap)?;
    }
    let out = ed.finish().map_err(wrap)?;
    // Refuse, don't saturate: a factor that pushes a duration, a size or memory out of its
    // physical range is an error naming the pass.
    crate::graph::bounds::check(&out).map_err(|m| wrap(JobError::Invalid(m)))?;
    Ok(out)
}

/// Apply several patches as one edit (ids of every patch refer to `job` before any of them).
pub fn apply_all(job: &Job, patches: &[Patch]) -> Result<Job, PassError> {
    let Some(first) = patches.first() else {
        return Ok(job.clone());
    };
    let merged = Patch {
        pass: first.pass.clone(),
        why: String::new(),
        edits: patches
            .iter()
            .flat_map(|p| p.edits.iter().cloned())
            .collect(),
    };
    apply(job, &merged)
}

fn apply_edit(ed: &mut Editor, e: &Edit) -> Result<(), JobError> {
    match e {
        Edit::Scale { ops, factor } => ed.scale(ops, *factor),
        Edit::SetDuration { op, dur_ns } => ed.set_duration(*op, *dur_ns),
        Edit::ClearGaps { ops } => {
            for &op in ops {
                if !ed.is_alive(op) {
                    return Err(JobError::NoSuchOp(op));
                }
                ed.job_mut().local_mut().ops[op as usize].spec.gap_ns = 0;
            }
            Ok(())
        }
        Edit::SetWork { op, work } => {
            if !ed.is_alive(*op) {
                return Err(JobError::NoSuchOp(*op));
            }
            ed.job_mut().local_mut().ops[*op as usize].work = *work;
            Ok(())
        }
        Edit::Remove { ops } => ed.remove(ops),
        Edit::Insert {
            spec,
            work,
            after,
            before,
            launch_ns,
        } => ed
            .insert(spec.clone(), *work, after, before, *launch_ns)
            .map(drop),
        Edit::Merge { ops, dur_ns } => ed.merge(ops, *dur_ns).map(drop),
        Edit::AddEdge { from, to } => ed.add_edge(*from, *to),
        Edit::DropEdge { from, to } => ed.drop_edge(*from, *to),
        Edit::Priority { ops, priority } => ed.set_priority(ops, *priority),
        Edit::SetMem { op, effects } => {
            if !ed.is_alive(*op) {
                return Err(JobError::NoSuchOp(*op));
            }
            for m in effects {
                if !ed.is_alive(m.op) {
                    return Err(JobError::NoSuchOp(m.op));
                }
            }
            let mem = &mut ed.job_mut().local_mut().mem;
            mem.retain(|m| m.op != *op);
            mem.extend(effects.iter().copied());
            Ok(())
        }
        Edit::StaticMemory { bytes } => {
            ed.job_mut().local_mut().static_mem_bytes = *bytes;
            Ok(())
        }
        Edit::FuseSyncs { syncs } => fuse_syncs(ed.job_mut(), syncs),
        Edit::PartitionSync { sync, k } => {
            let job = ed.job_mut();
            let s = job
                .syncs
                .get_mut(*sync)
                .ok_or(JobError::NoSuchSync(*sync))?;
            if *k == 0 {
                return Err(JobError::Invalid(
                    "a tensor cannot be cut into 0 pieces".into(),
                ));
            }
            s.partitions = *k;
            Ok(())
        }
        Edit::ScaleSyncBytes { syncs, factor } => {
            if !(factor.is_finite() && *factor > 0.0) {
                return Err(JobError::Invalid(format!(
                    "sync bytes factor must be > 0, got {factor}"
                )));
            }
            let job = ed.job_mut();
            for &i in syncs {
                let s = job.syncs.get_mut(i).ok_or(JobError::NoSuchSync(i))?;
                s.bytes = ((s.bytes as f64 * factor).round() as u64).max(1);
            }
            Ok(())
        }
        Edit::Dtype(d) => {
            ed.job_mut().dtype = *d;
            Ok(())
        }
        Edit::Math(m) => {
            ed.job_mut().math = *m;
            Ok(())
        }
        Edit::ReplaceJob(j) => {
            *ed = j.edit();
            Ok(())
        }
    }
}

/// Merge syncs: the fused one sits where the last of them was (it cannot start earlier) and
/// carries all their tensors, bytes, ready and done ops.
pub(crate) fn fuse_syncs(job: &mut Job, which: &[usize]) -> Result<(), JobError> {
    let mut idx: Vec<usize> = which.to_vec();
    idx.sort_unstable();
    idx.dedup();
    if idx.len() < 2 {
        return Ok(());
    }
    for &i in &idx {
        if i >= job.syncs.len() {
            return Err(JobError::NoSuchSync(i));
        }
    }
    let last = *idx.last().expect("two or more");
    // One collective carries one kind over one group: an all-gather of parameters and a
    // reduce-scatter of gradients (sharding) are not fused into one.
    let first = &job.syncs[idx[0]];
    if let Some(&other) = idx
        .iter()
        .find(|&&i| job.syncs[i].kind != first.kind || job.syncs[i].group != first.group)
    {
        return Err(JobError::Invalid(format!(
            "synchronisations {} ({}) and {other} ({}) are different collectives and cannot be fused",
            idx[0],
            first.kind.name(),
            job.syncs[other].kind.name()
        )));
    }
    let mut fused = job.syncs[idx[0]].clone();
    fused.partitions = 1;
    for &i in &idx[1..] {
        let s = &job.syncs[i];
        fused.tensors.extend(&s.tensors);
        fused.bytes += s.bytes;
        fused.ready.extend(&s.ready);
        fused.done.extend(&s.done);
    }
    job.syncs[last] = fused;
    for &i in idx[..idx.len() - 1].iter().rev() {
        job.syncs.remove(i);
    }
    Ok(())
}

/// The optimizer step's GPU kernels in `l`: update-phase ops on a GPU stream (not the virtual
/// joins, nor host work such as an offloaded step). What sharding divides over a shard group.
pub fn optimizer_kernels(l: &crate::graph::job::LocalGraph) -> Vec<OpId> {
    use crate::graph::{DeviceKind, OpKind, Phase};
    (0..l.ops.len() as OpId)
        .filter(|&o| {
            let sp = &l.ops[o as usize].spec;
            sp.phase == Phase::Update
                && !matches!(sp.kind, OpKind::In | OpKind::Out | OpKind::CpuOther)
                && matches!(
                    l.devices.get(sp.device as usize),
                    Some(DeviceKind::GpuStream { .. })
                )
        })
        .collect()
}

/// The `batch` knob of the layout passes (`tensor-parallel`, `context-parallel`, `pipeline`):
/// `global` (true) keeps the global batch, `replica` keeps the batch per model replica.
pub(crate) fn keeps_global_batch(pass: &str, knobs: &Knobs) -> Result<bool, PassError> {
    match knobs.text("batch").trim() {
        "global" => Ok(true),
        "replica" => Ok(false),
        other => Err(PassError::BadKnob {
            pass: pass.into(),
            knob: "batch".into(),
            value: other.into(),
            why: "expected global or replica".into(),
        }),
    }
}

/// A new GPU stream of the worker, after its others (a layout pass's collectives run on one
/// of their own); its device id.
pub(crate) fn new_stream(j: &mut crate::graph::job::Job) -> u32 {
    use crate::graph::DeviceKind;
    let next = j
        .local
        .devices
        .iter()
        .filter_map(|d| match d {
            DeviceKind::GpuStream { stream, .. } => Some(*stream + 1),
            _ => None,
        })
        .max()
        .unwrap_or(1);
    j.local_mut().devices.push(DeviceKind::GpuStream {
        worker: 0,
        stream: next,
    });
    (j.local.devices.len() - 1) as u32
}

/// The numbered block a layer belongs to: its path up to the first all-digit component
/// (`bert.encoder.layer.3`, `model.layers.11`, `layer3.1`), or `""` outside blocks. Sharding's
/// wrap units and full recomputation's segments.
pub fn unit_of(layer: &str) -> &str {
    let mut end = 0;
    for part in layer.split('.') {
        let stop = end + part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return &layer[..stop];
        }
        end = stop + 1;
    }
    ""
}

/// The attention modules of a block, by their path inside it (GPT-2's `attn`, Llama's
/// `self_attn`, BERT's `attention.self`): tensor parallelism's split and selective
/// recomputation's core.
pub const ATTENTION_MODULES: [&str; 3] = ["attn", "self_attn", "attention.self"];

/// Where a layer sits in a block's unfused attention core (Korthikanti et al., MLSys'23 §4.2:
/// what selective recomputation re-runs): `Some(true)` for the scores' matmul QKᵀ (re-run,
/// its saved q, k and v kept: the core's inputs), `Some(false)` for the softmax, its dropout
/// and the product with V (their saved activations dropped); `None` elsewhere, a flash
/// kernel's `core` included (it saves no scores to drop).
pub fn attention_core(name: &str) -> Option<bool> {
    let block = unit_of(name);
    if block.is_empty() {
        return None;
    }
    let rest = name[block.len()..].trim_start_matches('.');
    let (module, last) = rest.rsplit_once('.')?;
    if !ATTENTION_MODULES.contains(&module) {
        return None;
    }
    match last {
        "matmul_qk" => Some(true),
        "softmax" | "dropout" | "attn_dropout" | "matmul_av" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_args_parse() {
        assert_eq!(parse_pass_arg("amp").unwrap(), ("amp".to_string(), vec![]));
        assert_eq!(
            parse_pass_arg("amp:,").unwrap(),
            ("amp".to_string(), vec![])
        );
        assert_eq!(
            parse_pass_arg("grad-accumulation:k=4, x = y").unwrap(),
            (
                "grad-accumulation".to_string(),
                vec![("k".into(), "4".into()), ("x".into(), "y".into())]
            )
        );
    }

    #[test]
    fn pass_args_refuse_a_knob_twice_or_without_a_value() {
        let twice = parse_pass_arg("grad-accumulation:k=2,k=4").unwrap_err();
        assert!(
            matches!(&twice, PassError::BadKnob { knob, value, .. } if knob == "k" && value == "4"),
            "{twice:?}"
        );
        assert!(
            twice.to_string().contains("given twice (first k=2)"),
            "{twice}"
        );
        let bare = parse_pass_arg("shard:stage=3,prefetch").unwrap_err();
        assert!(
            bare.to_string()
                .contains("knob prefetch = : no value; write prefetch=VALUE"),
            "{bare}"
        );
    }
}
