//! The fit: the architecture constants (per GPU architecture and operator class) and the host's
//! speed factor that minimise the mean |log(predicted / measured)| iteration time over the
//! fit half, by argmin's Nelder–Mead. Nothing per model or per row: one value per
//! (architecture, class) or per host, shared by every row that uses it.

use std::collections::BTreeMap;

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::neldermead::NelderMead;
use rayon::prelude::*;

use trainplan::cost::config::{ArchSpec, load_gpu_arch};

use super::predict::{Overrides, predict};
use super::rows::Case;

/// One fitted constant: where it lives and its bounds.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub arch: Option<&'static str>,
    pub name: &'static str,
    pub lo: f64,
    pub hi: f64,
}

fn get(a: &ArchSpec, name: &str) -> f64 {
    match name {
        "gemm_efficiency.cuda_core" => a.gemm_efficiency.cuda_core,
        "gemm_efficiency.tensor_core" => a.gemm_efficiency.tensor_core,
        "conv_efficiency.cuda_core" => a.conv_efficiency.cuda_core,
        "conv_efficiency.tensor_core" => a.conv_efficiency.tensor_core,
        "memory_efficiency" => a.memory_efficiency,
        "reduction_half" => a.reduction_half,
        "tile_half_intensity" => a.tile_half_intensity,
        other => panic!("unknown constant {other}"),
    }
}

fn set(a: &mut ArchSpec, name: &str, v: f64) {
    match name {
        "gemm_efficiency.cuda_core" => a.gemm_efficiency.cuda_core = v,
        "gemm_efficiency.tensor_core" => a.gemm_efficiency.tensor_core = v,
        "conv_efficiency.cuda_core" => a.conv_efficiency.cuda_core = v,
        "conv_efficiency.tensor_core" => a.conv_efficiency.tensor_core = v,
        "memory_efficiency" => a.memory_efficiency = v,
        "reduction_half" => a.reduction_half = v,
        "tile_half_intensity" => a.tile_half_intensity = v,
        other => panic!("unknown constant {other}"),
    }
}

/// The constants fitted: those the fit half's rows exercise.
pub fn params() -> Vec<Param> {
    let p = |arch, name, lo, hi| Param {
        arch: Some(arch),
        name,
        lo,
        hi,
    };
    // Volta's GEMM efficiencies are not fitted here: they are the rate of the large products
    // DeepBench timed on a V100 (`cargo run --release --example kernel_rates`).
    let mut v = vec![p("volta", "conv_efficiency.cuda_core", 0.3, 1.0)];
    // Tensor-core GEMMs cannot beat the best shape of a brute-force search (ml-engineering's
    // "Maximum Achievable Matmul FLOPS", BF16 v2: A100-SXM 86.9 %, H100-SXM 80.3 % of the spec;
    // experiments/fidelity/data/kernels.csv).
    for (arch, ceiling) in [("ampere", 0.869), ("hopper", 0.803)] {
        v.push(p(arch, "gemm_efficiency.tensor_core", 0.2, ceiling));
    }
    for arch in ["volta", "ampere", "hopper"] {
        v.push(p(arch, "conv_efficiency.tensor_core", 0.2, 1.0));
        v.push(p(arch, "memory_efficiency", 0.3, 1.0));
    }
    for arch in ["volta", "ampere", "hopper"] {
        v.push(p(arch, "reduction_half", 0.0, 512.0));
    }
    v.push(Param {
        arch: None,
        name: "host.speed",
        lo: 0.1,
        hi: 3.0,
    });
    v.push(Param {
        arch: None,
        name: "host.micro_step_us",
        lo: 0.0,
        hi: 5000.0,
    });
    v
}

/// The overrides `x` stands for.
pub fn overrides(ps: &[Param], x: &[f64]) -> Overrides {
    let mut o = Overrides::default();
    for (p, &v) in ps.iter().zip(x) {
        let v = v.clamp(p.lo, p.hi);
        match p.arch {
            Some(a) => {
                let spec = o
                    .arch
                    .entry(a.to_string())
                    .or_insert_with(|| load_gpu_arch(a).expect("built-in architecture"));
                set(spec, p.name, v);
            }
            None if p.name == "host.speed" => o.host_speed = Some(v),
            None => o.host_micro_step_us = Some(v),
        }
    }
    o
}

