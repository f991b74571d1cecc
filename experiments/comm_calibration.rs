//! Calibrates the ring all-reduce α–β model (`trainplan::cost::comm`) on measured NCCL all-reduce
//! times and reports how well it fits.
//!
//! Reproduces: for each GPU kind (A100, V100) and each ring size n = 2..8, a fit of the latency α and
//! link bandwidth B of `T = 2(n−1)·(α + (S/n)/B)` to nccl-tests measurements (1 MiB .. 1 GiB,
//! out-of-place time), minimising the mean squared relative error; plus a two-segment (piecewise)
//! α–β fit with a fitted breakpoint, side by side. Data: `../shared/calibration/
//! nccl-tests-allreduce/{a100,v100}/AR_GPU{n}_1M_1024M_LUT` relative to the crate root (see
//! `../shared/calibration/README.md`).
//!
//! Run: `cargo run --release --example comm_calibration`
//!
//! Prints a Markdown report and writes it to `experiments/results/comm_calibration.md`, the summary
//! rows to `experiments/results/comm_calibration.csv` and the per-size errors to
//! `experiments/results/comm_calibration_by_size.csv`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use trainplan::cost::comm::{
    AllReduceSample, FitReport, PiecewiseReport, fit_report, piecewise_report, read_nccl_tests_lut,
};

const GPUS: [&str; 2] = ["a100", "v100"];
const MIB: u64 = 1 << 20;
const SIZES: [u64; 6] = [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB];

struct Row {
    gpu: &'static str,
    n: u32,
    single: FitReport,
    piecewise: PiecewiseReport,
    /// Measured busbw at the largest size, GB/s.
    measured_busbw_max: f64,
    max_bytes: u64,
}

/// nccl-tests bus bandwidth of one all-reduce (GB/s): `(S/T)·2(n−1)/n`.
fn busbw(n: u32, bytes: u64, time_ns: f64) -> f64 {
    bytes as f64 / time_ns * 2.0 * f64::from(n - 1) / f64::from(n)
}

fn signed_err_pct(measured: f64, predicted: f64) -> f64 {
    (predicted / measured - 1.0) * 100.0
}

fn row_at(rows: &[(u64, f64, f64)], bytes: u64) -> Option<(u64, f64, f64)> {
    rows.iter().copied().find(|r| r.0 == bytes)
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{}", bytes / MIB)
    } else {
        format!("{:.2}", bytes as f64 / MIB as f64)
    }
}

fn size_label(bytes: u64) -> String {
    if bytes >= 1024 * MIB && bytes.is_multiple_of(1024 * MIB) {
        format!("{} GiB", bytes / (1024 * MIB))
    } else {
        format!("{} MiB", mib(bytes))
    }
}

/// Mean |error| % over the samples with `lo <= bytes < hi`.
fn band_err(rows: &[(u64, f64, f64)], lo: u64, hi: u64) -> f64 {
    let errs: Vec<f64> = rows
        .iter()
        .filter(|r| r.0 >= lo && r.0 < hi)
        .map(|r| signed_err_pct(r.1, r.2).abs())
        .collect();
    errs.iter().sum::<f64>() / errs.len().max(1) as f64
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("../shared/calibration/nccl-tests-allreduce");
    if !data.is_dir() {
        eprintln!(
            "comm_calibration: calibration data not found at {}\n\
             expected ../shared/calibration/nccl-tests-allreduce/{{a100,v100}}/AR_GPU{{2..8}}_1M_1024M_LUT \
             next to the crate root (see ../shared/calibration/README.md)",
            data.display()
        );
        std::process::exit(2);
    }

    let mut rows = Vec::new();
    for gpu in GPUS {
        for n in 2..=8u32 {
            let path: PathBuf = data.join(gpu).join(format!("AR_GPU{n}_1M_1024M_LUT"));
            let samples: Vec<AllReduceSample> = match read_nccl_tests_lut(&path) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("comm_calibration: {e}");
                    std::process::exit(2);
                }
            };
            let fits =
                fit_report(&samples, n).and_then(|s| Ok((s, piecewise_report(&samples, n)?)));
            let (single, piecewise) = match fits {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("comm_calibration: {gpu} n={n}: {e}");
                    std::process::exit(1);
                }
            };
            let largest = samples
                .iter()
                .max_by_key(|s| s.bytes)
                .copied()
                .expect("parser returns at least one row");
            rows.push(Row {
                gpu,
                n,
                single,
                piecewise,
                measured_busbw_max: busbw(n, largest.bytes, largest.time_ns),
                max_bytes: largest.bytes,
            });
        }
    }

    let md = markdown(&rows);
    print!("{md}");
    let out = root.join("experiments/results");
    let res = std::fs::create_dir_all(&out)
        .and_then(|_| std::fs::write(out.join("comm_calibration.md"), &md))
        .and_then(|_| std::fs::write(out.join("comm_calibration.csv"), summary_csv(&rows)))
        .and_then(|_| std::fs::write(out.join("comm_calibration_by_size.csv"), by_size_csv(&rows)));
    if let Err(e) = res {
        eprintln!(
            "comm_calibration: cannot write results to {}: {e}",
            out.display()
        );
        std::process::exit(1);
    }
    eprintln!(
        "wrote {}/comm_calibration.{{md,csv}} and comm_calibration_by_size.csv",
        out.display()
    );
}

fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# NCCL all-reduce calibration of the ring α–β model\n");
    let _ = writeln!(
        s,
        "Generated by `cargo run --release --example comm_calibration` from \
         `../shared/calibration/nccl-tests-allreduce/{{a100,v100}}/AR_GPU{{n}}_1M_1024M_LUT` \
         (nccl-tests, one host, out-of-place time, 1024 sizes from 1 MiB to 1 GiB in 1 MiB steps).\n"
    );
    let _ = writeln!(
        s,
        "Model: `T(S) = 2(n−1)·(α + (S/n)/B)`. Fit: α ≥ 0 and B > 0 minimising the mean squared \
         relative error over all 1024 sizes (argmin Brent on the convex profile in α; see \
         `src/cost/comm.rs`).\n"
    );
    let _ = writeln!(
        s,
        "**What B is.** B is the fitted per-link bandwidth of the ring formula, in GB/s (10⁹ B/s). \
         nccl-tests' bus bandwidth is `busbw = (S/T)·2(n−1)/n`; under the model \
         `busbw(S) = B·x/(x + 2(n−1)αB)` with `x = 2(n−1)S/n`, so B is exactly the model's \
         *asymptotic* busbw (S → ∞) and is directly comparable with nccl-tests' busbw column. \
         \"busbw@1GiB\" columns give the measured busbw at the largest size and the model's busbw \
         there (which is below B because of the latency term). Errors are `predicted/measured − 1`.\n"
    );
    let _ = writeln!(s, "{}", observations(rows));

    let _ = writeln!(s, "## Single α–β segment (ring)\n");
    let _ = writeln!(
        s,
        "| gpu | n | α (µs) | B = asymptotic busbw (GB/s) | measured busbw@1GiB (GB/s) | model busbw@1GiB (GB/s) | mean \\|err\\| % | max \\|err\\| % | mean \\|err\\| % S < 16 MiB | mean \\|err\\| % S ≥ 64 MiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let f = r.single.fit;
        let model_t = trainplan::cost::comm::ring_allreduce_ns(f, r.n, r.max_bytes as f64);
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.gpu,
            r.n,
            f.alpha_ns / 1e3,
            f.gbps(),
            r.measured_busbw_max,
            busbw(r.n, r.max_bytes, model_t),
            r.single.mean_abs_err_pct,
            r.single.max_abs_err_pct,
            band_err(&r.single.rows, 0, 16 * MIB),
            band_err(&r.single.rows, 64 * MIB, u64::MAX),
        );
    }

    let _ = writeln!(
        s,
        "\n## Piecewise: two α–β segments, breakpoint chosen by the fit\n"
    );
    let _ = writeln!(
        s,
        "Messages smaller than the breakpoint use the *small* segment, the rest the *large* one; \
         both are ring α–β fits as above, and the breakpoint (a measured size) minimises the total \
         squared relative error.\n"
    );
    let _ = writeln!(
        s,
        "| gpu | n | breakpoint (MiB) | α small (µs) | B small (GB/s) | α large (µs) | B large (GB/s) | mean \\|err\\| % | max \\|err\\| % | mean \\|err\\| % S < 16 MiB | mean \\|err\\| % S ≥ 64 MiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let p = &r.piecewise;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.gpu,
            r.n,
            mib(p.fit.breakpoint_bytes),
            p.fit.small.alpha_ns / 1e3,
            p.fit.small.gbps(),
            p.fit.large.alpha_ns / 1e3,
            p.fit.large.gbps(),
            p.mean_abs_err_pct,
            p.max_abs_err_pct,
            band_err(&p.rows, 0, 16 * MIB),
            band_err(&p.rows, 64 * MIB, u64::MAX),
        );
    }

    let _ = writeln!(s, "\n## Error by message size\n");
    let _ = writeln!(
        s,
        "Signed error `predicted/measured − 1` in %, single segment / piecewise \
         (positive = model too slow).\n"
    );
    let mut hdr = String::from("| gpu | n |");
    let mut sep = String::from("|---|---|");
    for b in SIZES {
        let _ = write!(hdr, " {} |", size_label(b));
        sep.push_str("---|");
    }
    let _ = writeln!(s, "{hdr}\n{sep}");
    for r in rows {
        let _ = write!(s, "| {} | {} |", r.gpu, r.n);
        for b in SIZES {
            match (row_at(&r.single.rows, b), row_at(&r.piecewise.rows, b)) {
                (Some(a), Some(p)) => {
                    let _ = write!(
                        s,
                        " {:+.1} / {:+.1} |",
                        signed_err_pct(a.1, a.2),
                        signed_err_pct(p.1, p.2)
                    );
                }
                _ => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s
}

/// Observations computed from the fits (kept numeric so they stay true if the data changes).
fn observations(rows: &[Row]) -> String {
    let mut s = String::from("**Observations.**\n\n");
    let worst_small = rows
        .iter()
        .map(|r| (band_err(&r.single.rows, 0, 16 * MIB), r))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let worst_large = rows
        .iter()
        .map(|r| band_err(&r.single.rows, 64 * MIB, u64::MAX))
        .fold(0.0, f64::max);
    let worst_max = rows
        .iter()
        .map(|r| (r.single.max_abs_err_pct, r))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let pw_worst_max = rows
        .iter()
        .map(|r| r.piecewise.max_abs_err_pct)
        .fold(0.0, f64::max);
    if let (Some((ws, wr)), Some((wm, mr))) = (worst_small, worst_max) {
        let worst_at = mr
            .single
            .rows
            .iter()
            .max_by(|a, b| {
                signed_err_pct(a.1, a.2)
                    .abs()
                    .total_cmp(&signed_err_pct(b.1, b.2).abs())
            })
            .map(|r| r.0)
            .unwrap_or(0);
        let _ = writeln!(
            s,
            "- The single ring α–β line does **not** fit small and large messages equally. For \
             S ≥ 64 MiB the mean |error| is at most {worst_large:.2} % (any GPU, any n); below \
             16 MiB it reaches {ws:.1} % ({} n={}), and the worst single sample is {wm:.1} % \
             ({} n={} at {}).",
            wr.gpu,
            wr.n,
            mr.gpu,
            mr.n,
            size_label(worst_at),
        );
    }
    for gpu in GPUS {
        let g: Vec<&Row> = rows.iter().filter(|r| r.gpu == gpu).collect();
        let (Some(first), Some(last)) = (g.first(), g.last()) else {
            continue;
        };
        let b_min = g
            .iter()
            .map(|r| r.single.fit.gbps())
            .fold(f64::INFINITY, f64::min);
        let b_max = g.iter().map(|r| r.single.fit.gbps()).fold(0.0, f64::max);
        let lat = |r: &Row| 2.0 * f64::from(r.n - 1) * r.single.fit.alpha_ns / 1e3;
        // Largest drop of the measured time from one size to the next (a protocol/algorithm switch).
        let drop = g
            .iter()
            .flat_map(|r| {
                r.single
                    .rows
                    .windows(2)
                    .map(move |w| (1.0 - w[1].1 / w[0].1, r.n, w[0].0, w[1].0))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let bp_min = g
            .iter()
            .map(|r| r.piecewise.fit.breakpoint_bytes)
            .min()
            .unwrap_or(0);
        let bp_max = g
            .iter()
            .map(|r| r.piecewise.fit.breakpoint_bytes)
            .max()
            .unwrap_or(0);
        let _ = write!(
            s,
            "- {gpu}: fitted B ranges {b_min:.1}–{b_max:.1} GB/s over n = {}..{}, and the total \
             latency term 2(n−1)·α is {:.0} µs at n = {} and {:.0} µs at n = {} (α itself is \
             {:.1} → {:.1} µs), so neither α nor B is a per-link constant: calibrate per n. \
             Piecewise breakpoints fall at {}–{} MiB.",
            first.n,
            last.n,
            lat(first),
            first.n,
            lat(last),
            last.n,
            first.single.fit.alpha_ns / 1e3,
            last.single.fit.alpha_ns / 1e3,
            mib(bp_min),
            mib(bp_max),
        );
        if let Some((d, n, a, b)) = drop {
            let _ = write!(
                s,
                " The largest measured time *drop* between consecutive sizes is {:.1} % (n={n}, \
                 {} → {}): larger messages finishing faster points to NCCL switching \
                 protocol, algorithm or channel count, which no single α–β line can follow.",
                d * 100.0,
                size_label(a),
                size_label(b),
            );
        }
        let bs: Vec<f64> = g.iter().map(|r| r.single.fit.gbps()).collect();
        if bs.windows(2).any(|w| w[1] < 0.8 * w[0]) {
            let list: Vec<String> = g
                .iter()
                .map(|r| format!("{:.0}", r.single.fit.gbps()))
                .collect();
            let _ = write!(
                s,
                " B is not monotone in n ({} GB/s for n = {}..{}): the bandwidth NCCL gets \
                 depends on which GPUs and links the rings can use (a non-uniform NVLink \
                 topology), not just on n.",
                list.join(", "),
                first.n,
                last.n,
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "- Because the sizes are spaced linearly (1 MiB steps), only 15 of 1024 samples are below \
         16 MiB, so the overall mean |error| is dominated by large messages and looks small; read \
         the per-size table before trusting the model for small (latency-bound) messages."
    );
    let _ = writeln!(
        s,
        "- The small-message misfit is structural, not a fitting problem: NCCL picks protocol \
         (LL / LL128 / Simple), chunk size and number of channels by message size, which most \
         likely explains why the effective latency and bandwidth differ between size ranges. \
         No fudge factor is applied. The piecewise model (two independent α–β segments) brings \
         the worst sample down to {pw_worst_max:.1} % over all GPUs and n. It clearly helps on \
         V100, where the fitted breakpoint lands on the observed switch (e.g. 14 MiB for \
         n = 8) and, for the n where the single line is poor (3, 4, 6, 7, 8), the mean error \
         below 16 MiB falls 3–6×. On A100 it helps less: the fitted breakpoint lands at \
         100–300 MiB, i.e. the second segment is spent on the slow ripple of busbw at large \
         sizes (a few %), and the 1–16 MiB errors (a flat ~80–95 µs floor up to ~4 MiB, then a \
         steep ramp) improve only modestly. Segment α and B are effective values for a size \
         range, not physical link constants (e.g. A100's large-segment α of 13–60 µs)."
    );
    s
}

fn summary_csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "gpu,n,alpha_us,B_GBps,measured_busbw_1GiB_GBps,mean_abs_err_pct,max_abs_err_pct,\
         pw_breakpoint_bytes,pw_small_alpha_us,pw_small_B_GBps,pw_large_alpha_us,pw_large_B_GBps,\
         pw_mean_abs_err_pct,pw_max_abs_err_pct\n",
    );
    for r in rows {
        let f = r.single.fit;
        let p = &r.piecewise;
        let _ = writeln!(
            s,
            "{},{},{:.4},{:.3},{:.3},{:.4},{:.4},{},{:.4},{:.3},{:.4},{:.3},{:.4},{:.4}",
            r.gpu,
            r.n,
            f.alpha_ns / 1e3,
            f.gbps(),
            r.measured_busbw_max,
            r.single.mean_abs_err_pct,
            r.single.max_abs_err_pct,
            p.fit.breakpoint_bytes,
            p.fit.small.alpha_ns / 1e3,
            p.fit.small.gbps(),
            p.fit.large.alpha_ns / 1e3,
            p.fit.large.gbps(),
            p.mean_abs_err_pct,
            p.max_abs_err_pct,
        );
    }
    s
}

fn by_size_csv(rows: &[Row]) -> String {
    let mut s = String::from("gpu,n,model,bytes,measured_ns,predicted_ns,err_pct\n");
    for r in rows {
        for b in SIZES {
            for (model, rs) in [("single", &r.single.rows), ("piecewise", &r.piecewise.rows)] {
                if let Some((bytes, m, p)) = row_at(rs, b) {
                    let _ = writeln!(
                        s,
                        "{},{},{},{},{:.0},{:.0},{:.3}",
                        r.gpu,
                        r.n,
                        model,
                        bytes,
                        m,
                        p,
                        signed_err_pct(m, p)
                    );
                }
            }
        }
    }
    s
}
