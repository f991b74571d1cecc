//! torchtitan: `torchtitan.toml`, a job config for torchtitan's `ConfigManager`
//! (`torchrun … -m torchtitan.train --job.config_file torchtitan.toml`). Written for
//! torchtitan 0.2.0, the release that runs on PyTorch 2.9 (0.2.1 and 0.2.2 import
//! `torch.nn.attention.varlen`, new in 2.10; 0.3 reads no TOML job files). Only the keys the
//! plan decides are written; every other setting keeps torchtitan's default.
//!
//! | plan | `torchtitan.toml` |
//! |---|---|
//! | no `sharding` | `parallelism.data_parallel_replicate_degree` = ranks, `data_parallel_shard_degree` = 1 (torchtitan's DDP) |
//! | `sharding` stage 3 | `data_parallel_shard_degree` = `shard_size`, `data_parallel_replicate_degree` = `replicas` (HSDP when both > 1: torchtitan's mesh is `(replicas, shard)`, shard groups of consecutive ranks as planned) |
//! | `sharding.reshard` | `fsdp_reshard_after_forward` = `"always"` / `"never"` |
//! | stage 1 or 2, `offload` | refused ([`EmitError::Unsupported`], naming the field): FSDP2 shards all three together; torchtitan's CPU offload moves parameters and gradients too, which the plan did not price |
//! | `prefetch`, `units` | — (FSDP2's implicit prefetch of one; torchtitan wraps its own model's blocks): notes |
//! | `grad_accumulation` k | `training.local_batch_size` = batch ÷ k, `global_batch_size` = batch × ranks: torchtitan runs global ÷ (local × data-parallel degree) = k micro-batches per step and divides the loss by k |
//! | `dtype` bf16 (AMP) | `training.mixed_precision_param = "bfloat16"` (FSDP2's `MixedPrecisionPolicy`, or `torch.autocast` under DDP), `mixed_precision_reduce = "float32"`, `training.dtype = "float32"` (master weights) |
//! | `dtype` fp16 (AMP) | — `mixed_precision_param` takes bfloat16 or float32 only and torchtitan has no loss scaler: `"float32"` is written, and a note says so |
//! | `dtype` fp8, fp64 | refused (`training.dtype` is bfloat16 or float32; fp8 is a torchao model converter) |
//! | `fused-adam` | `optimizer.implementation = "fused"`; without it `"foreach"` (what the plan priced; torchtitan's own default is `"fused"`) |
//! | `recompute` with `policy=full` over every layer | `activation_checkpoint.mode = "full"`: torchtitan checkpoints each transformer block, as the pass plans it |
//! | `recompute` of chosen layers | — `activation_checkpoint.mode = "none"`: torchtitan checkpoints whole blocks by its own policy (every block, or every n-th), not the planned layers; a note lists them |
//! | `fused_ops` | — `compile.enable = false`: torchtitan compiles every block or none |
//! | `tensor_parallel` degree t | `parallelism.tensor_parallel_degree` = t; the data-parallel degrees over ranks ÷ t; `local_batch_size` per tensor-parallel group. Refused ([`crate::search::framework::tp_supported`]): `sequence` false (torchtitan always shards the norms over the sequence), or more than one data-parallel rank without FSDP (torchtitan's DDP takes a 1-D mesh only) |
//! | `context_parallel` degree c | `parallelism.context_parallel_degree` = c; `data_parallel_shard_degree` = `shard_size` ÷ c (FSDP2 shards over dp_shard × cp); `local_batch_size` per group. Refused ([`crate::search::framework::cp_supported`]) without sharding stage 3: torchtitan always shards with context parallelism |
//! | `pipeline` stages p | `parallelism.pipeline_parallel_degree` = p; the data-parallel degrees over ranks ÷ (t × c × p); `local_batch_size` = the pipeline replica's batch, `pipeline_parallel_microbatch_size` = it ÷ the micro-batches (torchtitan runs local ÷ micro-batch size micro-batches and no accumulation) |
//! | `pipeline` schedule | `pipeline_parallel_schedule` = `"1F1B"`, `"Interleaved1F1B"` (v chunks per rank: `stages × v` model parts, part `c` on pipeline rank `c mod p`, torchtitan's "loop" placement as planned), `"GPipe"` |
//! | `pipeline` layers per stage | `module_fqns_per_model_part`: torchtitan's llama3 module names (`tok_embeddings` with the first part, `norm` and `output` with the last) cut as the plan cuts its blocks ([`crate::graph::pipeline::split`]) |
//! | `pipeline` beside `sharding` | stage 3 with `reshard` false only (`fsdp_reshard_after_forward = "never"`, what torchtitan's `"default"` picks with a pipeline: FSDP2 gathers once per step, torch.distributed.pipelining syncs gradients on the last micro-batch), or no data parallelism; refused otherwise ([`crate::search::framework::pipeline_beside`]) |
//! | model | `[model]` `name` / `flavor` = `"set-me"`: the plan's model (a zoo stand-in, or a traced model) is not one of torchtitan's registered models; torchtitan refuses the placeholder until the user sets it |
//!
//! Plan text reaches the file only as a TOML string through [`toml_str`] (`job.description`)
//! or in a `#` comment through [`comment_text`].

