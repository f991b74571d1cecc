//! The fidelity set: published measurements (`experiments/fidelity/data/published.csv`, dPRO's
//! Tables 2–4) turned into trainplan settings. A row the tool cannot express (tensor or
//! pipeline parallelism, a GPU without a config, XLA runs, an unstated interconnect, no
//! derivable iteration time) is skipped with its reason; nothing is guessed.

use std::collections::BTreeMap;

use trainplan::cost::framework::{AmpStyle, Framework, Precision};
use trainplan::zoo::{Head, ModelOptions};

/// One measured setting the model predicts.
#[derive(Clone, Debug)]
pub struct Case {
    pub id: String,
    /// Source family (`dle`, `vtrain`, …): errors are reported per family.
    pub family: &'static str,
    pub source: String,
    pub locator: String,
    pub model: String,
    pub opts: ModelOptions,
    pub gpu: &'static str,
    pub gpus: u32,
    pub nodes: u32,
    /// Intra-node network (built-in name) where the row states one, instead of the GPU's
    /// NVLink: `shm-host` for runs with NCCL's peer-to-peer transport switched off
    /// (`NCCL_P2P_DISABLE=1` in the row's network column).
    pub intra: Option<&'static str>,
    /// Inter-node network (built-in name) when `nodes > 1`.
    pub inter: Option<&'static str>,
    /// apex's `DistributedDataParallel(message_size=N)`: gradients bucketed N elements at a time
    /// (a bucket closes once it holds N), instead of the framework's default synchronisation.
    /// DLE's BERT pre-training passes 250,000,000 when it does not accumulate, so BERT-base's
    /// gradients are one bucket, all-reduced after the backward.
    pub apex_bucket_elems: Option<u64>,
    /// NICs of that network per node (the cluster's `nics_per_node`).
    pub nics: u32,
    pub framework: Framework,
    /// Gradient synchronisation as run, when it is not the framework's (TF + Horovod).
    pub horovod_sync: bool,
    pub precision: Option<Precision>,
    /// How the run's mixed precision held the model, where its code says (`None`: the
    /// framework's default, `Framework::default_amp_style`).
    pub amp_style: Option<AmpStyle>,
    /// Activations in channels-last layout, when the source says.
    pub channels_last: Option<bool>,
    pub recompute: bool,
    /// Recomputation of whole transformer layers (the published runs' checkpointing:
    /// Megatron's `--checkpoint-activations`, Hugging Face's `gradient_checkpointing`, one
    /// checkpoint per layer): the pass's `policy=full`; false: the pass's default segments
    /// (dPRO's own re-computation, Chen's √ schedule).
    pub recompute_blocks: bool,
    /// Selective recomputation of the attention core (Korthikanti et al.; Megatron-LM's
    /// `--recompute-granularity selective`): the pass's `policy=selective`.
    pub recompute_selective: bool,
    /// Sequence parallelism beside tensor parallelism (`sequence parallelism` in the row's
    /// `extra`, not preceded by `no`): the `tensor-parallel` pass's `sequence=1`.
    pub sequence_parallel: bool,
    pub accum: u32,
    /// The sharding stage the run used (`sharding=zero1|zero2|zero3|fsdp-grad-op|fsdp-full` in
    /// the row's `extra`): the `shard` pass at that stage; `None` for plain data parallelism.
    pub shard: Option<u32>,
    /// The optimizer offloaded to the host CPU (`offload=cpu` at ZeRO stage 1–2, where
    /// DeepSpeed offloads the optimizer alone): the `shard` pass's `offload=1`.
    pub offload: bool,
    /// Tensor-parallel degree (`TP=` in the row's `extra`; 1 without): the `tensor-parallel`
    /// pass at that degree, keeping the row's batch per model replica.
    pub tp: u32,
    /// Pipeline stages (`PP=` in the row's `extra`; 1 without): the `pipeline` pass with the
    /// row's accumulation steps as its micro-batches (1F1B, Megatron's default).
    pub pp: u32,
    /// Measured time of one optimizer step (or micro-step, see the row's notes), ms.
    pub measured_ms: Option<f64>,
    /// A stated memory fact: the setting ran out of memory (`Some(false)`) or ran (`Some(true)`,
    /// "the largest batch that fitted"). Every row with a measured time ran, too.
    pub fits: Option<bool>,
    /// Measured peak memory per GPU, GB (10⁹ B), and what was measured.
    pub measured_gb: Option<f64>,
    pub memory_kind: MemoryKind,
    /// Samples the measured time covers (all GPUs): throughput = samples / time.
    pub samples: f64,
}

