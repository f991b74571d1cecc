//! Device memory of a recorded step, as memory effects of the step's ops, so that the replay
//! reports it and passes change it (AMP halves FW/BW allocations, accumulation divides them by
//! k, recomputation drops saved activations).
//!
//! **From `[memory]` events** (`profile_memory=True`). The allocator's level after each event is
//! its `Total Allocated` (newer traces) or, when events carry only `Bytes` (2021 traces), the
//! running sum from the profiler's start — which then misses what was allocated before it
//! (weights, optimizer state; [`MemoryFacts::absolute`] says which). The measured peak of the
//! step is the highest level over the step's events (and its start). Each event becomes an
//! effect of the CPU op running when it happened on its thread: an allocation at that op's
//! start, a free at its end (an event in the host's idle time: an allocation at the next op's
//! start, a free at the previous op's end). Allocations are paired with their frees by address
//! (or, without addresses, the latest unmatched allocation of the same size); a block allocated
//! in a layer's forward and freed in the backward is a *saved activation*: it moves to the
//! layer's first forward kernel (allocated at its start) and its last backward kernel (freed at
//! its end), which is where recomputation looks for it. Static memory is the level at the step's
//! start, adjusted once so that the replayed step peaks exactly at the measured peak: the
//! model's effects then change it from the measured figure.
//!
//! **From shapes**, without memory events: weights, gradients and optimizer state from the
//! parameter operands of the forward operators (4 B each; momentum SGD and Adagrad keep one
//! state tensor, Adam two), and each forward operator's input saved for its backward (allocated
//! at the layer's first forward kernel, freed at its last backward kernel) — operators autograd
//! recorded only (a sequence number): those run under `no_grad` save nothing. Embedding tables
//! sharded by TorchRec live in FBGEMM's table-batched lookups
//! (`fbgemm::split_embedding_codegen_lookup_<optimizer>_function`), whose backward applies the
//! optimizer in place: their device weights and each optimizer-state tensor on the device count
//! once, with no gradient copy ([`table_bytes`]). An estimate, said so in
//! [`MemoryFacts::source`].

use std::collections::BTreeMap;

use super::kineto::{Id, KinetoTrace, MemoryEvent};
use super::shapes::{self, Input};
use super::step::StepWindow;
use super::work::StepContext;
use crate::graph::job::{Job, MemoryFacts};
use crate::graph::{MemEffect, MemWhen, OpId, OpKind, Phase};

/// A thread's ops with their recorded `[start, end)`, in order.
type Timeline = [(i64, i64, OpId)];

/// The op an event at `t` belongs to: the one running, else (idle time) the next one for an
/// allocation and the previous one for a free.
fn op_at(tl: &Timeline, t: i64, alloc: bool) -> Option<OpId> {
    if tl.is_empty() {
        return None;
    }
    let i = tl.partition_point(|x| x.0 <= t);
    if i == 0 {
        return Some(tl[0].2);
    }
    let cur = tl[i - 1];
    if t < cur.1 {
        return Some(cur.2);
    }
    if alloc {
        Some(tl.get(i).map_or(cur.2, |x| x.2))
    } else {
        Some(cur.2)
    }
}

/// First forward and last backward GPU compute op of each layer.
fn layer_kernels(job: &Job) -> BTreeMap<u32, (OpId, OpId)> {
    let mut fw: BTreeMap<u32, OpId> = BTreeMap::new();
    let mut bw: BTreeMap<u32, OpId> = BTreeMap::new();
    for (i, o) in job.local.ops.iter().enumerate() {
        let s = &o.spec;
        if s.kind != OpKind::Compute || s.layer == crate::graph::NONE {
            continue;
        }
        match s.phase {
            Phase::Fw => {
                fw.entry(s.layer).or_insert(i as OpId);
            }
            Phase::Bw => {
                bw.insert(s.layer, i as OpId);
            }
            _ => {}
        }
    }
    fw.into_iter()
        .filter_map(|(l, f)| bw.get(&l).map(|&b| (l, (f, b))))
        .collect()
}

/// Replayed peak of `job` (one worker).
fn replayed_peak(job: &Job) -> Option<u64> {
    let g = job.expand().ok()?;
    let r = crate::replay::replay(&g);
    Some(crate::replay::peak_memory(&g, &r).peak_bytes)
}

