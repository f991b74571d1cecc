//! Where a worker's iteration goes: time with compute running, time with communication running,
//! their overlap, and the critical path grouped by layer or tensor.

use std::collections::BTreeMap;

use crate::graph::{DeviceKind, Dfg, NONE, OpId, OpKind};

use super::{CriticalPath, Replay};

/// Compute / communication breakdown of one worker (union of intervals, so parallel streams are
/// not double-counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Breakdown {
    /// Time at least one compute op of the worker runs.
    pub compute_ns: u64,
    /// Time at least one of the worker's communication ops runs (its SENDs, its RECVs).
    pub comm_ns: u64,
    /// Time both run.
    pub overlap_ns: u64,
}

fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|&(a, b)| b > a);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn total(v: &[(u64, u64)]) -> u64 {
    v.iter().map(|&(a, b)| b - a).sum()
}

fn intersect(x: &[(u64, u64)], y: &[(u64, u64)]) -> u64 {
    let (mut i, mut j, mut t) = (0, 0, 0);
    while i < x.len() && j < y.len() {
        let lo = x[i].0.max(y[j].0);
        let hi = x[i].1.min(y[j].1);
        if hi > lo {
            t += hi - lo;
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    t
}

/// Breakdown of `worker`'s time in a replay.
pub fn breakdown(g: &Dfg, r: &Replay, worker: u32) -> Breakdown {
    let mut compute = Vec::new();
    let mut comm = Vec::new();
    for op in 0..g.op_count() as OpId {
        let kind = g.kind(op);
        let dev = g.device_kind(g.device(op));
        let i = op as usize;
        let iv = (r.start_ns[i], r.end_ns[i]);
        match dev {
            DeviceKind::GpuStream { worker: w, .. } if w == worker && !kind.is_comm() => {
                compute.push(iv)
            }
            _ if kind.is_comm() && dev.worker() == Some(worker) => comm.push(iv),
            _ => {}
        }
    }
    let (compute, comm) = (merge(compute), merge(comm));
    Breakdown {
        compute_ns: total(&compute),
        comm_ns: total(&comm),
        overlap_ns: intersect(&compute, &comm),
    }
}

/// Where the critical path's time goes, by the kind of device its ops run on: the host (CPU
/// threads — launches, framework work and the idle time between them), the GPU (kernels and
/// copies), communication (collectives, SEND/RECV, links) and the rest (virtual ops: barriers,
/// joins). Each path op owns the time from its start to the next path op's start (its duration,
/// and its device's gap after it when the next op is on the same device), the last its
/// duration: the shares add up to the path's span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathShare {
    pub host_ns: u64,
    pub gpu_ns: u64,
    pub comm_ns: u64,
    pub other_ns: u64,
}

impl PathShare {
    pub fn total_ns(&self) -> u64 {
        self.host_ns + self.gpu_ns + self.comm_ns + self.other_ns
    }
    /// More than half of the critical path is host time: the GPU waits for the CPU, and a
    /// faster GPU does not shorten the iteration.
    pub fn host_bound(&self) -> bool {
        2 * self.host_ns > self.total_ns()
    }
}

/// The critical path's time by device kind (see [`PathShare`]).
pub fn path_share(g: &Dfg, r: &Replay, cp: &CriticalPath) -> PathShare {
    let mut s = PathShare::default();
    for (i, &op) in cp.ops.iter().enumerate() {
        let t0 = r.start_ns[op as usize];
        let t1 = cp
            .ops
            .get(i + 1)
            .map_or(r.end_ns[op as usize], |&n| r.start_ns[n as usize]);
        let t = t1.saturating_sub(t0);
        let slot = match g.device_kind(g.device(op)) {
            DeviceKind::CpuThread { .. } => &mut s.host_ns,
            DeviceKind::Virtual => &mut s.other_ns,
            DeviceKind::GpuStream { .. } if !g.kind(op).is_comm() => &mut s.gpu_ns,
            _ => &mut s.comm_ns,
        };
        *slot += t;
    }
    s
}

/// GPU time of a worker's compute ops (kernels and copies, summed: streams that overlap count
/// twice): what a pass that re-costs kernels saves.
pub fn gpu_busy_ns(g: &Dfg, worker: u32) -> u64 {
    (0..g.op_count() as OpId)
        .filter(|&op| {
            matches!(g.device_kind(g.device(op)), DeviceKind::GpuStream { worker: w, .. } if w == worker)
                && !g.kind(op).is_comm()
        })
        .map(|op| g.dur_ns(op))
        .sum()
}

/// Where one iteration's time goes on worker 0, and what bounds it: the fields every
/// `replay`/`whatif --json` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub breakdown: Breakdown,
    /// Communication with no compute beside it: what the iteration waits for.
    pub exposed_comm_ns: u64,
    /// Time the critical path spends in host (CPU thread) ops, and in GPU ops.
    pub host_path_ns: u64,
    pub gpu_path_ns: u64,
}

