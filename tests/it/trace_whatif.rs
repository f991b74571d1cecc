//! What-ifs on real traces (issue 15): kernels re-costed from their operators' shapes relative
//! to their recorded times, memory from `[memory]` events, the facts a trace states about its
//! job, every rank of a folder, the steady-state period, host-bound steps, and the gradient
//! accumulation cycle that once broke on the DDP trace. Every test skips when
//! `../shared/traces` is absent.

use std::path::PathBuf;

use trainplan::cost::kernel::OpClass;
use trainplan::graph::OpKind;
use trainplan::graph::job::Job;
use trainplan::passes::{self, Evaluated};
use trainplan::trace::graph::{TraceJob, build_job};

use crate::support::{run, run_json, shared_traces, traces};

fn kineto(name: &str) -> Option<PathBuf> {
    traces().map(|d| d.join(name))
}

fn built(name: &str) -> Option<TraceJob> {
    let p = kineto(name)?;
    let t = trainplan::trace::read_kineto(&p).unwrap();
    Some(build_job(&t, name, None).unwrap())
}

/// `job` after one pass with its default knobs (or `knobs`).
fn after(job: &Job, pass: &str, knobs: &[(&str, &str)]) -> (Evaluated, Evaluated) {
    let reg = passes::registry();
    let p = passes::find(&reg, pass).unwrap();
    let given: Vec<(String, String)> = knobs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let k = passes::resolve_knobs(p, &given).unwrap();
    let base = passes::evaluate(job.clone()).unwrap();
    let patches = trainplan::passes::propose(p, &base, &k).unwrap();
    let job = passes::apply_all(&base.job, &patches).unwrap();
    (base, passes::evaluate(job).unwrap())
}

const SHAPES: &str = "resnet50_v100_2021fmt_shapes_memory.json.gz";
const DDP: &str = "resnet50_ddp_a100_rank0of2.json.gz";

#[test]
fn a_gemm_is_recosted_from_its_shapes_relative_to_its_recorded_time() {
    let Some(t) = built(SHAPES) else { return };
    let job = &t.job;
    // ResNet-50's classifier, aten::addmm(bias[1000], x[32, 2048], w[2048, 1000]): its forward
    // kernel(s) carry a share of 2·32·1000·2048 FLOPs and the product's shape.
    let fc: Vec<usize> = (0..job.local.ops.len())
        .filter(|&i| {
            let o = &job.local.ops[i];
            o.spec.kind == OpKind::Compute
                && o.work.is_some_and(|w| {
                    w.class == OpClass::Gemm
                        && (w.gemms[0].m, w.gemms[0].n, w.gemms[0].k) == (32.0, 1000.0, 2048.0)
                })
        })
        .collect();
    assert!(
        !fc.is_empty(),
        "the classifier's forward GEMM has its shape"
    );
    let total: f64 = fc
        .iter()
        .map(|&i| job.local.ops[i].work.unwrap().flops)
        .sum();
    // (Shares of one operator's work, summed back: equal up to rounding.)
    assert!(
        (total / (2.0 * 32.0 * 1000.0 * 2048.0) - 1.0).abs() < 1e-12,
        "{total}"
    );
    // AMP re-costs each relative to itself: recorded × model(fp16) / model(fp32).
    let (_, amp) = after(job, "amp", &[]);
    let m = job.kernels();
    for &i in &fc {
        let o = &job.local.ops[i];
        let w = o.work.unwrap();
        let ratio = m.time_ns(&w, trainplan::cost::config::Dtype::Fp16, job.math)
            / m.time_ns(&w, job.dtype, job.math);
        let expect = (o.spec.dur_ns as f64 * ratio).round() as u64;
        // AMP inserts no ops on a trace (no parameter tensors): ids are unchanged.
        assert_eq!(amp.job.local.ops[i].spec.dur_ns, expect, "op {i}");
        assert!(expect < o.spec.dur_ns);
    }
    // Most of the step's GPU time has shapes.
    let f = job.meta.trace.as_deref().unwrap();
    assert!(
        f.work.shapes_ns > 9 * (f.work.names_ns + f.work.none_ns),
        "{:?}",
        f.work
    );
}

