//! What `replay`, `whatif` and `plan` say about a recorded step beyond its times: the job as
//! the trace describes it ([`TraceFacts`]), its device memory, the steady-state period beside the
//! makespan, and whether the step is host-bound — with the numbers a user needs to see why a
//! pass that saves GPU time does not move the step.

use serde_json::{Value, json};

use super::output::gb;
use crate::graph::job::{Job, TraceFacts};
use crate::passes::Evaluated;
use crate::replay::breakdown::{PathShare, gpu_busy_ns, path_share};

/// The facts of a trace job.
pub fn facts(job: &Job) -> Option<&TraceFacts> {
    job.meta.trace.as_deref()
}

/// `job:` line of a report.
pub fn facts_line(f: &TraceFacts) -> String {
    format!("job: {}", crate::trace::facts::summary(f))
}

/// The facts as JSON (`trace_facts`).
pub fn facts_json(job: &Job) -> Value {
    facts(job).map_or(Value::Null, |f| {
        serde_json::to_value(f).unwrap_or(Value::Null)
    })
}

/// Whether the trace job has memory figures (events or a shapes estimate).
pub fn has_memory(job: &Job) -> bool {
    facts(job).is_none_or(|f| f.memory.is_some())
}

/// The memory line(s) of a report: measured (or estimated) peak, and the predicted one after.
pub fn memory_lines(job: &Job, before: u64, after: Option<u64>) -> Vec<String> {
    let Some(f) = facts(job) else {
        return Vec::new();
    };
    let Some(m) = &f.memory else {
        return vec![
            "peak memory      not in the trace (record with profile_memory=True, or \
             record_shapes=True for an estimate)"
                .into(),
        ];
    };
    let what = if m.events > 0 {
        "measured"
    } else {
        "estimated"
    };
    let mut v = vec![match after {
        Some(a) => format!(
            "{:<16} {:>12} {:>12} {:>+8.1} %   {what} ({}) → predicted",
            "peak memory",
            gb(before),
            gb(a),
            100.0 * (a as f64 / before.max(1) as f64 - 1.0),
            m.source
        ),
        None => format!(
            "peak memory      {:>9}      {what}: {}",
            gb(before),
            m.source
        ),
    }];
    if m.events > 0 && !m.absolute {
        v.push(
            "                 (the events carry only Bytes: memory allocated before the \
             profiler started — weights, optimizer state — is not in them)"
                .into(),
        );
    }
    v
}

/// How the step's time divides on its critical path, and its GPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub share: PathShare,
    pub gpu_busy_ns: u64,
}

impl Bound {
    pub fn of(e: &Evaluated) -> Bound {
        Bound {
            share: path_share(&e.graph, &e.replay, &e.critical),
            gpu_busy_ns: gpu_busy_ns(&e.graph, 0),
        }
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// One line on the critical path's split between host and GPU.
pub fn path_line(b: &Bound) -> String {
    let s = &b.share;
    let t = s.total_ns().max(1) as f64;
    format!(
        "critical path    {}: host {} ({:.0} %), GPU {} ({:.0} %), \
         communication {}{}",
        super::output::dur(s.total_ns(), 1),
        super::output::dur(s.host_ns, 1),
        100.0 * s.host_ns as f64 / t,
        super::output::dur(s.gpu_ns, 1),
        100.0 * s.gpu_ns as f64 / t,
        super::output::dur(s.comm_ns, 1),
        if s.host_bound() {
            " — host-bound"
        } else {
            ""
        }
    )
}

/// What a what-if did to the GPU and why the step moved as it did (trace inputs).
pub fn explain(base: &Bound, after: &Bound, period: (u64, u64)) -> Vec<String> {
    let saved = base.gpu_busy_ns as i64 - after.gpu_busy_ns as i64;
    let moved = period.1 as i64 - period.0 as i64;
    let mut v = vec![format!(
        "GPU time         {} → {} ({}); step period {}",
        super::output::dur(base.gpu_busy_ns, 1),
        super::output::dur(after.gpu_busy_ns, 1),
        super::output::dur_ms_signed(-(saved as f64) / 1e6, 1),
        super::output::dur_ms_signed(moved as f64 / 1e6, 1)
    )];
    if !base.share.host_bound() && after.share.host_bound() {
        v.push(format!(
            "after the pass the step is host-bound: {:.0} % of its critical path is host time — \
             further GPU savings will not show (try --pass cuda-graphs)",
            100.0 * after.share.host_ns as f64 / after.share.total_ns().max(1) as f64
        ));
    }
    if base.share.host_bound() {
        let lost = saved.max(0) - (-moved).max(0);
        v.push(format!(
            "the step is host-bound: {:.0} % of its critical path ({} of {}) is host time \
             (kernel launches, framework work, idle Python between operators){}",
            100.0 * base.share.host_ns as f64 / base.share.total_ns().max(1) as f64,
            super::output::dur(base.share.host_ns, 1),
            super::output::dur(base.share.total_ns(), 1),
            if saved > 0 && lost > 0 {
                format!(
                    "; {} of the GPU time saved was off the critical path and does not \
                     shorten the step — cut host time first (try --pass cuda-graphs)",
                    super::output::dur_ms(lost as f64 / 1e6, 1)
                )
            } else {
                String::new()
            }
        ));
    }
    v
}

/// The same as JSON.
pub fn bound_json(base: &Bound, after: Option<&Bound>) -> Value {
    let s = &base.share;
    json!({
        "host_bound": s.host_bound(),
        "critical_path_host_ms": ms(s.host_ns),
        "critical_path_gpu_ms": ms(s.gpu_ns),
        "critical_path_communication_ms": ms(s.comm_ns),
        "gpu_busy_ms": ms(base.gpu_busy_ns),
        "gpu_busy_after_ms": after.map(|a| ms(a.gpu_busy_ns)),
    })
}

/// Why a recorded step's steady period is more than 5 % off the step the trace measured, when
/// it is: which device sets the pace (`by`, [`crate::replay::steady::Steady::by`]).
pub fn period_gap(
    period_ns: u64,
    measured_ns: u64,
    by: Option<crate::graph::DeviceKind>,
) -> Option<String> {
    use crate::graph::DeviceKind;
    let off = 100.0 * (period_ns as f64 / measured_ns.max(1) as f64 - 1.0);
    if off.abs() <= 5.0 {
        return None;
    }
    let why = match by? {
        DeviceKind::GpuStream { .. } | DeviceKind::CommStream { .. } => {
            "a GPU stream's work per step outlasts the host's step (the measured span times the host thread); once its queue fills, the loop runs at the GPU's pace"
        }
        DeviceKind::CpuThread { .. } => {
            "the host thread sets the pace, waiting for GPU work as it queues in steady state rather than as it did in the recorded step"
        }
        _ => return None,
    };
    Some(format!("{off:+.1} % off the measured step: {why}"))
}
