//! `tensor-partition`: cut a gradient synchronisation into `k` equal pieces (dPRO §5.1, the
//! optimal partition number `k*[s]` of Theorems 2–3; BytePS partitions).
//!
//! **When it applies.** Syncs with communication ops on the critical path (`scope=critical`,
//! default) or every sync (`scope=all`), when the best `k` differs from the sync's current
//! partition count.
//!
//! ```text
//! before:  Out(t) ──[ all-reduce of S bytes ]──────────────→ In(t)
//! after:   Out(t) ──[ S/k ]─[ S/k ]─ … ─[ S/k ] (k pieces) ──→ In(t)
//! ```
//!
//! Each piece is its own collective (NCCL issues them one after another on a worker's
//! communicator, but a worker may start piece `j+1` while its neighbours still forward piece `j`:
//! pieces pipeline through the ring / tree / parameter servers, and each pays the latency α).
//!
//! **Cost model.** `t_sync(s, k)` ([`sync_time_ns`]) is a partial replay of the synchronisation's
//! communication sub-graph alone: the job's topology ([`CommTopology`], the symmetric ring when
//! the job is symmetric) wired for one tensor of `s` bytes cut into `k` pieces between virtual
//! ready/done ops that all fire at time 0, replayed with the dPRO replayer; `t_sync` is its
//! makespan. This is dPRO's "partial replay of the sub-graph including all relevant
//! communication ops" (§5.3): it ignores contention with other tensors' collectives, as the
//! paper's does. `k*` minimises `t_sync` over the grid `k ∈ {1, 2, 4, …, max_k}` (plus `max_k`
//! itself when it is not a power of two); ties go to the smaller `k`. Results are memoised per
//! `(bytes, k)` inside one `propose` (tensors of equal size are common).
//!
//! **Partial replay switch** (`partial`, dPRO §5.3 "Partial Replay", Table 5). `partial=1`
//! (default) prices `t_sync(s, k)` as above. `partial=0` is the strawman the paper compares
//! against: every grid point is priced by a full replay of the whole job with sync `s` cut into
//! `k` ([`full_replay_ns`]: expand the global DFG, replay it, take the iteration time), and `k*`
//! minimises the iteration time (ties → smaller `k`). No memo across syncs: the result depends
//! on where the sync sits, not only on its size. Same decisions in the common case, but
//! `|grid|` full replays per critical sync instead of a few hundred-op sub-graphs; the search
//! sets `partial=0` under `plan --no-partial-replay`.
//!
//! **Knobs.** `scope` = `critical` | `all`; `max_k` (default 16, 1..=1024): the grid's top;
//! `k` (default 0 = search; 1..=1024 = use this `k` for every selected sync); `partial` (default
//! 1, 0..=1): price `k` by partial replay (1) or by full replay of the job (0).
//!
//! **Framework knobs** (DESIGN.md table): BytePS `BYTEPS_PARTITION_BYTES` (= ⌈s / k*⌉ of the
//! tensors chosen; one global value, so the emitter takes the most common one) and
//! `BYTEPS_SCHEDULING_CREDIT`; no Horovod / XLA / PyTorch / JAX equivalent.

pub use super::sync_time::sync_time_ns;
use super::sync_time::{SyncTimes, grid, scope_is_all, tensor_label};
use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::job::Job;

/// The `tensor-partition` pass.
pub struct TensorPartition;

const NAME: &str = "tensor-partition";