/// Memory effects and static memory of a trace job (see the module docs); the facts, or `None`
/// when the trace has neither memory events nor shapes.
pub fn attach(
    job: &mut Job,
    trace: &KinetoTrace,
    win: &StepWindow,
    timeline: &BTreeMap<Id, Vec<(i64, i64, OpId)>>,
    cx: &StepContext,
    optimizer: Option<&str>,
) -> Option<MemoryFacts> {
    let device = device_events(trace);
    if device.is_empty() {
        return from_shapes(job, trace, timeline, cx, optimizer);
    }
    let m = measure(&device, win);
    let step_thread = timeline.get(&win.tid);
    let mut paired = event_effects(job, trace, &device[m.first..m.end], timeline, step_thread);
    let carried = carry_in_blocks(job, step_thread, &mut paired.effects, paired.unpaired);
    move_saved_to_kernels(job, &mut paired.effects, paired.saved);
    job.local_mut().mem = paired.effects;
    settle_static(job, m.at_start, carried, m.peak);
    Some(MemoryFacts {
        source: if m.absolute {
            "profile_memory events (Total Allocated)".into()
        } else {
            "profile_memory events (Bytes, summed from the profiler's start)".into()
        },
        peak_bytes: m.peak,
        at_start_bytes: m.at_start,
        reserved_peak_bytes: m.reserved_peak_bytes,
        events: (m.end - m.first) as u64,
        absolute: m.absolute,
    })
}

/// The memory events of the device most of them are on, in time order (then event order).
fn device_events(trace: &KinetoTrace) -> Vec<&MemoryEvent> {
    let mut count: BTreeMap<i16, usize> = BTreeMap::new();
    for m in trace.memory.iter().filter(|m| m.on_device()) {
        *count.entry(m.device_id).or_default() += 1;
    }
    let dev = count.iter().max_by_key(|(_, n)| **n).map(|(d, _)| *d);
    let mut v: Vec<&MemoryEvent> = trace
        .memory
        .iter()
        .filter(|m| m.on_device() && Some(m.device_id) == dev)
        .collect();
    v.sort_by_key(|m| (m.ts_ns, m.event));
    v
}

/// What the memory events say about the step, before any op is involved.
struct Measured {
    /// Every event carries `Total Allocated` (else the levels are sums from the profiler's start).
    absolute: bool,
    /// The step's events: `device[first..end]`.
    first: usize,
    end: usize,
    /// The allocator's level at the step's start, and its highest level in the step (bytes).
    at_start: u64,
    peak: u64,
    /// Highest `Total Reserved` in the step, when recorded.
    reserved_peak_bytes: Option<u64>,
}

/// The allocator's level after each event (`Total Allocated`, else the running sum of `Bytes`),
/// and from it the step's events, its level at the start and its peak.
fn measure(device: &[&MemoryEvent], win: &StepWindow) -> Measured {
    let absolute = device.iter().all(|m| m.total_allocated.is_some());
    let mut level = Vec::with_capacity(device.len());
    let mut sum: i64 = 0;
    for m in device {
        sum = sum.saturating_add(m.bytes);
        level.push(if absolute {
            m.total_allocated.unwrap_or(sum)
        } else {
            sum
        });
    }
    let (lo, hi) = (win.start_ns, win.end_ns);
    let a = device.partition_point(|m| m.ts_ns < lo);
    let b = device.partition_point(|m| m.ts_ns < hi);
    let at_start = if a == 0 {
        if absolute {
            (device[0].total_allocated.unwrap_or(0) - device[0].bytes).max(0)
        } else {
            0
        }
    } else {
        level[a - 1]
    }
    .max(0) as u64;
    let peak = level[a..b]
        .iter()
        .copied()
        .fold(at_start as i64, i64::max)
        .max(0) as u64;
    let reserved_peak_bytes = device[a..b]
        .iter()
        .filter_map(|m| m.total_reserved)
        .max()
        .map(|r| r.max(0) as u64);
    Measured {
        absolute,
        first: a,
        end: b,
        at_start,
        peak,
        reserved_peak_bytes,
    }
}

/// The step's events as effects, with how their allocations and frees paired up.
struct Paired {
    effects: Vec<MemEffect>,
    /// (allocation, free) effect indices of blocks allocated in the forward and freed in the
    /// backward: saved activations.
    saved: Vec<(usize, usize)>,
    /// Frees of blocks allocated before the step.
    unpaired: Vec<usize>,
}

/// The timeline of the thread an event is on; thread ids are numbers on some events and strings
/// on others (2021 traces), so a failed lookup compares them as text. Else the step's thread.
fn event_thread<'a>(
    timeline: &'a BTreeMap<Id, Vec<(i64, i64, OpId)>>,
    tid: &Id,
    step_thread: Option<&'a Vec<(i64, i64, OpId)>>,
) -> Option<&'a Vec<(i64, i64, OpId)>> {
    timeline
        .get(tid)
        .or_else(|| {
            let want = tid.to_string();
            timeline
                .iter()
                .find(|(k, _)| k.to_string() == want)
                .map(|(_, v)| v)
        })
        .or(step_thread)
}

