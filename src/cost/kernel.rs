//! What one operator computes ([`OpWork`]: its class, FLOPs, elements moved, kernels and the
//! shapes of its matrix products) and how long its kernels take on a GPU ([`KernelModel`]).
//!
//! `OpWork` is the interface between whoever knows an operator (the zoo's layer tables, a trace
//! operator's recorded shapes) and the cost model: passes re-cost ops through it (AMP's dtype,
//! accumulation's batch/k, fusion's saved traffic), and a recorded kernel is re-costed relative
//! to itself as `recorded × model(new) / model(old)`.
//!
//! Matrix products carry their GEMM shapes ([`Gemm`]: M×N×K, a batch count, and which dimension
//! grows with the batch) because a kernel's efficiency depends on them: tiles, waves over the
//! GPU's SMs, and short reductions. Work a shape list does not cover (the `flops` beyond the
//! listed GEMMs) is priced at the listed GEMMs' average rate.

use serde::Serialize;

use super::config::{Dtype, GpuSpec};
use super::framework::Math;

/// Which roofline ceiling an operator's math runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MathClass {
    /// Dense matrix math that tensor cores / matrix cores accelerate (conv, GEMM, batched matmul).
    Matrix,
    /// Vector / element-wise math (norms, activations, pooling, softmax, adds, embeddings).
    Vector,
}

/// The operator class a kernel-efficiency curve is fitted for.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Convolution (implicit GEMM: M = N·Ho·Wo, N = Cout, K = Cin/g·Kh·Kw: a grouped conv's
    /// columns reduce over their own group's channels).
    Conv,
    /// Depthwise convolution (one group per channel, MobileNet / EfficientNet): a stencil, not
    /// a product — each output reads its own channel's window — priced as a memory-bound kernel
    /// at the architecture's `depthwise_efficiency` of the achieved bandwidth.
    DepthwiseConv,
    /// Dense GEMM (linear layers, `mm`, `addmm`) and batched matmul.
    Gemm,
    /// Attention as one fused kernel (flash / memory-efficient attention).
    Attention,
    /// Batch normalisation (runs in the activations' dtype under autocast).
    Norm,
    /// Layer / group normalisation (autocast runs it in FP32).
    LayerNorm,
    /// Softmax (with folded scale / mask).
    Softmax,
    /// Element-wise (activations, adds, casts, scaling).
    #[default]
    Elementwise,
    /// Dropout: element-wise, and what it saves is its mask, one byte per element whatever
    /// the activations' dtype (PyTorch's `native_dropout` returns a bool mask): mixed
    /// precision halves its output, not its mask.
    Dropout,
    /// An element-wise chain that autocast promotes to FP32: its first op is on autocast's
    /// float32 list (`pow` in Hugging Face's composite GELU), so the ops after it compute
    /// and save FP32 tensors.
    ElementwiseFp32,
    /// Pooling.
    Pool,
    /// Embedding lookup / its gradient.
    Embedding,
    /// Reductions (loss, sums).
    Reduction,
    /// Optimizer update kernels (per tensor, foreach or fused).
    Optimizer,
    /// Memory copies (concat, contiguous, host↔device).
    Copy,
}

impl OpClass {
    /// Classes PyTorch's autocast runs in FP32 under mixed precision (its "float32" op list:
    /// `softmax`, `log_softmax`, `layer_norm`, `group_norm`, the losses): they read half
    /// inputs, cast them, and write FP32 outputs.
    pub fn runs_in_fp32(self) -> bool {
        matches!(
            self,
            OpClass::Softmax | OpClass::LayerNorm | OpClass::Reduction | OpClass::ElementwiseFp32
        )
    }

    /// The class's roofline ceiling.
    pub fn math(self) -> MathClass {
        match self {
            OpClass::Conv | OpClass::Gemm | OpClass::Attention => MathClass::Matrix,
            _ => MathClass::Vector,
        }
    }
}

