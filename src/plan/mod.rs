//! The plan: what to change, why, and the predicted effect — the YAML file `trainplan plan`
//! writes and `trainplan export` reads (schema version [`SCHEMA_VERSION`]).
//!
//! ```yaml
//! trainplan: 1
//! workload: {source: zoo, ranks: 16, model: bert-base, batch: 32, cluster: dpro-16xv100-rdma, names: zoo}
//! predicted:
//!   baseline: {iteration_ms: 292.3, peak_memory_bytes: 5499729088, reserved_peak_bytes: 5729419264, device_used_bytes: 6124000000}
//!   planned: {iteration_ms: 120.1, peak_memory_bytes: 3850000000, reserved_peak_bytes: 4026531840, device_used_bytes: 4421000000}
//!   speedup: 2.43
//!   lower_bound_ms: 110.2
//! baselines: {none: 292.3, xla_default: 273.5, ...}
//! decisions:
//!   - pass: tensor-fusion
//!     tensors: [bert.encoder.layer.11.output.dense.weight, ...]
//!     why: "Theorem 2: ..."
//!     effect_ms: -1.2
//! config:            # the end state, for the emitters
//!   dtype: fp16
//!   tensor_groups: [[cls.predictions.bias, ...], ...]   # collectives in issue order
//!   partitions: {bert.embeddings.word_embeddings.weight: 4}
//!   fused_ops: [[layer1.0.conv1 FW, layer1.0.bn1 FW], ...]
//!   passes: [amp]
//!   grad_accumulation: 1
//!   recompute: []    # layers re-run in the backward
//! search: {strategy: critical-path, budget_s: 3600, replays: 1234, stop: converged, seed: 0}
//! ```
//!
//! Wall-clock time is deliberately not in the file (it is in `--json` and on stdout): the same
//! input and seed give a byte-identical plan. Maps are ordered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cost::config::Dtype;
use crate::cost::framework::Framework;
use crate::graph::job::Job;
use crate::search::{Advice, Decision, StopReason, Strategy};

pub mod emit;
pub mod svg;
pub mod validate;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// What was planned for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// `zoo` or `trace`.
    pub source: String,
    pub ranks: u32,
    pub model: String,
    /// Samples per GPU per iteration; `null` when the input does not say (a trace without
    /// shapes), never a made-up 0. (Plans written before issue 20 may say 0 for unknown: read
    /// it through [`Workload::batch`].)
    #[serde(default)]
    pub batch: Option<u32>,
    pub cluster: String,
    /// Whose names the plan uses: `zoo` (the zoo's PyTorch-style names) or `trace` (the
    /// trace's own operator and parameter names).
    pub names: String,
    /// The framework the plan is for: every counted decision is applied by its export
    /// (`plan --framework`; plans without the key were made for `pytorch`).
    #[serde(default)]
    pub framework: Framework,
}

impl Workload {
    /// The batch per GPU, when known (a 0 in an old plan is unknown).
    pub fn batch(&self) -> Option<u32> {
        self.batch.filter(|&b| b > 0)
    }
}

/// One predicted point.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    pub iteration_ms: f64,
    /// Peak allocated memory per GPU (`torch.cuda.max_memory_allocated`); `null` when the
    /// input does not model memory (a trace without memory events).
    pub peak_memory_bytes: Option<u64>,
    /// Peak of the allocator's reserved segments per GPU (absent in plans written before it).
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Device memory `nvidia-smi` would show: reserved + CUDA context + NCCL buffers.
    #[serde(default)]
    pub device_used_bytes: Option<u64>,
}

