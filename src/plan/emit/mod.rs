//! Emitters: a [`Plan`] turned into the files a user applies to one framework (`trainplan
//! export PLAN --to FRAMEWORK`), one module per column of the DESIGN.md knob table.
//!
//! | plan (config / decisions) | horovod | byteps | xla (tf) | pytorch | jax |
//! |---|---|---|---|---|---|
//! | `tensor_groups` | `groups=`, `HOROVOD_DISABLE_GROUP_FUSION=1`, `HOROVOD_FUSION_THRESHOLD` ≥ largest group | group id column of `byteps_partitions.txt` | — (not applied, said) | `bucket_cap_mb` of the start point | combine threshold of the start point |
//! | cycle of a Horovod baseline | `HOROVOD_CYCLE_TIME` | — | — | — | — |
//! | `partitions` | — | `BYTEPS_PARTITION_BYTES`, `BYTEPS_SCHEDULING_CREDIT`, per-tensor file | — | — | — |
//! | `fused_ops` | — | — | `jit_compile` / `TF_XLA_FLAGS` (XLA's own clusters; zoo names not targeted, said) | `torch.compile` per module | — (`jax.jit` fuses; said) |
//! | `dtype`, `amp` | autocast + GradScaler, `Compression.fp16` when `fp16_allreduce=1` | — | mixed-precision policy + loss scaling | autocast + GradScaler; DDP's `fp16_compress_hook` / `bf16_compress_hook` (FSDP2: `reduce_dtype` half) when `fp16_allreduce=1` | compute dtype + dynamic loss scaling (fp16) |
//! | `recompute` | — | — | — (not applied, said) | `torch.utils.checkpoint` per module (whole blocks as planned) | `jax.checkpoint` per layer or block (`remat`; whole blocks as planned) |
//! | `grad_accumulation` k | `backward_passes_per_step`, loss ÷ k | same (note) | `gradient_accumulation_steps` | `no_sync()` (FSDP2: `set_requires_gradient_sync(False)`) for k−1 micro-steps, loss ÷ k | `optax.MultiSteps(k)` |
//! | `sharding` (stage 3) | — | — | — | FSDP2 `fully_shard` per unit, then the root: `reshard_after_forward`, prefetch lists, `MixedPrecisionPolicy`, HSDP mesh ([`fsdp`]) | — |
//! | `tensor_parallel`, `pipeline` | — | — | — | a Llama-style model only: DTensor `parallelize_module`, `torch.distributed.pipelining` schedule, FSDP2 per model part on a 4-D mesh ([`native`]) | — |
//!
//! Megatron-LM gets `megatron_args.sh`, the planned arguments of `pretrain_gpt.py` as a bash
//! array (tensor, sequence and pipeline parallelism, the distributed optimizer, recomputation,
//! micro and global batch, precision); its module header has its own table.
//!
//! torchtitan writes one TOML job config (`torchtitan.toml`: data-parallel degrees and the
//! FSDP2 reshard policy from `sharding`, batch sizes from which torchtitan derives k, bf16
//! mixed precision, fused Adam); its module header has its own table.
//!
//! **Invariant:** emitters are pure: no IO, the same plan gives byte-identical files (every map
//! is ordered). Every Python file they produce compiles (`python3 -m py_compile`, tested) and
//! imports its framework lazily, inside functions, so that it can be inspected anywhere. Env
//! files are `KEY=value` lines (values single-quoted unless plain) for `set -a; . FILE`.
//!
//! **Invariant:** no string of a plan reaches a file unescaped. Names and other plan text go
//! through the one escaping function of their target ([`escape`]): Python literals
//! ([`py_str`]), `#` comments ([`comment_text`]), env values ([`env_line`]; control characters
//! refused), one-record-per-line text ([`escape::record_field`]), TOML strings ([`toml_str`]). Docstrings and the first two
//! lines of every Python file are fixed text. Importing an emitted module or sourcing an emitted
//! env file runs nothing but the emitter's own code, whatever the plan holds
//! (`tests/it/hostile_export.rs` exports hostile plans for every framework, then compiles,
//! imports and sources the files).
//!
//! **Names.** A plan refers to tensors and layers by the names of its source: a trace's own
//! operator and parameter names, or for zoo plans the zoo's (torchvision / Hugging Face style:
//! `layer4.0.conv1.weight`, `bert.encoder.layer.3.output.dense.weight`). The Python modules
//! look every planned name up in the user's model and raise an error listing a few missing ones.

mod byteps;
mod deepspeed;
pub mod escape;
mod fsdp;
mod horovod;
mod jax;
mod megatron;
mod native;
mod pytorch;
mod torch_helpers;
mod torchtitan;
mod xla;

use std::collections::{BTreeMap, BTreeSet};

use super::Plan;
pub(crate) use escape::{comment_text, env_line, py_str, toml_str};

/// A framework `trainplan export` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Framework {
    /// Horovod (PyTorch or TensorFlow): env file + `groups=` module.
    Horovod,
    /// TensorFlow with XLA: env file, dPRO cluster file, stock-TF scope module (`tf` is the
    /// same).
    #[value(alias = "tf")]
    Xla,
    /// BytePS: env file + per-tensor partition file.
    Byteps,
    /// PyTorch: `trainplan_patch.py` with `apply_plan(model, optimizer)` (DDP), or
    /// `apply_fsdp(model)` (FSDP2) for a sharded plan.
    Pytorch,
    /// JAX: env file + remat / dtype / accumulation module.
    Jax,
    /// DeepSpeed: `ds_config.json` (ZeRO stage and sizes, precision, batch and accumulation).
    Deepspeed,
    /// torchtitan: `torchtitan.toml` job config (parallelism degrees, precision, batch).
    Torchtitan,
    /// Megatron-LM: `megatron_args.sh`, the planned arguments of `pretrain_gpt.py`.
    Megatron,
}

