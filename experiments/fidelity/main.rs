//! How far trainplan's predictions are from published measurements.
//!
//! Every row of `experiments/fidelity/data/published.csv` that trainplan can express (see
//! `rows.rs` for what is skipped and why) plus dPRO's Tables 2 and 4 is predicted through the
//! same path as `trainplan replay/whatif --model` and compared with its measurement: iteration
//! time, memory, and the effects derived from pairs of rows (the AMP speed-up, 1→N GPU scaling
//! efficiency, the speed ratio of two GPU generations running one source's code). Rows are split in two halves by a hash of their id: `fit` (what
//! `--fit` may calibrate the architecture constants on) and `held-out` (what the summary
//! reports). dPRO's tables are never fitted on.
//!
//! Run: `cargo run --release --example fidelity` → `experiments/results/fidelity.{md,csv,svg}`;
//! `-- --fit` also fits the architecture constants on the fit half (argmin) and prints them;
//! `-- --fit-collective` fits the host's collective-call time on the tensor-parallel fit half;
//! `-- --check N` predicts every Nth case again and compares it with the committed
//! `fidelity.csv` (exit 1 on a difference; writes nothing): the test that pins the results to
//! the code (`tests/it/fidelity.rs`).

#[path = "../svg.rs"]
mod svg;

mod fit;
mod loso;
mod predict;
mod rows;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use rayon::prelude::*;

use rows::Case;

/// Which half a row is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Split {
    Fit,
    HeldOut,
    /// dPRO's tables: reported on their own, never fitted.
    Check,
    /// Sharded data-parallel runs (ZeRO, FSDP): reported on their own, never fitted.
    Sharded,
    /// Tensor-parallel runs, the held-out half: reported on their own, never fitted.
    Parallel,
    /// Tensor-parallel runs, the fit half: only the host's collective-call time is fitted on
    /// them (`-- --fit-collective`); no other row exercises it.
    ParallelFit,
    /// Pipeline-parallel runs: reported on their own, never fitted.
    Pipeline,
    /// Multi-node 3D layouts (BigScience's BLOOM topology search: TP × PP × ZeRO-1 over nodes):
    /// reported on their own, never fitted.
    ThreeD,
}

impl Split {
    fn name(self) -> &'static str {
        match self {
            Split::Fit => "fit",
            Split::HeldOut => "held-out",
            Split::Check => "reported",
            Split::Sharded => "sharded",
            Split::Parallel => "tensor-parallel",
            Split::ParallelFit => "tensor-parallel fit",
            Split::Pipeline => "pipeline",
            Split::ThreeD => "3D",
        }
    }
}

/// FNV-1a of a key: a split that does not depend on row order.
fn split_of(key: &str) -> Split {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    if h % 2 == 0 {
        Split::Fit
    } else {
        Split::HeldOut
    }
}

/// The split a case is reported in: dPRO's and Korthikanti's reported rows, pipeline rows,
/// tensor-parallel rows (halved by the FNV split of their id), sharded rows, then the fit or
/// held-out half.
fn split_for(c: &Case) -> Split {
    if matches!(c.family, "dpro" | "korthikanti") {
        Split::Check
    } else if c.family == "bigscience" {
        Split::ThreeD
    } else if c.pp > 1 {
        Split::Pipeline
    } else if c.tp > 1 {
        if split_of(&c.id) == Split::Fit {
            Split::ParallelFit
        } else {
            Split::Parallel
        }
    } else if c.check_only() {
        Split::Sharded
    } else {
        split_of(&c.id)
    }
}

/// One compared figure.
#[derive(Clone, Debug)]
pub struct Result_ {
    pub kind: &'static str,
    pub id: String,
    pub family: &'static str,
    pub setting: String,
    pub source: String,
    pub measured: f64,
    pub predicted: f64,
    split: Split,
}

impl Result_ {
    /// Relative error, %.
    fn error_pct(&self) -> f64 {
        if matches!(self.kind, "memory_fact" | "completed_run") {
            // A fact is right (0) or wrong (±100).
            return 100.0 * (self.predicted - self.measured);
        }
        100.0 * (self.predicted / self.measured - 1.0)
    }
}

fn mean_abs(v: &[&Result_]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().map(|r| r.error_pct().abs()).sum::<f64>() / v.len() as f64
}

/// Pairs of cases that isolate one effect: (key without the varied field) → cases.
fn pairs<'a>(
    cases: &'a [(Case, f64)],
    key: impl Fn(&Case) -> Option<String>,
) -> BTreeMap<String, Vec<&'a (Case, f64)>> {
    let mut m: BTreeMap<String, Vec<&(Case, f64)>> = BTreeMap::new();
    for c in cases {
        if let Some(k) = key(&c.0) {
            m.entry(k).or_default().push(c);
        }
    }
    m.retain(|_, v| v.len() >= 2);
    m
}