/// Which dimension of a matrix product grows with the batch (what accumulation's batch/k
/// shrinks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchDim {
    /// The output rows (forward and data-gradient GEMMs of convs and linear layers).
    M,
    /// The reduction (weight-gradient GEMMs).
    K,
    /// The batch count of a batched matmul (attention's batch × heads).
    Count,
    /// Nothing (a fixed-size product).
    #[default]
    None,
}

/// One matrix product: `count` independent (M×K)·(K×N) products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Gemm {
    pub m: f64,
    pub n: f64,
    pub k: f64,
    pub count: f64,
    pub batch_dim: BatchDim,
}

impl Gemm {
    /// No product (an unused slot of [`OpWork::gemms`]).
    pub const NONE: Gemm = Gemm {
        m: 0.0,
        n: 0.0,
        k: 0.0,
        count: 0.0,
        batch_dim: BatchDim::None,
    };

    pub fn new(m: f64, n: f64, k: f64, count: f64, batch_dim: BatchDim) -> Gemm {
        Gemm {
            m,
            n,
            k,
            count,
            batch_dim,
        }
    }

    pub fn is_none(&self) -> bool {
        self.count <= 0.0 || self.m <= 0.0 || self.n <= 0.0 || self.k <= 0.0
    }

    /// Whether a dimension other than the batch's is not a whole number of 16-byte vectors of
    /// `d` (an odd vocabulary). Those are the row-major operands' leading dimensions (the
    /// batch's never is), which cuBLAS's vectorised tensor-core kernels need aligned.
    pub fn misaligned(&self, d: Dtype) -> bool {
        let per = (16 / d.bytes().max(1)) as f64;
        let off = |x: f64| x % per != 0.0;
        match self.batch_dim {
            BatchDim::M => off(self.n) || off(self.k),
            BatchDim::K => off(self.m) || off(self.n),
            BatchDim::Count | BatchDim::None => off(self.m) || off(self.n) || off(self.k),
        }
    }

    /// 2·M·N·K·count.
    pub fn flops(&self) -> f64 {
        if self.is_none() {
            0.0
        } else {
            2.0 * self.m * self.n * self.k * self.count
        }
    }

    /// The product with its batch dimension scaled by `s`.
    pub fn scaled(&self, s: f64) -> Gemm {
        let mut g = *self;
        match g.batch_dim {
            BatchDim::M => g.m *= s,
            BatchDim::K => g.k *= s,
            BatchDim::Count => g.count *= s,
            BatchDim::None => {}
        }
        g
    }

    /// The two backward products of a forward `x(M×K)·w(K×N)`: data gradient
    /// `dy(M×N)·wᵀ(N×K)` (M×K output, reduction N) and weight gradient `xᵀ(K×M)·dy(M×N)` (K×N
    /// output, reduction M — the batch dimension moves into the reduction).
    pub fn backward(&self) -> [Gemm; 2] {
        let wgrad_batch = match self.batch_dim {
            BatchDim::M => BatchDim::K,
            other => other,
        };
        [
            Gemm::new(self.m, self.k, self.n, self.count, self.batch_dim),
            Gemm::new(self.k, self.n, self.m, self.count, wgrad_batch),
        ]
    }
}

/// What an op computes, so that a pass can re-cost it. Elements are per worker at the job's
/// batch size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OpWork {
    pub math: MathClass,
    pub class: OpClass,
    pub flops: f64,
    /// Elements moved that scale with the batch (activations, their gradients).
    pub act_elems: f64,
    /// Elements moved that do not (weights, weight gradients, optimizer state).
    pub weight_elems: f64,
    pub kernels: u32,
    /// Shapes of the op's matrix products (unused slots are [`Gemm::NONE`]).
    pub gemms: [Gemm; 2],
}

