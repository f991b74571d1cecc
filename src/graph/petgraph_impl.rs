//! petgraph's visit traits for `&Dfg`, so petgraph's algorithms (toposort, reachability, DFS,
//! dominators …) run on the arena directly, without copying it into a `petgraph::Graph`.
//!
//! Node ids are op ids; edges are identified by `(from, to)`. The hot loops (replay, critical
//! path) stay hand-written over the CSR arrays: they are measured in `benches/`.

use petgraph::Direction;
use petgraph::visit::{
    GraphBase, IntoNeighbors, IntoNeighborsDirected, IntoNodeIdentifiers, NodeCount, NodeIndexable,
    VisitMap, Visitable,
};

use super::{Dfg, OpId};

impl GraphBase for Dfg {
    type NodeId = OpId;
    type EdgeId = (OpId, OpId);
}

impl<'a> IntoNeighbors for &'a Dfg {
    type Neighbors = std::iter::Copied<std::slice::Iter<'a, OpId>>;
    fn neighbors(self, a: OpId) -> Self::Neighbors {
        self.succs(a).iter().copied()
    }
}

impl<'a> IntoNeighborsDirected for &'a Dfg {
    type NeighborsDirected = std::iter::Copied<std::slice::Iter<'a, OpId>>;
    fn neighbors_directed(self, a: OpId, d: Direction) -> Self::NeighborsDirected {
        match d {
            Direction::Outgoing => self.succs(a).iter().copied(),
            Direction::Incoming => self.preds(a).iter().copied(),
        }
    }
}

impl IntoNodeIdentifiers for &Dfg {
    type NodeIdentifiers = std::ops::Range<OpId>;
    fn node_identifiers(self) -> Self::NodeIdentifiers {
        0..self.op_count() as OpId
    }
}

impl NodeCount for Dfg {
    fn node_count(&self) -> usize {
        self.op_count()
    }
}

impl NodeIndexable for Dfg {
    fn node_bound(&self) -> usize {
        self.op_count()
    }
    fn to_index(&self, a: OpId) -> usize {
        a as usize
    }
    fn from_index(&self, i: usize) -> OpId {
        i as OpId
    }
}

/// A visited-set over op ids: one bit per op.
#[derive(Clone, Debug)]
pub struct OpSet(Vec<u64>);

impl VisitMap<OpId> for OpSet {
    fn visit(&mut self, a: OpId) -> bool {
        let (w, b) = (a as usize / 64, 1u64 << (a % 64));
        let first = self.0[w] & b == 0;
        self.0[w] |= b;
        first
    }
    fn is_visited(&self, a: &OpId) -> bool {
        self.0[*a as usize / 64] & (1u64 << (a % 64)) != 0
    }
    fn unvisit(&mut self, a: OpId) -> bool {
        let (w, b) = (a as usize / 64, 1u64 << (a % 64));
        let was = self.0[w] & b != 0;
        self.0[w] &= !b;
        was
    }
}

impl Visitable for Dfg {
    type Map = OpSet;
    fn visit_map(&self) -> OpSet {
        OpSet(vec![0; self.op_count().div_ceil(64)])
    }
    fn reset_map(&self, map: &mut OpSet) {
        map.0.clear();
        map.0.resize(self.op_count().div_ceil(64), 0);
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::{DeviceKind, DfgBuilder, OpKind, OpSpec, Phase};

    #[test]
    fn petgraph_algorithms_run_on_the_arena() {
        let mut b = DfgBuilder::new();
        let d = b.add_device(DeviceKind::GpuStream {
            worker: 0,
            stream: 0,
        });
        let ops: Vec<_> = (0..5)
            .map(|_| b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, d, 1)))
            .collect();
        // 4 -> 2 -> 0, 3 -> 1: petgraph's toposort must put 4 before 2 before 0.
        b.add_edge(ops[4], ops[2]);
        b.add_edge(ops[2], ops[0]);
        b.add_edge(ops[3], ops[1]);
        let g = b.build().unwrap();
        let order = petgraph::algo::toposort(&g, None).unwrap();
        let pos = |x: u32| order.iter().position(|&o| o == x).unwrap();
        assert!(pos(4) < pos(2) && pos(2) < pos(0) && pos(3) < pos(1));
        assert!(petgraph::algo::has_path_connecting(
            &g, ops[4], ops[0], None
        ));
        assert!(!petgraph::algo::has_path_connecting(
            &g, ops[0], ops[4], None
        ));
        assert!(!petgraph::algo::is_cyclic_directed(&g));
    }
}
