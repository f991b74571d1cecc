//! `tensor-fusion`: synchronise consecutive gradient tensors as one collective (dPRO §5.1,
//! Theorem 2; Horovod's fusion buffer, PyTorch DDP buckets).
//!
//! **When it applies.** `scope=critical` (default): consecutive syncs `q_{n−1}, q_n` (adjacent in
//! issue order) whose communication ops lie on the critical path — its communication-bound
//! suffix — when Theorem 2 says fusing ends `q_n` earlier; chains grow as in Algorithm 1 (a fused
//! group is the next step's `q_{n−1}`). `scope=all` (the Horovod-default baseline): every sync,
//! grouped greedily in issue order (= gradient-ready order) into groups of at most
//! `threshold_mb` MiB; a tensor larger than the threshold stays alone.
//!
//! ```text
//! before:  Out(q_{n−1}) ─[ sync q_{n−1} ]─→ In        (NCCL: one collective at a time)
//!          Out(q_n)     ───────────────[ sync q_n ]─→ In
//! after:   Out(q_{n−1}), Out(q_n) ─[ sync q_{n−1} + q_n ]─→ In, In
//! ```
//!
//! The fused sync starts when its last tensor is ready and pays one latency α per step instead
//! of two.
//!
//! **Cost model / Theorem 2.** Fuse iff
//! `q^e_{n−1} + t_sync(q^s_n) > p^e_n + t_sync(q^s_{n−1} + q^s_n)`, where `q^e_{n−1}` is when
//! `q_{n−1}` ends (its `In` ops' latest end in the replay; for a group already fused in this
//! proposal, its predicted end), `p^e_n` when `q_n` is ready (its `Out` ops' latest end; for a
//! group, the latest ready time of its members), and `t_sync(s)` is
//! `sync_time::sync_time_ns`: a partial replay of one synchronisation of `s` bytes
//! alone on the job's topology. The left side is when `q_n` ends unfused if the segment is
//! communication-bound (`q_n` waits for `q_{n−1}`), the right side when the fused sync ends.
//! `t_sync` is taken at the sync's current partition count for `q_n` and at `k = 1` for the fused
//! sync — what [`Edit::FuseSyncs`] produces; the paper's `k*` comes from composing with
//! `tensor-partition` (Algorithm 1 does both; `whatif` runs one pass at a time).
//!
//! **Patch order.** Every group is a contiguous range of sync indices, and the patches are
//! returned from the highest range to the lowest: `FuseSyncs` removes indices inside its own
//! range only, so applying them in that order keeps every later patch's indices valid
//! (`apply_all` applies the patches in order as one edit).
//!
//! **Coarsened view** (`coarsen`, dPRO §5.3 and Fig. 6; Algorithm 1 line 2). With `coarsen=1`
//! (default) the tensors of one layer — consecutive syncs whose tensors all belong to the same
//! layer, e.g. a Linear's weight and bias or a BatchNorm's two parameters, produced by the same
//! backward op — form one unit (`sync_units`): by Theorem 3 (a multi-tensor op is the fusion
//! of itself and a null op) fusing them is never worse, so a unit on the critical path is
//! proposed fused even on its own, and Theorem 2 is applied between units (fewer, larger
//! candidates: ResNet-50 has 161 tensors in 107 units, BERT-base 206 in 105). A unit's
//! `t_sync` is that of its fused bytes at `k = 1`. With `coarsen=0` every sync is its own unit
//! (the strawman of dPRO Table 5); the search passes `coarsen=0` under `plan --no-coarsen`.
//! `scope=all` ignores the knob.
//!
//! **Knobs.** `scope` = `critical` | `all`; `threshold_mb` (default 64 MiB, Horovod's default;
//! 0..=1048576; `scope=all` only, and every bucket on a trace); `coarsen` (default 1, 0..=1).
//!
//! **On a recorded step** (a trace, whose collectives are ops of the graph and not syncs): the
//! all-reduces the framework issued are re-bucketed up to `threshold_mb` and each bucket priced
//! with the communication model (`rebucket.rs`).
//!
//! **Framework knobs** (DESIGN.md table): Horovod `groups=` lists with
//! `HOROVOD_DISABLE_GROUP_FUSION=1` and `HOROVOD_FUSION_THRESHOLD` ≥ the largest group (bytes);
//! BytePS group file (dPRO fork); TF/XLA and JAX all-reduce combine threshold; PyTorch
//! `bucket_cap_mb_list` (contiguous buckets in gradient-ready order) or `bucket_cap_mb`.

