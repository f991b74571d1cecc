//! The replayer for graphs without scheduling priorities: one heap of ops instead of a heap of
//! devices over a queue per device (issue 28).
//!
//! Without priorities a device runs its ops in the order they become ready, (ready time, op id):
//! an op is released when its last predecessor runs, which is no later than its ready time, so
//! by the time a device frees up every op that could go next is known. One global heap of ops
//! keyed by their ready time therefore hands each device its ops in its own order, and an op's
//! start is fixed the moment it leaves the heap: max(ready, its device's clock). That is a single
//! push and a single pop per op.
//!
//! The contention model needs more: a kernel slows down when its worker's collectives are running
//! at its start, so a GPU stream's op may only be placed once every communication op that starts
//! before it has been placed. A kernel that finds its stream idle starts when ready, and every op
//! ready before it has been placed, so it is placed at once. One that finds the stream busy is
//! deferred: it waits in its stream's line (in order of readiness), and only the line's head is in
//! the heap, keyed by its start; every op with an earlier key, so every communication op with an
//! earlier start, has been placed when it comes out. Communication ops keep their ready time as
//! key (their start never depends on contention; at one key they go before kernels) and leave
//! their interval with the workers they occupy; a kernel starting at `s` is slowed when one of
//! them started before `s` (ties: the lower device id first, as the device engine pops them) and
//! has not ended by `s`.
//!
//! The schedule is the device engine's ([`super::Engine`]) op for op; a test replays graphs with
//! both.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::{OpState, Replay, Schedule, drain_virtual, ran};
use crate::graph::{DeviceKind, Dfg, NONE, OpId, OpKind};

/// Replay `g` (which has no priorities), optionally with release times.
pub(super) fn replay(g: &Dfg, release: Option<&[u64]>) -> Replay {
    Ordered::new(g, release).run()
}

/// Heap classes, in the order they run at one key.
const PLAIN: u8 = 0;
const DEFERRED: u8 = 1;
const FRESH: u8 = 2;

/// The heap's second word: class, then op.
#[inline]
fn entry(class: u8, op: OpId) -> u64 {
    u64::from(class) << 32 | u64::from(op)
}

/// What a device is to the engine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Starts its ops when ready, in parallel.
    Virtual,
    /// A GPU stream whose kernels the contention model slows: placed at their start.
    Slowed(u32),
    /// Communication that keeps workers' GPUs busy (its interval is recorded for them).
    Comm(u32, u32),
    /// Anything else: placed at its ready time.
    Plain,
}

struct Ordered<'g> {
    g: &'g Dfg,
    role: Vec<Role>,
    left: Vec<u32>,
    /// Latest predecessor end so far; overwritten with the op's start when it runs.
    ready: Vec<u64>,
    /// The predecessor that set `ready`; overwritten with the binding predecessor when it runs.
    ready_by: Vec<OpId>,
    end: Vec<u64>,
    clock: Vec<u64>,
    prev: Vec<OpId>,
    busy: Vec<u64>,
    /// Ops released and not yet placed, by (key, class, ready, op): the key is the ready time,
    /// or for the head of a slowed stream's line its start ([`DEFERRED`]); at one key
    /// communication and other ops ([`PLAIN`]) go first, so a kernel's contention sees every
    /// collective that starts with it.
    /// (The ready time is not in the entry: it is the key but for a line's head, and a device has
    /// one head at a time. Class and op share a word: `class << 32 | op`.)
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    /// Per device, the kernels waiting for a busy slowed stream, in order of readiness.
    line: Vec<VecDeque<OpId>>,
    stack: Vec<OpId>,
    contention_ppm: u64,
    gaps: bool,
    /// Per worker, the communication devices that keep its GPU busy.
    comm_devices: Vec<Vec<u32>>,
    /// Per communication device, the intervals it has run, in order, from the last one that began
    /// before the latest kernel's start (the only one that can still run then: a device runs one
    /// op at a time).
    intervals: Vec<VecDeque<(u64, u64)>>,
}

