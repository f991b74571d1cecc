//! Layer tables of the zoo's transformers: BERT pre-training (HuggingFace `BertForPreTraining`:
//! encoder, pooler, MLM head with its decoder tied to the word embeddings, NSP head) and GPT-2
//! (`GPT2LMHeadModel`: decoder-only, pre-LayerNorm, LM head tied to `wte`), one [`Layer`] per
//! PyTorch operator with HuggingFace module names, fp32 training.
//!
//! Counting rules are those of `cnn.rs` (same `Builder`): linear fw = 2·in·out·tokens (+1 FLOP
//! per output for the bias), bw = 2× the GEMM term; batched matmuls QKᵀ and AV =
//! 2·batch·heads·seq·seq·head_dim each, bw 2×; norms 7 FLOPs/element, GELU 8, tanh 4, dropout 2,
//! add 1, softmax 5 (+1 per folded op), cross-entropy 5 per logit; bw 2× fw for those except
//! ReLU/dropout (1×) and the residual add (0, its gradient accumulation is charged to the fork);
//! saved tensors are charged once, to the first op that keeps them; dropout masks count n/4.
//! Transformer specifics:
//! * The attention softmax folds the 1/√d scale and the mask (BERT: additive padding mask,
//!   GPT-2: causal `torch.where`): 2 folded ops, so 3 fw and 3 bw kernels, as eager HF runs it.
//! * Position embeddings are counted as batch·seq lookups (the broadcast over the batch and
//!   the batch reduction of their gradient), so all FLOPs scale with the batch.
//! * A tied output layer has no parameter of its own; its backward also accumulates its
//!   weight gradient into the embedding's (vocab·hidden FLOPs, 1 kernel). BERT's decoder keeps
//!   its own bias `cls.predictions.bias`; GPT-2's `lm_head` has none.
//! * The fused QKV of GPT-2 (`c_attn`) is one tensor: both attention matmuls read it, and it is
//!   kept once.
//! * BERT's losses are `loss.masked_lm` over every position (as `BertForPreTraining` computes
//!   the logits for all of them) and `loss.next_sentence`, summed by `loss.total`.

use super::cnn::{Builder, Work};
use super::layers::{Layer, LayerKind, Param};
use crate::cost::kernel::{BatchDim, Gemm};

/// BERT's token-type vocabulary (segment A/B).
const TYPE_VOCAB: u32 = 2;

/// Shape of a BERT-style encoder (`decoder: false`) or a GPT-2-style decoder (`decoder: true`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransformerConfig {
    pub hidden: u32,
    pub heads: u32,
    pub layers: u32,
    /// Sequence length trained on.
    pub seq: u32,
    pub vocab: u32,
    /// Width of the feed-forward layer (4·hidden in all three presets).
    pub intermediate: u32,
    /// Rows of the position-embedding table.
    pub max_positions: u32,
    pub decoder: bool,
    /// The task head on a BERT encoder (ignored for decoders, which predict every token).
    #[serde(default)]
    pub head: Head,
    /// How attention is computed.
    #[serde(default)]
    pub attention: Attention,
    /// How the feed-forward GELU is computed.
    #[serde(default)]
    pub gelu: Gelu,
    /// TensorFlow's composed ops, as graph-mode TensorFlow without XLA runs BERT's
    /// `modeling.py` (google-research/bert, and NVIDIA's fork in DeepLearningExamples'
    /// `TensorFlow/LanguageModeling/BERT`): `tf.nn.dropout` keeps the scaled input and a float
    /// mask for the backward instead of a one-byte mask; `layer_norm` (`tf.contrib.layers`:
    /// `nn.moments` then `nn.batch_normalization`) keeps, beside its input, the inverse standard
    /// deviation times gamma broadcast to the input's size; the tanh GELU written out keeps its
    /// input, tanh's output and the CDF factor. See [`Builder::dropout_scaled`].
    #[serde(default)]
    pub graph_ops: bool,
    /// A Llama decoder (RMSNorm, SwiGLU, grouped-query attention, rotary embeddings, untied
    /// head, no biases) instead of GPT-2's blocks.
    #[serde(default)]
    pub llama: bool,
    /// Key/value heads of grouped-query attention (0: one per query head).
    #[serde(default)]
    pub kv_heads: u32,
    /// How the loss runs and whether the loop holds the logits through the backward.
    #[serde(default)]
    pub loss: Loss,
}

/// How the feed-forward GELU runs (`--gelu`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Gelu {
    /// One kernel each way that keeps its input (`torch.nn.functional.gelu`, Megatron-LM's
    /// bias-GELU; Hugging Face BERT's `gelu`).
    #[default]
    Fused,
    /// The tanh approximation written as eight element-wise ops, autograd keeping four tensors
    /// (Hugging Face GPT-2's `gelu_new`, `NewGELUActivation`).
    Composite,
}

/// How the loss over the logits runs, and whether the training loop keeps the logits alive
/// through the backward (`--loss`). Measured on an H200 (`experiments/gpu_truth/memory_facts.py`,
/// `h200/memory_facts.json`): Hugging Face `BertForPreTraining` in FP32 holds, at its peak, the
/// saved activations plus the logits the script still references plus two logits-sized
/// gradients (PyTorch's `nll_loss` backward writes a dense gradient of the log-probabilities,
/// which `log_softmax`'s backward reads while writing the logits').
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Loss {
    /// `F.cross_entropy` (log-softmax + NLL) with the training loop holding the model's output
    /// (the logits) until the backward is done: Hugging Face's `outputs = model(**batch);
    /// outputs.loss.backward()`, NVIDIA's DLE BERT scripts, minGPT. BERT's default.
    Held,
    /// `F.cross_entropy` with the logits freed before the backward (torchtitan's train step
    /// deletes its `pred`; Hugging Face's `Trainer` keeps only the loss). The llama models'
    /// default, and torchtitan's.
    Freed,
    /// One cross-entropy kernel that keeps one logits-sized buffer and writes the gradient into
    /// it (Megatron-LM's vocab-parallel cross entropy; XLA's fusion in tf and jax). GPT's
    /// default.
    #[default]
    Fused,
}