/// What a memory figure counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    None,
    /// The framework's peak in use (tensors, workspaces), as dPRO reports TensorFlow's.
    Allocated,
    /// What `nvidia-smi` (NVML) shows: the allocator's reserved pool plus the CUDA context and
    /// NCCL.
    DeviceUsed,
}

/// Sources of sharded data-parallel runs (issue 23, `sections/sharded.py`): reported on their
/// own and never fitted on, so the headline figures stay those of plain data parallelism.
pub const SHARDED_FAMILIES: &[&str] = &["mingpt", "colossalai", "hf-blog", "bigscience"];

impl Case {
    /// Reported but never fitted on: dPRO's tables, the sharded sources and tensor-parallel
    /// runs.
    pub fn check_only(&self) -> bool {
        self.family == "dpro"
            || SHARDED_FAMILIES.contains(&self.family)
            || self.tp > 1
            || self.pp > 1
    }

    /// One line describing the setting.
    pub fn setting(&self) -> String {
        let mut s = format!(
            "{} b{}{} {}x{}{} {} {}",
            self.model,
            self.opts.batch.unwrap_or(0),
            self.opts.seq.map_or(String::new(), |q| format!(" s{q}")),
            self.gpus,
            self.gpu,
            if self.nodes > 1 {
                format!(" ({} nodes)", self.nodes)
            } else {
                String::new()
            },
            self.framework,
            self.precision.map_or("default", |p| p.name()),
        );
        if let Some(h) = self.opts.hidden {
            s.push_str(&format!(" h{h} l{}", self.opts.layers.unwrap_or(0)));
            if let Some(a) = self.opts.heads {
                s.push_str(&format!(" a{a}"));
            }
        }
        if self.tp > 1 {
            s.push_str(&format!(" tp{}", self.tp));
        }
        if self.pp > 1 {
            s.push_str(&format!(" pp{}", self.pp));
        }
        if self.sequence_parallel {
            s.push_str(" +sp");
        }
        if self.recompute_selective {
            s.push_str(" +recompute(selective)");
        } else if self.recompute {
            s.push_str(" +recompute");
        }
        if self.accum > 1 {
            s.push_str(&format!(" +accum{}", self.accum));
        }
        s
    }
}

fn family(source: &str) -> Option<&'static str> {
    let s = source.to_ascii_lowercase();
    Some(if s.contains("via-research") {
        "vtrain"
    } else if s.contains("deeplearningexamples") {
        "dle"
    } else if s.contains("dlperf") {
        "dlperf"
    } else if s.contains("lambdal") {
        "lambda"
    } else if s.contains("huggingface/blog") {
        "hf-blog"
    } else if s.contains("huggingface") {
        "hf"
    } else if s.contains("deepspeed") {
        "deepspeed"
    } else if s.contains("seannaren/mingpt") {
        "mingpt"
    } else if s.contains("hpcaitech/") {
        "colossalai"
    } else if s.contains("bigscience-workshop") {
        "bigscience"
    } else if s.contains("tensorflow/tensorflow") {
        "tf-benchmarks"
    } else if s.contains("korthikanti") {
        "korthikanti"
    } else if s.contains("narayanan") {
        "megatron"
    } else {
        return None;
    })
}

fn gpu_config(gpu: &str) -> Option<&'static str> {
    let g = gpu.to_ascii_uppercase();
    if g.contains("V100") {
        Some(if g.contains("16GB") {
            "v100-16gb"
        } else {
            "v100-32gb"
        })
    } else if g.contains("A100") {
        Some(if g.contains("40GB") || g.contains("40G") {
            "a100-40gb"
        } else {
            "a100-80gb"
        })
    } else if g.contains("H100") {
        Some("h100-sxm")
    } else {
        None
    }
}

