//! `trainplan plan`: the framework's baselines and the search, the plan YAML and its SVG
//! written atomically, a summary (or one JSON object).
//!
//! **Time.** `--budget` bounds the search from the start of the command (input, baselines and
//! search); `--max-rounds` bounds it by work instead, the same on every machine. The work runs
//! on a worker thread; the main thread watches the clock and Ctrl-C. The worker stops itself at
//! the deadline or on Ctrl-C between replays. A plan cut by the budget carries the same report
//! as a converged one (the final replay in the report's form, the bound, the advice, the lower
//! bound): the worker computes it after the search, or — if it has not returned [`GRACE`] after
//! the deadline (a replay of a very large graph still running) — the main thread computes it
//! from the snapshot of the best plan so far that the worker updates at every improvement, then
//! returns, which ends the process. The deadline counts only once the first baselines exist (a
//! plan needs a start). After Ctrl-C the snapshot is written as it is, and a second Ctrl-C
//! exits at once (130) without writing.
//!
//! **Which plan.** Baselines are the framework's own settings (`search::baselines::for_framework`;
//! a trace has one, `as_recorded`); the search starts from the fastest and only makes moves the
//! framework's export applies (`search::framework`), so `planned_iteration_ms` is what the
//! export gives. The headline compares with the framework's default.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::output::gb;
use super::pass_plan::all_passes;
use super::report;
use super::source::{self, Input, Source};
use super::{CliError, PlanArgs, exit};
use crate::cost::framework::Framework;
use crate::cost::memory::MemoryPeaks;
use crate::graph::job::Job;
use crate::plan::{FinalConfig, Plan, Point, Predicted, SCHEMA_VERSION, SearchStats, round_ms};
use crate::search::framework::Names;
use crate::search::{self, Advice, Decision, SearchError, SearchOptions, Speedups, StopReason};

/// Set by the first Ctrl-C (`cli::atomic`'s handler; a second one exits at once).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How long the main thread waits for the worker to stop by itself after Ctrl-C or the
/// deadline before it writes the snapshot.
pub const GRACE: Duration = Duration::from_millis(400);

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

/// A baseline as the plan reports it.
#[derive(Clone, Debug)]
struct BaseRow {
    name: &'static str,
    /// The job, kept for the rows a plan can start from or be compared with (the first, the
    /// framework's default, the search's start): the others are reported by their numbers, and
    /// holding their edited graphs through the search would cost a graph each (issue 28).
    job: Option<Job>,
    ns: u64,
    peaks: MemoryPeaks,
    config: String,
    knobs: BTreeMap<String, String>,
}

/// The best plan evaluated so far, as the worker last reported it.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    baselines: Vec<BaseRow>,
    /// The baseline the search starts from (`None` until the worker chose it).
    start: Option<&'static str>,
    best: Option<(Job, Vec<Decision>, u64, MemoryPeaks)>,
    replays: u64,
    rounds: usize,
    /// The options the search runs with (the DDP layout included), for the report of a plan
    /// written from the snapshot.
    opts: Option<SearchOptions>,
    /// The layouts the memory step tried, when nothing fitted (for `--top` with exit 4).
    infeasible_layouts: Vec<search::layout::LayoutRow>,
}

/// How the worker thread ended.
enum WorkerEnd {
    Done(Result<Finished, CliError>),
    /// It panicked (a bug): the panic's message.
    Panicked(String),
}

/// What the worker hands back when it finishes.
struct Finished {
    outcome: search::Outcome,
    lower_ns: Option<u64>,
}

/// The headline baseline of `fw` (its default), or `as_recorded` for a trace.
fn default_name(fw: Framework, trace: bool) -> &'static str {
    if trace {
        return "as_recorded";
    }
    match fw {
        Framework::Pytorch => "ddp_default",
        Framework::Horovod => "horovod_default",
        Framework::Byteps => "byteps_default",
        Framework::Tf => "tf_default",
        Framework::Jax => "jax_default",
        Framework::Deepspeed => "deepspeed_default",
        Framework::Torchtitan => "fsdp2_default",
        Framework::Megatron => "megatron_default",
    }
}

/// Longest `--budget`: 30 days (the search converges in seconds to minutes; a longer budget is
/// a typo, and `500000000000years` once passed).
pub const MAX_BUDGET: Duration = Duration::from_secs(30 * 86_400);

