//! Kineto import speed and memory on a ~300 MB trace (DESIGN.md target: < 5 s, peak memory under
//! 2× the file's size).
//!
//! Two inputs, written to temporary files:
//! * `synthetic`: a generated DDP-style trace that looks like a real one (ProfilerStep spans,
//!   nested `cpu_op`s, `cuda_runtime` launches with correlation ids, kernels with Kineto's arg dicts
//!   on a compute stream, NCCL kernels with their collective args on a comm stream, `ac2g` and
//!   `fwdbwd` flows, memcpys and memsets, a backward thread), repeated step after step; and the
//!   same with `Input Dims` / `Input type` on every CPU op, as `record_shapes=True` writes them;
//! * `resnet50-ddp x N`: when `../shared/traces` exists, the steps of
//!   `pytorch-kineto/resnet50_ddp_a100_rank0of2.json.gz` replicated with shifted timestamps and ids.
//!
//! For each: `read_kineto` (wall time, best of `BENCH_RUNS`, default 3), the peak resident memory
//! of the import measured in a child process (this binary re-executed with `--child-import FILE`,
//! which reports its `VmHWM` from `/proc/self/status` minus its resident size before the import,
//! and the import's CPU time from `/proc/self/schedstat`, which other jobs on a shared machine do
//! not inflate), the same for the gzipped file, and `trace::graph::build_job` on the last complete
//! step.
//!
//! Run: `cargo bench --bench kineto_import` (`KINETO_BENCH_MB=300` sets the size, `BENCH_RUNS`
//! the runs, `KINETO_BENCH_DIR` a folder where the generated traces are kept).

