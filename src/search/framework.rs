//! What each framework's exported files apply: the planner's contract with `trainplan export`.
//!
//! `plan --framework F` searches only the moves F's export applies, and every decision of the
//! plan records the mechanism that applies it, so the plan's `planned_iteration_ms` is the replay
//! of exactly what the export changes. A pass the export cannot apply may still be evaluated and
//! reported as *advice* (with its predicted effect and why it is not exported), never counted.
//!
//! | pass | pytorch | horovod | byteps | tf | jax |
//! |---|---|---|---|---|---|
//! | `tensor-fusion` (any contiguous groups) | — (DDP has one bucket cap) | `groups=` | — (fork only) | — | — (one threshold) |
//! | bucket / threshold grid (a baseline) | `bucket_cap_mb` | fusion threshold + cycle | `BYTEPS_PARTITION_BYTES` | — | combine threshold |
//! | `tensor-partition` (per tensor) | — | — | — (one size for all) | — | — |
//! | `op-fusion` | `torch.compile` per module (zoo names) | — | — | — (zoo names are not TF nodes) | — (`jax.jit` fuses already) |
//! | `amp` | autocast + GradScaler | autocast + GradScaler | — | Keras policy + loss scale | dtype + loss scale |
//! | `fused-adam` | `fused=True` | `fused=True` | — | — | — |
//! | `recompute` | `torch.utils.checkpoint` | — | — | — | `jax.checkpoint` policy |
//! | `grad-accumulation` | `no_sync()` (FSDP2: `set_requires_gradient_sync(False)`), loss ÷ k | `backward_passes_per_step` | `backward_passes_per_step` | `gradient_accumulation_steps` | `optax.MultiSteps` |
//! | `blueconnect` | — | `HOROVOD_HIERARCHICAL_ALLREDUCE` | — | — | — |
//! | `shard` | FSDP2 `fully_shard` per unit (stage 3) | — | — | — | — |
//! | `p3`, `reconstruct-batchnorm`, `vdnn`, `dgc`, pass files | — | — | — | — | — |
//!
//! `deepspeed` and `torchtitan` (the sharding issue's frameworks) apply `amp`, `fused-adam`,
//! `grad-accumulation` and `shard` (stages per [`shard_supported`]) through `ds_config.json`
//! and `torchtitan.toml`; torchtitan also `tensor-parallel` and `recompute` (whole blocks).
//! `megatron` applies `amp`, `fused-adam`, `recompute` (whole layers), `grad-accumulation`,
//! `shard` at stage 1 (the distributed optimizer), `tensor-parallel` ([`tp_supported`]) and
//! `pipeline` ([`pipeline_supported`]) through `megatron_args.sh`; nothing else.
//!
//! A plan from a trace names ATen operators, not modules, so `op-fusion` is never exported for
//! it; AMP on a trace is priced for kernels whose class the trace does not record, so it is
//! exported like on a zoo job but must clear the search's minimum gain.
//!
//! **Invariant:** this table is the only place that says what an export applies; the search, the
//! plan's `mechanism` fields, `trainplan show` and the emitters' notes all read it.

use crate::cost::framework::Framework;

/// Whether a plan from a trace or from the zoo (their names differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// The zoo's torchvision / Hugging Face module and parameter names.
    Zoo,
    /// A trace's ATen operator and kernel names.
    Trace,
}

impl Names {
    /// `zoo` or `trace`, as in the plan's `workload.names`.
    pub fn of(source: &str) -> Names {
        if source == "trace" {
            Names::Trace
        } else {
            Names::Zoo
        }
    }
}

