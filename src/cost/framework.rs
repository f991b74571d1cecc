//! The framework a job runs on, and what follows from it for the cost model: how its kernels are
//! issued (eager, one CPU dispatch per operator, or a compiled graph), in which precision its FP32
//! math runs by default, and how it synchronises gradients by default.
//!
//! `--framework pytorch|horovod|tf|jax|byteps|deepspeed|torchtitan|megatron` (default `pytorch`) is shared by `replay`,
//! `whatif` and `plan`: the framework's default is the baseline every prediction starts from.
//!
//! | framework | issue | FP32 convolutions | FP32 matmuls | default gradient sync |
//! |---|---|---|---|---|
//! | `pytorch` | eager | TF32 on Ampere+ (`cudnn.allow_tf32 = True`) | FP32 (`cuda.matmul.allow_tf32 = False` since 1.12) | DDP: 25 MiB buckets, first 1 MiB |
//! | `horovod` | eager (PyTorch) | as `pytorch` | as `pytorch` | tensor fusion: 128 MiB, 1 ms cycle (0.21+) |
//! | `byteps` | eager (PyTorch) | as `pytorch` | as `pytorch` | 4,096,000 B partitions |
//! | `tf` | graph (`tf.function`) | TF32 on Ampere+ (TF ≥ 2.4) | TF32 on Ampere+ | one all-reduce pack after backward (`MirroredStrategy`, `num_packs=1`) |
//! | `jax` | graph (`jax.jit`, XLA) | TF32 on Ampere+ (default precision) | TF32 on Ampere+ | XLA all-reduce combiner, 30 MiB |
//! | `deepspeed` | eager (PyTorch) | as `pytorch` | as `pytorch` | all-reduce after the backward (`allreduce_bucket_size` 5e8 elements); ZeRO baselines beside it |
//! | `torchtitan` | eager (PyTorch) | as `pytorch` | as `pytorch` | FSDP2 baseline (`fully_shard` per block); `replicate` (DDP buckets) without sharding |
//! | `megatron` | eager (PyTorch) | as `pytorch` | as `pytorch` | one all-reduce of the whole gradient buffer after the backward (no `--overlap-grad-reduce`); the distributed optimizer (ZeRO-1) beside it |
//!
//! Sources: PyTorch "CUDA semantics — TensorFloat-32 (TF32) on Ampere (and later) devices"
//! (`torch.backends.cuda.matmul.allow_tf32` default `False` since 1.12, cuDNN's `True`);
//! TensorFlow 2.4 release notes (TF32 enabled by default); JAX `jax_default_matmul_precision`
//! (`DEFAULT` lets XLA use TF32 on Ampere); PyTorch `DistributedDataParallel(bucket_cap_mb=25)`
//! and `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`; Horovod 0.21 changelog (fusion threshold
//! 128 MiB, cycle time 1 ms); BytePS `BYTEPS_PARTITION_BYTES` default 4096000; XLA
//! `xla_gpu_all_reduce_combine_threshold_bytes` (30 MiB); DeepSpeed configuration JSON docs
//! (`allreduce_bucket_size` 500000000); torchtitan `parallelize_llama` (`replicate` when only
//! `data_parallel_replicate_degree` > 1); Megatron-LM `DistributedDataParallelConfig`
//! (`overlap_grad_reduce` False by default: the gradient buffer is reduced once, after the
//! backward) and `Float16OptimizerWithFloat16Params` (`--bf16`/`--fp16` hold the model in half,
//! FP32 main parameters in the optimizer).

use serde::{Deserialize, Serialize};

use super::config::{Dtype, GpuSpec};

/// A training framework (`--framework`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// PyTorch eager with DistributedDataParallel.
    #[default]
    Pytorch,
    /// Horovod over PyTorch eager.
    Horovod,
    /// TensorFlow 2 (`tf.function` graphs, `MirroredStrategy`).
    Tf,
    /// JAX (`jax.jit`, XLA collectives).
    Jax,
    /// BytePS over PyTorch eager.
    Byteps,
    /// DeepSpeed over PyTorch eager (ZeRO stages 1–3: `ds_config.json`).
    Deepspeed,
    /// torchtitan: PyTorch eager with FSDP2 (`fully_shard` per block) by default.
    Torchtitan,
    /// Megatron-LM (megatron-core): PyTorch eager, its own data-parallel gradient buffer,
    /// tensor, sequence and pipeline parallelism by command-line arguments.
    Megatron,
}

/// How a framework issues its kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exec {
    /// One CPU dispatch per operator, every kernel launched from Python (PyTorch eager).
    #[default]
    Eager,
    /// A compiled graph: the runtime launches the kernels with little per-operator CPU work.
    Graph,
}

