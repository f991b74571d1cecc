//! The layer-level description every zoo model is written in: one entry per framework operator
//! (a conv, a batch-norm, a GELU, one GEMM), with its work counted at a given batch size.
//!
//! Counts are in elements and FLOPs, not bytes or seconds: the cost model (`crate::cost`) turns
//! them into durations for a GPU and a dtype. One multiply-add is 2 FLOPs.

pub use crate::cost::kernel::MathClass;
use crate::cost::kernel::{Gemm, OpClass};

/// The operator family, for op fusion legality, AMP and display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    Conv,
    /// A conv with one group per channel (`groups == in_channels == out_channels`).
    DepthwiseConv,
    Gemm,
    /// Batched matmul inside attention (QKᵀ, AV): no parameters.
    BatchedMatmul,
    /// The whole attention core as one fused kernel (FlashAttention): no parameters.
    Attention,
    BatchNorm,
    LayerNorm,
    /// ReLU, GELU, tanh, residual add, scale: element-wise.
    Elementwise,
    /// Dropout: element-wise, saving a one-byte mask per element.
    Dropout,
    /// Element-wise ops that autocast runs in FP32 (a chain starting with `pow`).
    ElementwiseFp32,
    Pool,
    Softmax,
    Embedding,
    Concat,
    /// The loss (cross-entropy) at the end of forward.
    Loss,
}

/// One trainable tensor of a layer, named as the framework names it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Param {
    /// PyTorch-style qualified name (`layer1.0.conv1.weight`,
    /// `bert.encoder.layer.0.attention.self.query.weight`).
    pub name: String,
    pub elems: u64,
}

/// One operator of a model at a fixed batch size.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Layer {
    /// Unique, framework-style name (`layer1.0.conv1`, `bert.encoder.layer.3.output.LayerNorm`).
    pub name: String,
    pub kind: LayerKind,
    pub math: MathClass,
    /// Indices of the layers whose outputs this one reads (empty for the first layer). Always
    /// smaller than this layer's own index: the list is in a valid forward order.
    pub inputs: Vec<usize>,
    /// Forward FLOPs at this batch size.
    pub fw_flops: f64,
    /// Elements read and written by the forward pass (inputs, outputs, weights).
    pub fw_elems: f64,
    /// Backward FLOPs (input gradient plus weight gradient).
    pub bw_flops: f64,
    /// Elements read and written by the backward pass.
    pub bw_elems: f64,
    /// Kernels one forward launches (a conv with bias may be 2; softmax 1).
    pub fw_kernels: u32,
    /// Kernels one backward launches.
    pub bw_kernels: u32,
    /// Elements this layer keeps alive from its forward until its backward (what activation
    /// checkpointing would drop).
    pub saved_elems: u64,
    /// Elements of its output.
    pub out_elems: u64,
    /// Elements its backward holds beyond the gradients of its output and inputs: an
    /// intermediate gradient between its backward kernels (PyTorch's cross-entropy writes the
    /// log-probabilities' gradient, dense, before the logits').
    pub bw_scratch_elems: u64,
    pub params: Vec<Param>,
    /// The forward matrix product of a conv (implicit GEMM), linear layer or batched matmul;
    /// the backward's data- and weight-gradient products follow from it ([`Gemm::backward`]).
    pub gemm: Option<Gemm>,
    /// The layer whose weight (its first parameter) this one computes with instead of a weight
    /// of its own: an output layer tied to the word embeddings (GPT-2's `lm_head`, BERT's MLM
    /// decoder). A pipeline that puts the two on different stages holds the weight on both.
    pub tied_to: Option<usize>,
}

impl LayerKind {
    /// The cost model's class for this operator family.
    pub fn class(self) -> OpClass {
        match self {
            LayerKind::Conv => OpClass::Conv,
            LayerKind::DepthwiseConv => OpClass::DepthwiseConv,
            LayerKind::Gemm | LayerKind::BatchedMatmul => OpClass::Gemm,
            LayerKind::Attention => OpClass::Attention,
            LayerKind::BatchNorm => OpClass::Norm,
            LayerKind::LayerNorm => OpClass::LayerNorm,
            LayerKind::Elementwise => OpClass::Elementwise,
            LayerKind::Dropout => OpClass::Dropout,
            LayerKind::ElementwiseFp32 => OpClass::ElementwiseFp32,
            LayerKind::Pool => OpClass::Pool,
            LayerKind::Softmax => OpClass::Softmax,
            LayerKind::Embedding => OpClass::Embedding,
            LayerKind::Concat => OpClass::Copy,
            LayerKind::Loss => OpClass::Reduction,
        }
    }
}