impl Pass for TensorPartition {
    fn name(&self) -> &str {
        NAME
    }
    fn granular(&self) -> bool {
        true
    }
    fn doc(&self) -> &str {
        "cut gradient synchronisations into k pieces; k* by grid search with partial replay (dPRO)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text(
                "scope",
                "critical: syncs on the critical path; all: every sync",
                "critical",
            ),
            KnobSpec::int(
                "max_k",
                "largest partition number the search tries",
                16,
                1,
                1024,
            ),
            KnobSpec::int(
                "k",
                "0: search k* in {1,2,4,…,max_k}; otherwise this partition number",
                0,
                0,
                1024,
            ),
            KnobSpec::int(
                "partial",
                "1: price k by partial replay of the sync alone; 0: by full replay of the job",
                1,
                0,
                1,
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let all = scope_is_all(NAME, knobs)?;
        let max_k = knobs.int("max_k") as u32;
        let fixed = knobs.int("k") as u32;
        let partial = knobs.int("partial") != 0;
        let job = &cx.job;
        let mut selected: Vec<usize> = if all {
            (0..job.syncs.len()).collect()
        } else {
            cx.critical_syncs.clone()
        };
        selected.sort_unstable();
        selected.dedup();
        let mut cache = SyncTimes::new(job);
        // Full-replay pricing (partial=0) of every selected sync, in parallel, in sync order.
        let full: Vec<Option<(u32, u64, u64)>> = if !partial && fixed == 0 {
            use rayon::prelude::*;
            selected
                .par_iter()
                .map(|&s| best_k_full(job, s, max_k))
                .collect()
        } else {
            Vec::new()
        };
        let mut out = Vec::new();
        for (i, s) in selected.into_iter().enumerate() {
            let sync = &job.syncs[s];
            let now = sync.partitions.max(1);
            let (k, why) = if fixed > 0 {
                (fixed, format!("k = {fixed} requested"))
            } else if !partial {
                let Some((k, t, t_now)) = full.get(i).copied().flatten() else {
                    continue;
                };
                (
                    k,
                    format!(
                        "k* = {k} minimises the iteration time over k ≤ {max_k} by full replay: \
                         {t} ns vs {t_now} ns with k = {now}"
                    ),
                )
            } else {
                let (k, t) = cache.best_k(sync.bytes, max_k);
                let t_now = cache.get(sync.bytes, now);
                (
                    k,
                    format!(
                        "k* = {k} minimises t_sync over k ≤ {max_k} by partial replay: \
                         {t} ns vs {t_now} ns with k = {now}"
                    ),
                )
            };
            if k == now {
                continue;
            }
            out.push(Patch {
                pass: NAME.into(),
                why: format!(
                    "sync {s} ({} B, {}): {why}",
                    sync.bytes,
                    tensor_label(job, s)
                ),
                edits: vec![Edit::PartitionSync { sync: s, k }],
            });
        }
        Ok(out)
    }
}

/// Iteration time of the whole job with sync `s` cut into `k` pieces (full replay; the
/// strawman of the partial-replay switch). `None` when the job does not expand.
pub fn full_replay_ns(job: &Job, s: usize, k: u32) -> Option<u64> {
    let mut j = job.clone();
    j.syncs.get_mut(s)?.partitions = k.max(1);
    let g = j.expand().ok()?;
    Some(crate::replay::replay(&g).iteration_ns)
}