impl OpWork {
    /// Work with no shapes: priced by its class's curve from FLOPs and elements alone.
    pub fn new(
        class: OpClass,
        flops: f64,
        act_elems: f64,
        weight_elems: f64,
        kernels: u32,
    ) -> Self {
        OpWork {
            math: class.math(),
            class,
            flops,
            act_elems,
            weight_elems,
            kernels,
            gemms: [Gemm::NONE; 2],
        }
    }

    /// The same op at `s` times its batch: FLOPs, activation elements and the GEMMs' batch
    /// dimensions scale; weight elements and kernel counts do not.
    pub fn scaled(&self, s: f64) -> OpWork {
        OpWork {
            flops: self.flops * s,
            act_elems: self.act_elems * s,
            gemms: [self.gemms[0].scaled(s), self.gemms[1].scaled(s)],
            ..*self
        }
    }

    /// `f` times the work: FLOPs, every element and each product's count (the shapes kept) — an
    /// op's share of its kernels, or one shard of an optimizer step.
    pub fn times(&self, f: f64) -> OpWork {
        let mut w = *self;
        w.flops *= f;
        w.act_elems *= f;
        w.weight_elems *= f;
        for g in w.gemms.iter_mut() {
            if !g.is_none() {
                g.count *= f;
            }
        }
        w
    }

    /// Two ops as one (op fusion): work adds up, the shape slots keep the larger products.
    pub fn merged(&self, b: &OpWork) -> OpWork {
        let math = if self.math == MathClass::Matrix || b.math == MathClass::Matrix {
            MathClass::Matrix
        } else {
            MathClass::Vector
        };
        let class = if self.flops >= b.flops {
            self.class
        } else {
            b.class
        };
        let mut all: Vec<Gemm> = self
            .gemms
            .iter()
            .chain(b.gemms.iter())
            .copied()
            .filter(|g| !g.is_none())
            .collect();
        all.sort_by(|x, y| y.flops().total_cmp(&x.flops()));
        let mut gemms = [Gemm::NONE; 2];
        for (slot, g) in gemms.iter_mut().zip(all) {
            *slot = g;
        }
        OpWork {
            math,
            class,
            flops: self.flops + b.flops,
            act_elems: self.act_elems + b.act_elems,
            weight_elems: self.weight_elems + b.weight_elems,
            kernels: self.kernels + b.kernels,
            gemms,
        }
    }
}

/// The kernel cost model of one GPU: how long an op's kernels take on the GPU (launch
/// overhead included, host dispatch not: that is the host model, `cost/host.rs`).
///
/// ```text
/// matrix op:  max(Σ_gemm T_gemm, bytes / (bw · e_mem)) + extra FLOPs / (vector peak · e_vec) + kernels · launch
/// T_gemm    = min over tiles (tm×tn) and split-K s of
///             waves · 2·tm·tn·(K/s) / (peak/SMs · e_unit · e_class · r(tile) · ramp(K/s))  + split-K reduction
///   waves   = ⌈⌈M/tm⌉·⌈N/tn⌉·count·s / SMs⌉               (wave quantisation over the SMs)
///   r(tile) = I/(I + I½) normalised to the best tile,  I = tm·tn/(tm+tn)   (operand re-reads per FLOP)
///   ramp(k) = k/(k + K½) normalised to k = 4096              (prologue/epilogue of short reductions)
/// vector op:  max(FLOPs / (vector peak · e_vec), bytes / (bw · e_mem)) + kernels · launch
/// ```
///
/// `e_unit` is the architecture's large-GEMM efficiency on the CUDA cores or the tensor cores,
/// `e_class` the convolution or attention factor; `launch` is the GPU's per-kernel floor (the
/// back-to-back gap plus the shortest kernel). Every constant lives in the GPU and architecture
/// configs (`configs/gpus`, `configs/arch`), each cited there. An op without GEMM shapes (a trace
/// kernel, a declarative pass's insert) is priced as one large GEMM of its FLOPs.
#[derive(Clone, Debug)]
pub struct KernelModel<'a> {
    gpu: &'a GpuSpec,
}

