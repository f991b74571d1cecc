//! What a trace says about the job it profiled ([`TraceFacts`], kept in `job.meta.trace`):
//! the GPU (`deviceProperties`) and the built-in config its kernels are re-costed against, the
//! batch (the first forward matrix operator's activation, from `Input Dims`), the rank and world
//! size (`distributedInfo`), the optimizer (`Optimizer.step#SGD.step`), the collectives and the
//! gradient buckets the framework formed (the all-reduce kernels' `In msg nelems` × dtype; DDP
//! closes a bucket once it reaches `bucket_cap_mb`, so the cap is read from the middle buckets).
//!
//! **GPU configs.** A `deviceProperties` name maps to the built-in config of its family (H200,
//! H100, A100, V100, AMD Instinct); the mapping is *exact* when the name is the model the config
//! describes (memory size included) and otherwise the nearest config by vendor and compute
//! capability (an RTX 2080 Ti is re-costed as a V100: a stated approximation). The recorded
//! memory size replaces the config's.

use super::collective::collective_type;
pub use super::collective::nccl_dtype_bytes;
use super::kineto::KinetoTrace;
use super::step::{StepWindow, TraceCollective};
use super::work::StepContext;
use crate::cost::config::GpuSpec;
use crate::graph::job::{Bucketing, Job, TraceFacts};

/// The GPU a trace ran on: the device most kernels ran on, else the first listed.
fn device_props(trace: &KinetoTrace) -> Option<&super::kineto::DeviceProps> {
    let mut count: std::collections::BTreeMap<i64, usize> = Default::default();
    for e in trace.events.iter().filter(|e| e.cat.is_gpu_activity()) {
        if let Some(d) = e.args.device {
            *count.entry(d).or_default() += 1;
        }
    }
    let dev = count.iter().max_by_key(|(_, n)| **n).map(|(d, _)| *d);
    dev.and_then(|d| trace.device_properties.iter().find(|p| p.id == Some(d)))
        .or_else(|| trace.device_properties.first())
}

/// The built-in config for a `deviceProperties` name (and compute capability, memory), and
/// whether it is that very model.
pub fn gpu_config_for(
    name: &str,
    major: Option<i64>,
    mem_bytes: Option<i64>,
) -> (&'static str, bool) {
    let n = name.to_ascii_uppercase();
    let gib = mem_bytes.map(|b| b as f64 / (1u64 << 30) as f64);
    let near = |want: f64| gib.is_some_and(|g| (g - want).abs() < 0.15 * want);
    if n.contains("H200") {
        ("h200", true)
    } else if n.contains("H100") {
        ("h100-sxm", !n.contains("PCIE"))
    } else if n.contains("A100") {
        ("a100-80gb", n.contains("80GB") || near(80.0))
    } else if n.contains("V100") {
        ("v100-32gb", n.contains("32GB") || near(32.0))
    } else if n.contains("MI300X") {
        ("mi300x", true)
    } else if n.contains("AMD")
        || n.contains("RADEON")
        || n.contains("INSTINCT")
        || n.contains(" MI")
    {
        ("mi300x", false)
    } else {
        match major {
            Some(m) if m >= 9 => ("h100-sxm", false),
            Some(8) => ("a100-80gb", false),
            _ => ("v100-32gb", false),
        }
    }
}

/// The GPU config a trace's kernels are re-costed against, and the facts about the device.
pub fn device(trace: &KinetoTrace) -> (GpuSpec, TraceFacts) {
    let props = device_props(trace);
    let name = props.and_then(|p| p.name.clone());
    let (cfg, exact) = gpu_config_for(
        name.as_deref().unwrap_or(""),
        props.and_then(|p| p.compute_major),
        props.and_then(|p| p.total_global_mem),
    );
    let mut gpu = crate::cost::config::load_gpu(cfg).expect("built-in GPU configs parse");
    let mem = props
        .and_then(|p| p.total_global_mem)
        .filter(|&b| b > 0)
        .map(|b| b as u64);
    if let Some(b) = mem {
        gpu.memory_gib = b as f64 / (1u64 << 30) as f64;
    }
    let facts = TraceFacts {
        gpu: name,
        gpu_config: cfg.to_string(),
        gpu_config_exact: exact && props.is_some(),
        gpu_memory_bytes: mem,
        gpu_sms: props
            .and_then(|p| p.num_sms)
            .filter(|&s| s > 0)
            .map(|s| s.min(u32::MAX as i64) as u32),
        ranks_given: 1,
        ..TraceFacts::default()
    };
    (gpu, facts)
}

/// The bucket cap gradient all-reduces of `sizes` imply: every bucket but the first and the last
/// reached it, so it is at most the smallest of those; taken as that, rounded down to whole MiB.
pub fn bucket_cap(sizes: &[u64]) -> Option<u64> {
    if sizes.len() < 3 {
        return None;
    }
    let mid = sizes[1..sizes.len() - 1].iter().copied().min()?;
    let mib = mid >> 20;
    (mib > 0).then_some(mib << 20)
}

