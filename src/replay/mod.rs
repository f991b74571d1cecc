//! The replayer (dPRO §4.3): predicts when every op of a [`Dfg`] starts and ends.
//!
//! Each device has one queue and one clock. An op is enqueued on its device when all its
//! predecessors have ended (its *ready* time is the latest of their ends). Repeatedly, the device
//! whose next op can start earliest runs it: start = max(device clock, ready), end = start +
//! duration, and the device's clock becomes end + gap. Among ops that are ready when a device
//! frees up, the lowest scheduling priority runs first, then the earliest ready, then the lowest
//! op id; devices tie by id. Ops on [`DeviceKind::Virtual`] start the moment they are ready. The
//! iteration time is the latest end.
//!
//! Of the predecessors that end last, the lowest id is the op's binding one.
//!
//! Two engines give this schedule: `ordered` (one heap of ops) for graphs without priorities,
//! `Engine` (a heap of devices over a queue per device) for graphs with them.
//!
//! Everything is integer nanoseconds, so a replay is exact and deterministic.
//!
//! **Invariant:** the replayer does no IO and never fails: a frozen [`Dfg`] is acyclic, so every
//! op is replayed.

/// [`Schedule`] for an engine whose per-op state is in its fields `left`, `ready`, `ready_by`,
/// `end` and `stack`, and which frees an op with its method `$free`.
macro_rules! schedule_by_fields {
    ($engine:ident, $free:ident) => {
        impl<'g> Schedule<'g> for $engine<'g> {
            #[inline]
            fn graph(&self) -> &'g Dfg {
                self.g
            }

            #[inline]
            fn ops(&mut self) -> OpState<'_> {
                OpState {
                    left: &mut self.left,
                    ready: &mut self.ready,
                    ready_by: &mut self.ready_by,
                    end: &mut self.end,
                    stack: &mut self.stack,
                }
            }

            #[inline]
            fn free(&mut self, op: OpId) {
                self.$free(op);
            }
        }
    };
}

pub mod breakdown;
pub mod critical;
mod devheap;
pub mod memory;
mod ordered;
mod radix;
pub mod steady;
pub mod timeline;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::graph::{DeviceKind, Dfg, NONE, OpId};
use devheap::{DeviceHeap, Pending};

pub use critical::{CriticalPath, critical_path, dependency_bound_ns};
pub use memory::{MemoryReport, peak_memory};

/// The replayed schedule of a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Start of every op, ns from the start of the iteration.
    pub start_ns: Vec<u64>,
    /// End of every op.
    pub end_ns: Vec<u64>,
    /// The op whose end set this op's start: a dependency or the previous op on the same device
    /// (the execution graph's edge on the critical path); [`NONE`] when nothing delayed it.
    pub binding: Vec<OpId>,
    /// Sum of the durations run on each device.
    pub device_busy_ns: Vec<u64>,
    /// The latest end.
    pub iteration_ns: u64,
    /// An op that ends last (the lowest id among them); [`NONE`] for an empty graph.
    pub last_op: OpId,
}

impl Replay {
    /// The replay of a finished schedule: each op's start, end and binding predecessor, each
    /// device's busy time; the latest end and the lowest op that ends then.
    fn of(start_ns: Vec<u64>, end_ns: Vec<u64>, binding: Vec<OpId>, busy: Vec<u64>) -> Replay {
        let mut iteration_ns = 0;
        let mut last_op = NONE;
        for (o, &e) in end_ns.iter().enumerate() {
            if e > iteration_ns || last_op == NONE {
                iteration_ns = e;
                last_op = o as OpId;
            }
        }
        Replay {
            start_ns,
            end_ns,
            binding,
            device_busy_ns: busy,
            iteration_ns,
            last_op,
        }
    }

    /// The busiest device's busy time.
    pub fn max_device_busy_ns(&self) -> u64 {
        self.device_busy_ns.iter().copied().max().unwrap_or(0)
    }
}

