//! Layer tables of the ImageNet CNNs of the zoo (ResNet-50, VGG-16, Inception-v3, fp32 training,
//! 1000 classes), one [`Layer`] per PyTorch operator with torchvision module names, plus the
//! small operator `Builder` that `transformer.rs` shares.
//!
//! Counting rules (n = elements of the op's output unless said otherwise; "elems" are elements
//! read plus written, each tensor counted once even when two kernels read it):
//!
//! | op | fw FLOPs | bw FLOPs | fw elems | bw elems | saved | kernels fw/bw |
//! |---|---|---|---|---|---|---|
//! | conv | 2·Cin/g·Kh·Kw·Cout·Ho·Wo·N (+n bias) | 2× the MACs term (+n bias); first conv 1× (no dgrad) | in+w+b+out | gout+in+w+gin+gw+gb (first: no w, gin) | its input | 1(+1 bias) / 2(+1 bias), first 1(+1) |
//! | linear | 2·in·out·rows (+n bias) | 2× the GEMM term (+n bias) | in+w+b+out | gout+in+w+gin+gw+gb | its input | 1 (bias in the GEMM) / 2(+1 bias) |
//! | batched matmul | 2·M·N·K·batch | 2× fw | a+b+out | gout+a+b+ga+gb | both inputs | 1 / 2 |
//! | batch/layer norm | 7·n (mean 1, var 2, normalize 2, affine 2) | 2× fw | in+out+params | gout+in+gin+params+grads | input + 2 stats per channel/row | BN 1/1 (cuDNN), LN 1/2 |
//! | ReLU | 1·n | 1× fw | 2n | 3n | its output | 1 / 1 |
//! | dropout | 2·n (compare, scale) | 1× fw | 2n + n/4 mask | 2n + n/4 | mask as n/4 (1 byte vs 4) | 1 / 1 |
//! | GELU / tanh | 8·n / 4·n | 2× fw | 2n | 3n | GELU its input, tanh its output | 1 / 1 |
//! | softmax (+f folded scale/mask ops) | (5+f)·n | 2× fw | 2n·(1+f) | 3n + 2n·f | its output | 1+f / 1+f |
//! | residual add | 1·n | 0 (pass-through) | 3n | 0 | nothing | 1 / 0 |
//! | concat | 0 | 0 | 2n | 2n (grad slices made contiguous) | nothing | 1 / 1 |
//! | max / avg pool k×k | k²·n | 1 per input element | in+out (+n indices, max) | gout+gin (+indices) | its input (+n indices, max; counted 1 element each) | 1 / 1 |
//! | embedding | 0 | 1 per looked-up element | ids+2·out | gout+ids+table grad | the ids | 1 / 2 |
//! | cross-entropy over L logits | 5·L | 2× fw | L+targets+1 | 2L+targets | log-softmax output (L) | 2 / 2 |
//!
//! Two rules apply after the table:
//! * **Saved tensors are counted once.** A tensor several ops keep (a ReLU output kept by the
//!   ReLU and by the next conv, a LayerNorm output kept by query, key and value) is charged to the
//!   first op in forward order that keeps it; later keepers add 0. `Model::saved_elems` is then
//!   the activation memory autograd really holds, not a multiple of it.
//! * **Forks pay the gradient accumulation.** An output read by k > 1 layers gets (k−1) extra
//!   backward adds (n FLOPs, 3n elems, 1 kernel each) on its producer; this is where residual and
//!   Inception-branch gradients are summed, which is why the residual add's own backward is free.
//!
//! Conventions: torchvision ResNet/Inception convs have no bias, VGG convs and every `fc` do;
//! BN running statistics are buffers, not parameters. Inception-v3 is built with
//! `aux_logits=False` (the AuxLogits head would add 3,326,696 parameters: 27,161,264 in all).
//! Every model ends with its cross-entropy loss layer named `loss`.

use super::layers::{Layer, LayerKind, MathClass, Param};
use crate::cost::kernel::{BatchDim, Gemm};

/// Work of one operator at a batch size, as the `Layer` fields of the same names.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Work {
    pub fw_flops: f64,
    pub fw_elems: f64,
    pub bw_flops: f64,
    pub bw_elems: f64,
    pub fw_kernels: u32,
    pub bw_kernels: u32,
}

/// Appends layers in forward order, charges saved tensors once and adds the fork gradient
/// accumulation on [`Builder::finish`]. Holds the shape-free operators both zoo files use.
pub(super) struct Builder {
    layers: Vec<Layer>,
    kept: Vec<bool>,
}

fn param(name: &str, suffix: &str, elems: u64) -> Param {
    Param {
        name: format!("{name}.{suffix}"),
        elems,
    }
}

