//! Critical-path throughput: the longest dependency path over the whole global DFG (target ≥ 40 M
//! nodes/s on one core) and the execution-graph critical path read off a replay.
//!
//! Run: `cargo bench --bench critical_path`.

mod common;

use common::{best_of, cluster, report, zoo_graph};
use trainplan::replay::{critical_path, dependency_bound_ns, replay};

fn main() {
    let c = cluster("128xv100-rdma", None);
    let g = zoo_graph("bert-base", &c, false);
    let (t, bound) = best_of(5, || dependency_bound_ns(&g));
    report(
        "bert-base 128xV100: dependency critical path",
        g.op_count() as f64 / t.as_secs_f64() / 1e6,
        "M nodes/s",
        &format!("{:.1} ms bound, {} ops", bound as f64 / 1e6, g.op_count()),
    );
    let (pg_build, pg_t, pg_bound) = petgraph_longest_path(&g);
    assert_eq!(pg_bound, bound);
    report(
        "same on a petgraph::Graph copy (toposort + DP)",
        g.op_count() as f64 / pg_t.as_secs_f64() / 1e6,
        "M nodes/s",
        &format!("copy built in {:.0} ms", pg_build.as_secs_f64() * 1e3),
    );
    let r = replay(&g);
    let (t, cp) = best_of(5, || critical_path(&g, &r));
    report(
        "bert-base 128xV100: execution critical path",
        t.as_secs_f64() * 1e3,
        "ms",
        &format!("{} ops on the path", cp.ops.len()),
    );
}

/// The same longest-path computation on a `petgraph::Graph` copy of the DFG, to compare the
/// arena against petgraph's own adjacency-list graph (the measurement behind ARCHITECTURE.md's
/// choice of an arena).
fn petgraph_longest_path(
    g: &trainplan::graph::Dfg,
) -> (std::time::Duration, std::time::Duration, u64) {
    use petgraph::graph::{DiGraph, NodeIndex};
    let t = std::time::Instant::now();
    let mut pg: DiGraph<u64, ()> = DiGraph::with_capacity(g.op_count(), g.edge_count());
    for op in 0..g.op_count() as u32 {
        pg.add_node(g.dur_ns(op));
    }
    for op in 0..g.op_count() as u32 {
        for &s in g.succs(op) {
            pg.add_edge(NodeIndex::new(op as usize), NodeIndex::new(s as usize), ());
        }
    }
    let build = t.elapsed();
    let t = std::time::Instant::now();
    let order = petgraph::algo::toposort(&pg, None).expect("acyclic");
    let mut finish = vec![0u64; pg.node_count()];
    let mut best = 0;
    for n in order {
        let start = pg
            .neighbors_directed(n, petgraph::Direction::Incoming)
            .map(|p| finish[p.index()])
            .max()
            .unwrap_or(0);
        finish[n.index()] = start + pg[n];
        best = best.max(finish[n.index()]);
    }
    (build, t.elapsed(), best)
}
