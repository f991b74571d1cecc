//! `trainplan passes` and `trainplan whatif`: list the registered passes; apply passes to a job
//! and report iteration time, peak memory and how the critical path changed.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::output::{gb, ms};
use super::replay::input_job;
use super::{CliError, PassesArgs, WhatifArgs};
use crate::passes::{self, Evaluated, KnobKind, Pass, PassError};
use crate::replay::breakdown::critical_path_items;

fn out() -> super::output::Clean<std::io::StdoutLock<'static>> {
    super::output::stdout()
}

fn pass_error(e: PassError) -> CliError {
    CliError::bad_input(e)
}

/// The built-in passes plus the ones registered with `--pass-file`, sorted by name; a file's
/// pass may not shadow a built-in one.
pub fn all_passes(files: &[std::path::PathBuf]) -> Result<Vec<Box<dyn Pass>>, CliError> {
    let mut v = passes::registry();
    for f in files {
        let p = passes::declarative::load_file(f).map_err(pass_error)?;
        if v.iter().any(|q| q.name() == p.name()) {
            return Err(CliError::bad_input(format!(
                "{}: pass name `{}` is already registered; choose another name",
                f.display(),
                p.name()
            )));
        }
        v.push(p);
    }
    v.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(v)
}

/// `trainplan passes`.
pub fn passes_cmd(a: &PassesArgs) -> Result<(), CliError> {
    let list = all_passes(&a.pass_file)?;
    let mut o = out();
    if a.json {
        let v: Vec<_> = list
            .iter()
            .map(|p| {
                let knobs: Vec<_> = p
                    .knobs()
                    .iter()
                    .map(|k| json!({"name": k.name, "default": k.default, "doc": k.doc}))
                    .collect();
                json!({"name": p.name(), "doc": p.doc(), "knobs": knobs})
            })
            .collect();
        writeln!(o, "{}", json!({ "passes": v })).map_err(CliError::stdout)?;
        return Ok(());
    }
    for p in &list {
        writeln!(o, "{:<22} {}", p.name(), p.doc()).map_err(CliError::stdout)?;
        for k in p.knobs() {
            let range = match k.kind {
                KnobKind::Int { min, max } => format!(" [{min}..{max}]"),
                KnobKind::Float { min, max } => format!(" [{min}..{max}]"),
                KnobKind::Text => String::new(),
            };
            writeln!(
                o,
                "{:<22}   {}={}{}  {}",
                "", k.name, k.default, range, k.doc
            )
            .map_err(CliError::stdout)?;
        }
    }
    writeln!(
        o,
        "\nApply with: trainplan whatif --model M --cluster C --pass NAME[:knob=value,...]; add your own with --pass-file F.yaml."
    )
    .map_err(CliError::stdout)
}

/// Critical-path items by name → ns.
fn path_items(e: &Evaluated) -> BTreeMap<String, u64> {
    critical_path_items(&e.graph, &e.critical)
        .into_iter()
        .map(|i| (i.name, i.dur_ns))
        .collect()
}

/// Items in `a` but not in `b`, largest first (ties by name), at most `n`.
fn only_in(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, n: usize) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = a
        .iter()
        .filter(|(k, _)| !b.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    v.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    v.truncate(n);
    v
}

/// The passes of one `whatif`, resolved: each pass with its knobs.
pub(super) type PassPlan<'a> = Vec<(&'a dyn Pass, passes::Knobs)>;

/// Resolve every `--pass` and its knobs before any work, so a typo costs nothing.
pub(super) fn resolve<'a>(
    all: &'a [Box<dyn Pass>],
    args: &[String],
) -> Result<PassPlan<'a>, CliError> {
    let mut plan = Vec::new();
    for arg in args {
        let (name, given) = passes::parse_pass_arg(arg);
        let p = passes::find(all, &name).map_err(pass_error)?;
        let knobs = passes::resolve_knobs(p, &given).map_err(pass_error)?;
        plan.push((p, knobs));
    }
    Ok(plan)
}

/// Evaluate `job`, apply the passes in order (each on the previous one's result), evaluate
/// again: (before, after, what each pass did as JSON).
pub(super) fn run_passes(
    job: crate::graph::job::Job,
    plan: &PassPlan,
    warn: bool,
) -> Result<(Evaluated, Evaluated, Vec<serde_json::Value>), CliError> {
    let base = passes::evaluate(job).map_err(CliError::bad_input)?;
    let mut cur = base.clone();
    let mut applied = Vec::new();
    for (p, knobs) in plan {
        let patches = crate::passes::propose(*p, &cur, knobs).map_err(pass_error)?;
        if patches.is_empty() && warn {
            tracing::warn!(pass = p.name(), "the pass found nothing to change");
        }
        let job = passes::apply_all(&cur.job, &patches).map_err(pass_error)?;
        applied.push(json!({"pass": p.name(), "patches": patches.len(),
            "why": patches.iter().map(|x| x.why.clone()).filter(|w| !w.is_empty()).take(20).collect::<Vec<_>>()}));
        cur = passes::evaluate(job).map_err(CliError::bad_input)?;
    }
    Ok((base, cur, applied))
}