/// `(k*, iteration time at k*, iteration time at the current k)` over the grid by full replay;
/// ties → smaller `k`.
fn best_k_full(job: &Job, s: usize, max_k: u32) -> Option<(u32, u64, u64)> {
    let now = job.syncs.get(s)?.partitions.max(1);
    let t_now = full_replay_ns(job, s, now)?;
    let mut best: Option<(u32, u64)> = None;
    for k in grid(max_k) {
        let t = if k == now {
            t_now
        } else {
            full_replay_ns(job, s, k)?
        };
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((k, t));
        }
    }
    best.map(|(k, t)| (k, t, t_now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::SyncScheme;
    use crate::passes::testkit::{chain_job, spec};
    use crate::passes::{evaluate, resolve_knobs};

    fn tiny(scheme: SyncScheme, workers: u32, bytes: u64) -> Job {
        chain_job(&[(1000, true)], bytes, spec(scheme), workers)
    }

    fn knobs(kv: &[(&str, &str)]) -> Knobs {
        let kv: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve_knobs(&TensorPartition, &kv).unwrap()
    }

    #[test]
    fn t_sync_of_a_ring_matches_alpha_beta() {
        // 4 workers, 4000 B, α = 1000 ns, 1 B/ns: 6 steps of 1000 + 1000 = 12,000 ns.
        let job = tiny(SyncScheme::Ring, 4, 4000);
        assert_eq!(sync_time_ns(&job, 4000, 1), 12_000);
    }

    #[test]
    fn ring_pieces_pipeline_but_pay_alpha() {
        // k = 2: pieces of 2000 B, chunks of 500 B, a step is 1500 ns. Piece 2 starts on each
        // worker when that worker's piece-1 work is done; the ring is busy on every link, so the
        // two pieces run back to back: 2 · 6 · 1500 = 18,000 ns > 12,000 ns. α dominates: k* = 1.
        let job = tiny(SyncScheme::Ring, 4, 4000);
        let t2 = sync_time_ns(&job, 4000, 2);
        assert_eq!(t2, 18_000);
        let mut c = SyncTimes::new(&job);
        assert_eq!(c.best_k(4000, 16), (1, 12_000));
    }

    #[test]
    fn ps_partitions_pipeline_push_and_pull() {
        // PS, 4 workers, 2 servers; a partition pipelines push of piece j+1 with the aggregation
        // and pull of piece j, so a large tensor gains from k > 1.
        let job = tiny(SyncScheme::Ps, 4, 4_000_000);
        let mut c = SyncTimes::new(&job);
        let t1 = c.get(4_000_000, 1);
        let (k, t) = c.best_k(4_000_000, 16);
        assert!(k > 1, "k* = {k}");
        assert!(t < t1, "{t} vs {t1}");
    }

    #[test]
    fn fixed_k_is_proposed_for_every_sync_with_scope_all() {
        let job = tiny(SyncScheme::Ring, 4, 4000);
        let cx = evaluate(job).unwrap();
        let p = TensorPartition
            .propose(&cx, &knobs(&[("scope", "all"), ("k", "4")]))
            .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].edits, vec![Edit::PartitionSync { sync: 0, k: 4 }]);
        // k* = 1 already: nothing to do with the search.
        let p = TensorPartition
            .propose(&cx, &knobs(&[("scope", "all")]))
            .unwrap();
        assert!(p.is_empty());
    }

    #[test]
    fn full_replay_strawman_prices_the_same_k() {
        // One op A (1 µs) and its 4000 B gradient on a 4-worker ring: the whole job is A then
        // the sync, so a full replay is 1000 + t_sync: k = 1 → 13,000 ns, k = 2 → 19,000 ns.
        let job = tiny(SyncScheme::Ring, 4, 4000);
        assert_eq!(full_replay_ns(&job, 0, 1), Some(13_000));
        assert_eq!(full_replay_ns(&job, 0, 2), Some(19_000));
        assert_eq!(full_replay_ns(&job, 7, 2), None);
        assert_eq!(best_k_full(&job, 0, 16), Some((1, 13_000, 13_000)));
        let cx = evaluate(job).unwrap();
        let p = TensorPartition
            .propose(&cx, &knobs(&[("partial", "0")]))
            .unwrap();
        assert!(p.is_empty());
        // PS with 4 MB: both pricings choose the same k* > 1, and the full replay's iteration
        // time is exactly 1000 ns + the partial replay's t_sync at every grid point.
        let job = tiny(SyncScheme::Ps, 4, 4_000_000);
        for k in [1, 2, 4, 8, 16] {
            assert_eq!(
                full_replay_ns(&job, 0, k),
                Some(1000 + sync_time_ns(&job, 4_000_000, k)),
                "k = {k}"
            );
        }
        let cx = evaluate(job).unwrap();
        let part = TensorPartition.propose(&cx, &knobs(&[])).unwrap();
        let full = TensorPartition
            .propose(&cx, &knobs(&[("partial", "0")]))
            .unwrap();
        assert_eq!(part.len(), 1);
        assert_eq!(part[0].edits, full[0].edits);
        assert!(full[0].why.contains("full replay"), "{}", full[0].why);
        for bad in ["2", "-1"] {
            assert!(resolve_knobs(&TensorPartition, &[("partial".into(), bad.into())]).is_err());
        }
    }

    #[test]
    fn search_switches_become_knob_overrides() {
        use crate::search::{Speedups, speedup_knobs};
        let kv = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let off = Speedups {
            coarsen: false,
            partial_replay: false,
            symmetry: false,
            lazy: false,
        };
        let on = Speedups::default();
        assert_eq!(
            speedup_knobs(&TensorPartition, &off),
            kv(&[("partial", "0")])
        );
        assert_eq!(
            speedup_knobs(&TensorPartition, &on),
            kv(&[("partial", "1")])
        );
        let of = crate::passes::op_fusion::OpFusion;
        assert_eq!(
            speedup_knobs(&of, &off),
            kv(&[("coarsen", "0"), ("twins", "0")])
        );
        let only_sym = Speedups {
            symmetry: true,
            ..off
        };
        assert_eq!(
            speedup_knobs(&of, &only_sym),
            kv(&[("coarsen", "0"), ("twins", "1")])
        );
        let tf = crate::passes::tensor_fusion::TensorFusion;
        assert_eq!(speedup_knobs(&tf, &on), kv(&[("coarsen", "1")]));
        assert!(speedup_knobs(&crate::passes::amp::Amp, &off).is_empty());
        // The overrides resolve against the declared ranges.
        assert!(resolve_knobs(&of, &speedup_knobs(&of, &off)).is_ok());
    }

    #[test]
    fn bad_knobs_are_refused() {
        let kv = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert!(resolve_knobs(&TensorPartition, &kv("k", "-1")).is_err());
        assert!(resolve_knobs(&TensorPartition, &kv("max_k", "0")).is_err());
        let job = tiny(SyncScheme::Ring, 4, 4000);
        let cx = evaluate(job).unwrap();
        let bad = resolve_knobs(&TensorPartition, &kv("scope", "some")).unwrap();
        assert!(TensorPartition.propose(&cx, &bad).is_err());
    }

    #[test]
    fn zoo_resnet50_on_ps_partitions_big_tensors() {
        let model = crate::zoo::model("resnet50", &Default::default()).unwrap();
        let mut cluster = crate::cost::config::load_cluster("dpro-16xv100-tcp").unwrap();
        cluster.sync = SyncScheme::Ps;
        cluster.ps_servers = cluster.ps_servers.max(2);
        let job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
        let base = evaluate(job.clone()).unwrap();
        for scope in ["critical", "all"] {
            let p = TensorPartition
                .propose(&base, &knobs(&[("scope", scope)]))
                .unwrap();
            let ks: Vec<u32> = p
                .iter()
                .map(|p| match p.edits[0] {
                    Edit::PartitionSync { k, .. } => k,
                    ref e => panic!("{e:?}"),
                })
                .collect();
            let after = evaluate(crate::passes::apply_all(&job, &p).unwrap()).unwrap();
            eprintln!(
                "PS {scope}: {} syncs partitioned, k = {:?}; {} → {} ns",
                p.len(),
                ks,
                base.iteration_ns(),
                after.iteration_ns()
            );
            assert!(ks.iter().all(|&k| k > 1 && k <= 16));
        }
        // The biggest tensor (fc.weight, 8.2 MB) is worth cutting in isolation.
        let big = job.syncs.iter().map(|s| s.bytes).max().unwrap();
        let mut c = SyncTimes::new(&job);
        let (k, t) = c.best_k(big, 16);
        assert!(k > 1 && t < c.get(big, 1), "k* = {k}");
    }
}
