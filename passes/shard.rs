//! `shard`: sharded data parallelism — ZeRO-1/2/3 (DeepSpeed), FSDP's SHARD_GRAD_OP and
//! FULL_SHARD (PyTorch FSDP2 `fully_shard`), and HSDP (shard inside a group, replicate across
//! groups).
//!
//! **What changes** (Rajbhandari et al., "ZeRO", SC'20, §5; PyTorch FSDP, Zhao et al., VLDB'23):
//!
//! | stage | optimizer state | gradients | parameters | collectives |
//! |---|---|---|---|---|
//! | 1 | 1/g | whole (each rank's optimizer reads its 1/g) | whole | reduce-scatter per bucket; all-gather of the updated parameters |
//! | 2 | 1/g | reduce-scattered: 1/g kept | whole | reduce-scatter per bucket; all-gather after the update |
//! | 3 | 1/g | 1/g | 1/g, gathered per unit | all-gather per unit before its forward (and again before its backward with `reshard=1`); reduce-scatter per bucket (per unit under `--framework pytorch`/`torchtitan`: FSDP2) |
//!
//! `g` = workers / `replicas`: with `replicas > 1` (HSDP) the shard group is `g` consecutive
//! ranks, and each reduce-scattered gradient shard is then all-reduced across the `replicas`
//! groups (stride `g`). The optimizer step runs on the shard: its kernels take 1/g of the time.
//!
//! ```text
//! stage 3, region r of unit u (prefetch p):
//!   gathered(r−p) + first op of r−p done ─► issue(r) ═ all-gather(u's params) ═► gathered(r)
//!   ─► ops of r ─► release(r)
//!   issue(r) allocates the unsharded parameters (bytes of the unit), release(r) frees them
//! ```
//!
//! **Regions** (one gather each): walking the forward and backward compute ops in one
//! topological order, a unit's forward run is a region, and its backward from the first
//! backward op (or recomputed forward: FSDP does not reshard after a forward run inside the
//! backward) to the last is one; every micro-step gathers again (FSDP's pre-forward and
//! pre-backward hooks). With `reshard=0`, and always for the root unit, one region runs from
//! the unit's forward to the end of its backward. So the pass composes with `recompute`
//! applied before or after it; `grad-accumulation` comes after it (a job already accumulated is
//! refused), and copies the gathers — and, reduce-scattering every micro-step (its `sync=auto`),
//! the gradient collectives — into every micro-step. Collectives are issued in the order of
//! what lets each start (positions in that topological order), which keeps the comm stream
//! acyclic with the compute it feeds.

//! **Units** (what FSDP wraps; knob `units`, default `auto`): a layer belongs to the unit named
//! by its path up to the first all-digit component (`bert.encoder.layer.3`, `transformer.h.11`,
//! `layer3.1`): one unit per transformer block or residual block, FSDP2's usual policy. With
//! `units=GLOB` a layer belongs to the shortest prefix of its path (at a `.`: the outermost
//! module) that the glob matches (`units=bert.encoder` wraps the whole encoder once;
//! `units=transformer.h.*` each block; `units=transformer.h.1?` only blocks 10-19); a glob no
//! module path matches is refused. Layers in no unit (embeddings,
//! heads, stem) form the root unit, which keeps its gathered parameters from its forward to the
//! end of its backward (FSDP2 does not reshard the root after the forward).
//!
//! **Cost model.** Reduce-scatter and all-gather are the two halves of a ring all-reduce (n−1
//! chunk steps each, α–β per hop: `src/graph/comm.rs`). All collectives share the rank's comm
//! stream in issue order (FSDP2 puts all-gathers and reduce-scatters on two streams: their
//! overlap with each other is not modelled). Memory: static bytes become the shards; each
//! unit's gathered parameters are allocated when its all-gather is issued and freed at release;
//! with stage ≥ 2 a gradient keeps 1/g of its bytes once its reduce-scatter is done.
//!
//! **Optimizer offload** (`offload=1`; ZeRO-Offload, Ren et al., ATC'21 §4; DeepSpeed's
//! `offload_optimizer: {device: cpu}`): the optimizer state and the FP32 master weights live in
//! host memory and the step runs on the host CPU. Per rank:
//!
//! ```text
//! each gradient's collective done ─► D2H copy of the rank's 1/g shard (copy stream, host link)
//! every D2H done ─► CPU Adam over the rank's Ψ/g parameters ─► H2D copy of the updated shard
//!   ─► (stages 1–2) all-gather of the updated parameters
//! ```
//!
//! The copies run at the GPU's `host_link_gbps` (pinned PCIe copies) on two copy streams of
//! their own (one DMA engine per direction); the CPU step takes Ψ/g × (ranks on the node) /
//! the host's `cpu_adam_gparams_per_s` (the ranks of a node share its CPUs and memory). The
//! GPU's optimizer kernels do not run. GPU memory keeps only the parameters as the model holds
//! them (whole at stages 1–2, 1/g at stage 3); a stage ≥ 2 gradient shard is freed once
//! copied. With `grad-accumulation` after it, every micro-step's shard is copied out as its
//! reduce-scatter ends (DeepSpeed accumulates them in host memory) and the host steps once.
//! Not modelled: DeepSpeed's pinned host buffers, the shard it frees after each micro-step's
//! copy (held here until the last), and the one-step delayed update (off by default). `amp`
//! after an offloaded shard is refused (apply it before).

use std::collections::BTreeMap;

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::cost::config::SyncScheme;
use crate::graph::job::{CollectiveKind, Group, Job, LocalOp, Sync};
use crate::graph::{DeviceKind, MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase};

/// The `shard` pass.
pub struct Shard;

const NAME: &str = "shard";

/// The sharding a patch applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub stage: u32,
    pub replicas: u32,
    pub reshard: bool,
    pub prefetch: u32,
    /// The optimizer state and step on the host CPU (ZeRO-Offload).
    pub offload: bool,
}

impl Pass for Shard {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "sharded data parallelism: ZeRO-1/2/3, FSDP SHARD_GRAD_OP / FULL_SHARD, HSDP (replicas=N)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::int(
                "stage",
                "1: optimizer state sharded; 2: + gradients (reduce-scatter); 3: + parameters (all-gather per unit)",
                3,
                1,
                3,
            ),
            KnobSpec::int(
                "replicas",
                "HSDP: shard inside groups of workers/replicas ranks, all-reduce across the replicas; must divide the workers",
                1,
                1,
                i64::from(u32::MAX),
            ),
            KnobSpec::int(
                "reshard",
                "stage 3: free a unit's gathered parameters after its forward and gather them again for its backward (FSDP reshard_after_forward)",
                1,
                0,
                1,
            ),
            KnobSpec::int(
                "prefetch",
                "stage 3: units whose all-gather may run ahead of the unit computing",
                1,
                0,
                64,
            ),
            KnobSpec::text(
                "units",
                "stage 3 wrap units: auto (one per numbered block) or a glob on module paths (bert.encoder.layer.*)",
                AUTO,
            ),
            KnobSpec::int(
                "offload",
                "optimizer state, FP32 master weights and step on the host CPU (ZeRO-Offload): gradients copied out, updated parameters back, over PCIe",
                0,
                0,
                1,
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let s = Sharding {
            stage: knobs.int("stage") as u32,
            replicas: knobs.int("replicas").max(1) as u32,
            reshard: knobs.int("reshard") == 1,
            prefetch: knobs.int("prefetch").max(0) as u32,
            offload: knobs.int("offload") == 1,
        };
        if let Some(recorded) = cx.job.meta.trace.as_ref().and_then(|f| f.sharding.as_ref()) {
            let r = super::fsdp_trace::Requested {
                stage: s.stage,
                reshard: s.reshard,
                prefetch: s.prefetch,
                replicas: s.replicas,
                offload: s.offload,
                units_auto: knobs.text("units").trim() == AUTO,
            };
            return super::fsdp_trace::propose(cx, recorded, r);
        }
        if cx.job.is_recorded() {
            // A recorded step's collectives are the kernels it ran (DDP's all-reduces), not
            // gradient synchronisations the pass could turn into reduce-scatters and gathers.
            return Err(not_applicable(
                "sharding a recorded step that did not shard (no FSDP2 hooks in the trace) is not modelled: its collectives are the kernels it ran; shard the job's model instead (--model), or trace it under FSDP2".into(),
            ));
        }
        let job = shard_units(&cx.job, s, knobs.text("units").trim())?;
        let g = cx.job.workers / cx.job.meta.tp.max(1) / s.replicas;
        Ok(vec![Patch {
            pass: NAME.into(),
            why: format!(
                "stage {} over shard groups of {g} rank{}{}: optimizer state{} held as 1/{g} shards",
                s.stage,
                if g == 1 { "" } else { "s" },
                if s.replicas > 1 {
                    format!(", {} replicas (HSDP)", s.replicas)
                } else {
                    String::new()
                },
                match s.stage {
                    1 => "",
                    2 => " and gradients",
                    _ => ", gradients and parameters",
                },
            ) + &if s.offload {
                format!(
                    "; optimizer state and step on the host CPU (gradient shards out, updated parameters back at {} GB/s)",
                    cx.job.gpu.host_link_gbps.unwrap_or(0.0)
                )
            } else {
                String::new()
            },
            edits: vec![Edit::ReplaceJob(Box::new(job))],
        }])
    }
}

