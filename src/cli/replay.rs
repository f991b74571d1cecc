//! `trainplan models`, `trainplan clusters` and `trainplan replay`.

use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::output::thousands;
use super::report::{self, out, top_items_json};
use super::source::{self, Built, Extrapolation, Source, TraceInput};
use super::{CliError, ListArgs, ReplayArgs};
use crate::cost::config::{self, Cluster};
use crate::replay::critical::CriticalPath;
use crate::replay::memory::MemoryReport;
use crate::replay::{self, breakdown, critical_path, dependency_bound_ns, peak_memory};
use crate::zoo;

/// `trainplan models`.
pub fn models(a: &ListArgs) -> Result<(), CliError> {
    let mut o = out();
    if a.json {
        let list: Vec<_> = zoo::MODELS
            .iter()
            .map(|m| {
                json!({"name": m.name, "description": m.doc, "default_batch": m.default_batch,
                       "optimizer": m.optimizer, "transformer_options": m.transformer})
            })
            .collect();
        writeln!(o, "{}", json!({ "models": list })).map_err(CliError::stdout)?;
        return Ok(());
    }
    writeln!(o, "{:<14} {:>6}  description", "model", "batch").map_err(CliError::stdout)?;
    for m in zoo::MODELS {
        writeln!(o, "{:<14} {:>6}  {}", m.name, m.default_batch, m.doc)
            .map_err(CliError::stdout)?;
    }
    writeln!(
        o,
        "\nThe transformers (bert-*, gpt*, llama*) take --hidden --heads --layers --seq --vocab --ffn (llama: --kv-heads); all take --batch."
    )
    .map_err(CliError::stdout)
}

/// `trainplan clusters`.
pub fn clusters(a: &ListArgs) -> Result<(), CliError> {
    let mut list = Vec::new();
    for name in config::builtins("clusters") {
        list.push(config::load_cluster(name).map_err(CliError::internal)?);
    }
    let mut o = out();
    if a.json {
        let v: Vec<_> = list
            .iter()
            .map(|c| {
                json!({"name": c.name, "description": c.description, "workers": c.workers(),
                       "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "gpu": c.gpu.name,
                       "intra": c.intra.name, "inter": c.inter.as_ref().map(|n| &n.name),
                       "sync": c.sync})
            })
            .collect();
        writeln!(o, "{}", json!({ "clusters": v })).map_err(CliError::stdout)?;
        return Ok(());
    }
    writeln!(o, "{:<20} {:>7}  description", "cluster", "GPUs").map_err(CliError::stdout)?;
    for c in &list {
        writeln!(o, "{:<20} {:>7}  {}", c.name, c.workers(), c.description)
            .map_err(CliError::stdout)?;
    }
    writeln!(o, "\nGPUs: {}", config::builtins("gpus").join(", ")).map_err(CliError::stdout)?;
    writeln!(o, "networks: {}", config::builtins("networks").join(", "))
        .map_err(CliError::stdout)?;
    writeln!(
        o,
        "A cluster file of your own: --cluster my.yaml (see configs/clusters/ for the format)."
    )
    .map_err(CliError::stdout)
}

/// `trainplan replay`: resolve the input (several ranks and a Chakra trace have their own
/// reports), build and replay it, write the timeline if asked, report.
pub fn replay_cmd(a: &ReplayArgs) -> Result<(), CliError> {
    let b = match source::resolve(&a.input)? {
        Source::Chakra(path) => return super::chakra::replay(a, &path),
        Source::Ranks(files) => return super::ranks::replay_ranks_cmd(a, &files),
        src => source::build(&a.input, &src)?,
    };
    let run = Replayed::of(&b)?;
    if let Some(path) = &a.timeline {
        report::write_timeline(path, &b.graph, &run.replay)?;
    }
    let mut o = report::out();
    if let Some(t) = &b.trace {
        return trace_report(a, &b, t, &run, &mut o);
    }
    let (Some(model), Some(c)) = (&b.model, &b.cluster) else {
        return Err(CliError::internal("a zoo input without its model"));
    };
    super::memory::warn_if_over(&run.mem.peaks, &b.job);
    if a.json {
        return report::json_line(&mut o, &zoo_json(a, &b, &run, model, c));
    }
    report::lines(&mut o, &zoo_lines(&b, &run, model, c))?;
    for i in run.items.iter().take(8) {
        writeln!(
            o,
            "    {:>11}  {:>5.1} %  {}",
            super::output::dur_ms(i.dur_ns as f64 / 1e6, 2),
            100.0 * i.dur_ns as f64 / run.replay.iteration_ns.max(1) as f64,
            i.name
        )
        .map_err(CliError::stdout)?;
    }
    if let Some(p) = &a.timeline {
        writeln!(
            o,
            "\ntimeline written to {} (open in ui.perfetto.dev)",
            p.display()
        )
        .map_err(CliError::stdout)?;
    }
    Ok(())
}