/// Each event as an effect of the op running when it happened on its thread, allocations paired
/// with their frees by address, else the latest unmatched allocation of the same size.
fn event_effects(
    job: &Job,
    trace: &KinetoTrace,
    events: &[&MemoryEvent],
    timeline: &BTreeMap<Id, Vec<(i64, i64, OpId)>>,
    step_thread: Option<&Vec<(i64, i64, OpId)>>,
) -> Paired {
    let mut out = Paired {
        effects: Vec::with_capacity(events.len()),
        saved: Vec::new(),
        unpaired: Vec::new(),
    };
    // Unmatched allocations: by address, else by size (the latest first).
    let mut open: BTreeMap<(bool, i64), Vec<usize>> = BTreeMap::new();
    for m in events {
        let e = &trace.events[m.event as usize];
        let tl = event_thread(timeline, &e.tid, step_thread);
        let Some(op) = tl.and_then(|tl| op_at(tl, m.ts_ns, m.bytes > 0)) else {
            continue;
        };
        let key = match m.addr {
            Some(addr) => (true, addr),
            None => (false, m.bytes.abs()),
        };
        let idx = out.effects.len();
        out.effects.push(MemEffect {
            op,
            worker: 0,
            bytes: m.bytes.unsigned_abs(),
            when: if m.bytes > 0 {
                MemWhen::AllocAtStart
            } else {
                MemWhen::FreeAtEnd
            },
        });
        if m.bytes > 0 {
            open.entry(key).or_default().push(idx);
        } else if let Some(j) = open.get_mut(&key).and_then(Vec::pop) {
            let phase = |o: OpId| job.local.ops[o as usize].spec.phase;
            if phase(out.effects[j].op) == Phase::Fw && phase(op) == Phase::Bw {
                out.saved.push((j, idx));
            }
        } else {
            out.unpaired.push(idx);
        }
    }
    out
}

/// A block the previous step allocated in its forward or backward and this one frees there:
/// allocated at the step's first forward op rather than counted in static memory, so that a pass
/// scaling this step's forward/backward memory (AMP, accumulation) scales it on both ends, as it
/// would have in the previous step. Returns the bytes so moved out of static memory.
fn carry_in_blocks(
    job: &Job,
    step_thread: Option<&Vec<(i64, i64, OpId)>>,
    effects: &mut Vec<MemEffect>,
    unpaired: Vec<usize>,
) -> u64 {
    let first_fw = step_thread.and_then(|tl| {
        tl.iter()
            .map(|x| x.2)
            .find(|&o| job.local.ops[o as usize].spec.phase == Phase::Fw)
    });
    let mut carried = 0u64;
    if let Some(f) = first_fw {
        for idx in unpaired {
            let e = effects[idx];
            if matches!(
                job.local.ops[e.op as usize].spec.phase,
                Phase::Fw | Phase::Bw
            ) {
                carried += e.bytes;
                effects.push(MemEffect {
                    op: f,
                    when: MemWhen::AllocAtStart,
                    ..e
                });
            }
        }
    }
    carried
}

/// Saved activations move to their layer's first forward kernel (allocation) and last backward
/// kernel (free), where recomputation looks for them.
fn move_saved_to_kernels(job: &Job, effects: &mut [MemEffect], saved: Vec<(usize, usize)>) {
    let kernels = layer_kernels(job);
    for (j, k) in saved {
        let layer = job.local.ops[effects[j].op as usize].spec.layer;
        if let Some(&(f, l)) = kernels.get(&layer) {
            effects[j].op = f;
            effects[k].op = l;
        }
    }
}

/// Static memory: the level at the step's start less what [`carry_in_blocks`] moved into the
/// step, then adjusted once so that the replayed step peaks at the measured `peak`.
fn settle_static(job: &mut Job, at_start: u64, carried: u64, peak: u64) {
    let base = at_start.saturating_sub(carried);
    job.local_mut().static_mem_bytes = base;
    if let Some(p) = replayed_peak(job) {
        job.local_mut().static_mem_bytes = (base as i128 + peak as i128 - p as i128).max(0) as u64;
    }
}

