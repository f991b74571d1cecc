//! The layout search (issue 24): the tensor-parallel layouts the memory step tries beside its
//! shardings, recomputation and accumulation, and the ranked table of every option it tried
//! (`plan --top K`, `top_layouts` in `--json`).
//!
//! A layout is a memory move: a job that fits as it is keeps data parallelism (tensor
//! parallelism only adds communication to a job with room), and one that does not meets each
//! tensor-parallel degree the pass takes, with and without each sharding the framework's export
//! applies, before recomputation and accumulation (see `memory_options` in the parent module).
//! Where the export runs a pipeline (`--framework megatron`, `torchtitan`, or `pytorch` for a
//! Llama-style model: [`framework::native_layout`]), each
//! tensor-parallel degree also meets each pipeline depth ([`pp_layouts`]), beside each sharding
//! the export runs with one ([`beside_pipeline`]: Megatron-LM's DDP and distributed optimizer,
//! torchtitan's and PyTorch's FSDP2 without resharding) and with and without recomputation, in 1F1B; the
//! fastest pipelined option that fits is then tried interleaved ([`interleaved`]). Context
//! parallelism is the last resort: where no option without it fits (a long sequence whose one
//! sample per group is too much), each degree the pass takes ([`cp_layouts`]) meets each
//! tensor-parallel degree and sharding, with the most accumulation steps (one sample per
//! group per micro-step) or a pipeline, with and without recomputation.

use super::{Evaluated, Framework, KnobbedPass, budget_peak, framework};
use crate::graph::job::Job;

/// The tensor-parallel layouts the memory step tries on `cur`: each degree the pass takes
/// ([`crate::passes::tensor_parallel::degrees`]), with sequence parallelism (its activations
/// are 1/degree where plain tensor parallelism keeps norms, dropout and residuals whole, at the
/// same communication volume: Korthikanti et al. 2022) and the global batch kept.
pub(super) fn tp_layouts(cur: &Evaluated) -> Vec<KnobbedPass> {
    crate::passes::tensor_parallel::degrees(&cur.job)
        .into_iter()
        .map(|t| {
            (
                "tensor-parallel".to_string(),
                vec![
                    ("degree".to_string(), t.to_string()),
                    ("sequence".to_string(), "1".to_string()),
                ],
            )
        })
        .collect()
}

/// Whether `fw`'s export applies the tensor parallelism of `head` (none: yes) with the
/// sharding that follows it in `head` ([`framework::tp_supported`]), and its pipeline's
/// schedule ([`framework::pipeline_supported`]).
pub(super) fn layout_exported(head: &[KnobbedPass], job: &Job, fw: Option<Framework>) -> bool {
    let Some(fw) = fw else { return true };
    let workers = job.workers;
    if (knob_of(head, "tensor-parallel", "degree").is_some()
        || knob_of(head, "pipeline", "stages").is_some())
        && !laid_out(job, Some(fw))
    {
        return false;
    }
    if let Some(s) = text_knob(head, "pipeline", "schedule")
        && framework::pipeline_supported(fw, s).is_err()
    {
        return false;
    }
    let fsdp = knob_of(head, "shard", "stage") == Some(3);
    if knob_of(head, "context-parallel", "degree").is_some()
        && framework::cp_supported(fw, fsdp).is_err()
    {
        return false;
    }
    let Some(t) = knob_of(head, "tensor-parallel", "degree") else {
        return true;
    };
    framework::tp_supported(fw, true, workers / t.max(1), fsdp).is_ok()
}

/// Whether `fw`'s export lays `job`'s model out over tensor or pipeline parallelism at all
/// ([`framework::native_layout`]: the PyTorch-native export splits Llama-style models only).
fn laid_out(job: &Job, fw: Option<Framework>) -> bool {
    fw.is_none_or(|fw| {
        framework::native_layout(fw, job.local.tensors.iter().map(|t| t.name.as_str())).is_ok()
    })
}

/// `head` as a pipeline runs after it in `fw`'s export, or None where it cannot:
/// torch.distributed.pipelining's schedules call `backward` on the loss themselves, so the
/// PyTorch export runs no loss scaling under a pipeline: its AMP there is bf16 (the head's AMP
/// step set to it), and a job already in fp16, or on a GPU without bf16, gets no pipeline.
pub(super) fn pipeline_head(
    head: &[KnobbedPass],
    job: &Job,
    fw: Option<Framework>,
) -> Option<Vec<KnobbedPass>> {
    use crate::cost::config::Dtype;
    if fw != Some(Framework::Pytorch) {
        return Some(head.to_vec());
    }
    let bf16 = job.gpu.matrix_tflops.contains_key(&Dtype::Bf16);
    if job.dtype == Dtype::Fp16 {
        return None;
    }
    let mut out = head.to_vec();
    for (name, knobs) in &mut out {
        if name == "amp" {
            if !bf16 {
                return None;
            }
            knobs.retain(|(k, _)| k != "dtype");
            knobs.push(("dtype".into(), "bf16".into()));
        }
    }
    Some(out)
}