/// A built graph replayed, and what the reports read off the replay.
struct Replayed {
    replay: replay::Replay,
    wall_ms: f64,
    cp: CriticalPath,
    /// The longest dependency chain (unlimited devices), ns.
    dep_ns: u64,
    mem: MemoryReport,
    bd: breakdown::Breakdown,
    sum: breakdown::Summary,
    items: Vec<breakdown::PathItem>,
}

impl Replayed {
    /// Replay `b`'s graph (refusing a replay beyond the physical bounds) and analyse it.
    fn of(b: &Built) -> Result<Replayed, CliError> {
        let g = &b.graph;
        let t = Instant::now();
        let r = replay::replay(g);
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        crate::graph::bounds::check_replayed(r.iteration_ns).map_err(CliError::bad_input)?;
        let cp = critical_path(g, &r);
        let dep_ns = dependency_bound_ns(g);
        let mem = peak_memory(g, &r).with_peaks(
            g,
            &r,
            &b.job.memory,
            b.job.communicators(),
            b.job.gpu.memory_bytes(),
        );
        let bd = breakdown::breakdown(g, &r, 0);
        let sum = breakdown::summary(g, &r, &cp);
        let items = breakdown::critical_path_items(g, &cp);
        Ok(Replayed {
            replay: r,
            wall_ms,
            cp,
            dep_ns,
            mem,
            bd,
            sum,
            items,
        })
    }
}

/// A zoo replay as one JSON object.
fn zoo_json(
    a: &ReplayArgs,
    b: &Built,
    run: &Replayed,
    model: &zoo::Model,
    c: &Cluster,
) -> serde_json::Value {
    let (g, r, bd, sum) = (&b.graph, &run.replay, &run.bd, &run.sum);
    let mut v = json!({
        "iteration_ms": r.iteration_ns as f64 / 1e6,
        "measured_iteration_ms": null,
        "error_pct": null,
        "ops": g.op_count(),
        "devices": g.device_count(),
        "workers": g.represented_workers(),
        "critical_path_ms": run.dep_ns as f64 / 1e6,
        "replay_wall_ms": run.wall_ms,
        "build_wall_ms": b.build_ms,
        "edges": g.edge_count(),
        "symmetric": g.is_symmetric_form(),
        "model": model.name,
        "batch": model.batch,
        "cluster": c.name,
        "compute_ms": bd.compute_ns as f64 / 1e6,
        "communication_ms": bd.comm_ns as f64 / 1e6,
        "overlap_ms": bd.overlap_ns as f64 / 1e6,
        "exposed_communication_ms": sum.exposed_comm_ns as f64 / 1e6,
        "host_bound": sum.host_bound(),
        "host_critical_path_ms": sum.host_path_ns as f64 / 1e6,
        "memory_over_capacity": super::memory::over_capacity(&run.mem.peaks, &b.job),
        "gpu_memory_bytes": c.gpu.memory_bytes(),
        "framework": a.input.framework.name(),
        "critical_path_top": top_items_json(&run.items),
        "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
    });
    super::memory::extend(&mut v, super::memory::fields(&run.mem.peaks, ""));
    v
}

