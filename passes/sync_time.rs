//! What the three synchronisation passes (`tensor-partition`, `tensor-fusion`, `op-fusion`)
//! share: `t_sync(s, k)`, the makespan of one tensor of `s` bytes cut into `k` pieces and
//! synchronised alone on the job's topology (a partial replay, dPRO §5.3; see
//! `tensor_partition.rs` for the model), memoised per job; the partition grid; the `scope` knob;
//! a sync's label for the `why` text. A module below the passes so that none of them imports
//! another.

use std::collections::BTreeMap;

use super::{Knobs, PassError};
use crate::cost::config::SyncScheme;
use crate::graph::comm::CommTopology;
use crate::graph::job::Job;
use crate::graph::{DeviceKind, DfgBuilder, NONE, OpKind, OpSpec, Phase};

/// `t_sync(s, k)`: makespan of one tensor of `bytes` bytes cut into `k` pieces, synchronised
/// alone on the job's topology (see the module docs).
pub fn sync_time_ns(job: &Job, bytes: u64, k: u32) -> u64 {
    let k = k.max(1);
    let mut b = DfgBuilder::new();
    let virt = b.add_device(DeviceKind::Virtual);
    let symmetric = job.symmetric && job.comm.scheme == SyncScheme::Ring;
    let gw = if symmetric { 1 } else { job.workers.max(1) };
    let streams: Vec<u32> = (0..gw)
        .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
        .collect();
    let mut topo = if symmetric {
        CommTopology::symmetric_ring(&mut b, &job.comm, job.workers, streams[0])
    } else {
        CommTopology::new(&mut b, &job.comm, streams)
    };
    let ready: Vec<u32> = (0..gw)
        .map(|_| b.add_op(OpSpec::new(OpKind::Out, Phase::Comm, virt, 0)))
        .collect();
    let done: Vec<u32> = (0..gw)
        .map(|_| b.add_op(OpSpec::new(OpKind::In, Phase::Comm, virt, 0)))
        .collect();
    let piece = bytes.div_ceil(k as u64);
    for _ in 0..k {
        topo.allreduce(&mut b, NONE, piece, &ready, &done);
    }
    match b.build() {
        Ok(g) => crate::replay::replay(&g).iteration_ns,
        // The wiring above is acyclic by construction; a failure is a bug in the topology.
        Err(e) => panic!("t_sync sub-graph for {bytes} B / {k} failed to build: {e}"),
    }
}

/// The partition grid `{1, 2, 4, …, max_k}` ∪ `{max_k}`.
pub(crate) fn grid(max_k: u32) -> Vec<u32> {
    let top = max_k.max(1);
    let mut grid = Vec::new();
    let mut k = 1u32;
    while k <= top {
        grid.push(k);
        k = k.saturating_mul(2);
    }
    if grid.last() != Some(&top) {
        grid.push(top);
    }
    grid
}

/// Memoised [`sync_time_ns`] for one job.
pub(crate) struct SyncTimes<'a> {
    job: &'a Job,
    memo: BTreeMap<(u64, u32), u64>,
}

impl<'a> SyncTimes<'a> {
    pub(crate) fn new(job: &'a Job) -> Self {
        SyncTimes {
            job,
            memo: BTreeMap::new(),
        }
    }

    /// `t_sync(bytes, k)`.
    pub(crate) fn get(&mut self, bytes: u64, k: u32) -> u64 {
        let job = self.job;
        *self
            .memo
            .entry((bytes, k.max(1)))
            .or_insert_with(|| sync_time_ns(job, bytes, k))
    }

    /// `(k*, t_sync(bytes, k*))` over `{1, 2, 4, …, max_k}` ∪ `{max_k}`; ties → smaller k.
    pub(crate) fn best_k(&mut self, bytes: u64, max_k: u32) -> (u32, u64) {
        let mut best = (1, self.get(bytes, 1));
        for k in grid(max_k) {
            let t = self.get(bytes, k);
            if t < best.1 {
                best = (k, t);
            }
        }
        best
    }
}

/// `scope` knob: `critical` (false) or `all` (true); anything else is bad input.
pub(crate) fn scope_is_all(pass: &str, knobs: &Knobs) -> Result<bool, PassError> {
    match knobs.text("scope") {
        "critical" => Ok(false),
        "all" => Ok(true),
        other => Err(PassError::BadKnob {
            pass: pass.into(),
            knob: "scope".into(),
            value: other.into(),
            why: "must be `critical` or `all`".into(),
        }),
    }
}

/// First tensor's name of a sync, for the `why` text.
pub(crate) fn tensor_label(job: &Job, s: usize) -> String {
    let sync = &job.syncs[s];
    let first = sync
        .tensors
        .first()
        .and_then(|&t| job.local.tensors.get(t as usize))
        .map_or("?", |t| t.name.as_str());
    match sync.tensors.len() {
        0 | 1 => first.to_string(),
        n => format!("{first} + {} more", n - 1),
    }
}