/// Whether the memory step tries pipelines after `head`: its sharding is one a pipeline runs
/// beside in `fw`'s export ([`framework::pipeline_beside`]).
pub(super) fn beside_pipeline(head: &[KnobbedPass], fw: Option<Framework>) -> bool {
    framework::pipeline_beside(
        fw,
        knob_of(head, "shard", "stage"),
        knob_of(head, "shard", "reshard") == Some(1),
    )
    .is_ok()
}

/// The context-parallel layouts the memory step tries after a tensor-parallel degree of `tp`
/// (1: none) on `cur`: each degree the pass takes there
/// ([`crate::passes::context_parallel::degrees_after_tp`]), the global batch kept. None where
/// `fw`'s export has no context parallelism.
pub(super) fn cp_layouts(cur: &Evaluated, tp: u32, fw: Option<Framework>) -> Vec<KnobbedPass> {
    if fw.is_some_and(|fw| framework::cp_supported(fw, true).is_err()) {
        return Vec::new();
    }
    crate::passes::context_parallel::degrees_after_tp(&cur.job, tp)
        .into_iter()
        .map(|c| {
            (
                "context-parallel".to_string(),
                vec![("degree".to_string(), c.to_string())],
            )
        })
        .collect()
}

/// Largest pipeline depth the layout search tries (Llama 3 405B's published layout is 16
/// stages; deeper pipelines multiply the micro-steps each option replays).
pub const MAX_STAGES: u32 = 32;

/// The pipelines the memory step tries after a tensor-parallel degree of `tp` (1: none) on
/// `cur`: 1F1B at each depth `p` ≥ 2 that cuts the model's blocks (equally, or with the ends
/// one block lighter: [`crate::graph::pipeline::split`]) and, times `tp`, divides the workers
/// (at most [`MAX_STAGES`]), the global batch kept, with the most micro-batches up to
/// 8 p that divide the replica's batch (micro-batches of fewer samples hold less in flight;
/// at 8 p the bubble is under 1/8 of the step) and at least `p` of them. None for a job that
/// is not a transformer from the zoo, or where `fw`'s export runs no pipeline.
pub(super) fn pp_layouts(cur: &Evaluated, tp: u32, fw: Option<Framework>) -> Vec<KnobbedPass> {
    if fw.is_some_and(|fw| framework::pipeline_supported(fw, "1f1b").is_err())
        || cur.job.is_recorded()
        || !laid_out(&cur.job, fw)
    {
        return Vec::new();
    }
    let Ok(cut) = crate::graph::pipeline::stages(&cur.job, 1) else {
        return Vec::new();
    };
    let tp = tp.max(1);
    (2..=cut.blocks.min(MAX_STAGES))
        .filter(|&p| crate::graph::pipeline::split(cut.blocks, p).is_some())
        .filter(|&p| {
            tp.checked_mul(p)
                .is_some_and(|tp_p| cur.job.workers.is_multiple_of(tp_p))
        })
        .filter_map(|p| {
            let replica = cur.job.meta.batch.saturating_mul(tp).saturating_mul(p);
            let m = (p..=replica.min(8 * p))
                .rev()
                .find(|&m| replica.is_multiple_of(m))?;
            Some((
                "pipeline".to_string(),
                vec![
                    ("stages".to_string(), p.to_string()),
                    ("microbatches".to_string(), m.to_string()),
                    ("schedule".to_string(), "1f1b".to_string()),
                ],
            ))
        })
        .collect()
}