/// Replay the whole graph from time 0.
pub fn replay(g: &Dfg) -> Replay {
    run(g, None)
}

/// Replay with the device engine whatever the graph's priorities: the engine graphs with
/// priorities get, kept callable so benches and tests can hold the op-heap engine to it.
pub fn replay_by_device(g: &Dfg) -> Replay {
    Engine::new(g, None).run()
}

/// The op-heap engine ([`ordered`]) where no op has a priority, the device engine otherwise (the same
/// schedule where both apply).
fn run(g: &Dfg, release: Option<&[u64]>) -> Replay {
    if g.priorities().iter().any(|&p| p != 0) {
        Engine::new(g, release).run()
    } else {
        ordered::replay(g, release)
    }
}

/// Replay with per-op release times: no op starts before `release_ns[op]` (used by partial
/// replay, where the ops outside the sub-graph are already placed).
pub fn replay_with_release(g: &Dfg, release_ns: &[u64]) -> Replay {
    assert_eq!(release_ns.len(), g.op_count(), "one release time per op");
    run(g, Some(release_ns))
}

/// Result of replaying part of a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialReplay {
    /// The sub-graph's ops, in the parent graph's ids.
    pub ops: Vec<OpId>,
    /// Their replayed schedule, indexed like `ops`.
    pub replay: Replay,
    /// The earliest start among them.
    pub first_start_ns: u64,
}

impl PartialReplay {
    /// Latest end minus earliest start: the span the sub-graph takes (e.g. a tensor's t_sync).
    pub fn span_ns(&self) -> u64 {
        self.replay.iteration_ns.saturating_sub(self.first_start_ns)
    }
}

/// Replay only `ops` (for the search's t_sync estimates): predecessors outside the set are taken
/// as done at their end in `base` (or at 0 without a base); devices start idle. Same semantics as
/// a full replay of the induced sub-graph.
pub fn partial_replay(g: &Dfg, ops: &[OpId], base: Option<&Replay>) -> PartialReplay {
    let mut inside = vec![false; g.op_count()];
    for &o in ops {
        inside[o as usize] = true;
    }
    let (sub, map) = g.induced(ops);
    let release: Vec<u64> = map
        .iter()
        .map(|&o| {
            g.preds(o)
                .iter()
                .filter(|&&p| !inside[p as usize])
                .map(|&p| base.map_or(0, |b| b.end_ns[p as usize]))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let replay = replay_with_release(&sub, &release);
    let first_start_ns = replay.start_ns.iter().copied().min().unwrap_or(0);
    PartialReplay {
        ops: map,
        replay,
        first_start_ns,
    }
}

/// What both engines keep per op, as [`release_succs`] and [`drain_virtual`] see it.
struct OpState<'a> {
    /// Predecessors not yet ended.
    left: &'a mut [u32],
    /// Latest predecessor end so far; the op's start once it runs.
    ready: &'a mut [u64],
    /// The predecessor that set `ready`; the binding one once the op runs.
    ready_by: &'a mut [OpId],
    end: &'a mut [u64],
    /// Released ops of the virtual device, not yet run.
    stack: &'a mut Vec<OpId>,
}

/// An engine, to the release rules both share.
trait Schedule<'g> {
    fn graph(&self) -> &'g Dfg;
    fn ops(&mut self) -> OpState<'_>;
    /// Every predecessor of `op` has ended: queue it (the virtual device's ops on the stack).
    fn free(&mut self, op: OpId);
}

/// `op` ended at `end`: each successor's ready time and binding predecessor — of the
/// predecessors that end last, the lowest id binds, the same whatever order they ran in (both
/// engines agree) — and those whose predecessors have all ended are freed.
#[inline]
fn release_succs<'g>(e: &mut impl Schedule<'g>, op: OpId, end: u64) {
    for &s in e.graph().succs(op) {
        let si = s as usize;
        let st = e.ops();
        if end > st.ready[si] || end == st.ready[si] && op < st.ready_by[si] {
            st.ready[si] = end;
            st.ready_by[si] = op;
        }
        st.left[si] -= 1;
        if st.left[si] == 0 {
            e.free(s);
        }
    }
}