fn not_applicable(why: String) -> PassError {
    PassError::NotApplicable {
        pass: NAME.into(),
        why,
    }
}

/// The unit a layer belongs to: its numbered block ([`super::unit_of`]), or the root unit.
pub use super::unit_of;

/// The `units` knob's default: one unit per numbered block ([`unit_of`]).
pub const AUTO: &str = "auto";

/// The unit `layer` belongs to under the `units` knob's `pattern`: [`unit_of`] for `auto`, else
/// the shortest prefix of the path (at a `.`: the outermost module) the glob matches, or the
/// root unit (`""`).
pub fn unit_for<'a>(layer: &'a str, pattern: &str) -> &'a str {
    if pattern == AUTO {
        return unit_of(layer);
    }
    let mut end = 0;
    for part in layer.split('.') {
        end += part.len();
        if super::recompute::glob_match(pattern, &layer[..end]) {
            return &layer[..end];
        }
        end += 1;
    }
    ""
}

/// [`shard_units`] with one unit per numbered block.
pub fn shard(job: &Job, s: Sharding) -> Result<Job, PassError> {
    shard_units(job, s, AUTO)
}

/// `job` sharded as `s` says, wrapping the units `pattern` names (the `units` knob): checked,
/// then its static memory, optimizer step, gradient collectives and parameter gathers rebuilt
/// in turn.
pub fn shard_units(job: &Job, s: Sharding, pattern: &str) -> Result<Job, PassError> {
    if job.meta.accumulation > 1 {
        return Err(not_applicable(format!(
            "apply shard before grad-accumulation (this job already runs {} micro-steps): the accumulation then reduce-scatters every micro-step's gradients, or holds them whole with sync=last",
            job.meta.accumulation
        )));
    }
    check_units(job, pattern)?;
    let g = shard_group_size(job, s)?;
    let link_gbps = if s.offload {
        Some(offload_link(job)?)
    } else {
        None
    };
    let mut j = job.clone();
    j.meta.shard_stage = s.stage;
    let virt = virtual_device(&mut j);
    let params: u64 = job.local.tensors.iter().map(|t| t.bytes).sum();
    j.local_mut().static_mem_bytes = if s.offload {
        offloaded_static_bytes(job, s.stage, g, params)
    } else {
        sharded_static_bytes(job, s.stage, g, params)
    };
    // FSDP2 reduce-scatters per unit, whatever buckets the job came with; DeepSpeed's ZeRO-2/3
    // gradient hooks reduce each `reduce_bucket_size` bucket as it fills.
    use crate::cost::framework::Framework;
    let regrouped;
    let job = if s.stage >= 3 && matches!(job.framework, Framework::Pytorch | Framework::Torchtitan)
    {
        regrouped = Job {
            syncs: per_unit_syncs(job, pattern),
            ..job.clone()
        };
        &regrouped
    } else if s.stage >= 2 && job.framework == Framework::Deepspeed {
        regrouped = Job {
            syncs: reduce_buckets(job),
            ..job.clone()
        };
        &regrouped
    } else {
        job
    };
    let mut updates = shard_update_step(&mut j, g, s.offload);
    let shard_group = Group {
        size: g,
        stride: job.meta.tp.max(1),
    };
    let grads = gradient_syncs(&mut j, job, s, g, virt);
    if let Some(gbps) = link_gbps {
        updates = vec![offload_step(&mut j, job, &grads, s.stage, g, params, gbps)];
        j.meta.offload = true;
    }
    j.syncs = if s.stage >= 3 {
        let units = units_of(job, pattern);
        if units.is_empty() {
            return Err(not_applicable(
                "no layer holds parameters: nothing to gather".into(),
            ));
        }
        let pos = topo_positions(job);
        let regions = regions(job, &units, &pos, s.reshard);
        let gathers = gather_regions(&mut j, &units, &regions, s, virt, shard_group, &pos);
        stage3_order(job, &pos, gathers, grads)
    } else {
        let mut syncs = grads;
        let gathered = ((params as f64 * gather_ratio(job)).ceil() as u64).max(1);
        syncs.push(gather_after_update(
            &mut j,
            &updates,
            gathered,
            shard_group,
            virt,
        ));
        syncs
    };
    Ok(j)
}

