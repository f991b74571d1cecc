//! The kernel model's rates (`trainplan::cost::kernel`) against measured kernel times: GEMMs by
//! shape, and streaming (memory-bound) kernels.
//!
//! GEMMs: every dense matrix product DeepBench timed on a V100 (DGX-1, CUDA 10.1, 2019;
//! `experiments/kernel_rates/gemm_kernels.csv`, built by `experiments/kernel_rates/build.py`
//! from the cited workbook), FP32 on the CUDA cores and FP16 inputs with FP32 accumulation on
//! the tensor cores, predicted by the same kernel model `replay --model` prices a layer's products
//! with. Error = predicted / measured − 1, per precision and per size class (a product's FLOPs),
//! and the single large-GEMM efficiency (`gemm_efficiency` of `configs/arch/volta.yaml`) that
//! would make the model's mean log error zero on the large products — what the kernels say that
//! constant is, against what the whole-step fit made it.
//!
//! Convolutions: every forward convolution DeepBench timed on the same V100
//! (`experiments/kernel_rates/conv_kernels.csv`), priced as the model prices a layer's: the
//! implicit GEMM (M = N·P·Q, N = K, K = C·R·S) at the GEMM rate times `conv_efficiency`, in
//! DeepBench's layouts (`code/nvidia/conv_bench.cu`: NCHW in FP32, NHWC for FP16 on the tensor
//! cores, so no layout transposes). Reported, not used: `conv_efficiency` is fitted on steps.
//!
//! Streaming kernels: the element-wise kernels of a real V100 trace (ResNet-50, PyTorch 1.8's
//! profiler; `../shared/traces/pytorch-kineto/resnet50_v100_2021fmt_shapes_memory.json.gz`, which
//! records each operator's input shapes): every `aten::add`, `aten::add_` and
//! `aten::threshold_backward` kernel of two same-shape FP32 tensors of at least 2²² elements
//! (16 MiB: larger than the V100's 6 MB L2) moves 3 × 4 bytes per element; their median bandwidth
//! over the datasheet's is Volta's `memory_efficiency`. Skipped, saying so, without `../shared`.
//!
//! Run: `cargo run --release --example kernel_rates`
//!
//! Prints a Markdown report and writes it to `experiments/results/kernel_rates.md`, the rows to
//! `experiments/results/kernel_rates.csv`.

use std::fmt::Write as _;
use std::path::Path;

use trainplan::cost::config::{Dtype, GpuSpec, load_gpu};
use trainplan::cost::framework::Math;
use trainplan::cost::kernel::{BatchDim, Gemm, KernelModel, OpClass, OpWork};

const DATA: &str = "experiments/kernel_rates/gemm_kernels.csv";
const CONV_DATA: &str = "experiments/kernel_rates/conv_kernels.csv";
/// Products of at least this many FLOPs are "large": many waves of full tiles, where one
/// efficiency per unit should hold.
const LARGE_FLOPS: f64 = 2e10;
/// Products with a side this short are matrix-vector-like: bound by reading the other operand
/// and by the launch, not by the tensor cores.
const SKINNY: f64 = 128.0;
const V100_TRACE: &str =
    "../shared/traces/pytorch-kineto/resnet50_v100_2021fmt_shapes_memory.json.gz";
/// Streaming kernels at least this large (elements) run from DRAM, not from the L2.
const MIN_STREAM_ELEMS: f64 = 4_194_304.0;

#[derive(Debug, serde::Deserialize)]
struct Row {
    id: String,
    gpu: String,
    dtype: String,
    app: String,
    m: f64,
    n: f64,
    k: f64,
    transpose: String,
    ms: f64,
}

struct Done {
    row: Row,
    predicted_ms: f64,
}

impl Done {
    fn flops(&self) -> f64 {
        2.0 * self.row.m * self.row.n * self.row.k
    }
    fn err(&self) -> f64 {
        self.predicted_ms / self.row.ms - 1.0
    }
}

#[derive(Debug, serde::Deserialize)]
struct ConvRow {
    dtype: String,
    app: String,
    w: f64,
    h: f64,
    c: f64,
    n: f64,
    k: f64,
    s: f64,
    r: f64,
    pad_w: f64,
    pad_h: f64,
    stride_w: f64,
    stride_h: f64,
    forward_ms: f64,
}

/// DeepBench's layout: NHWC for FP16 on the tensor cores, NCHW otherwise.
fn conv_math(c: &ConvRow) -> Math {
    Math {
        channels_last: c.dtype == "fp16",
        ..Math::FP32
    }
}