use super::{EmitError, Emitted, Facts, comment_text, header, toml_str, unmapped_passes};
use crate::plan::{Plan, ShardConfig};

/// A TOML value of the file.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Int(u64),
    Bool(bool),
    Str(String),
    /// An array of arrays of strings (`module_fqns_per_model_part`).
    Parts(Vec<Vec<String>>),
}

impl Value {
    fn render(&self) -> String {
        match self {
            Value::Int(v) => v.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Str(s) => toml_str(s),
            Value::Parts(parts) => {
                let inner: Vec<String> = parts
                    .iter()
                    .map(|p| {
                        let names: Vec<String> = p.iter().map(|n| toml_str(n)).collect();
                        format!("[{}]", names.join(", "))
                    })
                    .collect();
                format!("[\n    {},\n]", inner.join(",\n    "))
            }
        }
    }
}

fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}

/// One `[name]` table: `#` comment lines (plan text already through [`comment_text`]), then
/// its keys. Keys are the emitter's own.
struct Section {
    name: &'static str,
    comments: Vec<String>,
    entries: Vec<(&'static str, Value)>,
}

impl Section {
    fn render(&self) -> String {
        let mut out = format!("\n[{}]\n", self.name);
        for c in &self.comments {
            out.push_str(&format!("# {c}\n"));
        }
        for (k, v) in &self.entries {
            out.push_str(&format!("{k} = {}\n", v.render()));
        }
        out
    }
}

/// The placeholder torchtitan refuses as a model name (`TrainSpec set-me is not registered`).
const SET_ME: &str = "set-me";

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let sharding = supported_sharding(plan)?;
    let tp = supported_tp(plan, sharding)?;
    let cp = supported_cp(plan, sharding)?;
    let pp = supported_pipeline(plan, sharding, tp, cp)?;
    let param_dtype = param_dtype(plan, f)?;
    let sections = [
        job(plan),
        model(plan),
        parallelism(plan, f, sharding, (tp, cp), pp.as_ref()),
        training(plan, f, param_dtype),
        optimizer(f),
        activation_checkpoint(plan),
        Section {
            name: "compile",
            comments: vec![
                "the plan's fused regions, if any, are not compiled (see the notes)".into(),
            ],
            entries: vec![("enable", Value::Bool(false))],
        },
    ];
    let mut text = header(plan, "torchtitan job config (torchtitan 0.2.0)");
    text.push_str(&format!(
        "# run: torchrun (nodes x processes = {} ranks) -m torchtitan.train --job.config_file torchtitan.toml\n# set [model] first; every key not written here keeps torchtitan's default\n",
        plan.workload.ranks
    ));
    for sec in &sections {
        text.push_str(&sec.render());
    }
    Ok(Emitted {
        files: vec![("torchtitan.toml".into(), text)],
        notes: notes(plan, f, sharding),
    })
}

/// The plan's sharding, when torchtitan can apply it ([`crate::search::framework::shard_supported`]),
/// else the field it cannot.
fn supported_sharding(plan: &Plan) -> Result<Option<&ShardConfig>, EmitError> {
    let Some(sh) = &plan.config.sharding else {
        return Ok(None);
    };
    let fw = crate::cost::framework::Framework::Torchtitan;
    if let Err(why) =
        crate::search::framework::shard_supported(fw, sh.stage, sh.replicas, sh.reshard)
    {
        return Err(EmitError::Unsupported {
            field: "config.sharding.stage".into(),
            why: format!("stage {} cannot be exported to torchtitan: {why}", sh.stage),
        });
    }
    if sh.offload {
        return Err(EmitError::Unsupported {
            field: "config.sharding.offload".into(),
            why: "torchtitan's training.enable_cpu_offload moves parameters and gradients to the CPU as well as the optimizer state (FSDP2's CPUOffloadPolicy), which the plan did not price".into(),
        });
    }
    Ok(Some(sh))
}

/// Whether the plan checkpoints every block whole: a `recompute` decision with
/// `policy=full` over every layer (torchtitan's `mode = "full"` wraps each block).
pub(super) fn full_checkpointing(plan: &Plan) -> bool {
    whole_model_policy(plan, "full")
}

/// Whether the plan recomputes with `policy` over every layer (a `recompute` decision with
/// that policy and no layer glob).
pub(super) fn whole_model_policy(plan: &Plan, policy: &str) -> bool {
    !plan.config.recompute.is_empty()
        && plan.decisions.iter().any(|d| {
            d.pass == "recompute"
                && d.knobs.get("policy").map(|v| v.trim()) == Some(policy)
                && d.knobs
                    .get("layers")
                    .is_none_or(|v| matches!(v.trim(), "all" | "auto" | "sqrt"))
        })
}

fn activation_checkpoint(plan: &Plan) -> Section {
    let (comment, mode) = if plan.config.recompute.is_empty() {
        (
            "the plan recomputes nothing (torchtitan's default is selective checkpointing)",
            "none",
        )
    } else if full_checkpointing(plan) {
        (
            "every transformer block checkpointed, as planned (recompute:policy=full)",
            "full",
        )
    } else {
        (
            "the plan's recomputed layers cannot be named here: checkpointing is left off (see the notes)",
            "none",
        )
    };
    Section {
        name: "activation_checkpoint",
        comments: vec![comment.into()],
        entries: vec![("mode", s(mode))],
    }
}

