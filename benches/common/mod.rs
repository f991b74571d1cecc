//! Shared helpers for the benchmarks: build zoo graphs and time a closure (best of N runs, which
//! is the least disturbed by the other core's load).

#![allow(dead_code)]

use std::time::{Duration, Instant};

use trainplan::cost::config::{Cluster, load_cluster};
use trainplan::graph::Dfg;
use trainplan::zoo::{BuildOptions, ModelOptions, build, model};

/// Best wall time of `runs` calls of `f`, and the last result.
pub fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        last = Some(r);
    }
    (best, last.expect("runs > 0"))
}

/// A built-in cluster, optionally resized to `nodes` nodes.
pub fn cluster(name: &str, nodes: Option<u32>) -> Cluster {
    let c = load_cluster(name).expect("built-in cluster");
    match nodes {
        Some(n) => c.with_nodes(n),
        None => c,
    }
}

/// A zoo model's global DFG at its default batch.
pub fn zoo_graph(name: &str, c: &Cluster, symmetric: bool) -> Dfg {
    let m = model(name, &ModelOptions::default()).expect("zoo model");
    build(
        &m,
        c,
        &BuildOptions {
            symmetric,
            ..Default::default()
        },
    )
    .expect("valid graph")
}

/// Print one result line: `name: value unit (detail)`.
pub fn report(name: &str, value: f64, unit: &str, detail: &str) {
    println!("{name:<48} {value:>12.2} {unit:<10} {detail}");
}