fn main() {
    let fit = std::env::args().any(|a| a == "--fit");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (cases, skipped) = rows::load(&root.join("experiments/fidelity/data/published.csv"));
    eprintln!(
        "{} cases, {} rows skipped; predicting…",
        cases.len(),
        skipped.len()
    );
    if fit {
        let iters = std::env::args()
            .skip_while(|a| a != "--iters")
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(300);
        let fit_half: Vec<Case> = cases
            .iter()
            .filter(|c| !c.check_only() && split_of(&c.id) == Split::Fit)
            .cloned()
            .collect();
        eprintln!(
            "fitting on {} cases ({iters} iterations at most)…",
            fit_half.len()
        );
        for (name, before, after) in fit::fit(&fit_half, iters).rows {
            println!("{name:45} {before:10.4} → {after:10.4}");
        }
        return;
    }
    if std::env::args().any(|a| a == "--fit-collective") {
        let half: Vec<Case> = cases
            .iter()
            .filter(|c| split_for(c) == Split::ParallelFit)
            .cloned()
            .collect();
        eprintln!("fitting the collective-call time on {} cases…", half.len());
        let (now, best, before, after) = fit::fit_collective(&half, 12);
        println!(
            "host.collective_call_us {now:10.4} → {best:10.4} (mean |log error| {before:.4} → {after:.4})"
        );
        return;
    }
    if std::env::args().any(|a| a == "--fit-depthwise") {
        let half: Vec<Case> = cases
            .iter()
            .filter(|c| !c.check_only() && split_of(&c.id) == Split::Fit)
            .cloned()
            .collect();
        for f in fit::fit_depthwise(&half, 25) {
            println!(
                "{}.depthwise_efficiency {:10.4} → {:10.4} over {} fit rows (mean |log error| {:.4} → {:.4})",
                f.arch, f.now, f.best, f.rows, f.before, f.after
            );
        }
        return;
    }
    if std::env::args().any(|a| a == "--loso") {
        let iters = std::env::args()
            .skip_while(|a| a != "--iters")
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(100);
        // `--only SOURCE` refits that fold alone and keeps the other folds' committed values.
        let only = std::env::args().skip_while(|a| a != "--only").nth(1);
        loso::fit_folds(root, &cases, iters, only.as_deref());
        return;
    }
    if let Some(every) = std::env::args()
        .skip_while(|a| a != "--check")
        .nth(1)
        .and_then(|s| s.parse::<usize>().ok())
    {
        std::process::exit(check(root, &cases, every.max(1)));
    }
    let predicted: Vec<(Case, Result<predict::Prediction, String>)> = cases
        .par_iter()
        .map(|c| {
            (
                c.clone(),
                predict::predict(c, &predict::Overrides::default()),
            )
        })
        .collect();
    let mut failed = Vec::new();
    let mut ok = Vec::new();
    for (c, p) in predicted {
        match p {
            Ok(p) => ok.push((c, p)),
            Err(e) => failed.push((c.id.clone(), e)),
        }
    }
    let results = results_of(&ok);
    let loso = loso::predict_folds(root, &cases);
    report(root, &results, loso.as_ref(), &skipped, &failed);
}