/// The configs' current values of `ps`.
pub fn current(ps: &[Param]) -> Vec<f64> {
    ps.iter()
        .map(|p| match p.arch {
            Some(a) => get(&load_gpu_arch(a).expect("built-in architecture"), p.name),
            None if p.name == "host.speed" => trainplan::cost::host::HostSpec::default().speed,
            None => trainplan::cost::host::HostSpec::default().micro_step_us,
        })
        .collect()
}

struct Loss<'a> {
    cases: &'a [Case],
    params: Vec<Param>,
}

impl CostFunction for Loss<'_> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, x: &Vec<f64>) -> Result<f64, argmin::core::Error> {
        let o = overrides(&self.params, x);
        // Leaving the bounds costs as much as being that far off.
        let outside: f64 = self
            .params
            .iter()
            .zip(x)
            .map(|(p, &v)| ((p.lo - v).max(0.0) + (v - p.hi).max(0.0)) / (p.hi - p.lo))
            .sum();
        Ok(log_loss(self.cases, &o) + outside)
    }
}

/// What a fit found.
pub struct Fitted {
    /// (constant, configs' value, fitted value), in [`params`] order.
    pub rows: Vec<(String, f64, f64)>,
    /// Mean |log(predicted / measured)| over the cases before and after.
    pub loss_before: f64,
    pub loss_after: f64,
    pub iterations: u64,
}

/// The key a constant is written under: `arch.name`, or the host's name.
pub fn key(p: &Param) -> String {
    match p.arch {
        Some(a) => format!("{a}.{}", p.name),
        None => p.name.to_string(),
    }
}

/// Fits on `cases` from the configs' values.
pub fn fit(cases: &[Case], iters: u64) -> Fitted {
    let ps = params();
    let x0 = current(&ps);
    let mut simplex = vec![x0.clone()];
    for (i, p) in ps.iter().enumerate() {
        let mut x = x0.clone();
        x[i] += 0.1 * (p.hi - p.lo);
        if x[i] > p.hi {
            x[i] = x0[i] - 0.1 * (p.hi - p.lo);
        }
        simplex.push(x);
    }
    let solver = NelderMead::new(simplex)
        .with_sd_tolerance(1e-5)
        .expect("a valid tolerance");
    let loss = Loss {
        cases,
        params: ps.clone(),
    };
    let before = loss.cost(&x0).unwrap_or(f64::NAN);
    let res = Executor::new(loss, solver)
        .configure(|s| s.max_iters(iters))
        .run()
        .expect("the fit runs");
    let best = res.state().get_best_param().cloned().unwrap_or(x0.clone());
    let after = res.state().get_best_cost();
    let iterations = res.state().get_iter();
    eprintln!("fit: mean |log error| {before:.4} → {after:.4} after {iterations} iterations");
    let rows = ps
        .iter()
        .zip(&x0)
        .zip(&best)
        .map(|((p, a), b)| (key(p), *a, b.clamp(p.lo, p.hi)))
        .collect();
    Fitted {
        rows,
        loss_before: before,
        loss_after: after,
        iterations,
    }
}

/// The overrides that fitted values name (`key` → value; a constant not named keeps the
/// configs' value).
pub fn overrides_named(values: &BTreeMap<String, f64>) -> Overrides {
    let ps = params();
    let x: Vec<f64> = ps
        .iter()
        .zip(current(&ps))
        .map(|(p, now)| values.get(&key(p)).copied().unwrap_or(now))
        .collect();
    overrides(&ps, &x)
}

/// Mean |log(predicted / measured)| iteration time of `cases` under `o`.
fn log_loss(cases: &[Case], o: &Overrides) -> f64 {
    let errs: Vec<f64> = cases
        .par_iter()
        .filter_map(|c| {
            let m = c.measured_ms?;
            let p = predict(c, o).ok()?;
            Some((p.iteration_ms / m).ln().abs())
        })
        .collect();
    errs.iter().sum::<f64>() / errs.len().max(1) as f64
}