/// How `fw`'s exported files apply `pass`: `Ok(mechanism)`, or `Err(why not)`.
pub fn mechanism(fw: Framework, pass: &str, names: Names) -> Result<&'static str, &'static str> {
    use Framework::*;
    let torch_like = matches!(fw, Pytorch | Horovod);
    match pass {
        // On a trace the buckets regroup the all-reduces the traced run issued (DDP's buckets,
        // or a loop's one per gradient): advice, the export does not rewrite that run.
        "tensor-fusion" if names == Names::Trace && fw != Horovod => Err(
            "buckets of a traced run's all-reduces: set DDP's bucket_cap_mb to the planned bucket size (wrapping the model in DDP where the loop all-reduces each gradient itself) or Horovod's fusion threshold; the export does not rewrite a traced run's training loop",
        ),
        "tensor-fusion" => match fw {
            Horovod => Ok(
                "hvd.DistributedOptimizer(groups=...) with HOROVOD_DISABLE_GROUP_FUSION=1 and HOROVOD_FUSION_THRESHOLD >= the largest group (trainplan_horovod.distributed_optimizer, horovod.env)",
            ),
            Pytorch => Err(
                "DDP fills buckets by one size cap in gradient-ready order: arbitrary groups cannot be set (the plan tunes bucket_cap_mb instead)",
            ),
            Jax => Err(
                "XLA combines all-reduces by one size threshold: arbitrary groups cannot be set (the plan tunes the threshold instead)",
            ),
            Byteps => {
                Err("stock BytePS synchronises tensor by tensor: groups need dPRO's BytePS fork")
            }
            Tf => Err(
                "MirroredStrategy packs gradients by its own rule: arbitrary groups cannot be set",
            ),
            Deepspeed => Err(
                "DeepSpeed fills its buckets by one size (reduce_bucket_size): arbitrary groups cannot be set",
            ),
            Torchtitan => Err(
                "torchtitan groups gradients by its wrap units (FSDP2) or DDP buckets: arbitrary groups cannot be set",
            ),
            Megatron => Err(
                "Megatron-LM reduces one contiguous gradient buffer (or buckets of one size with --overlap-grad-reduce): arbitrary groups cannot be set",
            ),
        },
        "tensor-partition" => Err(
            "per-tensor partition numbers need dPRO's BytePS fork: stock BytePS cuts every tensor by one BYTEPS_PARTITION_BYTES (the plan tunes it for --framework byteps)",
        ),
        "op-fusion" => match (fw, names) {
            (Pytorch, Names::Zoo) => Ok(
                "torch.compile of each fused region's module (trainplan_patch.apply_plan, compile=True)",
            ),
            (Pytorch, Names::Trace) => Err(
                "a trace names ATen operators, not modules: torch.compile cannot be aimed at them",
            ),
            (Tf, _) => Err(
                "the plan names torchvision / Hugging Face layers or ATen operators, not TF graph nodes: no cluster of a Keras model can be targeted (XLA auto-clustering, the xla_default baseline, is TF's own switch)",
            ),
            (Jax, _) => Err("jax.jit compiles the whole step already: XLA chooses the fusion"),
            (Horovod | Byteps, _) => Err(
                "the Horovod and BytePS exports set communication only; compile regions come with --framework pytorch",
            ),
            (Deepspeed, _) => {
                Err("ds_config.json has no compile regions; they come with --framework pytorch")
            }
            (Torchtitan, _) => Err(
                "torchtitan compiles every block or none (compile.enable): regions cannot be chosen",
            ),
            (Megatron, _) => Err(
                "Megatron-LM fuses with its own kernels (Transformer Engine, --bias-gelu-fusion ...), not regions a plan chooses",
            ),
        },
        "amp" => match fw {
            Pytorch => Ok(
                "torch.autocast in the planned dtype, torch.amp.GradScaler for fp16 (trainplan_patch.autocast_context, make_grad_scaler)",
            ),
            Horovod => Ok(
                "torch.autocast in the planned dtype, GradScaler stepped the Horovod way (trainplan_horovod.autocast_context, make_grad_scaler, step)",
            ),
            Tf => Ok(
                "Keras mixed-precision policy; loss scaling for fp16 (trainplan_xla.set_precision_policy, compile_kwargs auto_scale_loss, wrap_optimizer)",
            ),
            Jax => Ok(
                "compute dtype inside the loss; fp16: dynamic loss scaling and overflowed steps skipped (trainplan_jax.cast_params, scaled_value_and_grad, make_optimizer)",
            ),
            Byteps => Err("the BytePS export sets communication only (no precision module)"),
            Deepspeed => Ok(
                "bf16.enabled, or fp16.enabled with dynamic loss scaling; FP32 master weights in the optimizer; gradients reduced in half only with fp16_allreduce=1, else communication_data_type fp32 (ds_config.json)",
            ),
            Torchtitan => Ok(
                "training.mixed_precision_param = bfloat16, mixed_precision_reduce = float32 (torchtitan.toml); bf16 only: torchtitan has no fp16 mixed precision (no loss scaler), and the export of an fp16 plan says it runs in float32",
            ),
            Megatron => Ok(
                "--bf16, or --fp16 with dynamic loss scaling: the model held in half, FP32 main parameters and gradients in the optimizer (megatron_args.sh)",
            ),
        },
        "fused-adam" => match fw {
            _ if torch_like => {
                Ok("torch.optim.Adam/AdamW(fused=True): pass optimizer_kwargs() to the optimizer")
            }
            Deepspeed => Ok(
                "optimizer.type AdamW: DeepSpeed's fused multi-tensor Adam, DeepSpeedCPUAdam when offloaded (ds_config.json; hyper-parameters through trainplan_deepspeed.load_config)",
            ),
            Torchtitan => Ok("optimizer.implementation = \"fused\" (torchtitan.toml)"),
            Megatron => Ok(
                "--optimizer adam: Transformer Engine's or apex's FusedAdam, Megatron-LM's only Adam (megatron_args.sh)",
            ),
            _ => Err("the optimizer update is compiled with the step (XLA): no separate switch"),
        },
        "recompute" => match fw {
            Pytorch => Ok(
                "torch.utils.checkpoint on each planned block, its input kept and the block re-run in the backward, as recompute:policy=full plans it (trainplan_patch.apply_plan / apply_fsdp, checkpointing=True)",
            ),
            Jax => Ok(
                "jax.checkpoint (nothing saved inside but its inputs) around each planned block's function, as recompute:policy=full plans it (trainplan_jax.remat(name, fn))",
            ),
            Torchtitan => Ok(
                "activation_checkpoint.mode = \"full\": every transformer block checkpointed, as recompute:policy=full plans it (torchtitan.toml)",
            ),
            Megatron => Ok(
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1: every transformer layer's input kept, the layer re-run in the backward, as recompute:policy=full plans it (megatron_args.sh)",
            ),
            _ => Err("the export has no recomputation switch for this framework"),
        },
        "grad-accumulation" => Ok(match fw {
            Pytorch => {
                "DDP no_sync() (FSDP2: set_requires_gradient_sync(False)) for k-1 micro-steps of batch/k, loss divided by k (trainplan_patch.accumulate, scale_loss, MICRO_BATCH)"
            }
            Horovod => {
                "hvd.DistributedOptimizer(backward_passes_per_step=k), micro-batches of batch/k, loss divided by k (trainplan_horovod.distributed_optimizer, scale_loss, MICRO_BATCH)"
            }
            Byteps => {
                "bps.DistributedOptimizer(backward_passes_per_step=k), micro-batches of batch/k, loss divided by k"
            }
            Tf => {
                "Keras optimizer gradient_accumulation_steps=k (trainplan_xla.make_optimizer), micro-batches of batch/k"
            }
            Jax => {
                "optax.MultiSteps(every_k_schedule=k) (trainplan_jax.make_optimizer), micro-batches of batch/k"
            }
            Deepspeed => {
                "gradient_accumulation_steps = k, train_micro_batch_size_per_gpu = batch/k (ds_config.json)"
            }
            Torchtitan => {
                "training.local_batch_size = batch/k, global_batch_size = batch x data-parallel ranks: torchtitan accumulates the k micro-batches (torchtitan.toml)"
            }
            Megatron => {
                "--micro-batch-size = batch/k, --global-batch-size = batch x data-parallel ranks: Megatron-LM runs k micro-batches per step (megatron_args.sh)"
            }
        }),
        "shard" | "tensor-parallel" | "context-parallel" | "pipeline" => parallelism(fw, pass),
        "blueconnect" => match fw {
            Horovod => Ok("HOROVOD_HIERARCHICAL_ALLREDUCE=1 (horovod.env)"),
            _ => Err("no hierarchical all-reduce switch in this framework's export"),
        },
        _ => Err(
            "a what-if of a technique the framework does not switch on (p3, reconstruct-batchnorm, vdnn, dgc, pass files): nothing in the export applies it",
        ),
    }
}