impl<'g> Ordered<'g> {
    fn new(g: &'g Dfg, release: Option<&[u64]>) -> Self {
        let n = g.op_count();
        let nd = g.device_count();
        let contention_ppm = u64::from(g.contention_ppm());
        let workers = g.workers().max(1) as usize;
        let role: Vec<Role> = g
            .devices()
            .iter()
            .map(|d| match *d {
                DeviceKind::Virtual => Role::Virtual,
                _ if contention_ppm == 0 => Role::Plain,
                DeviceKind::GpuStream { worker, .. } if (worker as usize) < workers => {
                    Role::Slowed(worker)
                }
                DeviceKind::CommStream { worker } => Role::Comm(worker, worker),
                DeviceKind::Link { from, to, .. } => Role::Comm(from, to),
                _ => Role::Plain,
            })
            .collect();
        let mut comm_devices = vec![Vec::new(); if contention_ppm == 0 { 0 } else { workers }];
        for (d, r) in role.iter().enumerate() {
            if let Role::Comm(a, b) = *r {
                for w in if a == b { [a, u32::MAX] } else { [a, b] } {
                    if let Some(v) = comm_devices.get_mut(w as usize) {
                        v.push(d as u32);
                    }
                }
            }
        }
        Ordered {
            g,
            role,
            left: (0..n as OpId).map(|o| g.preds(o).len() as u32).collect(),
            ready: release.map_or_else(|| vec![0; n], <[u64]>::to_vec),
            ready_by: vec![NONE; n],
            end: vec![0; n],
            clock: vec![0; nd],
            prev: vec![NONE; nd],
            busy: vec![0; nd],
            heap: BinaryHeap::new(),
            line: (0..if contention_ppm == 0 { 0 } else { nd })
                .map(|_| VecDeque::new())
                .collect(),
            stack: Vec::new(),
            contention_ppm,
            gaps: g.gaps().iter().any(|&x| x != 0),
            comm_devices,
            intervals: (0..if contention_ppm == 0 { 0 } else { nd })
                .map(|_| VecDeque::new())
                .collect(),
        }
    }

    fn run(mut self) -> Replay {
        let g = self.g;
        for o in 0..g.op_count() as OpId {
            if self.left[o as usize] == 0 {
                self.release(o);
            }
        }
        drain_virtual(&mut self);
        while let Some(Reverse((key, tag))) = self.heap.pop() {
            let (class, op) = ((tag >> 32) as u8, tag as OpId);
            let d = g.device(op) as usize;
            let r = key;
            match class {
                FRESH if !self.line[d].is_empty() => self.line[d].push_back(op),
                FRESH if self.clock[d] > r => {
                    // Its stream is busy: it waits, and starts when the stream frees up.
                    self.line[d].push_back(op);
                    self.heap
                        .push(Reverse((self.clock[d], entry(DEFERRED, op))));
                }
                DEFERRED => {
                    self.line[d].pop_front();
                    self.place(op, d);
                    if let Some(&next) = self.line[d].front() {
                        let rn = self.ready[next as usize];
                        self.heap
                            .push(Reverse((self.clock[d].max(rn), entry(DEFERRED, next))));
                    }
                    drain_virtual(&mut self);
                }
                _ => {
                    self.place(op, d);
                    drain_virtual(&mut self);
                }
            }
        }
        Replay::of(self.ready, self.end, self.ready_by, self.busy)
    }

    /// Fix the op's start and end on device `d`, whose earlier ops are all placed.
    #[inline]
    fn place(&mut self, op: OpId, d: usize) {
        let g = self.g;
        let i = op as usize;
        let r = self.ready[i];
        let (start, why) = if self.clock[d] > r {
            (self.clock[d], self.prev[d])
        } else {
            (r, self.ready_by[i])
        };
        let mut dur = g.dur_ns(op);
        match self.role[d] {
            Role::Slowed(w) => {
                if g.kind(op) == OpKind::Compute && self.comm_running(w as usize, start, d as u32) {
                    dur = dur.saturating_add(dur.saturating_mul(self.contention_ppm) / 1_000_000);
                }
            }
            Role::Comm(..) => self.intervals[d].push_back((start, start.saturating_add(dur))),
            Role::Virtual | Role::Plain => {}
        }
        let end = start.saturating_add(dur);
        self.clock[d] = if self.gaps {
            end.saturating_add(g.gap_ns(op))
        } else {
            end
        };
        self.prev[d] = op;
        self.busy[d] = self.busy[d].saturating_add(dur);
        ran(self, op, start, end, why);
    }

    /// Whether a communication op of worker `w` that began before `s` (or at `s` on a device
    /// below `d`, which the device engine pops first) is still running at `s`. Queries come in
    /// order of `s`.
    #[inline]
    fn comm_running(&mut self, w: usize, s: u64, d: u32) -> bool {
        let mut running = false;
        for &c in &self.comm_devices[w] {
            let began = |&(start, _): &(u64, u64)| start < s || start == s && c < d;
            let iv = &mut self.intervals[c as usize];
            while iv.len() > 1 && began(&iv[1]) {
                iv.pop_front();
            }
            running |= iv.front().is_some_and(|x| began(x) && x.1 > s);
        }
        running
    }

    /// All the op's predecessors have ended: queue it.
    #[inline]
    fn release(&mut self, op: OpId) {
        let d = self.g.device(op) as usize;
        let r = self.ready[op as usize];
        let entry = match self.role[d] {
            Role::Virtual => {
                self.stack.push(op);
                return;
            }
            Role::Slowed(_) => (r, entry(FRESH, op)),
            Role::Comm(..) | Role::Plain => (r, entry(PLAIN, op)),
        };
        self.heap.push(Reverse(entry));
    }
}

schedule_by_fields!(Ordered, release);
