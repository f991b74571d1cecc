//! The model zoo: layer-level descriptions of well-known models ([`cnn`], [`transformer`]), and
//! [`build()`], which turns a model plus a cluster into the global DFG of one data-parallel
//! iteration with durations from the roofline cost model. The no-trace default.
//!
//! **Invariant:** the zoo does no IO; a model is a pure function of its name and options.

pub mod build;
pub mod cnn;
pub mod layers;
pub mod transformer;

pub use build::{BuildError, BuildOptions, build};
pub use layers::{Layer, LayerKind, MathClass, Model, Optimizer, Param};
pub use transformer::{Attention, Gelu, Head, Loss, TransformerConfig};

/// A zoo entry: name, one-line description, default per-worker batch and optimizer.
#[derive(Clone, Copy, Debug)]
pub struct ZooEntry {
    pub name: &'static str,
    pub doc: &'static str,
    pub default_batch: u32,
    pub optimizer: Optimizer,
    /// Takes the transformer options (`--hidden`, `--heads`, `--layers`, `--seq`, `--vocab`).
    pub transformer: bool,
}

/// Every zoo model, sorted by name.
pub const MODELS: &[ZooEntry] = &[
    ZooEntry {
        name: "bert-base",
        doc: "BERT-base (110 M params, 12 layers, hidden 768) pre-training, seq 128",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "bert-large",
        doc: "BERT-large (336 M params, 24 layers, hidden 1024) pre-training, seq 128",
        default_batch: 16,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "convnext-base",
        doc: "ConvNeXt-Base (88.6 M params, 7x7 depthwise convs, LayerNorm, GELU; torchvision's) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "convnext-small",
        doc: "ConvNeXt-Small (50.2 M params) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "convnext-tiny",
        doc: "ConvNeXt-Tiny (28.6 M params) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b0",
        doc: "EfficientNet-B0 (5.3 M params, depthwise convs, SiLU, squeeze-and-excitation; DeepLearningExamples' definition) on 224x224 images",
        default_batch: 32,
        // DeepLearningExamples trains it with RMSprop and momentum: two state tensors per
        // parameter, as Adam keeps.
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b1",
        doc: "EfficientNet-B1 (7.8 M params; B0 compound-scaled) on 240x240 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b2",
        doc: "EfficientNet-B2 (9.1 M params; B0 compound-scaled) on 260x260 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b3",
        doc: "EfficientNet-B3 (12.2 M params; B0 compound-scaled) on 300x300 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b4",
        doc: "EfficientNet-B4 (19.3 M params; B0 scaled 1.4x wide, 1.8x deep) on 380x380 images",
        default_batch: 32,
        // DeepLearningExamples trains it with RMSprop and momentum: two state tensors per
        // parameter, as Adam keeps.
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b5",
        doc: "EfficientNet-B5 (30.4 M params; B0 compound-scaled) on 456x456 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b6",
        doc: "EfficientNet-B6 (43.0 M params; B0 compound-scaled) on 528x528 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-b7",
        doc: "EfficientNet-B7 (66.3 M params; B0 compound-scaled) on 600x600 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-widese-b0",
        doc: "EfficientNet-WideSE-B0 (8.4 M params: squeeze-and-excitation from the expanded channels; DeepLearningExamples') on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "efficientnet-widese-b4",
        doc: "EfficientNet-WideSE-B4 (34.9 M params) on 380x380 images",
        default_batch: 32,
        optimizer: Optimizer::Adam,
        transformer: false,
    },
    ZooEntry {
        name: "gpt",
        doc: "GPT-style decoder, GPT-2 small by default (124 M, 12 layers, hidden 768, seq 1024)",
        default_batch: 8,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "gpt3-175b",
        doc: "GPT-3 175B (96 layers, hidden 12288, 96 heads, seq 2048), FlashAttention",
        default_batch: 1,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "inception-v3",
        doc: "Inception-v3 (23.8 M params) on 299x299 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "llama",
        doc: "Llama decoder (RMSNorm, SwiGLU, grouped-query attention, RoPE, untied head); Llama 3 8B's shape by default, seq 8192",
        default_batch: 1,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "llama3-405b",
        doc: "Llama 3.1 405B (126 layers, hidden 16384, 128 heads, 8 KV heads, FFN 53248), seq 8192",
        default_batch: 1,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "llama3-70b",
        doc: "Llama 3 70B (80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672), seq 8192",
        default_batch: 1,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "llama3-8b",
        doc: "Llama 3 8B (32 layers, hidden 4096, 32 heads, 8 KV heads, FFN 14336), seq 8192",
        default_batch: 1,
        optimizer: Optimizer::Adam,
        transformer: true,
    },
    ZooEntry {
        name: "mobilenet-v2",
        doc: "MobileNetV2 (3.5 M params, inverted residuals with depthwise convs; torchvision's) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnet101",
        doc: "ResNet-101 (44.5 M params) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnet152",
        doc: "ResNet-152 (60.2 M params) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnet18",
        doc: "ResNet-18 (11.7 M params, basic blocks) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnet34",
        doc: "ResNet-34 (21.8 M params, basic blocks) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnet50",
        doc: "ResNet-50 (25.6 M params) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnext101-32x4d",
        doc: "ResNeXt101-32x4d (44.2 M params, 32 groups; NVIDIA DeepLearningExamples' definition) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "resnext50-32x4d",
        doc: "ResNeXt50-32x4d (25.0 M params, 32 groups; torchvision's) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "se-resnext101-32x4d",
        doc: "SE-ResNeXt101-32x4d (45.3 M params: ResNeXt101-32x4d with squeeze-and-excitation, DeepLearningExamples' definition) on 224x224 images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
    ZooEntry {
        name: "vgg16",
        doc: "VGG-16 (138 M params) on 224x224 ImageNet images",
        default_batch: 32,
        optimizer: Optimizer::SgdMomentum,
        transformer: false,
    },
];

/// Largest per-worker batch accepted: 16,777,216 samples, beyond any recipe (DLE BERT
/// pre-training accumulates 65,536 sequences per step on one GPU). What really bounds a batch is
/// the work: the graph's physical bounds (`graph::bounds`: a worker's memory ≤ 64 PiB, an op
/// ≤ 2^50 ns) refuse a batch whose activations or kernels would not be real.
pub const MAX_BATCH: u32 = 1 << 24;

/// Options that shape a zoo model; `None` keeps the model's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelOptions {
    pub batch: Option<u32>,
    pub hidden: Option<u32>,
    pub heads: Option<u32>,
    pub layers: Option<u32>,
    pub seq: Option<u32>,
    pub vocab: Option<u32>,
    /// BERT's task head (default: Hugging Face pre-training).
    pub head: Option<transformer::Head>,
    /// The attention implementation (default: eager for BERT, fused softmax for GPT).
    pub attention: Option<transformer::Attention>,
    /// The feed-forward GELU (default: one fused kernel).
    pub gelu: Option<transformer::Gelu>,
    /// Key/value heads of grouped-query attention (Llama models).
    pub kv_heads: Option<u32>,
    /// Feed-forward width (default: 4 × hidden; a Llama keeps its preset's ratio).
    pub ffn: Option<u32>,
    /// How the loss runs and whether the loop holds the logits (default: the preset's; see
    /// [`transformer::Loss::of_framework`] for the frameworks that decide it themselves).
    pub loss: Option<transformer::Loss>,
    /// TensorFlow's composed ops in a transformer (see
    /// [`transformer::TransformerConfig::graph_ops`]; default: off, or what
    /// [`framework_graph_ops`] says for the job's framework). Ignored by the CNNs.
    pub graph_ops: Option<bool>,
}

