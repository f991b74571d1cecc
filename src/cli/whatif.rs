//! `trainplan passes` and `trainplan whatif`: list the registered passes; apply passes to a job
//! and report iteration time, peak memory and how the critical path changed.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::output::{gb, ms};
use super::pass_plan::{PassPlan, all_passes, resolve, run_passes};
use super::report::{self, out};
use super::source::{self, Source};
use super::{CliError, PassesArgs, WhatifArgs};
use crate::passes::{Evaluated, KnobKind};
use crate::replay::breakdown::critical_path_items;

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

/// `trainplan whatif`: resolve the passes, then the input (several ranks have their own
/// report), apply the passes, compare, report.
pub fn whatif_cmd(a: &WhatifArgs) -> Result<(), CliError> {
    if a.pass.is_empty() {
        return Err(CliError::usage(
            "name at least one --pass NAME[:knob=value,...] (see `trainplan passes`)",
        ));
    }
    let all = all_passes(&a.pass_file)?;
    let plan = resolve(&all, &a.pass)?;
    let src = source::resolve(&a.input)?;
    if let Source::Ranks(files) = &src {
        return super::ranks::whatif_ranks_cmd(a, files, &plan);
    }
    let input = source::load(&a.input, &src)?;
    let w = Compared::of(input, &plan)?;
    if w.mem_known {
        super::memory::warn_if_over(&w.cur.memory.peaks, &w.cur.job);
    }
    let mut o = out();
    if a.json {
        return report::json_line(&mut o, &whatif_json(&w));
    }
    report::lines(&mut o, &whatif_lines(a, &w))?;
    write_why(&mut o, &w.applied)?;
    write_path_changes(&mut o, &w)
}

/// A job before and after the passes, and what changed.
struct Compared {
    base: Evaluated,
    cur: Evaluated,
    /// What each pass did (JSON: pass, patches, why).
    applied: Vec<serde_json::Value>,
    /// A trace's prediction with its name-classed kernels all math or all memory traffic.
    range: Option<(u64, u64)>,
    wall_ms: f64,
    /// Whether the input models memory (a trace without allocation events does not).
    mem_known: bool,
    /// Critical-path items that left it and that joined it (largest first, at most 10).
    left: Vec<(String, u64)>,
    joined: Vec<(String, u64)>,
}

impl Compared {
    /// Apply `plan` to `input`'s job and compare.
    fn of(input: source::Input, plan: &PassPlan) -> Result<Compared, CliError> {
        let t = Instant::now();
        let (base, cur, applied) = run_passes(input.job, plan, true)?;
        let range = match &input.trace {
            Some(ti) => name_range(&base, &ti.work_source, plan)?,
            None => None,
        };
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let mem_known = super::traceinfo::has_memory(&base.job);
        let (before, after) = (path_items(&base), path_items(&cur));
        Ok(Compared {
            left: only_in(&before, &after, 10),
            joined: only_in(&after, &before, 10),
            base,
            cur,
            applied,
            range,
            wall_ms,
            mem_known,
        })
    }

    /// Iteration before and after, ns (the steady-state period when there is one).
    fn iterations(&self) -> (u64, u64) {
        (self.base.iteration_ns(), self.cur.iteration_ns())
    }

    fn speedup(&self) -> f64 {
        let (b, a) = self.iterations();
        b as f64 / a.max(1) as f64
    }
}

/// The parts of one evaluation `whatif --json` shows for before and after.
fn parts_json(e: &Evaluated, mem_known: bool) -> serde_json::Value {
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
}

/// A what-if as one JSON object.
fn whatif_json(w: &Compared) -> serde_json::Value {
    let (base, cur) = (&w.base, &w.cur);
    let (b_it, a_it) = w.iterations();
    let items = |v: &[(String, u64)]| -> Vec<serde_json::Value> {
        v.iter()
            .map(|(n, d)| json!({"name": n, "ms": *d as f64 / 1e6}))
            .collect()
    };
    let bound = super::traceinfo::bound_json(
        &super::traceinfo::Bound::of(base),
        Some(&super::traceinfo::Bound::of(cur)),
    );
    let (sb, sa) = (parts_json(base, w.mem_known), parts_json(cur, w.mem_known));
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
        "speedup": w.speedup(),
        "gpu_memory_bytes": cur.job.gpu.memory_bytes(),
        "baseline_makespan_ms": base.makespan_ns() as f64 / 1e6,
        "makespan_ms": cur.makespan_ns() as f64 / 1e6,
        "metric": if base.steady.is_some() { "steady-state period" } else { "makespan" },
        "iteration_range_ms": w.range.map(|(l, h)| [l as f64 / 1e6, h as f64 / 1e6]),
        "bound": bound,
        "trace_facts": super::traceinfo::facts_json(&base.job),
        "passes": w.applied,
        "critical_path_left": items(&w.left),
        "critical_path_joined": items(&w.joined),
        "ops": cur.graph.op_count(),
        "workers": cur.graph.represented_workers(),
        "model": base.job.meta.model,
        "cluster": base.job.meta.cluster,
        "wall_ms": w.wall_ms,
    });
    for (e, prefix) in [(base, "baseline_"), (cur, "")] {
        let mut f = super::memory::fields(&e.memory.peaks, prefix);
        if !w.mem_known {
            f.values_mut().for_each(|x| *x = serde_json::Value::Null);
        }
        super::memory::extend(&mut v, f);
    }
    v
}