/// How `fw`'s exported files apply the parallelism pass `pass` (`shard`, `tensor-parallel`,
/// `pipeline`): [`mechanism`]'s arms for them.
fn parallelism(fw: Framework, pass: &str) -> Result<&'static str, &'static str> {
    use Framework::*;
    match pass {
        "shard" => match fw {
            Pytorch => Ok(
                "torch.distributed.fsdp.fully_shard on each planned unit, then the root, with the planned reshard_after_forward, prefetch and MixedPrecisionPolicy; HSDP on a (replicas, shard) mesh (trainplan_patch.apply_fsdp)",
            ),
            Deepspeed => Ok(
                "zero_optimization: stage, reduce/allgather bucket sizes, overlap_comm, stage-3 prefetch bucket, offload_optimizer; MiCS shard size for replicas, the model built in deepspeed.zero.MiCS_Init (ds_config.json, trainplan_deepspeed.model_init; MiCS needs DeepSpeed <= 0.19.6)",
            ),
            Torchtitan => Ok(
                "parallelism.data_parallel_shard_degree and data_parallel_replicate_degree, fsdp_reshard_after_forward (torchtitan.toml)",
            ),
            Megatron => Ok(
                "--use-distributed-optimizer: optimizer state and FP32 main parameters sharded over the data-parallel ranks (ZeRO-1), gradients reduce-scattered, parameters all-gathered (megatron_args.sh)",
            ),
            _ => Err(
                "this framework's export has no sharded data parallelism (FSDP2 comes with --framework pytorch, ZeRO with deepspeed)",
            ),
        },
        "tensor-parallel" => match fw {
            Torchtitan => Ok(
                "parallelism.tensor_parallel_degree: torchtitan's Megatron-style plan (column/row-parallel attention and MLP, sequence-parallel norms, vocabulary-parallel loss) on consecutive ranks (torchtitan.toml)",
            ),
            Megatron => Ok(
                "--tensor-model-parallel-size, --sequence-parallel: column/row-parallel attention and MLP, vocabulary-parallel embedding and loss, on consecutive ranks (megatron_args.sh)",
            ),
            Pytorch => Ok(
                "DTensor parallelize_module on each Llama-style block (ColwiseParallel query/key/value/gate/up, RowwiseParallel output/down, SequenceParallel norms), on the innermost mesh dimension, FSDP2 over the data-parallel ranks (trainplan_patch.apply_parallel)",
            ),
            _ => Err(
                "this framework's export has no tensor parallelism (it comes with --framework torchtitan, megatron or pytorch)",
            ),
        },
        "context-parallel" => match fw {
            Torchtitan => Ok(
                "parallelism.context_parallel_degree: the sequence split over the group, attention as a ring (torchtitan's context_parallel over SDPA), FSDP2 over the data- and context-parallel ranks (torchtitan.toml)",
            ),
            Megatron => Ok(
                "--context-parallel-size: the sequence split over the group, Transformer Engine's ring attention (megatron_args.sh)",
            ),
            _ => Err(
                "this framework's export has no context parallelism (it comes with --framework torchtitan or megatron)",
            ),
        },
        "pipeline" => match fw {
            Megatron => Ok(
                "--pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-stage for the interleaved schedule, the micro-batches by --micro-batch-size and --global-batch-size (megatron_args.sh)",
            ),
            Torchtitan => Ok(
                "parallelism.pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_microbatch_size and module_fqns_per_model_part (the planned cut), beside FSDP2 without resharding (torchtitan.toml)",
            ),
            Pytorch => Ok(
                "torch.distributed.pipelining: the planned model parts as PipelineStages, Schedule1F1B / ScheduleInterleaved1F1B / ScheduleGPipe over the planned micro-batches, beside FSDP2 without resharding (trainplan_patch.apply_parallel)",
            ),
            _ => Err(
                "this framework's export has no pipeline parallelism (it comes with --framework megatron, torchtitan or pytorch)",
            ),
        },
        _ => Err("not a parallelism pass"),
    }
}

