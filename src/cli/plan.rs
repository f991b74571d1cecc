//! `trainplan plan`: run the baselines and the search, write the plan YAML atomically, print a
//! summary (or one JSON object). Ctrl-C writes the best plan so far and exits 130.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use super::output::gb;
use super::replay::input_job;
use super::whatif::all_passes;
use super::{CliError, PlanArgs, exit, write_atomic};
use crate::plan::{
    FinalConfig, Plan, Point, Predicted, SCHEMA_VERSION, SearchStats, Workload, round3,
};
use crate::search::{self, Decision, SearchError, SearchOptions, Speedups, StopReason};

/// Set by the Ctrl-C handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Parse a byte size: `16GiB`, `16GB`, `16G` (= GiB), `512MiB`, `17000000000`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 16GiB, 80GB, 512MiB)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024.0f64.powi(4),
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{s}` (use B, MB, MiB, GB, GiB, TB, TiB)"
            ));
        }
    };
    let bytes = v * mult;
    if !(bytes.is_finite() && (1.0..1e18).contains(&bytes)) {
        return Err(format!(
            "`{s}` is not a sensible size (1 byte to 10^18 bytes)"
        ));
    }
    Ok(bytes as u64)
}

/// Parse `--budget`: `1h`, `90s`, `2m 30s`, `1.5h`.
pub fn parse_budget(s: &str) -> Result<Duration, String> {
    let d = match humantime::parse_duration(s) {
        Ok(d) => d,
        Err(_) => {
            // humantime has no fractions: accept `1.5h` and plain seconds.
            let t = s.trim();
            let (num, unit) =
                t.split_at(t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len()));
            let v: f64 = num
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a duration (examples: 1h, 90s, 2m30s, 1.5h)"))?;
            let secs = match unit.trim() {
                "" | "s" => v,
                "m" | "min" => v * 60.0,
                "h" => v * 3600.0,
                _ => {
                    return Err(format!(
                        "`{s}` is not a duration (examples: 1h, 90s, 2m30s, 1.5h)"
                    ));
                }
            };
            if !(secs.is_finite() && (0.0..1e9).contains(&secs)) {
                return Err(format!("`{s}` is not a sensible budget"));
            }
            Duration::from_secs_f64(secs)
        }
    };
    if d.is_zero() {
        return Err("the budget must be more than 0 s".into());
    }
    if d > MAX_BUDGET {
        return Err(format!(
            "`{s}` is more than the longest budget, {} days",
            MAX_BUDGET.as_secs() / 86_400
        ));
    }
    Ok(d)
}

/// Longest `--budget`: 30 days (the search converges in seconds to minutes; a longer budget is
/// a typo, and `500000000000years` once passed).
pub const MAX_BUDGET: Duration = Duration::from_secs(30 * 86_400);

/// The threads candidates are evaluated on, within the memory ceiling: one evaluation of `job`
/// in the form the search uses (symmetric when allowed) needs
/// [`crate::graph::bounds::expanded_ops`] × [`crate::limits::EVAL_BYTES_PER_OP`] bytes. A
/// large job ([`search::LEAN_OPS`] ops and more), or one whose parallel evaluations would not
/// fit, is evaluated one candidate at a time — so `plan` needs about what `replay` needs; one
/// that does not fit even alone is refused with what it would need (exit 3).
fn eval_pool(job: &crate::graph::job::Job, symmetry: bool) -> Result<rayon::ThreadPool, CliError> {
    let mut form = job.clone();
    if symmetry && form.comm.scheme == crate::cost::config::SyncScheme::Ring && form.workers > 1 {
        form.symmetric = true;
    }
    let ops = crate::graph::bounds::expanded_ops(&form);
    let one = ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP);
    let threads = rayon::current_num_threads().max(1) as u64;
    crate::limits::check(|| format!("evaluating the job's {ops} ops"), one)
        .map_err(CliError::bad_input)?;
    let lean = ops >= search::LEAN_OPS as u64
        || one.saturating_mul(threads + 1) > crate::limits::available();
    if lean {
        tracing::info!(
            ops,
            gb = one as f64 / 1e9,
            "large job: candidates evaluated one at a time"
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(if lean { 1 } else { 0 })
        .build()
        .map_err(CliError::internal)
}

/// `trainplan plan`.
pub fn plan_cmd(a: &PlanArgs) -> Result<(), CliError> {
    let budget = parse_budget(&a.budget).map_err(|e| CliError::usage(format!("--budget: {e}")))?;
    let memory_budget = a
        .memory_budget
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .map_err(|e| CliError::usage(format!("--memory-budget: {e}")))?;
    let all = all_passes(&a.pass_file)?;
    let passes = match &a.passes {
        None => None,
        Some(list) => {
            let names: Vec<String> = list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            for n in &names {
                crate::passes::find(&all, n).map_err(CliError::bad_input)?;
            }
            Some(names)
        }
    };
    // Several ranks: the search runs on the slowest rank (collectives hold every rank to it);
    // its decisions are then applied to every rank and all are replayed together.
    let files = if a.input.trace.is_empty() {
        Vec::new()
    } else {
        super::replay::refuse_trace_precision(&a.input)?;
        crate::trace::expand_inputs(&a.input.trace).map_err(CliError::bad_input)?
    };
    let ranks = if files.len() > 1 {
        let l = super::ranks::load_ranks(&a.input, &files)?;
        let base =
            crate::trace::multi::predict(&l.ranks, &l.offsets).map_err(CliError::bad_input)?;
        Some((l, base))
    } else {
        None
    };
    let input = match &ranks {
        Some((l, base)) => {
            let slowest = (0..l.ranks.len())
                .max_by_key(|&i| (base.predicted_ns[i], std::cmp::Reverse(i)))
                .unwrap_or(0);
            let r = &l.ranks[slowest];
            tracing::info!(rank = r.rank, "planning on the slowest rank");
            let mut job = r.built.job.clone();
            let dir = a
                .input
                .trace
                .first()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| "trace".into());
            job.meta.model = format!("{dir} (search on the slowest, rank {})", r.rank);
            super::replay::Input {
                job,
                sync: None,
                model: None,
                cluster: None,
                trace: None,
            }
        }
        None => input_job(&a.input)?,
    };
    let opts = SearchOptions {
        budget,
        memory_budget,
        passes,
        strategy: a.strategy,
        seed: a.seed,
        speedups: Speedups {
            coarsen: !a.no_coarsen,
            partial_replay: !a.no_partial_replay,
            symmetry: !a.no_symmetry,
        },
        ..SearchOptions::default()
    };
    // Ctrl-C stops the search, which then writes its best plan (a second Ctrl-C exits at once).
    super::atomic::interrupt_flag(&INTERRUPTED);
    let show = !a.json && std::io::stderr().is_terminal();
    let bar = if show {
        let b = indicatif::ProgressBar::new(budget.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} searching [{bar:30}] {msg} · {elapsed} of the budget used",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        Some(b)
    } else {
        None
    };
    let say = |msg: &str| {
        if let Some(b) = &bar {
            b.set_message(msg.to_string());
        }
    };

    say("baselines");
    let eval = search::evaluator(opts.speedups.symmetry);
    // The baselines rewrite the job with one collective per gradient tensor.
    let job = match &input.sync {
        Some((per_tensor, _)) => per_tensor.clone(),
        None => input.job.clone(),
    };
    let pool = eval_pool(&job, opts.speedups.symmetry)?;
    // Baselines stop early on Ctrl-C: the plan so far is then the unoptimised job.
    let eval_or_stop = |j: crate::graph::job::Job| -> Result<_, crate::graph::job::JobError> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return Err(crate::graph::job::JobError::Invalid("interrupted".into()));
        }
        eval(j)
    };
    let recorded = job.is_recorded();
    let made = pool.install(|| {
        if recorded {
            search::baselines::recorded(&job, &eval_or_stop)
        } else {
            search::baselines::baselines(&job, &eval_or_stop)
        }
    });
    let baselines = match made {
        Ok(b) => b,
        Err(_) if INTERRUPTED.load(Ordering::Relaxed) => Vec::new(),
        Err(e) => return Err(CliError::bad_input(e)),
    };
    let best_baseline = baselines
        .iter()
        .min_by_key(|b| b.eval.iteration_ns())
        .filter(|b| b.name != "none" && b.name != search::baselines::AS_RECORDED);
    let none_ns = baselines.first().map_or(0, |b| b.eval.iteration_ns());
    let start = best_baseline.map(|b| {
        (
            b.job.clone(),
            Decision {
                pass: format!("baseline:{}", b.name),
                tensors: Vec::new(),
                ops: Vec::new(),
                partitions: None,
                knobs: BTreeMap::new(),
                why: format!(
                    "start from the fastest framework default: {} ({})",
                    b.name, b.config
                ),
                effect_ms: (b.eval.iteration_ns() as f64 - none_ns as f64) / 1e6,
            },
        )
    });
    let progress = |p: &search::Progress| {
        if let Some(b) = &bar {
            b.set_position(p.elapsed.as_millis() as u64);
            b.set_message(format!(
                "best {:.1} ms · {} replays · round {}",
                p.best_ns as f64 / 1e6,
                p.replays,
                p.round
            ));
        }
    };
    let outcome = match pool
        .install(|| search::search(job.clone(), start, &opts, &all, &INTERRUPTED, &progress))
    {
        Ok(o) => o,
        Err(e @ SearchError::Infeasible { .. }) => {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            return Err(CliError {
                code: exit::INFEASIBLE,
                message: e.to_string(),
            });
        }
        Err(e) => return Err(CliError::bad_input(e)),
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let lower =
        search::comm_free_bound_ns(&outcome.best.job, &eval).map_err(CliError::bad_input)?;
    let ms3 = |ns: u64| round3(ns as f64 / 1e6);
    let (b, p) = (&outcome.baseline, &outcome.best);
    // Several ranks: the decisions applied to every rank, all replayed together.
    let multi = match &ranks {
        Some((l, base)) => {
            let mut seen = std::collections::BTreeSet::new();
            let mut args = Vec::new();
            for d in &outcome.decisions {
                if d.pass.starts_with("baseline:") {
                    continue;
                }
                let knobs: Vec<String> = d.knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let arg = if knobs.is_empty() {
                    d.pass.clone()
                } else {
                    format!("{}:{}", d.pass, knobs.join(","))
                };
                if seen.insert(arg.clone()) {
                    args.push(arg);
                }
            }
            let plan = super::whatif::resolve(&all, &args)?;
            let (after, evals, _) = super::ranks::apply_to_ranks(&l.ranks, &plan)?;
            let planned =
                crate::trace::multi::predict(&after, &l.offsets).map_err(CliError::bad_input)?;
            let peak = |f: fn(&(crate::passes::Evaluated, crate::passes::Evaluated)) -> u64| {
                evals.iter().map(f).max().unwrap_or(0)
            };
            Some(RanksPlan {
                baseline_ns: base.step_ns,
                planned_ns: planned.step_ns,
                baseline_peak: peak(|e| e.0.memory.peak_bytes),
                planned_peak: peak(|e| e.1.memory.peak_bytes),
                per_rank: l
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.rank, base.predicted_ns[i], planned.predicted_ns[i]))
                    .collect(),
            })
        }
        None => None,
    };
    let (b_ns, p_ns, b_mem, p_mem) = match &multi {
        Some(m) => (m.baseline_ns, m.planned_ns, m.baseline_peak, m.planned_peak),
        None => (
            b.iteration_ns(),
            p.iteration_ns(),
            b.memory.peak_bytes,
            p.memory.peak_bytes,
        ),
    };
    let facts = job.meta.trace.as_deref();
    let plan = Plan {
        trainplan: SCHEMA_VERSION,
        workload: Workload {
            source: job.meta.source.clone(),
            ranks: match (&ranks, facts) {
                (Some((l, _)), f) => f.and_then(|f| f.world_size).unwrap_or(l.ranks.len() as u32),
                (None, Some(f)) => f.world_size.unwrap_or(1),
                (None, None) => job.workers,
            },
            model: job.meta.model.clone(),
            batch: job.meta.batch,
            cluster: job.meta.cluster.clone(),
            names: job.meta.source.clone(),
        },
        predicted: Predicted {
            baseline: Point {
                iteration_ms: ms3(b_ns),
                peak_memory_bytes: b_mem,
            },
            planned: Point {
                iteration_ms: ms3(p_ns),
                peak_memory_bytes: p_mem,
            },
            speedup: round3(b_ns as f64 / p_ns.max(1) as f64),
            lower_bound_ms: ms3(lower.min(p_ns)),
        },
        baselines: baselines
            .iter()
            .map(|x| {
                let ns = match (&multi, x.name) {
                    (Some(m), search::baselines::AS_RECORDED) => m.baseline_ns,
                    _ => x.eval.iteration_ns(),
                };
                (x.name.to_string(), ms3(ns))
            })
            .collect(),
        decisions: outcome
            .decisions
            .iter()
            .map(|d| Decision {
                effect_ms: round3(d.effect_ms),
                ..d.clone()
            })
            .collect(),
        config: FinalConfig::of(&p.job, &outcome.decisions),
        search: SearchStats {
            strategy: opts.strategy,
            budget_s: budget.as_secs_f64(),
            replays: outcome.replays,
            rounds: outcome.rounds,
            stop: outcome.stop,
            seed: opts.seed,
        },
    };
    write_atomic(&a.output, |w| w.write_all(plan.to_yaml().as_bytes())).map_err(|e| {
        CliError::output(format!(
            "failed to write the plan to {}: {e}",
            a.output.display()
        ))
    })?;
    let extra = TraceExtra::of(&outcome, multi.as_ref());
    report(a, &plan, &outcome, &extra)?;
    if outcome.stop == StopReason::Interrupted {
        return Err(CliError {
            code: exit::INTERRUPTED,
            message: format!(
                "interrupted: the best plan so far is in {}",
                a.output.display()
            ),
        });
    }
    Ok(())
}

/// Several ranks planned together.
struct RanksPlan {
    baseline_ns: u64,
    planned_ns: u64,
    baseline_peak: u64,
    planned_peak: u64,
    /// (rank, baseline ns, planned ns).
    per_rank: Vec<(u32, u64, u64)>,
}

/// What a plan on a trace adds to its report.
struct TraceExtra {
    facts: Option<String>,
    facts_json: serde_json::Value,
    /// Whether the trace has memory figures.
    memory: bool,
    lines: Vec<String>,
    bound: serde_json::Value,
    host_bound: bool,
    makespan: Option<(u64, u64)>,
    ranks: Option<serde_json::Value>,
}

impl TraceExtra {
    fn of(outcome: &search::Outcome, multi: Option<&RanksPlan>) -> TraceExtra {
        let (b, p) = (&outcome.baseline, &outcome.best);
        let job = &b.job;
        let bb = super::traceinfo::Bound::of(b);
        let pb = super::traceinfo::Bound::of(p);
        let mut lines = Vec::new();
        if job.is_recorded() {
            lines.push(super::traceinfo::path_line(&bb));
            lines.extend(super::traceinfo::explain(
                &bb,
                &pb,
                (b.iteration_ns(), p.iteration_ns()),
            ));
        }
        TraceExtra {
            facts: super::traceinfo::facts(job).map(super::traceinfo::facts_line),
            facts_json: super::traceinfo::facts_json(job),
            memory: super::traceinfo::has_memory(job),
            lines,
            bound: super::traceinfo::bound_json(&bb, Some(&pb)),
            host_bound: job.is_recorded() && bb.share.host_bound(),
            makespan: b.steady.map(|_| (b.makespan_ns(), p.makespan_ns())),
            ranks: multi.map(|m| {
                json!(
                    m.per_rank
                        .iter()
                        .map(
                            |&(r, x, y)| json!({"rank": r, "baseline_ms": x as f64 / 1e6,
                                             "planned_ms": y as f64 / 1e6})
                        )
                        .collect::<Vec<_>>()
                )
            }),
        }
    }
}

fn report(
    a: &PlanArgs,
    plan: &Plan,
    outcome: &search::Outcome,
    extra: &TraceExtra,
) -> Result<(), CliError> {
    let mut o = super::output::stdout();
    let mem = |v: u64| extra.memory.then_some(v);
    if a.json {
        let v = json!({
            "baseline_iteration_ms": plan.predicted.baseline.iteration_ms,
            "planned_iteration_ms": plan.predicted.planned.iteration_ms,
            "speedup": plan.predicted.speedup,
            "baselines": plan.baselines,
            "lower_bound_ms": plan.predicted.lower_bound_ms,
            "search_wall_s": outcome.wall.as_secs_f64(),
            "replays": outcome.replays,
            "stop_reason": outcome.stop,
            "decisions": plan.decisions,
            "plan_path": a.output.display().to_string(),
            "baseline_peak_memory_bytes": mem(plan.predicted.baseline.peak_memory_bytes),
            "planned_peak_memory_bytes": mem(plan.predicted.planned.peak_memory_bytes),
            "rounds": outcome.rounds,
            "config": plan.config,
            "trace_facts": extra.facts_json,
            "host_bound": extra.host_bound,
            "bound": extra.bound,
            "baseline_makespan_ms": extra.makespan.map(|m| m.0 as f64 / 1e6),
            "planned_makespan_ms": extra.makespan.map(|m| m.1 as f64 / 1e6),
            "ranks": extra.ranks,
        });
        return writeln!(o, "{v}").map_err(super::CliError::stdout);
    }
    let w = &plan.workload;
    let head = match &extra.facts {
        Some(_) => format!(
            "{} (trace, {}): planned {:.1} ms per step, {:.2}x faster than as recorded",
            w.model,
            if w.ranks > 1 {
                format!("{} ranks", w.ranks)
            } else {
                "1 GPU".into()
            },
            plan.predicted.planned.iteration_ms,
            plan.predicted.speedup
        ),
        None => format!(
            "{} (batch {}/GPU) on {} ({} GPUs): planned {:.1} ms, {:.2}x faster than no optimisation",
            w.model,
            w.batch,
            w.cluster,
            w.ranks,
            plan.predicted.planned.iteration_ms,
            plan.predicted.speedup
        ),
    };
    let mut lines = vec![head];
    if let Some(f) = &extra.facts {
        lines.push(f.clone());
    }
    lines.extend([String::new(), format!("{:<18} {:>10}", "", "iteration")]);
    let best_base = plan
        .baselines
        .values()
        .cloned()
        .fold(f64::INFINITY, f64::min);
    for (name, v) in &plan.baselines {
        lines.push(format!("{name:<18} {v:>7.1} ms"));
    }
    lines.push(format!(
        "{:<18} {:>7.1} ms   {:+.1} % vs the best baseline",
        "trainplan",
        plan.predicted.planned.iteration_ms,
        100.0 * (plan.predicted.planned.iteration_ms / best_base - 1.0)
    ));
    lines.push(format!(
        "{:<18} {:>7.1} ms   (the plan if synchronisation were free)",
        "lower bound", plan.predicted.lower_bound_ms
    ));
    if extra.memory {
        lines.push(format!(
            "peak memory        {} → {}",
            gb(plan.predicted.baseline.peak_memory_bytes),
            gb(plan.predicted.planned.peak_memory_bytes)
        ));
    } else {
        lines.push(
            "peak memory        not in the trace (record with profile_memory=True, or \
             record_shapes=True for an estimate)"
                .into(),
        );
    }
    if let Some((b, p)) = extra.makespan {
        lines.push(format!(
            "makespan           {:.1} ms → {:.1} ms   (one step until its GPU work drains; the \
             iteration above is the steady-state period)",
            b as f64 / 1e6,
            p as f64 / 1e6
        ));
    }
    if !extra.lines.is_empty() {
        lines.push(String::new());
        lines.extend(extra.lines.iter().cloned());
    }
    lines.push(String::new());
    lines.push(format!("{} decisions:", plan.decisions.len()));
    for d in plan.decisions.iter().take(12) {
        let what = if !d.tensors.is_empty() {
            format!("{} tensors", d.tensors.len())
        } else if d.ops.len() > 3 {
            format!(
                "{} ops: {} + … + {}",
                d.ops.len(),
                d.ops[0],
                d.ops[d.ops.len() - 1]
            )
        } else if !d.ops.is_empty() {
            d.ops.join(" + ")
        } else {
            String::new()
        };
        lines.push(format!(
            "  {:>+8.2} ms  {:<18} {}",
            d.effect_ms, d.pass, what
        ));
    }
    if plan.decisions.len() > 12 {
        lines.push(format!(
            "  … {} more in the plan",
            plan.decisions.len() - 12
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "search: {:?}, {} replays in {} rounds, {:.1} s ({:?}); plan written to {}",
        plan.search.strategy,
        outcome.replays,
        outcome.rounds,
        outcome.wall.as_secs_f64(),
        outcome.stop,
        a.output.display()
    ));
    lines.push(format!(
        "next: trainplan export {} --to pytorch",
        a.output.display()
    ));
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("16GB").unwrap(), 16_000_000_000);
        assert_eq!(parse_bytes("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("17000000000").unwrap(), 17_000_000_000);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("16 parsecs").is_err());
        assert!(parse_bytes("0").is_err());
    }

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_budget("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_budget("2m30s").unwrap(), Duration::from_secs(150));
        assert_eq!(parse_budget("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_budget("45").unwrap(), Duration::from_secs(45));
        assert!(parse_budget("soon").is_err());
        assert!(parse_budget("0s").is_err());
        assert!(parse_budget("-5s").is_err());
        assert_eq!(parse_budget("30days").unwrap(), MAX_BUDGET);
        assert!(parse_budget("500000000000years").is_err());
        assert!(parse_budget("1e300").is_err());
    }
}