/// A what-if's summary: the job and the passes, the iteration before and after, memory,
/// speedup, and for a trace what bounds it.
fn whatif_lines(a: &WhatifArgs, w: &Compared) -> Vec<String> {
    let base = &w.base;
    let recorded = base.job.is_recorded();
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
    lines.extend(iteration_lines(w));
    lines.extend(memory_lines(w));
    lines.push(format!("speedup          {:.3}x", w.speedup()));
    if recorded {
        let (bound_b, bound_a) = (
            super::traceinfo::Bound::of(base),
            super::traceinfo::Bound::of(&w.cur),
        );
        lines.push(String::new());
        lines.push(super::traceinfo::path_line(&bound_b));
        lines.extend(super::traceinfo::explain(
            &bound_b,
            &bound_a,
            w.iterations(),
        ));
    }
    lines
}

/// The iteration (and the makespan, when a steady period differs from it) before and after,
/// and a trace's range when much of its GPU time has no shapes.
fn iteration_lines(w: &Compared) -> Vec<String> {
    let (base, cur) = (&w.base, &w.cur);
    let (b_it, a_it) = w.iterations();
    let mut lines = vec![
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
    ];
    if base.steady.is_some() && (base.makespan_ns() != b_it || cur.makespan_ns() != a_it) {
        lines.push(format!(
            "{:<16} {:>12} {:>12} {:>+8.1} %   one step until its GPU work drains",
            "makespan",
            super::output::dur(base.makespan_ns(), 1),
            super::output::dur(cur.makespan_ns(), 1),
            100.0 * (cur.makespan_ns() as f64 / base.makespan_ns().max(1) as f64 - 1.0)
        ));
    }
    if let (Some((lo, hi)), Some(f)) = (w.range, super::traceinfo::facts(&base.job)) {
        let work = f.work;
        let gpu = (work.shapes_ns + work.names_ns + work.none_ns).max(1);
        if work.names_ns * 100 >= gpu {
            lines.push(format!(
                "{:<16} {:>12} {:>6.1}–{}   range: {:.0} % of the GPU time has no shapes \
                 (re-costed by kernel-name class, all-math to all-memory)",
                "",
                "",
                ms(lo),
                super::output::dur(hi, 1),
                100.0 * work.names_ns as f64 / gpu as f64
            ));
        }
    }
    lines
}

/// Peak memory before and after: a trace's recorded lines, or the modelled peaks.
fn memory_lines(w: &Compared) -> Vec<String> {
    let (base, cur) = (&w.base, &w.cur);
    if base.job.is_recorded() {
        return super::traceinfo::memory_lines(
            &base.job,
            base.memory.peak_bytes,
            Some(cur.memory.peak_bytes),
        );
    }
    if base.memory.peak_bytes == 0 {
        return vec!["peak memory      not modelled for this input (no allocation events)".into()];
    }
    let (pb, pa) = (&base.memory.peaks, &cur.memory.peaks);
    let mut lines: Vec<String> = [
        ("peak allocated", pb.allocated, pa.allocated),
        ("peak reserved", pb.reserved, pa.reserved),
        ("device used", pb.device_used, pa.device_used),
    ]
    .into_iter()
    .map(|(label, b, a)| {
        format!(
            "{:<16} {:>12} {:>12} {:>+8.1} %",
            label,
            gb(b),
            gb(a),
            100.0 * (a as f64 / b.max(1) as f64 - 1.0)
        )
    })
    .collect();
    lines.push(format!(
        "memory after     {}",
        super::memory::summary(pa, &cur.job)
    ));
    lines
}

/// Each pass's first reason, after the summary.
fn write_why(o: &mut impl Write, applied: &[serde_json::Value]) -> Result<(), CliError> {
    for p in applied {
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
    Ok(())
}

/// The items that left and joined the critical path.
fn write_path_changes(o: &mut impl Write, w: &Compared) -> Result<(), CliError> {
    for (title, v) in [
        ("left the critical path", &w.left),
        ("joined the critical path", &w.joined),
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