mod common;

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{best_of, report};
use trainplan::trace::graph::build_job;
use trainplan::trace::read_kineto;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-import") {
        child_import(Path::new(&args[i + 1]));
        return;
    }
    let mb: u64 = env_or("KINETO_BENCH_MB", 300);
    let runs: usize = env_or("BENCH_RUNS", 3);
    // KINETO_BENCH_DIR keeps the generated files there (for profiling: `perf record <this binary>
    // --child-import FILE`).
    let keep = std::env::var_os("KINETO_BENCH_DIR").map(PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("trainplan-bench-kineto-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).expect("temp dir");

    let mut inputs = Vec::new();
    // A kept file of the right size is reused.
    let have =
        |p: &Path| keep.is_some() && std::fs::metadata(p).is_ok_and(|m| m.len() / 1_000_000 == mb);
    let synth = dir.join("synthetic.json");
    if !have(&synth) {
        write_synthetic(&synth, mb * 1_000_000, false);
    }
    inputs.push(("synthetic".to_string(), synth));
    let shapes = dir.join("synthetic_shapes.json");
    if !have(&shapes) {
        write_synthetic(&shapes, mb * 1_000_000, true);
    }
    inputs.push(("synthetic, record_shapes".to_string(), shapes));
    let real = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces/pytorch-kineto/resnet50_ddp_a100_rank0of2.json.gz");
    if real.is_file() {
        let p = dir.join("resnet50_ddp_replicated.json");
        if !have(&p) {
            write_replicated(&real, &p, mb * 1_000_000);
        }
        inputs.push(("resnet50-ddp replicated".to_string(), p));
    } else {
        eprintln!("../shared/traces is absent: only the synthetic trace is measured");
    }

    for (label, path) in &inputs {
        let bytes = std::fs::metadata(path).expect("written").len();
        let (t, trace) = best_of(runs, || read_kineto(path).expect("import"));
        report(
            &format!("{label}: read_kineto"),
            t.as_secs_f64(),
            "s",
            &format!(
                "{:.0} MB, {} events, {:.0} MB/s",
                bytes as f64 / 1e6,
                trace.events.len(),
                bytes as f64 / 1e6 / t.as_secs_f64()
            ),
        );
        let (bt, job) = best_of(runs, || build_job(&trace, label, None).expect("job"));
        report(
            &format!("{label}: build_job (one step)"),
            bt.as_secs_f64() * 1e3,
            "ms",
            &format!("{}, {} ops", job.window.label, job.job.local.ops.len()),
        );
        drop((trace, job));
        let (peak, cpu) = child_peak(path);
        report(
            &format!("{label}: import peak memory"),
            peak as f64 / 1e6,
            "MB",
            &format!(
                "{:.2}x the file; that import's CPU time {:.2} s",
                peak as f64 / bytes as f64,
                cpu as f64 / 1e9
            ),
        );

        let gz = path.with_extension("json.gz");
        gzip_file(path, &gz);
        let gz_bytes = std::fs::metadata(&gz).expect("written").len();
        let (t, _) = best_of(runs, || read_kineto(&gz).expect("import gz"));
        report(
            &format!("{label}.gz: read_kineto"),
            t.as_secs_f64(),
            "s",
            &format!(
                "{:.0} MB compressed, {:.0} MB/s of JSON",
                gz_bytes as f64 / 1e6,
                bytes as f64 / 1e6 / t.as_secs_f64()
            ),
        );
        let (peak, cpu) = child_peak(&gz);
        report(
            &format!("{label}.gz: import peak memory"),
            peak as f64 / 1e6,
            "MB",
            &format!(
                "{:.2}x the decompressed size; CPU time {:.2} s",
                peak as f64 / bytes as f64,
                cpu as f64 / 1e9
            ),
        );
        if keep.is_none() {
            let _ = std::fs::remove_file(&gz);
        }
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// ---- memory ---------------------------------------------------------------------------------

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux only)");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// CPU time this process has run, ns (`/proc/self/schedstat`): unlike wall time, not inflated
/// by other jobs on the machine.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The child: import once, keep the result alive, print the peak resident growth in bytes and
/// the import's CPU time in ns.
fn child_import(path: &Path) {
    let before = status_bytes("VmRSS");
    let cpu = cpu_ns();
    let trace = read_kineto(path).expect("import");
    let cpu = cpu_ns() - cpu;
    let peak = status_bytes("VmHWM");
    std::hint::black_box(&trace);
    println!("{} {cpu}", peak.saturating_sub(before));
}

/// Peak resident growth (bytes) and CPU time (ns) of one import in a fresh process.
fn child_peak(path: &PathBuf) -> (u64, u64) {
    let out = Command::new(std::env::current_exe().expect("own path"))
        .arg("--child-import")
        .arg(path)
        .output()
        .expect("re-run the bench as a child");
    assert!(
        out.status.success(),
        "child: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = text
        .split_whitespace()
        .map(|x| x.parse().expect("child prints numbers"));
    (v.next().expect("bytes"), v.next().expect("cpu ns"))
}

fn gzip_file(src: &Path, dst: &Path) {
    let mut r = std::io::BufReader::new(std::fs::File::open(src).expect("open"));
    let f = std::fs::File::create(dst).expect("create");
    let mut w = flate2::write::GzEncoder::new(BufWriter::new(f), flate2::Compression::fast());
    std::io::copy(&mut r, &mut w).expect("gzip");
    w.finish().expect("gzip").flush().expect("flush");
}

// ---- the replicated real trace --------------------------------------------------------------

/// Writes the resnet50 DDP trace's events again and again (timestamps shifted by the trace's span,
/// correlation / External ids / flow ids by 10^7 per copy, ProfilerStep numbers by 3) until the
/// file reaches `target` bytes. Metadata events are written once. Returns the number of copies.
fn write_replicated(src: &Path, dst: &Path, target: u64) -> usize {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(src).expect("open"));
    let mut doc: serde_json::Value = serde_json::from_reader(std::io::BufReader::new(gz)).unwrap();
    let events = doc["traceEvents"].as_array().cloned().unwrap_or_default();
    doc.as_object_mut().unwrap().remove("traceEvents");
    let ts = |e: &serde_json::Value| e["ts"].as_f64();
    let lo = events.iter().filter_map(ts).fold(f64::MAX, f64::min);
    let hi = events
        .iter()
        .filter_map(|e| Some(ts(e)? + e["dur"].as_f64().unwrap_or(0.0)))
        .fold(f64::MIN, f64::max);
    let shift = (hi - lo + 1000.0).ceil();
    let f = std::fs::File::create(dst).expect("create");
    let mut w = CountingWriter(BufWriter::with_capacity(1 << 20, f), 0);
    w.write_all(b"{\n  \"traceEvents\": [\n").unwrap();
    let mut copies = 0;
    let mut first = true;
    while w.1 < target {
        for e in &events {
            if copies > 0 && e["ph"] == "M" {
                continue;
            }
            let mut e = e.clone();
            if let Some(t) = ts(&e) {
                let v = ((t + shift * copies as f64) * 1000.0).round() / 1000.0;
                e["ts"] = serde_json::json!(v);
            }
            let off = copies as i64 * 10_000_000;
            if let Some(id) = e["id"].as_i64() {
                e["id"] = (id + off).into();
            }
            if let Some(args) = e["args"].as_object_mut() {
                for k in ["External id", "correlation"] {
                    if let Some(v) = args.get(k).and_then(|v| v.as_i64()) {
                        args.insert(k.into(), (v + off).into());
                    }
                }
            }
            if let Some(n) = e["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("ProfilerStep#"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                e["name"] = format!("ProfilerStep#{}", n + 3 * copies as u64).into();
            }
            if !first {
                w.write_all(b",\n").unwrap();
            }
            first = false;
            serde_json::to_writer(&mut w, &e).unwrap();
        }
        copies += 1;
    }
    w.write_all(b"\n  ],\n").unwrap();
    let rest = serde_json::to_string_pretty(&doc).unwrap();
    w.write_all(rest.trim_start_matches('{').as_bytes())
        .unwrap();
    w.0.flush().unwrap();
    copies
}

struct CountingWriter<W>(W, u64);

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(b)?;
        self.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

// ---- the synthetic trace --------------------------------------------------------------------

const PID: u32 = 2_910_249;
const MAIN: u32 = 2_910_249;
const BW: u32 = 2_919_752;
const COMPUTE: u32 = 7;
const COMM: u32 = 40;

const CONV_KERNELS: [&str; 3] = [
    "void cudnn::cnn::implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)",
    "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
    "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
];
const BN_KERNEL: &str = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)";
const RELU_KERNEL: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)";
const BW_KERNELS: [&str; 3] = [
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, float, float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float*, float*, float const*, float const*, float)",
    "sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize64x64x8_stage3_warpsize1x2x1_g1_tensor16x8x8_kernel",
    "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x8_stage3_warpsize2x2x1_g1_tensor16x8x8_kernel",
];
const NCCL_KERNEL: &str =
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)";
const ADAM_KERNEL: &str = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 3, 2, 2>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 3, 2, 2>, std::plus<float>, float)";

