//! What a recorded step says about its sharding: PyTorch FSDP2 (`fully_shard`) annotates every
//! hook it runs with `record_function("FSDP::<hook> (<module fqn>)")` — `pre_forward`,
//! `all_gather`, `all_gather_copy_out`, `post_backward_reduce`, `backward_prefetch for <fqn>`,
//! … — the root module's without the suffix (torch ≥ 2.4,
//! `torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`). Those names and the step's
//! all-gather / reduce-scatter kernels say:
//!
//! * the **units** (one per `fully_shard` call whose hooks ran), in the order their forward
//!   pre-hooks ran; `""` is the root;
//! * which units were **resharded after the forward**: all-gathered again in the backward (two
//!   `FSDP::all_gather (<fqn>)` spans in the step; FSDP2 never reshards the root);
//! * the collectives' counts and bytes (the kernels' `Out msg nelems` of an all-gather — what
//!   each rank holds once gathered — and `In msg nelems` of a reduce-scatter, × the dtype).
//!
//! FSDP1 (`FullyShardedDataParallel`) names no module in its annotations and is not recognised.

use std::collections::{BTreeMap, HashMap};

use crate::graph::job::{FsdpOp, FsdpSpan, LocalGraph, TraceSharding};
use crate::graph::{DeviceKind, OpId, OpKind};

use super::collective::{collective_type, nccl_dtype_bytes};
use super::kineto::KinetoTrace;
use super::step::{StepWindow, TraceCollective};

/// `FSDP::<hook> (<fqn>)` → (hook, fqn); the root's hooks have no suffix (fqn "").
fn hook(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("FSDP::")?;
    match rest.split_once(" (") {
        Some((h, m)) => Some((h, m.strip_suffix(')').unwrap_or(m))),
        None => Some((rest, "")),
    }
}

/// The step's FSDP2 hook events (indices), in time order.
pub(crate) fn hook_events(trace: &KinetoTrace, win: &StepWindow) -> Vec<usize> {
    let ev = &trace.events;
    let mut v: Vec<usize> = (0..ev.len())
        .filter(|&i| ev[i].ts_ns >= win.start_ns && ev[i].ts_ns < win.end_ns)
        .filter(|&i| ev[i].name.starts_with("FSDP::"))
        .collect();
    v.sort_by_key(|&i| (ev[i].ts_ns, i));
    v
}

/// The step's FSDP2 sharding, or `None` when no FSDP2 hook ran in it.
pub(crate) fn describe(
    trace: &KinetoTrace,
    hooks: &[usize],
    collectives: &[TraceCollective],
) -> Option<TraceSharding> {
    let ev = &trace.events;
    let mut units: Vec<String> = Vec::new();
    let mut gathers: BTreeMap<String, u32> = BTreeMap::new();
    for &i in hooks {
        let Some((h, m)) = hook(&ev[i].name) else {
            continue;
        };
        match h {
            "pre_forward" if !units.iter().any(|u| u == m) => units.push(m.to_string()),
            "all_gather" => *gathers.entry(m.to_string()).or_default() += 1,
            _ => {}
        }
    }
    if units.is_empty() {
        return None;
    }
    let resharded = units
        .iter()
        .filter(|u| gathers.get(*u).copied().unwrap_or(0) > 1)
        .cloned()
        .collect();
    // Each kind's count and bytes (`None` once a kernel lacks its size): all-gathers by
    // what they output, reduce-scatters by what they take in.
    let sum = |kind: &str, out: bool| {
        let mut count = 0u32;
        let mut bytes = Some(0u64);
        for c in collectives
            .iter()
            .filter(|c| collective_type(&c.name) == kind)
        {
            count += 1;
            let a = &ev[c.event].args;
            let n = if out {
                a.out_msg_nelems
            } else {
                a.in_msg_nelems
            }
            .filter(|&n| n > 0);
            let b = a.dtype.as_deref().and_then(nccl_dtype_bytes);
            bytes = bytes.zip(n.zip(b)).map(|(s, (n, b))| s + n as u64 * b);
        }
        (count, bytes.filter(|_| count > 0))
    };
    let (all_gathers, gathered) = sum("AllGather", true);
    let (reduce_scatters, scattered) = sum("ReduceScatter", false);
    let n = units.len();
    Some(TraceSharding {
        framework: "FSDP2 (fully_shard)".into(),
        unit_bytes: vec![0; n],
        units,
        resharded,
        all_gathers,
        reduce_scatters,
        all_gather_bytes: gathered,
        reduce_scatter_bytes: scattered,
    })
}

/// The span a hook name opens, if it is one the `shard` pass works with.
fn span_of(h: &str) -> Option<FsdpSpan> {
    match h {
        "all_gather" => Some(FsdpSpan::AllGather),
        "all_gather_copy_out" => Some(FsdpSpan::CopyOut),
        "post_forward" => Some(FsdpSpan::PostForward),
        "post_backward_reshard" => Some(FsdpSpan::PostBackwardReshard),
        _ => None,
    }
}