/// Knobs `fw`'s export needs a pass to take when the search moves it: torchtitan runs AMP in
/// bf16 only (it has no loss scaler), so its plans' `amp` is bf16; it checkpoints whole
/// blocks, so its plans' `recompute` is `policy=full`, and so are the PyTorch export's:
/// `torch.utils.checkpoint` on a module keeps that module's inputs and re-runs all of it, so
/// only whole modules are sites it applies as planned, and a numbered block (a transformer
/// layer, a ResNet bottleneck) is the module `policy=full` prices exactly. A segment of
/// layers (`policy=layers`) exported module by module would keep every checkpointed module's
/// inputs (Llama 3 405B: about four hidden states per block where the plan counted a third of
/// one) and re-run the parents of functional ops (`self_attn.core`, `mlp.mul`) whole. JAX's
/// `jax.checkpoint` around a function likewise saves the function's inputs, so the JAX export's
/// `remat(name, fn)` applies whole blocks as priced too. The PyTorch export accumulates with
/// whole gradients held (`grad-accumulation` `sync=last`).
pub fn pass_knobs(pass: &str, fw: Option<Framework>) -> Vec<(String, String)> {
    match (pass, fw) {
        ("amp", Some(Framework::Torchtitan)) => vec![("dtype".into(), "bf16".into())],
        (
            "recompute",
            Some(Framework::Torchtitan | Framework::Megatron | Framework::Pytorch | Framework::Jax),
        ) => {
            vec![("policy".into(), "full".into())]
        }
        // Megatron-LM's distributed optimizer is ZeRO-1.
        ("shard", Some(Framework::Megatron)) => vec![("stage".into(), "1".into())],
        // The PyTorch export accumulates an FSDP2 model with set_requires_gradient_sync(False)
        // (whole gradients held, one reduce-scatter); torchtitan and DeepSpeed ZeRO-2/3
        // reduce-scatter every micro-step, the pass's default.
        ("grad-accumulation", Some(Framework::Pytorch)) => vec![("sync".into(), "last".into())],
        _ => Vec::new(),
    }
}

