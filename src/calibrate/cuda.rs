//! GPU measurements with cudarc (feature `gpu`): the driver, cuBLAS and NVRTC are loaded at run
//! time; a machine without them gets a clean error, never a panic.
//!
//! * GEMM: cuBLAS `cublasGemmEx`, square n = 2048, 4096, 8192, fp32 (FP32 compute), tf32
//!   (fp32 data, `CUBLAS_COMPUTE_32F_FAST_TF32`), fp16 and bf16 (16-bit data, fp32
//!   accumulation); the best rate over sizes, each the mean of 10 runs after a warm-up.
//! * Memory: a grid-stride `float4` copy kernel between two 1 GiB buffers (or a quarter of free
//!   memory); bytes read plus written per second.
//! * Vector peak: an FMA loop (8 independent chains per thread, all SMs busy).
//! * Launch overhead: 10,000 back-to-back launches of an empty kernel, timed with CUDA events.
//! * Fusion: 8 multiply-adds on 64 M floats as 8 kernels against one kernel doing all 8.
//! * `measure_layers` (`lower-bound --measure`): each unique layer's kernels as proxies — matrix
//!   kernels as the cuBLAS GEMM of the same M, N, K (a convolution as its implicit GEMM), the
//!   other kernels as a streaming kernel moving the same bytes with the same FLOPs per element.
//!   This measures what the GPU and cuBLAS achieve on the layer's shape, not cuDNN's algorithms.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as bsys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg, sys as dsys,
};

use super::{Chain, Measured};
use crate::cost::config::Dtype;
use crate::lowerbound::{self, Entry, PerfDb, Source};
use crate::onnx::Graph;

const KERNELS: &str = r#"
extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void copy4(const float4* __restrict__ a, float4* __restrict__ b, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        b[i] = a[i];
    }
}

extern "C" __global__ void fill_f32(float* y, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = (float)((i * 2654435761u) % 1000u) * 1e-3f;
    }
}

extern "C" __global__ void fill_u16(unsigned short* y, unsigned long long n, unsigned short base) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = base + (unsigned short)(i % 64u);
    }
}

extern "C" __global__ void axpb(float* __restrict__ y, unsigned long long n, float a, float b, int k) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = y[i];
        for (int j = 0; j < k; ++j) v = v * a + b;
        y[i] = v;
    }
}

extern "C" __global__ void fma_loop(float* out, int iters, float a, float b) {
    float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3;
    float x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    for (int i = 0; i < iters; ++i) {
        x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
        x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}

extern "C" __global__ void stream_ops(const float* __restrict__ a, float* __restrict__ b,
                                      unsigned long long n_in, unsigned long long n_out, int ops) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n_out;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = a[i % n_in];
        for (int j = 0; j < ops; ++j) v = v * 0.999f + 0.001f;
        b[i] = v;
    }
}
"#;

/// An error of the CUDA stack, as a one-line message.
fn err<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// Open GPU `ordinal`, or say why not (no driver library, no device) without panicking.
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>, String> {
    // cudarc panics when it cannot load libcuda: probe the library first.
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { dsys::is_culib_present() } {
        return Err(
            "no GPU found: the NVIDIA driver library (libcuda) is not installed or \
                    not on LD_LIBRARY_PATH"
                .into(),
        );
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| {
        let n = CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
        if n <= 0 || ordinal >= n as usize {
            return Err(format!("the driver reports {n} CUDA devices"));
        }
        CudaContext::new(ordinal).map_err(|e| format!("{e:?}"))
    });
    std::panic::set_hook(hook);
    match r {
        Ok(Ok(ctx)) => Ok(ctx),
        Ok(Err(e)) => Err(format!("no GPU found (device {ordinal}): {e}")),
        Err(_) => Err("no GPU found: loading the CUDA driver failed".into()),
    }
}

/// cuBLAS on `g`'s stream, after checking that the library can be loaded (cudarc panics when it
/// cannot).
fn blas(g: &Gpu) -> Result<CudaBlas, String> {
    // SAFETY: only tries to dlopen libcublas by its usual names.
    if !unsafe { bsys::is_culib_present() } {
        return Err("cuBLAS (libcublas) is not installed or not on LD_LIBRARY_PATH".into());
    }
    CudaBlas::new(g.stream.clone()).map_err(err("cuBLAS"))
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    f: HashMap<&'static str, CudaFunction>,
    sms: u32,
}

