//! One rank's Kineto trace → an editable [`Job`] of one iteration (Daydream §4.2), so that
//! replay, every pass and the planner work on a recorded iteration as on a zoo model.
//!
//! **Iteration.** `ProfilerStep#N` spans on a CPU thread (`cpu_op` / `user_annotation`; the GPU-side
//! copies are ignored). By default the *last complete* step is taken (warm-up steps come first); a
//! step is complete when it launched GPU work and every launch has its GPU activity in the file (the
//! profiler's last, cut-off step has neither). Without ProfilerStep spans, iterations are cut at the
//! ends of consecutive `Optimizer.step` annotations: iteration `i` (1-based) runs from the end of
//! annotation `i − 1` to the end of annotation `i`. Neither → an error. The measured iteration time
//! is the window's wall time.
//!
//! **Ops.** Local device 0 is virtual; then one CPU-thread device per thread with events in the
//! window, then one GPU-stream device per stream (a stream running only NCCL/RCCL kernels is the
//! worker's comm stream). Each CPU thread's `cpu_op` / `user_annotation` / runtime events (step
//! markers excluded, Python-function events ignored) are flattened into non-overlapping segments,
//! each attributed to its innermost event: a runtime call that launched GPU work becomes a `Launch`
//! op, everything else `CpuOther`. Time on the thread covered by no event is idle: it becomes the
//! previous op's `gap_ns` (a leading `Gap` op before the first one), so replay keeps the host timing.
//! A zero-length `Gap` op at the window's end on the step's thread marks the end of the step
//! ([`TraceJob::step_end`]). GPU kernels / memcpys / memsets launched in the window (by
//! `correlation`, the id Kineto writes on both sides of every launch in every vintage; the `ac2g`
//! flows carry the same pairs) become `Compute` / `Memcpy` ops with their measured durations; NCCL
//! kernels become `Collective` ops. Consecutive ops of one device get an explicit edge, so the
//! recorded order holds whatever the replayer's queue policy. When the GPU lags the host (work
//! launched in the previous step still runs when the window opens), that work comes first on its
//! stream as ops of its own with their recorded durations (the carry-in).
//!
//! **Launch back-pressure.** A launch much slower than the window's usual one (over 4× the median
//! and 30 µs) was blocked on a full launch queue: it gets an edge from the GPU op (in the window or
//! carried in) that ended last while it was blocked — the op whose end freed its slot — and keeps
//! only its recorded time after that end. Replayed as recorded it changes nothing; in a what-if
//! where the GPU is faster, the launch returns earlier.
//!
//! **Dependencies.** launch → GPU op; blocking calls (`cudaDeviceSynchronize`,
//! `cudaStreamSynchronize`, `cudaEventSynchronize`, blocking `cudaMemcpy`/`cudaMemset`,
//! `hipMemcpyWithStream`) are split into a zero-length issue op (which launches the call's own GPU
//! work) and a wait op with an edge from each GPU op it waited for; the wait op keeps only the
//! recorded time *after* the last waited-for GPU op ended (the waiting itself is re-derived by
//! replay). Waited-for ops: the call's own GPU work; for a `cuda_sync` event naming the event's
//! record (`wait_on_cuda_event_record_corr_id`), the last op of that stream launched before the
//! record; otherwise the last op of the synchronised stream (or of every stream) launched before the
//! call. Only ops that ended before the call returned count. `cudaStreamWaitEvent` after
//! `cudaEventRecord`, when the trace has the `cuda_sync` "Wait Event" record (2024+ Kineto): an edge
//! from the last op of the recorded stream launched before the record to the first op of the
//! waiting stream launched after the wait. Without that record (older traces), the pair is
//! inferred from the launching thread's order — the stream of its last launch before the
//! preceding `cudaEventRecord` (or, when the trace has none, before the wait) that differs from
//! the stream of its next launch — and kept only if the recorded times satisfy it; the rest are
//! counted in a warning. Cross-thread waits on the host (the step's thread idle inside
//! `backward()` while autograd's thread runs the backward): edges to and from the other thread's
//! burst of work (stage *cross-thread waits*).
//!
//! **Phases** (best effort): an event inherits its enclosing event's phase unless its name says
//! otherwise: `Optimizer.step` → UPDATE; `Optimizer.zero_grad` → OTHER (once per iteration,
//! before the forward); autograd names (`autograd::engine::evaluate_function…`, `…Backward…`) →
//! BW; everything else FW. A GPU op takes its launch's phase, NCCL kernels COMM.
//!
//! **Layers.** An operator autograd recorded carries a sequence number, which its backward node
//! carries too: ops are grouped into one layer per sequence number, named after the forward
//! operator spanning it (`aten::conv2d #17`), so that a layer has forward and backward ops;
//! operators without one inherit their enclosing operator's layer, else take their own name. A GPU
//! op takes its launch's layer.
//!
//! **Stages.** `build_job` runs, in order: *threads* (`threads.rs`), *streams*, *carry-in* and
//! *collectives* (`streams.rs`), *launches* (`launches.rs`), *waits* (`waits.rs`), *cross-thread
//! waits* (`crossthread.rs`); then each kernel's work ([`super::work`]), the facts
//! ([`super::facts`]), the memory ([`super::memory`]) and, for a rank alone, the collectives'
//! waits for its absent peers ([`super::peers`]). Each stage is a function with its own test.

use std::collections::BTreeMap;

use crate::cost::comm::AlphaBeta;
use crate::cost::config::{Dtype, SyncScheme};
use crate::cost::framework::{Exec, Framework, Math};
use crate::graph::comm::{CommCost, CommSpec};
use crate::graph::job::{Job, JobMeta, LocalGraph, LocalOp};
use crate::graph::{OpId, OpKind, OpSpec};

