//! `trainplan models`, `trainplan clusters` and `trainplan replay`.

use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::output::thousands;
use super::{CliError, InputArgs, ListArgs, ReplayArgs, write_atomic};
use crate::cost::config::{self, Cluster};
use crate::graph::Dfg;
use crate::graph::job::Job;
use crate::replay::{self, breakdown, critical_path, dependency_bound_ns, peak_memory};
use crate::zoo::{self, ModelOptions};

pub(super) fn out() -> super::output::Clean<std::io::StdoutLock<'static>> {
    super::output::stdout()
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
    /// The job the graph was expanded from.
    pub job: Job,
    /// The zoo model and cluster (`None` for a trace).
    pub model: Option<zoo::Model>,
    pub cluster: Option<Cluster>,
    pub trace: Option<TraceInput>,
    pub build_ms: f64,
}

/// A resolved input as an editable job.
pub struct Input {
    /// The job as the framework runs it by default (`--sync per-tensor`: one collective per
    /// gradient tensor).
    pub job: Job,
    /// For a zoo job: the same job with one collective per gradient tensor (what the planner's
    /// baselines rewrite) and one line on the synchronisation `job` uses.
    pub sync: Option<(Job, String)>,
    /// The zoo model and cluster (`None` for a trace).
    pub model: Option<zoo::Model>,
    pub cluster: Option<Cluster>,
    pub trace: Option<TraceInput>,
}

/// What a trace input adds: the recorded iteration.
pub struct TraceInput {
    pub file: String,
    /// The file's stem (the job's model name).
    pub name: String,
    pub window: crate::trace::graph::StepWindow,
    /// Local op whose replayed end is the predicted step time.
    pub step_end: crate::graph::OpId,
    /// Set when the rank was extrapolated to a cluster (`--trace FILE --cluster C`).
    pub extrapolated: Option<Extrapolation>,
    /// World size of the recorded run (`distributedInfo`; 1 when the trace has none).
    pub world_size: u32,
    /// How each local op's work is known (for the uncertainty `whatif` states).
    pub work_source: Vec<crate::trace::work::WorkSource>,
    /// Collectives re-derived to wait for the rank's absent peers.
    pub peer_waits: usize,
}

/// One rank's trace standing for every worker of a cluster.
pub struct Extrapolation {
    pub cluster: String,
    pub workers: u32,
    /// World size of the recorded run.
    pub recorded_world: u32,
    pub collectives: Vec<crate::trace::extrapolate::Extrapolated>,
}

/// `--precision` describes a zoo job; a trace ran in the precision it was recorded in.
pub(super) fn refuse_trace_precision(i: &InputArgs) -> Result<(), CliError> {
    match i.precision {
        Some(p) => Err(CliError::usage(format!(
            "--precision {} applies to --model jobs: a trace ran in the precision it was \
             recorded in (try `whatif --pass amp` on it)",
            p.name()
        ))),
        None => Ok(()),
    }
}

