//! `trainplan models`, `trainplan clusters` and `trainplan replay`.

use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::output::{gb, ms, thousands};
use super::{CliError, InputArgs, ListArgs, ReplayArgs, write_atomic};
use crate::cost::config::{self, Cluster};
use crate::graph::Dfg;
use crate::graph::job::Job;
use crate::replay::{self, breakdown, critical_path, dependency_bound_ns, peak_memory};
use crate::zoo::{self, BuildOptions, ModelOptions};

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

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
        "\nbert-base, bert-large and gpt take --hidden --heads --layers --seq --vocab; all take --batch."
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

/// A built input: the graph and what it describes.
pub struct Built {
    pub graph: Dfg,
    pub model: zoo::Model,
    pub cluster: Cluster,
    pub build_ms: f64,
}

/// A resolved input as an editable job.
pub struct Input {
    pub job: Job,
    pub model: zoo::Model,
    pub cluster: Cluster,
}

/// Resolve `--model/--cluster` into a job.
pub fn input_job(i: &InputArgs) -> Result<Input, CliError> {
    let (Some(name), Some(cluster)) = (&i.model, &i.cluster) else {
        return Err(CliError::usage(
            "give the input as --model NAME --cluster NAME|FILE (see `trainplan models` and `trainplan clusters`)",
        ));
    };
    let opts = ModelOptions {
        batch: i.batch,
        hidden: i.hidden,
        heads: i.heads,
        layers: i.layers,
        seq: i.seq,
        vocab: i.vocab,
    };
    let model = zoo::model(name, &opts).map_err(CliError::bad_input)?;
    let cluster = config::load_cluster(cluster).map_err(CliError::bad_input)?;
    let job = zoo::build::job(
        &model,
        &cluster,
        &BuildOptions {
            symmetric: i.symmetric,
            ..Default::default()
        },
    )
    .map_err(CliError::bad_input)?;
    Ok(Input {
        job,
        model,
        cluster,
    })
}

/// Resolve `--model/--cluster` into a graph.
pub fn build_input(i: &InputArgs) -> Result<Built, CliError> {
    let Input {
        job,
        model,
        cluster,
    } = input_job(i)?;
    let t = Instant::now();
    let graph = job
        .expand()
        .map_err(|e| CliError::bad_input(format!("{}: {e}", model.name)))?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!(ops = graph.op_count(), build_ms, "built the global DFG");
    Ok(Built {
        graph,
        model,
        cluster,
        build_ms,
    })
}

/// `trainplan replay`.
pub fn replay_cmd(a: &ReplayArgs) -> Result<(), CliError> {
    let b = build_input(&a.input)?;
    let g = &b.graph;
    let t = Instant::now();
    let r = replay::replay(g);
    let replay_wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let cp = critical_path(g, &r);
    let dep = dependency_bound_ns(g);
    let mem = peak_memory(g, &r);
    let bd = breakdown::breakdown(g, &r, 0);
    let items = breakdown::critical_path_items(g, &cp);
    if let Some(path) = &a.timeline {
        write_atomic(path, |w| replay::timeline::write_chrome_trace(g, &r, w)).map_err(|e| {
            CliError::bad_input(format!("failed to write timeline {}: {e}", path.display()))
        })?;
    }
    let workers = g.represented_workers();
    let mut o = out();
    if a.json {
        let top: Vec<_> = items
            .iter()
            .take(10)
            .map(|i| json!({"name": i.name, "ms": i.dur_ns as f64 / 1e6}))
            .collect();
        let v = json!({
            "iteration_ms": r.iteration_ns as f64 / 1e6,
            "measured_iteration_ms": null,
            "error_pct": null,
            "ops": g.op_count(),
            "devices": g.device_count(),
            "workers": workers,
            "critical_path_ms": dep as f64 / 1e6,
            "peak_memory_bytes": mem.peak_bytes,
            "replay_wall_ms": replay_wall_ms,
            "build_wall_ms": b.build_ms,
            "edges": g.edge_count(),
            "symmetric": g.is_symmetric_form(),
            "model": b.model.name,
            "batch": b.model.batch,
            "cluster": b.cluster.name,
            "compute_ms": bd.compute_ns as f64 / 1e6,
            "communication_ms": bd.comm_ns as f64 / 1e6,
            "overlap_ms": bd.overlap_ns as f64 / 1e6,
            "critical_path_top": top,
            "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
        });
        writeln!(o, "{v}").map_err(CliError::stdout)?;
        return Ok(());
    }
    let c = &b.cluster;
    let lines = [
        format!(
            "{} (batch {}/GPU, {} params) on {} ({} x {}, {:?} all-reduce)",
            b.model.name,
            b.model.batch,
            thousands(b.model.param_elems()),
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
            workers,
            if g.is_symmetric_form() {
                " (symmetric form: 1 worker + quotient ring)"
            } else {
                ""
            },
            b.build_ms,
            replay_wall_ms
        ),
        String::new(),
        format!("iteration        {:>9.1} ms", ms(r.iteration_ns)),
        format!(
            "  compute        {:>9.1} ms   worker 0's GPU stream busy",
            ms(bd.compute_ns)
        ),
        format!(
            "  communication  {:>9.1} ms   worker 0's SEND/RECV",
            ms(bd.comm_ns)
        ),
        format!(
            "  overlap        {:>9.1} ms   both at once",
            ms(bd.overlap_ns)
        ),
        format!(
            "  exposed comm.  {:>9.1} ms   iteration − compute",
            ms(r.iteration_ns.saturating_sub(bd.compute_ns))
        ),
        format!(
            "dependency bound {:>9.1} ms   longest dependency chain (unlimited devices)",
            ms(dep)
        ),
        format!(
            "peak memory      {:>9}      worker {} (of {} GB on the GPU)",
            gb(mem.peak_bytes),
            mem.peak_worker,
            (c.gpu.memory_bytes() as f64 / 1e9).round()
        ),
        String::new(),
        format!(
            "critical path    {}",
            breakdown::critical_path_by_phase(g, &cp)
                .iter()
                .map(|(k, v)| format!("{k} {:.1} ms", ms(*v)))
                .collect::<Vec<_>>()
                .join(" · ")
        ),
        "  largest items:".to_string(),
    ];
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    for i in items.iter().take(8) {
        writeln!(
            o,
            "    {:>8.2} ms  {:>5.1} %  {}",
            i.dur_ns as f64 / 1e6,
            100.0 * i.dur_ns as f64 / r.iteration_ns.max(1) as f64,
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
