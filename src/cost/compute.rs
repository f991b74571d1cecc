//! Roofline compute cost: how long one operator's kernels take on a GPU.
//!
//! ```text
//! t = max(flops / (peak(math, dtype) · e_math),  bytes / (dram_bw · e_mem))  +  kernels · launch
//! ```
//!
//! `peak` is the matrix (tensor-core) peak for [`MathClass::Matrix`] operators and the vector peak
//! otherwise (`configs/gpus/*.yaml`). The efficiency factors are the fraction of peak that real
//! kernels reach; the defaults ([`Efficiency::default`]) are:
//!
//! | factor | default | why |
//! |---|---|---|
//! | `matrix` | 0.70 | large cuBLAS/cuDNN GEMMs and convolutions reach 65–80 % of the datasheet peak |
//! | `vector` | 0.50 | element-wise and reduction kernels rarely issue FMAs every cycle |
//! | `memory` | 0.80 | STREAM-like kernels reach ~80–90 % of datasheet DRAM bandwidth |
//!
//! `launch` is the GPU's `launch_overhead_us`: the per-kernel cost that remains even when the
//! CPU runs ahead (launch latency plus the kernel's ramp and tail). The model is deliberately
//! simple and calibratable: `trainplan calibrate` measures the peaks on a real GPU.

use crate::cost::config::{Dtype, GpuSpec};
use crate::cost::kernel::MathClass;

/// Achieved fraction of each roofline ceiling. See the module docs for the defaults.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Efficiency {
    pub matrix: f64,
    pub vector: f64,
    pub memory: f64,
}

impl Default for Efficiency {
    fn default() -> Self {
        Efficiency {
            matrix: 0.70,
            vector: 0.50,
            memory: 0.80,
        }
    }
}

/// Roofline model of one GPU computing in one dtype.
#[derive(Clone, Debug)]
pub struct Roofline {
    /// Matrix FLOP/ns achieved.
    matrix: f64,
    /// Vector FLOP/ns achieved.
    vector: f64,
    /// Bytes/ns achieved.
    mem: f64,
    launch_ns: f64,
    dtype: Dtype,
}

impl Roofline {
    pub fn new(gpu: &GpuSpec, dtype: Dtype, eff: Efficiency) -> Self {
        Roofline {
            matrix: gpu.matrix_flops_per_ns(dtype) * eff.matrix,
            vector: gpu.vector_flops_per_ns(dtype) * eff.vector,
            mem: gpu.memory_bytes_per_ns() * eff.memory,
            launch_ns: gpu.launch_overhead_us * 1e3,
            dtype,
        }
    }

    /// The dtype activations and weights are stored in.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Time of `kernels` kernels doing `flops` FLOPs and moving `elems` elements, in ns.
    pub fn time_ns(&self, math: MathClass, flops: f64, elems: f64, kernels: u32) -> f64 {
        let peak = match math {
            MathClass::Matrix => self.matrix,
            MathClass::Vector => self.vector,
        };
        let compute = flops / peak;
        let memory = elems * self.dtype.bytes() as f64 / self.mem;
        compute.max(memory) + kernels as f64 * self.launch_ns
    }

    /// Time to stream `bytes` through DRAM once (read or write), in ns.
    pub fn mem_time_ns(&self, bytes: f64) -> f64 {
        bytes / self.mem
    }
}

/// Round a modelled time to whole nanoseconds (replay works in integers: exact and deterministic).
pub fn ns(t: f64) -> u64 {
    if t.is_finite() && t > 0.0 {
        t.round() as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_gpu;

    #[test]
    fn compute_bound_gemm_on_v100() {
        let v100 = load_gpu("v100-32gb").unwrap();
        let r = Roofline::new(&v100, Dtype::Fp32, Efficiency::default());
        // 1 TFLOP at 15.7 TFLOP/s · 0.7 = 90.99 ms, plus one 4 µs launch.
        let t = r.time_ns(MathClass::Matrix, 1e12, 1e6, 1);
        assert!((t - (1e12 / (15.7e3 * 0.7) + 4000.0)).abs() < 1.0, "{t}");
    }

    #[test]
    fn memory_bound_elementwise_on_v100() {
        let v100 = load_gpu("v100-32gb").unwrap();
        let r = Roofline::new(&v100, Dtype::Fp32, Efficiency::default());
        // 1 G elements · 4 B at 900 GB/s · 0.8 = 5.556 ms.
        let t = r.time_ns(MathClass::Vector, 1e9, 1e9, 0);
        assert!((t - 4e9 / 720.0).abs() < 1.0, "{t}");
    }

    #[test]
    fn half_precision_uses_tensor_cores() {
        let v100 = load_gpu("v100-32gb").unwrap();
        let e = Efficiency::default();
        let fp32 = Roofline::new(&v100, Dtype::Fp32, e).time_ns(MathClass::Matrix, 1e12, 0.0, 0);
        let fp16 = Roofline::new(&v100, Dtype::Fp16, e).time_ns(MathClass::Matrix, 1e12, 0.0, 0);
        assert!((fp32 / fp16 - 125.0 / 15.7).abs() < 1e-9);
    }

    #[test]
    fn ns_rounds_and_clamps() {
        assert_eq!(ns(1.4), 1);
        assert_eq!(ns(1.6), 2);
        assert_eq!(ns(-3.0), 0);
        assert_eq!(ns(f64::NAN), 0);
    }
}