/// Predictions before and after.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicted {
    /// Which baseline `baseline` is: the framework's default (`ddp_default`, …,
    /// `as_recorded` for a trace), or `none` when the run stopped before it was evaluated.
    #[serde(default)]
    pub baseline_name: String,
    pub baseline: Point,
    pub planned: Point,
    pub speedup: f64,
    /// The planned job's iteration time if synchronisation cost nothing: what no further
    /// communication-side change (fusion, partition, scheduling, compression) can beat.
    /// `null` when an interrupt or the budget left no time to replay it.
    pub lower_bound_ms: Option<f64>,
    /// The GPU's memory and the budget the plan was held to (the GPU's memory unless
    /// `--memory-budget` asked for less), bytes; absent in plans written before them.
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    #[serde(default)]
    pub memory_budget_bytes: Option<u64>,
    /// The precision the baseline computes in (`fp32`, `tf32`, `fp16`, `bf16`): `fp32` for
    /// most frameworks' defaults, so a plan that turns AMP on counts AMP's gain against strict
    /// fp32. Empty in plans written before it was recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub baseline_precision: String,
    /// For a transformer planned from an fp32 baseline: the same framework default in half
    /// precision (bf16, else fp16 where the GPU has no bf16 peak) — what the plan gains besides
    /// mixed precision (issue 27).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_baseline: Option<HalfBaseline>,
    /// For a transformer from the zoo: the planned step's tokens per second per GPU (per-GPU
    /// batch × sequence length / planned iteration time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s_per_gpu: Option<f64>,
    /// For a transformer from the zoo: model FLOPs utilisation of the planned step — the model
    /// FLOPs by PaLM's count ([`crate::zoo::Model::matrix_flops`]: three times the forward's
    /// matrix products, attention in full, no recomputation) over the planned iteration time
    /// at the GPU's dense matrix peak in the planned compute dtype (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
}

/// The framework's default baseline in half precision (`plan` with `--precision` given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HalfBaseline {
    /// `bf16` or `fp16`: the `--precision` that gives this baseline.
    pub precision: String,
    pub iteration_ms: f64,
    /// This baseline's time over the planned time.
    pub speedup: f64,
}

/// The end state of the planned job, in the terms the framework emitters need.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalConfig {
    /// Compute dtype: fp32, or fp16/bf16 under AMP.
    pub dtype: String,
    /// Every collective in issue order, as the gradient tensors it carries.
    pub tensor_groups: Vec<Vec<String>>,
    /// Partition number of each partitioned group, keyed by the group's first tensor.
    #[serde(default)]
    pub partitions: BTreeMap<String, u32>,
    /// Bytes of each gradient tensor (what the emitters size fusion buffers and DDP buckets
    /// with). Optional: a hand-written plan without it still reads, and emitters then say what
    /// they could not size.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tensor_bytes: BTreeMap<String, u64>,
    /// Ops fused into one kernel, as `layer PHASE` names (by the search or by a baseline it
    /// started from).
    #[serde(default)]
    pub fused_ops: Vec<Vec<String>>,
    /// On/off passes applied (amp, fused-adam, …).
    #[serde(default)]
    pub passes: Vec<String>,
    /// Micro-batches per iteration (1: no accumulation).
    pub grad_accumulation: u32,
    /// Layers whose forward is re-run in the backward (activation recomputation), forward
    /// order; empty when none.
    #[serde(default)]
    pub recompute: Vec<String>,
    /// Sharded data parallelism (the `shard` pass or a sharded baseline); absent: every rank
    /// holds whole weights, gradients and optimizer state. `tensor_groups` then lists the
    /// gradient collectives (reduce-scatters from stage 2), not the parameter all-gathers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<ShardConfig>,
    /// Megatron tensor parallelism (the `tensor-parallel` pass); absent: degree 1. With it the
    /// data-parallel ranks (the gradient collectives' and `sharding`'s) are `ranks / degree`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<TensorParallelConfig>,
    /// Context parallelism (the `context-parallel` pass); absent: degree 1. Its groups sit next
    /// to the tensor-parallel ranks; gradients (and `sharding`) run over the context- and
    /// data-parallel ranks together, `ranks / tensor-parallel degree / stages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_parallel: Option<ContextParallelConfig>,
    /// Pipeline parallelism (the `pipeline` pass); absent: one stage. With it the
    /// data-parallel ranks are `ranks / (tensor-parallel degree × stages)`, and
    /// `grad_accumulation` is 1 (the pipeline's micro-batches are its accumulation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineConfig>,
}

