//! PyTorch-native tensor, pipeline and data parallelism (issue 24): for a plan with
//! `config.tensor_parallel` or `config.pipeline`, `trainplan_patch.py` gets `apply_parallel(model,
//! loss_fn)`, which lays a Hugging Face Llama-style causal LM out on PyTorch's own APIs. The
//! user's model must have the zoo's Llama layout ([`crate::search::framework::native_layout`]).
//!
//! | plan | PyTorch |
//! |---|---|
//! | ranks | `init_device_mesh` over `("pp", "dp_replicate", "dp_shard", "tp")`: tensor parallelism innermost (one node's consecutive ranks), the pipeline outermost, as the plan places them |
//! | `tensor_parallel` degree, `sequence` | `parallelize_module` on each block: query, key, value, gate and up projections `ColwiseParallel`, the attention output and down projections `RowwiseParallel`, the embedding row- and the head column-parallel; with `sequence` the norms `SequenceParallel` and the row-parallel outputs reduce-scattered over the sequence (`output_layouts=Shard(1)`), the attention and MLP inputs gathered (`PrepareModuleInput`) |
//! | `pipeline` stages, `virtual` | the model parts of [`super::pipeline_parts`] (`model.embed_tokens` with the first, `model.norm` and `lm_head` with the last), part `s` on pipeline rank `s mod stages`, each a `torch.distributed.pipelining.PipelineStage` keeping the model's parameter names |
//! | `pipeline` schedule, micro-batches | `Schedule1F1B` / `ScheduleInterleaved1F1B` / `ScheduleGPipe` with `n_microbatches`; the schedule splits each replica's batch and scales the gradients by the micro-batches |
//! | `sharding` (stage 3) | `fully_shard` on each planned unit a part holds, then the part, over the `dp_shard` mesh (HSDP: `("dp_replicate", "dp_shard")`), with the planned `reshard_after_forward` (a pipeline: `False`) and `MixedPrecisionPolicy` |
//! | `grad_accumulation` k (no pipeline) | `step()` runs k micro-steps, FSDP2's gradient sync off (`set_requires_gradient_sync(False)`) but on the last |
//! | `recompute` | `torch.utils.checkpoint` on the planned modules, before the split |
//!
//! Refused, naming the field: a model without the Llama layout, tensor parallelism beside DDP
//! (data-parallel ranks not sharded), a pipeline beside sharding that re-gathers for the
//! backward, fp16 with a pipeline (its schedules call `backward` themselves: no loss scaling),
//! context parallelism (in [`super::emit`]). Op fusion (`torch.compile`) is not applied on this
//! path, and a note says so.
//!
//! Tested against real PyTorch (`tests/frameworks/torch_parallel.py`): a tiny Hugging Face
//! Llama trained on 8 gloo processes as tensor x pipeline x FSDP2, its gradients against one
//! process's on the whole global batch.

use super::{EmitError, Facts, py_list};
use crate::cost::framework::Framework;
use crate::plan::{Plan, ShardConfig};
use crate::search::framework::{native_layout, pipeline_beside, pipeline_supported, tp_supported};

/// A plan's layout as the PyTorch-native export applies it.
pub(super) struct Layout {
    tp: u32,
    sequence: bool,
    /// Data-parallel ranks (replicas × shard size when sharded; 1 unsharded).
    dp: u32,
    pipe: Option<Pipe>,
}

struct Pipe {
    stages: u32,
    /// The torch.distributed.pipelining schedule class.
    schedule: &'static str,
    microbatches: u32,
    /// Module paths per model part, in pipeline order.
    parts: Vec<Vec<String>>,
}