#[test]
fn the_memory_trace_reports_its_measured_peak_and_passes_lower_it() {
    let Some(p) = kineto(SHAPES) else { return };
    let trace = trainplan::trace::read_kineto(&p).unwrap();
    let t = build_job(&trace, SHAPES, None).unwrap();
    // The events' own maximum in the step: the running sum of the device's Bytes.
    let (lo, hi) = (t.window.start_ns, t.window.end_ns);
    let mut dev: Vec<_> = trace.memory.iter().filter(|m| m.on_device()).collect();
    dev.sort_by_key(|m| (m.ts_ns, m.event));
    let (mut sum, mut max) = (0i64, 0i64);
    for m in dev {
        sum += m.bytes;
        if m.ts_ns < lo {
            max = sum;
        } else if m.ts_ns < hi {
            max = max.max(sum);
        }
    }
    let f = t.job.meta.trace.as_deref().unwrap();
    let mem = f.memory.as_ref().unwrap();
    let within = |x: u64| (x as f64 / max as f64 - 1.0).abs() < 0.01;
    assert!(within(mem.peak_bytes), "{} vs {max}", mem.peak_bytes);
    let base = passes::evaluate(t.job.clone()).unwrap();
    assert!(
        within(base.memory.peak_bytes),
        "replayed {}",
        base.memory.peak_bytes
    );
    // Recomputation, AMP and accumulation each predict a lower peak.
    for (pass, knobs) in [
        ("recompute", vec![]),
        ("amp", vec![]),
        ("grad-accumulation", vec![("k", "2")]),
    ] {
        let (b, a) = after(&t.job, pass, &knobs);
        assert!(
            a.memory.peak_bytes < b.memory.peak_bytes * 9 / 10,
            "{pass}: {} → {}",
            b.memory.peak_bytes,
            a.memory.peak_bytes
        );
    }
}

#[test]
fn facts_of_the_shared_traces() {
    let Some(t) = built(SHAPES) else { return };
    let f = t.job.meta.trace.as_deref().unwrap();
    assert_eq!(f.batch, Some(32));
    assert_eq!(f.gpu_config, "v100-32gb");
    assert_eq!(f.optimizer.as_deref(), Some("SGD"));
    assert_eq!(f.world_size, None);
    assert_eq!(t.job.meta.batch, 32);
    let Some(t) = built(DDP) else { return };
    let f = t.job.meta.trace.as_deref().unwrap();
    assert_eq!((f.rank, f.world_size), (Some(0), Some(2)));
    assert_eq!(f.batch, None, "no Input Dims in this trace");
    let b = f.bucketing.as_ref().unwrap();
    assert_eq!(b.sizes_bytes.len(), 5);
    // 25,557,032 ResNet-50 parameters in fp32, in DDP's default 25 MiB buckets.
    assert_eq!(b.total_bytes, 25_557_032 * 4);
    assert_eq!(b.cap_bytes, Some(25 << 20));
    assert_eq!(f.collectives.get("AllReduce"), Some(&5));
}

#[test]
fn the_steady_period_of_a_gpu_bound_trace_is_its_measured_step() {
    // The GPU runs ~90 ms behind the host (the step's GPU work drains at 184 ms of a 96 ms
    // step): the makespan is not the period; the step-to-step time is.
    let Some((e, measured)) = evaluated_step("resnet50_v100_1gpu_ns_timestamps.json.gz") else {
        return;
    };
    assert!(e.makespan_ns() as f64 > 1.5 * measured);
    let period = e.iteration_ns() as f64;
    assert!(
        (period / measured - 1.0).abs() < 0.01,
        "{period} vs {measured}"
    );
}

/// The shared trace `name` evaluated, with its measured step (ns); `None` without ../shared.
fn evaluated_step(name: &str) -> Option<(passes::Evaluated, f64)> {
    let t = built(name)?;
    let e = passes::evaluate(t.job.clone()).unwrap();
    Some((e, t.window.measured_ns() as f64))
}

/// Issue 27: the ROCm activation-checkpointing trace once replayed to a steady period of twice
/// its step (a 0.01 ms recorded broadcast stretched by peer-wait pinning, and `plan` called that
/// period "as recorded"). Its step-to-step time is its measured step.
#[test]
fn the_rocm_trace_steps_at_its_measured_step() {
    let Some((e, measured)) = evaluated_step("toy_train_mi250_rocm.json.gz") else {
        return;
    };
    let period = e.iteration_ns() as f64;
    assert!(
        (period / measured - 1.0).abs() < 0.02,
        "steady period {period} ns against the measured {measured} ns"
    );
}