/// The threads candidates are evaluated on, within the memory ceiling: one evaluation of `job`
/// in the form the search uses (symmetric when allowed) needs
/// [`crate::graph::bounds::expanded_ops`] × [`crate::limits::EVAL_BYTES_PER_OP`] bytes. A
/// large job ([`search::SERIAL_OPS`] ops and more), or one whose parallel evaluations would not
/// fit, is evaluated one candidate at a time — so `plan` needs about what `replay` needs; one
/// that does not fit even alone is refused with what it would need (exit 3).
fn eval_pool(job: &crate::graph::job::Job, symmetry: bool) -> Result<rayon::ThreadPool, CliError> {
    let ops = evaluated_ops(job, symmetry);
    let one = ops.saturating_mul(crate::limits::EVAL_BYTES_PER_OP);
    // The cores, not `rayon::current_num_threads()`, which would start the global pool's
    // threads (and their allocator arenas) only to ask its size.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    crate::limits::check(|| format!("evaluating the job's {ops} ops"), one)
        .map_err(CliError::bad_input)?;
    let lean =
        ops >= search::SERIAL_OPS || one.saturating_mul(threads + 1) > crate::limits::available();
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

/// Ops of one evaluation of `job` in the form the search replays it (symmetric where it can).
fn evaluated_ops(job: &crate::graph::job::Job, symmetry: bool) -> u64 {
    crate::graph::bounds::expanded_ops_in(job, evaluated_symmetric(job, symmetry))
}

/// Whether the search evaluates `job` in the symmetric form.
fn evaluated_symmetric(job: &crate::graph::job::Job, symmetry: bool) -> bool {
    job.symmetric
        || (symmetry && job.comm.scheme == crate::cost::config::SyncScheme::Ring && job.workers > 1)
}

/// Whether `job` is small enough for the search's threads to share one malloc arena (fewer
/// than [`SHARED_ARENA_OPS`] ops per evaluation). Its workers' ops are a floor of the count: a
/// large job is ruled out by it without laying out every worker's collectives.
fn shares_one_arena(job: &crate::graph::job::Job, symmetry: bool) -> bool {
    let workers = if evaluated_symmetric(job, symmetry) {
        1
    } else {
        u64::from(job.workers)
    };
    workers.saturating_mul(job.local.ops.len() as u64) < SHARED_ARENA_OPS
        && evaluated_ops(job, symmetry) < SHARED_ARENA_OPS
}

/// Below this many ops per evaluation (a few MB each) the search's threads share one malloc
/// arena.
const SHARED_ARENA_OPS: u64 = 1 << 16;

/// `trainplan plan`: the settings, the input, the outputs checked; the search on a worker
/// thread watched by this one; the plan (the worker's outcome, or the snapshot of the best so
/// far) gated on memory, written and reported.
pub fn plan_cmd(a: &PlanArgs) -> Result<(), CliError> {
    let t0 = Instant::now();
    let s = Settings::parse(a, t0)?;
    let (ranks, input) = plan_input(a)?;
    // A small job: every thread of the search allocates from one arena, and blocks of 128 KiB
    // or more (a candidate's graph) are unmapped when freed. With an arena per thread, a graph
    // one thread frees stays resident in its arena while another thread's arena grows for the
    // next candidate; and glibc's dynamic mmap threshold, raised by the first graph freed,
    // keeps later ones in the heap. Together that was most of what `plan` held above `replay`
    // (BERT-base on 1,024 GPUs, symmetric: 16.4-17.0 -> 14.6-14.8 MB resident, 0.08 -> 0.12 s
    // on two cores; issue 28). Before the search's threads start: glibc fixes the arena limit
    // when a thread first needs an arena.
    let searched = input.sync.as_ref().map_or(&input.job, |s| &s.0);
    if shares_one_arena(searched, !a.no_symmetry) {
        crate::limits::limit_malloc_arenas(1);
        // glibc's own starting threshold (DEFAULT_MMAP_THRESHOLD_MIN, 128 KiB), held there.
        crate::limits::fix_mmap_threshold(128 << 10);
    }
    // Every input is read by now: refuse (exit 2) a plan or picture path that is one of them, or
    // a plan named `.svg` (its picture would replace it), before the search.
    let svg_path = a.output.with_extension("svg");
    super::distinct::check(
        &[
            super::distinct::Output::new("-o", &a.output),
            super::distinct::Output::new("the plan's picture (-o with .svg)", &svg_path),
        ],
        &[],
        &[],
    )?;
    let w = Workload::of(a, &s, &input, ranks.as_ref())?;
    let opts = search_options(a, &s, &w);
    // Ctrl-C stops the search, which then writes its best plan (a second Ctrl-C exits at once).
    super::atomic::interrupt_flag(&INTERRUPTED);
    let bar = progress_bar(a, s.budget);
    let snapshot = Arc::new(Mutex::new(Snapshot::default()));
    let rx = spawn_search(input, w.fw, &opts, s.all, &snapshot, bar.clone())?;
    let (finished, stopped_at) = match watch(&rx, s.deadline, &snapshot) {
        // Nothing fits: with --top, what came closest goes to stderr before the error.
        Err(e) if e.code == exit::INFEASIBLE && a.top.is_some() => {
            let rows = snapshot
                .lock()
                .map(|s| s.infeasible_layouts.clone())
                .unwrap_or_default();
            let k = a.top.unwrap_or(0) as usize;
            let mut err = super::output::Clean::new(std::io::stderr().lock());
            for line in super::layouts::top_lines(&rows, k, w.per_step) {
                let _ = writeln!(err, "{line}");
            }
            return Err(e);
        }
        r => r?,
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let snap = snapshot.lock().map(|s| s.clone()).unwrap_or_default();
    let headline = headline(&snap, w.fw, w.is_trace)?;
    // The worker did not return within GRACE of the deadline: the best plan so far gets the
    // same report a finished search gives (issue 20), evaluated here; after Ctrl-C the user
    // asked to stop, so the snapshot is written as it is.
    let finished = match finished {
        None if stopped_at.is_some_and(|s| s.1 == StopReason::Budget) => {
            snapshot_report(&snap, all_passes(&a.pass_file)?, w.is_trace)?
        }
        f => f,
    };
    // Several ranks: the decisions applied to every rank, all replayed together (unless
    // interrupted: then the slowest rank is reported).
    let multi = match (&ranks, &finished) {
        (Some((l, base)), Some(f)) if f.outcome.stop != StopReason::Interrupted => {
            Some(ranks_plan(a, l, base, &f.outcome.decisions)?)
        }
        _ => None,
    };
    let extra = finished
        .as_ref()
        .map(|f| TraceExtra::of(&f.outcome, multi.as_ref()));
    let layouts = a.top.map(|k| {
        let rows = finished
            .as_ref()
            .map_or(&[][..], |f| f.outcome.layouts.as_slice());
        (
            super::layouts::top_json(rows, k as usize, w.per_step),
            super::layouts::top_lines(rows, k as usize, w.per_step),
        )
    });
    let chosen = Chosen::of(finished, stopped_at, &snap, &headline, w.fw, multi.as_ref())?;
    let memory_modelled = headline.peaks.allocated > 0
        && headline
            .job
            .as_ref()
            .is_some_and(super::traceinfo::has_memory);
    check_memory_gate(&w, &chosen, memory_modelled)?;
    let plan = make_plan(
        &w,
        &opts,
        s.budget,
        &snap,
        &headline,
        &chosen,
        memory_modelled,
        multi.as_ref(),
    );
    write_plan(a, &plan, &svg_path)?;
    report(a, &plan, t0.elapsed(), &svg_path, extra.as_ref(), layouts)?;
    if chosen.stop == StopReason::Interrupted {
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

/// `plan`'s own flags, parsed and checked before any input is read.
struct Settings {
    budget: Duration,
    /// The start of the command plus the budget.
    deadline: Instant,
    /// `--memory-budget`, bytes.
    memory_budget: Option<u64>,
    /// Every pass (built-in and `--pass-file`).
    all: Vec<Box<dyn crate::passes::Pass>>,
    /// `--passes`, each name known.
    passes: Option<Vec<String>>,
}

impl Settings {
    fn parse(a: &PlanArgs, t0: Instant) -> Result<Settings, CliError> {
        let budget =
            parse_budget(&a.budget).map_err(|e| CliError::usage(format!("--budget: {e}")))?;
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
        Ok(Settings {
            budget,
            deadline: t0 + budget,
            memory_budget,
            all,
            passes,
        })
    }
}

/// Several ranks loaded, with their prediction before any change.
type LoadedRanks = (super::ranks::Loaded, crate::trace::multi::RanksPrediction);

/// The job the search runs on. Several ranks (a folder of traces): the slowest rank
/// (collectives hold every rank to it); its decisions are later applied to every rank and all
/// are replayed together.
fn plan_input(a: &PlanArgs) -> Result<(Option<LoadedRanks>, Input), CliError> {
    let src = source::resolve(&a.input)?;
    let Source::Ranks(files) = &src else {
        return Ok((None, source::load(&a.input, &src)?));
    };
    let l = super::ranks::load_ranks(&a.input, files)?;
    let base = crate::trace::multi::predict(&l.ranks, &l.offsets).map_err(CliError::bad_input)?;
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
    let input = Input {
        job,
        sync: None,
        model: None,
        cluster: None,
        trace: None,
    };
    Ok((Some((l, base)), input))
}

/// What the plan is of, read off the input before the search takes it.
struct Workload {
    fw: Framework,
    is_trace: bool,
    /// The GPU's memory, bytes.
    gpu_bytes: u64,
    /// The memory budget: the GPU's memory unless --memory-budget asks for less.
    memory_budget: Option<u64>,
    baseline_precision: String,
    half: Option<(&'static str, u64)>,
    /// Ranks of the traced run (or the job's workers).
    world: u32,
    meta: crate::graph::job::JobMeta,
    workers: u32,
    /// For a transformer from the zoo, per GPU per step: tokens, and the FLOPs of the model's
    /// matrix products in a forward and backward ([`crate::zoo::Model::matrix_flops`]).
    per_step: Option<(f64, f64)>,
}

impl Workload {
    fn of(
        a: &PlanArgs,
        s: &Settings,
        input: &Input,
        ranks: Option<&LoadedRanks>,
    ) -> Result<Workload, CliError> {
        // The memory budget: the GPU's memory unless --memory-budget asks for less (never
        // more: the device-used peak must fit the GPU).
        let gpu_bytes = input.job.gpu.memory_bytes();
        if let Some(b) = s.memory_budget
            && b > gpu_bytes
        {
            return Err(CliError::usage(format!(
                "--memory-budget {} ({b} bytes) is above the {} ({gpu_bytes} bytes) of a {}: a plan must fit the GPU",
                a.memory_budget.as_deref().unwrap_or(""),
                gb(gpu_bytes),
                input.job.gpu.model
            )));
        }
        let fw = a.input.framework;
        let baseline_precision = precision_name(&input.job, a.input.precision);
        let half = half_baseline(a, input, fw);
        let facts_world = input.job.meta.trace.as_deref().and_then(|f| f.world_size);
        let world = match (ranks, &input.trace) {
            (Some((l, _)), _) => facts_world.unwrap_or(l.ranks.len() as u32),
            (None, Some(t)) => facts_world.unwrap_or(t.world_size),
            (None, None) => facts_world.unwrap_or(input.job.workers),
        };
        let per_step = input
            .model
            .as_ref()
            .filter(|m| m.tokens_per_sample > 0)
            .map(|m| {
                (
                    f64::from(m.batch) * f64::from(m.tokens_per_sample),
                    m.matrix_flops(),
                )
            });
        Ok(Workload {
            per_step,
            fw,
            is_trace: input.trace.is_some() || input.job.is_recorded(),
            gpu_bytes,
            memory_budget: Some(s.memory_budget.unwrap_or(gpu_bytes)),
            baseline_precision,
            half,
            world,
            meta: input.job.meta.clone(),
            workers: input.job.workers,
        })
    }
}

/// The search's options from the flags.
fn search_options(a: &PlanArgs, s: &Settings, w: &Workload) -> SearchOptions {
    let names = if w.is_trace { Names::Trace } else { Names::Zoo };
    SearchOptions {
        budget: s.budget,
        memory_budget: w.memory_budget,
        passes: s.passes.clone(),
        strategy: a.strategy,
        seed: a.seed,
        speedups: Speedups {
            coarsen: !a.no_coarsen,
            partial_replay: !a.no_partial_replay,
            symmetry: !a.no_symmetry,
            lazy: !a.no_lazy,
        },
        framework: Some((w.fw, names)),
        deadline: Some(s.deadline),
        max_rounds: a.max_rounds.map(|n| n as usize),
        ..SearchOptions::default()
    }
}

/// The progress bar, when it shows ([`show_progress`]).
fn progress_bar(a: &PlanArgs, budget: Duration) -> Option<indicatif::ProgressBar> {
    let show = show_progress(
        a.json,
        std::io::stderr().is_terminal(),
        std::env::var_os("CI").is_some(),
    );
    show.then(|| {
        let b = indicatif::ProgressBar::new(budget.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} searching [{bar:20}] {msg} · {elapsed} of the budget",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b.set_message("baselines");
        b
    })
}

/// Start [`work`] on its own thread; it reports how it ended on the returned channel.
fn spawn_search(
    input: Input,
    fw: Framework,
    opts: &SearchOptions,
    all: Vec<Box<dyn crate::passes::Pass>>,
    snapshot: &Arc<Mutex<Snapshot>>,
    bar: Option<indicatif::ProgressBar>,
) -> Result<std::sync::mpsc::Receiver<WorkerEnd>, CliError> {
    let (tx, rx) = std::sync::mpsc::channel::<WorkerEnd>();
    let snapshot = Arc::clone(snapshot);
    let opts = opts.clone();
    std::thread::Builder::new()
        .name("trainplan-search".into())
        .spawn(move || {
            // A panic is a bug; it still ends the command with a message naming it, not
            // with "the search thread ended without a result" (issue 20).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                work(input, fw, &opts, all, &snapshot, bar.as_ref())
            }));
            let _ = tx.send(match r {
                Ok(r) => WorkerEnd::Done(r),
                Err(p) => WorkerEnd::Panicked(panic_message(p.as_ref())),
            });
        })
        .map_err(|e| CliError::internal(format!("failed to start the search thread: {e}")))?;
    Ok(rx)
}

/// When and why the main thread stopped waiting for the worker.
type Stopped = Option<(Instant, StopReason)>;

/// Watch for the worker's result, Ctrl-C, or the deadline; give up on the worker [`GRACE`]
/// after Ctrl-C or the deadline (`None`: the plan comes from the snapshot).
fn watch(
    rx: &std::sync::mpsc::Receiver<WorkerEnd>,
    deadline: Instant,
    snapshot: &Mutex<Snapshot>,
) -> Result<(Option<Finished>, Stopped), CliError> {
    let mut stopped_at: Stopped = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(WorkerEnd::Done(r)) => return Ok((Some(r?), stopped_at)),
            Ok(WorkerEnd::Panicked(m)) => {
                return Err(CliError::internal(format!(
                    "the search failed (a bug in trainplan; please report it with the command): {m}"
                )));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(CliError::internal(
                    "the search thread ended without a result",
                ));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if stopped_at.is_none() {
            if INTERRUPTED.load(Ordering::SeqCst) {
                stopped_at = Some((now, StopReason::Interrupted));
            } else if now >= deadline && searching(snapshot) {
                // A budget shorter than the baselines: the worker stops after the first ones
                // (it checks the deadline between them), and the plan starts from those.
                stopped_at = Some((now, StopReason::Budget));
            }
        }
        if let Some((at, _)) = stopped_at
            && now.duration_since(at) >= GRACE
        {
            return Ok((None, stopped_at));
        }
    }
}

/// The baseline the search starts from: the one the worker chose, else (the worker stopped
/// before choosing) the fastest evaluated that is not `none`, else the first.
fn start_row(snap: &Snapshot) -> Option<&BaseRow> {
    let chosen = snap
        .start
        .and_then(|n| snap.baselines.iter().find(|b| b.name == n));
    chosen
        .or_else(|| {
            snap.baselines
                .iter()
                .filter(|b| b.name != "none" && b.job.is_some())
                .min_by_key(|b| b.ns)
        })
        .or_else(|| snap.baselines.first())
}

/// The baseline the plan is compared with: the framework's default, else (a budget that
/// ended before it) the first evaluated, with a warning; none at all is an interruption.
fn headline(snap: &Snapshot, fw: Framework, is_trace: bool) -> Result<BaseRow, CliError> {
    let default = default_name(fw, is_trace);
    let headline = snap
        .baselines
        .iter()
        .find(|b| b.name == default)
        .or_else(|| snap.baselines.first())
        .cloned();
    let Some(headline) = headline else {
        return Err(CliError {
            code: exit::INTERRUPTED,
            message: "interrupted before any plan was evaluated: nothing written".into(),
        });
    };
    if headline.name != default {
        tracing::warn!(
            "the budget ended before the framework's default ({default}) was evaluated: the plan \
             is compared with {}, not with the default",
            headline.name
        );
    }
    Ok(headline)
}

/// The plan chosen: the worker's outcome, or the snapshot's best so far; and the baseline
/// and planned figures it reports (several ranks: all replayed together).
struct Chosen {
    best_job: Job,
    decisions: Vec<Decision>,
    advice: Vec<Advice>,
    stop: StopReason,
    replays: u64,
    rounds: usize,
    lower_ns: Option<u64>,
    base_ns: u64,
    base_peak: MemoryPeaks,
    best_ns: u64,
    best_peak: MemoryPeaks,
}

impl Chosen {
    fn of(
        finished: Option<Finished>,
        stopped_at: Stopped,
        snap: &Snapshot,
        headline: &BaseRow,
        fw: Framework,
        multi: Option<&RanksPlan>,
    ) -> Result<Chosen, CliError> {
        let mut c = match finished {
            Some(f) => {
                let o = f.outcome;
                Chosen {
                    best_job: o.best.job.clone(),
                    decisions: o.decisions,
                    best_ns: o.best.iteration_ns(),
                    best_peak: o.best.memory.peaks,
                    advice: o.advice,
                    stop: o.stop,
                    replays: o.replays,
                    rounds: o.rounds,
                    lower_ns: f.lower_ns,
                    base_ns: headline.ns,
                    base_peak: headline.peaks,
                }
            }
            None => {
                let (j, d, ns, pk) = match snap.best.clone() {
                    Some(best) => best,
                    None => {
                        let b = start_row(snap)
                            .filter(|b| b.job.is_some())
                            .unwrap_or(headline);
                        let job = b.job.clone().ok_or_else(|| {
                            CliError::internal(format!("baseline {} kept no job", b.name))
                        })?;
                        let d = start_decision(b, &snap.baselines, fw);
                        (job, d.into_iter().collect(), b.ns, b.peaks)
                    }
                };
                Chosen {
                    best_job: j,
                    decisions: d,
                    best_ns: ns,
                    best_peak: pk,
                    advice: Vec::new(),
                    stop: stopped_at.map_or(StopReason::Budget, |s| s.1),
                    replays: snap.replays,
                    rounds: snap.rounds,
                    lower_ns: None,
                    base_ns: headline.ns,
                    base_peak: headline.peaks,
                }
            }
        };
        if let Some(m) = multi {
            (c.base_ns, c.base_peak, c.best_ns, c.best_peak) =
                (m.baseline_ns, m.baseline_peak, m.planned_ns, m.planned_peak);
        }
        Ok(c)
    }
}

/// The gate: no plan over the memory budget is written (an interrupted or budget-cut search
/// can hold a start that does not fit).
fn check_memory_gate(w: &Workload, c: &Chosen, memory_modelled: bool) -> Result<(), CliError> {
    if let Some(budget) = w.memory_budget
        && memory_modelled
        && c.best_peak.against_budget(w.gpu_bytes, budget) > budget
    {
        return Err(CliError {
            code: exit::INFEASIBLE,
            message: format!(
                "no plan within the memory budget of {} was reached before the search stopped ({:?}): the best plan so far needs {} of device memory; nothing written",
                gb(budget),
                c.stop,
                gb(c.best_peak.against_budget(w.gpu_bytes, budget))
            ),
        });
    }
    Ok(())
}

/// The plan file's content.
#[allow(clippy::too_many_arguments)]
fn make_plan(
    w: &Workload,
    opts: &SearchOptions,
    budget: Duration,
    snap: &Snapshot,
    headline: &BaseRow,
    c: &Chosen,
    memory_modelled: bool,
    multi: Option<&RanksPlan>,
) -> Plan {
    let point = |ms: f64, p: &MemoryPeaks| Point {
        iteration_ms: ms,
        peak_memory_bytes: memory_modelled.then_some(p.allocated),
        reserved_peak_bytes: memory_modelled.then_some(p.reserved),
        device_used_bytes: memory_modelled.then_some(p.device_used),
    };
    let ms3 = |ns: u64| round_ms(ns as f64 / 1e6);
    let cluster = if w.is_trace {
        format!(
            "the traced run ({} rank{})",
            w.world,
            if w.world == 1 { "" } else { "s" }
        )
    } else {
        w.meta.cluster.clone()
    };
    Plan {
        trainplan: SCHEMA_VERSION,
        workload: crate::plan::Workload {
            source: w.meta.source.clone(),
            ranks: if w.is_trace { w.world } else { w.workers },
            model: w.meta.model.clone(),
            batch: (w.meta.batch > 0).then_some(w.meta.batch),
            cluster,
            names: w.meta.source.clone(),
            framework: w.fw,
        },
        predicted: Predicted {
            baseline_name: headline.name.to_string(),
            baseline: point(ms3(c.base_ns), &c.base_peak),
            planned: point(ms3(c.best_ns), &c.best_peak),
            speedup: round_ms(c.base_ns as f64 / c.best_ns.max(1) as f64),
            lower_bound_ms: c.lower_ns.map(|l| ms3(l.min(c.best_ns))),
            gpu_memory_bytes: Some(w.gpu_bytes),
            memory_budget_bytes: w.memory_budget,
            baseline_precision: if w.is_trace {
                String::new()
            } else {
                w.baseline_precision.clone()
            },
            half_baseline: w.half.map(|(p, ns)| crate::plan::HalfBaseline {
                precision: p.to_string(),
                iteration_ms: ms3(ns),
                speedup: round_ms(ns as f64 / c.best_ns.max(1) as f64),
            }),
            tokens_per_s_per_gpu: w
                .per_step
                .map(|(tokens, _)| (tokens / (c.best_ns.max(1) as f64 / 1e9)).round()),
            mfu: w.per_step.map(|(_, flops)| {
                let m = flops / (c.best_ns.max(1) as f64 * c.best_job.matrix_peak_flops_per_ns());
                (m * 1e4).round() / 1e4
            }),
        },
        baselines: snap
            .baselines
            .iter()
            .map(|x| {
                let ns = match (multi, x.name) {
                    (Some(m), search::baselines::AS_RECORDED) => m.baseline_ns,
                    _ => x.ns,
                };
                (x.name.to_string(), ms3(ns))
            })
            .collect(),
        decisions: c
            .decisions
            .iter()
            .map(|d| Decision {
                effect_ms: round_ms(d.effect_ms),
                ..d.clone()
            })
            .collect(),
        advice: c
            .advice
            .iter()
            .map(|x| Advice {
                effect_ms: round_ms(x.effect_ms),
                ..x.clone()
            })
            .collect(),
        config: FinalConfig::of(&c.best_job, &c.decisions),
        search: SearchStats {
            strategy: opts.strategy,
            budget_s: budget.as_secs_f64(),
            replays: c.replays,
            rounds: c.rounds,
            stop: c.stop,
            seed: opts.seed,
        },
    }
}

/// Check the plan against the ranges its readers check (`plan::validate`: one out of them is
/// a bug here, not a file for `show` and `export` to refuse later), then write it and its
/// picture atomically.
fn write_plan(a: &PlanArgs, plan: &Plan, svg_path: &std::path::Path) -> Result<(), CliError> {
    plan.check().map_err(|e| {
        CliError::internal(format!(
            "the planner made a plan out of its own ranges: {e}"
        ))
    })?;
    report::write_file(&a.output, "the plan to", |w| {
        w.write_all(plan.to_yaml().as_bytes())
    })?;
    report::write_file(svg_path, "the plan's picture to", |w| {
        w.write_all(crate::plan::svg::waterfall(plan).as_bytes())
    })
}

/// The precision a zoo job computes in, as `--precision` names it: the one given, else what
/// the framework does by default with an FP32 model (`tf32` when its matrix products run on
/// TF32 tensor cores, else `fp32`).
fn precision_name(job: &Job, given: Option<crate::cost::framework::Precision>) -> String {
    use crate::cost::config::Dtype;
    if let Some(p) = given {
        return p.name().to_string();
    }
    match (job.dtype, job.math.matmul) {
        (Dtype::Fp16, _) => "fp16",
        (Dtype::Bf16, _) => "bf16",
        (_, Dtype::Tf32) => "tf32",
        _ => "fp32",
    }
    .to_string()
}

/// For a transformer from the zoo whose baseline computes in fp32: the framework's default
/// synchronisation at `--precision bf16` (fp16 where the GPU has no bf16 peak), replayed as
/// the search replays (precision, ns). A plan that turns AMP on then says what it gains
/// besides mixed precision (issue 27: GPT-2-medium on 64×H100 was 6.62× against fp32, 1.57×
/// against bf16).
fn half_baseline(a: &PlanArgs, input: &Input, fw: Framework) -> Option<(&'static str, u64)> {
    use crate::cost::framework::Precision;
    let (Some(model), Some(cluster)) = (&input.model, &input.cluster) else {
        return None;
    };
    if input.job.dtype != crate::cost::config::Dtype::Fp32
        || !crate::zoo::entry(&model.name).is_ok_and(|e| e.transformer)
    {
        return None;
    }
    let eval = search::evaluator(!a.no_symmetry);
    [Precision::Bf16, Precision::Fp16]
        .into_iter()
        .find_map(|p| {
            let (job, _, _) = search::baselines::zoo_baseline(
                model,
                cluster,
                fw,
                Some(p),
                a.input.amp_style,
                a.input.sync == super::SyncArg::PerTensor,
                a.input.symmetric,
                None,
                a.input.channels_last.then_some(true),
            )
            .ok()?;
            let ns = eval(job).ok()?.iteration_ns();
            Some((p.name(), ns))
        })
}

/// The decision that records starting from baseline `b`. Its effect is measured from the
/// headline baseline (the framework's default, [`default_name`]), like every later decision
/// from the one before it, so that the effects add up to the headline's gain (issue 27: it was
/// measured from `none`).
fn start_decision(b: &BaseRow, all: &[BaseRow], fw: Framework) -> Option<Decision> {
    if b.name == "none" || b.name == "as_recorded" {
        return None;
    }
    let default = default_name(fw, false);
    let from_ns = all
        .iter()
        .find(|x| x.name == default)
        .map_or(b.ns, |x| x.ns);
    Some(Decision {
        pass: format!("baseline:{}", b.name),
        tensors: Vec::new(),
        ops: Vec::new(),
        partitions: None,
        knobs: b.knobs.clone(),
        why: format!(
            "start from the fastest setting of the framework: {} ({})",
            b.name, b.config
        ),
        effect_ms: (b.ns as f64 - from_ns as f64) / 1e6,
        mechanism: search::framework::baseline_mechanism(b.name)
            .unwrap_or("")
            .to_string(),
    })
}

/// Whether `plan` shows its progress bar: on a terminal, never with `--json` or in CI (`CI`
/// set, as CI services do).
fn show_progress(json: bool, stderr_is_terminal: bool, ci: bool) -> bool {
    !json && stderr_is_terminal && !ci
}

/// The progress bar's message after a round: the round, the best plan so far (against the
/// headline baseline) and replays per second (issue 27: minutes of search showed nothing).
fn progress_message(p: &search::Progress, headline: Option<(&str, u64)>) -> String {
    let best = p.best_ns as f64 / 1e6;
    let vs = match headline {
        Some((name, ns)) if ns > 0 => format!(
            " ({:+.1} % vs {name})",
            100.0 * (p.best_ns as f64 / ns as f64 - 1.0)
        ),
        _ => String::new(),
    };
    let secs = p.elapsed.as_secs_f64();
    // Under half a second the rate is noise (one replay in a few ms).
    let rate = if secs >= 0.5 {
        format!("{:.0} replays/s", p.replays as f64 / secs)
    } else {
        "replays/s after 0.5 s".to_string()
    };
    format!(
        "round {} · best plan {best:.1} ms{vs}, {} decisions · {} replays, {rate}",
        p.round,
        p.decisions.len(),
        p.replays
    )
}

impl BaseRow {
    fn of(b: &search::baselines::Baseline) -> BaseRow {
        BaseRow {
            name: b.name,
            job: Some(b.job.clone()),
            ns: b.eval.iteration_ns(),
            peaks: b.eval.memory.peaks,
            config: b.config.clone(),
            knobs: b.knobs.clone(),
        }
    }
}

/// Hand the evaluated baselines to the snapshot with the search's start: the numbers of every
/// one, the jobs of those a plan can start from or be compared with (the first, the default,
/// the start; see [`BaseRow::job`]).
fn publish_baselines(
    table: Vec<BaseRow>,
    start: &'static str,
    default: &str,
    snapshot: &Mutex<Snapshot>,
) {
    let n = table.len();
    let kept: Vec<BaseRow> = table
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            if !(i == 0 || r.name == default || r.name == start) {
                r.job = None;
            }
            r
        })
        .collect();
    if let Ok(mut s) = snapshot.lock() {
        s.baselines = kept;
        s.start = Some(start);
        s.replays = n as u64;
    }
}

