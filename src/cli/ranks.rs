//! `trainplan replay --trace` with several ranks: one global graph, clocks aligned, measured
//! against predicted step per rank.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::output::thousands;
use super::report::out;
use super::{CliError, InputArgs, ReplayArgs, WhatifArgs, write_atomic};
use crate::passes::Evaluated;
use crate::replay::{dependency_bound_ns, timeline};
use crate::trace::align::{AlignOptions, align};
use crate::trace::multi::{
    RankStep, collective_times, global_graph, predict, rank_steps, replay_ranks, with_job,
};
use crate::trace::{KinetoTrace, read_kineto};

fn pct(pred: u64, meas: u64) -> f64 {
    100.0 * (pred as f64 / meas.max(1) as f64 - 1.0)
}

/// Several ranks read, built, checked against each other and their clocks aligned.
pub struct Loaded {
    pub ranks: Vec<RankStep>,
    pub offsets: Vec<i64>,
    pub alignment: Option<crate::trace::align::Alignment>,
}

/// Read the ranks of one job (`--trace` with several files or a folder): each rank's step built
/// (the same step on all), their collectives matched, their clocks aligned (unless
/// `--no-align`).
pub fn load_ranks(input: &InputArgs, files: &[PathBuf]) -> Result<Loaded, CliError> {
    if files.len() > crate::limits::MAX_WORKERS as usize {
        return Err(CliError::bad_input(format!(
            "{} trace files given; at most {} ranks are supported (README, Limits)",
            files.len(),
            crate::limits::MAX_WORKERS
        )));
    }
    let mut traces: Vec<(String, KinetoTrace)> = Vec::with_capacity(files.len());
    // Ranks and world size are checked as each file is read, so a folder of copies of one rank
    // stops at the second file, not after loading them all.
    let mut seen: std::collections::BTreeMap<i64, String> = Default::default();
    let mut world: Option<(i64, String)> = None;
    for p in files {
        let tr = read_kineto(p).map_err(CliError::bad_input)?;
        let name = p.display().to_string();
        if let Some(d) = &tr.distributed {
            if let Some(r) = d.rank {
                if let Some(first) = seen.insert(r, name.clone()) {
                    return Err(CliError::bad_input(format!(
                        "{first} and {name} are both rank {r} (distributedInfo.rank): give each rank's trace once"
                    )));
                }
            }
            if let Some(w) = d.world_size {
                match &world {
                    Some((w0, f0)) if *w0 != w => {
                        return Err(CliError::bad_input(format!(
                            "{f0} is from a job of world size {w0} but {name} is from one of world size {w}: \
                             these traces are not from the same run"
                        )));
                    }
                    None => world = Some((w, name.clone())),
                    _ => {}
                }
            }
        }
        if let Some((w, _)) = &world
            && traces.len() as i64 >= (*w).max(1)
        {
            return Err(CliError::bad_input(format!(
                "more trace files than the job's world size of {w} ({name} is one too many)"
            )));
        }
        for w in &tr.warnings {
            tracing::warn!(file = %name, "{w}");
        }
        traces.push((name, tr));
    }
    let refs: Vec<(String, &KinetoTrace)> = traces.iter().map(|(n, t)| (n.clone(), t)).collect();
    let (mut ranks, warnings) = rank_steps(&refs, input.step).map_err(CliError::bad_input)?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let mut said: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for r in &ranks {
        for w in &r.built.warnings {
            said.entry(w.as_str()).or_default().push(r.rank);
        }
    }
    for (w, on) in said {
        let who = if on.len() == ranks.len() {
            "every rank".to_string()
        } else {
            format!(
                "rank {}",
                on.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            )
        };
        tracing::warn!("{who}: {w}");
    }
    let given = ranks.len() as u32;
    for r in ranks.iter_mut() {
        r.built.job.framework = input.framework;
        r.built.job.math = input.framework.default_math(&r.built.job.gpu);
        if let Some(f) = r.built.job.meta.trace.as_mut() {
            f.ranks_given = given;
        }
    }
    let n = ranks.len();
    // The global graph and its replay: checked against the ceiling before they are built.
    let ops: u64 = ranks
        .iter()
        .map(|r| r.built.job.local.ops.len() as u64 + 2)
        .sum();
    crate::limits::check(
        || format!("the {n} ranks' global graph of {} ops", thousands(ops)),
        ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP),
    )
    .map_err(|e| CliError::bad_input(format!("{e}: give it more memory or fewer ranks")))?;
    let g = global_graph(&ranks).map_err(CliError::bad_input)?;
    let (offsets, alignment) = if input.no_align || g.matched.is_empty() {
        if g.matched.is_empty() && !input.no_align {
            tracing::warn!("the ranks share no collective: their clocks are taken as recorded");
        }
        (vec![0i64; n], None)
    } else {
        let al = align(&collective_times(&ranks), &AlignOptions::default())
            .map_err(CliError::bad_input)?;
        if !al.constrained {
            tracing::warn!(
                "the clock-alignment constraints are infeasible (collectives end before their \
                 ranks start on every offset): used the unconstrained least-squares offsets"
            );
        }
        (al.offsets_ns.clone(), Some(al))
    };
    Ok(Loaded {
        ranks,
        offsets,
        alignment,
    })
}