use super::sync_time::{SyncTimes, scope_is_all, tensor_label};
use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::OpId;

/// The `tensor-fusion` pass.
pub struct TensorFusion;

const NAME: &str = "tensor-fusion";

impl Pass for TensorFusion {
    fn name(&self) -> &str {
        NAME
    }
    fn granular(&self) -> bool {
        true
    }
    fn doc(&self) -> &str {
        "fuse consecutive gradient synchronisations (dPRO Theorem 2; scope=all: Horovod threshold)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text(
                "scope",
                "critical: pairs on the critical path by Theorem 2; all: groups up to threshold_mb",
                "critical",
            ),
            KnobSpec::float(
                "threshold_mb",
                "largest fused group with scope=all, MiB (Horovod default 64)",
                64.0,
                0.0,
                1_048_576.0,
            ),
            KnobSpec::int(
                "coarsen",
                "1: a layer's tensors are one unit (dPRO coarsened view); 0: every tensor alone",
                1,
                0,
                1,
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        if cx.job.syncs.is_empty() && !cx.job.local.calls.is_empty() {
            // A recorded step: re-bucket the all-reduces the framework issued.
            return super::rebucket::propose(
                cx,
                NAME,
                scope_is_all(NAME, knobs)?,
                knobs.float("threshold_mb"),
            );
        }
        let groups = if scope_is_all(NAME, knobs)? {
            threshold_groups(cx, knobs.float("threshold_mb"))
        } else {
            theorem_2_groups(cx, knobs.int("coarsen") != 0)
        };
        let job = &cx.job;
        let mut out: Vec<Patch> = groups
            .into_iter()
            .map(|(syncs, why)| Patch {
                pass: NAME.into(),
                why: format!(
                    "syncs {}..={} ({} tensors from {}): {why}",
                    syncs[0],
                    syncs[syncs.len() - 1],
                    syncs
                        .iter()
                        .map(|&s| job.syncs[s].tensors.len())
                        .sum::<usize>(),
                    tensor_label(job, syncs[0]),
                ),
                edits: vec![Edit::FuseSyncs { syncs }],
            })
            .collect();
        // Highest range first (see the module docs).
        out.reverse();
        Ok(out)
    }
}

/// Latest end over every worker's copy of the local ops `ops`.
fn latest_end(cx: &Evaluated, ops: &[OpId]) -> u64 {
    let per = cx.job.local.ops.len() as u32;
    let mut t = 0;
    for w in 0..cx.job.graph_workers() {
        for &o in ops {
            t = t.max(cx.replay.end_ns[(w * per + o) as usize]);
        }
    }
    t
}

/// Horovod-style: contiguous groups in issue order of at most `threshold_mb` MiB.
fn threshold_groups(cx: &Evaluated, threshold_mb: f64) -> Vec<(Vec<usize>, String)> {
    let cap = (threshold_mb * 1024.0 * 1024.0) as u64;
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = 0u64;
    let mut close = |cur: &mut Vec<usize>, bytes: &mut u64| {
        if cur.len() >= 2 {
            out.push((
                std::mem::take(cur),
                format!("{} B ≤ threshold {threshold_mb} MiB", *bytes),
            ));
        }
        cur.clear();
        *bytes = 0;
    };
    for (i, s) in cx.job.syncs.iter().enumerate() {
        if !cur.is_empty() && bytes.saturating_add(s.bytes) > cap {
            close(&mut cur, &mut bytes);
        }
        if s.bytes <= cap {
            cur.push(i);
            bytes += s.bytes;
        } else {
            close(&mut cur, &mut bytes);
        }
    }
    close(&mut cur, &mut bytes);
    out
}

/// Units of the coarsened view: maximal runs of consecutive syncs whose tensors all belong to
/// one and the same layer (a layer's weight and bias, a BatchNorm's two parameters); with
/// `coarsen` off, every sync is its own unit. Returned in sync order; every sync is in one.
pub(crate) fn sync_units(job: &crate::graph::job::Job, coarsen: bool) -> Vec<Vec<usize>> {
    let layer_of = |s: usize| -> Option<u32> {
        let mut layers = job.syncs[s]
            .tensors
            .iter()
            .map(|&t| job.local.tensors.get(t as usize).map(|t| t.layer));
        let first = layers.next()??;
        if first == crate::graph::NONE {
            return None;
        }
        layers.all(|l| l == Some(first)).then_some(first)
    };
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut last: Option<u32> = None;
    for s in 0..job.syncs.len() {
        let l = if coarsen { layer_of(s) } else { None };
        match (units.last_mut(), l) {
            (Some(u), Some(l)) if last == Some(l) => u.push(s),
            _ => units.push(vec![s]),
        }
        last = l;
    }
    units
}