fn conv_err(km: &KernelModel, c: &ConvRow) -> f64 {
    km.time_ns(&conv_work(c), dtype(&c.dtype), conv_math(c)) / 1e6 / c.forward_ms - 1.0
}

/// A forward convolution as the kernel model sees it: its implicit GEMM, input and output as
/// activations, the filters as the weight.
fn conv_work(c: &ConvRow) -> OpWork {
    let p = ((c.h + 2.0 * c.pad_h - c.r) / c.stride_h).floor() + 1.0;
    let q = ((c.w + 2.0 * c.pad_w - c.s) / c.stride_w).floor() + 1.0;
    let g = Gemm::new(c.n * p * q, c.k, c.c * c.r * c.s, 1.0, BatchDim::M);
    let act = c.n * c.c * c.h * c.w + c.n * c.k * p * q;
    let mut w = OpWork::new(OpClass::Conv, g.flops(), act, c.k * c.c * c.r * c.s, 1);
    w.gemms[0] = g;
    w
}

fn conv_section(md: &mut String, root: &Path) {
    let mut reader = csv::Reader::from_path(root.join(CONV_DATA)).expect(CONV_DATA);
    let rows: Vec<ConvRow> = reader
        .deserialize()
        .collect::<Result<_, _>>()
        .expect(CONV_DATA);
    let v100 = load_gpu("v100-16gb").expect("GPU config");
    let km = KernelModel::new(&v100);
    let _ = writeln!(
        md,
        "\n## Forward convolutions: DeepBench on the same V100 (FP32 in NCHW, FP16 in NHWC)\n\n\
         | convolutions | rows | mean abs error | mean signed | max abs |\n|---|---|---|---|---|"
    );
    for dt in ["fp32", "fp16"] {
        for (label, keep) in [
            ("all", (|_: &ConvRow| true) as fn(&ConvRow) -> bool),
            ("at least 8 input channels", |c: &ConvRow| c.c >= 8.0),
        ] {
            let errs: Vec<f64> = rows
                .iter()
                .filter(|c| c.dtype == dt && keep(c))
                .map(|c| conv_err(&km, c))
                .collect();
            let (mae, n) = mean(errs.iter().map(|e| e.abs()));
            let max = errs.iter().map(|e| e.abs()).fold(0.0, f64::max);
            let _ = writeln!(
                md,
                "| {dt}, {label} | {n} | {:.1} % | {:+.1} % | {:.1} % |",
                mae * 100.0,
                mean(errs.iter().copied()).0 * 100.0,
                max * 100.0
            );
        }
    }
    let by_app = |dt: &str, app: &str| {
        mean(
            rows.iter()
                .filter(|c| c.dtype == dt && c.app == app)
                .map(|c| conv_err(&km, c)),
        )
    };
    let _ = writeln!(
        md,
        "\n| application | fp32 mean signed | fp16 mean signed |\n|---|---|---|"
    );
    let mut apps: Vec<&str> = Vec::new();
    for c in &rows {
        if !apps.contains(&c.app.as_str()) {
            apps.push(&c.app);
        }
    }
    for app in apps {
        let (f32e, n) = by_app("fp32", app);
        let (f16e, _) = by_app("fp16", app);
        let _ = writeln!(
            md,
            "| {app} ({n} shapes) | {:+.1} % | {:+.1} % |",
            f32e * 100.0,
            f16e * 100.0
        );
    }
}

fn dtype(s: &str) -> Dtype {
    match s {
        "fp16" => Dtype::Fp16,
        "fp32" => Dtype::Fp32,
        other => panic!("{DATA}: unknown dtype {other}"),
    }
}

/// One product as the kernel model sees it: A (M×K) and C (M×N) are activations, B (K×N) the
/// weight; one kernel.
fn work(r: &Row) -> OpWork {
    let mut w = OpWork::new(
        OpClass::Gemm,
        2.0 * r.m * r.n * r.k,
        r.m * r.k + r.m * r.n,
        r.k * r.n,
        1,
    );
    w.gemms[0] = Gemm::new(r.m, r.n, r.k, 1.0, BatchDim::M);
    w
}

fn predict(gpu: &GpuSpec, r: &Row) -> f64 {
    let km = KernelModel::new(gpu);
    km.time_ns(&work(r), dtype(&r.dtype), Math::FP32) / 1e6
}

fn mean(v: impl Iterator<Item = f64>) -> (f64, usize) {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (if n == 0 { f64::NAN } else { s / n as f64 }, n)
}