/// The compared figures of predicted cases: each case's iteration time, memory figure and
/// memory fact, and the effects derived from pairs of cases (AMP speed-up, 1→8 GPU scaling).
fn results_of(predicted: &[(Case, predict::Prediction)]) -> Vec<Result_> {
    let mut results: Vec<Result_> = Vec::new();
    let mut timed: Vec<(Case, f64)> = Vec::new();
    for (c, p) in predicted {
        let split = split_for(c);
        if let Some(m) = c.measured_ms {
            results.push(Result_ {
                kind: "iteration",
                id: c.id.clone(),
                family: c.family,
                setting: c.setting(),
                source: format!("{} {}", c.source, c.locator),
                measured: m,
                predicted: p.iteration_ms,
                split,
            });
            timed.push((c.clone(), p.iteration_ms));
        }
        // Memory facts: a stated out-of-memory or fitted setting, and every completed run (a
        // row with a measured time ran, so it fitted).
        if let Some(f) = c.fits.or(c.measured_ms.map(|_| true)) {
            results.push(Result_ {
                kind: if c.fits.is_some() {
                    "memory_fact"
                } else {
                    "completed_run"
                },
                id: c.id.clone(),
                family: c.family,
                setting: format!(
                    "{} (device used {:.2} GB of {:.2} GB)",
                    c.setting(),
                    p.device_used as f64 / 1e9,
                    p.capacity as f64 / 1e9
                ),
                source: format!("{} {}", c.source, c.locator),
                measured: f64::from(u8::from(f)),
                predicted: f64::from(u8::from(p.fits())),
                split,
            });
        }
        if let Some(m) = c.measured_gb {
            results.push(Result_ {
                kind: "memory",
                id: c.id.clone(),
                family: c.family,
                setting: c.setting(),
                source: format!("{} {}", c.source, c.locator),
                measured: m,
                predicted: p.memory_gb,
                split,
            });
        }
    }
    // Derived effects from pairs: per-sample times, so batches may differ.
    let measured_per_sample = |c: &Case| c.measured_ms.unwrap_or(f64::NAN) / c.samples;
    let amp = pairs(&timed, |c| {
        (!c.check_only()).then(|| {
            format!(
                "{}|{}|{:?}|{:?}|{}|{}|{}|{}",
                c.source,
                c.model,
                c.opts.seq,
                c.opts.head,
                c.gpu,
                c.gpus,
                c.nodes,
                c.accum > 1
            )
        })
    });
    for (k, v) in &amp {
        let half = v
            .iter()
            .find(|(c, _)| c.precision == Some(trainplan::cost::framework::Precision::Fp16));
        let full = v
            .iter()
            .find(|(c, _)| c.precision != Some(trainplan::cost::framework::Precision::Fp16));
        if let (Some((h, hp)), Some((f, fp))) = (half, full) {
            results.push(Result_ {
                kind: "amp_speedup",
                id: format!("{}+{}", f.id, h.id),
                family: f.family,
                setting: format!("{} → fp16", f.setting()),
                source: f.source.clone(),
                measured: measured_per_sample(f) / measured_per_sample(h),
                predicted: (fp / f.samples) / (hp / h.samples),
                split: split_of(k),
            });
        }
    }
    let scaling = pairs(&timed, |c| {
        (!c.check_only() && c.family != "vtrain").then(|| {
            format!(
                "{}|{}|{:?}|{:?}|{}|{:?}|{:?}|{}",
                c.source,
                c.model,
                c.opts.seq,
                c.opts.head,
                c.gpu,
                c.precision,
                c.opts.batch,
                c.accum
            )
        })
    });
    for (k, v) in &scaling {
        let one = v.iter().find(|(c, _)| c.gpus == 1);
        let eight = v.iter().find(|(c, _)| c.gpus == 8);
        if let (Some((o, op)), Some((e, ep))) = (one, eight) {
            let eff = |t1: f64, t8: f64| (e.samples / t8 / 8.0) / (o.samples / t1);
            results.push(Result_ {
                kind: "scaling_1_to_8",
                id: format!("{}+{}", o.id, e.id),
                family: o.family,
                setting: format!("{} → 8 GPUs", o.setting()),
                source: o.source.clone(),
                measured: eff(
                    o.measured_ms.unwrap_or(f64::NAN),
                    e.measured_ms.unwrap_or(f64::NAN),
                ),
                predicted: eff(*op, *ep),
                split: split_of(k),
            });
        }
    }
    results.extend(arch_ratios(&timed));
    results
}

/// NVIDIA's GPU architectures in order of release (the `arch` of `configs/gpus/*.yaml`), for
/// [`arch_ratios`].
const GENERATIONS: [&str; 3] = ["volta", "ampere", "hopper"];

/// The generation of a built-in GPU, from its config's architecture: `None` outside
/// [`GENERATIONS`] or for a GPU without a config.
fn generation(gpu: &str) -> Option<usize> {
    let arch = trainplan::cost::config::load_gpu(gpu).ok()?.arch;
    GENERATIONS.iter().position(|a| *a == arch)
}

/// The speed ratio between two GPU generations running one source's code on one GPU each: the
/// older GPU's per-sample time over the newer's, for the same model, sequence, head, framework
/// and precision class (AMP or not: each GPU's own default FP32 math, TF32 on Ampere), batches
/// as the source ran them. A generation the model prices wrongly moves all its rows the same
/// way, which the per-row errors of a source that also ran the other GPU hide (issue 22).
fn arch_ratios(timed: &[(Case, f64)]) -> Vec<Result_> {
    use trainplan::cost::framework::Precision;
    let mut gens: BTreeMap<&str, Option<usize>> = BTreeMap::new();
    for (c, _) in timed {
        gens.entry(c.gpu).or_insert_with(|| generation(c.gpu));
    }
    let generation = |gpu: &str| gens.get(gpu).copied().flatten();
    let groups = pairs(timed, |c| {
        (!c.check_only() && c.gpus == 1 && generation(c.gpu).is_some()).then(|| {
            format!(
                "{}|{}|{:?}|{:?}|{:?}|{}|{}",
                c.source,
                c.model,
                c.opts.seq,
                c.opts.head,
                c.framework,
                c.precision == Some(Precision::Fp16),
                c.accum > 1
            )
        })
    });
    let per_sample = |c: &Case, ms: f64| ms / c.samples;
    let mut out = Vec::new();
    for (k, v) in &groups {
        for (old, old_p) in v {
            for (new, new_p) in v {
                if generation(old.gpu) >= generation(new.gpu) {
                    continue;
                }
                let (Some(om), Some(nm)) = (old.measured_ms, new.measured_ms) else {
                    continue;
                };
                out.push(Result_ {
                    kind: "arch_ratio",
                    id: format!("{}+{}", old.id, new.id),
                    family: old.family,
                    setting: format!("{} → {}", old.setting(), new.gpu),
                    source: old.source.clone(),
                    measured: per_sample(old, om) / per_sample(new, nm),
                    predicted: per_sample(old, *old_p) / per_sample(new, *new_p),
                    split: split_of(k),
                });
            }
        }
    }
    out
}