/// Replay the ranks of one job.
pub fn replay_ranks_cmd(a: &ReplayArgs, files: &[PathBuf]) -> Result<(), CliError> {
    let t = Instant::now();
    let Loaded {
        ranks,
        offsets,
        alignment,
    } = load_ranks(&a.input, files)?;
    let g = global_graph(&ranks).map_err(CliError::bad_input)?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!(
        ranks = ranks.len(),
        ops = g.graph.op_count(),
        collectives = g.matched.len(),
        build_ms,
        "built the ranks' global graph"
    );

    let n = ranks.len();
    let t = Instant::now();
    let rr = replay_ranks(&ranks, &g, &offsets);
    let replay_wall_ms = t.elapsed().as_secs_f64() * 1e3;
    if let Some(path) = &a.timeline {
        super::distinct::check(
            &[super::distinct::Output::new("--timeline", path)],
            &[],
            &[],
        )?;
        write_atomic(path, |w| {
            timeline::write_chrome_trace(&g.graph, &rr.replay, w)
        })
        .map_err(|e| {
            CliError::output(format!("failed to write timeline {}: {e}", path.display()))
        })?;
    }
    let measured: Vec<u64> = ranks.iter().map(|r| r.measured_ns()).collect();
    let m_max = measured.iter().copied().max().unwrap_or(0);
    let p_max = rr.predicted_ns.iter().copied().max().unwrap_or(0);
    let errs: Vec<f64> = rr
        .predicted_ns
        .iter()
        .zip(&measured)
        .map(|(&p, &m)| pct(p, m))
        .collect();
    let mean_abs = errs.iter().map(|e| e.abs()).sum::<f64>() / n.max(1) as f64;
    let max_abs = errs.iter().map(|e| e.abs()).fold(0.0, f64::max);
    let step = ranks
        .first()
        .map(|r| r.built.window.label.clone())
        .unwrap_or_default();
    let mut o = out();
    if a.json {
        let per: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                json!({"rank": r.rank, "trace": r.file,
                       "measured_ms": measured[i] as f64 / 1e6,
                       "predicted_ms": rr.predicted_ns[i] as f64 / 1e6,
                       "error_pct": errs[i],
                       "clock_offset_us": offsets[i] as f64 / 1e3,
                       "release_ms": rr.release_ns[i] as f64 / 1e6})
            })
            .collect();
        let v = json!({
            "iteration_ms": p_max as f64 / 1e6,
            "measured_iteration_ms": m_max as f64 / 1e6,
            "error_pct": pct(p_max, m_max),
            "mean_abs_rank_error_pct": mean_abs,
            "max_abs_rank_error_pct": max_abs,
            "ops": g.graph.op_count(),
            "devices": g.graph.device_count(),
            "workers": n,
            "critical_path_ms": dependency_bound_ns(&g.graph) as f64 / 1e6,
            "peak_memory_bytes": null,
            "reserved_peak_bytes": null,
            "device_used_bytes": null,
            "replay_wall_ms": replay_wall_ms,
            "build_wall_ms": build_ms,
            "edges": g.graph.edge_count(),
            "step": step,
            "collectives": g.matched.len(),
            "aligned": alignment.is_some(),
            "alignment_spread_before_us": alignment.as_ref().map(|a| a.spread_before_ns / 1e3),
            "alignment_spread_after_us": alignment.as_ref().map(|a| a.spread_after_ns / 1e3),
            "ranks": per,
            "model": "trace",
            "cluster": "trace",
            "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
        });
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let mut lines = vec![
        format!(
            "{n} ranks, {step}: {} ops, {} devices, {} collectives matched; built in {build_ms:.0} ms, replayed in {replay_wall_ms:.1} ms",
            thousands(g.graph.op_count() as u64),
            g.graph.device_count(),
            g.matched.len()
        ),
        match &alignment {
            Some(al) => format!(
                "clocks aligned (dPRO §4.2 QP): spread of collective ends {:.1} µs → {:.1} µs",
                al.spread_before_ns / 1e3,
                al.spread_after_ns / 1e3
            ),
            None => "clocks as recorded (not aligned)".to_string(),
        },
        String::new(),
        format!(
            "{:>4}  {:>12}  {:>12}  {:>8}  {:>10}  trace",
            "rank", "measured ms", "predicted ms", "error", "offset µs"
        ),
    ];
    for (i, r) in ranks.iter().enumerate() {
        lines.push(format!(
            "{:>4}  {:>12.3}  {:>12.3}  {:>+7.2}%  {:>10.1}  {}",
            r.rank,
            measured[i] as f64 / 1e6,
            rr.predicted_ns[i] as f64 / 1e6,
            errs[i],
            offsets[i] as f64 / 1e3,
            r.file
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "slowest rank: measured {}, predicted {}, error {:+.2} %; mean |error| over ranks {mean_abs:.2} %, max {max_abs:.2} %", super::output::dur_ms(m_max as f64 / 1e6, 3), super::output::dur_ms(p_max as f64 / 1e6, 3),
        pct(p_max, m_max)
    ));
    if let Some(p) = &a.timeline {
        lines.push(format!(
            "timeline written to {} (open in ui.perfetto.dev)",
            p.display()
        ));
    }
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}