/// Whether `pass` is ruled out on `job` whatever its knobs (as a move, and as advice):
/// torchtitan's AMP is bf16 only, so on a GPU without bf16 (a V100) a torchtitan plan has none;
/// P3 slices and prioritises whole-gradient synchronisation (Jayarajan et al.: all-reduce or a
/// parameter server's push and pull), which a sharded job does not have: FSDP and ZeRO already
/// move gradients by wrap unit, in the backward's order, as reduce-scatters (slicing those of
/// Llama 3 405B on 16,384 H100s into 4 MiB pieces made the advice of its torchtitan plan one
/// replay of 44 s, for no gain).
pub fn rules_out(pass: &str, fw: Option<Framework>, job: &crate::graph::job::Job) -> bool {
    match pass {
        "amp" => {
            fw == Some(Framework::Torchtitan)
                && !job
                    .gpu
                    .matrix_tflops
                    .contains_key(&crate::cost::config::Dtype::Bf16)
        }
        "p3" => job
            .syncs
            .iter()
            .any(|s| s.kind != crate::graph::comm::CollectiveKind::AllReduce),
        _ => false,
    }
}

/// Whether `fw`'s export can apply sharding `stage` with `replicas` replica groups and
/// `reshard`: `Err(why not)` for a combination it has no setting for.
///
/// | | stage 1 | stage 2 | stage 3, reshard | stage 3, no reshard | replicas > 1 |
/// |---|---|---|---|---|---|
/// | pytorch (FSDP2) | — | — | `reshard_after_forward=True` | `False` | HSDP mesh |
/// | deepspeed | ZeRO-1 | ZeRO-2 | ZeRO-3 | — (stage 3 always re-gathers) | MiCS, stage 3 |
/// | torchtitan | — | — | `fsdp_reshard_after_forward = "always"` | `"never"` | `data_parallel_replicate_degree` |
/// | megatron | `--use-distributed-optimizer` | — | — | — | — (one distributed-optimizer instance) |
pub fn shard_supported(
    fw: Framework,
    stage: u32,
    replicas: u32,
    reshard: bool,
) -> Result<(), &'static str> {
    use Framework::*;
    match fw {
        Pytorch | Torchtitan if stage != 3 => Err(
            "FSDP2 shards parameters, gradients and optimizer state together (stage 3); ZeRO-1/2 come with --framework deepspeed",
        ),
        Pytorch | Torchtitan => Ok(()),
        Deepspeed if stage == 3 && !reshard => {
            Err("DeepSpeed ZeRO-3 gathers parameters again for the backward (reshard=1)")
        }
        Deepspeed if replicas > 1 && stage != 3 => {
            Err("DeepSpeed shards inside groups (MiCS) at stage 3 only")
        }
        Deepspeed => Ok(()),
        Megatron if stage != 1 || replicas > 1 => Err(
            "Megatron-LM's distributed optimizer shards the optimizer state over every data-parallel rank (stage 1); stages 2 and 3 and replica groups come with --framework deepspeed or torchtitan",
        ),
        Megatron => Ok(()),
        _ => Err("this framework's export has no sharded data parallelism"),
    }
}

/// Whether `fw`'s export can offload the optimizer alone to the host CPU (the `shard` pass's
/// `offload=1`, ZeRO-Offload): `Err(why not)`.
pub fn offload_supported(fw: Framework) -> Result<(), &'static str> {
    match fw {
        Framework::Deepspeed => Ok(()),
        Framework::Pytorch | Framework::Torchtitan => Err(
            "FSDP2's CPUOffloadPolicy moves parameters and gradients to the CPU too; the optimizer alone is offloaded with --framework deepspeed",
        ),
        Framework::Megatron => Err(
            "Megatron-LM's --optimizer-cpu-offload runs Transformer Engine's hybrid optimizer, which is not priced; the optimizer alone is offloaded with --framework deepspeed",
        ),
        _ => Err("this framework's export has no optimizer offload"),
    }
}