impl Framework {
    /// The export of a plan made with `--framework fw` (`tf` → `xla`).
    pub fn of(fw: crate::cost::framework::Framework) -> Framework {
        use crate::cost::framework::Framework as F;
        match fw {
            F::Pytorch => Framework::Pytorch,
            F::Horovod => Framework::Horovod,
            F::Byteps => Framework::Byteps,
            F::Tf => Framework::Xla,
            F::Jax => Framework::Jax,
            F::Deepspeed => Framework::Deepspeed,
            F::Torchtitan => Framework::Torchtitan,
            F::Megatron => Framework::Megatron,
        }
    }

    /// The `--framework` this export serves (`xla` → `tf`).
    pub fn planned_as(self) -> crate::cost::framework::Framework {
        use crate::cost::framework::Framework as F;
        match self {
            Framework::Pytorch => F::Pytorch,
            Framework::Horovod => F::Horovod,
            Framework::Byteps => F::Byteps,
            Framework::Xla => F::Tf,
            Framework::Jax => F::Jax,
            Framework::Deepspeed => F::Deepspeed,
            Framework::Torchtitan => F::Torchtitan,
            Framework::Megatron => F::Megatron,
        }
    }

    /// Every framework, in the order they are listed.
    pub const ALL: [Framework; 8] = [
        Framework::Horovod,
        Framework::Xla,
        Framework::Byteps,
        Framework::Pytorch,
        Framework::Jax,
        Framework::Deepspeed,
        Framework::Torchtitan,
        Framework::Megatron,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Horovod => "horovod",
            Framework::Xla => "xla",
            Framework::Byteps => "byteps",
            Framework::Pytorch => "pytorch",
            Framework::Jax => "jax",
            Framework::Deepspeed => "deepspeed",
            Framework::Torchtitan => "torchtitan",
            Framework::Megatron => "megatron",
        }
    }
}

impl std::fmt::Display for Framework {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Framework {
    type Err = EmitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        Framework::ALL
            .into_iter()
            .find(|f| f.name() == t || ((t == "tensorflow" || t == "tf") && *f == Framework::Xla))
            .ok_or_else(|| EmitError::UnknownFramework {
                name: s.to_string(),
                known: Framework::ALL.map(|f| f.name()).join(", "),
            })
    }
}

/// What an emitter produced: files (relative name, content) and what the user must do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Emitted {
    pub files: Vec<(String, String)>,
    pub notes: Vec<String>,
}

/// Why a plan cannot be emitted.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum EmitError {
    #[error("unknown framework `{name}` (known: {known})")]
    UnknownFramework { name: String, known: String },
    #[error("the plan is inconsistent: {0}")]
    Inconsistent(String),
    /// A value no escaping can carry into the target file (a control character in an env value).
    #[error("cannot be exported safely: {0}")]
    Unsafe(String),
    /// A planned setting the framework's export has no mechanism for (`field` names it).
    #[error("{field} cannot be exported for this framework: {why}")]
    Unsupported { field: String, why: String },
}

/// Emit `plan` for `fw`.
pub fn emit(plan: &Plan, fw: Framework) -> Result<Emitted, EmitError> {
    // The reader checked a plan from a file already; a plan built in code meets the same ranges.
    plan.check()
        .map_err(|e| EmitError::Inconsistent(e.to_string()))?;
    let facts = Facts::of(plan)?;
    if let Some(tp) = &plan.config.tensor_parallel
        && !matches!(
            fw,
            Framework::Torchtitan | Framework::Megatron | Framework::Pytorch
        )
    {
        return Err(EmitError::Unsupported {
            field: "config.tensor_parallel".into(),
            why: format!(
                "this export has no tensor parallelism (degree {} planned): it comes with --framework torchtitan (parallelism.tensor_parallel_degree), megatron (--tensor-model-parallel-size) or pytorch (DTensor); run without it, every rank would hold the whole model",
                tp.degree
            ),
        });
    }
    if let Some(cp) = &plan.config.context_parallel
        && !matches!(fw, Framework::Torchtitan | Framework::Megatron)
    {
        return Err(EmitError::Unsupported {
            field: "config.context_parallel".into(),
            why: format!(
                "this export has no context parallelism (degree {} planned): it comes with --framework torchtitan (parallelism.context_parallel_degree) or megatron (--context-parallel-size); run without it, every rank would hold whole sequences",
                cp.degree
            ),
        });
    }
    if let Some(pp) = &plan.config.pipeline
        && !matches!(
            fw,
            Framework::Megatron | Framework::Torchtitan | Framework::Pytorch
        )
    {
        return Err(EmitError::Unsupported {
            field: "config.pipeline".into(),
            why: format!(
                "this export has no pipeline parallelism ({} stages planned): it comes with --framework megatron (--pipeline-model-parallel-size), torchtitan (parallelism.pipeline_parallel_degree) or pytorch (torch.distributed.pipelining); run without it, every rank would hold the whole model",
                pp.stages
            ),
        });
    }
    let mut out = match fw {
        Framework::Horovod => horovod::emit(plan, &facts)?,
        Framework::Xla => xla::emit(plan, &facts)?,
        Framework::Byteps => byteps::emit(plan, &facts)?,
        Framework::Pytorch => pytorch::emit(plan, &facts)?,
        Framework::Jax => jax::emit(plan, &facts)?,
        Framework::Deepspeed => deepspeed::emit(plan, &facts)?,
        Framework::Torchtitan => torchtitan::emit(plan, &facts)?,
        Framework::Megatron => megatron::emit(plan, &facts)?,
    };
    if plan.workload.names == "zoo" {
        out.notes.insert(
            0,
            format!(
                "names are the zoo's ({} in torchvision / Hugging Face style, e.g. `{}`): they match those models; for another model, plan from its trace",
                plan.workload.model,
                facts
                    .groups
                    .first()
                    .and_then(|g| g.first())
                    .map_or("layer1.0.conv1.weight", |s| s.as_str())
            ),
        );
    }
    Ok(out)
}

