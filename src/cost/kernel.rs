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

use super::compute::{Efficiency, Roofline};
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Convolution (implicit GEMM: M = N·Ho·Wo, N = Cout/g, K = Cin/g·Kh·Kw).
    Conv,
    /// Dense GEMM (linear layers, `mm`, `addmm`) and batched matmul.
    Gemm,
    /// Attention as one fused kernel (flash / memory-efficient attention).
    Attention,
    /// Batch / layer / group normalisation.
    Norm,
    /// Softmax (with folded scale / mask).
    Softmax,
    /// Element-wise (activations, dropout, adds, casts, scaling).
    #[default]
    Elementwise,
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
/// overhead included, host dispatch not: that is [`crate::cost::host`]).
#[derive(Clone, Debug)]
pub struct KernelModel<'a> {
    gpu: &'a GpuSpec,
}

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

    /// GPU time of `work`'s kernels in ns, values stored in `storage`, FP32 matrix math as
    /// `math` says.
    pub fn time_ns(&self, work: &OpWork, storage: Dtype, math: Math) -> f64 {
        let d = Self::math_dtype(work, storage, math);
        let r = Roofline::new(self.gpu, d, Efficiency::default());
        let bytes_per = storage.bytes() as f64 / d.bytes() as f64;
        r.time_ns(
            work.math,
            work.flops,
            (work.act_elems + work.weight_elems) * bytes_per,
            work.kernels,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