/// The plan's tensor/pipeline layout for the PyTorch-native export; None without either. Refuses
/// (naming the field) what the export cannot run as planned.
pub(super) fn layout(
    plan: &Plan,
    f: &Facts,
    sharding: Option<&ShardConfig>,
) -> Result<Option<Layout>, EmitError> {
    let c = &plan.config;
    if c.tensor_parallel.is_none() && c.pipeline.is_none() {
        return Ok(None);
    }
    let field = if c.tensor_parallel.is_some() {
        "config.tensor_parallel"
    } else {
        "config.pipeline"
    };
    let unsupported = |field: &str, why: String| EmitError::Unsupported {
        field: field.into(),
        why,
    };
    native_layout(
        Framework::Pytorch,
        c.tensor_bytes
            .keys()
            .chain(f.groups.iter().flatten())
            .map(String::as_str),
    )
    .map_err(|why| unsupported(field, why.into()))?;
    let (tp, sequence) = c
        .tensor_parallel
        .as_ref()
        .map_or((1, false), |t| (t.degree.max(1), t.sequence));
    let stages = c.pipeline.as_ref().map_or(1, |p| p.stages.max(1));
    let dp = plan.workload.ranks / (tp * stages).max(1);
    if tp > 1 {
        tp_supported(Framework::Pytorch, sequence, dp, sharding.is_some())
            .map_err(|why| unsupported("config.tensor_parallel", why.into()))?;
    }
    if let Some(sh) = sharding
        && sh.replicas.saturating_mul(sh.shard_size) != dp
    {
        return Err(EmitError::Inconsistent(format!(
            "config.sharding: {} replicas x {} ranks is not the {dp} data-parallel ranks of {} ranks over tensor parallelism of {tp} and {stages} pipeline stages",
            sh.replicas, sh.shard_size, plan.workload.ranks
        )));
    }
    let pipe = match &c.pipeline {
        None => None,
        Some(p) => {
            pipeline_supported(Framework::Pytorch, &p.schedule).map_err(|why| {
                unsupported(
                    "config.pipeline.schedule",
                    format!("{}: {why}", super::comment_text(&p.schedule)),
                )
            })?;
            if dp > 1 || sharding.is_some() {
                pipeline_beside(
                    Some(Framework::Pytorch),
                    sharding.map(|sh| sh.stage),
                    sharding.is_some_and(|sh| sh.reshard),
                )
                .map_err(|why| {
                    unsupported(
                        "config.sharding",
                        format!("beside a pipeline of {} stages: {why}", p.stages),
                    )
                })?;
            }
            if f.half.as_deref() == Some("fp16") {
                return Err(unsupported(
                    "config.dtype",
                    "fp16 needs loss scaling, and torch.distributed.pipelining's schedules call backward on the loss themselves: plan the pipeline in bf16".into(),
                ));
            }
            Some(Pipe {
                stages: p.stages,
                schedule: match p.schedule.as_str() {
                    "interleaved" => "ScheduleInterleaved1F1B",
                    "gpipe" => "ScheduleGPipe",
                    _ => "Schedule1F1B",
                },
                microbatches: p.microbatches,
                parts: super::pipeline_parts(
                    p,
                    &["model.embed_tokens"],
                    "model.layers.",
                    &["model.norm", "lm_head"],
                )?,
            })
        }
    };
    Ok(Some(Layout {
        tp,
        sequence,
        dp,
        pipe,
    }))
}

/// The module's layout constants (neutral values without a layout: `apply_parallel` refuses).
pub(super) fn constants(l: Option<&Layout>) -> String {
    let py_bool = |b: bool| if b { "True" } else { "False" };
    let whole = vec![vec![
        "model.embed_tokens".to_string(),
        "model.layers".to_string(),
        "model.norm".to_string(),
        "lm_head".to_string(),
    ]];
    let parts = l.and_then(|l| l.pipe.as_ref()).map_or(&whole, |p| &p.parts);
    let mut text = String::from("[");
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(&py_list(part, "    "));
    }
    text.push(']');
    format!(
        "# Tensor and pipeline parallelism (apply_parallel) when True.\n\
         PARALLEL = {}\n\
         # Ranks per tensor-parallel group (DTensor, the innermost mesh dimension) and sequence parallelism.\n\
         TENSOR_PARALLEL = {}\n\
         SEQUENCE_PARALLEL = {}\n\
         # Data-parallel ranks (FSDP2 over them when SHARDED).\n\
         DATA_PARALLEL = {}\n\
         # Pipeline stages (the outermost mesh dimension), the torch.distributed.pipelining schedule and its micro-batches.\n\
         PIPELINE_STAGES = {}\n\
         PIPELINE_SCHEDULE = {}\n\
         PIPELINE_MICROBATCHES = {}\n\
         # Model parts in pipeline order, as module paths (\"model.layers\": every block); part s runs on pipeline rank s % PIPELINE_STAGES.\n\
         PIPELINE_PARTS = {text}\n",
        py_bool(l.is_some()),
        l.map_or(1, |l| l.tp),
        py_bool(l.is_some_and(|l| l.sequence)),
        l.map_or(1, |l| l.dp),
        l.and_then(|l| l.pipe.as_ref()).map_or(1, |p| p.stages),
        super::py_str(l.and_then(|l| l.pipe.as_ref()).map_or("", |p| p.schedule)),
        l.and_then(|l| l.pipe.as_ref())
            .map_or(1, |p| p.microbatches),
    )
}

