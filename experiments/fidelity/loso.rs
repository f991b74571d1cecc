//! Leave-one-source-out: for each source in turn, the fitted constants are fitted again on every
//! other source's rows (both halves; dPRO's tables and the sharded sources are never fitted on) and that source's rows
//! are predicted with them. A source is one organisation's table or repository; DeepLearning
//! Examples' PyTorch and TensorFlow folders run different recipes, so they are two sources.
//!
//! `--loso [--iters N] [--only SOURCE]` runs the fits (slow: one Nelder–Mead per source; with
//! `--only`, that source's fold alone, the other folds' rows kept as committed) and writes the
//! fitted values to `experiments/fidelity/data/loso_constants.csv`; every later run predicts each
//! source with its fold's committed values, so the report is reproducible without refitting.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use rayon::prelude::*;

use super::rows::Case;
use super::{Result_, fit, predict};

const CONSTANTS: &str = "experiments/fidelity/data/loso_constants.csv";

/// The source a case belongs to for leave-one-source-out.
pub fn source_of(c: &Case) -> String {
    if c.family == "dle" {
        format!("dle-{}", c.framework)
    } else {
        c.family.to_string()
    }
}

/// The sources that can be left out: every one with a timed row, dPRO's excepted.
fn sources(cases: &[Case]) -> Vec<String> {
    let mut s: Vec<String> = cases
        .iter()
        .filter(|c| !c.check_only() && c.measured_ms.is_some())
        .map(source_of)
        .collect();
    s.sort();
    s.dedup();
    s
}

/// Fits every fold, or the fold of `only` (keeping the other folds' committed rows), and writes
/// their constants (`--loso`).
pub fn fit_folds(root: &Path, cases: &[Case], iters: u64, only: Option<&str>) {
    let all = sources(cases);
    if let Some(o) = only {
        assert!(
            all.iter().any(|s| s == o),
            "--only {o}: no such source (one of {})",
            all.join(", ")
        );
    }
    // The other folds' rows come from the committed file: without it `--only` would drop them.
    let committed = match only {
        Some(_) => std::fs::read_to_string(root.join(CONSTANTS))
            .expect("--only keeps the other folds of the committed loso_constants.csv"),
        None => String::new(),
    };
    let mut csv = String::from(
        "left_out,constant,configs_value,fitted_value,fit_rows,loss_before,loss_after,iterations\n",
    );
    for s in all {
        if only.is_some_and(|o| o != s) {
            for line in committed
                .lines()
                .filter(|l| l.split(',').next() == Some(s.as_str()))
            {
                csv.push_str(line);
                csv.push('\n');
            }
            continue;
        }
        let train: Vec<Case> = cases
            .iter()
            .filter(|c| !c.check_only() && source_of(c) != s)
            .cloned()
            .collect();
        let rows = train.iter().filter(|c| c.measured_ms.is_some()).count();
        eprintln!("fold without {s}: fitting on {rows} timed rows ({iters} iterations at most)…");
        let f = fit::fit(&train, iters);
        for (name, before, after) in &f.rows {
            let _ = writeln!(
                csv,
                "{s},{name},{before},{after},{rows},{:.6},{:.6},{}",
                f.loss_before, f.loss_after, f.iterations
            );
        }
        // Written after every fold: a long run cut short keeps the folds it finished.
        write_atomically(&root.join(CONSTANTS), &csv);
    }
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, text).expect("write the LOSO constants");
    std::fs::rename(&tmp, path).expect("replace the LOSO constants");
}

/// One fold: the source left out, its rows predicted with the others' constants.
pub struct Fold {
    pub source: String,
    pub results: Vec<Result_>,
    /// The same rows with the committed constants (fitted on a random half of every source).
    pub committed: Vec<Result_>,
    pub fit_rows: usize,
    pub iterations: u64,
    pub loss_after: f64,
}

/// Predicts each source with its fold's committed constants; `None` without the constants file.
pub fn predict_folds(root: &Path, cases: &[Case]) -> Option<Vec<Fold>> {
    let text = std::fs::read_to_string(root.join(CONSTANTS)).ok()?;
    let mut folds: BTreeMap<String, (BTreeMap<String, f64>, usize, u64, f64)> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let [src, name, _, value, rows, _, after, iters] = f[..] else {
            continue;
        };
        let e = folds.entry(src.to_string()).or_default();
        if let Ok(v) = value.parse() {
            e.0.insert(name.to_string(), v);
        }
        e.1 = rows.parse().unwrap_or(0);
        e.3 = after.parse().unwrap_or(f64::NAN);
        e.2 = iters.parse().unwrap_or(0);
    }
    let out = folds
        .into_iter()
        .map(|(source, (values, fit_rows, iterations, loss_after))| {
            let o = fit::overrides_named(&values);
            // The source's rows the headline reports (never the check-only ones: dPRO, the
            // sharded and tensor-parallel runs). Nor the rows with depthwise convolutions:
            // `depthwise_efficiency` is fitted on DeepLearningExamples' EfficientNet rows alone
            // (no other source times a depthwise conv), so no fold predicts them out of source.
            let mine: Vec<&Case> = cases
                .iter()
                .filter(|c| source_of(c) == source && !c.check_only() && !fit::has_depthwise(c))
                .collect();
            let predict_all = |o: &predict::Overrides| -> Vec<(Case, predict::Prediction)> {
                mine.par_iter()
                    .filter_map(|c| predict::predict(c, o).ok().map(|p| ((*c).clone(), p)))
                    .collect()
            };
            Fold {
                results: super::results_of(&predict_all(&o)),
                committed: super::results_of(&predict_all(&predict::Overrides::default())),
                source,
                fit_rows,
                iterations,
                loss_after,
            }
        })
        .collect();
    Some(out)
}

/// Spearman's rank correlation of predicted against measured (average ranks for ties); NaN
/// below three points.
pub fn spearman(rows: &[&Result_]) -> f64 {
    if rows.len() < 3 {
        return f64::NAN;
    }
    let ranks = |v: Vec<f64>| -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let mut r = vec![0.0; v.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
                j += 1;
            }
            let avg = (i + j) as f64 / 2.0 + 1.0;
            for &k in &idx[i..=j] {
                r[k] = avg;
            }
            i = j + 1;
        }
        r
    };
    let a = ranks(rows.iter().map(|r| r.measured).collect());
    let b = ranks(rows.iter().map(|r| r.predicted).collect());
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(m: f64, p: f64) -> Result_ {
        Result_ {
            kind: "iteration",
            id: String::new(),
            family: "x",
            setting: String::new(),
            source: String::new(),
            measured: m,
            predicted: p,
            split: super::super::Split::Fit,
        }
    }

    #[test]
    fn spearman_is_one_for_the_same_order_and_minus_one_reversed() {
        let same = [row(1.0, 10.0), row(2.0, 30.0), row(3.0, 31.0)];
        let rev = [row(1.0, 3.0), row(2.0, 2.0), row(3.0, 1.0)];
        let r = |v: &[Result_]| spearman(&v.iter().collect::<Vec<_>>());
        assert!((r(&same) - 1.0).abs() < 1e-12);
        assert!((r(&rev) + 1.0).abs() < 1e-12);
        let tie = [row(1.0, 1.0), row(2.0, 1.0), row(3.0, 2.0), row(4.0, 3.0)];
        let t = r(&tie);
        assert!(t > 0.9 && t < 1.0, "{t}");
    }
}