/// Read `--trace FILE [--step N]` (one rank, or a Chakra execution trace) into a job; several
/// ranks go through [`super::ranks`].
fn trace_job(i: &InputArgs) -> Result<Input, CliError> {
    refuse_trace_precision(i)?;
    let files = crate::trace::expand_inputs(&i.trace).map_err(CliError::bad_input)?;
    let [path] = files.as_slice() else {
        return Err(CliError::internal(format!(
            "{} rank traces reached the one-rank reader",
            files.len()
        )));
    };
    if crate::trace::chakra::is_chakra(path) {
        return chakra_job(path, i);
    }
    let t = Instant::now();
    let trace = crate::trace::read_kineto(path).map_err(CliError::bad_input)?;
    let file = path.display().to_string();
    // A Horovod timeline reads as events but holds negotiation and communication only.
    let negotiations = trace
        .events
        .iter()
        .filter(|e| e.name.starts_with("NEGOTIATE_"))
        .count();
    if negotiations > 0 && crate::trace::graph::steps(&trace).is_empty() {
        return Err(CliError::bad_input(format!(
            "{file} is a Horovod timeline ({negotiations} negotiation events): it records \
             communication only, no compute, so there is no step to replay; replay the PyTorch \
             profiler trace of the same run"
        )));
    }
    for w in &trace.warnings {
        tracing::warn!(file = %file, "{w}");
    }
    let world_size = trace
        .distributed
        .as_ref()
        .and_then(|d| d.world_size)
        .unwrap_or(1)
        .clamp(1, 1 << 20) as u32;
    let mut built =
        crate::trace::graph::build_job(&trace, &file, i.step).map_err(CliError::bad_input)?;
    for w in &built.warnings {
        tracing::warn!(file = %file, "{w}");
    }
    // --cluster: this rank stands for every worker of the cluster (one rank → n).
    let mut extrapolated = None;
    if let Some(c) = &i.cluster {
        let cluster = config::load_cluster(c).map_err(CliError::bad_input)?;
        if let Some(w) = other_gpu_warning(&built.job, &cluster) {
            tracing::warn!(file = %file, "{w}");
        }
        let et = crate::trace::extrapolate::sizes_beside(path, &trace, &built);
        let list = crate::trace::extrapolate::extrapolate(&trace, &file, &mut built, &cluster, &et)
            .map_err(CliError::bad_input)?;
        let world = trace
            .distributed
            .as_ref()
            .and_then(|d| d.world_size)
            .unwrap_or(1)
            .max(1) as u32;
        tracing::info!(
            workers = cluster.workers(),
            recorded_world = world,
            collectives = list.len(),
            "extrapolated the rank to the cluster"
        );
        extrapolated = Some(Extrapolation {
            cluster: cluster.name.clone(),
            workers: cluster.workers(),
            recorded_world: world,
            collectives: list,
        });
    }
    let mut job = built.job;
    crate::graph::bounds::check(&job).map_err(|m| CliError::bad_input(format!("{file}: {m}")))?;
    job.meta.model = trace_stem(path);
    job.framework = i.framework;
    job.math = i.framework.default_math(&job.gpu);
    let name = job.meta.model.clone();
    if built.peer_waits > 0 {
        tracing::info!(
            collectives = built.peer_waits,
            "collectives wait for the rank's absent peers as recorded"
        );
    }
    tracing::info!(
        ops = job.local.ops.len(),
        ms = t.elapsed().as_secs_f64() * 1e3,
        step = %built.window.label,
        "imported the trace"
    );
    Ok(Input {
        job,
        sync: None,
        model: None,
        cluster: None,
        trace: Some(TraceInput {
            file,
            name,
            window: built.window,
            step_end: built.step_end,
            extrapolated,
            world_size,
            work_source: built.work_source,
            peer_waits: built.peer_waits,
        }),
    })
}

/// A Chakra execution trace as a job for `whatif` and `plan` (no measured step: its
/// iteration is the replayed makespan).
fn chakra_job(path: &std::path::Path, i: &InputArgs) -> Result<Input, CliError> {
    let file = path.display().to_string();
    let trace = crate::trace::chakra::read_chakra(path).map_err(CliError::bad_input)?;
    let built = crate::trace::chakra::build_job(&trace, &file).map_err(CliError::bad_input)?;
    for w in &built.warnings {
        tracing::warn!(file = %file, "{w}");
    }
    let mut job = built.job;
    let stem = trace_stem(path);
    job.meta.model = stem
        .trim_end_matches(".et")
        .trim_end_matches(".chakra")
        .to_string();
    job.framework = i.framework;
    job.math = i.framework.default_math(&job.gpu);
    Ok(Input {
        job,
        sync: None,
        model: None,
        cluster: None,
        trace: None,
    })
}

/// `resnet50_rank0` of `…/resnet50_rank0.json.gz`.
fn trace_stem(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    name.strip_suffix(".json").unwrap_or(name).to_string()
}