/// Parses `KEY=n` out of free text.
fn field(text: &str, key: &str) -> Option<u32> {
    let i = text.find(&format!("{key}="))?;
    text[i + key.len() + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The sharding stage of a row's `extra` (`sharding=…`; experiments/fidelity/data/sections/
/// sharded.py's vocabulary), or why the row cannot be expressed.
/// The value of the `key` token (`key=value`) of a row's `extra`.
fn token<'a>(extra: &'a str, key: &str) -> Option<&'a str> {
    extra.split_whitespace().find_map(|t| t.strip_prefix(key))
}

fn sharding(extra: &str) -> Result<(Option<u32>, bool), String> {
    let token = |key: &str| token(extra, key);
    if token("zero_stage=").is_some_and(|v| v != "0") {
        return Err("DeepSpeed ZeRO stage without a sharding= token".into());
    }
    let stage = match token("sharding=") {
        None | Some("none") => None,
        Some("zero1") => Some(1),
        // FairScale's ShardedDDP shards optimizer state and gradients: ZeRO-2.
        Some("zero2" | "fsdp-grad-op" | "fairscale-sdp") => Some(2),
        Some("zero3" | "fsdp-full") => Some(3),
        Some(other) => return Err(format!("sharding `{other}` is not modelled")),
    };
    let offload = token("offload=").is_some_and(|v| v != "none");
    if offload {
        // DeepSpeed offloads parameters only at stage 3 (`offload_param`), FSDP's
        // CPUOffload moves parameters and gradients too; at stages 1-2 DeepSpeed's
        // `offload_optimizer` (ZeRO-Offload) moves the optimizer alone, which is modelled.
        let deepspeed = token("impl=").is_some_and(|v| v.starts_with("deepspeed"));
        if !(deepspeed && stage.is_some_and(|s| s <= 2)) {
            return Err("parameter offload to the CPU (ZeRO-3 offload_param, FSDP CPUOffload) is not modelled; optimizer offload at ZeRO stages 1-2 is".into());
        }
    }
    Ok((stage, offload))
}

/// apex DDP's `message_size` where a row ran DLE's PyTorch BERT pre-training without
/// accumulation: DLPerf's re-run of NGC 20.03 (`run_pretraining.py` at
/// NVIDIA/DeepLearningExamples@793b92dc, 2020-03-15, to @1d4211fe: `DDP(model,
/// message_size=250000000, ...)` from `apex.parallel` unless `--allreduce_post_accumulation`,
/// which DLPerf's `single_node_train.sh` leaves off and which needs accumulation). DLE's own
/// tables ran other code (19.07: `DDP(model)`, apex's 10^7 default) or accumulated (21.11: one
/// flat all-reduce per step after dozens of micro-steps), so they keep the default.
fn dle_pretraining_ddp(family: &str, head: Option<Head>, accum: u32) -> Option<u64> {
    (family == "dlperf" && head == Some(Head::Pretraining) && accum == 1).then_some(250_000_000)
}

/// The intra-node network a network description states instead of NVLink: NCCL's SHM transport
/// where the run switched peer-to-peer access off (`NCCL_P2P_DISABLE=1`).
fn intra_network(network: &str) -> Option<&'static str> {
    network.contains("nccl_p2p_disable=1").then_some("shm-host")
}

/// The Omni-Path links per node a network description states ("4 Omni-Path links per node",
/// BigScience's Jean Zay A100 nodes): `None` when it names no Omni-Path count.
fn omni_path_links(network: &str) -> Option<u32> {
    let at = network.find("omni-path links per node")?;
    network[..at].split_whitespace().last()?.parse().ok()
}

