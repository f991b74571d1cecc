//! Lazy rounds: a round re-evaluates its moves in the order of what each gained when last
//! evaluated, and stops once no move left can beat the best found by that measure (the lazy
//! greedy of Minoux, 1978, "Accelerated greedy algorithms for maximizing submodular set
//! functions"; CELF in Leskovec et al., KDD 2007).
//!
//! A move is known across rounds by what it touches, named ([`move_key`]): op ids shift when a
//! fusion removes ops, so the key renders ops by their member names and syncs by their tensors.
//! A move never evaluated comes first, and so does the one move of each on/off pass (AMP,
//! CUDA graphs, batch-norm reconstruction: a handful, whose gains can grow when the bottleneck
//! moves — on ResNet-50 over 64 V100s the full walk took batch-norm reconstruction as its 10th
//! decision, for 2.87 ms, after three tensor fusions; lazy rounds that trusted its older gain
//! took smaller fusions first and planned 36.15 against 35.89 ms). When a move's gain can only
//! shrink as other moves are
//! taken, the lazy round takes the move a full round would: each skipped move's last gain
//! bounds what it would gain now. Where that does not hold the round may take another
//! improving move first; the walk still stops only after a round in which every move was
//! evaluated afresh and none improved (with nothing found, nothing is skipped), so a lazy walk
//! ends where no single move improves, as a full one does. A walk about to stop because its
//! last rounds gained little evaluates every move once more first (the moves a lazy round
//! skipped may gain more now), and stops only if that round gains little too.
//!
//! Deterministic: the moves are evaluated in fixed batches of [`BATCH`], in (bound, index)
//! order, whatever the thread count.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use rayon::prelude::*;

use super::{Ctx, Fastest, Move, is_granular};
use crate::graph::OpId;
use crate::graph::job::Job;
use crate::passes::{Edit, Evaluated};

/// Moves evaluated together: enough to keep a few cores busy, fixed so that the moves
/// evaluated (and so the plan) do not depend on the machine.
pub(crate) const BATCH: usize = 4;

/// What each move gained (ns, 0 when it did not fit or was slower) when last evaluated, by
/// [`move_key`].
#[derive(Default)]
pub(crate) struct Gains(HashMap<u64, u64>);

impl Ctx<'_> {
    /// The best move of `moves` from `cur` as [`Ctx::best_move`] chooses it, evaluating the
    /// moves in the order of their last gains in `gains` (never-evaluated first) and stopping
    /// once the best found is faster than every move left could be by its last gain (ties to
    /// the lower index); with `every`, evaluates every move (the choice of [`Ctx::best_move`]).
    /// Records each evaluated move's gain. Returns the best and the number of moves evaluated.
    pub(crate) fn best_move_lazy(
        &self,
        cur: &Evaluated,
        moves: &[&Move],
        gains: &mut Gains,
        every: bool,
    ) -> (Option<(usize, Evaluated)>, u64) {
        let now = cur.iteration_ns();
        let keys: Vec<u64> = moves.iter().map(|m| move_key(&cur.job, m)).collect();
        // The fastest each move could be: never evaluated, or an on/off pass's one move, 0
        // (first); else now less its last gain.
        let bound: Vec<u64> = keys
            .iter()
            .zip(moves)
            .map(|(k, m)| match gains.0.get(k) {
                Some(g) if is_granular(&self.allowed, &m.pass) => now.saturating_sub(*g),
                _ => 0,
            })
            .collect();
        let mut order: Vec<usize> = (0..moves.len()).collect();
        order.sort_by_key(|&i| (bound[i], i));
        let best = Fastest::default();
        let mut evaluated = 0u64;
        let mut next = 0;
        while next < order.len() {
            let j = order[next];
            if !every && best.peek().is_some_and(|held| held < (bound[j], j)) {
                break;
            }
            if self.should_stop().is_some() {
                break;
            }
            let batch = &order[next..(next + BATCH).min(order.len())];
            let results: Vec<(usize, Option<u64>)> = batch
                .par_iter()
                .map(|&i| {
                    let m = moves[i];
                    let Some(e) = self.evaluate_move(cur, m) else {
                        return (i, None);
                    };
                    let ns = e.iteration_ns();
                    let fits = self.fits(&e);
                    if fits && self.worth(m, cur, &e) {
                        best.offer(i, ns, e);
                    }
                    (i, Some(if fits { now.saturating_sub(ns) } else { 0 }))
                })
                .collect();
            for (i, gain) in results {
                let Some(g) = gain else { continue };
                evaluated += 1;
                gains.0.insert(keys[i], g);
            }
            next += batch.len();
        }
        (best.into_inner(), evaluated)
    }
}

/// A move named by what it touches, stable across rounds: the pass, its knobs, and each
/// patch's reason and edits, with ops rendered by their member names and syncs by their
/// tensors' names (ids shift as the job is edited).
pub(crate) fn move_key(job: &Job, m: &Move) -> u64 {
    let mut h = DefaultHasher::new();
    m.pass.hash(&mut h);
    m.knobs.hash(&mut h);
    for p in &m.patches {
        p.why.hash(&mut h);
        for e in &p.edits {
            hash_edit(job, e, &mut h);
        }
    }
    h.finish()
}