/// Predicts every `every`th case and compares its iteration time and memory with the committed
/// `fidelity.csv` (4 decimals, as written); returns the exit code.
fn check(root: &Path, cases: &[Case], every: usize) -> i32 {
    let path = root.join("experiments/results/fidelity.csv");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return 1;
        }
    };
    let mut committed: BTreeMap<(String, String), f64> = BTreeMap::new();
    for line in text.lines().skip(1) {
        // kind,split,family,"id","setting",measured,predicted,…: the id has no quote or comma.
        let f: Vec<&str> = line.splitn(5, ',').collect();
        let (Some(kind), Some(id)) = (f.first(), f.get(3)) else {
            continue;
        };
        let rest = f.get(4).copied().unwrap_or("");
        // After the quoted setting: measured, predicted.
        let Some(after) = rest.find("\",").map(|i| &rest[i + 2..]) else {
            continue;
        };
        let nums: Vec<&str> = after.split(',').collect();
        if let Some(p) = nums.get(1).and_then(|x| x.parse::<f64>().ok()) {
            committed.insert((kind.to_string(), id.trim_matches('"').to_string()), p);
        }
    }
    let picked: Vec<&Case> = cases.iter().step_by(every).collect();
    let mut bad = 0;
    let mut compared = 0;
    for c in &picked {
        let p = match predict::predict(c, &predict::Overrides::default()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{}: prediction failed: {e}", c.id);
                bad += 1;
                continue;
            }
        };
        for (kind, now, has) in [
            ("iteration", p.iteration_ms, c.measured_ms.is_some()),
            ("memory", p.memory_gb, c.measured_gb.is_some()),
        ] {
            if !has {
                continue;
            }
            compared += 1;
            let key = (kind.to_string(), c.id.clone());
            match committed.get(&key) {
                Some(&was) if (was - now).abs() <= 1e-4 + 1e-6 * was.abs() => {}
                Some(&was) => {
                    eprintln!("{} {kind}: committed {was:.4}, now {now:.4}", c.id);
                    bad += 1;
                }
                None => {
                    eprintln!("{} {kind}: not in {}", c.id, path.display());
                    bad += 1;
                }
            }
        }
    }
    eprintln!(
        "checked {compared} figures of {} cases against {}: {bad} differ",
        picked.len(),
        path.display()
    );
    i32::from(bad > 0)
}

/// Writes `experiments/results/fidelity.{md,csv,svg}` and prints the summary.
fn report(
    root: &Path,
    results: &[Result_],
    loso: Option<&Vec<loso::Fold>>,
    skipped: &[(String, String)],
    failed: &[(String, String)],
) {
    let dir = root.join("experiments/results");
    std::fs::create_dir_all(&dir).expect("create experiments/results");
    let mut csv =
        String::from("kind,split,family,id,setting,measured,predicted,error_pct,source\n");
    for r in results {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.4},{:.4},{:.2},{}",
            r.kind,
            r.split.name(),
            r.family,
            q(&r.id),
            q(&r.setting),
            r.measured,
            r.predicted,
            r.error_pct(),
            q(&r.source)
        );
    }
    std::fs::write(dir.join("fidelity.csv"), csv).expect("write fidelity.csv");
    let mut summary = summary_table(results);
    if let Some(folds) = loso {
        summary.push_str(&loso_table(folds));
        std::fs::write(dir.join("fidelity_loso.svg"), loso_scatter(folds))
            .expect("write fidelity_loso.svg");
    }
    let mut md = String::from(
        "# Fidelity: trainplan against published measurements\n\n\
         Generated by `cargo run --release --example fidelity`; every row with its source is in \
         `fidelity.csv`. Error = predicted / measured − 1 (for scaling efficiency: points).\n\n",
    );
    md.push_str(&summary);
    let mut by: BTreeMap<(&str, &str, Split), Vec<&Result_>> = BTreeMap::new();
    for r in results {
        by.entry((r.kind, r.family, r.split)).or_default().push(r);
    }
    md.push_str("\n## Per source\n\n| figure | source | half | rows | mean abs error | median signed error |\n|---|---|---|---|---|---|\n");
    for ((kind, fam, split), v) in &by {
        let mut signed: Vec<f64> = v.iter().map(|r| err(r)).collect();
        signed.sort_by(f64::total_cmp);
        let _ = writeln!(
            md,
            "| {kind} | {fam} | {} | {} | {:.1} | {:+.1} |",
            split.name(),
            v.len(),
            v.iter().map(|r| err(r).abs()).sum::<f64>() / v.len() as f64,
            signed[signed.len() / 2]
        );
    }
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, why) in skipped {
        *reasons.entry(why.as_str()).or_default() += 1;
    }
    md.push_str("\n## Rows not used\n\n| reason | rows |\n|---|---|\n");
    for (why, n) in &reasons {
        let _ = writeln!(md, "| {why} | {n} |");
    }
    for (id, why) in failed {
        let _ = writeln!(md, "| prediction failed for {id}: {why} | 1 |");
    }
    std::fs::write(dir.join("fidelity.md"), &md).expect("write fidelity.md");
    std::fs::write(dir.join("fidelity.svg"), scatter(results)).expect("write fidelity.svg");
    print!("{summary}");
}

