//! Critical paths.
//!
//! * [`critical_path`]: the critical path of the *execution graph* (the DFG plus, for each
//!   device, an edge from each op to the next op it ran), read off a replay by following each op's
//!   binding predecessor back from the op that ends last. Its ops are what the search optimises
//!   (dPRO §5.1): delaying any of them delays the iteration.
//! * [`dependency_bound_ns`]: the longest path through the DFG's dependencies alone, weighting
//!   each op by its duration — the iteration time with unlimited devices, a lower bound on any
//!   replay. `critical_path_ms` in `--json` is this number: a replay that sits far above it is
//!   bound by device contention, not by dependencies.

use crate::graph::{Dfg, NONE, OpId};

use super::Replay;

/// The execution graph's critical path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriticalPath {
    /// Ops from the first to the one that ends last.
    pub ops: Vec<OpId>,
    /// Time on the path spent inside ops (the rest is gaps and waiting for release times).
    pub busy_ns: u64,
}

/// Follow binding predecessors back from the last op.
pub fn critical_path(g: &Dfg, r: &Replay) -> CriticalPath {
    let mut ops = Vec::new();
    let mut busy_ns = 0;
    let mut o = r.last_op;
    while o != NONE {
        ops.push(o);
        busy_ns += g.dur_ns(o);
        o = r.binding[o as usize];
    }
    ops.reverse();
    CriticalPath { ops, busy_ns }
}

/// Longest dependency path (sum of durations), in ns. One pass over the topological order.
pub fn dependency_bound_ns(g: &Dfg) -> u64 {
    let mut finish = vec![0u64; g.op_count()];
    let dur = g.durations();
    let mut best = 0;
    for &o in g.topo_order() {
        let start = g
            .preds(o)
            .iter()
            .map(|&p| finish[p as usize])
            .max()
            .unwrap_or(0);
        let f = start + dur[o as usize];
        finish[o as usize] = f;
        best = best.max(f);
    }
    best
}
