//! `pipeline`: pipeline parallelism of a transformer (GPipe, Huang et al. 2019; 1F1B,
//! Narayanan et al. 2021 §2.2): each model replica's layers are cut into `stages` consecutive
//! groups of blocks on `stages` ranks, and the replica's batch runs as `microbatches`
//! micro-batches through them in the schedule's order.
//!
//! **What changes.** The job's local graph becomes one micro-batch of the whole replica (the
//! forward and backward ops re-costed at the micro-batch, as `grad-accumulation` re-costs
//! them; their activations scaled the same way), and [`crate::graph::pipeline`] expands it into
//! the stages, their micro-steps in the schedule's order, the sends between stages and each
//! stage's gradient synchronisation over its data-parallel replicas (the ranks `N / stages`
//! apart hold the other stages: the pipeline dimension is outermost, as in Megatron-LM and
//! torchtitan). With `batch=global` (default) the global batch is kept: a replica of `stages`
//! ranks trains `stages` times the per-GPU batch; `batch=replica` keeps the batch per replica.
//!
//! **Bubble.** With equal stages, forward `F` and backward `B` per micro-batch and no
//! communication, both schedules take `(m + stages − 1)(F + B)`: the bubble is
//! `(stages − 1) / m` of the ideal time (Narayanan et al., eq. 1). 1F1B holds at most
//! `stages − s` micro-batches' activations on stage `s`, GPipe all `m`. The replay adds what
//! the formula leaves out: the first stage's embedding and the last stage's head and loss, the
//! sends, the launches, and the gradient synchronisation after the last backward.
//!
//! **Knobs.** `stages` (times `virtual`, must divide the model's blocks; times the
//! tensor-parallel degree, the workers), `microbatches` (must divide the replica's batch),
//! `schedule` = `1f1b` | `gpipe` | `interleaved`, `virtual` (model chunks per rank, with
//! `interleaved` only), `batch` = `global` | `replica`.
//!
//! **Interleaved** (`schedule=interleaved`, `virtual=V`, default 2): each rank holds `V` model
//! chunks (chunk `c` of `stages × V` on rank `c mod stages`), the order is Megatron-LM's
//! interleaved 1F1B (micro-batches a multiple of the stages), and the bubble shrinks to
//! `(stages − 1) / (V m)` at the price of `V` times the sends.
//!
//! **Beside a sharded optimizer** (`shard:stage=1` before it: Megatron-LM's distributed
//! optimizer, DeepSpeed's ZeRO-1 with its pipeline engine): each stage keeps its own layers'
//! optimizer state as 1/dp shards over its dp replicas, runs 1/dp of its optimizer kernels and
//! all-gathers its updated parameters over them. The shard pass, applied first, divided the
//! state and the kernels over every data-parallel rank of the job; the pipeline multiplies them
//! back by the stages (`distributed_optimizer_per_stage`).
//!
//! **Beside FSDP** (`shard:stage=3,reshard=0` before it: FSDP2 under
//! `torch.distributed.pipelining`, as torchtitan runs it): the schedule keeps every unit
//! gathered from the first micro-batch's forward to the last one's backward and syncs gradients
//! on the last backward only, so a stage gathers its parameters once per step and
//! reduce-scatters its gradients once: the traffic of stage 1, with the parameters held whole
//! for the step beside their shards ([`super::shard::gathered_once_per_step`] rewrites the
//! per-unit gathers so; then as stage 1 above). `reshard=1` is refused.
//!
//! **Not modelled yet** (refused with the reason): sharding stage 2 (DeepSpeed's pipeline
//! engine refuses ZeRO-2; no other runtime runs it beside a pipeline), HSDP groups or optimizer offload
//! with a pipeline, accumulation on top of the pipeline's micro-batches, passes after
//! `pipeline` (it comes last), and traces. A tied weight is held by both stages that use it,
//! and their gradients are exchanged between them (`graph/pipeline.rs`).

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::graph::job::{CollectiveKind, Group, Job};
use crate::graph::pipeline::{Pipeline as Spec, Schedule, stages as cut};
use crate::graph::{NONE, Phase};

/// The `pipeline` pass.
pub struct Pipeline;

pub const NAME: &str = "pipeline";

fn refuse(why: String) -> PassError {
    PassError::NotApplicable {
        pass: NAME.into(),
        why,
    }
}

