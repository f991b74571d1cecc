//! The one check of a plan's values ([`Plan::check`]), run by every reader of a plan file
//! ([`Plan::from_yaml`]: `show`, `export`) and by the emitters ([`super::emit::emit`]), and on
//! the planner's own plan before it is written: a plan holds only what the planner could have
//! written. A hand-edited or corrupt plan is refused naming the field (`decisions[3].knobs.k`),
//! never exported with a wrapped sum or printed with a negative time.
//!
//! The ranges are the planner's own, not new ones:
//!
//! | field | range | from |
//! |---|---|---|
//! | `workload.ranks` | 1 ..= 65,536 | [`crate::limits::MAX_WORKERS`] |
//! | `workload.batch` | 1 ..= 65,536 (null or 0: a trace that does not say) | [`crate::zoo::MAX_BATCH`] |
//! | `workload.source`, `names` | `zoo` or `trace` | what `plan` writes |
//! | times (`iteration_ms`, `baselines`, `lower_bound_ms`) | positive, finite, ≤ 2^62 ns | [`crate::graph::bounds::MAX_SUM_NS`] |
//! | `effect_ms` | finite, \|x\| ≤ 2^62 ns | the same |
//! | `speedup` | baseline ÷ planned (to the file's rounding); `lower_bound_ms` ≤ planned | how `plan` computes them |
//! | `peak_memory_bytes` | ≤ 64 PiB | [`crate::graph::bounds::MAX_MEMORY_BYTES`] |
//! | decision knobs | the pass's declared knobs and ranges; `amp`'s dtype fp16 / bf16 | `passes::*::knobs()`, [`crate::passes::amp::half_dtype`] |
//! | a `baseline:` decision's knobs | [`crate::search::baselines::knob_specs`] | the baselines' grids |
//! | `partitions` (decision and config) | 1 ..= 1,024 | `tensor-partition`'s `max_k` |
//! | `config.grad_accumulation` | 1 ..= 2^24 (the largest batch), dividing the batch | `grad-accumulation`'s `k` |
//! | `config.dtype` | fp32, fp16, bf16, fp8, fp64 | what `plan` writes |
//! | `config.tensor_bytes`, each group's sum | ≤ 16 TiB (checked addition) | [`crate::graph::bounds::MAX_TENSOR_BYTES`] |
//! | `config.tensor_groups` | no empty group, no tensor twice; partitions keyed by a group's first tensor | the job's syncs |
//! | `config.tensor_parallel` | degree ≥ 2, dividing the ranks | the `tensor-parallel` pass |
//! | `config.context_parallel` | degree ≥ 2, dividing the ranks the tensor-parallel degree leaves | the `context-parallel` pass |
//! | `config.pipeline` | stages ≥ 2, stages × the tensor-parallel degree dividing the ranks; `layers` a multiple of stages × virtual, or lighter first / last stages leaving the middle ones equal shares (1F1B, GPipe); virtual > 1 only `interleaved`; micro-batches dividing the replica's batch (a multiple of the stages when interleaved); no `grad_accumulation` beside it | the `pipeline` pass |
//! | `config.sharding` | stage 1..=3; shard_size ≥ 2 and shard_size × replicas = the data-parallel ranks (ranks ÷ the tensor-parallel degree); prefetch ≤ 64; one byte count per unit, no unit twice, stage 3 has units | the `shard` pass |
//! | `search.budget_s` | finite, ≥ 0 | `--budget` |

use std::collections::BTreeSet;

use super::{FinalConfig, Plan, Point};
use crate::graph::bounds::{MAX_MEMORY_BYTES, MAX_SUM_NS, MAX_TENSOR_BYTES};

/// Largest time a plan may state, ms (2^62 ns, a worker's sum of durations).
pub const MAX_MS: f64 = MAX_SUM_NS as f64 / 1e6;
/// Largest partition number (`tensor-partition`'s `max_k` range).
pub const MAX_K: u32 = 1024;
/// Largest accumulation factor: a micro-step holds at least one sample, so k is at most the
/// largest per-GPU batch (`grad-accumulation`'s `k` is bounded by the batch it divides).
pub const MAX_ACCUMULATION: u32 = crate::zoo::MAX_BATCH;
/// The dtypes `FinalConfig::of` writes.
pub const DTYPES: [&str; 5] = ["fp32", "fp16", "bf16", "fp8", "fp64"];