/// Whether `fw`'s export can apply tensor parallelism (`sequence`: with sequence parallelism)
/// on `dp_ranks` data-parallel ranks, sharded at stage 3 (`fsdp`) or not: `Err(why not)`.
///
/// | | sequence=1 | sequence=0 | DP > 1 without FSDP |
/// |---|---|---|---|
/// | torchtitan 0.2.0 | `tensor_parallel_degree` | — (its TP plan always puts `SequenceParallel` on the norms) | — (`parallelize_llama`: "DDP has not supported > 1D parallelism") |
/// | megatron | `--tensor-model-parallel-size`, `--sequence-parallel` | without `--sequence-parallel` | its own DDP |
/// | pytorch (DTensor, a Llama-style model: [`native_layout`]) | `SequenceParallel` norms, reduce-scattered row-parallel outputs | column/row-parallel only | — (DDP takes no DTensor parameters) |
/// | other exports | — | — | — |
pub fn tp_supported(
    fw: Framework,
    sequence: bool,
    dp_ranks: u32,
    fsdp: bool,
) -> Result<(), &'static str> {
    match fw {
        Framework::Torchtitan if !sequence => Err(
            "torchtitan's tensor parallelism always shards the norms over the sequence (SequenceParallel): plan it with sequence=1",
        ),
        Framework::Torchtitan if dp_ranks > 1 && !fsdp => Err(
            "torchtitan 0.2.0 applies DDP to a one-dimensional mesh only: with tensor parallelism the data-parallel ranks must be sharded (FSDP2, shard:stage=3)",
        ),
        Framework::Pytorch if dp_ranks > 1 && !fsdp => Err(
            "PyTorch-native tensor parallelism (DTensor) runs beside FSDP2 over the data-parallel ranks, not DDP, which takes no DTensor parameters: plan shard:stage=3",
        ),
        Framework::Torchtitan | Framework::Megatron | Framework::Pytorch => Ok(()),
        _ => Err(
            "this framework's export has no tensor parallelism (it comes with --framework torchtitan, megatron or pytorch)",
        ),
    }
}

/// Whether `fw`'s export can apply context parallelism, with FSDP (`shard:stage=3`) over the
/// data-parallel ranks or not: `Err(why not)`.
///
/// | | with FSDP | without |
/// |---|---|---|
/// | torchtitan 0.2.0 | `context_parallel_degree` | — (`ParallelDims.fsdp_enabled` is true with cp > 1: torchtitan shards the parameters over dp_shard × cp whatever the plan says) |
/// | megatron | `--context-parallel-size` | the same |
/// | other exports | — | — |
pub fn cp_supported(fw: Framework, fsdp: bool) -> Result<(), &'static str> {
    match fw {
        Framework::Torchtitan if !fsdp => Err(
            "torchtitan 0.2.0 shards the parameters over the data- and context-parallel ranks (FSDP2) whenever context parallelism is on: plan it with shard:stage=3",
        ),
        Framework::Torchtitan | Framework::Megatron => Ok(()),
        _ => Err(
            "this framework's export has no context parallelism (it comes with --framework torchtitan or megatron)",
        ),
    }
}

/// Whether `fw`'s export can lay out a model whose parameters are `names` over tensor or
/// pipeline parallelism: `Err(why not)`. The PyTorch-native export splits Hugging Face
/// Llama-style causal LMs (`model.embed_tokens`, `model.layers.N` blocks of `nn.Linear`
/// projections, `model.norm`, `lm_head`), which DTensor's column- and row-parallel styles
/// take; GPT-2's fused `Conv1D` projections and BERT are not. torchtitan and Megatron-LM
/// export their own model definitions: any.
pub fn native_layout<'a>(
    fw: Framework,
    mut names: impl Iterator<Item = &'a str>,
) -> Result<(), &'static str> {
    if fw != Framework::Pytorch {
        return Ok(());
    }
    let (mut embed, mut head, mut block) = (false, false, false);
    for n in names.by_ref() {
        embed |= n == "model.embed_tokens.weight";
        head |= n == "lm_head.weight";
        block |= n.starts_with("model.layers.") && n.ends_with(".self_attn.q_proj.weight");
    }
    if embed && head && block {
        Ok(())
    } else {
        Err(
            "the PyTorch-native export lays out Hugging Face Llama-style models only (model.embed_tokens, model.layers.N.self_attn.q_proj, lm_head: --model llama and its presets); other models get tensor and pipeline parallelism with --framework torchtitan or megatron",
        )
    }
}

