//! What-ifs on every shared trace (issue 15): for each trace that replays (one rank, the DLRM
//! ranks as one job, the Chakra trace), each pass's predicted step time and peak memory, with
//! the pass's own reason, how much GPU time it saved, whether the step is host-bound, and — for
//! kernels without shapes — the range between all-math and all-memory. Also each trace's facts
//! (batch, GPU, ranks, buckets, memory) and the replay of one DLRM rank alone against its
//! measured step.
//!
//! No GPU session has recorded pass/measurement pairs yet (`experiments/gpu_truth/record.py` is
//! not run), so there is no predicted-vs-measured column for the passes.
//!
//! `cargo run --release --example trace_whatif` → experiments/results/trace_whatif.{md,csv}
//!
//! The committed results also hold one trace from outside ../shared, given by
//! `TRACE_WHATIF_EXTRA` (colon-separated paths): HolisticTraceAnalysis @ f4d0062
//! `tests/data/df_index_resolver/df_index_resolver.json.gz` (rank 1 of 2, V100, 404
//! per-tensor all-reduces per step), saved as `hta_df_index_resolver_rank1of2.json.gz`, and
//! `tests/data/negative_queue_length_values_check/rank0.json.gz` (rank 0 of 16, A100, a
//! TorchRec job whose all-to-alls run a step after their launch; steps recorded 216 ms apart),
//! saved as `hta_negative_queue_rank0of16.json.gz`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use trainplan::graph::job::Job;
use trainplan::passes::{self, Evaluated, Pass};
use trainplan::replay::breakdown::{gpu_busy_ns, path_share};
use trainplan::trace::align::{AlignOptions, align};
use trainplan::trace::graph::build_job;
use trainplan::trace::multi::{collective_times, predict, rank_steps, with_job};
use trainplan::trace::work::{Bound, WorkSource, at_bound};
use trainplan::trace::{expand_inputs, read_kineto};

/// The passes tried on every trace, with knobs.
const PASSES: &[&str] = &[
    "amp",
    "grad-accumulation:k=2",
    "recompute",
    "op-fusion",
    "cuda-graphs",
    "cuda-graphs:host=1",
    "tensor-fusion",
];

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn mem(b: Option<u64>) -> String {
    match b {
        Some(b) if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        Some(b) => format!("{:.1} MB", b as f64 / 1e6),
        None => "–".into(),
    }
}

/// One pass applied to one job: (before, after, reason) or the reason it does not apply.
fn apply(
    reg: &[Box<dyn Pass>],
    job: &Job,
    arg: &str,
) -> Result<(Evaluated, Evaluated, String), String> {
    let (name, given) = passes::parse_pass_arg(arg).map_err(|e| e.to_string())?;
    let p = passes::find(reg, &name).map_err(|e| e.to_string())?;
    let k = passes::resolve_knobs(p, &given).map_err(|e| e.to_string())?;
    let base = passes::evaluate(job.clone()).map_err(|e| e.to_string())?;
    let patches = trainplan::passes::propose(p, &base, &k).map_err(|e| e.to_string())?;
    if patches.is_empty() {
        return Err("nothing to change".into());
    }
    let why = patches
        .iter()
        .map(|x| x.why.clone())
        .find(|w| !w.is_empty())
        .unwrap_or_default();
    let j = passes::apply_all(&base.job, &patches).map_err(|e| e.to_string())?;
    let after = passes::evaluate(j).map_err(|e| e.to_string())?;
    Ok((base, after, why))
}