/// State of the generator: clocks in ns, ids, the output.
struct Synth {
    out: String,
    first: bool,
    rng: u64,
    cpu_ns: u64,
    bw_ns: u64,
    stream_free: [u64; 2],
    corr: u64,
    ext: u64,
    seq: u64,
    flow: u64,
    /// Write `Input Dims` / `Input type` on CPU ops (`record_shapes=True`).
    shapes: bool,
}

fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

impl Synth {
    fn rand(&mut self, lo: u64, hi: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        lo + self.rng % (hi - lo + 1)
    }

    fn sep(&mut self) {
        if !self.first {
            self.out.push_str(",\n");
        }
        self.first = false;
    }

    #[allow(clippy::too_many_arguments)]
    fn x(&mut self, cat: &str, name: &str, pid: u32, tid: u32, ts: u64, dur: u64, args: &str) {
        self.sep();
        let _ = write!(
            self.out,
            "  {{\n    \"ph\": \"X\", \"cat\": \"{cat}\", \"name\": \"{name}\", \"pid\": {pid}, \"tid\": {tid},\n    \"ts\": {}, \"dur\": {},\n    \"args\": {{\n      {args}\n    }}\n  }}",
            us(ts),
            us(dur)
        );
    }

    fn flow(&mut self, ph: char, cat: &str, id: u64, pid: u32, tid: u32, ts: u64) {
        self.sep();
        let bp = if ph == 'f' { ", \"bp\": \"e\"" } else { "" };
        let _ = write!(
            self.out,
            "  {{\n    \"ph\": \"{ph}\", \"id\": {id}, \"pid\": {pid}, \"tid\": {tid}, \"ts\": {}, \"cat\": \"{cat}\", \"name\": \"{cat}\"{bp}\n  }}",
            us(ts)
        );
    }

