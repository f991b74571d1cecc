//! `trainplan lower-bound MODEL.onnx`: Benanza's lower-bound latency of an ONNX model on a GPU,
//! with the fused and tensor-core variants and the Q1–Q6 analyses (`crate::lowerbound`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{CliError, write_atomic};
use crate::cost::config::{self, Dtype};
use crate::lowerbound::report::{self, Measurement, dtype_name};
use crate::lowerbound::{Analysis, PerfDb};
use crate::onnx::{self, InferOptions};

/// The dtype a model runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

impl From<DtypeArg> for Dtype {
    fn from(d: DtypeArg) -> Dtype {
        match d {
            DtypeArg::Fp32 => Dtype::Fp32,
            DtypeArg::Tf32 => Dtype::Tf32,
            DtypeArg::Fp16 => Dtype::Fp16,
            DtypeArg::Bf16 => Dtype::Bf16,
        }
    }
}

#[derive(Debug, Args)]
pub struct LowerBoundArgs {
    /// The ONNX model (weights may be absent: only their dims are read).
    #[arg(value_name = "MODEL.onnx")]
    pub model: PathBuf,
    /// GPU: a built-in name (v100-32gb, a100-80gb, h100-sxm, h200, mi300x) or a GPU YAML file,
    /// e.g. one `trainplan calibrate` wrote.
    #[arg(long, default_value = "v100-32gb", value_name = "NAME|FILE")]
    pub gpu: String,
    /// Batch size: dim 0 of every graph input (needed when the model's batch dim is symbolic;
    /// overrides a fixed one).
    #[arg(long, value_name = "N")]
    pub batch: Option<i64>,
    /// Size of another symbolic input dim, NAME=N (repeatable), e.g. --dim sequence=128.
    #[arg(long = "dim", value_name = "NAME=N")]
    pub dim: Vec<String>,
    /// The dtype the model runs in (tf32: fp32 storage, TF32 tensor-core math).
    #[arg(long, value_enum, default_value = "fp32")]
    pub dtype: DtypeArg,
    /// Performance database (JSON, versioned): read when it exists; the analytic entries of this
    /// model's layers are added and the file is written back atomically. Measured entries in it
    /// take precedence over analytic ones.
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Measure each unique layer (and fused group) on this machine's GPU and store the results in
    /// --db (needs a build with `--features gpu`).
    #[arg(long, requires = "db")]
    pub measure: bool,
    /// Measured latency of one forward pass of this model at this batch size and dtype, ms.
    #[arg(long, value_name = "MS", conflicts_with = "trace")]
    pub measured_ms: Option<f64>,
    /// A PyTorch profiler (Kineto) trace of the same model: its step time is the measured latency,
    /// its kernels answer Q2, Q4 and Q6.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The trace's step (ProfilerStep#N; default: the last complete one).
    #[arg(long, value_name = "N", requires = "trace")]
    pub step: Option<u64>,
    /// Rows of the top-layers table.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Print one JSON object on stdout instead of the report.
    #[arg(long)]
    pub json: bool,
}

fn parse_dims(list: &[String]) -> Result<BTreeMap<String, i64>, CliError> {
    let mut m = BTreeMap::new();
    for d in list {
        let (k, v) = d
            .split_once('=')
            .ok_or_else(|| CliError::usage(format!("--dim {d}: expected NAME=N")))?;
        let v: i64 = v
            .trim()
            .parse()
            .map_err(|_| CliError::usage(format!("--dim {d}: N must be an integer")))?;
        // Like --batch: a value that parses but makes an impossible model is bad input.
        if v < 1 {
            return Err(CliError::bad_input(format!(
                "--dim {d}: must be between 1 and {}, got {v}",
                i64::MAX
            )));
        }
        m.insert(k.trim().to_string(), v);
    }
    Ok(m)
}

/// Fill the database with measurements of this model's layers on the local GPU.
#[cfg(feature = "gpu")]
fn measure(
    g: &onnx::Graph,
    gpu: &str,
    dtypes: &[Dtype],
    db: &mut PerfDb,
) -> Result<usize, CliError> {
    crate::calibrate::cuda::measure_layers(g, gpu, dtypes, db).map_err(CliError::bad_input)
}

#[cfg(not(feature = "gpu"))]
fn measure(
    _g: &onnx::Graph,
    _gpu: &str,
    _dtypes: &[Dtype],
    _db: &mut PerfDb,
) -> Result<usize, CliError> {
    Err(CliError::bad_input(crate::calibrate::NO_GPU_FEATURE))
}