/// What the Megatron-LM export applies for pipeline parallelism
/// (`--pipeline-model-parallel-size`, `--num-layers-per-virtual-pipeline-stage`, the
/// micro-batch size); the other exports refuse a plan with it, naming `config.pipeline`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Ranks along the pipeline (the outermost dimension: stage `s` holds ranks
    /// `s × ranks / stages ..`).
    pub stages: u32,
    /// Micro-batches per iteration, each through every stage.
    pub microbatches: u32,
    /// `1f1b`, `gpipe` or `interleaved`.
    pub schedule: String,
    /// Model chunks per rank: 1, or more with `interleaved`.
    #[serde(rename = "virtual")]
    pub chunks_per_rank: u32,
    /// Transformer layers the stages cut (`stages × virtual` chunks of equal layers, or the
    /// lighter ends below; the embedding rides with the first, the head and loss with the last).
    pub layers: u32,
    /// Layers of the first / last stage where it is one lighter than the others (the stages do
    /// not divide the layers: [`crate::graph::pipeline::split`]); absent: as the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage_layers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage_layers: Option<u32>,
    /// The global batch is kept: a replica of `stages` ranks trains `stages` × what one
    /// rank's share would be (`batch=global`); false: `batch=replica`.
    pub global_batch: bool,
}

impl PipelineConfig {
    /// Samples one data-parallel replica (all stages) trains per iteration, from what one
    /// stage's ranks would train without the pipeline (`per_stage`).
    pub fn replica_batch(&self, per_stage: u32) -> u32 {
        if self.global_batch {
            per_stage.saturating_mul(self.stages)
        } else {
            per_stage
        }
    }
}

/// Samples one data-parallel replica trains per iteration: the per-GPU `batch` times the
/// tensor- and context-parallel degrees and the pipeline's stages where they keep the global
/// batch.
pub fn replica_batch(c: &FinalConfig, batch: u32) -> u32 {
    let b = c
        .tensor_parallel
        .as_ref()
        .map_or(batch, |tp| tp.replica_batch(batch));
    let b = c
        .context_parallel
        .as_ref()
        .map_or(b, |cp| cp.replica_batch(b));
    c.pipeline.as_ref().map_or(b, |pp| pp.replica_batch(b))
}

/// The context-parallel degree of `c` (1 without).
pub fn cp_degree(c: &FinalConfig) -> u32 {
    c.context_parallel.as_ref().map_or(1, |cp| cp.degree.max(1))
}

/// What the Megatron-LM (`--context-parallel-size`) and torchtitan
/// (`parallelism.context_parallel_degree`) exports apply for context parallelism; the other
/// exports refuse a plan with it, naming `config.context_parallel`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextParallelConfig {
    /// Ranks per context-parallel group (each holds 1/degree of every sequence).
    pub degree: u32,
    /// The global batch is kept: each group of `degree` ranks trains `degree` x what a rank
    /// would (`batch=global`); false: `batch=replica`.
    pub global_batch: bool,
}

impl ContextParallelConfig {
    /// Samples one context-parallel group trains per iteration, from what one of its ranks
    /// would train without it (`per_rank`).
    pub fn replica_batch(&self, per_rank: u32) -> u32 {
        if self.global_batch {
            per_rank.saturating_mul(self.degree)
        } else {
            per_rank
        }
    }
}

/// What the torchtitan export applies for tensor parallelism (`parallelism.tensor_parallel_degree`;
/// the other exports refuse a plan with it, naming `config.tensor_parallel`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorParallelConfig {
    /// Ranks per tensor-parallel group (consecutive ranks of one node).
    pub degree: u32,
    /// Sequence parallelism: norms, dropout and residuals split over the sequence.
    pub sequence: bool,
    /// The global batch is kept: each group of `degree` ranks trains `degree` x the per-GPU
    /// batch (`workload.batch`); false: each group trains the per-GPU batch (`batch=replica`).
    pub global_batch: bool,
}

impl TensorParallelConfig {
    /// Samples one data-parallel replica (a tensor-parallel group) trains per iteration, from
    /// the per-GPU batch of the plan's workload.
    pub fn replica_batch(&self, per_gpu: u32) -> u32 {
        if self.global_batch {
            per_gpu.saturating_mul(self.degree)
        } else {
            per_gpu
        }
    }
}