/// The host's collective-call time (`collective_call_us`, µs) that minimises the mean
/// |log error| of `cases` (the tensor-parallel fit half: no other row calls a collective from
/// the host's program order), by golden-section search on [0, 100] µs with every other
/// constant at its configs' value. Returns (configs' value, fitted value, loss before, after).
pub fn fit_collective(cases: &[Case], iters: u32) -> (f64, f64, f64, f64) {
    let at = |v: f64| {
        log_loss(
            cases,
            &Overrides {
                host_collective_call_us: Some(v),
                ..Overrides::default()
            },
        )
    };
    let now = trainplan::cost::host::HostSpec::default().collective_call_us;
    let before = at(now);
    let best = golden_section(0.0, 100.0, iters, &at, |a, b, step| {
        eprintln!("collective call: [{a:.2}, {b:.2}] µs after {step} steps");
    });
    (now, best, before, at(best))
}

/// The minimum of `f` on [`lo`, `hi`] by `iters` golden-section steps (`f` unimodal there);
/// `progress` sees the bracket after each step.
fn golden_section(
    lo: f64,
    hi: f64,
    iters: u32,
    f: &dyn Fn(f64) -> f64,
    progress: impl Fn(f64, f64, u32),
) -> f64 {
    let r = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (lo, hi);
    let (mut c, mut d) = (b - r * (b - a), a + r * (b - a));
    let (mut fc, mut fd) = (f(c), f(d));
    for i in 0..iters {
        if fc < fd {
            b = d;
            d = c;
            fd = fc;
            c = b - r * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + r * (b - a);
            fd = f(d);
        }
        progress(a, b, i + 1);
    }
    (a + b) / 2.0
}

/// Whether `c`'s model has a depthwise convolution (`OpClass::DepthwiseConv`).
pub fn has_depthwise(c: &Case) -> bool {
    trainplan::zoo::model(&c.model, &c.opts).is_ok_and(|m| {
        m.layers
            .iter()
            .any(|l| l.kind == trainplan::zoo::LayerKind::DepthwiseConv)
    })
}

/// One fitted `depthwise_efficiency`: the architecture, its rows, the configs' value (1 when
/// absent), the fitted value, and the mean |log error| before and after.
pub struct DepthwiseFit {
    pub arch: String,
    pub rows: usize,
    pub now: f64,
    pub best: f64,
    pub before: f64,
    pub after: f64,
}

/// Each architecture's `depthwise_efficiency` (`configs/arch/*.yaml`) that minimises the mean
/// |log error| of `cases`' rows with depthwise convolutions on that architecture, by
/// golden-section search on ln(e) ∈ [ln 0.02, 0] with every other constant at its configs'
/// value. Only the architectures `cases` has such rows for are fitted.
pub fn fit_depthwise(cases: &[Case], iters: u32) -> Vec<DepthwiseFit> {
    let mut by_arch: BTreeMap<String, Vec<Case>> = BTreeMap::new();
    for c in cases.iter().filter(|c| has_depthwise(c)) {
        if let Ok(cl) = super::predict::cluster(c) {
            by_arch
                .entry(cl.gpu.arch.clone())
                .or_default()
                .push(c.clone());
        }
    }
    let mut out = Vec::new();
    for (arch, rows) in by_arch {
        let base = load_gpu_arch(&arch).expect("built-in architecture");
        let at = |ln_e: f64| {
            let mut spec = base.clone();
            spec.depthwise_efficiency = Some(ln_e.exp());
            let mut o = Overrides::default();
            o.arch.insert(arch.clone(), spec);
            log_loss(&rows, &o)
        };
        let now = base.depthwise_efficiency.unwrap_or(1.0);
        let before = at(now.ln());
        let best = golden_section(0.02f64.ln(), 0.0, iters, &at, |_, _, _| {}).exp();
        let after = at(best.ln());
        eprintln!("depthwise {arch}: {} rows, e {best:.4}", rows.len());
        out.push(DepthwiseFit {
            arch: arch.clone(),
            rows: rows.len(),
            now,
            best,
            before,
            after,
        });
    }
    out
}