impl Builder {
    pub(super) fn new() -> Self {
        Builder {
            layers: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// Output elements of layer `i`.
    pub(super) fn out(&self, i: usize) -> u64 {
        self.layers[i].out_elems
    }

    pub(super) fn layer_mut(&mut self, i: usize) -> &mut Layer {
        &mut self.layers[i]
    }

    /// Charges layer `i`'s output to the caller's saved set, unless an earlier op keeps it.
    pub(super) fn keep(&mut self, i: usize) -> u64 {
        if std::mem::replace(&mut self.kept[i], true) {
            0
        } else {
            self.out(i)
        }
    }

    /// Appends one layer and returns its index.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn push(
        &mut self,
        name: &str,
        kind: LayerKind,
        inputs: Vec<usize>,
        w: Work,
        saved: u64,
        out: u64,
        params: Vec<Param>,
    ) -> usize {
        let idx = self.layers.len();
        debug_assert!(
            inputs.iter().all(|&i| i < idx),
            "{name}: input after itself"
        );
        let math = match kind {
            LayerKind::Conv | LayerKind::Gemm | LayerKind::BatchedMatmul | LayerKind::Attention => {
                MathClass::Matrix
            }
            _ => MathClass::Vector,
        };
        self.layers.push(Layer {
            name: name.to_string(),
            kind,
            math,
            inputs,
            fw_flops: w.fw_flops,
            fw_elems: w.fw_elems,
            bw_flops: w.bw_flops,
            bw_elems: w.bw_elems,
            fw_kernels: w.fw_kernels,
            bw_kernels: w.bw_kernels,
            saved_elems: saved,
            out_elems: out,
            bw_scratch_elems: 0,
            params,
            gemm: None,
            tied_to: None,
        });
        self.kept.push(false);
        idx
    }

    /// An element-wise op on `x` that keeps its own output (ReLU, tanh) or nothing.
    fn unary(&mut self, name: &str, x: usize, flops: f64, bw_mult: f64, keep_out: bool) -> usize {
        let n = self.out(x) as f64;
        let w = Work {
            fw_flops: flops * n,
            fw_elems: 2.0 * n,
            bw_flops: bw_mult * flops * n,
            bw_elems: 3.0 * n,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        let saved = if keep_out { self.out(x) } else { 0 };
        let i = self.push(
            name,
            LayerKind::Elementwise,
            vec![x],
            w,
            saved,
            self.out(x),
            vec![],
        );
        self.kept[i] = keep_out;
        i
    }

    pub(super) fn relu(&mut self, name: &str, x: usize) -> usize {
        self.unary(name, x, 1.0, 1.0, true)
    }

    /// ReLU6 in place (torchvision's `nn.ReLU6(inplace=True)`, MobileNetV2): `hardtanh_`'s
    /// backward reads its input, not its output, so autograd saves a copy of the input before
    /// the op overwrites it (a clone kernel in the forward). A conv-BN-ReLU6 keeps three
    /// activation-sized tensors (the conv's output for BN, the copy, the ReLU6 output for the
    /// next conv) where conv-BN-ReLU keeps two. Read off PyTorch's autograd graph
    /// (`HardtanhBackward0` saves `self`; one `CloneBackward0` tensor per ReLU6) and the H200
    /// sweep: MobileNetV2 b256 FP32 allocates 20.30 GB (`experiments/gpu_truth/h200/cnn_zoo.json`).
    pub(super) fn relu6(&mut self, name: &str, x: usize) -> usize {
        let i = self.unary(name, x, 1.0, 1.0, true);
        let n = self.out(x);
        let l = &mut self.layers[i];
        l.saved_elems = l.saved_elems.saturating_add(n);
        l.fw_elems += 2.0 * n as f64;
        l.fw_kernels += 1;
        i
    }

    pub(super) fn tanh(&mut self, name: &str, x: usize) -> usize {
        self.unary(name, x, 4.0, 2.0, true)
    }

    /// GELU keeps its input, not its output.
    pub(super) fn gelu(&mut self, name: &str, x: usize) -> usize {
        let i = self.unary(name, x, 8.0, 2.0, false);
        self.layers[i].saved_elems = self.keep(x);
        i
    }

    /// GELU's tanh approximation as separate element-wise ops (Hugging Face's
    /// `NewGELUActivation`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`). Forward: 8 kernels
    /// (pow, 3 scalar ops, tanh, add, 2 muls) reading 10 and writing 8 tensors of x's size.
    /// Autograd keeps x (for pow), tanh's output and both factors of the last product: x plus
    /// three new tensors. Backward: 11 kernels (the product's two grads, tanh's, two scalar
    /// muls, pow's three, x's three incoming grads summed in two adds, the 0.5 factor) over
    /// about 30 tensor passes. Under autocast `pow` is on the float32 list, so the chain from it
    /// runs and saves in FP32 (x cast for pow, tanh's output, `1 + tanh`; the last product
    /// promotes to FP32), while `0.5·x` alone stays in the half dtype — measured: the saved
    /// tensors of Hugging Face GPT-2 medium under bf16 autocast
    /// (`experiments/gpu_truth/h200/saved_tensors.json`). So two layers: `name.scale` (`0.5·x`:
    /// one kernel each way, its output saved by the product) and `name` (the rest, in FP32
    /// under autocast).
    pub(super) fn gelu_composite(&mut self, name: &str, x: usize) -> usize {
        let n = self.out(x);
        let nf = n as f64;
        let scale = Work {
            fw_flops: nf,
            fw_elems: 2.0 * nf,
            bw_flops: nf,
            bw_elems: 2.0 * nf,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        let half = self.push(
            &format!("{name}.scale"),
            LayerKind::Elementwise,
            vec![x],
            scale,
            n,
            n,
            vec![],
        );
        let chain = Work {
            fw_flops: 9.0 * nf,
            fw_elems: 16.0 * nf,
            bw_flops: 15.0 * nf,
            bw_elems: 28.0 * nf,
            fw_kernels: 7,
            bw_kernels: 10,
        };
        let saved = self.keep(x).saturating_add(n.saturating_mul(2));
        self.push(
            name,
            LayerKind::ElementwiseFp32,
            vec![x, half],
            chain,
            saved,
            n,
            vec![],
        )
    }

    /// The tanh GELU as TensorFlow's BERT writes it (`modeling.py` `gelu`:
    /// `x * 0.5 * (1 + tanh(√(2/π)·(x + 0.044715·pow(x, 3))))`), run op by op in graph mode:
    /// the same eight kernels each way as [`Builder::gelu_composite`], but TensorFlow's
    /// gradients keep x (for `pow` and the last product), tanh's output and the CDF factor, two
    /// tensors beside x, where autograd also keeps `0.5·x`. One layer, in FP32 from `pow` on
    /// as under PyTorch's autocast (an assumption for TensorFlow's AMP rewrite).
    pub(super) fn gelu_composite_graph(&mut self, name: &str, x: usize) -> usize {
        let n = self.out(x);
        let nf = n as f64;
        let chain = Work {
            fw_flops: 10.0 * nf,
            fw_elems: 18.0 * nf,
            bw_flops: 16.0 * nf,
            bw_elems: 30.0 * nf,
            fw_kernels: 8,
            bw_kernels: 11,
        };
        let saved = self.keep(x).saturating_add(n.saturating_mul(2));
        self.push(
            name,
            LayerKind::ElementwiseFp32,
            vec![x],
            chain,
            saved,
            n,
            vec![],
        )
    }

    /// TensorFlow's `tf.nn.dropout(x, keep_prob)` (TensorFlow 1.x `nn_ops.py`:
    /// `floor(keep_prob + random_uniform(shape))` as a float mask, then `div(x, keep_prob) *
    /// mask`): five kernels forward; the product's gradient keeps both of its inputs, the
    /// scaled input and the float mask, each the size of x in its dtype (PyTorch keeps one
    /// byte per element). Backward: the product's gradient and the division's.
    pub(super) fn dropout_scaled(&mut self, name: &str, x: usize) -> usize {
        let n = self.out(x);
        let nf = n as f64;
        let w = Work {
            fw_flops: 4.0 * nf,
            fw_elems: 10.0 * nf,
            bw_flops: 2.0 * nf,
            bw_elems: 5.0 * nf,
            fw_kernels: 5,
            bw_kernels: 2,
        };
        self.push(
            name,
            LayerKind::Dropout,
            vec![x],
            w,
            n.saturating_mul(2),
            n,
            vec![],
        )
    }

    pub(super) fn dropout(&mut self, name: &str, x: usize) -> usize {
        let n = self.out(x);
        let nf = n as f64;
        let w = Work {
            fw_flops: 2.0 * nf,
            fw_elems: 2.25 * nf,
            bw_flops: 2.0 * nf,
            bw_elems: 2.25 * nf,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        self.push(
            name,
            LayerKind::Dropout,
            vec![x],
            w,
            n.div_ceil(4),
            n,
            vec![],
        )
    }

    /// Residual add (`b` may broadcast onto `a`); its backward is a pass-through.
    pub(super) fn add(&mut self, name: &str, a: usize, b: usize) -> usize {
        let n = self.out(a).max(self.out(b));
        let w = Work {
            fw_flops: n as f64,
            fw_elems: (self.out(a) as f64) + (self.out(b) as f64) + n as f64,
            fw_kernels: 1,
            ..Work::default()
        };
        self.push(name, LayerKind::Elementwise, vec![a, b], w, 0, n, vec![])
    }

    pub(super) fn concat(&mut self, name: &str, xs: &[usize]) -> usize {
        let n: u64 = xs.iter().map(|&x| self.out(x)).sum();
        let e = 2.0 * n as f64;
        let w = Work {
            fw_elems: e,
            bw_elems: e,
            fw_kernels: 1,
            bw_kernels: 1,
            ..Work::default()
        };
        self.push(name, LayerKind::Concat, xs.to_vec(), w, 0, n, vec![])
    }

    /// `rows` × `fin` → `rows` × `fout` GEMM with the given parameters; `bias` adds a bias vector
    /// of `fout` (named in `params` by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &mut self,
        name: &str,
        x: usize,
        rows: u64,
        fin: u64,
        fout: u64,
        bias: bool,
        params: Vec<Param>,
    ) -> usize {
        let (inp, wt) = (
            rows.saturating_mul(fin) as f64,
            fin.saturating_mul(fout) as f64,
        );
        let out = rows.saturating_mul(fout);
        let (o, b) = (out as f64, if bias { fout as f64 } else { 0.0 });
        let mm = 2.0 * wt * rows as f64;
        let bo = if bias { o } else { 0.0 };
        let w = Work {
            fw_flops: mm + bo,
            fw_elems: inp + wt + b + o,
            bw_flops: 2.0 * mm + bo,
            bw_elems: o + 2.0 * inp + 2.0 * wt + b,
            fw_kernels: 1,
            bw_kernels: 2 + u32::from(bias),
        };
        let saved = self.keep(x);
        let i = self.push(name, LayerKind::Gemm, vec![x], w, saved, out, params);
        self.layers[i].gemm = Some(Gemm::new(
            rows as f64,
            fout as f64,
            fin as f64,
            1.0,
            BatchDim::M,
        ));
        i
    }

    /// `nn.Linear(fin, fout, bias=False)`: `name.weight` only.
    pub(super) fn linear_no_bias(
        &mut self,
        name: &str,
        x: usize,
        rows: u64,
        fin: u64,
        fout: u64,
    ) -> usize {
        let params = vec![param(name, "weight", fin.saturating_mul(fout))];
        self.gemm(name, x, rows, fin, fout, false, params)
    }

    /// SiLU (`x·σ(x)`, one kernel each way): keeps its input.
    pub(super) fn silu(&mut self, name: &str, x: usize) -> usize {
        let i = self.unary(name, x, 4.0, 2.0, false);
        self.layers[i].saved_elems = self.keep(x);
        i
    }

    /// Element-wise product of two tensors of one size (SwiGLU's gate · up): keeps both, its
    /// backward writes both gradients.
    pub(super) fn mul(&mut self, name: &str, a: usize, b: usize) -> usize {
        let n = self.out(a).max(self.out(b));
        let nf = n as f64;
        let w = Work {
            fw_flops: nf,
            fw_elems: 3.0 * nf,
            bw_flops: 2.0 * nf,
            bw_elems: 5.0 * nf,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = self.keep(a).saturating_add(self.keep(b));
        self.push(
            name,
            LayerKind::Elementwise,
            vec![a, b],
            w,
            saved,
            n,
            vec![],
        )
    }

    /// `nn.Linear(fin, fout)` with `name.weight` and `name.bias`.
    pub(super) fn linear(&mut self, name: &str, x: usize, rows: u64, fin: u64, fout: u64) -> usize {
        let params = vec![
            param(name, "weight", fin.saturating_mul(fout)),
            param(name, "bias", fout),
        ];
        self.gemm(name, x, rows, fin, fout, true, params)
    }

    /// Adds the accumulation of a tied weight's gradient (`elems`) into the other user's grad.
    pub(super) fn tie(&mut self, i: usize, owner: usize, elems: u64) {
        let l = &mut self.layers[i];
        l.tied_to = Some(owner);
        l.bw_flops += elems as f64;
        l.bw_elems += 2.0 * elems as f64;
        l.bw_kernels += 1;
    }

    /// Cross-entropy over `logits` elements in `rows` rows (log-softmax + NLL); scalar output.
    pub(super) fn loss(&mut self, name: &str, x: usize, rows: u64) -> usize {
        let l = self.out(x);
        let lf = l as f64;
        let w = Work {
            fw_flops: 5.0 * lf,
            fw_elems: lf + rows as f64 + 1.0,
            bw_flops: 10.0 * lf,
            bw_elems: 2.0 * lf + rows as f64,
            fw_kernels: 2,
            bw_kernels: 2,
        };
        self.push(name, LayerKind::Loss, vec![x], w, l, 1, vec![])
    }

    /// The layers, with every fork's gradient accumulation charged to its producer.
    pub(super) fn finish(mut self) -> Vec<Layer> {
        let mut uses = vec![0u32; self.layers.len()];
        for l in &self.layers {
            for &i in &l.inputs {
                uses[i] += 1;
            }
        }
        for (l, k) in self.layers.iter_mut().zip(uses) {
            if k > 1 {
                let extra = f64::from(k - 1) * l.out_elems as f64;
                l.bw_flops += extra;
                l.bw_elems += 3.0 * extra;
                l.bw_kernels += k - 1;
            }
        }
        self.layers
    }
}

/// A conv's shape: output channels, kernel (h, w), stride, padding (h, w), groups.
#[derive(Clone, Copy)]
struct Cv {
    cout: u64,
    k: (u64, u64),
    stride: u64,
    pad: (u64, u64),
    /// `groups` of `nn.Conv2d`: each output channel reads `cin / groups` input channels.
    groups: u64,
}

/// A square `k`×`k` conv.
const fn sq(cout: u64, k: u64, stride: u64, pad: u64) -> Cv {
    Cv {
        cout,
        k: (k, k),
        stride,
        pad: (pad, pad),
        groups: 1,
    }
}

/// `c` split into `groups` groups (ResNeXt's grouped 3×3 convs).
const fn grouped(c: Cv, groups: u64) -> Cv {
    Cv { groups, ..c }
}

/// A stride-1, same-padded `kh`×`kw` conv (Inception's 1×7, 7×1, 1×3, 3×1).
const fn rect(cout: u64, kh: u64, kw: u64) -> Cv {
    Cv {
        cout,
        k: (kh, kw),
        stride: 1,
        pad: (kh / 2, kw / 2),
        groups: 1,
    }
}

/// A CNN under construction: the `Builder` plus a per-sample `[C, H, W]` shape per layer.
/// `None` as an input means the image.
struct Net {
    b: Builder,
    n: u64,
    image: [u64; 3],
    shape: Vec<[u64; 3]>,
}

impl Net {
    fn new(batch: u32, image: [u64; 3]) -> Self {
        Net {
            b: Builder::new(),
            n: u64::from(batch),
            image,
            shape: Vec::new(),
        }
    }

    fn put(&mut self, i: usize, s: [u64; 3]) -> usize {
        self.shape.push(s);
        debug_assert_eq!(self.shape.len(), i + 1);
        i
    }

    /// Shape-preserving op: records `x`'s shape for `i`.
    fn same(&mut self, i: usize, x: usize) -> usize {
        let s = self.shape[x];
        self.put(i, s)
    }

    fn conv(&mut self, name: &str, x: Option<usize>, c: Cv, bias: bool) -> usize {
        let [cin, h, w] = x.map_or(self.image, |i| self.shape[i]);
        let ho = (h + 2 * c.pad.0 - c.k.0) / c.stride + 1;
        let wo = (w + 2 * c.pad.1 - c.k.1) / c.stride + 1;
        // A grouped conv's window reads `cin / groups` channels: its weight and FLOPs shrink
        // by the group count.
        let per_group = cin / c.groups.max(1);
        let (inp, wt) = (self.n * cin * h * w, per_group * c.k.0 * c.k.1 * c.cout);
        let out = self.n * c.cout * ho * wo;
        let (i, wf, o) = (inp as f64, wt as f64, out as f64);
        let (nb, bc, bo) = if bias {
            (1, c.cout as f64, o)
        } else {
            (0, 0.0, 0.0)
        };
        let mm = 2.0 * wf * (self.n * ho * wo) as f64;
        let (bw_flops, bw_elems, bw_kernels, saved) = match x {
            // The first conv needs no input gradient: wgrad (+ bias grad) only.
            None => (mm + bo, o + i + wf + bc, 1 + nb, inp),
            Some(x) => (
                2.0 * mm + bo,
                o + 2.0 * (i + wf) + bc,
                2 + nb,
                self.b.keep(x),
            ),
        };
        let w = Work {
            fw_flops: mm + bo,
            fw_elems: i + wf + bc + o,
            bw_flops,
            bw_elems,
            fw_kernels: 1 + nb,
            bw_kernels,
        };
        let mut params = vec![param(name, "weight", wt)];
        if bias {
            params.push(param(name, "bias", c.cout));
        }
        let depthwise = c.groups > 1 && per_group == 1 && c.cout == cin;
        let kind = if depthwise {
            LayerKind::DepthwiseConv
        } else {
            LayerKind::Conv
        };
        let j = self
            .b
            .push(name, kind, x.into_iter().collect(), w, saved, out, params);
        if depthwise {
            // A stencil over each channel's own window: no product to tile (`OpClass::DepthwiseConv`).
            return self.put(j, [c.cout, ho, wo]);
        }
        // Implicit GEMM: one row per output pixel, one column per output channel, a reduction
        // over the input channels times the window. A grouped conv is one launch whose tiles
        // span the output channels of every group (cuDNN's grouped implicit-GEMM kernels), each
        // column reducing over its own group's channels only: the short reduction is what it
        // costs (the kernel model's `reduction_half`), not a tile per group.
        self.b.layer_mut(j).gemm = Some(Gemm::new(
            (self.n * ho * wo) as f64,
            c.cout as f64,
            (per_group * c.k.0 * c.k.1) as f64,
            1.0,
            BatchDim::M,
        ));
        self.put(j, [c.cout, ho, wo])
    }

    fn bn(&mut self, name: &str, x: usize) -> usize {
        let (n, c) = (self.b.out(x), self.shape[x][0]);
        let (nf, cf) = (n as f64, c as f64);
        let w = Work {
            fw_flops: 7.0 * nf,
            fw_elems: 2.0 * nf + 4.0 * cf,
            bw_flops: 14.0 * nf,
            bw_elems: 3.0 * nf + 4.0 * cf,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        let saved = self.b.keep(x) + 2 * c;
        let params = vec![param(name, "weight", c), param(name, "bias", c)];
        let i = self
            .b
            .push(name, LayerKind::BatchNorm, vec![x], w, saved, n, params);
        self.same(i, x)
    }

    fn relu(&mut self, name: &str, x: usize) -> usize {
        let i = self.b.relu(name, x);
        self.same(i, x)
    }

    fn relu6(&mut self, name: &str, x: usize) -> usize {
        let i = self.b.relu6(name, x);
        self.same(i, x)
    }

    /// Max or average pooling with a square `k`×`k` window.
    fn pool(&mut self, name: &str, x: usize, k: u64, stride: u64, pad: u64, max: bool) -> usize {
        let [c, h, w] = self.shape[x];
        let (ho, wo) = (
            (h + 2 * pad - k) / stride + 1,
            (w + 2 * pad - k) / stride + 1,
        );
        let (inp, out) = (self.b.out(x), self.n * c * ho * wo);
        let (i, o, idx) = (inp as f64, out as f64, if max { out as f64 } else { 0.0 });
        let wk = Work {
            fw_flops: (k * k) as f64 * o,
            fw_elems: i + o + idx,
            bw_flops: i,
            bw_elems: o + i + idx,
            fw_kernels: 1,
            bw_kernels: 1,
        };
        let saved = self.b.keep(x) + if max { out } else { 0 };
        let j = self
            .b
            .push(name, LayerKind::Pool, vec![x], wk, saved, out, vec![]);
        self.put(j, [c, ho, wo])
    }

    /// `AdaptiveAvgPool2d(side)` on an input whose side is a multiple of `side`.
    fn adaptive_avgpool(&mut self, name: &str, x: usize, side: u64) -> usize {
        let k = self.shape[x][1] / side;
        self.pool(name, x, k, k, 0, false)
    }

    fn cat(&mut self, name: &str, xs: &[usize]) -> usize {
        let i = self.b.concat(name, xs);
        let [_, h, w] = self.shape[xs[0]];
        let c = xs.iter().map(|&x| self.shape[x][0]).sum();
        self.put(i, [c, h, w])
    }

    /// `nn.Linear` on the flattened features of `x`.
    fn linear(&mut self, name: &str, x: usize, fout: u64) -> usize {
        let [c, h, w] = self.shape[x];
        let i = self.b.linear(name, x, self.n, c * h * w, fout);
        self.put(i, [fout, 1, 1])
    }

    /// Classifier dropout then `nn.Linear`.
    fn dropout_linear(&mut self, drop: &str, name: &str, x: usize, fout: u64) -> usize {
        let d = self.b.dropout(drop, x);
        let x = self.same(d, x);
        self.linear(name, x, fout)
    }

    fn finish(mut self, logits: usize) -> Vec<Layer> {
        let i = self.b.loss("loss", logits, self.n);
        self.put(i, [1, 1, 1]);
        self.b.finish()
    }

    // ---- composite blocks (several layers each) ----

    /// torchvision `Bottleneck` (v1.5: stride on the 3×3 conv).
    fn bottleneck(&mut self, p: &str, x: usize, planes: u64, stride: u64, down: bool) -> usize {
        let c = self.conv(&format!("{p}.conv1"), Some(x), sq(planes, 1, 1, 0), false);
        let y = self.bn(&format!("{p}.bn1"), c);
        let y = self.relu(&format!("{p}.relu1"), y);
        let c = self.conv(
            &format!("{p}.conv2"),
            Some(y),
            sq(planes, 3, stride, 1),
            false,
        );
        let y = self.bn(&format!("{p}.bn2"), c);
        let y = self.relu(&format!("{p}.relu2"), y);
        let c = self.conv(
            &format!("{p}.conv3"),
            Some(y),
            sq(4 * planes, 1, 1, 0),
            false,
        );
        let y = self.bn(&format!("{p}.bn3"), c);
        let id = if down {
            let d = sq(4 * planes, 1, stride, 0);
            let d = self.conv(&format!("{p}.downsample.0"), Some(x), d, false);
            self.bn(&format!("{p}.downsample.1"), d)
        } else {
            x
        };
        let y = self.b.add(&format!("{p}.add"), y, id);
        let y = self.same(y, id);
        self.relu(&format!("{p}.relu3"), y)
    }

    /// DeepLearningExamples' ResNeXt bottleneck (`image_classification/models/resnet.py`,
    /// `Bottleneck`): 1×1 to `width`, a 3×3 in `groups` groups (stride here), 1×1 to
    /// `2 × width`; with `se`, its squeeze-and-excitation folded into the residual add.
    fn resnext_block(&mut self, p: &str, x: usize, width: u64, stride: u64, se: bool) -> usize {
        const GROUPS: u64 = 32;
        let out = 2 * width;
        let c = self.conv(&format!("{p}.conv1"), Some(x), sq(width, 1, 1, 0), false);
        let y = self.bn(&format!("{p}.bn1"), c);
        let y = self.relu(&format!("{p}.relu1"), y);
        let c3 = grouped(sq(width, 3, stride, 1), GROUPS);
        let c = self.conv(&format!("{p}.conv2"), Some(y), c3, false);
        let y = self.bn(&format!("{p}.bn2"), c);
        let y = self.relu(&format!("{p}.relu2"), y);
        let c = self.conv(&format!("{p}.conv3"), Some(y), sq(out, 1, 1, 0), false);
        let y = self.bn(&format!("{p}.bn3"), c);
        let id = if stride != 1 || self.shape[x][0] != out {
            let d = self.conv(
                &format!("{p}.downsample.0"),
                Some(x),
                sq(out, 1, stride, 0),
                false,
            );
            self.bn(&format!("{p}.downsample.1"), d)
        } else {
            x
        };
        let y = if se {
            let s = self.squeeze_excitation(&format!("{p}.squeeze"), y);
            self.gate(&format!("{p}.addcmul"), y, s, Some(id))
        } else {
            let a = self.b.add(&format!("{p}.add"), y, id);
            self.same(a, id)
        };
        self.relu(&format!("{p}.relu3"), y)
    }

    /// DeepLearningExamples' `SqueezeAndExcitation` (`models/common.py`): the spatial mean,
    /// `Linear(C, 16)`, ReLU, `Linear(16, C)`, sigmoid — the 16 is the squeeze width itself
    /// (`se_squeeze=16` is passed as `nn.Linear`'s output size), not a reduction ratio.
    fn squeeze_excitation(&mut self, p: &str, x: usize) -> usize {
        const SQUEEZE: u64 = 16;
        let c = self.shape[x][0];
        let m = self.adaptive_avgpool(&format!("{p}.mean"), x, 1);
        let s = self.linear(&format!("{p}.squeeze"), m, SQUEEZE);
        let s = self.relu(&format!("{p}.relu"), s);
        let e = self.linear(&format!("{p}.expand"), s, c);
        // The sigmoid's backward reads its output.
        let g = self.b.unary(&format!("{p}.sigmoid"), e, 4.0, 2.0, true);
        self.same(g, e)
    }

    /// SiLU (`nn.SiLU`: one kernel each way, keeps its input).
    fn silu(&mut self, name: &str, x: usize) -> usize {
        let i = self.b.silu(name, x);
        self.same(i, x)
    }

    /// `x * gate` with a per-channel `gate` broadcast over the pixels (squeeze-and-excitation),
    /// one kernel forward; backward, `x`'s gradient (full size) and the gate's (the product summed
    /// over the pixels) are two kernels. With `residual`, the add folded into the same kernel:
    /// `torch.addcmul(residual, x, gate)` (DeepLearningExamples' `fused_se`), whose residual
    /// gradient passes through.
    fn gate(&mut self, name: &str, x: usize, gate: usize, residual: Option<usize>) -> usize {
        let n = self.b.out(x);
        let (nf, gf) = (n as f64, self.b.out(gate) as f64);
        let add = if residual.is_some() { nf } else { 0.0 };
        let w = Work {
            fw_flops: nf + add,
            fw_elems: 2.0 * nf + gf + add,
            bw_flops: 2.0 * nf + add,
            bw_elems: 3.0 * nf + 2.0 * gf + add,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = self.b.keep(x).saturating_add(self.b.keep(gate));
        let inputs = residual.into_iter().chain([x, gate]).collect();
        let i = self
            .b
            .push(name, LayerKind::Elementwise, inputs, w, saved, n, vec![]);
        self.same(i, x)
    }

    /// DeepLearningExamples' `MBConvBlock` (`image_classification/models/efficientnet.py`,
    /// `original_mbconv`): a 1×1 expansion to `e × cin` (none when `e` is 1), a depthwise
    /// `k`×`k` conv (one group per channel; the stride here), each with BN and SiLU; the
    /// squeeze-and-excitation (`torch.mean` over the pixels, `Linear(hidden, cin/4)`, SiLU,
    /// `Linear(cin/4, hidden)`, sigmoid, times the features); a 1×1 projection with BN; and the
    /// residual add where the shape allows (stochastic depth scales it, one kernel either way).
    fn mbconv(&mut self, p: &str, x: usize, k: u64, s: (u64, u64), cout: u64, wide: bool) -> usize {
        let (stride, e) = s;
        let cin = self.shape[x][0];
        let hidden = cin * e;
        let mut y = x;
        if e != 1 {
            let c = self.conv(
                &format!("{p}.expand.conv"),
                Some(x),
                sq(hidden, 1, 1, 0),
                false,
            );
            let c = self.bn(&format!("{p}.expand.bn"), c);
            y = self.silu(&format!("{p}.expand.act"), c);
        }
        let dw = grouped(sq(hidden, k, stride, k / 2), hidden);
        let c = self.conv(&format!("{p}.depsep.conv"), Some(y), dw, false);
        let c = self.bn(&format!("{p}.depsep.bn"), c);
        let y = self.silu(&format!("{p}.depsep.act"), c);
        let m = self.adaptive_avgpool(&format!("{p}.se.mean"), y, 1);
        // WideSE (`widese_mbconv`, `squeeze_hidden=True`): a quarter of the expanded width.
        let squeeze = if wide { hidden / 4 } else { cin / 4 };
        let s = self.linear(&format!("{p}.se.squeeze"), m, squeeze.max(1));
        let s = self.silu(&format!("{p}.se.act"), s);
        let s = self.linear(&format!("{p}.se.expand"), s, hidden);
        let g = self.b.unary(&format!("{p}.se.sigmoid"), s, 4.0, 2.0, true);
        let g = self.same(g, s);
        let y = self.gate(&format!("{p}.se.mul"), y, g, None);
        let c = self.conv(&format!("{p}.proj.conv"), Some(y), sq(cout, 1, 1, 0), false);
        let y = self.bn(&format!("{p}.proj.bn"), c);
        if stride == 1 && cin == cout {
            let a = self.b.add(&format!("{p}.add"), x, y);
            self.same(a, y)
        } else {
            y
        }
    }

    /// torchvision `BasicBlock`: two 3×3 convs (the stride on the first), each with BN, ReLU
    /// after the first and after the residual add; a 1×1 downsample where the shape changes.
    fn basic_block(&mut self, p: &str, x: usize, planes: u64, stride: u64) -> usize {
        let c = self.conv(
            &format!("{p}.conv1"),
            Some(x),
            sq(planes, 3, stride, 1),
            false,
        );
        let y = self.bn(&format!("{p}.bn1"), c);
        let y = self.relu(&format!("{p}.relu1"), y);
        let c = self.conv(&format!("{p}.conv2"), Some(y), sq(planes, 3, 1, 1), false);
        let y = self.bn(&format!("{p}.bn2"), c);
        let id = if stride != 1 || self.shape[x][0] != planes {
            let d = sq(planes, 1, stride, 0);
            let d = self.conv(&format!("{p}.downsample.0"), Some(x), d, false);
            self.bn(&format!("{p}.downsample.1"), d)
        } else {
            x
        };
        let y = self.b.add(&format!("{p}.add"), y, id);
        let y = self.same(y, id);
        self.relu(&format!("{p}.relu2"), y)
    }

    /// `nn.LayerNorm(C)` over each pixel's channels (ConvNeXt's channels-last norm, and its
    /// `LayerNorm2d`): `C` weights and biases, the row statistics kept for the backward.
    fn layer_norm(&mut self, name: &str, x: usize) -> usize {
        let [c, h, w] = self.shape[x];
        let (n, rows) = (self.b.out(x), self.n * h * w);
        let (nf, cf) = (n as f64, c as f64);
        let wk = Work {
            fw_flops: 7.0 * nf,
            fw_elems: 2.0 * nf + 2.0 * cf,
            bw_flops: 14.0 * nf,
            bw_elems: 3.0 * nf + 2.0 * rows as f64 + 3.0 * cf,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = self.b.keep(x).saturating_add(2 * rows);
        let params = vec![param(name, "weight", c), param(name, "bias", c)];
        let i = self
            .b
            .push(name, LayerKind::LayerNorm, vec![x], wk, saved, n, params);
        self.same(i, x)
    }

    /// `nn.Linear(C, cout)` applied to every pixel of `x` (ConvNeXt's pointwise layers on
    /// channels-last activations): a GEMM of N·H·W rows.
    fn pointwise_linear(&mut self, name: &str, x: usize, cout: u64) -> usize {
        let [c, h, w] = self.shape[x];
        let i = self.b.linear(name, x, self.n * h * w, c, cout);
        self.put(i, [cout, h, w])
    }

    /// ConvNeXt's layer scale: the block's output times a learned per-channel `gamma`
    /// (`layer_scale`, C parameters), one kernel each way.
    fn layer_scale(&mut self, name: &str, x: usize) -> usize {
        let c = self.shape[x][0];
        let n = self.b.out(x) as f64;
        let w = Work {
            fw_flops: n,
            fw_elems: 2.0 * n + c as f64,
            bw_flops: 2.0 * n,
            bw_elems: 3.0 * n + 2.0 * c as f64,
            fw_kernels: 1,
            bw_kernels: 2,
        };
        let saved = self.b.keep(x);
        let params = vec![Param {
            name: format!("{name}.layer_scale"),
            elems: c,
        }];
        let i = self.b.push(
            name,
            LayerKind::Elementwise,
            vec![x],
            w,
            saved,
            self.b.out(x),
            params,
        );
        self.same(i, x)
    }

    /// torchvision's ConvNeXt `CNBlock`: a 7×7 depthwise conv (with bias), LayerNorm over the
    /// channels, `Linear(C, 4C)`, GELU, `Linear(4C, C)`, layer scale, and the residual add
    /// (stochastic depth scales it in the same kernel).
    fn convnext_block(&mut self, p: &str, x: usize) -> usize {
        let c = self.shape[x][0];
        let dw = grouped(sq(c, 7, 1, 3), c);
        let y = self.conv(&format!("{p}.block.0"), Some(x), dw, true);
        let y = self.layer_norm(&format!("{p}.block.2"), y);
        let y = self.pointwise_linear(&format!("{p}.block.3"), y, 4 * c);
        let g = self.b.gelu(&format!("{p}.block.4"), y);
        let y = self.same(g, y);
        let y = self.pointwise_linear(&format!("{p}.block.5"), y, c);
        let y = self.layer_scale(p, y);
        let a = self.b.add(&format!("{p}.add"), x, y);
        self.same(a, y)
    }

    /// torchvision's MobileNetV2 `InvertedResidual`: a 1×1 expansion to `t × cin` (none when
    /// `t` is 1), a 3×3 depthwise conv (the stride here), each with BN and ReLU6, a linear 1×1
    /// projection with BN, and the residual add where the shape allows.
    fn inverted_residual(&mut self, p: &str, x: usize, t: u64, cout: u64, stride: u64) -> usize {
        let cin = self.shape[x][0];
        let hidden = cin * t;
        let mut y = x;
        let mut k = 0;
        if t != 1 {
            let c = self.conv(
                &format!("{p}.conv.0.0"),
                Some(x),
                sq(hidden, 1, 1, 0),
                false,
            );
            let c = self.bn(&format!("{p}.conv.0.1"), c);
            y = self.relu6(&format!("{p}.conv.0.2"), c);
            k = 1;
        }
        let dw = grouped(sq(hidden, 3, stride, 1), hidden);
        let c = self.conv(&format!("{p}.conv.{k}.0"), Some(y), dw, false);
        let c = self.bn(&format!("{p}.conv.{k}.1"), c);
        let y = self.relu6(&format!("{p}.conv.{k}.2"), c);
        let c = self.conv(
            &format!("{p}.conv.{}", k + 1),
            Some(y),
            sq(cout, 1, 1, 0),
            false,
        );
        let y = self.bn(&format!("{p}.conv.{}", k + 2), c);
        if stride == 1 && cin == cout {
            let a = self.b.add(&format!("{p}.add"), x, y);
            self.same(a, y)
        } else {
            y
        }
    }

    /// Inception `BasicConv2d` named `p`: bias-free conv, BN, ReLU.
    fn basic(&mut self, p: &str, x: Option<usize>, c: Cv) -> usize {
        let y = self.conv(&format!("{p}.conv"), x, c, false);
        let y = self.bn(&format!("{p}.bn"), y);
        self.relu(&format!("{p}.relu"), y)
    }

    /// A chain of `BasicConv2d`s named `{p}.{branch}`.
    fn chain(&mut self, p: &str, mut x: usize, convs: &[(&str, Cv)]) -> usize {
        for &(n, c) in convs {
            x = self.basic(&format!("{p}.{n}"), Some(x), c);
        }
        x
    }

    /// `avg_pool2d(3, 1, 1)` then the 1×1 `branch_pool` conv.
    fn pool_branch(&mut self, p: &str, x: usize, cout: u64) -> usize {
        let a = self.pool(&format!("{p}.avg_pool"), x, 3, 1, 1, false);
        self.chain(p, a, &[("branch_pool", sq(cout, 1, 1, 0))])
    }

    fn inception_a(&mut self, p: &str, x: usize, pool_features: u64) -> usize {
        let b1 = self.chain(p, x, &[("branch1x1", sq(64, 1, 1, 0))]);
        let b5 = [
            ("branch5x5_1", sq(48, 1, 1, 0)),
            ("branch5x5_2", sq(64, 5, 1, 2)),
        ];
        let b5 = self.chain(p, x, &b5);
        let b3 = [
            ("branch3x3dbl_1", sq(64, 1, 1, 0)),
            ("branch3x3dbl_2", sq(96, 3, 1, 1)),
            ("branch3x3dbl_3", sq(96, 3, 1, 1)),
        ];
        let b3 = self.chain(p, x, &b3);
        let bp = self.pool_branch(p, x, pool_features);
        self.cat(&format!("{p}.cat"), &[b1, b5, b3, bp])
    }

    fn inception_b(&mut self, p: &str, x: usize) -> usize {
        let b3 = self.chain(p, x, &[("branch3x3", sq(384, 3, 2, 0))]);
        let bd = [
            ("branch3x3dbl_1", sq(64, 1, 1, 0)),
            ("branch3x3dbl_2", sq(96, 3, 1, 1)),
            ("branch3x3dbl_3", sq(96, 3, 2, 0)),
        ];
        let bd = self.chain(p, x, &bd);
        let bp = self.pool(&format!("{p}.max_pool"), x, 3, 2, 0, true);
        self.cat(&format!("{p}.cat"), &[b3, bd, bp])
    }

    fn inception_c(&mut self, p: &str, x: usize, c7: u64) -> usize {
        let b1 = self.chain(p, x, &[("branch1x1", sq(192, 1, 1, 0))]);
        let b7 = [
            ("branch7x7_1", sq(c7, 1, 1, 0)),
            ("branch7x7_2", rect(c7, 1, 7)),
            ("branch7x7_3", rect(192, 7, 1)),
        ];
        let b7 = self.chain(p, x, &b7);
        let bd = [
            ("branch7x7dbl_1", sq(c7, 1, 1, 0)),
            ("branch7x7dbl_2", rect(c7, 7, 1)),
            ("branch7x7dbl_3", rect(c7, 1, 7)),
            ("branch7x7dbl_4", rect(c7, 7, 1)),
            ("branch7x7dbl_5", rect(192, 1, 7)),
        ];
        let bd = self.chain(p, x, &bd);
        let bp = self.pool_branch(p, x, 192);
        self.cat(&format!("{p}.cat"), &[b1, b7, bd, bp])
    }

    fn inception_d(&mut self, p: &str, x: usize) -> usize {
        let b3 = [
            ("branch3x3_1", sq(192, 1, 1, 0)),
            ("branch3x3_2", sq(320, 3, 2, 0)),
        ];
        let b3 = self.chain(p, x, &b3);
        let b7 = [
            ("branch7x7x3_1", sq(192, 1, 1, 0)),
            ("branch7x7x3_2", rect(192, 1, 7)),
            ("branch7x7x3_3", rect(192, 7, 1)),
            ("branch7x7x3_4", sq(192, 3, 2, 0)),
        ];
        let b7 = self.chain(p, x, &b7);
        let bp = self.pool(&format!("{p}.max_pool"), x, 3, 2, 0, true);
        self.cat(&format!("{p}.cat"), &[b3, b7, bp])
    }

    /// InceptionE: each 3×3 branch ends in parallel 1×3 and 3×1 convs, concatenated.
    fn inception_e(&mut self, p: &str, x: usize) -> usize {
        let b1 = self.chain(p, x, &[("branch1x1", sq(320, 1, 1, 0))]);
        let s = self.chain(p, x, &[("branch3x3_1", sq(384, 1, 1, 0))]);
        let a = self.chain(p, s, &[("branch3x3_2a", rect(384, 1, 3))]);
        let b = self.chain(p, s, &[("branch3x3_2b", rect(384, 3, 1))]);
        let b3 = self.cat(&format!("{p}.branch3x3_cat"), &[a, b]);
        let d = [
            ("branch3x3dbl_1", sq(448, 1, 1, 0)),
            ("branch3x3dbl_2", sq(384, 3, 1, 1)),
        ];
        let d = self.chain(p, x, &d);
        let a = self.chain(p, d, &[("branch3x3dbl_3a", rect(384, 1, 3))]);
        let b = self.chain(p, d, &[("branch3x3dbl_3b", rect(384, 3, 1))]);
        let bd = self.cat(&format!("{p}.branch3x3dbl_cat"), &[a, b]);
        let bp = self.pool_branch(p, x, 192);
        self.cat(&format!("{p}.cat"), &[b1, b3, bd, bp])
    }
}

/// torchvision `resnet50` on 224×224 images: 25,557,032 parameters, ≈ 8.2 GFLOPs per image.
pub fn resnet50(batch: u32) -> Vec<Layer> {
    resnet(batch, [3, 4, 6, 3], true)
}

/// torchvision's ResNets on 224×224 images: `blocks` per stage of bottleneck blocks
/// (`resnet50`, `resnet101`, `resnet152`: [3, 4, 6, 3], [3, 4, 23, 3], [3, 8, 36, 3]) or of
/// basic blocks (`resnet18`, `resnet34`: [2, 2, 2, 2], [3, 4, 6, 3]).
pub fn resnet(batch: u32, blocks: [u32; 4], bottleneck: bool) -> Vec<Layer> {
    let mut net = Net::new(batch, [3, 224, 224]);
    let x = net.conv("conv1", None, sq(64, 7, 2, 3), false);
    let x = net.bn("bn1", x);
    let x = net.relu("relu", x);
    let mut x = net.pool("maxpool", x, 3, 2, 1, true);
    let stages = [(64, 1), (128, 2), (256, 2), (512, 2)];
    for (stage, ((planes, stride), n)) in stages.into_iter().zip(blocks).enumerate() {
        for blk in 0..n {
            let s = if blk == 0 { stride } else { 1 };
            let p = format!("layer{}.{blk}", stage + 1);
            x = if bottleneck {
                net.bottleneck(&p, x, planes, s, blk == 0)
            } else {
                net.basic_block(&p, x, planes, s)
            };
        }
    }
    let x = net.adaptive_avgpool("avgpool", x, 1);
    let x = net.linear("fc", x, 1000);
    net.finish(x)
}

/// DeepLearningExamples' `resnext101-32x4d` (`se` false) and `se-resnext101-32x4d` (`se`
/// true) on 224×224 images (`image_classification/models/resnet.py` at
/// NVIDIA/DeepLearningExamples@291f0d02: stem 64, blocks [3, 4, 23, 3], widths
/// [128, 256, 512, 1024], expansion 2, cardinality 32): 44,177,704 and 45,251,128 parameters,
/// ≈ 8.0 G multiply-adds per image. With `blocks` [3, 4, 6, 3], torchvision's
/// `resnext50_32x4d` (25,028,904 parameters: the same block, written there as width
/// `planes × 4/64 × 32` and expansion 4 of `planes`).
pub fn resnext_32x4d(batch: u32, blocks: [u32; 4], se: bool) -> Vec<Layer> {
    let mut net = Net::new(batch, [3, 224, 224]);
    let x = net.conv("conv1", None, sq(64, 7, 2, 3), false);
    let x = net.bn("bn1", x);
    let x = net.relu("relu", x);
    let mut x = net.pool("maxpool", x, 3, 2, 1, true);
    let stages = [(128, 1), (256, 2), (512, 2), (1024, 2)];
    for (stage, ((width, stride), n)) in stages.into_iter().zip(blocks).enumerate() {
        for blk in 0..n {
            let s = if blk == 0 { stride } else { 1 };
            x = net.resnext_block(&format!("layer{}.{blk}", stage + 1), x, width, s, se);
        }
    }
    let x = net.adaptive_avgpool("avgpool", x, 1);
    let x = net.linear("fc", x, 1000);
    net.finish(x)
}

/// [`resnext_32x4d`] with ResNet-101's blocks.
pub fn resnext101_32x4d(batch: u32, se: bool) -> Vec<Layer> {
    resnext_32x4d(batch, [3, 4, 23, 3], se)
}

/// EfficientNet's width rounding (`EffNetArch._scale_width` in DeepLearningExamples, the
/// reference implementation's `round_filters`): `c × w` to the nearest multiple of 8, up by 8
/// where that loses more than 10 %.
fn scale_width(c: u64, w: f64) -> u64 {
    let x = c as f64 * w;
    let r = (((x + 4.0) as u64) / 8 * 8).max(8);
    if (r as f64) < 0.9 * x { r + 8 } else { r }
}

/// DeepLearningExamples' `efficientnet-b0` (`width` 1, `depth` 1, 224×224) and
/// `efficientnet-b4` (1.4, 1.8, 380×380): B0's seven stages (kernels, strides, repeats,
/// expansions, channels) scaled by `EffNetArch.scale` (`image_classification/models/
/// efficientnet.py` at NVIDIA/DeepLearningExamples@c4813240); 5,288,548 and 19,341,616
/// parameters, as torchvision's `efficientnet_b0` and `efficientnet_b4`.
pub fn efficientnet(batch: u32, width: f64, depth: f64, image: u64) -> Vec<Layer> {
    efficientnet_se(batch, width, depth, image, false)
}

/// [`efficientnet`], or with `wide_se` DeepLearningExamples' `efficientnet-widese-*`, whose
/// squeeze-and-excitation squeezes from the expanded channels (`widese_mbconv`): WideSE-B0
/// 8,423,848 and WideSE-B4 34,927,246 parameters.
pub fn efficientnet_se(
    batch: u32,
    width: f64,
    depth: f64,
    image: u64,
    wide_se: bool,
) -> Vec<Layer> {
    const KERNEL: [u64; 7] = [3, 3, 5, 3, 5, 5, 3];
    const STRIDE: [u64; 7] = [1, 2, 2, 2, 1, 2, 1];
    const REPEAT: [u64; 7] = [1, 2, 2, 3, 3, 4, 1];
    const EXPAND: [u64; 7] = [1, 6, 6, 6, 6, 6, 6];
    const CHANNELS: [u64; 7] = [16, 24, 40, 80, 112, 192, 320];
    let mut net = Net::new(batch, [3, image, image]);
    let x = net.conv(
        "stem.conv",
        None,
        sq(scale_width(32, width), 3, 2, 1),
        false,
    );
    let x = net.bn("stem.bn", x);
    let mut x = net.silu("stem.activation", x);
    for i in 0..7 {
        let repeat = (REPEAT[i] as f64 * depth).ceil() as u64;
        let cout = scale_width(CHANNELS[i], width);
        for blk in 0..repeat {
            let s = if blk == 0 { STRIDE[i] } else { 1 };
            let p = format!("layer{}.block{blk}", i + 1);
            x = net.mbconv(&p, x, KERNEL[i], (s, EXPAND[i]), cout, wide_se);
        }
    }
    let c = net.conv(
        "features.conv",
        Some(x),
        sq(scale_width(1280, width), 1, 1, 0),
        false,
    );
    let c = net.bn("features.bn", c);
    let x = net.silu("features.activation", c);
    let x = net.adaptive_avgpool("classifier.pooling", x, 1);
    let x = net.dropout_linear("classifier.dropout", "classifier.fc", x, 1000);
    net.finish(x)
}

/// torchvision's `convnext_tiny` (`depths` [3, 3, 9, 3], `dims` [96, 192, 384, 768]: 28,589,128
/// parameters), `convnext_small` ([3, 3, 27, 3], same dims: 50,223,688) and `convnext_base`
/// ([3, 3, 27, 3], [128, 256, 512, 1024]: 88,591,464) on 224×224 images: a 4×4 stride-4 stem
/// with LayerNorm, the stages of [`Net::convnext_block`] joined by LayerNorm and a 2×2 stride-2
/// conv, then the pooled features' LayerNorm and the classifier.
pub fn convnext(batch: u32, depths: [u32; 4], dims: [u64; 4]) -> Vec<Layer> {
    let mut net = Net::new(batch, [3, 224, 224]);
    let x = net.conv("features.0.0", None, sq(dims[0], 4, 4, 0), true);
    let mut x = net.layer_norm("features.0.1", x);
    for (stage, (&depth, &dim)) in depths.iter().zip(&dims).enumerate() {
        let f = 2 * stage + 1;
        if stage > 0 {
            let y = net.layer_norm(&format!("features.{}.0", f - 1), x);
            x = net.conv(
                &format!("features.{}.1", f - 1),
                Some(y),
                sq(dim, 2, 2, 0),
                true,
            );
        }
        for blk in 0..depth {
            x = net.convnext_block(&format!("features.{f}.{blk}"), x);
        }
    }
    let x = net.adaptive_avgpool("avgpool", x, 1);
    let x = net.layer_norm("classifier.0", x);
    let x = net.linear("classifier.2", x, 1000);
    net.finish(x)
}

/// torchvision's `mobilenet_v2` on 224×224 images: 3,504,872 parameters (a 3×3 stride-2 stem,
/// 17 inverted residual blocks, a 1×1 conv to 1280 features, dropout and the classifier).
pub fn mobilenet_v2(batch: u32) -> Vec<Layer> {
    // (expansion t, channels c, repeats n, stride s) of the first block of each group.
    const SETTINGS: [(u64, u64, u32, u64); 7] = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ];
    let mut net = Net::new(batch, [3, 224, 224]);
    let x = net.conv("features.0.0", None, sq(32, 3, 2, 1), false);
    let x = net.bn("features.0.1", x);
    let mut x = net.relu6("features.0.2", x);
    let mut f = 1;
    for (t, c, n, s) in SETTINGS {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            x = net.inverted_residual(&format!("features.{f}"), x, t, c, stride);
            f += 1;
        }
    }
    let c = net.conv(
        &format!("features.{f}.0"),
        Some(x),
        sq(1280, 1, 1, 0),
        false,
    );
    let c = net.bn(&format!("features.{f}.1"), c);
    let x = net.relu6(&format!("features.{f}.2"), c);
    let x = net.adaptive_avgpool("avgpool", x, 1);
    let x = net.dropout_linear("classifier.0", "classifier.1", x, 1000);
    net.finish(x)
}

/// torchvision `vgg16` (configuration D, no batch norm) on 224×224 images: 138,357,544
/// parameters, ≈ 31 GFLOPs per image.
pub fn vgg16(batch: u32) -> Vec<Layer> {
    // Conv widths, 0 = 2×2 max pool.
    const CFG: [u64; 17] = [
        64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let mut net = Net::new(batch, [3, 224, 224]);
    let x = net.conv("features.0", None, sq(64, 3, 1, 1), true);
    let mut x = net.relu("features.1", x);
    let mut f = 2;
    for c in CFG {
        let name = |i: usize| format!("features.{i}");
        x = if c == 0 {
            net.pool(&name(f), x, 2, 2, 0, true)
        } else {
            let y = net.conv(&name(f), Some(x), sq(c, 3, 1, 1), true);
            f += 1;
            net.relu(&name(f), y)
        };
        f += 1;
    }
    let x = net.adaptive_avgpool("avgpool", x, 7);
    let x = net.linear("classifier.0", x, 4096);
    let x = net.relu("classifier.1", x);
    let x = net.dropout_linear("classifier.2", "classifier.3", x, 4096);
    let x = net.relu("classifier.4", x);
    let x = net.dropout_linear("classifier.5", "classifier.6", x, 1000);
    net.finish(x)
}

/// torchvision `inception_v3(aux_logits=False)` on 299×299 images: 23,834,568 parameters,
/// ≈ 11.5 GFLOPs per image.
pub fn inception_v3(batch: u32) -> Vec<Layer> {
    let mut net = Net::new(batch, [3, 299, 299]);
    let x = net.basic("Conv2d_1a_3x3", None, sq(32, 3, 2, 0));
    let x = net.basic("Conv2d_2a_3x3", Some(x), sq(32, 3, 1, 0));
    let x = net.basic("Conv2d_2b_3x3", Some(x), sq(64, 3, 1, 1));
    let x = net.pool("maxpool1", x, 3, 2, 0, true);
    let x = net.basic("Conv2d_3b_1x1", Some(x), sq(80, 1, 1, 0));
    let x = net.basic("Conv2d_4a_3x3", Some(x), sq(192, 3, 1, 0));
    let x = net.pool("maxpool2", x, 3, 2, 0, true);
    let x = net.inception_a("Mixed_5b", x, 32);
    let x = net.inception_a("Mixed_5c", x, 64);
    let x = net.inception_a("Mixed_5d", x, 64);
    let x = net.inception_b("Mixed_6a", x);
    let x = net.inception_c("Mixed_6b", x, 128);
    let x = net.inception_c("Mixed_6c", x, 160);
    let x = net.inception_c("Mixed_6d", x, 160);
    let x = net.inception_c("Mixed_6e", x, 192);
    let x = net.inception_d("Mixed_7a", x);
    let x = net.inception_e("Mixed_7b", x);
    let x = net.inception_e("Mixed_7c", x);
    let x = net.adaptive_avgpool("avgpool", x, 1);
    let x = net.dropout_linear("dropout", "fc", x, 1000);
    net.finish(x)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashSet;

    fn params(ls: &[Layer]) -> u64 {
        ls.iter().map(Layer::param_elems).sum()
    }
    fn sum(ls: &[Layer], f: impl Fn(&Layer) -> f64) -> f64 {
        ls.iter().map(f).sum()
    }
    fn near(got: f64, want: f64, tol: f64) -> bool {
        ((got - want) / want).abs() <= tol
    }

    /// Structure checks shared with `transformer.rs`: DAG order, unique names, sane counts,
    /// FLOPs linear in the batch.
    pub(in crate::zoo) fn check_well_formed(build: &dyn Fn(u32) -> Vec<Layer>) {
        let ls = build(1);
        assert!(ls[0].inputs.is_empty());
        let mut names = HashSet::new();
        let mut pnames = HashSet::new();
        for (i, l) in ls.iter().enumerate() {
            assert!(
                l.inputs.iter().all(|&j| j < i),
                "{} reads a later layer",
                l.name
            );
            let uniq: HashSet<_> = l.inputs.iter().collect();
            assert_eq!(
                uniq.len(),
                l.inputs.len(),
                "{} lists an input twice",
                l.name
            );
            assert!(
                names.insert(l.name.clone()),
                "duplicate layer name {}",
                l.name
            );
            for p in &l.params {
                assert!(
                    p.elems > 0 && pnames.insert(p.name.clone()),
                    "bad param {}",
                    p.name
                );
            }
            let matrix = matches!(
                l.kind,
                LayerKind::Conv | LayerKind::Gemm | LayerKind::BatchedMatmul | LayerKind::Attention
            );
            assert_eq!(l.math == MathClass::Matrix, matrix, "{}", l.name);
            assert!(
                l.fw_flops >= 0.0 && l.fw_elems > 0.0 && l.fw_kernels >= 1 && l.out_elems > 0,
                "{}",
                l.name
            );
        }
        // Every layer but the last feeds something.
        let used: HashSet<usize> = ls.iter().flat_map(|l| l.inputs.iter().copied()).collect();
        assert_eq!(used.len(), ls.len() - 1);
        let ls4 = build(4);
        assert_eq!(ls4.len(), ls.len());
        // Forward FLOPs are exactly linear; backward too but for tied-weight gradient sums.
        assert!(near(
            sum(&ls4, |l| l.fw_flops),
            4.0 * sum(&ls, |l| l.fw_flops),
            1e-9
        ));
        assert!(near(
            sum(&ls4, |l| l.bw_flops),
            4.0 * sum(&ls, |l| l.bw_flops),
            1e-3
        ));
        assert_eq!(params(&ls4), params(&ls));
    }

    /// Forward FLOPs of the conv and linear layers only (the published GMAC numbers count these).
    fn matrix_gflops(ls: &[Layer]) -> f64 {
        sum(ls, |l| {
            if l.math == MathClass::Matrix {
                l.fw_flops
            } else {
                0.0
            }
        }) / 1e9
    }

    #[test]
    fn parameter_counts_match_torchvision() {
        assert_eq!(params(&resnet50(1)), 25_557_032);
        assert_eq!(params(&vgg16(1)), 138_357_544);
        // aux_logits=False; the AuxLogits head would bring it to 27,161,264.
        assert_eq!(params(&inception_v3(1)), 23_834_568);
    }

    #[test]
    fn forward_flops_per_image() {
        // torchvision's published MACs: 4.09 G, 15.47 G, 5.71 G (conv + linear), ×2 FLOPs.
        let (r, v, i) = (resnet50(1), vgg16(1), inception_v3(1));
        assert!(near(matrix_gflops(&r), 8.18, 0.01), "{}", matrix_gflops(&r));
        assert!(
            near(matrix_gflops(&v), 30.94, 0.01),
            "{}",
            matrix_gflops(&v)
        );
        assert!(
            near(matrix_gflops(&i), 11.42, 0.01),
            "{}",
            matrix_gflops(&i)
        );
        // All ops: the element-wise work adds about 1 %.
        let total = |ls: &[Layer]| sum(ls, |l| l.fw_flops) / 1e9;
        assert!(near(total(&r), 8.2, 0.03), "{}", total(&r));
        assert!(near(total(&v), 31.0, 0.03), "{}", total(&v));
        assert!(near(total(&i), 11.4, 0.03), "{}", total(&i));
    }

    /// DeepLearningExamples' ResNeXt101-32x4d, counted from its architecture (stem 64, blocks
    /// [3, 4, 23, 3], widths [128, 256, 512, 1024], expansion 2, 32 groups): 44,177,704
    /// parameters; its SE variant adds `Linear(C, 16)` and `Linear(16, C)` per block (1,073,424);
    /// 7.970 G multiply-adds per image in the convs and the classifier (the grouped 3×3 convs
    /// at a 32nd of a dense conv's). The gate multiplies into the residual add in one kernel.
    #[test]
    fn resnext_counts_follow_the_architecture() {
        let (x, se) = (resnext101_32x4d(1, false), resnext101_32x4d(1, true));
        assert_eq!(params(&x), 44_177_704);
        assert_eq!(params(&se), 45_251_128);
        assert!(
            near(matrix_gflops(&x), 15.94, 0.005),
            "{}",
            matrix_gflops(&x)
        );
        let grouped = x.iter().find(|l| l.name == "layer1.0.conv2").unwrap();
        let g = grouped.gemm.unwrap();
        // 4 input channels per group × a 3×3 window: the reduction of each output column.
        assert_eq!((g.n, g.k), (128.0, 36.0));
        assert_eq!(grouped.params[0].elems, 128 * 4 * 9);
        let gate = se.iter().find(|l| l.name == "layer4.2.addcmul").unwrap();
        assert_eq!(gate.inputs.len(), 3);
        assert_eq!((gate.fw_kernels, gate.bw_kernels), (1, 2));
        assert!(!x.iter().any(|l| l.name.contains("squeeze")));
        check_well_formed(&|b| resnext101_32x4d(b, false));
        check_well_formed(&|b| resnext101_32x4d(b, true));
        for ls in [resnext101_32x4d(2, false), resnext101_32x4d(2, true)] {
            let ratio = sum(&ls, |l| l.bw_flops) / sum(&ls, |l| l.fw_flops);
            assert!((1.9..2.1).contains(&ratio), "{ratio}");
        }
    }

    /// torchvision's parameter counts of the other ResNets, ResNeXt50-32x4d and EfficientNet-B1
    /// to -B7 (`torchvision.models.*`, the counts its model builders document).
    #[test]
    fn family_parameter_counts_match_torchvision() {
        assert_eq!(params(&resnet(1, [2, 2, 2, 2], false)), 11_689_512);
        assert_eq!(params(&resnet(1, [3, 4, 6, 3], false)), 21_797_672);
        assert_eq!(params(&resnet(1, [3, 4, 23, 3], true)), 44_549_160);
        assert_eq!(params(&resnet(1, [3, 8, 36, 3], true)), 60_192_808);
        assert_eq!(params(&resnext_32x4d(1, [3, 4, 6, 3], false)), 25_028_904);
        for (w, d, img, want) in [
            (1.0, 1.1, 240, 7_794_184),
            (1.1, 1.2, 260, 9_109_994),
            (1.2, 1.4, 300, 12_233_232),
            (1.6, 2.2, 456, 30_389_784),
            (1.8, 2.6, 528, 43_040_704),
            (2.0, 3.1, 600, 66_347_960),
        ] {
            assert_eq!(params(&efficientnet(1, w, d, img)), want, "{w} {d}");
        }
        assert_eq!(
            params(&convnext(1, [3, 3, 9, 3], [96, 192, 384, 768])),
            28_589_128
        );
        assert_eq!(
            params(&convnext(1, [3, 3, 27, 3], [96, 192, 384, 768])),
            50_223_688
        );
        assert_eq!(
            params(&convnext(1, [3, 3, 27, 3], [128, 256, 512, 1024])),
            88_591_464
        );
        assert_eq!(params(&mobilenet_v2(1)), 3_504_872);
        check_well_formed(&|b| resnet(b, [2, 2, 2, 2], false));
        check_well_formed(&|b| convnext(b, [3, 3, 9, 3], [96, 192, 384, 768]));
        check_well_formed(&mobilenet_v2);
        // ConvNeXt's 7×7 and MobileNetV2's 3×3 per-channel convs are depthwise.
        let cn = convnext(1, [3, 3, 9, 3], [96, 192, 384, 768]);
        let dw = cn
            .iter()
            .find(|l| l.name == "features.1.0.block.0")
            .unwrap();
        assert_eq!(dw.kind, LayerKind::DepthwiseConv);
        assert_eq!(dw.param_elems(), 96 * 49 + 96);
        // ResNet-18's first stage keeps its shape: no downsample there.
        let r18 = resnet(1, [2, 2, 2, 2], false);
        assert!(!r18.iter().any(|l| l.name == "layer1.0.downsample.0"));
        assert!(r18.iter().any(|l| l.name == "layer2.0.downsample.0"));
    }

    /// DeepLearningExamples' EfficientNet-B0 and -B4 have torchvision's parameter counts
    /// (`efficientnet_b0`: 5,288,548; `efficientnet_b4`: 19,341,616); B0's 0.39 G
    /// multiply-adds per image are the EfficientNet paper's (Tan & Le 2019, Table 2), B4's 4.4 G
    /// are counted here (the paper gives 4.2 G). A depthwise conv is a stencil, not a product.
    #[test]
    fn efficientnet_counts_match_torchvision() {
        let (b0, b4) = (
            efficientnet(1, 1.0, 1.0, 224),
            efficientnet(1, 1.4, 1.8, 380),
        );
        assert_eq!(params(&b0), 5_288_548);
        assert_eq!(params(&b4), 19_341_616);
        // WideSE, counted from DeepLearningExamples' `widese_mbconv`.
        assert_eq!(params(&efficientnet_se(1, 1.0, 1.0, 224, true)), 8_423_848);
        assert_eq!(params(&efficientnet_se(1, 1.4, 1.8, 380, true)), 34_927_246);
        // Multiply-adds of the convs (depthwise included) and the classifier, ×2.
        let conv_gflops = |ls: &[Layer]| {
            ls.iter()
                .filter(|l| {
                    matches!(
                        l.kind,
                        LayerKind::Conv | LayerKind::DepthwiseConv | LayerKind::Gemm
                    )
                })
                .map(|l| l.fw_flops)
                .sum::<f64>()
                / 1e9
        };
        assert!(near(conv_gflops(&b0), 0.78, 0.03), "{}", conv_gflops(&b0));
        assert!(near(conv_gflops(&b4), 8.8, 0.03), "{}", conv_gflops(&b4));
        let dw = b0
            .iter()
            .find(|l| l.name == "layer3.block0.depsep.conv")
            .unwrap();
        assert_eq!(dw.kind, LayerKind::DepthwiseConv);
        assert_eq!(dw.math, MathClass::Vector);
        assert!(dw.gemm.is_none());
        assert_eq!(dw.params[0].elems, 144 * 25);
        // 2 FLOPs per tap of the 5×5 window per output element (stride 2: 56×56 to 28×28).
        assert_eq!(dw.fw_flops, 2.0 * 25.0 * (144 * 28 * 28) as f64);
        // ResNeXt's grouped convs stay products.
        let rx = resnext101_32x4d(1, false);
        assert!(rx.iter().all(|l| l.kind != LayerKind::DepthwiseConv));
        check_well_formed(&|b| efficientnet(b, 1.0, 1.0, 224));
        check_well_formed(&|b| efficientnet(b, 1.4, 1.8, 380));
    }

    #[test]
    fn backward_is_about_twice_forward() {
        for ls in [resnet50(2), vgg16(2), inception_v3(2)] {
            let ratio = sum(&ls, |l| l.bw_flops) / sum(&ls, |l| l.fw_flops);
            assert!((1.9..2.1).contains(&ratio), "{ratio}");
        }
    }

    #[test]
    fn well_formed() {
        check_well_formed(&resnet50);
        check_well_formed(&vgg16);
        check_well_formed(&inception_v3);
    }

    #[test]
    fn resnet_dag_has_the_residual_branches() {
        let ls = resnet50(1);
        let idx = |n: &str| {
            ls.iter()
                .position(|l| l.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        let add = &ls[idx("layer1.0.add")];
        assert_eq!(
            add.inputs,
            vec![idx("layer1.0.bn3"), idx("layer1.0.downsample.1")]
        );
        assert_eq!(
            ls[idx("layer1.0.downsample.0")].inputs,
            vec![idx("maxpool")]
        );
        assert_eq!(
            ls[idx("layer1.1.add")].inputs,
            vec![idx("layer1.1.bn3"), idx("layer1.0.relu3")]
        );
        assert_eq!(ls.iter().filter(|l| l.kind == LayerKind::Conv).count(), 53);
        assert_eq!(ls.last().map(|l| l.kind), Some(LayerKind::Loss));
        // The stem conv does no data gradient.
        assert_eq!(ls[0].bw_flops, ls[0].fw_flops);
        assert_eq!(ls[0].bw_kernels, 1);
    }

    #[test]
    fn inception_modules_concat_their_branches() {
        let ls = inception_v3(1);
        let idx = |n: &str| {
            ls.iter()
                .position(|l| l.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        let cat = &ls[idx("Mixed_5b.cat")];
        assert_eq!(cat.out_elems, 256 * 35 * 35);
        let want: Vec<_> = ["branch1x1", "branch5x5_2", "branch3x3dbl_3", "branch_pool"]
            .iter()
            .map(|b| idx(&format!("Mixed_5b.{b}.relu")))
            .collect();
        assert_eq!(cat.inputs, want);
        // All four branches read the previous module's output.
        let input = idx("maxpool2");
        for b in [
            "branch1x1.conv",
            "branch5x5_1.conv",
            "branch3x3dbl_1.conv",
            "avg_pool",
        ] {
            assert_eq!(ls[idx(&format!("Mixed_5b.{b}"))].inputs, vec![input]);
        }
        assert_eq!(ls[idx("Mixed_7c.cat")].out_elems, 2048 * 8 * 8);
        assert_eq!(ls[idx("Mixed_6a.cat")].out_elems, 768 * 17 * 17);
        assert_eq!(ls[idx("Mixed_7a.cat")].out_elems, 1280 * 8 * 8);
    }

    #[test]
    fn resnet50_saved_activations_per_image() {
        // By hand, each tensor once (conv outputs kept by BN, ReLU outputs, pool indices, the
        // image, the 2048 pooled features, the 1000 log-probabilities, BN stats):
        //   stem 3·224² (image) + 2·64·112² (conv1 out, relu out) + 2·64·56² (pool indices,
        //     pool output kept by layer1.0.conv1) = 2,157,568
        //   layer1 8,028,160 · layer2 5,820,416 · layer3 4,114,432 · layer4 1,154,048
        //   → 21,274,624 + 3,048 (fc input, loss) + 2·26,560 (BN stats) = 21,330,792
        let ls = resnet50(1);
        let saved: u64 = ls.iter().map(|l| l.saved_elems).sum();
        assert_eq!(saved, 21_330_792);
        let s8: u64 = resnet50(8).iter().map(|l| l.saved_elems).sum();
        assert!(s8 > 7 * saved && s8 < 8 * saved);
    }

    /// MobileNetV2's in-place ReLU6 keeps a copy of its input: what autograd saves for one
    /// 224×224 image of torchvision's `mobilenet_v2` (every storage a `saved_tensors_hooks`
    /// pack sees, the parameters left out) is 78,482,432 bytes in FP32 (PyTorch 2.9, torchvision 0.24, CPU), 19.62 M elements.
    #[test]
    fn mobilenet_v2_saved_activations_match_autograd() {
        let saved: u64 = mobilenet_v2(1).iter().map(|l| l.saved_elems).sum();
        let autograd = 78_482_432.0 / 4.0;
        let err = saved as f64 / autograd - 1.0;
        assert!(
            err.abs() < 0.01,
            "{saved} saved elements, {err:+.3} off autograd's"
        );
    }
}