/// `steps` with its 1F1B pipeline interleaved over two model chunks per rank, where the
/// blocks split into `2 p` chunks, the micro-batches are a multiple of `p` and `fw`'s export
/// runs the schedule; None otherwise.
pub(super) fn interleaved(
    steps: &[KnobbedPass],
    cur: &Evaluated,
    fw: Option<Framework>,
) -> Option<Vec<KnobbedPass>> {
    let p = knob_of(steps, "pipeline", "stages")?;
    let m = knob_of(steps, "pipeline", "microbatches")?;
    if text_knob(steps, "pipeline", "schedule") != Some("1f1b")
        || fw.is_some_and(|fw| framework::pipeline_supported(fw, "interleaved").is_err())
        || !laid_out(&cur.job, fw)
        || !m.is_multiple_of(p)
    {
        return None;
    }
    let blocks = crate::graph::pipeline::stages(&cur.job, 1).ok()?.blocks;
    if !blocks.is_multiple_of(2 * p) {
        return None;
    }
    Some(
        steps
            .iter()
            .map(|(n, ks)| {
                if n != "pipeline" {
                    return (n.clone(), ks.clone());
                }
                let mut ks: Vec<(String, String)> = ks
                    .iter()
                    .filter(|(k, _)| k != "schedule")
                    .cloned()
                    .collect();
                ks.push(("schedule".into(), "interleaved".into()));
                ks.push(("virtual".into(), "2".into()));
                (n.clone(), ks)
            })
            .collect(),
    )
}

/// The text knob `k` of the step `pass` in `steps`, if there is one.
fn text_knob<'a>(steps: &'a [KnobbedPass], pass: &str, k: &str) -> Option<&'a str> {
    steps
        .iter()
        .filter(|(n, _)| n == pass)
        .flat_map(|(_, ks)| ks.iter())
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

/// The integer knob `k` of the step `pass` in `steps`, if there is one.
pub(super) fn knob_of(steps: &[KnobbedPass], pass: &str, k: &str) -> Option<u32> {
    text_knob(steps, pass, k).and_then(|v| v.parse().ok())
}

/// One option the memory step tried, as the layout table shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LayoutRow {
    /// The option's passes with every knob (`tensor-parallel:degree=8,sequence=1 + shard:stage=3,reshard=1`),
    /// `as is` for the job unchanged.
    pub passes: String,
    /// Ranks per tensor-parallel group.
    pub tp: u32,
    /// Ranks per context-parallel group.
    pub cp: u32,
    /// Pipeline stages (1: none).
    pub pp: u32,
    /// Model chunks per pipeline rank (interleaved: more than 1).
    pub virtual_stages: u32,
    /// The pipeline's schedule (`1f1b`, `interleaved`, `gpipe`), None without one.
    pub schedule: Option<String>,
    /// Ranks per shard group (1: unsharded).
    pub dp_shard: u32,
    /// Data-parallel groups holding replicas of each other.
    pub dp_replicate: u32,
    /// The sharding stage (0: none).
    pub shard_stage: u32,
    /// Samples per micro-step of one data-parallel replica.
    pub micro_batch: u32,
    /// Micro-steps per iteration (accumulation's k, or the pipeline's micro-batches).
    pub accumulation: u32,
    pub recompute: bool,
    pub iteration_ns: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub device_used_bytes: u64,
    /// Within the memory budget (and the GPU).
    pub fits: bool,
    /// The GPU's dense matrix peak in the option's precision, FLOP/ns (for its MFU).
    #[serde(skip)]
    pub peak_flops_per_ns: f64,
}

