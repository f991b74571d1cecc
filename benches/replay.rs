//! Replay throughput on the DESIGN.md scenarios: BERT-base with fine-grained ring all-reduce on
//! 16 and 128 V100s (global DFG built and replayed; target < 2 s for 128 workers and ≥ 10 M ops/s
//! on one core), and the 1,024-worker symmetric form (target < 50 ms per replay).
//!
//! Run: `cargo bench --bench replay`.

mod common;

use common::{best_of, cluster, report, zoo_graph};
use trainplan::replay::replay;

fn main() {
    for (label, c, runs) in [
        (
            "bert-base 16xV100 (dpro-16xv100-rdma)",
            cluster("dpro-16xv100-rdma", None),
            10,
        ),
        (
            "bert-base 128xV100 (128xv100-rdma)",
            cluster("128xv100-rdma", None),
            3,
        ),
    ] {
        let (build_t, g) = best_of(runs, || zoo_graph("bert-base", &c, false));
        let (replay_t, r) = best_of(runs, || replay(&g));
        let ops = g.op_count() as f64;
        report(
            &format!("{label}: build"),
            build_t.as_secs_f64() * 1e3,
            "ms",
            &format!("{} ops", g.op_count()),
        );
        report(
            &format!("{label}: replay"),
            replay_t.as_secs_f64() * 1e3,
            "ms",
            &format!("iteration {:.1} ms", r.iteration_ns as f64 / 1e6),
        );
        report(
            &format!("{label}: replay throughput"),
            ops / replay_t.as_secs_f64() / 1e6,
            "M ops/s",
            "",
        );
        report(
            &format!("{label}: build + replay"),
            (build_t + replay_t).as_secs_f64() * 1e3,
            "ms",
            "",
        );
    }
    for workers in [128u32, 1024] {
        let c = cluster("128xv100-rdma", Some(workers / 8));
        let (build_t, g) = best_of(5, || zoo_graph("bert-base", &c, true));
        let (replay_t, r) = best_of(10, || replay(&g));
        report(
            &format!("bert-base {workers}xV100 symmetric: build"),
            build_t.as_secs_f64() * 1e3,
            "ms",
            &format!("{} ops", g.op_count()),
        );
        report(
            &format!("bert-base {workers}xV100 symmetric: replay"),
            replay_t.as_secs_f64() * 1e3,
            "ms",
            &format!("iteration {:.1} ms", r.iteration_ns as f64 / 1e6),
        );
        report(
            &format!("bert-base {workers}xV100 symmetric: throughput"),
            g.op_count() as f64 / replay_t.as_secs_f64() / 1e6,
            "M ops/s",
            "",
        );
    }
}