/// A row of `published.csv` as a case, or why it is skipped.
pub fn case(r: &BTreeMap<String, String>) -> Result<Case, String> {
    let get = |k: &str| r.get(k).map(String::as_str).unwrap_or("").trim();
    let num = |k: &str| get(k).parse::<f64>().ok();
    let id = get("id").to_string();
    let source = get("source").to_string();
    let family = family(&source).ok_or("source family not used")?;
    let notes = get("notes");
    if notes.contains("SUSPICIOUS") {
        return Err("flagged suspicious by the collector".into());
    }
    let optimizer = get("optimizer").to_ascii_lowercase();
    if optimizer.contains("adafactor") || optimizer.contains("8bit") || optimizer.contains("8-bit")
    {
        return Err("optimizer not modelled (Adam, SGD and LAMB are)".into());
    }
    let metric = get("metric");
    let fits = match metric {
        "fits_in_memory" => Some(get("value") == "1"),
        "throughput" | "iteration_time" => None,
        _ => {
            return Err(format!(
                "metric `{metric}` is not a step time or a memory fact"
            ));
        }
    };
    let measured_ms = match fits {
        Some(_) => None,
        None => Some(num("iteration_ms").ok_or("no iteration time derivable")?),
    };
    let extra = get("extra");
    let lower_extra = extra.to_ascii_lowercase();
    let framework_text = get("framework").to_ascii_lowercase();
    let precision_text = get("precision").to_ascii_lowercase();
    if lower_extra.contains("xla") || precision_text.contains("xla") {
        return Err("XLA runs: the baseline would need XLA's fusion".into());
    }
    if lower_extra.contains("binned sequence lengths") {
        // DLE's phase-2 tables (LDDL, bin size 64) state 512 tokens, but each batch was padded
        // to its own bin; the bins' share of the data is not published, and trainplan runs one
        // fixed length. Their per-token throughput exceeds phase 1's at 128 tokens, which no
        // fixed-length run of the same model can do (attention grows with the length).
        return Err(
            "binned sequence lengths (LDDL, bin 64): the padded lengths are not stated".into(),
        );
    }
    let pp = field(extra, "PP").unwrap_or(1).max(1);
    if pp > 1 && lower_extra.contains("interleaved") {
        // Korthikanti's rows say "interleaved schedule m=3" without saying whether 3 is the
        // chunks per rank; the pass needs that count.
        return Err("interleaved pipeline schedule: chunks per rank not stated as such".into());
    }
    let tp = field(extra, "TP").unwrap_or(1).max(1);
    let (mut shard, offload) = sharding(extra)?;
    let gpu = gpu_config(get("gpu")).ok_or("no GPU config for this GPU")?;
    let gpus = num("gpus").ok_or("no GPU count")? as u32;
    // ZeRO over a single data-parallel rank (BigScience's DP=1 runs) shards nothing.
    if gpus <= tp * pp && !offload {
        shard = None;
    }
    let nodes = num("nodes").unwrap_or(1.0).max(1.0) as u32;
    let network = get("network").to_ascii_lowercase();
    let (inter, nics) = if nodes > 1 {
        if network.contains("edr 100") {
            (Some("rdma-100g"), 1)
        } else if let Some(n) = omni_path_links(&network) {
            (Some("opa-100g"), n)
        } else {
            return Err("multi-node interconnect not stated".into());
        }
    } else {
        (None, 1)
    };
    let micro = num("micro_batch").ok_or("no per-GPU batch")? as u32;
    let per_micro_step = notes.contains("iteration_ms derived per forward+backward micro-step");
    let accum = if per_micro_step {
        1
    } else {
        num("accum_steps").unwrap_or(1.0).max(1.0) as u32
    };
    let mut model_name = get("model").to_ascii_lowercase();
    // Korthikanti et al.'s GPT models (Megatron-LM's GPT, its fused kernels: the zoo's
    // default) by size name, their shapes in the row; the per-layer rows (Table 4) are not
    // steps.
    if family == "korthikanti" && model_name.starts_with("gpt-") && !model_name.contains("layer") {
        model_name = "gpt".into();
    }
    let seq = num("seq").map(|s| s as u32);
    let text = format!("{} {} {}", get("locator"), extra, notes).to_ascii_lowercase();
    // trainplan's batch is per GPU per optimizer step; accumulation splits it into micro-steps.
    let mut opts = ModelOptions {
        batch: Some(micro * accum),
        ..Default::default()
    };
    // NVIDIA's BERT recipes: DeepLearningExamples' PyTorch BERT, re-run by DLPerf and Lambda.
    let nvidia_recipe = matches!(family, "dle" | "dlperf" | "lambda");
    let model = match model_name.as_str() {
        "resnet50" => "resnet50",
        // DeepLearningExamples' own definitions (its ConvNets READMEs' rows).
        "resnext101-32x4d" => "resnext101-32x4d",
        "se-resnext101-32x4d" => "se-resnext101-32x4d",
        "efficientnet-b0" => "efficientnet-b0",
        "efficientnet-b4" => "efficientnet-b4",
        "efficientnet-widese-b0" => "efficientnet-widese-b0",
        "efficientnet-widese-b4" => "efficientnet-widese-b4",
        "bert-base" | "bert-large" => {
            opts.seq = seq;
            opts.head = Some(if text.contains("squad") || seq == Some(384) {
                Head::Squad
            } else if family == "hf" {
                Head::Classify
            } else if text.contains("pretrain")
                || text.contains("pre-train")
                || text.contains("phase")
                // DLPerf's DLE BERT rows are phase-1 pre-training (its README's section names
                // the batch only).
                || (fits.is_some() && family == "dlperf" && seq == Some(128))
            {
                if family == "dlperf" {
                    // DLPerf re-ran DLE's PyTorch BERT of NGC 20.03, whose modeling.py
                    // (NVIDIA/DeepLearningExamples@1d4211fe, BertForPreTraining.forward)
                    // returns the MLM logits at every position, [batch, seq, vocab].
                    Head::Pretraining
                } else {
                    Head::MaskedLm
                }
            } else {
                return Err("BERT task not stated".into());
            });
            // Its modeling.py (BertSelfAttention.forward at NVIDIA/DeepLearningExamples@1d4211fe,
            // the NGC 20.03 code DLPerf re-ran; run_squad.py, which Lambda re-ran, uses the same
            // model) scales, masks, soft-maxes and drops out the scores as separate eager kernels,
            // in the activations' dtype under apex O2: the zoo's eager attention. The 2022
            // pre-training recipe runs the model under TorchScript with the NVFuser backend
            // (README changelog, January 2022), which fuses that chain into one kernel each way.
            if nvidia_recipe && lower_extra.contains("nvfuser") {
                opts.attention = Some(trainplan::zoo::Attention::FusedSoftmax);
            }
            if nvidia_recipe && framework_text.contains("pytorch") {
                // DLE's PyTorch BERT pads the vocabulary to a multiple of 8 (run_pretraining.py
                // and run_squad.py, "Padding for divisibility by 8"): 30,522 -> 30,528.
                opts.vocab = Some(30528);
            }
            if model_name == "bert-base" {
                "bert-base"
            } else {
                "bert-large"
            }
        }
        "gpt" => {
            opts.hidden = num("hidden").map(|v| v as u32);
            opts.layers = num("layers").map(|v| v as u32);
            opts.heads = num("heads").map(|v| v as u32);
            opts.seq = seq;
            // Megatron's GPT-2 BPE vocabulary padded to a multiple of 128.
            opts.vocab = Some(num("vocab").map_or(50304, |v| v as u32));
            // Megatron-DeepSpeed pads a stated vocabulary to a multiple of
            // make-vocab-size-divisible-by (128, its default) × TP
            // (megatron/tokenizer/tokenizer.py `_vocab_size_with_padding`): BigScience's
            // 250,000 words are 250,880 at TP 8, 31,360 per rank.
            if extra.contains("impl=megatron-deepspeed")
                && let Some(v) = opts.vocab
            {
                let m = 128 * tp;
                opts.vocab = Some(v.div_ceil(m) * m);
            }
            // The model code the run executed (`code=` in `extra`), as that code computes
            // attention and the GELU; Megatron's fused kernels otherwise (the zoo's default).
            match token(extra, "code=") {
                None => {}
                // Hugging Face GPT2LMHeadModel (transformers' modeling_gpt2.py before SDPA):
                // scores, scale, mask, softmax and dropout as separate kernels, and `gelu_new`
                // (the tanh approximation) as element-wise ops.
                // Its loss is `F.cross_entropy` on the logits the model returns, which the
                // training loop holds through the backward (`outputs.loss.backward()`).
                Some("hf-gpt2") => {
                    opts.attention = Some(trainplan::zoo::Attention::Eager);
                    opts.gelu = Some(trainplan::zoo::Gelu::Composite);
                    opts.loss = Some(trainplan::zoo::Loss::Held);
                }
                // minGPT's CausalSelfAttention (mingpt/model.py: q @ k^T, masked_fill, softmax,
                // dropout, @ v) with nn.GELU (one kernel); its loss is `F.cross_entropy`, and
                // SeanNaren's fork (these rows) trains it with PyTorch Lightning (below).
                Some("mingpt") => {
                    opts.attention = Some(trainplan::zoo::Attention::Eager);
                    opts.loss = Some(trainplan::zoo::Loss::Freed);
                }
                Some(other) => return Err(format!("model code `{other}` is not modelled")),
            }
            // PyTorch Lightning (SeanNaren's minGPT fork; the ColossalAI-Pytorch-lightning
            // benchmark, whose ColossalAI strategies run through Lightning too) backpropagates
            // the loss its `training_step` returns: the logits are gone by then.
            if token(extra, "code=") == Some("hf-gpt2")
                && (extra.contains("lightning") || extra.contains("impl=colossalai"))
            {
                opts.loss = Some(trainplan::zoo::Loss::Freed);
            }
            "gpt"
        }
        _ => return Err(format!("model `{model_name}` is not in the zoo")),
    };
    // A DeepSpeed engine (minGPT's and ColossalAI's Lightning plugin or strategy, the HF blog's
    // runs) synchronises gradients its own way: after the backward without ZeRO, in its reduce
    // buckets as they fill at ZeRO-2/3.
    let deepspeed_engine =
        extra.contains("impl=deepspeed") || extra.contains("impl=lightning-DeepSpeedStrategy");
    let framework = if framework_text.starts_with("tensorflow") {
        Framework::Tf
    } else if deepspeed_engine {
        Framework::Deepspeed
    } else if framework_text.contains("pytorch") || framework_text.contains("megatron") {
        Framework::Pytorch
    } else {
        return Err("framework not modelled".into());
    };
    let full = precision_text.starts_with("fp32") || precision_text.starts_with("tf32");
    let half = !full
        && (precision_text.starts_with("amp")
            || precision_text.contains("fp16")
            || precision_text.contains("mixed"));
    let precision = if half || (family == "vtrain" && precision_text.is_empty()) {
        Some(Precision::Fp16)
    } else if precision_text.starts_with("bf16") {
        Some(Precision::Bf16)
    } else if !gpu.starts_with("v100")
        && (precision_text.contains("tf32") || precision_text.contains("fp32"))
    {
        // NGC containers run FP32 math as TF32 on Ampere and newer.
        Some(Precision::Tf32)
    } else if precision_text.contains("fp32") {
        Some(Precision::Fp32)
    } else {
        return Err("precision not stated".into());
    };
    // The model in half with FP32 master weights, where the code the run executed does that:
    // NVIDIA's PyTorch BERT scripts before native AMP (run_pretraining.py and run_squad.py,
    // `amp.initialize(model, optimizer, opt_level="O2")`: DLE's NGC 19.07-20.03 rows, DLPerf's
    // re-run, and Lambda's runs of run_squad.py, which kept apex O2); Megatron-DeepSpeed
    // (vTrain's runs: `--fp16`, FP32 master weights in the optimizer); DeepSpeed engines
    // (`fp16.enabled`, which Lightning's DeepSpeed strategy and plugin set for precision=16).
    let apex_o2_bert = matches!(family, "dle" | "dlperf" | "lambda")
        && model.starts_with("bert")
        && framework_text.contains("pytorch")
        && !framework_text.contains("native amp");
    // Megatron-DeepSpeed's --fp16 / --bf16 (BigScience's runs) cast the model too.
    let megatron_deepspeed = extra.contains("impl=megatron-deepspeed");
    let amp_style = ((precision == Some(Precision::Fp16)
        && (apex_o2_bert
            || family == "vtrain"
            || megatron_deepspeed
            || extra.contains("impl=deepspeed")
            || extra.contains("DeepSpeedStrategy")))
        || (precision == Some(Precision::Bf16) && megatron_deepspeed))
        .then_some(AmpStyle::Pure);
    let checkpointing = get("checkpointing").to_ascii_lowercase();
    let recompute_selective = checkpointing.starts_with("selective");
    let recompute = checkpointing.starts_with("yes")
        || checkpointing.starts_with("full")
        || recompute_selective;
    let kind_text = get("memory_kind").to_ascii_lowercase();
    let (measured_gb, memory_kind) = match num("peak_memory_gb") {
        Some(g) if kind_text.contains("nvml") || kind_text.contains("nvidia-smi") => {
            (Some(g), MemoryKind::DeviceUsed)
        }
        Some(g) => (Some(g), MemoryKind::Allocated),
        None => (None, MemoryKind::None),
    };
    let apex_bucket_elems = dle_pretraining_ddp(family, opts.head, accum);
    Ok(Case {
        id,
        family,
        source,
        locator: get("locator").to_string(),
        model: model.to_string(),
        opts,
        gpu,
        gpus,
        nodes,
        intra: intra_network(&network),
        inter,
        apex_bucket_elems,
        nics,
        framework,
        horovod_sync: false,
        precision,
        amp_style,
        // "NHWC" or "channels_last (nhwc)" (DLE's ResNet-50 AMP rows), "NCHW": any case.
        channels_last: if lower_extra.contains("nhwc") || lower_extra.contains("channels_last") {
            Some(true)
        } else if lower_extra.contains("nchw") {
            Some(false)
        } else {
            None
        },
        recompute,
        recompute_blocks: recompute && !recompute_selective,
        recompute_selective,
        sequence_parallel: lower_extra.contains("sequence parallelism")
            && !lower_extra.contains("no sequence parallelism"),
        accum,
        shard,
        offload,
        tp,
        pp,
        measured_ms,
        fits,
        measured_gb,
        memory_kind,
        samples: f64::from(micro) * f64::from(gpus / (tp * pp).max(1)) * f64::from(accum),
    })
}