/// The worker: baselines, then the search, updating `snapshot` as it goes.
fn work(
    input: Input,
    fw: Framework,
    opts: &SearchOptions,
    all: Vec<Box<dyn crate::passes::Pass>>,
    snapshot: &Mutex<Snapshot>,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<Finished, CliError> {
    let stop = || {
        INTERRUPTED.load(Ordering::Relaxed) || opts.deadline.is_some_and(|d| Instant::now() >= d)
    };
    let eval = search::evaluator(opts.speedups.symmetry);
    let trace = input.trace.is_some() || input.job.is_recorded();
    // The baselines rewrite the job with one collective per gradient tensor. Nothing else of
    // the input is needed here: the job as the framework runs it is rebuilt as a baseline.
    let Input {
        job: as_run,
        sync,
        model,
        cluster,
        trace: recorded,
    } = input;
    drop((model, cluster, recorded));
    let job = match sync {
        Some((per_tensor, _)) => {
            drop(as_run);
            per_tensor
        }
        None => as_run,
    };
    // Within the memory ceiling: a large job's baselines and candidates one at a time.
    let pool = eval_pool(&job, opts.speedups.symmetry)?;
    // The report's form, decided once from the unoptimised job (as `replay` of that job would
    // choose), so the plan's report needs no more memory than that replay. Decided before the
    // baselines: counting the full graph lays out every worker's collectives (3.4 MB at 65,536
    // workers), which should not add to what the baselines hold.
    let report_form = search::report_symmetric(&job);
    let rows: Vec<search::baselines::Baseline> = if trace {
        // A trace is one recorded run: its own synchronisation is the only baseline.
        pool.install(|| search::baselines::recorded(&job, &eval))
            .map_err(CliError::bad_input)?
    } else {
        pool.install(|| search::baselines::for_framework(&job, fw, &eval, &stop))
            .map_err(CliError::bad_input)?
    };
    let rows: Vec<(BaseRow, search::baselines::Baseline)> =
        rows.into_iter().map(|b| (BaseRow::of(&b), b)).collect();
    let table: Vec<BaseRow> = rows.iter().map(|r| r.0.clone()).collect();
    let headline_ns = table
        .iter()
        .find(|r| r.name == default_name(fw, trace))
        .map(|r| (r.name, r.ns));
    // Start from the fastest setting the export can write (`none` is a reference only) that is
    // unsharded, fitting ones first: sharding is a memory move here (FSDP2's and ZeRO's copy-in
    // / copy-out and hook overheads are not modelled, so a predicted speed-up of sharding is
    // not one the model can vouch for). The sharded baselines are references; the memory step
    // shards where memory demands it.
    let budget = opts.memory_budget.unwrap_or(u64::MAX);
    let capacity = job.gpu.memory_bytes();
    let rank = |r: &BaseRow| {
        let sharded = r.knobs.contains_key("stage");
        (
            sharded,
            r.peaks.against_budget(capacity, budget) > budget,
            r.ns,
        )
    };
    let start = rows
        .iter()
        .filter(|(r, _)| r.name != "none")
        .min_by_key(|(r, _)| rank(r))
        .or_else(|| rows.first())
        .ok_or_else(|| CliError::internal("no baseline was evaluated"))?;
    let prefix: Vec<Decision> = start_decision(&start.0, &table, fw).into_iter().collect();
    let baselines = table.len();
    publish_baselines(table, start.0.name, default_name(fw, trace), snapshot);
    // PyTorch: DDP rebuilds its buckets in autograd's order, which AMP changes; every job the
    // search evaluates is regrouped the way DDP will group it.
    let mut opts = opts.clone();
    opts.report_symmetric = Some(report_form);
    if fw == Framework::Pytorch && !trace {
        opts.ddp = search::baselines::DdpLayout::caps(start.0.name, &start.0.knobs)
            .and_then(|(first, cap)| search::baselines::DdpLayout::of(&job, first, cap));
    }
    if let Ok(mut s) = snapshot.lock() {
        s.opts = Some(opts.clone());
    }
    // Tests wait for this line (RUST_LOG=trainplan=info) before they send Ctrl-C.
    tracing::info!(baselines, "baselines evaluated, searching");
    let opts = &opts;
    let start_eval = start.1.eval.clone();
    drop(rows);
    drop(job);
    // A best so far that fits the memory budget is never replaced by one that does not: the
    // unconstrained part of the search reports faster jobs over the budget after the memory
    // step on the start reported one that fits, and a cut search writes the snapshot.
    let fits = |peaks: &MemoryPeaks, job: &Job| {
        opts.memory_budget
            .is_none_or(|b| peaks.against_budget(job.gpu.memory_bytes(), b) <= b)
    };
    let progress = |p: &search::Progress| {
        if let Ok(mut s) = snapshot.lock() {
            let keep = s.best.as_ref().is_some_and(|(j, _, _, k)| fits(k, j))
                && !fits(&p.best_peaks, p.best_job);
            if !keep {
                s.best = Some((
                    p.best_job.clone(),
                    p.decisions.to_vec(),
                    p.best_ns,
                    p.best_peaks,
                ));
            }
            s.replays = p.replays;
            s.rounds = p.round;
        }
        if let Some(b) = bar {
            b.set_position(p.elapsed.as_millis() as u64);
            b.set_message(progress_message(p, headline_ns));
        }
    };
    let outcome = match pool
        .install(|| search::search_from(start_eval, prefix, opts, &all, &INTERRUPTED, &progress))
    {
        Ok(o) => o,
        Err(e @ SearchError::Infeasible { .. }) => return Err(infeasible(e, snapshot)),
        Err(e) => return Err(CliError::bad_input(e)),
    };
    let lower_ns = lower_bound_ns(&outcome, trace)?;
    let mut outcome = outcome;
    outcome.replays += baselines as u64;
    Ok(Finished { outcome, lower_ns })
}

/// Exit 4 for an infeasible search, its layouts left in the snapshot (for `--top`).
fn infeasible(e: SearchError, snapshot: &Mutex<Snapshot>) -> CliError {
    let message = e.to_string();
    if let (SearchError::Infeasible { layouts, .. }, Ok(mut s)) = (e, snapshot.lock()) {
        s.infeasible_layouts = layouts;
    }
    CliError {
        code: exit::INFEASIBLE,
        message,
    }
}

/// The plan's lower bound (the plan with free synchronisation; a trace's own step), unless the
/// search was interrupted.
fn lower_bound_ns(outcome: &search::Outcome, trace: bool) -> Result<Option<u64>, CliError> {
    Ok(match outcome.stop {
        StopReason::Interrupted => None,
        _ if trace => Some(outcome.best.iteration_ns()),
        _ => Some(
            search::comm_free_bound_ns(&outcome.best.job, &search::evaluator(true))
                .map_err(CliError::bad_input)?,
        ),
    })
}

/// A finished search's outcome for the best plan of the snapshot, when the worker did not
/// stop within [`GRACE`] of the deadline: the start (the fastest baseline, as the worker
/// starts from) evaluated in the search's form, the best job in the report's form, the advice
/// and the lower bound, as the worker computes them. `None` when nothing was evaluated.
fn snapshot_report(
    snap: &Snapshot,
    all: Vec<Box<dyn crate::passes::Pass>>,
    trace: bool,
) -> Result<Option<Finished>, CliError> {
    let Some(opts) = &snap.opts else {
        return Ok(None);
    };
    let Some(start) = start_row(snap).and_then(|b| b.job.as_ref()) else {
        return Ok(None);
    };
    let (job, decisions) = match &snap.best {
        Some((j, d, _, _)) => (j.clone(), d.clone()),
        None => (start.clone(), Vec::new()),
    };
    let eval = search::evaluator(opts.speedups.symmetry);
    let baseline = eval(start.clone()).map_err(CliError::bad_input)?;
    let form = opts
        .report_symmetric
        .unwrap_or_else(|| search::report_symmetric(&job));
    let best =
        search::evaluate_full(job.clone(), form, opts.lean_ops).map_err(CliError::bad_input)?;
    let (advice, n) = search::advice_for(&best, opts, &all).map_err(CliError::bad_input)?;
    let outcome = search::Outcome {
        baseline,
        best,
        decisions,
        advice,
        replays: snap.replays + 2 + n,
        wall: Duration::ZERO,
        stop: StopReason::Budget,
        rounds: snap.rounds,
        // An interrupted search's snapshot keeps no layout table.
        layouts: Vec::new(),
    };
    let lower_ns = lower_bound_ns(&outcome, trace)?;
    Ok(Some(Finished { outcome, lower_ns }))
}

/// Whether the worker has evaluated its baselines and started the search (so a plan can be
/// written from the snapshot).
fn searching(snapshot: &Mutex<Snapshot>) -> bool {
    snapshot.lock().is_ok_and(|s| s.opts.is_some())
}

/// The text of a panic's payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Several ranks planned together.
struct RanksPlan {
    baseline_ns: u64,
    planned_ns: u64,
    baseline_peak: MemoryPeaks,
    planned_peak: MemoryPeaks,
    /// (rank, baseline ns, planned ns).
    per_rank: Vec<(u32, u64, u64)>,
}

/// The plan's decisions (the slowest rank's) applied to every rank, all replayed together.
fn ranks_plan(
    a: &PlanArgs,
    l: &super::ranks::Loaded,
    base: &crate::trace::multi::RanksPrediction,
    decisions: &[Decision],
) -> Result<RanksPlan, CliError> {
    let all = all_passes(&a.pass_file)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut args = Vec::new();
    for d in decisions {
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
    let plan = super::pass_plan::resolve(&all, &args)?;
    let (after, evals, _) = super::ranks::apply_to_ranks(&l.ranks, &plan)?;
    let planned = crate::trace::multi::predict(&after, &l.offsets).map_err(CliError::bad_input)?;
    // Each peak is the highest over the ranks.
    let peak = |f: fn(&(crate::passes::Evaluated, crate::passes::Evaluated)) -> MemoryPeaks| {
        evals.iter().map(f).fold(MemoryPeaks::default(), |a, p| {
            if p.needed() > a.needed() {
                MemoryPeaks {
                    allocated: a.allocated.max(p.allocated),
                    reserved: a.reserved.max(p.reserved),
                    ..p
                }
            } else {
                MemoryPeaks {
                    allocated: a.allocated.max(p.allocated),
                    reserved: a.reserved.max(p.reserved),
                    ..a
                }
            }
        })
    };
    Ok(RanksPlan {
        baseline_ns: base.step_ns,
        planned_ns: planned.step_ns,
        baseline_peak: peak(|e| e.0.memory.peaks),
        planned_peak: peak(|e| e.1.memory.peaks),
        per_rank: l
            .ranks
            .iter()
            .enumerate()
            .map(|(i, r)| (r.rank, base.predicted_ns[i], planned.predicted_ns[i]))
            .collect(),
    })
}

/// The traced run's steady period against the step its trace measured, when they are more than
/// 5 % apart (and the plan runs the recorded worker count: an extrapolated rank's measured step
/// is another job's).
fn as_recorded_gap(b: &crate::passes::Evaluated) -> Option<String> {
    let s = b.steady?;
    let f = b.job.meta.trace.as_deref()?;
    // One rank standing for `--cluster`'s workers: its measured step is another job's.
    if f.ranks_given <= 1 && b.job.workers > 1 {
        return None;
    }
    let measured = f.measured_step_ns?;
    let why = super::traceinfo::period_gap(s.period_ns, measured, Some(s.by))?;
    Some(format!(
        "as_recorded is the traced step replayed in steady state, {} a step; its trace measured {}: {why}",
        super::output::dur_ms(s.period_ns as f64 / 1e6, 1),
        super::output::dur_ms(measured as f64 / 1e6, 1),
    ))
}

/// What a plan on a trace adds to its report.
struct TraceExtra {
    facts: Option<String>,
    facts_json: serde_json::Value,
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
        // The search keeps a large best lean (no graph, no replay): its GPU time and critical
        // path need the full evaluation (once; was "GPU time 39.6 ms → 0 ms" on every trace).
        // Trace jobs only: a zoo plan's lean best is a large graph kept lean on purpose.
        let full = (job.is_recorded() && p.is_lean())
            .then(|| crate::passes::evaluate(p.job.clone()).ok())
            .flatten();
        let p = full.as_ref().unwrap_or(p);
        let bb = super::traceinfo::Bound::of(b);
        let pb = super::traceinfo::Bound::of(p);
        let mut lines = Vec::new();
        if job.is_recorded() {
            if let Some(line) = as_recorded_gap(b) {
                lines.push(line);
            }
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
            lines,
            // A lean evaluation (a large zoo plan's) has no replay to read a GPU time or a
            // critical path from: null, not zeros.
            bound: if b.is_lean() {
                serde_json::Value::Null
            } else {
                super::traceinfo::bound_json(&bb, (!p.is_lean()).then_some(&pb))
            },
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
    wall: Duration,
    svg: &std::path::Path,
    extra: Option<&TraceExtra>,
    layouts: Option<(serde_json::Value, Vec<String>)>,
) -> Result<(), CliError> {
    let mut o = super::output::stdout();
    let p = &plan.predicted;
    let (top_json, top_lines) = layouts.unzip();
    if a.json {
        let v = json!({
            "top_layouts": top_json,
            "baseline_iteration_ms": p.baseline.iteration_ms,
            "baseline_name": p.baseline_name,
            "baseline_precision": p.baseline_precision,
            "half_precision_baseline": p.half_baseline,
            "planned_iteration_ms": p.planned.iteration_ms,
            "speedup": p.speedup,
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "mfu": p.mfu,
            "layout": layout(plan),
            "baselines": plan.baselines,
            "lower_bound_ms": p.lower_bound_ms,
            "search_wall_s": wall.as_secs_f64(),
            "replays": plan.search.replays,
            "stop_reason": plan.search.stop,
            "decisions": plan.decisions,
            "advice": plan.advice,
            "plan_path": a.output.display().to_string(),
            "svg_path": svg.display().to_string(),
            "framework": plan.workload.framework,
            "baseline_peak_memory_bytes": p.baseline.peak_memory_bytes,
            "planned_peak_memory_bytes": p.planned.peak_memory_bytes,
            "baseline_reserved_peak_bytes": p.baseline.reserved_peak_bytes,
            "planned_reserved_peak_bytes": p.planned.reserved_peak_bytes,
            "baseline_device_used_bytes": p.baseline.device_used_bytes,
            "planned_device_used_bytes": p.planned.device_used_bytes,
            "gpu_memory_bytes": p.gpu_memory_bytes,
            "memory_budget_bytes": p.memory_budget_bytes,
            "memory_over_capacity": p.planned.device_used_bytes.zip(p.gpu_memory_bytes).map(|(d, g)| d > g),
            "rounds": plan.search.rounds,
            "config": plan.config,
            "trace_facts": extra.map(|e| e.facts_json.clone()),
            "host_bound": extra.is_some_and(|e| e.host_bound),
            "bound": extra.map(|e| e.bound.clone()),
            "baseline_makespan_ms": extra.and_then(|e| e.makespan).map(|m| m.0 as f64 / 1e6),
            "planned_makespan_ms": extra.and_then(|e| e.makespan).map(|m| m.1 as f64 / 1e6),
            "ranks": extra.and_then(|e| e.ranks.clone()),
        });
        return writeln!(o, "{v}").map_err(super::CliError::stdout);
    }
    let mut lines = summary(plan);
    if let Some(top) = top_lines {
        lines.extend(top);
        lines.push(String::new());
    }
    if let Some(e) = extra {
        // A trace's facts under the headline; its makespan and what bounds it after the
        // memory line.
        // (The memory lines: "peak memory" and its indented reserved / device-used lines.)
        let mut at = lines
            .iter()
            .position(|l| l.starts_with("peak memory"))
            .map_or(lines.len(), |i| {
                i + 1
                    + lines[i + 1..]
                        .iter()
                        .take_while(|l| l.starts_with("   "))
                        .count()
            });
        if let Some(f) = &e.facts {
            lines.insert(1, f.clone());
            at += 1;
        }
        let mut more = Vec::new();
        if let Some((b, p)) = e.makespan {
            more.push(format!(
                "makespan           {} → {}   (one step until its GPU work drains; the \
                 iteration above is the steady-state period)",
                super::output::dur_ms(b as f64 / 1e6, 1),
                super::output::dur_ms(p as f64 / 1e6, 1)
            ));
        }
        if !e.lines.is_empty() {
            more.push(String::new());
            more.extend(e.lines.iter().cloned());
        }
        lines.splice(at..at, more);
    }
    lines.push(format!(
        "search: {:?}, {} replays in {} rounds, {:.1} s ({:?}); plan written to {}, picture to {}",
        plan.search.strategy,
        plan.search.replays,
        plan.search.rounds,
        wall.as_secs_f64(),
        plan.search.stop,
        a.output.display(),
        svg.display()
    ));
    lines.push(format!(
        "next: trainplan show {0}   ·   trainplan export {0} --to {1}",
        a.output.display(),
        crate::plan::emit::Framework::of(plan.workload.framework)
    ));
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}

/// "1.23x faster than ddp_default", "as fast as …" — never "0.99x faster".
pub fn versus(speedup: f64, name: &str) -> String {
    if speedup >= 1.005 {
        format!("{speedup:.2}x faster than {name}")
    } else if speedup > 0.995 {
        format!("as fast as {name}: it is already the best setting found")
    } else {
        format!("{:.2}x slower than {name}", 1.0 / speedup.max(1e-9))
    }
}

/// The human summary of a plan (shared with `trainplan show`): the headline, the baselines
/// against the plan, memory, the decisions and the advice.
pub fn summary(plan: &Plan) -> Vec<String> {
    let mut lines = headline_lines(plan);
    lines.extend(iteration_table(plan));
    lines.extend(throughput_line(&plan.predicted));
    lines.extend(memory_lines(&plan.predicted));
    lines.push(String::new());
    lines.extend(decision_lines(plan));
    lines.extend(advice_lines(plan));
    lines.push(String::new());
    lines
}

/// DESIGN.md's `layout` of a zoo plan: the tensor-parallel degree of its `tensor-parallel`
/// decision, its pipeline's stages, chunks per rank and schedule, the data-parallel degrees
/// its sharding leaves (`dp_shard` ranks per shard group, `dp_replicate` groups), the
/// micro-batch its accumulation or pipeline leaves, and — until context parallelism exists as
/// a pass — degree 1 for that. `null` for a trace, whose layout is the recorded run's.
fn layout(plan: &Plan) -> serde_json::Value {
    let w = &plan.workload;
    if w.source == "trace" {
        return serde_json::Value::Null;
    }
    let tp = plan
        .decisions
        .iter()
        .filter(|d| d.pass == "tensor-parallel")
        .find_map(|d| d.knobs.get("degree").and_then(|v| v.parse::<u32>().ok()))
        .unwrap_or(1)
        .max(1);
    let pipeline = plan.config.pipeline.as_ref();
    let pp = pipeline.map_or(1, |p| p.stages.max(1));
    let cp = crate::plan::cp_degree(&plan.config);
    // torchtitan's degrees: the shard group holds the context-parallel ranks, dp_shard the rest.
    let (dp_shard, dp_replicate) = plan
        .config
        .sharding
        .as_ref()
        .map_or((1, w.ranks / tp / pp / cp), |s| {
            ((s.shard_size / cp).max(1), s.replicas)
        });
    let k = plan.config.micro_steps();
    // The micro-batch of one data-parallel replica (a tensor-parallel group's, all stages').
    let replica = w
        .batch()
        .map(|b| crate::plan::replica_batch(&plan.config, b));
    json!({
        "dp_replicate": dp_replicate,
        "dp_shard": dp_shard,
        "tp": tp,
        "pp": pp,
        "virtual": pipeline.map_or(1, |p| p.chunks_per_rank.max(1)),
        "cp": cp,
        "micro_batch": replica.map(|b| b / k),
        "schedule": pipeline.map(|p| p.schedule.clone()),
    })
}

/// `throughput  9,120 tokens/s per GPU · MFU 41.3 %` for a transformer from the zoo.
fn throughput_line(p: &Predicted) -> Option<String> {
    let (tokens, mfu) = (p.tokens_per_s_per_gpu?, p.mfu?);
    Some(format!(
        "{:<18} {:>10}   tokens/s per GPU · MFU {:.1} % (model FLOPs by PaLM's count over the GPU's dense peak in the planned precision)",
        "throughput",
        crate::units::thousands(tokens as u64),
        100.0 * mfu
    ))
}

/// Who the plan is for, what it gains against the headline baseline, and against a
/// half-precision baseline when there is one.
fn headline_lines(plan: &Plan) -> Vec<String> {
    let w = &plan.workload;
    let p = &plan.predicted;
    let batch = w.batch().map_or("batch not recorded".to_string(), |b| {
        format!("batch {b}/GPU")
    });
    let who = if w.source == "trace" {
        if w.ranks > 1 {
            format!("{} ({batch}), {} ranks as traced", w.model, w.ranks)
        } else {
            format!("{} ({batch}), 1 GPU as traced", w.model)
        }
    } else {
        format!("{} ({batch}) on {} ({} GPUs)", w.model, w.cluster, w.ranks)
    };
    let mut lines = vec![
        format!(
            "{who}, --framework {}: planned {}, {}",
            w.framework,
            super::output::dur_ms(p.planned.iteration_ms, 1),
            versus(p.speedup, &p.baseline_name)
        ),
        String::new(),
    ];
    // A baseline the GPU cannot hold: what the plan is compared with would not run.
    if let (Some(used), Some(gpu)) = (p.baseline.device_used_bytes, p.gpu_memory_bytes)
        && used > gpu
    {
        lines.insert(
            1,
            format!(
                "  ({} does not fit: it needs {:.1} GB of device memory, the GPU has {:.1} GB; the plan fits)",
                p.baseline_name,
                used as f64 / 1e9,
                gpu as f64 / 1e9
            ),
        );
    }
    if let Some(h) = &p.half_baseline {
        lines.insert(
            1,
            format!(
                "  (the baseline computes in {}; with --precision {} as the baseline, {} is {} and the plan is {})",
                p.baseline_precision,
                h.precision,
                p.baseline_name,
                super::output::dur_ms(h.iteration_ms, 1),
                versus(h.speedup, "that")
            ),
        );
    }
    lines
}

/// Every baseline's iteration, the plan's (against the best baseline) and the lower bound.
fn iteration_table(plan: &Plan) -> Vec<String> {
    let w = &plan.workload;
    let p = &plan.predicted;
    let mut lines = vec![format!("{:<18} {:>10}", "", "iteration")];
    // The headline is the framework's default only when that was evaluated: a budget that ends
    // before it leaves another baseline (`none`) as the headline, and says so.
    let default = default_name(w.framework, w.source == "trace");
    for (name, v) in &plan.baselines {
        let tag = match name.as_str() {
            "as_recorded" => "   (the traced run)",
            n if n == p.baseline_name && n == default => "   (the framework's default)",
            n if n == p.baseline_name => {
                "   (compared with: the framework's default was not evaluated before the budget ended)"
            }
            _ => "",
        };
        lines.push(format!(
            "{name:<18} {:>10}{tag}",
            super::output::dur_ms(*v, 1)
        ));
    }
    let best_base = plan
        .baselines
        .iter()
        .filter(|(n, _)| n.as_str() != "none")
        .map(|(_, v)| *v)
        .fold(f64::INFINITY, f64::min);
    let vs = if best_base.is_finite() && best_base > 0.0 {
        format!(
            "   {:+.1} % vs the best baseline",
            100.0 * (p.planned.iteration_ms / best_base - 1.0)
        )
    } else {
        String::new()
    };
    lines.push(format!(
        "{:<18} {:>10}{vs}",
        "trainplan",
        super::output::dur_ms(p.planned.iteration_ms, 1)
    ));
    if let Some(lb) = p.lower_bound_ms {
        lines.push(format!(
            "{:<18} {:>10}   (the plan if synchronisation were free)",
            "lower bound",
            super::output::dur_ms(lb, 1)
        ));
    }
    lines
}

/// Peak memory before → after: allocated, reserved, device used (against the budget and the
/// GPU), or why it is not modelled.
fn memory_lines(p: &Predicted) -> Vec<String> {
    let (Some(b), Some(a)) = (p.baseline.peak_memory_bytes, p.planned.peak_memory_bytes) else {
        return vec![
            "peak memory        not modelled: not in the trace (record with profile_memory=True, \
             or record_shapes=True for an estimate)"
                .into(),
        ];
    };
    let mut lines = vec![format!(
        "peak memory        {} → {} allocated",
        gb(b),
        gb(a)
    )];
    if let (Some(b), Some(a)) = (
        p.baseline.reserved_peak_bytes,
        p.planned.reserved_peak_bytes,
    ) {
        lines.push(format!("                   {} → {} reserved", gb(b), gb(a)));
    }
    if let (Some(b), Some(a)) = (p.baseline.device_used_bytes, p.planned.device_used_bytes) {
        let of = match (p.gpu_memory_bytes, p.memory_budget_bytes) {
            (Some(g), Some(m)) if m < g => format!(" (budget {}, GPU {})", gb(m), gb(g)),
            (Some(g), _) => format!(" (GPU {})", gb(g)),
            _ => String::new(),
        };
        lines.push(format!(
            "                   {} → {} device used{of}",
            gb(b),
            gb(a)
        ));
    }
    lines
}

/// The first twelve decisions with their effect and what they touch.
fn decision_lines(plan: &Plan) -> Vec<String> {
    let mut lines = vec![format!(
        "{} decisions, each applied by the {} export:",
        plan.decisions.len(),
        plan.workload.framework
    )];
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
            "  {:>11}  {:<18} {}",
            super::output::dur_ms_signed(d.effect_ms, 2),
            d.pass,
            what
        ));
    }
    if plan.decisions.len() > 12 {
        lines.push(format!(
            "  … {} more in the plan",
            plan.decisions.len() - 12
        ));
    }
    lines
}