/// The model parts of pipeline `p` (`stages × virtual`, in pipeline order) as module paths:
/// the blocks `{block}N` cut as the plan cuts them ([`crate::graph::pipeline::split`]), the
/// `first` modules (the embedding) with the first part and the `last` ones (final norm, head)
/// with the last.
pub(super) fn pipeline_parts(
    p: &crate::plan::PipelineConfig,
    first: &[&str],
    block: &str,
    last: &[&str],
) -> Result<Vec<Vec<String>>, EmitError> {
    let chunks = p.stages.saturating_mul(p.chunks_per_rank.max(1));
    let sizes = crate::graph::pipeline::split(p.layers, chunks).ok_or_else(|| {
        EmitError::Inconsistent(format!(
            "config.pipeline: {} layers cannot be cut into {chunks} model parts",
            p.layers
        ))
    })?;
    let mut parts = Vec::with_capacity(sizes.len());
    let mut next = 0u32;
    for (i, &n) in sizes.iter().enumerate() {
        let mut part: Vec<String> = Vec::new();
        if i == 0 {
            part.extend(first.iter().map(|m| m.to_string()));
        }
        part.extend((next..next + n).map(|l| format!("{block}{l}")));
        next += n;
        if i + 1 == sizes.len() {
            part.extend(last.iter().map(|m| m.to_string()));
        }
        parts.push(part);
    }
    Ok(parts)
}

/// What every emitter needs, derived once from the plan and checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Facts {
    /// Collectives in issue order, as tensor names.
    pub groups: Vec<Vec<String>>,
    /// Bytes of each group, when the plan knows every tensor's bytes.
    pub group_bytes: Option<Vec<u64>>,
    /// Half dtype under AMP (`fp16` / `bf16`), None for fp32.
    pub half: Option<String>,
    /// AMP all-reduces gradients in half (the `amp` decision's `fp16_allreduce=1`, or its model
    /// in half: `style=pure`, DeepSpeed's default; not Megatron-LM's bf16 model, which keeps
    /// FP32 gradients).
    pub fp16_allreduce: bool,
    /// Micro-batches per iteration.
    pub k: u32,
    /// Samples per micro-step (the per-GPU batch ÷ k — per tensor-parallel group with tensor
    /// parallelism, ÷ the micro-batches of a pipelined replica —, always whole: a plan whose k does not divide its batch is refused),
    /// `None` when the plan does not know its batch (a trace).
    pub micro_batch: Option<u32>,
    /// Modules to recompute (checkpoint), forward order, collapsed to parents where all of a
    /// parent's planned layers are recomputed.
    pub recompute: Vec<String>,
    /// Op-fusion clusters: `layer PHASE` members, deduplicated, clusters sharing a member merged.
    pub clusters: Vec<Vec<String>>,
    /// Cycle time of the Horovod baseline the plan started from, ms.
    pub horovod_cycle_ms: Option<f64>,
    /// On/off passes with no knob in the emitted framework are reported by the emitters.
    pub passes: Vec<String>,
}