/// What is wrong with a plan, and where: `field` is the path in the YAML
/// (`decisions[3].knobs.k`, `config.tensor_bytes["fc.weight"]`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Invalid {
    pub field: String,
    pub why: String,
}

fn invalid(field: impl Into<String>, why: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        why: why.into(),
    }
}

/// A map key in a field path: quoted, long names cut (the message names the place, it need not
/// repeat a 10 KB name).
fn key(name: &str) -> String {
    let mut s: String = name.chars().take(60).collect();
    if s.len() < name.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// A positive, finite time no larger than [`MAX_MS`].
fn time(field: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v > 0.0 && v <= MAX_MS {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v} ms is not a time (a positive number of milliseconds up to {MAX_MS:e})"),
        ))
    }
}

/// A finite change of time.
fn effect(field: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v.abs() <= MAX_MS {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v} ms is not a change of time (a finite number of milliseconds)"),
        ))
    }
}

fn memory(field: &str, v: Option<u64>) -> Result<(), Invalid> {
    match v {
        Some(b) if b > MAX_MEMORY_BYTES => Err(invalid(
            field,
            format!(
                "{b} bytes is more than the {MAX_MEMORY_BYTES} (64 PiB) one worker's memory may be"
            ),
        )),
        _ => Ok(()),
    }
}

fn point(field: &str, p: &Point) -> Result<(), Invalid> {
    time(&format!("{field}.iteration_ms"), p.iteration_ms)?;
    memory(&format!("{field}.peak_memory_bytes"), p.peak_memory_bytes)
}

/// At least half the last unit a time was rounded to in the file: [`super::round_ms`] keeps µs
/// for 1 ms and more and 4 significant digits below (older files: µs).
const HALF_UNIT: f64 = 5e-4;

/// `speedup` is `baseline / planned` as far as the file's rounding allows.
fn speedup(baseline: f64, planned: f64, s: f64) -> Result<(), Invalid> {
    let field = "predicted.speedup";
    if !(s.is_finite() && s > 0.0) {
        return Err(invalid(field, format!("{s} is not a speed-up")));
    }
    let (hb, hp) = (HALF_UNIT, HALF_UNIT);
    let lo = (baseline - hb).max(0.0) / (planned + hp);
    let hi = if planned > hp {
        (baseline + hb) / (planned - hp)
    } else {
        f64::INFINITY
    };
    let slack = 5e-4 + 1e-9 * s;
    if s < lo - slack || s > hi + slack {
        return Err(invalid(
            field,
            format!(
                "{s} is not predicted.baseline.iteration_ms / predicted.planned.iteration_ms ({baseline} / {planned} = {:.3})",
                baseline / planned
            ),
        ));
    }
    Ok(())
}