impl Summary {
    /// The host, not the GPU, sets the pace: the critical path spends more time issuing work
    /// than running it.
    pub fn host_bound(&self) -> bool {
        self.host_path_ns > self.gpu_path_ns
    }
}

/// The summary of worker 0 in a replay.
pub fn summary(g: &Dfg, r: &Replay, cp: &CriticalPath) -> Summary {
    let b = breakdown(g, r, 0);
    let (mut host, mut gpu) = (0u64, 0u64);
    for &op in &cp.ops {
        let i = op as usize;
        let d = r.end_ns[i] - r.start_ns[i];
        match g.device_kind(g.device(op)) {
            DeviceKind::CpuThread { .. } => host += d,
            DeviceKind::GpuStream { .. } if !g.kind(op).is_comm() => gpu += d,
            _ => {}
        }
    }
    Summary {
        breakdown: b,
        exposed_comm_ns: b.comm_ns - b.overlap_ns,
        host_path_ns: host,
        gpu_path_ns: gpu,
    }
}

/// One line of the critical path grouped by what it works on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PathItem {
    /// Layer and phase (`layer3.2.conv2 BW`) or tensor synchronisation (`fc.weight sync`).
    pub name: String,
    /// Time its ops occupy on the critical path.
    pub dur_ns: u64,
}

/// The critical path's time grouped by layer+phase or tensor, largest first (ties by name).
pub fn critical_path_items(g: &Dfg, cp: &CriticalPath) -> Vec<PathItem> {
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for &op in &cp.ops {
        let dur = g.dur_ns(op);
        if dur == 0 {
            continue;
        }
        let name = if g.kind(op).is_comm() && g.tensor(op) != NONE {
            format!("{} sync", g.tensors()[g.tensor(op) as usize].name)
        } else if g.layer(op) != NONE {
            let phase = match g.phase(op) {
                crate::graph::Phase::Fw => "FW",
                crate::graph::Phase::Bw => "BW",
                crate::graph::Phase::Update => "UPDATE",
                _ => "",
            };
            format!("{} {phase}", g.layers()[g.layer(op) as usize])
        } else if g.kind(op) == OpKind::Gap {
            "(gaps)".to_string()
        } else {
            g.op_label(op)
        };
        *by.entry(name).or_default() += dur;
    }
    let mut v: Vec<PathItem> = by
        .into_iter()
        .map(|(name, dur_ns)| PathItem { name, dur_ns })
        .collect();
    v.sort_by(|a, b| b.dur_ns.cmp(&a.dur_ns).then_with(|| a.name.cmp(&b.name)));
    v
}

/// The critical path's op time by category: `FW`, `BW`, `UPDATE` compute, `communication`,
/// `CPU` (launches, host work, gaps) and `other`, in that order, zero categories left out.
pub fn critical_path_by_phase(g: &Dfg, cp: &CriticalPath) -> Vec<(&'static str, u64)> {
    const NAMES: [&str; 6] = ["FW", "BW", "UPDATE", "communication", "CPU", "other"];
    let mut t = [0u64; 6];
    for &op in &cp.ops {
        let k = g.kind(op);
        let i = if k.is_comm() {
            3
        } else if matches!(k, OpKind::Launch | OpKind::CpuOther | OpKind::Gap) {
            4
        } else {
            match g.phase(op) {
                crate::graph::Phase::Fw => 0,
                crate::graph::Phase::Bw => 1,
                crate::graph::Phase::Update => 2,
                _ => 5,
            }
        };
        t[i] += g.dur_ns(op);
    }
    NAMES
        .iter()
        .zip(t)
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| (*n, v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_algebra() {
        let a = merge(vec![(0, 5), (3, 8), (10, 12), (12, 12)]);
        assert_eq!(a, vec![(0, 8), (10, 12)]);
        let b = merge(vec![(4, 11)]);
        assert_eq!(total(&a), 10);
        assert_eq!(intersect(&a, &b), 4 + 1);
    }
}