/// Tensors a forward operator keeps as parameters: (input index) by operator family.
fn parameter_inputs(name: &str) -> &'static [usize] {
    let s = name.strip_prefix("aten::").unwrap_or(name);
    match s {
        "conv1d" | "conv2d" | "conv3d" | "convolution" | "_convolution" | "cudnn_convolution"
        | "miopen_convolution" | "linear" => &[1, 2],
        "addmm" => &[0, 2],
        "batch_norm" | "native_batch_norm" | "cudnn_batch_norm" | "_batch_norm_impl_index" => {
            &[1, 2]
        }
        "layer_norm" | "native_layer_norm" | "group_norm" | "native_group_norm" => &[2, 3],
        "embedding" | "embedding_bag" | "_embedding_bag" => &[0],
        _ => &[],
    }
}

/// Operand positions of FBGEMM's lookup function
/// (`split_embedding_codegen_lookup_<optimizer>_function` in fbgemm_gpu's codegen: the autograd
/// placeholder, then `dev_weights`, `uvm_weights`, `lxu_cache_weights`, `weights_placements`,
/// `weights_offsets`, …, `lxu_cache_locations` at 16, then the optimizer's arguments).
const TBE_DEV_WEIGHTS: usize = 1;
const TBE_PLACEMENTS: usize = 4;
const TBE_OFFSETS: usize = 5;
const TBE_OPTIMIZER_ARGS: usize = 17;

/// Device bytes of one table-batched lookup's tables and optimizer state. The weights are
/// `dev_weights` (tables placed in UVM or host memory are in `uvm_weights` and take no device
/// memory). Each optimizer-state tensor comes as four operands like the weights' —
/// `<state>_dev`, `<state>_uvm`, `<state>_placements`, `<state>_offsets` — and is recognised by
/// its placements and offsets having the weights' shapes (one entry per table); its `_dev`
/// part counts. Element sizes come from `Input type` (4 B where it is missing).
fn table_bytes(ins: &[Input], types: &[String]) -> u64 {
    let bytes = |i: usize| -> f64 {
        let elem = types
            .get(i)
            .and_then(|t| shapes::float_dtype(t))
            .map_or(4, |d| d.bytes());
        ins.get(i).map_or(0.0, Input::elems) * elem as f64
    };
    let dims = |i: usize| ins.get(i).and_then(Input::dims);
    let (Some(placements), Some(offsets)) = (dims(TBE_PLACEMENTS), dims(TBE_OFFSETS)) else {
        return 0;
    };
    let mut total = bytes(TBE_DEV_WEIGHTS);
    for i in TBE_OPTIMIZER_ARGS..ins.len().saturating_sub(3) {
        let one_dim = |j: usize| dims(j).is_some_and(|d| d.len() == 1);
        if one_dim(i)
            && one_dim(i + 1)
            && dims(i + 2) == Some(placements)
            && dims(i + 3) == Some(offsets)
        {
            total += bytes(i);
        }
    }
    total as u64
}

/// Optimizer state tensors per parameter.
fn state_per_param(optimizer: Option<&str>) -> u64 {
    match optimizer.map(str::to_ascii_lowercase).as_deref() {
        Some(o) if o.contains("adam") || o.contains("lamb") => 2,
        Some(o) if o.contains("sgd") || o.contains("adagrad") || o.contains("rmsprop") => 1,
        _ => 1,
    }
}