fn summary(out: &mut String, label: &str, rows: &[&Done]) {
    let (mae, n) = mean(rows.iter().map(|d| d.err().abs()));
    let (signed, _) = mean(rows.iter().map(|d| d.err()));
    let max = rows.iter().map(|d| d.err().abs()).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "| {label} | {n} | {:.1} % | {:+.1} % | {:.1} % |",
        mae * 100.0,
        signed * 100.0,
        max * 100.0
    );
}

/// The large-GEMM efficiency at which the model's mean log error on `rows` is zero, found by
/// bisection on `gemm_efficiency` of the unit the rows run on (time falls as it rises).
fn implied_efficiency(gpu: &GpuSpec, rows: &[&Done], tensor_core: bool) -> f64 {
    let log_err = |e: f64| {
        let mut g = gpu.clone();
        if tensor_core {
            g.kernels.gemm_efficiency.tensor_core = e;
        } else {
            g.kernels.gemm_efficiency.cuda_core = e;
        }
        mean(rows.iter().map(|d| (predict(&g, &d.row) / d.row.ms).ln())).0
    };
    let (mut lo, mut hi) = (0.05, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if log_err(mid) > 0.0 {
            lo = mid
        } else {
            hi = mid
        }
    }
    0.5 * (lo + hi)
}