/// Split-K factors the GEMM model tries.
const SPLITS: [f64; 6] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
/// Smallest reduction per CTA a split-K GEMM is given.
const MIN_SPLIT_K: f64 = 64.0;
/// Reduction length the ramp is normalised to (where published GEMM peaks are measured).
const REF_K: f64 = 4096.0;

impl<'a> KernelModel<'a> {
    pub fn new(gpu: &'a GpuSpec) -> Self {
        KernelModel { gpu }
    }

    /// The dtype `work`'s math runs in when values are stored in `storage`: half-precision
    /// storage runs matrix math in that dtype; FP32 storage uses `math` per class.
    pub fn math_dtype(work: &OpWork, storage: Dtype, math: Math) -> Dtype {
        if work.math == MathClass::Vector {
            return storage;
        }
        if storage.bytes() < 4 {
            // FP8 GEMMs (Transformer Engine) keep half-precision storage.
            return if work.class == OpClass::Gemm && math.matmul == Dtype::Fp8 {
                Dtype::Fp8
            } else {
                storage
            };
        }
        match work.class {
            OpClass::Conv => math.conv,
            _ => math.matmul,
        }
    }

    /// Whether `d`'s matrix math runs on tensor cores on this GPU.
    fn tensor_core(&self, d: Dtype) -> bool {
        !matches!(d, Dtype::Fp32 | Dtype::Fp64) && self.gpu.matrix_tflops.contains_key(&d)
    }

    /// Per-kernel floor, ns.
    fn launch_ns(&self) -> f64 {
        self.gpu.launch_overhead_us * 1e3
    }

    /// Achieved DRAM bytes/ns of streaming kernels.
    fn mem_rate(&self) -> f64 {
        self.gpu.memory_bytes_per_ns() * self.gpu.kernels.memory_efficiency
    }

    /// The fraction of the streaming rate a memory-bound class reaches: the architecture's
    /// measured `depthwise_efficiency` and `norm_efficiency`, 1 for every other class and
    /// where they were not measured.
    fn stream_fraction(&self, class: OpClass) -> f64 {
        let k = &self.gpu.kernels;
        match class {
            OpClass::DepthwiseConv => k.depthwise_efficiency,
            OpClass::Norm => k.norm_efficiency,
            _ => None,
        }
        .unwrap_or(1.0)
    }

    /// Achieved vector FLOP/ns in `d`.
    fn vector_rate(&self, d: Dtype) -> f64 {
        self.gpu.vector_flops_per_ns(d) * self.gpu.kernels.vector_efficiency
    }

    /// GPU time of `work`'s kernels in ns, values stored in `storage`, FP32 matrix math as
    /// `math` says.
    pub fn time_ns(&self, work: &OpWork, storage: Dtype, math: Math) -> f64 {
        if storage.bytes() < 4 && work.class.runs_in_fp32() && !math.pure_half {
            // Autocast's FP32 ops: the op in FP32 plus the cast of its half input (read 2 B,
            // write 4 B per input element; about half the op's activation traffic is input).
            // A model stored in half runs them in half, like every other op.
            let cast = self.memory_ns(work.act_elems * 0.5 * 6.0) + self.launch_ns();
            return self.time_ns(work, Dtype::Fp32, math) + cast;
        }
        let bytes = (work.act_elems + work.weight_elems).max(0.0) * storage.bytes() as f64;
        let memory = bytes / (self.mem_rate() * self.stream_fraction(work.class));
        let launches = f64::from(work.kernels) * self.launch_ns();
        if work.math == MathClass::Vector {
            let compute = work.flops.max(0.0) / self.vector_rate(storage);
            return compute.max(memory) + launches;
        }
        let mut t = self.matrix_compute_ns(work, storage, math).max(memory) + launches;
        let d = Self::math_dtype(work, storage, math);
        if work.class == OpClass::Conv && !math.channels_last && self.tensor_core(d) {
            // NCHW activations: cuDNN transposes the input to NHWC and the output back around
            // a tensor-core convolution (one read and one write of each, two more kernels).
            t += self.memory_ns(2.0 * work.act_elems * storage.bytes() as f64)
                + 2.0 * self.launch_ns();
        }
        t
    }