/// Every rank's job after `plan`'s passes (each pass proposes on each rank's own graph), and
/// the evaluations before and after of each.
pub fn apply_to_ranks(
    ranks: &[RankStep],
    plan: &super::pass_plan::PassPlan,
) -> Result<
    (
        Vec<RankStep>,
        Vec<(Evaluated, Evaluated)>,
        Vec<serde_json::Value>,
    ),
    CliError,
> {
    let mut after = Vec::with_capacity(ranks.len());
    let mut evals = Vec::with_capacity(ranks.len());
    let mut applied = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        // A pass that cannot apply to this rank's recorded step says which rank and file.
        let (b, c, ap) =
            super::pass_plan::run_passes(r.built.job.clone(), plan, i == 0).map_err(|mut e| {
                e.message = format!("{} (rank {}): {}", r.file, r.rank, e.message);
                e
            })?;
        if i == 0 {
            applied = ap;
        }
        after.push(with_job(r, c.job.clone()).map_err(CliError::bad_input)?);
        evals.push((b, c));
    }
    // Each rank's sites are chosen on its own graph: ranks whose recorded steps read
    // differently (a hook's span on one rank only) can lose different collectives, and the
    // global graph needs them matched.
    crate::trace::multi::check_matching(&after).map_err(|e| {
        CliError::bad_input(format!(
            "the passes changed the ranks' collectives differently, so they no longer match \
             across ranks: {e}"
        ))
    })?;
    Ok((after, evals, applied))
}