    /// A CPU op on `tid` at its clock, with `inner` nested inside (run by the closure).
    fn cpu_op(&mut self, tid: u32, name: &str, inner: impl FnOnce(&mut Self)) {
        let start = self.clock(tid);
        let d = self.rand(3_000, 9_000);
        self.advance(tid, d);
        inner(self);
        let d = self.rand(1_000, 4_000);
        self.advance(tid, d);
        let end = self.clock(tid);
        self.ext += 1;
        self.seq += 1;
        let shapes = if self.shapes {
            "\"Input Dims\": [[32, 256, 56, 56], [256], [256], [256], [256], [], [], [], []], \"Input type\": [\"float\", \"float\", \"float\", \"float\", \"float\", \"Scalar\", \"Scalar\", \"Scalar\", \"Scalar\"],\n      "
        } else {
            ""
        };
        let args = format!(
            "{shapes}\"External id\": {},\"Record function id\": 0, \"Sequence number\": {}, \"Fwd thread id\": 0, \"Ev Idx\": {}",
            self.ext,
            self.seq,
            self.ext % 5000
        );
        self.x("cpu_op", name, PID, tid, start, end - start, &args);
    }

    fn clock(&self, tid: u32) -> u64 {
        if tid == BW { self.bw_ns } else { self.cpu_ns }
    }

    fn advance(&mut self, tid: u32, ns: u64) {
        if tid == BW {
            self.bw_ns += ns;
        } else {
            self.cpu_ns += ns;
        }
    }

    /// `cudaLaunchKernel` (or another runtime call) on `tid` launching `kernel` on `stream`.
    fn launch(&mut self, tid: u32, call: &str, cat: &str, kernel: &str, stream: u32, extra: &str) {
        self.corr += 1;
        let corr = self.corr;
        let ts = self.clock(tid);
        let dur = self.rand(4_000, 12_000);
        self.x(
            "cuda_runtime",
            call,
            PID,
            tid,
            ts,
            dur,
            &format!(
                "\"External id\": {}, \"cbid\": 211, \"correlation\": {corr}",
                self.ext + 1
            ),
        );
        let s = usize::from(stream == COMM);
        let start = self.stream_free[s].max(ts + self.rand(5_000, 20_000));
        let kdur = if stream == COMM {
            self.rand(200_000, 900_000)
        } else {
            self.rand(8_000, 160_000)
        };
        self.stream_free[s] = start + kdur;
        let args = if cat == "kernel" {
            format!(
                "\"External id\": {}, \"queued\": 0, \"device\": 0, \"context\": 1, \"stream\": {stream}, \"correlation\": {corr}, \"registers per thread\": {}, \"shared memory\": {}, \"blocks per SM\": 4.740741, \"warps per SM\": 75.851852, \"grid\": [{}, 1, 1], \"block\": [512, 1, 1], \"est. achieved occupancy %\": 100{extra}",
                self.ext + 1,
                self.rand(16, 255),
                self.rand(0, 49_152),
                self.rand(1, 4096)
            )
        } else {
            format!(
                "\"External id\": {}, \"device\": 0, \"context\": 1, \"stream\": {stream}, \"correlation\": {corr}, \"bytes\": {}, \"memory bandwidth (GB/s)\": 1268.4387096774194",
                self.ext + 1,
                self.rand(4, 1 << 24)
            )
        };
        self.x(cat, kernel, 0, stream, start, kdur, &args);
        self.flow('s', "ac2g", corr, PID, tid, ts);
        self.flow('f', "ac2g", corr, 0, stream, start);
        self.advance(tid, dur);
    }

