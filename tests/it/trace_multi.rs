//! `trainplan replay --trace` with several ranks: matching collectives, "a collective ends when
//! its last rank arrives", clock alignment, and the mismatches that must be refused (exit 3).

use std::path::PathBuf;

use trainplan::trace::KinetoTrace;
use trainplan::trace::align::{AlignOptions, align};
use trainplan::trace::multi::{collective_times, global_graph, rank_steps, replay_ranks};

use crate::support::{check_bad_input, run_json, shared_traces, write_tmp};

/// One rank of a 2-rank job: a step of `len` µs from `t0`, one all-reduce launched at `t0 + 10`
/// whose kernel runs `k0..k1` (recorded, including the wait for the other rank), then a
/// cudaStreamSynchronize from `t0 + 20` until `k1 + 1`.
fn rank(r: u32, world: u32, t0: i64, len: i64, k0: i64, k1: i64, kernel: &str) -> String {
    format!(
        r#"{{"distributedInfo":{{"backend":"nccl","rank":{r},"world_size":{world}}},"traceEvents":[
{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":{t0},"dur":{len}}},
{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{l},"dur":5,"args":{{"correlation":1}}}},
{{"ph":"X","cat":"kernel","name":"{kernel}","pid":0,"tid":20,"ts":{k0},"dur":{kd},"args":{{"correlation":1,"stream":20}}}},
{{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":1,"tid":1,"ts":{l}}},
{{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":20,"ts":{k0},"bp":"e"}},
{{"ph":"X","cat":"cuda_runtime","name":"cudaStreamSynchronize","pid":1,"tid":1,"ts":{s},"dur":{sd},"args":{{"correlation":2}}}}
]}}"#,
        l = t0 + 10,
        kd = k1 - k0,
        s = t0 + 20,
        sd = k1 + 1 - (t0 + 20),
    )
}

const AR: &str = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)";

/// Rank 0 starts at 0 and waits in the all-reduce (15–95 µs) for rank 1, which starts at 60 and
/// arrives at 75; the transfer is rank 1's 20 µs. `skew` shifts rank 1's whole clock.
fn pair(tag: &str, skew: i64) -> (PathBuf, PathBuf) {
    (
        write_tmp(&format!("{tag}_r0.json"), &rank(0, 2, 0, 100, 15, 95, AR)),
        write_tmp(
            &format!("{tag}_r1.json"),
            &rank(1, 2, 60 + skew, 40, 75 + skew, 95 + skew, AR),
        ),
    )
}