/// dPRO (MLSys'22) Tables 2 and 4: TensorFlow + Horovod on 2 × 8 V100 with 100 Gb/s RDMA,
/// FP32. Table 4's memory is TensorFlow's peak in use (the `Real` column: the extracted text
/// prints `Est. | Real`, and Table 3's BERT-base at batch 32 — real 9.96 GB, est. 10.25 GB — fixes
/// which is which). The paper does not print Table 4's accumulation `k`; its memory row (9.96 GB)
/// is exactly Table 3's BERT-base at batch 32, so the run used 2 micro-batches of 32.
pub fn dpro() -> Vec<Case> {
    let base = |id: &str, model: &str, batch: u32, ms: f64| Case {
        id: id.to_string(),
        family: "dpro",
        source: "dPRO (Hu et al., MLSys'22)".into(),
        locator: String::new(),
        model: model.to_string(),
        opts: ModelOptions {
            batch: Some(batch),
            ..Default::default()
        },
        gpu: "v100-32gb",
        gpus: 16,
        nodes: 2,
        intra: None,
        inter: Some("rdma-100g"),
        apex_bucket_elems: None,
        nics: 1,
        framework: Framework::Tf,
        horovod_sync: true,
        precision: Some(Precision::Fp32),
        amp_style: None,
        channels_last: None,
        recompute: false,
        recompute_blocks: false,
        recompute_selective: false,
        sequence_parallel: false,
        accum: 1,
        shard: None,
        offload: false,
        tp: 1,
        pp: 1,
        measured_ms: Some(ms),
        fits: None,
        measured_gb: None,
        memory_kind: MemoryKind::None,
        samples: f64::from(batch) * 16.0,
    };
    let mut v = vec![
        Case {
            locator: "Table 2, ResNet-50 iteration".into(),
            ..base("dpro-t2-resnet50", "resnet50", 32, 138.64)
        },
        Case {
            locator: "Table 2, BERT-base iteration".into(),
            ..base("dpro-t2-bert-base", "bert-base", 32, 459.62)
        },
    ];
    for (id, what, recompute, accum, ms, gb) in [
        ("dpro-t4-none", "no optimisation", false, 1, 622.1, 16.42),
        ("dpro-t4-recompute", "re-computation", true, 1, 696.1, 7.43),
        (
            "dpro-t4-accum",
            "gradient accumulation",
            false,
            2,
            714.2,
            9.96,
        ),
    ] {
        let mut c = base(id, "bert-base", 64, ms);
        c.locator = format!("Table 4, BERT-base batch 64, {what}");
        c.recompute = recompute;
        c.accum = accum;
        c.measured_gb = Some(gb);
        c.memory_kind = MemoryKind::Allocated;
        // Accumulation: the batch of 64 per GPU in two micro-steps of 32.
        v.push(c);
    }
    v
}

