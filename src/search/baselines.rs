//! The baselines of the planner: what a user would get without trainplan, by picking one
//! framework's default (or its autotuner), evaluated with the same replay as the plan so that
//! `plan --json`'s `baselines` field compares like with like.
//!
//! Every baseline is a rewrite of the *unoptimised* job (one collective per gradient tensor, in
//! gradient-ready order) and is built here as data, never by mutating the job:
//!
//! | name | what is set | framework knobs (DESIGN.md table) |
//! |---|---|---|
//! | `none` | nothing: one collective per tensor, in ready order | — |
//! | `xla_default` | `op-fusion` with `scope=all`, `max_ops=1024` | `TF_XLA_FLAGS=--tf_xla_auto_jit=2` |
//! | `horovod_default` | fusion threshold 64 MiB, cycle 5 ms | `HOROVOD_FUSION_THRESHOLD=67108864`, `HOROVOD_CYCLE_TIME=5` |
//! | `horovod_autotune` | best point of a threshold × cycle grid | `HOROVOD_AUTOTUNE=1` (what it would converge to) |
//! | `byteps_default` | every tensor cut into 4,096,000 B pieces | `BYTEPS_PARTITION_BYTES=4096000` |
//! | `ddp_default` | 25 MiB buckets, first bucket 1 MiB | `bucket_cap_mb=25`, `dist._DEFAULT_FIRST_BUCKET_BYTES` |
//!
//! **`xla_default`.** XLA's auto-clustering merges every compilable op into clusters as large as
//! legality allows (`tf_xla_max_cluster_size` defaults to unlimited). The `op-fusion` pass with
//! `scope=all` does the same on the worker template: every device's forward/backward compute ops
//! in topological order, consecutive ones merged greedily while the merge stays acyclic, never
//! across a synchronisation; `max_ops` = 1024 (the pass's ceiling) stands for "unlimited". The
//! gradients of a fused cluster become ready at the cluster's end — the cost of XLA's default
//! that dPRO measures (up to 3.48×).
//!
//! **`horovod_default` (tensor fusion with cycle time).** Horovod's background thread wakes every
//! `cycle` (ticks at `c, 2c, 3c, …` from the start of the iteration), takes the tensors whose
//! gradients became ready since its last wake-up, and all-reduces them in ready order through a
//! fusion buffer of `threshold` bytes: tensors are appended while the buffer holds them, a full
//! buffer is one collective, a tensor larger than the threshold goes alone, threshold 0 disables
//! fusion (one collective per tensor, still issued at the tick).
//!
//! ```text
//! before:  Out(a)@1.2 ms → sync(a)    Out(b)@3.9 ms → sync(b)    Out(c)@6.1 ms → sync(c)
//! after:   Out(a), Out(b) → wait(→5 ms) → sync(a+b)              Out(c) → wait(→10 ms) → sync(c)
//! ```
//!
//! Ready times are the ends of the tensors' `Out` ops in the replay of the unoptimised job
//! (worker 0: the template's op `i` is the global op `i`). Fusion only changes communication, so
//! these times hold in the rewritten job as long as compute does not wait for a collective
//! inside the iteration (true of zoo jobs: only UPDATE waits for `In`). The delay to the tick is
//! modelled by one `Gap` op per tick on a new CPU thread (Horovod's background thread) that waits
//! for the tick's `Out` ops and lasts `tick − latest ready time`; every collective of the tick
//! waits for it. Negotiation messages between ranks are not modelled (they overlap the wait).
//! Defaults 5 ms / 64 MiB are the ones dPRO compared against (Horovod ≤ 0.20); Horovod 0.21
//! changed them to 1 ms / 128 MiB, which the autotune grid contains.
//!
//! **`horovod_autotune`.** Horovod's autotuner runs Bayesian optimisation over the fusion
//! threshold (0–64 MB) and the cycle time (1–100 ms) while training. The honest stand-in is a grid
//! that covers that space and the post-0.21 defaults: threshold ∈ {0, 1, 2, 4, 8, 16, 32, 64, 128,
//! 256} MiB × cycle ∈ {1, 2.5, 5, 10, 20, 25, 50, 100} ms, every point replayed (in parallel), the
//! fastest kept, ties broken by grid order (threshold-major). It is therefore never slower than
//! `horovod_default`, which is a grid point; it is an upper bound on what Bayesian optimisation
//! with a few samples finds.
//!
//! **`byteps_default`.** BytePS cuts every tensor into pieces of at most `BYTEPS_PARTITION_BYTES`
//! = 4,096,000 B (its default, `BytePSGlobal::_partition_bytes`), each its own push/pull or
//! collective: `PartitionSync { k = ⌈bytes / 4,096,000⌉ }` for every sync with `k > 1`. The
//! synchronisation scheme stays the cluster's (ring or parameter server).
//!
//! **`ddp_default` (PyTorch DDP buckets).** DDP assigns gradients, in gradient-ready order
//! (reverse parameter order, rebuilt from the observed order after the first iteration), to
//! buckets: a tensor is appended to the open bucket and the bucket is closed as soon as its size
//! reaches the limit (`compute_bucket_assignment_by_size`: so a bucket may exceed the cap by its
//! last tensor). The first bucket's limit is `dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB, the
//! others `bucket_cap_mb` = 25 MiB (26,214,400 B). A bucket is all-reduced when all its gradients
//! are ready, buckets in order: one fused sync per bucket, no cycle delay.
//!
//! Cost model: none of its own — each baseline is a job, and its time is the replay of that job
//! with the caller's evaluator (the full graph, or the symmetric form). Deterministic: syncs are
//! ordered by (ready time, index), grid points by index, and nothing depends on thread count.

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::cost::framework::{Framework, SyncDefault};
use crate::graph::job::{Job, JobError, LocalOp, Sync};
use crate::graph::{DeviceKind, OpId, OpKind, OpSpec, Phase};
use crate::passes::shard::{Sharding, shard};
use crate::passes::{self, Edit, Evaluated, PassError, Patch};

/// Names as in `--json`, in report order.
pub const NAMES: [&str; 6] = [
    "none",
    "xla_default",
    "horovod_default",
    "horovod_autotune",
    "byteps_default",
    "ddp_default",
];

/// `max_ops` of the `op-fusion` pass for XLA's default (its ceiling: "unlimited").
pub const XLA_MAX_OPS: i64 = 1024;
/// `HOROVOD_FUSION_THRESHOLD` default before Horovod 0.21 (bytes).
pub const HOROVOD_THRESHOLD_BYTES: u64 = 64 << 20;
/// `HOROVOD_CYCLE_TIME` default before Horovod 0.21 (ns).
pub const HOROVOD_CYCLE_NS: u64 = 5_000_000;
/// The autotune grid's fusion thresholds (MiB).
pub const AUTOTUNE_THRESHOLDS_MIB: [u64; 10] = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256];
/// The autotune grid's cycle times (µs).
pub const AUTOTUNE_CYCLES_US: [u64; 8] =
    [1_000, 2_500, 5_000, 10_000, 20_000, 25_000, 50_000, 100_000];
/// `BYTEPS_PARTITION_BYTES` default.
pub const BYTEPS_PARTITION_BYTES: u64 = 4_096_000;
/// DDP's `bucket_cap_mb = 25`, in bytes.
pub const DDP_BUCKET_BYTES: u64 = 25 << 20;
/// DDP's `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB).
pub const DDP_FIRST_BUCKET_BYTES: u64 = 1 << 20;
/// Longest `HOROVOD_CYCLE_TIME` a plan may carry, ms: ten times the autotune grid's longest
/// (100 ms); a cycle of a second would hold every collective for a whole step.
pub const MAX_CYCLE_MS: f64 = 1_000.0;

/// The framework settings a plan's `baseline:` decision may carry (the `knobs` of
/// [`Baseline`]), with their ranges: byte sizes up to a tensor's physical bound
/// ([`crate::graph::bounds::MAX_TENSOR_BYTES`]), a cycle of 1 µs to [`MAX_CYCLE_MS`]. The plan
/// reader checks a plan's start point against them (`plan::validate`), so an export never
/// writes a setting the planner could not have chosen.
pub fn knob_specs() -> Vec<passes::KnobSpec> {
    use passes::KnobSpec;
    let max = crate::graph::bounds::MAX_TENSOR_BYTES as i64;
    vec![
        KnobSpec::int(
            "threshold_bytes",
            "HOROVOD_FUSION_THRESHOLD, bytes (0: no fusion)",
            64 << 20,
            0,
            max,
        ),
        KnobSpec::float(
            "cycle_ms",
            "HOROVOD_CYCLE_TIME, ms",
            5.0,
            1e-3,
            MAX_CYCLE_MS,
        ),
        KnobSpec::int(
            "bucket_cap_bytes",
            "DDP bucket_cap_mb, bytes",
            DDP_BUCKET_BYTES as i64,
            1,
            max,
        ),
        KnobSpec::int(
            "partition_bytes",
            "BYTEPS_PARTITION_BYTES",
            BYTEPS_PARTITION_BYTES as i64,
            1,
            max,
        ),
        KnobSpec::int(
            "combine_threshold_bytes",
            "--xla_gpu_all_reduce_combine_threshold_bytes (0: no combining)",
            30 << 20,
            0,
            max,
        ),
        KnobSpec::int("auto_jit", "--tf_xla_auto_jit", 2, 0, 2),
        KnobSpec::int("stage", "ZeRO stage of a sharded baseline", 3, 1, 3),
        KnobSpec::int(
            "reshard",
            "sharded baseline: reshard after forward",
            1,
            0,
            1,
        ),
        KnobSpec::int(
            "prefetch",
            "sharded baseline: units gathered ahead",
            1,
            0,
            64,
        ),
        KnobSpec::int(
            "replicas",
            "sharded baseline: replica groups (HSDP)",
            1,
            1,
            i64::from(crate::limits::MAX_WORKERS),
        ),
    ]
}

/// One baseline: the job a framework's default would run, and its evaluation.
pub struct Baseline {
    pub name: &'static str,
    pub job: Job,
    pub eval: Evaluated,
    /// One line: what was set and what it gave.
    pub config: String,
    /// The framework setting that gives it, for the export (`bucket_cap_bytes`,
    /// `threshold_bytes`, `cycle_ms`, `partition_bytes`, `combine_threshold_bytes`, `auto_jit`).
    pub knobs: BTreeMap<String, String>,
}

/// A job evaluator (the full graph, or the symmetric form).
pub type Evaluator<'a> = dyn Fn(Job) -> Result<Evaluated, JobError> + std::marker::Sync + 'a;