    fn step(&mut self, n: u64) {
        let start = self.cpu_ns;
        self.advance(MAIN, 20_000);
        // Input copy.
        self.cpu_op(MAIN, "aten::to", |s| {
            s.cpu_op(MAIN, "aten::copy_", |s| {
                s.launch(
                    MAIN,
                    "cudaMemcpyAsync",
                    "gpu_memcpy",
                    "Memcpy HtoD (Pageable -> Device)",
                    COMPUTE,
                    "",
                );
            });
        });
        // Forward: 53 conv-bn-relu blocks.
        let mut fwd_flows = Vec::new();
        for l in 0..53 {
            let conv = CONV_KERNELS[l % 3];
            self.cpu_op(MAIN, "aten::conv2d", |s| {
                s.cpu_op(MAIN, "aten::convolution", |s| {
                    s.cpu_op(MAIN, "aten::_convolution", |s| {
                        s.cpu_op(MAIN, "aten::cudnn_convolution", |s| {
                            s.launch(MAIN, "cudaLaunchKernel", "kernel", conv, COMPUTE, "");
                        });
                    });
                });
            });
            self.flow += 1;
            fwd_flows.push(self.flow);
            let id = self.flow;
            let ts = self.cpu_ns;
            self.flow('s', "fwdbwd", id, PID, MAIN, ts);
            self.cpu_op(MAIN, "aten::batch_norm", |s| {
                s.cpu_op(MAIN, "aten::_batch_norm_impl_index", |s| {
                    s.cpu_op(MAIN, "aten::cudnn_batch_norm", |s| {
                        s.cpu_op(MAIN, "aten::empty_like", |_| {});
                        s.launch(MAIN, "cudaLaunchKernel", "kernel", BN_KERNEL, COMPUTE, "");
                    });
                });
            });
            self.cpu_op(MAIN, "aten::relu_", |s| {
                s.cpu_op(MAIN, "aten::clamp_min_", |s| {
                    s.launch(MAIN, "cudaLaunchKernel", "kernel", RELU_KERNEL, COMPUTE, "");
                });
            });
        }
        // Backward on the autograd thread, with an all-reduce every 8 layers.
        self.bw_ns = self.bw_ns.max(self.cpu_ns + 50_000);
        let bw_start = self.bw_ns;
        for (l, id) in fwd_flows.into_iter().rev().enumerate() {
            let ts = self.bw_ns;
            self.flow('f', "fwdbwd", id, PID, BW, ts);
            self.cpu_op(
                BW,
                "autograd::engine::evaluate_function: ConvolutionBackward0",
                |s| {
                    s.cpu_op(BW, "ConvolutionBackward0", |s| {
                        s.cpu_op(BW, "aten::convolution_backward", |s| {
                            for k in BW_KERNELS {
                                s.launch(BW, "cudaLaunchKernel", "kernel", k, COMPUTE, "");
                            }
                        });
                    });
                },
            );
            if l % 8 == 7 {
                self.cpu_op(BW, "nccl:all_reduce", |s| {
                    s.cpu_op(BW, "record_param_comms", |s| {
                        s.launch(
                            BW,
                            "cudaLaunchKernel",
                            "kernel",
                            NCCL_KERNEL,
                            COMM,
                            ", \"Collective name\": \"allreduce\", \"In msg nelems\": 6557440, \"Out msg nelems\": 6557440, \"Group size\": 2, \"dtype\": \"Float\", \"In split size\": \"[]\", \"Out split size\": \"[]\", \"Process Group Name\": \"0\", \"Process Group Description\": \"default_pg\", \"Process Group Ranks\": \"[0, 1]\"",
                        );
                    });
                });
            }
        }
        let bw_end = self.bw_ns;
        self.x(
            "user_annotation",
            "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
            PID,
            BW,
            bw_start,
            bw_end - bw_start,
            "\"External id\": 1, \"Ev Idx\": 0",
        );
        // The main thread waits in backward(), then the optimizer runs.
        self.cpu_ns = self.cpu_ns.max(bw_end) + 10_000;
        let opt = self.cpu_ns;
        self.cpu_op(MAIN, "aten::_foreach_add_", |s| {
            for _ in 0..4 {
                s.launch(MAIN, "cudaLaunchKernel", "kernel", ADAM_KERNEL, COMPUTE, "");
            }
            s.launch(
                MAIN,
                "cudaMemsetAsync",
                "gpu_memset",
                "Memset (Device)",
                COMPUTE,
                "",
            );
        });
        let opt_end = self.cpu_ns;
        self.x(
            "user_annotation",
            "Optimizer.step#SGD.step",
            PID,
            MAIN,
            opt,
            opt_end - opt,
            "\"External id\": 2, \"Ev Idx\": 1",
        );
        // End of step: wait for the GPU.
        self.corr += 1;
        let drain = self.stream_free[0].max(self.stream_free[1]) + 2_000;
        let ts = self.cpu_ns;
        let d = drain.max(ts + 3_000) - ts;
        let args = format!(
            "\"External id\": 3, \"cbid\": 165, \"correlation\": {}",
            self.corr
        );
        self.x(
            "cuda_runtime",
            "cudaDeviceSynchronize",
            PID,
            MAIN,
            ts,
            d,
            &args,
        );
        self.cpu_ns = ts + d + 5_000;
        let end = self.cpu_ns;
        self.x(
            "user_annotation",
            &format!("ProfilerStep#{n}"),
            PID,
            MAIN,
            start,
            end - start,
            "\"External id\": 4, \"Record function id\": 0, \"Ev Idx\": 2",
        );
    }
}

