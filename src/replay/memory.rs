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

use crate::graph::{Dfg, MemWhen};

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
}

/// Compute the peak memory of every worker.
pub fn peak_memory(g: &Dfg, r: &Replay) -> MemoryReport {
    let workers = g.workers().max(1) as usize;
    // Each op's position in the topological order: the order of events at one instant.
    let mut pos = vec![0u32; g.op_count()];
    for (i, &op) in g.topo_order().iter().enumerate() {
        pos[op as usize] = i as u32;
    }
    // (worker, time, 0 = a free of an op that started earlier / 1 = the rest, topological
    // position, 0 = at its start / 1 = at its end, 0 = free / 1 = alloc, bytes)
    type Ev = (u32, u64, u8, u32, u8, u8, u64);
    let mut events: Vec<Ev> = Vec::with_capacity(g.mem_effects().len());
    for m in g.mem_effects() {
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
    events.sort_unstable();
    let statics = g.static_memory();
    let mut per_worker_bytes: Vec<u64> = (0..workers)
        .map(|w| statics.get(w).copied().unwrap_or(0))
        .collect();
    let mut peak_at = vec![0u64; workers];
    let mut cur: i128 = 0;
    let mut cur_worker = u32::MAX;
    for &(w, t, _, _, _, kind, bytes) in &events {
        if w != cur_worker {
            cur_worker = w;
            cur = 0;
        }
        if kind == 1 {
            cur += bytes as i128;
        } else {
            cur -= bytes as i128;
        }
        let Some(slot) = per_worker_bytes.get_mut(w as usize) else {
            continue;
        };
        let base = statics.get(w as usize).copied().unwrap_or(0) as i128;
        let total = (base + cur).max(0) as u64;
        if total > *slot {
            *slot = total;
            peak_at[w as usize] = t;
        }
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
    }
}