/// `trainplan lower-bound`.
pub fn lower_bound_cmd(a: &LowerBoundArgs) -> Result<(), CliError> {
    // A latency beyond a worker's physical bound (2^62 ns, `graph::bounds`) is not a
    // measurement: its ratios to the bound would print as infinities.
    let max_ms = crate::graph::bounds::MAX_SUM_NS as f64 / 1e6;
    if let Some(m) = a.measured_ms
        && !(m.is_finite() && m > 0.0 && m <= max_ms)
    {
        return Err(CliError::usage(format!(
            "--measured-ms must be a positive number of milliseconds up to {max_ms:e}, got {m:e}"
        )));
    }
    // The same code and message as the zoo's `--batch 0` (bad input: an impossible model).
    if let Some(b) = a.batch.filter(|&b| b < 1) {
        return Err(CliError::bad_input(format!(
            "batch must be at least 1, got {b}"
        )));
    }
    let opts = InferOptions {
        batch: a.batch,
        dims: parse_dims(&a.dim)?,
    };
    let gpu = config::load_gpu(&a.gpu).map_err(CliError::bad_input)?;
    let graph = onnx::load(&a.model, &opts).map_err(CliError::bad_input)?;
    for w in &graph.warnings {
        tracing::warn!("{w}");
    }
    let mut db = match &a.db {
        Some(p) => PerfDb::open(p).map_err(CliError::bad_input)?,
        None => PerfDb::new(),
    };
    let dtype: Dtype = a.dtype.into();
    if a.measure {
        let mut dtypes = vec![dtype];
        dtypes.extend(crate::lowerbound::tensor_core_dtype(&gpu, dtype));
        let n = measure(&graph, &gpu.name, &dtypes, &mut db)?;
        tracing::info!("measured {n} layers on the GPU");
    }
    let analysis = Analysis::new(&graph, &gpu, dtype, &mut db);
    if let Some(p) = &a.db {
        // The database is read and written back on purpose; the model or the trace may not be
        // replaced by it (the trace is read later: named here).
        let mut named: Vec<(&str, &std::path::Path)> = vec![("the ONNX model", &a.model)];
        if let Some(t) = &a.trace {
            named.push(("the --trace", t));
        }
        super::distinct::check(&[super::distinct::Output::new("--db", p)], &named, &[p])?;
        let text = db.to_json();
        write_atomic(p, |w| w.write_all(text.as_bytes()))
            .map_err(|e| CliError::output(format!("{}: failed to write: {e}", p.display())))?;
    }
    let measurement = match (&a.trace, a.measured_ms) {
        (Some(path), _) => {
            let name = path.display().to_string();
            let trace = crate::trace::read_kineto(path).map_err(CliError::bad_input)?;
            let w = crate::trace::graph::pick_step(&trace, &name, a.step)
                .map_err(CliError::bad_input)?;
            let t = report::trace_stats(&trace, &w, &name);
            Some(Measurement {
                ms: t.step_ms,
                source: format!("{name} {}", t.step),
                trace: Some(t),
            })
        }
        (None, Some(ms)) => Some(Measurement {
            ms,
            source: "--measured-ms".into(),
            trace: None,
        }),
        (None, None) => None,
    };
    let answers = report::answers(&analysis, measurement.as_ref());
    let mut o = super::output::stdout();
    if a.json {
        let v = to_json(a, &analysis, measurement.as_ref(), &answers, &db, &graph);
        writeln!(o, "{v}").map_err(CliError::stdout)?;
        return Ok(());
    }
    human(&mut o, a, &analysis, &graph, &answers).map_err(CliError::stdout)
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn to_json(
    a: &LowerBoundArgs,
    an: &Analysis,
    m: Option<&Measurement>,
    answers: &[report::Answer],
    db: &PerfDb,
    g: &onnx::Graph,
) -> serde_json::Value {
    let b = &an.bounds;
    let (k_unfused, k_fused) = an.kernels();
    let tc = an.tensor_core.as_ref();
    let by_op: BTreeMap<String, serde_json::Value> = an
        .by_op_type()
        .into_iter()
        .map(|(k, s)| {
            (
                k,
                json!({"layers": s.layers, "ms": round(s.ms), "flops": s.flops}),
            )
        })
        .collect();
    let top: Vec<_> = an
        .unique_rows()
        .into_iter()
        .take(a.top)
        .map(|r| {
            json!({"name": r.name, "op_type": r.op_type, "count": r.count,
                   "ms_each": round(r.ms_each), "ms_total": round(r.ms_total), "key": r.key})
        })
        .collect();
    let fusion: Vec<_> = an
        .fusion_rows()
        .into_iter()
        .map(|r| {
            json!({"pattern": r.pattern, "groups": r.groups, "layers": r.layers,
                   "unfused_ms": round(r.unfused_ms), "fused_ms": round(r.fused_ms)})
        })
        .collect();
    json!({
        "model": g.file,
        "gpu": an.gpu,
        "dtype": dtype_name(an.dtype),
        "batch": an.batch,
        "sequential_ms": round(b.sequential_ms),
        "parallel_ms": round(b.parallel_ms),
        "layers": an.layers.len(),
        "unique_layers": an.unique_layers(),
        "fused_sequential_ms": round(b.fused_sequential_ms),
        "fused_parallel_ms": round(b.fused_parallel_ms),
        "tensor_core_dtype": tc.map(|(c, _)| dtype_name(c.dtype)),
        "tensor_core_ms": tc.map(|(_, t)| round(t.sequential_ms)),
        "tensor_core_parallel_ms": tc.map(|(_, t)| round(t.parallel_ms)),
        "tensor_core_fused_ms": tc.map(|(_, t)| round(t.fused_sequential_ms)),
        "gflops": an.flops() / 1e9,
        "kernels": k_unfused,
        "fused_kernels": k_fused,
        "fused_groups": an.fused.len(),
        "fusion": fusion,
        "critical_path_layers": an.critical_path.len(),
        "by_op_type": by_op,
        "top_layers": top,
        "measured_ms": m.map(|m| m.ms),
        "measured_source": m.map(|m| m.source.clone()),
        "ratio": report::ratio(an, m),
        "trace": m.and_then(|m| m.trace.as_ref()),
        "answers": answers,
        "db": a.db.as_ref().map(|p| p.display().to_string()),
        "db_entries": db.len(),
        "measured_layers": an.costs.measured_layers,
    })
}

fn human(
    o: &mut dyn Write,
    a: &LowerBoundArgs,
    an: &Analysis,
    g: &onnx::Graph,
    answers: &[report::Answer],
) -> std::io::Result<()> {
    let b = &an.bounds;
    writeln!(
        o,
        "{} on {} ({}, batch {}): {} layers, {} unique, {:.2} GFLOP per forward pass",
        g.file,
        an.gpu,
        dtype_name(an.dtype),
        an.batch,
        an.layers.len(),
        an.unique_layers(),
        an.flops() / 1e9
    )?;
    writeln!(o)?;
    writeln!(o, "lower bound                 sequential      parallel")?;
    let row = |o: &mut dyn Write, name: &str, s: f64, p: f64| {
        writeln!(
            o,
            "{name:<24} {:>13} {:>13}",
            super::output::dur_ms(s, 3),
            super::output::dur_ms(p, 3)
        )
    };
    row(o, "layer by layer", b.sequential_ms, b.parallel_ms)?;
    row(o, "fused", b.fused_sequential_ms, b.fused_parallel_ms)?;
    if let Some((c, t)) = &an.tensor_core {
        row(
            o,
            &format!("{} tensor cores", dtype_name(c.dtype)),
            t.sequential_ms,
            t.parallel_ms,
        )?;
        row(
            o,
            &format!("{} cores, fused", dtype_name(c.dtype)),
            t.fused_sequential_ms,
            t.fused_parallel_ms,
        )?;
    }
    writeln!(o)?;
    writeln!(o, "top layers by bound time (sequential, layer by layer):")?;
    writeln!(
        o,
        "{:>10} {:>6} {:>10} {:>6}  {:<20} first layer",
        "ms total", "count", "ms each", "share", "op"
    )?;
    for r in an.unique_rows().into_iter().take(a.top) {
        writeln!(
            o,
            "{:>10.3} {:>6} {:>10.4} {:>5.1}%  {:<20} {}",
            r.ms_total,
            r.count,
            r.ms_each,
            100.0 * r.ms_total / b.sequential_ms.max(f64::MIN_POSITIVE),
            r.op_type,
            r.name
        )?;
    }
    writeln!(o)?;
    let mut ops: Vec<_> = an.by_op_type().into_iter().collect();
    ops.sort_by(|x, y| y.1.ms.total_cmp(&x.1.ms));
    let list: Vec<String> = ops
        .iter()
        .filter(|(_, s)| s.ms > 0.0)
        .map(|(k, s)| {
            format!(
                "{k} {:.1} % ({})",
                100.0 * s.ms / b.sequential_ms.max(f64::MIN_POSITIVE),
                s.layers
            )
        })
        .collect();
    writeln!(o, "by op type: {}", list.join(", "))?;
    writeln!(o)?;
    for ans in answers {
        writeln!(o, "{} {}\n   {}", ans.id, ans.question, ans.answer)?;
    }
    if let Some(p) = &a.db {
        writeln!(o, "\nperformance database: {}", p.display())?;
    }
    Ok(())
}