/// Writes a synthetic DDP trace of about `target` bytes.
fn write_synthetic(path: &Path, target: u64, shapes: bool) {
    let f = std::fs::File::create(path).expect("create");
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let head = r#"{
  "schemaVersion": 1,
  "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85097971712,
      "computeMajor": 8, "computeMinor": 0,
      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
      "regsPerBlock": 65536, "warpSize": 32,
      "sharedMemPerBlock": 49152, "numSms": 108
    }
  ],
  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
  "traceEvents": [
  {
    "name": "process_name", "ph": "M", "ts": 4458676416431.397, "pid": 2910249, "tid": 0,
    "args": {
      "name": "python3.10"
    }
  },
  {
    "name": "process_labels", "ph": "M", "ts": 4458676416431.397, "pid": 0, "tid": 0,
    "args": {
      "labels": "GPU 0"
    }
  }"#;
    w.write_all(head.as_bytes()).unwrap();
    let mut written = head.len() as u64;
    let mut s = Synth {
        out: String::new(),
        first: false,
        rng: 0x9e37_79b9_7f4a_7c15,
        cpu_ns: 4_458_676_416_788_066,
        bw_ns: 0,
        stream_free: [0; 2],
        corr: 1000,
        ext: 0,
        seq: 0,
        flow: 0,
        shapes,
    };
    let mut n = 1;
    while written < target {
        s.step(n);
        n += 1;
        w.write_all(s.out.as_bytes()).unwrap();
        written += s.out.len() as u64;
        s.out.clear();
    }
    let tail = r#"
  ],
  "traceName": "synthetic.json",
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1711964646000000000
}
"#;
    w.write_all(tail.as_bytes()).unwrap();
    w.flush().unwrap();
}