fn edit_err(name: &str) -> impl Fn(JobError) -> PassError + '_ {
    move |source| PassError::Edit {
        pass: name.to_string(),
        source,
    }
}

/// Every baseline a user would otherwise pick, evaluated on `job` (the unoptimised job), in the
/// order of [`NAMES`]. Deterministic.
pub fn baselines(job: &Job, evaluate: &Evaluator) -> Result<Vec<Baseline>, PassError> {
    let mut none = evaluate(job.clone()).map_err(edit_err("none"))?;
    let ready = ready_times(&none);
    let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();

    // The four fixed baselines, built here, evaluated in parallel below.
    let (xla_job, xla_cfg) = xla_default(&none)?;
    // An evaluation keeps its numbers only once scored and used (see `search::LEAN_OPS`).
    super::lean(&mut none);
    let hvd = horovod_groups(&bytes, &ready, HOROVOD_THRESHOLD_BYTES, HOROVOD_CYCLE_NS);
    let hvd_job = horovod_job(job, &hvd).map_err(edit_err("horovod_default"))?;
    let hvd_cfg = horovod_config(HOROVOD_THRESHOLD_BYTES, HOROVOD_CYCLE_NS, &hvd);
    let (bps_job, bps_cfg) = byteps_default(job)?;
    let order = ready_order(&ready);
    let buckets = ddp_buckets(&bytes, &order);
    let ddp_job = fused_job(job, &buckets, &[]).map_err(edit_err("ddp_default"))?;
    let ddp_cfg = format!(
        "bucket_cap_mb 25, first bucket 1 MiB, in gradient-ready order: {} buckets for {} tensors",
        buckets.len(),
        job.syncs.len()
    );
    let fixed = vec![
        ("xla_default", xla_job, xla_cfg),
        ("horovod_default", hvd_job, hvd_cfg),
        ("byteps_default", bps_job, bps_cfg),
        ("ddp_default", ddp_job, ddp_cfg),
    ];
    let (fixed, tuned) = rayon::join(
        || {
            fixed
                .into_par_iter()
                .map(|(name, j, config)| {
                    let mut eval = match evaluate(j.clone()) {
                        Ok(e) => e,
                        // A baseline whose graph is over the op limit or the memory ceiling
                        // (BytePS' 4 MB pieces multiply a 65,536-GPU ring's ops) is left out
                        // with a warning; the others still compare.
                        Err(e @ (JobError::TooLarge { .. } | JobError::Invalid(_))) => {
                            tracing::warn!("baseline {name} left out: {e}");
                            return Ok(None);
                        }
                        Err(e) => return Err(edit_err(name)(e)),
                    };
                    super::lean(&mut eval);
                    Ok(Some(Baseline {
                        name,
                        job: j,
                        eval,
                        config,
                        knobs: BTreeMap::new(),
                    }))
                })
                .collect::<Result<Vec<Option<Baseline>>, PassError>>()
        },
        || horovod_autotune(job, &bytes, &ready, evaluate),
    );
    let fixed = fixed?.into_iter().flatten();
    let tuned = tuned?;
    let mut out = Vec::with_capacity(NAMES.len());
    out.push(Baseline {
        name: "none",
        job: job.clone(),
        config: format!(
            "one collective per gradient tensor in ready order: {} syncs",
            job.syncs.len()
        ),
        eval: none,
        knobs: BTreeMap::new(),
    });
    out.extend(fixed);
    out.push(tuned);
    // In the order of NAMES (a left-out baseline is simply absent).
    out.sort_by_key(|b| NAMES.iter().position(|n| *n == b.name));
    debug_assert!(out.iter().all(|b| NAMES.contains(&b.name)));
    Ok(out)
}

/// Name of the one baseline of a recorded job.
pub const AS_RECORDED: &str = "as_recorded";

/// The baselines of a recorded job (a trace): the job as it ran. A trace's collectives are the
/// framework's own, as recorded — its buckets (DDP), or none on one GPU — so the data-parallel
/// defaults above, which rewrite per-tensor synchronisations the trace does not have, do not
/// apply; nor does XLA's fusion of every op to an eager PyTorch step.
pub fn recorded(job: &Job, evaluate: &Evaluator) -> Result<Vec<Baseline>, PassError> {
    let eval = evaluate(job.clone()).map_err(edit_err(AS_RECORDED))?;
    let f = job.meta.trace.as_deref();
    let config = match f.and_then(|f| f.bucketing.as_ref()) {
        Some(b) => format!(
            "as recorded: {} gradient all-reduces{}",
            b.sizes_bytes.len(),
            b.cap_bytes
                .map(|c| format!(", bucket cap ≈ {} MiB", c >> 20))
                .unwrap_or_default()
        ),
        None => "as recorded".into(),
    };
    Ok(vec![Baseline {
        name: AS_RECORDED,
        job: job.clone(),
        eval,
        config,
        knobs: BTreeMap::new(),
    }])
}

/// The job `fw`'s default gradient synchronisation gives (see
/// [`Framework::default_sync`]), built from the per-tensor `job` (one sync per gradient tensor),
/// and one line saying what was set. `evaluate` prices the per-tensor job for the gradients'
/// ready times (Horovod's cycle ticks, ready order); `None` is returned unchanged for
/// [`SyncDefault::PerTensor`].
pub fn framework_default(
    job: &Job,
    fw: Framework,
    evaluate: &Evaluator,
) -> Result<(Job, String), PassError> {
    let ready = match fw.default_sync() {
        SyncDefault::PerTensor | SyncDefault::Partitions { .. } => Vec::new(),
        _ => ready_times(&evaluate(job.clone()).map_err(edit_err(fw.name()))?),
    };
    default_from_ready(job, fw, &ready)
}

/// [`framework_default`] with the per-tensor job's ready times already known (`plan`'s
/// baselines have them from the `none` row). PyTorch's buckets follow autograd's order
/// ([`autograd_order`], as `plan` and the export do), else the ready order.
pub fn default_from_ready(
    job: &Job,
    fw: Framework,
    ready_ns: &[u64],
) -> Result<(Job, String), PassError> {
    let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();
    let name = fw.name();
    let ready = || -> Result<Vec<u64>, PassError> { Ok(ready_ns.to_vec()) };
    let n = job.syncs.len();
    match fw.default_sync() {
        SyncDefault::PerTensor => {
            Ok((job.clone(), format!("one collective per tensor: {n} syncs")))
        }
        SyncDefault::Buckets {
            first_bytes,
            bytes: cap,
        } => {
            let order = autograd_order(job, is_half(job.dtype))
                .filter(|_| fw == Framework::Pytorch)
                .map_or_else(|| ready().map(|r| ready_order(&r)), Ok)?;
            let buckets = buckets_by_size(&bytes, &order, first_bytes, cap);
            let cfg = format!(
                "DDP buckets of {} MiB (first {} MiB) in gradient-ready order: {} buckets for {n} tensors",
                cap >> 20,
                first_bytes >> 20,
                buckets.len()
            );
            // DDP copies each gradient into its bucket, divides by the world size, and copies the
            // result back: 2 + 2 passes before the all-reduce, 2 after.
            let j = fused_job(job, &buckets, &[]).map_err(edit_err(name))?;
            let mut j = with_buffer_copies(j, 4.0, 2.0, true).map_err(edit_err(name))?;
            if j.workers > 1 {
                // The buckets are buffers of their own beside the gradients.
                let total: u64 = j.syncs.iter().map(|s| s.bytes).sum();
                let l = j.local_mut();
                l.static_mem_bytes = l.static_mem_bytes.saturating_add(total);
            }
            Ok((j, cfg))
        }
        SyncDefault::Combine { threshold_bytes } => {
            let order = ready_order(&ready()?);
            let groups = buckets_by_size(&bytes, &order, threshold_bytes, threshold_bytes);
            let cfg = format!(
                "XLA all-reduce combiner, {} MiB: {} collectives for {n} tensors",
                threshold_bytes >> 20,
                groups.len()
            );
            Ok((fused_job(job, &groups, &[]).map_err(edit_err(name))?, cfg))
        }
        SyncDefault::OnePack => {
            let all = vec![ready_order(&ready()?)];
            let cfg = format!("all {n} gradients in one pack after the backward");
            Ok((fused_job(job, &all, &[]).map_err(edit_err(name))?, cfg))
        }
        SyncDefault::Fusion {
            threshold_bytes,
            cycle_ns,
        } => {
            let ticks = horovod_groups(&bytes, &ready()?, threshold_bytes, cycle_ns);
            let cfg = horovod_config(threshold_bytes, cycle_ns, &ticks);
            // The fusion buffer: a memcpy in and one out for every fused group.
            let j = horovod_job(job, &ticks).map_err(edit_err(name))?;
            let mut j = with_buffer_copies(j, 2.0, 2.0, false).map_err(edit_err(name))?;
            if j.workers > 1 {
                // The fusion buffer, allocated at the threshold's size on first use.
                let l = j.local_mut();
                l.static_mem_bytes = l.static_mem_bytes.saturating_add(threshold_bytes);
            }
            Ok((j, cfg))
        }
        SyncDefault::Partitions { bytes: piece } => {
            let edits = partition_edits(job, piece);
            let cut = edits.len();
            let out = passes::apply(
                job,
                &Patch {
                    pass: name.into(),
                    why: format!("partitions of {piece} B"),
                    edits,
                },
            )?;
            Ok((
                out,
                format!("partitions of {piece} B: {cut} of {n} tensors cut"),
            ))
        }
    }
}