/// What the user must do to run the parallel layout.
pub(super) fn notes(
    l: &Layout,
    f: &Facts,
    sh: Option<&ShardConfig>,
    compiled: bool,
) -> Vec<String> {
    let mut out = vec![format!(
        "parallel layout: call par = apply_parallel(model, loss_fn) after torch.distributed.init_process_group on {} ranks (instead of apply_plan / apply_fsdp); it lays the model out on the mesh (pipeline {}, data-parallel {}, tensor-parallel {}) named (\"pp\", \"dp_replicate\", \"dp_shard\", \"tp\"); build the optimizer over par.parameters() after it and call par.step(inputs, targets) each iteration",
        l.dp * l.tp * l.pipe.as_ref().map_or(1, |p| p.stages),
        l.pipe.as_ref().map_or(1, |p| p.stages),
        l.dp,
        l.tp
    )];
    if l.tp > 1 {
        out.push(format!(
            "tensor parallelism {}{}: every rank of a tensor-parallel group must be fed the same batch (same token ids and targets)",
            l.tp,
            if l.sequence {
                " with sequence parallelism (norms on 1/degree of the positions; the sequence length must divide by the degree)"
            } else {
                ""
            }
        ));
    }
    if let Some(p) = &l.pipe {
        out.push(format!(
            "pipeline of {} stages, {} over {} micro-batches of {} samples, {} model part(s) (part s on pipeline rank s % {}): pass the replica's token ids to par.step on the ranks that hold the first part and the targets on those that hold the last (par.has_first / par.has_last); the loss is returned where the last part runs",
            p.stages,
            p.schedule,
            p.microbatches,
            f.micro_batch.map_or("?".to_string(), |m| m.to_string()),
            p.parts.len(),
            p.stages
        ));
    }
    if let Some(sh) = sh {
        out.push(format!(
            "FSDP2 over the {} data-parallel ranks ({}): fully_shard on each planned unit a model part holds, then the part, reshard_after_forward={}, {}",
            l.dp,
            if sh.replicas > 1 {
                format!("HSDP: {} replicas x {}", sh.replicas, sh.shard_size)
            } else {
                "one shard group".to_string()
            },
            if sh.reshard { "True" } else { "False" },
            match f.half.as_deref() {
                Some(h) => {
                    let half = if h == "bf16" { "bfloat16" } else { "float16" };
                    format!(
                        "MixedPrecisionPolicy(param_dtype={half}, reduce_dtype={})",
                        if f.fp16_allreduce { half } else { "float32" }
                    )
                }
                None => "no mixed-precision policy (fp32)".to_string(),
            }
        ));
        if sh.prefetch > 1 {
            out.push(format!(
                "prefetch {}: apply_parallel sets no explicit prefetch lists; FSDP2 gathers one unit ahead (its implicit prefetch)",
                sh.prefetch
            ));
        }
    }
    if compiled {
        out.push("op fusion: apply_parallel does not compile the planned regions (COMPILE_MODULES); the plan's fused time is not reached on this path".into());
    }
    out
}

