//! Peak memory per worker from a replay: static bytes (weights, gradients, optimizer state) plus
//! the running sum of the graph's allocation and free events placed at the replayed times.
//!
//! At equal times the frees of ops that ended then (having started earlier) are applied first (the
//! caching allocator hands a freed block to the next request), so a buffer freed exactly when
//! another is allocated is not counted twice. The other events at that time — ops starting then,
//! and ops that take no time — follow the graph's dependencies (its topological order; an op's
//! allocations before its frees), not the order of their numbers: a pass that scales durations to
//! 0 puts an activation's allocation and its free at one instant, and the free must still come
//! after the allocation it depends on.
//!
//! **Invariant:** memory follows dependencies: replays that differ only in when ops run, not in
//! what depends on what, see each buffer allocated before it is freed.
//!
//! [`rank_peaks`] plays the peak worker's events through the allocator model of
//! [`crate::cost::memory`] for the reserved and device-used peaks.

use crate::cost::memory::{Event, MemoryPeaks, MemorySpec, run_allocator};
use crate::graph::{Dfg, MemEffect, MemWhen};

use super::Replay;

/// Peak memory of each worker in the graph.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Peak bytes of each worker.
    pub per_worker_bytes: Vec<u64>,
    /// The largest of them.
    pub peak_bytes: u64,
    /// The worker that reaches it (the lowest id on ties).
    pub peak_worker: u32,
    /// When it is reached, ns.
    pub peak_at_ns: u64,
    /// The peak worker's allocated, reserved and device-used peaks ([`rank_peaks`]; all zero
    /// until it is computed).
    pub peaks: MemoryPeaks,
}

impl MemoryReport {
    /// This report with its three peaks computed ([`rank_peaks`]).
    pub fn with_peaks(
        mut self,
        g: &Dfg,
        r: &Replay,
        spec: &MemorySpec,
        communicators: u32,
        capacity: u64,
    ) -> MemoryReport {
        self.peaks = rank_peaks(g, r, &self, spec, communicators, capacity);
        self
    }
}

/// The three peaks of the report's peak worker: its allocated peak, its events (static bytes
/// first, then every allocation and free at its replayed time, frees first at equal times)
/// played through the allocator model for the reserved peak, and the runtime terms
/// (`communicators`: NCCL communicators the rank holds). `capacity` is the GPU's memory: the
/// allocator releases its empty cached segments before it would pass what the context, NCCL
/// and the workspace leave of it, or the framework's pool cap ([`MemorySpec::pool_bytes`]),
/// whichever is lower; what the framework keeps out of its pool is the breakdown's
/// `kept_out_bytes`.
pub fn rank_peaks(
    g: &Dfg,
    r: &Replay,
    m: &MemoryReport,
    spec: &MemorySpec,
    communicators: u32,
    capacity: u64,
) -> MemoryPeaks {
    let w = m.peak_worker;
    // The peak worker's events in the order `peak_memory` plays them (memory follows
    // dependencies at one instant), reduced to (time, 0 = free / 1 = alloc, bytes).
    let events: Vec<(u64, u8, u64)> = ordered_events(g, r, Some(w))
        .into_iter()
        .map(|(_, t, _, _, _, kind, bytes)| (t, kind, bytes))
        .collect();
    let statics = spec.scaled(g.static_memory().get(w as usize).copied().unwrap_or(0));
    let stream =
        std::iter::once(Event::Alloc(statics)).chain(same_storage(&events).into_iter().map(|e| {
            match e {
                Event::Alloc(b) => Event::Alloc(spec.scaled(b)),
                Event::Free(b) => Event::Free(spec.scaled(b)),
            }
        }));
    let left = capacity
        .saturating_sub(spec.context_bytes())
        .saturating_sub(spec.nccl_bytes(communicators))
        .saturating_sub(spec.workspace_bytes);
    // A framework that caps its pool (TensorFlow, XLA) releases cached regions at the cap.
    let limit = spec
        .pool_bytes(capacity)
        .map_or(left, |pool| left.min(pool));
    let run = run_allocator(spec, limit, stream);
    // Allocated: the liveness peak, which follows dependencies (issue 20: a what-if that only
    // moves when ops run, such as durations scaled to 0, must not change it). How the
    // allocator's blocks round and split requests depends on the order they arrive in; that
    // is the reserve's part (`run.segments`), not the allocated peak's.
    let mut p = MemoryPeaks::combine(
        spec,
        spec.scaled(m.peak_bytes),
        statics,
        run.segments,
        communicators,
    );
    p.breakdown.kept_out_bytes = spec.kept_out_bytes(capacity, communicators);
    p
}