/// `pass:k=v,k=v + ...`, every knob shown (the plan's labels show the first only).
fn full_label(steps: &[KnobbedPass]) -> String {
    if steps.is_empty() {
        return "as is".into();
    }
    steps
        .iter()
        .map(|(n, ks)| {
            if ks.is_empty() {
                n.clone()
            } else {
                let kv: Vec<String> = ks.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{n}:{}", kv.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The row of option `steps`, evaluated as `e`, tried from a job of `workers` ranks and
/// `batch` samples per GPU, against `budget`.
pub(super) fn row(
    steps: &[KnobbedPass],
    e: &Evaluated,
    workers: u32,
    batch: u32,
    budget: u64,
) -> LayoutRow {
    let tp = knob_of(steps, "tensor-parallel", "degree")
        .unwrap_or(1)
        .max(1);
    let pp = knob_of(steps, "pipeline", "stages").unwrap_or(1).max(1);
    let cp = knob_of(steps, "context-parallel", "degree")
        .unwrap_or(1)
        .max(1);
    let dp = (workers / tp / pp / cp).max(1);
    let stage = knob_of(steps, "shard", "stage").unwrap_or(0);
    let (dp_shard, dp_replicate) = if stage > 0 {
        let replicas = knob_of(steps, "shard", "replicas").unwrap_or(1).max(1);
        ((dp / replicas).max(1), replicas)
    } else {
        (1, dp)
    };
    let k = knob_of(steps, "grad-accumulation", "k")
        .or_else(|| knob_of(steps, "pipeline", "microbatches"))
        .unwrap_or(1)
        .max(1);
    let schedule = text_knob(steps, "pipeline", "schedule").map(str::to_string);
    let p = &e.memory.peaks;
    LayoutRow {
        passes: full_label(steps),
        tp,
        cp,
        pp,
        virtual_stages: knob_of(steps, "pipeline", "virtual").unwrap_or(1).max(1),
        schedule,
        dp_shard,
        dp_replicate,
        shard_stage: stage,
        micro_batch: batch
            .saturating_mul(tp)
            .saturating_mul(cp)
            .saturating_mul(pp)
            / k,
        accumulation: k,
        recompute: steps.iter().any(|(n, _)| n == "recompute"),
        iteration_ns: e.iteration_ns(),
        allocated_bytes: p.allocated,
        reserved_bytes: p.reserved,
        device_used_bytes: p.device_used,
        fits: budget_peak(e, budget) <= budget,
        peak_flops_per_ns: e.job.matrix_peak_flops_per_ns(),
    }
}

/// `rows` ranked: those that fit first, fastest first; then the rest, smallest device memory
/// first; ties by label, so the table is the same on every run.
pub(super) fn ranked(mut rows: Vec<LayoutRow>) -> Vec<LayoutRow> {
    rows.sort_by(|a, b| {
        b.fits
            .cmp(&a.fits)
            .then_with(|| {
                if a.fits {
                    a.iteration_ns.cmp(&b.iteration_ns)
                } else {
                    a.device_used_bytes.cmp(&b.device_used_bytes)
                }
            })
            .then_with(|| a.passes.cmp(&b.passes))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(passes: &str, fits: bool, ns: u64, used: u64) -> LayoutRow {
        LayoutRow {
            passes: passes.into(),
            tp: 1,
            cp: 1,
            pp: 1,
            virtual_stages: 1,
            schedule: None,
            dp_shard: 1,
            dp_replicate: 1,
            shard_stage: 0,
            micro_batch: 1,
            accumulation: 1,
            recompute: false,
            iteration_ns: ns,
            allocated_bytes: used,
            reserved_bytes: used,
            device_used_bytes: used,
            fits,
            peak_flops_per_ns: 1.0,
        }
    }

    #[test]
    fn fitting_rows_rank_first_by_time_then_the_rest_by_memory() {
        let got = ranked(vec![
            r("d", false, 1, 30),
            r("b", true, 20, 9),
            r("e", false, 1, 20),
            r("a", true, 10, 9),
            r("c", true, 20, 1),
        ]);
        let order: Vec<&str> = got.iter().map(|x| x.passes.as_str()).collect();
        assert_eq!(order, ["a", "b", "c", "e", "d"]);
    }

    #[test]
    fn labels_show_every_knob_and_the_unchanged_job() {
        let steps: Vec<KnobbedPass> = vec![
            (
                "tensor-parallel".into(),
                vec![
                    ("degree".into(), "8".into()),
                    ("sequence".into(), "1".into()),
                ],
            ),
            ("recompute".into(), vec![]),
        ];
        assert_eq!(
            full_label(&steps),
            "tensor-parallel:degree=8,sequence=1 + recompute"
        );
        assert_eq!(full_label(&[]), "as is");
        assert_eq!(knob_of(&steps, "tensor-parallel", "degree"), Some(8));
        assert_eq!(knob_of(&steps, "shard", "stage"), None);
    }

    /// The pipelines the layout search tries for GPT-2 small (12 blocks) at batch 2 on 8
    /// V100s: 1F1B at every depth dividing the blocks and, times the tensor-parallel degree,
    /// the 8 workers; micro-batches dividing the replica's batch, between p and 8 p; none
    /// where the export runs no pipeline; the shardings each export runs one beside.
    #[test]
    fn pipelines_divide_the_blocks_and_the_workers() {
        let (_, job) = crate::zoo::build::test_job("gpt", 2, "8xv100");
        let cur = crate::passes::evaluate(job).unwrap();
        let mega = Some(Framework::Megatron);
        let depths = |tp: u32| -> Vec<(u32, u32)> {
            pp_layouts(&cur, tp, mega)
                .iter()
                .map(|o| {
                    let s = std::slice::from_ref(o);
                    assert_eq!(text_knob(s, "pipeline", "schedule"), Some("1f1b"));
                    (
                        knob_of(s, "pipeline", "stages").unwrap(),
                        knob_of(s, "pipeline", "microbatches").unwrap(),
                    )
                })
                .collect()
        };
        // Replica batch 2 p (the global batch kept): m = 2 p micro-batches of one sample.
        assert_eq!(depths(1), vec![(2, 4), (4, 8)]);
        // With tensor parallelism of 2 (a replica of 2 p ranks trains 4 p): 4 p.
        assert_eq!(depths(2), vec![(2, 8), (4, 16)]);
        assert!(pp_layouts(&cur, 1, Some(Framework::Pytorch)).is_empty());
        assert_eq!(
            pp_layouts(&cur, 1, Some(Framework::Torchtitan)),
            pp_layouts(&cur, 1, mega)
        );
        // Beside which sharding: Megatron-LM's DDP and distributed optimizer; torchtitan's
        // FSDP2 without resharding only.
        let shard = |stage: &str, reshard: &str| -> Vec<KnobbedPass> {
            vec![(
                "shard".into(),
                vec![
                    ("stage".into(), stage.into()),
                    ("reshard".into(), reshard.into()),
                ],
            )]
        };
        let tt = Some(Framework::Torchtitan);
        for (head, m, t) in [
            (Vec::new(), true, false),
            (shard("1", "1"), true, false),
            (shard("3", "0"), false, true),
            (shard("3", "1"), false, false),
        ] {
            assert_eq!(beside_pipeline(&head, mega), m, "{head:?}");
            assert_eq!(beside_pipeline(&head, tt), t, "{head:?}");
        }
        // Interleaved where 2 p chunks divide the 12 blocks and p divides m; not for a
        // framework without it, nor for a step list without a 1F1B pipeline.
        let one = pp_layouts(&cur, 1, mega);
        let alt = interleaved(&one[..1], &cur, mega).expect("2 stages x 2 chunks divide 12");
        assert_eq!(text_knob(&alt, "pipeline", "schedule"), Some("interleaved"));
        assert_eq!(knob_of(&alt, "pipeline", "virtual"), Some(2));
        assert_eq!(knob_of(&alt, "pipeline", "stages"), Some(2));
        assert!(
            interleaved(&one[1..2], &cur, mega).is_none(),
            "8 chunks do not divide 12"
        );
        assert!(interleaved(&alt, &cur, mega).is_none());
        // PyTorch runs the schedule, but its export lays out Llama-style models only.
        assert!(interleaved(&one[..1], &cur, Some(Framework::Pytorch)).is_none());
        assert!(layout_exported(&one[..1], &cur.job, mega));
        assert!(!layout_exported(
            &one[..1],
            &cur.job,
            Some(Framework::Pytorch)
        ));
        assert!(!layout_exported(
            &one[..1],
            &cur.job,
            Some(Framework::Deepspeed)
        ));
    }

    #[test]
    fn torchtitan_takes_tensor_parallelism_only_with_fsdp_or_one_replica() {
        let tp = |t: &str| -> KnobbedPass {
            (
                "tensor-parallel".into(),
                vec![("degree".into(), t.into()), ("sequence".into(), "1".into())],
            )
        };
        let fsdp: KnobbedPass = ("shard".into(), vec![("stage".into(), "3".into())]);
        let tt = Some(Framework::Torchtitan);
        let pt = Some(Framework::Pytorch);
        let (_, mut j16) = crate::zoo::build::test_job("gpt", 2, "8xv100");
        j16.workers = 16;
        let (_, j8) = crate::zoo::build::test_job("gpt", 2, "8xv100");
        assert!(layout_exported(&[], &j16, tt));
        assert!(!layout_exported(&[tp("8")], &j16, tt));
        assert!(layout_exported(&[tp("8")], &j8, tt));
        assert!(layout_exported(&[tp("8"), fsdp.clone()], &j16, tt));
        // PyTorch (DTensor): beside FSDP2, on a Llama-style model only (not GPT-2).
        assert!(!layout_exported(&[tp("8"), fsdp.clone()], &j16, pt));
        let opts = crate::zoo::ModelOptions {
            batch: Some(1),
            layers: Some(2),
            hidden: Some(256),
            heads: Some(8),
            kv_heads: Some(8),
            ffn: Some(512),
            seq: Some(128),
            vocab: Some(1000),
            ..Default::default()
        };
        let (_, mut llama) = crate::zoo::build::test_job_with("llama", &opts, "8xv100");
        llama.workers = 16;
        assert!(layout_exported(&[tp("8"), fsdp.clone()], &llama, pt));
        assert!(!layout_exported(&[tp("8")], &llama, pt));
        let cur = crate::passes::evaluate(llama).unwrap();
        assert!(!pp_layouts(&cur, 1, pt).is_empty());
        assert!(layout_exported(&[tp("8")], &j16, None));
    }
}