impl Pass for Pipeline {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "pipeline parallelism: the blocks cut into stages on their own ranks, micro-batches in a GPipe or 1F1B schedule (apply it last)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::int(
                "stages",
                "ranks along the pipeline; must divide the model's blocks, and stages x the tensor-parallel degree the workers",
                2,
                1,
                1024,
            ),
            KnobSpec::int(
                "microbatches",
                "micro-batches per iteration; must divide the replica's batch",
                8,
                1,
                65_536,
            ),
            KnobSpec::text(
                "schedule",
                "1f1b (PipeDream-Flush, Megatron's default), gpipe, or interleaved (1F1B over `virtual` chunks per rank)",
                "1f1b",
            ),
            KnobSpec::int(
                "virtual",
                "model chunks per rank with schedule=interleaved (default 2 there; 1 otherwise)",
                1,
                1,
                64,
            ),
            KnobSpec::text(
                "batch",
                "global: keep the global batch (a replica of `stages` ranks trains stages x the per-GPU batch); replica: keep the batch per replica",
                "global",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let stages = knobs.int("stages") as u32;
        let m = knobs.int("microbatches") as u32;
        let schedule = match knobs.text("schedule").trim() {
            "1f1b" => Schedule::OneFOneB,
            "gpipe" => Schedule::Gpipe,
            "interleaved" => Schedule::Interleaved,
            other => {
                return Err(PassError::BadKnob {
                    pass: NAME.into(),
                    knob: "schedule".into(),
                    value: other.into(),
                    why: "expected 1f1b, gpipe or interleaved".into(),
                });
            }
        };
        let v = knobs.int("virtual") as u32;
        let v = match (schedule, v) {
            // The interleaved schedule's default: two chunks per rank.
            (Schedule::Interleaved, 1) => 2,
            (Schedule::Interleaved, v) => v,
            (_, 1) => 1,
            (s, v) => {
                return Err(refuse(format!(
                    "virtual = {v} model chunks per rank need schedule=interleaved (schedule={} runs one chunk per rank)",
                    s.name()
                )));
            }
        };
        let global = super::keeps_global_batch(NAME, knobs)?;
        let spec = Spec {
            stages,
            microbatches: m,
            schedule,
            chunks_per_rank: v,
        };
        let job = pipelined(&cx.job, spec, global)?;
        if stages == 1 && m == 1 {
            return Ok(Vec::new());
        }
        let per = job.meta.batch / m;
        let (chunks, bubble) = if v > 1 {
            (
                format!(", {v} chunks per rank"),
                format!(
                    "(stages − 1)/(virtual · m) = {:.1} %",
                    100.0 * f64::from(stages - 1) / f64::from(v * m)
                ),
            )
        } else {
            (
                String::new(),
                format!(
                    "(stages − 1)/m = {:.1} %",
                    100.0 * f64::from(stages - 1) / f64::from(m)
                ),
            )
        };
        let sizes = cut(&job, spec.chunks())
            .map(|c| c.sizes)
            .unwrap_or_default();
        let per_stage = match (sizes.first(), sizes.iter().max()) {
            (Some(&first), Some(_)) if sizes.iter().all(|&n| n == first) => {
                format!("{} blocks", first * v)
            }
            (Some(&first), Some(&most)) => format!(
                "{most} blocks (the first {first}, the last {})",
                sizes.last().copied().unwrap_or(most)
            ),
            _ => "? blocks".into(),
        };
        let why = format!(
            "{stages} stages of {per_stage}{chunks}, {m} micro-batches of {per} sample{}, {}: bubble {bubble} of the ideal step",
            if per == 1 { "" } else { "s" },
            schedule.name(),
        );
        Ok(vec![Patch {
            pass: NAME.into(),
            why,
            edits: vec![Edit::ReplaceJob(Box::new(job))],
        }])
    }
}

/// `job` pipelined as `spec` says (see the module docs), or why it cannot be.
pub fn pipelined(job: &Job, spec: Spec, global: bool) -> Result<Job, PassError> {
    let (stages, m) = (spec.stages, spec.microbatches);
    if job.is_recorded() {
        return Err(refuse(
            "pipeline stages are cut by the model's blocks (a zoo transformer: --model gpt, bert-*, llama*); a trace's kernels are not".into(),
        ));
    }
    if let Some(p) = job.meta.pipeline {
        return Err(refuse(format!(
            "the job is already pipelined ({} stages)",
            p.stages
        )));
    }
    if job.meta.accumulation > 1 {
        return Err(refuse(
            "the pipeline's micro-batches are its gradient accumulation: apply pipeline instead of grad-accumulation".into(),
        ));
    }
    let (tp, cp) = (job.meta.tp.max(1), job.meta.cp.max(1));
    let fsdp;
    let job = if job.meta.shard_stage == 3 {
        fsdp = super::shard::gathered_once_per_step(job).map_err(refuse)?;
        &fsdp
    } else {
        job
    };
    let gathered = stage1_gather(job)?;
    if !job.workers.is_multiple_of(stages * tp * cp) {
        return Err(refuse(format!(
            "stages = {stages} × tensor-parallel degree {tp}{} must divide the {} workers",
            if cp > 1 {
                format!(" × context-parallel degree {cp}")
            } else {
                String::new()
            },
            job.workers
        )));
    }
    let c = cut(job, spec.chunks()).map_err(|why| {
        refuse(if spec.chunks_per_rank > 1 {
            format!(
                "{why} (stages × virtual = {stages} × {})",
                spec.chunks_per_rank
            )
        } else {
            why
        })
    })?;
    if spec.chunks_per_rank > 1 && !c.blocks.is_multiple_of(spec.chunks()) {
        return Err(refuse(format!(
            "the interleaved schedule needs stages × virtual = {} to divide the model's {} blocks (uneven stages are 1F1B and GPipe only, as in Megatron-LM)",
            spec.chunks(),
            c.blocks
        )));
    }
    if spec.schedule == Schedule::Interleaved && !m.is_multiple_of(stages) {
        return Err(refuse(format!(
            "the interleaved schedule needs microbatches = {m} to be a multiple of stages = {stages} (as Megatron-LM does)"
        )));
    }
    let syncs = split_syncs(job, &c.of_layer);
    let batch = job.meta.batch.max(1) * if global { stages } else { 1 };
    if !batch.is_multiple_of(m) {
        return Err(refuse(format!(
            "microbatches = {m} must divide the replica's batch of {batch} samples{}",
            if global {
                format!(" ({stages} stages × {} per GPU)", job.meta.batch.max(1))
            } else {
                String::new()
            }
        )));
    }
    let scale = f64::from(batch / job.meta.batch.max(1)) / f64::from(m);
    let mut j = job.clone();
    j.syncs = syncs;
    let micro: Vec<bool> = job
        .local
        .ops
        .iter()
        .map(|o| matches!(o.spec.phase, Phase::Fw | Phase::Bw))
        .collect();
    {
        let ops: Vec<_> = job
            .local
            .ops
            .iter()
            .zip(&micro)
            .map(|(o, &mi)| {
                if mi {
                    super::grad_accumulation::micro_op(job, o, scale)
                } else {
                    o.clone()
                }
            })
            .collect();
        let l = j.local_mut();
        l.ops = ops;
        for e in &mut l.mem {
            if micro[e.op as usize] {
                e.bytes = (e.bytes as f64 * scale).ceil() as u64;
            }
        }
    }
    if let Some(whole) = gathered {
        distributed_optimizer_per_stage(&mut j, whole, stages);
    }
    for s in &mut j.syncs {
        let size = s.group.len(job.workers) / stages;
        s.group = Group {
            size,
            stride: s.group.stride.max(1),
        };
    }
    j.meta.batch = batch;
    j.meta.pipeline = Some(spec);
    Ok(j)
}