impl Loss {
    /// The loss a framework's own training loop runs, whatever the model code: tf and jax
    /// compile the loss into one fusion; torchtitan frees the logits before the backward.
    /// `None`: the model code decides (the preset's default or `--loss`).
    pub fn of_framework(f: crate::cost::framework::Framework) -> Option<Loss> {
        use crate::cost::framework::Framework;
        match f {
            Framework::Tf | Framework::Jax => Some(Loss::Fused),
            Framework::Torchtitan => Some(Loss::Freed),
            _ => None,
        }
    }
}

/// How the attention core (QKᵀ, softmax, dropout, ·V) runs (`--attention`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Attention {
    /// Separate kernels, the softmax with its scale and mask as eager Hugging Face runs it
    /// (under autocast in FP32): BERT's default.
    #[default]
    Eager,
    /// Two batched matmuls around one fused scale-mask-softmax kernel in the activations'
    /// dtype (Megatron-LM's `FusedScaleMaskSoftmax`): GPT's default.
    FusedSoftmax,
    /// One fused kernel that never writes the scores (FlashAttention, PyTorch's
    /// `scaled_dot_product_attention`): the backward recomputes them.
    Flash,
}

/// The task head on a BERT encoder (`--head`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Head {
    /// Hugging Face `BertForPreTraining`: MLM logits at every position, plus NSP.
    #[default]
    Pretraining,
    /// Pre-training that predicts the masked positions only (15 % of the sequence, gathered
    /// before the MLM head, as NVIDIA's and Google's BERT do), plus NSP.
    MaskedLm,
    /// SQuAD question answering: one linear layer to start/end logits per token.
    Squad,
    /// Sequence classification on the pooled first token (GLUE-style, 2 labels).
    Classify,
}

impl TransformerConfig {
    /// BERT-base uncased (110 M with the pre-training heads), at the phase-1 sequence length 128.
    pub fn bert_base() -> Self {
        TransformerConfig {
            hidden: 768,
            heads: 12,
            layers: 12,
            seq: 128,
            vocab: 30522,
            intermediate: 3072,
            max_positions: 512,
            decoder: false,
            head: Head::Pretraining,
            attention: Attention::Eager,
            gelu: Gelu::Fused,
            graph_ops: false,
            llama: false,
            kv_heads: 0,
            loss: Loss::Held,
        }
    }

    /// BERT-large uncased (336 M with the pre-training heads), at sequence length 128.
    pub fn bert_large() -> Self {
        TransformerConfig {
            hidden: 1024,
            heads: 16,
            layers: 24,
            intermediate: 4096,
            ..Self::bert_base()
        }
    }

    /// GPT-2 small (124 M), full 1024-token context.
    pub fn gpt2_small() -> Self {
        TransformerConfig {
            hidden: 768,
            heads: 12,
            layers: 12,
            seq: 1024,
            vocab: 50257,
            intermediate: 3072,
            max_positions: 1024,
            decoder: true,
            head: Head::Pretraining,
            attention: Attention::FusedSoftmax,
            gelu: Gelu::Fused,
            graph_ops: false,
            llama: false,
            kv_heads: 0,
            loss: Loss::Fused,
        }
    }

    /// GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12,288, 96 heads of 128,
    /// context 2,048), dense attention, GPT-2's vocabulary, FlashAttention.
    pub fn gpt3_175b() -> Self {
        TransformerConfig {
            hidden: 12288,
            heads: 96,
            layers: 96,
            seq: 2048,
            intermediate: 4 * 12288,
            max_positions: 2048,
            attention: Attention::Flash,
            ..Self::gpt2_small()
        }
    }

    /// Llama 3 8B (meta-llama/Meta-Llama-3-8B `config.json`: hidden 4,096, 32 layers, 32 heads,
    /// 8 key/value heads, intermediate 14,336, vocabulary 128,256, 8,192 positions), trained at
    /// sequence 8,192 with FlashAttention.
    pub fn llama3_8b() -> Self {
        TransformerConfig {
            hidden: 4096,
            heads: 32,
            layers: 32,
            seq: 8192,
            vocab: 128_256,
            intermediate: 14336,
            max_positions: 131_072,
            decoder: true,
            head: Head::Pretraining,
            attention: Attention::Flash,
            gelu: Gelu::Fused,
            graph_ops: false,
            llama: true,
            kv_heads: 8,
            loss: Loss::Freed,
        }
    }

    /// Llama 3 70B (meta-llama/Meta-Llama-3-70B `config.json`: hidden 8,192, 80 layers, 64
    /// heads, 8 key/value heads, intermediate 28,672).
    pub fn llama3_70b() -> Self {
        TransformerConfig {
            hidden: 8192,
            heads: 64,
            layers: 80,
            intermediate: 28672,
            ..Self::llama3_8b()
        }
    }

    /// Llama 3.1 405B (meta-llama/Llama-3.1-405B `config.json`: hidden 16,384, 126 layers, 128
    /// heads, 8 key/value heads, intermediate 53,248).
    pub fn llama3_405b() -> Self {
        TransformerConfig {
            hidden: 16384,
            heads: 128,
            layers: 126,
            intermediate: 53248,
            ..Self::llama3_8b()
        }
    }

    /// Key/value heads (grouped-query attention), the query heads when unset.
    pub fn kv_heads(&self) -> u32 {
        if self.kv_heads == 0 {
            self.heads
        } else {
            self.kv_heads
        }
    }

    /// Checks the fields are positive, within sane limits, `hidden` splits into `heads` and
    /// `seq` fits the position table. The message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("hidden", self.hidden, 1 << 16),
            ("heads", self.heads, 1 << 16),
            ("layers", self.layers, 1 << 10),
            ("seq", self.seq, 1 << 20),
            ("vocab", self.vocab, 1 << 22),
            ("intermediate", self.intermediate, 1 << 20),
            ("max_positions", self.max_positions, 1 << 20),
        ];
        for (name, v, max) in fields {
            if v == 0 {
                return Err(format!("transformer {name} must be > 0"));
            }
            if v > max {
                return Err(format!("transformer {name} = {v} is above the limit {max}"));
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "transformer hidden = {} is not divisible by heads = {}",
                self.hidden, self.heads
            ));
        }
        if self.kv_heads > 0 && !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "transformer heads = {} is not divisible by kv_heads = {}",
                self.heads, self.kv_heads
            ));
        }
        if self.seq > self.max_positions {
            return Err(format!(
                "transformer seq = {} exceeds max_positions = {}",
                self.seq, self.max_positions
            ));
        }
        Ok(())
    }
}