/// What the FSDP2 (`pytorch`), DeepSpeed and torchtitan exports apply for sharding.
///
/// | field | FSDP2 | DeepSpeed | torchtitan |
/// |---|---|---|---|
/// | `stage` | 3 (`fully_shard`) | `zero_optimization.stage` | 3 (FSDP2) |
/// | `shard_size`, `replicas` | HSDP mesh `(replicas, shard_size)` | MiCS `mics_shard_size` | `data_parallel_shard_degree`, `data_parallel_replicate_degree` |
/// | `reshard` | `reshard_after_forward` | — (stage 3 always re-gathers) | `fsdp_reshard_after_forward` |
/// | `prefetch` | `set_modules_to_forward_prefetch` / `..._backward_prefetch` | `stage3_prefetch_bucket_size` (units' bytes) | — (FSDP2's implicit prefetch of one) |
/// | `units` | one `fully_shard` per unit, then the root | — (DeepSpeed gathers per module) | per transformer block (torchtitan's own policy) |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// 1: optimizer state sharded; 2: and gradients (reduce-scatter); 3: and parameters
    /// (gathered per unit). FSDP's FULL_SHARD is 3 with `reshard`, SHARD_GRAD_OP 3 without.
    pub stage: u32,
    /// Ranks in one shard group (`workload.ranks / replicas`).
    pub shard_size: u32,
    /// Shard groups holding replicas of each other (HSDP); 1: one group of every rank.
    pub replicas: u32,
    /// Stage 3: a unit's gathered parameters are freed after its forward and gathered again
    /// for its backward (`reshard_after_forward`).
    pub reshard: bool,
    /// Stage 3: units gathered ahead of the one computing.
    pub prefetch: u32,
    /// Optimizer state and step on the CPU.
    pub offload: bool,
    /// Wrap units (module paths) in forward order; `""` is the root unit (the whole model,
    /// wrapped last: embeddings, final norm and head).
    pub units: Vec<String>,
    /// Bytes of each unit's parameters (as the plan's dtype holds them), in `units` order.
    pub unit_bytes: Vec<u64>,
}

/// Search statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchStats {
    pub strategy: Strategy,
    pub budget_s: f64,
    pub replays: u64,
    pub rounds: usize,
    pub stop: StopReason,
    pub seed: u64,
}

/// A plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Schema version (the key doubles as the file's signature).
    pub trainplan: u32,
    pub workload: Workload,
    pub predicted: Predicted,
    /// What each framework default would take, ms.
    pub baselines: BTreeMap<String, f64>,
    pub decisions: Vec<Decision>,
    /// Moves the framework's export cannot apply, with their predicted effect on the planned
    /// job: not counted in `predicted.planned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<Advice>,
    pub config: FinalConfig,
    pub search: SearchStats,
}

/// Errors reading a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "{file}: schema version {found}; this trainplan reads version {SCHEMA_VERSION} (re-run `trainplan plan` with this version)"
    )]
    Version { file: String, found: u64 },
    #[error("{file}: not a trainplan plan (no `trainplan:` version key at the top)")]
    NotAPlan { file: String },
    #[error(transparent)]
    Yaml(#[from] crate::cost::config::ConfigError),
    /// A value out of the planner's ranges ([`Plan::check`]), with its field.
    #[error("{file}: {source}")]
    Invalid {
        file: String,
        source: validate::Invalid,
    },
}

/// Round a time in ms for the file, so output is stable and readable: to the µs from 1 ms up,
/// to 4 significant digits below (a 30.45 µs step stays 0.03045, not 0.03; issue 20, class 8).
pub fn round_ms(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 || x.abs() >= 1.0 {
        return (x * 1e3).round() / 1e3;
    }
    let decimals = 3 - x.abs().log10().floor() as i32;
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Fp64 => "fp64",
        Dtype::Fp32 | Dtype::Tf32 => "fp32",
        Dtype::Fp16 => "fp16",
        Dtype::Bf16 => "bf16",
        Dtype::Fp8 => "fp8",
    }
}

impl FinalConfig {
    /// Micro-steps per iteration: the pipeline's micro-batches, or accumulation's k (a
    /// pipeline's micro-batches are its accumulation: k is 1 beside it).
    pub fn micro_steps(&self) -> u32 {
        self.pipeline
            .as_ref()
            .map_or(self.grad_accumulation, |p| p.microbatches)
            .max(1)
    }