/// A zoo job as its framework runs it by default: built, at `precision` (`None`: the
/// framework's default) in `amp_style` (`None`: the framework's), with the framework's default synchronisation unless `per_tensor`.
/// Returns (that job, the same job with one collective per gradient tensor, one line on the
/// synchronisation). What `replay`/`whatif`/`plan --model` start from, and what the fidelity
/// experiment predicts with.
pub fn zoo_baseline(
    model: &crate::zoo::Model,
    cluster: &crate::cost::config::Cluster,
    framework: Framework,
    precision: Option<crate::cost::framework::Precision>,
    amp_style: Option<crate::cost::framework::AmpStyle>,
    per_tensor: bool,
    symmetric: bool,
    host: Option<crate::cost::host::HostSpec>,
    channels_last: Option<bool>,
) -> Result<(Job, Job, String), String> {
    let job = crate::zoo::build::job(
        model,
        cluster,
        &crate::zoo::BuildOptions {
            symmetric,
            framework,
            host,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let flat = passes::amp::with_precision(&job, precision, amp_style, channels_last)
        .map_err(|e| e.to_string())?;
    if per_tensor {
        let cfg = format!("one collective per tensor: {} syncs", flat.syncs.len());
        return Ok((flat.clone(), flat, cfg));
    }
    let (job, cfg) =
        framework_default(&flat, framework, &ready_evaluator).map_err(|e| e.to_string())?;
    Ok((job, flat, cfg))
}

/// Evaluates a job for its gradients' ready times: on the symmetric form when the job allows
/// (ready times do not depend on the worker count), else on the full graph.
fn ready_evaluator(job: Job) -> Result<Evaluated, JobError> {
    let mut j = job;
    if j.comm.scheme == crate::cost::config::SyncScheme::Ring {
        j.symmetric = true;
    }
    passes::evaluate(j)
}

/// `job` with the copies a framework makes around each fused collective: before it,
/// `passes_in` passes over its bytes (gathering the gradients into the buffer, scaling), after
/// it `passes_out` (scattering the result back), one kernel per tensor plus one, on the compute
/// stream (PyTorch DDP's reducer: `copy_` into the bucket view, `div_` by the world size, `copy_`
/// back unless `gradient_as_bucket_view`; Horovod's fusion buffer: memcpy in and out). Each is
/// issued by the host like any op. A sync of one tensor that needs no buffer (`always` false)
/// is left alone. Only for more than one worker: one GPU synchronises nothing.
pub fn with_buffer_copies(
    job: Job,
    passes_in: f64,
    passes_out: f64,
    always: bool,
) -> Result<Job, JobError> {
    use crate::cost::kernel::{OpClass, OpWork};
    use crate::graph::OpKind;
    if job.workers <= 1 {
        return Ok(job);
    }
    let gpu = job
        .local
        .devices
        .iter()
        .position(|d| matches!(d, DeviceKind::GpuStream { stream: 0, .. }));
    let Some(gpu) = gpu else { return Ok(job) };
    let all_synced: Vec<OpId> = job
        .local
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.spec.kind == OpKind::Out && o.spec.phase == Phase::Update)
        .map(|(i, _)| i as OpId)
        .collect();
    let has_host = job.local.ops.iter().any(|o| o.spec.kind == OpKind::Launch);
    let elem = job.dtype.bytes().max(1) as f64;
    let mut ed = job.edit();
    for i in 0..job.syncs.len() {
        let s = job.syncs[i].clone();
        if !always && s.tensors.len() < 2 {
            continue;
        }
        let elems = s.bytes as f64 / elem;
        let n = s.tensors.len() as u32;
        let copy = |passes: f64, kernels: u32| {
            OpWork::new(OpClass::Copy, 0.0, 0.0, passes * elems, kernels)
        };
        let host = |kernels: u32| {
            has_host.then(|| crate::cost::compute::ns(job.host.op_ns(OpClass::Copy, true, kernels)))
        };
        let w_in = copy(passes_in, n + 1);
        let spec = OpSpec::compute(
            gpu as u32,
            Phase::Comm,
            crate::graph::NONE,
            job.cost_ns(&w_in, job.dtype, 1.0),
        );
        let pack = ed.insert(spec, Some(w_in), &s.ready, &[], host(n + 1))?;
        let w_out = copy(passes_out, n);
        let spec = OpSpec::compute(
            gpu as u32,
            Phase::Comm,
            crate::graph::NONE,
            job.cost_ns(&w_out, job.dtype, 1.0),
        );
        let unpack = ed.insert(spec, Some(w_out), &s.done, &all_synced, host(n))?;
        let _ = unpack;
        ed.job_mut().syncs[i].ready = vec![pack];
    }
    ed.finish()
}

/// Ready time of every sync: the latest end of its ready ops on worker 0 (the template's op `i`
/// is global op `i`). Needs a full evaluation (a lean one has no replay times).
pub fn ready_times(e: &Evaluated) -> Vec<u64> {
    e.job
        .syncs
        .iter()
        .map(|s| {
            s.ready
                .iter()
                .map(|&r| e.replay.end_ns[r as usize])
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// The order PyTorch's autograd makes the gradients of a zoo job ready, as sync indices (one
/// tensor per sync), or `None` when the job is not shaped so (a trace, fused syncs).
///
/// Autograd runs the backward nodes that are ready by their sequence number, highest first: the
/// node created last in the forward pass runs first. So where the backward branches (a
/// residual block's downsample and main path, attention's query, key and value), the branch
/// computed last in the forward finishes its gradients first — not the one the replay's GPU
/// stream happens to start first. The bucket boundaries of DDP follow this order (checked
/// against real PyTorch in `tests/frameworks/torch_ddp.py`): a topological order of the BW ops,
/// the ready op with the highest layer index first (zoo layers are in forward order); within a
/// layer in the order its backward returns them: a convolution or normalisation the weight
/// first; a linear layer (`addmm`) in fp32 the bias first (its gradient goes straight to its
/// accumulator while the weight's passes `t()` first), under `autocast` the weight first (both
/// pass a cast node, the bias's created first, so run last). Measured on real PyTorch 2.9.
pub fn autograd_order(job: &Job, autocast: bool) -> Option<Vec<usize>> {
    let l = &job.local;
    let mut bw_of_layer = std::collections::BTreeMap::new();
    let mut linear = std::collections::BTreeSet::new();
    for (i, op) in l.ops.iter().enumerate() {
        if op.spec.phase == Phase::Bw && op.spec.kind == OpKind::Compute {
            if bw_of_layer.insert(op.spec.layer, i).is_some() {
                return None;
            }
            if op
                .work
                .is_some_and(|w| w.class == crate::cost::kernel::OpClass::Gemm)
            {
                linear.insert(op.spec.layer);
            }
        }
    }
    let mut indeg: BTreeMap<usize, usize> = bw_of_layer.values().map(|&i| (i, 0)).collect();
    let mut succ: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(a, b) in &l.edges {
        let (a, b) = (a as usize, b as usize);
        if indeg.contains_key(&a) && indeg.contains_key(&b) {
            *indeg.get_mut(&b)? += 1;
            succ.entry(a).or_default().push(b);
        }
    }
    let mut heap: std::collections::BinaryHeap<(u32, usize)> = indeg
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(&i, _)| (l.ops[i].spec.layer, i))
        .collect();
    let mut pos_of_layer = BTreeMap::new();
    while let Some((layer, i)) = heap.pop() {
        let n = pos_of_layer.len();
        pos_of_layer.insert(layer, n);
        for &s in succ.get(&i).map(Vec::as_slice).unwrap_or(&[]) {
            let d = indeg.get_mut(&s)?;
            *d -= 1;
            if *d == 0 {
                heap.push((l.ops[s].spec.layer, s));
            }
        }
    }
    let mut keyed = Vec::with_capacity(job.syncs.len());
    for (i, s) in job.syncs.iter().enumerate() {
        let [t] = s.tensors.as_slice() else {
            return None;
        };
        let tensor = l.tensors.get(*t as usize)?;
        let pos = *pos_of_layer.get(&tensor.layer)?;
        let first = if linear.contains(&tensor.layer) {
            tensor
                .name
                .ends_with(if autocast { ".weight" } else { ".bias" })
        } else {
            tensor.name.ends_with(".weight")
        };
        keyed.push(((pos, !first, *t), i));
    }
    keyed.sort();
    Some(keyed.into_iter().map(|(_, i)| i).collect())
}

/// fp16 or bf16: the dtypes `torch.autocast` runs in.
pub fn is_half(d: crate::cost::config::Dtype) -> bool {
    matches!(
        d,
        crate::cost::config::Dtype::Fp16 | crate::cost::config::Dtype::Bf16
    )
}

/// How DDP lays out a PyTorch plan's buckets: it fills them in the order autograd makes the
/// gradients ready, closing one at `first_bytes` (the first) or `cap_bytes`, and that order
/// depends on the dtype ([`autograd_order`]: autocast puts a linear layer's weight before its
/// bias). The search evaluates every job through [`DdpLayout::apply`], so a move that turns
/// AMP on is priced with the buckets DDP will really build, and the plan's groups are those
/// buckets (issue 13, finding 2). Orders are tensor ids, fixed on the unoptimised job (compiled
/// regions run eagerly until DDP has rebuilt its buckets, so fusion does not change them).
#[derive(Clone, Debug, PartialEq)]
pub struct DdpLayout {
    pub first_bytes: u64,
    pub cap_bytes: u64,
    /// Gradient-ready order in fp32, as tensor ids.
    pub fp32: Vec<u32>,
    /// The same under autocast.
    pub autocast: Vec<u32>,
}

impl DdpLayout {
    /// The layout of `job` (one collective per tensor, as the baselines see it) with these
    /// caps; `None` when its autograd order is unknown (a trace, fused syncs).
    pub fn of(job: &Job, first_bytes: u64, cap_bytes: u64) -> Option<DdpLayout> {
        let ids = |order: Vec<usize>| -> Option<Vec<u32>> {
            order
                .into_iter()
                .map(|i| match job.syncs[i].tensors.as_slice() {
                    [t] => Some(*t),
                    _ => None,
                })
                .collect()
        };
        Some(DdpLayout {
            first_bytes,
            cap_bytes,
            fp32: ids(autograd_order(job, false)?)?,
            autocast: ids(autograd_order(job, true)?)?,
        })
    }

    /// The caps of a PyTorch baseline (`ddp_default`: first bucket 1 MiB, then 25 MiB;
    /// `ddp_tuned`: its `bucket_cap_bytes` for all), or `None` for another baseline.
    pub fn caps(name: &str, knobs: &BTreeMap<String, String>) -> Option<(u64, u64)> {
        match name {
            "ddp_default" => Some((DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)),
            "ddp_tuned" => {
                let c: u64 = knobs.get("bucket_cap_bytes")?.parse().ok()?;
                Some((c, c))
            }
            _ => None,
        }
    }

    /// `job` with its collectives regrouped into the buckets DDP builds for its dtype: every
    /// collective is split into its tensors (each keeps the op that makes it ready and the op
    /// that waits for it) and the tensors are bucketed in this layout's order. The job is
    /// returned unchanged when that grouping is already its own, or when a collective cannot be
    /// split so (partitioned, or not one ready op per tensor).
    ///
    /// A job with DDP's bucket copies (`ddp_default`: [`with_buffer_copies`]) is regrouped
    /// without them — each tensor's ready and waiting ops are its `Out` and `In` — and gets the
    /// copies of its new buckets back.
    pub fn apply(&self, job: Job) -> Job {
        let Some(plain) = without_bucket_copies(&job) else {
            return self.apply_plain(job);
        };
        let regrouped = self.apply_plain(plain.clone());
        if regrouped.syncs.len() == job.syncs.len()
            && regrouped
                .syncs
                .iter()
                .zip(&job.syncs)
                .all(|(a, b)| a.tensors == b.tensors)
        {
            return job;
        }
        with_buffer_copies(regrouped, 4.0, 2.0, true).unwrap_or(job)
    }

    fn apply_plain(&self, job: Job) -> Job {
        let order = if is_half(job.dtype) {
            &self.autocast
        } else {
            &self.fp32
        };
        let mut split: Vec<Sync> = Vec::new();
        let mut pos_of_tensor: BTreeMap<u32, usize> = BTreeMap::new();
        for s in &job.syncs {
            let n = s.tensors.len();
            let whole: u64 = s
                .tensors
                .iter()
                .map(|&t| job.local.tensors[t as usize].bytes)
                .sum();
            if s.partitions != 1 || s.ready.len() != n || (s.done.len() != n && !s.done.is_empty())
            {
                return job;
            }
            let mut left = s.bytes;
            for (k, &t) in s.tensors.iter().enumerate() {
                let b = if k + 1 == n || whole == 0 {
                    left
                } else {
                    let tb = job.local.tensors[t as usize].bytes as u128;
                    ((s.bytes as u128 * tb) / whole as u128) as u64
                };
                left -= b.min(left);
                pos_of_tensor.insert(t, split.len());
                split.push(Sync {
                    tensors: vec![t],
                    bytes: b,
                    partitions: 1,
                    kind: crate::graph::comm::CollectiveKind::AllReduce,
                    group: s.group,
                    ready: vec![s.ready[k]],
                    done: if s.done.is_empty() {
                        Vec::new()
                    } else {
                        vec![s.done[k]]
                    },
                });
            }
        }
        let Some(idx): Option<Vec<usize>> = order
            .iter()
            .map(|t| pos_of_tensor.get(t).copied())
            .collect()
        else {
            return job;
        };
        if idx.len() != split.len() {
            return job;
        }
        let bytes: Vec<u64> = split.iter().map(|s| s.bytes).collect();
        let groups = buckets_by_size(&bytes, &idx, self.first_bytes, self.cap_bytes);
        let same = groups.len() == job.syncs.len()
            && groups.iter().zip(&job.syncs).all(|(g, s)| {
                g.len() == s.tensors.len()
                    && g.iter()
                        .zip(&s.tensors)
                        .all(|(&i, t)| split[i].tensors[0] == *t)
            });
        if same {
            return job;
        }
        let mut per_tensor = job.clone();
        per_tensor.syncs = split;
        fused_job(&per_tensor, &groups, &[]).unwrap_or(job)
    }
}

/// `job` without the bucket copies [`with_buffer_copies`] inserted (the copy ops and their
/// launches removed, each sync's ready and waiting ops back to its tensors' `Out` and `In`), or
/// `None` when it has none.
fn without_bucket_copies(job: &Job) -> Option<Job> {
    let ops = &job.local.ops;
    let is_copy = |o: OpId| {
        let op = &ops[o as usize];
        op.spec.kind == OpKind::Compute
            && op.spec.phase == Phase::Comm
            && op
                .work
                .is_some_and(|w| w.class == crate::cost::kernel::OpClass::Copy)
    };
    if !job
        .syncs
        .iter()
        .any(|s| s.ready.iter().chain(&s.done).any(|&o| is_copy(o)))
        && !job
            .local
            .edges
            .iter()
            .any(|&(a, b)| is_copy(a) && ops[b as usize].spec.phase == Phase::Update)
    {
        return None;
    }
    let mut out_of = BTreeMap::new();
    let mut in_of = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if op.spec.phase != Phase::Comm {
            continue;
        }
        match op.spec.kind {
            OpKind::Out => {
                out_of.insert(op.spec.tensor, i as OpId);
            }
            OpKind::In => {
                in_of.insert(op.spec.tensor, i as OpId);
            }
            _ => {}
        }
    }
    let copies: Vec<OpId> = (0..ops.len() as OpId).filter(|&o| is_copy(o)).collect();
    let launches: Vec<OpId> = job
        .local
        .edges
        .iter()
        .filter(|&&(a, b)| is_copy(b) && ops[a as usize].spec.kind == OpKind::Launch)
        .map(|&(a, _)| a)
        .collect();
    let mut ed = job.edit();
    for s in ed.job_mut().syncs.iter_mut() {
        let ready: Option<Vec<OpId>> = s.tensors.iter().map(|t| out_of.get(t).copied()).collect();
        let done: Option<Vec<OpId>> = s.tensors.iter().map(|t| in_of.get(t).copied()).collect();
        s.ready = ready?;
        s.done = done?;
    }
    // The copies first (their launches then bridge only the host's program order).
    ed.remove(&copies).ok()?;
    ed.remove(&launches).ok()?;
    ed.finish().ok()
}

/// Sync indices sorted by (ready time, index).
pub fn ready_order(ready: &[u64]) -> Vec<usize> {
    let mut v: Vec<usize> = (0..ready.len()).collect();
    v.sort_by_key(|&i| (ready[i], i));
    v
}

fn xla_default(none: &Evaluated) -> Result<(Job, String), PassError> {
    let pass = passes::op_fusion::OpFusion;
    let knobs = passes::resolve_knobs(
        &pass,
        &[
            ("scope".to_string(), "all".to_string()),
            ("max_ops".to_string(), XLA_MAX_OPS.to_string()),
        ],
    )?;
    let patches = passes::propose(&pass, none, &knobs)?;
    let job = passes::apply_all(&none.job, &patches)?;
    let fused: usize = patches
        .iter()
        .flat_map(|p| &p.edits)
        .map(|e| match e {
            Edit::Merge { ops, .. } => ops.len(),
            _ => 0,
        })
        .sum();
    let cfg = format!(
        "op-fusion scope=all max_ops={XLA_MAX_OPS}: {} clusters of {fused} ops, compute ops {} → {}",
        patches.len(),
        none.job.compute_ops().count(),
        job.compute_ops().count()
    );
    Ok((job, cfg))
}

fn byteps_default(job: &Job) -> Result<(Job, String), PassError> {
    let edits = partition_edits(job, BYTEPS_PARTITION_BYTES);
    let cut = edits.len();
    let pieces: u64 = job
        .syncs
        .iter()
        .map(|s| u64::from(byteps_pieces(s.bytes)))
        .sum();
    let out = passes::apply(
        job,
        &Patch {
            pass: "byteps_default".into(),
            why: "BYTEPS_PARTITION_BYTES=4096000".into(),
            edits,
        },
    )?;
    Ok((
        out,
        format!(
            "partition bytes {BYTEPS_PARTITION_BYTES}: {cut} of {} tensors cut, {pieces} pieces in all",
            job.syncs.len()
        ),
    ))
}

/// BytePS's piece count for a tensor of `bytes`: `⌈bytes / 4,096,000⌉`, at least 1.
/// BytePS' cuts: every sync over `piece` bytes partitioned into pieces of at most `piece`.
fn partition_edits(job: &Job, piece: u64) -> Vec<Edit> {
    job.syncs
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let k = u32::try_from(s.bytes.div_ceil(piece).max(1)).unwrap_or(u32::MAX);
            (k > 1).then_some(Edit::PartitionSync { sync: i, k })
        })
        .collect()
}

