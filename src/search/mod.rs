//! The planner's search (dPRO §5, Algorithm 1): from an unoptimised job to the fastest job the
//! registered passes can reach within a wall-clock budget.
//!
//! 1. **Memory step.** Over the memory budget (compared with the device-used peak, what
//!    `nvidia-smi` shows), try AMP, recomputation, gradient accumulation (every k that divides the
//!    per-GPU batch, [`accumulation_steps`]) and their combinations by replay and keep the
//!    fastest that fits; when none fits, stop with [`SearchError::Infeasible`], the smallest peak
//!    reached and what would fit ([`what_would_fit`]).
//! 2. **Critical-path rounds.** Replay, take the critical path, ask every allowed pass for
//!    patches at its sites (op fusion along the computation-bound prefix by Theorem 1, tensor
//!    fusion along the communication-bound suffix by Theorem 2, partition numbers by partial
//!    replay; AMP and the declarative passes as on/off moves), evaluate every candidate move in
//!    parallel (rayon), take the best, repeat. Stop when a round finds no improving move or the
//!    last [`SearchOptions::converge_rounds`] rounds gained less than
//!    [`SearchOptions::converge_gain`] together (converged), on the budget, or on interrupt.
//!
//! The search is anytime: it always holds its best job, and every stop returns it.
//! Deterministic: candidates are generated in registry and site order and the best is chosen
//! by (iteration time, candidate index), whatever the thread count.
//!
//! Speed-ups, each switchable for the dPRO Table 5 ablation ([`Speedups`]): *symmetry* evaluates
//! candidates on the symmetric form (one worker + quotient ring) when the job uses ring
//! all-reduce, and lets op-fusion repeat a fusion in every twin block (`twins`); *partial
//! replay* lets tensor-partition price k by replaying one synchronisation alone (`partial`;
//! off: a full replay of the job per k); *coarsened view* makes op-fusion consider a
//! tensor-producing op with its tensor-less neighbours, and tensor-fusion a layer's tensors, as
//! units (`coarsen`). The switches reach the passes as knob overrides ([`speedup_knobs`]).
//! Not in dPRO: *lazy rounds* ([`lazy`]) evaluate a round's moves in the order of their last
//! gains and stop once none left can beat the best by that measure.
//!
//! **Invariant:** the search does no IO; progress goes through a callback.

pub mod baselines;
pub mod framework;
pub mod layout;
mod lazy;
pub mod mcmc;
#[cfg(test)]
mod quality;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::cost::config::SyncScheme;
use crate::cost::framework::Framework;
use crate::graph::job::{Job, JobError};
use crate::passes::{self, Edit, Evaluated, Pass, PassError, Patch};

/// Which search strategy.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// dPRO Algorithm 1 over the critical path.
    CriticalPath,
    /// Seeded Markov-chain Monte Carlo over the same moves.
    Mcmc,
}

/// The search speed-ups of dPRO §5.3, each switchable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Speedups {
    pub coarsen: bool,
    pub partial_replay: bool,
    pub symmetry: bool,
    /// Lazy rounds: re-evaluate a round's moves in the order of what each gained when last
    /// evaluated, and stop once no move left can beat the best by that measure
    /// ([`Ctx::best_move_lazy`]). Not in dPRO; off for its Table 5 columns.
    #[serde(default = "yes")]
    pub lazy: bool,
}

fn yes() -> bool {
    true
}

impl Default for Speedups {
    fn default() -> Self {
        Speedups {
            coarsen: true,
            partial_replay: true,
            symmetry: true,
            lazy: true,
        }
    }
}

/// Why the search stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// No move improves, or the last rounds gained too little.
    Converged,
    /// The wall-clock budget ran out.
    Budget,
    /// Ctrl-C.
    Interrupted,
    /// The round limit (`plan --max-rounds N`) was reached: a deterministic cut, unlike the
    /// budget, so tests and reproducible runs can bound a search by work instead of time.
    RoundLimit,
}

/// How to search.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    pub budget: Duration,
    /// Peak memory per GPU the plan must fit, bytes.
    pub memory_budget: Option<u64>,
    /// Passes the search may use, by name (None: [`default_passes`]).
    pub passes: Option<Vec<String>>,
    pub strategy: Strategy,
    pub seed: u64,
    pub speedups: Speedups,
    /// Rounds over which the gain is measured for convergence (dPRO: 5).
    pub converge_rounds: usize,
    /// Relative gain below which those rounds count as converged (0.001 = 0.1 %).
    pub converge_gain: f64,
    /// The framework whose export must apply every counted move, and whose names the plan
    /// uses (`None`: every allowed pass counts, as for `whatif`-style studies).
    pub framework: Option<(Framework, framework::Names)>,
    /// Smallest relative gain an on/off move (AMP, fused Adam, a declarative pass) must bring to
    /// be taken (0.001 = 0.1 % of the iteration): such a move changes how the user trains, and a
    /// gain inside the model's noise is not worth recommending.
    pub min_onoff_gain: f64,
    /// When the budget ends (default: `budget` after the search starts). The CLI sets it from
    /// the start of the whole run, so that baselines count against the budget too.
    pub deadline: Option<Instant>,
    /// PyTorch: the DDP bucket layout every evaluated job is regrouped into (set by the CLI
    /// from the `ddp_*` start point; `None`: collectives as the moves leave them).
    pub ddp: Option<baselines::DdpLayout>,
    /// Evaluations of graphs with at least this many ops are kept lean (default [`LEAN_OPS`];
    /// 0: always, `usize::MAX`: never — the plan is the same either way, tested).
    pub lean_ops: usize,
    /// The form the report evaluates the plan in ([`report_symmetric`] of the unoptimised
    /// job, decided once by the caller that has it); `None`: decided from the search's start.
    pub report_symmetric: Option<bool>,
    /// Stop after this many rounds (critical-path rounds, or MCMC batches) with
    /// [`StopReason::RoundLimit`]; `None`: until convergence, the budget or Ctrl-C.
    pub max_rounds: Option<usize>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            budget: Duration::from_secs(3600),
            memory_budget: None,
            passes: None,
            strategy: Strategy::CriticalPath,
            seed: 0,
            speedups: Speedups::default(),
            converge_rounds: 5,
            converge_gain: 0.001,
            framework: None,
            min_onoff_gain: 0.001,
            deadline: None,
            ddp: None,
            lean_ops: LEAN_OPS,
            report_symmetric: None,
            max_rounds: None,
        }
    }
}

/// Passes the search uses unless told otherwise: every registered pass except the lossy ones
/// (`dgc` changes what is trained), those that only trade time for memory (`recompute`,
/// `grad-accumulation`, `shard`, `vdnn`: the memory step uses the first three when memory
/// demands it) and layouts (`tensor-parallel`, `context-parallel`, `pipeline`: the memory
/// step's layout search tries them).
pub fn default_passes(all: &[Box<dyn Pass>]) -> Vec<String> {
    const EXCLUDED: [&str; 8] = [
        "context-parallel",
        "dgc",
        "grad-accumulation",
        "pipeline",
        "recompute",
        "shard",
        "tensor-parallel",
        "vdnn",
    ];
    all.iter()
        .map(|p| p.name().to_string())
        .filter(|n| !EXCLUDED.contains(&n.as_str()))
        .collect()
}

/// One step the search took.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    pub pass: String,
    /// Tensors the decision groups or partitions, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<String>,
    /// Ops (layer and phase) the decision fuses or changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// Partition number, when the decision sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Knobs the pass ran with, when not its defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub knobs: std::collections::BTreeMap<String, String>,
    pub why: String,
    /// Change of the predicted iteration time, ms (negative = faster).
    pub effect_ms: f64,
    /// How the plan's framework applies it (`search::framework::mechanism`); empty in plans
    /// made without a framework.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mechanism: String,
}

/// A move the plan's framework cannot apply: its predicted effect on the planned job, and why
/// it is not in the export. Never counted in `planned_iteration_ms`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Advice {
    pub pass: String,
    /// Change of the planned iteration time if it were applied too, ms (negative = faster).
    pub effect_ms: f64,
    /// Why the framework's export does not apply it.
    pub why_not: String,
}

/// What the search reports as it goes: enough to write the best plan so far.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub best_ns: u64,
    pub replays: u64,
    pub elapsed: Duration,
    pub round: usize,
    /// The best job so far and its peak memory per GPU, bytes.
    pub best_job: &'a Job,
    pub best_peak_bytes: u64,
    /// Its three peaks.
    pub best_peaks: crate::cost::memory::MemoryPeaks,
    /// The decisions from the search's start to it (the start's own decisions included).
    pub decisions: &'a [Decision],
}

/// Why the search could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(
        "no plan fits the memory budget of {budget_gb:.2} GB per GPU; the smallest peak reached is {smallest_gb:.2} GB of device memory, with {how}"
    )]
    Infeasible {
        budget_gb: f64,
        smallest_gb: f64,
        how: String,
        /// The options the memory step tried on the start, ranked ([`layout::ranked`]): what
        /// came closest (`plan --top K` prints them with the error).
        layouts: Vec<layout::LayoutRow>,
    },
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Job(#[from] JobError),
}

/// The result of a search.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The unoptimised job, fully evaluated.
    pub baseline: Evaluated,
    /// The best job found, fully evaluated (with the search's evaluator when the budget or an
    /// interrupt left no time for a full replay).
    pub best: Evaluated,
    pub decisions: Vec<Decision>,
    /// Passes the framework cannot apply, evaluated on the best job (empty without a framework).
    pub advice: Vec<Advice>,
    pub replays: u64,
    pub wall: Duration,
    pub stop: StopReason,
    pub rounds: usize,
    /// Every option the memory step tried on the baseline (the layout search), ranked: those
    /// that fit first, fastest first. Empty when the baseline fits as it is.
    pub layouts: Vec<layout::LayoutRow>,
}

/// Evaluations of graphs with at least this many ops are kept *lean* once scored: their graph,
/// replay and critical path (~100 bytes an op) are dropped, their numbers (iteration time,
/// memory, the critical path's local ops and syncs) and job kept; the one the search moves to
/// is evaluated again in full. So the search holds one full evaluation per thread, and `plan`
/// needs about what `replay` needs (issue 14: it held every baseline's and every candidate's
/// graph, 6× `replay` for BERT-base on 8,192 GPUs). 0: every evaluation (issue 28: a threshold
/// of 262,144 ops left BERT-base on the dPRO testbed at 2× replay's memory; dropping its graphs
/// costs one replay per round, 1,781 replays instead of 1,737, and the plan is the same).
pub const LEAN_OPS: usize = 0;

/// Jobs whose evaluation has at least this many ops are searched one candidate at a time (the
/// CLI's evaluation pool), so that `plan` holds one evaluation, as `replay` does.
pub const SERIAL_OPS: u64 = 1 << 18;

/// Make `e` lean (see [`LEAN_OPS`]).
pub fn lean(e: &mut Evaluated) {
    lean_from(e, LEAN_OPS)
}

/// Make `e` lean when its graph has at least `threshold` ops.
pub fn lean_from(e: &mut Evaluated, threshold: usize) {
    if e.graph.op_count() >= threshold && !is_lean(e) {
        e.graph = crate::graph::Dfg::default();
        e.replay = crate::replay::Replay {
            start_ns: Vec::new(),
            end_ns: Vec::new(),
            binding: Vec::new(),
            device_busy_ns: std::mem::take(&mut e.replay.device_busy_ns),
            iteration_ns: e.replay.iteration_ns,
            last_op: e.replay.last_op,
        };
        e.critical.ops = Vec::new();
    }
}

/// A lean copy of `e` (a full copy when it has fewer than `threshold` ops).
pub(crate) fn lean_clone(e: &Evaluated, threshold: usize) -> Evaluated {
    if e.graph.op_count() < threshold {
        return e.clone();
    }
    Evaluated {
        job: e.job.clone(),
        graph: crate::graph::Dfg::default(),
        replay: crate::replay::Replay {
            start_ns: Vec::new(),
            end_ns: Vec::new(),
            binding: Vec::new(),
            device_busy_ns: e.replay.device_busy_ns.clone(),
            iteration_ns: e.replay.iteration_ns,
            last_op: e.replay.last_op,
        },
        critical: crate::replay::CriticalPath {
            ops: Vec::new(),
            busy_ns: e.critical.busy_ns,
        },
        memory: e.memory.clone(),
        critical_local: e.critical_local.clone(),
        critical_syncs: e.critical_syncs.clone(),
        steady: e.steady,
    }
}

/// Whether `e` was made lean (a real evaluation always has ops).
pub fn is_lean(e: &Evaluated) -> bool {
    e.is_lean()
}

/// `e` in full: evaluated again with `eval` when it is lean.
pub(crate) fn in_full(
    e: Evaluated,
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
    replays: &mut u64,
) -> Result<Evaluated, JobError> {
    if is_lean(&e) {
        *replays += 1;
        eval(e.job)
    } else {
        Ok(e)
    }
}