/// The estimate from shapes (see the module docs).
fn from_shapes(
    job: &mut Job,
    trace: &KinetoTrace,
    timeline: &BTreeMap<Id, Vec<(i64, i64, OpId)>>,
    cx: &StepContext,
    optimizer: Option<&str>,
) -> Option<MemoryFacts> {
    let ev = &trace.events;
    // Outermost shaped forward operators only (conv2d ⊃ convolution ⊃ cudnn_convolution).
    let shaped: std::collections::BTreeSet<usize> = cx.forward_shaped.iter().copied().collect();
    let outer: Vec<usize> = cx
        .forward_shaped
        .iter()
        .copied()
        .filter(|&i| !cx.chain(i).iter().skip(1).any(|p| shaped.contains(p)))
        .collect();
    if outer.is_empty() && cx.table_lookups.is_empty() {
        return None;
    }
    let kernels = layer_kernels(job);
    let mut params = 0.0f64;
    let mut effects = Vec::new();
    for &i in &outer {
        let e = &ev[i];
        let Some(ins) = e.args.input_dims.as_deref().and_then(shapes::parse_dims) else {
            continue;
        };
        for &p in parameter_inputs(&e.name) {
            params += ins.get(p).map_or(0.0, Input::elems);
        }
        let types = e
            .args
            .input_type
            .as_deref()
            .map(shapes::parse_types)
            .unwrap_or_default();
        let Some(x) = ins.iter().position(|d| d.dims().is_some()) else {
            continue;
        };
        let elem = types
            .get(x)
            .and_then(|t| shapes::float_dtype(t))
            .map_or(4, |d| d.bytes());
        let bytes = (ins[x].elems() * elem as f64) as u64;
        // Only an operator autograd recorded (it carries a sequence number) saves its input
        // for a backward: one run under `no_grad` (FSDP2's copy-in and copy-out, an
        // optimizer's or a metric's ops) keeps nothing.
        if e.args.seq.filter(|&s| s >= 0).is_none() {
            continue;
        }
        let layer = timeline
            .get(&e.tid)
            .and_then(|tl| op_at(tl, e.ts_ns, true))
            .map(|o| job.local.ops[o as usize].spec.layer);
        if let Some(&(f, l)) = layer.and_then(|l| kernels.get(&l))
            && bytes > 0
        {
            effects.push(MemEffect {
                op: f,
                worker: 0,
                bytes,
                when: MemWhen::AllocAtStart,
            });
            effects.push(MemEffect {
                op: l,
                worker: 0,
                bytes,
                when: MemWhen::FreeAtEnd,
            });
        }
    }
    let tables: u64 = cx
        .table_lookups
        .iter()
        .filter_map(|&i| {
            let e = &ev[i];
            let ins = e.args.input_dims.as_deref().and_then(shapes::parse_dims)?;
            let types = e.args.input_type.as_deref().map(shapes::parse_types);
            Some(table_bytes(&ins, &types.unwrap_or_default()))
        })
        .sum();
    let weights = (params * 4.0) as u64;
    job.local_mut().static_mem_bytes = weights * (2 + state_per_param(optimizer)) + tables;
    job.local_mut().mem = effects;
    let peak = replayed_peak(job)?;
    Some(MemoryFacts {
        source: format!(
            "estimate from shapes (no profile_memory events): weights, gradients, optimizer \
             state{}, each forward operator's saved input",
            if tables > 0 {
                ", embedding tables with their fused optimizer state"
            } else {
                ""
            }
        ),
        peak_bytes: peak,
        at_start_bytes: job.local.static_mem_bytes,
        reserved_peak_bytes: None,
        events: 0,
        absolute: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_belong_to_the_running_op_or_its_neighbours() {
        let tl = [(0, 10, 1), (10, 20, 2), (30, 40, 3)];
        assert_eq!(op_at(&tl, 5, true), Some(1));
        assert_eq!(op_at(&tl, 10, false), Some(2));
        // Idle time 20–30: an allocation goes to the next op, a free to the previous one.
        assert_eq!(op_at(&tl, 25, true), Some(3));
        assert_eq!(op_at(&tl, 25, false), Some(2));
        assert_eq!(op_at(&tl, 50, true), Some(3));
        assert_eq!(op_at(&[], 5, true), None);
    }

    /// The operands of the lookup in the shared DLRM trace (rank 1, Adagrad): 640,339,856 fp32
    /// weights and as many fp32 `momentum1` values on the device; UVM and cache empty.
    #[test]
    fn table_batched_lookups_count_weights_and_device_state() {
        let dims = "[[0], [640339856], [0], [0, 0], [3], [3], [4], [], [], [4], [], [1792], [385], \
                    [], [], [], [0], [], [], [], [640339856], [0], [3], [3], [], [], []]";
        let ins = shapes::parse_dims(dims).unwrap();
        let mut types = vec!["float".to_string(); ins.len()];
        assert_eq!(table_bytes(&ins, &types), 2 * 640_339_856 * 4);
        // Half-precision tables: the weights at 2 B, the fp32 state at 4 B.
        types[1] = "c10::Half".into();
        assert_eq!(table_bytes(&ins, &types), 640_339_856 * (2 + 4));
        // Tables in UVM: nothing on the device but the state's device part.
        let uvm = dims.replacen("[640339856], [0]", "[0], [640339856]", 1);
        let ins = shapes::parse_dims(&uvm).unwrap();
        assert_eq!(table_bytes(&ins, &types), 640_339_856 * 4);
        // Without optimizer operands (SGD) only the device weights count: none, they are in UVM.
        assert_eq!(table_bytes(&ins[..17], &types), 0);
        assert!(super::super::work::is_table_lookup(
            "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function"
        ));
        assert!(!super::super::work::is_table_lookup(
            "fbgemm::dense_embedding_codegen_lookup_function"
        ));
    }

    #[test]
    fn optimizer_state() {
        assert_eq!(state_per_param(Some("Adam")), 2);
        assert_eq!(state_per_param(Some("SGD")), 1);
        assert_eq!(parameter_inputs("aten::addmm"), &[0, 2]);
    }
}
