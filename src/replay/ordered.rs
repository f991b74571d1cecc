//! The replayer for graphs without scheduling priorities: one queue of ops instead of a heap of
//! devices over a queue per device (issue 28).
//!
//! Without priorities a device runs its ops in the order they become ready, (ready time, op id):
//! an op is released when its last predecessor runs, which is no later than its ready time, so
//! by the time a device frees up every op that could go next is known. One global queue of ops
//! keyed by their ready time therefore hands each device its ops in its own order, and an op's
//! start is fixed the moment it leaves the queue: max(ready, its device's clock). That is a single
//! push and a single pop per op. No key pushed is below the last one popped (an op is ready no
//! earlier than its last predecessor, which has just left the queue), so the queue is a monotone
//! radix queue ([`RadixQueue`]) rather than a binary heap.
//!
//! The contention model needs more: a kernel slows down when its worker's collectives are running
//! at its start, so a GPU stream's op may only be placed once every communication op that starts
//! by then has been placed. So on GPU streams and communication devices an op is placed at its
//! start. One that finds its device idle starts when ready, and every op ready before it has been
//! placed, so it is placed at once. One that finds its device busy waits in the device's line (in
//! order of readiness), and only the line's head is in the queue, keyed by its start. At one key
//! communication goes before kernels, so when a kernel starting at `s` leaves the queue, every
//! collective that starts by `s` has been placed, and on each communication device only the last
//! one placed can still be running: the kernel is slowed when one of its worker's communication
//! devices last started an op before `s` (ties: the lower device id first, as the device engine
//! pops them) that has not ended by `s`. Placing communication ahead of its start instead (as a
//! first version did) kept every collective queued behind a busy link as an interval: 8.4 M of
//! them, 134 MB written, on BERT-base over 128 GPUs.
//!
//! The schedule is the device engine's ([`super::Engine`]) op for op; a test replays graphs with
//! both.

use std::collections::VecDeque;

use super::radix::RadixQueue;
use super::{OpState, Replay, Schedule, drain_virtual, ran};
use crate::graph::{DeviceKind, Dfg, NONE, OpId, OpKind};

/// Replay `g` (which has no priorities), optionally with release times.
pub(super) fn replay(g: &Dfg, release: Option<&[u64]>) -> Replay {
    Ordered::new(g, release).run()
}

/// Queue classes, in the order they run at one key: communication before kernels, so that a
/// kernel's contention sees every collective that starts with it; a line's head before the
/// fresh ops of its device, which were ready later.
const COMM_HEAD: u8 = 0;
const COMM_FRESH: u8 = 1;
const PLAIN: u8 = 2;
const HEAD: u8 = 3;
const FRESH: u8 = 4;

/// A queue entry's second word: class, then op.
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
    /// Communication that keeps workers' GPUs busy: placed at their start, the last interval
    /// kept for the kernels.
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
    /// Ops released and not yet placed, by (key, class, op): the key is the ready time, or for
    /// the head of a line its start; classes order one key (communication first). The ready time
    /// is not in the entry: it is the key but for a line's head, and a device has one head at a
    /// time. Class and op share a word: `class << 32 | op`.
    queue: RadixQueue,
    /// Per GPU stream and communication device, the ops waiting for it to free up, in order of
    /// readiness.
    line: Vec<VecDeque<OpId>>,
    stack: Vec<OpId>,
    contention_ppm: u64,
    gaps: bool,
    /// Per worker, the communication devices that keep its GPU busy.
    comm_devices: Vec<Vec<u32>>,
    /// Per communication device, the interval of the last op placed (started) on it.
    last: Vec<(u64, u64)>,
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
            queue: RadixQueue::new(),
            line: (0..if contention_ppm == 0 { 0 } else { nd })
                .map(|_| VecDeque::new())
                .collect(),
            stack: Vec::new(),
            contention_ppm,
            gaps: g.gaps().iter().any(|&x| x != 0),
            comm_devices,
            last: vec![(0, 0); if contention_ppm == 0 { 0 } else { nd }],
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
        while let Some((key, tag)) = self.queue.pop() {
            let (class, op) = ((tag >> 32) as u8, tag as OpId);
            let d = g.device(op) as usize;
            match class {
                FRESH | COMM_FRESH if !self.line[d].is_empty() => self.line[d].push_back(op),
                FRESH | COMM_FRESH if self.clock[d] > key => {
                    // Its device is busy: it waits in line, and starts when the device frees up.
                    self.line[d].push_back(op);
                    let head = if class == FRESH { HEAD } else { COMM_HEAD };
                    self.queue.push(self.clock[d], entry(head, op));
                }
                HEAD | COMM_HEAD => {
                    self.line[d].pop_front();
                    self.place(op, d);
                    if let Some(&next) = self.line[d].front() {
                        let rn = self.ready[next as usize];
                        self.queue.push(self.clock[d].max(rn), entry(class, next));
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
            Role::Comm(..) => self.last[d] = (start, start.saturating_add(dur)),
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
    /// below `d`, which the device engine pops first) is still running at `s`. A communication
    /// device's ops are placed at their start, so every one that starts by `s` is placed, and
    /// the last of them is the only one that can still run at `s`.
    #[inline]
    fn comm_running(&self, w: usize, s: u64, d: u32) -> bool {
        self.comm_devices[w].iter().any(|&c| {
            let (start, end) = self.last[c as usize];
            (start < s || start == s && c < d) && end > s
        })
    }

    /// All the op's predecessors have ended: queue it.
    #[inline]
    fn release(&mut self, op: OpId) {
        let d = self.g.device(op) as usize;
        let r = self.ready[op as usize];
        let class = match self.role[d] {
            Role::Virtual => {
                self.stack.push(op);
                return;
            }
            Role::Slowed(_) => FRESH,
            Role::Comm(..) => COMM_FRESH,
            Role::Plain => PLAIN,
        };
        self.queue.push(r, entry(class, op));
    }
}

schedule_by_fields!(Ordered, release);