/// A transformer under construction. Element counts saturate instead of overflowing.
struct Net {
    b: Builder,
    batch: u64,
    seq: u64,
    heads: u64,
    hidden: u64,
    /// batch · seq.
    tokens: u64,
    /// TensorFlow's composed ops ([`TransformerConfig::graph_ops`]).
    graph_ops: bool,
}

fn prod(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

impl Net {
    fn new(cfg: &TransformerConfig, batch: u32) -> Self {
        let (batch, seq) = (u64::from(batch), u64::from(cfg.seq));
        Net {
            b: Builder::new(),
            batch,
            seq,
            heads: u64::from(cfg.heads.max(1)),
            hidden: u64::from(cfg.hidden),
            tokens: prod(&[batch, seq]),
            graph_ops: cfg.graph_ops,
        }
    }

    /// An `nn.Embedding(rows, hidden)` looked up once per token.
    fn embedding(&mut self, name: &str, rows: u32) -> usize {
        let (t, table) = (self.tokens, prod(&[u64::from(rows), self.hidden]));
        let out = prod(&[t, self.hidden]);
        let (tf, o) = (t as f64, out as f64);
        let w = Work {
            fw_flops: 0.0,
            fw_elems: tf + 2.0 * o,
            bw_flops: o,
            bw_elems: o + tf + table as f64,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let params = vec![Param {
            name: format!("{name}.weight"),
            elems: table,
        }];
        self.b
            .push(name, LayerKind::Embedding, vec![], w, t, out, params)
    }

    /// `nn.LayerNorm(hidden)` over every token.
    fn layer_norm(&mut self, name: &str, x: usize) -> usize {
        self.layer_norm_rows(name, x, self.tokens)
    }

    /// `nn.LayerNorm(hidden)` over `rows` rows.
    fn layer_norm_rows(&mut self, name: &str, x: usize, rows: u64) -> usize {
        let (n, t, h) = (self.b.out(x), rows as f64, self.hidden as f64);
        let nf = n as f64;
        let w = Work {
            fw_flops: 7.0 * nf,
            fw_elems: 2.0 * nf + 2.0 * h,
            bw_flops: 14.0 * nf,
            bw_elems: 3.0 * nf + 2.0 * t + 3.0 * h,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let mut saved = self.b.keep(x).saturating_add(2 * rows);
        let mut w = w;
        if self.graph_ops {
            // TensorFlow 1's `layer_norm`: `nn.moments` (mean, squared difference, mean) and
            // `nn.batch_normalization`, whose `inv = rsqrt(var + eps) * gamma` broadcasts to the
            // input's size and is kept by `x * inv`; then `mean * inv`, `beta - ...` and the
            // add. Forward 9 kernels, backward about 14 (each op's gradient, broadcasts summed).
            saved = saved.saturating_add(n);
            w = Work {
                fw_flops: 9.0 * nf,
                fw_elems: 14.0 * nf + 2.0 * h,
                bw_flops: 16.0 * nf,
                bw_elems: 26.0 * nf + 3.0 * h,
                fw_kernels: 9,
                bw_kernels: 14,
            };
        }
        let params = ["weight", "bias"].map(|s| Param {
            name: format!("{name}.{s}"),
            elems: self.hidden,
        });
        self.b.push(
            name,
            LayerKind::LayerNorm,
            vec![x],
            w,
            saved,
            n,
            params.to_vec(),
        )
    }

    fn linear(&mut self, name: &str, x: usize, fin: u32, fout: u32) -> usize {
        self.b
            .linear(name, x, self.tokens, u64::from(fin), u64::from(fout))
    }

    /// Elements of one attention-score tensor: batch · heads · seq².
    fn scores_elems(&self) -> u64 {
        prod(&[self.batch, self.heads, self.seq, self.seq])
    }

    /// An attention batched matmul reading `inputs` (`a_elems` + `b_elems`) and writing `out`:
    /// 2·batch·heads·seq·seq·head_dim FLOPs either way (QKᵀ or AV).
    fn bmm(
        &mut self,
        name: &str,
        inputs: Vec<usize>,
        a_elems: u64,
        b_elems: u64,
        out: u64,
        gemm: Gemm,
    ) -> usize {
        let fl = 2.0 * self.scores_elems() as f64 * (self.hidden / self.heads) as f64;
        let (a, bb, o) = (a_elems as f64, b_elems as f64, out as f64);
        let w = Work {
            fw_flops: fl,
            fw_elems: a + bb + o,
            bw_flops: 2.0 * fl,
            bw_elems: o + 2.0 * (a + bb),
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = inputs
            .iter()
            .fold(0u64, |s, &i| s.saturating_add(self.b.keep(i)));
        let i = self.b.push(
            name,
            LayerKind::BatchedMatmul,
            inputs,
            w,
            saved,
            out,
            vec![],
        );
        self.b.layer_mut(i).gemm = Some(gemm);
        i
    }

    /// One attention product per (sequence, head): `m`×`k` by `k`×`n`.
    fn head_gemm(&self, m: u64, n: u64, k: u64) -> Gemm {
        Gemm::new(
            m as f64,
            n as f64,
            k as f64,
            prod(&[self.batch, self.heads]) as f64,
            BatchDim::Count,
        )
    }

    fn matmul_qk(&mut self, name: &str, inputs: Vec<usize>) -> usize {
        let th = prod(&[self.tokens, self.hidden]);
        let g = self.head_gemm(self.seq, self.seq, self.hidden / self.heads);
        self.bmm(name, inputs, th, th, self.scores_elems(), g)
    }

    fn matmul_av(&mut self, name: &str, inputs: Vec<usize>) -> usize {
        let th = prod(&[self.tokens, self.hidden]);
        let g = self.head_gemm(self.seq, self.hidden / self.heads, self.seq);
        self.bmm(name, inputs, self.scores_elems(), th, th, g)
    }

    /// The attention core reading `q`, `k`, `v` (one tensor when they are the fused QKV):
    /// the two batched matmuls around the softmax and its dropout, or one flash kernel.
    fn attention(
        &mut self,
        p: &str,
        inputs: Vec<usize>,
        v: usize,
        cfg: &TransformerConfig,
    ) -> usize {
        match cfg.attention {
            Attention::Flash => self.flash(&format!("{p}.core"), inputs, cfg.decoder),
            a => {
                let s = self.matmul_qk(&format!("{p}.matmul_qk"), inputs);
                let s = if a == Attention::FusedSoftmax {
                    self.fused_softmax(&format!("{p}.softmax"), s)
                } else {
                    self.softmax(&format!("{p}.softmax"), s)
                };
                let drop = if cfg.decoder {
                    "attn_dropout"
                } else {
                    "dropout"
                };
                let s = self.dropout(&format!("{p}.{drop}"), s);
                self.matmul_av(&format!("{p}.matmul_av"), vec![s, v])
            }
        }
    }

    /// One FlashAttention kernel (forward: QKᵀ and ·V over tiles, the softmax kept in
    /// registers; backward: the scores recomputed, 2.5× the forward's FLOPs). A causal
    /// (decoder) kernel skips the masked half. It saves q, k, v, its output and one
    /// log-sum-exp per row.
    fn flash(&mut self, name: &str, inputs: Vec<usize>, causal: bool) -> usize {
        let th = prod(&[self.tokens, self.hidden]);
        let d = self.hidden / self.heads;
        let half = if causal { 0.5 } else { 1.0 };
        let fl = 4.0 * self.scores_elems() as f64 * d as f64 * half;
        let t = th as f64;
        let w = Work {
            fw_flops: fl,
            fw_elems: 4.0 * t,
            bw_flops: 2.5 * fl,
            bw_elems: 8.0 * t,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = inputs
            .iter()
            .fold(0u64, |s, &i| s.saturating_add(self.b.keep(i)))
            .saturating_add(prod(&[self.batch, self.heads, self.seq]));
        let i = self
            .b
            .push(name, LayerKind::Attention, inputs, w, saved, th, vec![]);
        let o = self.b.keep(i);
        self.b.layer_mut(i).saved_elems += o;
        self.b.layer_mut(i).gemm = Some(self.head_gemm(self.seq, self.seq, d));
        i
    }

    /// Megatron's fused scale-mask-softmax: one kernel each way, in the activations' dtype.
    fn fused_softmax(&mut self, name: &str, x: usize) -> usize {
        let n = self.b.out(x);
        let nf = n as f64;
        let w = Work {
            fw_flops: 7.0 * nf,
            fw_elems: 2.0 * nf,
            bw_flops: 14.0 * nf,
            bw_elems: 3.0 * nf,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        let i = self
            .b
            .push(name, LayerKind::Elementwise, vec![x], w, 0, n, vec![]);
        let saved = self.b.keep(i);
        self.b.layer_mut(i).saved_elems = saved;
        i
    }

    /// Softmax over the scores with the scale and the mask folded in (2 folded ops).
    fn softmax(&mut self, name: &str, x: usize) -> usize {
        const FOLDED: u32 = 2;
        let (n, f) = (self.b.out(x), f64::from(FOLDED));
        let nf = n as f64;
        let w = Work {
            fw_flops: (5.0 + f) * nf,
            fw_elems: 2.0 * nf * (1.0 + f),
            bw_flops: 2.0 * (5.0 + f) * nf,
            bw_elems: 3.0 * nf + 2.0 * nf * f,
            fw_kernels: 1 + FOLDED,
            bw_kernels: 1 + FOLDED,
        };
        let i = self
            .b
            .push(name, LayerKind::Softmax, vec![x], w, 0, n, vec![]);
        let saved = self.b.keep(i);
        self.b.layer_mut(i).saved_elems = saved;
        i
    }

    /// Cross-entropy over `logits` in `rows` rows, as `cfg.loss` runs it: the log-softmax keeps
    /// its output for the backward in every case; PyTorch's `cross_entropy` backward also holds
    /// the dense gradient of the log-probabilities while it writes the logits' (a logits-sized
    /// scratch); a loop that holds the model's output keeps the logits until then too.
    fn loss(&mut self, name: &str, logits: usize, rows: u64, cfg: &TransformerConfig) -> usize {
        let i = self.b.loss(name, logits, rows);
        let n = self.b.out(logits);
        match cfg.loss {
            Loss::Fused => {}
            Loss::Freed => self.b.layer_mut(i).bw_scratch_elems = n,
            Loss::Held => {
                let l = self.b.layer_mut(i);
                l.bw_scratch_elems = n;
                l.saved_elems = l.saved_elems.saturating_add(n);
            }
        }
        i
    }

    /// A GEMM onto the vocabulary with the weight of the word embedding `word` (`hidden`·`vocab`,
    /// tied).
    fn tied_head(
        &mut self,
        name: &str,
        x: usize,
        word: usize,
        vocab: u32,
        bias: Option<&str>,
    ) -> usize {
        self.tied_head_rows(name, x, word, self.tokens, vocab, bias)
    }

    /// [`Net::tied_head`] on `rows` rows.
    fn tied_head_rows(
        &mut self,
        name: &str,
        x: usize,
        word: usize,
        rows: u64,
        vocab: u32,
        bias: Option<&str>,
    ) -> usize {
        let v = u64::from(vocab);
        let params: Vec<Param> = bias
            .map(|b| Param {
                name: b.to_string(),
                elems: v,
            })
            .into_iter()
            .collect();
        let i = self
            .b
            .gemm(name, x, rows, self.hidden, v, bias.is_some(), params);
        self.b.tie(i, word, prod(&[self.hidden, v]));
        i
    }

    /// HF `BertLayer` (post-LN).
    fn bert_layer(&mut self, p: &str, x: usize, cfg: &TransformerConfig) -> usize {
        let (h, ff) = (cfg.hidden, cfg.intermediate);
        let q = self.linear(&format!("{p}.attention.self.query"), x, h, h);
        let k = self.linear(&format!("{p}.attention.self.key"), x, h, h);
        let v = self.linear(&format!("{p}.attention.self.value"), x, h, h);
        let qkv = match cfg.attention {
            Attention::Flash => vec![q, k, v],
            _ => vec![q, k],
        };
        let c = self.attention(&format!("{p}.attention.self"), qkv, v, cfg);
        let y = self.linear(&format!("{p}.attention.output.dense"), c, h, h);
        let y = self.dropout(&format!("{p}.attention.output.dropout"), y);
        let y = self
            .b
            .add(&format!("{p}.attention.output.residual_add"), y, x);
        let a = self.layer_norm(&format!("{p}.attention.output.LayerNorm"), y);
        let y = self.linear(&format!("{p}.intermediate.dense"), a, h, ff);
        let y = self.gelu(&format!("{p}.intermediate.intermediate_act_fn"), y, cfg);
        let y = self.linear(&format!("{p}.output.dense"), y, ff, h);
        let y = self.dropout(&format!("{p}.output.dropout"), y);
        let y = self.b.add(&format!("{p}.output.residual_add"), y, a);
        self.layer_norm(&format!("{p}.output.LayerNorm"), y)
    }

    /// The feed-forward activation as `cfg` computes it.
    fn gelu(&mut self, name: &str, x: usize, cfg: &TransformerConfig) -> usize {
        match (cfg.gelu, cfg.graph_ops) {
            (Gelu::Fused, _) => self.b.gelu(name, x),
            (Gelu::Composite, false) => self.b.gelu_composite(name, x),
            (Gelu::Composite, true) => self.b.gelu_composite_graph(name, x),
        }
    }

    /// Dropout as the framework runs it ([`TransformerConfig::graph_ops`]).
    fn dropout(&mut self, name: &str, x: usize) -> usize {
        if self.graph_ops {
            self.b.dropout_scaled(name, x)
        } else {
            self.b.dropout(name, x)
        }
    }

    /// `LlamaRMSNorm(hidden)` over every token: one weight, keeps its input and one inverse
    /// RMS per row.
    fn rms_norm(&mut self, name: &str, x: usize) -> usize {
        let (n, t, h) = (self.b.out(x), self.tokens, self.hidden as f64);
        let nf = n as f64;
        let w = Work {
            fw_flops: 4.0 * nf,
            fw_elems: 2.0 * nf + h,
            bw_flops: 8.0 * nf,
            bw_elems: 3.0 * nf + t as f64 + 2.0 * h,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = self.b.keep(x).saturating_add(t);
        let params = vec![Param {
            name: format!("{name}.weight"),
            elems: self.hidden,
        }];
        self.b
            .push(name, LayerKind::LayerNorm, vec![x], w, saved, n, params)
    }

    /// Rotary position embeddings on q and k (`q·cos + rotate_half(q)·sin`, the same for k):
    /// five element-wise kernels each way per tensor; cos and sin are per position only.
    fn rope(&mut self, name: &str, q: usize, k: usize) -> usize {
        let n = self.b.out(q).saturating_add(self.b.out(k));
        let nf = n as f64;
        let w = Work {
            fw_flops: 3.0 * nf,
            fw_elems: 6.0 * nf,
            bw_flops: 3.0 * nf,
            bw_elems: 6.0 * nf,
            fw_kernels: 10,
            bw_kernels: 10,
        };
        self.b
            .push(name, LayerKind::Elementwise, vec![q, k], w, 0, n, vec![])
    }

    /// HF `LlamaDecoderLayer` (pre-RMSNorm): grouped-query attention with rotary embeddings,
    /// then the SwiGLU MLP (`down(silu(gate(x)) · up(x))`); no biases.
    fn llama_block(&mut self, p: &str, x: usize, cfg: &TransformerConfig) -> usize {
        let (h, ff) = (cfg.hidden, cfg.intermediate);
        let kv = cfg.kv_heads().saturating_mul(h / cfg.heads.max(1));
        let a = self.rms_norm(&format!("{p}.input_layernorm"), x);
        let q = self.linear_no_bias(&format!("{p}.self_attn.q_proj"), a, h, h);
        let k = self.linear_no_bias(&format!("{p}.self_attn.k_proj"), a, h, kv);
        let v = self.linear_no_bias(&format!("{p}.self_attn.v_proj"), a, h, kv);
        let r = self.rope(&format!("{p}.self_attn.rotary_emb"), q, k);
        let c = self.attention(&format!("{p}.self_attn"), vec![r, v], v, cfg);
        let y = self.linear_no_bias(&format!("{p}.self_attn.o_proj"), c, h, h);
        let x = self.b.add(&format!("{p}.residual_add_attn"), y, x);
        let m = self.rms_norm(&format!("{p}.post_attention_layernorm"), x);
        let g = self.linear_no_bias(&format!("{p}.mlp.gate_proj"), m, h, ff);
        let u = self.linear_no_bias(&format!("{p}.mlp.up_proj"), m, h, ff);
        let s = self.b.silu(&format!("{p}.mlp.act_fn"), g);
        let y = self.b.mul(&format!("{p}.mlp.mul"), s, u);
        let y = self.linear_no_bias(&format!("{p}.mlp.down_proj"), y, ff, h);
        self.b.add(&format!("{p}.residual_add_mlp"), y, x)
    }

    fn linear_no_bias(&mut self, name: &str, x: usize, fin: u32, fout: u32) -> usize {
        self.b
            .linear_no_bias(name, x, self.tokens, u64::from(fin), u64::from(fout))
    }

    /// HF `GPT2Block` (pre-LN).
    fn gpt_block(&mut self, p: &str, x: usize, cfg: &TransformerConfig) -> usize {
        let (h, ff) = (cfg.hidden, cfg.intermediate);
        let a = self.layer_norm(&format!("{p}.ln_1"), x);
        let qkv = self.linear(&format!("{p}.attn.c_attn"), a, h, h.saturating_mul(3));
        let c = self.attention(&format!("{p}.attn"), vec![qkv], qkv, cfg);
        let y = self.linear(&format!("{p}.attn.c_proj"), c, h, h);
        let y = self.dropout(&format!("{p}.attn.resid_dropout"), y);
        let x = self.b.add(&format!("{p}.residual_add_attn"), y, x);
        let m = self.layer_norm(&format!("{p}.ln_2"), x);
        let y = self.linear(&format!("{p}.mlp.c_fc"), m, h, ff);
        let y = self.gelu(&format!("{p}.mlp.act"), y, cfg);
        let y = self.linear(&format!("{p}.mlp.c_proj"), y, ff, h);
        let y = self.dropout(&format!("{p}.mlp.dropout"), y);
        self.b.add(&format!("{p}.residual_add_mlp"), y, x)
    }
}

/// The layers of one training step of `cfg` on `batch` sequences: BERT pre-training when
/// `cfg.decoder` is false, a GPT-2 language model otherwise. `cfg` should pass
/// [`TransformerConfig::validate`]; counts saturate rather than overflow on absurd sizes.
pub fn transformer(cfg: &TransformerConfig, batch: u32) -> Vec<Layer> {
    let mut m = Net::new(cfg, batch);
    if cfg.llama {
        // HF `LlamaForCausalLM`: embeddings, blocks, final RMSNorm, an untied LM head.
        let mut x = m.embedding("model.embed_tokens", cfg.vocab);
        for l in 0..cfg.layers {
            x = m.llama_block(&format!("model.layers.{l}"), x, cfg);
        }
        let x = m.rms_norm("model.norm", x);
        let logits = m.linear_no_bias("lm_head", x, cfg.hidden, cfg.vocab);
        m.loss("loss", logits, m.tokens, cfg);
    } else if cfg.decoder {
        let wte = m.embedding("transformer.wte", cfg.vocab);
        let wpe = m.embedding("transformer.wpe", cfg.max_positions);
        let x = m.b.add("transformer.add_wpe", wte, wpe);
        let mut x = m.dropout("transformer.drop", x);
        for l in 0..cfg.layers {
            x = m.gpt_block(&format!("transformer.h.{l}"), x, cfg);
        }
        let x = m.layer_norm("transformer.ln_f", x);
        let logits = m.tied_head("lm_head", x, wte, cfg.vocab, None);
        m.loss("loss", logits, m.tokens, cfg);
    } else {
        let word = m.embedding("bert.embeddings.word_embeddings", cfg.vocab);
        let ty = m.embedding("bert.embeddings.token_type_embeddings", TYPE_VOCAB);
        let x = m.b.add("bert.embeddings.add_token_type", word, ty);
        let pos = m.embedding("bert.embeddings.position_embeddings", cfg.max_positions);
        let x = m.b.add("bert.embeddings.add_position", x, pos);
        let x = m.layer_norm("bert.embeddings.LayerNorm", x);
        let mut x = m.dropout("bert.embeddings.dropout", x);
        for l in 0..cfg.layers {
            x = m.bert_layer(&format!("bert.encoder.layer.{l}"), x, cfg);
        }
        let (h, rows) = (u64::from(cfg.hidden), m.batch);
        match cfg.head {
            Head::Squad => {
                let logits = m.b.linear("qa_outputs", x, m.tokens, h, 2);
                m.loss("loss", logits, 2 * rows, cfg);
            }
            Head::Classify => {
                let pooled = m.b.linear("bert.pooler.dense", x, rows, h, h);
                let pooled = m.b.tanh("bert.pooler.activation", pooled);
                let pooled = m.dropout("dropout", pooled);
                let logits = m.b.linear("classifier", pooled, rows, h, 2);
                m.loss("loss", logits, rows, cfg);
            }
            Head::Pretraining | Head::MaskedLm => {
                // The pooler reads the first token of each sequence only.
                let pooled = m.b.linear("bert.pooler.dense", x, rows, h, h);
                let pooled = m.b.tanh("bert.pooler.activation", pooled);
                // Masked LM: every position, or only the masked 15 % gathered first.
                let predicted = match cfg.head {
                    Head::MaskedLm => prod(&[rows, (u64::from(cfg.seq) * 15).div_ceil(100)]),
                    _ => m.tokens,
                };
                let y =
                    m.b.linear("cls.predictions.transform.dense", x, predicted, h, h);
                let y = m.b.gelu("cls.predictions.transform.transform_act_fn", y);
                let y = m.layer_norm_rows("cls.predictions.transform.LayerNorm", y, predicted);
                let logits = m.tied_head_rows(
                    "cls.predictions.decoder",
                    y,
                    word,
                    predicted,
                    cfg.vocab,
                    Some("cls.predictions.bias"),
                );
                let nsp = m.b.linear("cls.seq_relationship", pooled, rows, h, 2);
                let mlm = m.loss("loss.masked_lm", logits, predicted, cfg);
                let nsp = m.loss("loss.next_sentence", nsp, rows, cfg);
                m.b.add("loss.total", mlm, nsp);
            }
        }
    }
    m.b.finish()
}

#[cfg(test)]
mod tests {
    use super::super::cnn::tests::check_well_formed;
    use super::*;
    use crate::zoo::layers::MathClass;

    fn params(ls: &[Layer]) -> u64 {
        ls.iter().map(Layer::param_elems).sum()
    }
    fn fw(ls: &[Layer]) -> f64 {
        ls.iter().map(|l| l.fw_flops).sum()
    }

    /// BertForPreTraining by hand: embeddings (V + P + 2)·h + 2h; per layer 4(h² + h) + 2·h·f +
    /// f + h + 4h; pooler h² + h; MLM transform h² + h + 2h and decoder bias V (decoder weight
    /// tied); NSP 2h + 2.
    fn bert_params(c: &TransformerConfig) -> u64 {
        let (h, f, v, p) = (
            c.hidden as u64,
            c.intermediate as u64,
            c.vocab as u64,
            c.max_positions as u64,
        );
        let emb = (v + p + 2) * h + 2 * h;
        let layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h;
        emb + c.layers as u64 * layer + (h * h + h) + (h * h + 3 * h + v) + (2 * h + 2)
    }

    #[test]
    fn parameter_counts() {
        let (base, large, gpt) = (
            TransformerConfig::bert_base(),
            TransformerConfig::bert_large(),
            TransformerConfig::gpt2_small(),
        );
        assert_eq!(bert_params(&base), 110_106_428);
        assert_eq!(params(&transformer(&base, 1)), 110_106_428);
        assert_eq!(bert_params(&large), 336_226_108);
        assert_eq!(params(&transformer(&large, 1)), 336_226_108);
        assert_eq!(params(&transformer(&gpt, 1)), 124_439_808);
        // Without the pre-training heads BERT is the familiar 109,482,240 / 335,141,888.
        let heads = |c: &TransformerConfig| {
            bert_params(c) - {
                let (h, v) = (c.hidden as u64, c.vocab as u64);
                h * h + 3 * h + v + 2 * h + 2
            }
        };
        assert_eq!(heads(&base), 109_482_240);
        assert_eq!(heads(&large), 335_141_888);
    }

    /// 2·(non-embedding params acting on every token)·tokens + 2·V·h·tokens (tied output GEMM)
    /// + 2·(pooler + NSP)·batch + 4·layers·batch·seq²·hidden (QKᵀ and AV).
    fn formula(c: &TransformerConfig, batch: u32) -> f64 {
        let (h, f, v) = (c.hidden as f64, c.intermediate as f64, c.vocab as f64);
        let (b, s, l) = (batch as f64, c.seq as f64, c.layers as f64);
        let t = b * s;
        let layer = 4.0 * (h * h + h) + 2.0 * h * f + f + h + 4.0 * h;
        let per_token = l * layer + if c.decoder { 2.0 * h } else { h * h + 3.0 * h };
        let sequence = if c.decoder {
            0.0
        } else {
            h * h + h + 2.0 * h + 2.0
        };
        2.0 * per_token * t + 2.0 * v * h * t + 2.0 * sequence * b + 4.0 * l * b * s * s * h
    }

    #[test]
    fn forward_flops_follow_the_formula() {
        for c in [
            TransformerConfig::bert_base(),
            TransformerConfig::bert_large(),
            TransformerConfig::gpt2_small(),
        ] {
            for batch in [1, 8] {
                let ls = transformer(&c, batch);
                let (got, want) = (fw(&ls), formula(&c, batch));
                assert!(((got - want) / want).abs() < 0.02, "{c:?}: {got} vs {want}");
                let bw: f64 = ls.iter().map(|l| l.bw_flops).sum();
                assert!((1.9..2.1).contains(&(bw / got)), "{}", bw / got);
            }
        }
        // GPT-2 small: 2·123.65 M·1024 + 4·12·1024²·768 ≈ 291.9 GFLOPs per sequence.
        let g = fw(&transformer(&TransformerConfig::gpt2_small(), 1)) / 1e9;
        assert!((290.0..296.0).contains(&g), "{g}");
    }

    #[test]
    fn well_formed() {
        for c in [
            TransformerConfig::bert_base(),
            TransformerConfig::bert_large(),
            TransformerConfig::gpt2_small(),
        ] {
            assert_eq!(c.validate(), Ok(()));
            check_well_formed(&|b| transformer(&c, b));
        }
    }

    #[test]
    fn dag_has_the_residuals() {
        let ls = transformer(&TransformerConfig::bert_base(), 2);
        let idx = |n: &str| {
            ls.iter()
                .position(|l| l.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        let p = "bert.encoder.layer.1";
        let input = idx("bert.encoder.layer.0.output.LayerNorm");
        for m in ["query", "key", "value"] {
            assert_eq!(
                ls[idx(&format!("{p}.attention.self.{m}"))].inputs,
                vec![input]
            );
        }
        let add = &ls[idx(&format!("{p}.attention.output.residual_add"))];
        assert_eq!(
            add.inputs,
            vec![idx(&format!("{p}.attention.output.dropout")), input]
        );
        let qk = &ls[idx(&format!("{p}.attention.self.matmul_qk"))];
        assert_eq!(qk.out_elems, 2 * 12 * 128 * 128);
        assert_eq!(qk.math, MathClass::Matrix);
        // The layer input feeds q, k, v and the residual: 3 gradient accumulations.
        assert_eq!(ls[input].bw_kernels, 2 + 3);

        let ls = transformer(&TransformerConfig::gpt2_small(), 1);
        let idx = |n: &str| {
            ls.iter()
                .position(|l| l.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        let qkv = idx("transformer.h.0.attn.c_attn");
        assert_eq!(ls[idx("transformer.h.0.attn.matmul_qk")].inputs, vec![qkv]);
        assert_eq!(
            ls[idx("transformer.h.0.attn.matmul_av")].inputs,
            vec![idx("transformer.h.0.attn.attn_dropout"), qkv]
        );
        assert_eq!(
            ls[idx("transformer.h.1.residual_add_attn")].inputs,
            vec![
                idx("transformer.h.1.attn.resid_dropout"),
                idx("transformer.h.0.residual_add_mlp")
            ]
        );
        let head = &ls[idx("lm_head")];
        assert!(head.params.is_empty() && head.inputs == vec![idx("transformer.ln_f")]);
        assert_eq!(ls.last().map(|l| l.kind), Some(LayerKind::Loss));
    }

    #[test]
    fn bert_base_saved_activations_per_sequence() {
        // seq 128, batch 1, T = 128 tokens, Th = 98,304, A = 12·128² = 196,608, each tensor once:
        //   embeddings: 3·128 ids + Th (LN input) + 256 stats + Th/4 (mask)       =    123,520
        //   per layer: 16.5·Th (LN out, q, k, v, context, 2 LN inputs, LN out, 4Th GELU in,
        //     4Th GELU out, 2 masks Th/4) + 2.25·A (probs, dropped probs, mask A/4)
        //     + 512 stats = 2,064,896, × 12                                       = 24,778,752
        //   heads: Th (pooler input) + 768 (tanh) + Th (GELU in) + Th + 256 (LN in)
        //     + Th (decoder in) + 128·30,522 (log-probs) + 2 (NSP)               =  4,301,058
        //   the logits the loop holds (`Loss::Held`, BERT's default): 128·30,522 + 2 = 3,906,818
        let held = transformer(&TransformerConfig::bert_base(), 1);
        let saved: u64 = held.iter().map(|l| l.saved_elems).sum();
        assert_eq!(saved, 29_203_330 + 3_906_818);
        let fused = TransformerConfig {
            loss: Loss::Fused,
            ..TransformerConfig::bert_base()
        };
        let saved: u64 = transformer(&fused, 1).iter().map(|l| l.saved_elems).sum();
        assert_eq!(saved, 29_203_330);
    }

    #[test]
    fn the_loss_backward_holds_a_logits_sized_scratch_unless_fused() {
        // GPT-2 small, batch 2: the LM head's logits are 2·1024·50,257 elements.
        let logits = 2 * 1024 * 50_257;
        for (loss, scratch, saved) in [
            (Loss::Fused, 0, logits),
            (Loss::Freed, logits, logits),
            (Loss::Held, logits, 2 * logits),
        ] {
            let cfg = TransformerConfig {
                loss,
                ..TransformerConfig::gpt2_small()
            };
            let ls = transformer(&cfg, 2);
            let l = ls.last().unwrap();
            assert_eq!(l.kind, LayerKind::Loss);
            assert_eq!(ls[l.inputs[0]].out_elems, logits);
            assert_eq!(
                (l.bw_scratch_elems, l.saved_elems),
                (scratch, saved),
                "{loss:?}"
            );
        }
        // Every other layer's backward holds only the gradients of its output and inputs.
        let ls = transformer(&TransformerConfig::bert_base(), 1);
        assert!(
            ls.iter()
                .all(|l| l.kind == LayerKind::Loss || l.bw_scratch_elems == 0)
        );
    }

    #[test]
    fn tensorflow_graph_ops_keep_what_its_gradients_reference() {
        // BERT-base, batch 1, seq 128 (Th = 98,304; attention probabilities 12·128² = 196,608).
        // Per encoder layer TensorFlow keeps, beyond PyTorch: for each of the three dropouts two
        // tensors of its input's size instead of a quarter (one byte of four), for each of the
        // two layer norms the broadcast inverse (Th), and for the written-out GELU two tensors of
        // its 4·Th input beside the input a fused GELU keeps.
        let layer0 = |cfg: &TransformerConfig| -> u64 {
            transformer(cfg, 1)
                .iter()
                .filter(|l| l.name.starts_with("bert.encoder.layer.0."))
                .map(|l| l.saved_elems)
                .sum()
        };
        let torch = TransformerConfig::bert_base();
        let tf = TransformerConfig {
            graph_ops: true,
            gelu: Gelu::Composite,
            ..torch
        };
        let (th, probs) = (98_304u64, 196_608u64);
        let dropout = |n: u64| 2 * n - n.div_ceil(4);
        let extra = dropout(probs) + 2 * dropout(th) + 2 * th + 2 * 4 * th;
        assert_eq!(layer0(&tf) - layer0(&torch), extra);
        assert_eq!(extra, 1_671_168);
    }

    #[test]
    fn composite_gelu_keeps_three_more_tensors_in_fp32() {
        // GPT-2 small, batch 1: each block's GELU input is 4·Th = 4 · 1024 · 768 elements.
        let fused = TransformerConfig::gpt2_small();
        let composite = TransformerConfig {
            gelu: Gelu::Composite,
            ..fused
        };
        let (a, b) = (transformer(&fused, 1), transformer(&composite, 1));
        let saved = |ls: &[Layer]| ls.iter().map(|l| l.saved_elems).sum::<u64>();
        let n = 4 * 1024 * 768u64;
        assert_eq!(saved(&b) - saved(&a), 12 * 3 * n);
        let ls_named = |ls: &[Layer], name: &str| {
            ls.iter()
                .find(|l| l.name == name)
                .cloned()
                .expect("a layer of that name")
        };
        let act = |ls: &[Layer]| {
            ls.iter()
                .find(|l| l.name == "transformer.h.0.mlp.act")
                .cloned()
                .expect("the block's activation")
        };
        let (fa, ca) = (act(&a), act(&b));
        let cp = ls_named(&b, "transformer.h.0.mlp.act.scale");
        assert_eq!((fa.fw_kernels, fa.bw_kernels), (1, 1));
        assert_eq!(
            (ca.fw_kernels + cp.fw_kernels, ca.bw_kernels + cp.bw_kernels),
            (8, 11)
        );
        assert_eq!(fa.saved_elems, n);
        assert_eq!((ca.saved_elems, cp.saved_elems), (3 * n, n));
        // Autocast runs the chain in FP32 (`pow` first); `0.5·x`, like the fused kernel, in the
        // half dtype.
        assert!(ca.kind.class().runs_in_fp32());
        assert!(!cp.kind.class().runs_in_fp32());
        assert!(!fa.kind.class().runs_in_fp32());
        check_well_formed(&|n| transformer(&composite, n));
    }

    /// Parameter counts of the published checkpoints (Hugging Face `LlamaForCausalLM`:
    /// embeddings V·h, per layer q/o h² each, k/v h·(kv·d) each, gate/up/down 3·h·f, two norms
    /// 2h; final norm h; untied head h·V).
    #[test]
    fn llama_presets_have_the_published_parameter_counts() {
        for (c, n) in [
            (TransformerConfig::llama3_8b(), 8_030_261_248u64),
            (TransformerConfig::llama3_70b(), 70_553_706_496),
            (TransformerConfig::llama3_405b(), 405_853_388_800),
        ] {
            assert_eq!(params(&transformer(&c, 1)), n, "{c:?}");
        }
        // GPT-3 175B: 175.0 B in Brown et al. (their count leaves out the position table and
        // biases' rounding): 12·h²·L plus embeddings, biases and norms.
        let g = params(&transformer(&TransformerConfig::gpt3_175b(), 1)) as f64;
        assert!((g / 175.0e9 - 1.0).abs() < 0.005, "{g}");
        check_well_formed(&|n| transformer(&TransformerConfig::llama3_8b(), n));
    }

    #[test]
    fn grouped_query_attention_shrinks_k_and_v() {
        let gqa = TransformerConfig::llama3_8b();
        let mha = TransformerConfig { kv_heads: 0, ..gqa };
        let (a, b) = (transformer(&gqa, 1), transformer(&mha, 1));
        let find = |ls: &[Layer], n: &str| ls.iter().find(|l| l.name == n).cloned().unwrap();
        let k = "model.layers.0.self_attn.k_proj";
        assert_eq!(find(&a, k).param_elems(), 4096 * 1024);
        assert_eq!(find(&b, k).param_elems(), 4096 * 4096);
        // The attention kernel keeps q, k, v: k and v are a quarter of q with 8 of 32 heads.
        let saved = |ls: &[Layer]| ls.iter().map(|l| l.saved_elems).sum::<u64>();
        assert_eq!(saved(&b) - saved(&a), 32 * 2 * 8192 * (4096 - 1024));
        let bad = TransformerConfig { kv_heads: 5, ..gqa };
        assert!(bad.validate().unwrap_err().contains("kv_heads = 5"));
    }

    #[test]
    fn validate_names_the_field() {
        let ok = TransformerConfig::gpt2_small();
        let cases = [
            (TransformerConfig { heads: 5, ..ok }, "divisible"),
            (TransformerConfig { layers: 0, ..ok }, "layers"),
            (
                TransformerConfig {
                    hidden: 1 << 17,
                    heads: 1,
                    ..ok
                },
                "hidden",
            ),
            (
                TransformerConfig {
                    vocab: u32::MAX,
                    ..ok
                },
                "vocab",
            ),
            (TransformerConfig { seq: 2048, ..ok }, "max_positions"),
            (TransformerConfig { heads: 0, ..ok }, "heads"),
        ];
        for (c, word) in cases {
            let e = c.validate().expect_err(word);
            assert!(e.contains(word) && !e.contains('\n'), "{e}");
        }
        // Even an invalid config builds without panicking.
        assert!(!transformer(&TransformerConfig { heads: 0, ..ok }, 1).is_empty());
    }
}