use super::kineto::{Category, Event, Id, KinetoTrace, RuntimeCall};
pub use super::step::{StepWindow, TraceCollective, TraceJob};

mod crossthread;
mod launches;
mod streams;
mod threads;
mod waits;

/// Largest sum of op durations and gaps in one step's job, ns (~146 years): replayed times stay
/// far below `u64::MAX`.
const MAX_TOTAL_NS: u64 = 1 << 62;

/// Why a job could not be built from a trace.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceGraphError {
    #[error("{name} cannot be replayed: {reason}")]
    NotReplayable { name: String, reason: String },
    #[error(
        "{name} has no iteration markers: neither ProfilerStep#N spans nor Optimizer.step \
         annotations (record with torch.profiler.profile(schedule=...) and call prof.step() \
         once per iteration)"
    )]
    NoIterations { name: String },
    #[error(
        "{name} has no complete iteration {what}: an iteration is complete when every kernel, \
         memcpy and memset it launches is in the file (a trace stopped before the GPU finished, \
         or with GPU events left out, is not)"
    )]
    NoStep { name: String, what: String },
    #[error("{name}: {message}")]
    Invalid { name: String, message: String },
}

pub(crate) fn is_cpu(e: &Event) -> bool {
    matches!(
        e.cat,
        Category::CpuOp | Category::UserAnnotation | Category::CudaRuntime | Category::CudaDriver
    ) && e.ph == super::kineto::Phase::Complete
}

pub(crate) fn is_gpu(e: &Event) -> bool {
    e.cat.is_gpu_activity() && e.ph == super::kineto::Phase::Complete
}

/// The iteration windows of a trace, in time order.
pub fn steps(trace: &KinetoTrace) -> Vec<StepWindow> {
    let ev = &trace.events;
    // Launch correlations → whether the GPU side is present.
    let gpu_corr: std::collections::BTreeSet<i64> = ev
        .iter()
        .filter(|e| is_gpu(e))
        .filter_map(|e| e.args.correlation)
        .collect();
    // Per process, the launches (kernels and copies; Kineto drops some memsets' GPU side, e.g.
    // zero-sized ones) in time order, each with whether its GPU side is in the file: one pass over
    // the events, then a binary search per window (a 300 MB trace has hundreds of steps).
    let mut launches: BTreeMap<&Id, Vec<(i64, bool)>> = BTreeMap::new();
    for e in ev.iter().filter(|e| is_cpu(e)) {
        if let (Some(c), Some(corr)) = (e.runtime_call(), e.args.correlation)
            && matches!(
                c,
                RuntimeCall::LaunchKernel | RuntimeCall::MemcpyAsync | RuntimeCall::Memcpy { .. }
            )
        {
            launches
                .entry(&e.pid)
                .or_default()
                .push((e.ts_ns, gpu_corr.contains(&corr)));
        }
    }
    for l in launches.values_mut() {
        l.sort_unstable();
    }
    let complete = |pid: &Id, start: i64, end: i64| -> bool {
        let Some(l) = launches.get(pid) else {
            return false;
        };
        let a = l.partition_point(|x| x.0 < start);
        let b = l.partition_point(|x| x.0 < end).max(a);
        b > a && l[a..b].iter().all(|x| x.1)
    };
    let mut out: Vec<StepWindow> = ev
        .iter()
        .filter(|e| is_cpu(e) && e.dur_ns > 0)
        .filter_map(|e| {
            let n = e.profiler_step()?;
            Some(StepWindow {
                label: format!("ProfilerStep#{n}"),
                number: n,
                start_ns: e.ts_ns,
                end_ns: e.end_ns(),
                pid: e.pid.clone(),
                tid: e.tid.clone(),
                complete: complete(&e.pid, e.ts_ns, e.end_ns()),
            })
        })
        .collect();
    if out.is_empty() {
        let mut opt: Vec<&Event> = ev
            .iter()
            .filter(|e| is_cpu(e) && e.name.starts_with("Optimizer.step"))
            .collect();
        opt.sort_by_key(|e| (e.ts_ns, e.end_ns()));
        for (i, w) in opt.windows(2).enumerate() {
            let (a, b) = (w[0], w[1]);
            out.push(StepWindow {
                label: format!("Optimizer.step iteration {}", i + 1),
                number: i as u64 + 1,
                start_ns: a.end_ns(),
                end_ns: b.end_ns(),
                pid: b.pid.clone(),
                tid: b.tid.clone(),
                complete: complete(&b.pid, a.end_ns(), b.end_ns()),
            });
        }
    }
    out.sort_by_key(|s| (s.start_ns, s.number));
    out
}

pub(crate) fn launches_gpu(c: RuntimeCall) -> bool {
    matches!(
        c,
        RuntimeCall::LaunchKernel
            | RuntimeCall::Memcpy { .. }
            | RuntimeCall::MemcpyAsync
            | RuntimeCall::Memset { .. }
            | RuntimeCall::MemsetAsync
            | RuntimeCall::GraphLaunch
    )
}

