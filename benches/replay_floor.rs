//! The replayer against the floor of any list scheduler on the same graph (issue 28): BERT-base
//! with fine-grained ring all-reduce on 16 and 128 V100s, and with `REPLAY_FLOOR_BIG=1` on 1,024
//! V100s (128 nodes of the 128-GPU cluster's servers) with PyTorch DDP's default 25 MiB gradient
//! buckets (per tensor, its 2(n-1) ring steps per worker and tensor would be 865 M ops, over the
//! 200 M-op limit; bucketed, 60.5 M ops, 7.7 GB resident). Each graph is replayed four ways:
//!
//! * `replay` as the planner runs it (compute slowed while its worker's collectives run): the
//!   op-heap engine, as every graph without priorities gets;
//! * the same with the device engine (`replay_by_device`, what graphs with priorities get);
//! * `replay`, contention off (`contention_ppm` = 0: the d86141c model);
//! * a minimal binary-heap loop: one global heap of ready ops by (ready time, id), each op
//!   started at max(ready, its device's clock) — one push and one pop per op and nothing else.
//!   It is not the replayer's semantics (no per-device choice among ready ops, no gaps, no
//!   critical-path bookkeeping): it is the cost floor the replayer is compared with.
//!
//! Run: `cargo bench --bench replay_floor`. Best of N runs; ops/s counts every op of the graph.

mod common;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use common::{best_of, cluster, report, zoo_graph};
use trainplan::cost::framework::Framework;
use trainplan::graph::{DeviceKind, Dfg, OpId};
use trainplan::replay::{replay, replay_by_device};
use trainplan::search::baselines::default_from_ready;
use trainplan::zoo::build::job;
use trainplan::zoo::{BuildOptions, ModelOptions, model};

/// The minimal loop: returns the latest end (so the work cannot be optimised away).
fn heap_floor(g: &Dfg) -> u64 {
    let n = g.op_count();
    let virt: Vec<bool> = g
        .devices()
        .iter()
        .map(|d| *d == DeviceKind::Virtual)
        .collect();
    let mut left: Vec<u32> = (0..n as OpId).map(|o| g.preds(o).len() as u32).collect();
    let mut ready = vec![0u64; n];
    let mut clock = vec![0u64; g.device_count()];
    let mut heap: BinaryHeap<Reverse<(u64, OpId)>> = (0..n as OpId)
        .filter(|&o| left[o as usize] == 0)
        .map(|o| Reverse((0, o)))
        .collect();
    let mut last = 0;
    while let Some(Reverse((r, op))) = heap.pop() {
        let d = g.device(op) as usize;
        let start = if virt[d] { r } else { r.max(clock[d]) };
        let end = start + g.dur_ns(op);
        if !virt[d] {
            clock[d] = end;
        }
        last = last.max(end);
        for &s in g.succs(op) {
            let i = s as usize;
            ready[i] = ready[i].max(end);
            left[i] -= 1;
            if left[i] == 0 {
                heap.push(Reverse((ready[i], s)));
            }
        }
    }
    last
}

/// BERT-base on `nodes` nodes of the 128-GPU cluster with PyTorch DDP's default buckets.
fn bucketed_graph(nodes: u32) -> Dfg {
    let c = cluster("128xv100-rdma", Some(nodes));
    let m = model("bert-base", &ModelOptions::default()).expect("zoo model");
    let per_tensor = job(&m, &c, &BuildOptions::default()).expect("valid job");
    // PyTorch orders its buckets by autograd's order: no ready times needed.
    let (bucketed, _) =
        default_from_ready(&per_tensor, Framework::Pytorch, &[]).expect("DDP's buckets");
    bucketed.expand().expect("valid graph")
}

/// A row: its label, how its graph is built, and how many runs it takes the best of.
type Case = (&'static str, fn() -> Dfg, usize);

fn main() {
    let mut cases: Vec<Case> = vec![
        (
            "bert-base 16xV100 (dpro-16xv100-rdma)",
            || zoo_graph("bert-base", &cluster("dpro-16xv100-rdma", None), false),
            20,
        ),
        (
            "bert-base 128xV100 (128xv100-rdma)",
            || zoo_graph("bert-base", &cluster("128xv100-rdma", None), false),
            3,
        ),
    ];
    if std::env::var_os("REPLAY_FLOOR_BIG").is_some() {
        cases.push((
            "bert-base 1024xV100 (128 nodes, DDP buckets)",
            || bucketed_graph(128),
            1,
        ));
    }
    for (label, graph, runs) in cases {
        let mut g = graph();
        let ops = g.op_count() as f64;
        let mops = |t: std::time::Duration| ops / t.as_secs_f64() / 1e6;
        let (on, r_on) = best_of(runs, || replay(&g));
        let (dev, r_dev) = best_of(runs, || replay_by_device(&g));
        assert_eq!(r_dev, r_on, "the two engines give one schedule");
        let ppm = g.contention_ppm();
        g.set_contention_ppm(0);
        let (off, r_off) = best_of(runs, || replay(&g));
        let (floor, last) = best_of(runs, || heap_floor(&g));
        report(
            &format!("{label}: replay"),
            mops(on),
            "M ops/s",
            &format!(
                "{} ops, contention {ppm} ppm, iteration {:.1} ms",
                g.op_count(),
                r_on.iteration_ns as f64 / 1e6
            ),
        );
        report(
            &format!("{label}: replay, device engine"),
            mops(dev),
            "M ops/s",
            "(what graphs with priorities run)",
        );
        report(
            &format!("{label}: replay, no contention"),
            mops(off),
            "M ops/s",
            &format!("iteration {:.1} ms", r_off.iteration_ns as f64 / 1e6),
        );
        report(
            &format!("{label}: minimal heap loop"),
            mops(floor),
            "M ops/s",
            &format!("its makespan {:.1} ms", last as f64 / 1e6),
        );
        report(
            &format!("{label}: replay / floor time"),
            on.as_secs_f64() / floor.as_secs_f64(),
            "x",
            "",
        );
    }
}