/// Why a model could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZooError {
    #[error("unknown model `{name}`; the zoo has: {known}")]
    Unknown { name: String, known: String },
    #[error("{0}")]
    Invalid(String),
}

/// Look up a zoo entry.
pub fn entry(name: &str) -> Result<&'static ZooEntry, ZooError> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| ZooError::Unknown {
            name: name.to_string(),
            known: MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
        })
}

/// The loss `framework`'s own training loop runs for zoo model `name`
/// ([`transformer::Loss::of_framework`]); `None` for a model that is not a transformer, or a
/// framework that leaves it to the model code.
pub fn framework_loss(
    name: &str,
    framework: crate::cost::framework::Framework,
) -> Option<transformer::Loss> {
    entry(name)
        .is_ok_and(|e| e.transformer)
        .then(|| transformer::Loss::of_framework(framework))
        .flatten()
}

/// Whether `framework` runs a transformer's dropout, layer norm and written-out GELU as
/// TensorFlow's composed ops keep them ([`transformer::TransformerConfig::graph_ops`]):
/// TensorFlow does, in graph mode without XLA (what its BERT scripts run unless `--use_xla`);
/// the GELU is then the tanh form its `modeling.py` writes out.
pub fn framework_graph_ops(framework: crate::cost::framework::Framework) -> bool {
    framework == crate::cost::framework::Framework::Tf
}