impl Gpu {
    fn new(ctx: Arc<CudaContext>) -> Result<Gpu, String> {
        // SAFETY: nothing is shared between streams here; per-slice events only add overhead.
        unsafe { ctx.disable_event_tracking() };
        // SAFETY: probing the NVRTC library by name.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("NVRTC (libnvrtc) is not installed or not on LD_LIBRARY_PATH".into());
        }
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(err("NVRTC compile"))?;
        let module = ctx.load_module(ptx).map_err(err("load module"))?;
        let mut f = HashMap::new();
        for name in [
            "empty_kernel",
            "copy4",
            "fill_f32",
            "fill_u16",
            "axpb",
            "fma_loop",
            "stream_ops",
        ] {
            f.insert(name, module.load_function(name).map_err(err(name))?);
        }
        let sms = ctx
            .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(err("SM count"))? as u32;
        Ok(Gpu {
            stream: ctx.default_stream(),
            ctx,
            _module: module,
            f,
            sms,
        })
    }

    fn grid(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.sms * 8, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Mean GPU time of `reps` runs of `f` after one warm-up, ms (CUDA events).
    fn time(&self, reps: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
        f()?;
        self.stream.synchronize().map_err(err("synchronize"))?;
        let flags = Some(dsys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = self.stream.record_event(flags).map_err(err("event"))?;
        for _ in 0..reps {
            f()?;
        }
        let b = self.stream.record_event(flags).map_err(err("event"))?;
        Ok(a.elapsed_ms(&b).map_err(err("elapsed"))? as f64 / reps as f64)
    }

    fn fill_f32(&self, y: &mut CudaSlice<f32>) -> Result<(), String> {
        let n = y.len();
        let mut l = self.stream.launch_builder(&self.f["fill_f32"]);
        l.arg(y).arg(&n);
        // SAFETY: the kernel writes n floats of y.
        unsafe { l.launch(self.grid()) }.map_err(err("fill"))?;
        Ok(())
    }

    fn fill_u16(&self, y: &mut CudaSlice<u16>, base: u16) -> Result<(), String> {
        let n = y.len();
        let mut l = self.stream.launch_builder(&self.f["fill_u16"]);
        l.arg(y).arg(&n).arg(&base);
        // SAFETY: the kernel writes n u16 of y.
        unsafe { l.launch(self.grid()) }.map_err(err("fill"))?;
        Ok(())
    }
}

/// Buffers for GEMMs up to m×k·k×n in one dtype.
enum Bufs {
    F32(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>),
    U16(CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>),
}

fn gemm_bufs(g: &Gpu, dtype: Dtype, a: usize, b: usize, c: usize) -> Result<Bufs, String> {
    let s = &g.stream;
    Ok(match dtype {
        Dtype::Fp32 | Dtype::Tf32 => {
            let (mut x, mut y) = (
                s.alloc_zeros::<f32>(a).map_err(err("alloc"))?,
                s.alloc_zeros::<f32>(b).map_err(err("alloc"))?,
            );
            g.fill_f32(&mut x)?;
            g.fill_f32(&mut y)?;
            Bufs::F32(x, y, s.alloc_zeros::<f32>(c).map_err(err("alloc"))?)
        }
        _ => {
            // 1.0 in fp16 is 0x3C00, in bf16 0x3F80; the fill adds small mantissa noise.
            let base = if dtype == Dtype::Bf16 { 0x3F80 } else { 0x3C00 };
            let (mut x, mut y) = (
                s.alloc_zeros::<u16>(a).map_err(err("alloc"))?,
                s.alloc_zeros::<u16>(b).map_err(err("alloc"))?,
            );
            g.fill_u16(&mut x, base)?;
            g.fill_u16(&mut y, base)?;
            Bufs::U16(x, y, s.alloc_zeros::<u16>(c).map_err(err("alloc"))?)
        }
    })
}

/// One column-major GEMM C(m×n) = A(m×k)·B(k×n) with cublasGemmEx.
fn gemm(
    g: &Gpu,
    h: &CudaBlas,
    dtype: Dtype,
    bufs: &mut Bufs,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), String> {
    let (ty, compute) = match dtype {
        Dtype::Fp32 => (
            bsys::cudaDataType::CUDA_R_32F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        Dtype::Tf32 => (
            bsys::cudaDataType::CUDA_R_32F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        Dtype::Fp16 => (
            bsys::cudaDataType::CUDA_R_16F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        Dtype::Bf16 => (
            bsys::cudaDataType::CUDA_R_16BF,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        other => return Err(format!("no GEMM benchmark for {other:?}")),
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    let s = &g.stream;
    let (pa, pb, pc, _ga, _gb, _gc);
    match bufs {
        Bufs::F32(a, b, c) => {
            (pa, _ga) = a.device_ptr(s);
            (pb, _gb) = b.device_ptr(s);
            (pc, _gc) = c.device_ptr_mut(s);
        }
        Bufs::U16(a, b, c) => {
            (pa, _ga) = a.device_ptr(s);
            (pb, _gb) = b.device_ptr(s);
            (pc, _gc) = c.device_ptr_mut(s);
        }
    }
    let (m, n, k) = (m as i32, n as i32, k as i32);
    // SAFETY: the buffers hold at least m·k, k·n and m·n elements of `ty` (the callers allocate
    // them for the largest shape); alpha and beta are host f32 (pointer mode host, fp32 compute).
    unsafe {
        blas::gemm_ex(
            *h.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_N,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha) as *const f32 as *const _,
            pa as *const _,
            ty,
            m,
            pb as *const _,
            ty,
            k,
            (&beta) as *const f32 as *const _,
            pc as *mut _,
            ty,
            m,
            compute,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(err("cublasGemmEx"))
}

/// Run the whole calibration on device `ordinal`.
pub fn calibrate(ordinal: usize) -> Result<Measured, String> {
    let ctx = open(ordinal)?;
    let device = ctx.name().map_err(err("device name"))?;
    let memory_gib = ctx.total_mem().map_err(err("memory size"))? as f64 / (1u64 << 30) as f64;
    let g = Gpu::new(ctx)?;
    eprintln!("calibrating {device} ({} SMs, {memory_gib:.1} GiB)", g.sms);
    let h = blas(&g)?;

    let sizes = [2048u64, 4096, 8192];
    let mut gemm_tflops = BTreeMap::new();
    for dtype in [Dtype::Fp32, Dtype::Tf32, Dtype::Fp16, Dtype::Bf16] {
        let big = (sizes[sizes.len() - 1] * sizes[sizes.len() - 1]) as usize;
        let mut bufs = gemm_bufs(&g, dtype, big, big, big)?;
        let mut best = 0.0f64;
        for &n in &sizes {
            let nn = n as usize;
            let ms = g.time(10, || gemm(&g, &h, dtype, &mut bufs, nn, nn, nn))?;
            best = best.max(2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12);
        }
        eprintln!("  GEMM {dtype:?}: {best:.1} TFLOP/s");
        gemm_tflops.insert(dtype, best);
    }

    let (free, _) = g.ctx.mem_get_info().map_err(err("free memory"))?;
    let bytes = (1usize << 30).min(free / 4) & !15;
    let n4 = bytes / 16;
    let src = g.stream.alloc_zeros::<f32>(n4 * 4).map_err(err("alloc"))?;
    let mut dst = g.stream.alloc_zeros::<f32>(n4 * 4).map_err(err("alloc"))?;
    let copy_ms = g.time(20, || {
        let mut l = g.stream.launch_builder(&g.f["copy4"]);
        l.arg(&src).arg(&mut dst).arg(&n4);
        // SAFETY: both buffers hold n4 float4 values.
        unsafe { l.launch(g.grid()) }.map_err(err("copy"))?;
        Ok(())
    })?;
    let copy_gbps = 2.0 * bytes as f64 / (copy_ms * 1e6);
    eprintln!("  copy: {copy_gbps:.0} GB/s");

    let iters = 4096i32;
    let cfg = LaunchConfig {
        grid_dim: (g.sms * 16, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut out = g
        .stream
        .alloc_zeros::<f32>((g.sms * 16 * 256) as usize)
        .map_err(err("alloc"))?;
    let (a, b) = (0.999f32, 0.001f32);
    let fma_ms = g.time(5, || {
        let mut l = g.stream.launch_builder(&g.f["fma_loop"]);
        l.arg(&mut out).arg(&iters).arg(&a).arg(&b);
        // SAFETY: one output per thread of the grid, `out` has that many.
        unsafe { l.launch(cfg) }.map_err(err("fma"))?;
        Ok(())
    })?;
    let threads = (g.sms * 16 * 256) as f64;
    let vector_fp32_tflops = threads * iters as f64 * 8.0 * 2.0 / (fma_ms * 1e-3) / 1e12;
    eprintln!("  FMA loop: {vector_fp32_tflops:.1} TFLOP/s");

    let launches = 10_000;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let total_ms = g.time(1, || {
        for _ in 0..launches {
            let mut l = g.stream.launch_builder(&g.f["empty_kernel"]);
            // SAFETY: the kernel takes no arguments.
            unsafe { l.launch(one) }.map_err(err("empty kernel"))?;
        }
        Ok(())
    })?;
    let launch_us = total_ms * 1e3 / launches as f64;
    eprintln!("  launch: {launch_us:.2} us");

    let elems = (64usize << 20).min(n4 * 4);
    let mut y = g.stream.alloc_zeros::<f32>(elems).map_err(err("alloc"))?;
    g.fill_f32(&mut y)?;
    let ops = 8i32;
    let axpb = |k: i32, y: &mut CudaSlice<f32>| -> Result<(), String> {
        let mut l = g.stream.launch_builder(&g.f["axpb"]);
        l.arg(y).arg(&elems).arg(&a).arg(&b).arg(&k);
        // SAFETY: the kernel updates the `elems` floats of y in place.
        unsafe { l.launch(g.grid()) }.map_err(err("axpb"))?;
        Ok(())
    };
    let unfused_ms = g.time(5, || (0..ops).try_for_each(|_| axpb(1, &mut y)))?;
    let fused_ms = g.time(5, || axpb(ops, &mut y))?;
    eprintln!("  element-wise chain of {ops}: {unfused_ms:.3} ms unfused, {fused_ms:.3} ms fused");

    let cc = |a| {
        g.ctx
            .attribute(a)
            .map(|v| v as u32)
            .map_err(err("compute capability"))
    };
    let compute_capability = (
        cc(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        cc(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    Ok(Measured {
        device,
        memory_gib,
        sms: g.sms,
        compute_capability,
        gemm_tflops,
        gemm_sizes: sizes.to_vec(),
        vector_fp32_tflops,
        copy_gbps,
        launch_us,
        chain: Some(Chain {
            ops: ops as u32,
            elems: elems as u64,
            unfused_ms,
            fused_ms,
        }),
    })
}

/// (batch, M, N, K) of the GEMM a matrix layer amounts to.
fn gemm_shape(g: &Graph, l: &lowerbound::Layer) -> Option<(usize, usize, usize, usize)> {
    let n = &g.nodes[l.node];
    let dims = |i: usize| {
        n.input(i)
            .and_then(|v| g.values.get(v))
            .map(|v| v.dims.clone())
    };
    let out = n
        .outputs
        .first()
        .and_then(|o| g.values.get(o))?
        .dims
        .clone();
    let u = |x: i64| x.max(1) as usize;
    match l.op_type.as_str() {
        "Conv" => {
            let (x, w) = (dims(0)?, dims(1)?);
            let grp = n.int("group").unwrap_or(1).max(1);
            let spatial: i64 = out[2..].iter().product();
            let ksz: i64 = w[2..].iter().product();
            Some((
                u(grp),
                u(out[0] * spatial),
                u(w[0] / grp),
                u(x[1] / grp * ksz),
            ))
        }
        "Gemm" => {
            let (m, k, nn) = crate::onnx::shape::gemm_mkn(n, &dims(0)?, &dims(1)?).ok()?;
            Some((1, u(m), u(nn), u(k)))
        }
        "MatMul" => {
            let (b, m, k, nn, _) = crate::onnx::shape::matmul_dims(&dims(0)?, &dims(1)?).ok()?;
            Some((u(b.iter().product()), u(m), u(nn), u(k)))
        }
        _ => None,
    }
}

/// Measure every unique layer (and fused group) of `graph` in each dtype and store the results
/// in `db` as measured entries; returns how many entries were written.
pub fn measure_layers(
    graph: &Graph,
    gpu: &str,
    dtypes: &[Dtype],
    db: &mut PerfDb,
) -> Result<usize, String> {
    let ctx = open(0)?;
    let g = Gpu::new(ctx)?;
    let h = blas(&g)?;
    let layers = lowerbound::layers::layers(graph);
    let fused = lowerbound::fusion::find(graph, &layers);
    let mut written = 0;
    for &dtype in dtypes {
        let bytes = dtype.bytes() as usize;
        // Per-layer GEMM proxies, batched GEMMs run as one GEMM with batch·M rows.
        let mut mats: Vec<(usize, usize, usize)> = Vec::new();
        for l in &layers {
            if let Some((b, m, n, k)) = gemm_shape(graph, l) {
                mats.push((b * m, n, k));
            }
        }
        let cap = |f: fn(&(usize, usize, usize)) -> usize| mats.iter().map(f).max().unwrap_or(1);
        let (a_max, b_max, c_max) = (
            cap(|&(m, _, k)| m * k),
            cap(|&(_, n, k)| k * n),
            cap(|&(m, n, _)| m * n),
        );
        let mut bufs = gemm_bufs(&g, dtype, a_max, b_max, c_max)?;
        let max_elems = layers
            .iter()
            .flat_map(|l| &l.kernels)
            .map(|k| k.elems as usize)
            .max()
            .unwrap_or(1)
            .max(1);
        // Streaming proxy buffers, in fp32 words: 16-bit dtypes move half the words.
        let words = (max_elems * bytes).div_ceil(4).max(1);
        let src = g.stream.alloc_zeros::<f32>(words).map_err(err("alloc"))?;
        let mut dst = g.stream.alloc_zeros::<f32>(words).map_err(err("alloc"))?;
        let mut stream_ms = |k: &lowerbound::Kernel| -> Result<f64, String> {
            let w = ((k.elems as usize * bytes).div_ceil(4) / 2).max(1);
            let ops = (k.vector_flops / (k.elems / 2.0).max(1.0) / 2.0)
                .ceil()
                .clamp(0.0, 64.0) as i32;
            g.time(10, || {
                let mut l = g.stream.launch_builder(&g.f["stream_ops"]);
                l.arg(&src).arg(&mut dst).arg(&w).arg(&w).arg(&ops);
                // SAFETY: both buffers hold at least `w` floats.
                unsafe { l.launch(g.grid()) }.map_err(err("stream"))?;
                Ok(())
            })
        };
        let mut done: HashMap<String, f64> = HashMap::new();
        for l in &layers {
            if l.kernels.is_empty() || done.contains_key(&l.key) {
                continue;
            }
            let mut ms = 0.0;
            for k in &l.kernels {
                ms += match (k.matrix_flops > 0.0, gemm_shape(graph, l)) {
                    (true, Some((b, m, n, kk))) => {
                        g.time(10, || gemm(&g, &h, dtype, &mut bufs, b * m, n, kk))?
                    }
                    _ => stream_ms(k)?,
                };
            }
            done.insert(l.key.clone(), ms);
            db.upsert(Entry {
                gpu: gpu.to_string(),
                dtype,
                layer: l.key.clone(),
                implementation: "cublas-gemm+stream-proxy".into(),
                source: Source::Measured,
                ms,
                flops: l.flops(),
                bytes: l.kernels.iter().map(|k| k.elems).sum::<f64>() * bytes as f64,
            });
            written += 1;
        }
        for f in &fused {
            let key = lowerbound::fused_key(f, &layers);
            // A fused kernel costs its GEMMs (the epilogue rides along) or, without a GEMM, one
            // streaming pass.
            let mut ms = 0.0;
            let mut any = false;
            for &m in &f.members {
                if let Some((b, mm, n, kk)) = gemm_shape(graph, &layers[m]) {
                    ms += g.time(10, || gemm(&g, &h, dtype, &mut bufs, b * mm, n, kk))?;
                    any = true;
                }
            }
            if !any {
                ms = stream_ms(&f.kernel)?;
            }
            db.upsert(Entry {
                gpu: gpu.to_string(),
                dtype,
                layer: key,
                implementation: "cublas-gemm-epilogue-proxy".into(),
                source: Source::Measured,
                ms,
                flops: f.kernel.matrix_flops + f.kernel.vector_flops,
                bytes: f.kernel.elems * bytes as f64,
            });
            written += 1;
        }
        eprintln!("measured {written} entries in {dtype:?}");
    }
    Ok(written)
}