/// The plan's tensor-parallel degree (1 without), when torchtitan can apply it
/// ([`crate::search::framework::tp_supported`]), else the field it cannot.
fn supported_tp(plan: &Plan, sharding: Option<&ShardConfig>) -> Result<u32, EmitError> {
    let Some(tp) = &plan.config.tensor_parallel else {
        return Ok(1);
    };
    let dp = plan.workload.ranks / tp.degree.max(1);
    let fsdp = sharding.is_some_and(|sh| sh.stage == 3);
    crate::search::framework::tp_supported(
        crate::cost::framework::Framework::Torchtitan,
        tp.sequence,
        dp,
        fsdp,
    )
    .map_err(|why| EmitError::Unsupported {
        field: if tp.sequence {
            "config.tensor_parallel.degree".into()
        } else {
            "config.tensor_parallel.sequence".into()
        },
        why: why.into(),
    })?;
    Ok(tp.degree)
}

/// The plan's context-parallel degree (1 without), when torchtitan can apply it: with FSDP2
/// (torchtitan 0.2.0 shards the parameters over the data- and context-parallel ranks whenever
/// context parallelism is on, `ParallelDims.fsdp_enabled`, so a plan that keeps them whole is
/// not what it would run).
fn supported_cp(plan: &Plan, sharding: Option<&ShardConfig>) -> Result<u32, EmitError> {
    let cp = crate::plan::cp_degree(&plan.config);
    if cp == 1 {
        return Ok(1);
    }
    let fsdp = sharding.is_some_and(|sh| sh.stage == 3);
    crate::search::framework::cp_supported(crate::cost::framework::Framework::Torchtitan, fsdp)
        .map_err(|why| EmitError::Unsupported {
            field: "config.context_parallel".into(),
            why: format!("degree {cp}: {why}"),
        })?;
    Ok(cp)
}

/// The plan's pipeline as torchtitan runs it: its degree, schedule name and model parts.
struct Pipe {
    stages: u32,
    schedule: &'static str,
    parts: Vec<Vec<String>>,
}

/// The plan's pipeline, when torchtitan can run it: a schedule torch.distributed.pipelining
/// has ([`crate::search::framework::pipeline_supported`]), beside FSDP2 without resharding or
/// no data parallelism ([`crate::search::framework::pipeline_beside`]); else the field it
/// cannot.
fn supported_pipeline(
    plan: &Plan,
    sharding: Option<&ShardConfig>,
    tp: u32,
    cp: u32,
) -> Result<Option<Pipe>, EmitError> {
    use crate::cost::framework::Framework::Torchtitan;
    let Some(p) = &plan.config.pipeline else {
        return Ok(None);
    };
    crate::search::framework::pipeline_supported(Torchtitan, &p.schedule).map_err(|why| {
        EmitError::Unsupported {
            field: "config.pipeline.schedule".into(),
            why: format!("{}: {why}", comment_text(&p.schedule)),
        }
    })?;
    let dp = plan.workload.ranks / (tp * cp * p.stages).max(1);
    if dp > 1 || sharding.is_some() {
        crate::search::framework::pipeline_beside(
            Some(Torchtitan),
            sharding.map(|sh| sh.stage),
            sharding.is_some_and(|sh| sh.reshard),
        )
        .map_err(|why| EmitError::Unsupported {
            field: "config.sharding".into(),
            why: format!("beside a pipeline of {} stages: {why}", p.stages),
        })?;
    }
    let parts = super::pipeline_parts(p, &["tok_embeddings"], "layers.", &["norm", "output"])?;
    Ok(Some(Pipe {
        stages: p.stages,
        schedule: match p.schedule.as_str() {
            "interleaved" => "Interleaved1F1B",
            "gpipe" => "GPipe",
            _ => "1F1B",
        },
        parts,
    }))
}

/// `training.mixed_precision_param` for the plan's dtype: bf16 AMP → bfloat16; fp32, and fp16
/// AMP, which torchtitan cannot run (a note says so) → float32.
fn param_dtype(plan: &Plan, f: &Facts) -> Result<&'static str, EmitError> {
    match (f.half.as_deref(), plan.config.dtype.as_str()) {
        (Some("bf16"), _) => Ok("bfloat16"),
        (Some(_), _) | (None, "fp32") => Ok("float32"),
        (None, other) => Err(EmitError::Unsupported {
            field: "config.dtype".into(),
            why: format!(
                "{other} cannot be exported to torchtitan: its training.dtype and mixed_precision_param are bfloat16 or float32 (float8 is a torchao model converter the export does not set)"
            ),
        }),
    }
}

fn job(plan: &Plan) -> Section {
    let w = &plan.workload;
    Section {
        name: "job",
        comments: Vec::new(),
        entries: vec![(
            "description",
            Value::Str(format!(
                "trainplan plan: {} on {} ({} ranks)",
                w.model, w.cluster, w.ranks
            )),
        )],
    }
}