pub fn byteps_pieces(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(BYTEPS_PARTITION_BYTES).max(1)).unwrap_or(u32::MAX)
}

/// DDP's buckets: syncs taken in `order` (gradient-ready order), a bucket closed once its size
/// reaches its limit (1 MiB for the first, 25 MiB after).
pub fn ddp_buckets(bytes: &[u64], order: &[usize]) -> Vec<Vec<usize>> {
    buckets_by_size(bytes, order, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
}

/// Syncs taken in `order`, a bucket closed once its size reaches its limit (`first` for the
/// first bucket, `cap` after): DDP's `compute_bucket_assignment_by_size`.
pub fn buckets_by_size(bytes: &[u64], order: &[usize], first: u64, cap: u64) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut size = 0u64;
    for &i in order {
        cur.push(i);
        size += bytes[i];
        let limit = if out.is_empty() { first } else { cap };
        if size >= limit {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One tick of Horovod's background thread: when it fires, the latest ready time among its
/// tensors, and the fusion buffers it all-reduces (sync indices in ready order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    pub at_ns: u64,
    pub last_ready_ns: u64,
    pub buffers: Vec<Vec<usize>>,
}

/// Horovod's grouping (see the module docs): ticks at multiples of `cycle_ns`, buffers of at
/// most `threshold` bytes (0: no fusion) in ready order.
pub fn horovod_groups(bytes: &[u64], ready: &[u64], threshold: u64, cycle_ns: u64) -> Vec<Tick> {
    let cycle = cycle_ns.max(1);
    let mut ticks: Vec<Tick> = Vec::new();
    for i in ready_order(ready) {
        let at = ready[i].div_ceil(cycle) * cycle;
        if ticks.last().is_none_or(|t| t.at_ns != at) {
            ticks.push(Tick {
                at_ns: at,
                last_ready_ns: ready[i],
                buffers: Vec::new(),
            });
        }
        let t = ticks.last_mut().expect("pushed above");
        t.last_ready_ns = t.last_ready_ns.max(ready[i]);
        let fits = match t.buffers.last() {
            Some(b) => b.iter().map(|&j| bytes[j]).sum::<u64>() + bytes[i] <= threshold,
            None => false,
        };
        match t.buffers.last_mut() {
            Some(b) if fits => b.push(i),
            _ => t.buffers.push(vec![i]),
        }
    }
    ticks
}

fn horovod_config(threshold: u64, cycle_ns: u64, ticks: &[Tick]) -> String {
    let groups: usize = ticks.iter().map(|t| t.buffers.len()).sum();
    let wait: u64 = ticks.iter().map(|t| t.at_ns - t.last_ready_ns).sum();
    format!(
        "fusion threshold {} MiB, cycle {} ms: {groups} collectives in {} cycles, {:.2} ms of cycle waits",
        threshold >> 20,
        cycle_ns as f64 / 1e6,
        ticks.len(),
        wait as f64 / 1e6
    )
}

/// The job Horovod's grouping gives: one sync per buffer, every buffer of a tick gated by the
/// tick's wait op.
pub fn horovod_job(job: &Job, ticks: &[Tick]) -> Result<Job, JobError> {
    let mut groups = Vec::new();
    let mut gates = Vec::new();
    for t in ticks {
        let first = groups.len();
        groups.extend(t.buffers.iter().cloned());
        gates.push((first..groups.len(), t.at_ns - t.last_ready_ns));
    }
    fused_job(job, &groups, &gates)
}

/// `job` with its syncs replaced by one sync per group (in group order; a group of one keeps
/// its sync as is). Each `(range, wait)` of `gates` with `wait > 0` adds one `Gap` op of `wait`
/// ns on a new CPU thread that waits for the ready ops of the groups in `range`, and those
/// groups' syncs wait for it.
fn fused_job(
    job: &Job,
    groups: &[Vec<usize>],
    gates: &[(std::ops::Range<usize>, u64)],
) -> Result<Job, JobError> {
    debug_assert!({
        let mut all: Vec<usize> = groups.iter().flatten().copied().collect();
        all.sort_unstable();
        all == (0..job.syncs.len()).collect::<Vec<_>>()
    });
    let mut out = job.clone();
    let mut syncs: Vec<Sync> = groups
        .iter()
        .map(|g| match g.as_slice() {
            [one] => job.syncs[*one].clone(),
            _ => {
                let mut s = Sync {
                    tensors: Vec::new(),
                    bytes: 0,
                    partitions: 1,
                    kind: crate::graph::comm::CollectiveKind::AllReduce,
                    group: job.syncs[g[0]].group,
                    ready: Vec::new(),
                    done: Vec::new(),
                };
                for &i in g {
                    let o = &job.syncs[i];
                    s.tensors.extend(&o.tensors);
                    s.bytes += o.bytes;
                    s.ready.extend(&o.ready);
                    s.done.extend(&o.done);
                }
                s
            }
        })
        .collect();
    if gates.iter().any(|(_, w)| *w > 0) {
        let l = out.local_mut();
        // Horovod's background thread: a CPU thread of its own.
        let thread = l.next_cpu_thread();
        l.devices.push(DeviceKind::CpuThread { worker: 0, thread });
        let dev = (l.devices.len() - 1) as u32;
        for (range, wait) in gates {
            if *wait == 0 || range.is_empty() {
                continue;
            }
            let gate = l.ops.len() as OpId;
            l.ops.push(LocalOp {
                spec: OpSpec::new(OpKind::Gap, Phase::Comm, dev, *wait),
                work: None,
            });
            for s in &mut syncs[range.clone()] {
                for &r in &s.ready {
                    l.edges.push((r, gate));
                }
                s.ready.push(gate);
            }
        }
    }
    out.syncs = syncs;
    out.edit().finish()
}

fn horovod_autotune(
    job: &Job,
    bytes: &[u64],
    ready: &[u64],
    evaluate: &Evaluator,
) -> Result<Baseline, PassError> {
    let grid: Vec<(u64, u64)> = AUTOTUNE_THRESHOLDS_MIB
        .iter()
        .flat_map(|&t| AUTOTUNE_CYCLES_US.iter().map(move |&c| (t << 20, c * 1000)))
        .collect();
    let n = grid.len();
    let best = grid
        .into_par_iter()
        .enumerate()
        .map(|(idx, (threshold, cycle))| {
            let ticks = horovod_groups(bytes, ready, threshold, cycle);
            let j = horovod_job(job, &ticks).map_err(edit_err("horovod_autotune"))?;
            let mut eval = evaluate(j.clone()).map_err(edit_err("horovod_autotune"))?;
            super::lean(&mut eval);
            let config = format!(
                "{} (best of {n} grid points)",
                horovod_config(threshold, cycle, &ticks)
            );
            Ok((idx, j, eval, config))
        })
        .reduce_with(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => {
                if (b.2.iteration_ns(), b.0) < (a.2.iteration_ns(), a.0) {
                    Ok(b)
                } else {
                    Ok(a)
                }
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        })
        .expect("the grid is not empty")?;
    Ok(Baseline {
        name: "horovod_autotune",
        job: best.1,
        eval: best.2,
        config: best.3,
        knobs: BTreeMap::new(),
    })
}

/// `bucket_cap_mb` values `ddp_tuned` tries (MiB). With an explicit cap, DDP closes every bucket
/// at the cap, the first included (`first_bucket_bytes_cap` = `bucket_bytes_cap` unless the cap
/// is left at its default).
pub const DDP_CAPS_MIB: [u64; 10] = [1, 2, 4, 8, 16, 25, 50, 100, 200, 400];
/// `BYTEPS_PARTITION_BYTES` values `byteps_tuned` tries (MiB; 1,024 MiB cuts nothing).
pub const BYTEPS_PARTITION_MIB: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 256, 1024];
/// `--xla_gpu_all_reduce_combine_threshold_bytes` values `jax_tuned` tries (MiB; 0: no combining).
pub const JAX_THRESHOLDS_MIB: [u64; 10] = [0, 1, 2, 4, 8, 16, 30, 64, 128, 256];

/// One grid point of a tuned baseline: its job, what it set, and the knobs the export needs.
type Point = (Job, String, BTreeMap<String, String>);

/// A tuned baseline's grid, each point built when it is evaluated: a grid holds one point's job
/// per thread, not every point's (ten edited graphs for `ddp_tuned`, the peak of `plan` on a
/// small job before this).
type Grid<'a> = Vec<Box<dyn FnOnce() -> Result<Point, PassError> + Send + 'a>>;

/// A grid of one point already built.
fn one<'a>(point: Point) -> Grid<'a> {
    vec![Box::new(move || Ok(point))]
}

fn knobs(kv: &[(&str, String)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// The fastest of `points` (ties: the first), evaluated in parallel; points not started when
/// `stop()` turns true are skipped. `None` when none was evaluated.
fn best_point(
    name: &'static str,
    points: Grid,
    evaluate: &Evaluator,
    stop: &(dyn Fn() -> bool + std::marker::Sync),
) -> Result<Option<Baseline>, PassError> {
    let n = points.len();
    // The fastest kept while evaluated: one setting per thread is held, not every setting's
    // job twice. The error of the lowest-numbered setting that failed, if any, as a
    // sequential loop would report it.
    let best = super::Fastest::default();
    let failed: std::sync::Mutex<Option<(usize, PassError)>> = std::sync::Mutex::new(None);
    points.into_par_iter().enumerate().for_each(|(i, point)| {
        if stop() {
            return;
        }
        let made = point().and_then(|(job, config, knobs)| {
            let mut eval = evaluate(job.clone()).map_err(edit_err(name))?;
            super::lean(&mut eval);
            Ok((job, eval, config, knobs))
        });
        match made {
            Ok((job, eval, config, knobs)) => {
                let config = if n > 1 {
                    format!("{config} (best of {n} settings)")
                } else {
                    config
                };
                let ns = eval.iteration_ns();
                let b = Baseline {
                    name,
                    job,
                    eval,
                    config,
                    knobs,
                };
                best.offer(i, ns, b);
            }
            Err(e) => {
                let mut f = failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if f.as_ref().is_none_or(|(j, _)| i < *j) {
                    *f = Some((i, e));
                }
            }
        }
    });
    if let Some((_, e)) = failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        return Err(e);
    }
    Ok(best.into_inner().map(|(_, b)| b))
}

/// The baselines a user of `fw` would otherwise get, evaluated on `job` (one collective per
/// gradient tensor), `none` first: its default and the best setting of its own
/// synchronisation knob — every one a setting `fw`'s export can write, so the search may start
/// from it. Stops early (returning what it has) when `stop()` turns true.
///
/// | framework | baselines after `none` |
/// |---|---|
/// | pytorch | `ddp_default` (25 MiB, first 1 MiB), `ddp_tuned` (best `bucket_cap_mb` of [`DDP_CAPS_MIB`]) |
/// | horovod | `horovod_default` (128 MiB, 1 ms), `horovod_autotune` (threshold × cycle grid) |
/// | byteps | `byteps_default` (4,096,000 B), `byteps_tuned` (best of [`BYTEPS_PARTITION_MIB`]) |
/// | tf | `tf_default` (one pack), `xla_default` (the same with XLA auto-clustering) |
/// | jax | `jax_default` (30 MiB combiner), `jax_tuned` (best of [`JAX_THRESHOLDS_MIB`]) |
/// | deepspeed | `deepspeed_default` (no ZeRO: one all-reduce pack after the backward), `zero2_default`, `zero3_default` |
/// | torchtitan | `torchtitan_ddp` (`replicate`, DDP's buckets), `fsdp2_default` |
///
/// PyTorch also gets `fsdp2_default` ([`sharded_points`]); sharded baselines need two workers
/// or more on a ring cluster.
pub fn for_framework(
    job: &Job,
    fw: Framework,
    evaluate: &Evaluator,
    stop: &(dyn Fn() -> bool + std::marker::Sync),
) -> Result<Vec<Baseline>, PassError> {
    let mut none = evaluate(job.clone()).map_err(edit_err("none"))?;
    let ready = ready_times(&none);
    super::lean(&mut none);
    let order = match fw {
        Framework::Pytorch => {
            autograd_order(job, is_half(job.dtype)).unwrap_or_else(|| ready_order(&ready))
        }
        _ => ready_order(&ready),
    };
    let n = job.syncs.len();
    let mut out = vec![Baseline {
        name: "none",
        job: job.clone(),
        config: format!("one collective per gradient tensor in ready order: {n} syncs"),
        eval: none,
        knobs: BTreeMap::new(),
    }];
    // The framework's default: the same rewrite `replay` and `whatif` start from.
    let (default_name, default_knobs) = default_point(fw);
    let (dj, dcfg) = default_from_ready(job, fw, &ready)?;
    let default_job = dj.clone();
    out.extend(best_point(
        default_name,
        one((dj, dcfg, default_knobs)),
        evaluate,
        stop,
    )?);
    let tuned = match fw {
        Framework::Pytorch => best_point("ddp_tuned", ddp_points(job, &order), evaluate, stop)?,
        Framework::Horovod => best_point(
            "horovod_autotune",
            horovod_points(job, &ready),
            evaluate,
            stop,
        )?,
        Framework::Byteps => best_point("byteps_tuned", byteps_points(job), evaluate, stop)?,
        Framework::Tf => xla_baseline(default_job.clone(), evaluate, stop)?,
        Framework::Jax => best_point("jax_tuned", jax_points(job, &order), evaluate, stop)?,
        Framework::Deepspeed | Framework::Torchtitan | Framework::Megatron => None,
    };
    out.extend(tuned);
    for (name, point) in sharded_points(job, &default_job, fw) {
        out.extend(best_point(name, one(point), evaluate, stop)?);
    }
    Ok(out)
}

/// FSDP2's default: one reduce-scatter (and one all-gather) per wrap unit, reshard after the
/// forward, prefetch one (`fully_shard` per transformer block, PyTorch's FSDP2 docs).
const FSDP2_DEFAULT: Sharding = Sharding {
    stage: 3,
    replicas: 1,
    reshard: true,
    prefetch: 1,
    offload: false,
};

/// The sharded settings a user of `fw` would otherwise run, each the `shard` pass on a job
/// synchronised the framework's way; none where the job cannot be sharded (one worker, a
/// parameter-server cluster).
///
/// | framework | sharded baselines |
/// |---|---|
/// | pytorch, torchtitan | `fsdp2_default`: gradients reduce-scattered per wrap unit (the `shard` pass's FSDP2 grouping), stage 3, reshard, prefetch 1 |
/// | megatron | `megatron_distopt`: the distributed optimizer (stage 1) on Megatron-LM's default synchronisation |
/// | deepspeed | `zero2_default`, `zero3_default`: gradients reduced in buckets of `reduce_bucket_size` (5e8 elements), each as it fills in the backward (the `shard` pass under `--framework deepspeed`), at stage 2 on the compute stream (`overlap_comm` off, DeepSpeed's default below stage 3: [`crate::passes::shard::reductions_on_compute_stream`]); prefetch one unit at stage 3 (`stage3_prefetch_bucket_size` 5e7 elements holds about one transformer block of a 1–7 B model) |
fn sharded_points(job: &Job, default_job: &Job, fw: Framework) -> Vec<(&'static str, Point)> {
    let knobs_of = |s: Sharding| {
        knobs(&[
            ("stage", s.stage.to_string()),
            ("replicas", s.replicas.to_string()),
            ("reshard", u32::from(s.reshard).to_string()),
            ("prefetch", s.prefetch.to_string()),
        ])
    };
    let mut out = Vec::new();
    match fw {
        Framework::Pytorch | Framework::Torchtitan => {
            // The `shard` pass reduce-scatters per wrap unit under these frameworks (FSDP2).
            let n = crate::passes::shard::units(job).len();
            let fsdp2 = Job {
                framework: fw,
                ..job.clone()
            };
            if let Ok(j) = shard(&fsdp2, FSDP2_DEFAULT) {
                let cfg = format!(
                    "FSDP2 fully_shard per unit ({n} units), reshard after forward, prefetch 1"
                );
                out.push(("fsdp2_default", (j, cfg, knobs_of(FSDP2_DEFAULT))));
            }
        }
        Framework::Deepspeed => {
            for (name, stage) in [("zero2_default", 2), ("zero3_default", 3)] {
                let s = Sharding {
                    stage,
                    ..FSDP2_DEFAULT
                };
                if let Ok(j) = shard(default_job, s) {
                    // DeepSpeed's default overlap_comm: off below stage 3, so ZeRO-2 reduces
                    // each bucket on the compute stream.
                    let j = if stage < 3 {
                        crate::passes::shard::reductions_on_compute_stream(j)
                    } else {
                        j
                    };
                    let cfg = format!(
                        "DeepSpeed ZeRO-{stage} with its default bucket sizes{}",
                        if stage < 3 {
                            ", gradients reduced on the compute stream (overlap_comm off)"
                        } else {
                            ""
                        }
                    );
                    out.push((name, (j, cfg, knobs_of(s))));
                }
            }
        }
        Framework::Megatron => {
            let s = Sharding {
                stage: 1,
                ..FSDP2_DEFAULT
            };
            if let Ok(j) = shard(default_job, s) {
                let cfg = "Megatron-LM's distributed optimizer (ZeRO-1)".to_string();
                out.push(("megatron_distopt", (j, cfg, knobs_of(s))));
            }
        }
        _ => {}
    }
    out
}

/// The name of `fw`'s default baseline and the knobs it is written with.
fn default_point(fw: Framework) -> (&'static str, BTreeMap<String, String>) {
    match fw {
        Framework::Pytorch => ("ddp_default", BTreeMap::new()),
        Framework::Horovod => {
            let SyncDefault::Fusion {
                threshold_bytes,
                cycle_ns,
            } = fw.default_sync()
            else {
                unreachable!("Horovod's default is tensor fusion")
            };
            (
                "horovod_default",
                knobs(&[
                    ("threshold_bytes", threshold_bytes.to_string()),
                    ("cycle_ms", format!("{}", cycle_ns as f64 / 1e6)),
                ]),
            )
        }
        Framework::Byteps => (
            "byteps_default",
            knobs(&[("partition_bytes", BYTEPS_PARTITION_BYTES.to_string())]),
        ),
        Framework::Tf => ("tf_default", BTreeMap::new()),
        Framework::Jax => ("jax_default", BTreeMap::new()),
        Framework::Deepspeed => ("deepspeed_default", BTreeMap::new()),
        Framework::Torchtitan => ("torchtitan_ddp", BTreeMap::new()),
        Framework::Megatron => ("megatron_default", BTreeMap::new()),
    }
}

/// `job` with its gradients bucketed by size in `order` (first bucket `first` bytes, then
/// `cap`), and the number of buckets; an edit error names `who`.
fn bucketed(
    job: &Job,
    order: &[usize],
    first: u64,
    cap: u64,
    who: &str,
) -> Result<(Job, usize), PassError> {
    let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();
    let groups = buckets_by_size(&bytes, order, first, cap);
    let len = groups.len();
    Ok((fused_job(job, &groups, &[]).map_err(edit_err(who))?, len))
}

/// `ddp_tuned`'s grid: one point per `bucket_cap_mb` of [`DDP_CAPS_MIB`] (first bucket the
/// same size), in autograd order.
fn ddp_points<'a>(job: &'a Job, order: &'a [usize]) -> Grid<'a> {
    let n = job.syncs.len();
    let mut points: Grid<'a> = Vec::new();
    for c in DDP_CAPS_MIB {
        points.push(Box::new(move || {
            let (j, len) = bucketed(job, order, c << 20, c << 20, Framework::Pytorch.name())?;
            let cfg = format!("bucket_cap_mb {c}: {len} buckets for {n} tensors");
            let k = knobs(&[("bucket_cap_bytes", (c << 20).to_string())]);
            Ok((j, cfg, k))
        }));
    }
    points
}

/// `horovod_autotune`'s grid: every fusion threshold of [`AUTOTUNE_THRESHOLDS_MIB`] × cycle of
/// [`AUTOTUNE_CYCLES_US`], grouped by ready time.
fn horovod_points<'a>(job: &'a Job, ready: &'a [u64]) -> Grid<'a> {
    let mut points: Grid<'a> = Vec::new();
    for t in AUTOTUNE_THRESHOLDS_MIB {
        for c in AUTOTUNE_CYCLES_US {
            points.push(Box::new(move || {
                let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();
                let ticks = horovod_groups(&bytes, ready, t << 20, c * 1000);
                let j = horovod_job(job, &ticks).map_err(edit_err("horovod_autotune"))?;
                let cfg = horovod_config(t << 20, c * 1000, &ticks);
                let k = knobs(&[
                    ("threshold_bytes", (t << 20).to_string()),
                    ("cycle_ms", format!("{}", c as f64 / 1000.0)),
                ]);
                Ok((j, cfg, k))
            }));
        }
    }
    points
}

/// `byteps_tuned`'s grid: one point per partition size of [`BYTEPS_PARTITION_MIB`].
fn byteps_points(job: &Job) -> Grid<'_> {
    let n = job.syncs.len();
    let cut = move |piece: u64| -> Result<Point, PassError> {
        let edits = partition_edits(job, piece);
        let cut = edits.len();
        let j = passes::apply(
            job,
            &Patch {
                pass: "byteps".into(),
                why: format!("BYTEPS_PARTITION_BYTES={piece}"),
                edits,
            },
        )?;
        let cfg = format!("partition bytes {piece}: {cut} of {n} tensors cut");
        Ok((j, cfg, knobs(&[("partition_bytes", piece.to_string())])))
    };
    let mut points: Grid<'_> = Vec::new();
    for m in BYTEPS_PARTITION_MIB {
        points.push(Box::new(move || cut(m << 20)));
    }
    points
}

/// `xla_default`: TF's default job (`default_job`, one pack) with XLA auto-clustering; none
/// when `stop()` already holds.
fn xla_baseline(
    default_job: Job,
    evaluate: &Evaluator,
    stop: &(dyn Fn() -> bool + std::marker::Sync),
) -> Result<Option<Baseline>, PassError> {
    if stop() {
        return Ok(None);
    }
    let packed = evaluate(default_job).map_err(edit_err("xla_default"))?;
    let (xj, xcfg) = xla_default(&packed)?;
    let k = knobs(&[("auto_jit", "2".into())]);
    best_point("xla_default", one((xj, xcfg, k)), evaluate, stop)
}

/// `jax_tuned`'s grid: one point per combine threshold of [`JAX_THRESHOLDS_MIB`] (threshold 0:
/// every gradient its own all-reduce).
fn jax_points<'a>(job: &'a Job, order: &'a [usize]) -> Grid<'a> {
    let n = job.syncs.len();
    let mut points: Grid<'a> = Vec::new();
    for m in JAX_THRESHOLDS_MIB {
        points.push(Box::new(move || {
            // Threshold 0: every gradient its own all-reduce.
            let cap = (m << 20).max(1);
            let (j, len) = bucketed(job, order, cap, cap, Framework::Jax.name())?;
            let cfg = format!("combine threshold {m} MiB: {len} collectives for {n} tensors");
            let k = knobs(&[("combine_threshold_bytes", (m << 20).to_string())]);
            Ok((j, cfg, k))
        }));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::comm::AlphaBeta;
    use crate::cost::config::SyncScheme;
    use crate::graph::Tensor;
    use crate::graph::comm::{CommCost, CommSpec};
    use crate::graph::job::{JobMeta, LocalGraph};
    use crate::passes::evaluate;

    const MIB: u64 = 1 << 20;

    /// α = 1000 ns, 1 B/ns on every link: a ring all-reduce of `b` bytes over `n` workers takes
    /// `2(n−1) · (1000 + b/n)` ns.
    fn ring() -> CommSpec {
        let link = AlphaBeta {
            alpha_ns: 1000.0,
            bytes_per_ns: 1.0,
        };
        CommSpec {
            scheme: SyncScheme::Ring,
            gpus_per_node: 8,
            nodes: 1,
            ps_servers: 2,
            cost: CommCost {
                intra: link,
                inter: link,
                aggregate_bytes_per_ns: 10.0,
            },
        }
    }

    /// A chain of backward compute ops on GPU device 1; op `i` produces gradient `i` of
    /// `bytes[i]` B (`op → Out → sync → In`), syncs in chain order. Two workers.
    fn chain(durs: &[u64], bytes: &[u64]) -> Job {
        let mut g = LocalGraph {
            devices: vec![
                DeviceKind::Virtual,
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                },
            ],
            layers: (0..durs.len()).map(|i| format!("l{i}")).collect(),
            ..LocalGraph::default()
        };
        let mut syncs = Vec::new();
        for (i, (&d, &b)) in durs.iter().zip(bytes).enumerate() {
            let o = g.ops.len() as OpId;
            g.ops.push(LocalOp {
                spec: OpSpec::compute(1, Phase::Bw, i as u32, d),
                work: None,
            });
            if i > 0 {
                g.edges.push((o - 3, o));
            }
            g.tensors.push(Tensor {
                name: format!("w{i}"),
                bytes: b,
                layer: i as u32,
            });
            for kind in [OpKind::Out, OpKind::In] {
                g.ops.push(LocalOp {
                    spec: OpSpec {
                        tensor: i as u32,
                        ..OpSpec::new(kind, Phase::Comm, 0, 0)
                    },
                    work: None,
                });
            }
            g.edges.push((o, o + 1));
            syncs.push(Sync {
                tensors: vec![i as u32],
                bytes: b,
                partitions: 1,
                kind: crate::graph::comm::CollectiveKind::AllReduce,
                group: crate::graph::comm::Group::ALL,
                ready: vec![o + 1],
                done: vec![o + 2],
            });
        }
        Job {
            local: g.into(),
            syncs,
            comm: ring(),
            workers: 2,
            symmetric: false,
            // Hand-computed timings: no compute/communication contention.
            gpu: {
                let mut g = crate::cost::config::load_gpu("v100-32gb").unwrap();
                g.kernels.overlap_slowdown = 0.0;
                g
            },
            dtype: crate::cost::config::Dtype::Fp32,
            math: Default::default(),
            framework: Default::default(),
            exec: Default::default(),
            host: Default::default(),
            memory: Default::default(),
            meta: JobMeta::default(),
        }
    }

    /// Gradients ready at 1, 2, 10 µs, 4000 B each.
    fn tiny() -> Job {
        chain(&[1000, 1000, 8000], &[4000, 4000, 4000])
    }

    fn iteration(job: Job) -> u64 {
        evaluate(job).unwrap().iteration_ns()
    }

    #[test]
    fn horovod_groups_by_cycle_then_threshold() {
        // Cycle 5 ms, threshold 64 MiB. Ready at 1, 2, 4 ms → tick 5 ms, 10+20+30 = 60 MiB fit
        // one buffer. 6 and 7 ms → tick 10 ms, 40 + 50 > 64: two buffers. 12 ms → tick 15 ms.
        // 20 ms exactly → tick 20 ms, no wait. 100 MiB > threshold: alone at its tick.
        let ms = 1_000_000;
        let bytes = [10, 20, 30, 40, 50, 60, 5, 100].map(|b| b * MIB);
        let ready = [
            ms,
            2 * ms,
            4 * ms,
            6 * ms,
            7 * ms,
            12 * ms,
            20 * ms,
            19 * ms,
        ];
        let t = horovod_groups(&bytes, &ready, 64 * MIB, 5 * ms);
        let view: Vec<(u64, u64, Vec<Vec<usize>>)> = t
            .iter()
            .map(|t| (t.at_ns / ms, t.at_ns - t.last_ready_ns, t.buffers.clone()))
            .collect();
        assert_eq!(
            view,
            vec![
                (5, ms, vec![vec![0, 1, 2]]),
                (10, 3 * ms, vec![vec![3], vec![4]]),
                (15, 3 * ms, vec![vec![5]]),
                (20, 0, vec![vec![7], vec![6]]),
            ]
        );
        // Threshold 0: the same ticks, no fusion.
        let t0 = horovod_groups(&bytes, &ready, 0, 5 * ms);
        assert_eq!(t0.iter().map(|t| t.buffers.len()).sum::<usize>(), 8);
        assert_eq!(t0[0].buffers, vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn ddp_buckets_close_when_they_reach_the_limit() {
        // First limit 1 MiB: 0.5 MiB, then + 0.6 MiB ≥ 1 MiB closes [0, 1]. Then 25 MiB:
        // 10 + 20 ≥ 25 closes [2, 3] (30 MiB: a bucket may exceed the cap by its last tensor);
        // 30 alone; the rest open at the end.
        let bytes = [
            MIB / 2,
            6 * MIB / 10,
            10 * MIB,
            20 * MIB,
            30 * MIB,
            MIB,
            2 * MIB,
        ];
        let order: Vec<usize> = (0..bytes.len()).collect();
        assert_eq!(
            ddp_buckets(&bytes, &order),
            vec![vec![0, 1], vec![2, 3], vec![4], vec![5, 6]]
        );
        // Ready order, not index order.
        assert_eq!(
            ddp_buckets(&[MIB, 10, 20], &ready_order(&[5, 1, 1])),
            vec![vec![1, 2, 0]]
        );
    }

    #[test]
    fn byteps_piece_counts() {
        assert_eq!(byteps_pieces(10_000_000), 3);
        assert_eq!(byteps_pieces(4_096_000), 1);
        assert_eq!(byteps_pieces(4_096_001), 2);
        assert_eq!(byteps_pieces(1), 1);
        assert_eq!(byteps_pieces(0), 1);
        let job = chain(&[1000, 1000], &[10_000_000, 4_000]);
        let (j, cfg) = byteps_default(&job).unwrap();
        assert_eq!(
            j.syncs.iter().map(|s| s.partitions).collect::<Vec<_>>(),
            vec![3, 1]
        );
        assert_eq!(
            cfg,
            "partition bytes 4096000: 1 of 2 tensors cut, 4 pieces in all"
        );
    }

    #[test]
    fn tiny_job_replays_by_hand() {
        // 2 workers: a ring all-reduce of b bytes is 2 steps of 1000 + b/2 ns; NCCL runs one
        // collective at a time. Ready at 1000, 2000, 10000 ns.
        let job = tiny();
        // none: 1000 → 7000, 7000 → 13000, 13000 → 19000.
        let none = evaluate(job.clone()).unwrap();
        assert_eq!(none.iteration_ns(), 19_000);
        assert_eq!(ready_times(&none), vec![1000, 2000, 10_000]);
        let ready = ready_times(&none);
        let bytes = [4000, 4000, 4000];
        // Horovod, cycle 5 µs, threshold 8000 B: tick 5 µs fuses syncs 0+1 (8000 B) after a wait
        // of 3 µs: 5000 → 5000 + 2·(1000 + 4000) = 15000; tick 10 µs (ready exactly at the
        // tick, no wait): sync 2 waits for the fused one: 15000 → 21000.
        let t = horovod_groups(&bytes, &ready, 8000, 5000);
        let j = horovod_job(&job, &t).unwrap();
        assert_eq!(j.syncs.len(), 2);
        assert_eq!(j.syncs[0].bytes, 8000);
        assert_eq!(j.local.ops.len(), job.local.ops.len() + 1);
        assert_eq!(j.local.ops.last().unwrap().spec.dur_ns, 3000);
        assert_eq!(iteration(j), 21_000);
        // Threshold 0: 5000 → 11000, 11000 → 17000, 17000 → 23000.
        let t = horovod_groups(&bytes, &ready, 0, 5000);
        assert_eq!(iteration(horovod_job(&job, &t).unwrap()), 23_000);
        // A cycle of 1 ns is no delay and threshold 0 no fusion: the job as is.
        let t = horovod_groups(&bytes, &ready, 0, 1);
        let j = horovod_job(&job, &t).unwrap();
        assert_eq!(j, job.edit().finish().unwrap());
        assert_eq!(iteration(j), 19_000);
        // DDP: 12000 B < 1 MiB: one bucket, ready at 10000: 10000 + 2·(1000 + 6000) = 24000.
        let b = ddp_buckets(&bytes, &ready_order(&ready));
        assert_eq!(b, vec![vec![0, 1, 2]]);
        assert_eq!(iteration(fused_job(&job, &b, &[]).unwrap()), 24_000);
    }

    #[test]
    fn every_framework_default_on_the_tiny_job() {
        // Gradients of 4000 B ready at 1, 2, 10 µs (see `tiny_job_replays_by_hand`).
        let job = tiny();
        let it = |fw: Framework| {
            let (j, cfg) = framework_default(&job, fw, &evaluate).unwrap();
            (j.syncs.len(), iteration(j), cfg)
        };
        // PyTorch DDP: 12000 B < the 1 MiB first bucket: one bucket (24000 by hand above), plus
        // the reducer's copies on the compute stream: into the bucket and ÷ world size (4 passes
        // over 3000 fp32 elements, 3 copies + 1 division = 4 kernels) before the all-reduce, back
        // out after (2 passes, 3 kernels). Each kernel costs the V100's launch floor.
        let (n, t, cfg) = it(Framework::Pytorch);
        let bw = 900.0 * job.gpu.kernels.memory_efficiency;
        let floor = job.gpu.launch_overhead_us * 1e3;
        let pack = (4.0 * 12_000.0 / bw + 4.0 * floor).round() as u64;
        let unpack = (2.0 * 12_000.0 / bw + 3.0 * floor).round() as u64;
        assert_eq!((n, t), (1, 10_000 + pack + 14_000 + unpack));
        assert!(cfg.contains("1 buckets for 3 tensors"), "{cfg}");
        // JAX's 30 MiB combiner: the same single group.
        assert_eq!((it(Framework::Jax).0, it(Framework::Jax).1), (1, 24_000));
        // TF: one pack after the backward, the same here.
        assert_eq!((it(Framework::Tf).0, it(Framework::Tf).1), (1, 24_000));
        // Horovod 1 ms cycle: one tick at 1 ms fuses all three: 1,000,000 + 2·(1000 + 6000),
        // with the fusion buffer's memcpy in and out (2 passes each).
        let hin = (2.0 * 12_000.0 / bw + 4.0 * floor).round() as u64;
        let hout = (2.0 * 12_000.0 / bw + 3.0 * floor).round() as u64;
        assert_eq!(
            (it(Framework::Horovod).0, it(Framework::Horovod).1),
            (1, 1_000_000 + hin + 14_000 + hout)
        );
        // BytePS: nothing above 4,096,000 B: as is.
        assert_eq!(
            (it(Framework::Byteps).0, it(Framework::Byteps).1),
            (3, 19_000)
        );
        // Above the first bucket, DDP closes a bucket after the 1 MiB one.
        let big = chain(&[1000, 1000, 8000], &[MIB, 4000, 4000]);
        let (j, _) = framework_default(&big, Framework::Pytorch, &evaluate).unwrap();
        assert_eq!(
            j.syncs.iter().map(|s| s.tensors.len()).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn all_six_on_the_tiny_job() {
        let job = tiny();
        let all = baselines(&job, &evaluate).unwrap();
        let names: Vec<&str> = all.iter().map(|b| b.name).collect();
        assert_eq!(names, NAMES);
        let ms: Vec<u64> = all.iter().map(|b| b.eval.iteration_ns()).collect();
        // none 19000 (above). horovod_default: cycle 5 ms ≫ the iteration: every tensor waits
        // for the first tick (5,000,000 ns), one 12000 B buffer: 5,000,000 + 14000.
        assert_eq!(ms[0], 19_000);
        assert_eq!(ms[2], 5_014_000);
        // Autotune: the 1 ms cycle, every threshold ≥ 12000 B fuses all three alike; the first
        // such grid point (1 MiB) wins the tie: 1,000,000 + 14000.
        assert_eq!(ms[3], 1_014_000);
        assert!(
            all[3]
                .config
                .starts_with("fusion threshold 1 MiB, cycle 1 ms")
        );
        // BytePS: nothing above 4,096,000 B: the job as is.
        assert_eq!(ms[4], 19_000);
        // DDP: one bucket, 24000 (above).
        assert_eq!(ms[5], 24_000);
        // XLA: the three ops fuse into one (trace ops: max(8000, 10000 − 2 launches of 4 µs))
        // = 8000 ns, after which the three gradients are ready at once: 8000 + 3 · 6000.
        assert_eq!(ms[1], 26_000);
        assert_eq!(all[1].job.compute_ops().count(), 1);
    }

    fn zoo_job(model: &str, cluster: &str, batch: u32) -> Job {
        let m = crate::zoo::model(
            model,
            &crate::zoo::ModelOptions {
                batch: Some(batch),
                ..Default::default()
            },
        )
        .unwrap();
        let c = crate::cost::config::load_cluster(cluster).unwrap();
        crate::zoo::build::job(&m, &c, &Default::default()).unwrap()
    }

    #[test]
    fn resnet50_on_tcp() {
        let job = zoo_job("resnet50", "dpro-16xv100-tcp", 8);
        let all = baselines(&job, &evaluate).unwrap();
        let t: Vec<u64> = all.iter().map(|b| b.eval.iteration_ns()).collect();
        // Autotune is never worse than the default nor than its no-fusion points.
        assert!(t[3] <= t[2]);
        let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();
        let ready = ready_times(&evaluate(job.clone()).unwrap());
        for cycle in AUTOTUNE_CYCLES_US {
            let g = horovod_groups(&bytes, &ready, 0, cycle * 1000);
            assert!(t[3] <= iteration(horovod_job(&job, &g).unwrap()));
        }
        // ResNet-50: 161 tensors, 25.6 M parameters (102 MB in FP32). DDP: the first bucket
        // closes at 1 MiB, i.e. right after fc.weight (2048 × 1000 × 4 = 8,192,000 B, the first
        // gradient ready); then ≥ 25 MiB each: at most 1 + ⌊(total − 8,192,000) / 25 MiB⌋ + 1.
        assert_eq!(job.syncs.len(), 161);
        let total: u64 = bytes.iter().sum();
        let ddp = &all[5].job;
        assert_eq!(ddp.syncs[0].bytes, 8_192_000);
        assert_eq!(ddp.syncs[0].tensors.len(), 1);
        assert!(ddp.syncs.len() as u64 <= 2 + (total - 8_192_000) / DDP_BUCKET_BYTES);
        assert!(
            ddp.syncs[1..ddp.syncs.len() - 1]
                .iter()
                .all(|s| s.bytes >= DDP_BUCKET_BYTES)
        );
        // BytePS: pieces = Σ ⌈bytes / 4,096,000⌉.
        let pieces: u32 = all[4].job.syncs.iter().map(|s| s.partitions).sum();
        assert_eq!(pieces, bytes.iter().map(|&b| byteps_pieces(b)).sum::<u32>());
        assert!(pieces > 161);
        // Communication-bound on 25 Gb/s: fusing tensors beats one collective per tensor.
        assert!(t[5] < t[0], "ddp {} vs none {}", t[5], t[0]);
        assert!(t[3] < t[0], "autotune {} vs none {}", t[3], t[0]);
        // On a ring, cutting a tensor pays α per piece and the pieces run back to back.
        assert!(t[4] >= t[0], "byteps {} vs none {}", t[4], t[0]);
        // Same inputs, same outputs.
        let again = baselines(&job, &evaluate).unwrap();
        for (a, b) in all.iter().zip(&again) {
            assert_eq!(a.eval.iteration_ns(), b.eval.iteration_ns());
            assert_eq!(a.config, b.config);
        }
    }

    /// Finding 2 after AMP: autocast makes a linear layer's weight gradient ready before its
    /// bias (fp32: the bias first), and DDP's buckets follow; `DdpLayout::apply` regroups a job
    /// into exactly those buckets for its dtype and leaves a job already so grouped alone.
    #[test]
    fn ddp_layout_follows_the_dtype() {
        let job = zoo_job("resnet50", "dpro-16xv100-tcp", 8);
        let name = |j: &Job, i: usize| j.local.tensors[j.syncs[i].tensors[0] as usize].name.clone();
        let pos =
            |order: &[usize], n: &str| order.iter().position(|&i| name(&job, i) == n).unwrap();
        let fp32 = autograd_order(&job, false).unwrap();
        let amp = autograd_order(&job, true).unwrap();
        assert!(pos(&fp32, "fc.bias") < pos(&fp32, "fc.weight"));
        assert!(pos(&amp, "fc.weight") < pos(&amp, "fc.bias"));
        // Convolutions and batch norms keep their order: only fc's two tensors swap.
        let strip = |o: &[usize]| -> Vec<String> {
            o.iter()
                .map(|&i| name(&job, i))
                .filter(|n| !n.starts_with("fc."))
                .collect()
        };
        assert_eq!(strip(&fp32), strip(&amp));

        let cap = 8 << 20;
        let layout = DdpLayout::of(&job, cap, cap).unwrap();
        let bytes: Vec<u64> = job.syncs.iter().map(|s| s.bytes).collect();
        let planned = fused_job(&job, &buckets_by_size(&bytes, &fp32, cap, cap), &[]).unwrap();
        // Already DDP's fp32 buckets: unchanged.
        assert_eq!(layout.apply(planned.clone()).syncs, planned.syncs);
        // The same job under AMP: regrouped in the autocast order, every bucket closed where
        // DDP closes it (at the first tensor that takes it to the cap).
        let mut half = planned.clone();
        half.dtype = crate::cost::config::Dtype::Fp16;
        let re = layout.apply(half);
        assert_ne!(re.syncs, planned.syncs);
        let flat: Vec<String> = re
            .syncs
            .iter()
            .flat_map(|s| {
                s.tensors
                    .iter()
                    .map(|&t| job.local.tensors[t as usize].name.clone())
            })
            .collect();
        let want: Vec<String> = amp.iter().map(|&i| name(&job, i)).collect();
        assert_eq!(flat, want);
        assert_eq!(flat[0], "fc.weight");
        for s in &re.syncs[..re.syncs.len() - 1] {
            let last = job.local.tensors[*s.tensors.last().unwrap() as usize].bytes;
            assert!(s.bytes >= cap && s.bytes - last < cap, "{} B", s.bytes);
            assert_eq!(s.ready.len(), s.tensors.len());
        }
        let total = |j: &Job| j.syncs.iter().map(|s| s.bytes).sum::<u64>();
        assert_eq!(total(&re), total(&job));
    }

    /// The same with DDP's bucket copies (the `ddp_default` job the search starts from): the
    /// job is regrouped in the autocast order and every new bucket has its two copies, as many
    /// copy ops as buckets before and after.
    #[test]
    fn ddp_layout_regroups_a_job_with_bucket_copies() {
        let job = zoo_job("resnet50", "dpro-16xv100-tcp", 8);
        let (first, cap) = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES);
        let layout = DdpLayout::of(&job, first, cap).unwrap();
        let (ddp, _) =
            framework_default(&job, Framework::Pytorch, &|j| passes::evaluate(j)).unwrap();
        let copies = |j: &Job| {
            j.local
                .ops
                .iter()
                .filter(|o| {
                    o.spec.phase == Phase::Comm
                        && o.work
                            .is_some_and(|w| w.class == crate::cost::kernel::OpClass::Copy)
                })
                .count()
        };
        assert_eq!(copies(&ddp), 2 * ddp.syncs.len());
        // fp32: already DDP's buckets, unchanged.
        assert_eq!(layout.apply(ddp.clone()), ddp);
        let name = |j: &Job, t: u32| j.local.tensors[t as usize].name.clone();
        assert_eq!(name(&ddp, ddp.syncs[0].tensors[0]), "fc.bias");
        let mut half = ddp.clone();
        half.dtype = crate::cost::config::Dtype::Fp16;
        let re = layout.apply(half);
        // fc.weight (8 MB) alone fills the 1 MiB first bucket; fc.bias opens the second.
        let first_bucket: Vec<String> = re.syncs[0].tensors.iter().map(|&t| name(&re, t)).collect();
        assert_eq!(first_bucket, ["fc.weight"]);
        assert_eq!(name(&re, re.syncs[1].tensors[0]), "fc.bias");
        assert_eq!(copies(&re), 2 * re.syncs.len());
        for s in &re.syncs {
            // Ready when its pack copy ends; every tensor's `In` waits for it.
            assert_eq!(s.ready.len(), 1);
            assert_eq!(s.done.len(), s.tensors.len());
        }
        assert!(re.local_dfg().is_ok());
        passes::evaluate(re).unwrap();
    }
}