/// What the framework's export cannot apply, with its effect (none: no lines).
fn advice_lines(plan: &Plan) -> Vec<String> {
    if plan.advice.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![
        String::new(),
        format!(
            "advice, not counted ({} cannot apply it):",
            plan.workload.framework
        ),
    ];
    for x in &plan.advice {
        lines.push(format!(
            "  {:>11}  {:<18} {}",
            super::output::dur_ms_signed(x.effect_ms, 2),
            x.pass,
            x.why_not
        ));
    }
    lines
}

#[cfg(test)]
mod tests {

    /// Issue 27: the bar says the round, the best plan so far and the replay rate; it shows
    /// only on a terminal, never with --json or in CI.
    #[test]
    fn progress_says_round_best_plan_and_rate() {
        let job = crate::passes::testkit::chain_job(
            &[(1_000, false)],
            0,
            crate::passes::testkit::spec(crate::cost::config::SyncScheme::Ring),
            1,
        );
        let p = crate::search::Progress {
            best_ns: 123_300_000,
            replays: 800,
            elapsed: Duration::from_secs(2),
            round: 12,
            best_job: &job,
            best_peak_bytes: 0,
            best_peaks: Default::default(),
            decisions: &[],
        };
        assert_eq!(
            progress_message(&p, Some(("ddp_default", 324_300_000))),
            "round 12 · best plan 123.3 ms (-62.0 % vs ddp_default), 0 decisions · 800 replays, 400 replays/s"
        );
        assert!(show_progress(false, true, false));
        assert!(!show_progress(true, true, false));
        assert!(!show_progress(false, false, false));
        assert!(!show_progress(false, true, true));
    }

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

