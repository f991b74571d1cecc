//! A recorded step's gradient all-reduces as the framework issued them: each NCCL/RCCL
//! all-reduce kernel together with the host ops of the call that issued it (`c10d::allreduce_`
//! and what runs inside it: `record_param_comms`, `nccl:all_reduce`, the launch). The ops of one
//! call carry the call's index in [`LocalGraph::calls`], so that `tensor-fusion` can re-bucket
//! the recorded gradients on a trace (one collective, and one host call, per bucket instead of
//! per tensor) after any other edit has renumbered the ops.
//!
//! **The call.** From the kernel's launch, the outermost enclosing host event whose name is a
//! collective call (`c10d::…`, `nccl:…`, `record_param_comms`, `ProcessGroupNCCL…`); without
//! one, the launch alone. Every host op whose event is that call or lies inside it belongs to
//! the call.
//!
//! **Sizes.** The kernel's args (`In msg nelems` × dtype, PyTorch ≥ 2.1) when it has them;
//! otherwise none here, and the pass estimates one from the recorded duration.

use std::collections::HashMap;

use crate::graph::job::{LocalGraph, RecordedSync};
use crate::graph::{OpId, OpKind};

use super::collective::{CollectiveKind, collective_type};
use super::kineto::KinetoTrace;
use super::step::TraceCollective;

/// Whether a host event is (part of) a collective call.
fn is_call(name: &str) -> bool {
    name.starts_with("c10d::")
        || name.starts_with("nccl:")
        || name.starts_with("ProcessGroupNCCL")
        || name == "record_param_comms"
}

/// The value `labels` gives the innermost of event `e` and the host events enclosing it
/// (`parent[event]`), if any does: which labelled call or span a host op lies in.
pub(crate) fn innermost<T: Copy>(
    labels: &HashMap<usize, T>,
    parent: &HashMap<usize, usize>,
    mut e: usize,
) -> Option<T> {
    loop {
        if let Some(&l) = labels.get(&e) {
            return Some(l);
        }
        e = *parent.get(&e)?;
    }
}

/// Label the ops of every all-reduce call of the step in `local.calls` and return the calls in
/// stream order. `op_event[op]` is the trace event an op came from; `parent[event]` the host
/// event enclosing it.
pub(crate) fn label(
    trace: &KinetoTrace,
    local: &mut LocalGraph,
    op_event: &[Option<usize>],
    parent: &HashMap<usize, usize>,
    collectives: &[TraceCollective],
) -> Vec<RecordedSync> {
    let ev = &trace.events;
    let is_kernel: std::collections::HashSet<OpId> = collectives.iter().map(|c| c.op).collect();
    let mut launch_of: HashMap<OpId, OpId> = HashMap::new();
    for &(a, b) in &local.edges {
        if is_kernel.contains(&b) && local.ops[a as usize].spec.kind == OpKind::Launch {
            launch_of.entry(b).or_insert(a);
        }
    }
    let mut out = Vec::new();
    // Call event → index of its all-reduce.
    let mut call_of_event: HashMap<usize, u32> = HashMap::new();
    for (position, c) in collectives.iter().enumerate() {
        if collective_type(&c.name) != "AllReduce" {
            continue;
        }
        let index = out.len() as u32;
        let bytes = super::extrapolate::size_from_kernel(trace, c)
            .filter(|s| s.kind == CollectiveKind::AllReduce)
            .map(|s| s.bytes);
        out.push(RecordedSync {
            position: position as u32,
            kernel: c.name.clone(),
            bytes,
        });
        local.calls.insert(c.op, index);
        let Some(first) = launch_of
            .get(&c.op)
            .and_then(|&l| op_event.get(l as usize).copied().flatten())
        else {
            continue;
        };
        let mut call = first;
        let mut cur = first;
        while let Some(&p) = parent.get(&cur) {
            if ev.get(p).is_some_and(|e| is_call(&e.name)) {
                call = p;
            }
            cur = p;
        }
        call_of_event.insert(call, index);
    }
    for (i, op) in local.ops.iter().enumerate() {
        if !matches!(op.spec.kind, OpKind::Launch | OpKind::CpuOther) {
            continue;
        }
        let Some(e) = op_event.get(i).copied().flatten() else {
            continue;
        };
        if let Some(index) = innermost(&call_of_event, parent, e) {
            local.calls.insert(i as OpId, index);
        }
    }
    out
}