/// A framework's default gradient synchronisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncDefault {
    /// PyTorch DDP: gradients in ready order into buckets closed at `bytes` (`first_bytes` for
    /// the first), each bucket one all-reduce as soon as it is full.
    Buckets { first_bytes: u64, bytes: u64 },
    /// Horovod tensor fusion: every `cycle_ns`, the ready tensors in fusion buffers of at most
    /// `threshold_bytes`.
    Fusion { threshold_bytes: u64, cycle_ns: u64 },
    /// BytePS: every tensor cut into pieces of at most `bytes`.
    Partitions { bytes: u64 },
    /// XLA's all-reduce combiner: consecutive ready gradients combined up to `threshold_bytes`.
    Combine { threshold_bytes: u64 },
    /// All gradients in one pack after the whole backward (TF `MirroredStrategy`).
    OnePack,
    /// One collective per gradient tensor (no framework does this; `--sync per-tensor`).
    PerTensor,
}

/// Dtypes of the matrix math (tensor-core classes) of a job whose storage dtype is FP32.
/// Half-precision jobs run all matrix math in their storage dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Math {
    /// Convolutions (cuDNN).
    pub conv: Dtype,
    /// GEMMs, batched matmuls and attention (cuBLAS).
    pub matmul: Dtype,
    /// Activations in channels-last (NHWC) layout, the tensor cores' own; NCHW tensors are
    /// transposed around every tensor-core convolution (cuDNN's `nchwToNhwc`/`nhwcToNchw`
    /// kernels).
    pub channels_last: bool,
    /// The model itself is stored in the half dtype ([`AmpStyle::Pure`]): autocast's FP32
    /// operator classes (softmax, norms, reductions, the loss) run in half precision too.
    pub pure_half: bool,
}

impl Math {
    /// Plain FP32 everywhere.
    pub const FP32: Math = Math {
        conv: Dtype::Fp32,
        matmul: Dtype::Fp32,
        channels_last: false,
        pure_half: false,
    };
    /// TF32 tensor cores for every matrix class.
    pub const TF32: Math = Math {
        conv: Dtype::Tf32,
        matmul: Dtype::Tf32,
        channels_last: false,
        pure_half: false,
    };
}

impl Default for Math {
    fn default() -> Self {
        Math::FP32
    }
}

impl Framework {
    /// Every framework, in `--help` order.
    pub const ALL: [Framework; 8] = [
        Framework::Pytorch,
        Framework::Horovod,
        Framework::Tf,
        Framework::Jax,
        Framework::Byteps,
        Framework::Deepspeed,
        Framework::Torchtitan,
        Framework::Megatron,
    ];

    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Pytorch => "pytorch",
            Framework::Horovod => "horovod",
            Framework::Tf => "tf",
            Framework::Jax => "jax",
            Framework::Byteps => "byteps",
            Framework::Deepspeed => "deepspeed",
            Framework::Torchtitan => "torchtitan",
            Framework::Megatron => "megatron",
        }
    }

    /// How its kernels are issued.
    pub fn exec(self) -> Exec {
        match self {
            Framework::Pytorch
            | Framework::Horovod
            | Framework::Byteps
            | Framework::Deepspeed
            | Framework::Torchtitan
            | Framework::Megatron => Exec::Eager,
            Framework::Tf | Framework::Jax => Exec::Graph,
        }
    }

    /// The matrix math an FP32 model gets by default on `gpu` (TF32 only where the GPU has a
    /// TF32 matrix peak).
    pub fn default_math(self, gpu: &GpuSpec) -> Math {
        let tf32 = gpu.matrix_tflops.contains_key(&Dtype::Tf32);
        let pick = |on: bool| if on && tf32 { Dtype::Tf32 } else { Dtype::Fp32 };
        match self {
            Framework::Pytorch
            | Framework::Horovod
            | Framework::Byteps
            | Framework::Deepspeed
            | Framework::Torchtitan
            | Framework::Megatron => Math {
                conv: pick(true),
                matmul: pick(false),
                channels_last: false,
                pure_half: false,
            },
            Framework::Tf | Framework::Jax => Math {
                conv: pick(true),
                matmul: pick(true),
                channels_last: true,
                pure_half: false,
            },
        }
    }

    /// How its mixed precision holds the model: DeepSpeed's `fp16`/`bf16` sections and
    /// Megatron-LM's `--fp16`/`--bf16` cast the whole model and keep FP32 master weights in the
    /// optimizer (DeepSpeed's `FP16_Optimizer` and ZeRO's FP32 partitions, Megatron's
    /// `Float16OptimizerWithFloat16Params`); the others' AMP is autocast around an FP32 model
    /// (`torch.autocast`, Keras' and JAX's mixed policies, Horovod and BytePS over PyTorch's).
    pub fn default_amp_style(self) -> AmpStyle {
        match self {
            Framework::Deepspeed | Framework::Megatron => AmpStyle::Pure,
            _ => AmpStyle::Autocast,
        }
    }

    /// Whether its model in `half` (the pure style) keeps FP32 gradients: Megatron-LM with
    /// `--bf16` accumulates and reduces them in FP32 (its argument checks turn
    /// `accumulate_allreduce_grads_in_fp32` on for bf16 unless `--grad-reduce-in-bf16`;
    /// `megatron/training/arguments.py`), so its gradient buffers and their all-reduce or
    /// reduce-scatter keep 4 B per parameter (Megatron-LM's distributed-optimizer notes: bf16
    /// parameters with fp32 gradients, 18 B per parameter unsharded). Its fp16 models reduce in
    /// fp16 (the flag is off by default), as DeepSpeed's do.
    pub fn keeps_fp32_grads(self, half: Dtype) -> bool {
        self == Framework::Megatron && half == Dtype::Bf16
    }

    /// Its default gradient synchronisation.
    pub fn default_sync(self) -> SyncDefault {
        match self {
            // torchtitan without sharding wraps the model in `replicate` (DDP's buckets).
            Framework::Pytorch | Framework::Torchtitan => SyncDefault::Buckets {
                first_bytes: 1 << 20,
                bytes: 25 << 20,
            },
            // DeepSpeed without ZeRO all-reduces after the whole backward, in buckets of
            // `allreduce_bucket_size` = 5e8 elements: one pack for any model up to 500 M
            // parameters.
            Framework::Deepspeed => SyncDefault::OnePack,
            // Megatron-LM without `--overlap-grad-reduce` reduces its contiguous gradient
            // buffer once, after the whole backward.
            Framework::Megatron => SyncDefault::OnePack,
            Framework::Horovod => SyncDefault::Fusion {
                threshold_bytes: 128 << 20,
                cycle_ns: 1_000_000,
            },
            Framework::Byteps => SyncDefault::Partitions { bytes: 4_096_000 },
            Framework::Tf => SyncDefault::OnePack,
            Framework::Jax => SyncDefault::Combine {
                threshold_bytes: 30 << 20,
            },
        }
    }
}

