//! Where a command's iteration comes from, resolved one way for every command: a zoo model on
//! a cluster, one rank's trace (possibly extrapolated to `--cluster`), the ranks of one job (a
//! folder or several files), or a Chakra execution trace. [`resolve`] says which, before
//! anything is read; [`load`] reads a one-job source into an editable [`Input`], [`build`]
//! also expands it into its global graph. Several ranks are read by [`super::ranks`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::output::thousands;
use super::{CliError, InputArgs, SyncArg};
use crate::cost::config::{self, Cluster};
use crate::graph::Dfg;
use crate::graph::job::Job;
use crate::zoo::{self, ModelOptions};

/// The log target of this module's messages: the one they had before input resolution moved
/// here from `cli::replay`, so that `RUST_LOG` filters and logs stay as they were.
const LOG_TARGET: &str = "trainplan::cli::replay";

/// What `--model/--cluster` or `--trace` names, before any of it is read.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A zoo model on a cluster.
    Zoo,
    /// One rank's Kineto trace.
    Trace(PathBuf),
    /// The ranks of one job: several Kineto traces, or a folder of them.
    Ranks(Vec<PathBuf>),
    /// A Chakra execution trace (one `--trace FILE.et`).
    Chakra(PathBuf),
}

/// Which source `i` names: a trace refuses `--precision` (it ran in the precision it was
/// recorded in), one Chakra file is itself, folders are expanded into their Kineto files.
pub fn resolve(i: &InputArgs) -> Result<Source, CliError> {
    if i.trace.is_empty() {
        return Ok(Source::Zoo);
    }
    refuse_trace_precision(i)?;
    if let [path] = i.trace.as_slice()
        && crate::trace::chakra::is_chakra(path)
    {
        return Ok(Source::Chakra(path.clone()));
    }
    let mut files = crate::trace::expand_inputs(&i.trace).map_err(CliError::bad_input)?;
    Ok(if files.len() == 1 {
        Source::Trace(files.remove(0))
    } else {
        Source::Ranks(files)
    })
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

/// `--precision` and `--amp-style` describe a zoo job; a trace ran in the precision it was
/// recorded in.
fn refuse_trace_precision(i: &InputArgs) -> Result<(), CliError> {
    match i.precision {
        Some(p) => Err(CliError::usage(format!(
            "--precision {} applies to --model jobs: a trace ran in the precision it was \
             recorded in (try `whatif --pass amp` on it)",
            p.name()
        ))),
        None if i.amp_style.is_some() => Err(CliError::usage(
            "--amp-style applies to --model jobs: a trace ran in the precision it was recorded in (try `whatif --framework deepspeed --pass amp` on an FP32 trace)"
                .to_string(),
        )),
        None => Ok(()),
    }
}

/// Read one rank's Kineto trace (`--trace FILE [--step N]`) into a job: the file, its step,
/// the extrapolation to `--cluster` if one is named, then the job's bounds and framework.
fn trace_job(path: &Path, i: &InputArgs) -> Result<Input, CliError> {
    let t = Instant::now();
    let file = path.display().to_string();
    let trace = read_rank_trace(path, &file)?;
    let world_size = trace
        .distributed
        .as_ref()
        .and_then(|d| d.world_size)
        .unwrap_or(1)
        .clamp(1, 1 << 20) as u32;
    let mut built =
        crate::trace::graph::build_job(&trace, &file, i.step).map_err(CliError::bad_input)?;
    for w in &built.warnings {
        tracing::warn!(target: LOG_TARGET, file = %file, "{w}");
    }
    // --cluster: this rank stands for every worker of the cluster (one rank → n).
    let extrapolated = match &i.cluster {
        Some(c) => Some(extrapolate_rank(path, &file, &trace, &mut built, c)?),
        None => None,
    };
    let mut job = built.job;
    crate::graph::bounds::check(&job).map_err(|m| CliError::bad_input(format!("{file}: {m}")))?;
    job.meta.model = trace_stem(path);
    job.framework = i.framework;
    job.math = i.framework.default_math(&job.gpu);
    let name = job.meta.model.clone();
    if built.peer_waits > 0 {
        tracing::info!(target: LOG_TARGET,
            collectives = built.peer_waits,
            "collectives wait for the rank's absent peers as recorded"
        );
    }
    tracing::info!(target: LOG_TARGET,
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

/// Read a Kineto file, refusing a Horovod timeline (it reads as events but holds negotiation
/// and communication only), and log what the reader warned about.
fn read_rank_trace(path: &Path, file: &str) -> Result<crate::trace::KinetoTrace, CliError> {
    let trace = crate::trace::read_kineto(path).map_err(CliError::bad_input)?;
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
        tracing::warn!(target: LOG_TARGET, file = %file, "{w}");
    }
    Ok(trace)
}

/// `--trace FILE --cluster C`: the rank's collectives re-timed so it stands for every worker
/// of the cluster.
fn extrapolate_rank(
    path: &Path,
    file: &str,
    trace: &crate::trace::KinetoTrace,
    built: &mut crate::trace::graph::TraceJob,
    cluster: &str,
) -> Result<Extrapolation, CliError> {
    let cluster = config::load_cluster(cluster).map_err(CliError::bad_input)?;
    if let Some(w) = other_gpu_warning(&built.job, &cluster) {
        tracing::warn!(target: LOG_TARGET, file = %file, "{w}");
    }
    let et = crate::trace::extrapolate::sizes_beside(path, trace, built);
    let list = crate::trace::extrapolate::extrapolate(trace, file, built, &cluster, &et)
        .map_err(CliError::bad_input)?;
    let world = trace
        .distributed
        .as_ref()
        .and_then(|d| d.world_size)
        .unwrap_or(1)
        .max(1) as u32;
    tracing::info!(target: LOG_TARGET,
        workers = cluster.workers(),
        recorded_world = world,
        collectives = list.len(),
        "extrapolated the rank to the cluster"
    );
    Ok(Extrapolation {
        cluster: cluster.name.clone(),
        workers: cluster.workers(),
        recorded_world: world,
        collectives: list,
    })
}

/// A Chakra execution trace as a job for `whatif` and `plan` (no measured step: its
/// iteration is the replayed makespan).
fn chakra_job(path: &Path, i: &InputArgs) -> Result<Input, CliError> {
    let file = path.display().to_string();
    let trace = crate::trace::chakra::read_chakra(path).map_err(CliError::bad_input)?;
    let built = crate::trace::chakra::build_job(&trace, &file).map_err(CliError::bad_input)?;
    for w in &built.warnings {
        tracing::warn!(target: LOG_TARGET, file = %file, "{w}");
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
fn trace_stem(path: &Path) -> String {
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

/// Read a one-job source into a job, with the allocator as `--expandable-segments` says
/// (several ranks go through [`super::ranks`]).
pub fn load(i: &InputArgs, src: &Source) -> Result<Input, CliError> {
    let mut input = match src {
        Source::Zoo => zoo_job(i)?,
        Source::Trace(path) => trace_job(path, i)?,
        Source::Chakra(path) => chakra_job(path, i)?,
        Source::Ranks(files) => {
            return Err(CliError::internal(format!(
                "{} rank traces reached the one-rank reader",
                files.len()
            )));
        }
    };
    if i.expandable_segments {
        expandable_segments(&mut input);
    }
    Ok(input)
}

/// `--expandable-segments`: the caching allocator of the job (and of its per-tensor twin)
/// grows segments instead of caching them; another allocator has no such mode (a warning).
fn expandable_segments(input: &mut Input) {
    let expand = |job: &mut Job| {
        if job.memory.allocator == crate::cost::memory::AllocatorKind::Caching {
            let mut m = (*job.memory).clone();
            m.expandable_segments = true;
            job.memory = std::sync::Arc::new(m);
        }
    };
    if input.job.memory.allocator != crate::cost::memory::AllocatorKind::Caching {
        tracing::warn!(target: LOG_TARGET,
            "--expandable-segments is a PyTorch caching-allocator setting; the {} allocator has none",
            input.job.memory.name
        );
    }
    expand(&mut input.job);
    if let Some((j, _)) = &mut input.sync {
        expand(j);
    }
}

/// A zoo model on a cluster (`--model NAME --cluster NAME|FILE`) as the framework's default
/// job, with its one-collective-per-tensor twin.
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
        gelu: i.gelu,
        kv_heads: i.kv_heads,
        ffn: i.ffn,
        // A framework whose own loop runs the loss decides it (tf, jax: fused; torchtitan: the
        // logits freed); otherwise the model code's (`--loss`, or the preset's).
        loss: i.loss.or_else(|| zoo::framework_loss(name, i.framework)),
        // TensorFlow's composed ops (dropout's float mask, layer norm's broadcast inverse, the
        // written-out GELU), as its graph mode runs the model code.
        graph_ops: Some(zoo::framework_graph_ops(i.framework)),
    };
    let model = zoo::model(name, &opts).map_err(CliError::bad_input)?;
    let cluster = config::load_cluster(cluster).map_err(CliError::bad_input)?;
    let (job, per_tensor, sync_cfg) = crate::search::baselines::zoo_baseline(
        &model,
        &cluster,
        i.framework,
        i.precision,
        i.amp_style,
        i.sync == SyncArg::PerTensor,
        i.symmetric,
        None,
        i.channels_last.then_some(true),
    )
    .map_err(|e| CliError::bad_input(format!("{}: {e}", model.name)))?;
    tracing::info!(target: LOG_TARGET, framework = %i.framework, sync = %sync_cfg, "the framework's default sync");
    Ok(Input {
        job,
        sync: Some((per_tensor, sync_cfg)),
        model: Some(model),
        cluster: Some(cluster),
        trace: None,
    })
}

/// Read a one-job source and expand it into its global graph.
pub fn build(i: &InputArgs, src: &Source) -> Result<Built, CliError> {
    let Input {
        job,
        model,
        cluster,
        trace,
        ..
    } = load(i, src)?;
    check_graph_memory(&job)?;
    let t = Instant::now();
    let graph = job
        .expand()
        .map_err(|e| CliError::bad_input(format!("{}: {e}", job.meta.model)))?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!(target: LOG_TARGET, ops = graph.op_count(), build_ms, "built the global DFG");
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