/// A summary line of errors: rows, mean and max |error|, how many within 10 %.
fn error_line(label: &str, v: &[&Result_]) -> String {
    let within = v.iter().filter(|r| err(r).abs() <= 10.0).count();
    format!(
        "| {label} | {} | {:.1}% | {:.1}% | {within} of {} within 10 % | |\n",
        v.len(),
        v.iter().map(|r| err(r).abs()).sum::<f64>() / v.len() as f64,
        v.iter().map(|r| err(r).abs()).fold(0.0, f64::max),
        v.len()
    )
}

/// A summary line of facts (right or wrong): how many are right, the first wrong ones.
fn facts_line(label: &str, v: &[&Result_]) -> String {
    let right = v.iter().filter(|r| r.predicted == r.measured).count();
    let wrong: Vec<&str> = v
        .iter()
        .filter(|r| r.predicted != r.measured)
        .map(|r| r.id.as_str())
        .take(3)
        .collect();
    format!(
        "| {label} | {} | {right} of {} right | {} | | |\n",
        v.len(),
        v.len(),
        if wrong.is_empty() {
            String::new()
        } else {
            format!("wrong: {}", wrong.join(", "))
        }
    )
}

/// The summary's lines for the tensor-parallel runs (never fitted on): iteration error, the
/// rank correlation across the layouts of each model (the same shape on different GPU counts,
/// tensor-parallel degrees and micro-batches; mean over models with three rows or more) and
/// whether each completed run is predicted to fit.
fn parallel_rows(results: &[Result_], split: Split, title: &str) -> String {
    let pick = |kind: &str| -> Vec<&Result_> {
        results
            .iter()
            .filter(|r| r.split == split && r.kind == kind)
            .collect()
    };
    let it = pick("iteration");
    if it.is_empty() {
        return String::new();
    }
    let short = split.name();
    let mut s = error_line(&format!("{title}: iteration time"), &it);
    if split == Split::Pipeline {
        // Apart from the tensor-parallel model's own error (the split above).
        let alone: Vec<&Result_> = it
            .iter()
            .copied()
            .filter(|r| !r.setting.split_whitespace().any(|t| t.starts_with("tp")))
            .collect();
        if !alone.is_empty() && alone.len() < it.len() {
            s.push_str(&error_line(
                "pipeline runs without tensor parallelism: iteration time",
                &alone,
            ));
        }
    }
    // A model: its name and shape tokens (s…, h…, l…, a… heads) of the setting.
    let model = |r: &Result_| -> String {
        r.setting
            .split_whitespace()
            .enumerate()
            .filter(|(i, t)| {
                *i == 0
                    || (t.len() > 1
                        && matches!(t.as_bytes()[0], b's' | b'h' | b'l' | b'a')
                        && t[1..].bytes().all(|b| b.is_ascii_digit()))
            })
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut by: BTreeMap<String, Vec<&Result_>> = BTreeMap::new();
    for r in &it {
        by.entry(model(r)).or_default().push(r);
    }
    let rho: Vec<f64> = by
        .values()
        .map(|v| loso::spearman(v))
        .filter(|x| x.is_finite())
        .collect();
    if !rho.is_empty() {
        let worst = rho.iter().copied().fold(f64::INFINITY, f64::min);
        let _ = writeln!(
            s,
            "| {short} runs: Spearman across the layouts of each model | {} model{} | mean {:.2} | lowest {:.2} | | |",
            rho.len(),
            if rho.len() == 1 { "" } else { "s" },
            rho.iter().sum::<f64>() / rho.len() as f64,
            worst
        );
    }
    // Whether a run fits is never fitted: both tensor-parallel halves count.
    let fit: Vec<&Result_> = results
        .iter()
        .filter(|r| {
            (r.split == split || (split == Split::Parallel && r.split == Split::ParallelFit))
                && r.kind == "completed_run"
                && r.measured == 1.0
        })
        .collect();
    if !fit.is_empty() {
        s.push_str(&facts_line(
            &format!("{short} runs: completed runs predicted to fit"),
            &fit,
        ));
    }
    s
}

/// The summary's lines for the sharded runs (ZeRO, FSDP; never fitted on).
fn sharded_rows(results: &[Result_]) -> String {
    let pick = |kind: &str| -> Vec<&Result_> {
        results
            .iter()
            .filter(|r| r.split == Split::Sharded && r.kind == kind)
            .collect()
    };
    let mut s = String::new();
    for (kind, label) in [
        (
            "iteration",
            "sharded runs (ZeRO, FSDP; never fitted): iteration time",
        ),
        ("memory", "sharded runs: peak memory"),
    ] {
        let v = pick(kind);
        if !v.is_empty() {
            s.push_str(&error_line(label, &v));
        }
    }
    for (kind, want, label) in [
        (
            "memory_fact",
            0.0,
            "sharded runs: stated out-of-memory predicted over capacity",
        ),
        (
            "memory_fact",
            1.0,
            "sharded runs: stated largest that fitted predicted to fit",
        ),
        (
            "completed_run",
            1.0,
            "sharded runs: completed runs predicted to fit",
        ),
    ] {
        let v: Vec<&Result_> = pick(kind)
            .into_iter()
            .filter(|r| r.measured == want)
            .collect();
        if !v.is_empty() {
            s.push_str(&facts_line(label, &v));
        }
    }
    s
}

/// The BigScience row whose step, against its aligned neighbours, gives Ampere's rate for
/// misaligned tensor-core products (`configs/arch/ampere.yaml`).
const AMPERE_MISALIGNED_ROW: &str = "sharded-bigsci-nheads-h13824-n128";

/// The summary's lines for the multi-node 3D layouts (BigScience; never fitted on): iteration
/// time, Spearman across each model's layouts and completed runs fitting ([`parallel_rows`]),
/// then device memory (nvidia-smi) and the stated out-of-memory layouts.
fn three_d_rows(results: &[Result_]) -> String {
    // The row Ampere's misaligned_gemm_efficiency is derived from (configs/arch/ampere.yaml):
    // reported alone, outside the held-out figures.
    let derived = |r: &Result_| r.kind == "iteration" && r.id == AMPERE_MISALIGNED_ROW;
    let held: Vec<Result_> = results.iter().filter(|r| !derived(r)).cloned().collect();
    let mut s = parallel_rows(
        &held,
        Split::ThreeD,
        "3D layouts (BigScience, TP × PP × ZeRO-1 on 1-48 nodes of 8 A100-80GB, Omni-Path; never fitted, but for the one row listed below)",
    );
    let pick = |kind: &str, want: Option<f64>| -> Vec<&Result_> {
        results
            .iter()
            .filter(|r| {
                r.split == Split::ThreeD && r.kind == kind && want.is_none_or(|w| r.measured == w)
            })
            .collect()
    };
    let mem = pick("memory", None);
    if !mem.is_empty() {
        s.push_str(&error_line("3D runs: device memory (nvidia-smi)", &mem));
    }
    for r in results.iter().filter(|r| derived(r)) {
        let _ = writeln!(
            s,
            "| 3D: the row Ampere's misaligned_gemm_efficiency is derived from ({}) | measured {:.1} | predicted {:.1} | {:+.1} % | | |",
            r.id,
            r.measured,
            r.predicted,
            r.error_pct()
        );
    }
    for (want, label) in [
        (0.0, "3D runs: stated out-of-memory predicted over capacity"),
        (
            1.0,
            "3D runs: stated to have run (no time) predicted to fit",
        ),
    ] {
        let v = pick("memory_fact", Some(want));
        if !v.is_empty() {
            s.push_str(&facts_line(label, &v));
        }
    }
    s
}

/// The leave-one-source-out table: per source, its rows predicted with constants fitted on
/// every other source, beside the same rows with the committed constants; Spearman's rank
/// correlation of predicted and measured iteration time within the source.
fn loso_table(folds: &[loso::Fold]) -> String {
    let mut s = String::from(
        "\n**Leave one source out** (`-- --loso` refits the constants without each source; \
         `experiments/fidelity/data/loso_constants.csv`):\n\n\
         | left out | fit rows | iteration rows | mean abs error | median signed | Spearman | \
         committed constants: mean abs error | Spearman | AMP pairs: mean abs error | 1→8 scaling: mean abs error |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let pick = |v: &[Result_], kind: &str| -> Vec<Result_> {
        v.iter().filter(|r| r.kind == kind).cloned().collect()
    };
    let mean = |v: &[Result_]| -> String {
        if v.is_empty() {
            "—".into()
        } else {
            let unit = if v[0].kind.starts_with("scaling") {
                " pts"
            } else {
                " %"
            };
            format!(
                "{:.1}{unit}",
                v.iter().map(|r| err(r).abs()).sum::<f64>() / v.len() as f64
            )
        }
    };
    let mut all = Vec::new();
    let mut all_amp = Vec::new();
    let mut all_scaling = Vec::new();
    for f in folds {
        let it = pick(&f.results, "iteration");
        let it_c = pick(&f.committed, "iteration");
        let mut signed: Vec<f64> = it.iter().map(err).collect();
        signed.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {} |",
            f.source,
            format!(
                "{} ({} iterations, loss {:.3})",
                f.fit_rows, f.iterations, f.loss_after
            ),
            it.len(),
            mean(&it),
            signed
                .get(signed.len() / 2)
                .map_or("—".into(), |m| format!("{m:+.1} %")),
            loso::spearman(&it.iter().collect::<Vec<_>>()),
            mean(&it_c),
            loso::spearman(&it_c.iter().collect::<Vec<_>>()),
            mean(&pick(&f.results, "amp_speedup")),
            mean(&pick(&f.results, "scaling_1_to_8")),
        );
        all.extend(it);
        all_amp.extend(pick(&f.results, "amp_speedup"));
        all_scaling.extend(pick(&f.results, "scaling_1_to_8"));
    }
    let _ = writeln!(
        s,
        "| **all sources** | | {} | {} | | | | | {} | {} |",
        all.len(),
        mean(&all),
        mean(&all_amp),
        mean(&all_scaling)
    );
    s
}