/// `trainplan whatif` on the ranks of one job: every pass applied to every rank's graph (each
/// rank's sites chosen on its own graph), then all ranks replayed together — stragglers,
/// skew and the collectives' waits stay in the replay.
pub fn whatif_ranks_cmd(
    a: &WhatifArgs,
    files: &[PathBuf],
    plan: &super::pass_plan::PassPlan,
) -> Result<(), CliError> {
    let t = Instant::now();
    let Loaded { ranks, offsets, .. } = load_ranks(&a.input, files)?;
    let base = predict(&ranks, &offsets).map_err(CliError::bad_input)?;
    let (after_ranks, evals, applied) = apply_to_ranks(&ranks, plan)?;
    let after = predict(&after_ranks, &offsets).map_err(CliError::bad_input)?;
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let mem_known = ranks
        .iter()
        .all(|r| super::traceinfo::has_memory(&r.built.job));
    let peak = |f: fn(&(Evaluated, Evaluated)) -> u64| -> Option<u64> {
        mem_known.then(|| evals.iter().map(f).max().unwrap_or(0))
    };
    let (m0, m1) = (
        peak(|e| e.0.memory.peaks.allocated),
        peak(|e| e.1.memory.peaks.allocated),
    );
    let (r0, r1) = (
        peak(|e| e.0.memory.peaks.reserved),
        peak(|e| e.1.memory.peaks.reserved),
    );
    let (d0, d1) = (
        peak(|e| e.0.memory.peaks.device_used),
        peak(|e| e.1.memory.peaks.device_used),
    );
    let over = mem_known.then(|| {
        evals
            .iter()
            .any(|e| super::memory::over_capacity(&e.1.memory.peaks, &e.1.job))
    });
    let speedup = base.step_ns as f64 / after.step_ns.max(1) as f64;
    let mut o = out();
    if a.json {
        let per: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                json!({"rank": r.rank, "trace": r.file,
                       "baseline_ms": base.predicted_ns[i] as f64 / 1e6,
                       "ms": after.predicted_ns[i] as f64 / 1e6,
                       "baseline_peak_memory_bytes": mem_known.then_some(evals[i].0.memory.peaks.allocated),
                       "peak_memory_bytes": mem_known.then_some(evals[i].1.memory.peaks.allocated),
                       "reserved_peak_bytes": mem_known.then_some(evals[i].1.memory.peaks.reserved),
                       "device_used_bytes": mem_known.then_some(evals[i].1.memory.peaks.device_used)})
            })
            .collect();
        let v = json!({
            "baseline_iteration_ms": base.step_ns as f64 / 1e6,
            "iteration_ms": after.step_ns as f64 / 1e6,
            "speedup": speedup,
            "baseline_peak_memory_bytes": m0,
            "peak_memory_bytes": m1,
            "baseline_reserved_peak_bytes": r0,
            "reserved_peak_bytes": r1,
            "baseline_device_used_bytes": d0,
            "device_used_bytes": d1,
            "memory_over_capacity": over,
            "baseline_makespan_ms": base.makespan_ns as f64 / 1e6,
            "makespan_ms": after.makespan_ns as f64 / 1e6,
            "metric": "slowest rank's step",
            "workers": ranks.len(),
            "ranks": per,
            "passes": applied,
            "trace_facts": ranks.first().map(|r| super::traceinfo::facts_json(&r.built.job)),
            "model": "trace",
            "cluster": "trace",
            "wall_ms": wall_ms,
        });
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let names: Vec<&str> = a.pass.iter().map(String::as_str).collect();
    let mut lines = vec![format!(
        "{} ranks, {}: what if {} (applied to every rank)",
        ranks.len(),
        ranks
            .first()
            .map(|r| r.built.window.label.clone())
            .unwrap_or_default(),
        names.join(" + ")
    )];
    if let Some(f) = ranks
        .first()
        .and_then(|r| super::traceinfo::facts(&r.built.job))
    {
        lines.push(super::traceinfo::facts_line(f));
    }
    lines.push(String::new());
    lines.push(format!(
        "{:>4}  {:>12}  {:>12}  {:>8}",
        "rank", "before ms", "after ms", "change"
    ));
    for (i, r) in ranks.iter().enumerate() {
        lines.push(format!(
            "{:>4}  {:>12.3}  {:>12.3}  {:>+7.1}%",
            r.rank,
            base.predicted_ns[i] as f64 / 1e6,
            after.predicted_ns[i] as f64 / 1e6,
            pct(after.predicted_ns[i], base.predicted_ns[i])
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "iteration        {} → {} ({:+.1} %): the slowest rank's step; speedup {speedup:.3}x",
        super::output::dur_ms(base.step_ns as f64 / 1e6, 3),
        super::output::dur_ms(after.step_ns as f64 / 1e6, 3),
        pct(after.step_ns, base.step_ns)
    ));
    match (m0, m1) {
        (Some(x), Some(y)) => lines.push(format!(
            "peak memory      {} → {} (the fullest rank)",
            super::output::gb(x),
            super::output::gb(y)
        )),
        _ => lines.push(
            "peak memory      not in the traces (record with profile_memory=True, or \
             record_shapes=True for an estimate)"
                .into(),
        ),
    }
    for p in &applied {
        if let Some(w) = p["why"].as_array().and_then(|w| w.first()) {
            lines.push(format!(
                "\n{} (rank {}): {}",
                p["pass"].as_str().unwrap_or(""),
                ranks.first().map_or(0, |r| r.rank),
                w.as_str().unwrap_or("")
            ));
        }
    }
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}