#[test]
fn grad_accumulation_on_the_ddp_trace_has_no_cycle() {
    // Regression (issue 15): "the graph has a cycle through op 22294 (FW cpu @w0.cpu.t1)".
    let Some(p) = kineto(DDP) else { return };
    let p = p.to_str().unwrap();
    let v = run_json(&["whatif", "--trace", p, "--pass", "grad-accumulation:k=2"]);
    let (b, a) = (
        v["baseline_iteration_ms"].as_f64().unwrap(),
        v["iteration_ms"].as_f64().unwrap(),
    );
    // A host-bound step: each micro-step runs the host side again.
    assert!(a > b, "{b} → {a}");
}

/// Issue 27: tensor fusion on a trace re-buckets the recorded all-reduces (here DDP's five
/// ~25 MB buckets of ResNet-50's 102 MB of gradients, sizes from the NCCL kernels' args) up to
/// the threshold, names the new buckets, and changes the step; on the ranks of one job it
/// proposes nothing rather than breaking the match of their collectives.
#[test]
fn tensor_fusion_rebuckets_the_recorded_all_reduces() {
    let Some(p) = kineto(DDP) else { return };
    let p = p.to_str().unwrap();
    let v = run_json(&["whatif", "--trace", p, "--pass", "tensor-fusion:scope=all"]);
    let why: Vec<&str> = v["passes"][0]["why"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(
        why[0].starts_with(
            "bucket of all-reduces #3..=#4 (2 recorded all-reduces, 36.27 MB; sizes from the \
             kernels' args)"
        ) && why[1].starts_with(
            "bucket of all-reduces #0..=#2 (3 recorded all-reduces, 65.95 MB; sizes from the \
             kernels' args)"
        ) && why[1].contains("ring of 2 on nvlink-a100"),
        "{why:?}"
    );
    let (b, a) = (
        v["baseline_iteration_ms"].as_f64().unwrap(),
        v["iteration_ms"].as_f64().unwrap(),
    );
    assert!(a < b - 0.5, "{b} → {a}");
    // 16 MiB buckets: nothing two of DDP's ~25 MB buckets fit in.
    let (code, _, err) = run(&[
        "whatif",
        "--trace",
        p,
        "--pass",
        "tensor-fusion:scope=all,threshold_mb=16",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the pass found nothing to change"), "{err}");
    let Some(d) = traces().map(|d| d.join("../multi-rank-dlrm")) else {
        return;
    };
    let (code, _, err) = run(&[
        "whatif",
        "--trace",
        d.to_str().unwrap(),
        "--pass",
        "tensor-fusion:scope=all",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the pass found nothing to change"), "{err}");
}

#[test]
fn plan_on_the_ddp_trace_explains_a_host_bound_step() {
    let Some(p) = kineto(DDP) else { return };
    let out = std::env::temp_dir().join(format!("trainplan-it-ddp-{}.yaml", std::process::id()));
    let args = [
        "plan",
        "--trace",
        p.to_str().unwrap(),
        "--max-rounds",
        "100",
        "-o",
        out.to_str().unwrap(),
    ];
    let (code, text, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("host-bound"), "{text}");
    assert!(text.contains("rank 0 of 2"), "{text}");
    assert!(
        !text.contains("batch 0") && !text.contains("0.0 GB"),
        "{text}"
    );
    let v = run_json(&args);
    assert_eq!(v["host_bound"], true);
    // A DDP trace's baseline is the job as recorded; no Horovod/BytePS/XLA defaults.
    let names: Vec<&String> = v["baselines"].as_object().unwrap().keys().collect();
    assert_eq!(names, vec!["as_recorded"]);
    assert!(v["bound"]["critical_path_host_ms"].as_f64().unwrap() > 100.0);
    let _ = std::fs::remove_file(&out);
}

/// Issue 20: a plan cut by the budget carries the same report as one that ran its course —
/// here a budget that ends before the search starts. Whether the search thread or the main
/// thread (after the grace period) writes it, the host-bound explanation is there.
#[test]
fn a_budget_cut_plan_on_the_ddp_trace_keeps_its_explanation() {
    let Some(p) = kineto(DDP) else { return };
    let out =
        std::env::temp_dir().join(format!("trainplan-it-ddp-cut-{}.yaml", std::process::id()));
    let v = run_json(&[
        "plan",
        "--trace",
        p.to_str().unwrap(),
        "--budget",
        "1ns",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(v["stop_reason"], "budget");
    assert_eq!(v["host_bound"], true, "{v}");
    assert!(
        v["bound"]["critical_path_host_ms"].as_f64().unwrap() > 100.0,
        "{v}"
    );
    assert!(v["lower_bound_ms"].as_f64().is_some(), "{v}");
    let _ = std::fs::remove_file(&out);
}

#[test]
fn a_single_gpu_trace_has_no_data_parallel_baselines_and_no_batch_0() {
    let Some(p) = kineto("resnet50_v100_1gpu_ns_timestamps.json.gz") else {
        return;
    };
    let out = std::env::temp_dir().join(format!("trainplan-it-1gpu-{}.yaml", std::process::id()));
    let args = [
        "plan",
        "--trace",
        p.to_str().unwrap(),
        "--max-rounds",
        "100",
        "-o",
        out.to_str().unwrap(),
    ];
    let (code, text, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        !text.contains("batch 0") && !text.contains("0.0 GB"),
        "{text}"
    );
    assert!(text.contains("1 GPU"), "{text}");
    for dp in ["horovod", "byteps", "ddp_default", "xla_default"] {
        assert!(!text.contains(dp), "{dp} in:\n{text}");
    }
    let _ = std::fs::remove_file(&out);
}

#[test]
fn whatif_and_plan_on_the_dlrm_folder() {
    let Some(d) = traces().map(|d| d.join("../multi-rank-dlrm")) else {
        return;
    };
    let d = d.to_str().unwrap();
    let v = run_json(&["whatif", "--trace", d, "--pass", "cuda-graphs"]);
    assert_eq!(v["workers"], 8);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    let (b, a) = (
        v["baseline_iteration_ms"].as_f64().unwrap(),
        v["iteration_ms"].as_f64().unwrap(),
    );
    // The slowest rank's step as replayed with all ranks (19.9 ms measured), and launches
    // removed on every rank make it shorter.
    assert!((b - 19.9).abs() < 0.2, "{b}");
    assert!(a < b, "{b} → {a}");
    let out = std::env::temp_dir().join(format!("trainplan-it-dlrm-{}.yaml", std::process::id()));
    let v = run_json(&[
        "plan",
        "--trace",
        d,
        "--max-rounds",
        "100",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(out.exists());
    assert_eq!(v["ranks"].as_array().unwrap().len(), 8);
    assert!(
        v["planned_iteration_ms"].as_f64().unwrap() <= v["baseline_iteration_ms"].as_f64().unwrap()
    );
    let _ = std::fs::remove_file(&out);
}

/// Issue 27: the DLRM memory estimate holds the ranks' sharded embedding tables. Rank 3's
/// FBGEMM lookup carries 640,209,296 fp32 weights and as many Adagrad `momentum1` values on the
/// device (its `Input Dims`); rank 7's tables are a hundredth of that.
#[test]
fn the_dlrm_memory_estimate_holds_the_embedding_tables() {
    let Some(d) = shared_traces("multi-rank-dlrm") else {
        return;
    };
    let peak = |rank: u32| {
        let f = d.join(format!("rank{rank}.kineto.json.gz"));
        let v = run_json(&["replay", "--trace", f.to_str().unwrap()]);
        let static_bytes = v["memory_breakdown"]["static_bytes"].as_u64().unwrap();
        assert!(
            v["peak_memory_bytes"].as_u64().unwrap() >= static_bytes,
            "{v}"
        );
        static_bytes
    };
    let tables = 2 * 640_209_296 * 4;
    let big = peak(3);
    assert!(big >= tables && big < tables + 100_000_000, "{big}");
    let small = peak(7);
    assert!(small >= 2 * 6_520_016 * 4 && small < tables / 50, "{small}");
}

#[test]
fn whatif_on_a_chakra_trace() {
    let Some(d) = traces().map(|d| d.join("../execution-traces/resnet_ddp_rank0.chakra.et")) else {
        return;
    };
    let v = run_json(&[
        "whatif",
        "--trace",
        d.to_str().unwrap(),
        "--pass",
        "op-fusion",
    ]);
    assert!(v["baseline_iteration_ms"].as_f64().unwrap() > 0.0);
    assert!(v["iteration_ms"].as_f64().unwrap() <= v["baseline_iteration_ms"].as_f64().unwrap());
}

/// Issue 27: 2021 traces spell their shapes `Input dims`. The real 2021 trace (which says
/// `Input Dims`) respelt gives the same work coverage and batch.
#[test]
fn input_dims_in_either_spelling() {
    let Some(p) = kineto(SHAPES) else { return };
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    assert!(text.contains("\"Input Dims\""));
    let respelt = text.replace("\"Input Dims\"", "\"Input dims\"");
    let dir = std::env::temp_dir().join(format!("trainplan-it-dims-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let q = dir.join("resnet50_2021_input_dims.json");
    std::fs::write(&q, respelt).unwrap();
    let facts = |path: &std::path::Path| {
        let v = run_json(&["replay", "--trace", path.to_str().unwrap()]);
        (
            v["trace_facts"]["batch"].clone(),
            v["trace_facts"]["work"].clone(),
        )
    };
    let (b0, w0) = facts(&p);
    let (b1, w1) = facts(&q);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(b0, serde_json::json!(32));
    assert_eq!((b1, w1), (b0, w0));
}

/// Issue 27: fused Adam is refused on the SGD and Adagrad traces and on a step that already
/// runs `aten::_fused_adam_`.
#[test]
fn fused_adam_only_where_adam_runs_unfused() {
    for (name, why) in [
        (DDP, "steps with SGD"),
        (
            "../multi-rank-dlrm/rank0.kineto.json.gz",
            "steps with Adagrad",
        ),
    ] {
        let Some(p) = kineto(name) else { return };
        let (code, _, err) = run(&[
            "whatif",
            "--trace",
            p.to_str().unwrap(),
            "--pass",
            "fused-adam",
        ]);
        assert_ne!(code, 0, "{name}");
        assert!(err.contains(why), "{name}: {err}");
    }
    // A tiny step whose optimizer is Adam(fused=True).
    let fused = r#"{"traceEvents":[
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","pid":1,"tid":1,"ts":0,"dur":100},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":20,"dur":10,"args":{"correlation":1}},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":25,"dur":50,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":1,"tid":1,"ts":20},
{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":7,"ts":25,"bp":"e"},
{"ph":"X","cat":"user_annotation","name":"Optimizer.step#Adam.step","pid":1,"tid":1,"ts":82,"dur":12},
{"ph":"X","cat":"cpu_op","name":"aten::_fused_adam_","pid":1,"tid":1,"ts":83,"dur":8},
{"ph":"X","cat":"cuda_runtime","name":"cudaDeviceSynchronize","pid":1,"tid":1,"ts":50,"dur":30,"args":{"correlation":2}}
]}"#;
    let dir = std::env::temp_dir().join(format!("trainplan-it-fused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let q = dir.join("fused_adam_step.json");
    std::fs::write(&q, fused).unwrap();
    let (code, _, err) = run(&[
        "whatif",
        "--trace",
        q.to_str().unwrap(),
        "--pass",
        "fused-adam",
    ]);
    let plain = fused.replace("aten::_fused_adam_", "aten::add_");
    std::fs::write(&q, plain).unwrap();
    let (code2, _, err2) = run(&[
        "whatif",
        "--trace",
        q.to_str().unwrap(),
        "--pass",
        "fused-adam",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_ne!(code, 0);
    assert!(err.contains("already fused"), "{err}");
    // Unfused Adam: the pass is not refused for its optimizer (this step has no update
    // kernels, so it may still find nothing to merge).
    assert!(
        !err2.contains("steps with") && !err2.contains("already fused"),
        "{code2}: {err2}"
    );
}

/// Issue 27: an A100 trace replayed with `--cluster` of another GPU model says that it keeps
/// the recorded kernel times; with the same GPU model it says nothing.
#[test]
fn another_gpu_model_keeps_the_recorded_kernel_times_and_says_so() {
    let Some(p) = kineto(DDP) else { return };
    let p = p.to_str().unwrap();
    let (code, _, err) = run(&["replay", "--trace", p, "--cluster", "64xh100-ib"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("recorded on NVIDIA A100-PG509-200 (a100-80gb) and --cluster 64xh100-ib has h100-sxm: the recorded kernel and host times are kept"),
        "{err}"
    );
    let (code, _, err) = run(&["replay", "--trace", p, "--cluster", "2xa100"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !err.contains("recorded kernel and host times are kept"),
        "{err}"
    );
}