impl Facts {
    pub fn of(plan: &Plan) -> Result<Facts, EmitError> {
        let c = &plan.config;
        if c.grad_accumulation == 0 {
            return Err(EmitError::Inconsistent(
                "grad_accumulation is 0 (1 means no accumulation)".into(),
            ));
        }
        // What one data-parallel replica trains: a tensor-parallel group's batch, with
        // tensor parallelism; all its stages', with a pipeline.
        let batch = plan
            .workload
            .batch()
            .map_or(0, |b| crate::plan::replica_batch(c, b));
        if batch > 0 && !batch.is_multiple_of(c.grad_accumulation) {
            return Err(EmitError::Inconsistent(format!(
                "grad_accumulation {} does not divide the per-GPU batch of {batch}: a micro-step would hold {:.3} samples (no export feeds a fraction of a sample)",
                c.grad_accumulation,
                f64::from(batch) / f64::from(c.grad_accumulation)
            )));
        }
        let micro_batch = (batch > 0).then(|| batch / c.micro_steps());
        let mut seen = BTreeSet::new();
        for t in c.tensor_groups.iter().flatten() {
            if !seen.insert(t.as_str()) {
                return Err(EmitError::Inconsistent(format!(
                    "tensor `{t}` is in two collectives of config.tensor_groups"
                )));
            }
        }
        if let Some(g) = c.tensor_groups.iter().find(|g| g.is_empty()) {
            let _ = g;
            return Err(EmitError::Inconsistent(
                "config.tensor_groups has an empty group".into(),
            ));
        }
        for first in c.partitions.keys() {
            if !c.tensor_groups.iter().any(|g| g.first() == Some(first)) {
                return Err(EmitError::Inconsistent(format!(
                    "config.partitions names `{first}`, which is not the first tensor of a group"
                )));
            }
        }
        // Checked sums: a group over a collective's bound is refused, never wrapped to a small
        // number (`Plan::check` refuses it first; this holds without it).
        let mut group_bytes = Some(Vec::with_capacity(c.tensor_groups.len()));
        for (i, g) in c.tensor_groups.iter().enumerate() {
            let mut sum = Some(0u64);
            for t in g {
                sum = match (sum, c.tensor_bytes.get(t)) {
                    (Some(s), Some(&b)) => Some(s.checked_add(b).ok_or_else(|| {
                        EmitError::Inconsistent(format!(
                            "config.tensor_groups[{i}]: its tensors' bytes overflow"
                        ))
                    })?),
                    _ => None,
                };
            }
            group_bytes = match (group_bytes, sum) {
                (Some(mut v), Some(s)) => {
                    v.push(s);
                    Some(v)
                }
                _ => None,
            };
        }
        let amp = plan.decisions.iter().rev().find(|d| d.pass == "amp");
        let half = match c.dtype.as_str() {
            "fp16" | "bf16" => Some(c.dtype.clone()),
            // The knob's spelling (`float16`, ` BF16`) normalised: only `fp16` / `bf16` reach a
            // file.
            _ if c.passes.iter().any(|p| p == "amp") => {
                Some(match amp.and_then(|d| d.knobs.get("dtype")) {
                    None => "fp16".to_string(),
                    Some(v) => match crate::passes::amp::half_dtype(v) {
                        Some(crate::cost::config::Dtype::Bf16) => "bf16".to_string(),
                        Some(_) => "fp16".to_string(),
                        None => {
                            return Err(EmitError::Inconsistent(format!(
                                "the amp decision's dtype {v:?} is not fp16 or bf16"
                            )));
                        }
                    },
                })
            }
            _ => None,
        };
        // A model in half (`style=pure`, or the framework's style when the knob is absent or
        // `framework`) reduces its half gradients in half: the pass priced that.
        let pure = amp.is_some_and(|d| {
            let named = d
                .knobs
                .get("style")
                .and_then(|v| crate::passes::amp::amp_style(v))
                .flatten();
            named.unwrap_or(plan.workload.framework.default_amp_style())
                == crate::cost::framework::AmpStyle::Pure
        });
        // Except where the framework keeps FP32 gradients (Megatron-LM's bf16 models).
        let fp32_grads = half.as_deref() == Some("bf16")
            && plan
                .workload
                .framework
                .keeps_fp32_grads(crate::cost::config::Dtype::Bf16);
        let fp16_allreduce = (pure && !fp32_grads)
            || amp
                .and_then(|d| d.knobs.get("fp16_allreduce"))
                .is_some_and(|v| v.trim() == "1");
        let horovod_cycle_ms = plan
            .decisions
            .iter()
            .find(|d| d.pass.starts_with("baseline:horovod"))
            .and_then(|d| {
                d.knobs
                    .get("cycle_ms")
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| cycle_in_range(*v))
                    .or_else(|| cycle_ms(&d.why))
            });
        Ok(Facts {
            groups: c.tensor_groups.clone(),
            group_bytes,
            half,
            fp16_allreduce,
            k: c.grad_accumulation,
            micro_batch,
            recompute: recompute_modules(plan),
            clusters: merge_clusters(&c.fused_ops),
            horovod_cycle_ms,
            passes: c.passes.clone(),
        })
    }

    /// Largest group, bytes.
    pub fn largest_group_bytes(&self) -> Option<u64> {
        self.group_bytes.as_ref()?.iter().copied().max()
    }

    /// Some group carries more than one tensor (the plan fuses tensors).
    pub fn fuses_tensors(&self) -> bool {
        self.groups.iter().any(|g| g.len() > 1)
    }

    /// Module names (layer names) of the fusion clusters' FW members, one list per cluster.
    pub fn cluster_modules(&self) -> Vec<Vec<String>> {
        self.clusters
            .iter()
            .map(|c| {
                let mut seen = BTreeSet::new();
                c.iter()
                    .map(|m| split_member(m).0)
                    .filter(|l| seen.insert(l.to_string()))
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    }
}

/// `layer4.0.conv1 FW` → (`layer4.0.conv1`, `FW`).
pub(crate) fn split_member(m: &str) -> (&str, &str) {
    match m.rsplit_once(' ') {
        Some((l, p)) if ["FW", "BW", "UPDATE", "COMM"].contains(&p) => (l, p),
        _ => (m, ""),
    }
}

/// `… cycle 2.5 ms …` in a Horovod baseline's explanation.
fn cycle_ms(why: &str) -> Option<f64> {
    let rest = &why[why.find("cycle ")? + "cycle ".len()..];
    let num = rest.split_whitespace().next()?.trim_end_matches(':');
    let v: f64 = num.parse().ok()?;
    cycle_in_range(v).then_some(v)
}

/// A Horovod cycle time the planner could have chosen (1 µs to
/// [`crate::search::baselines::MAX_CYCLE_MS`]).
fn cycle_in_range(v: f64) -> bool {
    v.is_finite() && (1e-3..=crate::search::baselines::MAX_CYCLE_MS).contains(&v)
}

/// Fusion clusters with duplicates removed inside a cluster and clusters that share a member
/// merged (a framework node belongs to one cluster: the copies gradient accumulation makes of
/// every micro-batch's ops fuse alike, and a layer with several ops appears once). Order: by
/// first appearance.
pub(crate) fn merge_clusters(fused: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut parent: Vec<usize> = (0..fused.len()).collect();
    fn root(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let mut owner: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, c) in fused.iter().enumerate() {
        for m in c {
            match owner.get(m.as_str()) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    let (lo, hi) = (a.min(b), a.max(b));
                    parent[hi] = lo;
                }
                None => {
                    owner.insert(m, i);
                }
            }
        }
    }
    let mut out: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (i, c) in fused.iter().enumerate() {
        let r = root(&mut parent, i);
        for m in c {
            if seen.insert(m.clone()) {
                out.entry(r).or_default().push(m.clone());
            }
        }
    }
    out.into_values().filter(|c| c.len() > 1).collect()
}