/// Fill in what the step says: batch, ranks, optimizer, collectives, buckets.
pub fn describe(
    facts: &mut TraceFacts,
    trace: &KinetoTrace,
    win: &StepWindow,
    _job: &Job,
    collectives: &[TraceCollective],
    cx: &StepContext,
) {
    let ev = &trace.events;
    if let Some((i, name, x)) = cx.forward_matrix.first() {
        let _ = i;
        if let Some(&b) = x.first()
            && b > 0
        {
            facts.batch = Some(b.min(u32::MAX as i64) as u32);
            facts.batch_from = Some(format!("{name} input {x:?}"));
        }
    }
    if let Some(d) = &trace.distributed {
        facts.rank = d
            .rank
            .filter(|&r| r >= 0)
            .map(|r| r.min(u32::MAX as i64) as u32);
        facts.world_size = d
            .world_size
            .filter(|&w| w > 0)
            .map(|w| w.min(u32::MAX as i64) as u32);
        facts.backend = d.backend.clone();
    }
    facts.optimizer = ev
        .iter()
        .filter(|e| e.ts_ns >= win.start_ns && e.ts_ns < win.end_ns)
        .find_map(|e| {
            let rest = e.name.strip_prefix("Optimizer.step#")?;
            Some(rest.split('.').next().unwrap_or(rest).to_string())
        });
    // `torch.optim.Adam(fused=True)` runs `aten::_fused_adam_` (`_fused_adamw_` for AdamW);
    // apex's optimizer is `FusedAdam` (issue 27: fused Adam was proposed for fused jobs).
    facts.optimizer_fused = facts
        .optimizer
        .as_deref()
        .is_some_and(|o| o.starts_with("Fused"))
        || ev.iter().any(|e| {
            e.ts_ns >= win.start_ns
                && e.ts_ns < win.end_ns
                && (e.name.starts_with("aten::_fused_adam") || e.name.contains("multi_tensor_adam"))
        });
    for c in collectives {
        *facts
            .collectives
            .entry(collective_type(&c.name).to_string())
            .or_default() += 1;
    }
    let mut sizes = Vec::new();
    let mut known = true;
    let mut order: Vec<&TraceCollective> = collectives
        .iter()
        .filter(|c| collective_type(&c.name) == "AllReduce")
        .collect();
    order.sort_by_key(|c| (c.start_ns, c.event));
    for c in &order {
        let a = &ev[c.event].args;
        match (
            a.in_msg_nelems,
            a.dtype.as_deref().and_then(nccl_dtype_bytes),
        ) {
            (Some(n), Some(b)) if n > 0 => sizes.push(n as u64 * b),
            _ => known = false,
        }
    }
    if known && !sizes.is_empty() {
        facts.bucketing = Some(Bucketing {
            total_bytes: sizes.iter().sum(),
            cap_bytes: bucket_cap(&sizes),
            sizes_bytes: sizes,
            source: "NCCL kernel args (In msg nelems × dtype)".into(),
        });
    }
}

/// One line on what the trace says, for reports.
pub fn summary(f: &TraceFacts) -> String {
    let mut parts = Vec::new();
    parts.push(match (f.batch, &f.batch_from) {
        (Some(b), _) => format!("batch {b}/GPU"),
        _ => "batch unknown (no Input Dims: record with record_shapes=True)".into(),
    });
    parts.push(format!(
        "{} ({}{})",
        f.gpu.as_deref().unwrap_or("GPU not recorded"),
        f.gpu_config,
        if f.gpu_config_exact {
            ""
        } else {
            ", nearest config"
        }
    ));
    match (f.world_size, f.rank) {
        (Some(w), Some(r)) if w > 1 => parts.push(format!("rank {r} of {w}")),
        (Some(w), None) if w > 1 => parts.push(format!("{w} ranks")),
        _ => parts.push("1 GPU".into()),
    }
    if let Some(p) = &f.precision {
        parts.push(p.clone());
    }
    if let Some(o) = &f.optimizer {
        parts.push(o.clone());
    }
    if let Some(b) = &f.bucketing {
        parts.push(format!(
            "{} gradient all-reduces ({:.1} MB{})",
            b.sizes_bytes.len(),
            b.total_bytes as f64 / 1e6,
            b.cap_bytes
                .map(|c| format!(", bucket cap ≈ {} MiB", c >> 20))
                .unwrap_or_default()
        ));
    }
    if let Some(s) = &f.sharding {
        parts.push(super::fsdp::summary(s));
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names_map_to_configs() {
        assert_eq!(
            gpu_config_for("Tesla V100-SXM2-32GB", Some(7), None),
            ("v100-32gb", true)
        );
        assert_eq!(
            gpu_config_for("NVIDIA A100-PG509-200", Some(8), Some(42_297_524_224)),
            ("a100-80gb", false)
        );
        assert_eq!(
            gpu_config_for("NVIDIA A100-SXM4-80GB", Some(8), None),
            ("a100-80gb", true)
        );
        assert_eq!(
            gpu_config_for("AMD Radeon Graphics", Some(9), None),
            ("mi300x", false)
        );
        assert_eq!(
            gpu_config_for("NVIDIA GeForce RTX 2080 Ti", Some(7), None),
            ("v100-32gb", false)
        );
        assert_eq!(
            gpu_config_for("NVIDIA H100 80GB HBM3", Some(9), None),
            ("h100-sxm", true)
        );
    }

    #[test]
    fn ddp_bucket_cap_from_the_middle_buckets() {
        // ResNet-50 DDP: 8.2 MB (the classifier alone), 31.5, 26.3, 26.6, 9.7 MB.
        let sizes = [8_196_000, 31_502_336, 26_255_360, 26_550_272, 9_724_160];
        assert_eq!(bucket_cap(&sizes), Some(25 << 20));
        assert_eq!(bucket_cap(&sizes[..2]), None);
        assert_eq!(nccl_dtype_bytes("Float"), Some(4));
        assert_eq!(nccl_dtype_bytes("BFloat16"), Some(2));
    }
}