    /// Compute time alone (no memory traffic, no launches) of `work`'s math.
    pub fn compute_ns(&self, work: &OpWork, storage: Dtype, math: Math) -> f64 {
        match work.math {
            MathClass::Vector => work.flops.max(0.0) / self.vector_rate(storage),
            MathClass::Matrix => self.matrix_compute_ns(work, storage, math),
        }
    }

    /// Time to stream `bytes` through DRAM at the achieved bandwidth, ns.
    pub fn memory_ns(&self, bytes: f64) -> f64 {
        bytes.max(0.0) / self.mem_rate()
    }

    /// The per-kernel floor, ns.
    pub fn launch_floor_ns(&self) -> f64 {
        self.launch_ns()
    }

    /// Compute time of a matrix op: its products by the GEMM model; FLOPs beyond them (bias
    /// adds, the members of a fused op whose shapes were not kept) at the products' average rate.
    fn matrix_compute_ns(&self, work: &OpWork, storage: Dtype, math: Math) -> f64 {
        let d = Self::math_dtype(work, storage, math);
        let (t, covered) = self.products_ns(work, d);
        if covered <= 0.0 {
            return t;
        }
        t * work.flops.max(covered) / covered
    }

    /// Compute time of a matrix op's products and the FLOPs they cover.
    fn products_ns(&self, work: &OpWork, d: Dtype) -> (f64, f64) {
        let a = &self.gpu.kernels;
        let tc = self.tensor_core(d);
        let pick = |u: &crate::cost::config::PerUnit| if tc { u.tensor_core } else { u.cuda_core };
        let e_class = match work.class {
            OpClass::Conv => pick(&a.conv_efficiency),
            OpClass::Attention => a.attention_efficiency,
            _ => 1.0,
        };
        let rate = self.gpu.matrix_flops_per_ns(d) * pick(&a.gemm_efficiency) * e_class;
        let gemms: Vec<&Gemm> = work.gemms.iter().filter(|g| !g.is_none()).collect();
        if gemms.is_empty() {
            return (work.flops.max(0.0) / rate, work.flops.max(0.0));
        }
        let misaligned_rate = a
            .misaligned_gemm_efficiency
            .filter(|_| tc && work.class == OpClass::Gemm)
            .map(|e| self.gpu.matrix_flops_per_ns(d) * e);
        let mut t = 0.0;
        let mut covered = 0.0;
        for g in gemms {
            let r = match misaligned_rate {
                Some(r) if g.misaligned(d) => r,
                _ => rate,
            };
            t += self.gemm_ns(g, r, tc);
            covered += g.flops();
        }
        (t, covered)
    }

