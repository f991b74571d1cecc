//! The layout search (issue 24): the tensor-parallel layouts the memory step tries beside its
//! shardings, recomputation and accumulation, and the ranked table of every option it tried
//! (`plan --top K`, `top_layouts` in `--json`).
//!
//! A layout is a memory move: a job that fits as it is keeps data parallelism (tensor
//! parallelism only adds communication to a job with room), and one that does not meets each
//! tensor-parallel degree the pass takes, with and without each sharding the framework's export
//! applies, before recomputation and accumulation (see `memory_options` in the parent module).
//! Pipeline and context parallelism are not passes yet: their degrees are 1.

use super::{Evaluated, Framework, KnobbedPass, budget_peak, framework};

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
/// sharding that follows it in `head` ([`framework::tp_supported`]).
pub(super) fn layout_exported(head: &[KnobbedPass], workers: u32, fw: Option<Framework>) -> bool {
    let Some(t) = knob_of(head, "tensor-parallel", "degree") else {
        return true;
    };
    let fsdp = knob_of(head, "shard", "stage") == Some(3);
    fw.is_none_or(|fw| framework::tp_supported(fw, true, workers / t.max(1), fsdp).is_ok())
}

/// The integer knob `k` of the step `pass` in `steps`, if there is one.
pub(super) fn knob_of(steps: &[KnobbedPass], pass: &str, k: &str) -> Option<u32> {
    steps
        .iter()
        .filter(|(n, _)| n == pass)
        .flat_map(|(_, ks)| ks.iter())
        .find(|(n, _)| n == k)
        .and_then(|(_, v)| v.parse().ok())
}

/// One option the memory step tried, as the layout table shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LayoutRow {
    /// The option's passes with every knob (`tensor-parallel:degree=8,sequence=1 + shard:stage=3,reshard=1`),
    /// `as is` for the job unchanged.
    pub passes: String,
    /// Ranks per tensor-parallel group.
    pub tp: u32,
    /// Ranks per shard group (1: unsharded).
    pub dp_shard: u32,
    /// Data-parallel groups holding replicas of each other.
    pub dp_replicate: u32,
    /// The sharding stage (0: none).
    pub shard_stage: u32,
    /// Samples per micro-step of one data-parallel replica.
    pub micro_batch: u32,
    /// Micro-steps per iteration.
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
    let dp = (workers / tp).max(1);
    let stage = knob_of(steps, "shard", "stage").unwrap_or(0);
    let (dp_shard, dp_replicate) = if stage > 0 {
        let replicas = knob_of(steps, "shard", "replicas").unwrap_or(1).max(1);
        ((dp / replicas).max(1), replicas)
    } else {
        (1, dp)
    };
    let k = knob_of(steps, "grad-accumulation", "k").unwrap_or(1).max(1);
    let p = &e.memory.peaks;
    LayoutRow {
        passes: full_label(steps),
        tp,
        dp_shard,
        dp_replicate,
        shard_stage: stage,
        micro_batch: batch.saturating_mul(tp) / k,
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
        assert!(layout_exported(&[], 16, tt));
        assert!(!layout_exported(&[tp("8")], 16, tt));
        assert!(layout_exported(&[tp("8")], 8, tt));
        assert!(layout_exported(&[tp("8"), fsdp.clone()], 16, tt));
        assert!(!layout_exported(
            &[tp("8"), fsdp],
            16,
            Some(Framework::Pytorch)
        ));
        assert!(layout_exported(&[tp("8")], 16, None));
    }
}