/// When `--cluster` names another GPU model than the one a trace was recorded on: what the
/// replay keeps (issue 27: an A100 trace replayed on `64xh100-ib` kept A100 kernel times
/// without a word). Only the collectives are re-timed for the cluster.
pub fn other_gpu_warning(job: &crate::graph::job::Job, cluster: &Cluster) -> Option<String> {
    let f = job.meta.trace.as_deref()?;
    let recorded = if f.gpu_config.is_empty() {
        return None;
    } else {
        f.gpu_config.as_str()
    };
    (recorded != cluster.gpu.name).then(|| {
        format!(
            "the trace was recorded on {} ({recorded}) and --cluster {} has {}: the recorded kernel and host times are kept (they are not re-timed for another GPU model); only the collectives are re-timed for the cluster",
            f.gpu.as_deref().unwrap_or("its GPU"),
            cluster.name,
            cluster.gpu.name
        )
    })
}

/// Resolve `--model/--cluster` or `--trace` into a job.
/// Resolve `--model/--cluster` or `--trace` into a job (with the allocator as
/// `--expandable-segments` says).
pub fn input_job(i: &InputArgs) -> Result<Input, CliError> {
    let mut input = if i.trace.is_empty() {
        zoo_job(i)?
    } else {
        trace_job(i)?
    };
    if i.expandable_segments {
        let expand = |job: &mut Job| {
            if job.memory.allocator == crate::cost::memory::AllocatorKind::Caching {
                let mut m = (*job.memory).clone();
                m.expandable_segments = true;
                job.memory = std::sync::Arc::new(m);
            }
        };
        if input.job.memory.allocator != crate::cost::memory::AllocatorKind::Caching {
            tracing::warn!(
                "--expandable-segments is a PyTorch caching-allocator setting; the {} allocator has none",
                input.job.memory.name
            );
        }
        expand(&mut input.job);
        if let Some((j, _)) = &mut input.sync {
            expand(j);
        }
    }
    Ok(input)
}

fn zoo_job(i: &InputArgs) -> Result<Input, CliError> {
    let (Some(name), Some(cluster)) = (&i.model, &i.cluster) else {
        return Err(CliError::usage(
            "give the input as --model NAME --cluster NAME|FILE (see `trainplan models` and `trainplan clusters`), or --trace FILE",
        ));
    };
    let opts = ModelOptions {
        batch: i.batch,
        hidden: i.hidden,
        heads: i.heads,
        layers: i.layers,
        seq: i.seq,
        vocab: i.vocab,
        head: i.head,
        attention: i.attention,
    };
    let model = zoo::model(name, &opts).map_err(CliError::bad_input)?;
    let cluster = config::load_cluster(cluster).map_err(CliError::bad_input)?;
    let (job, per_tensor, sync_cfg) = crate::search::baselines::zoo_baseline(
        &model,
        &cluster,
        i.framework,
        i.precision,
        i.sync == super::SyncArg::PerTensor,
        i.symmetric,
        None,
        i.channels_last.then_some(true),
    )
    .map_err(|e| CliError::bad_input(format!("{}: {e}", model.name)))?;
    tracing::info!(framework = %i.framework, sync = %sync_cfg, "the framework's default sync");
    Ok(Input {
        job,
        sync: Some((per_tensor, sync_cfg)),
        model: Some(model),
        cluster: Some(cluster),
        trace: None,
    })
}

/// Resolve `--model/--cluster` into a graph.
pub fn build_input(i: &InputArgs) -> Result<Built, CliError> {
    let Input {
        job,
        model,
        cluster,
        trace,
        ..
    } = input_job(i)?;
    check_graph_memory(&job)?;
    let t = Instant::now();
    let graph = job
        .expand()
        .map_err(|e| CliError::bad_input(format!("{}: {e}", job.meta.model)))?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!(ops = graph.op_count(), build_ms, "built the global DFG");
    Ok(Built {
        graph,
        job,
        model,
        cluster,
        trace,
        build_ms,
    })
}