#[test]
fn a_collective_ends_when_its_last_rank_arrives() {
    let (a, b) = pair("same_clock", 0);
    let v = run_json(&[
        "replay",
        "--trace",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert_eq!(v["workers"], 2);
    assert_eq!(v["collectives"], 1);
    let ranks = v["ranks"].as_array().unwrap();
    // Rank 0: barrier at 75 µs (rank 1's arrival), transfer 20 µs → ends at 95; the sync returns
    // 1 µs later, the step ends at 100. Rank 1: the same end, 40 µs after its start.
    assert_eq!(ranks[0]["predicted_ms"].as_f64(), Some(0.1));
    assert_eq!(ranks[1]["predicted_ms"].as_f64(), Some(0.04));
    assert_eq!(ranks[1]["release_ms"].as_f64(), Some(0.06));
    assert_eq!(v["error_pct"].as_f64(), Some(0.0));
}

#[test]
fn alignment_undoes_a_clock_skew() {
    // Rank 1's clock runs 1 ms ahead: as recorded, rank 0 would wait for it for 1 ms.
    let (a, b) = pair("skewed", 1000);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let raw = run_json(&["replay", "--trace", a, b, "--no-align"]);
    let r0 = raw["ranks"][0]["predicted_ms"].as_f64().unwrap();
    assert!((r0 - 1.1).abs() < 1e-9, "{raw}");
    let fixed = run_json(&["replay", "--trace", a, b]);
    assert_eq!(fixed["ranks"][0]["predicted_ms"].as_f64(), Some(0.1));
    assert_eq!(fixed["ranks"][1]["predicted_ms"].as_f64(), Some(0.04));
    assert_eq!(fixed["ranks"][1]["clock_offset_us"].as_f64(), Some(-1000.0));
}

#[test]
fn mismatched_ranks_are_refused() {
    let r0 = write_tmp("mm_r0.json", &rank(0, 2, 0, 100, 15, 95, AR));
    // Another collective type at the same position.
    let bc = write_tmp(
        "mm_bcast.json",
        &rank(
            1,
            2,
            60,
            40,
            75,
            95,
            "ncclKernel_Broadcast_RING_LL_Sum_float",
        ),
    );
    let msg = check_bad_input(
        &[
            "replay",
            "--trace",
            r0.to_str().unwrap(),
            bc.to_str().unwrap(),
        ],
        "differs",
    );
    assert!(
        msg.contains("mm_bcast.json") && msg.contains("event #"),
        "{msg}"
    );
    // Different world sizes.
    let w4 = write_tmp("mm_w4.json", &rank(1, 4, 60, 40, 75, 95, AR));
    let msg = check_bad_input(
        &[
            "replay",
            "--trace",
            r0.to_str().unwrap(),
            w4.to_str().unwrap(),
        ],
        "world size",
    );
    assert!(msg.contains("mm_w4.json"), "{msg}");
    // The same rank twice.
    let again = write_tmp("mm_again.json", &rank(0, 2, 60, 40, 75, 95, AR));
    check_bad_input(
        &[
            "replay",
            "--trace",
            r0.to_str().unwrap(),
            again.to_str().unwrap(),
        ],
        "both rank 0",
    );
    // A rank without the collective (a compute kernel instead of the NCCL one).
    let none = write_tmp("mm_none.json", &rank(1, 2, 60, 40, 75, 95, "gemm_kernel"));
    let msg = check_bad_input(
        &[
            "replay",
            "--trace",
            r0.to_str().unwrap(),
            none.to_str().unwrap(),
        ],
        "do not match",
    );
    assert!(msg.contains("mm_none.json"), "{msg}");
}

/// The global graph refuses ranks whose collectives no longer match (a pass that removed a
/// collective on one rank only, as `whatif` on ranks whose recorded steps read differently can):
/// an error naming both ranks, not an index out of bounds.
#[test]
fn the_global_graph_refuses_ranks_that_no_longer_match() {
    let (a, b) = pair("diverged", 0);
    let traces: Vec<(String, KinetoTrace)> = [a, b]
        .iter()
        .map(|p| {
            (
                p.display().to_string(),
                trainplan::trace::read_kineto(p).unwrap(),
            )
        })
        .collect();
    let refs: Vec<(String, &KinetoTrace)> = traces.iter().map(|(n, t)| (n.clone(), t)).collect();
    let (mut ranks, _) = rank_steps(&refs, None).unwrap();
    assert!(global_graph(&ranks).is_ok());
    ranks[1].groups[0].clear();
    let e = global_graph(&ranks).unwrap_err().to_string();
    assert!(
        e.contains("has 1 collectives in group 0") && e.contains("has 0"),
        "{e}"
    );
}

fn dlrm() -> Option<PathBuf> {
    shared_traces("multi-rank-dlrm")
}

#[test]
fn dlrm_eight_ranks_replay_within_one_percent() {
    let Some(d) = dlrm() else { return };
    let v = run_json(&["replay", "--trace", d.to_str().unwrap()]);
    assert_eq!(v["workers"], 8);
    assert_eq!(v["collectives"], 8);
    assert_eq!(v["step"], "ProfilerStep#10");
    // The measured steps of the README: r1 is the slowest at 19.901 ms.
    assert_eq!(v["measured_iteration_ms"].as_f64(), Some(19.901));
    for r in v["ranks"].as_array().unwrap() {
        let e = r["error_pct"].as_f64().unwrap();
        assert!(e.abs() < 1.0, "{r}");
        // One host clock: the offsets found are a few µs at most.
        assert!(r["clock_offset_us"].as_f64().unwrap().abs() < 20.0, "{r}");
    }
}

#[test]
fn dlrm_known_clock_shifts_are_recovered() {
    let Some(d) = dlrm() else { return };
    let shift = [
        0i64, 4_200_000, -3_100_000, 5_000_000, -4_900_000, 1_000, 2_500_000, -750_000,
    ];
    let traces: Vec<(String, KinetoTrace)> = (0..8)
        .map(|r| {
            let p = d.join(format!("rank{r}.kineto.json.gz"));
            let mut t = trainplan::trace::read_kineto(&p).unwrap();
            for e in &mut t.events {
                e.ts_ns += shift[r];
            }
            (p.display().to_string(), t)
        })
        .collect();
    let refs: Vec<(String, &KinetoTrace)> = traces.iter().map(|(n, t)| (n.clone(), t)).collect();
    let (ranks, _) = rank_steps(&refs, None).unwrap();
    let a = align(&collective_times(&ranks), &AlignOptions::default()).unwrap();
    for r in 0..8 {
        let err = a.offsets_ns[r] + shift[r] - shift[0];
        assert!(err.abs() < 20_000, "rank {r}: off by {err} ns");
    }
    let g = global_graph(&ranks).unwrap();
    let before = replay_ranks(&ranks, &g, &[0; 8]);
    let after = replay_ranks(&ranks, &g, &a.offsets_ns);
    let worst = |p: &[u64]| {
        p.iter()
            .zip(&ranks)
            .map(|(&p, r)| (p as f64 / r.measured_ns() as f64 - 1.0).abs())
            .fold(0.0, f64::max)
    };
    assert!(worst(&before.predicted_ns) > 0.05, "the shifts must matter");
    assert!(worst(&after.predicted_ns) < 0.01);
}

#[test]
fn one_rank_stands_for_a_cluster() {
    // Rank 0 of 2 with the all-reduce's size on the kernel (PyTorch ≥ 2.1): 1,000,000 floats.
    let text = rank(0, 2, 0, 100, 15, 95, AR).replace(
        r#""args":{"correlation":1,"stream":20}"#,
        r#""args":{"correlation":1,"stream":20,"Collective name":"allreduce","In msg nelems":1000000,"dtype":"Float","Group size":2}"#,
    );
    let p = write_tmp("one_to_n.json", &text);
    let v = run_json(&[
        "replay",
        "--trace",
        p.to_str().unwrap(),
        "--cluster",
        "8xv100",
    ]);
    assert_eq!(v["workers"], 8);
    assert_eq!(v["cluster"], "8xv100");
    // 8 ranks on NVLink (α 5.4 µs, 1,200 Gb/s × 0.907): 14 ring steps of (5.4 µs + 500 kB / 136.05 B/ns).
    let c = &v["extrapolation"]["collectives"][0];
    assert_eq!(c["bytes"], 4_000_000);
    assert_eq!(c["size_from"], "kernel args");
    let expect_ms = 14.0 * (5400.0 + 500_000.0 / (1200.0 * 0.907 / 8.0)) / 1e6;
    assert!(
        (c["modelled_ms"].as_f64().unwrap() - expect_ms).abs() < 1e-5,
        "{c}"
    );
    // The recorded run had 2 workers: no error figure against it.
    assert!(v["error_pct"].is_null(), "{v}");
    // On its own shape (2 workers) the measurement is comparable again.
    let v2 = run_json(&[
        "replay",
        "--trace",
        p.to_str().unwrap(),
        "--cluster",
        "2xa100",
    ]);
    assert!(v2["error_pct"].is_number(), "{v2}");
    // Without a size anywhere: refused, naming the kernel.
    let bare = write_tmp("one_to_n_bare.json", &rank(0, 2, 0, 100, 15, 95, AR));
    let msg = check_bad_input(
        &[
            "replay",
            "--trace",
            bare.to_str().unwrap(),
            "--cluster",
            "8xv100",
        ],
        "has no size",
    );
    assert!(
        msg.contains("one_to_n_bare.json") && msg.contains("event #"),
        "{msg}"
    );
}

/// Issue 20, class 7: ranks recorded on different GPU models are not one homogeneous job; the
/// replay says so, with how many ranks ran each model.
#[test]
fn ranks_on_different_gpu_models_are_counted() {
    let props = |name: &str| format!(r#""deviceProperties":[{{"id":0,"name":"{name}"}}],"#);
    let with = |text: String, gpu: &str| text.replacen('{', &format!("{{{}", props(gpu)), 1);
    let a = write_tmp(
        "gpus_r0.json",
        &with(rank(0, 2, 0, 100, 15, 95, AR), "NVIDIA A100-SXM4-80GB"),
    );
    let b = write_tmp(
        "gpus_r1.json",
        &with(rank(1, 2, 60, 40, 75, 95, AR), "Tesla V100-SXM2-32GB"),
    );
    let (code, out, err) = crate::support::run(&[
        "replay",
        "--trace",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with('{'), "{out}");
    assert!(
        err.contains("the ranks were recorded on 2 different GPU models")
            && err.contains("1 on NVIDIA A100-SXM4-80GB (first: rank 0")
            && err.contains("1 on Tesla V100-SXM2-32GB (first: rank 1"),
        "{err}"
    );
    // The same model on both: nothing to say.
    let c = write_tmp(
        "gpus_r1b.json",
        &with(rank(1, 2, 60, 40, 75, 95, AR), "NVIDIA A100-SXM4-80GB"),
    );
    let (code, _, err) = crate::support::run(&[
        "replay",
        "--trace",
        a.to_str().unwrap(),
        c.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("GPU models"), "{err}");
}