/// `op` ran from `start` to `end`, its start set by `why`: its times are kept (the ready time
/// becomes the start, the latest predecessor the binding one) and its successors released.
#[inline]
fn ran<'g>(e: &mut impl Schedule<'g>, op: OpId, start: u64, end: u64, why: OpId) {
    let st = e.ops();
    let i = op as usize;
    st.ready[i] = start;
    st.end[i] = end;
    st.ready_by[i] = why;
    release_succs(e, op, end);
}

/// Run the freed ops of the virtual device: they start when ready, in parallel.
fn drain_virtual<'g>(e: &mut impl Schedule<'g>) {
    let g = e.graph();
    loop {
        let st = e.ops();
        let Some(op) = st.stack.pop() else { return };
        let i = op as usize;
        let end = st.ready[i].saturating_add(g.dur_ns(op));
        st.end[i] = end;
        release_succs(e, op, end);
    }
}

/// One device's queue of ready ops.
#[derive(Default)]
struct Queue {
    /// Ready ops by (ready time, op id).
    pending: Pending,
    /// With priorities: ops ready by the device clock, by (priority, ready, op id).
    avail: BinaryHeap<Reverse<(i32, u64, OpId)>>,
    clock: u64,
    prev: OpId,
}

struct Engine<'g> {
    g: &'g Dfg,
    virt: Vec<bool>,
    prios: bool,
    left: Vec<u32>,
    /// Latest predecessor end so far; overwritten with the op's start when it runs.
    ready: Vec<u64>,
    /// The predecessor that set `ready`; overwritten with the binding predecessor when it runs.
    ready_by: Vec<OpId>,
    end: Vec<u64>,
    busy: Vec<u64>,
    queues: Vec<Queue>,
    /// Devices with work, by (earliest start of their next op, device id).
    heap: DeviceHeap,
    stack: Vec<OpId>,
    /// Contention: the worker of each GPU stream (compute side) and the two workers whose GPUs
    /// a communication device keeps busy (a comm stream's worker twice; a link's sender and
    /// receiver), `u32::MAX` otherwise.
    gpu_worker: Vec<u32>,
    comm_worker: Vec<(u32, u32)>,
    /// Per worker, the latest end of a communication op started so far.
    comm_until: Vec<u64>,
    contention_ppm: u64,
}

impl<'g> Engine<'g> {
    fn new(g: &'g Dfg, release: Option<&[u64]>) -> Self {
        let n = g.op_count();
        let nd = g.device_count();
        let left: Vec<u32> = (0..n as OpId).map(|o| g.preds(o).len() as u32).collect();
        Engine {
            g,
            virt: g
                .devices()
                .iter()
                .map(|d| *d == DeviceKind::Virtual)
                .collect(),
            prios: g.priorities().iter().any(|&p| p != 0),
            left,
            ready: release.map_or_else(|| vec![0; n], <[u64]>::to_vec),
            ready_by: vec![NONE; n],
            end: vec![0; n],
            busy: vec![0; nd],
            queues: (0..nd)
                .map(|_| Queue {
                    prev: NONE,
                    ..Queue::default()
                })
                .collect(),
            heap: DeviceHeap::new(nd),
            stack: Vec::new(),
            gpu_worker: g
                .devices()
                .iter()
                .map(|d| match d {
                    DeviceKind::GpuStream { worker, .. } => *worker,
                    _ => u32::MAX,
                })
                .collect(),
            comm_worker: g
                .devices()
                .iter()
                .map(|d| match d {
                    DeviceKind::CommStream { worker } => (*worker, *worker),
                    DeviceKind::Link { from, to, .. } => (*from, *to),
                    _ => (u32::MAX, u32::MAX),
                })
                .collect(),
            comm_until: vec![0; g.workers().max(1) as usize],
            contention_ppm: u64::from(g.contention_ppm()),
        }
    }