/// The allocator's view of one worker's `(time, 0 = free / 1 = alloc, bytes)` events, in the
/// order they happen (`ordered_events`): at one instant, a free followed by an allocation of the
/// same size are one tensor living on (an op's output freed as its own tensor and allocated
/// again as its consumer's saved input, in the graph's bookkeeping, is one storage in the
/// framework), so such pairs cancel; every other event keeps its place, so memory still follows
/// dependencies (an allocation is never moved after the free that depends on it).
fn same_storage(events: &[(u64, u8, u64)]) -> Vec<Event> {
    let mut out = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        let j = i + events[i..].partition_point(|e| e.0 == t);
        let mut keep = vec![true; j - i];
        // Each allocation cancels the earliest unmatched equal-sized free before it.
        let mut open: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
        for (k, e) in events[i..j].iter().enumerate() {
            if e.1 == 0 {
                open.entry(e.2).or_default().push(k);
            } else if let Some(f) = open
                .get_mut(&e.2)
                .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
            {
                keep[f] = false;
                keep[k] = false;
            }
        }
        for (k, e) in events[i..j].iter().enumerate() {
            if keep[k] {
                out.push(if e.1 == 0 {
                    Event::Free(e.2)
                } else {
                    Event::Alloc(e.2)
                });
            }
        }
        i = j;
    }
    out
}

/// Every worker's allocation and free events at their replayed times, sorted by (worker, time,
/// 0 = a free of an op that started earlier / 1 = the rest, topological position, 0 = at its
/// start / 1 = at its end, 0 = free / 1 = alloc, bytes): at one instant the frees of ops that
/// ended then come first (the caching allocator hands a freed block to the next request), the
/// rest follow the graph's dependencies.
type Ev = (u32, u64, u8, u32, u8, u8, u64);

/// Each op's position in the topological order: the order of events at one instant.
fn topo_positions(g: &Dfg) -> Vec<u32> {
    let mut pos = vec![0u32; g.op_count()];
    for (i, &op) in g.topo_order().iter().enumerate() {
        pos[op as usize] = i as u32;
    }
    pos
}

/// Append the events of `effects` (one worker's) to `events`, unsorted.
fn push_events<'a>(
    r: &Replay,
    pos: &[u32],
    effects: impl Iterator<Item = &'a MemEffect>,
    events: &mut Vec<Ev>,
) {
    for m in effects {
        let op = m.op as usize;
        let (s, e) = (r.start_ns[op], r.end_ns[op]);
        let p = pos[op];
        let free_class = u8::from(s == e);
        match m.when {
            MemWhen::AllocAtStart => events.push((m.worker, s, 1, p, 0, 1, m.bytes)),
            MemWhen::FreeAtEnd => events.push((m.worker, e, free_class, p, 1, 0, m.bytes)),
            MemWhen::During => {
                events.push((m.worker, s, 1, p, 0, 1, m.bytes));
                events.push((m.worker, e, free_class, p, 1, 0, m.bytes));
            }
        }
    }
}

/// `only`: one worker's events (the others are not collected).
fn ordered_events(g: &Dfg, r: &Replay, only: Option<u32>) -> Vec<Ev> {
    let pos = topo_positions(g);
    let mut events: Vec<Ev> = Vec::new();
    push_events(
        r,
        &pos,
        g.mem_effects()
            .iter()
            .filter(|m| only.is_none_or(|w| m.worker == w)),
        &mut events,
    );
    events.sort_unstable();
    events
}

