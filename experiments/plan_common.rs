//! Shared by the dPRO search experiments: build a zoo job and run the planner the way
//! `trainplan plan` does (baselines first, the search started from the fastest framework
//! default, the planned job evaluated in full where it fits).

#![allow(dead_code)]

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use trainplan::cost::config::{Cluster, load_cluster};
use trainplan::graph::job::Job;
use trainplan::passes;
use trainplan::search::{self, Decision, SearchOptions, Speedups, StopReason};
use trainplan::zoo;

/// The four models of dPRO Figs. 9–10 and Table 5, as the zoo names them.
pub const MODELS: [&str; 4] = ["resnet50", "vgg16", "inception-v3", "bert-base"];

/// A zoo job on `cluster` (default batch and options).
pub fn zoo_job(model: &str, cluster: &Cluster) -> Job {
    let m = zoo::model(model, &Default::default()).expect("zoo model");
    zoo::build::job(&m, cluster, &Default::default()).expect("zoo job")
}

pub fn cluster(name: &str) -> Cluster {
    load_cluster(name).expect("built-in cluster")
}

/// What one planner run gave.
pub struct Planned {
    /// Unoptimised job, ms.
    pub none_ms: f64,
    pub planned_ms: f64,
    /// Every baseline, ms, in `search::baselines::NAMES` order.
    pub baselines: Vec<(String, f64)>,
    /// Wall time of the baselines, s.
    pub baselines_s: f64,
    /// Wall time of the search (as `plan --json` reports `search_wall_s`), s.
    pub search_s: f64,
    pub replays: u64,
    pub rounds: usize,
    pub stop: StopReason,
    /// Whether the final job was evaluated in the symmetric form (too large in full).
    pub symmetric_final: bool,
}

/// Run `plan` on `job` with these speed-ups and search budget.
pub fn plan(job: Job, speedups: Speedups, budget: Duration) -> Planned {
    let all = passes::registry();
    let eval = search::evaluator(speedups.symmetry);
    let t0 = Instant::now();
    let bases = search::baselines::baselines(&job, &eval).expect("baselines");
    let baselines_s = t0.elapsed().as_secs_f64();
    let start = bases
        .iter()
        .min_by_key(|b| b.eval.iteration_ns())
        .filter(|b| b.name != "none")
        .map(|b| {
            (
                b.job.clone(),
                Decision {
                    pass: format!("baseline:{}", b.name),
                    tensors: Vec::new(),
                    ops: Vec::new(),
                    partitions: None,
                    knobs: Default::default(),
                    why: b.config.clone(),
                    mechanism: String::new(),
                    effect_ms: 0.0,
                },
            )
        });
    let opts = SearchOptions {
        budget,
        speedups,
        ..SearchOptions::default()
    };
    let stop = AtomicBool::new(false);
    let out = search::search(job, start, &opts, &all, &stop, &|_| {}).expect("search");
    Planned {
        none_ms: out.baseline.iteration_ns() as f64 / 1e6,
        planned_ms: out.best.iteration_ns() as f64 / 1e6,
        baselines: bases
            .iter()
            .map(|b| (b.name.to_string(), b.eval.iteration_ns() as f64 / 1e6))
            .collect(),
        baselines_s,
        search_s: out.wall.as_secs_f64(),
        replays: out.replays,
        rounds: out.rounds,
        stop: out.stop,
        symmetric_final: out.best.job.symmetric,
    }
}

/// Write `experiments/results/<name>.{md,csv,svg}`.
pub fn write_results(name: &str, md: &str, csv: &str, svg: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/results");
    std::fs::create_dir_all(&dir).expect("results folder");
    for (ext, body) in [("md", md), ("csv", csv), ("svg", svg)] {
        let p = dir.join(format!("{name}.{ext}"));
        std::fs::write(&p, body).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        eprintln!("wrote {}", p.display());
    }
}

/// Seconds from an environment variable, or the default.
pub fn env_secs(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}