/// Leave-one-source-out predictions against measured iteration time, one colour per source.
fn loso_scatter(folds: &[loso::Fold]) -> String {
    let groups: Vec<svg::Points> = folds
        .iter()
        .map(|f| {
            let points: Vec<(f64, f64, String)> = f
                .results
                .iter()
                .filter(|r| r.kind == "iteration")
                .map(|r| {
                    (
                        r.measured,
                        r.predicted,
                        format!(
                            "{} [fitted without {}]: measured {:.1} ms, predicted {:.1} ms ({:+.1} %)",
                            r.setting,
                            f.source,
                            r.measured,
                            r.predicted,
                            r.error_pct()
                        ),
                    )
                })
                .collect();
            svg::Points {
                name: format!("{} ({})", f.source, points.len()),
                points,
            }
        })
        .collect();
    svg::scatter(
        "Iteration time, leave one source out: each source predicted with constants fitted without it (dashed: ±10 %)",
        "measured iteration, ms",
        "predicted iteration, ms",
        &groups,
        0.1,
    )
}

/// Predicted against measured iteration time, one colour per source (hover: the row).
fn scatter(results: &[Result_]) -> String {
    let mut groups: BTreeMap<String, Vec<(f64, f64, String)>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.kind == "iteration") {
        groups.entry(r.family.to_string()).or_default().push((
            r.measured,
            r.predicted,
            format!(
                "{} [{}]: measured {:.1} ms, predicted {:.1} ms ({:+.1} %)",
                r.setting,
                r.split.name(),
                r.measured,
                r.predicted,
                r.error_pct()
            ),
        ));
    }
    let groups: Vec<svg::Points> = groups
        .into_iter()
        .map(|(name, points)| svg::Points {
            name: format!("{name} ({})", points.len()),
            points,
        })
        .collect();
    svg::scatter(
        "Iteration time: predicted against published (dashed: ±10 %)",
        "measured iteration, ms",
        "predicted iteration, ms",
        &groups,
        0.1,
    )
}

