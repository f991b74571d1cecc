//! The three memory peaks in reports: `--json` fields, the human line and the over-capacity
//! warning, shared by `replay`, `whatif` and `plan` (and `show` through the plan's points).

use serde_json::{Value, json};

use crate::cost::memory::MemoryPeaks;
use crate::graph::job::Job;

use super::output::gb;

/// Whether the job needs more than the GPU's memory: its device-used peak plus what the
/// framework keeps out of its allocator's pool ([`MemoryPeaks::needed`]).
pub fn over_capacity(p: &MemoryPeaks, job: &Job) -> bool {
    p.needed() > job.gpu.memory_bytes()
}

/// `+ 37.2 GB jax keeps out of its allocator's pool` when the framework caps its pool.
fn kept_out(p: &MemoryPeaks, job: &Job) -> Option<String> {
    (p.breakdown.kept_out_bytes > 0).then(|| {
        format!(
            "+ {} {} keeps out of its allocator's pool",
            gb(p.breakdown.kept_out_bytes),
            job.memory.name
        )
    })
}

/// `peak_memory_bytes` (allocated), `reserved_peak_bytes`, `device_used_bytes` and the
/// breakdown, with `prefix` before each name (`baseline_`).
pub fn fields(p: &MemoryPeaks, prefix: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(format!("{prefix}peak_memory_bytes"), json!(p.allocated));
    m.insert(format!("{prefix}reserved_peak_bytes"), json!(p.reserved));
    m.insert(format!("{prefix}device_used_bytes"), json!(p.device_used));
    m.insert(format!("{prefix}memory_breakdown"), json!(p.breakdown));
    m
}

/// Merge `fields` into a JSON object.
pub fn extend(v: &mut Value, fields: serde_json::Map<String, Value>) {
    if let Some(o) = v.as_object_mut() {
        o.extend(fields);
    }
}

/// `allocated 12.3 GB · reserved 13.1 GB · device used 14.6 GB of 34.4 GB`.
pub fn summary(p: &MemoryPeaks, job: &Job) -> String {
    format!(
        "allocated {} · reserved {} · device used {} of {} on a {}{}{}",
        gb(p.allocated),
        gb(p.reserved),
        gb(p.device_used),
        gb(job.gpu.memory_bytes()),
        job.gpu.model,
        kept_out(p, job).map_or(String::new(), |k| format!(" ({k})")),
        if over_capacity(p, job) {
            "  OVER CAPACITY: this job would not fit"
        } else {
            ""
        }
    )
}

/// The warning on stderr when a job does not fit.
pub fn warn_if_over(p: &MemoryPeaks, job: &Job) {
    if over_capacity(p, job) {
        tracing::warn!(
            "predicted device memory {} (allocated {}, reserved {}{}) is above the {} of a {}: the job would not fit",
            gb(p.device_used),
            gb(p.allocated),
            gb(p.reserved),
            kept_out(p, job).map_or(String::new(), |k| format!("; {k}")),
            gb(job.gpu.memory_bytes()),
            job.gpu.model
        );
    }
}