fn model(plan: &Plan) -> Section {
    let w = &plan.workload;
    let what = if w.names == "zoo" {
        "trainplan's zoo stand-in"
    } else {
        "a traced model"
    };
    Section {
        name: "model",
        comments: vec![
            format!(
                "the plan's model ({}) is {what}, not one of torchtitan's registered models: set",
                comment_text(&w.model)
            ),
            "name and flavor (e.g. \"llama3\" / \"8B\") and hf_assets_path here or on the command line".into(),
            "(--model.name, --model.flavor); torchtitan refuses the placeholder".into(),
        ],
        entries: vec![("name", s(SET_ME)), ("flavor", s(SET_ME))],
    }
}

fn parallelism(
    plan: &Plan,
    f: &Facts,
    sharding: Option<&ShardConfig>,
    (tp, cp): (u32, u32),
    pp: Option<&Pipe>,
) -> Section {
    let ranks = u64::from(plan.workload.ranks);
    let stages = pp.map_or(1, |p| p.stages.max(1));
    // The data-parallel ranks: every rank, or one per tensor-, context-parallel and pipeline
    // group.
    let dp = ranks / u64::from(tp.max(1)) / u64::from(cp.max(1)) / u64::from(stages);
    let mut entries = Vec::new();
    let mut comments = Vec::new();
    let comment = match sharding {
        None if dp == 1 => {
            entries.push(("data_parallel_replicate_degree", Value::Int(1)));
            entries.push(("data_parallel_shard_degree", Value::Int(1)));
            "no data parallelism: one tensor-parallel group".to_string()
        }
        None => {
            entries.push(("data_parallel_replicate_degree", Value::Int(dp)));
            entries.push(("data_parallel_shard_degree", Value::Int(1)));
            format!("no sharding: DDP over the {dp} ranks")
        }
        Some(sh) => {
            entries.push((
                "data_parallel_replicate_degree",
                Value::Int(sh.replicas.into()),
            ));
            // The plan's shard group holds the context-parallel ranks too; torchtitan's
            // `dp_shard` is the rest of it (FSDP2 shards over dp_shard x cp).
            entries.push((
                "data_parallel_shard_degree",
                Value::Int((sh.shard_size / cp.max(1)).into()),
            ));
            entries.push((
                "fsdp_reshard_after_forward",
                s(if sh.reshard { "always" } else { "never" }),
            ));
            if sh.replicas > 1 {
                format!(
                    "HSDP: FSDP2 (stage 3) inside shard groups of {} ranks, {} replicas",
                    sh.shard_size, sh.replicas
                )
            } else {
                format!("FSDP2 (stage 3) over the {dp} data-parallel ranks")
            }
        }
    };
    comments.push(comment);
    if tp > 1 {
        comments.push(format!(
            "tensor parallelism over groups of {tp} consecutive ranks (torchtitan's mesh puts tp innermost), with sequence-parallel norms and a vocabulary-parallel loss; training.seq_len must be a multiple of {tp}"
        ));
    }
    if cp > 1 {
        comments.push(format!(
            "context parallelism over groups of {cp} ranks (next to the tensor-parallel ones in torchtitan's mesh): each holds 1/{cp} of every sequence, attention as a ring; FSDP2 shards over the data- and context-parallel ranks together; training.seq_len must be a multiple of {}",
            2 * cp * tp.max(1)
        ));
    }
    entries.extend([
        ("tensor_parallel_degree", Value::Int(tp.into())),
        ("pipeline_parallel_degree", Value::Int(stages.into())),
        ("context_parallel_degree", Value::Int(cp.into())),
    ]);
    if let Some(p) = pp {
        let micro = plan.config.pipeline.as_ref().map_or(1, |c| c.microbatches);
        comments.push(format!(
            "pipeline of {} stages (the outermost mesh dimension), {} schedule, {} model part(s) of torchtitan's llama3 modules cut as planned, part c on pipeline rank c mod {}; {micro} micro-batches per step; FSDP2 keeps each stage's parameters gathered for the step beside it",
            p.stages,
            p.schedule,
            p.parts.len(),
            p.stages
        ));
        entries.push(("pipeline_parallel_schedule", s(p.schedule)));
        if let Some(mb) = f.micro_batch {
            entries.push(("pipeline_parallel_microbatch_size", Value::Int(mb.into())));
        }
        entries.push(("module_fqns_per_model_part", Value::Parts(p.parts.clone())));
    }
    Section {
        name: "parallelism",
        comments,
        entries,
    }
}