/// The error a row is judged by: % for times, memory and speed-ups; points for efficiency.
fn err(r: &Result_) -> f64 {
    if r.kind.starts_with("scaling") {
        100.0 * (r.predicted - r.measured)
    } else {
        r.error_pct()
    }
}

/// The summary table (the README's).
fn summary_table(results: &[Result_]) -> String {
    let mut s = String::from(
        "| prediction | held-out rows | mean abs error | max abs error | fit rows | mean abs error (fit) |\n|---|---|---|---|---|---|\n",
    );
    for (kind, label, unit) in [
        ("iteration", "iteration time", "%"),
        ("amp_speedup", "AMP speed-up", "%"),
        ("scaling_1_to_8", "1→8 GPU scaling efficiency", " points"),
        (
            "arch_ratio",
            "speed ratio of two GPU generations (one source's code, 1 GPU each)",
            "%",
        ),
    ] {
        let pick = |sp: Split| -> Vec<&Result_> {
            results
                .iter()
                .filter(|r| r.kind == kind && r.split == sp)
                .collect()
        };
        let (h, f) = (pick(Split::HeldOut), pick(Split::Fit));
        let m = |v: &[&Result_]| {
            if v.is_empty() {
                "—".to_string()
            } else {
                format!(
                    "{:.1}{unit}",
                    v.iter().map(|r| err(r).abs()).sum::<f64>() / v.len() as f64
                )
            }
        };
        let mx = |v: &[&Result_]| {
            v.iter()
                .map(|r| err(r).abs())
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
                .map_or("—".to_string(), |x| format!("{x:.1}{unit}"))
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} |",
            h.len(),
            m(&h),
            mx(&h),
            f.len(),
            m(&f)
        );
    }
    // Memory: no memory constant is fitted on any row (the allocator, context and NCCL
    // constants come from their documentation, configs/memory/*.yaml), so every row is out of
    // sample.
    // (TensorFlow's allocated_scale is fitted on dPRO's rows, listed below as fitted.)
    let mem: Vec<&Result_> = results
        .iter()
        .filter(|r| {
            r.kind == "memory"
                && !matches!(
                    r.split,
                    Split::Check
                        | Split::Sharded
                        | Split::Parallel
                        | Split::ParallelFit
                        | Split::Pipeline
                        | Split::ThreeD
                )
        })
        .collect();
    if !mem.is_empty() {
        s.push_str(&error_line(
            "peak memory, sources no memory constant was fitted on",
            &mem,
        ));
    }
    for (kind, want, label) in [
        (
            "memory_fact",
            0.0,
            "stated out-of-memory runs predicted over capacity",
        ),
        (
            "memory_fact",
            1.0,
            "stated largest batches that fitted predicted to fit",
        ),
        (
            "completed_run",
            1.0,
            "completed runs (every timed row) predicted to fit",
        ),
    ] {
        let v: Vec<&Result_> = results
            .iter()
            .filter(|r| {
                r.kind == kind
                    && r.measured == want
                    && !matches!(
                        r.split,
                        Split::Sharded
                            | Split::Parallel
                            | Split::ParallelFit
                            | Split::Pipeline
                            | Split::ThreeD
                    )
            })
            .collect();
        s.push_str(&facts_line(label, &v));
    }
    s.push_str(&sharded_rows(results));
    s.push_str(&parallel_rows(
        results,
        Split::Parallel,
        "tensor-parallel runs (vTrain, TP 2-8 in one node, PP 1; the held-out half: only the host's collective-call time is fitted, on the other half)",
    ));
    let tp_fit: Vec<&Result_> = results
        .iter()
        .filter(|r| r.split == Split::ParallelFit && r.kind == "iteration")
        .collect();
    if !tp_fit.is_empty() {
        s.push_str(&error_line(
            "tensor-parallel runs, the fit half of the collective-call time: iteration time",
            &tp_fit,
        ));
    }
    s.push_str(&parallel_rows(
        results,
        Split::Pipeline,
        "pipeline-parallel runs (vTrain, PP 2-4 in one node, 1F1B; never fitted)",
    ));
    s.push_str(&three_d_rows(results));
    let dpro: Vec<&Result_> = results
        .iter()
        .filter(|r| r.split == Split::Check && !matches!(r.kind, "memory_fact" | "completed_run"))
        .collect();
    for r in dpro {
        let _ = writeln!(
            s,
            "| {} {}{} ({}) | measured {:.1} | predicted {:.1} | {:+.1} % | | |",
            if r.family == "dpro" {
                "dPRO"
            } else {
                "Korthikanti et al. (TP 8, one node, never fitted)"
            },
            r.kind,
            if r.kind == "memory" {
                ", TensorFlow's allocated_scale fitted on these"
            } else {
                ""
            },
            r.id,
            r.measured,
            r.predicted,
            r.error_pct()
        );
    }
    let _ = mean_abs;
    s
}