    /// Issue 20, class 7: a plan cut by its budget before the framework's default was evaluated
    /// compares with `none`, and never labels `none` as the framework's default.
    #[test]
    fn only_the_framework_default_is_labelled_so() {
        let mut plan = crate::plan::emit::tests::tiny_plan();
        plan.baselines = std::collections::BTreeMap::from([
            ("ddp_default".to_string(), 10.0),
            ("none".to_string(), 11.0),
        ]);
        let tagged = |plan: &Plan| -> Vec<String> {
            summary(plan)
                .into_iter()
                .filter(|l| l.contains("the framework's default"))
                .collect()
        };
        let t = tagged(&plan);
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(t[0].starts_with("ddp_default ") && t[0].ends_with("(the framework's default)"));
        plan.baselines = std::collections::BTreeMap::from([("none".to_string(), 11.0)]);
        plan.predicted.baseline_name = "none".into();
        let t = tagged(&plan);
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(
            t[0].starts_with("none ") && t[0].contains("was not evaluated before the budget ended"),
            "{t:?}"
        );
    }

    /// Finding 8: a plan as fast as its baseline is never "0.99x faster".
    #[test]
    fn speed_words() {
        assert_eq!(
            versus(1.234, "ddp_default"),
            "1.23x faster than ddp_default"
        );
        assert_eq!(
            versus(0.996, "ddp_default"),
            "as fast as ddp_default: it is already the best setting found"
        );
        assert_eq!(versus(0.5, "none"), "2.00x slower than none");
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

#[cfg(test)]
mod as_recorded_tests {
    /// A traced step whose steady state runs slower than its trace measured: the plan's report
    /// says so beside `as_recorded`, with the device that sets the pace; not for one rank
    /// standing for another worker count.
    #[test]
    fn a_steady_period_off_the_measured_step_is_said_beside_as_recorded() {
        let mut j = crate::replay::steady::tests::carried_job();
        j.meta.trace = Some(Box::new(crate::graph::job::TraceFacts {
            measured_step_ns: Some(60_000),
            ranks_given: 1,
            ..Default::default()
        }));
        let e = crate::passes::evaluate(j.clone()).unwrap();
        let line = super::as_recorded_gap(&e).unwrap();
        assert!(
            line.contains("+41.7 %") && line.contains("host thread"),
            "{line}"
        );
        j.workers = 64;
        let e = crate::passes::evaluate(j).unwrap();
        assert_eq!(super::as_recorded_gap(&e), None);
    }
}