/// Evaluate a job the way the search's options say (symmetric form when allowed).
pub fn evaluator(symmetry: bool) -> impl Fn(Job) -> Result<Evaluated, JobError> + Sync {
    move |mut job: Job| {
        if symmetry && job.comm.scheme == SyncScheme::Ring && job.workers > 1 {
            job.symmetric = true;
        }
        passes::evaluate(job)
    }
}

/// The form the report evaluates the baseline and the plan in, decided once from the
/// unoptimised job so both are compared alike: the full graph when it fits — under the op limit
/// and, by its estimated size ([`crate::graph::bounds::expanded_ops`] ×
/// [`crate::limits::EVAL_BYTES_PER_OP`]), in the memory the ceiling leaves — else the symmetric
/// form (ring all-reduce; exact when the ring's links are alike). `replay` makes the same choice
/// a user would (the full graph, `--symmetric` beyond the limit), so `plan` needs no more memory
/// for its report than `replay` for the job (issue 14: it replayed a fused plan's full graph
/// whenever it was under the op limit, 10.8 GB for VGG-16 on 1,024 GPUs).
pub fn report_symmetric(job: &Job) -> bool {
    let ring = job.comm.scheme == SyncScheme::Ring && job.workers > 1;
    // Every worker's ops are a floor of the full graph's: over the limit on that alone, the
    // count (which lays out the collectives' devices for every worker: 3.4 MB at 65,536
    // workers, the largest thing `plan` held there) is not needed.
    let floor = u64::from(job.workers).saturating_mul(job.local.ops.len() as u64);
    let over = |ops: u64| {
        ops > crate::graph::job::MAX_OPS
            || !crate::limits::fits(ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP))
    };
    if ring && over(floor) {
        tracing::info!(
            ops = floor,
            "the full graph (at least this many ops) is over the op limit or would not fit the memory ceiling: the report uses the symmetric form"
        );
        return true;
    }
    let ops = crate::graph::bounds::expanded_ops_in(job, false);
    let fits = ops <= crate::graph::job::MAX_OPS
        && crate::limits::fits(ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP));
    if ring && !fits {
        tracing::info!(
            ops,
            "the full graph is over the op limit or would not fit the memory ceiling: the report uses the symmetric form"
        );
    }
    ring && !fits
}

/// Evaluate for the final report in the form [`report_symmetric`] chose; lean from `lean_ops`
/// ops ([`lean_from`]): the report needs numbers.
pub fn evaluate_full(
    mut job: Job,
    symmetric: bool,
    lean_ops: usize,
) -> Result<Evaluated, JobError> {
    job.symmetric = symmetric;
    let mut e = passes::evaluate(job)?;
    lean_from(&mut e, lean_ops);
    Ok(e)
}