/// With sharding, the bytes its all-gather of the updated parameters moves (the whole
/// parameters as the model holds them); None without sharding; why not where the sharding is
/// one a pipeline cannot run beside: stage 2 (DeepSpeed's pipeline engine refuses ZeRO-2;
/// Megatron-LM's distributed optimizer is stage 1), HSDP shard groups, or the optimizer
/// offloaded. A stage-3 job comes here as [`super::shard::gathered_once_per_step`] made it.
fn stage1_gather(job: &Job) -> Result<Option<u64>, PassError> {
    // Stages 1 and 3 reduce-scatter; anything else that is not an all-reduce or all-gather is
    // a sharding the pipeline does not run beside (stage 2, or a trace's recorded sharding).
    if let Some(s) = job.syncs.iter().find(|s| {
        !matches!(job.meta.shard_stage, 1 | 3)
            && !matches!(
                s.kind,
                CollectiveKind::AllReduce | CollectiveKind::AllGather
            )
    }) {
        return Err(refuse(format!(
            "sharding stage {} ({} of {}) with a pipeline is not modelled: Megatron-LM's distributed optimizer and DeepSpeed's pipeline engine shard the optimizer state only (shard:stage=1), FSDP2 under torch.distributed.pipelining everything (shard:stage=3,reshard=0); DeepSpeed refuses ZeRO-2 beside its pipeline",
            job.meta.shard_stage,
            s.kind.name(),
            job.local.tensors[s.tensors[0] as usize].name
        )));
    }
    let gathers: Vec<&crate::graph::job::Sync> = job
        .syncs
        .iter()
        .filter(|s| s.kind == CollectiveKind::AllGather)
        .collect();
    let Some(g) = gathers.first() else {
        return Ok(None);
    };
    if job.meta.offload {
        return Err(refuse(
            "optimizer offload with a pipeline is not modelled".into(),
        ));
    }
    let dp = job.workers / job.meta.tp.max(1);
    if gathers.len() > 1 || g.group.len(job.workers) != dp {
        return Err(refuse(format!(
            "sharding over groups of {} of the {dp} data-parallel ranks (HSDP) with a pipeline is not modelled: shard over all of them (replicas=1)",
            g.group.len(job.workers)
        )));
    }
    Ok(Some(g.bytes))
}

/// A stage-1 sharded job (Megatron-LM's distributed optimizer) pipelined over `stages`: the
/// shard pass divided the optimizer state and step over every data-parallel rank of the whole
/// job, and a stage's are divided over its `stages` times fewer replicas. Its static bytes are
/// the `whole` parameters plus `stages` × the shards it held; its GPU optimizer kernels take
/// `stages` × their time and work (each stage runs its own layers' kernels only).
fn distributed_optimizer_per_stage(j: &mut Job, whole: u64, stages: u32) {
    let k = u64::from(stages);
    let l = j.local_mut();
    let states = l.static_mem_bytes.saturating_sub(whole);
    l.static_mem_bytes = whole.saturating_add(states.saturating_mul(k));
    for o in super::optimizer_kernels(l) {
        let op = &mut l.ops[o as usize];
        op.spec.dur_ns = op.spec.dur_ns.saturating_mul(k);
        op.work = op.work.map(|w| w.times(f64::from(stages)));
    }
}