    fn run(mut self) -> Replay {
        let g = self.g;
        for o in 0..g.op_count() as OpId {
            if self.left[o as usize] == 0 {
                self.enqueue(o);
            }
        }
        drain_virtual(&mut self);
        // The device stays in the heap while it runs its op: its key moves in place afterwards.
        while let Some((_, d)) = self.heap.peek() {
            let op = self.pick(d as usize);
            self.execute(op, d as usize);
            drain_virtual(&mut self);
            self.reschedule(d as usize);
        }
        Replay::of(self.ready, self.end, self.ready_by, self.busy)
    }

    /// Take the op device `d` runs next (its queue is non-empty).
    #[inline]
    fn pick(&mut self, d: usize) -> OpId {
        let q = &mut self.queues[d];
        if !self.prios {
            let (_, op) = q.pending.pop().expect("scheduled device has work");
            return op;
        }
        let horizon = match q.avail.peek() {
            Some(_) => q.clock,
            None => q.pending.peek().map_or(q.clock, |(r, _)| r.max(q.clock)),
        };
        while let Some((r, op)) = q.pending.peek() {
            if r > horizon {
                break;
            }
            q.pending.pop();
            q.avail.push(Reverse((self.g.priority(op), r, op)));
        }
        let Reverse((_, _, op)) = q.avail.pop().expect("scheduled device has work");
        op
    }

    #[inline]
    fn execute(&mut self, op: OpId, d: usize) {
        let g = self.g;
        let i = op as usize;
        let q = &mut self.queues[d];
        let r = self.ready[i];
        let (start, why) = if q.clock > r {
            (q.clock, q.prev)
        } else {
            (r, self.ready_by[i])
        };
        let mut dur = g.dur_ns(op);
        if self.contention_ppm > 0 {
            let w = self.gpu_worker[d];
            if w != u32::MAX {
                // A kernel that starts while its worker's collectives run shares the SMs and
                // the memory bandwidth with them.
                if self.comm_until.get(w as usize).is_some_and(|&u| u > start)
                    && g.kind(op) == crate::graph::OpKind::Compute
                {
                    dur = dur.saturating_add(dur.saturating_mul(self.contention_ppm) / 1_000_000);
                }
            } else {
                let (a, b) = self.comm_worker[d];
                let end = start.saturating_add(dur);
                for w in [a, b] {
                    if let Some(u) = self.comm_until.get_mut(w as usize) {
                        *u = (*u).max(end);
                    }
                }
            }
        }
        // Saturating: a job within `graph::bounds` never comes near; a saturated end is
        // reported as an overflow by `passes::evaluate`, never as a time.
        let end = start.saturating_add(dur);
        q.clock = end.saturating_add(g.gap_ns(op));
        q.prev = op;
        self.busy[d] = self.busy[d].saturating_add(dur);
        ran(self, op, start, end, why);
    }

    #[inline]
    fn enqueue(&mut self, op: OpId) {
        let d = self.g.device(op) as usize;
        if self.virt[d] {
            self.stack.push(op);
            return;
        }
        let r = self.ready[op as usize];
        self.queues[d].pending.push((r, op));
        self.reschedule(d);
    }

    /// Key the device in the heap by its next op's earliest start, or take it out when it has
    /// no work.
    #[inline]
    fn reschedule(&mut self, d: usize) {
        let q = &self.queues[d];
        let next = if !q.avail.is_empty() {
            q.clock
        } else if let Some((r, _)) = q.pending.peek() {
            r.max(q.clock)
        } else {
            self.heap.remove(d as u32);
            return;
        };
        self.heap.set(d as u32, next);
    }
}

schedule_by_fields!(Engine, enqueue);

#[cfg(test)]
mod tests;