/// A trace's iterations for a message: "ProfilerStep#3 (incomplete), 4, 5".
pub(crate) fn step_list(all: &[StepWindow]) -> String {
    let kind = if all
        .first()
        .is_none_or(|s| s.label.starts_with("ProfilerStep"))
    {
        "ProfilerStep#"
    } else {
        "Optimizer.step iterations "
    };
    let l = all
        .iter()
        .map(|s| {
            format!(
                "{}{}",
                s.number,
                if s.complete { "" } else { " (incomplete)" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("{kind}{l}")
}

/// Pick the window: step `n` (ProfilerStep number or Optimizer.step iteration), or the last
/// complete one.
pub fn pick_step(
    trace: &KinetoTrace,
    name: &str,
    step: Option<u64>,
) -> Result<StepWindow, TraceGraphError> {
    let all = steps(trace);
    if all.is_empty() {
        return Err(TraceGraphError::NoIterations { name: name.into() });
    }
    let list = || step_list(&all);
    match step {
        Some(n) => all
            .iter()
            .find(|s| s.number == n && s.complete)
            .cloned()
            .ok_or_else(|| TraceGraphError::NoStep {
                name: name.into(),
                what: format!("{n} (it has {})", list()),
            }),
        None => all
            .iter()
            .rev()
            .find(|s| s.complete)
            .cloned()
            .ok_or_else(|| TraceGraphError::NoStep {
                name: name.into(),
                what: format!("(it has {})", list()),
            }),
    }
}
/// The job under construction, with what the stages need to know about its ops.
#[derive(Default)]
pub(crate) struct Builder {
    pub local: LocalGraph,
    layer_ids: BTreeMap<String, u32>,
    /// Recorded start of each op (ns, the trace's clock).
    pub recorded: Vec<i64>,
    /// The trace event of each op.
    pub op_event: Vec<Option<usize>>,
    /// CPU event → its enclosing event (innermost first), for the events of the window.
    pub parent: std::collections::HashMap<usize, usize>,
}

impl Builder {
    pub fn layer(&mut self, name: &str) -> u32 {
        if let Some(&l) = self.layer_ids.get(name) {
            return l;
        }
        let id = self.local.layers.len() as u32;
        self.local.layers.push(name.to_string());
        self.layer_ids.insert(name.to_string(), id);
        id
    }
    pub fn push(&mut self, spec: OpSpec, at: i64) -> OpId {
        self.local.ops.push(LocalOp { spec, work: None });
        self.recorded.push(at);
        self.op_event.push(None);
        (self.local.ops.len() - 1) as OpId
    }
    pub fn set_event(&mut self, op: OpId, ev: usize) {
        self.op_event[op as usize] = Some(ev);
    }
}

pub(crate) fn ns(v: i64) -> u64 {
    v.max(0) as u64
}

/// Build the job of one iteration (`step`: see [`pick_step`]) of a single-rank trace: the
/// stages of the module docs, then the work of every kernel ([`super::work`]), the memory
/// ([`super::memory`]), the facts ([`super::facts`]) and, when the rank's peers are absent, the
/// collectives' waits for them ([`super::peers`]).
pub fn build_job(
    trace: &KinetoTrace,
    name: &str,
    step: Option<u64>,
) -> Result<TraceJob, TraceGraphError> {
    build(trace, name, step, Peers::Absent)
}

/// Whether the ranks a step's collectives wait for are in the same graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peers {
    /// One rank alone: its collectives wait for peers as recorded.
    Absent,
    /// Every rank's trace is built into one graph (the `multi` module): the barrier models them.
    Present,
}

pub(crate) fn build(
    trace: &KinetoTrace,
    name: &str,
    step: Option<u64>,
    peers: Peers,
) -> Result<TraceJob, TraceGraphError> {
    trace
        .replayable()
        .map_err(|reason| TraceGraphError::NotReplayable {
            name: name.into(),
            reason,
        })?;
    let win = pick_step(trace, name, step)?;
    let (lo, hi) = (win.start_ns, win.end_ns);
    let ev = &trace.events;
    let mut b = Builder::default();
    b.local.devices.push(crate::graph::DeviceKind::Virtual);

    let mut threads = threads::collect(ev, &win);
    let mut gpu = streams::collect(ev, &win, &threads);
    let mut carry = streams::carry_in(ev, &win, &gpu);
    let mut cpu = threads::build(&mut b, ev, &mut threads, &win, &gpu.gpu_by_corr);
    let gops = streams::build(&mut b, ev, &win, &mut gpu, &mut carry, &cpu);
    let stalled = launches::stall_edges(&mut b, ev, &cpu, &gops);
    if stalled > 0 {
        tracing::info!(
            file = name,
            stalled,
            usual_launch_us = cpu.usual_launch as f64 / 1e3,
            "launches blocked on a full launch queue: each waits for the GPU op that freed its slot"
        );
    }
    waits::blocking(&mut b, ev, &win, &gpu, &cpu, &gops);
    let mut warnings = streams::oddities(ev, &gpu);
    warnings.extend(waits::stream_waits(&mut b, ev, &win, &gpu, &gops, name));
    let resumes = crossthread::cross_thread(&mut b, ev, &win, &mut cpu);
    if !resumes.is_empty() {
        tracing::info!(
            file = name,
            bursts = resumes.len(),
            "the step's thread waits for work on another thread (the backward on autograd's \
             thread): linked by edges"
        );
    }

    if !b
        .local
        .ops
        .iter()
        .any(|o| o.spec.kind == OpKind::Compute || o.spec.kind == OpKind::Collective)
    {
        return Err(TraceGraphError::Invalid {
            name: name.into(),
            message: format!("{} has no GPU work", win.label),
        });
    }
    // The replayed end of any op is at most the sum of every duration and gap (u64 ns): keep it
    // far from overflowing, whatever times the file claims.
    let total = b.local.ops.iter().fold(0u64, |t, o| {
        t.saturating_add(o.spec.dur_ns)
            .saturating_add(o.spec.gap_ns)
    });
    if total > MAX_TOTAL_NS {
        return Err(TraceGraphError::Invalid {
            name: name.into(),
            message: format!(
                "the durations in {} add up to {:.3e} s, more than {:.0e} s: the recorded times \
                 cannot be real",
                win.label,
                total as f64 / 1e9,
                MAX_TOTAL_NS as f64 / 1e9
            ),
        });
    }
    b.local.edges.sort_unstable();
    b.local.edges.dedup();
    let (gpu_spec, mut facts) = super::facts::device(trace);
    let Builder {
        mut local,
        recorded,
        op_event,
        parent,
        ..
    } = b;
    let recorded_syncs =
        super::calls::label(trace, &mut local, &op_event, &parent, &gops.collectives);
    let mut job = one_worker_job(local, gpu_spec, name);
    job.math = job.framework.default_math(&job.gpu);
    job.local_dfg().map_err(|e| TraceGraphError::Invalid {
        name: name.into(),
        message: format!("the dependency graph of {} is invalid: {e}", win.label),
    })?;
    let step_cx = super::work::StepContext::new(ev, &threads, &parent);
    let (work_source, precision) =
        super::work::attach(&mut job, ev, &op_event, &gpu.launch_of, &step_cx);
    facts.precision = precision;
    facts.work = super::work::coverage(&job, &work_source);
    super::facts::describe(&mut facts, trace, &win, &job, &gops.collectives, &step_cx);
    // FSDP2's hooks, found once: what the step's sharding is, and which ops gather or free.
    let hooks = super::fsdp::hook_events(trace, &win);
    facts.sharding = super::fsdp::describe(trace, &hooks, &gops.collectives);
    if let Some(s) = facts.sharding.as_mut() {
        super::fsdp::label(
            trace,
            &hooks,
            job.local_mut(),
            &op_event,
            &parent,
            &gops.collectives,
            s,
        );
    }
    facts.sync_link = server_sync_link(&job.gpu.arch, facts.world_size.unwrap_or(1));
    facts.recorded_syncs = recorded_syncs;
    facts.measured_step_ns = Some(win.measured_ns());
    if let Some(b) = facts.batch {
        job.meta.batch = b;
    }
    let recorded_start_ns: Vec<i64> = recorded.into_iter().map(|t| t - lo).collect();
    facts.memory = super::memory::attach(
        &mut job,
        trace,
        &win,
        &cpu.timeline,
        &step_cx,
        facts.optimizer.as_deref(),
    );
    job.meta.trace = Some(Box::new(facts));
    let mut built = TraceJob {
        job,
        window: win,
        recorded_start_ns,
        op_event,
        work_source,
        step_end: cpu.step_end,
        collectives: gops.collectives,
        peer_waits: 0,
        warnings: std::mem::take(&mut warnings),
    };
    let _ = hi;
    let resumes: Vec<(OpId, i64)> = resumes.into_iter().map(|(op, t)| (op, t - lo)).collect();
    built.peer_waits = super::peers::calibrate(&mut built, peers == Peers::Absent, &resumes);
    Ok(built)
}

/// Where a recorded step's re-bucketed all-reduces are priced without `--cluster`: the GPU's
/// own server link over the recorded world size (`None` for an architecture without one).
pub(crate) fn server_sync_link(arch: &str, ranks: u32) -> Option<crate::graph::job::SyncLink> {
    let name = crate::cost::config::server_link_network(arch)?;
    let n = crate::cost::config::load_network(name).ok()?;
    Some(crate::graph::job::SyncLink {
        name: name.to_string(),
        link: AlphaBeta {
            alpha_ns: n.alpha_us * 1e3,
            bytes_per_ns: n.bytes_per_ns(),
        },
        ranks,
    })
}

/// The one-worker job of a recorded step: no gradient syncs to plan (the trace's collectives are
/// ops of the graph), a placeholder network (nothing is re-costed through it), `meta.source` =
/// `trace`. Shared by the Kineto and Chakra importers.
pub(crate) fn one_worker_job(
    local: LocalGraph,
    gpu: crate::cost::config::GpuSpec,
    name: &str,
) -> Job {
    let link = AlphaBeta {
        alpha_ns: 5_000.0,
        bytes_per_ns: 100.0,
    };
    // The recorded peak already holds cuBLAS's workspace; the context is the GPU's.
    let memory = crate::cost::memory::MemorySpec {
        workspace_bytes: 0,
        ..crate::cost::memory::MemorySpec::default().for_arch(&gpu.arch)
    };
    Job {
        local: local.into(),
        syncs: Vec::new(),
        comm: CommSpec {
            scheme: SyncScheme::Ring,
            gpus_per_node: 1,
            nodes: 1,
            ps_servers: 1,
            cost: CommCost {
                intra: link,
                inter: link,
                aggregate_bytes_per_ns: 100.0,
            },
        },
        workers: 1,
        symmetric: false,
        gpu,
        dtype: Dtype::Fp32,
        math: Math::FP32,
        framework: Framework::default(),
        exec: Exec::Eager,
        host: std::sync::Arc::new(crate::cost::host::HostSpec::builtin(Exec::Eager)),
        memory: std::sync::Arc::new(memory),
        meta: JobMeta {
            model: name.to_string(),
            batch: 0,
            cluster: "trace".into(),
            source: "trace".into(),
            trace: None,
            optimizer: None,
            ..JobMeta::default()
        },
    }
}

/// One step replayed: what `trainplan replay --trace FILE --step N` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReplay {
    pub window: StepWindow,
    pub measured_ns: u64,
    /// Replayed end of the step on the step's thread.
    pub predicted_ns: u64,
    /// When the step's GPU work ends (ns from the step's start): recorded, and replayed. The
    /// step's CPU side keeps its recorded durations and gaps; this is where the graph's
    /// dependencies alone decide the timing.
    pub gpu_end_recorded_ns: u64,
    pub gpu_end_predicted_ns: u64,
    pub ops: usize,
}

/// Build and replay one step of a single-rank trace.
pub fn replay_step(
    trace: &KinetoTrace,
    name: &str,
    step: Option<u64>,
) -> Result<StepReplay, TraceGraphError> {
    let built = build_job(trace, name, step)?;
    let g = built.job.expand().map_err(|e| TraceGraphError::Invalid {
        name: name.into(),
        message: e.to_string(),
    })?;
    let r = crate::replay::replay(&g);
    let gpu = |o: &LocalOp| {
        matches!(
            o.spec.kind,
            OpKind::Compute | OpKind::Memcpy | OpKind::Collective
        )
    };
    let ops = &built.job.local.ops;
    let gpu_end_recorded_ns = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| gpu(o))
        .map(|(i, o)| (built.recorded_start_ns[i] + o.spec.dur_ns as i64).max(0) as u64)
        .max()
        .unwrap_or(0);
    let gpu_end_predicted_ns = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| gpu(o))
        .map(|(i, _)| r.end_ns[i])
        .max()
        .unwrap_or(0);
    Ok(StepReplay {
        measured_ns: built.window.measured_ns(),
        predicted_ns: r.end_ns[built.step_end as usize],
        gpu_end_recorded_ns,
        gpu_end_predicted_ns,
        ops: g.op_count(),
        window: built.window,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::{DeviceKind, Phase};
    use crate::replay::replay;
    use std::path::{Path, PathBuf};

    pub(crate) fn parse(json: &str) -> KinetoTrace {
        crate::trace::parse_kineto(json.as_bytes(), "t.json").unwrap()
    }

    /// A complete CPU event (µs).
    pub(crate) fn x(
        cat: &str,
        name: &str,
        tid: u32,
        ts: u64,
        dur: u64,
        corr: Option<u32>,
    ) -> String {
        let args = corr.map_or(String::new(), |c| {
            format!(r#","args":{{"correlation":{c}}}"#)
        });
        format!(
            r#"{{"ph":"X","cat":"{cat}","name":"{name}","pid":100,"tid":{tid},"ts":{ts},"dur":{dur}{args}}}"#
        )
    }

    /// A kernel on `stream` with its ac2g flow pair.
    pub(crate) fn kernel(
        name: &str,
        stream: u32,
        ts: u64,
        dur: u64,
        corr: u32,
        launch_ts: u64,
    ) -> String {
        format!(
            r#"{{"ph":"X","cat":"kernel","name":"{name}","pid":0,"tid":{stream},"ts":{ts},"dur":{dur},"args":{{"correlation":{corr},"stream":{stream}}}}},
{{"ph":"s","cat":"ac2g","name":"ac2g","id":{corr},"pid":100,"tid":1,"ts":{launch_ts}}},
{{"ph":"f","cat":"ac2g","name":"ac2g","id":{corr},"pid":0,"tid":{stream},"ts":{ts},"bp":"e"}}"#
        )
    }

    pub(crate) fn doc(events: &[String]) -> String {
        format!(r#"{{"traceEvents":[{}]}}"#, events.join(",\n"))
    }

    /// Step 0–100 µs: aten::mm [10,40] with a launch [20,30] of a kernel [25,75], then
    /// cudaDeviceSynchronize [50,80].
    pub(crate) fn sync_trace() -> String {
        doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("cpu_op", "aten::mm", 1, 10, 30, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 20, 10, Some(1)),
            kernel("gemm", 7, 25, 50, 1, 20),
            x("cuda_runtime", "cudaDeviceSynchronize", 1, 50, 30, Some(2)),
        ])
    }

    fn replay_step(t: &TraceJob) -> (u64, u64) {
        let g = t.job.expand().unwrap();
        let r = replay(&g);
        (r.end_ns[t.step_end as usize], r.iteration_ns)
    }

    #[test]
    fn launch_split_gap_and_device_sync() {
        let t = build_job(&parse(&sync_trace()), "t.json", None).unwrap();
        assert_eq!(t.window.label, "ProfilerStep#1");
        assert_eq!(t.window.measured_ns(), 100_000);
        let l = &t.job.local;
        // Thread: gap 10, mm [10,20], launch pre [20,25], launch rest [25,30], mm [30,40] + gap
        // 10, sync issue (0), sync wait (80 − 75 = 5) + gap 20, step end. GPU: the kernel.
        let durs: Vec<(OpKind, u64, u64)> = l
            .ops
            .iter()
            .map(|o| (o.spec.kind, o.spec.dur_ns / 1000, o.spec.gap_ns / 1000))
            .collect();
        assert_eq!(
            durs,
            vec![
                (OpKind::CpuOther, 10, 0),
                (OpKind::Gap, 10, 0),
                (OpKind::Launch, 5, 0),
                (OpKind::Launch, 5, 0),
                (OpKind::CpuOther, 10, 10),
                (OpKind::CpuOther, 0, 0),
                (OpKind::CpuOther, 5, 20),
                (OpKind::Gap, 0, 0),
                (OpKind::Compute, 50, 0),
            ]
        );
        assert!(l.edges.contains(&(2, 8)), "launch → kernel");
        assert!(l.edges.contains(&(8, 6)), "kernel → sync wait");
        assert_eq!(l.op_name(8), "aten::mm FW");
        assert_eq!(replay_step(&t), (100_000, 100_000));
        // What-if: the kernel twice as long (25 → 125 µs): the sync waits until 125, returns at
        // 130, and the thread's 20 µs of recorded idle follows: the step ends at 150 µs.
        let mut e = t.job.edit();
        e.scale(&[8], 2.0).unwrap();
        let job = e.finish().unwrap();
        let r = replay(&job.expand().unwrap());
        assert_eq!(r.end_ns[t.step_end as usize], 150_000);
    }

    #[test]
    fn blocking_copy_and_pageable_async_copy_wait_for_their_copy() {
        // cudaMemcpyAsync [10,50] whose copy [15,45] ends inside it (pageable memory): issue 5,
        // wait = 50 − 45 = 5 after the copy.
        let json = doc(&[
            x("user_annotation", "ProfilerStep#3", 1, 0, 60, None),
            x("cuda_runtime", "cudaMemcpyAsync", 1, 10, 40, Some(1)),
            r#"{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD","pid":0,"tid":7,"ts":15,"dur":30,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":100,"tid":1,"ts":10},
{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":7,"ts":15,"bp":"e"}"#
                .to_string(),
            x("cuda_runtime", "cudaLaunchKernel", 1, 52, 3, Some(2)),
            kernel("k", 7, 53, 2, 2, 52),
        ]);
        let t = build_job(&parse(&json), "t.json", None).unwrap();
        let l = &t.job.local;
        let copy = l
            .ops
            .iter()
            .position(|o| o.spec.kind == OpKind::Memcpy)
            .unwrap() as OpId;
        // ops: issue (Launch, 5), leading gap 10, wait (5, gap 2), launch pre 1, launch rest 2
        // (gap 5), end marker, copy, kernel.
        assert_eq!(l.ops[0].spec.kind, OpKind::Launch);
        assert_eq!(l.ops[0].spec.dur_ns, 5_000);
        assert_eq!(
            (l.ops[1].spec.kind, l.ops[1].spec.dur_ns),
            (OpKind::Gap, 10_000)
        );
        assert_eq!(l.ops[2].spec.dur_ns, 5_000);
        assert!(l.edges.contains(&(0, copy)) && l.edges.contains(&(copy, 2)));
        assert_eq!(replay_step(&t).0, 60_000);
        // The copy 3× as long (15 → 105): the call returns at 110, the rest shifts by 60 µs.
        let mut e = t.job.edit();
        e.scale(&[copy], 3.0).unwrap();
        let r = replay(&e.finish().unwrap().expand().unwrap());
        assert_eq!(r.end_ns[t.step_end as usize], 120_000);
    }

    #[test]
    fn stream_wait_event_links_streams() {
        // Kernel A on stream 7 [10,60]; record on 7 at 20; stream 20 waits at 22; kernel B on
        // stream 20 launched at 24, ran at 60 (after A).
        let json = doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 5, 5, Some(1)),
            kernel("a", 7, 10, 50, 1, 5),
            x("cuda_runtime", "cudaEventRecord", 1, 20, 1, Some(2)),
            x("cuda_runtime", "cudaStreamWaitEvent", 1, 22, 1, Some(3)),
            r#"{"ph":"X","cat":"cuda_sync","name":"Wait Event","pid":0,"tid":20,"ts":23,"dur":0,"args":{"cuda_sync_kind":"Wait Event","wait_on_stream":7,"wait_on_cuda_event_record_corr_id":2,"stream":20,"correlation":3}}"#.to_string(),
            x("cuda_runtime", "cudaLaunchKernel", 1, 24, 4, Some(4)),
            kernel("b", 20, 60, 10, 4, 24),
        ]);
        let t = build_job(&parse(&json), "t.json", None).unwrap();
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        let l = &t.job.local;
        let find = |kind: OpKind, dev_nth: usize| -> OpId {
            l.ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.spec.kind == kind)
                .nth(dev_nth)
                .unwrap()
                .0 as OpId
        };
        let (a, b) = (find(OpKind::Compute, 0), find(OpKind::Compute, 1));
        assert!(l.edges.contains(&(a, b)));
        let g = t.job.expand().unwrap();
        let r = replay(&g);
        assert_eq!(
            (r.start_ns[b as usize], r.end_ns[b as usize]),
            (60_000, 70_000)
        );
    }

    #[test]
    fn iterations_from_optimizer_steps_and_incomplete_steps() {
        let json = doc(&[
            x("user_annotation", "Optimizer.step#SGD.step", 1, 0, 10, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 20, 5, Some(1)),
            kernel("k1", 7, 22, 10, 1, 20),
            x(
                "user_annotation",
                "Optimizer.step#SGD.step",
                1,
                40,
                10,
                None,
            ),
            x("cuda_runtime", "cudaLaunchKernel", 1, 60, 5, Some(2)),
            kernel("k2", 7, 62, 10, 2, 60),
            x(
                "user_annotation",
                "Optimizer.step#SGD.step",
                1,
                90,
                20,
                None,
            ),
            // A cut-off last iteration: a launch whose kernel is not in the file.
            x("cuda_runtime", "cudaLaunchKernel", 1, 120, 5, Some(3)),
            x(
                "user_annotation",
                "Optimizer.step#SGD.step",
                1,
                130,
                5,
                None,
            ),
        ]);
        let tr = parse(&json);
        let s = steps(&tr);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.iter()
                .map(|w| (w.start_ns, w.end_ns, w.complete))
                .collect::<Vec<_>>(),
            vec![
                (10_000, 50_000, true),
                (50_000, 110_000, true),
                (110_000, 135_000, false)
            ]
        );
        let t = build_job(&tr, "t.json", None).unwrap();
        assert_eq!((t.window.number, t.window.measured_ns()), (2, 60_000));
        assert_eq!(replay_step(&t).0, 60_000);
        let t = build_job(&tr, "t.json", Some(1)).unwrap();
        assert_eq!(t.window.measured_ns(), 40_000);
        let e = build_job(&tr, "t.json", Some(3)).unwrap_err().to_string();
        assert!(
            e.contains("no complete iteration 3") && e.contains("3 (incomplete)"),
            "{e}"
        );
        let none = doc(&[
            x("cuda_runtime", "cudaLaunchKernel", 1, 20, 5, Some(1)),
            kernel("k", 7, 22, 1, 1, 20),
        ]);
        let e = build_job(&parse(&none), "t.json", None).unwrap_err();
        assert!(matches!(e, TraceGraphError::NoIterations { .. }));
    }

    #[test]
    fn nccl_kernels_are_collectives_on_the_comm_stream() {
        let json = doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 50, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 5, 5, Some(1)),
            kernel("gemm", 7, 12, 10, 1, 5),
            x("cuda_runtime", "cudaLaunchKernel", 1, 12, 5, Some(2)),
            kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 20, 20, 2, 12),
        ]);
        let t = build_job(&parse(&json), "t.json", None).unwrap();
        let l = &t.job.local;
        let c = l
            .ops
            .iter()
            .find(|o| o.spec.kind == OpKind::Collective)
            .unwrap();
        assert_eq!(c.spec.phase, Phase::Comm);
        // Its peers are absent (one rank): it ends when it did, 40 µs, though the replay can
        // start it at 17 (its launch's end): 23 µs (see `trace::peers`).
        assert_eq!(c.spec.dur_ns, 23_000);
        assert_eq!(t.peer_waits, 1);
        assert_eq!(
            l.devices[c.spec.device as usize],
            DeviceKind::CommStream { worker: 0 }
        );
        // Makespan: the collective ends at 40 µs, the step at 50.
        assert_eq!(replay_step(&t), (50_000, 50_000));
    }

    fn traces_dir() -> Option<PathBuf> {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/pytorch-kineto");
        if d.is_dir() {
            Some(d)
        } else {
            crate::skip_note!(
                "skipping: ../shared/traces is absent (the real-trace tests need it)"
            );
            None
        }
    }

    /// Every replayable real trace with iteration markers: measured against replayed step, and
    /// the replayed end of the step's GPU work against the recorded one.
    #[test]
    fn real_traces_replay_error() {
        let Some(dir) = traces_dir() else { return };
        // (file, step, |error| bound on the step %, |error| bound on the GPU end %)
        let expect: &[(&str, u64, f64, f64)] = &[
            ("linear_rtx2080ti_no_profilerstep.json.gz", 39, 0.01, 1.0),
            (
                "resnet18like_rtx2080ti_no_profilerstep.json.gz",
                29,
                0.01,
                1.0,
            ),
            ("resnet50_ddp_a100_rank0of2.json.gz", 6, 0.01, 1.0),
            ("resnet50_v100_1gpu_ns_timestamps.json.gz", 105, 0.01, 1.0),
            ("toy_cuda_event_sync.json.gz", 100, 0.1, 1.0),
            ("toy_train_mi250_rocm.json.gz", 1, 0.01, 1.0),
        ];
        println!(
            "{:<48} {:>6} {:>11} {:>11} {:>8} {:>11} {:>11} {:>8}",
            "trace",
            "step",
            "measured",
            "predicted",
            "err %",
            "GPU end rec",
            "GPU end rep",
            "err %"
        );
        for &(n, step, bound, gpu_bound) in expect {
            let tr = crate::trace::read_kineto(&dir.join(n)).unwrap();
            let t = build_job(&tr, n, None).unwrap();
            let (p, makespan) = replay_step(&t);
            let m = t.window.measured_ns();
            let err = 100.0 * (p as f64 / m as f64 - 1.0);
            // Recorded end of the step's GPU work, from the window's start.
            let rec_gpu = t
                .job
                .local
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| {
                    matches!(
                        o.spec.kind,
                        OpKind::Compute | OpKind::Memcpy | OpKind::Collective
                    )
                })
                .map(|(i, o)| t.recorded_start_ns[i] + o.spec.dur_ns as i64)
                .max()
                .unwrap()
                .max(m as i64);
            let gpu_err = 100.0 * (makespan as f64 / rec_gpu as f64 - 1.0);
            println!(
                "{:<48} {:>6} {:>11.3} {:>11.3} {:>8.3} {:>11.3} {:>11.3} {:>8.3}",
                n,
                t.window.number,
                m as f64 / 1e6,
                p as f64 / 1e6,
                err,
                rec_gpu as f64 / 1e6,
                makespan as f64 / 1e6,
                gpu_err
            );
            assert_eq!(t.window.number, step, "{n}");
            assert!(err.abs() <= bound, "{n}: step error {err} %");
            assert!(gpu_err.abs() <= gpu_bound, "{n}: GPU end error {gpu_err} %");
        }
    }

    #[test]
    fn real_traces_that_cannot_be_replayed() {
        let Some(dir) = traces_dir() else { return };
        for r in [0, 1] {
            let n = format!("sampled_events_rank{r}of128_NOT_REPLAYABLE.json.gz");
            let tr = crate::trace::read_kineto(&dir.join(&n)).unwrap();
            let e = build_job(&tr, &n, None).unwrap_err().to_string();
            assert!(e.contains(&n) && e.contains("sampled"), "{e}");
        }
        for n in [
            "alexnet_a100_cuda_sync.json.gz",
            "toy_cuda_event_sync_multi_stream.json.gz",
        ] {
            let tr = crate::trace::read_kineto(&dir.join(n)).unwrap();
            let e = build_job(&tr, n, None).unwrap_err();
            assert!(matches!(e, TraceGraphError::NoIterations { .. }), "{e}");
        }
    }

    /// Step 1 is 100–300 µs. Kernel `prev`, launched in step 0, runs 60–250 (carried in). Three
    /// quick launches (5 µs) queue k2–k4 behind it; the fourth launch, 140–252, was blocked on the
    /// full queue until `prev` ended; a device synchronize 260–291 waits for k5 (280–290).
    pub(crate) fn stall_trace() -> String {
        doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 100, 200, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 50, 5, Some(1)),
            kernel("prev", 7, 60, 190, 1, 50),
            x("cuda_runtime", "cudaLaunchKernel", 1, 110, 5, Some(2)),
            kernel("k2", 7, 250, 10, 2, 110),
            x("cuda_runtime", "cudaLaunchKernel", 1, 120, 5, Some(3)),
            kernel("k3", 7, 260, 10, 3, 120),
            x("cuda_runtime", "cudaLaunchKernel", 1, 130, 5, Some(4)),
            kernel("k4", 7, 270, 10, 4, 130),
            x("cuda_runtime", "cudaLaunchKernel", 1, 140, 112, Some(5)),
            kernel("k5", 7, 280, 10, 5, 140),
            x("cuda_runtime", "cudaDeviceSynchronize", 1, 260, 31, Some(6)),
        ])
    }

    #[test]
    fn stalled_launch_waits_for_the_carried_in_kernel() {
        let tr = parse(&stall_trace());
        let mut t = build_job(&tr, "stall", Some(1)).unwrap();
        let g = t.job.expand().unwrap();
        let r = replay(&g);
        // As recorded: exact.
        assert_eq!(r.end_ns[t.step_end as usize], 200_000);
        // The carried-in kernel is an op of its own (its part inside the window, 100–250) …
        let ops = &t.job.local.ops;
        let prev = (0..ops.len())
            .find(|&i| ops[i].spec.kind == OpKind::Compute && t.recorded_start_ns[i] == 0)
            .expect("carried-in op");
        assert_eq!(ops[prev].spec.dur_ns, 150_000);
        // … and the stalled launch waits for it, keeping 2 µs after its end.
        let launch = (0..ops.len())
            .find(|&i| ops[i].spec.kind == OpKind::Launch && t.recorded_start_ns[i] == 40_000)
            .expect("the stalled launch");
        assert_eq!(ops[launch].spec.dur_ns, 2_000);
        assert!(t.job.local.edges.contains(&(prev as OpId, launch as OpId)));
        // What if the GPU were twice as fast on `prev`: it ends at 75 µs; the launch returns at 77
        // and its gap (8 µs) brings the synchronize to 85; k2–k4 run 75–105, k5 105–115; the
        // synchronize returns 1 µs after k5 and the step ends 9 µs later: 125 µs instead of 200.
        t.job.local_mut().ops[prev].spec.dur_ns = 75_000;
        let g = t.job.expand().unwrap();
        let r = replay(&g);
        assert_eq!(r.end_ns[t.step_end as usize], 125_000);
    }

    /// Step 0–100 µs: k1, k2 on stream 7, then a cudaStreamWaitEvent (no cuda_sync record) and k3
    /// on stream 24, which starts `k3_ts` µs in.
    pub(crate) fn wait_trace(k3_ts: u64) -> String {
        doc(&[
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 10, 5, Some(1)),
            kernel("k1", 7, 16, 20, 1, 10),
            x("cuda_runtime", "cudaLaunchKernel", 1, 20, 5, Some(2)),
            kernel("k2", 7, 36, 24, 2, 20),
            x("cuda_runtime", "cudaStreamWaitEvent", 1, 30, 2, Some(3)),
            x("cuda_runtime", "cudaLaunchKernel", 1, 35, 5, Some(4)),
            kernel("k3", 24, k3_ts, 10, 4, 35),
        ])
    }

    #[test]
    fn stream_waits_without_records_are_inferred_from_launch_order() {
        let t = build_job(&parse(&wait_trace(61)), "wait", Some(1)).unwrap();
        let ops = &t.job.local.ops;
        let at = |us: i64| {
            (0..ops.len())
                .find(|&i| {
                    ops[i].spec.kind == OpKind::Compute && t.recorded_start_ns[i] == us * 1000
                })
                .unwrap() as OpId
        };
        let (k2, k3) = (at(36), at(61));
        assert!(t.job.local.edges.contains(&(k2, k3)), "k2 → k3 inferred");
        assert!(
            t.warnings
                .iter()
                .all(|w| !w.contains("cudaStreamWaitEvent"))
        );
        // The edge holds in a what-if: k2 twice as long pushes k3 to k2's end (k1 runs 15–35 from
        // its launch's return, k2 35–83).
        let mut j = t.job.clone();
        j.local_mut().ops[k2 as usize].spec.dur_ns = 48_000;
        let r = replay(&j.expand().unwrap());
        assert_eq!(r.start_ns[k3 as usize], 83_000);
        // k3 recorded before k2 ended: the guess contradicts the record, so no edge, a warning.
        let t = build_job(&parse(&wait_trace(45)), "wait", Some(1)).unwrap();
        assert!(
            t.warnings
                .iter()
                .any(|w| w.contains("1 cudaStreamWaitEvent")),
            "{:?}",
            t.warnings
        );
        let r = replay(&t.job.expand().unwrap());
        assert_eq!(r.end_ns[t.step_end as usize], 100_000);
    }
}