/// Whether `fw`'s export can run a pipeline in `schedule` (`1f1b`, `gpipe`, `interleaved`):
/// `Err(why not)`.
///
/// | | 1f1b | interleaved | gpipe |
/// |---|---|---|---|
/// | megatron | `--pipeline-model-parallel-size` | and `--num-layers-per-virtual-pipeline-stage` | — (Megatron-LM's schedules are 1F1B and interleaved 1F1B) |
/// | torchtitan 0.2.0 | `pipeline_parallel_schedule = "1F1B"` | `"Interleaved1F1B"` | `"GPipe"` (torch.distributed.pipelining's schedules) |
/// | pytorch (a Llama-style model: [`native_layout`]) | `Schedule1F1B` | `ScheduleInterleaved1F1B` | `ScheduleGPipe` |
/// | other exports | — | — | — |
pub fn pipeline_supported(fw: Framework, schedule: &str) -> Result<(), &'static str> {
    match (fw, schedule) {
        (Framework::Megatron, "1f1b" | "interleaved") => Ok(()),
        (Framework::Megatron, _) => Err(
            "Megatron-LM runs the 1F1B and interleaved 1F1B schedules (get_forward_backward_func): plan schedule=1f1b or interleaved",
        ),
        (Framework::Torchtitan | Framework::Pytorch, "1f1b" | "interleaved" | "gpipe") => Ok(()),
        (Framework::Torchtitan | Framework::Pytorch, _) => Err(
            "torch.distributed.pipelining runs the 1F1B, interleaved 1F1B and GPipe schedules: plan schedule=1f1b, interleaved or gpipe",
        ),
        _ => Err(
            "this framework's export has no pipeline parallelism (it comes with --framework megatron, torchtitan or pytorch)",
        ),
    }
}

/// Whether a pipeline runs beside the sharding `stage` (None: unsharded; `reshard`: stage 3's
/// FSDP reshard-after-forward) in `fw`'s export (None: any export): `Err(why not)`.
///
/// | | unsharded | stage 1 | stage 3, reshard=0 |
/// |---|---|---|---|
/// | megatron | its DDP | `--use-distributed-optimizer` | — |
/// | torchtitan 0.2.0 | — (DDP takes a one-dimensional mesh only) | — | FSDP2 on `dp_shard`, `fsdp_reshard_after_forward = "never"` (its `"default"` with a pipeline) |
/// | pytorch | — (the export runs FSDP2 beside its parallel layouts) | — | FSDP2 on the data-parallel mesh, `reshard_after_forward=False` |
///
/// The `pipeline` pass itself refuses stage 2 and stage 3 with `reshard=1` (see its docs).
pub fn pipeline_beside(
    fw: Option<Framework>,
    stage: Option<u32>,
    reshard: bool,
) -> Result<(), &'static str> {
    match (fw, stage) {
        (None, None | Some(1)) | (Some(Framework::Megatron), None | Some(1)) => Ok(()),
        (None | Some(Framework::Torchtitan | Framework::Pytorch), Some(3)) if !reshard => Ok(()),
        (Some(Framework::Torchtitan), _) => Err(
            "torchtitan 0.2.0 runs a pipeline beside FSDP2 that keeps the parameters gathered for the step (shard:stage=3,reshard=0); its DDP takes a one-dimensional mesh only",
        ),
        (Some(Framework::Pytorch), _) => Err(
            "the PyTorch-native export runs a pipeline beside FSDP2 that keeps the parameters gathered for the step (shard:stage=3,reshard=0)",
        ),
        (Some(Framework::Megatron), _) => Err(
            "Megatron-LM runs a pipeline beside its DDP or its distributed optimizer (shard:stage=1)",
        ),
        _ => Err("a pipeline runs beside stage 1, or stage 3 with reshard=0"),
    }
}

/// The names of `all` that `fw`'s export applies, in the given order.
pub fn applicable<'a>(fw: Framework, names: Names, all: &'a [String]) -> Vec<&'a String> {
    all.iter()
        .filter(|p| mechanism(fw, p, names).is_ok())
        .collect()
}