/// Make a zoo model at the options' batch size and shape.
pub fn model(name: &str, opts: &ModelOptions) -> Result<Model, ZooError> {
    let e = entry(name)?;
    let batch = opts.batch.unwrap_or(e.default_batch);
    if batch == 0 || batch > MAX_BATCH {
        return Err(ZooError::Invalid(format!(
            "batch must be between 1 and {MAX_BATCH}, got {batch}"
        )));
    }
    let shaped = [opts.hidden, opts.heads, opts.layers, opts.seq, opts.vocab];
    if !e.transformer
        && (shaped.iter().any(Option::is_some)
            || opts.head.is_some()
            || opts.attention.is_some()
            || opts.gelu.is_some()
            || opts.kv_heads.is_some()
            || opts.ffn.is_some()
            || opts.loss.is_some())
    {
        return Err(ZooError::Invalid(format!(
            "{name} is not a transformer: --hidden, --heads, --layers, --seq, --vocab, --head, --attention, --gelu, --loss, --kv-heads and --ffn apply to the transformers (bert-*, gpt*, llama*)"
        )));
    }
    let mut tokens_per_sample = 0;
    let layers = match name {
        "resnet50" => cnn::resnet50(batch),
        "vgg16" => cnn::vgg16(batch),
        "convnext-tiny" => cnn::convnext(batch, [3, 3, 9, 3], [96, 192, 384, 768]),
        "convnext-small" => cnn::convnext(batch, [3, 3, 27, 3], [96, 192, 384, 768]),
        "convnext-base" => cnn::convnext(batch, [3, 3, 27, 3], [128, 256, 512, 1024]),
        "mobilenet-v2" => cnn::mobilenet_v2(batch),
        "efficientnet-b0" => cnn::efficientnet(batch, 1.0, 1.0, 224),
        "efficientnet-b1" => cnn::efficientnet(batch, 1.0, 1.1, 240),
        "efficientnet-b2" => cnn::efficientnet(batch, 1.1, 1.2, 260),
        "efficientnet-b3" => cnn::efficientnet(batch, 1.2, 1.4, 300),
        "efficientnet-b4" => cnn::efficientnet(batch, 1.4, 1.8, 380),
        "efficientnet-b5" => cnn::efficientnet(batch, 1.6, 2.2, 456),
        "efficientnet-b6" => cnn::efficientnet(batch, 1.8, 2.6, 528),
        "efficientnet-b7" => cnn::efficientnet(batch, 2.0, 3.1, 600),
        "efficientnet-widese-b0" => cnn::efficientnet_se(batch, 1.0, 1.0, 224, true),
        "efficientnet-widese-b4" => cnn::efficientnet_se(batch, 1.4, 1.8, 380, true),
        "resnet18" => cnn::resnet(batch, [2, 2, 2, 2], false),
        "resnet34" => cnn::resnet(batch, [3, 4, 6, 3], false),
        "resnet101" => cnn::resnet(batch, [3, 4, 23, 3], true),
        "resnet152" => cnn::resnet(batch, [3, 8, 36, 3], true),
        "resnext50-32x4d" => cnn::resnext_32x4d(batch, [3, 4, 6, 3], false),
        "resnext101-32x4d" => cnn::resnext101_32x4d(batch, false),
        "se-resnext101-32x4d" => cnn::resnext101_32x4d(batch, true),
        "inception-v3" => cnn::inception_v3(batch),
        _ => {
            let mut cfg = match name {
                "bert-base" => TransformerConfig::bert_base(),
                "bert-large" => TransformerConfig::bert_large(),
                "gpt3-175b" => TransformerConfig::gpt3_175b(),
                "llama" | "llama3-8b" => TransformerConfig::llama3_8b(),
                "llama3-70b" => TransformerConfig::llama3_70b(),
                "llama3-405b" => TransformerConfig::llama3_405b(),
                _ => TransformerConfig::gpt2_small(),
            };
            if let Some(h) = opts.hidden {
                // 4 × hidden, or a Llama's own FFN ratio rounded up to a multiple of 256.
                cfg.intermediate = if cfg.llama {
                    let r = f64::from(cfg.intermediate) / f64::from(cfg.hidden);
                    ((f64::from(h) * r / 256.0).ceil() * 256.0).min(f64::from(u32::MAX)) as u32
                } else {
                    h.saturating_mul(4)
                };
                cfg.hidden = h;
            }
            cfg.intermediate = opts.ffn.unwrap_or(cfg.intermediate);
            if let Some(k) = opts.kv_heads {
                if !cfg.llama {
                    return Err(ZooError::Invalid(format!(
                        "{name} has one key/value head per query head: --kv-heads applies to the llama models"
                    )));
                }
                cfg.kv_heads = k;
            }
            cfg.heads = opts.heads.unwrap_or(cfg.heads);
            cfg.layers = opts.layers.unwrap_or(cfg.layers);
            if let Some(s) = opts.seq {
                cfg.seq = s;
                cfg.max_positions = cfg.max_positions.max(s);
            }
            cfg.vocab = opts.vocab.unwrap_or(cfg.vocab);
            if let Some(a) = opts.attention {
                cfg.attention = a;
            }
            if let Some(true) = opts.graph_ops {
                // TensorFlow's BERT writes its GELU out (`modeling.py`); `--gelu` still wins.
                cfg.graph_ops = true;
                cfg.gelu = Gelu::Composite;
            }
            if let Some(g) = opts.gelu {
                cfg.gelu = g;
            }
            if let Some(l) = opts.loss {
                cfg.loss = l;
            }
            if let Some(h) = opts.head {
                if cfg.decoder {
                    return Err(ZooError::Invalid(format!(
                        "{name} is a decoder: --head applies to bert-base and bert-large"
                    )));
                }
                cfg.head = h;
            }
            cfg.validate().map_err(ZooError::Invalid)?;
            tokens_per_sample = cfg.seq;
            transformer::transformer(&cfg, batch)
        }
    };
    Ok(Model {
        name: name.to_string(),
        batch,
        optimizer: e.optimizer,
        layers,
        tokens_per_sample,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_sorted_and_all_build() {
        let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        for m in MODELS {
            let model = model(m.name, &ModelOptions::default()).unwrap();
            assert_eq!(model.batch, m.default_batch);
            // The smallest is MobileNetV2's 3.5 M.
            assert!(model.param_elems() > 3_000_000, "{}", m.name);
        }
    }

    #[test]
    fn unknown_model_gets_the_list() {
        let e = model("resnet51", &ModelOptions::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown model `resnet51`; the zoo has: bert-base, bert-large, convnext-base, convnext-small, convnext-tiny, efficientnet-b0, efficientnet-b1, efficientnet-b2, efficientnet-b3, efficientnet-b4, efficientnet-b5, efficientnet-b6, efficientnet-b7, efficientnet-widese-b0, efficientnet-widese-b4, gpt, gpt3-175b, inception-v3, llama, llama3-405b, llama3-70b, llama3-8b, mobilenet-v2, resnet101, resnet152, resnet18, resnet34, resnet50, resnext101-32x4d, resnext50-32x4d, se-resnext101-32x4d, vgg16"
        );
    }

    #[test]
    fn bad_options_are_refused() {
        let opts = |f: fn(&mut ModelOptions)| {
            let mut o = ModelOptions::default();
            f(&mut o);
            o
        };
        assert!(
            model("resnet50", &opts(|o| o.batch = Some(0)))
                .unwrap_err()
                .to_string()
                .contains("batch")
        );
        assert!(model("resnet50", &opts(|o| o.batch = Some((1 << 24) + 1))).is_err());
        // Issue 21: a global batch of 64k sequences on one GPU is a real recipe.
        assert_eq!(
            model("bert-base", &opts(|o| o.batch = Some(65_536 * 2)))
                .unwrap()
                .batch,
            131_072
        );
        assert!(
            model("resnet50", &opts(|o| o.hidden = Some(512)))
                .unwrap_err()
                .to_string()
                .contains("not a transformer")
        );
        let e = model("gpt", &opts(|o| o.heads = Some(7)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not divisible by heads"), "{e}");
    }

    #[test]
    fn gpt_shape_options_change_the_model() {
        let small = model("gpt", &ModelOptions::default()).unwrap();
        let deeper = model(
            "gpt",
            &ModelOptions {
                layers: Some(24),
                hidden: Some(1024),
                heads: Some(16),
                ..Default::default()
            },
        )
        .unwrap();
        // GPT-2 medium: 24 layers, hidden 1024 → 354.8 M parameters (345 M + position table).
        assert_eq!(small.param_elems(), 124_439_808);
        assert_eq!(deeper.param_elems(), 354_823_168);
    }
}

#[cfg(test)]
mod flops_tests {
    use super::*;

    /// The model's matrix FLOPs of one forward and backward against PaLM's count (Chowdhery et
    /// al. 2022, App. B): 6 FLOPs per matrix parameter per token plus 12 · layers · hidden ·
    /// sequence per token for attention's two products (non-causal), where the matrix
    /// parameters are the layers' weight matrices and the LM head (GPT-2 ties it to the token
    /// embedding, so it is counted here as a product, not in the embedding lookup).
    #[test]
    fn matrix_flops_follow_palms_count() {
        for (name, h, l, s, v, ffn) in [
            ("gpt", 768u64, 12u64, 1024u64, 50257u64, 3072u64),
            ("llama3-8b", 4096, 32, 8192, 128256, 14336),
        ] {
            let m = model(name, &ModelOptions::default()).unwrap();
            assert_eq!(u64::from(m.tokens_per_sample), s, "{name}");
            let tokens = (u64::from(m.batch) * s) as f64;
            let (attn, mlp) = if name == "gpt" {
                (4 * h * h, 2 * h * ffn)
            } else {
                // Grouped-query attention: K and V project to 8 heads of 128.
                (2 * h * h + 2 * h * 1024, 3 * h * ffn)
            };
            let matrix_params = (l * (attn + mlp) + h * v) as f64;
            let palm = tokens * (6.0 * matrix_params + 12.0 * (l * h * s) as f64);
            let got = m.matrix_flops();
            assert!(
                (got / palm - 1.0).abs() < 0.03,
                "{name}: {got:e} model FLOPs vs PaLM's {palm:e}"
            );
        }
    }
}