/// A zoo replay's summary: the job, the graph, the iteration's parts, memory, the critical
/// path by phase (its largest items follow).
fn zoo_lines(b: &Built, run: &Replayed, model: &zoo::Model, c: &Cluster) -> Vec<String> {
    let (g, r, bd, sum, mem) = (&b.graph, &run.replay, &run.bd, &run.sum, &run.mem);
    let dur = |ns| super::output::dur(ns, 1);
    vec![
        format!(
            "{} (batch {}/GPU, {} params) on {} ({} x {}, {:?} all-reduce)",
            model.name,
            model.batch,
            thousands(model.param_elems()),
            c.name,
            c.workers(),
            c.gpu.model,
            c.sync
        ),
        format!(
            "graph: {} ops, {} edges, {} devices, {} workers{}; built in {:.0} ms, replayed in {:.0} ms",
            thousands(g.op_count() as u64),
            thousands(g.edge_count() as u64),
            g.device_count(),
            g.represented_workers(),
            if g.is_symmetric_form() {
                " (symmetric form: 1 worker + quotient ring)"
            } else {
                ""
            },
            b.build_ms,
            run.wall_ms
        ),
        String::new(),
        format!("iteration        {:>12}", dur(r.iteration_ns)),
        format!(
            "  compute        {:>12}   worker 0's GPU stream busy",
            dur(bd.compute_ns)
        ),
        format!(
            "  communication  {:>12}   worker 0's SEND/RECV",
            dur(bd.comm_ns)
        ),
        format!("  overlap        {:>12}   both at once", dur(bd.overlap_ns)),
        format!(
            "  exposed comm.  {:>12}   communication with no compute beside it",
            dur(sum.exposed_comm_ns)
        ),
        format!(
            "  host           {:>12}   on the critical path ({}-bound: {})",
            dur(sum.host_path_ns),
            if sum.host_bound() { "host" } else { "GPU" },
            if sum.host_bound() {
                "the CPU issuing kernels sets the pace; CUDA graphs or torch.compile would help"
            } else {
                "the GPU's work sets the pace"
            }
        ),
        format!(
            "dependency bound {:>12}   longest dependency chain (unlimited devices)",
            dur(run.dep_ns)
        ),
        format!(
            "peak memory      {}  (worker {}){}",
            super::memory::summary(&mem.peaks, &b.job),
            mem.peak_worker,
            if super::memory::over_capacity(&mem.peaks, &b.job) {
                " (try --pass recompute or grad-accumulation)"
            } else {
                ""
            }
        ),
        String::new(),
        format!(
            "critical path    {}",
            breakdown::critical_path_by_phase(g, &run.cp)
                .iter()
                .map(|(k, v)| format!("{k} {}", dur(*v)))
                .collect::<Vec<_>>()
                .join(" · ")
        ),
        "  largest items:".to_string(),
    ]
}

/// What a trace's report compares: the measured step, the replayed one (the step's thread
/// reaching the step's end) and the error; no error figure when the rank was extrapolated to
/// another number of workers (the measurement is of a different job).
struct Measured {
    measured_ns: u64,
    predicted_ns: u64,
    err_pct: Option<f64>,
}

impl Measured {
    fn of(t: &TraceInput, r: &replay::Replay) -> Measured {
        let predicted_ns = r
            .end_ns
            .get(t.step_end as usize)
            .copied()
            .unwrap_or(r.iteration_ns);
        let measured_ns = t.window.measured_ns();
        let err = 100.0 * (predicted_ns as f64 / measured_ns.max(1) as f64 - 1.0);
        let comparable = t
            .extrapolated
            .as_ref()
            .is_none_or(|x| x.workers == x.recorded_world);
        Measured {
            measured_ns,
            predicted_ns,
            err_pct: comparable.then_some(err),
        }
    }
}

/// Why the steady period is more than 5 % off the measured step, when it is (a recorded step
/// at another worker count has no measured step to compare with).
fn period_gap(
    period_ns: u64,
    m: &Measured,
    by: Option<crate::graph::DeviceKind>,
) -> Option<String> {
    m.err_pct?;
    super::traceinfo::period_gap(period_ns, m.measured_ns, by).map(|w| format!("{:18}{w}", ""))
}

/// What a trace report adds to the replay: the steady period, the bound, the memory.
struct TraceFindings {
    period_ns: Option<u64>,
    /// The device that sets the steady period.
    period_by: Option<crate::graph::DeviceKind>,
    bound: super::traceinfo::Bound,
    /// Whether the trace recorded memory (else no memory figure).
    mem_known: bool,
}