/// The mechanism of a start-point baseline (`baseline:NAME`), or why it is not exported.
pub fn baseline_mechanism(name: &str) -> Result<&'static str, &'static str> {
    Ok(match name {
        "ddp_default" => "DistributedDataParallel defaults (bucket_cap_mb=25, first bucket 1 MiB)",
        "ddp_tuned" => "DistributedDataParallel(bucket_cap_mb=...) (trainplan_patch.apply_plan)",
        "horovod_default" => "HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME at their defaults",
        "horovod_autotune" => {
            "HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME set to the tuned point (horovod.env)"
        }
        "byteps_default" => "BYTEPS_PARTITION_BYTES=4096000 (the default)",
        "byteps_tuned" => "BYTEPS_PARTITION_BYTES set to the tuned size (byteps.env)",
        "tf_default" => {
            "MirroredStrategy's default all-reduce (one pack), no XLA (trainplan_xla.compile_kwargs: jit_compile=False)"
        }
        "xla_default" => {
            "XLA clustering: model.compile(jit_compile=True) (trainplan_xla.compile_kwargs), TF_XLA_FLAGS=--tf_xla_auto_jit=2 (xla.env)"
        }
        "jax_default" => "XLA's all-reduce combiner at its default threshold",
        "jax_tuned" => "XLA_FLAGS=--xla_gpu_all_reduce_combine_threshold_bytes=... (jax.env)",
        "as_recorded" => "the traced run as it was recorded",
        "fsdp2_default" => {
            "fully_shard on every wrap unit, then the root: reshard_after_forward=True, implicit prefetch of one (trainplan_patch.apply_fsdp; torchtitan.toml)"
        }
        "zero2_default" => {
            "zero_optimization.stage = 2 with DeepSpeed's default bucket sizes (ds_config.json)"
        }
        "zero3_default" => {
            "zero_optimization.stage = 3 with DeepSpeed's default bucket and prefetch sizes (ds_config.json)"
        }
        "deepspeed_default" => {
            "DeepSpeed without ZeRO: gradients all-reduced after the backward (ds_config.json)"
        }
        "torchtitan_ddp" => {
            "torchtitan with data_parallel_replicate_degree = ranks, no sharding (torchtitan.toml)"
        }
        "megatron_default" => {
            "Megatron-LM's data parallelism: the gradient buffer all-reduced once after the backward, no --overlap-grad-reduce, no distributed optimizer (megatron_args.sh)"
        }
        "megatron_distopt" => {
            "--use-distributed-optimizer: gradients reduce-scattered after the backward, parameters all-gathered after the step (megatron_args.sh)"
        }
        "none" => return Err("one collective per tensor: a reference, not a framework setting"),
        _ => return Err("not a setting of this framework"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_framework_applies_accumulation_and_only_horovod_arbitrary_groups() {
        for fw in Framework::ALL {
            assert!(
                mechanism(fw, "grad-accumulation", Names::Zoo).is_ok(),
                "{fw}"
            );
            assert_eq!(
                mechanism(fw, "tensor-fusion", Names::Zoo).is_ok(),
                fw == Framework::Horovod,
                "{fw}"
            );
            assert!(mechanism(fw, "tensor-partition", Names::Zoo).is_err());
            assert!(mechanism(fw, "dgc", Names::Zoo).is_err());
            assert!(mechanism(fw, "my-pass-from-a-file", Names::Zoo).is_err());
        }
    }

    #[test]
    fn p3_is_ruled_out_on_sharded_jobs_only() {
        let (_, job) = crate::zoo::build::test_job("gpt", 8, "8xv100");
        assert!(!rules_out("p3", None, &job));
        assert!(!rules_out("tensor-fusion", None, &job));
        let cur = crate::passes::evaluate(job).unwrap();
        let all = crate::passes::registry();
        let shard = crate::passes::find(&all, "shard").unwrap();
        let knobs = crate::passes::resolve_knobs(shard, &[("stage".into(), "3".into())]).unwrap();
        let patches = crate::passes::propose(shard, &cur, &knobs).unwrap();
        let sharded = crate::passes::apply_all(&cur.job, &patches).unwrap();
        for fw in [None, Some(Framework::Pytorch), Some(Framework::Torchtitan)] {
            assert!(rules_out("p3", fw, &sharded), "{fw:?}");
        }
        assert!(!rules_out("tensor-fusion", None, &sharded));
    }

    #[test]
    fn op_fusion_only_for_pytorch_zoo_plans() {
        for fw in Framework::ALL {
            for names in [Names::Zoo, Names::Trace] {
                assert_eq!(
                    mechanism(fw, "op-fusion", names).is_ok(),
                    fw == Framework::Pytorch && names == Names::Zoo,
                    "{fw} {names:?}"
                );
            }
        }
        let all: Vec<String> = ["amp", "op-fusion", "recompute", "tensor-fusion"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            applicable(Framework::Pytorch, Names::Trace, &all),
            vec!["amp", "recompute"]
        );
        assert_eq!(
            applicable(Framework::Jax, Names::Zoo, &all),
            vec!["amp", "recompute"]
        );
    }
}