/// Names of what a patch touches, for the plan.
fn describe(job: &Job, patch: &Patch) -> (Vec<String>, Vec<String>, Option<u32>) {
    let (mut tensors, mut ops, mut parts) = (Vec::new(), Vec::new(), None);
    let tensor_names = |sync: usize| -> Vec<String> {
        job.syncs
            .get(sync)
            .map(|s| {
                s.tensors
                    .iter()
                    .map(|&t| job.local.tensors[t as usize].name.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    for e in &patch.edits {
        match e {
            Edit::FuseSyncs { syncs } => {
                syncs.iter().for_each(|&s| tensors.extend(tensor_names(s)))
            }
            Edit::PartitionSync { sync, k } => {
                tensors.extend(tensor_names(*sync));
                parts = Some(*k);
            }
            Edit::Merge { ops: m, .. } => ops.extend(m.iter().flat_map(|&o| job.local.members(o))),
            // Recomputation inserts a copy of each dropped forward op right after the
            // original (`after[0]`, see passes/recompute.rs): the plan names the originals, so
            // that `config.recompute` lists the layers the export checkpoints.
            Edit::Insert { spec, after, .. }
                if patch.pass == "recompute" && spec.phase == crate::graph::Phase::Fw =>
            {
                if let Some(&f) = after.first() {
                    for m in job.local.members(f) {
                        if m.ends_with(" FW") && !ops.contains(&m) {
                            ops.push(m);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (tensors, ops, parts)
}

/// A candidate move: patches applied together, and the knobs the framework's export needed
/// the pass to take ([`framework::pass_knobs`]), which the plan's decision records (the
/// exports read them: Megatron's `shard` at stage 1, torchtitan's full recomputation).
pub(crate) struct Move {
    pub(crate) pass: String,
    pub(crate) patches: Vec<Patch>,
    pub(crate) knobs: Vec<(String, String)>,
}

/// What both strategies share: the allowed passes, the evaluator, the options and the stop
/// signals.
pub(crate) struct Ctx<'a> {
    pub(crate) allowed: Vec<&'a dyn Pass>,
    pub(crate) opts: &'a SearchOptions,
    pub(crate) eval: &'a (dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
    pub(crate) interrupt: &'a AtomicBool,
    pub(crate) progress: &'a (dyn Fn(&Progress) + Sync),
    pub(crate) start: Instant,
    /// When the budget ends.
    pub(crate) deadline: Instant,
    /// Peak memory the moves must keep to (None: unconstrained).
    pub(crate) memory_budget: Option<u64>,
    /// Decisions taken before the strategy started (baseline, memory step), for the reports.
    pub(crate) prefix: Vec<Decision>,
    /// Every option the memory step tried on the start, ranked ([`layout::ranked`]); empty
    /// when the start fits.
    pub(crate) layouts: Vec<layout::LayoutRow>,
}

/// Where a strategy ended: its best job, the decisions from its start to it, and the replays
/// counted so far (the strategy is handed the count before it and adds its own).
pub(crate) struct Walk {
    pub(crate) best: Evaluated,
    pub(crate) decisions: Vec<Decision>,
    pub(crate) replays: u64,
    pub(crate) stop: StopReason,
    pub(crate) rounds: usize,
}

impl Ctx<'_> {
    /// Interrupt or budget, checked between rounds.
    pub(crate) fn should_stop(&self) -> Option<StopReason> {
        if self.interrupt.load(Ordering::Relaxed) {
            Some(StopReason::Interrupted)
        } else if Instant::now() >= self.deadline {
            Some(StopReason::Budget)
        } else {
            None
        }
    }

    /// Within the memory budget (if any).
    pub(crate) fn fits(&self, e: &Evaluated) -> bool {
        self.memory_budget.is_none_or(|b| budget_peak(e, b) <= b)
    }

    /// Whether `next` is worth taking over `cur` with move `m`: faster, and for an on/off pass
    /// by at least [`SearchOptions::min_onoff_gain`].
    pub(crate) fn worth(&self, m: &Move, cur: &Evaluated, next: &Evaluated) -> bool {
        let (c, n) = (cur.iteration_ns() as f64, next.iteration_ns() as f64);
        if n >= c {
            return false;
        }
        is_granular(&self.allowed, &m.pass) || (c - n) >= self.opts.min_onoff_gain * c
    }

    /// Tell the caller where the walk stands.
    pub(crate) fn report(&self, best: &Evaluated, walk: &[Decision], replays: u64, round: usize) {
        let mut all = self.prefix.clone();
        all.extend_from_slice(walk);
        (self.progress)(&Progress {
            best_ns: best.iteration_ns(),
            replays,
            elapsed: self.start.elapsed(),
            round,
            best_job: &best.job,
            best_peak_bytes: best.memory.peak_bytes,
            best_peaks: best.memory.peaks,
            decisions: &all,
        });
    }

    /// Every move of this round from `cur` (see [`candidate_moves`]).
    pub(crate) fn moves(
        &self,
        cur: &Evaluated,
        used: &BTreeSet<String>,
    ) -> Result<Vec<Move>, SearchError> {
        candidate_moves(cur, &self.allowed, used, self.opts)
    }

    /// Apply and evaluate moves in parallel; `None` for a move that failed to apply or
    /// evaluate, or that was skipped on interrupt or budget. The result is in `moves` order
    /// whatever the thread count.
    pub(crate) fn evaluate_moves(
        &self,
        cur: &Evaluated,
        moves: &[&Move],
    ) -> Vec<Option<Evaluated>> {
        moves
            .par_iter()
            .map(|m| self.evaluate_move(cur, m))
            .collect()
    }

    /// Apply and evaluate one move, kept lean; `None` when it fails to apply or evaluate, or
    /// on interrupt or budget.
    fn evaluate_move(&self, cur: &Evaluated, m: &Move) -> Option<Evaluated> {
        if self.interrupt.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return None;
        }
        let job = passes::apply_all(&cur.job, &m.patches).ok()?;
        let mut e = (self.eval)(job).ok()?;
        lean_from(&mut e, self.opts.lean_ops);
        Some(e)
    }

    /// The best move of `moves` from `cur`: the fastest evaluation that fits and is worth
    /// taking ([`Ctx::fits`], [`Ctx::worth`]), the lowest index on ties,
    /// with the number of moves evaluated. One best is kept while the moves are evaluated, so
    /// a round holds the best and one candidate per thread, not every candidate's job (issue
    /// 28: BERT-base on 16 GPUs held 19 MB of candidate jobs per round; a parallel reduction
    /// still held one result per pending split). The same choice as filtering
    /// [`Ctx::evaluate_moves`]' results, whatever the thread count or the order the threads
    /// finish in: the minimum of (time, index) over the kept moves.
    pub(crate) fn best_move(
        &self,
        cur: &Evaluated,
        moves: &[&Move],
    ) -> (Option<(usize, Evaluated)>, u64) {
        let best = Fastest::default();
        let evaluated = AtomicU64::new(0);
        moves.par_iter().enumerate().for_each(|(i, m)| {
            let Some(e) = self.evaluate_move(cur, m) else {
                return;
            };
            evaluated.fetch_add(1, Ordering::Relaxed);
            if self.fits(&e) && self.worth(m, cur, &e) {
                best.offer(i, e.iteration_ns(), e);
            }
        });
        (best.into_inner(), evaluated.into_inner())
    }

    /// Once a move is taken: a non-granular pass is not offered again.
    pub(crate) fn mark_used(&self, m: &Move, used: &mut BTreeSet<String>) {
        if !m.patches.is_empty() && !is_granular(&self.allowed, &m.pass) {
            used.insert(m.pass.clone());
        }
    }
}

/// The fastest of indexed results offered from parallel threads, the lowest index on ties:
/// what `min_by_key((ns, index))` over them all would pick, whatever the order the threads
/// finish in. It holds one result, so a parallel loop over candidate jobs holds the best and
/// the one each thread is evaluating (a parallel `reduce` also holds one per pending split:
/// issue 28's plan-memory target).
pub(crate) struct Fastest<T> {
    held: Mutex<Option<(usize, u64, T)>>,
}

impl<T> Default for Fastest<T> {
    fn default() -> Self {
        Fastest {
            held: Mutex::new(None),
        }
    }
}

impl<T> Fastest<T> {
    /// Offer result `i` taking `ns`; the slower of it and the held one is dropped outside the
    /// lock.
    pub(crate) fn offer(&self, i: usize, ns: u64, v: T) {
        // A poisoned lock means a thread panicked while replacing; the Option is whole.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let faster = held.as_ref().is_none_or(|(j, b, _)| (ns, i) < (*b, *j));
        let loser = if faster {
            held.replace((i, ns, v))
        } else {
            Some((i, ns, v))
        };
        drop(held);
        drop(loser);
    }

    /// The time and index of the fastest offered so far.
    pub(crate) fn peek(&self) -> Option<(u64, usize)> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().map(|(i, ns, _)| (*ns, *i))
    }

    /// The fastest offered, with its index.
    pub(crate) fn into_inner(self) -> Option<(usize, T)> {
        self.held
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|(i, _, v)| (i, v))
    }
}

/// The plan's record of taking move `m` from `cur` to `next`.
pub(crate) fn decision(cur: &Evaluated, m: &Move, next: &Evaluated) -> Decision {
    let (tensors, ops, partitions) = m.patches.iter().map(|p| describe(&cur.job, p)).fold(
        (Vec::new(), Vec::new(), None),
        |mut acc, (t, o, k)| {
            acc.0.extend(t);
            acc.1.extend(o);
            acc.2 = acc.2.or(k);
            acc
        },
    );
    let why = m
        .patches
        .iter()
        .map(|p| p.why.as_str())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Decision {
        pass: m.pass.clone(),
        tensors,
        ops,
        partitions,
        knobs: m.knobs.iter().cloned().collect(),
        why,
        effect_ms: (next.iteration_ns() as f64 - cur.iteration_ns() as f64) / 1e6,
        mechanism: String::new(),
    }
}

/// Run the search from `job` (the unoptimised job, the report's baseline), or from `from`
/// when given (a better starting point, e.g. the fastest framework default, with the decision
/// that records it). `interrupt` is polled between candidate evaluations; `progress` is called
/// after every round. The strategy is `opts.strategy`: critical-path rounds, or the seeded
/// Metropolis–Hastings chain of [`mcmc`] over the same moves.
pub fn search(
    job: Job,
    from: Option<(Job, Decision)>,
    opts: &SearchOptions,
    all: &[Box<dyn Pass>],
    interrupt: &AtomicBool,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Outcome, SearchError> {
    let start = Instant::now();
    let symmetric_report = opts
        .report_symmetric
        .unwrap_or_else(|| report_symmetric(&job));
    let baseline = evaluate_full(job.clone(), symmetric_report, opts.lean_ops)?;
    let eval = evaluator(opts.speedups.symmetry);
    let (cur, prefix) = match from {
        Some((j, d)) => (eval(j)?, vec![d]),
        None => (eval(job)?, Vec::new()),
    };
    let opts = &SearchOptions {
        report_symmetric: Some(symmetric_report),
        ..opts.clone()
    };
    let mut out = search_from(cur, prefix, opts, all, interrupt, progress)?;
    out.baseline = baseline;
    out.replays += 1;
    out.wall = start.elapsed();
    Ok(out)
}

/// The passes a search may use (`opts.passes`, else [`default_passes`]) split into those the
/// framework's export applies and those it does not (all apply without a framework).
pub fn split_passes(opts: &SearchOptions, all: &[Box<dyn Pass>]) -> (Vec<String>, Vec<String>) {
    let names = opts.passes.clone().unwrap_or_else(|| default_passes(all));
    match opts.framework {
        None => (names, Vec::new()),
        Some((fw, n)) => names
            .into_iter()
            .partition(|p| framework::mechanism(fw, p, n).is_ok()),
    }
}

/// The search from an evaluated start (`start`, reached by the decisions `prefix`). The
/// outcome's `baseline` is `start` itself; [`search`] puts the unoptimised job there.
///
/// Memory (`opts.memory_budget`): when the start is over it, the strategy first runs without
/// the constraint (moves such as AMP may bring the peak under it at no cost); if its best fits,
/// that is the plan. Otherwise each memory option the passes allow (recomputation, gradient
/// accumulation k = 2, 4, 8, 16) is tried on that best job and on the start, the strategy
/// continues under the constraint from the fastest fitting one of each, and the faster result
/// is the plan; none fitting is [`SearchError::Infeasible`].
pub fn search_from(
    start: Evaluated,
    prefix: Vec<Decision>,
    opts: &SearchOptions,
    all: &[Box<dyn Pass>],
    interrupt: &AtomicBool,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Outcome, SearchError> {
    let started = Instant::now();
    let (mut names, not_exported) = split_passes(opts, all);
    // A recorded FSDP2 step: keeping the resharded units gathered (`shard:reshard=0`) trades
    // memory for the backward all-gathers, gathering further ahead (`shard:prefetch=2`) memory
    // for overlap: moves the search weighs (sharding is otherwise a memory move only) where
    // the export can apply them.
    if opts.passes.is_none()
        && recorded_fsdp_knobs(&start.job).is_some()
        && !names.iter().any(|n| n == "shard")
        && opts
            .framework
            .is_none_or(|(fw, _)| framework::shard_supported(fw, 3, 1, false).is_ok())
    {
        names.push("shard".into());
    }
    let mut allowed: Vec<&dyn Pass> = Vec::new();
    for n in &names {
        allowed.push(passes::find(all, n)?);
    }
    let plain = evaluator(opts.speedups.symmetry);
    let eval = |job: Job| match &opts.ddp {
        Some(layout) => plain(layout.apply(job)),
        None => plain(job),
    };
    let deadline = opts.deadline.unwrap_or(started + opts.budget);
    let mut ctx = Ctx {
        allowed,
        opts,
        eval: &eval,
        interrupt,
        progress,
        start: started,
        deadline,
        memory_budget: opts.memory_budget,
        prefix,
        layouts: Vec::new(),
    };
    let (walk, mut decisions) = match walk_within_memory(&mut ctx, &start, all) {
        Ok(w) => w,
        Err(SearchError::Infeasible {
            budget_gb,
            smallest_gb,
            how,
            ..
        }) => {
            return Err(SearchError::Infeasible {
                budget_gb,
                smallest_gb,
                how,
                layouts: ctx.layouts,
            });
        }
        Err(e) => return Err(e),
    };
    name_mechanisms(opts, &mut decisions);
    let (stop, rounds) = (walk.stop, walk.rounds);
    let symmetric_report = opts
        .report_symmetric
        .unwrap_or_else(|| report_symmetric(&start.job));
    let (best, advice, replays) =
        report_form(walk, symmetric_report, &not_exported, opts, all, &eval)?;
    Ok(Outcome {
        baseline: start,
        best,
        decisions,
        advice,
        replays,
        wall: started.elapsed(),
        stop,
        rounds,
        layouts: ctx.layouts,
    })
}

/// The passes the memory step may use: amp, recompute, grad-accumulation and shard, those of
/// them `opts.passes` names (all without a list) and the framework's export applies. Sharding
/// is a memory move, like recomputation: the unconstrained search meets it through the sharded
/// baselines (`fsdp2_default`, `zero2_default`, ...), not as a move.
fn memory_passes(opts: &SearchOptions) -> Vec<&'static str> {
    [
        "amp",
        "recompute",
        "grad-accumulation",
        "shard",
        "tensor-parallel",
        "context-parallel",
        "pipeline",
    ]
    .into_iter()
    .filter(|p| match &opts.passes {
        Some(list) => list.iter().any(|l| l == p),
        None => true,
    })
    .filter(|p| {
        opts.framework
            .is_none_or(|(fw, n)| framework::mechanism(fw, p, n).is_ok())
    })
    .collect()
}

/// Whether `e`'s peak is over the options' memory budget (never without one).
fn over_budget(opts: &SearchOptions, e: &Evaluated) -> bool {
    opts.memory_budget.is_some_and(|b| budget_peak(e, b) > b)
}

/// The options' strategy run from `cur`, handed the replays counted before it.
fn run_strategy(ctx: &Ctx, cur: Evaluated, replays: u64) -> Result<Walk, SearchError> {
    ctx.report(&cur, &[], replays, 0);
    match ctx.opts.strategy {
        Strategy::CriticalPath => critical_path_rounds(ctx, cur, replays),
        Strategy::Mcmc => mcmc::run(ctx, cur, replays),
    }
}

/// The strategy's walk from `start` and the plan's decisions (`ctx.prefix` first), under the
/// memory budget as [`search_from`] describes: directly when the start fits; else
/// unconstrained first, then, when that best is over the budget, from the memory options.
fn walk_within_memory(
    ctx: &mut Ctx,
    start: &Evaluated,
    all: &[Box<dyn Pass>],
) -> Result<(Walk, Vec<Decision>), SearchError> {
    let opts = ctx.opts;
    let prefix = ctx.prefix.clone();
    if !over_budget(opts, start) {
        let w = run_strategy(ctx, start.clone(), 1)?;
        let mut d = prefix;
        d.extend(w.decisions.iter().cloned());
        return Ok((w, d));
    }
    // The memory step on the start first: a plan that fits is then the best so far before the
    // unconstrained walk (which may run until the budget ends) reports faster ones that do not
    // fit, so a budget-cut or interrupted search still holds one. Its result is reused below.
    let budget = opts.memory_budget.unwrap_or(u64::MAX);
    let first = match memory_step(
        start,
        budget,
        &memory_passes(opts),
        opts.framework.map(|(fw, _)| fw),
        all,
        ctx.eval,
        opts.lean_ops,
        &mut ctx.layouts,
    ) {
        Ok(r) => {
            ctx.report(&r.end, &r.decisions, 1 + r.replays, 0);
            Ok(r)
        }
        Err(e @ SearchError::Infeasible { .. }) => Err(e),
        Err(e) => return Err(e),
    };
    // A. Unconstrained.
    ctx.memory_budget = None;
    let free = run_strategy(ctx, start.clone(), 1)?;
    ctx.memory_budget = opts.memory_budget;
    if !over_budget(opts, &free.best) || free.stop != StopReason::Converged {
        return unconstrained_plan(ctx, &prefix, free, first);
    }
    // B. A memory option on the unconstrained best and on the start, then constrained rounds
    // from each; the faster wins.
    constrained_from_memory_options(ctx, &prefix, free, first, all)
}

/// The memory step's result on the start ([`memory_step`]), computed once.
type StartFit = Result<MemoryFit, SearchError>;

/// What the memory step chose: the end, evaluated; the replays the step took; the decisions;
/// and the chosen option's steps with each step's start (for [`memory_step_after_first`]).
struct MemoryFit {
    end: Evaluated,
    replays: u64,
    decisions: Vec<Decision>,
    steps: Vec<KnobbedPass>,
    trail: Trail,
}

/// The plan when the unconstrained walk `free` fits the budget or stopped early: that walk;
/// but stopped early over the budget, the start plus the memory step.
fn unconstrained_plan(
    ctx: &Ctx,
    prefix: &[Decision],
    free: Walk,
    start_fit: StartFit,
) -> Result<(Walk, Vec<Decision>), SearchError> {
    let opts = ctx.opts;
    if !over_budget(opts, &free.best) {
        let mut d = prefix.to_vec();
        d.extend(free.decisions.iter().cloned());
        return Ok((free, d));
    }
    // Stopped early over the budget: the start plus the memory step is the plan.
    let fit = start_fit?;
    let mut d = prefix.to_vec();
    d.extend(fit.decisions);
    let w = Walk {
        best: fit.end,
        decisions: Vec::new(),
        replays: free.replays + fit.replays,
        stop: free.stop,
        rounds: free.rounds,
    };
    Ok((w, d))
}

/// The memory step on the unconstrained best `free` and on the start, the strategy continued
/// under the budget from each that fits; the faster result, or the infeasibility with the
/// smallest peak when neither fits.
fn constrained_from_memory_options(
    ctx: &mut Ctx,
    prefix: &[Decision],
    free: Walk,
    start_fit: StartFit,
    all: &[Box<dyn Pass>],
) -> Result<(Walk, Vec<Decision>), SearchError> {
    let opts = ctx.opts;
    let budget = opts.memory_budget.unwrap_or(u64::MAX);
    let memory_options = memory_passes(opts);
    let mut replays = free.replays;
    let mut tries: Vec<(Walk, Vec<Decision>)> = Vec::new();
    let mut smallest: Option<SearchError> = None;
    let taken = memory_step_after_first(&free.best, budget, &start_fit);
    let taken_from_start = taken.is_some();
    let mut fits = vec![match taken {
        Some(fit) => (Ok(fit), free.decisions.clone()),
        None => (
            memory_step(
                &free.best,
                budget,
                &memory_options,
                opts.framework.map(|(fw, _)| fw),
                all,
                ctx.eval,
                opts.lean_ops,
                &mut Vec::new(),
            ),
            free.decisions.clone(),
        ),
    }];
    // Taken from the start's step, both end where that step ends and a walk from there would
    // run twice the same: the first is kept, as a tie between them keeps it.
    if taken_from_start {
        replays += start_fit.as_ref().map_or(0, |f| f.replays);
    } else {
        fits.push((start_fit, Vec::new()));
    }
    for (fitted, path) in fits {
        match fitted {
            Ok(fit) => {
                replays += fit.replays;
                let mut pre = prefix.to_vec();
                pre.extend(path);
                pre.extend(fit.decisions);
                ctx.prefix = pre.clone();
                let w = run_strategy(ctx, fit.end, replays)?;
                replays = w.replays;
                pre.extend(w.decisions.iter().cloned());
                tries.push((w, pre));
            }
            Err(e @ SearchError::Infeasible { .. }) => {
                let keep = match (&smallest, &e) {
                    (
                        Some(SearchError::Infeasible { smallest_gb: a, .. }),
                        SearchError::Infeasible { smallest_gb: b, .. },
                    ) => b < a,
                    _ => true,
                };
                if keep {
                    smallest = Some(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    match tries.into_iter().min_by_key(|(w, _)| w.best.iteration_ns()) {
        Some((mut w, d)) => {
            w.replays = replays;
            Ok((w, d))
        }
        None => Err(smallest.expect("an infeasible option was recorded")),
    }
}

/// Each decision's mechanism in the options' framework (a start point's through
/// [`framework::baseline_mechanism`]); unchanged without a framework or a mechanism.
fn name_mechanisms(opts: &SearchOptions, decisions: &mut [Decision]) {
    let Some((fw, n)) = opts.framework else {
        return;
    };
    for d in decisions {
        let m = match d.pass.strip_prefix("baseline:") {
            Some(b) => framework::baseline_mechanism(b),
            None => framework::mechanism(fw, &d.pass, n),
        };
        if let Ok(m) = m {
            d.mechanism = m.to_string();
        }
    }
}

/// The walk's best job in the report's form and the advice, with the replays counted. A plan
/// cut by the budget or the round limit carries the same report as a converged one (issue 20:
/// a budget-cut plan on a trace lost its host-bound explanation); only Ctrl-C skips it, since
/// the user asked to stop now.
fn report_form(
    walk: Walk,
    symmetric_report: bool,
    not_exported: &[String],
    opts: &SearchOptions,
    all: &[Box<dyn Pass>],
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
) -> Result<(Evaluated, Vec<Advice>, u64), SearchError> {
    let mut replays = walk.replays;
    if walk.stop == StopReason::Interrupted {
        return Ok((walk.best, Vec::new(), replays));
    }
    replays += 1;
    // The walk's best is in the search's form (its job's `symmetric` flag as the evaluator
    // set it): when the report's form is the same and no DDP layout is applied on the way, the
    // report's evaluation is the one the advice needs, so it is kept whole until advised.
    let same_form = opts.ddp.is_none() && walk.best.job.symmetric == symmetric_report;
    let keep = if same_form { usize::MAX } else { opts.lean_ops };
    let mut best = evaluate_full(walk.best.job, symmetric_report, keep)?;
    let (advice, n) = advise(&best, same_form, not_exported, opts, all, eval)?;
    lean_from(&mut best, opts.lean_ops);
    replays += n;
    Ok((best, advice, replays))
}

/// The advice for a plan whose best job is `best` (any form, lean or not): each pass the
/// options allow but the framework's export does not apply, on its own (see [`advise`]), with
/// the number of replays it took. What `plan` reports when the search thread did not finish
/// in time and the plan is written from its snapshot.
pub fn advice_for(
    best: &Evaluated,
    opts: &SearchOptions,
    all: &[Box<dyn Pass>],
) -> Result<(Vec<Advice>, u64), SearchError> {
    let (_, not_exported) = split_passes(opts, all);
    let plain = evaluator(opts.speedups.symmetry);
    let eval = |job: Job| match &opts.ddp {
        Some(layout) => plain(layout.apply(job)),
        None => plain(job),
    };
    advise(best, false, &not_exported, opts, all, &eval)
}

/// Each pass of `names` (not exported by the plan's framework) applied on its own to the best
/// job, as `whatif` would: its effect, and why the export does not apply it, with the number
/// of replays it took. Passes that propose nothing or fail are left out. The passes are shown
/// the best job evaluated the way the search evaluates (`eval`), and each effect is measured
/// against that evaluation: `best` itself may be lean or in the report's form (issue 20: the
/// lean final evaluation of a large job reached `tensor-fusion`, which panicked). With
/// `as_searched`, `best` is a full evaluation made as `eval` would make it and is used as it is
/// (one replay fewer: 3.3 s of the 405B Megatron plan's 38 s).
fn advise(
    best: &Evaluated,
    as_searched: bool,
    names: &[String],
    opts: &SearchOptions,
    all: &[Box<dyn Pass>],
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
) -> Result<(Vec<Advice>, u64), SearchError> {
    let Some((fw, n)) = opts.framework else {
        return Ok((Vec::new(), 0));
    };
    if names.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let reuse = as_searched && !is_lean(best);
    let own;
    let best = if reuse {
        best
    } else {
        own = eval(best.job.clone())?;
        &own
    };
    // Each pass: its advice if any, and whether it was replayed.
    let tried: Vec<Result<(Option<Advice>, bool), SearchError>> = names
        .par_iter()
        .map(|name| {
            let p = passes::find(all, name)?;
            if framework::rules_out(name, opts.framework.map(|(fw, _)| fw), &best.job) {
                return Ok((None, false));
            }
            let knobs = passes::resolve_knobs(p, &move_knobs(p, opts, &best.job))?;
            // As in the search: a pass that cannot apply is skipped, one that proposes
            // something out of range (a user's pass file) is an error, named.
            let patches = match passes::propose(p, best, &knobs) {
                Ok(v) => v,
                Err(PassError::NotApplicable { .. }) => return Ok((None, false)),
                Err(e) => return Err(e.into()),
            };
            if patches.is_empty() {
                return Ok((None, false));
            }
            let Ok(job) = passes::apply_all(&best.job, &patches) else {
                return Ok((None, false));
            };
            let Ok(e) = eval(job) else {
                return Ok((None, true));
            };
            let effect = (e.iteration_ns() as f64 - best.iteration_ns() as f64) / 1e6;
            let worth = -effect * 1e6 >= opts.min_onoff_gain * best.iteration_ns() as f64;
            let advice = (effect < 0.0 && worth).then(|| Advice {
                pass: name.clone(),
                effect_ms: effect,
                why_not: framework::mechanism(fw, name, n)
                    .err()
                    .unwrap_or("")
                    .to_string(),
            });
            Ok((advice, true))
        })
        .collect();
    // The best job once (unless reused), then each pass whose patches were replayed.
    let mut replays = u64::from(!reuse);
    let mut out = Vec::new();
    for t in tried {
        let (advice, replayed) = t?;
        replays += u64::from(replayed);
        out.extend(advice);
    }
    Ok((out, replays))
}

/// dPRO Algorithm 1: every round, evaluate every candidate move and take the best, by
/// (iteration time, candidate index); stop when none improves or the last
/// [`SearchOptions::converge_rounds`] rounds gained less than [`SearchOptions::converge_gain`].
fn critical_path_rounds(
    ctx: &Ctx,
    mut cur: Evaluated,
    mut replays: u64,
) -> Result<Walk, SearchError> {
    let opts = ctx.opts;
    let mut decisions = Vec::new();
    let mut stop = StopReason::Converged;
    let mut history = vec![cur.iteration_ns()];
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut gains = lazy::Gains::default();
    // Lazy rounds: the next round evaluates every move (a walk about to stop on small gains
    // first checks the moves its lazy rounds skipped).
    let mut full_round = !opts.speedups.lazy;
    let mut round = 0;
    loop {
        if let Some(s) = ctx.should_stop() {
            stop = s;
            break;
        }
        if opts.max_rounds.is_some_and(|m| round >= m) {
            stop = StopReason::RoundLimit;
            break;
        }
        round += 1;
        // The move taken last round was scored lean: its graph is needed for the next moves.
        cur = in_full(cur, ctx.eval, &mut replays)?;
        let moves = ctx.moves(&cur, &used)?;
        if moves.is_empty() {
            break;
        }
        let refs: Vec<&Move> = moves.iter().collect();
        // The moves are made: the current job's graph is not needed while its candidates are
        // evaluated (dropped; see LEAN_OPS).
        lean_from(&mut cur, opts.lean_ops);
        let (best, evaluated) = if opts.speedups.lazy {
            ctx.best_move_lazy(&cur, &refs, &mut gains, full_round)
        } else {
            ctx.best_move(&cur, &refs)
        };
        replays += evaluated;
        let Some((i, next)) = best else {
            // No improvement among what was evaluated: converged, unless the budget or an
            // interrupt cut the round's evaluations short.
            if let Some(s) = ctx.should_stop() {
                stop = s;
            }
            break;
        };
        let m = &moves[i];
        decisions.push(decision(&cur, m, &next));
        ctx.mark_used(m, &mut used);
        cur = next;
        history.push(cur.iteration_ns());
        ctx.report(&cur, &decisions, replays, round);
        let r = opts.converge_rounds;
        if history.len() > r {
            let old = history[history.len() - 1 - r] as f64;
            if (old - cur.iteration_ns() as f64) / old < opts.converge_gain {
                if full_round {
                    break;
                }
                full_round = true;
                continue;
            }
        }
        full_round = !opts.speedups.lazy;
    }
    Ok(Walk {
        best: cur,
        decisions,
        replays,
        stop,
        rounds: round,
    })
}

fn is_granular(allowed: &[&dyn Pass], name: &str) -> bool {
    allowed.iter().any(|p| p.name() == name && p.granular())
}

/// Every move of this round: each site of a granular pass alone, each other pass (not yet
/// taken) as one move, in pass order.
fn candidate_moves(
    cur: &Evaluated,
    allowed: &[&dyn Pass],
    used: &BTreeSet<String>,
    opts: &SearchOptions,
) -> Result<Vec<Move>, SearchError> {
    let mut moves = Vec::new();
    for p in allowed {
        if used.contains(p.name())
            || framework::rules_out(p.name(), opts.framework.map(|(fw, _)| fw), &cur.job)
        {
            continue;
        }
        for (run, fw_knobs) in knob_sets(*p, opts, &cur.job) {
            let knobs = passes::resolve_knobs(*p, &run)?;
            let patches = match passes::propose(*p, cur, &knobs) {
                Ok(v) => v,
                Err(PassError::NotApplicable { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if patches.is_empty() {
                continue;
            }
            if p.granular() {
                moves.extend(patches.into_iter().map(|patch| Move {
                    pass: p.name().to_string(),
                    patches: vec![patch],
                    knobs: fw_knobs.clone(),
                }));
            } else {
                moves.push(Move {
                    pass: p.name().to_string(),
                    patches,
                    knobs: fw_knobs,
                });
            }
        }
    }
    Ok(moves)
}

/// The knob sets `p` is tried with this round, each as (the knobs it runs with, the knobs its
/// decision records): one ([`move_knobs`], [`decision_knobs`]); for `shard` on a recorded
/// FSDP2 step, one per [`recorded_fsdp_variants`] (the search takes at most one: the pass is
/// then used).
type KnobSet = (Vec<(String, String)>, Vec<(String, String)>);
fn knob_sets(p: &dyn Pass, opts: &SearchOptions, job: &Job) -> Vec<KnobSet> {
    let variants = if p.name() == "shard" {
        recorded_fsdp_variants(job)
    } else {
        Vec::new()
    };
    if variants.is_empty() {
        return vec![(move_knobs(p, opts, job), decision_knobs(p, opts, job))];
    }
    variants
        .into_iter()
        .map(|v| {
            let mut run = speedup_knobs(p, &opts.speedups);
            run.extend(v.iter().cloned());
            (run, v)
        })
        .collect()
}

/// The `shard` moves on a recorded FSDP2 step, each a set of knobs: keep the units resharded
/// after the forward gathered (`reshard=0`), issue every all-gather two units ahead
/// (`prefetch=2`, with three units or more), or both. Empty for any other job.
fn recorded_fsdp_variants(job: &Job) -> Vec<Vec<(String, String)>> {
    let Some(s) = job.meta.trace.as_ref().and_then(|f| f.sharding.as_ref()) else {
        return Vec::new();
    };
    let reshard = ("reshard".to_string(), "0".to_string());
    let prefetch = ("prefetch".to_string(), "2".to_string());
    let mut v = Vec::new();
    if !s.resharded.is_empty() {
        v.push(vec![reshard.clone()]);
    }
    if s.units.len() >= 3 {
        v.push(vec![prefetch.clone()]);
        if !s.resharded.is_empty() {
            v.push(vec![reshard, prefetch]);
        }
    }
    v
}

/// The first of [`recorded_fsdp_variants`]: what a pass tried once (the advice on passes the
/// export cannot apply) runs with.
fn recorded_fsdp_knobs(job: &Job) -> Option<Vec<(String, String)>> {
    recorded_fsdp_variants(job).into_iter().next()
}

/// The speed-up switches as knob overrides, for the passes that declare them: `coarsen`
/// (op-fusion, tensor-fusion: the coarsened view), `partial` (tensor-partition: partial vs
/// full replay) and `twins` (op-fusion: block symmetry, with the symmetry switch).
pub fn speedup_knobs(p: &dyn Pass, s: &Speedups) -> Vec<(String, String)> {
    let bit = |on: bool| if on { "1" } else { "0" }.to_string();
    p.knobs()
        .iter()
        .filter_map(|k| match k.name.as_str() {
            "coarsen" => Some((k.name.clone(), bit(s.coarsen))),
            "partial" => Some((k.name.clone(), bit(s.partial_replay))),
            "twins" => Some((k.name.clone(), bit(s.symmetry))),
            _ => None,
        })
        .collect()
}

/// The knobs a move of `p` on `job` runs with: the speed-up switches ([`speedup_knobs`]) and
/// the knobs its decision records ([`decision_knobs`]).
fn move_knobs(p: &dyn Pass, opts: &SearchOptions, job: &Job) -> Vec<(String, String)> {
    let mut k = speedup_knobs(p, &opts.speedups);
    k.extend(decision_knobs(p, opts, job));
    k
}

/// The knobs a decision of `p` on `job` records: what the framework's export needs
/// ([`framework::pass_knobs`]); on a recorded FSDP2 step, `shard`'s change of its recorded
/// sharding ([`recorded_fsdp_knobs`]).
fn decision_knobs(p: &dyn Pass, opts: &SearchOptions, job: &Job) -> Vec<(String, String)> {
    if p.name() == "shard"
        && let Some(k) = recorded_fsdp_knobs(job)
    {
        return k;
    }
    framework::pass_knobs(p.name(), opts.framework.map(|(fw, _)| fw))
}

/// Over the memory budget: the fastest option that fits, among recomputation, gradient
/// accumulation (every `k` that leaves a whole number of samples per micro-step, see
/// [`accumulation_steps`]), AMP, and their combinations, each tried on `cur` by replay. The
/// budget is compared with the device-used peak (what must fit the GPU).
/// A pass with knob assignments, as the memory step tries it.
type KnobbedPass = (String, Vec<(String, String)>);
/// One option the memory step tried: its steps, the outcome, and each step's evaluation and
/// patches.
type Tried = (Vec<KnobbedPass>, Result<(Evaluated, Trail), SearchError>);
/// Each step of an option: the evaluation it started from and its patches.
type Trail = Vec<(Evaluated, Vec<Patch>)>;

/// The peak a memory budget of `budget` bytes is compared with: device-used (reserved + CUDA
/// context + NCCL), and the whole need, with what the framework keeps out of its pool, within
/// the GPU ([`crate::cost::memory::MemoryPeaks::against_budget`]).
pub fn budget_peak(e: &Evaluated, budget: u64) -> u64 {
    e.memory
        .peaks
        .against_budget(e.job.gpu.memory_bytes(), budget)
}

/// Accumulation steps the memory step tries for a per-GPU batch of `batch` samples: the
/// divisors of the batch above 1 (every micro-step a whole number of samples), at most 12
/// spread geometrically, always with `batch` itself (one sample per micro-step). A batch of 0
/// (a trace that does not say) gives 2, 4, 8, 16.
pub fn accumulation_steps(batch: u32) -> Vec<u32> {
    if batch == 0 {
        return vec![2, 4, 8, 16];
    }
    let mut divs: Vec<u32> = (2..=batch)
        .take_while(|d| u64::from(*d) * u64::from(*d) <= u64::from(batch))
        .filter(|d| batch.is_multiple_of(*d))
        .flat_map(|d| [d, batch / d])
        .chain(std::iter::once(batch).filter(|&b| b > 1))
        .collect();
    divs.sort_unstable();
    divs.dedup();
    if divs.len() <= 12 {
        return divs;
    }
    // Thin to about 12, geometrically, keeping the smallest and the largest.
    let (lo, hi) = (divs[0] as f64, *divs.last().unwrap_or(&1) as f64);
    let mut out: Vec<u32> = (0..12)
        .map(|i| {
            let target = lo * (hi / lo).powf(i as f64 / 11.0);
            *divs
                .iter()
                .min_by(|a, b| {
                    ((**a as f64).ln() - target.ln())
                        .abs()
                        .total_cmp(&((**b as f64).ln() - target.ln()).abs())
                })
                .unwrap_or(&divs[0])
        })
        .collect();
    out.dedup();
    out
}

fn label(steps: &[KnobbedPass]) -> String {
    steps
        .iter()
        .map(|(n, k)| match k.first() {
            Some((kn, v)) => format!("{n}:{kn}={v}"),
            None => n.clone(),
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The memory step: every memory option the passes `allowed` give (see [`memory_options`])
/// tried on `cur` in parallel; the fastest whose peak fits `budget`, with the replays taken
/// and its decisions. None fitting is [`SearchError::Infeasible`], naming the smallest peak
/// reached and what would fit.
#[allow(clippy::too_many_arguments)]
fn memory_step(
    cur: &Evaluated,
    budget: u64,
    allowed: &[&str],
    fw: Option<Framework>,
    all: &[Box<dyn Pass>],
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
    lean_ops: usize,
    rows: &mut Vec<layout::LayoutRow>,
) -> Result<MemoryFit, SearchError> {
    let options = without_hopeless(cur, budget, memory_options(cur, allowed, fw));
    if options.is_empty() && cp_options(cur, allowed, fw, None).is_empty() {
        return Err(SearchError::Infeasible {
            budget_gb: budget as f64 / 1e9,
            smallest_gb: budget_peak(cur, budget) as f64 / 1e9,
            how: format!(
                "no memory option allowed: --passes and the framework's export leave neither amp, recompute, grad-accumulation nor shard; {}",
                what_would_fit(cur, budget, 1, 1)
            ),
            layouts: Vec::new(),
        });
    }
    let (workers, batch) = (cur.job.workers, cur.job.meta.batch);
    // Each option's row as it is tried; of the options themselves (each a job and its trail)
    // only those that can still be chosen are kept (a 70 B model's 57 options held 1.5 GB).
    let run = |options: &[Vec<KnobbedPass>], from: usize| -> Kept {
        options
            .par_iter()
            .enumerate()
            .map(|(i, steps)| {
                let r = try_memory_option(cur, steps, all, eval, lean_ops, false);
                let row = r
                    .as_ref()
                    .ok()
                    .map(|(e, _)| layout::row(steps, e, workers, batch, budget));
                let replays = u64::from(r.is_ok());
                Kept {
                    tried: vec![(from + i, (steps.clone(), r))],
                    rows: row.into_iter().collect(),
                    replays,
                }
            })
            .reduce(Kept::default, |a, b| a.merge(b, budget))
    };
    let mut kept = run(&options, 0);
    // Context parallelism: where nothing above fits, or the fastest that fits recomputes
    // (splitting the sequence may hold less than recomputing does, for less time).
    let best = kept
        .tried
        .iter()
        .filter_map(|(_, (steps, r))| r.as_ref().ok().map(|(e, _)| (steps, e)))
        .filter(|(_, e)| budget_peak(e, budget) <= budget)
        .min_by_key(|(_, e)| e.iteration_ns())
        .map(|(steps, _)| steps.clone());
    if best
        .as_ref()
        .is_none_or(|b| b.iter().any(|(n, _)| n == "recompute"))
    {
        let more = without_hopeless(cur, budget, cp_options(cur, allowed, fw, best.as_deref()));
        if !more.is_empty() {
            kept = kept.merge(run(&more, options.len()), budget);
        }
    }
    *rows = layout::ranked(
        std::iter::once(layout::row(&[], cur, workers, batch, budget))
            .chain(kept.rows)
            .collect(),
    );
    let tried = kept.tried.into_iter().map(|(_, t)| t).collect();
    let (mut steps, best, _) = fastest_fitting(cur, budget, tried)?;
    let mut extra = 0;
    // The fastest pipeline that fits, interleaved over two chunks per rank where the export
    // runs that (a smaller bubble for more sends): taken when it fits and is faster.
    if let Some(alt) = layout::interleaved(&steps, cur, fw)
        && let Ok((e, _)) = try_memory_option(cur, &alt, all, eval, lean_ops, false)
    {
        extra += 1;
        rows.push(layout::row(&alt, &e, workers, batch, budget));
        *rows = layout::ranked(std::mem::take(rows));
        if budget_peak(&e, budget) <= budget && e.iteration_ns() < best.iteration_ns() {
            steps = alt;
        }
    }
    // The chosen option again, each step replayed, for its decisions' effects (the same end:
    // replays are deterministic).
    let (e, trail) = try_memory_option(cur, &steps, all, eval, lean_ops, true)?;
    let replays = kept.replays + extra + steps.len() as u64;
    let decisions = memory_decisions(cur, budget, &steps, &e, &trail);
    Ok(MemoryFit {
        end: e,
        replays,
        decisions,
        steps,
        trail,
    })
}

/// The memory step on `cur` without a replay, from the memory step on the start (`start_fit`),
/// when `cur` is the start with that step's first pass applied (AMP, the one pass the memory
/// step puts first: [`memory_options`]) and the step chose an option that begins with it. The
/// options on `cur` are then the start's options that begin with that pass, less it (`cur`
/// has AMP, so none puts AMP first), minus only options [`without_hopeless`] drops, which
/// cannot fit: the fastest of them that fits, the start's choice less its first pass, is the
/// same option, ties kept in the same order. `None` when that does not hold (then the step
/// runs). Llama 3 405B on 16,384 H100s: the unconstrained walk's best is the start with AMP,
/// and the second memory step took 19 of the plan's 62 s.
fn memory_step_after_first(
    cur: &Evaluated,
    budget: u64,
    start_fit: &StartFit,
) -> Option<MemoryFit> {
    let fit = start_fit.as_ref().ok()?;
    let (first, after_first) = (fit.steps.first()?, fit.trail.get(1)?);
    if first.0 != "amp" || fit.trail.len() != fit.steps.len() || after_first.0.job != cur.job {
        return None;
    }
    let steps = fit.steps[1..].to_vec();
    let trail = fit.trail[1..].to_vec();
    let decisions = memory_decisions(cur, budget, &steps, &fit.end, &trail);
    Some(MemoryFit {
        end: fit.end.clone(),
        replays: 0,
        decisions,
        steps,
        trail,
    })
}

/// `options` less those that cannot fit: an option that keeps every rank's weights, gradients
/// and optimizer state whole cannot fit when those and the runtime alone are over the budget
/// (AMP adds half copies; recomputation and accumulation leave them as they are), so when a
/// sharded or tensor-parallel option (each divides them) is left they are not tried (a 70 B
/// model on 512 GPUs: half the options, each a replay of the whole model).
fn without_hopeless(
    cur: &Evaluated,
    budget: u64,
    mut options: Vec<Vec<KnobbedPass>>,
) -> Vec<Vec<KnobbedPass>> {
    let b = &cur.memory.peaks.breakdown;
    let floor = b.static_bytes + b.workspace_bytes + b.context_bytes + b.nccl_bytes;
    let sharded = |o: &Vec<KnobbedPass>| {
        o.iter()
            .any(|(n, _)| n == "shard" || n == "tensor-parallel" || n == "pipeline")
    };
    if floor > budget && options.iter().any(sharded) {
        options.retain(sharded);
    }
    options
}

/// The memory options, each a list of passes with knobs: AMP alone (when allowed and the job
/// is in fp32), then with and without AMP first, recomputation, gradient accumulation at each
/// k [`accumulation_steps`] gives, and recomputation with the largest k; then each sharding
/// the framework's export applies ([`shard_options`]), alone and before those; then each
/// tensor-parallel layout ([`layout::tp_layouts`]) before all of those, where the export
/// applies it with that sharding ([`layout::layout_exported`]). The memory step is the layout search: a layout
/// is a memory move, met when the job does not fit as it is.
fn memory_options(
    cur: &Evaluated,
    allowed: &[&str],
    fw: Option<Framework>,
) -> Vec<Vec<KnobbedPass>> {
    let has = |p: &str| allowed.contains(&p);
    let amp_on = cur.job.dtype != crate::cost::config::Dtype::Fp32;
    let mut firsts: Vec<Vec<KnobbedPass>> = vec![Vec::new()];
    if has("amp") && !amp_on && !framework::rules_out("amp", fw, &cur.job) {
        firsts.push(vec![("amp".into(), framework::pass_knobs("amp", fw))]);
    }
    // A tensor-parallel group of t ranks trains t x the per-GPU batch: its k divide that.
    let ks_of = |head: &[KnobbedPass]| -> Vec<u32> {
        if !has("grad-accumulation") {
            return Vec::new();
        }
        let t = layout::knob_of(head, "tensor-parallel", "degree").unwrap_or(1);
        accumulation_steps(cur.job.meta.batch.saturating_mul(t))
    };
    let acc = |k: u32| accumulate(k, fw);
    let shards = if has("shard") {
        shard_options(cur, fw)
    } else {
        Vec::new()
    };
    let layouts = if has("tensor-parallel") {
        layout::tp_layouts(cur)
    } else {
        Vec::new()
    };
    let mut options: Vec<Vec<KnobbedPass>> = Vec::new();
    for (fi, first) in firsts.iter().enumerate() {
        // Without tensor parallelism, then at each degree; each without sharding, then with
        // each sharding the export applies (over the data-parallel ranks the degree leaves).
        let mut heads: Vec<Vec<KnobbedPass>> = Vec::new();
        for tp in std::iter::once(None).chain(layouts.iter().map(Some)) {
            let mut base = first.clone();
            base.extend(tp.cloned());
            for sh in std::iter::once(None).chain(shards.iter().map(Some)) {
                let mut h = base.clone();
                h.extend(sh.cloned());
                if layout::layout_exported(&h, &cur.job, fw) {
                    heads.push(h);
                }
            }
        }
        for head in heads {
            // Pipelines after the head's tensor parallelism, beside the shardings a pipeline
            // runs with in the export (unsharded or stage 1: Megatron-LM; stage 3 without
            // resharding: torchtitan's FSDP2), with and without recomputation; after AMP only,
            // where AMP is an option (fp32 pipelines double the options for plans no faster).
            let beside_pipeline = layout::beside_pipeline(&head, fw);
            if has("pipeline")
                && fi + 1 == firsts.len()
                && beside_pipeline
                && let Some(ph) = layout::pipeline_head(&head, &cur.job, fw)
            {
                let t = layout::knob_of(&ph, "tensor-parallel", "degree").unwrap_or(1);
                for pp in layout::pp_layouts(cur, t, fw) {
                    let mut o = ph.clone();
                    o.push(pp.clone());
                    options.push(o);
                    if has("recompute") {
                        for r in recompute_moves(fw) {
                            let mut o = ph.clone();
                            o.push(r);
                            o.push(pp.clone());
                            options.push(o);
                        }
                    }
                }
            }
            let ks = ks_of(&head);
            let with = |rest: Vec<KnobbedPass>| {
                let mut v = head.clone();
                v.extend(rest);
                v
            };
            if !head.is_empty() {
                options.push(head.clone());
            }
            if has("recompute") {
                for r in recompute_moves(fw) {
                    options.push(with(vec![r]));
                }
            }
            // Every k without sharding or tensor parallelism; with either, the largest only
            // (the options multiply).
            let sharded = head
                .iter()
                .any(|(n, _)| n == "shard" || n == "tensor-parallel");
            for &k in ks.iter().filter(|&&k| !sharded || Some(&k) == ks.last()) {
                options.push(with(vec![acc(k)]));
            }
            if has("recompute")
                && let Some(&k) = ks.last()
            {
                for r in recompute_moves(fw) {
                    options.push(with(vec![r, acc(k)]));
                }
            }
        }
    }
    options
}

/// The memory options with context parallelism (`memory_step` tries them where none of
/// [`memory_options`] fits, or the fastest that fits, `best`, recomputes). With nothing
/// fitting: after AMP where it is an option, each tensor-parallel layout (and none) meets each
/// context-parallel degree the pass takes there ([`layout::cp_layouts`]) and each sharding the
/// export applies with them; each such head then runs with the most accumulation steps (one
/// sample per group per micro-step: the least a rank can hold) or, where the export runs one,
/// each pipeline, with and without recomputation. Beside a `best` that recomputes: `best`'s
/// AMP, tensor-parallel degree and pipeline depth, with each context-parallel degree and
/// sharding and no recomputation (a few options, not the whole table again).
fn cp_options(
    cur: &Evaluated,
    allowed: &[&str],
    fw: Option<Framework>,
    best: Option<&[KnobbedPass]>,
) -> Vec<Vec<KnobbedPass>> {
    let has = |p: &str| allowed.contains(&p);
    if !has("context-parallel") {
        return Vec::new();
    }
    if let Some(best) = best {
        return cp_beside(cur, allowed, fw, best);
    }
    let mut first: Vec<KnobbedPass> = Vec::new();
    if has("amp")
        && cur.job.dtype == crate::cost::config::Dtype::Fp32
        && !framework::rules_out("amp", fw, &cur.job)
    {
        first.push(("amp".into(), framework::pass_knobs("amp", fw)));
    }
    let layouts = if has("tensor-parallel") {
        layout::tp_layouts(cur)
    } else {
        Vec::new()
    };
    let tps: Vec<Option<KnobbedPass>> = std::iter::once(None)
        .chain(layouts.into_iter().map(Some))
        .collect();
    let shards = if has("shard") {
        shard_options(cur, fw)
    } else {
        Vec::new()
    };
    let recomputes = if has("recompute") {
        recompute_moves(fw)
    } else {
        Vec::new()
    };
    let mut options = Vec::new();
    for tp in &tps {
        let t = tp.as_ref().map_or(1, |tp| {
            layout::knob_of(std::slice::from_ref(tp), "tensor-parallel", "degree").unwrap_or(1)
        });
        for cp in layout::cp_layouts(cur, t, fw) {
            let c = layout::knob_of(std::slice::from_ref(&cp), "context-parallel", "degree")
                .unwrap_or(1);
            for sh in std::iter::once(None).chain(shards.iter().map(Some)) {
                let mut head = first.clone();
                head.extend(tp.iter().cloned());
                head.push(cp.clone());
                head.extend(sh.cloned());
                if !layout::layout_exported(&head, &cur.job, fw) {
                    continue;
                }
                let mut tails: Vec<KnobbedPass> = Vec::new();
                if has("grad-accumulation")
                    && let Some(&k) =
                        accumulation_steps(cur.job.meta.batch.saturating_mul(t * c)).last()
                {
                    tails.push(accumulate(k, fw));
                }
                if has("pipeline") && layout::beside_pipeline(&head, fw) {
                    tails.extend(layout::pp_layouts(cur, t * c, fw));
                }
                for tail in tails {
                    for r in std::iter::once(None).chain(recomputes.iter().map(Some)) {
                        let mut o = head.clone();
                        o.extend(r.cloned());
                        o.push(tail.clone());
                        options.push(o);
                    }
                }
            }
        }
    }
    options
}

/// The memory step's `grad-accumulation:k=…` with the knobs `fw`'s export needs.
fn accumulate(k: u32, fw: Option<Framework>) -> KnobbedPass {
    let mut knobs = vec![("k".into(), k.to_string())];
    knobs.extend(framework::pass_knobs("grad-accumulation", fw));
    ("grad-accumulation".into(), knobs)
}

/// [`cp_options`] beside `best`, an option that fits and recomputes.
fn cp_beside(
    cur: &Evaluated,
    allowed: &[&str],
    fw: Option<Framework>,
    best: &[KnobbedPass],
) -> Vec<Vec<KnobbedPass>> {
    let has = |p: &str| allowed.contains(&p);
    let step = |name: &str| best.iter().find(|(n, _)| n == name).cloned();
    let t = layout::knob_of(best, "tensor-parallel", "degree").unwrap_or(1);
    let stages = layout::knob_of(best, "pipeline", "stages");
    let shards = if has("shard") {
        shard_options(cur, fw)
    } else {
        Vec::new()
    };
    let mut options = Vec::new();
    for cp in layout::cp_layouts(cur, t, fw) {
        let c =
            layout::knob_of(std::slice::from_ref(&cp), "context-parallel", "degree").unwrap_or(1);
        for sh in std::iter::once(None).chain(shards.iter().map(Some)) {
            let mut head: Vec<KnobbedPass> = step("amp").into_iter().collect();
            head.extend(step("tensor-parallel"));
            head.push(cp.clone());
            head.extend(sh.cloned());
            if !layout::layout_exported(&head, &cur.job, fw)
                || (stages.is_some() && !layout::beside_pipeline(&head, fw))
            {
                continue;
            }
            let tail = match stages {
                Some(p) => layout::pp_layouts(cur, t * c, fw).into_iter().find(|pp| {
                    layout::knob_of(std::slice::from_ref(pp), "pipeline", "stages") == Some(p)
                }),
                None if has("grad-accumulation") => {
                    accumulation_steps(cur.job.meta.batch.saturating_mul(t * c))
                        .last()
                        .map(|&k| accumulate(k, fw))
                }
                None => None,
            };
            if stages.is_some() && tail.is_none() {
                continue;
            }
            head.extend(tail);
            options.push(head);
        }
    }
    options
}

/// The recomputations the memory step tries: the one `fw`'s export applies
/// ([`framework::pass_knobs`]); with Megatron-LM also its selective recomputation of the
/// attention core (`policy=selective`, `--recompute-granularity selective`), which frees the
/// s²-sized activations for a fraction of a full recomputation's time (not applicable to a
/// flash-attention model: that option then drops out).
fn recompute_moves(fw: Option<Framework>) -> Vec<KnobbedPass> {
    let mut v = vec![(
        "recompute".to_string(),
        framework::pass_knobs("recompute", fw),
    )];
    if fw == Some(Framework::Megatron) {
        v.push((
            "recompute".to_string(),
            vec![("policy".to_string(), "selective".to_string())],
        ));
    }
    v
}

/// The shardings the memory step tries: stages 1, 2 and 3 (3 with and without resharding
/// after the forward), prefetch one, over every worker — those [`framework::shard_supported`]
/// lets `fw`'s export apply; then stages 2 and 3 with the optimizer offloaded to the host
/// (slow: chosen only when nothing faster fits) where [`framework::offload_supported`] lets
/// it. None for a job already sharded or on one worker.
fn shard_options(cur: &Evaluated, fw: Option<Framework>) -> Vec<KnobbedPass> {
    let sharded = cur
        .job
        .syncs
        .iter()
        .any(|s| s.kind != crate::graph::comm::CollectiveKind::AllReduce);
    if sharded || cur.job.workers < 2 {
        return Vec::new();
    }
    let offload = cur.job.gpu.host_link_gbps.is_some()
        && fw.is_none_or(|fw| framework::offload_supported(fw).is_ok());
    [
        (1, true, false),
        (2, true, false),
        (3, true, false),
        (3, false, false),
        (2, true, true),
        (3, true, true),
    ]
    .into_iter()
    .filter(|&(stage, reshard, off)| {
        (!off || offload)
            && fw.is_none_or(|fw| framework::shard_supported(fw, stage, 1, reshard).is_ok())
    })
    .map(|(stage, reshard, off)| {
        let mut knobs = vec![
            ("stage".to_string(), stage.to_string()),
            ("reshard".to_string(), u32::from(reshard).to_string()),
        ];
        if off {
            knobs.push(("offload".to_string(), "1".to_string()));
        }
        ("shard".to_string(), knobs)
    })
    .collect()
}

/// The passes of a memory option ([`memory_options`]): each proposes from its input's job
/// alone, never from its replay, so an option's intermediate jobs need no replay.
/// `memory_passes_propose_from_the_job_alone` holds them to it.
pub(crate) const MEMORY_PASSES: [&str; 7] = [
    "amp",
    "tensor-parallel",
    "context-parallel",
    "shard",
    "recompute",
    "grad-accumulation",
    "pipeline",
];

/// One memory option's passes applied in turn from `cur` (shown in full even when `cur` is
/// lean); the end, evaluated, and with `trail` each intermediate result evaluated too (the
/// trail, for the chosen option's decisions: without it, empty), made lean per `lean_ops`.
/// Without the trail the option costs one replay: each pass is shown the job before it in a
/// shell that carries the start's numbers ([`MEMORY_PASSES`] read the job alone).
fn try_memory_option(
    cur: &Evaluated,
    steps: &[KnobbedPass],
    all: &[Box<dyn Pass>],
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
    lean_ops: usize,
    trail: bool,
) -> Result<(Evaluated, Trail), SearchError> {
    if !trail
        && steps
            .iter()
            .all(|(n, _)| MEMORY_PASSES.contains(&n.as_str()))
    {
        let shell = lean_clone(cur, 0);
        let mut job = cur.job.clone();
        for (name, knobs) in steps {
            let p = passes::find(all, name)?;
            let k = passes::resolve_knobs(p, knobs)?;
            let before = Evaluated {
                job,
                ..shell.clone()
            };
            let patches = p.propose(&before, &k)?;
            job = passes::apply_all(&before.job, &patches)?;
        }
        let mut end = eval(job)?;
        lean_from(&mut end, lean_ops);
        return Ok((end, Vec::new()));
    }
    // A lean start (the unconstrained search's best, scored lean) is shown to the passes in
    // full.
    let mut e = if cur.is_lean() {
        eval(cur.job.clone())?
    } else {
        cur.clone()
    };
    let mut trail = Vec::new();
    for (name, knobs) in steps {
        let p = passes::find(all, name)?;
        let k = passes::resolve_knobs(p, knobs)?;
        let patches = passes::propose(p, &e, &k)?;
        let job = passes::apply_all(&e.job, &patches)?;
        let next = eval(job)?;
        trail.push((e, patches));
        e = next;
    }
    lean_from(&mut e, lean_ops);
    for t in &mut trail {
        lean_from(&mut t.0, lean_ops);
    }
    Ok((e, trail))
}

/// What the memory step keeps of the options tried so far: those [`fastest_fitting`] can
/// still choose (the fastest fitting and the smallest peak, the first of equals), with their
/// position in option order; every option's row; the replays.
#[derive(Default)]
struct Kept {
    tried: Vec<(usize, Tried)>,
    rows: Vec<layout::LayoutRow>,
    replays: u64,
}

impl Kept {
    /// `self` (earlier options) and `later` together, pruned to what can still be chosen.
    fn merge(mut self, later: Kept, budget: u64) -> Kept {
        self.tried.extend(later.tried);
        self.rows.extend(later.rows);
        self.replays += later.replays;
        fn ok(t: &(usize, Tried)) -> Option<&Evaluated> {
            t.1.1.as_ref().ok().map(|(e, _)| e)
        }
        let first_min = |key: &dyn Fn(&Evaluated) -> Option<u64>| -> Option<usize> {
            self.tried
                .iter()
                .filter_map(|t| ok(t).and_then(key).map(|k| (k, t.0)))
                .min()
                .map(|(_, i)| i)
        };
        let fastest = first_min(&|e| (budget_peak(e, budget) <= budget).then(|| e.iteration_ns()));
        let smallest = first_min(&|e| Some(budget_peak(e, budget)));
        self.tried
            .retain(|t| Some(t.0) == fastest || Some(t.0) == smallest);
        self.tried.sort_by_key(|t| t.0);
        self
    }
}

/// The fastest tried option whose peak fits `budget` (the first of equals, in option order).
/// None fitting: [`SearchError::Infeasible`] naming the smallest peak among the options and
/// the start, and what would fit from there.
fn fastest_fitting(
    cur: &Evaluated,
    budget: u64,
    tried: Vec<Tried>,
) -> Result<(Vec<KnobbedPass>, Evaluated, Trail), SearchError> {
    let k_of = |steps: &[KnobbedPass]| -> u32 {
        steps
            .iter()
            .filter(|(n, _)| n == "grad-accumulation")
            .filter_map(|(_, k)| k.first().and_then(|(_, v)| v.parse().ok()))
            .next()
            .unwrap_or(1)
    };
    // The ranks a `shard` step shards the states over (workers / replicas), 1 without one.
    let group_of = |steps: &[KnobbedPass], e: &Evaluated| -> u32 {
        steps
            .iter()
            .filter(|(n, _)| n == "shard")
            .map(|(_, k)| {
                let replicas = k
                    .iter()
                    .find(|(n, _)| n == "replicas")
                    .and_then(|(_, v)| v.parse::<u32>().ok())
                    .unwrap_or(1);
                e.job.workers.max(1) / replicas.max(1)
            })
            .next()
            .unwrap_or(1)
    };
    let mut smallest: Option<(u64, String, Evaluated, (u32, u32))> = None;
    let mut best: Option<(Vec<KnobbedPass>, Evaluated, Trail)> = None;
    for (steps, r) in tried {
        let Ok((e, trail)) = r else { continue };
        let peak = budget_peak(&e, budget);
        if smallest.as_ref().is_none_or(|(b, _, _, _)| peak < *b) {
            let g = group_of(&steps, &e);
            smallest = Some((peak, label(&steps), e.clone(), (k_of(&steps), g)));
        }
        if peak <= budget
            && best
                .as_ref()
                .is_none_or(|(_, b, _)| e.iteration_ns() < b.iteration_ns())
        {
            best = Some((steps, e, trail));
        }
    }
    if let Some(best) = best {
        return Ok(best);
    }
    let (bytes, how, s, k) = smallest.unwrap_or((
        budget_peak(cur, budget),
        "no option ran".into(),
        cur.clone(),
        (1, 1),
    ));
    let (bytes, how, s, k) = if bytes <= budget_peak(cur, budget) {
        (bytes, how, s, k)
    } else {
        (
            budget_peak(cur, budget),
            "the start".into(),
            cur.clone(),
            (1, 1),
        )
    };
    Err(SearchError::Infeasible {
        budget_gb: budget as f64 / 1e9,
        smallest_gb: bytes as f64 / 1e9,
        how: format!("{how}; {}", what_would_fit(&s, budget, k.0, k.1)),
        layouts: Vec::new(),
    })
}

/// One decision per step of the chosen memory option `steps` (ending at `e`), each with the
/// ops its patches touched and its effect along the trail.
fn memory_decisions(
    cur: &Evaluated,
    budget: u64,
    steps: &[KnobbedPass],
    e: &Evaluated,
    trail: &Trail,
) -> Vec<Decision> {
    let all_label = label(steps);
    let mut decisions = Vec::new();
    for (i, ((name, knobs), (before, patches))) in steps.iter().zip(trail).enumerate() {
        let after = trail.get(i + 1).map_or(e, |t| &t.0);
        let ops = patches
            .iter()
            .flat_map(|p| describe(&before.job, p).1)
            .collect();
        decisions.push(Decision {
            pass: name.clone(),
            tensors: Vec::new(),
            ops,
            partitions: None,
            knobs: knobs.iter().cloned().collect(),
            why: format!(
                "memory step: device memory {:.2} GB over the budget of {:.2} GB; {all_label} is the fastest option that fits ({:.2} GB)",
                budget_peak(cur, budget) as f64 / 1e9,
                budget as f64 / 1e9,
                budget_peak(e, budget) as f64 / 1e9
            ),
            effect_ms: (after.iteration_ns() as f64 - before.iteration_ns() as f64) / 1e6,
            mechanism: String::new(),
        });
    }
    decisions
}

/// What would fit when nothing the passes reach does, from the smallest evaluation `s`: the
/// largest per-GPU micro-batch the room left by its fixed memory holds (activations grow with
/// the micro-batch), or, when not even one sample fits, how many GPUs the weights, gradients
/// and optimizer state would have to be sharded over (`sharded`: the ranks `s` already shards
/// them over, 1 when it does not).
pub fn what_would_fit(s: &Evaluated, budget: u64, k: u32, sharded: u32) -> String {
    let p = &s.memory.peaks;
    let b = &p.breakdown;
    let fixed = budget_peak(s, budget).saturating_sub(b.dynamic_bytes);
    let batch = u64::from(s.job.meta.batch);
    let k = u64::from(k.max(1));
    let micro = (batch / k).max(1);
    let per_sample = b.dynamic_bytes / micro;
    let gb = |x: u64| x as f64 / 1e9;
    if batch > 0 && fixed < budget && per_sample > 0 {
        let fit = (budget - fixed) / per_sample;
        let (tp, cp) = (s.job.meta.tp.max(1), s.job.meta.cp.max(1));
        let group = u64::from(tp) * u64::from(cp);
        if fit >= 1 && group > 1 {
            // A tensor- or context-parallel group trains the samples together: say it per
            // group.
            let kind = match (tp > 1, cp > 1) {
                (true, false) => "tensor-parallel",
                (false, true) => "context-parallel",
                _ => "tensor- x context-parallel",
            };
            return format!(
                "{fit} sample{} per {kind} group of {group} per micro-step would fit ({:.2} GB fixed + {:.3} GB a sample): a global batch of {} on these {} GPUs",
                if fit == 1 { "" } else { "s" },
                gb(fixed),
                gb(per_sample),
                fit * u64::from(s.job.workers.max(1)) / group,
                s.job.workers
            );
        }
        if fit >= 1 {
            let w = u64::from(s.job.workers.max(1));
            let global = batch * w;
            return format!(
                "{fit} sample{} per GPU per micro-step would fit ({:.2} GB fixed + {:.3} GB a sample): a per-GPU batch of {fit} (global {}), or the global batch of {global} on {} GPUs",
                if fit == 1 { "" } else { "s" },
                gb(fixed),
                gb(per_sample),
                fit * w,
                global.div_ceil(fit).max(w)
            );
        }
    }
    let states = b.static_bytes;
    let room = budget
        .saturating_sub(fixed.saturating_sub(states))
        .saturating_sub(per_sample);
    if room == 0 || states == 0 {
        return format!(
            "the runtime and one sample alone need more than the budget ({:.2} GB fixed, {:.3} GB a sample)",
            gb(fixed.saturating_sub(states)),
            gb(per_sample)
        );
    }
    let sharded = u64::from(sharded.max(1));
    let over = if sharded > 1 {
        format!(" sharded over {sharded} GPUs")
    } else {
        String::new()
    };
    format!(
        "one sample per micro-step does not fit: weights, gradients and optimizer state are {:.2} GB per GPU{over}; shard them (ZeRO-3/FSDP: --framework pytorch, deepspeed or torchtitan) over >= {} GPUs, offload the optimizer to the host CPU (--framework deepspeed, slower), or use a smaller model",
        gb(states),
        (states * sharded).div_ceil(room).max(sharded + 1)
    )
}

/// The iteration time if synchronisation cost nothing (zero latency, unbounded bandwidth): no
/// change that only touches communication can beat it. `plan` reports it for the planned job as
/// `lower_bound_ms`.
pub fn comm_free_bound_ns(
    job: &Job,
    eval: &(dyn Fn(Job) -> Result<Evaluated, JobError> + Sync),
) -> Result<u64, JobError> {
    let mut j = job.clone();
    for link in [&mut j.comm.cost.intra, &mut j.comm.cost.inter] {
        link.alpha_ns = 0.0;
        link.bytes_per_ns = 1e18;
    }
    j.comm.cost.aggregate_bytes_per_ns = 1e18;
    Ok(eval(j)?.iteration_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory step replays an option's end only: its passes must propose from the job
    /// alone. Every option the memory step makes for a job (each framework's) ends where the
    /// step-by-step replay of the same passes ends, and the chosen option's trail is the same.
    /// A two-block Llama (flash attention) at one 8,192-token sequence per GPU on 8 H200s.
    fn long_llama() -> Job {
        let opts = crate::zoo::ModelOptions {
            batch: Some(1),
            layers: Some(2),
            seq: Some(8192),
            ..Default::default()
        };
        crate::zoo::build::test_job_with("llama", &opts, "8xh200").1
    }

    #[test]
    fn context_parallel_options_propose_from_the_job_alone_and_follow_the_export() {
        let job = long_llama();
        let cur = passes::evaluate(job).unwrap();
        let all = passes::registry();
        let eval = |j: Job| passes::evaluate(j);
        for fw in [None, Some(Framework::Megatron), Some(Framework::Torchtitan)] {
            let options = cp_options(&cur, &MEMORY_PASSES, fw, None);
            assert!(options.len() > 4, "{fw:?}: {}", options.len());
            for steps in &options {
                assert!(steps.iter().any(|(n, _)| n == "context-parallel"));
                // torchtitan shards whenever context parallelism is on: only with FSDP2.
                if fw == Some(Framework::Torchtitan) {
                    assert_eq!(
                        layout::knob_of(steps, "shard", "stage"),
                        Some(3),
                        "{}",
                        label(steps)
                    );
                }
            }
            let mut applied = 0;
            for steps in options.iter().take(6) {
                let quick = try_memory_option(&cur, steps, &all, &eval, usize::MAX, false);
                let full = try_memory_option(&cur, steps, &all, &eval, usize::MAX, true);
                match (quick, full) {
                    (Ok((q, _)), Ok((f, _))) => {
                        assert_eq!(q.iteration_ns(), f.iteration_ns(), "{}", label(steps));
                        assert_eq!(q.memory, f.memory, "{}", label(steps));
                        assert!(q.job.meta.cp > 1);
                        applied += 1;
                    }
                    // Megatron's selective recomputation has no unfused core to re-run here.
                    (Err(q), Err(f)) => assert_eq!(q.to_string(), f.to_string()),
                    (q, f) => panic!("{}: {} vs {}", label(steps), q.is_ok(), f.is_ok()),
                }
            }
            assert!(applied > 0, "{fw:?}");
        }
        // Other exports have no context parallelism: no option.
        assert!(cp_options(&cur, &MEMORY_PASSES, Some(Framework::Pytorch), None).is_empty());
        // Not asked for: none.
        assert!(cp_options(&cur, &["amp", "grad-accumulation"], None, None).is_empty());
    }

    /// With context parallelism a group of ranks trains the samples together (its batch is
    /// the group's): what would fit is said per group, as for tensor parallelism.
    #[test]
    fn what_would_fit_speaks_of_the_context_parallel_group() {
        let job = long_llama();
        let cp = crate::passes::context_parallel::context_parallel(&job, 2, true).unwrap();
        let e = passes::evaluate(cp).unwrap();
        let budget = budget_peak(&e, u64::MAX);
        let said = what_would_fit(&e, budget, 1, 1);
        assert!(
            said.contains("samples per context-parallel group of 2 per micro-step would fit"),
            "{said}"
        );
        assert!(said.contains("on these 8 GPUs"), "{said}");
    }

    #[test]
    fn memory_passes_propose_from_the_job_alone() {
        let (_, job) = crate::zoo::build::test_job("gpt", 8, "8xv100");
        let cur = passes::evaluate(job).unwrap();
        let all = passes::registry();
        let eval = |j: Job| passes::evaluate(j);
        for fw in [
            None,
            Some(Framework::Pytorch),
            Some(Framework::Deepspeed),
            Some(Framework::Torchtitan),
        ] {
            let options = memory_options(&cur, &MEMORY_PASSES, fw);
            assert!(options.len() > 4, "{fw:?}: {}", options.len());
            for steps in &options {
                assert!(
                    steps
                        .iter()
                        .all(|(n, _)| MEMORY_PASSES.contains(&n.as_str()))
                );
                let quick = try_memory_option(&cur, steps, &all, &eval, usize::MAX, false);
                let full = try_memory_option(&cur, steps, &all, &eval, usize::MAX, true);
                match (quick, full) {
                    (Ok((q, qt)), Ok((f, ft))) => {
                        assert!(qt.is_empty());
                        assert_eq!(ft.len(), steps.len());
                        assert_eq!(q.iteration_ns(), f.iteration_ns(), "{}", label(steps));
                        assert_eq!(q.memory, f.memory, "{}", label(steps));
                        assert_eq!(q.job.syncs, f.job.syncs, "{}", label(steps));
                    }
                    (Err(q), Err(f)) => assert_eq!(q.to_string(), f.to_string()),
                    (q, f) => panic!(
                        "{}: {:?} vs {:?}",
                        label(steps),
                        q.map(|_| ()).map_err(|e| e.to_string()),
                        f.map(|_| ()).map_err(|e| e.to_string())
                    ),
                }
            }
        }
    }

    /// The second memory step, on the start with AMP, taken from the first: the same choice,
    /// end, decisions and trail as running it.
    #[test]
    fn memory_step_after_amp_is_the_step_on_the_amp_job() {
        let (_, job) = crate::zoo::build::test_job("gpt", 8, "8xv100");
        let start = passes::evaluate(job).unwrap();
        let all = passes::registry();
        let eval = |j: Job| passes::evaluate(j);
        let budget = start.memory.peaks.device_used / 10 * 6;
        for fw in [None, Some(Framework::Pytorch)] {
            let step = |cur: &Evaluated| {
                memory_step(
                    cur,
                    budget,
                    &MEMORY_PASSES,
                    fw,
                    &all,
                    &eval,
                    usize::MAX,
                    &mut Vec::new(),
                )
                .unwrap()
            };
            let first = step(&start);
            assert_eq!(first.steps[0].0, "amp", "{fw:?}: {}", label(&first.steps));
            assert!(first.steps.len() > 1, "{fw:?}: {}", label(&first.steps));
            let amp = &first.steps[..1];
            let (with_amp, _) =
                try_memory_option(&start, amp, &all, &eval, usize::MAX, false).unwrap();
            let ran = step(&with_amp);
            let taken = memory_step_after_first(&with_amp, budget, &Ok(first)).expect("taken");
            assert_eq!(taken.steps, ran.steps, "{fw:?}");
            assert_eq!(taken.decisions, ran.decisions, "{fw:?}");
            assert_eq!(taken.end.iteration_ns(), ran.end.iteration_ns(), "{fw:?}");
            assert_eq!(taken.end.memory, ran.end.memory, "{fw:?}");
            assert_eq!(taken.end.job, ran.end.job, "{fw:?}");
            assert_eq!(taken.trail.len(), ran.trail.len(), "{fw:?}");
            assert_eq!(taken.replays, 0);
            // A start the first pass did not make is not taken.
            assert!(memory_step_after_first(&start, budget, &Ok(step(&start))).is_none());
        }
    }

    #[test]
    fn fastest_keeps_the_lowest_time_then_index_whatever_the_order() {
        // Offered from many threads in whatever order they finish: the same pick as a
        // sequential minimum of (time, index), ties to the lower index.
        let ns = |i: usize| ((i * 7919) % 97) as u64;
        let want = (0..1000).min_by_key(|&i| (ns(i), i)).unwrap();
        for _ in 0..5 {
            let f = Fastest::default();
            (0..1000usize)
                .into_par_iter()
                .for_each(|i| f.offer(i, ns(i), i * 10));
            assert_eq!(f.into_inner(), Some((want, want * 10)));
        }
        let f = Fastest::default();
        for i in [3usize, 1, 2, 0] {
            f.offer(i, 5, ());
        }
        assert_eq!(f.into_inner(), Some((0, ())));
        assert_eq!(Fastest::<()>::default().into_inner(), None);
    }

    fn job() -> Job {
        let m = crate::zoo::model(
            "resnet50",
            &crate::zoo::ModelOptions {
                batch: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        let c = crate::cost::config::load_cluster("8xh200").unwrap();
        // A compiled step (the graph host): bound by the GPU and the all-reduces, so tensor
        // fusion and partition have moves to make.
        let opts = crate::zoo::BuildOptions {
            host: Some(crate::cost::host::HostSpec::builtin(
                crate::cost::framework::Exec::Graph,
            )),
            ..Default::default()
        };
        crate::zoo::build::job(&m, &c, &opts).unwrap()
    }

    /// Issue 14: lean evaluations (graphs dropped once scored, the move taken evaluated again)
    /// change the memory a search needs, never its plan — for both strategies.
    /// Issue 21: the memory step tries only k that leave whole samples per micro-step.
    #[test]
    fn accumulation_steps_divide_the_batch() {
        assert_eq!(accumulation_steps(3), vec![3]);
        assert_eq!(accumulation_steps(32), vec![2, 4, 8, 16, 32]);
        assert_eq!(accumulation_steps(12), vec![2, 3, 4, 6, 12]);
        assert_eq!(accumulation_steps(1), Vec::<u32>::new());
        assert_eq!(accumulation_steps(0), vec![2, 4, 8, 16]);
        let big = accumulation_steps(65_536);
        assert!(
            big.len() <= 12 && big.contains(&2) && big.contains(&65_536),
            "{big:?}"
        );
        assert!(big.iter().all(|k| 65_536 % k == 0));
    }

    /// Options that keep the states whole are not tried once the states alone are over the
    /// budget, so long as a sharded one is left; under the states they all are.
    #[test]
    fn options_that_cannot_fit_are_not_tried() {
        let cur = crate::passes::evaluate(job()).unwrap();
        let all = ["amp", "recompute", "grad-accumulation", "shard"];
        let options = memory_options(&cur, &all, Some(Framework::Pytorch));
        let sharded = |o: &Vec<KnobbedPass>| o.iter().any(|(n, _)| n == "shard");
        assert!(options.iter().any(sharded) && !options.iter().all(sharded));
        let states = cur.memory.peaks.breakdown.static_bytes;
        assert!(states > 0);
        // A budget under the states alone: only the sharded options.
        let kept = without_hopeless(&cur, states / 2, options.clone());
        assert!(!kept.is_empty() && kept.iter().all(sharded), "{kept:?}");
        assert_eq!(kept.len(), options.iter().filter(|o| sharded(o)).count());
        // Room for the states: every option.
        assert_eq!(without_hopeless(&cur, u64::MAX, options.clone()), options);
        // No sharded option to fall back on: every option, for the message.
        let unsharded: Vec<_> = options.into_iter().filter(|o| !sharded(o)).collect();
        assert_eq!(
            without_hopeless(&cur, states / 2, unsharded.clone()),
            unsharded
        );
    }

    #[test]
    fn lean_evaluations_give_the_same_plan() {
        let all = crate::passes::registry();
        for strategy in [Strategy::CriticalPath, Strategy::Mcmc] {
            let run = |lean_ops: usize| {
                let opts = SearchOptions {
                    strategy,
                    seed: 3,
                    passes: Some(vec!["tensor-fusion".into(), "tensor-partition".into()]),
                    lean_ops,
                    ..SearchOptions::default()
                };
                search(job(), None, &opts, &all, &AtomicBool::new(false), &|_| {}).unwrap()
            };
            let (lean, full) = (run(0), run(usize::MAX));
            assert!(!lean.decisions.is_empty(), "{strategy:?}");
            assert_eq!(lean.decisions, full.decisions, "{strategy:?}");
            assert_eq!(lean.best.iteration_ns(), full.best.iteration_ns());
            assert_eq!(lean.best.memory, full.best.memory);
            assert_eq!(lean.best.job.syncs.len(), full.best.job.syncs.len());
            // The lean run replayed the moves it took once more; its outcome holds no graph.
            assert!(lean.replays > full.replays, "{strategy:?}");
            assert!(is_lean(&lean.best) && !is_lean(&full.best));
        }
    }

    /// Issue 28: the report evaluates the baseline and the plan in one form, decided once from
    /// the unoptimised job (the full graph here: 8 GPUs fit), or the form the caller decided
    /// (`report_symmetric`), whatever form the best job's own graph would allow.
    #[test]
    fn the_plan_is_reported_in_the_form_of_the_unoptimised_job() {
        let all = crate::passes::registry();
        assert!(!report_symmetric(&job()));
        for forced in [None, Some(true), Some(false)] {
            let opts = SearchOptions {
                passes: Some(vec!["tensor-fusion".into()]),
                report_symmetric: forced,
                max_rounds: Some(2),
                ..SearchOptions::default()
            };
            let out = search(job(), None, &opts, &all, &AtomicBool::new(false), &|_| {}).unwrap();
            let want = forced.unwrap_or(false);
            assert_eq!(out.baseline.job.symmetric, want, "{forced:?}");
            assert_eq!(out.best.job.symmetric, want, "{forced:?}");
        }
    }

    /// Issue 20: with a framework, the passes its export cannot apply become advice, proposed
    /// on the final evaluation — lean above `LEAN_OPS` ops, where `tensor-fusion` indexed an
    /// empty replay and the search panicked (`plan --model resnet50 --cluster 128xv100-rdma`).
    /// Lean or not, the advice is the same, and a lean evaluation shown to a pass is refused.
    #[test]
    fn advice_on_a_lean_best_is_the_advice_on_a_full_one() {
        let all = crate::passes::registry();
        let run = |lean_ops: usize| {
            let opts = SearchOptions {
                passes: Some(vec![
                    "tensor-fusion".into(),
                    "tensor-partition".into(),
                    "op-fusion".into(),
                ]),
                framework: Some((Framework::Pytorch, framework::Names::Zoo)),
                lean_ops,
                ..SearchOptions::default()
            };
            search(job(), None, &opts, &all, &AtomicBool::new(false), &|_| {}).unwrap()
        };
        let (lean, full) = (run(0), run(usize::MAX));
        assert!(is_lean(&lean.best));
        // tensor-fusion and tensor-partition are not in PyTorch's export: advice, if anything.
        assert_eq!(lean.advice, full.advice);
        assert_eq!(lean.decisions, full.decisions);
        for p in &all {
            let k = passes::resolve_knobs(p.as_ref(), &[]).unwrap();
            assert!(
                matches!(
                    passes::propose(p.as_ref(), &lean.best, &k),
                    Err(PassError::Lean { .. })
                ),
                "{}",
                p.name()
            );
        }
    }

    /// Advice on the best job's evaluation as the search made it, used as it is, is the advice
    /// on a fresh evaluation, one replay sooner.
    #[test]
    fn advice_reuses_an_evaluation_in_the_searched_form() {
        let all = crate::passes::registry();
        let opts = SearchOptions {
            passes: Some(vec!["tensor-fusion".into(), "tensor-partition".into()]),
            framework: Some((Framework::Pytorch, framework::Names::Zoo)),
            ..SearchOptions::default()
        };
        let (_, names) = split_passes(&opts, &all);
        let eval = evaluator(opts.speedups.symmetry);
        let full = eval(job()).unwrap();
        let (fresh, n_fresh) = advise(&full, false, &names, &opts, &all, &eval).unwrap();
        let (reused, n_reused) = advise(&full, true, &names, &opts, &all, &eval).unwrap();
        assert!(!fresh.is_empty());
        assert_eq!(reused, fresh);
        assert_eq!(n_reused + 1, n_fresh);
        // A lean evaluation is evaluated again whatever the caller says.
        let mut lean = full.clone();
        lean_from(&mut lean, 0);
        let (again, n_again) = advise(&lean, true, &names, &opts, &all, &eval).unwrap();
        assert_eq!((again, n_again), (fresh, n_fresh));
    }

    /// `max_rounds` cuts the search by work: the same rounds and plan on every run, and the
    /// stop reason says so.
    #[test]
    fn the_round_limit_stops_the_search_deterministically() {
        let all = crate::passes::registry();
        for strategy in [Strategy::CriticalPath, Strategy::Mcmc] {
            let run = |max_rounds| {
                let opts = SearchOptions {
                    strategy,
                    passes: Some(vec!["tensor-fusion".into(), "tensor-partition".into()]),
                    max_rounds,
                    ..SearchOptions::default()
                };
                search(job(), None, &opts, &all, &AtomicBool::new(false), &|_| {}).unwrap()
            };
            let free = run(None);
            assert!(free.rounds > 1, "{strategy:?}: {} rounds", free.rounds);
            let cut = run(Some(1));
            assert_eq!(cut.stop, StopReason::RoundLimit, "{strategy:?}");
            assert_eq!(cut.rounds, 1, "{strategy:?}");
            assert!(cut.decisions.len() <= 1, "{strategy:?}");
            assert_eq!(run(Some(1)).decisions, cut.decisions, "{strategy:?}");
            // A limit the search never reaches changes nothing.
            let loose = run(Some(free.rounds + 10));
            assert_eq!(loose.stop, free.stop, "{strategy:?}");
            assert_eq!(loose.decisions, free.decisions, "{strategy:?}");
        }
    }

    #[test]
    fn lean_keeps_the_numbers_and_in_full_restores_the_rest() {
        let e = passes::evaluate(job()).unwrap();
        let mut l = e.clone();
        lean_from(&mut l, 0);
        assert!(is_lean(&l));
        assert_eq!(
            (l.iteration_ns(), &l.memory, &l.critical_local),
            (e.iteration_ns(), &e.memory, &e.critical_local)
        );
        assert!(l.replay.end_ns.is_empty() && l.critical.ops.is_empty());
        let mut n = 0;
        let back = in_full(l, &passes::evaluate, &mut n).unwrap();
        assert_eq!(n, 1);
        assert_eq!(back.graph.op_count(), e.graph.op_count());
        assert_eq!(back.replay, e.replay);
        // Below the threshold nothing changes.
        let mut s = e.clone();
        lean_from(&mut s, usize::MAX);
        assert_eq!(s.replay, e.replay);
    }
}
