//! Search wall time for BERT-base on the dPRO testbed (dpro-16xv100-rdma), critical-path
//! strategy from the unoptimised job, with and without the symmetry speed-up, on the rayon
//! pool's thread count. Run it as
//! `RAYON_NUM_THREADS=1 cargo bench --bench search` and `RAYON_NUM_THREADS=2 cargo bench --bench search`
//! and compare: the parallel speed-up of candidate evaluation. Best of `BENCH_RUNS` (default 3).

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use trainplan::search::{SearchOptions, Speedups, search};

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let model = trainplan::zoo::model("bert-base", &Default::default()).expect("bert-base");
    let cluster = trainplan::cost::config::load_cluster("dpro-16xv100-rdma").expect("cluster");
    let job = trainplan::zoo::build::job(&model, &cluster, &Default::default()).expect("job");
    let all = trainplan::passes::registry();
    let threads = rayon::current_num_threads();
    for symmetry in [true, false] {
        let opts = SearchOptions {
            budget: Duration::from_secs(600),
            speedups: Speedups {
                symmetry,
                ..Speedups::default()
            },
            ..SearchOptions::default()
        };
        let mut best = f64::INFINITY;
        let mut last = None;
        for _ in 0..runs {
            let t = Instant::now();
            let o = search(
                job.clone(),
                None,
                &opts,
                &all,
                &AtomicBool::new(false),
                &|_| {},
            )
            .expect("the search runs");
            best = best.min(t.elapsed().as_secs_f64());
            last = Some(o);
        }
        let o = last.expect("one run");
        println!(
            "search bert-base dpro-16xv100-rdma symmetry={symmetry} threads={threads}: {best:.2} s (best of {runs}), {} replays, {} rounds, {:.1} → {:.1} ms, {:?}",
            o.replays,
            o.rounds,
            o.baseline.iteration_ns() as f64 / 1e6,
            o.best.iteration_ns() as f64 / 1e6,
            o.stop
        );
    }
}