impl Layer {
    /// Total trainable elements of the layer.
    pub fn param_elems(&self) -> u64 {
        self.params.iter().map(|p| p.elems).sum()
    }
}

/// The optimizer a model is conventionally trained with; it sets the optimizer-state memory
/// and the cost of the update ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// SGD with momentum: one state tensor per parameter.
    SgdMomentum,
    /// Adam / AdamW: two state tensors per parameter.
    Adam,
}

impl Optimizer {
    /// State tensors kept per parameter.
    pub fn states_per_param(self) -> u64 {
        match self {
            Optimizer::SgdMomentum => 1,
            Optimizer::Adam => 2,
        }
    }
    /// Elements read plus written per parameter by one update with PyTorch's default
    /// multi-tensor (`foreach`) implementation, each `_foreach_*` op a pass over its lists:
    /// SGD with momentum and weight decay (`_single_tensor_sgd`'s `_multi_tensor_sgd`):
    /// grad += wd·param (r2 w1), buf = m·buf (r1 w1), buf += grad (r2 w1), param −= lr·buf (r2 w1)
    /// = 11; Adam (`_multi_tensor_adam`): lerp m (r2 w1), v·β₂ (r1 w1), v += g² (r2 w1),
    /// √v → denom (r1 w1), denom /= bias (r1 w1), denom += ε (r1 w1), param −= m/denom (r3 w1) = 18.
    pub fn update_elems_per_param(self) -> u64 {
        match self {
            Optimizer::SgdMomentum => 11,
            Optimizer::Adam => 18,
        }
    }
    /// `_foreach_*` passes (kernel launches per group of tensors) of one update (see
    /// [`Optimizer::update_elems_per_param`]).
    pub fn update_kernels(self) -> u32 {
        match self {
            Optimizer::SgdMomentum => 4,
            Optimizer::Adam => 7,
        }
    }
    /// FLOPs per parameter of one update.
    pub fn update_flops_per_param(self) -> f64 {
        match self {
            Optimizer::SgdMomentum => 4.0,
            Optimizer::Adam => 12.0,
        }
    }
}

/// A model at a batch size: its layers in forward order and its optimizer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Model {
    /// Zoo name (`resnet50`, `bert-base`, `gpt`).
    pub name: String,
    /// Per-worker batch size (samples, or sequences for transformers).
    pub batch: u32,
    pub optimizer: Optimizer,
    pub layers: Vec<Layer>,
    /// Tokens per sample: the sequence length of a transformer, 0 for the other models.
    pub tokens_per_sample: u32,
}

impl Model {
    /// Total trainable elements.
    pub fn param_elems(&self) -> u64 {
        self.layers.iter().map(Layer::param_elems).sum()
    }
    /// Forward FLOPs of one iteration on one worker.
    pub fn fw_flops(&self) -> f64 {
        self.layers.iter().map(|l| l.fw_flops).sum()
    }
    /// Model FLOPs of one training step on one worker, the numerator of model FLOPs
    /// utilisation (MFU), by PaLM's convention (Chowdhery et al. 2022, App. B): three times the
    /// forward's matrix products (GEMMs, convolutions, attention's two batched products), the
    /// backward counted as twice the forward whatever the kernels recompute, attention's
    /// products in full even where a causal FlashAttention kernel skips the masked half, and
    /// no recomputation.
    pub fn matrix_flops(&self) -> f64 {
        self.layers
            .iter()
            .filter(|l| l.math == MathClass::Matrix)
            .map(|l| match (l.kind, l.gemm) {
                // One fused attention kernel: QKᵀ and ·V, each 2·m·n·k per head and sample.
                (LayerKind::Attention, Some(g)) => 3.0 * 2.0 * (2.0 * g.m * g.n * g.k * g.count),
                _ => 3.0 * l.fw_flops,
            })
            .sum()
    }
    /// Elements kept for backward, summed over layers.
    pub fn saved_elems(&self) -> u64 {
        self.layers.iter().map(|l| l.saved_elems).sum()
    }
}