#[cfg(test)]
mod tests {
    use super::{arch_ratios, rows};
    use std::path::Path;

    /// Generation pairs form across GPU generations only (V100 16 GB and 32 GB are one
    /// generation), within one precision class, and compare per-sample times: with every
    /// prediction equal to its measurement, every ratio is exact.
    #[test]
    fn generation_ratios_pair_gpus_of_different_generations() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (cases, _) = rows::load(&root.join("experiments/fidelity/data/published.csv"));
        let timed: Vec<_> = cases
            .into_iter()
            .filter(|c| c.id.starts_with("dle-pt-rn50-2103-") && c.id.ends_with("-1g"))
            .map(|c| {
                let m = c.measured_ms.unwrap();
                (c, m)
            })
            .collect();
        // DGX-1 16 GB, DGX-1 32 GB and DGX A100, each with AMP and FP32/TF32.
        assert_eq!(
            timed.len(),
            6,
            "{:?}",
            timed.iter().map(|t| &t.0.id).collect::<Vec<_>>()
        );
        let r = arch_ratios(&timed);
        let mut ids: Vec<&str> = r.iter().map(|x| x.id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            [
                "dle-pt-rn50-2103-dgx1-16g-amp-1g+dle-pt-rn50-2103-dgxa100-amp-1g",
                "dle-pt-rn50-2103-dgx1-16g-fp32-1g+dle-pt-rn50-2103-dgxa100-tf32-1g",
                "dle-pt-rn50-2103-dgx1-32g-amp-1g+dle-pt-rn50-2103-dgxa100-amp-1g",
                "dle-pt-rn50-2103-dgx1-32g-fp32-1g+dle-pt-rn50-2103-dgxa100-tf32-1g",
            ]
        );
        for x in &r {
            assert!(x.measured > 1.0, "{}: an A100 is faster", x.id);
            assert!((x.predicted / x.measured - 1.0).abs() < 1e-12, "{}", x.id);
        }
    }
}