impl TraceFindings {
    fn of(b: &Built, run: &Replayed) -> TraceFindings {
        let (g, r) = (&b.graph, &run.replay);
        let steady = crate::replay::steady::steady(&b.job);
        let period_ns = steady.map(|s| s.period_ns);
        let bound = super::traceinfo::Bound {
            share: breakdown::path_share(g, r, &run.cp),
            gpu_busy_ns: breakdown::gpu_busy_ns(g, 0),
        };
        TraceFindings {
            period_ns,
            period_by: steady.map(|s| s.by),
            bound,
            mem_known: super::traceinfo::has_memory(&b.job),
        }
    }
}

/// `trainplan replay --trace`: measured against predicted.
fn trace_report(
    a: &ReplayArgs,
    b: &Built,
    t: &TraceInput,
    run: &Replayed,
    o: &mut impl Write,
) -> Result<(), CliError> {
    let m = Measured::of(t, &run.replay);
    let f = TraceFindings::of(b, run);
    if f.mem_known {
        super::memory::warn_if_over(&run.mem.peaks, &b.job);
    }
    if a.json {
        return report::json_line(o, &trace_json(a, b, t, run, &m, &f));
    }
    report::write_report(o, &trace_lines(b, t, run, &m, &f), &run.items)?;
    match &t.extrapolated {
        Some(x) => write_collectives(o, x),
        None => Ok(()),
    }
}

/// A trace replay as one JSON object.
fn trace_json(
    a: &ReplayArgs,
    b: &Built,
    t: &TraceInput,
    run: &Replayed,
    m: &Measured,
    f: &TraceFindings,
) -> serde_json::Value {
    let (g, r, job) = (&b.graph, &run.replay, &b.job);
    let x = t.extrapolated.as_ref();
    let extrapolation = x.map(|x| {
        json!({
            "cluster": x.cluster,
            "workers": x.workers,
            "recorded_world_size": x.recorded_world,
            "collectives": x.collectives.iter().map(|c| json!({
                "name": c.name, "kind": c.size.kind, "bytes": c.size.bytes,
                "size_from": c.source,
                "recorded_ms": c.recorded_ns as f64 / 1e6,
                "modelled_ms": c.modelled_ns as f64 / 1e6,
            })).collect::<Vec<_>>(),
        })
    });
    let mut v = json!({
        "iteration_ms": m.predicted_ns as f64 / 1e6,
        "measured_iteration_ms": m.measured_ns as f64 / 1e6,
        "error_pct": m.err_pct,
        "makespan_ms": r.iteration_ns as f64 / 1e6,
        "period_ms": f.period_ns.map(|p| p as f64 / 1e6),
        "trace_facts": super::traceinfo::facts_json(job),
        "bound": super::traceinfo::bound_json(&f.bound, None),
        "peer_waits": t.peer_waits,
        "step": t.window.label,
        "trace": t.file,
        "ops": g.op_count(),
        "devices": g.device_count(),
        "workers": x.map_or(1, |x| x.workers),
        "extrapolation": extrapolation,
        "critical_path_ms": run.dep_ns as f64 / 1e6,
        "peak_memory_bytes": f.mem_known.then_some(run.mem.peak_bytes),
        "replay_wall_ms": run.wall_ms,
        "build_wall_ms": b.build_ms,
        "edges": g.edge_count(),
        "symmetric": false,
        "model": t.name,
        "cluster": x.map_or("trace".to_string(), |x| x.cluster.clone()),
        "compute_ms": run.bd.compute_ns as f64 / 1e6,
        "communication_ms": run.bd.comm_ns as f64 / 1e6,
        "exposed_communication_ms": run.sum.exposed_comm_ns as f64 / 1e6,
        "host_bound": run.sum.host_bound(),
        "host_critical_path_ms": run.sum.host_path_ns as f64 / 1e6,
        "memory_over_capacity": f.mem_known.then(|| super::memory::over_capacity(&run.mem.peaks, job)),
        "critical_path_top": top_items_json(&run.items),
        "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
    });
    let mut fields = super::memory::fields(&run.mem.peaks, "");
    if !f.mem_known {
        for x in fields.values_mut() {
            *x = serde_json::Value::Null;
        }
    }
    super::memory::extend(&mut v, fields);
    v
}