/// The module docstring of a plan with a parallel layout (fixed text).
pub(super) const PARALLEL_DOC: &str = r#""""Apply a trainplan plan's tensor / pipeline / data-parallel layout with PyTorch's own APIs.

    from trainplan_patch import apply_parallel, autocast_context, optimizer_kwargs
    model = LlamaForCausalLM(config)            # same weights on every rank
    loss_fn = lambda logits, targets: F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    par = apply_parallel(model, loss_fn)        # after init_process_group
    optimizer = torch.optim.AdamW(par.parameters(), lr=1e-4, **optimizer_kwargs())
    for inputs, targets in loader:              # the replica's batch, the same on its tp / pp ranks
        with autocast_context():
            loss = par.step(inputs if par.has_first else None, targets if par.has_last else None)
        optimizer.step(); optimizer.zero_grad()

apply_parallel builds the mesh ("pp", "dp_replicate", "dp_shard", "tp"), checkpoints the
planned modules, keeps this rank's model parts of PIPELINE_PARTS (same parameter names as the
model), applies DTensor tensor parallelism (column/row-parallel projections, SequenceParallel
norms), shards each part with FSDP2 over the data-parallel ranks and, with a pipeline, builds
the torch.distributed.pipelining schedule PIPELINE_SCHEDULE over PIPELINE_MICROBATCHES
micro-batches. It expects a Hugging Face Llama-style causal LM (model.embed_tokens,
model.layers, model.norm, model.rotary_emb, lm_head).

The plan (model, cluster, --framework, predicted times) and whose names it uses are in the
comments below.
"""
"#;

/// The helpers of the parallel path (read `PARALLEL`, `TENSOR_PARALLEL`, `SEQUENCE_PARALLEL`,
/// `DATA_PARALLEL`, `PIPELINE_*`, the FSDP constants, `MICRO_BATCH`, `GRAD_ACCUMULATION`, and the
/// PyTorch and FSDP modules' helpers).
pub(super) const PARALLEL_PY: &str = r#"

PARALLEL_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def parallel_mesh_shape():
    """(PIPELINE_STAGES, data-parallel replicas, data-parallel shard size, TENSOR_PARALLEL): the
    planned ranks, tensor parallelism innermost (consecutive ranks of one node), the pipeline
    outermost."""
    replicas = FSDP_REPLICAS if SHARDED else 1
    return (PIPELINE_STAGES, replicas, DATA_PARALLEL // replicas, TENSOR_PARALLEL)


def parallel_mesh(device_type="cpu"):
    """The planned 4-D mesh named PARALLEL_DIMS; the process group must hold exactly the planned
    ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shape = parallel_mesh_shape()
    planned = shape[0] * shape[1] * shape[2] * shape[3]
    world = dist.get_world_size()
    if world != planned:
        raise PlanMismatch(
            "the plan lays out %d ranks (pipeline %d x data-parallel %d x %d x tensor-parallel %d), "
            "the process group has %d" % ((planned,) + shape + (world,))
        )
    return init_device_mesh(device_type, shape, mesh_dim_names=PARALLEL_DIMS)


def _llama_parts(model):
    """Check that `model` is a Hugging Face Llama-style causal LM (model.embed_tokens,
    model.layers, model.norm, model.rotary_emb, lm_head): the layout the module names assume."""
    inner = getattr(model, "model", None)
    for owner, attr in ((model, "lm_head"), (inner, "embed_tokens"), (inner, "layers"), (inner, "norm"), (inner, "rotary_emb")):
        if owner is None or getattr(owner, attr, None) is None:
            raise PlanMismatch(
                "apply_parallel splits a Hugging Face Llama-style causal LM (model.embed_tokens, "
                "model.layers, model.norm, model.rotary_emb, lm_head); %s has no %s"
                % (type(model).__name__, "model" if owner is None else attr)
            )
    return inner