/// Theorem 2 along the critical path's syncs (Algorithm 1, lines 16–18, chains included),
/// between units of the coarsened view (single syncs when `coarsen` is off).
fn theorem_2_groups(cx: &Evaluated, coarsen: bool) -> Vec<(Vec<usize>, String)> {
    let job = &cx.job;
    let mut times = SyncTimes::new(job);
    let units = sync_units(job, coarsen);
    let mut unit_of = vec![0usize; job.syncs.len()];
    for (i, u) in units.iter().enumerate() {
        for &s in u {
            unit_of[s] = i;
        }
    }
    let mut path: Vec<usize> = cx.critical_syncs.iter().map(|&s| unit_of[s]).collect();
    path.sort_unstable();
    path.dedup();
    let mut out = Vec::new();
    // The group being grown: members, bytes, latest ready, (predicted) end, reason.
    let mut group: Vec<usize> = Vec::new();
    let (mut bytes, mut ready, mut end) = (0u64, 0u64, 0u64);
    let mut why = String::new();
    for &u in &path {
        let unit = &units[u];
        let ready_ops: Vec<OpId> = unit
            .iter()
            .flat_map(|&s| job.syncs[s].ready.iter().copied())
            .collect();
        let done_ops: Vec<OpId> = unit
            .iter()
            .flat_map(|&s| job.syncs[s].done.iter().copied())
            .collect();
        let u_bytes: u64 = unit.iter().map(|&s| job.syncs[s].bytes).sum();
        let p_e = latest_end(cx, &ready_ops);
        let contiguous = group.last().is_some_and(|&l| l + 1 == unit[0]);
        if contiguous {
            // A unit of several syncs is synchronised as one (k = 1) once coarsened.
            let t_n = match unit.as_slice() {
                [one] => times.get(u_bytes, job.syncs[*one].partitions),
                _ => times.get(u_bytes, 1),
            };
            let t_f = times.get(bytes + u_bytes, 1);
            let r = ready.max(p_e);
            if end + t_n > r + t_f {
                why = format!(
                    "Theorem 2: q^e_(n-1) + t_sync(q_n) = {end} + {t_n} ns > p^e_n + t_sync(fused) = {r} + {t_f} ns"
                );
                group.extend(unit);
                bytes += u_bytes;
                ready = r;
                end = r + t_f;
                continue;
            }
        }
        if group.len() >= 2 {
            out.push((std::mem::take(&mut group), std::mem::take(&mut why)));
        }
        group = unit.clone();
        bytes = u_bytes;
        ready = p_e;
        end = latest_end(cx, &done_ops);
        why = if unit.len() >= 2 {
            format!(
                "coarsened view: the {} tensors of one layer as one unit",
                unit.len()
            )
        } else {
            String::new()
        };
    }
    if group.len() >= 2 {
        out.push((group, why));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::SyncScheme;
    use crate::graph::comm::CommSpec;
    use crate::graph::job::Job;
    use crate::passes::testkit::{chain_job, chain_job_sizes, spec};
    use crate::passes::{apply_all, evaluate, resolve_knobs};

    fn ring() -> CommSpec {
        spec(SyncScheme::Ring)
    }

    fn knobs(kv: &[(&str, &str)]) -> Knobs {
        let kv: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve_knobs(&TensorFusion, &kv).unwrap()
    }

    fn fused(p: &[Patch]) -> Vec<Vec<usize>> {
        p.iter()
            .map(|p| match &p.edits[0] {
                Edit::FuseSyncs { syncs } => syncs.clone(),
                e => panic!("{e:?}"),
            })
            .collect()
    }

    fn run(job: &Job, kv: &[(&str, &str)]) -> (u64, Vec<Vec<usize>>, u64) {
        let cx = evaluate(job.clone()).unwrap();
        let p = TensorFusion.propose(&cx, &knobs(kv)).unwrap();
        let after = evaluate(apply_all(job, &p).unwrap()).unwrap();
        (cx.iteration_ns(), fused(&p), after.iteration_ns())
    }

    #[test]
    fn theorem_2_fuses_a_communication_bound_pair() {
        // A(1 µs) → B(1 µs), each with a 4000 B gradient; 4 workers, α = 1000 ns, 1 B/ns:
        // t_sync(4000) = 6 × 2000 = 12,000; t_sync(8000) = 6 × 3000 = 18,000.
        // Unfused: q0 1000 → 13,000; q1 waits for q0: 13,000 → 25,000.
        // Theorem 2: 13,000 + 12,000 = 25,000 > 2000 + 18,000 = 20,000 → fuse; 2000 → 20,000.
        let job = chain_job(&[(1000, true), (1000, true)], 4000, ring(), 4);
        assert_eq!(run(&job, &[]), (25_000, vec![vec![0, 1]], 20_000));
    }

    #[test]
    fn theorem_2_refuses_when_the_second_gradient_is_late() {
        // A(1 µs) → B(10 µs): q0 1000 → 13,000; q1 ready at 11,000, waits → 25,000.
        // Theorem 2: 25,000 > 11,000 + 18,000 = 29,000 is false → no fusion (it would end at
        // 29,000).
        let job = chain_job(&[(1000, true), (10_000, true)], 4000, ring(), 4);
        assert_eq!(run(&job, &[]), (25_000, vec![], 25_000));
    }

    #[test]
    fn theorem_2_chains_and_patches_come_highest_first() {
        // Three 1 µs ops with 4000 B gradients: q0 1000→13,000, q1 →25,000, q2 →37,000.
        // (q0, q1): fuse, predicted end 2000 + 18,000 = 20,000. (q01, q2): 20,000 + 12,000 =
        // 32,000 > 3000 + t_sync(12,000 B) = 3000 + 6 × 4000 = 27,000 → fuse all three.
        let job = chain_job(&[(1000, true), (1000, true), (1000, true)], 4000, ring(), 4);
        assert_eq!(run(&job, &[]), (37_000, vec![vec![0, 1, 2]], 27_000));
        // scope=all with a threshold of 8000 B: groups {0, 1} and {2} alone.
        let mb = format!("{}", 8000.0 / 1048576.0);
        let (_, groups, after) = run(&job, &[("scope", "all"), ("threshold_mb", &mb)]);
        assert_eq!(groups, vec![vec![0, 1]]);
        // {0,1}: 2000 → 20,000; q2 ready 3000, waits: 20,000 → 32,000.
        assert_eq!(after, 32_000);
    }

    #[test]
    fn threshold_groups_in_issue_order_and_apply_highest_first() {
        // Sizes 3, 3, 5, 1, 1 MiB with a 6 MiB threshold: {0,1}, {2,3}, {4}; applying the
        // higher group first keeps the lower group's indices valid.
        let mib = 1 << 20;
        let job = chain_job_sizes(
            &[
                (1000, Some(3 * mib)),
                (1000, Some(3 * mib)),
                (1000, Some(5 * mib)),
                (1000, Some(mib)),
                (1000, Some(mib)),
            ],
            ring(),
            2,
        );
        let cx = evaluate(job.clone()).unwrap();
        let p = TensorFusion
            .propose(&cx, &knobs(&[("scope", "all"), ("threshold_mb", "6")]))
            .unwrap();
        assert_eq!(fused(&p), vec![vec![2, 3], vec![0, 1]]);
        let after = apply_all(&job, &p).unwrap();
        assert_eq!(after.syncs.len(), 3);
        assert_eq!(after.syncs[0].bytes, 6 * mib);
        assert_eq!(after.syncs[1].bytes, 6 * mib);
        assert_eq!(after.syncs[1].tensors, vec![2, 3]);
        assert_eq!(after.syncs[2].tensors, vec![4]);
        // A tensor above the threshold stays alone.
        let p = TensorFusion
            .propose(&cx, &knobs(&[("scope", "all"), ("threshold_mb", "4")]))
            .unwrap();
        assert_eq!(fused(&p), vec![vec![3, 4]]);
    }

    #[test]
    fn coarsened_view_fuses_a_layers_tensors_as_one_unit() {
        // A, B, C (1 µs each), 4000 B gradients, 4 workers: unfused q0 ends 13,000, q1 25,000,
        // q2 37,000. Give A's and B's tensors the same layer: units {0, 1} and {2}.
        let mut job = chain_job(&[(1000, true), (1000, true), (1000, true)], 4000, ring(), 4);
        job.local_mut().tensors[1].layer = 0;
        assert_eq!(sync_units(&job, true), vec![vec![0, 1], vec![2]]);
        assert_eq!(sync_units(&job, false), vec![vec![0], vec![1], vec![2]]);
        // Unit {0,1}: ready 2000, unfused end 25,000; next unit {2}: 25,000 + 12,000 = 37,000 >
        // max(2000, 3000) + t_sync(12,000 B) = 3000 + 24,000 → fuse all: ends 27,000.
        assert_eq!(run(&job, &[]), (37_000, vec![vec![0, 1, 2]], 27_000));
        assert_eq!(
            run(&job, &[("coarsen", "0")]),
            (37_000, vec![vec![0, 1, 2]], 27_000)
        );
        // A unit alone is proposed fused (its why says so) even where Theorem 2 would not fuse
        // its syncs: A(1 µs) → B(10 µs): 25,000 unfused, 11,000 + 18,000 = 29,000 fused. The
        // search prices the move by replay and rejects it.
        let mut late = chain_job(&[(1000, true), (10_000, true)], 4000, ring(), 4);
        late.local_mut().tensors[1].layer = 0;
        assert_eq!(run(&late, &[("coarsen", "0")]), (25_000, vec![], 25_000));
        assert_eq!(run(&late, &[]), (25_000, vec![vec![0, 1]], 29_000));
        let cx = evaluate(late).unwrap();
        let p = TensorFusion.propose(&cx, &knobs(&[])).unwrap();
        assert!(p[0].why.contains("coarsened view"), "{}", p[0].why);
        assert!(resolve_knobs(&TensorFusion, &[("coarsen".into(), "5".into())]).is_err());
    }

    #[test]
    fn zoo_units_group_a_layers_tensors() {
        let cluster = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        for (name, tensors, units) in [("resnet50", 161, 107), ("bert-base", 206, 105)] {
            let model = crate::zoo::model(name, &Default::default()).unwrap();
            let job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
            let u = sync_units(&job, true);
            eprintln!("{name}: {} syncs in {} units", job.syncs.len(), u.len());
            assert_eq!((job.syncs.len(), u.len()), (tensors, units), "{name}");
            assert_eq!(u.concat(), (0..tensors).collect::<Vec<_>>());
            let mut sym = job.clone();
            sym.symmetric = true;
            let cx = evaluate(sym.clone()).unwrap();
            let fine = TensorFusion
                .propose(&cx, &knobs(&[("coarsen", "0")]))
                .unwrap();
            let coarse = TensorFusion.propose(&cx, &knobs(&[])).unwrap();
            let t = |p: &[Patch]| {
                evaluate(apply_all(&sym, p).unwrap())
                    .unwrap()
                    .iteration_ns()
            };
            eprintln!(
                "{name}: {} ns; coarsen=0 {} groups → {} ns; coarsen=1 {} groups → {} ns",
                cx.iteration_ns(),
                fine.len(),
                t(&fine),
                coarse.len(),
                t(&coarse)
            );
        }
    }

    #[test]
    fn zoo_resnet50_tcp_all_fuses_and_is_faster() {
        let model = crate::zoo::model("resnet50", &Default::default()).unwrap();
        let cluster = crate::cost::config::load_cluster("dpro-16xv100-tcp").unwrap();
        let job = crate::zoo::build::job(&model, &cluster, &Default::default()).unwrap();
        let base = evaluate(job.clone()).unwrap();
        let p = TensorFusion
            .propose(&base, &knobs(&[("scope", "all")]))
            .unwrap();
        // 161 tensors, ~97.5 MiB in FP32: at least two groups under 64 MiB.
        assert!(p.len() >= 2, "{}", p.len());
        let after = evaluate(apply_all(&job, &p).unwrap()).unwrap();
        assert!(after.job.syncs.len() < job.syncs.len());
        let total: u64 = job.syncs.iter().map(|s| s.bytes).sum();
        assert_eq!(after.job.syncs.iter().map(|s| s.bytes).sum::<u64>(), total);
        let crit = TensorFusion.propose(&base, &knobs(&[])).unwrap();
        let after_crit = evaluate(apply_all(&job, &crit).unwrap()).unwrap();
        assert!(after_crit.iteration_ns() <= base.iteration_ns());
    }
}