/// A trace replay's summary: the file and who it stands for, the graph, measured against
/// predicted, the steady period, the trace's facts, the bound and the memory.
fn trace_lines(
    b: &Built,
    t: &TraceInput,
    run: &Replayed,
    m: &Measured,
    f: &TraceFindings,
) -> Vec<String> {
    let (g, job) = (&b.graph, &b.job);
    let who = match &t.extrapolated {
        Some(x) => format!(
            "one rank standing for the {} workers of {} (recorded with {})",
            x.workers, x.cluster, x.recorded_world
        ),
        None => "one rank".to_string(),
    };
    let verdict = match m.err_pct {
        Some(e) => format!("replayed; error {e:+.2} %"),
        None => "replayed; no error figure: the recorded run had another worker count".into(),
    };
    let mut lines = vec![
        format!("{} ({}, {who})", t.file, t.window.label),
        format!(
            "graph: {} ops, {} edges, {} devices; built in {:.0} ms, replayed in {:.0} ms",
            thousands(g.op_count() as u64),
            thousands(g.edge_count() as u64),
            g.device_count(),
            b.build_ms,
            run.wall_ms
        ),
        String::new(),
        format!(
            "measured step    {:>12}   the ProfilerStep / iteration span",
            super::output::dur(m.measured_ns, 3)
        ),
        format!(
            "predicted step   {:>12}   {verdict}",
            super::output::dur(m.predicted_ns, 3)
        ),
        format!(
            "GPU drains at    {:>12}   the step's last GPU work ends (replayed makespan)",
            super::output::dur(run.replay.iteration_ns, 3)
        ),
    ];
    if let Some(p) = f.period_ns {
        lines.push(format!(
            "steady period    {:>12}   step-to-step time with every step like this one",
            super::output::dur(p, 3)
        ));
        if let Some(why) = period_gap(p, m, f.period_by) {
            lines.push(why);
        }
    }
    if let Some(facts) = super::traceinfo::facts(job) {
        lines.insert(1, super::traceinfo::facts_line(facts));
    }
    lines.push(super::traceinfo::path_line(&f.bound));
    lines.extend(super::traceinfo::memory_lines(
        job,
        run.mem.peak_bytes,
        None,
    ));
    lines
}

/// The collectives an extrapolated rank re-timed for the cluster.
fn write_collectives(o: &mut impl Write, x: &Extrapolation) -> Result<(), CliError> {
    writeln!(
        o,
        "\ncollectives re-timed for {} workers:\n    {:>11}  {:>11}  {:>14}  {:<15}  kernel",
        x.workers, "recorded ms", "modelled ms", "bytes", "size from"
    )
    .map_err(CliError::stdout)?;
    for c in &x.collectives {
        writeln!(
            o,
            "    {:>11.3}  {:>11.3}  {:>14}  {:<15}  {}",
            c.recorded_ns as f64 / 1e6,
            c.modelled_ns as f64 / 1e6,
            thousands(c.size.bytes),
            c.source,
            c.name.chars().take(48).collect::<String>()
        )
        .map_err(CliError::stdout)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::DeviceKind;

    #[test]
    fn a_steady_period_far_from_the_measured_step_says_which_device_sets_it() {
        let m = |err: Option<f64>| Measured {
            measured_ns: 100_000_000,
            predicted_ns: 100_000_000,
            err_pct: err,
        };
        let gpu = Some(DeviceKind::GpuStream {
            worker: 0,
            stream: 3,
        });
        let host = Some(DeviceKind::CpuThread {
            worker: 0,
            thread: 0,
        });
        // Within 5 %: nothing to explain.
        assert_eq!(period_gap(104_000_000, &m(Some(0.0)), gpu), None);
        let g = period_gap(130_000_000, &m(Some(0.0)), gpu).unwrap();
        assert!(g.contains("+30.0 %") && g.contains("GPU stream"), "{g}");
        let h = period_gap(80_000_000, &m(Some(0.0)), host).unwrap();
        assert!(h.contains("-20.0 %") && h.contains("host thread"), "{h}");
        // An extrapolated rank has no measured step of its own job.
        assert_eq!(period_gap(130_000_000, &m(None), gpu), None);
    }
}