/// Every row of the CSV: cases, and (id, reason) for the skipped.
pub fn load(csv_path: &std::path::Path) -> (Vec<Case>, Vec<(String, String)>) {
    let mut rdr = csv::Reader::from_path(csv_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", csv_path.display()));
    let headers = rdr.headers().expect("a header row").clone();
    let (mut cases, mut skipped) = (Vec::new(), Vec::new());
    for rec in rdr.records() {
        let rec = rec.expect("a well-formed CSV row");
        let row: BTreeMap<String, String> = headers
            .iter()
            .zip(rec.iter())
            .map(|(h, v)| (h.to_string(), v.to_string()))
            .collect();
        match case(&row) {
            Ok(c) => cases.push(c),
            Err(why) => skipped.push((row.get("id").cloned().unwrap_or_default(), why)),
        }
    }
    cases.extend(dpro());
    (cases, skipped)
}

#[cfg(test)]
mod tests {
    use super::{dle_pretraining_ddp, intra_network, omni_path_links};

    /// DLPerf's BERT pre-training without accumulation ran apex DDP with 250 M-element buckets;
    /// its ResNet-50 rows, DLE's own BERT tables and accumulated runs keep the default.
    #[test]
    fn dlperf_bert_pretraining_buckets_250_million_elements() {
        use trainplan::zoo::Head;
        assert_eq!(
            dle_pretraining_ddp("dlperf", Some(Head::Pretraining), 1),
            Some(250_000_000)
        );
        assert_eq!(dle_pretraining_ddp("dlperf", None, 1), None);
        assert_eq!(dle_pretraining_ddp("dle", Some(Head::Pretraining), 1), None);
        assert_eq!(dle_pretraining_ddp("dlperf", Some(Head::Squad), 1), None);
        assert_eq!(
            dle_pretraining_ddp("dlperf", Some(Head::Pretraining), 4),
            None
        );
    }

    /// A network column that states `NCCL_P2P_DISABLE=1` (Lambda's runs of late 2022) gives
    /// NCCL's SHM transport inside the node; one that states nothing keeps the GPU's NVLink.
    #[test]
    fn a_run_without_peer_to_peer_goes_through_host_memory() {
        let lambda = "single node (nvlink/nvswitch for sxm; not stated); nccl_p2p_disable=1 exported by the benchmark script";
        assert_eq!(intra_network(lambda), Some("shm-host"));
        assert_eq!(
            intra_network("single node (nvlink/nvswitch for sxm; not stated)"),
            None
        );
        assert_eq!(intra_network("nccl_p2p_disable=0"), None);
    }

    /// BigScience's network column ("… 4 Omni-Path links per node, …") gives the NIC count;
    /// a network that names no count (or no Omni-Path) gives none.
    #[test]
    fn omni_path_links_are_read_from_the_network_text() {
        let bs = "nvlink within node (nvlink 4 inter-gpu connects); 4 omni-path links per node, omni-path architecture (opa) between nodes (jz/hpc-specs.md)";
        assert_eq!(omni_path_links(bs), Some(4));
        assert_eq!(omni_path_links("omni-path links per node"), None);
        assert_eq!(omni_path_links("infiniband edr 100 gb/s"), None);
        assert_eq!(omni_path_links("many omni-path links per node"), None);
    }
}
