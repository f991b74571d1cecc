//! `trainplan plan` end to end: the `--json` fields DESIGN.md fixes, the plan never slower than
//! a baseline, byte-identical plans for the same input and seed (both strategies), the plan file
//! round-trips, errors and their exit codes (usage 2 without touching the output, bad pass 3,
//! infeasible memory budget 4), and Ctrl-C (130 with the best plan so far written).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::cli::{check_bad_input, check_error, run, run_json};

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trainplan-it-plan-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a scratch folder");
    d
}

const SMALL: [&str; 6] = ["plan", "--model", "resnet50", "--batch", "4", "--cluster"];

/// `plan` on ResNet-50 batch 4 on one H200 server, plus `extra`, writing to `out`.
fn plan_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a: Vec<&str> = SMALL.to_vec();
    a.extend(["8xh200", "--budget", "60s", "-o", out]);
    a.extend(extra);
    a
}

fn read(p: &std::path::Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn json_has_the_design_fields_and_the_plan_beats_every_baseline() {
    let d = scratch("json");
    let out = d.join("p.yaml");
    let out_s = out.to_str().unwrap();
    let v = run_json(&plan_args(out_s, &[]));
    for f in [
        "baseline_iteration_ms",
        "planned_iteration_ms",
        "speedup",
        "baselines",
        "lower_bound_ms",
        "search_wall_s",
        "replays",
        "stop_reason",
        "decisions",
        "plan_path",
    ] {
        assert!(v.get(f).is_some(), "no `{f}` in {v}");
    }
    let baselines = v["baselines"].as_object().unwrap();
    let mut names: Vec<&str> = baselines.keys().map(|k| k.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "byteps_default",
            "ddp_default",
            "horovod_autotune",
            "horovod_default",
            "none",
            "xla_default"
        ]
    );
    let planned = v["planned_iteration_ms"].as_f64().unwrap();
    for (name, ms) in baselines {
        assert!(
            planned <= ms.as_f64().unwrap(),
            "{name}: {ms} < planned {planned}"
        );
    }
    let base = v["baseline_iteration_ms"].as_f64().unwrap();
    assert_eq!(base, baselines["none"].as_f64().unwrap());
    let speedup = v["speedup"].as_f64().unwrap();
    assert!(
        (speedup - base / planned).abs() < 0.01,
        "{speedup} vs {base}/{planned}"
    );
    assert!(v["lower_bound_ms"].as_f64().unwrap() <= planned);
    assert_eq!(v["stop_reason"], "converged");
    assert!(v["replays"].as_u64().unwrap() > 1);
    assert!(!v["decisions"].as_array().unwrap().is_empty());
    assert_eq!(v["plan_path"], out_s);

    // The file parses back and re-serialises byte-identically.
    let text = read(&out);
    let plan = trainplan::plan::Plan::from_yaml(&text, out_s).expect("the plan parses");
    assert_eq!(plan.to_yaml(), text);
    assert_eq!(plan.predicted.planned.iteration_ms, planned);
    assert_eq!(
        plan.decisions.len(),
        v["decisions"].as_array().unwrap().len()
    );
}

#[test]
fn the_same_input_and_seed_give_byte_identical_plans() {
    let d = scratch("determinism");
    for (tag, extra) in [
        ("cp", vec![]),
        ("mcmc", vec!["--strategy", "mcmc", "--seed", "3"]),
    ] {
        let texts: Vec<String> = (0..2)
            .map(|i| {
                let out = d.join(format!("{tag}{i}.yaml"));
                let (code, _, stderr) = run(&plan_args(out.to_str().unwrap(), &extra));
                assert_eq!(code, 0, "{tag}: {stderr}");
                read(&out)
            })
            .collect();
        assert_eq!(texts[0], texts[1], "{tag}: two runs differ");
        let plan = trainplan::plan::Plan::from_yaml(&texts[0], tag).unwrap();
        assert_eq!(plan.search.stop, trainplan::search::StopReason::Converged);
        if tag == "mcmc" {
            assert_eq!(plan.search.strategy, trainplan::search::Strategy::Mcmc);
            assert_eq!(plan.search.seed, 3);
            assert!(plan.predicted.planned.iteration_ms <= plan.predicted.baseline.iteration_ms);
        }
    }
}

#[test]
fn a_usage_error_leaves_the_output_untouched() {
    let d = scratch("usage");
    let out = d.join("keep.yaml");
    std::fs::write(&out, "precious\n").unwrap();
    let out_s = out.to_str().unwrap();
    let mut a: Vec<&str> = SMALL.to_vec();
    a.extend(["8xh200", "--budget", "soon", "-o", out_s]);
    let msg = check_error(&a, 2, "--budget");
    assert!(msg.contains("soon"), "{msg}");
    assert_eq!(read(&out), "precious\n");
    // Nothing else appeared beside it (no temporary file left behind).
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
}

#[test]
fn an_unreachable_memory_budget_is_infeasible_with_the_smallest_peak() {
    let d = scratch("memory");
    let out = d.join("p.yaml");
    let msg = check_error(
        &plan_args(out.to_str().unwrap(), &["--memory-budget", "1MB"]),
        4,
        "smallest peak reached",
    );
    assert!(msg.contains("GB"), "{msg}");
    assert!(!out.exists(), "an infeasible plan was written");
}

#[test]
fn an_unknown_pass_is_bad_input_listing_the_passes() {
    let d = scratch("passes");
    let out = d.join("p.yaml");
    let msg = check_bad_input(
        &plan_args(out.to_str().unwrap(), &["--passes", "op-fusion,nope"]),
        "nope",
    );
    for known in ["op-fusion", "tensor-fusion", "tensor-partition", "amp"] {
        assert!(msg.contains(known), "{known} not listed: {msg}");
    }
    assert!(!out.exists());
}

/// Ctrl-C a few seconds into a run that would take minutes (full graph, no symmetry): the best
/// plan so far is written and the exit code is 130.
#[test]
fn ctrl_c_writes_the_best_plan_so_far_and_exits_130() {
    let d = scratch("interrupt");
    let out = d.join("p.yaml");
    let child = Command::new(env!("CARGO_BIN_EXE_trainplan"))
        .args([
            "plan",
            "--model",
            "bert-base",
            "--cluster",
            "dpro-16xv100-rdma",
            "--no-symmetry",
            "--budget",
            "10m",
            "-o",
            out.to_str().unwrap(),
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("trainplan starts");
    std::thread::sleep(Duration::from_secs(3));
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    let got = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(got.status.code(), Some(130), "stderr: {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let text = read(&out);
    let plan = trainplan::plan::Plan::from_yaml(&text, "p.yaml").expect("the plan parses");
    assert_eq!(plan.search.stop, trainplan::search::StopReason::Interrupted);
    assert!(plan.predicted.planned.iteration_ms <= plan.predicted.baseline.iteration_ms);
}