    /// Compute time of one product at `rate` FLOP/ns for the whole GPU (large-GEMM efficiency
    /// included), choosing the fastest tile and split-K.
    fn gemm_ns(&self, g: &Gemm, rate: f64, tensor_core: bool) -> f64 {
        let a = &self.gpu.kernels;
        let tiles = if tensor_core {
            &a.tensor_core_tiles
        } else {
            &a.cuda_core_tiles
        };
        let sms = f64::from(self.gpu.sms.max(1));
        let intensity = |t: &[u32; 2]| {
            let (x, y) = (f64::from(t[0]), f64::from(t[1]));
            x * y / (x + y)
        };
        let r = |t: &[u32; 2]| {
            let i = intensity(t);
            i / (i + a.tile_half_intensity)
        };
        let r_best = tiles.iter().map(r).fold(0.0, f64::max).max(1e-9);
        let ramp = |k: f64| k / (k + a.reduction_half);
        let per_sm = rate / sms;
        let mut best = f64::INFINITY;
        for t in tiles {
            let (tm, tn) = (f64::from(t[0]), f64::from(t[1]));
            let ctas = (g.m / tm).ceil() * (g.n / tn).ceil() * g.count.ceil();
            let rel = r(t) / r_best;
            for s in SPLITS {
                let ks = g.k / s;
                if s > 1.0 && ks < MIN_SPLIT_K {
                    break;
                }
                let waves = (ctas * s / sms).ceil();
                let cta = 2.0 * tm * tn * ks / (per_sm * rel * ramp(ks) / ramp(REF_K));
                let reduce = if s > 1.0 {
                    // Partial sums written and read back in FP32, one more kernel.
                    g.m * g.n * g.count * s * 8.0 / self.mem_rate() + self.launch_ns()
                } else {
                    0.0
                };
                best = best.min(waves * cta + reduce);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_gpu;

    #[test]
    fn backward_gemms_move_the_batch_into_the_reduction() {
        let fw = Gemm::new(512.0, 64.0, 128.0, 1.0, BatchDim::M);
        let [dgrad, wgrad] = fw.backward();
        assert_eq!((dgrad.m, dgrad.n, dgrad.k), (512.0, 128.0, 64.0));
        assert_eq!((wgrad.m, wgrad.n, wgrad.k), (128.0, 64.0, 512.0));
        assert_eq!(dgrad.flops() + wgrad.flops(), 2.0 * fw.flops());
        let half = wgrad.scaled(0.5);
        assert_eq!(half.k, 256.0);
        assert_eq!(dgrad.scaled(0.5).m, 256.0);
    }

    #[test]
    fn scaled_work_keeps_weights_and_launches() {
        let mut w = OpWork::new(OpClass::Gemm, 1e9, 1e6, 5e5, 2);
        w.gemms[0] = Gemm::new(1000.0, 500.0, 1000.0, 1.0, BatchDim::M);
        let s = w.scaled(0.25);
        assert_eq!(s.flops, 2.5e8);
        assert_eq!(s.act_elems, 2.5e5);
        assert_eq!(s.weight_elems, 5e5);
        assert_eq!(s.kernels, 2);
        assert_eq!(s.gemms[0].m, 250.0);
    }

    fn gemm_work(m: f64, n: f64, k: f64) -> OpWork {
        let mut w = OpWork::new(OpClass::Gemm, 2.0 * m * n * k, m * k + m * n, k * n, 1);
        w.gemms[0] = Gemm::new(m, n, k, 1.0, BatchDim::M);
        w
    }

    #[test]
    fn a_large_gemm_runs_at_the_architecture_efficiency() {
        let a100 = load_gpu("a100-80gb").unwrap();
        let km = KernelModel::new(&a100);
        // 8192³ in fp16: many waves, long K: the large-GEMM rate of Ampere's tensor cores.
        let w = gemm_work(8192.0, 8192.0, 8192.0);
        let t = km.time_ns(&w, Dtype::Fp16, Math::FP32);
        let ideal = w.flops / (312e3 * a100.kernels.gemm_efficiency.tensor_core);
        assert!((t / ideal - 1.0).abs() < 0.03, "{t} vs {ideal}");
    }

    #[test]
    fn a_large_v100_gemm_takes_the_time_deepbench_measured() {
        // DeepBench on a DGX-1 V100, CUDA 10.1 (experiments/kernel_rates): M 5124, N 9124,
        // K 2048, no transposes: 1.993 ms with FP16 inputs on the tensor cores, 14.924 ms in
        // FP32 on the CUDA cores. Volta's GEMM efficiencies are these products' rates.
        let v100 = load_gpu("v100-16gb").unwrap();
        let km = KernelModel::new(&v100);
        let w = gemm_work(5124.0, 9124.0, 2048.0);
        for (d, measured_ms) in [(Dtype::Fp16, 1.993), (Dtype::Fp32, 14.924)] {
            let ms = km.time_ns(&w, d, Math::FP32) / 1e6;
            assert!((ms / measured_ms - 1.0).abs() < 0.1, "{d:?}: {ms} ms");
        }
    }

    #[test]
    fn an_odd_vocabulary_sends_hopper_products_to_the_slow_kernels() {
        // GPT-2's LM head: 8192 tokens x 1024 onto 50,257 words (odd: not whole 16-byte
        // vectors), against the padded 50,304.
        let h200 = load_gpu("h200").unwrap();
        let km = KernelModel::new(&h200);
        let (odd, padded) = (
            gemm_work(8192.0, 50257.0, 1024.0),
            gemm_work(8192.0, 50304.0, 1024.0),
        );
        assert!(odd.gemms[0].misaligned(Dtype::Bf16) && !padded.gemms[0].misaligned(Dtype::Bf16));
        // The batch dimension is never a leading dimension: an odd token count is aligned.
        assert!(!gemm_work(8191.0, 1024.0, 1024.0).gemms[0].misaligned(Dtype::Bf16));
        let [dgrad, wgrad] = odd.gemms[0].backward();
        assert!(dgrad.misaligned(Dtype::Bf16) && wgrad.misaligned(Dtype::Bf16));
        let t = |w: &OpWork| km.compute_ns(w, Dtype::Bf16, Math::FP32);
        // Measured: 123 TFLOP/s for these products on the H200 (configs/arch/hopper.yaml).
        let rate = odd.flops / t(&odd) / 1e3;
        assert!((100.0..130.0).contains(&rate), "{rate} TFLOP/s");
        assert!(t(&odd) > 4.0 * t(&padded));
        // Ampere: the rate derived from BigScience's head-count sweep (0.066 of the 312 bf16
        // peak, configs/arch/ampere.yaml), about 20 TFLOP/s; Volta has none: priced as aligned.
        let a100_gpu = load_gpu("a100-80gb").unwrap();
        let a100 = KernelModel::new(&a100_gpu);
        let slow = |km: &KernelModel| km.compute_ns(&odd, Dtype::Fp16, Math::FP32);
        let fast = |km: &KernelModel| km.compute_ns(&padded, Dtype::Fp16, Math::FP32);
        let rate = odd.flops / slow(&a100) / 1e3;
        assert!((15.0..21.0).contains(&rate), "{rate} TFLOP/s");
        let v100_gpu = load_gpu("v100-32gb").unwrap();
        let v100 = KernelModel::new(&v100_gpu);
        assert!(slow(&v100) / fast(&v100) < 1.1);
    }

    #[test]
    fn wave_quantisation_and_short_reductions_cost_time() {
        let a100 = load_gpu("a100-80gb").unwrap();
        let km = KernelModel::new(&a100);
        let per_flop = |m: f64, n: f64, k: f64| {
            let w = gemm_work(m, n, k);
            km.compute_ns(&w, Dtype::Fp16, Math::FP32) / w.flops
        };
        // 108 SMs: one output tile more than a full wave costs part of a second wave on a
        // small problem (a smaller tile or split-K recovers some of it).
        let full = per_flop(12.0 * 256.0, 9.0 * 128.0, 1024.0);
        let over = per_flop(12.0 * 256.0 + 8.0, 9.0 * 128.0, 1024.0);
        assert!(over > 1.2 * full, "{over} vs {full}");
        // A short reduction runs below the rate of a long one.
        assert!(per_flop(4096.0, 4096.0, 64.0) > 1.2 * per_flop(4096.0, 4096.0, 4096.0));
        // Half precision is faster than FP32 on CUDA cores for a large GEMM by about the ratio
        // of the peaks times the efficiencies.
        let w = gemm_work(4096.0, 4096.0, 4096.0);
        let r = km.time_ns(&w, Dtype::Fp32, Math::FP32) / km.time_ns(&w, Dtype::Fp16, Math::FP32);
        let a = &a100.kernels;
        let peaks = (312.0 * a.gemm_efficiency.tensor_core) / (19.5 * a.gemm_efficiency.cuda_core);
        assert!((r / peaks - 1.0).abs() < 0.1, "{r} vs {peaks}");
    }

    #[test]
    fn memory_bound_kernels_have_a_floor_and_the_achieved_bandwidth() {
        let v100 = load_gpu("v100-32gb").unwrap();
        let km = KernelModel::new(&v100);
        let bw = 900.0 * v100.kernels.memory_efficiency;
        let floor = v100.launch_overhead_us * 1e3;
        for elems in [1.0, 1e3, 1e6, 1e8] {
            let w = OpWork::new(OpClass::Elementwise, elems, 3.0 * elems, 0.0, 1);
            let t = km.time_ns(&w, Dtype::Fp32, Math::FP32);
            assert!(
                (t - (12.0 * elems / bw + floor)).abs() < 1e-6,
                "{elems}: {t}"
            );
        }
    }

    /// A depthwise conv moves its bytes at `depthwise_efficiency` of the streaming rate and a
    /// batch norm at `norm_efficiency`, each class only its own; where an architecture has
    /// none, at the streaming rate.
    #[test]
    fn depthwise_convs_and_batch_norm_stream_at_their_fraction_of_the_bandwidth() {
        let mut gpu = load_gpu("a100-80gb").unwrap();
        let elems = 1e9;
        let math = Math::FP32;
        let plain = OpWork::new(OpClass::Elementwise, 0.0, elems, 0.0, 1);
        let dw = OpWork::new(OpClass::DepthwiseConv, 0.0, elems, 0.0, 1);
        let bn = OpWork::new(OpClass::Norm, 0.0, elems, 0.0, 1);
        gpu.kernels.depthwise_efficiency = Some(0.25);
        gpu.kernels.norm_efficiency = Some(0.5);
        let m = KernelModel::new(&gpu);
        let launch = m.launch_floor_ns();
        let t = |w: &OpWork| m.time_ns(w, Dtype::Fp16, math) - launch;
        let (t_plain, t_dw, t_bn) = (t(&plain), t(&dw), t(&bn));
        assert!((t_dw / t_plain - 4.0).abs() < 1e-9, "{t_dw} vs {t_plain}");
        assert!((t_bn / t_plain - 2.0).abs() < 1e-9, "{t_bn} vs {t_plain}");
        gpu.kernels.depthwise_efficiency = None;
        gpu.kernels.norm_efficiency = None;
        let m = KernelModel::new(&gpu);
        for w in [&dw, &bn] {
            assert_eq!(
                m.time_ns(w, Dtype::Fp16, math),
                m.time_ns(&plain, Dtype::Fp16, math)
            );
        }
        assert_eq!(OpClass::DepthwiseConv.math(), MathClass::Vector);
    }

    #[test]
    fn half_storage_runs_matrix_math_in_half() {
        let w = OpWork::new(OpClass::Conv, 1.0, 1.0, 0.0, 1);
        assert_eq!(
            KernelModel::math_dtype(&w, Dtype::Fp16, Math::FP32),
            Dtype::Fp16
        );
        assert_eq!(
            KernelModel::math_dtype(&w, Dtype::Fp32, Math::TF32),
            Dtype::Tf32
        );
        let v = OpWork::new(OpClass::Norm, 1.0, 1.0, 0.0, 1);
        assert_eq!(
            KernelModel::math_dtype(&v, Dtype::Fp32, Math::TF32),
            Dtype::Fp32
        );
    }
}