/// Parameterised layers in forward order: the plan's gradient tensors, in reverse issue order,
/// with the parameter suffix dropped (`layer1.0.conv1.weight` → `layer1.0.conv1`).
pub(crate) fn forward_layers(groups: &[Vec<String>]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for t in groups.iter().flatten().rev() {
        let l = t.rsplit_once('.').map_or(t.as_str(), |(l, _)| l);
        if seen.insert(l.to_string()) {
            out.push(l.to_string());
        }
    }
    out
}

/// Whether every recomputation decision of `plan` checkpoints whole blocks
/// (`recompute:policy=full`): what a checkpoint around a module or function, which keeps that
/// one's inputs (`torch.utils.checkpoint`, `jax.checkpoint`), applies as priced.
pub(crate) fn whole_block_recompute(plan: &Plan) -> bool {
    plan.decisions
        .iter()
        .filter(|d| d.pass == "recompute")
        .all(|d| d.knobs.get("policy").map(String::as_str) == Some("full"))
}

/// The layers the plan recomputes, collapsed: a parent module all of whose planned layers are
/// recomputed stands for them (`bert.encoder.layer.3` rather than its 6 linear layers).
fn recompute_modules(plan: &Plan) -> Vec<String> {
    // `recompute:policy=full` re-runs each block whole from its input: the blocks themselves
    // (the first numbered module of each chosen layer's path, `model.layers.3`), which are
    // modules where some chosen layers (residual adds) are functional ops.
    let full = plan.decisions.iter().any(|d| {
        d.pass == "recompute" && d.knobs.get("policy").map(String::as_str) == Some("full")
    });
    if full {
        let mut blocks: Vec<String> = Vec::new();
        for l in &plan.config.recompute {
            let parts: Vec<&str> = l.split('.').collect();
            let b = parts
                .iter()
                .position(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
                .map_or(l.clone(), |i| parts[..=i].join("."));
            if !blocks.contains(&b) {
                blocks.push(b);
            }
        }
        return blocks;
    }
    let mut layers = forward_layers(&plan.config.tensor_groups);
    // Layers without parameters (activations, dropouts) are not in the tensor groups.
    for l in &plan.config.recompute {
        if !layers.contains(l) {
            layers.push(l.clone());
        }
    }
    // Nor are any where the plan has no gradient collectives of its own (a sharded or
    // pipelined plan's are FSDP's): every parameter's layer counts, or a module whose other
    // layers are not recomputed would stand for the chosen ones (Llama 3 405B's selective
    // recomputation became `model`, the whole model).
    let mut known: BTreeSet<String> = layers.iter().cloned().collect();
    for t in plan.config.tensor_bytes.keys() {
        let l = t.rsplit_once('.').map_or(t.as_str(), |(l, _)| l);
        if known.insert(l.to_string()) {
            layers.push(l.to_string());
        }
    }
    let chosen: BTreeSet<&str> = plan.config.recompute.iter().map(String::as_str).collect();
    collapse(&layers, &chosen)
}

/// The smallest set of module names covering `chosen` among `all` (forward order): a prefix
/// stands for its layers when every layer of `all` under it is chosen.
pub(crate) fn collapse(all: &[String], chosen: &BTreeSet<&str>) -> Vec<String> {
    let parent_of = |l: &str| l.rsplit_once('.').map(|(p, _)| p.to_string());
    let under =
        |p: &str, l: &str| l.len() > p.len() && l.starts_with(p) && l[p.len()..].starts_with('.');
    let mut out: Vec<String> = Vec::new();
    for l in all.iter().filter(|l| chosen.contains(l.as_str())) {
        // The highest ancestor whose planned layers are all chosen.
        let mut best = l.clone();
        let mut cur = parent_of(l);
        while let Some(p) = cur {
            let mine: Vec<&String> = all.iter().filter(|x| under(&p, x)).collect();
            if mine.iter().all(|x| chosen.contains(x.as_str())) {
                best = p.clone();
                cur = parent_of(&p);
            } else {
                break;
            }
        }
        if out.last() != Some(&best) && !out.contains(&best) {
            out.push(best);
        }
    }
    out
}

/// A Python list of string literals, one per line when long.
pub(crate) fn py_list(items: &[String], indent: &str) -> String {
    if items.is_empty() {
        return "[]".into();
    }
    let one: Vec<String> = items.iter().map(|s| py_str(s)).collect();
    let flat = format!("[{}]", one.join(", "));
    if flat.len() + indent.len() <= 96 {
        return flat;
    }
    let mut out = String::from("[\n");
    for s in one {
        out.push_str(&format!("{indent}    {s},\n"));
    }
    out.push_str(indent);
    out.push(']');
    out
}

/// A Python list of lists of string literals.
pub(crate) fn py_groups(groups: &[Vec<String>]) -> String {
    if groups.is_empty() {
        return "[]".into();
    }
    let mut out = String::from("[\n");
    for g in groups {
        out.push_str(&format!("    {},\n", py_list(g, "    ")));
    }
    out.push(']');
    out
}

/// A Python list of ints.
pub(crate) fn py_ints(v: &[u64]) -> String {
    format!(
        "[{}]",
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    )
}

/// The header every emitted file carries (`#` comments in env, text and Python files). The
/// plan's names go through [`comment_text`]: one printable-ASCII line each, whatever they hold.
/// Never the first line of a Python file (see [`escape`]: an encoding declaration).
pub(crate) fn header(plan: &Plan, what: &str) -> String {
    let w = &plan.workload;
    format!(
        "# trainplan export: {what}\n# plan: {} ({}) on {} ({} ranks), names: {}; predicted {} → {} ({:.2}x)\n",
        comment_text(&w.model),
        w.batch()
            .map_or("batch not recorded".to_string(), |b| format!(
                "batch {b}/GPU"
            )),
        comment_text(&w.cluster),
        w.ranks,
        comment_text(&w.names),
        crate::units::dur_ms(plan.predicted.baseline.iteration_ms, 1),
        crate::units::dur_ms(plan.predicted.planned.iteration_ms, 1),
        plan.predicted.speedup
    )
}

/// Whose names the plan uses, in words. Holds the plan's model name: for a `#` comment through
/// [`comment_text`], never a docstring.
pub(crate) fn names_doc(plan: &Plan) -> String {
    if plan.workload.names == "zoo" {
        format!(
            "the zoo's ({} in torchvision / Hugging Face naming); they match those models — for another model, plan from its trace",
            plan.workload.model
        )
    } else {
        "the trace's own parameter and operator names".into()
    }
}

/// Passes of the plan that `fw` has no knob for, as a note.
pub(crate) fn unmapped_passes(facts: &Facts, mapped: &[&str], fw: &str) -> Option<String> {
    let rest: Vec<&str> = facts
        .passes
        .iter()
        .map(String::as_str)
        .filter(|p| !mapped.contains(p))
        .collect();
    (!rest.is_empty()).then(|| {
        format!(
            "the plan also applies {} — {fw} has no setting for {}; apply by hand (see the plan's decisions)",
            rest.join(", "),
            if rest.len() == 1 { "it" } else { "them" }
        )
    })
}

/// Whether the plan's gradient accumulation holds sharded gradients whole over its micro-steps
/// and reduce-scatters once (`grad-accumulation` `sync=last`, FSDP2's
/// `set_requires_gradient_sync(False)`); otherwise they are reduce-scattered every micro-step.
pub(crate) fn holds_sharded_gradients(plan: &crate::plan::Plan) -> bool {
    plan.decisions.iter().any(|d| {
        d.pass == "grad-accumulation" && d.knobs.get("sync").map(|v| v.trim()) == Some("last")
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plan::{FinalConfig, Point, Predicted, SCHEMA_VERSION, SearchStats, Workload};
    use crate::search::{Decision, StopReason, Strategy};

    pub(crate) fn decision(pass: &str, knobs: &[(&str, &str)], why: &str) -> Decision {
        Decision {
            pass: pass.into(),
            tensors: Vec::new(),
            ops: Vec::new(),
            partitions: None,
            knobs: knobs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            why: why.into(),
            effect_ms: -1.0,
            mechanism: String::new(),
        }
    }

    /// `plan` without accumulation, pipelined over `stages` × `chunks` parts of 4 layers in 4
    /// micro-batches in `schedule`, the global batch kept.
    pub(crate) fn pipelined(mut plan: Plan, stages: u32, schedule: &str, chunks: u32) -> Plan {
        plan.config.grad_accumulation = 1;
        plan.decisions.retain(|d| d.pass != "grad-accumulation");
        plan.config.pipeline = Some(crate::plan::PipelineConfig {
            stages,
            microbatches: 4,
            schedule: schedule.into(),
            chunks_per_rank: chunks,
            layers: 4,
            first_stage_layers: None,
            last_stage_layers: None,
            global_batch: true,
        });
        plan
    }

    /// A tiny plan: 4 layers `net.{0..3}` with weight+bias each (tensors in gradient-ready order
    /// `net.3.*` first), grouped [[net.3.weight, net.3.bias], [net.2.weight], [net.2.bias,
    /// net.1.weight, net.1.bias], [net.0.weight], [net.0.bias]]; bytes: weights 4 MiB, biases
    /// 1 KiB; group [net.0.weight] partitioned in 4; AMP fp16 with fp16 all-reduce; k = 2;
    /// two fusion clusters (one duplicated by accumulation).
    pub(crate) fn tiny_plan() -> Plan {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
        let groups = vec![
            s(&["net.3.weight", "net.3.bias"]),
            s(&["net.2.weight"]),
            s(&["net.2.bias", "net.1.weight", "net.1.bias"]),
            s(&["net.0.weight"]),
            s(&["net.0.bias"]),
        ];
        let mut tensor_bytes = BTreeMap::new();
        for l in 0..4 {
            tensor_bytes.insert(format!("net.{l}.weight"), 4 << 20);
            tensor_bytes.insert(format!("net.{l}.bias"), 1024);
        }
        Plan {
            trainplan: SCHEMA_VERSION,
            workload: Workload {
                source: "zoo".into(),
                ranks: 8,
                model: "tiny".into(),
                batch: Some(4),
                cluster: "8xh200".into(),
                names: "zoo".into(),
                framework: Default::default(),
            },
            predicted: Predicted {
                baseline_precision: String::new(),
                half_baseline: None,
                tokens_per_s_per_gpu: None,
                mfu: None,
                baseline_name: "ddp_default".into(),
                baseline: Point {
                    iteration_ms: 10.0,
                    peak_memory_bytes: Some(1 << 30),
                    reserved_peak_bytes: None,
                    device_used_bytes: None,
                },
                planned: Point {
                    iteration_ms: 8.0,
                    peak_memory_bytes: Some(1 << 29),
                    reserved_peak_bytes: None,
                    device_used_bytes: None,
                },
                speedup: 1.25,
                lower_bound_ms: Some(7.0),
                gpu_memory_bytes: None,
                memory_budget_bytes: None,
            },
            baselines: BTreeMap::from([("none".to_string(), 10.0)]),
            decisions: vec![
                decision(
                    "baseline:horovod_autotune",
                    &[],
                    "start from the fastest framework default: horovod_autotune (fusion threshold 64 MiB, cycle 2.5 ms: 3 collectives in 2 cycles, 0.10 ms of cycle waits)",
                ),
                decision("grad-accumulation", &[("k", "2")], "memory step"),
                decision("amp", &[("fp16_allreduce", "1")], "fp16"),
            ],
            advice: Vec::new(),
            config: FinalConfig {
                dtype: "fp16".into(),
                tensor_groups: groups,
                partitions: BTreeMap::from([("net.0.weight".to_string(), 4)]),
                tensor_bytes,
                fused_ops: vec![
                    s(&["net.1 FW", "net.1 FW", "act.1 FW"]),
                    s(&["net.3 BW", "act.3 BW"]),
                    s(&["net.1 FW", "act.1 FW"]),
                ],
                passes: s(&["amp", "blueconnect", "fused-adam"]),
                grad_accumulation: 2,
                recompute: Vec::new(),
                sharding: None,
                tensor_parallel: None,
                context_parallel: None,
                pipeline: None,
            },
            search: SearchStats {
                strategy: Strategy::CriticalPath,
                budget_s: 60.0,
                replays: 10,
                rounds: 2,
                stop: StopReason::Converged,
                seed: 0,
            },
        }
    }

    /// Every Python file compiles (skipped, with a message, without python3); every env file is
    /// `KEY=value` lines.
    pub(crate) fn check_files(e: &Emitted) {
        for (name, text) in &e.files {
            if name.ends_with(".env") {
                check_env(text);
            }
            if name.ends_with(".py") {
                py_compile(name, text);
            }
        }
    }

    pub(crate) fn check_env(text: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for l in text.lines() {
            if l.trim().is_empty() || l.starts_with('#') {
                continue;
            }
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {l}"));
            assert!(
                !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
                "bad key: {l}"
            );
            assert!(
                !v.starts_with(' ') && !k.ends_with(' '),
                "space around =: {l}"
            );
            out.insert(
                k.to_string(),
                shell_word(v).unwrap_or_else(|| panic!("{l}")),
            );
        }
        out
    }

    /// The value of one shell word as `env_value` writes it: bare, or single-quoted with `'\''`
    /// for a quote. None for anything else.
    pub(crate) fn shell_word(w: &str) -> Option<String> {
        if !w.starts_with('\'') {
            return (!w.contains(['\'', '"', '\\', '$', '`', ' ', ';'])).then(|| w.to_string());
        }
        let inner = w.strip_prefix('\'')?.strip_suffix('\'')?;
        let parts: Vec<&str> = inner.split("'\\''").collect();
        parts
            .iter()
            .all(|p| !p.contains('\''))
            .then(|| parts.join("'"))
    }

    pub(crate) fn py_compile(name: &str, text: &str) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "trainplan-emit-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        match std::process::Command::new("python3")
            .args(["-m", "py_compile"])
            .arg(&p)
            .output()
        {
            Err(_) => crate::skip_note!("python3 not found: skipping py_compile of {name}"),
            Ok(o) => assert!(
                o.status.success(),
                "{name} does not compile:\n{}\n{text}",
                String::from_utf8_lossy(&o.stderr)
            ),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    pub(crate) fn file<'a>(e: &'a Emitted, name: &str) -> &'a str {
        &e.files
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| {
                panic!(
                    "no {name} in {:?}",
                    e.files.iter().map(|f| &f.0).collect::<Vec<_>>()
                )
            })
            .1
    }

    /// Plan text (model, cluster, names) reaches comments and docstrings only through
    /// `one_line` / `py_doc`: a hostile model name cannot end a docstring or a comment line.
    #[test]
    fn plan_text_cannot_break_out_of_comments_or_docstrings() {
        let mut p = tiny_plan();
        p.workload.model = "m\"\"\"\nimport os; os.system('boom')\n\"\"\"\\".into();
        p.workload.cluster = "c\nEVIL=1".into();
        for fw in Framework::ALL {
            let e = emit(&p, fw).unwrap();
            check_files(&e);
            for (name, text) in &e.files {
                for line in text.lines() {
                    assert!(!line.starts_with("import os"), "{fw} {name}: {line}");
                    assert!(!line.starts_with("EVIL="), "{fw} {name}: {line}");
                }
            }
        }
    }

    #[test]
    fn framework_names_parse_and_unknown_lists_known() {
        assert_eq!("pytorch".parse::<Framework>().unwrap(), Framework::Pytorch);
        assert_eq!("Horovod".parse::<Framework>().unwrap(), Framework::Horovod);
        assert_eq!("tensorflow".parse::<Framework>().unwrap(), Framework::Xla);
        assert_eq!(
            "DeepSpeed".parse::<Framework>().unwrap(),
            Framework::Deepspeed
        );
        assert_eq!(
            "Megatron".parse::<Framework>().unwrap(),
            Framework::Megatron
        );
        let e = "megatron-lm".parse::<Framework>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown framework `megatron-lm` (known: horovod, xla, byteps, pytorch, jax, deepspeed, torchtitan, megatron)"
        );
    }

    #[test]
    fn facts_of_the_tiny_plan() {
        let f = Facts::of(&tiny_plan()).unwrap();
        // 4 MiB + 1 KiB; 4 MiB; 1 KiB + 4 MiB + 1 KiB; 4 MiB; 1 KiB.
        assert_eq!(
            f.group_bytes,
            Some(vec![4195328, 4194304, 4196352, 4194304, 1024])
        );
        assert_eq!(f.largest_group_bytes(), Some(4196352));
        assert_eq!(f.half.as_deref(), Some("fp16"));
        assert!(f.fp16_allreduce);
        assert_eq!(f.k, 2);
        assert_eq!(f.horovod_cycle_ms, Some(2.5));
        // Clusters 0 and 2 share `net.1 FW`: merged, duplicates gone, first-appearance order.
        assert_eq!(
            f.clusters,
            vec![
                vec!["net.1 FW".to_string(), "act.1 FW".into()],
                vec!["net.3 BW".to_string(), "act.3 BW".into()],
            ]
        );
        assert_eq!(
            forward_layers(&f.groups),
            vec!["net.0", "net.1", "net.2", "net.3"]
        );
    }

    #[test]
    fn inconsistent_plans_are_refused() {
        let mut p = tiny_plan();
        p.config.tensor_groups[1].push("net.3.bias".into());
        assert!(
            matches!(Facts::of(&p), Err(EmitError::Inconsistent(m)) if m.contains("net.3.bias"))
        );
        let mut p = tiny_plan();
        p.config.grad_accumulation = 0;
        assert!(Facts::of(&p).is_err());
        let mut p = tiny_plan();
        p.config.partitions.insert("net.1.bias".into(), 2);
        assert!(Facts::of(&p).is_err());
        // Missing bytes: not an error, the sizes are unknown.
        let mut p = tiny_plan();
        p.config.tensor_bytes.clear();
        assert_eq!(Facts::of(&p).unwrap().group_bytes, None);
    }

    #[test]
    fn recompute_without_tensor_groups_is_not_collapsed_past_unchosen_layers() {
        let mut p = tiny_plan();
        // A sharded plan: no gradient collectives of its own, every parameter's bytes known.
        p.config.tensor_groups.clear();
        p.config.partitions.clear();
        p.config.recompute = vec!["net.1".into(), "net.2".into()];
        assert_eq!(Facts::of(&p).unwrap().recompute, vec!["net.1", "net.2"]);
        p.config.recompute = (0..4).map(|l| format!("net.{l}")).collect();
        assert_eq!(Facts::of(&p).unwrap().recompute, vec!["net"]);
        // policy=full: the blocks, whatever their first layer.
        p.config.recompute = vec![
            "model.layers.0.self_attn".into(),
            "model.layers.0.residual_add_attn".into(),
            "model.layers.1.mlp.mul".into(),
        ];
        p.decisions
            .push(decision("recompute", &[("policy", "full")], "memory step"));
        assert_eq!(
            Facts::of(&p).unwrap().recompute,
            vec!["model.layers.0", "model.layers.1"]
        );
    }

    #[test]
    fn recompute_lists_the_planned_layers_collapsed_to_parents() {
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into(), "net.2".into()];
        assert_eq!(Facts::of(&p).unwrap().recompute, vec!["net.1", "net.2"]);
        p.config.recompute.clear();
        assert!(Facts::of(&p).unwrap().recompute.is_empty());
        // A parent all of whose layers are chosen stands for them.
        let all: Vec<String> = ["x.0.a", "x.0.b", "x.1.a", "y"].map(String::from).to_vec();
        let chosen = BTreeSet::from(["x.0.a", "x.0.b", "x.1.a"]);
        assert_eq!(collapse(&all, &chosen), vec!["x"]);
        let chosen = BTreeSet::from(["x.0.a", "x.0.b"]);
        assert_eq!(collapse(&all, &chosen), vec!["x.0"]);
    }

    #[test]
    fn every_framework_emits_compiling_python_and_parsing_env_for_a_zoo_plan() {
        let m = crate::zoo::model(
            "resnet50",
            &crate::zoo::ModelOptions {
                batch: Some(8),
                ..Default::default()
            },
        )
        .unwrap();
        let c = crate::cost::config::load_cluster("dpro-16xv100-rdma").unwrap();
        let job = crate::zoo::build::job(&m, &c, &Default::default()).unwrap();
        let mut p = tiny_plan();
        p.decisions.clear();
        p.config = FinalConfig::of(&job, &[]);
        // One collective per tensor (161 for ResNet-50), every tensor sized.
        assert_eq!(p.config.tensor_groups.len(), 161);
        assert_eq!(p.config.tensor_bytes.len(), 161);
        // fc.weight is 2048 × 1000 fp32 and the largest tensor in one group: layer4's 3×3 conv
        // weights, 512·512·9·4 B = 9,437,184 B.
        assert_eq!(p.config.tensor_bytes["fc.weight"], 8_192_000);
        let f = Facts::of(&p).unwrap();
        assert_eq!(f.largest_group_bytes(), Some(9_437_184));
        for fw in Framework::ALL {
            let e = emit(&p, fw).unwrap();
            assert!(!e.files.is_empty(), "{fw}");
            assert!(e.notes[0].contains("zoo"), "{fw}: {:?}", e.notes);
            check_files(&e);
        }
    }
}