/// The graph's memory effects grouped by worker, in worker order: `(worker, indices into
/// mem_effects)`. A graph built worker by worker (every expanded job) is already grouped, and
/// its groups are contiguous ranges; otherwise the indices are bucketed (stable) by worker.
fn effects_by_worker(effects: &[MemEffect]) -> Vec<(u32, Vec<u32>)> {
    let mut groups: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (i, m) in effects.iter().enumerate() {
        groups.entry(m.worker).or_default().push(i as u32);
    }
    groups.into_iter().collect()
}

/// Compute the peak memory of every worker: one worker's events at a time (sorted and summed
/// alone), so the pass holds one worker's events, not the whole graph's (issue 28: 435 MB of
/// events for BERT-base on 1,024 GPUs, three times the graph).
pub fn peak_memory(g: &Dfg, r: &Replay) -> MemoryReport {
    let workers = g.workers().max(1) as usize;
    let statics = g.static_memory();
    let mut per_worker_bytes: Vec<u64> = (0..workers)
        .map(|w| statics.get(w).copied().unwrap_or(0))
        .collect();
    let mut peak_at = vec![0u64; workers];
    let pos = topo_positions(g);
    let effects = g.mem_effects();
    let mut events: Vec<Ev> = Vec::new();
    // Contiguous runs of one worker (the usual layout) need no index.
    let contiguous = effects.windows(2).all(|p| p[0].worker <= p[1].worker);
    let groups: Vec<(u32, std::ops::Range<usize>)> = if contiguous {
        let mut out = Vec::new();
        let mut i = 0;
        while i < effects.len() {
            let w = effects[i].worker;
            let j = i + effects[i..].partition_point(|m| m.worker == w);
            out.push((w, i..j));
            i = j;
        }
        out
    } else {
        Vec::new()
    };
    let scattered = if contiguous {
        Vec::new()
    } else {
        effects_by_worker(effects)
    };
    let mut scan = |w: u32, events: &mut Vec<Ev>| {
        events.sort_unstable();
        let Some(slot) = per_worker_bytes.get_mut(w as usize) else {
            return;
        };
        let base = statics.get(w as usize).copied().unwrap_or(0) as i128;
        let mut cur: i128 = 0;
        for &(_, t, _, _, _, kind, bytes) in events.iter() {
            if kind == 1 {
                cur += bytes as i128;
            } else {
                cur -= bytes as i128;
            }
            let total = (base + cur).max(0) as u64;
            if total > *slot {
                *slot = total;
                peak_at[w as usize] = t;
            }
        }
    };
    for (w, range) in groups {
        events.clear();
        push_events(r, &pos, effects[range].iter(), &mut events);
        scan(w, &mut events);
    }
    for (w, idx) in scattered {
        events.clear();
        push_events(
            r,
            &pos,
            idx.iter().map(|&i| &effects[i as usize]),
            &mut events,
        );
        scan(w, &mut events);
    }
    let (peak_worker, &peak_bytes) = per_worker_bytes
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .unwrap_or((0, &0));
    MemoryReport {
        peak_at_ns: peak_at.get(peak_worker).copied().unwrap_or(0),
        peak_worker: peak_worker as u32,
        peak_bytes,
        per_worker_bytes,
        peaks: MemoryPeaks::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_equal_free_and_allocation_at_one_instant_are_one_tensor() {
        // t=0: 100 B allocated; t=5: 100 B freed and 100 B + 50 B allocated (the 100 B pair is
        // one tensor living on); t=9: 50 B freed.
        let ev = [
            (0, 1, 100),
            (5, 0, 100),
            (5, 1, 50),
            (5, 1, 100),
            (9, 0, 50),
        ];
        assert_eq!(
            same_storage(&ev),
            vec![Event::Alloc(100), Event::Alloc(50), Event::Free(50)]
        );
        // Unequal sizes stay where they are.
        assert_eq!(
            same_storage(&[(3, 0, 64), (3, 1, 128)]),
            vec![Event::Free(64), Event::Alloc(128)]
        );
        // An allocation before an equal-sized free at the same instant (an op that takes no
        // time: its buffer is allocated, then freed) is not one tensor: both stay, in order.
        assert_eq!(
            same_storage(&[(3, 1, 64), (3, 0, 64)]),
            vec![Event::Alloc(64), Event::Free(64)]
        );
    }
}
