//! Replay accuracy on every trace in `../shared/traces` (issue 3, part 7): each complete step of
//! each single-rank Kineto trace replayed against its measured time, the 8 DLRM ranks as one
//! job (clocks aligned), and the traces that cannot be replayed with the reason.
//!
//! `cargo run --release --example replay_accuracy` → experiments/results/replay_accuracy.{md,csv,svg}

mod svg;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use trainplan::trace::align::{AlignOptions, align};
use trainplan::trace::graph::{replay_step, steps};
use trainplan::trace::multi::{collective_times, global_graph, rank_steps, replay_ranks};
use trainplan::trace::{KinetoTrace, expand_inputs, read_kineto};

struct Row {
    trace: String,
    steps: String,
    measured_ms: Option<f64>,
    predicted_ms: Option<f64>,
    mean_abs_err: Option<f64>,
    max_abs_err: Option<f64>,
    /// Mean |error| of when the step's GPU work ends.
    gpu_err: Option<f64>,
    note: String,
}

fn pct(p: u64, m: u64) -> f64 {
    100.0 * (p as f64 / m.max(1) as f64 - 1.0)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    if !root.is_dir() {
        eprintln!("skipping: {} is absent", root.display());
        return;
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut csv = String::from("trace,step,measured_ms,predicted_ms,error_pct\n");
    let mut errors: Vec<f64> = Vec::new(); // |error| of every replayed trace (mean over its steps)

    // Single-rank Kineto traces.
    let mut files: Vec<PathBuf> = Vec::new();
    for sub in ["pytorch-kineto", "execution-traces"] {
        if let Ok(f) = expand_inputs(&[root.join(sub)]) {
            files.extend(f);
        }
    }
    for p in &files {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let t = Instant::now();
        let trace = match read_kineto(p) {
            Ok(t) => t,
            Err(e) => {
                rows.push(Row {
                    trace: name,
                    steps: "-".into(),
                    measured_ms: None,
                    predicted_ms: None,
                    mean_abs_err: None,
                    max_abs_err: None,
                    gpu_err: None,
                    note: format!("refused: {e}"),
                });
                continue;
            }
        };
        let disp = p.display().to_string();
        let complete: Vec<u64> = steps(&trace)
            .into_iter()
            .filter(|w| w.complete)
            .map(|w| w.number)
            .collect();
        let mut errs = Vec::new();
        let mut gpu_errs = Vec::new();
        let (mut m_sum, mut p_sum) = (0.0, 0.0);
        let mut refused = None;
        for &s in &complete {
            match replay_step(&trace, &disp, Some(s)) {
                Ok(r) => {
                    let e = pct(r.predicted_ns, r.measured_ns);
                    writeln!(
                        csv,
                        "{name},{},{:.4},{:.4},{e:.4}",
                        r.window.label,
                        r.measured_ns as f64 / 1e6,
                        r.predicted_ns as f64 / 1e6
                    )
                    .unwrap();
                    m_sum += r.measured_ns as f64 / 1e6;
                    p_sum += r.predicted_ns as f64 / 1e6;
                    errs.push(e);
                    gpu_errs.push(pct(r.gpu_end_predicted_ns, r.gpu_end_recorded_ns).abs());
                }
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        if complete.is_empty() || refused.is_some() {
            let why = match refused {
                Some(e) => e,
                None => match replay_step(&trace, &disp, None) {
                    Err(e) => e.to_string(),
                    Ok(_) => "no complete step".into(),
                },
            };
            rows.push(Row {
                trace: name,
                steps: "-".into(),
                measured_ms: None,
                predicted_ms: None,
                mean_abs_err: None,
                max_abs_err: None,
                gpu_err: None,
                note: format!("refused: {}", why.replace(&disp, "the file")),
            });
            continue;
        }
        let n = errs.len() as f64;
        let mean = errs.iter().map(|e| e.abs()).sum::<f64>() / n;
        let max = errs.iter().map(|e| e.abs()).fold(0.0, f64::max);
        errors.push(mean);
        let label = steps(&trace)
            .into_iter()
            .find(|w| w.complete)
            .map(|w| w.label)
            .unwrap_or_default();
        let kind = if label.starts_with("ProfilerStep") {
            "ProfilerStep"
        } else {
            "Optimizer.step iterations"
        };
        rows.push(Row {
            trace: name,
            steps: format!("{} ({kind})", errs.len()),
            measured_ms: Some(m_sum / n),
            predicted_ms: Some(p_sum / n),
            mean_abs_err: Some(mean),
            max_abs_err: Some(max),
            gpu_err: Some(gpu_errs.iter().sum::<f64>() / n),
            note: format!(
                "import + replay of all steps {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            ),
        });
    }

    // The 8 DLRM ranks as one job.
    let dlrm = root.join("multi-rank-dlrm");
    if let Ok(files) = expand_inputs(&[dlrm]) {
        let traces: Vec<(String, KinetoTrace)> = files
            .iter()
            .map(|p| (p.display().to_string(), read_kineto(p).expect("readable")))
            .collect();
        let refs: Vec<(String, &KinetoTrace)> =
            traces.iter().map(|(n, t)| (n.clone(), t)).collect();
        let (ranks, _) = rank_steps(&refs, None).expect("ranks fit");
        let g = global_graph(&ranks).expect("graph");
        let a = align(&collective_times(&ranks), &AlignOptions::default()).expect("aligned");
        let r = replay_ranks(&ranks, &g, &a.offsets_ns);
        let errs: Vec<f64> = r
            .predicted_ns
            .iter()
            .zip(&ranks)
            .map(|(&p, k)| pct(p, k.measured_ns()))
            .collect();
        for (k, (&p, e)) in ranks.iter().zip(r.predicted_ns.iter().zip(&errs)) {
            writeln!(
                csv,
                "multi-rank-dlrm rank{},{},{:.4},{:.4},{e:.4}",
                k.rank,
                k.built.window.label,
                k.measured_ns() as f64 / 1e6,
                p as f64 / 1e6
            )
            .unwrap();
        }
        let m = ranks.iter().map(|k| k.measured_ns()).max().unwrap();
        let p = r.predicted_ns.iter().copied().max().unwrap();
        let mean = errs.iter().map(|e| e.abs()).sum::<f64>() / errs.len() as f64;
        errors.push(mean);
        rows.push(Row {
            trace: "multi-rank-dlrm (8 ranks, one job)".into(),
            steps: format!("1 per rank ({})", ranks[0].built.window.label),
            measured_ms: Some(m as f64 / 1e6),
            predicted_ms: Some(p as f64 / 1e6),
            mean_abs_err: Some(mean),
            max_abs_err: Some(errs.iter().map(|e| e.abs()).fold(0.0, f64::max)),
            gpu_err: None,
            note: format!(
                "slowest rank shown; errors over the 8 ranks; clocks aligned (ends spread {:.1} µs)",
                a.spread_after_ns / 1e3
            ),
        });
    }

    let mut md = String::new();
    writeln!(md, "# Replay accuracy on ../shared/traces\n").unwrap();
    writeln!(md, "| trace | steps | measured ms | predicted ms | mean abs error % | max abs error % | GPU end abs error % | note |\n|---|---|---|---|---|---|---|---|").unwrap();
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |x| format!("{x:.d$}"));
    for r in &rows {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.trace,
            r.steps,
            f(r.measured_ms, 3),
            f(r.predicted_ms, 3),
            f(r.mean_abs_err, 3),
            f(r.max_abs_err, 3),
            f(r.gpu_err, 3),
            r.note
        )
        .unwrap();
    }
    let mean = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    let worst = errors.iter().copied().fold(0.0, f64::max);
    writeln!(
        md,
        "\n{} traces replayed: mean |error| {mean:.3} %, worst trace {worst:.3} % (goal: mean ≤ 2 %, each ≤ 5 %). \
         Measured and predicted are means over the trace's complete steps; per-step figures in \
         replay_accuracy.csv.",
        errors.len()
    )
    .unwrap();
    writeln!(
        md,
        "\nWhat this measures: the replay keeps every CPU op's recorded duration and idle gaps and \
         every GPU op's recorded duration, and re-derives when each op starts from the dependency \
         graph alone (launch → kernel, stream order, blocking synchronisations, event waits, and \
         across ranks \"a collective ends when its last rank arrives\"). A step comes out right only \
         when those dependencies are right: with the DLRM ranks' clocks skewed by ±5 ms the same \
         replay is off by 7–27 % on average (experiments/results/trace_alignment.md). Nothing is \
         fitted to these traces. \"GPU end\" compares when the step's last GPU work ends, replayed \
         against recorded. Traces without iteration markers are refused (exit 3), as are the \
         sampled ones."
    )
    .unwrap();
    print!("{md}");
    // Plot: measured vs predicted per replayed trace (log scale: 0.1 ms … 250 ms).
    let done: Vec<&Row> = rows.iter().filter(|r| r.measured_ms.is_some()).collect();
    let cats: Vec<String> = done
        .iter()
        .map(|r| {
            r.trace
                .split(['.', ' '])
                .next()
                .unwrap_or(&r.trace)
                .chars()
                .take(18)
                .collect()
        })
        .collect();
    let chart = svg::bar_chart(
        "Replay accuracy: measured vs predicted step (mean over steps)",
        "ms (log)",
        &cats,
        &[
            svg::Series {
                name: "measured".into(),
                values: done.iter().map(|r| r.measured_ms).collect(),
            },
            svg::Series {
                name: "predicted".into(),
                values: done.iter().map(|r| r.predicted_ms).collect(),
            },
        ],
        true,
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/results");
    std::fs::write(dir.join("replay_accuracy.md"), md).expect("write md");
    std::fs::write(dir.join("replay_accuracy.csv"), csv).expect("write csv");
    std::fs::write(dir.join("replay_accuracy.svg"), chart).expect("write svg");
    eprintln!("wrote {}/replay_accuracy.{{md,csv,svg}}", dir.display());
}