/// Refuse, before it is built, a graph whose evaluation (expansion, replay, critical path,
/// memory: [`crate::graph::bounds::expanded_ops`] × [`crate::limits::EVAL_BYTES_PER_OP`]) would
/// not fit the memory ceiling, saying what it needs and what would help.
pub fn check_graph_memory(job: &crate::graph::job::Job) -> Result<(), CliError> {
    let ops = crate::graph::bounds::expanded_ops(job);
    let need = ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP);
    crate::limits::check(
        || format!("the job's graph of {} ops", thousands(ops)),
        need,
    )
    .map_err(|e| {
        let hint = if job.symmetric || job.workers <= 1 {
            "give it more memory"
        } else {
            "try --symmetric (one worker and the quotient ring) or give it more memory"
        };
        CliError::bad_input(format!("{e}: {hint}"))
    })
}

/// `trainplan replay`.
pub fn replay_cmd(a: &ReplayArgs) -> Result<(), CliError> {
    if !a.input.trace.is_empty() {
        refuse_trace_precision(&a.input)?;
    }
    if let [path] = a.input.trace.as_slice()
        && crate::trace::chakra::is_chakra(path)
    {
        return super::chakra::replay(a, path);
    }
    if !a.input.trace.is_empty() {
        let files = crate::trace::expand_inputs(&a.input.trace).map_err(CliError::bad_input)?;
        if files.len() > 1 {
            return super::ranks::replay_ranks_cmd(a, &files);
        }
    }
    let b = build_input(&a.input)?;
    let g = &b.graph;
    let t = Instant::now();
    let r = replay::replay(g);
    let replay_wall_ms = t.elapsed().as_secs_f64() * 1e3;
    crate::graph::bounds::check_replayed(r.iteration_ns).map_err(CliError::bad_input)?;
    let cp = critical_path(g, &r);
    let dep = dependency_bound_ns(g);
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
    if let Some(path) = &a.timeline {
        super::distinct::check(
            &[super::distinct::Output::new("--timeline", path)],
            &[],
            &[],
        )?;
        write_atomic(path, |w| replay::timeline::write_chrome_trace(g, &r, w)).map_err(|e| {
            CliError::output(format!("failed to write timeline {}: {e}", path.display()))
        })?;
    }
    let workers = g.represented_workers();
    // A trace: the measured step and the replayed one (the step's thread reaching the step's end).
    let measured = b.trace.as_ref().map(|t| {
        let predicted = r
            .end_ns
            .get(t.step_end as usize)
            .copied()
            .unwrap_or(r.iteration_ns);
        let m = t.window.measured_ns();
        (
            m,
            predicted,
            100.0 * (predicted as f64 / m.max(1) as f64 - 1.0),
        )
    });
    let mut o = out();
    if let (Some(t), Some((m, p, err))) = (&b.trace, measured) {
        return trace_report(a, &b, t, &r, (m, p, err), replay_wall_ms, &mut o);
    }
    let (Some(model), Some(c)) = (&b.model, &b.cluster) else {
        return Err(CliError::internal("a zoo input without its model"));
    };
    super::memory::warn_if_over(&mem.peaks, &b.job);
    if a.json {
        let top = top_items_json(&items);
        let mut v = json!({
            "iteration_ms": r.iteration_ns as f64 / 1e6,
            "measured_iteration_ms": null,
            "error_pct": null,
            "ops": g.op_count(),
            "devices": g.device_count(),
            "workers": workers,
            "critical_path_ms": dep as f64 / 1e6,
            "replay_wall_ms": replay_wall_ms,
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
            "memory_over_capacity": super::memory::over_capacity(&mem.peaks, &b.job),
            "gpu_memory_bytes": c.gpu.memory_bytes(),
            "framework": a.input.framework.name(),
            "critical_path_top": top,
            "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
        });
        super::memory::extend(&mut v, super::memory::fields(&mem.peaks, ""));
        writeln!(o, "{v}").map_err(CliError::stdout)?;
        return Ok(());
    }
    let lines = [
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
        format!(
            "iteration        {:>12}",
            super::output::dur(r.iteration_ns, 1)
        ),
        format!(
            "  compute        {:>12}   worker 0's GPU stream busy",
            super::output::dur(bd.compute_ns, 1)
        ),
        format!(
            "  communication  {:>12}   worker 0's SEND/RECV",
            super::output::dur(bd.comm_ns, 1)
        ),
        format!(
            "  overlap        {:>12}   both at once",
            super::output::dur(bd.overlap_ns, 1)
        ),
        format!(
            "  exposed comm.  {:>12}   communication with no compute beside it",
            super::output::dur(sum.exposed_comm_ns, 1)
        ),
        format!(
            "  host           {:>12}   on the critical path ({}-bound: {})",
            super::output::dur(sum.host_path_ns, 1),
            if sum.host_bound() { "host" } else { "GPU" },
            if sum.host_bound() {
                "the CPU issuing kernels sets the pace; CUDA graphs or torch.compile would help"
            } else {
                "the GPU's work sets the pace"
            }
        ),
        format!(
            "dependency bound {:>12}   longest dependency chain (unlimited devices)",
            super::output::dur(dep, 1)
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
            breakdown::critical_path_by_phase(g, &cp)
                .iter()
                .map(|(k, v)| format!("{k} {}", super::output::dur(*v, 1)))
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
            "    {:>11}  {:>5.1} %  {}",
            super::output::dur_ms(i.dur_ns as f64 / 1e6, 2),
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

/// The critical path's ten largest items for `--json` (`critical_path_top`).
pub(super) fn top_items_json(items: &[breakdown::PathItem]) -> Vec<serde_json::Value> {
    items
        .iter()
        .take(10)
        .map(|i| json!({"name": i.name, "ms": i.dur_ns as f64 / 1e6}))
        .collect()
}

/// A trace report's summary lines, then the critical path's largest items.
pub(super) fn write_report(
    o: &mut impl Write,
    lines: &[String],
    items: &[breakdown::PathItem],
) -> Result<(), CliError> {
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    writeln!(o, "\ncritical path, largest items:").map_err(CliError::stdout)?;
    for i in items.iter().take(8) {
        // Kernel names run to hundreds of characters (templates): the start says which.
        let name: String = if i.name.chars().count() > 100 {
            i.name.chars().take(99).chain(['…']).collect()
        } else {
            i.name.clone()
        };
        writeln!(
            o,
            "    {:>11}  {}",
            super::output::dur_ms(i.dur_ns as f64 / 1e6, 3),
            name.trim_end()
        )
        .map_err(CliError::stdout)?;
    }
    Ok(())
}

/// `trainplan replay --trace`: measured against predicted.
fn trace_report(
    a: &ReplayArgs,
    b: &Built,
    t: &TraceInput,
    r: &replay::Replay,
    (measured, predicted, err): (u64, u64, f64),
    replay_wall_ms: f64,
    o: &mut impl Write,
) -> Result<(), CliError> {
    let g = &b.graph;
    let cp = critical_path(g, r);
    let bd = breakdown::breakdown(g, r, 0);
    let sum = breakdown::summary(g, r, &cp);
    let items = breakdown::critical_path_items(g, &cp);
    // Extrapolated to another number of workers: the measurement is of a different job, so no
    // error figure.
    let x = t.extrapolated.as_ref();
    let comparable = x.is_none_or(|x| x.workers == x.recorded_world);
    let err = comparable.then_some(err);
    let workers = x.map_or(1, |x| x.workers);
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
    let job = &b.job;
    let steady = crate::replay::steady::steady(job);
    let period = steady.map(|s| s.period_ns);
    let share = crate::replay::breakdown::path_share(g, r, &cp);
    let bound = super::traceinfo::Bound {
        share,
        gpu_busy_ns: crate::replay::breakdown::gpu_busy_ns(g, 0),
    };
    let mem_report = peak_memory(g, r).with_peaks(
        g,
        r,
        &job.memory,
        job.communicators(),
        job.gpu.memory_bytes(),
    );
    let mem_peak = mem_report.peak_bytes;
    let known = super::traceinfo::has_memory(job);
    let mem = known.then_some(mem_peak);
    if known {
        super::memory::warn_if_over(&mem_report.peaks, job);
    }
    if a.json {
        let top = top_items_json(&items);
        let mut v = json!({
            "iteration_ms": predicted as f64 / 1e6,
            "measured_iteration_ms": measured as f64 / 1e6,
            "error_pct": err,
            "makespan_ms": r.iteration_ns as f64 / 1e6,
            "period_ms": period.map(|p| p as f64 / 1e6),
            "trace_facts": super::traceinfo::facts_json(job),
            "bound": super::traceinfo::bound_json(&bound, None),
            "peer_waits": t.peer_waits,
            "step": t.window.label,
            "trace": t.file,
            "ops": g.op_count(),
            "devices": g.device_count(),
            "workers": workers,
            "extrapolation": extrapolation,
            "critical_path_ms": dependency_bound_ns(g) as f64 / 1e6,
            "peak_memory_bytes": mem,
            "replay_wall_ms": replay_wall_ms,
            "build_wall_ms": b.build_ms,
            "edges": g.edge_count(),
            "symmetric": false,
            "model": t.name,
            "cluster": x.map_or("trace".to_string(), |x| x.cluster.clone()),
            "compute_ms": bd.compute_ns as f64 / 1e6,
            "communication_ms": bd.comm_ns as f64 / 1e6,
            "exposed_communication_ms": sum.exposed_comm_ns as f64 / 1e6,
            "host_bound": sum.host_bound(),
            "host_critical_path_ms": sum.host_path_ns as f64 / 1e6,
            "memory_over_capacity": known.then(|| super::memory::over_capacity(&mem_report.peaks, job)),
            "critical_path_top": top,
            "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
        });
        let mut f = super::memory::fields(&mem_report.peaks, "");
        if !known {
            for x in f.values_mut() {
                *x = serde_json::Value::Null;
            }
        }
        super::memory::extend(&mut v, f);
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let who = match x {
        Some(x) => format!(
            "one rank standing for the {} workers of {} (recorded with {})",
            x.workers, x.cluster, x.recorded_world
        ),
        None => "one rank".to_string(),
    };
    let verdict = match err {
        Some(e) => format!("replayed; error {e:+.2} %"),
        None => "replayed; no error figure: the recorded run had another worker count".into(),
    };
    let lines = [
        format!("{} ({}, {who})", t.file, t.window.label),
        format!(
            "graph: {} ops, {} edges, {} devices; built in {:.0} ms, replayed in {:.0} ms",
            thousands(g.op_count() as u64),
            thousands(g.edge_count() as u64),
            g.device_count(),
            b.build_ms,
            replay_wall_ms
        ),
        String::new(),
        format!(
            "measured step    {:>12}   the ProfilerStep / iteration span",
            super::output::dur(measured, 3)
        ),
        format!(
            "predicted step   {:>12}   {verdict}",
            super::output::dur(predicted, 3)
        ),
        format!(
            "GPU drains at    {:>12}   the step's last GPU work ends (replayed makespan)",
            super::output::dur(r.iteration_ns, 3)
        ),
    ];
    let mut lines = lines.to_vec();
    if let Some(p) = period {
        lines.push(format!(
            "steady period    {:>12}   step-to-step time with every step like this one",
            super::output::dur(p, 3)
        ));
    }
    if let Some(f) = super::traceinfo::facts(job) {
        lines.insert(1, super::traceinfo::facts_line(f));
    }
    lines.push(super::traceinfo::path_line(&bound));
    lines.extend(super::traceinfo::memory_lines(job, mem_peak, None));
    write_report(o, &lines, &items)?;
    if let Some(x) = x {
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
    }
    Ok(())
}