/// A trace's prediction at both ends of what its name-classed kernels could be (all math, all
/// memory traffic): `None` when every kernel has shapes.
fn name_range(
    base: &Evaluated,
    source: &[crate::trace::work::WorkSource],
    plan: &PassPlan,
) -> Result<Option<(u64, u64)>, CliError> {
    use crate::trace::work::{Bound, WorkSource, at_bound};
    if !source.contains(&WorkSource::KernelName) {
        return Ok(None);
    }
    let mut v = Vec::new();
    for b in [Bound::Compute, Bound::Memory] {
        let job = at_bound(&base.job, source, b);
        let (_, after, _) = run_passes(job, plan, false)?;
        v.push(after.iteration_ns());
    }
    Ok(Some((
        v.iter().copied().min().unwrap_or(0),
        v.iter().copied().max().unwrap_or(0),
    )))
}

/// `trainplan whatif`.
pub fn whatif_cmd(a: &WhatifArgs) -> Result<(), CliError> {
    if a.pass.is_empty() {
        return Err(CliError::usage(
            "name at least one --pass NAME[:knob=value,...] (see `trainplan passes`)",
        ));
    }
    let all = all_passes(&a.pass_file)?;
    let plan = resolve(&all, &a.pass)?;
    if !a.input.trace.is_empty() {
        super::replay::refuse_trace_precision(&a.input)?;
        let files = crate::trace::expand_inputs(&a.input.trace).map_err(CliError::bad_input)?;
        if files.len() > 1 {
            return super::ranks::whatif_ranks_cmd(a, &files, &plan);
        }
    }
    let input = input_job(&a.input)?;
    let t = Instant::now();
    let (base, cur, applied) = run_passes(input.job, &plan, true)?;
    let range = match &input.trace {
        Some(ti) => name_range(&base, &ti.work_source, &plan)?,
        None => None,
    };
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let mem_known = super::traceinfo::has_memory(&base.job);
    if mem_known {
        super::memory::warn_if_over(&cur.memory.peaks, &cur.job);
    }
    let (before, after) = (path_items(&base), path_items(&cur));
    let left = only_in(&before, &after, 10);
    let joined = only_in(&after, &before, 10);
    let (b_it, a_it) = (base.iteration_ns(), cur.iteration_ns());
    let speedup = b_it as f64 / a_it.max(1) as f64;
    let recorded = base.job.is_recorded();
    let (bound_b, bound_a) = (
        super::traceinfo::Bound::of(&base),
        super::traceinfo::Bound::of(&cur),
    );
    let mut o = out();
    if a.json {
        let items = |v: &[(String, u64)]| -> Vec<serde_json::Value> {
            v.iter()
                .map(|(n, d)| json!({"name": n, "ms": *d as f64 / 1e6}))
                .collect()
        };
        let b = super::traceinfo::bound_json(&bound_b, Some(&bound_a));
        let s = |e: &passes::Evaluated| {
            let sum = crate::replay::breakdown::summary(&e.graph, &e.replay, &e.critical);
            json!({
                "compute_ms": sum.breakdown.compute_ns as f64 / 1e6,
                "communication_ms": sum.breakdown.comm_ns as f64 / 1e6,
                "exposed_communication_ms": sum.exposed_comm_ns as f64 / 1e6,
                "host_bound": sum.host_bound(),
                "host_critical_path_ms": sum.host_path_ns as f64 / 1e6,
                "memory_over_capacity": mem_known
                    .then(|| super::memory::over_capacity(&e.memory.peaks, &e.job)),
            })
        };
        let (sb, sa) = (s(&base), s(&cur));
        let mut v = json!({
            "compute_ms": sa["compute_ms"],
            "communication_ms": sa["communication_ms"],
            "exposed_communication_ms": sa["exposed_communication_ms"],
            "host_bound": sa["host_bound"],
            "host_critical_path_ms": sa["host_critical_path_ms"],
            "memory_over_capacity": sa["memory_over_capacity"],
            "baseline": sb,
            "baseline_iteration_ms": b_it as f64 / 1e6,
            "iteration_ms": a_it as f64 / 1e6,
            "speedup": speedup,
            "gpu_memory_bytes": cur.job.gpu.memory_bytes(),
            "baseline_makespan_ms": base.makespan_ns() as f64 / 1e6,
            "makespan_ms": cur.makespan_ns() as f64 / 1e6,
            "metric": if base.steady.is_some() { "steady-state period" } else { "makespan" },
            "iteration_range_ms": range.map(|(l, h)| [l as f64 / 1e6, h as f64 / 1e6]),
            "bound": b,
            "trace_facts": super::traceinfo::facts_json(&base.job),
            "passes": applied,
            "critical_path_left": items(&left),
            "critical_path_joined": items(&joined),
            "ops": cur.graph.op_count(),
            "workers": cur.graph.represented_workers(),
            "model": base.job.meta.model,
            "cluster": base.job.meta.cluster,
            "wall_ms": wall_ms,
        });
        for (e, prefix) in [(&base, "baseline_"), (&cur, "")] {
            let mut f = super::memory::fields(&e.memory.peaks, prefix);
            if !mem_known {
                f.values_mut().for_each(|x| *x = serde_json::Value::Null);
            }
            super::memory::extend(&mut v, f);
        }
        writeln!(o, "{v}").map_err(CliError::stdout)?;
        return Ok(());
    }
    let names: Vec<&str> = a.pass.iter().map(String::as_str).collect();
    let mut lines = vec![if recorded {
        format!(
            "{} (trace, one rank): what if {}",
            base.job.meta.model,
            names.join(" + ")
        )
    } else {
        format!(
            "{} (batch {}/GPU) on {}: what if {}",
            base.job.meta.model,
            base.job.meta.batch,
            base.job.meta.cluster,
            names.join(" + ")
        )
    }];
    if let Some(f) = super::traceinfo::facts(&base.job) {
        lines.push(super::traceinfo::facts_line(f));
    }
    lines.extend([
        String::new(),
        format!(
            "{:<16} {:>12} {:>12} {:>9}",
            "", "before", "after", "change"
        ),
        format!(
            "{:<16} {:>12} {:>12} {:>+8.1} %{}",
            "iteration",
            super::output::dur(b_it, 1),
            super::output::dur(a_it, 1),
            100.0 * (a_it as f64 / b_it.max(1) as f64 - 1.0),
            if base.steady.is_some() {
                "   steady-state period"
            } else {
                ""
            }
        ),
    ]);
    if base.steady.is_some() && (base.makespan_ns() != b_it || cur.makespan_ns() != a_it) {
        lines.push(format!(
            "{:<16} {:>12} {:>12} {:>+8.1} %   one step until its GPU work drains",
            "makespan",
            super::output::dur(base.makespan_ns(), 1),
            super::output::dur(cur.makespan_ns(), 1),
            100.0 * (cur.makespan_ns() as f64 / base.makespan_ns().max(1) as f64 - 1.0)
        ));
    }
    if let (Some((lo, hi)), Some(f)) = (range, super::traceinfo::facts(&base.job)) {
        let w = f.work;
        let gpu = (w.shapes_ns + w.names_ns + w.none_ns).max(1);
        if w.names_ns * 100 >= gpu {
            lines.push(format!(
                "{:<16} {:>12} {:>6.1}–{}   range: {:.0} % of the GPU time has no shapes \
                 (re-costed by kernel-name class, all-math to all-memory)",
                "",
                "",
                ms(lo),
                super::output::dur(hi, 1),
                100.0 * w.names_ns as f64 / gpu as f64
            ));
        }
    }
    if recorded {
        lines.extend(super::traceinfo::memory_lines(
            &base.job,
            base.memory.peak_bytes,
            Some(cur.memory.peak_bytes),
        ));
    } else if base.memory.peak_bytes == 0 {
        lines.push("peak memory      not modelled for this input (no allocation events)".into());
    } else {
        let (pb, pa) = (&base.memory.peaks, &cur.memory.peaks);
        for (label, b, a) in [
            ("peak allocated", pb.allocated, pa.allocated),
            ("peak reserved", pb.reserved, pa.reserved),
            ("device used", pb.device_used, pa.device_used),
        ] {
            lines.push(format!(
                "{:<16} {:>12} {:>12} {:>+8.1} %",
                label,
                gb(b),
                gb(a),
                100.0 * (a as f64 / b.max(1) as f64 - 1.0)
            ));
        }
        lines.push(format!(
            "memory after     {}",
            super::memory::summary(pa, &cur.job)
        ));
    }
    lines.push(format!("speedup          {speedup:.3}x"));
    if recorded {
        lines.push(String::new());
        lines.push(super::traceinfo::path_line(&bound_b));
        lines.extend(super::traceinfo::explain(&bound_b, &bound_a, (b_it, a_it)));
    }
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    for p in &applied {
        if let Some(w) = p["why"].as_array().and_then(|w| w.first()) {
            writeln!(
                o,
                "\n{}: {}",
                p["pass"].as_str().unwrap_or(""),
                w.as_str().unwrap_or("")
            )
            .map_err(CliError::stdout)?;
        }
    }
    for (title, v) in [
        ("left the critical path", &left),
        ("joined the critical path", &joined),
    ] {
        if v.is_empty() {
            continue;
        }
        writeln!(o, "\n{title}:").map_err(CliError::stdout)?;
        for (n, d) in v.iter() {
            writeln!(
                o,
                "  {:>11}  {n}",
                super::output::dur_ms(*d as f64 / 1e6, 2)
            )
            .map_err(CliError::stdout)?;
        }
    }
    Ok(())
}