def model_part(model, names):
    """The module that runs one model part of PIPELINE_PARTS (`names`: module paths of `model`,
    in forward order) with the same parameter names as `model`: its blocks in a ModuleDict keyed
    by their index, the embedding when it holds it, the final norm and head when it holds them.
    Its forward takes token ids (first part) or the previous part's hidden states and returns
    hidden states or, on the last part, the logits."""
    import torch

    inner = _llama_parts(model)
    wanted = set(names)
    blocks = [i for i in range(len(inner.layers)) if "model.layers" in wanted or "model.layers.%d" % i in wanted]
    known = {"model.embed_tokens", "model.layers", "model.norm", "lm_head"} | {"model.layers.%d" % i for i in range(len(inner.layers))}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise PlanMismatch("model part names %s, which the model does not have" % ", ".join(unknown[:5]))
    sequence_parallel = SEQUENCE_PARALLEL and TENSOR_PARALLEL > 1

    class ModelPart(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = model.config
            self.model = torch.nn.Module()
            self.model.embed_tokens = inner.embed_tokens if "model.embed_tokens" in wanted else None
            self.model.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in blocks})
            self.model.norm = inner.norm if "model.norm" in wanted else None
            self.model.rotary_emb = inner.rotary_emb
            self.lm_head = model.lm_head if "lm_head" in wanted else None

        def forward(self, x):
            m = self.model
            if m.embed_tokens is not None:
                x = m.embed_tokens(x)
            # With sequence parallelism the hidden states hold 1/TENSOR_PARALLEL of the positions.
            seq = x.shape[1] * (TENSOR_PARALLEL if sequence_parallel else 1)
            positions = torch.arange(seq, device=x.device).unsqueeze(0)
            rotary = m.rotary_emb(x, positions)
            mask = None
            if getattr(self.config, "_attn_implementation", "sdpa") == "eager":
                # Eager attention is causal only through its mask (SDPA without one is causal).
                mask = torch.full((seq, seq), torch.finfo(torch.float32).min, device=x.device).triu(1)[None, None]
            for block in m.layers.values():
                out = block(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
                x = out[0] if isinstance(out, tuple) else out
            if m.norm is not None:
                x = m.norm(x)
            if self.lm_head is not None:
                x = self.lm_head(x)
            return x

    return ModelPart()


def apply_tensor_parallel(part, tp_mesh):
    """Megatron-style tensor parallelism with DTensor on one model part: the attention's query,
    key and value and the MLP's gate and up projections column-parallel, the attention output
    and down projections row-parallel, the embedding row-parallel and the head column-parallel;
    with SEQUENCE_PARALLEL the norms run on 1/TENSOR_PARALLEL of the positions
    (SequenceParallel) and the row-parallel outputs are reduce-scattered over the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    cfg = part.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    if heads % TENSOR_PARALLEL or kv % TENSOR_PARALLEL:
        raise PlanMismatch(
            "tensor parallelism of %d does not divide the model's %d attention heads and %d key/value heads"
            % (TENSOR_PARALLEL, heads, kv)
        )
    sp = SEQUENCE_PARALLEL
    between = Shard(1) if sp else Replicate()
    top = {}
    if part.model.embed_tokens is not None:
        top["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=between)
    if part.model.norm is not None and sp:
        top["model.norm"] = SequenceParallel()
    if part.lm_head is not None:
        top["lm_head"] = ColwiseParallel(input_layouts=between, output_layouts=Replicate())
    if top:
        parallelize_module(part, tp_mesh, top)
    for block in part.model.layers.values():
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=between),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=between),
        }
        if sp:
            plan.update(
                {
                    "input_layernorm": SequenceParallel(),
                    "post_attention_layernorm": SequenceParallel(),
                    "self_attn": PrepareModuleInput(
                        input_kwarg_layouts={"hidden_states": Shard(1)},
                        desired_input_kwarg_layouts={"hidden_states": Replicate()},
                        use_local_output=True,
                    ),
                    "mlp": PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
                    ),
                }
            )
        parallelize_module(block, tp_mesh, plan)
    return part


class ParallelModel:
    """What apply_parallel built on this rank: its model parts (`parts`, nn.Modules), the mesh,
    the pipeline schedule (None without a pipeline) and `step(inputs, targets)`."""

    def __init__(self, parts, stage_ids, mesh, schedule, loss_fn):
        self.parts = parts
        self.stage_ids = stage_ids
        self.mesh = mesh
        self.schedule = schedule
        self.loss_fn = loss_fn

    def parameters(self):
        for p in self.parts:
            yield from p.parameters()

    def named_parameters(self):
        for p in self.parts:
            yield from p.named_parameters()

    @property
    def has_first(self):
        return 0 in self.stage_ids

    @property
    def has_last(self):
        return len(PIPELINE_PARTS) - 1 in self.stage_ids

    def step(self, inputs=None, targets=None, scaler=None):
        """Forward and backward of one iteration of this rank's data-parallel replica (every rank
        of a tensor-parallel group and of a pipeline is fed the same replica batch: MICRO_BATCH x
        PIPELINE_MICROBATCHES samples with a pipeline, MICRO_BATCH x GRAD_ACCUMULATION without):
        `inputs` (token ids) where the first part runs, `targets` where the last runs. Without a
        pipeline the batch is run in GRAD_ACCUMULATION micro-steps, FSDP2 reducing gradients
        after the last only; `scaler` (make_grad_scaler(), fp16) scales the loss. Returns the
        mean loss where the last part runs, else None. Step the optimizer after it."""
        import torch

        micro_steps = PIPELINE_MICROBATCHES if self.schedule is not None else GRAD_ACCUMULATION
        for name, t, needed in (("inputs", inputs, self.has_first), ("targets", targets, self.has_last)):
            if needed and t is None:
                raise ValueError("this rank runs the %s model part: pass %s" % ("first" if name == "inputs" else "last", name))
            if needed and MICRO_BATCH is not None and t.shape[0] != MICRO_BATCH * micro_steps:
                raise PlanMismatch(
                    "%s hold %d samples; the plan feeds each replica %d (%d micro-batches of %d)"
                    % (name, t.shape[0], MICRO_BATCH * micro_steps, micro_steps, MICRO_BATCH)
                )
        if self.schedule is None:
            part, total = self.parts[0], 0.0
            for i, (x, y) in enumerate(zip(inputs.chunk(micro_steps), targets.chunk(micro_steps))):
                if SHARDED and micro_steps > 1:
                    part.set_requires_gradient_sync(i == micro_steps - 1)
                loss = self.loss_fn(part(x), y) / micro_steps
                (scaler.scale(loss) if scaler is not None else loss).backward()
                total = total + loss.detach()
            return total
        losses = []
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        if self.has_first:
            self.schedule.step(inputs, **kwargs)
        else:
            self.schedule.step(**kwargs)
        return torch.stack([l.detach() for l in losses]).mean() if losses else None


def _shard_part(part, dp_mesh, reshard):
    """FSDP2 on the planned units this model part holds, then on the part itself."""
    from torch.distributed.fsdp import fully_shard

    modules = dict(part.named_modules())
    policy = mixed_precision_policy()
    units = [u for u in FSDP_UNITS if u and u in modules]
    for u in sorted(units, key=lambda u: -u.count(".")):
        fully_shard(modules[u], mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)


def apply_parallel(model, loss_fn, *, mesh=None, device_type=None, checkpointing=True):
    """Lay `model` (a Hugging Face Llama-style causal LM on every rank, same weights) out as
    planned and return a ParallelModel: this rank's model parts (PIPELINE_PARTS), tensor-parallel
    over mesh["tp"], checkpointed as planned, sharded with FSDP2 over the data-parallel mesh, and
    with a pipeline a torch.distributed.pipelining schedule (PIPELINE_SCHEDULE over
    PIPELINE_MICROBATCHES micro-batches, `loss_fn(logits, targets)` on the last stage). Call it
    after init_process_group; build the optimizer over its parameters() after it."""
    import torch

    if not PARALLEL:
        raise ValueError("this plan has no tensor or pipeline parallelism: use apply_fsdp or apply_plan")
    check_names(model)
    if SHARDED:
        fsdp_units(model)
    device_type = device_type or _fsdp_device_type(model)
    set_device_type(device_type)
    if mesh is None:
        mesh = parallel_mesh(device_type)
    elif tuple(mesh.mesh_dim_names or ()) != PARALLEL_DIMS or tuple(mesh.shape) != parallel_mesh_shape():
        raise PlanMismatch("the mesh %s %s is not the planned %s %s" % (mesh.mesh_dim_names, tuple(mesh.shape), PARALLEL_DIMS, parallel_mesh_shape()))
    if checkpointing:
        apply_checkpointing(model)
    pp_rank = mesh["pp"].get_local_rank()
    stage_ids = list(range(pp_rank, len(PIPELINE_PARTS), PIPELINE_STAGES))
    parts = [model_part(model, PIPELINE_PARTS[s]) for s in stage_ids]
    for part in parts:
        if TENSOR_PARALLEL > 1:
            apply_tensor_parallel(part, mesh["tp"])
        if SHARDED:
            dp = mesh["dp_replicate", "dp_shard"] if FSDP_REPLICAS > 1 else mesh["dp_shard"]
            # Beside a pipeline FSDP2 keeps each unit gathered for all micro-batches (reshard=0).
            _shard_part(part, dp, FSDP_RESHARD_AFTER_FORWARD)
    schedule = None
    if PIPELINE_STAGES > 1:
        import torch.distributed as dist
        from torch.distributed import pipelining

        device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device(device_type)
        group = mesh["pp"].get_group()
        stages = [pipelining.PipelineStage(p, s, len(PIPELINE_PARTS), device, group=group) for p, s in zip(parts, stage_ids)]
        if dist.get_backend(group) == "gloo":
            # torch 2.9's schedules warm the point-to-point links up by sending an int64 scalar
            # into a float32 buffer: NCCL does not check sizes, gloo aborts the process. Gloo
            # needs no warm-up: skip it there.
            for stage in stages:
                if hasattr(stage, "_get_init_p2p_neighbors_ops"):
                    stage._get_init_p2p_neighbors_ops = list
        cls = getattr(pipelining, PIPELINE_SCHEDULE)
        if len(stages) > 1 or PIPELINE_SCHEDULE == "ScheduleInterleaved1F1B":
            schedule = cls(stages, n_microbatches=PIPELINE_MICROBATCHES, loss_fn=loss_fn)
        else:
            schedule = cls(stages[0], n_microbatches=PIPELINE_MICROBATCHES, loss_fn=loss_fn)
    return ParallelModel(parts, stage_ids, mesh, schedule, loss_fn)
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_files, file, pipelined, tiny_plan};
    use super::super::{EmitError, Framework, emit};
    use crate::plan::{Plan, ShardConfig, TensorParallelConfig};

    /// [`tiny_plan`] with a 4-block Llama's names (one tensor each for the blocks), in bf16,
    /// tensor-parallel over 2 with sequence parallelism, pipelined over 2 stages in 1F1B beside
    /// FSDP2 without resharding over the 2 data-parallel ranks (8 ranks).
    fn llama_plan() -> Plan {
        let mut p = pipelined(tiny_plan(), 2, "1f1b", 1);
        let mut names = vec!["lm_head.weight".to_string()];
        names.extend(
            (0..4)
                .rev()
                .map(|l| format!("model.layers.{l}.self_attn.q_proj.weight")),
        );
        names.push("model.embed_tokens.weight".into());
        let c = &mut p.config;
        c.tensor_groups = names.iter().map(|n| vec![n.clone()]).collect();
        c.tensor_bytes = names.iter().map(|n| (n.clone(), 1 << 20)).collect();
        c.partitions.clear();
        c.fused_ops.clear();
        c.dtype = "bf16".into();
        c.passes.retain(|x| x != "blueconnect");
        c.tensor_parallel = Some(TensorParallelConfig {
            degree: 2,
            sequence: true,
            global_batch: true,
        });
        c.sharding = Some(ShardConfig {
            stage: 3,
            shard_size: 2,
            replicas: 1,
            reshard: false,
            prefetch: 1,
            offload: false,
            units: vec!["model.layers.0".into(), String::new()],
            unit_bytes: vec![1 << 20, 1 << 20],
        });
        for d in &mut p.decisions {
            if d.pass == "amp" {
                d.knobs.clear();
                d.knobs.insert("dtype".into(), "bf16".into());
            }
        }
        p
    }

    #[test]
    fn a_llama_layout_writes_the_mesh_the_schedule_and_the_parts() {
        let plan = llama_plan();
        let e = emit(&plan, Framework::Pytorch).unwrap();
        check_files(&e);
        let py = file(&e, "trainplan_patch.py");
        for want in [
            "PARALLEL = True\n",
            "TENSOR_PARALLEL = 2\n",
            "SEQUENCE_PARALLEL = True\n",
            "DATA_PARALLEL = 2\n",
            "PIPELINE_STAGES = 2\n",
            "PIPELINE_SCHEDULE = \"Schedule1F1B\"\n",
            "PIPELINE_MICROBATCHES = 4\n",
            "PIPELINE_PARTS = [[\"model.embed_tokens\", \"model.layers.0\", \"model.layers.1\"], [\"model.layers.2\", \"model.layers.3\", \"model.norm\", \"lm_head\"]]\n",
            "FSDP_RESHARD_AFTER_FORWARD = False\n",
            // A replica of 2 x 2 ranks trains 4 x 4 samples in 4 micro-batches of 4.
            "MICRO_BATCH = 4\n",
            "def apply_parallel(",
        ] {
            assert!(py.contains(want), "{want}");
        }
        let notes = e.notes.join("\n");
        assert!(notes.contains("apply_parallel(model, loss_fn)"), "{notes}");
        assert!(
            notes.contains("Schedule1F1B over 4 micro-batches of 4 samples"),
            "{notes}"
        );
        assert!(!notes.contains("call apply_fsdp"), "{notes}");
        // Interleaved over 2 chunks per rank: 4 parts, part s on rank s % 2.
        let mut p = llama_plan();
        p.config.tensor_parallel = None;
        p.config.sharding.as_mut().unwrap().shard_size = 4;
        let p = pipelined(p, 2, "interleaved", 2);
        let py = file(&emit(&p, Framework::Pytorch).unwrap(), "trainplan_patch.py").to_string();
        assert!(py.contains("PIPELINE_SCHEDULE = \"ScheduleInterleaved1F1B\"\n"));
        assert!(py.contains("PIPELINE_PARTS = [[\"model.embed_tokens\", \"model.layers.0\"], [\"model.layers.1\"], [\"model.layers.2\"], [\"model.layers.3\", \"model.norm\", \"lm_head\"]]\n"), "{py}");
        assert!(py.contains("TENSOR_PARALLEL = 1\n"));
    }

    #[test]
    fn a_plan_without_a_layout_keeps_apply_plan() {
        let e = emit(&tiny_plan(), Framework::Pytorch).unwrap();
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains("PARALLEL = False\n"));
        assert!(py.contains("PIPELINE_PARTS = [[\"model.embed_tokens\", \"model.layers\", \"model.norm\", \"lm_head\"]]\n"));
        assert!(!e.notes.join("\n").contains("apply_parallel"));
    }

    #[test]
    fn what_the_export_cannot_run_is_refused_naming_the_field() {
        let refused = |edit: &dyn Fn(&mut Plan), field: &str, why: &str| {
            let mut p = llama_plan();
            edit(&mut p);
            match emit(&p, Framework::Pytorch) {
                Err(EmitError::Unsupported { field: f, why: w }) => {
                    assert_eq!(f, field);
                    assert!(w.contains(why), "{w}");
                }
                other => panic!("{field}: {other:?}"),
            }
        };
        // Not a Llama-style model (the tiny plan's net.* names).
        refused(
            &|p| {
                let t = tiny_plan();
                p.config.tensor_groups = t.config.tensor_groups.clone();
                p.config.tensor_bytes = t.config.tensor_bytes.clone();
                p.config.sharding.as_mut().unwrap().units = vec![String::new()];
                p.config.sharding.as_mut().unwrap().unit_bytes = vec![1];
            },
            "config.tensor_parallel",
            "Llama-style models only",
        );
        // Tensor parallelism beside DDP over 2 data-parallel ranks.
        refused(
            &|p| {
                p.config.sharding = None;
                p.config.pipeline = None;
            },
            "config.tensor_parallel",
            "not DDP",
        );
        // A pipeline beside FSDP2 that re-gathers for the backward.
        refused(
            &|p| p.config.sharding.as_mut().unwrap().reshard = true,
            "config.sharding",
            "reshard=0",
        );
        // fp16 needs loss scaling the schedules do not run.
        refused(
            &|p| {
                p.config.dtype = "fp16".into();
                for d in &mut p.decisions {
                    if d.pass == "amp" {
                        d.knobs.insert("dtype".into(), "fp16".into());
                    }
                }
            },
            "config.dtype",
            "plan the pipeline in bf16",
        );
    }
}