fn training(plan: &Plan, f: &Facts, param_dtype: &'static str) -> Section {
    let tp = plan.config.tensor_parallel.as_ref();
    let cp = crate::plan::cp_degree(&plan.config);
    let pp = plan.config.pipeline.as_ref();
    // torchtitan's batch sizes are per data-parallel rank: a tensor-, context-parallel and
    // pipeline group's.
    let dp = u64::from(
        plan.workload.ranks
            / tp.map_or(1, |t| t.degree.max(1))
            / cp
            / pp.map_or(1, |p| p.stages.max(1)),
    );
    let mut comments = Vec::new();
    let mut entries = Vec::new();
    match (plan.workload.batch(), f.micro_batch) {
        (Some(batch), Some(micro)) => {
            let replica = crate::plan::replica_batch(&plan.config, batch);
            comments.push(match tp {
                _ if pp.is_some() => format!(
                    "batch {batch} per GPU: each pipeline replica ({} ranks) trains {replica} per step as {} micro-batches of {micro} (pipeline_parallel_microbatch_size), no accumulation",
                    plan.workload.ranks / dp.max(1) as u32,
                    f.k
                ),
                _ if cp > 1 => format!(
                    "batch {batch} per GPU: each group of {} ranks (tensor x context parallel) trains {replica}, in {} micro-batch(es) of {micro}; torchtitan runs global / (local x {dp} data-parallel ranks) = {} per step",
                    tp.map_or(1, |t| t.degree.max(1)) * cp, f.k, f.k
                ),
                Some(t) => format!(
                    "batch {batch} per GPU: each tensor-parallel group of {} trains {replica}, in {} micro-batch(es) of {micro}; torchtitan runs global / (local x {dp} data-parallel ranks) = {} per step",
                    t.degree, f.k, f.k
                ),
                None => format!(
                    "batch {batch} per GPU in {} micro-batch(es) of {micro}: torchtitan runs global / (local x {dp} data-parallel ranks) = {} per step",
                    f.k, f.k
                ),
            });
            // With a pipeline torchtitan splits its local batch into the micro-batches.
            let local = if pp.is_some() { replica } else { micro };
            entries.push(("local_batch_size", Value::Int(local.into())));
            entries.push((
                "global_batch_size",
                Value::Int(u64::from(replica) * dp),
            ));
        }
        _ => comments.push(format!(
            "the plan does not record the per-GPU batch: set local_batch_size = batch / {} and global_batch_size = batch x {dp}",
            f.k
        )),
    }
    comments.push(match f.half.as_deref() {
        Some("bf16") => "AMP in bf16: bf16 compute, fp32 master weights and gradient reduction".into(),
        Some(h) => format!("the plan's AMP in {h} is not applied: torchtitan runs bfloat16 or float32 only (see the notes)"),
        None => "fp32: mixed_precision_param must be float32 (torchtitan's default is bfloat16)".into(),
    });
    entries.extend([
        ("dtype", s("float32")),
        ("mixed_precision_param", s(param_dtype)),
        ("mixed_precision_reduce", s("float32")),
    ]);
    Section {
        name: "training",
        comments,
        entries,
    }
}

fn optimizer(f: &Facts) -> Section {
    let fused = f.passes.iter().any(|p| p == "fused-adam");
    Section {
        name: "optimizer",
        comments: vec![if fused {
            "fused Adam, as planned".into()
        } else {
            "the plan prices the unfused (foreach) update; torchtitan's own default is fused".into()
        }],
        entries: vec![("implementation", s(if fused { "fused" } else { "foreach" }))],
    }
}

/// What the user must do, and what the file does not apply.
fn notes(plan: &Plan, f: &Facts, sharding: Option<&ShardConfig>) -> Vec<String> {
    let w = &plan.workload;
    let mut notes = vec![format!(
        "set [model] name and flavor to the model torchtitan trains (the plan's {} is not a torchtitan model; the placeholder \"{SET_ME}\" is refused), then launch {} ranks in all with --job.config_file torchtitan.toml: the degrees multiply to {}, and torchtitan refuses another world size",
        comment_text(&w.model),
        w.ranks,
        w.ranks
    )];
    if w.framework != crate::cost::framework::Framework::Torchtitan {
        notes.push(format!(
            "the plan was made for --framework {}: torchtitan applies only its sharding, AMP (bf16), fused Adam and accumulation, so the predicted time assumes moves this file does not make (plan with --framework torchtitan)",
            w.framework
        ));
    }
    if let Some(sh) = sharding {
        notes.push(format!(
            "FSDP2 wrap units: torchtitan wraps its own model's token embedding, each transformer block, the final norm with the output, then the root (the plan's {} units, root last, are its estimate of the same per-block policy)",
            sh.units.len()
        ));
        if f.k > 1 && super::holds_sharded_gradients(plan) {
            notes.push(format!(
                "accumulation over FSDP2: the plan prices {} micro-batches with gradients held unsharded and reduce-scattered once (grad-accumulation sync=last: FSDP2's set_requires_gradient_sync(False), as the pytorch export runs it); torchtitan 0.2.0 reduce-scatters after every micro-batch, so the run holds 1/{} of those gradients and communicates {} times: less memory, more communication than predicted (plan with --framework torchtitan)",
                f.k, sh.shard_size, f.k
            ));
        }
        if sh.prefetch != 1 {
            notes.push(format!(
                "the plan's prefetch of {} unit(s) is not applied: torchtitan has no prefetch setting and keeps FSDP2's implicit prefetch of one",
                sh.prefetch
            ));
        }
    }
    if let Some(p) = &plan.config.pipeline {
        notes.push(format!(
            "pipeline: module_fqns_per_model_part names torchtitan's llama3 modules (tok_embeddings, layers.0 .. layers.{}, norm, output) cut as the plan cuts its {} blocks; for another torchtitan model rename them, keeping the cut",
            p.layers.saturating_sub(1),
            p.layers
        ));
        if sharding.is_some() {
            notes.push("pipeline beside FSDP2: torch.distributed.pipelining reduce-scatters each stage's gradients once its last micro-batch's backward is done, all of them after it; the plan starts each block's as its last backward ends, and prices the parameters' gather at the end of the step where torchtitan gathers them under the next step's first forward (the two differ from the run in opposite directions, by at most one stage's collectives)".into());
        }
    }
    if f.half.as_deref() == Some("fp16") {
        notes.push("the plan's AMP in fp16 is not applied: torchtitan's mixed_precision_param is bfloat16 or float32 and it has no loss scaler, so the file runs in float32 and the predicted time counts a speed-up it will not get (plan with --precision bf16 on a GPU with bf16)".into());
    }
    if f.fp16_allreduce {
        notes.push("the plan's fp16 gradient all-reduce is not applied: torchtitan reduces in float32 (mixed_precision_reduce)".into());
    }
    if !plan.config.recompute.is_empty() && !full_checkpointing(plan) {
        notes.push(format!(
            "the plan recomputes {} module(s) (e.g. {}); torchtitan checkpoints whole blocks by its own policy (activation_checkpoint.mode full, or selective every n-th block), not chosen layers, so the file leaves checkpointing off and the run keeps those activations",
            f.recompute.len(),
            comment_text(f.recompute.first().map_or("", String::as_str))
        ));
    }
    if !f.clusters.is_empty() {
        notes.push(format!(
            "the plan's {} fused region(s) are not compiled: torchtitan compiles every block or none (compile.enable), left off",
            f.clusters.len()
        ));
    }
    if sharding.is_none() && (f.fuses_tensors() || !plan.config.partitions.is_empty()) {
        notes.push("the plan's gradient groups and partitions are not applied: torchtitan's DDP fills its buckets by its own size".into());
    }
    notes.extend(unmapped_passes(
        f,
        &["amp", "fused-adam", "shard"],
        "torchtitan",
    ));
    notes
}