/// The syncs with each one's tensors split by stage: a bucket of DDP or a fused group holding
/// tensors of two stages becomes one per stage (each stage's process buckets its own
/// gradients), its bytes shared in proportion to its tensors' and its ready and done ops to
/// the stage they run on.
fn split_syncs(job: &Job, of_layer: &[u32]) -> Vec<crate::graph::job::Sync> {
    let l = &job.local;
    let stage_of_tensor = |t: u32| {
        let layer = l.tensors[t as usize].layer;
        if layer == NONE {
            0
        } else {
            of_layer[layer as usize]
        }
    };
    let stage_of_op = |o: u32| {
        let layer = l.ops[o as usize].spec.layer;
        (layer != NONE).then(|| of_layer[layer as usize])
    };
    let mut out = Vec::with_capacity(job.syncs.len());
    for s in &job.syncs {
        let mut stages: Vec<u32> = s.tensors.iter().map(|&t| stage_of_tensor(t)).collect();
        stages.sort_unstable();
        stages.dedup();
        if stages.len() <= 1 {
            out.push(s.clone());
            continue;
        }
        let total: u64 = s.tensors.iter().map(|&t| l.tensors[t as usize].bytes).sum();
        // Later stages' gradients are ready first (the backward runs from the last stage).
        for &st in stages.iter().rev() {
            let tensors: Vec<u32> = s
                .tensors
                .iter()
                .copied()
                .filter(|&t| stage_of_tensor(t) == st)
                .collect();
            let mine: u64 = tensors.iter().map(|&t| l.tensors[t as usize].bytes).sum();
            let keep = |ops: &[u32]| -> Vec<u32> {
                ops.iter()
                    .copied()
                    .filter(|&o| stage_of_op(o).is_none_or(|x| x == st))
                    .collect()
            };
            out.push(crate::graph::job::Sync {
                tensors,
                bytes: if total == 0 {
                    s.bytes
                } else {
                    ((s.bytes as u128 * mine as u128).div_ceil(total as u128) as u64).max(1)
                },
                ready: keep(&s.ready),
                done: keep(&s.done),
                ..s.clone()
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{DeviceKind, OpId};
    use crate::passes::evaluate;
    use crate::zoo::build::test_job_with;

    fn gpt(layers: u32, batch: u32, cluster: &str) -> Job {
        let opts = crate::zoo::ModelOptions {
            batch: Some(batch),
            layers: Some(layers),
            hidden: Some(1024),
            heads: Some(16),
            seq: Some(1024),
            ..Default::default()
        };
        test_job_with("gpt", &opts, cluster).1
    }

    fn spec(stages: u32, m: u32, schedule: Schedule) -> Spec {
        Spec {
            stages,
            microbatches: m,
            schedule,
            chunks_per_rank: if schedule == Schedule::Interleaved {
                2
            } else {
                1
            },
        }
    }

    /// Per stage: (compute-stream busy ns, last end ns).
    fn per_stage(e: &Evaluated) -> Vec<(u64, u64)> {
        let g = &e.graph;
        let mut out = vec![(0u64, 0u64); g.workers() as usize];
        for op in 0..g.op_count() as u32 {
            if let DeviceKind::GpuStream { worker, stream: 0 } = g.device_kind(g.device(op)) {
                let w = &mut out[worker as usize];
                w.0 += g.dur_ns(op);
                w.1 = w.1.max(e.replay.end_ns[op as usize]);
            }
        }
        out
    }

    /// A GPT of `layers` blocks with a small vocabulary (its head and embedding a few % of a
    /// block), so that its stages are nearly equal, and wide enough that a micro-batch of one
    /// sample keeps the GPU busier than the host that launches it.
    fn balanced(layers: u32, batch: u32, cluster: &str) -> Job {
        let opts = crate::zoo::ModelOptions {
            batch: Some(batch),
            layers: Some(layers),
            hidden: Some(4096),
            heads: Some(32),
            seq: Some(2048),
            vocab: Some(1024),
            ..Default::default()
        };
        test_job_with("gpt", &opts, cluster).1
    }

    /// Narayanan et al. 2021, eq. 1: with equal stages the step is the busiest stage's work
    /// stretched by (m + p − 1) / m, under both schedules. Eight stages on eight GPUs (no data
    /// parallelism to synchronise); the replay adds the sends, the launches and the update.
    #[test]
    fn the_step_follows_the_bubble_formula() {
        let job = balanced(16, 16, "8xh200");
        for schedule in [Schedule::OneFOneB, Schedule::Gpipe] {
            for m in [8u32, 16] {
                let p = pipelined(&job, spec(8, m, schedule), false).unwrap();
                let e = evaluate(p).unwrap();
                let busy = per_stage(&e).iter().map(|s| s.0).max().unwrap() as f64;
                let formula = busy * f64::from(m + 7) / f64::from(m);
                let got = e.iteration_ns() as f64;
                assert!(
                    (got / formula - 1.0).abs() < 0.03,
                    "{schedule:?} m={m}: replay {got} ns, formula {formula} ns"
                );
            }
        }
    }

    /// Stages that do not divide the blocks: the ends one block lighter (Megatron-LM's
    /// `--decoder-first/last-pipeline-num-layers`; Llama 3 405B's 126 layers on 16 stages:
    /// 7, 14 × 8, 7), else refused.
    #[test]
    fn uneven_stages_make_the_ends_lighter() {
        use crate::graph::pipeline::split;
        assert_eq!(split(8, 4), Some(vec![2, 2, 2, 2]));
        assert_eq!(split(7, 4), Some(vec![2, 2, 2, 1]));
        assert_eq!(split(6, 4), Some(vec![1, 2, 2, 1]));
        let meta = split(126, 16).unwrap();
        assert_eq!((meta[0], meta[15], meta.iter().sum::<u32>()), (7, 7, 126));
        assert!(meta[1..15].iter().all(|&n| n == 8));
        assert_eq!(split(6, 5), None);
        assert_eq!(split(3, 4), None);
        // Replayed: 14 blocks on 8 stages (1, 6 × 2, 1) on 8 GPUs; with unequal stages 1F1B
        // takes m − 1 micro-steps of the slowest stage plus one of every stage (which is
        // (m + p − 1) / m of the busiest stage's work when they are equal).
        let job = balanced(14, 16, "8xh200");
        let p = pipelined(&job, spec(8, 8, Schedule::OneFOneB), false).unwrap();
        let c = cut(&p, 8).unwrap();
        assert_eq!(c.sizes, vec![1, 2, 2, 2, 2, 2, 2, 1]);
        let e = evaluate(p).unwrap();
        let busy: Vec<f64> = per_stage(&e).iter().map(|s| s.0 as f64).collect();
        let max = busy.iter().copied().fold(0.0, f64::max);
        let formula = max * 7.0 / 8.0 + busy.iter().sum::<f64>() / 8.0;
        let got = e.iteration_ns() as f64;
        assert!(
            (got / formula - 1.0).abs() < 0.03,
            "replay {got} ns, formula {formula} ns"
        );
        // Interleaved needs the chunks to divide the blocks.
        let err = pipelined(&job, spec(4, 8, Schedule::Interleaved), false).unwrap_err();
        assert!(
            err.to_string().contains("to divide the model's 14 blocks"),
            "{err}"
        );
    }

    /// Narayanan et al. 2021 §2.2.2: with `v` model chunks per rank the bubble shrinks to
    /// (p − 1) / (v m) of the ideal step. The replay is 3-4 % above the formula (1F1B: under
    /// 1 %): each micro-batch crosses `v` times as many stage boundaries, and the formula has
    /// no communication.
    #[test]
    fn the_interleaved_step_follows_its_smaller_bubble() {
        let job = balanced(16, 16, "8xh200");
        for m in [8u32, 16] {
            let p = pipelined(&job, spec(8, m, Schedule::Interleaved), false).unwrap();
            let e = evaluate(p).unwrap();
            let busy = per_stage(&e).iter().map(|s| s.0).max().unwrap() as f64;
            let formula = busy * (1.0 + 7.0 / f64::from(2 * m));
            let got = e.iteration_ns() as f64;
            assert!(
                (got / formula - 1.0).abs() < 0.05,
                "m={m}: replay {got} ns, formula {formula} ns"
            );
        }
    }

    /// Saved activations of one micro-step of stage `s`: what its forward ops allocate at their
    /// start (freed by their backward).
    fn saved_per_micro(job: &Job, s: u32) -> u64 {
        let c = cut(job, job.meta.pipeline.unwrap().chunks()).unwrap();
        job.local
            .mem
            .iter()
            .filter(|e| {
                let o = &job.local.ops[e.op as usize].spec;
                o.phase == Phase::Fw
                    && e.when == crate::graph::MemWhen::AllocAtStart
                    && o.layer != NONE
                    && c.of_layer[o.layer as usize] == s
            })
            .map(|e| e.bytes)
            .sum()
    }

    /// In-flight micro-batches (Narayanan et al. §2.2): stage s holds the activations of
    /// min(p − s, m) micro-batches under 1F1B, of all m under GPipe. The replayed peak above the
    /// stage's static memory, in units of one micro-step's saved activations, rounds down to
    /// that count (the rest is the running op's transient memory, less than one micro-step's).
    #[test]
    fn each_stage_holds_the_schedules_in_flight_micro_batches() {
        let job = balanced(16, 16, "8xh200");
        let (p, m) = (8u32, 16u32);
        // Interleaved, two chunks per rank: rank s's warm-up runs 2(p − s − 1) + p chunk
        // forwards, and one more is in flight when its first backward starts (middle ranks:
        // their two chunks hold the same blocks' worth).
        let pj = pipelined(&job, spec(p, m, Schedule::Interleaved), false).unwrap();
        let e = evaluate(pj.clone()).unwrap();
        for s in 1..p - 1 {
            let act = saved_per_micro(&pj, s);
            assert_eq!(act, saved_per_micro(&pj, s + p));
            let dynamic =
                e.memory.per_worker_bytes[s as usize] - e.graph.static_memory()[s as usize];
            let want = (2 * (p - s - 1) + p + 1).min(2 * m);
            assert_eq!(
                dynamic / act,
                u64::from(want),
                "interleaved rank {s}: {dynamic} B above static, {act} B a chunk's micro-step"
            );
        }
        for schedule in [Schedule::OneFOneB, Schedule::Gpipe] {
            let pj = pipelined(&job, spec(p, m, schedule), false).unwrap();
            let e = evaluate(pj.clone()).unwrap();
            for s in 0..p {
                let act = saved_per_micro(&pj, s);
                let dynamic =
                    e.memory.per_worker_bytes[s as usize] - e.graph.static_memory()[s as usize];
                let want = match schedule {
                    Schedule::OneFOneB => (p - s).min(m),
                    Schedule::Gpipe | Schedule::Interleaved => m,
                };
                assert_eq!(
                    dynamic / act,
                    u64::from(want),
                    "{schedule:?} stage {s}: {dynamic} B above static, {act} B a micro-step"
                );
            }
        }
    }

    /// The stages' weights and optimizer state add up to the replica's, the embedding's on
    /// the first stage and the head's on the last; each stage's gradients are its own. GPT-2's
    /// output layer computes with the word embeddings' weight: the last stage holds a copy of
    /// it, its share of the static memory and its gradient (Megatron-LM's last-stage
    /// `word_embeddings`, DeepSpeed's `TiedLayerSpec`).
    #[test]
    fn static_memory_is_split_by_the_stages_parameters() {
        let job = gpt(8, 4, "8xh200");
        let pj = pipelined(&job, spec(4, 4, Schedule::OneFOneB), true).unwrap();
        let e = evaluate(pj).unwrap();
        let st = e.graph.static_memory();
        let grads: u64 = job
            .local
            .mem
            .iter()
            .filter(|m| {
                job.local.ops[m.op as usize].spec.phase == Phase::Comm
                    && m.when == crate::graph::MemWhen::AllocAtStart
            })
            .map(|m| m.bytes)
            .sum();
        let l = &job.local;
        assert_eq!(l.ties.len(), 1, "lm_head ties to transformer.wte");
        let (head, t) = l.ties[0];
        assert_eq!(l.layers[head as usize], "lm_head");
        let wte = &l.tensors[t as usize];
        assert_eq!(wte.name, "transformer.wte.weight");
        let params: u64 = l.tensors.iter().map(|t| t.bytes).sum();
        let copy = (l.static_mem_bytes as u128 * wte.bytes as u128).div_ceil(params as u128) as u64
            + wte.bytes;
        let total: u64 = st.iter().sum();
        let want = l.static_mem_bytes + grads + copy;
        assert!(total >= want && total <= want + 8, "{total} vs {want}");
        // GPT-2's embeddings (vocab x hidden + positions) sit on stage 0: it holds more than a
        // middle stage; the last one holds the copy and the final norm.
        assert!(st[0] > st[1] && st[1] == st[2], "{st:?}");
        assert!(st[3] >= st[1] + copy, "{st:?}, copy {copy}");
        // Without the tie the copy is gone.
        let mut untied = job.clone();
        untied.local_mut().ties.clear();
        let u =
            evaluate(pipelined(&untied, spec(4, 4, Schedule::OneFOneB), true).unwrap()).unwrap();
        let su = u.graph.static_memory();
        assert_eq!(su[3] + copy, st[3]);
        assert_eq!(su[..3], st[..3]);
    }

    /// The tied word embeddings' two gradients are exchanged between the first and last stage
    /// (Megatron-LM's embedding-group all-reduce): one send each way carrying the whole
    /// gradient, on links of their own between those two ranks, the first after the last
    /// stage's every backward of the output layer and before the first stage's sync of the
    /// embeddings, the second after that sync. Untied, there are none, and the step is no
    /// longer.
    #[test]
    fn tied_gradients_are_exchanged_between_the_first_and_last_stage() {
        let job = gpt(8, 4, "64xh100-ib");
        let (head, t) = job.local.ties[0];
        let bytes = job.local.tensors[t as usize].bytes;
        let pj = pipelined(&job, spec(4, 4, Schedule::OneFOneB), true).unwrap();
        let e = evaluate(pj.clone()).unwrap();
        let g = &e.graph;
        // (The replicas' ring of the embeddings' sync has sends of that tensor too, on the
        // ring's links; the exchange's carry the output layer.)
        let sends: Vec<OpId> = (0..g.op_count() as OpId)
            .filter(|&o| {
                g.kind(o) == crate::graph::OpKind::Send && g.tensor(o) == t && g.layer(o) == head
            })
            .collect();
        assert_eq!(sends.len(), 2, "one each way");
        let ends: Vec<(u32, u32)> = sends
            .iter()
            .map(|&o| match g.device_kind(g.device(o)) {
                DeviceKind::Link { from, to, .. } => (from, to),
                d => panic!("a tied send on {d:?}"),
            })
            .collect();
        assert_eq!(ends, vec![(3, 0), (0, 3)]);
        // 64 H100s over 8 nodes, 4 stages: the first and last stage are on different nodes.
        let link = pj.comm.cost.link(crate::graph::LinkClass::InterNode);
        assert_eq!(
            g.dur_ns(sends[0]),
            crate::cost::compute::ns(link.time_ns(bytes as f64))
        );
        // The first waits for the output layer's backward of every micro-batch on stage 3.
        let head_bw = (0..g.op_count() as OpId)
            .filter(|&o| g.layer(o) == head && g.phase(o) == Phase::Bw)
            .count();
        assert!(head_bw >= 4);
        assert!(g.preds(sends[0]).len() >= 4, "{:?}", g.preds(sends[0]));
        let mut untied = job.clone();
        untied.local_mut().ties.clear();
        let u =
            evaluate(pipelined(&untied, spec(4, 4, Schedule::OneFOneB), true).unwrap()).unwrap();
        assert_eq!(u.graph.op_count() + 2, g.op_count());
        assert!(e.iteration_ns() >= u.iteration_ns());
    }

    /// Each stage synchronises its own gradients over its data-parallel replicas: the groups
    /// shrink by the stages, and no sync mixes two stages.
    #[test]
    fn syncs_run_per_stage_over_the_replicas() {
        let job = gpt(8, 4, "64xh100-ib");
        let pj = pipelined(&job, spec(4, 4, Schedule::OneFOneB), true).unwrap();
        assert!(pj.syncs.iter().all(|s| s.group.len(pj.workers) == 16));
        let c = cut(&pj, 4).unwrap();
        for s in &pj.syncs {
            let stages: std::collections::BTreeSet<u32> = s
                .tensors
                .iter()
                .map(|&t| c.of_layer[pj.local.tensors[t as usize].layer as usize])
                .collect();
            assert_eq!(stages.len(), 1, "{:?}", s.tensors);
        }
        let bytes = |j: &Job| j.syncs.iter().map(|s| s.bytes).sum::<u64>();
        let (a, b) = (bytes(&job), bytes(&pj));
        assert!(b >= a && b <= a + pj.syncs.len() as u64, "{a} vs {b}");
        assert_eq!(pj.meta.batch, 16);
    }

    /// Megatron-LM's distributed optimizer beside a pipeline (`shard:stage=1` before it): each
    /// stage holds its own layers' optimizer state as 1/dp shards of its dp = 64 / (2 × 4) = 8
    /// replicas — not the 1/32 the shard pass divided by over the whole job's data-parallel
    /// ranks — runs 1/dp of its optimizer kernels, and all-gathers its updated parameters over
    /// its replicas. Stages 2–3, HSDP and offload are refused.
    #[test]
    fn a_stage1_shard_runs_per_stage_over_the_replicas() {
        use crate::passes::testkit::try_pass;
        let tp = try_pass(
            &gpt(8, 4, "64xh100-ib"),
            "tensor-parallel",
            &[("degree", "2")],
        )
        .unwrap();
        let plain = pipelined(&tp, spec(4, 8, Schedule::OneFOneB), true).unwrap();
        let sh = try_pass(&tp, "shard", &[("stage", "1")]).unwrap();
        let whole = sh
            .syncs
            .iter()
            .find(|s| s.kind == CollectiveKind::AllGather)
            .unwrap()
            .bytes;
        let pj = pipelined(&sh, spec(4, 8, Schedule::OneFOneB), true).unwrap();
        let dp = 64 / (2 * 4);
        // Static bytes: the whole parameters plus the state divided over the stage's replicas.
        let states = plain.local.static_mem_bytes - whole;
        let want = whole + states / dp;
        let got = pj.local.static_mem_bytes;
        assert!(got.abs_diff(want) <= 64, "{got} vs {want}");
        // The optimizer kernels: 1/dp of the unsharded ones' time (each rounded up to a whole
        // ns of its 1/32 shard, then times 4: under 4 ns off per kernel).
        let update = |j: &Job| -> (u64, u64) {
            let ks = crate::passes::optimizer_kernels(&j.local);
            let ns = ks
                .iter()
                .map(|&o| j.local.ops[o as usize].spec.dur_ns)
                .sum();
            (ns, ks.len() as u64)
        };
        let ((u, n), (v, m)) = (update(&plain), update(&pj));
        assert_eq!(n, m);
        assert!(
            n > 0 && u > 1_000_000,
            "the GPT's Adam kernels: {n}, {u} ns"
        );
        assert!(v.abs_diff(u / dp) <= 4 * n, "{v} vs {}", u / dp);
        // Each stage gathers its own parameters over its 8 replicas; all together, the whole.
        let gathers: Vec<_> = pj
            .syncs
            .iter()
            .filter(|s| s.kind == CollectiveKind::AllGather)
            .collect();
        assert_eq!(gathers.len(), 4);
        assert!(gathers.iter().all(|s| s.group.len(pj.workers) == dp as u32));
        let sum: u64 = gathers.iter().map(|s| s.bytes).sum();
        assert!(sum >= whole && sum <= whole + 4, "{sum} vs {whole}");
        // Less memory and a replay that runs.
        let (a, b) = (evaluate(plain).unwrap(), evaluate(pj).unwrap());
        assert!(b.memory.peaks.allocated < a.memory.peaks.allocated);
        for (knobs, why) in [
            (vec![("stage", "2")], "sharding stage 2"),
            (vec![("stage", "1"), ("replicas", "2")], "(HSDP)"),
            (
                vec![("stage", "1"), ("offload", "1")],
                "offload with a pipeline",
            ),
        ] {
            let j = try_pass(&tp, "shard", &knobs).unwrap();
            let e = pipelined(&j, spec(4, 8, Schedule::OneFOneB), true)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(why), "{knobs:?}: {e}");
        }
    }

    /// FSDP beside a pipeline (`shard:stage=3,reshard=0` before it, torchtitan's layout): each
    /// stage gathers its parameters once per step (one all-gather over its replicas, not one
    /// per unit and micro-batch), holds them whole beside its shards, and reduce-scatters its
    /// gradients: the collectives of the distributed optimizer (stage 1) in the same places, so
    /// the same step time, and the same memory to within the shards of the half weights and the
    /// gradient shards it keeps. `reshard=1` is refused.
    #[test]
    fn an_fsdp_shard_gathers_once_per_step_beside_a_pipeline() {
        use crate::passes::testkit::try_pass;
        let base = try_pass(&gpt(8, 4, "64xh100-ib"), "amp", &[("dtype", "bf16")]).unwrap();
        let tp = try_pass(&base, "tensor-parallel", &[("degree", "2")]).unwrap();
        let s = spec(4, 8, Schedule::OneFOneB);
        let fsdp = try_pass(&tp, "shard", &[("stage", "3"), ("reshard", "0")]).unwrap();
        let units = fsdp
            .syncs
            .iter()
            .filter(|x| x.kind == CollectiveKind::AllGather)
            .count();
        assert!(units >= 8, "one gather per block at least: {units}");
        let pj = pipelined(&fsdp, s, true).unwrap();
        let dp = 64 / (2 * 4);
        let gathers: Vec<_> = pj
            .syncs
            .iter()
            .filter(|x| x.kind == CollectiveKind::AllGather)
            .collect();
        assert_eq!(gathers.len(), 4, "one gather per stage");
        assert!(gathers.iter().all(|x| x.group.len(pj.workers) == dp));
        let scatters = pj
            .syncs
            .iter()
            .filter(|x| x.kind == CollectiveKind::ReduceScatter)
            .count();
        assert!(scatters >= 8, "{scatters}");
        // No memory effect is left on the per-unit gathers' ops: each held its unit per
        // micro-batch; the whole parameters are now static.
        let per_unit: u64 = fsdp
            .syncs
            .iter()
            .filter(|x| x.kind == CollectiveKind::AllGather)
            .map(|x| x.bytes)
            .sum();
        let whole: u64 = gathers.iter().map(|x| x.bytes).sum();
        assert!(whole.abs_diff(per_unit) <= 4, "{whole} vs {per_unit}");
        let z1 = try_pass(&tp, "shard", &[("stage", "1")]).unwrap();
        let p1 = pipelined(&z1, s, true).unwrap();
        let (a, b) = (evaluate(p1).unwrap(), evaluate(pj).unwrap());
        let (ta, tb) = (a.replay.iteration_ns as f64, b.replay.iteration_ns as f64);
        assert!((tb / ta - 1.0).abs() < 0.02, "{tb} vs {ta}");
        let (ma, mb) = (
            a.memory.peaks.allocated as f64,
            b.memory.peaks.allocated as f64,
        );
        assert!((mb / ma - 1.0).abs() < 0.05, "{mb} vs {ma}");
        // Gathering again for every backward: refused, not priced.
        let per_pass = try_pass(&tp, "shard", &[("stage", "3"), ("reshard", "1")]).unwrap();
        let e = pipelined(&per_pass, s, true).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("reshard=0")),
            "{e:?}"
        );
    }

    #[test]
    fn impossible_pipelines_are_refused_with_the_constraint() {
        let job = gpt(6, 4, "8xh200");
        let why = |s: u32, m: u32| match pipelined(&job, spec(s, m, Schedule::OneFOneB), true) {
            Err(e) => e.to_string(),
            Ok(_) => String::new(),
        };
        // 6 blocks on 4 stages: 1, 2, 2, 1 (the ends lighter, as Megatron-LM's uneven split);
        // on 8 stages there are not enough blocks.
        assert_eq!(why(4, 4), "");
        assert!(
            why(8, 8).contains("must divide the model's 6 blocks"),
            "{}",
            why(8, 8)
        );
        assert!(
            why(3, 4).contains("must divide the 8 workers"),
            "{}",
            why(3, 4)
        );
        assert!(
            why(2, 3).contains("must divide the replica's batch of 8"),
            "{}",
            why(2, 3)
        );
        let cx = evaluate(job.clone()).unwrap();
        let k = |kv: &[(&str, &str)]| {
            let given: Vec<(String, String)> = kv
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            crate::passes::resolve_knobs(&Pipeline, &given).unwrap()
        };
        let err = Pipeline
            .propose(&cx, &k(&[("schedule", "gpipe"), ("virtual", "2")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("need schedule=interleaved"), "{err}");
        // Passes after pipeline are refused: they read the replay by template op ids.
        let pj = pipelined(&job, spec(2, 4, Schedule::OneFOneB), true).unwrap();
        let cx = evaluate(pj).unwrap();
        let amp = crate::passes::amp::Amp;
        let err = crate::passes::propose(&amp, &cx, &k(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("apply amp before pipeline"), "{err}");
    }
}