    /// The end state of `job` after `decisions`.
    pub fn of(job: &Job, decisions: &[Decision]) -> FinalConfig {
        let name = |t: u32| job.local.tensors[t as usize].name.clone();
        let mut partitions = BTreeMap::new();
        // Gradient collectives only: a sharded job's parameter all-gathers and HSDP's
        // all-reduce of each reduce-scattered shard across the replicas carry the same tensors
        // again (the export derives both from `sharding`).
        // One micro-step's collectives: with gradient accumulation reduce-scattering every
        // micro-step, each micro-step repeats the same groups (the first copy is kept).
        let mut seen = std::collections::BTreeSet::new();
        let tensor_groups = job
            .syncs
            .iter()
            .filter(|s| {
                s.kind != crate::graph::comm::CollectiveKind::AllGather && s.group.stride <= 1
            })
            .filter(|s| {
                let fresh = s.tensors.iter().any(|t| !seen.contains(t));
                seen.extend(s.tensors.iter().copied());
                fresh
            })
            .map(|s| {
                let names: Vec<String> = s.tensors.iter().map(|&t| name(t)).collect();
                if let Some(first) = names.first().filter(|_| s.partitions > 1) {
                    partitions.insert(first.clone(), s.partitions);
                }
                names
            })
            .collect();
        let tensor_bytes = job
            .local
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.bytes))
            .collect();
        let mut passes = Vec::new();
        // Op fusion's clusters (compute kernels of the forward or backward), not fused-adam's
        // merged optimizer updates, which no compiler region stands for.
        let fused_ops: Vec<Vec<String>> = job
            .local
            .fused
            .values()
            .filter(|m| !m.iter().any(|x| x.ends_with(" UPDATE")))
            .cloned()
            .collect();
        let (mut k, mut recompute) = (1, Vec::<String>::new());
        let mut sharding = None;
        let mut tensor_parallel = None;
        let mut context_parallel = None;
        let mut pipeline = None;
        for d in decisions {
            match d.pass.as_str() {
                "op-fusion" | "tensor-fusion" | "tensor-partition" => {}
                "tensor-parallel" => {
                    let knob = |k: &str| d.knobs.get(k).map(|v| v.trim());
                    let degree = knob("degree").and_then(|v| v.parse().ok()).unwrap_or(2);
                    tensor_parallel = (degree > 1).then(|| TensorParallelConfig {
                        degree,
                        sequence: knob("sequence") == Some("1"),
                        global_batch: knob("batch") != Some("replica"),
                    });
                }
                "context-parallel" => {
                    let knob = |k: &str| d.knobs.get(k).map(|v| v.trim());
                    let degree = knob("degree").and_then(|v| v.parse().ok()).unwrap_or(2);
                    context_parallel = (degree > 1).then(|| ContextParallelConfig {
                        degree,
                        global_batch: knob("batch") != Some("replica"),
                    });
                }
                "shard" => sharding = Some(ShardConfig::of(job, &d.knobs)),
                "pipeline" => {
                    pipeline = job.meta.pipeline.map(|p| {
                        let cut = crate::graph::pipeline::stages(job, p.chunks()).ok();
                        let sizes = cut.as_ref().map(|c| c.sizes.clone()).unwrap_or_default();
                        let most = sizes.iter().copied().max().unwrap_or(0);
                        let lighter = |n: Option<&u32>| n.copied().filter(|&n| n < most);
                        PipelineConfig {
                            stages: p.stages,
                            microbatches: p.microbatches,
                            schedule: p.schedule.name().to_string(),
                            chunks_per_rank: p.chunks_per_rank.max(1),
                            layers: cut.as_ref().map_or(0, |c| c.blocks),
                            first_stage_layers: lighter(sizes.first()),
                            last_stage_layers: lighter(sizes.last()),
                            global_batch: d.knobs.get("batch").map(|v| v.trim()) != Some("replica"),
                        }
                    });
                }
                b if b.starts_with("baseline:") => {
                    if d.knobs.contains_key("stage") {
                        sharding = Some(ShardConfig::of(job, &d.knobs));
                    }
                }
                "recompute" => {
                    for op in &d.ops {
                        let layer = op.strip_suffix(" FW").unwrap_or(op).to_string();
                        if !recompute.contains(&layer) {
                            recompute.push(layer);
                        }
                    }
                }
                "grad-accumulation" => {
                    k = d.knobs.get("k").and_then(|v| v.parse().ok()).unwrap_or(2);
                }
                other => passes.push(other.to_string()),
            }
        }
        passes.sort();
        passes.dedup();
        // A traced FSDP2 run keeps its sharding unless a decision changed it: the export must
        // not wrap it in DDP.
        if sharding.is_none() && recorded_sharding(job).is_some() {
            sharding = Some(ShardConfig::of(job, &BTreeMap::new()));
        }
        FinalConfig {
            dtype: dtype_name(job.dtype).to_string(),
            tensor_groups,
            partitions,
            tensor_bytes,
            fused_ops,
            passes,
            grad_accumulation: k,
            recompute,
            sharding,
            tensor_parallel,
            context_parallel,
            pipeline,
        }
    }
}