/// Label the step's FSDP2 spans in `local.fsdp`: every host op whose event is a span of
/// [`FsdpSpan`] or lies inside one, and every GPU op such a host op launched; and set each
/// unit's gathered bytes in `s.unit_bytes` from its first all-gather kernel. `op_event[op]` is
/// the trace event an op came from, `parent[event]` the host event enclosing it.
pub(crate) fn label(
    trace: &KinetoTrace,
    hooks: &[usize],
    local: &mut LocalGraph,
    op_event: &[Option<usize>],
    parent: &HashMap<usize, usize>,
    collectives: &[TraceCollective],
    s: &mut TraceSharding,
) {
    let ev = &trace.events;
    let mut seen: BTreeMap<(u32, u8), u32> = BTreeMap::new();
    let mut span_label: HashMap<usize, FsdpOp> = HashMap::new();
    for &i in hooks {
        let Some((h, m)) = hook(&ev[i].name) else {
            continue;
        };
        let (Some(span), Some(unit)) = (span_of(h), s.units.iter().position(|u| u == m)) else {
            continue;
        };
        let unit = unit as u32;
        let nth = seen.entry((unit, span as u8)).or_default();
        span_label.insert(
            i,
            FsdpOp {
                unit,
                span,
                nth: *nth,
            },
        );
        *nth += 1;
    }
    if span_label.is_empty() {
        return;
    }
    // Host ops: the innermost labelled span enclosing their event.
    for (i, op) in local.ops.iter().enumerate() {
        let Some(e) = op_event.get(i).copied().flatten() else {
            continue;
        };
        if !matches!(
            local.devices.get(op.spec.device as usize),
            Some(DeviceKind::CpuThread { .. })
        ) {
            continue;
        }
        if let Some(l) = super::calls::innermost(&span_label, parent, e) {
            local.fsdp.insert(i as OpId, l);
        }
    }
    // GPU ops: their launch's label.
    let launched: Vec<(OpId, FsdpOp)> = local
        .edges
        .iter()
        .filter(|&&(a, b)| {
            local.ops[a as usize].spec.kind == OpKind::Launch
                && !matches!(
                    local
                        .devices
                        .get(local.ops[b as usize].spec.device as usize),
                    Some(DeviceKind::CpuThread { .. })
                )
        })
        .filter_map(|&(a, b)| local.fsdp.get(&a).map(|&l| (b, l)))
        .collect();
    local.fsdp.extend(launched);
    for c in collectives {
        if collective_type(&c.name) != "AllGather" {
            continue;
        }
        let Some(l) = local.fsdp.get(&c.op).filter(|l| l.nth == 0) else {
            continue;
        };
        let a = &ev[c.event].args;
        let bytes = a.dtype.as_deref().and_then(nccl_dtype_bytes);
        if let (Some(n), Some(b)) = (a.out_msg_nelems.filter(|&n| n > 0), bytes) {
            s.unit_bytes[l.unit as usize] = n as u64 * b;
        }
    }
}

/// One phrase for reports: `FSDP2 (fully_shard): 3 units, 2 resharded after the forward; 5
/// all-gathers (1.1 MB), 3 reduce-scatters (0.7 MB)`.
pub fn summary(s: &TraceSharding) -> String {
    let mb = |b: Option<u64>| b.map_or(String::new(), |b| format!(" ({:.1} MB)", b as f64 / 1e6));
    format!(
        "{}: {} unit{} ({}), {} resharded after the forward; {} all-gather{}{}, {} reduce-scatter{}{}",
        s.framework,
        s.units.len(),
        if s.units.len() == 1 { "" } else { "s" },
        s.unit_labels(0..s.units.len()),
        s.resharded.len(),
        s.all_gathers,
        if s.all_gathers == 1 { "" } else { "s" },
        mb(s.all_gather_bytes),
        s.reduce_scatters,
        if s.reduce_scatters == 1 { "" } else { "s" },
        mb(s.reduce_scatter_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_name_their_module_or_the_root() {
        assert_eq!(
            hook("FSDP::pre_forward (transformer.h.0)"),
            Some(("pre_forward", "transformer.h.0"))
        );
        assert_eq!(hook("FSDP::all_gather"), Some(("all_gather", "")));
        assert_eq!(
            hook("FSDP::root_pre_forward"),
            Some(("root_pre_forward", ""))
        );
        assert_eq!(hook("FullyShardedDataParallel.forward"), None);
    }

    #[test]
    fn a_unit_name_with_a_newline_stays_on_its_line() {
        let s = TraceSharding {
            framework: "FSDP2 (fully_shard)".into(),
            units: vec![String::new(), "h.0\"]\nimport os".into()],
            unit_bytes: vec![0, 0],
            ..Default::default()
        };
        let line = summary(&s);
        assert!(
            !line.contains('\n') && line.contains("h.0\"]\\nimport os"),
            "{line}"
        );
    }
}