/// The knobs of decision `i` against the ranges of the pass (or baseline) that made it.
fn decision_knobs(
    i: usize,
    d: &crate::search::Decision,
    batch: u32,
    registry: &[Box<dyn crate::passes::Pass>],
) -> Result<(), Invalid> {
    use crate::passes::PassError;
    let given: Vec<(String, String)> = d
        .knobs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let specs = if d.pass.starts_with("baseline:") {
        Some(crate::search::baselines::knob_specs())
    } else {
        registry
            .iter()
            .find(|p| p.name() == d.pass)
            .map(|p| p.knobs())
    };
    // A pass of the user's own pass file: its knobs are not known here and no export reads them.
    let Some(specs) = specs else { return Ok(()) };
    let field = |k: &str| format!("decisions[{i}].knobs.{k}");
    crate::passes::resolve_specs(&d.pass, &specs, &given).map_err(|e| match e {
        PassError::UnknownKnob { knob, known, .. } => invalid(
            field(&knob),
            format!("not a knob of {} (its knobs: {known})", d.pass),
        ),
        PassError::BadKnob {
            knob, value, why, ..
        } => invalid(field(&knob), format!("{value:?}: {why}")),
        other => invalid(format!("decisions[{i}].knobs"), other.to_string()),
    })?;
    match d.pass.as_str() {
        "amp" => {
            if let Some(v) = d.knobs.get("dtype")
                && crate::passes::amp::half_dtype(v).is_none()
            {
                return Err(invalid(
                    field("dtype"),
                    format!("{v:?}: must be fp16 or bf16"),
                ));
            }
        }
        "grad-accumulation" => {
            let k: u32 = d
                .knobs
                .get("k")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(2);
            if batch > 0 && !batch.is_multiple_of(k) {
                return Err(invalid(
                    field("k"),
                    format!(
                        "{k} micro-batches do not divide the batch of {batch} (workload.batch, per data-parallel replica): a micro-step would hold {:.3} samples",
                        f64::from(batch) / k as f64
                    ),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn config(c: &FinalConfig, batch: u32, ranks: u32) -> Result<(), Invalid> {
    if !DTYPES.contains(&c.dtype.as_str()) {
        return Err(invalid(
            "config.dtype",
            format!("{:?}: must be one of {}", c.dtype, DTYPES.join(", ")),
        ));
    }
    let dp_ranks = match &c.tensor_parallel {
        Some(tp) => tensor_parallel(tp, ranks)?,
        None => ranks,
    };
    let cp = match &c.context_parallel {
        Some(cp) => context_parallel(cp, dp_ranks)?,
        None => 1,
    };
    // Accumulation splits what one data-parallel replica trains (a tensor- and
    // context-parallel group's batch; all its stages', with a pipeline).
    let batch = if batch > 0 {
        super::replica_batch(c, batch)
    } else {
        0
    };
    // Sharding runs over the context- and data-parallel ranks together.
    let dp_ranks = match &c.pipeline {
        Some(pp) => pipeline(pp, dp_ranks / cp, batch, c.grad_accumulation)? * cp,
        None => dp_ranks,
    };
    let k = c.grad_accumulation;
    if k == 0 || k > MAX_ACCUMULATION {
        return Err(invalid(
            "config.grad_accumulation",
            format!("{k}: must be between 1 and {MAX_ACCUMULATION} (1 means no accumulation)"),
        ));
    }
    if batch > 0 && !batch.is_multiple_of(k) {
        return Err(invalid(
            "config.grad_accumulation",
            format!(
                "{k} micro-batches do not divide the batch of {batch} (workload.batch, per data-parallel replica): a micro-step would hold {:.3} samples",
                f64::from(batch) / f64::from(k)
            ),
        ));
    }
    for (t, &b) in &c.tensor_bytes {
        if b > MAX_TENSOR_BYTES {
            return Err(invalid(
                format!("config.tensor_bytes[{}]", key(t)),
                format!("{b} bytes is more than the {MAX_TENSOR_BYTES} (16 TiB) a tensor may hold"),
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for (g, group) in c.tensor_groups.iter().enumerate() {
        if group.is_empty() {
            return Err(invalid(
                format!("config.tensor_groups[{g}]"),
                "an empty group (every collective carries a tensor)",
            ));
        }
        let mut sum: u64 = 0;
        for t in group {
            if !seen.insert(t.as_str()) {
                return Err(invalid(
                    format!("config.tensor_groups[{g}]"),
                    format!("tensor {} is in two collectives", key(t)),
                ));
            }
            let b = c.tensor_bytes.get(t).copied().unwrap_or(0);
            sum = sum
                .checked_add(b)
                .filter(|&s| s <= MAX_TENSOR_BYTES)
                .ok_or_else(|| {
                    invalid(
                        format!("config.tensor_groups[{g}]"),
                        format!(
                            "its tensors (config.tensor_bytes) add up to more than the {MAX_TENSOR_BYTES} bytes (16 TiB) one collective may move"
                        ),
                    )
                })?;
        }
    }
    if let Some(sh) = &c.sharding {
        sharding(sh, dp_ranks)?;
    }
    for (first, &n) in &c.partitions {
        let field = format!("config.partitions[{}]", key(first));
        if n == 0 || n > MAX_K {
            return Err(invalid(
                field,
                format!("{n}: must be between 1 and {MAX_K}"),
            ));
        }
        if !c.tensor_groups.iter().any(|g| g.first() == Some(first)) {
            return Err(invalid(
                field,
                "not the first tensor of a group of config.tensor_groups",
            ));
        }
    }
    Ok(())
}

/// `config.tensor_parallel`: a degree of at least 2 dividing the ranks; the data-parallel
/// ranks it leaves.
fn tensor_parallel(tp: &crate::plan::TensorParallelConfig, ranks: u32) -> Result<u32, Invalid> {
    if tp.degree < 2 || !ranks.is_multiple_of(tp.degree) {
        return Err(invalid(
            "config.tensor_parallel.degree",
            format!(
                "{}: must be at least 2 and divide the {ranks} ranks (workload.ranks); a plan without tensor parallelism has no config.tensor_parallel",
                tp.degree
            ),
        ));
    }
    Ok(ranks / tp.degree)
}

/// `config.context_parallel`: a degree of at least 2 dividing the `ranks` a tensor-parallel
/// degree leaves; the degree.
fn context_parallel(cp: &crate::plan::ContextParallelConfig, ranks: u32) -> Result<u32, Invalid> {
    if cp.degree < 2 || !ranks.is_multiple_of(cp.degree) {
        return Err(invalid(
            "config.context_parallel.degree",
            format!(
                "{}: must be at least 2 and divide the {ranks} ranks a tensor-parallel group leaves (workload.ranks / config.tensor_parallel.degree); a plan without context parallelism has no config.context_parallel",
                cp.degree
            ),
        ));
    }
    Ok(cp.degree)
}

/// `config.pipeline` over the `ranks` a tensor-parallel degree leaves, for a replica batch
/// of `batch` (0: unknown) and `k` accumulation steps; the data-parallel ranks it leaves.
fn pipeline(
    pp: &crate::plan::PipelineConfig,
    ranks: u32,
    batch: u32,
    k: u32,
) -> Result<u32, Invalid> {
    let field = |f: &str| format!("config.pipeline.{f}");
    if pp.stages < 2 || !ranks.is_multiple_of(pp.stages) {
        return Err(invalid(
            field("stages"),
            format!(
                "{}: must be at least 2 and divide the {ranks} ranks the tensor- and context-parallel groups leave (workload.ranks / config.tensor_parallel.degree / config.context_parallel.degree)",
                pp.stages
            ),
        ));
    }
    let interleaved = match pp.schedule.as_str() {
        "1f1b" | "gpipe" => false,
        "interleaved" => true,
        other => {
            return Err(invalid(
                field("schedule"),
                format!("{other:?}: must be 1f1b, gpipe or interleaved"),
            ));
        }
    };
    if pp.chunks_per_rank == 0 || (pp.chunks_per_rank > 1) != interleaved {
        return Err(invalid(
            field("virtual"),
            format!(
                "{}: 1 with schedule {}, more than 1 with interleaved",
                pp.chunks_per_rank, pp.schedule
            ),
        ));
    }
    let chunks = pp.stages.saturating_mul(pp.chunks_per_rank);
    let ends = [pp.first_stage_layers, pp.last_stage_layers];
    if ends.iter().any(Option::is_some) {
        // Uneven: the given ends, and the middle stages' layers in equal shares (as
        // Megatron-LM's TransformerConfig checks them); 1F1B or GPipe only.
        let given: Vec<u32> = ends.iter().flatten().copied().collect();
        let middle_stages = pp.stages - given.len() as u32;
        let middle = given
            .iter()
            .try_fold(pp.layers, |left, &n| left.checked_sub(n));
        let ok = !interleaved
            && given.iter().all(|&n| n > 0)
            && middle.is_some_and(|mid| {
                (mid == 0) == (middle_stages == 0)
                    && (middle_stages == 0 || mid.is_multiple_of(middle_stages))
            });
        if !ok {
            return Err(invalid(
                field("first_stage_layers"),
                format!(
                    "{:?} / {:?} of {} layers: the ends must hold at least one layer and leave the {middle_stages} middle stage(s) equal shares, without interleaving",
                    pp.first_stage_layers, pp.last_stage_layers, pp.layers
                ),
            ));
        }
    } else if pp.layers == 0 || !pp.layers.is_multiple_of(chunks) {
        return Err(invalid(
            field("layers"),
            format!(
                "{}: must be a multiple of stages x virtual = {chunks}",
                pp.layers
            ),
        ));
    }
    let m = pp.microbatches;
    if m == 0
        || (batch > 0 && !batch.is_multiple_of(m))
        || (interleaved && !m.is_multiple_of(pp.stages))
    {
        return Err(invalid(
            field("microbatches"),
            format!(
                "{m}: must divide the replica's batch of {batch}{}",
                if interleaved {
                    " and be a multiple of the stages (interleaved)"
                } else {
                    ""
                }
            ),
        ));
    }
    if k != 1 {
        return Err(invalid(
            "config.grad_accumulation",
            format!("{k}: must be 1 with a pipeline (its micro-batches are the accumulation)"),
        ));
    }
    Ok(ranks / pp.stages)
}

/// `config.sharding`: a stage the passes know, groups that tile the data-parallel ranks
/// (`ranks`: every rank, or `ranks / degree` with tensor parallelism), units matching their
/// bytes.
fn sharding(sh: &crate::plan::ShardConfig, ranks: u32) -> Result<(), Invalid> {
    if !(1..=3).contains(&sh.stage) {
        return Err(invalid(
            "config.sharding.stage",
            format!("{}: must be 1, 2 or 3 (ZeRO stages)", sh.stage),
        ));
    }
    if sh.replicas == 0
        || sh.shard_size < 2
        || sh.shard_size.checked_mul(sh.replicas) != Some(ranks)
    {
        return Err(invalid(
            "config.sharding.shard_size",
            format!(
                "{} ranks per shard group x {} replicas must be the {ranks} data-parallel ranks (workload.ranks / config.tensor_parallel.degree / config.pipeline.stages), with at least 2 per group",
                sh.shard_size, sh.replicas
            ),
        ));
    }
    if sh.prefetch > 64 {
        return Err(invalid(
            "config.sharding.prefetch",
            format!("{}: must be between 0 and 64", sh.prefetch),
        ));
    }
    if sh.units.len() != sh.unit_bytes.len() {
        return Err(invalid(
            "config.sharding.unit_bytes",
            format!(
                "{} sizes for {} units: one per unit",
                sh.unit_bytes.len(),
                sh.units.len()
            ),
        ));
    }
    if sh.stage == 3 && sh.units.is_empty() {
        return Err(invalid(
            "config.sharding.units",
            "stage 3 gathers parameters per unit: at least one unit",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, u) in sh.units.iter().enumerate() {
        if !seen.insert(u.as_str()) {
            return Err(invalid(
                format!("config.sharding.units[{i}]"),
                format!("unit {} listed twice", key(u)),
            ));
        }
    }
    if let Some(i) = sh.unit_bytes.iter().position(|&b| b > MAX_TENSOR_BYTES) {
        return Err(invalid(
            format!("config.sharding.unit_bytes[{i}]"),
            format!("more than the {MAX_TENSOR_BYTES} bytes (16 TiB) one collective may move"),
        ));
    }
    Ok(())
}

impl Plan {
    /// Check every value against the ranges the planner itself uses (see the module docs).
    pub fn check(&self) -> Result<(), Invalid> {
        let w = &self.workload;
        for (field, v) in [("workload.source", &w.source), ("workload.names", &w.names)] {
            if v != "zoo" && v != "trace" {
                return Err(invalid(field, format!("{v:?}: must be zoo or trace")));
            }
        }
        if w.ranks == 0 || w.ranks > crate::limits::MAX_WORKERS {
            return Err(invalid(
                "workload.ranks",
                format!(
                    "{}: must be between 1 and {}",
                    w.ranks,
                    crate::limits::MAX_WORKERS
                ),
            ));
        }
        // Unknown (a trace without shapes) is null; 0 is what plans before issue 20 wrote for
        // it, still read as unknown on a trace.
        let bad_batch = match w.batch {
            Some(b) => b > crate::zoo::MAX_BATCH || (b == 0 && w.source != "trace"),
            None => w.source != "trace",
        };
        if bad_batch {
            return Err(invalid(
                "workload.batch",
                format!(
                    "{}: must be between 1 and {} (unknown only for a trace that does not say)",
                    w.batch.map_or("null".to_string(), |b| b.to_string()),
                    crate::zoo::MAX_BATCH
                ),
            ));
        }
        let p = &self.predicted;
        point("predicted.baseline", &p.baseline)?;
        point("predicted.planned", &p.planned)?;
        speedup(p.baseline.iteration_ms, p.planned.iteration_ms, p.speedup)?;
        if !["", "fp32", "tf32", "fp16", "bf16", "fp8"].contains(&p.baseline_precision.as_str()) {
            return Err(invalid(
                "predicted.baseline_precision",
                format!(
                    "{}: not a precision (fp32, tf32, fp16, bf16, fp8)",
                    key(&p.baseline_precision)
                ),
            ));
        }
        if let Some(h) = &p.half_baseline {
            if !["fp16", "bf16"].contains(&h.precision.as_str()) {
                return Err(invalid(
                    "predicted.half_baseline.precision",
                    format!("{}: not a half precision (fp16, bf16)", key(&h.precision)),
                ));
            }
            time("predicted.half_baseline.iteration_ms", h.iteration_ms)?;
            if !(h.speedup.is_finite() && h.speedup > 0.0) {
                return Err(invalid(
                    "predicted.half_baseline.speedup",
                    format!("{} is not a speed-up", h.speedup),
                ));
            }
        }
        if let Some(lb) = p.lower_bound_ms {
            time("predicted.lower_bound_ms", lb)?;
            if lb > p.planned.iteration_ms + 2.0 * HALF_UNIT {
                return Err(invalid(
                    "predicted.lower_bound_ms",
                    format!(
                        "{lb} ms is more than the planned {} ms it bounds",
                        p.planned.iteration_ms
                    ),
                ));
            }
        }
        for (name, &v) in &self.baselines {
            time(&format!("baselines[{}]", key(name)), v)?;
        }
        let registry = crate::passes::registry();
        // Accumulation splits what one data-parallel replica trains (a tensor-parallel
        // group's batch, its degree checked first).
        if let Some(tp) = &self.config.tensor_parallel {
            tensor_parallel(tp, w.ranks)?;
        }
        if let Some(cp) = &self.config.context_parallel {
            let tp = self.config.tensor_parallel.as_ref().map_or(1, |t| t.degree);
            context_parallel(cp, w.ranks / tp.max(1))?;
        }
        let replica_batch = w
            .batch()
            .map_or(0, |b| super::replica_batch(&self.config, b));
        for (i, d) in self.decisions.iter().enumerate() {
            effect(&format!("decisions[{i}].effect_ms"), d.effect_ms)?;
            if let Some(n) = d.partitions
                && (n == 0 || n > MAX_K)
            {
                return Err(invalid(
                    format!("decisions[{i}].partitions"),
                    format!("{n}: must be between 1 and {MAX_K}"),
                ));
            }
            decision_knobs(i, d, replica_batch, &registry)?;
        }
        for (i, a) in self.advice.iter().enumerate() {
            effect(&format!("advice[{i}].effect_ms"), a.effect_ms)?;
        }
        config(&self.config, w.batch().unwrap_or(0), w.ranks)?;
        let b = self.search.budget_s;
        if !(b.is_finite() && b >= 0.0) {
            return Err(invalid(
                "search.budget_s",
                format!("{b}: not a number of seconds"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::emit::tests::{decision, tiny_plan};
    use super::*;

    /// `edit` applied to the tiny plan is refused at `field`, with `why` in the reason.
    fn refused(edit: impl FnOnce(&mut Plan), field: &str, why: &str) {
        refused_from(&tiny_plan(), edit, field, why);
    }

    /// `edit` applied to `base` is refused at `field`, with `why` in the reason.
    fn refused_from(base: &Plan, edit: impl FnOnce(&mut Plan), field: &str, why: &str) {
        let mut p = base.clone();
        edit(&mut p);
        let e = p.check().expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(e.why.contains(why), "{e}");
    }

    #[test]
    fn the_tiny_plan_passes() {
        tiny_plan().check().unwrap();
    }

    #[test]
    fn every_class_of_hand_edit_is_refused_at_its_field() {
        refused(|p| p.workload.ranks = 0, "workload.ranks", "between 1");
        refused(
            |p| p.workload.batch = Some(0),
            "workload.batch",
            "unknown only for a trace",
        );
        refused(
            |p| p.workload.names = "mine".into(),
            "workload.names",
            "zoo or trace",
        );
        refused(
            |p| p.predicted.planned.iteration_ms = -5.0,
            "predicted.planned.iteration_ms",
            "not a time",
        );
        refused(
            |p| p.predicted.baseline.iteration_ms = f64::NAN,
            "predicted.baseline.iteration_ms",
            "not a time",
        );
        refused(
            |p| p.predicted.planned.iteration_ms = 1e308,
            "predicted.planned.iteration_ms",
            "not a time",
        );
        // 10 / 8 = 1.25, not 1000.
        refused(
            |p| p.predicted.speedup = 1000.0,
            "predicted.speedup",
            "10 / 8",
        );
        refused(
            |p| p.predicted.lower_bound_ms = Some(9.0),
            "predicted.lower_bound_ms",
            "more than the planned",
        );
        refused(
            |p| p.predicted.planned.peak_memory_bytes = Some(u64::MAX),
            "predicted.planned.peak_memory_bytes",
            "64 PiB",
        );
        refused(
            |p| {
                p.baselines.insert("none".into(), f64::INFINITY);
            },
            "baselines[\"none\"]",
            "not a time",
        );
        refused(
            |p| p.decisions[1].effect_ms = f64::NAN,
            "decisions[1].effect_ms",
            "not a change",
        );
        refused(
            |p| p.decisions[1] = decision("grad-accumulation", &[("k", "4294967295")], "x"),
            "decisions[1].knobs.k",
            "do not divide the batch of 4",
        );
        refused(
            |p| p.decisions[1] = decision("grad-accumulation", &[("k", "3")], "x"),
            "decisions[1].knobs.k",
            "do not divide the batch of 4",
        );
        refused(
            |p| p.decisions[2] = decision("amp", &[("dtype", "float64")], "x"),
            "decisions[2].knobs.dtype",
            "fp16 or bf16",
        );
        refused(
            |p| p.decisions[2] = decision("amp", &[("colour", "red")], "x"),
            "decisions[2].knobs.colour",
            "not a knob of amp",
        );
        let cycle = format!("1{}", "0".repeat(308));
        refused(
            |p| {
                p.decisions[0]
                    .knobs
                    .insert("cycle_ms".into(), cycle.clone());
            },
            "decisions[0].knobs.cycle_ms",
            "between",
        );
        refused(
            |p| {
                p.decisions[0]
                    .knobs
                    .insert("threshold_bytes".into(), "-1".into());
            },
            "decisions[0].knobs.threshold_bytes",
            "between 0",
        );
        refused(
            |p| p.decisions[0].partitions = Some(0),
            "decisions[0].partitions",
            "between 1",
        );
        refused(
            |p| {
                p.config.partitions.insert("net.0.weight".into(), 0);
            },
            "config.partitions[\"net.0.weight\"]",
            "between 1",
        );
        refused(
            |p| p.config.dtype = "float64".into(),
            "config.dtype",
            "fp32",
        );
        refused(
            |p| p.config.grad_accumulation = 4294967295,
            "config.grad_accumulation",
            "between 1 and 16777216",
        );
        refused(
            |p| p.config.grad_accumulation = 3,
            "config.grad_accumulation",
            "do not divide",
        );
        refused(
            |p| {
                p.config.tensor_bytes.insert("net.3.bias".into(), u64::MAX);
            },
            "config.tensor_bytes[\"net.3.bias\"]",
            "16 TiB",
        );
        // Each tensor in range, their sum over a collective's bound (and over u64 if added
        // without a check).
        refused(
            |p| {
                for t in ["net.2.bias", "net.1.weight", "net.1.bias"] {
                    p.config.tensor_bytes.insert(t.into(), MAX_TENSOR_BYTES);
                }
            },
            "config.tensor_groups[2]",
            "add up to more than",
        );
        refused(
            |p| p.config.tensor_groups[4].push("net.3.bias".into()),
            "config.tensor_groups[4]",
            "two collectives",
        );
        refused(
            |p| p.search.budget_s = f64::NAN,
            "search.budget_s",
            "seconds",
        );
    }

    #[test]
    fn tensor_parallelism_checks_its_degree_and_moves_the_data_parallel_ranks() {
        use crate::plan::{ShardConfig, TensorParallelConfig};
        // 8 ranks at batch 4: degree 2 leaves 4 data-parallel ranks, each a group training 8.
        let tp = |p: &mut Plan, degree: u32| {
            p.config.tensor_parallel = Some(TensorParallelConfig {
                degree,
                sequence: true,
                global_batch: true,
            });
        };
        let sharded = |p: &mut Plan, shard_size: u32| {
            p.config.sharding = Some(ShardConfig {
                stage: 3,
                shard_size,
                replicas: 1,
                reshard: true,
                prefetch: 1,
                offload: false,
                units: vec!["net.0".into(), String::new()],
                unit_bytes: vec![1024, 512],
            });
        };
        let mut p = tiny_plan();
        tp(&mut p, 2);
        sharded(&mut p, 4);
        p.config.grad_accumulation = 8;
        p.decisions[1] = decision("grad-accumulation", &[("k", "8")], "x");
        p.check().unwrap();
        let refused =
            |edit: &dyn Fn(&mut Plan), field: &str, why: &str| refused_from(&p, edit, field, why);
        refused(
            &|q| tp(q, 3),
            "config.tensor_parallel.degree",
            "must be at least 2 and divide the 8 ranks",
        );
        refused(
            &|q| tp(q, 1),
            "config.tensor_parallel.degree",
            "must be at least 2",
        );
        // The shard groups tile the 4 data-parallel ranks, not the 8.
        refused(
            &|q| sharded(q, 8),
            "config.sharding.shard_size",
            "must be the 4 data-parallel ranks",
        );
        // 16 micro-batches split a group's 8 samples into halves.
        refused(
            &|q| q.config.grad_accumulation = 16,
            "config.grad_accumulation",
            "do not divide the batch of 8",
        );
        refused(
            &|q| q.decisions[1] = decision("grad-accumulation", &[("k", "16")], "x"),
            "decisions[1].knobs.k",
            "do not divide the batch of 8",
        );
        // Keeping the batch per replica instead: a group trains 4, so k = 8 no longer divides.
        refused(
            &|q| q.config.tensor_parallel.as_mut().unwrap().global_batch = false,
            "decisions[1].knobs.k",
            "do not divide the batch of 4",
        );
    }

    #[test]
    fn context_parallelism_checks_its_degree_and_multiplies_the_replica_batch() {
        use crate::plan::{ContextParallelConfig, TensorParallelConfig};
        // 8 ranks at batch 4: TP 2 x CP 2 leaves 2 data-parallel ranks, each group of 4
        // training 16 samples.
        let cp = |p: &mut Plan, degree: u32| {
            p.config.context_parallel = Some(ContextParallelConfig {
                degree,
                global_batch: true,
            });
        };
        let mut p = tiny_plan();
        p.config.tensor_parallel = Some(TensorParallelConfig {
            degree: 2,
            sequence: true,
            global_batch: true,
        });
        cp(&mut p, 2);
        p.config.grad_accumulation = 16;
        p.decisions[1] = decision("grad-accumulation", &[("k", "16")], "x");
        p.check().unwrap();
        assert_eq!(crate::plan::replica_batch(&p.config, 4), 16);
        let refused =
            |edit: &dyn Fn(&mut Plan), field: &str, why: &str| refused_from(&p, edit, field, why);
        refused(
            &|q| cp(q, 3),
            "config.context_parallel.degree",
            "must be at least 2 and divide the 4 ranks a tensor-parallel group leaves",
        );
        refused(
            &|q| cp(q, 1),
            "config.context_parallel.degree",
            "must be at least 2",
        );
        // Keeping the batch per group: 8 samples, which 16 micro-batches would halve.
        refused(
            &|q| q.config.context_parallel.as_mut().unwrap().global_batch = false,
            "decisions[1].knobs.k",
            "do not divide the batch of 8",
        );
    }

    #[test]
    fn a_trace_plan_without_a_batch_skips_the_divisibility_check() {
        let mut p = tiny_plan();
        p.workload.source = "trace".into();
        p.workload.batch = None;
        p.config.grad_accumulation = 3;
        p.check().unwrap();
    }

    #[test]
    fn the_speedup_check_allows_the_files_rounding() {
        let mut p = tiny_plan();
        // 0.0305 / 0.0104 rounded to µs: 0.031 / 0.010 = 3.1; the true ratio 2.933 is within.
        p.predicted.baseline.iteration_ms = 0.031;
        p.predicted.planned.iteration_ms = 0.010;
        p.predicted.lower_bound_ms = None;
        p.predicted.speedup = 2.933;
        p.check().unwrap();
        p.predicted.speedup = 4.0;
        assert_eq!(p.check().unwrap_err().field, "predicted.speedup");
    }
}