impl std::fmt::Display for Framework {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `--precision`: the compute precision of the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Strict FP32 on CUDA cores (TF32 switched off).
    Fp32,
    /// FP32 storage, every matrix class on TF32 tensor cores (`torch.set_float32_matmul_precision("high")`).
    Tf32,
    /// Mixed precision with fp16 (autocast + loss scaling, FP32 master weights).
    Fp16,
    /// Mixed precision with bf16 (autocast, FP32 master weights).
    Bf16,
    /// bf16 mixed precision with FP8 GEMMs (Transformer Engine) where the GPU has an FP8 peak.
    Fp8,
}

impl Precision {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

/// `--amp-style`: how a mixed-precision job (`--precision fp16|bf16|fp8`, the `amp` pass)
/// holds its model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AmpStyle {
    /// Autocast around an FP32 model (`torch.autocast`, apex O1, Keras' `mixed_float16`):
    /// FP32 weights and gradients, a half copy of each weight per step, softmax, norms,
    /// reductions and the loss in FP32, gradients reduced in FP32.
    Autocast,
    /// The model itself in half precision, FP32 master weights in the optimizer (DeepSpeed's
    /// fp16/bf16, Megatron-LM's --fp16/--bf16, apex O2): every activation in half, half
    /// gradients reduced in half, the master weights copied into the model after each step.
    Pure,
}

impl AmpStyle {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AmpStyle::Autocast => "autocast",
            AmpStyle::Pure => "pure",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_gpu;

    #[test]
    fn tf32_defaults_follow_the_framework_and_the_gpu() {
        let a100 = load_gpu("a100-80gb").unwrap();
        let v100 = load_gpu("v100-32gb").unwrap();
        assert_eq!(
            Framework::Pytorch.default_math(&a100),
            Math {
                conv: Dtype::Tf32,
                matmul: Dtype::Fp32,
                channels_last: false,
                pure_half: false,
            }
        );
        let nhwc = |m: Math| Math {
            channels_last: true,
            ..m
        };
        assert_eq!(Framework::Tf.default_math(&a100), nhwc(Math::TF32));
        assert_eq!(Framework::Jax.default_math(&a100), nhwc(Math::TF32));
        // Volta has no TF32: everything stays FP32 (TensorFlow and JAX keep NHWC).
        for f in [Framework::Pytorch, Framework::Horovod, Framework::Byteps] {
            assert_eq!(f.default_math(&v100), Math::FP32, "{f}");
        }
        assert_eq!(Framework::Tf.default_math(&v100), nhwc(Math::FP32));
    }

    #[test]
    fn ddp_is_the_default_sync() {
        assert_eq!(
            Framework::default().default_sync(),
            SyncDefault::Buckets {
                first_bytes: 1 << 20,
                bytes: 25 << 20
            }
        );
        assert_eq!(Framework::Tf.exec(), Exec::Graph);
        assert_eq!(Framework::Horovod.exec(), Exec::Eager);
    }
}