fn short(s: &str, n: usize) -> String {
    let s = s.replace('|', "/");
    if s.chars().count() > n {
        s.chars().take(n - 1).chain(['…']).collect()
    } else {
        s
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    if !root.is_dir() {
        eprintln!("skipping: {} is absent", root.display());
        return;
    }
    let reg = passes::registry();
    let started = Instant::now();
    let mut md = String::new();
    let mut csv = String::from(
        "trace,pass,baseline_ms,predicted_ms,change_pct,baseline_makespan_ms,predicted_makespan_ms,\
         gpu_busy_before_ms,gpu_busy_after_ms,host_bound,baseline_peak_bytes,predicted_peak_bytes,\
         range_low_ms,range_high_ms,reason\n",
    );
    let _ = writeln!(
        md,
        "# What-ifs on the shared traces\n\n`cargo run --release --example trace_whatif` (this \
         file is its output). Each pass is applied to the trace's recorded step; recorded kernels \
         are re-costed relative to themselves (`recorded × model(new) / model(old)`) from their \
         operators' shapes, or from their names' class where the trace has no shapes. \
         *Iteration* is the steady-state period (the step-to-step time with every step like the \
         recorded one), *makespan* one step until its GPU work drains. Memory: measured from \
         `profile_memory` events, or estimated from shapes, or not in the trace (–). *Range*: the \
         prediction with every name-classed kernel taken as all-math and as all-memory. No GPU \
         session has recorded pass/measurement pairs yet, so there is no measured column.\n"
    );

    let mut files: Vec<PathBuf> = expand_inputs(&[root.join("pytorch-kineto")]).unwrap_or_default();
    files.push(root.join("execution-traces/resnet_ddp_rank0.chakra.et"));
    // Traces from outside ../shared, named by path (`TRACE_WHATIF_EXTRA=a.json.gz:b.json.gz`):
    // the committed results add HolisticTraceAnalysis' per-tensor all-reduce trace (README).
    let extra = std::env::var("TRACE_WHATIF_EXTRA").unwrap_or_default();
    files.extend(
        extra
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    );
    for p in &files {
        let name = p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".json.gz")
            .to_string();
        let (job, source, header) = if name.ends_with(".et") {
            let t = match trainplan::trace::chakra::read_chakra(p) {
                Ok(t) => t,
                Err(e) => {
                    let _ = writeln!(md, "## {name}\n\nnot read: {e}\n");
                    continue;
                }
            };
            match trainplan::trace::chakra::build_job(&t, &name) {
                Ok(c) => (
                    c.job,
                    Vec::new(),
                    "Chakra execution trace: no start times, so no measured step; the iteration \
                     is the replayed makespan."
                        .to_string(),
                ),
                Err(e) => {
                    let _ = writeln!(md, "## {name}\n\nnot built: {e}\n");
                    continue;
                }
            }
        } else {
            let trace = match read_kineto(p) {
                Ok(t) => t,
                Err(e) => {
                    let _ = writeln!(md, "## {name}\n\nnot read: {e}\n");
                    continue;
                }
            };
            match build_job(&trace, &name, None) {
                Ok(t) => {
                    let f = t.job.meta.trace.as_deref().cloned().unwrap_or_default();
                    let g = t.job.expand().unwrap();
                    let r = trainplan::replay::replay(&g);
                    let predicted = r.end_ns[t.step_end as usize];
                    let measured = t.window.measured_ns();
                    let steady = trainplan::replay::steady::steady(&t.job);
                    let mut h = format!(
                        "{}: measured {:.3} ms, replayed {:.3} ms ({:+.3} %), steady period {} ({}). Facts: {}.",
                        t.window.label,
                        ms(measured),
                        ms(predicted),
                        100.0 * (predicted as f64 / measured as f64 - 1.0),
                        steady.map_or("–".into(), |s| format!(
                            "{:.3} ms, {:+.1} %",
                            ms(s.period_ns),
                            100.0 * (s.period_ns as f64 / measured as f64 - 1.0)
                        )),
                        steady.map_or("no step end", |s| match s.by {
                            trainplan::graph::DeviceKind::CpuThread { .. } =>
                                "set by a host thread",
                            _ => "set by a GPU stream",
                        }),
                        trainplan::trace::facts::summary(&f)
                    );
                    let w = f.work;
                    let gpu = (w.shapes_ns + w.names_ns + w.none_ns).max(1) as f64;
                    let _ = write!(
                        h,
                        " GPU time with work from shapes {:.0} %, from kernel names {:.0} %, none \
                         {:.0} %.",
                        100.0 * w.shapes_ns as f64 / gpu,
                        100.0 * w.names_ns as f64 / gpu,
                        100.0 * w.none_ns as f64 / gpu
                    );
                    if let Some(m) = &f.memory {
                        let _ = write!(
                            h,
                            " Memory: peak {} ({}{}).",
                            mem(Some(m.peak_bytes)),
                            m.source,
                            if m.events > 0 {
                                format!(", {} events in the step", m.events)
                            } else {
                                String::new()
                            }
                        );
                    }
                    (t.job, t.work_source, h)
                }
                Err(e) => {
                    let _ = writeln!(md, "## {name}\n\nnot replayed: {e}\n");
                    continue;
                }
            }
        };
        let _ = writeln!(md, "## {name}\n\n{header}\n");
        let _ = writeln!(
            md,
            "| pass | iteration ms | change | makespan ms | GPU time ms | host-bound | peak memory | range ms | reason |\n|---|---|---|---|---|---|---|---|---|"
        );
        let base = passes::evaluate(job.clone()).unwrap();
        let known = job.meta.trace.as_deref().is_none_or(|f| f.memory.is_some())
            && base.memory.peak_bytes > 0;
        for arg in PASSES {
            match apply(&reg, &job, arg) {
                Ok((b, a, why)) => {
                    let (bi, ai) = (b.iteration_ns(), a.iteration_ns());
                    let share = path_share(&b.graph, &b.replay, &b.critical);
                    let (g0, g1) = (gpu_busy_ns(&b.graph, 0), gpu_busy_ns(&a.graph, 0));
                    let range = if source.contains(&WorkSource::KernelName) {
                        let mut v = Vec::new();
                        for bd in [Bound::Compute, Bound::Memory] {
                            if let Ok((_, x, _)) = apply(&reg, &at_bound(&job, &source, bd), arg) {
                                v.push(x.iteration_ns());
                            }
                        }
                        (v.len() == 2).then(|| (v[0].min(v[1]), v[0].max(v[1])))
                    } else {
                        None
                    };
                    let m = |e: &Evaluated| known.then_some(e.memory.peak_bytes);
                    let _ = writeln!(
                        md,
                        "| {arg} | {:.1} → {:.1} | {:+.1} % | {:.1} → {:.1} | {:.1} → {:.1} | {} | {} → {} | {} | {} |",
                        ms(bi),
                        ms(ai),
                        100.0 * (ai as f64 / bi as f64 - 1.0),
                        ms(b.makespan_ns()),
                        ms(a.makespan_ns()),
                        ms(g0),
                        ms(g1),
                        if share.host_bound() { "yes" } else { "no" },
                        mem(m(&b)),
                        mem(m(&a)),
                        range.map_or("–".into(), |(l, h)| format!("{:.1}–{:.1}", ms(l), ms(h))),
                        short(&why, 160)
                    );
                    let _ = writeln!(
                        csv,
                        "{name},{arg},{:.3},{:.3},{:.2},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{},\"{}\"",
                        ms(bi),
                        ms(ai),
                        100.0 * (ai as f64 / bi as f64 - 1.0),
                        ms(b.makespan_ns()),
                        ms(a.makespan_ns()),
                        ms(g0),
                        ms(g1),
                        share.host_bound(),
                        m(&b).map_or(String::new(), |x| x.to_string()),
                        m(&a).map_or(String::new(), |x| x.to_string()),
                        range.map_or(String::new(), |r| format!("{:.3}", ms(r.0))),
                        range.map_or(String::new(), |r| format!("{:.3}", ms(r.1))),
                        why.replace('"', "'")
                    );
                }
                Err(why) => {
                    let _ = writeln!(
                        md,
                        "| {arg} | {:.1} | – | – | – | – | – | – | not applied: {} |",
                        ms(base.iteration_ns()),
                        short(&why, 160)
                    );
                    let _ = writeln!(
                        csv,
                        "{name},{arg},{:.3},,,,,,,,,,,,\"not applied: {}\"",
                        ms(base.iteration_ns()),
                        why.replace('"', "'")
                    );
                }
            }
        }
        md.push('\n');
    }

    // The DLRM ranks: one job, every pass applied to every rank.
    let dlrm = root.join("multi-rank-dlrm");
    if let Ok(files) = expand_inputs(&[dlrm.clone()]) {
        let traces: Vec<(String, trainplan::trace::KinetoTrace)> = files
            .iter()
            .map(|p| (p.display().to_string(), read_kineto(p).unwrap()))
            .collect();
        let refs: Vec<(String, &trainplan::trace::KinetoTrace)> =
            traces.iter().map(|(n, t)| (n.clone(), t)).collect();
        let (ranks, _) = rank_steps(&refs, None).unwrap();
        let al = align(&collective_times(&ranks), &AlignOptions::default()).unwrap();
        let base = predict(&ranks, &al.offsets_ns).unwrap();
        let _ = writeln!(
            md,
            "## multi-rank-dlrm (8 ranks as one job)\n\nEvery pass applied to every rank (each \
             rank's sites on its own graph), all ranks replayed together with aligned clocks; \
             the iteration is the slowest rank's step. Measured slowest step: {:.3} ms; \
             replayed: {:.3} ms.\n",
            ms(ranks.iter().map(|r| r.measured_ns()).max().unwrap_or(0)),
            ms(base.step_ns)
        );
        let _ = writeln!(
            md,
            "| pass | iteration ms | change | reason (rank 0) |\n|---|---|---|---|"
        );
        for arg in PASSES {
            let mut after = Vec::new();
            let mut why = String::new();
            let mut err = None;
            for (i, r) in ranks.iter().enumerate() {
                match apply(&reg, &r.built.job, arg) {
                    Ok((_, a, w)) => {
                        if i == 0 {
                            why = w;
                        }
                        after.push(with_job(r, a.job).unwrap());
                    }
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            match err {
                Some(e) => {
                    let _ = writeln!(
                        md,
                        "| {arg} | {:.2} | – | not applied: {} |",
                        ms(base.step_ns),
                        short(&e, 120)
                    );
                }
                None => {
                    let p = predict(&after, &al.offsets_ns).unwrap();
                    let _ = writeln!(
                        md,
                        "| {arg} | {:.2} → {:.2} | {:+.1} % | {} |",
                        ms(base.step_ns),
                        ms(p.step_ns),
                        100.0 * (p.step_ns as f64 / base.step_ns as f64 - 1.0),
                        short(&why, 140)
                    );
                    let _ = writeln!(
                        csv,
                        "multi-rank-dlrm,{arg},{:.3},{:.3},{:.2},,,,,,,,,,\"{}\"",
                        ms(base.step_ns),
                        ms(p.step_ns),
                        100.0 * (p.step_ns as f64 / base.step_ns as f64 - 1.0),
                        why.replace('"', "'")
                    );
                }
            }
        }
        // Each rank alone: its collectives wait for absent peers.
        let _ = writeln!(
            md,
            "\nEach DLRM rank replayed alone (its collectives wait for the absent peers as \
             recorded, `trace::peers`):\n\n| rank | measured ms | replayed alone ms | error |\n|---|---|---|---|"
        );
        for (name, t) in &traces {
            let b = build_job(t, name, None).unwrap();
            let g = b.job.expand().unwrap();
            let r = trainplan::replay::replay(&g);
            let p = r.end_ns[b.step_end as usize];
            let m = b.window.measured_ns();
            let _ = writeln!(
                md,
                "| {} | {:.3} | {:.3} | {:+.3} % |",
                Path::new(name).file_name().unwrap().to_string_lossy(),
                ms(m),
                ms(p),
                100.0 * (p as f64 / m as f64 - 1.0)
            );
        }
    }
    let _ = writeln!(
        md,
        "\nWall time of this experiment: {:.1} s.",
        started.elapsed().as_secs_f64()
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/results");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("trace_whatif.md"), &md).unwrap();
    std::fs::write(out.join("trace_whatif.csv"), &csv).unwrap();
    print!("{md}");
}