fn hash_edit(job: &Job, e: &Edit, h: &mut DefaultHasher) {
    let ops = |ids: &[OpId], h: &mut DefaultHasher| {
        for &o in ids {
            job.local.members(o).hash(h);
        }
    };
    let syncs = |ids: &[usize], h: &mut DefaultHasher| {
        for &s in ids {
            match job.syncs.get(s) {
                Some(sync) => sync.tensors.iter().for_each(|&t| {
                    job.local.tensors[t as usize].name.hash(h);
                }),
                None => s.hash(h),
            }
        }
    };
    std::mem::discriminant(e).hash(h);
    match e {
        Edit::Scale { ops: o, factor } => {
            ops(o, h);
            factor.to_bits().hash(h);
        }
        Edit::SetDuration { op, dur_ns } => {
            ops(&[*op], h);
            dur_ns.hash(h);
        }
        Edit::ClearGaps { ops: o } | Edit::Remove { ops: o } => ops(o, h),
        Edit::SetWork { op, work } => {
            ops(&[*op], h);
            format!("{work:?}").hash(h);
        }
        Edit::Insert {
            spec,
            work,
            after,
            before,
            launch_ns,
        } => {
            format!("{spec:?}{work:?}{launch_ns:?}").hash(h);
            ops(after, h);
            ops(before, h);
        }
        Edit::Merge { ops: o, dur_ns } => {
            ops(o, h);
            dur_ns.hash(h);
        }
        Edit::AddEdge { from, to } | Edit::DropEdge { from, to } => ops(&[*from, *to], h),
        Edit::Priority { ops: o, priority } => {
            ops(o, h);
            priority.hash(h);
        }
        Edit::SetMem { op, effects } => {
            ops(&[*op], h);
            format!("{effects:?}").hash(h);
        }
        Edit::FuseSyncs { syncs: s } => syncs(s, h),
        Edit::PartitionSync { sync, k } => {
            syncs(&[*sync], h);
            k.hash(h);
        }
        Edit::ScaleSyncBytes { syncs: s, factor } => {
            syncs(s, h);
            factor.to_bits().hash(h);
        }
        // No ids: the value itself names the move.
        Edit::StaticMemory { .. } | Edit::Dtype(_) | Edit::Math(_) => format!("{e:?}").hash(h),
        // The reason names the replacement (e.g. the accumulation steps).
        Edit::ReplaceJob(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::search::{SearchOptions, Speedups, candidate_moves, evaluator, search};

    /// A 4-layer BERT on 16 V100s, evaluated on the full graph: op fusion decides each layer
    /// alone, so the walk has many rounds of many moves.
    fn job() -> Job {
        let m = crate::zoo::model(
            "bert-base",
            &crate::zoo::ModelOptions {
                batch: Some(8),
                layers: Some(4),
                ..Default::default()
            },
        )
        .unwrap();
        let c = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        crate::zoo::build::job(&m, &c, &Default::default()).unwrap()
    }

    fn opts(lazy: bool) -> SearchOptions {
        SearchOptions {
            speedups: Speedups {
                symmetry: false,
                lazy,
                ..Speedups::default()
            },
            ..SearchOptions::default()
        }
    }

    #[test]
    fn lazy_rounds_walk_the_full_rounds_path_in_fewer_replays() {
        let all = crate::passes::registry();
        let run = |lazy| {
            search(
                job(),
                None,
                &opts(lazy),
                &all,
                &AtomicBool::new(false),
                &|_| {},
            )
            .unwrap()
        };
        let (lazy, full) = (run(true), run(false));
        assert!(
            full.decisions.len() > 3,
            "{} decisions",
            full.decisions.len()
        );
        // The same walk, and the lazy one checks every move once more where the full one
        // stopped on small gains (here it finds one more).
        assert_eq!(lazy.decisions[..full.decisions.len()], full.decisions[..]);
        assert!(lazy.best.iteration_ns() <= full.best.iteration_ns());
        assert!(lazy.rounds >= full.rounds);
        assert_eq!(lazy.stop, full.stop);
        assert!(
            2 * lazy.replays < full.replays,
            "lazy {} vs full {} replays",
            lazy.replays,
            full.replays
        );
    }

    /// Taking one fusion removes ops and shifts the ids of the ops after them; the moves left
    /// keep their keys, so their last gains still order the next round.
    #[test]
    fn move_keys_survive_the_ids_shifting() {
        let all = crate::passes::registry();
        let allowed: Vec<&dyn crate::passes::Pass> = all
            .iter()
            .filter(|p| p.name() == "op-fusion")
            .map(|p| p.as_ref())
            .collect();
        let o = opts(true);
        let eval = evaluator(false);
        let e0 = eval(job()).unwrap();
        let m0 = candidate_moves(&e0, &allowed, &Default::default(), &o).unwrap();
        assert!(m0.len() > 2, "{} moves", m0.len());
        let taken = &m0[0];
        let e1 = eval(crate::passes::apply_all(&e0.job, &taken.patches).unwrap()).unwrap();
        let m1 = candidate_moves(&e1, &allowed, &Default::default(), &o).unwrap();
        let before: HashMap<u64, &Move> = m0.iter().map(|m| (move_key(&e0.job, m), m)).collect();
        assert!(
            !m1.iter()
                .any(|m| move_key(&e1.job, m) == move_key(&e0.job, taken))
        );
        let kept: Vec<(&Move, &Move)> = m1
            .iter()
            .filter_map(|m| before.get(&move_key(&e1.job, m)).map(|b| (*b, m)))
            .collect();
        assert!(!kept.is_empty());
        // Some kept move names other op ids than it did: the key is not the ids.
        assert!(kept.iter().any(|(b, a)| b.patches != a.patches));
        // Distinct moves, distinct keys.
        let keys: HashSet<u64> = m1.iter().map(|m| move_key(&e1.job, m)).collect();
        assert_eq!(keys.len(), m1.len());
    }
}