#[cfg(test)]
mod tests {
    use super::super::tests::{file, tiny_plan};
    use super::super::{Framework, emit as emit_plan};
    use super::*;

    /// The tiny plan (8 ranks, batch 4, k = 2, fp16 AMP, fused Adam) with `sharding`.
    fn sharded(replicas: u32, reshard: bool) -> Plan {
        let mut p = tiny_plan();
        p.config.sharding = Some(ShardConfig {
            stage: 3,
            shard_size: 8 / replicas,
            replicas,
            reshard,
            prefetch: 1,
            offload: false,
            units: vec!["net.0".into(), "net.1".into(), String::new()],
            unit_bytes: vec![1 << 22, 1 << 22, 1 << 11],
        });
        p
    }

    /// The exported file, read back by the `toml` crate, and the notes.
    fn check(p: &Plan) -> (toml::Table, Vec<String>) {
        let e = emit_plan(p, Framework::Torchtitan).unwrap();
        let text = file(&e, "torchtitan.toml");
        assert!(
            text.chars()
                .all(|c| c == '\n' || (' '..='~').contains(&c) || c == '→'),
            "{text}"
        );
        let t: toml::Table = text.parse().unwrap_or_else(|err| panic!("{err}\n{text}"));
        (t, e.notes)
    }

    fn int(t: &toml::Table, sec: &str, key: &str) -> Option<i64> {
        t[sec].get(key).and_then(|v| v.as_integer())
    }