/// Achieved bandwidths (GB/s) of the two-input, same-shape FP32 element-wise kernels of the
/// trace at `path`: (operator, GB/s) per kernel.
fn streaming_rates(path: &Path) -> Result<Vec<(String, f64)>, String> {
    // Through the project's guarded opener: a regular file within the trace size caps, the
    // decompressed stream capped too.
    let kind = trainplan::limits::InputKind::KinetoTrace;
    let file =
        trainplan::input::open(path, kind).map_err(|e| format!("{}: {e}", path.display()))?;
    let gz = trainplan::input::decompressed(flate2::read::GzDecoder::new(file), kind);
    let trace: serde_json::Value =
        serde_json::from_reader(gz).map_err(|e| format!("{}: {e}", path.display()))?;
    let events = trace["traceEvents"].as_array().ok_or("no traceEvents")?;
    let mut ops = std::collections::HashMap::new();
    for e in events.iter().filter(|e| e["cat"] == "Operator") {
        if let Some(id) = e["args"]["External id"].as_i64() {
            ops.insert(id, e);
        }
    }
    let mut out = Vec::new();
    for k in events.iter().filter(|e| e["cat"] == "Kernel") {
        let Some(op) = k["args"]["external id"]
            .as_i64()
            .and_then(|id| ops.get(&id))
        else {
            continue;
        };
        let name = op["name"].as_str().unwrap_or("");
        if !["aten::add", "aten::add_", "aten::threshold_backward"].contains(&name) {
            continue;
        }
        let dims = &op["args"]["Input Dims"];
        let types = &op["args"]["Input type"];
        if dims[0] != dims[1] || types[0] != "float" || types[1] != "float" {
            continue;
        }
        let elems: f64 = dims[0]
            .as_array()
            .map(|d| d.iter().filter_map(|x| x.as_f64()).product())
            .unwrap_or(0.0);
        let dur_us = k["dur"].as_f64().unwrap_or(0.0);
        if elems < MIN_STREAM_ELEMS || dur_us <= 0.0 {
            continue;
        }
        out.push((name.to_string(), 3.0 * 4.0 * elems / (dur_us * 1e3)));
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn streaming_section(md: &mut String, root: &Path, v100: &GpuSpec) {
    let path = root.join(V100_TRACE);
    let _ = writeln!(md, "\n## Streaming kernels on a V100 (`{V100_TRACE}`)\n");
    if !path.exists() {
        let _ = writeln!(
            md,
            "skipped: {} is not there (../shared beside the clone).",
            path.display()
        );
        return;
    }
    let rates = match streaming_rates(&path) {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => {
            let _ = writeln!(md, "no kernel of the kind in {}", path.display());
            return;
        }
        Err(e) => {
            let _ = writeln!(md, "could not read the trace: {e}");
            return;
        }
    };
    let _ = writeln!(
        md,
        "| operator | kernels | median GB/s | of {:.0} GB/s |",
        v100.memory_gbps
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for op in ["aten::add", "aten::add_", "aten::threshold_backward"] {
        let v: Vec<f64> = rates.iter().filter(|r| r.0 == op).map(|r| r.1).collect();
        if !v.is_empty() {
            let (n, m) = (v.len(), median(v));
            let _ = writeln!(md, "| {op} | {n} | {m:.0} | {:.3} |", m / v100.memory_gbps);
        }
    }
    let all = median(rates.iter().map(|r| r.1).collect());
    let _ = writeln!(
        md,
        "| all | {} | {all:.0} | {:.3} |\n\n- the median implies `memory_efficiency` = {:.3} (configured: {:.3}).",
        rates.len(),
        all / v100.memory_gbps,
        all / v100.memory_gbps,
        v100.kernels.memory_efficiency
    );
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut reader = csv::Reader::from_path(root.join(DATA)).expect(DATA);
    let mut done = Vec::new();
    for r in reader.deserialize::<Row>() {
        let row = r.expect(DATA);
        let gpu = load_gpu(&row.gpu).expect("GPU config");
        let predicted_ms = predict(&gpu, &row);
        done.push(Done { row, predicted_ms });
    }
    let v100 = load_gpu("v100-16gb").expect("GPU config");
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Kernel rates: the kernel model against measured kernels\n\n## GEMMs: DeepBench on a V100 (DGX-1, CUDA 10.1)\n\n\
         `cargo run --release --example kernel_rates`; error = predicted / measured − 1; \
         large = at least {:.0} GFLOP per product.\n",
        LARGE_FLOPS / 1e9
    );
    let _ = writeln!(
        md,
        "| products | rows | mean abs error | mean signed | max abs |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (dt, unit) in [("fp16", "tensor cores"), ("fp32", "CUDA cores")] {
        let all: Vec<&Done> = done.iter().filter(|d| d.row.dtype == dt).collect();
        let class = |f: fn(&Done) -> bool| all.iter().copied().filter(|d| f(d)).collect::<Vec<_>>();
        summary(&mut md, &format!("{dt} ({unit}), all"), &all);
        summary(
            &mut md,
            &format!("{dt} ({unit}), large"),
            &class(|d| d.flops() >= LARGE_FLOPS),
        );
        summary(
            &mut md,
            &format!("{dt} ({unit}), skinny (M or N ≤ {SKINNY})"),
            &class(|d| d.flops() < LARGE_FLOPS && d.row.m.min(d.row.n) <= SKINNY),
        );
        summary(
            &mut md,
            &format!("{dt} ({unit}), the rest"),
            &class(|d| d.flops() < LARGE_FLOPS && d.row.m.min(d.row.n) > SKINNY),
        );
    }
    let _ = writeln!(md);
    for (dt, tc) in [("fp16", true), ("fp32", false)] {
        let large: Vec<&Done> = done
            .iter()
            .filter(|d| d.row.dtype == dt && d.flops() >= LARGE_FLOPS)
            .collect();
        let configured = if tc {
            v100.kernels.gemm_efficiency.tensor_core
        } else {
            v100.kernels.gemm_efficiency.cuda_core
        };
        let _ = writeln!(
            md,
            "- {dt}: the large products imply `gemm_efficiency.{}` = {:.3} (configured: {configured:.3}).",
            if tc { "tensor_core" } else { "cuda_core" },
            implied_efficiency(&v100, &large, tc)
        );
    }
    conv_section(&mut md, root);
    streaming_section(&mut md, root, &v100);
    print!("{md}");
    let _ = writeln!(
        md,
        "\n## Every product\n\n| id | app | dtype | M | N | K | op | measured ms | predicted ms | error | measured TFLOP/s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mut csv_out = String::from("id,dtype,m,n,k,transpose,measured_ms,predicted_ms,error_pct\n");
    for d in &done {
        let r = &d.row;
        let shape = [
            r.id.clone(),
            r.dtype.clone(),
            r.m.to_string(),
            r.n.to_string(),
            r.k.to_string(),
            r.transpose.clone(),
            r.ms.to_string(),
        ];
        let (pred, err) = (d.predicted_ms, d.err() * 100.0);
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:+.1} % | {:.1} |",
            [&shape[..1], std::slice::from_ref(&r.app), &shape[1..]]
                .concat()
                .join(" | "),
            pred,
            err,
            d.flops() / (r.ms * 1e9)
        );
        let _ = writeln!(csv_out, "{},{pred:.5},{err:.2}", shape.join(","));
    }
    let results = root.join("experiments/results");
    std::fs::write(results.join("kernel_rates.md"), &md).expect("write report");
    std::fs::write(results.join("kernel_rates.csv"), csv_out).expect("write rows");
}