/// The sharding a traced job recorded (FSDP2's units), if any.
fn recorded_sharding(job: &Job) -> Option<&crate::graph::job::TraceSharding> {
    job.meta.trace.as_ref().and_then(|f| f.sharding.as_ref())
}

impl ShardConfig {
    /// The sharding a `shard` decision (or a sharded baseline) with `knobs` gives `job`: its
    /// knobs, at their defaults where absent, and the job's wrap units.
    pub fn of(job: &Job, knobs: &BTreeMap<String, String>) -> ShardConfig {
        let int = |k: &str, d: u32| {
            knobs
                .get(k)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(d)
        };
        let replicas = int("replicas", 1).max(1);
        if let Some(rec) = recorded_sharding(job) {
            // A recorded FSDP2 step: its own units and the recorded world; FSDP2 spells
            // SHARD_GRAD_OP (stage 2) as stage 3 without resharding.
            let ranks = job
                .meta
                .trace
                .as_ref()
                .and_then(|f| f.world_size)
                .unwrap_or(job.workers)
                .max(1);
            return ShardConfig {
                stage: 3,
                shard_size: ranks / replicas,
                replicas,
                reshard: int("stage", 3) == 3 && int("reshard", 1) == 1,
                // FSDP2's implicit prefetch, as the traced run did, unless the decision
                // issues the all-gathers further ahead (explicit lists of that many units).
                prefetch: Some(int("prefetch", 1)).filter(|&p| p >= 2).unwrap_or(0),
                offload: false,
                units: rec.units.clone(),
                unit_bytes: rec.unit_bytes.clone(),
            };
        }
        let pattern = knobs
            .get("units")
            .map_or(crate::passes::shard::AUTO, |v| v.trim());
        let units = crate::passes::shard::units_of(job, pattern);
        ShardConfig {
            stage: int("stage", 3),
            // With tensor parallelism or a pipeline the shard groups are over the
            // data-parallel ranks (a stage's replicas).
            shard_size: job.workers
                / job.meta.tp.max(1)
                / job.meta.pipeline.map_or(1, |p| p.stages.max(1))
                / replicas,
            replicas,
            reshard: int("reshard", 1) == 1,
            prefetch: int("prefetch", 1),
            offload: int("offload", 0) == 1,
            units: units.iter().map(|u| u.name.clone()).collect(),
            unit_bytes: units.iter().map(|u| u.bytes).collect(),
        }
    }
}