    fn str_of<'a>(t: &'a toml::Table, sec: &str, key: &str) -> Option<&'a str> {
        t[sec].get(key).and_then(|v| v.as_str())
    }

    /// The sharded plan (8 ranks, batch 4 per GPU, FSDP2 without resharding) pipelined over
    /// `stages` x `chunks` parts of its 4 layers in 4 micro-batches, no accumulation.
    fn pipelined(schedule: &str, stages: u32, chunks: u32) -> Plan {
        let mut p = sharded(1, false);
        // A stage's data-parallel ranks: 8 / stages.
        p.config.sharding.as_mut().unwrap().shard_size = 8 / stages;
        super::super::tests::pipelined(p, stages, schedule, chunks)
    }

    fn parts(t: &toml::Table) -> Vec<Vec<String>> {
        t["parallelism"]["module_fqns_per_model_part"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p.as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_pipeline_sets_the_degree_schedule_parts_and_micro_batches() {
        let (t, notes) = check(&pipelined("1f1b", 2, 1));
        let par = |k: &str| int(&t, "parallelism", k);
        assert_eq!(par("pipeline_parallel_degree"), Some(2));
        // Each stage shards over its 4 data-parallel ranks.
        assert_eq!(par("data_parallel_shard_degree"), Some(4));
        assert_eq!(par("data_parallel_replicate_degree"), Some(1));
        assert_eq!(
            str_of(&t, "parallelism", "pipeline_parallel_schedule"),
            Some("1F1B")
        );
        assert_eq!(
            str_of(&t, "parallelism", "fsdp_reshard_after_forward"),
            Some("never")
        );
        // A replica of 2 stages trains 2 x 4 = 8 samples in 4 micro-batches of 2; 4
        // replicas: the global 32 kept.
        assert_eq!(par("pipeline_parallel_microbatch_size"), Some(2));
        assert_eq!(int(&t, "training", "local_batch_size"), Some(8));
        assert_eq!(int(&t, "training", "global_batch_size"), Some(32));
        assert_eq!(
            parts(&t),
            vec![
                vec!["tok_embeddings", "layers.0", "layers.1"],
                vec!["layers.2", "layers.3", "norm", "output"],
            ]
        );
        assert!(
            notes.iter().any(|n| n.contains("llama3 modules")),
            "{notes:?}"
        );
        // Interleaved: 2 stages x 2 chunks, a layer each, the ends holding the embedding and
        // the head; GPipe by its name.
        let (t, _) = check(&pipelined("interleaved", 2, 2));
        assert_eq!(
            str_of(&t, "parallelism", "pipeline_parallel_schedule"),
            Some("Interleaved1F1B")
        );
        assert_eq!(
            parts(&t),
            vec![
                vec!["tok_embeddings", "layers.0"],
                vec!["layers.1"],
                vec!["layers.2"],
                vec!["layers.3", "norm", "output"],
            ]
        );
        let (t, _) = check(&pipelined("gpipe", 2, 1));
        assert_eq!(
            str_of(&t, "parallelism", "pipeline_parallel_schedule"),
            Some("GPipe")
        );
        // Resharding FSDP2 or DDP beside a pipeline: refused, naming the field.
        let mut r = pipelined("1f1b", 2, 1);
        r.config.sharding.as_mut().unwrap().reshard = true;
        let mut ddp = pipelined("1f1b", 2, 1);
        ddp.config.sharding = None;
        for q in [r, ddp] {
            let err = emit_plan(&q, Framework::Torchtitan)
                .unwrap_err()
                .to_string();
            assert!(err.contains("config.sharding"), "{err}");
            assert!(err.contains("reshard=0"), "{err}");
        }
    }

    #[test]
    fn tensor_parallelism_sets_the_degree_and_batches_per_group() {
        // 8 ranks, tensor parallelism of 2: FSDP2 over the 4 data-parallel ranks; each group
        // trains 2 x 4 samples in k = 2 micro-batches of 4.
        let mut p = sharded(1, true);
        p.config.sharding.as_mut().unwrap().shard_size = 4;
        p.config.tensor_parallel = Some(crate::plan::TensorParallelConfig {
            degree: 2,
            sequence: true,
            global_batch: true,
        });
        let (t, _) = check(&p);
        let par = |k: &str| int(&t, "parallelism", k);
        assert_eq!(par("tensor_parallel_degree"), Some(2));
        assert_eq!(par("data_parallel_shard_degree"), Some(4));
        assert_eq!(par("data_parallel_replicate_degree"), Some(1));
        assert_eq!(int(&t, "training", "local_batch_size"), Some(4));
        assert_eq!(int(&t, "training", "global_batch_size"), Some(32));
        // One group on every rank: no data parallelism, DDP not needed.
        let mut one = tiny_plan();
        one.config.tensor_parallel = Some(crate::plan::TensorParallelConfig {
            degree: 8,
            sequence: true,
            global_batch: true,
        });
        let (t, _) = check(&one);
        assert_eq!(int(&t, "parallelism", "tensor_parallel_degree"), Some(8));
        assert_eq!(
            int(&t, "parallelism", "data_parallel_replicate_degree"),
            Some(1)
        );
        assert_eq!(int(&t, "training", "local_batch_size"), Some(16));
        // Without FSDP over several data-parallel ranks, or without sequence parallelism:
        // refused, naming the field.
        let mut ddp = one.clone();
        ddp.config.tensor_parallel.as_mut().unwrap().degree = 2;
        for (q, field) in [
            (ddp, "config.tensor_parallel.degree"),
            (
                {
                    let mut q = p.clone();
                    q.config.tensor_parallel.as_mut().unwrap().sequence = false;
                    q
                },
                "config.tensor_parallel.sequence",
            ),
        ] {
            match emit_plan(&q, Framework::Torchtitan) {
                Err(EmitError::Unsupported { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Every other export refuses the plan.
        for fw in [Framework::Pytorch, Framework::Deepspeed, Framework::Jax] {
            match emit_plan(&p, fw) {
                Err(EmitError::Unsupported { field, .. }) => {
                    assert_eq!(field, "config.tensor_parallel")
                }
                other => panic!("{fw:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn unsharded_fp16_plan_is_ddp_in_float32_with_its_notes() {
        let (t, notes) = check(&tiny_plan());
        assert_eq!(
            int(&t, "parallelism", "data_parallel_replicate_degree"),
            Some(8)
        );
        assert_eq!(
            int(&t, "parallelism", "data_parallel_shard_degree"),
            Some(1)
        );
        assert_eq!(
            str_of(&t, "parallelism", "fsdp_reshard_after_forward"),
            None
        );
        for d in ["tensor", "pipeline", "context"] {
            assert_eq!(
                int(&t, "parallelism", &format!("{d}_parallel_degree")),
                Some(1)
            );
        }
        // Batch 4 per GPU, k = 2: 2 per micro-step, 4 x 8 ranks per step.
        assert_eq!(int(&t, "training", "local_batch_size"), Some(2));
        assert_eq!(int(&t, "training", "global_batch_size"), Some(32));
        assert_eq!(
            str_of(&t, "training", "mixed_precision_param"),
            Some("float32")
        );
        assert_eq!(
            str_of(&t, "training", "mixed_precision_reduce"),
            Some("float32")
        );
        assert_eq!(str_of(&t, "optimizer", "implementation"), Some("fused"));
        assert_eq!(str_of(&t, "activation_checkpoint", "mode"), Some("none"));
        assert_eq!(t["compile"]["enable"].as_bool(), Some(false));
        assert_eq!(str_of(&t, "model", "name"), Some(SET_ME));
        let has = |s: &str| notes.iter().any(|n| n.contains(s));
        assert!(has("AMP in fp16 is not applied"), "{notes:?}");
        assert!(has("fp16 gradient all-reduce is not applied"), "{notes:?}");
        assert!(has("fused region(s) are not compiled"), "{notes:?}");
        assert!(
            has("gradient groups and partitions are not applied"),
            "{notes:?}"
        );
        // blueconnect has no torchtitan setting; amp and fused-adam do.
        assert!(has("the plan also applies blueconnect —"), "{notes:?}");
        assert!(!has("recomputes"), "{notes:?}");
    }

    #[test]
    fn stage_3_sets_the_degrees_and_the_reshard_policy() {
        for (replicas, reshard, policy) in [
            (1, true, "always"),
            (1, false, "never"),
            (2, true, "always"),
        ] {
            let mut p = sharded(replicas, reshard);
            p.config.dtype = "bf16".into();
            let (t, notes) = check(&p);
            let par = |k| int(&t, "parallelism", k);
            assert_eq!(par("data_parallel_replicate_degree"), Some(replicas.into()));
            assert_eq!(
                par("data_parallel_shard_degree"),
                Some((8 / replicas).into())
            );
            assert_eq!(
                str_of(&t, "parallelism", "fsdp_reshard_after_forward"),
                Some(policy)
            );
            assert_eq!(
                str_of(&t, "training", "mixed_precision_param"),
                Some("bfloat16")
            );
            assert!(
                notes.iter().any(|n| n.contains("the plan's 3 units")),
                "{notes:?}"
            );
            assert!(
                !notes.iter().any(|n| n.contains("gradient groups")),
                "{notes:?}"
            );
        }
        let mut p = sharded(1, true);
        p.config.sharding.as_mut().unwrap().prefetch = 2;
        let (_, notes) = check(&p);
        assert!(
            notes
                .iter()
                .any(|n| n.contains("prefetch of 2 unit(s) is not applied"))
        );
    }

    #[test]
    fn what_torchtitan_cannot_apply_is_refused_naming_the_field() {
        for stage in [1, 2] {
            let mut p = sharded(1, true);
            p.config.sharding.as_mut().unwrap().stage = stage;
            match emit_plan(&p, Framework::Torchtitan) {
                Err(EmitError::Unsupported { field, why }) => {
                    assert_eq!(field, "config.sharding.stage");
                    assert!(why.contains("deepspeed"), "{why}");
                }
                other => panic!("stage {stage}: {other:?}"),
            }
        }
        let mut p = sharded(1, true);
        p.config.sharding.as_mut().unwrap().offload = true;
        let e = emit_plan(&p, Framework::Torchtitan)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config.sharding.offload cannot be exported for this framework: "),
            "{e}"
        );
        let mut p = tiny_plan();
        p.config.passes.retain(|x| x != "amp");
        p.config.dtype = "fp8".into();
        let e = emit_plan(&p, Framework::Torchtitan)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config.dtype cannot be exported for this framework: fp8"),
            "{e}"
        );
    }

    #[test]
    fn plan_text_reaches_the_toml_exactly_and_recompute_is_noted() {
        let mut p = tiny_plan();
        p.workload.model = "m\"\n[job]\ndescription = \"x\"\u{2028}é\\".into();
        p.workload.cluster = "c'''\r\0".into();
        // A trace that does not record its batch.
        p.workload.batch = None;
        p.workload.source = "trace".into();
        p.workload.names = "trace".into();
        p.config.recompute = vec!["net.1".into(), "net.2".into()];
        p.config.passes.retain(|x| x != "fused-adam");
        let (t, notes) = check(&p);
        let want = format!(
            "trainplan plan: {} on {} (8 ranks)",
            p.workload.model, p.workload.cluster
        );
        assert_eq!(str_of(&t, "job", "description"), Some(want.as_str()));
        assert_eq!(t["job"].as_table().unwrap().len(), 1);
        // No batch recorded: the batch keys are the user's, a comment says how.
        assert_eq!(int(&t, "training", "local_batch_size"), None);
        assert_eq!(str_of(&t, "optimizer", "implementation"), Some("foreach"));
        assert!(
            notes
                .iter()
                .any(|n| n.contains("recomputes 2 module(s) (e.g. net.1)")),
            "{notes:?}"
        );
    }
}