/// The job's gradient syncs as FSDP2 issues them (`fully_shard` per unit, the pytorch and
/// torchtitan exports): one per wrap unit (`unit_for` of its tensors' layer under `pattern`),
/// holding the unit's tensors in the order the job synchronised them, the units in the order
/// their first tensor came — whatever buckets the job had (a DDP-tuned start point's 100 MiB
/// buckets would otherwise wait for tensors of several blocks, and several blocks' gradients
/// would be reduce-scattered as one). A bucket is cut back into its tensors (its bytes shared
/// by their sizes) only when it lists one ready and one done op per tensor, as fused syncs
/// do; one that does not (a partitioned sync) stays whole, in its first tensor's unit.
fn per_unit_syncs(job: &Job, pattern: &str) -> Vec<Sync> {
    let l = &job.local;
    let unit = |t: u32| -> &str {
        l.tensors
            .get(t as usize)
            .and_then(|t| l.layers.get(t.layer as usize))
            .map_or("", |n| unit_for(n, pattern))
    };
    let mut groups: Vec<(&str, Sync)> = Vec::new();
    for p in tensor_pieces(job) {
        let u = p.tensors.first().map_or("", |&t| unit(t));
        match groups
            .iter_mut()
            .find(|(n, g)| *n == u && g.kind == p.kind && g.group == p.group)
        {
            Some((_, g)) => join(g, &p),
            None => groups.push((u, p)),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// DeepSpeed's `reduce_bucket_size` (its default, 5e8 elements).
pub const DEEPSPEED_REDUCE_BUCKET_ELEMS: u64 = 500_000_000;

/// The job's gradient syncs as DeepSpeed's ZeRO-2/3 gradient hooks issue them: the gradients,
/// in the order the job synchronised them, filled into buckets of `reduce_bucket_size`
/// elements, each reduced once the next gradient would overflow it
/// (`stage_1_and_2.py`'s `reduce_independent_p_g_buckets_and_remove_grads`, `stage3.py`'s
/// `reduce_ready_partitions_and_remove_grads`) — not one pack after the backward, which holds
/// every gradient whole. Bytes per element are the job's storage dtype's (the `amp` pass
/// scales the syncs with the gradients).
fn reduce_buckets(job: &Job) -> Vec<Sync> {
    let cap = DEEPSPEED_REDUCE_BUCKET_ELEMS * job.dtype.bytes();
    let mut out: Vec<Sync> = Vec::new();
    for p in tensor_pieces(job) {
        match out.last_mut() {
            Some(b)
                if b.kind == p.kind
                    && b.group == p.group
                    && b.bytes.saturating_add(p.bytes) <= cap =>
            {
                join(b, &p)
            }
            _ => out.push(p),
        }
    }
    out
}

/// `p` joined to the end of `g`.
fn join(g: &mut Sync, p: &Sync) {
    g.tensors.extend(&p.tensors);
    g.bytes += p.bytes;
    g.ready.extend(&p.ready);
    g.done.extend(&p.done);
    g.partitions = 1;
}

/// The job's syncs cut back into one per tensor (a bucket's bytes shared by its tensors'
/// sizes) where a bucket lists one ready and one done op per tensor, as fused syncs do; one that
/// does not (a partitioned sync) stays whole.
fn tensor_pieces(job: &Job) -> Vec<Sync> {
    let l = &job.local;
    let mut pieces: Vec<Sync> = Vec::with_capacity(job.syncs.len());
    for sy in &job.syncs {
        let n = sy.tensors.len();
        if n < 2 || sy.ready.len() != n || sy.done.len() != n || sy.partitions > 1 {
            pieces.push(sy.clone());
            continue;
        }
        let sizes: Vec<u128> = sy
            .tensors
            .iter()
            .map(|&t| {
                l.tensors
                    .get(t as usize)
                    .map_or(1, |t| u128::from(t.bytes.max(1)))
            })
            .collect();
        let total: u128 = sizes.iter().sum();
        let mut given = 0u64;
        for (i, &size) in sizes.iter().enumerate() {
            let bytes = if i + 1 == n {
                sy.bytes - given
            } else {
                (u128::from(sy.bytes) * size / total) as u64
            };
            given += bytes;
            pieces.push(Sync {
                tensors: vec![sy.tensors[i]],
                bytes,
                ready: vec![sy.ready[i]],
                done: vec![sy.done[i]],
                ..sy.clone()
            });
        }
    }
    pieces
}

/// The shard group's size, or why the job cannot be sharded as asked.
fn shard_group_size(job: &Job, s: Sharding) -> Result<u32, PassError> {
    // With tensor parallelism the data-parallel ranks are `tp` apart: shard over those.
    let n = job.workers / job.meta.tp.max(1);
    if n < 2 {
        return Err(not_applicable(if job.meta.tp > 1 {
            format!(
                "tensor parallelism over all {} workers leaves one data-parallel rank: nothing to shard over",
                job.workers
            )
        } else {
            "one worker has nothing to shard over".into()
        }));
    }
    if s.replicas == 0 || n % s.replicas != 0 {
        return Err(not_applicable(format!(
            "replicas = {} must divide the {n} workers",
            s.replicas
        )));
    }
    let g = n / s.replicas;
    if g < 2 {
        return Err(not_applicable(format!(
            "replicas = {} leaves shard groups of one rank: that is plain data parallelism",
            s.replicas
        )));
    }
    if job.comm.scheme != SyncScheme::Ring {
        return Err(not_applicable(format!(
            "sharded data parallelism runs NCCL ring collectives; this cluster synchronises by {:?}",
            job.comm.scheme
        )));
    }
    if job
        .syncs
        .iter()
        .any(|x| x.kind != CollectiveKind::AllReduce)
    {
        return Err(not_applicable("the job is already sharded".into()));
    }
    if job.syncs.is_empty() {
        return Err(not_applicable(
            "the job has no gradient synchronisation".into(),
        ));
    }
    Ok(g)
}

/// Static bytes per rank: the optimizer state (and the master weights) as 1/g shards; the
/// weights too at stage 3 (ZeRO §5.1). Under mixed precision the weights every rank keeps
/// whole at stages 1–2 are the half-precision copy (2Ψ); the FP32 master weights are
/// optimizer state (ZeRO's 2Ψ + 12Ψ/N).
fn sharded_static_bytes(job: &Job, stage: u32, g: u32, params: u64) -> u64 {
    let whole = ((params as f64 * gather_ratio(job)).ceil() as u64).min(params);
    let states = job.local.static_mem_bytes.saturating_sub(whole);
    let g = u64::from(g);
    if stage >= 3 {
        job.local.static_mem_bytes.div_ceil(g)
    } else {
        whole + states.div_ceil(g)
    }
}

/// The GPU's host-link bandwidth an offloaded optimizer copies at, or why there is none.
fn offload_link(job: &Job) -> Result<f64, PassError> {
    if job.meta.pipeline.is_some() {
        return Err(not_applicable(
            "optimizer offload beside a pipeline is not modelled".into(),
        ));
    }
    job.gpu
        .host_link_gbps
        .filter(|g| *g > 0.0)
        .ok_or_else(|| {
            not_applicable(format!(
                "optimizer offload needs the GPU's host-link bandwidth: the GPU config `{}` gives no host_link_gbps",
                job.gpu.name
            ))
        })
}

/// Static bytes per rank with the optimizer offloaded: only the parameters as the model holds
/// them (the half copy under mixed precision) stay on the GPU, whole at stages 1–2 and as 1/g
/// shards at stage 3; the optimizer state and the FP32 master weights are in host memory.
fn offloaded_static_bytes(job: &Job, stage: u32, g: u32, params: u64) -> u64 {
    let whole = ((params as f64 * gather_ratio(job)).ceil() as u64).min(params);
    if stage >= 3 {
        whole.div_ceil(u64::from(g))
    } else {
        whole
    }
}

/// The offloaded step (ZeRO-Offload): after each gradient's collective, a device-to-host copy
/// of the rank's shard (freeing a stage ≥ 2 shard once copied); after every copy, the host
/// CPU's Adam over the rank's Ψ/g parameters; then a host-to-device copy of the updated
/// parameters. `grads` are [`gradient_syncs`]' collectives, in order. Returns the last copy,
/// which the all-gather of the updated parameters waits for (stages 1–2).
fn offload_step(
    j: &mut Job,
    job: &Job,
    grads: &[Sync],
    stage: u32,
    g: u32,
    params: u64,
    gbps: f64,
) -> OpId {
    let (top, thread) = (j.local.top_stream(), j.local.next_cpu_thread());
    let l = j.local_mut();
    let first = l.devices.len() as u32;
    l.devices.extend([
        DeviceKind::GpuStream {
            worker: 0,
            stream: top + 1,
        },
        DeviceKind::GpuStream {
            worker: 0,
            stream: top + 2,
        },
        DeviceKind::CpuThread { worker: 0, thread },
    ]);
    let (d2h, h2d, cpu) = (first, first + 1, first + 2);
    let copy_ns = |bytes: u64| (bytes as f64 / gbps).round() as u64;
    let gu = u64::from(g);
    // One collective per gradient, or (HSDP) a reduce-scatter then the replicas' all-reduce.
    let per = (grads.len() / job.syncs.len().max(1)).max(1);
    let mut copies = Vec::with_capacity(job.syncs.len());
    for (i, sy) in job.syncs.iter().enumerate() {
        let Some(&end) = grads.get(i * per + per - 1).and_then(|x| x.done.first()) else {
            continue;
        };
        let shard = (sy.bytes / gu).max(1);
        let layer = j.local.ops[end as usize].spec.layer;
        let c = push_op(j, OpKind::Memcpy, Phase::Update, d2h, layer);
        let l = j.local_mut();
        l.ops[c as usize].spec.dur_ns = copy_ns(shard);
        l.edges.push((end, c));
        if stage >= 2 && sy.bytes / gu > 0 {
            free_at_end(j, c, sy.bytes / gu);
        }
        copies.push(c);
    }
    // The parameters: elements from the bytes the tensors hold (FP32 where mixed precision
    // casts them per step, else the job's dtype).
    let stored = if gather_ratio(job) < 1.0 {
        4
    } else {
        job.dtype.bytes()
    };
    let elems = (params / stored.max(1)) as f64 / f64::from(g);
    let sharing = job.comm.gpus_per_node.min(job.workers).max(1);
    let adam = push_op(j, OpKind::CpuOther, Phase::Update, cpu, NONE);
    let back = push_op(j, OpKind::Memcpy, Phase::Update, h2d, NONE);
    let held = ((params as f64 * gather_ratio(job)).ceil() as u64).min(params);
    let adam_ns = job.host.cpu_adam_ns(elems, sharing).round() as u64;
    let l = j.local_mut();
    l.ops[adam as usize].spec.dur_ns = adam_ns;
    l.ops[back as usize].spec.dur_ns = copy_ns(held.div_ceil(gu));
    l.edges.extend(copies.iter().map(|&c| (c, adam)));
    // After the GPU's (now empty) optimizer ops: the step follows the backward's end.
    let gpu_updates: Vec<OpId> = (0..job.local.ops.len() as OpId)
        .filter(|&o| job.local.ops[o as usize].spec.phase == Phase::Update)
        .collect();
    l.edges.extend(gpu_updates.into_iter().map(|u| (u, adam)));
    l.edges.push((adam, back));
    back
}

/// The optimizer step runs on the shard: its GPU kernels take 1/g of their time and work (none
/// when `offload`ed: the step runs on the host). Returns them.
fn shard_update_step(j: &mut Job, g: u32, offload: bool) -> Vec<OpId> {
    let updates = super::optimizer_kernels(&j.local);
    let l = j.local_mut();
    for &u in &updates {
        let op = &mut l.ops[u as usize];
        if offload {
            op.spec.dur_ns = 0;
            op.work = None;
            continue;
        }
        op.spec.dur_ns = op.spec.dur_ns.div_ceil(u64::from(g));
        // Every element the step touches is the shard's.
        op.work = op.work.map(|w| w.times(1.0 / f64::from(g)));
    }
    updates
}

/// The gradient collectives: a reduce-scatter per bucket (then, with HSDP, an all-reduce of the
/// rank's shard across the replicas). From stage 2 each frees all but the rank's 1/g of its
/// gradient once done; at stage 1 the gradients stay whole (Megatron-LM's distributed optimizer
/// reduce-scatters into its whole gradient buffer, DeepSpeed ZeRO-1 reduces each partition to
/// its owner): the rank's optimizer reads its 1/g of them.
fn gradient_syncs(j: &mut Job, job: &Job, s: Sharding, g: u32, virt: u32) -> Vec<Sync> {
    let tp = job.meta.tp.max(1);
    let shard_group = Group {
        size: g,
        stride: tp,
    };
    let replica_group = Group {
        size: s.replicas,
        stride: g * tp,
    };
    let mut out = Vec::with_capacity(job.syncs.len());
    let sharded_grads = s.stage >= 2;
    for sy in &job.syncs {
        let kept = sy.bytes / u64::from(g);
        let scatter = Sync {
            kind: CollectiveKind::ReduceScatter,
            group: shard_group,
            ..sy.clone()
        };
        if s.replicas == 1 {
            if let (true, Some(&d)) = (sharded_grads, sy.done.first()) {
                keep_shard(j, job, sy, d, kept);
            }
            out.push(scatter);
            continue;
        }
        let mid = push_op(j, OpKind::In, Phase::Comm, virt, NONE);
        if sharded_grads {
            keep_shard(j, job, sy, mid, kept);
        }
        out.push(Sync {
            done: vec![mid],
            ..scatter
        });
        out.push(Sync {
            kind: CollectiveKind::AllReduce,
            group: replica_group,
            bytes: kept.max(1),
            ready: vec![mid],
            ..sy.clone()
        });
    }
    out
}

/// Stages 1 and 2: the updated shards are gathered back into whole parameters after the step.
fn gather_after_update(
    j: &mut Job,
    updates: &[OpId],
    params: u64,
    group: Group,
    virt: u32,
) -> Sync {
    let done = push_op(j, OpKind::In, Phase::Update, virt, NONE);
    let ready = push_op(j, OpKind::Out, Phase::Update, virt, NONE);
    j.local_mut()
        .edges
        .extend(updates.iter().map(|&u| (u, ready)));
    Sync {
        tensors: (0..j.local.tensors.len() as u32).collect(),
        bytes: params.max(1),
        partitions: 1,
        kind: CollectiveKind::AllGather,
        group,
        ready: vec![ready],
        done: vec![done],
    }
}

/// A stage-3 job as FSDP2 runs it beside a pipeline (`torch.distributed.pipelining`, which
/// torchtitan drives): the schedule turns off resharding and gradient sync for every
/// micro-batch's backward but the last (`set_reshard_after_backward(False)`,
/// `set_requires_gradient_sync(False)`, then FSDP's post-backward by hand), so with `reshard=0`
/// (no reshard after the forward: torchtitan's default beside a pipeline) each unit is gathered
/// once per step and held through every micro-batch, and its gradients are held whole and
/// reduce-scattered once. Here the per-unit gathers and the memory they held become the whole
/// gathered parameters held for the step (static bytes) and one all-gather after the update —
/// the next step's gathers, priced at the end of this one, where they overlap nothing (FSDP2
/// prefetches them under the first forward: pessimistic by up to one gather of a stage). The
/// reduce-scatters stay per unit, issued as each unit's last backward ends (torch issues them
/// after the stage's whole last backward: optimistic by that overlap). `Err(why not)` for a job
/// that gathers per forward and backward (`reshard=1`), offloads, or has no gathers.
pub fn gathered_once_per_step(job: &Job) -> Result<Job, String> {
    let gathers: Vec<&Sync> = job
        .syncs
        .iter()
        .filter(|s| s.kind == CollectiveKind::AllGather)
        .collect();
    let Some(first) = gathers.first() else {
        return Err("the job gathers no parameters: not sharded at stage 3".into());
    };
    if job.meta.offload {
        return Err("optimizer offload with a pipeline is not modelled".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    if gathers
        .iter()
        .any(|g| !seen.insert(g.tensors.first().copied()))
    {
        return Err(
            "FSDP beside a pipeline keeps each unit gathered from its first forward to its last backward (torchtitan's default reshard policy with a pipeline, as torch.distributed.pipelining runs it); gathering again for every backward (reshard=1) is not modelled: plan shard:stage=3,reshard=0".into(),
        );
    }
    let group = first.group;
    let whole: u64 = gathers.iter().map(|g| g.bytes).sum();
    let issued: std::collections::BTreeSet<OpId> = gathers
        .iter()
        .flat_map(|g| g.ready.iter().copied())
        .collect();
    let got: std::collections::BTreeSet<OpId> = gathers
        .iter()
        .flat_map(|g| g.done.iter().copied())
        .collect();
    let l = &job.local;
    // A region's release: the virtual `Out` op after its `got` that frees the parameters.
    let released: std::collections::BTreeSet<OpId> = l
        .edges
        .iter()
        .filter(|&&(a, c)| {
            got.contains(&a)
                && !issued.contains(&c)
                && l.ops[c as usize].spec.kind == OpKind::Out
                && matches!(
                    l.devices.get(l.ops[c as usize].spec.device as usize),
                    Some(DeviceKind::Virtual)
                )
        })
        .map(|&(_, c)| c)
        .collect();
    let mut j = job.clone();
    let virt = virtual_device(&mut j);
    let lm = j.local_mut();
    lm.mem
        .retain(|m| !(issued.contains(&m.op) || released.contains(&m.op)));
    // Once per stage, not per micro-batch: they hold nothing and gate nothing now.
    for &o in issued.iter().chain(&got).chain(&released) {
        lm.ops[o as usize].spec.phase = Phase::Comm;
    }
    lm.static_mem_bytes = lm.static_mem_bytes.saturating_add(whole);
    let updates = super::optimizer_kernels(&j.local);
    let mut syncs: Vec<Sync> = job
        .syncs
        .iter()
        .filter(|s| s.kind != CollectiveKind::AllGather)
        .cloned()
        .collect();
    syncs.push(gather_after_update(&mut j, &updates, whole, group, virt));
    j.syncs = syncs;
    Ok(j)
}

fn virtual_device(j: &mut Job) -> u32 {
    if let Some(i) = j
        .local
        .devices
        .iter()
        .position(|d| matches!(d, DeviceKind::Virtual))
    {
        return i as u32;
    }
    j.local_mut().devices.push(DeviceKind::Virtual);
    (j.local.devices.len() - 1) as u32
}

fn push_op(j: &mut Job, kind: OpKind, phase: Phase, device: u32, layer: u32) -> OpId {
    j.local_mut().ops.push(LocalOp {
        spec: OpSpec {
            layer,
            ..OpSpec::new(kind, phase, device, 0)
        },
        work: None,
    });
    (j.local.ops.len() - 1) as OpId
}

/// Once `sy`'s reduce-scatter is done (at `done`), the rank keeps a new `kept`-byte shard and
/// frees the whole gradient buffers: each buffer its `ready` op allocated is freed as the block
/// it is (the allocator frees blocks, not parts of them), and the shard is allocated while
/// they are still live, as the collective's output is.
fn keep_shard(j: &mut Job, job: &Job, sy: &Sync, done: OpId, kept: u64) {
    let l = &job.local;
    // The gradient buffers: allocated by the sync's ready ops or by its tensors' `Out` ops.
    let holds = |op: OpId| {
        let sp = &l.ops[op as usize].spec;
        sy.ready.contains(&op) || (sp.kind == OpKind::Out && sy.tensors.contains(&sp.tensor))
    };
    let buffers: Vec<u64> = l
        .mem
        .iter()
        .filter(|m| m.when == MemWhen::AllocAtStart && holds(m.op))
        .map(|m| m.bytes)
        .collect();
    if buffers.is_empty() {
        // No buffer to match (a trace's gradients): the bytes the shard does not keep.
        free_at_end(j, done, sy.bytes.saturating_sub(kept));
        return;
    }
    if kept > 0 {
        j.local_mut().mem.push(MemEffect {
            op: done,
            worker: 0,
            bytes: kept,
            when: MemWhen::AllocAtStart,
        });
    }
    for b in buffers {
        free_at_end(j, done, b);
    }
}

fn free_at_end(j: &mut Job, op: OpId, bytes: u64) {
    if bytes > 0 {
        j.local_mut().mem.push(MemEffect {
            op,
            worker: 0,
            bytes,
            when: MemWhen::FreeAtEnd,
        });
    }
}

/// One wrap unit: its name, layers, parameter bytes and tensors, in forward order.
#[derive(Clone, Debug)]
pub struct Unit {
    pub name: String,
    pub layers: Vec<u32>,
    pub bytes: u64,
    pub tensors: Vec<u32>,
}

/// A `units` pattern that names no module is an error, naming an example path.
fn check_units(job: &Job, pattern: &str) -> Result<(), PassError> {
    let bad = |why: String| PassError::BadKnob {
        pass: NAME.into(),
        knob: "units".into(),
        value: pattern.to_string(),
        why,
    };
    if pattern.is_empty() {
        return Err(bad("give `auto` or a glob on module paths".into()));
    }
    let layers = &job.local.layers;
    if pattern != AUTO && !layers.iter().any(|n| !unit_for(n, pattern).is_empty()) {
        let example = layers
            .iter()
            .map(|n| unit_of(n))
            .find(|u| !u.is_empty())
            .or(layers.first().map(String::as_str))
            .unwrap_or("");
        return Err(bad(format!(
            "no module path of the model matches it (its blocks are named like `{example}`)"
        )));
    }
    Ok(())
}

/// The job's wrap units that hold parameters (one per numbered block), in the order their
/// forward first runs.
pub fn units(job: &Job) -> Vec<Unit> {
    units_of(job, AUTO)
}

/// [`units`] under the `units` knob's `pattern` ([`unit_for`]).
pub fn units_of(job: &Job, pattern: &str) -> Vec<Unit> {
    let l = &job.local;
    let mut by: BTreeMap<&str, Unit> = BTreeMap::new();
    for (ti, t) in l.tensors.iter().enumerate() {
        let Some(name) = l.layers.get(t.layer as usize) else {
            continue;
        };
        let u = by.entry(unit_for(name, pattern)).or_insert_with(|| Unit {
            name: unit_for(name, pattern).to_string(),
            layers: Vec::new(),
            bytes: 0,
            tensors: Vec::new(),
        });
        u.bytes += t.bytes;
        u.tensors.push(ti as u32);
    }
    for (li, name) in l.layers.iter().enumerate() {
        if let Some(u) = by.get_mut(unit_for(name, pattern)) {
            u.layers.push(li as u32);
        }
    }
    // Forward order: the first FW compute op of each unit.
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    for (i, o) in l.ops.iter().enumerate() {
        if o.spec.phase == Phase::Fw
            && o.spec.kind == OpKind::Compute
            && let Some(name) = l.layers.get(o.spec.layer as usize)
        {
            first
                .entry(unit_for(name, pattern).to_string())
                .or_insert(i);
        }
    }
    let mut v: Vec<Unit> = by.into_values().collect();
    v.sort_by_key(|u| first.get(&u.name).copied().unwrap_or(usize::MAX));
    v
}

/// One gather of a unit's parameters: the unit, and the compute ops that use them, in
/// topological order. The unit is gathered before the first and released after the last.
struct Region {
    unit: usize,
    ops: Vec<OpId>,
    /// Its parameters stay gathered from its forward to the end of its backward (the root
    /// unit, or any unit with `reshard=0`).
    held: bool,
}

/// `job` with its gradient reductions run on the compute stream, as DeepSpeed's ZeRO-1/2 run
/// them with `overlap_comm` off (its default below stage 3: `stage_1_and_2.py` reduces each
/// bucket on `current_stream()` unless `overlap_comm`, then on its `reduction_stream`): every
/// compute-stream op issued after a reduction's last ready op waits for the reduction, so the
/// backward stops while each bucket is reduced. Issue order is [`topo_positions`], a
/// topological order, so no op that waits is one the reduction waits for.
pub fn reductions_on_compute_stream(mut job: Job) -> Job {
    let pos = topo_positions(&job);
    let on_compute = |o: &LocalOp| {
        o.spec.kind == OpKind::Compute
            && matches!(
                job.local.devices.get(o.spec.device as usize),
                Some(DeviceKind::GpuStream { stream: 0, .. })
            )
    };
    // Compute-stream ops in issue order.
    let mut issued: Vec<OpId> = (0..job.local.ops.len() as OpId)
        .filter(|&o| on_compute(&job.local.ops[o as usize]))
        .collect();
    issued.sort_unstable_by_key(|&o| pos[o as usize]);
    for s in job.syncs.iter_mut() {
        if s.kind == CollectiveKind::AllGather {
            continue;
        }
        let Some(last) = s.ready.iter().map(|&r| pos[r as usize]).max() else {
            continue;
        };
        let from = issued.partition_point(|&o| pos[o as usize] <= last);
        let mut done: std::collections::BTreeSet<OpId> = s.done.iter().copied().collect();
        done.extend(&issued[from..]);
        s.done = done.into_iter().collect();
    }
    job
}

/// Every op's position in the order the ops would start with unbounded resources: by earliest
/// start (the longest duration-weighted path from a source), ties by a topological order with
/// the smaller id first. A gradient's ready op then sits right after its layer's backward
/// (where a plain topological order would defer it behind every smaller id), so issuing
/// collectives in this order follows the step.
fn topo_positions(job: &Job) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = job.local.ops.len();
    let succs = job.local_succs();
    let mut indeg = vec![0usize; n];
    for s in &succs {
        for &t in s {
            indeg[t as usize] += 1;
        }
    }
    let mut ready: BinaryHeap<Reverse<OpId>> = (0..n as OpId)
        .filter(|&o| indeg[o as usize] == 0)
        .map(Reverse)
        .collect();
    let mut est = vec![0u64; n];
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(o)) = ready.pop() {
        order.push(o);
        let end = est[o as usize] + job.local.ops[o as usize].spec.dur_ns;
        for &t in &succs[o as usize] {
            est[t as usize] = est[t as usize].max(end);
            indeg[t as usize] -= 1;
            if indeg[t as usize] == 0 {
                ready.push(Reverse(t));
            }
        }
    }
    let mut keyed: Vec<(u64, usize, OpId)> = order
        .iter()
        .enumerate()
        .map(|(i, &o)| (est[o as usize], i, o))
        .collect();
    keyed.sort_unstable();
    let mut pos = vec![usize::MAX; n];
    for (p, &(_, _, o)) in keyed.iter().enumerate() {
        pos[o as usize] = p;
    }
    pos
}

/// The gathers stage 3 needs, in execution order. Walking the forward and backward compute
/// ops in topological order, a region is a run of ops of one unit: a forward, a backward, a
/// recomputed forward with the backward that follows it, and each micro-step's again (FSDP
/// gathers on every forward and backward pre-hook). A held unit's region runs from a forward
/// to the end of the backward after it.
fn regions(job: &Job, units: &[Unit], pos: &[usize], reshard: bool) -> Vec<Region> {
    let l = &job.local;
    let unit_of_layer: BTreeMap<u32, usize> = units
        .iter()
        .enumerate()
        .flat_map(|(i, u)| u.layers.iter().map(move |&layer| (layer, i)))
        .collect();
    let mut ops: Vec<(usize, OpId, usize)> = l
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.spec.kind == OpKind::Compute && matches!(o.spec.phase, Phase::Fw | Phase::Bw)
        })
        .filter_map(|(i, o)| Some((pos[i], i as OpId, *unit_of_layer.get(&o.spec.layer)?)))
        .collect();
    ops.sort_unstable();
    let mut out: Vec<Region> = Vec::new();
    // Regions open until a fresh forward of their unit after their backward: a held unit's
    // (from its forward), and every unit's backward (from its first backward op or recomputed
    // forward: FSDP reshards a unit after its whole backward, and not after a forward run
    // inside the backward); each with whether it has reached a backward op.
    let mut open: BTreeMap<usize, (usize, bool)> = BTreeMap::new();
    // Per layer: whether its last op was a forward, the backward ops seen by then, and
    // whether it was a recomputation.
    let mut last: BTreeMap<u32, (bool, usize, bool)> = BTreeMap::new();
    let mut bw_seen = 0;
    // The forward run of the op before (a run ends where another unit's op comes).
    let mut run: Option<usize> = None;
    for (_, op, u) in ops {
        let held = !reshard || units[u].name.is_empty();
        let spec = &l.ops[op as usize].spec;
        let bw = spec.phase == Phase::Bw;
        // A layer's forward after its own forward with a backward between (or after its
        // recomputed forward op: a layer may have several): a recomputation.
        let rerun = !bw
            && last
                .get(&spec.layer)
                .is_some_and(|&(fw, seen, was)| fw && (seen < bw_seen || was));
        last.insert(spec.layer, (!bw, bw_seen, rerun));
        bw_seen += usize::from(bw);
        let fresh = !bw && !rerun;
        if let Some(&(r, seen_bw)) = open.get(&u) {
            if !(fresh && seen_bw) {
                open.insert(u, (r, seen_bw || bw));
                out[r].ops.push(op);
                run = None;
                continue;
            }
            open.remove(&u);
        }
        if held || !fresh {
            open.insert(u, (out.len(), bw));
            run = None;
        } else if let Some(r) = run.filter(|&r| out[r].unit == u) {
            out[r].ops.push(op);
            continue;
        } else {
            run = Some(out.len());
        }
        out.push(Region {
            unit: u,
            ops: vec![op],
            held,
        });
    }
    out
}

/// The bytes a unit's all-gather moves per byte of its gradient tensors: the compute dtype's
/// share when mixed precision keeps FP32 parameters and casts them per step (AMP's weight-cast
/// ops carry their tensor), else 1 (the parameters are stored in the dtype they compute in).
fn gather_ratio(job: &Job) -> f64 {
    let casts = job.local.ops.iter().any(|o| {
        o.spec.kind == OpKind::Compute && o.spec.phase == Phase::Fw && o.spec.tensor != NONE
    });
    if casts && job.dtype.bytes() < 4 {
        job.dtype.bytes() as f64 / 4.0
    } else {
        1.0
    }
}

/// Stage 3's per-region all-gathers, each with the virtual ops that hold its memory
/// (allocated when the gather is issued, freed once the region's last op is done); a region
/// is gathered once the one `prefetch` before it is computing (without prefetch: once the one
/// before released its parameters). Each gather comes with its place in the comm stream's
/// issue order (the position of the op whose end lets it start).
fn gather_regions(
    j: &mut Job,
    units: &[Unit],
    regions: &[Region],
    s: Sharding,
    virt: u32,
    group: Group,
    pos: &[usize],
) -> Vec<(usize, Sync)> {
    let p = s.prefetch as usize;
    let ratio = gather_ratio(j);
    let (mut got_of, mut rel_of) = (Vec::new(), Vec::new());
    let mut out = Vec::with_capacity(regions.len());
    for (i, r) in regions.iter().enumerate() {
        let u = &units[r.unit];
        let bytes = ((u.bytes as f64 * ratio).ceil() as u64).max(1);
        let layer = u.layers.first().copied().unwrap_or(NONE);
        let phase = j.local.ops[r.ops[0] as usize].spec.phase;
        let issue = push_op(j, OpKind::Out, phase, virt, layer);
        let got = push_op(j, OpKind::In, phase, virt, layer);
        let rel = push_op(j, OpKind::Out, phase, virt, layer);
        // What lets the gather start: the region `p` before it has its parameters and has
        // begun computing (its first op is done); without prefetch, the one before released
        // its parameters (a held one: has begun computing).
        let key = if p == 0 {
            if i > 0 {
                let prev = if regions[i - 1].held {
                    regions[i - 1].ops[0]
                } else {
                    rel_of[i - 1]
                };
                j.local_mut().edges.push((prev, issue));
            }
            pos[r.ops[0] as usize]
        } else if i >= p {
            let first = regions[i - p].ops[0];
            j.local_mut()
                .edges
                .extend([(got_of[i - p], issue), (first, issue)]);
            pos[regions[i - p].ops[0] as usize]
        } else {
            0
        };
        let l = j.local_mut();
        for &o in &r.ops {
            l.edges.push((got, o));
            l.edges.push((o, rel));
        }
        l.edges.push((got, rel));
        l.mem.push(MemEffect {
            op: issue,
            worker: 0,
            bytes,
            when: MemWhen::AllocAtStart,
        });
        free_at_end(j, rel, bytes);
        got_of.push(got);
        rel_of.push(rel);
        out.push((
            key,
            Sync {
                tensors: u.tensors.clone(),
                bytes,
                partitions: 1,
                kind: CollectiveKind::AllGather,
                group,
                ready: vec![issue],
                done: vec![got],
            },
        ));
    }
    out
}

/// Stage 3's collectives in issue order: gathers and gradient collectives merged by the
/// position of what lets each start (a gradient collective: its ready op in the unsharded
/// job), gathers first among equals. Sorting by positions of one topological order keeps the
/// comm stream acyclic with the compute it feeds.
fn stage3_order(
    job: &Job,
    pos: &[usize],
    gathers: Vec<(usize, Sync)>,
    grads: Vec<Sync>,
) -> Vec<Sync> {
    let ready_pos: BTreeMap<OpId, usize> = job
        .syncs
        .iter()
        .flat_map(|s| s.ready.iter().map(|&r| (r, pos[r as usize])))
        .collect();
    let mut keyed: Vec<(usize, u8, usize, Sync)> = gathers
        .into_iter()
        .enumerate()
        .map(|(i, (k, s))| (k, 0, i, s))
        .collect();
    let mut last = 0;
    for (i, g) in grads.into_iter().enumerate() {
        // An HSDP replica all-reduce follows its reduce-scatter (its ready op is new).
        if let Some(&k) = g.ready.iter().filter_map(|r| ready_pos.get(r)).max() {
            last = k;
        }
        keyed.push((last, 1, i, g));
    }
    keyed.sort_by_key(|(k, c, i, _)| (*k, *c, *i));
    keyed.into_iter().map(|(_, _, _, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::host::CPU_ADAM_GPARAMS_PER_S as CPU_ADAM;
    use crate::passes::testkit::try_pass;
    use crate::zoo::build::test_job;

    /// `job` with the model in fp16 and FP32 master weights (DeepSpeed's, ZeRO's setting).
    fn in_half(job: &Job) -> Job {
        crate::passes::amp::with_precision(
            job,
            Some(crate::cost::framework::Precision::Fp16),
            Some(crate::cost::framework::AmpStyle::Pure),
            None,
        )
        .unwrap()
    }

    fn sharding(stage: u32) -> Sharding {
        Sharding {
            stage,
            replicas: 1,
            reshard: true,
            prefetch: 1,
            offload: false,
        }
    }

    /// ZeRO's accounting (Rajbhandari et al. §5.1): with Ψ parameters, FP32 Adam keeps 4Ψ
    /// bytes of weights and 8Ψ of state; stage 1 shards the state, stage 3 the weights too;
    /// stages 2 and 3 keep 1/N of each 4Ψ gradient once it is reduce-scattered.
    #[test]
    fn static_memory_follows_zero_arithmetic_for_each_stage() {
        let (m, job) = test_job("bert-base", 8, "8xv100");
        let n = u64::from(job.workers);
        let psi = m.param_elems();
        assert_eq!(
            job.local.static_mem_bytes,
            4 * psi + 8 * psi,
            "DDP: weights + Adam state"
        );
        let weights: u64 = job.local.tensors.iter().map(|t| t.bytes).sum();
        assert_eq!(weights, 4 * psi);
        let s1 = shard(&job, sharding(1)).expect("stage 1");
        assert_eq!(s1.local.static_mem_bytes, 4 * psi + (8 * psi).div_ceil(n));
        let s2 = shard(&job, sharding(2)).expect("stage 2");
        assert_eq!(s2.local.static_mem_bytes, s1.local.static_mem_bytes);
        let s3 = shard(&job, sharding(3)).expect("stage 3");
        assert_eq!(
            s3.local.static_mem_bytes,
            (4 * psi).div_ceil(n) + (8 * psi).div_ceil(n)
        );
        // Gradients: when its reduce-scatter is done, each gradient buffer is freed whole (as
        // the block its `Out` allocated: the allocator model matches frees to blocks) and the
        // rank's 1/N shard is allocated; net, all but 1/N is freed.
        for (st, j) in [(1, &s1), (2, &s2), (3, &s3)] {
            let at_done = |when: MemWhen| -> u64 {
                j.local
                    .mem
                    .iter()
                    .filter(|e| {
                        e.when == when
                            && j.syncs.iter().any(|s| {
                                s.kind == CollectiveKind::ReduceScatter && s.done.contains(&e.op)
                            })
                    })
                    .map(|e| e.bytes)
                    .sum()
            };
            let (freed, shards) = (at_done(MemWhen::FreeAtEnd), at_done(MemWhen::AllocAtStart));
            let grads: u64 = job.syncs.iter().map(|s| s.bytes).sum();
            let kept: u64 = job.syncs.iter().map(|s| s.bytes / n).sum();
            let want = if st == 1 { 0 } else { grads - kept };
            assert_eq!(freed - shards, want, "stage {st}");
            if st > 1 {
                assert_eq!(shards, kept, "stage {st}");
                // Every freed size is a block some op allocated.
                for e in j.local.mem.iter().filter(|e| e.when == MemWhen::FreeAtEnd) {
                    assert!(
                        j.local
                            .mem
                            .iter()
                            .any(|a| a.when == MemWhen::AllocAtStart && a.bytes == e.bytes),
                        "stage {st}: a free of {} B matches no allocation",
                        e.bytes
                    );
                }
            }
        }
    }

    /// ZeRO's own setting (Rajbhandari et al. §5, mixed-precision Adam: K = 12): the model in
    /// fp16 with FP32 master weights. Static: 2Ψ half weights + 12Ψ of master weights and
    /// Adam state, sharded with the stage; the half gradients (2Ψ) are reduce-scattered in
    /// half. Stage 1–2: 2Ψ + 12Ψ/N; stage 3: 14Ψ/N.
    #[test]
    fn a_model_in_half_shards_as_zero_counts() {
        let (m, job) = test_job("bert-base", 8, "8xv100");
        let (n, psi) = (u64::from(job.workers), m.param_elems());
        let half = in_half(&job);
        assert_eq!(half.local.static_mem_bytes, 2 * psi + 12 * psi);
        let grads: u64 = half.syncs.iter().map(|s| s.bytes).sum();
        assert!(grads * 2 >= 4 * psi && grads * 2 <= 4 * psi + 2 * half.syncs.len() as u64);
        let s2 = shard(&half, sharding(2)).expect("stage 2");
        let s3 = shard(&half, sharding(3)).expect("stage 3");
        assert_eq!(s2.local.static_mem_bytes, 2 * psi + (12 * psi).div_ceil(n));
        assert_eq!(s3.local.static_mem_bytes, (14 * psi).div_ceil(n));
        // Each reduce-scatter moves the half gradients, each all-gather the half weights: half
        // of what the FP32 job's collectives move.
        let moved = |j: &Job, kind: CollectiveKind| -> (u64, u64) {
            let v: Vec<u64> = j
                .syncs
                .iter()
                .filter(|s| s.kind == kind)
                .map(|s| s.bytes)
                .collect();
            (v.iter().sum(), v.len() as u64)
        };
        let f2 = shard(&job, sharding(2)).expect("fp32 stage 2");
        let f3 = shard(&job, sharding(3)).expect("fp32 stage 3");
        for (h, f, kind) in [
            (&s2, &f2, CollectiveKind::ReduceScatter),
            (&s3, &f3, CollectiveKind::ReduceScatter),
            (&s3, &f3, CollectiveKind::AllGather),
        ] {
            let ((hb, hn), (fb, fn_)) = (moved(h, kind), moved(f, kind));
            assert_eq!(hn, fn_, "{kind:?}");
            assert!(
                hn > 0 && hb * 2 <= fb + hn && hb * 2 + hn >= fb,
                "{kind:?}: {hb} vs {fb}"
            );
        }
    }

    #[test]
    fn a_units_glob_picks_the_outermost_matching_module() {
        let l = "bert.encoder.layer.3.attention.self.query";
        assert_eq!(unit_for(l, AUTO), "bert.encoder.layer.3");
        assert_eq!(unit_for(l, "bert.encoder.layer.*"), "bert.encoder.layer.3");
        assert_eq!(unit_for(l, "bert.encoder"), "bert.encoder");
        assert_eq!(unit_for(l, "*.attention"), "bert.encoder.layer.3.attention");
        assert_eq!(unit_for(l, "bert.encoder.layer.1?"), "");
        assert_eq!(
            unit_for("bert.embeddings.word_embeddings", "bert.encoder"),
            ""
        );
    }

    #[test]
    fn collectives_follow_the_stage() {
        let (_, job) = test_job("gpt", 2, "8xv100");
        let kinds = |j: &Job| -> Vec<CollectiveKind> { j.syncs.iter().map(|s| s.kind).collect() };
        // Stage 1 as Megatron-LM's distributed optimizer and DeepSpeed ZeRO-1 run it: gradients
        // reduce-scattered (ZeRO §7.2.1: the same volume as DDP's all-reduce with the gather),
        // not all-reduced; the updated parameters all-gathered.
        let k1 = kinds(&shard(&job, sharding(1)).unwrap());
        assert_eq!(k1.last(), Some(&CollectiveKind::AllGather));
        assert!(!k1.contains(&CollectiveKind::AllReduce));
        assert_eq!(
            k1.iter()
                .filter(|&&k| k == CollectiveKind::ReduceScatter)
                .count(),
            job.syncs.len()
        );
        let k2 = kinds(&shard(&job, sharding(2)).unwrap());
        assert_eq!(
            k2.iter()
                .filter(|&&k| k == CollectiveKind::ReduceScatter)
                .count(),
            job.syncs.len()
        );
        let s3 = shard(&job, sharding(3)).unwrap();
        let units = units(&job);
        // A forward all-gather per unit, a backward one per unit but the root.
        let gathers = kinds(&s3)
            .iter()
            .filter(|&&k| k == CollectiveKind::AllGather)
            .count();
        assert_eq!(gathers, 2 * units.len() - 1);
        assert_eq!(units[0].name, "", "the root unit (embeddings) runs first");
        assert_eq!(units[1].name, "transformer.h.0");
        // Replayed in the symmetric form and in full, the sharded job predicts the same step
        // and the same peak, and the peak is below DDP's.
        use crate::replay::{peak_memory, replay};
        let sym = s3.expand().expect("the sharded job expands");
        let full_job = Job {
            symmetric: false,
            ..s3.clone()
        };
        let full = full_job.expand().expect("full form");
        let (rs, rf) = (replay(&sym), replay(&full));
        assert_eq!(rs.iteration_ns, rf.iteration_ns);
        let (ps, pf) = (peak_memory(&sym, &rs), peak_memory(&full, &rf));
        assert_eq!(ps.peak_bytes, pf.peak_bytes);
        let ddp = job.expand().unwrap();
        assert!(ps.peak_bytes < peak_memory(&ddp, &replay(&ddp)).peak_bytes);
        // HSDP: reduce-scatter in groups of 4, all-reduce of the shard across 2 replicas.
        let h = shard(
            &job,
            Sharding {
                replicas: 2,
                ..sharding(2)
            },
        )
        .unwrap();
        let ar: Vec<&Sync> = h
            .syncs
            .iter()
            .filter(|s| s.kind == CollectiveKind::AllReduce)
            .collect();
        assert_eq!(ar.len(), job.syncs.len());
        assert!(ar.iter().all(|s| s.group == Group { size: 2, stride: 4 }));
        assert_eq!(ar[0].bytes, job.syncs[0].bytes / 4);
    }

    /// FSDP2 (the pytorch and torchtitan exports) reduce-scatters once per wrap unit whatever
    /// buckets the job came with; DeepSpeed's ZeRO-2/3 fill its reduce buckets. Bytes are
    /// conserved and every tensor is reduce-scattered once.
    /// DeepSpeed's ZeRO-2 default (`overlap_comm` off) reduces on the compute stream: the
    /// backward stops for every bucket, so nearly all the reduction time is exposed where the
    /// overlapped form hides part of it behind the backward; the reductions themselves and the
    /// memory are unchanged.
    #[test]
    fn reductions_on_the_compute_stream_stop_the_backward() {
        use crate::cost::framework::Framework;
        use crate::replay::breakdown::summary;
        let (_, mut job) = test_job("gpt", 8, "8xv100");
        job.framework = Framework::Deepspeed;
        // Gradients 20× larger (about 10 GB), so that 2 GB buckets of FP32 gradients fill
        // several times during the backward.
        for s in &mut job.syncs {
            s.bytes *= 20;
        }
        let beside = shard(&job, sharding(2)).unwrap();
        assert!(beside.syncs.len() >= 3, "{}", beside.syncs.len());
        let on_stream = reductions_on_compute_stream(beside.clone());
        assert_eq!(on_stream.syncs.len(), beside.syncs.len());
        for (a, b) in on_stream.syncs.iter().zip(&beside.syncs) {
            assert_eq!((a.bytes, a.kind, &a.ready), (b.bytes, b.kind, &b.ready));
            assert!(b.done.iter().all(|d| a.done.contains(d)));
        }
        let (eb, es) = (
            super::super::evaluate(beside).unwrap(),
            super::super::evaluate(on_stream).unwrap(),
        );
        let sum = |e: &Evaluated| summary(&e.graph, &e.replay, &e.critical);
        let (sb, ss) = (sum(&eb), sum(&es));
        assert_eq!(sb.breakdown.comm_ns, ss.breakdown.comm_ns);
        assert!(
            ss.exposed_comm_ns > sb.exposed_comm_ns,
            "{} vs {}",
            ss.exposed_comm_ns,
            sb.exposed_comm_ns
        );
        assert!(
            ss.exposed_comm_ns as f64 >= 0.9 * ss.breakdown.comm_ns as f64,
            "{ss:?}"
        );
        assert!(es.iteration_ns() > eb.iteration_ns());
        assert_eq!(es.memory.peak_bytes, eb.memory.peak_bytes);
    }

    #[test]
    fn fsdp2_reduce_scatters_per_unit_whatever_the_buckets() {
        use crate::cost::framework::Framework;
        let (_, per_tensor) = test_job("gpt", 2, "8xv100");
        // Two buckets that cut across blocks: the first half of the tensors, then the rest.
        let n = per_tensor.syncs.len();
        let mut bucketed = per_tensor.clone();
        super::super::fuse_syncs(&mut bucketed, &(n / 2..n).collect::<Vec<_>>()).unwrap();
        super::super::fuse_syncs(&mut bucketed, &(0..n / 2).collect::<Vec<_>>()).unwrap();
        assert_eq!(bucketed.syncs.len(), 2);
        let scatters = |j: &Job| -> Vec<Sync> {
            j.syncs
                .iter()
                .filter(|s| s.kind == CollectiveKind::ReduceScatter)
                .cloned()
                .collect()
        };
        let l = &per_tensor.local;
        let unit_of_tensor = |t: u32| unit_of(&l.layers[l.tensors[t as usize].layer as usize]);
        for fw in [Framework::Pytorch, Framework::Torchtitan] {
            for job in [&per_tensor, &bucketed] {
                let j = Job {
                    framework: fw,
                    ..job.clone()
                };
                let rs = scatters(&shard(&j, sharding(3)).unwrap());
                assert_eq!(rs.len(), units(&j).len(), "{fw:?}");
                for s in &rs {
                    let u = unit_of_tensor(s.tensors[0]);
                    assert!(s.tensors.iter().all(|&t| unit_of_tensor(t) == u));
                    assert_eq!(s.ready.len(), s.tensors.len());
                }
                let mut all: Vec<u32> = rs.iter().flat_map(|s| s.tensors.clone()).collect();
                all.sort_unstable();
                assert_eq!(all, (0..l.tensors.len() as u32).collect::<Vec<_>>());
                let bytes: u64 = rs.iter().map(|s| s.bytes).sum();
                assert_eq!(bytes, job.syncs.iter().map(|s| s.bytes).sum::<u64>());
            }
        }
        // DeepSpeed: ZeRO-1 keeps the job's buckets; ZeRO-2/3 fill buckets of
        // `reduce_bucket_size` elements in the order the job synchronised its gradients (here
        // the gradients made 20× larger, 10 GB in all, so that the 2 GB buckets of FP32
        // gradients matter).
        let mut big = bucketed.clone();
        big.framework = Framework::Deepspeed;
        for s in &mut big.syncs {
            s.bytes *= 20;
        }
        let total: u64 = big.syncs.iter().map(|s| s.bytes).sum();
        assert_eq!(
            shard(&big, sharding(1))
                .unwrap()
                .syncs
                .iter()
                .filter(|s| s.kind == CollectiveKind::ReduceScatter)
                .count(),
            2
        );
        let cap = DEEPSPEED_REDUCE_BUCKET_ELEMS * 4;
        let order: Vec<u32> = big.syncs.iter().flat_map(|s| s.tensors.clone()).collect();
        for stage in [2, 3] {
            let rs = scatters(&shard(&big, sharding(stage)).unwrap());
            // No bucket over the cap but a lone gradient larger than it (the word
            // embeddings' here), and never more buckets than the fill needs.
            assert!(rs.len() as u64 >= total.div_ceil(cap), "stage {stage}");
            assert!(
                rs.len() < order.len() / 4,
                "stage {stage}: {} buckets",
                rs.len()
            );
            assert!(
                rs.iter().all(|s| s.bytes <= cap || s.tensors.len() == 1),
                "stage {stage}"
            );
            let seen: Vec<u32> = rs.iter().flat_map(|s| s.tensors.clone()).collect();
            assert_eq!(seen, order, "stage {stage}: every gradient once, in order");
            assert_eq!(rs.iter().map(|s| s.bytes).sum::<u64>(), total);
            assert!(rs.iter().all(|s| s.ready.len() == s.tensors.len()));
        }
    }

    /// Stage 3 with accumulation (shard first; the other order is refused) or recomputation
    /// (either order): every micro-step's forward and backward gathers again, a recomputed
    /// forward runs inside its unit's backward gather, and the graph stays acyclic.
    #[test]
    fn stage_3_composes_with_accumulation_and_recomputation() {
        use crate::passes::evaluate;
        let (_, job) = test_job("gpt", 4, "8xv100");
        let apply = |j: &Job, name: &str, knobs: &[(&str, &str)]| -> Job {
            try_pass(j, name, knobs).expect("applies")
        };
        let gathers = |j: &Job| {
            j.syncs
                .iter()
                .filter(|s| s.kind == CollectiveKind::AllGather)
                .count()
        };
        let units = units(&job).len();
        let plain = shard(&job, sharding(3)).unwrap();
        assert_eq!(gathers(&plain), 2 * units - 1);
        let acc = apply(&job, "grad-accumulation", &[("k", "2")]);
        let refused = shard(&acc, sharding(3)).unwrap_err().to_string();
        assert!(
            refused.contains("apply shard before grad-accumulation"),
            "{refused}"
        );
        let acc3 = apply(&plain, "grad-accumulation", &[("k", "2")]);
        assert_eq!(
            gathers(&acc3),
            2 * (2 * units - 1),
            "one set per micro-step"
        );
        acc3.expand().expect("acyclic");
        let re = apply(&job, "recompute", &[]);
        let re3 = shard(&re, sharding(3)).expect("recomputation, then stage 3");
        // A recomputed block re-runs inside its backward gather: no extra gather.
        assert_eq!(gathers(&re3), 2 * units - 1);
        // Under AMP a layer's forward is several ops (casts, then the kernel): still one
        // gather per unit and direction.
        let amp_re = apply(&apply(&job, "amp", &[]), "recompute", &[]);
        let amp_re3 = shard(&amp_re, sharding(3)).expect("amp, recomputation, stage 3");
        assert_eq!(gathers(&amp_re3), 2 * units - 1);
        let replayed = evaluate(re3).expect("acyclic, replays");
        assert!(replayed.iteration_ns() > 0);
        for j in [&plain, &acc3] {
            evaluate(j.clone()).expect("replays");
        }
    }

    /// ZeRO-Offload (Ren et al. §4): the GPU keeps only the parameters as the model holds them
    /// (4Ψ in FP32, the 2Ψ half copy under mixed precision; 1/N of them at stage 3); the
    /// optimizer state and master weights leave it.
    #[test]
    fn offload_keeps_only_the_model_parameters_on_the_gpu() {
        let (m, job) = test_job("bert-base", 8, "8xv100");
        let (n, psi) = (u64::from(job.workers), m.param_elems());
        let off = |j: &Job, stage| {
            shard(
                j,
                Sharding {
                    offload: true,
                    ..sharding(stage)
                },
            )
            .expect("offloads")
        };
        assert_eq!(off(&job, 2).local.static_mem_bytes, 4 * psi);
        assert_eq!(off(&job, 3).local.static_mem_bytes, (4 * psi).div_ceil(n));
        let half = in_half(&job);
        assert_eq!(off(&half, 1).local.static_mem_bytes, 2 * psi);
        assert_eq!(off(&half, 2).local.static_mem_bytes, 2 * psi);
        assert_eq!(off(&half, 3).local.static_mem_bytes, (2 * psi).div_ceil(n));
        // A stage-2 gradient shard leaves the GPU once copied out: every byte reduce-scatter
        // allocated is freed by a copy.
        let s2 = off(&half, 2);
        let kept: u64 = half.syncs.iter().map(|s| s.bytes / n).sum();
        let freed_by_copies: u64 = s2
            .local
            .mem
            .iter()
            .filter(|e| {
                e.when == MemWhen::FreeAtEnd
                    && s2.local.ops[e.op as usize].spec.kind == OpKind::Memcpy
            })
            .map(|e| e.bytes)
            .sum();
        assert_eq!(freed_by_copies, kept);
    }

    /// The offloaded step: one device-to-host copy per gradient at the host link's bandwidth,
    /// the host's Adam over Ψ/N parameters shared by the node's ranks, the updated parameters
    /// copied back before they are all-gathered; the GPU's optimizer kernels do not run, and
    /// the replayed step waits for all of it.
    #[test]
    fn the_offloaded_step_prices_copies_and_the_host_adam_in_order() {
        use crate::passes::evaluate;
        let (m, job) = test_job("gpt", 4, "8xv100");
        let (n, psi) = (u64::from(job.workers), m.param_elems());
        let gbps = job.gpu.host_link_gbps.expect("V100's host link");
        let j = shard(
            &job,
            Sharding {
                offload: true,
                ..sharding(2)
            },
        )
        .unwrap();
        assert!(j.meta.offload);
        let l = &j.local;
        let on = |o: &LocalOp, f: fn(&DeviceKind) -> bool| f(&l.devices[o.spec.device as usize]);
        let copies: Vec<&LocalOp> = l
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Memcpy)
            .collect();
        assert_eq!(
            copies.len(),
            job.syncs.len() + 1,
            "one out per gradient, one back"
        );
        let out_ns: u64 = copies[..job.syncs.len()]
            .iter()
            .map(|o| o.spec.dur_ns)
            .sum();
        let out_bytes: u64 = job.syncs.iter().map(|s| s.bytes / n).sum();
        let want = out_bytes as f64 / gbps;
        assert!(
            (out_ns as f64 - want).abs() <= job.syncs.len() as f64,
            "{out_ns} vs {want}"
        );
        let back = copies[job.syncs.len()];
        assert!(((back.spec.dur_ns as f64) - (4 * psi).div_ceil(n) as f64 / gbps).abs() <= 1.0);
        // The host's step: the one CPU op the pass added (the job has its framework's CPU ops).
        let adam: Vec<&LocalOp> = l.ops[job.local.ops.len()..]
            .iter()
            .filter(|o| o.spec.kind == OpKind::CpuOther)
            .collect();
        assert_eq!(adam.len(), 1);
        assert!(on(adam[0], |d| matches!(d, DeviceKind::CpuThread { .. })));
        // 8 ranks on the one node each update Ψ/8: the node updates Ψ.
        let want = job.host.cpu_adam_ns(psi as f64 / n as f64, 8);
        assert!((adam[0].spec.dur_ns as f64 - want).abs() <= 1.0);
        assert!((want - psi as f64 / CPU_ADAM).abs() < 2.0, "{want}");
        for o in l.ops.iter().filter(|o| o.spec.phase == Phase::Update) {
            if on(o, |d| matches!(d, DeviceKind::GpuStream { stream: 0, .. })) {
                assert_eq!(o.spec.dur_ns, 0, "no optimizer kernel on the GPU");
            }
        }
        let gather = j
            .syncs
            .iter()
            .find(|s| s.kind == CollectiveKind::AllGather)
            .expect("stage 2 gathers the updated parameters");
        let back_id = l.ops.iter().position(|o| std::ptr::eq(o, back)).unwrap() as OpId;
        assert!(l.edges.contains(&(back_id, gather.ready[0])));
        let e = evaluate(j.clone()).expect("replays");
        assert!(e.iteration_ns() >= adam[0].spec.dur_ns + back.spec.dur_ns);
        let plain = evaluate(shard(&job, sharding(2)).unwrap()).unwrap();
        assert!(e.iteration_ns() > plain.iteration_ns() + adam[0].spec.dur_ns / 2);
        // The symmetric form (one worker standing for all) replays as the full one does.
        use crate::replay::{peak_memory, replay};
        let sym = j.expand().expect("expands");
        let full = Job {
            symmetric: false,
            ..j.clone()
        }
        .expand()
        .expect("full form");
        let (rs, rf) = (replay(&sym), replay(&full));
        assert_eq!(rs.iteration_ns, rf.iteration_ns);
        assert_eq!(
            peak_memory(&sym, &rs).peak_bytes,
            peak_memory(&full, &rf).peak_bytes
        );
    }

    /// Offload needs the GPU's host link and comes after AMP; accumulated after it, every
    /// micro-step copies its gradient shards out and the host steps once.
    #[test]
    fn offload_needs_a_host_link_comes_after_amp_and_copies_every_micro_step() {
        use crate::passes::evaluate;
        let (_, mut job) = test_job("gpt", 2, "8xv100");
        let off = Sharding {
            offload: true,
            ..sharding(2)
        };
        let j = shard(&job, off).unwrap();
        let e = try_pass(&j, "amp", &[]).unwrap_err().to_string();
        assert!(e.contains("apply amp before shard"), "{e}");
        let host_ops = |j: &Job, kind: OpKind| {
            j.local
                .ops
                .iter()
                .filter(|o| o.spec.kind == kind && o.spec.phase == Phase::Update)
                .count()
        };
        let acc = try_pass(&j, "grad-accumulation", &[("k", "2")]).expect("accumulates");
        assert_eq!(
            host_ops(&acc, OpKind::Memcpy),
            2 * job.syncs.len() + 1,
            "each micro-step's shards out, the parameters back once"
        );
        let adam = |j: &Job| {
            j.local.ops[job.local.ops.len()..]
                .iter()
                .filter(|o| o.spec.kind == OpKind::CpuOther && o.spec.phase == Phase::Update)
                .count()
        };
        assert_eq!(adam(&acc), 1, "one host step");
        let (e1, e2) = (evaluate(j.clone()).unwrap(), evaluate(acc).unwrap());
        assert!(e2.iteration_ns() > e1.iteration_ns());
        job.gpu.host_link_gbps = None;
        let e = shard(&job, off).unwrap_err().to_string();
        assert!(e.contains("host_link_gbps") && e.contains("v100"), "{e}");
    }

    #[test]
    fn what_cannot_shard_says_why() {
        let (_, job) = test_job("gpt", 2, "8xv100");
        for (s, want) in [
            (
                Sharding {
                    replicas: 3,
                    ..sharding(3)
                },
                "must divide the 8 workers",
            ),
            (
                Sharding {
                    replicas: 8,
                    ..sharding(3)
                },
                "shard groups of one rank",
            ),
        ] {
            let e = shard(&job, s).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let once = shard(&job, sharding(2)).unwrap();
        let e = shard(&once, sharding(3)).unwrap_err().to_string();
        assert!(e.contains("already sharded"), "{e}");
    }

    #[test]
    fn units_are_blocks_up_to_the_first_index() {
        assert_eq!(
            unit_of("bert.encoder.layer.3.attention.self.query"),
            "bert.encoder.layer.3"
        );
        assert_eq!(unit_of("transformer.h.11.mlp.c_fc"), "transformer.h.11");
        assert_eq!(unit_of("layer3.1.conv2"), "layer3.1");
        assert_eq!(unit_of("bert.embeddings.word_embeddings"), "");
        assert_eq!(unit_of("fc"), "");
    }
}