impl Plan {
    /// The plan as YAML.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("a plan always serialises")
    }

    /// Read a plan, refusing other schema versions with a clear message, and values out of the
    /// planner's ranges naming the field ([`Plan::check`]).
    pub fn from_yaml(text: &str, file: &str) -> Result<Plan, PlanError> {
        #[derive(Deserialize)]
        struct Head {
            trainplan: Option<u64>,
        }
        let head: Result<Head, _> =
            crate::cost::config::parse_yaml_as::<Head>(text, file, crate::limits::InputKind::Plan);
        match head {
            Ok(Head { trainplan: None }) => {
                return Err(PlanError::NotAPlan {
                    file: file.to_string(),
                });
            }
            Ok(Head { trainplan: Some(v) }) if v != SCHEMA_VERSION as u64 => {
                return Err(PlanError::Version {
                    file: file.to_string(),
                    found: v,
                });
            }
            _ => {}
        }
        let plan: Plan =
            crate::cost::config::parse_yaml_as(text, file, crate::limits::InputKind::Plan)?;
        plan.check().map_err(|source| PlanError::Invalid {
            file: file.to_string(),
            source,
        })?;
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A traced FSDP2 job's sharding: the recorded units and world; FSDP2's implicit prefetch
    /// (0) for the recorded schedule (`prefetch` 1 or absent), the decision's explicit one for
    /// `prefetch=2` or more; `reshard=0` or `stage=2` keep the units gathered.
    #[test]
    fn a_traced_fsdp2_job_keeps_its_units_and_takes_the_decided_prefetch() {
        let job = crate::passes::testkit::fsdp2_rank0();
        let knobs = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let plain = ShardConfig::of(&job, &knobs(&[]));
        assert_eq!(plain.units, ["", "transformer.h.0", "transformer.h.1"]);
        assert_eq!(
            (plain.shard_size, plain.prefetch, plain.reshard),
            (2, 0, true)
        );
        assert_eq!(
            ShardConfig::of(&job, &knobs(&[("prefetch", "1")])).prefetch,
            0
        );
        let ahead = ShardConfig::of(&job, &knobs(&[("prefetch", "2"), ("reshard", "0")]));
        assert_eq!((ahead.prefetch, ahead.reshard), (2, false));
        assert!(!ShardConfig::of(&job, &knobs(&[("stage", "2")])).reshard);
    }

    #[test]
    fn times_keep_4_significant_digits_below_a_millisecond() {
        assert_eq!(round_ms(112.3456), 112.346);
        assert_eq!(round_ms(1.23456), 1.235);
        assert_eq!(round_ms(0.0304567), 0.03046);
        assert_eq!(round_ms(-0.000123456), -0.0001235);
        assert_eq!(round_ms(0.0), 0.0);
    }

    #[test]
    fn a_plan_round_trips_byte_for_byte() {
        let plan = emit::tests::tiny_plan();
        let text = plan.to_yaml();
        let back = Plan::from_yaml(&text, "p.yaml").unwrap();
        assert_eq!(back, plan);
        assert_eq!(back.to_yaml(), text);
        assert!(text.contains("tensor_bytes:"), "{text}");
        // A plan without tensor_bytes (hand-written, or older) reads and writes without it.
        let mut bare = plan.clone();
        bare.config.tensor_bytes.clear();
        let t = bare.to_yaml();
        assert!(!t.contains("tensor_bytes"));
        assert_eq!(Plan::from_yaml(&t, "p.yaml").unwrap().to_yaml(), t);
    }

    /// With accumulation reduce-scattering every micro-step, each micro-step repeats the same
    /// gradient collectives: the plan lists one micro-step's groups, each tensor once (a
    /// torchtitan plan once failed its own check: "tensor ... is in two collectives").
    #[test]
    fn tensor_groups_list_one_micro_steps_collectives() {
        use crate::passes::shard::{Sharding, shard};
        let (_, job) = crate::zoo::build::test_job("gpt", 4, "8xv100");
        let sharded = shard(
            &job,
            Sharding {
                stage: 2,
                replicas: 1,
                reshard: true,
                prefetch: 1,
                offload: false,
            },
        )
        .unwrap();
        let once = FinalConfig::of(&sharded, &[]).tensor_groups;
        let acc = crate::passes::grad_accumulation::accumulate(&sharded, 4);
        assert!(acc.syncs.len() > sharded.syncs.len());
        let groups = FinalConfig::of(&acc, &[]).tensor_groups;
        assert_eq!(groups, once);
        let mut all: Vec<&String> = groups.iter().flatten().collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "each tensor once");
    }

    #[test]
    fn other_versions_and_non_plans_are_refused_clearly() {
        let text = emit::tests::tiny_plan()
            .to_yaml()
            .replacen("trainplan: 1", "trainplan: 2", 1);
        let e = Plan::from_yaml(&text, "p.yaml").unwrap_err().to_string();
        assert_eq!(
            e,
            "p.yaml: schema version 2; this trainplan reads version 1 (re-run `trainplan plan` with this version)"
        );
        let e = Plan::from_yaml("a: 1\n", "x.yaml").unwrap_err().to_string();
        assert!(e.contains("x.yaml: not a trainplan plan"), "{e}");
    }
}
