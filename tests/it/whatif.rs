//! `trainplan passes` and `trainplan whatif` end to end: the listing, the DESIGN.md `--json`
//! fields, each built-in pass moving time and memory the way its cost model says, and bad input
//! (unknown pass or knob, knob out of range, bad pass files) exiting 3 with one line.

use crate::cli::{check_bad_input, check_error, run, run_json};

const BERT: &[&str] = &[
    "--model",
    "bert-base",
    "--batch",
    "8",
    "--cluster",
    "dpro-16xv100-rdma",
];

fn whatif(extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["whatif"];
    a.extend_from_slice(BERT);
    a.extend_from_slice(extra);
    run_json(&a)
}

#[test]
fn passes_lists_every_builtin_with_its_knobs() {
    let (code, out, _) = run(&["passes"]);
    assert_eq!(code, 0);
    for name in [
        "amp",
        "blueconnect",
        "dgc",
        "fused-adam",
        "grad-accumulation",
        "op-fusion",
        "p3",
        "recompute",
        "reconstruct-batchnorm",
        "tensor-fusion",
        "tensor-partition",
        "vdnn",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(name)),
            "{name} missing from:\n{out}"
        );
    }
    let v = run_json(&["passes"]);
    let list = v["passes"].as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|p| p["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "registry is sorted");
    let ga = list
        .iter()
        .find(|p| p["name"] == "grad-accumulation")
        .unwrap();
    assert!(
        ga["knobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "k")
    );
}

#[test]
fn whatif_json_has_the_design_fields() {
    let v = whatif(&["--pass", "amp"]);
    for f in [
        "baseline_iteration_ms",
        "iteration_ms",
        "speedup",
        "baseline_peak_memory_bytes",
        "peak_memory_bytes",
    ] {
        assert!(v[f].is_number(), "{f}: {v}");
    }
    let (b, a) = (
        v["baseline_iteration_ms"].as_f64().unwrap(),
        v["iteration_ms"].as_f64().unwrap(),
    );
    assert!((v["speedup"].as_f64().unwrap() - b / a).abs() < 1e-9);
}

#[test]
fn bad_pass_arguments_are_bad_input() {
    let mut a = vec!["whatif"];
    a.extend_from_slice(BERT);
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = a.clone();
        v.extend_from_slice(extra);
        v
    };
    let e = check_bad_input(
        &with(&["--pass", "warp-drive"]),
        "unknown pass `warp-drive`",
    );
    assert!(
        e.contains("op-fusion") && e.contains("tensor-fusion"),
        "{e}"
    );
    check_bad_input(
        &with(&["--pass", "amp:warp=9"]),
        "pass amp has no knob `warp`",
    );
    check_bad_input(&with(&["--pass", "grad-accumulation:k=0"]), "knob k = 0");
    check_bad_input(
        &with(&["--pass", "grad-accumulation:k=two"]),
        "not an integer",
    );
    check_bad_input(
        &with(&["--pass-file", "/nonexistent/p.yaml", "--pass", "amp"]),
        "/nonexistent/p.yaml",
    );
    check_error(&a, 2, "--pass");
}
