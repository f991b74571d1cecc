//! Peak memory per worker from a replay: static bytes (weights, gradients, optimizer state) plus
//! the running sum of the graph's allocation and free events placed at the replayed times.
//!
//! At equal times frees are applied before allocations (the caching allocator hands a freed block
//! to the next request), so a buffer freed exactly when another is allocated is not counted twice.
//!
//! [`rank_peaks`] plays the peak worker's events through the allocator model of
//! [`crate::cost::memory`] for the reserved and device-used peaks.

use crate::cost::memory::{Event, MemoryPeaks, MemorySpec, segments_peak};
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
    ) -> MemoryReport {
        self.peaks = rank_peaks(g, r, &self, spec, communicators);
        self
    }
}

/// The three peaks of the report's peak worker: its allocated peak, its events (static bytes
/// first, then every allocation and free at its replayed time, frees first at equal times)
/// played through the allocator model for the reserved peak, and the runtime terms
/// (`communicators`: NCCL communicators the rank holds).
pub fn rank_peaks(
    g: &Dfg,
    r: &Replay,
    m: &MemoryReport,
    spec: &MemorySpec,
    communicators: u32,
) -> MemoryPeaks {
    let w = m.peak_worker;
    let mut events: Vec<(u64, u8, u64)> = Vec::new();
    for e in g.mem_effects().iter().filter(|e| e.worker == w) {
        let (s, t) = (r.start_ns[e.op as usize], r.end_ns[e.op as usize]);
        match e.when {
            MemWhen::AllocAtStart => events.push((s, 1, e.bytes)),
            MemWhen::FreeAtEnd => events.push((t, 0, e.bytes)),
            MemWhen::During => {
                events.push((s, 1, e.bytes));
                events.push((t, 0, e.bytes));
            }
        }
    }
    events.sort_unstable();
    let statics = g.static_memory().get(w as usize).copied().unwrap_or(0);
    let stream = std::iter::once(Event::Alloc(statics)).chain(events.iter().map(|&(_, k, b)| {
        if k == 1 {
            Event::Alloc(b)
        } else {
            Event::Free(b)
        }
    }));
    let segments = segments_peak(spec, stream);
    MemoryPeaks::combine(spec, m.peak_bytes, statics, segments, communicators)
}

/// Compute the peak memory of every worker.
pub fn peak_memory(g: &Dfg, r: &Replay) -> MemoryReport {
    let workers = g.workers().max(1) as usize;
    // (worker, time, 0 = free / 1 = alloc, bytes)
    let mut events: Vec<(u32, u64, u8, u64)> = Vec::with_capacity(g.mem_effects().len());
    for m in g.mem_effects() {
        let (s, e) = (r.start_ns[m.op as usize], r.end_ns[m.op as usize]);
        match m.when {
            MemWhen::AllocAtStart => events.push((m.worker, s, 1, m.bytes)),
            MemWhen::FreeAtEnd => events.push((m.worker, e, 0, m.bytes)),
            MemWhen::During => {
                events.push((m.worker, s, 1, m.bytes));
                events.push((m.worker, e, 0, m.bytes));
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
    for &(w, t, kind, bytes) in &events {
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
        peaks: MemoryPeaks::default(),
    }
}
