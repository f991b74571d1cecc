//! Context parallelism (`context-parallel:degree=N[,batch=replica]`) end to end on zoo input:
//! `whatif` splits a long sequence's activations, `plan` picks it when one sample per GPU does
//! not fit and reports it in the layout, and a degree that cannot apply exits 3 naming why.

use crate::support::{check_bad_input, run_json};

/// A small Llama (8 layers, hidden 1024, 16 heads, 4 KV heads, flash attention) at one
/// 16,384-token sequence per GPU on 8 H200s, in bf16.
const LONG: [&str; 22] = [
    "--model",
    "llama",
    "--hidden",
    "1024",
    "--heads",
    "16",
    "--kv-heads",
    "4",
    "--ffn",
    "4096",
    "--seq",
    "16384",
    "--vocab",
    "32000",
    "--batch",
    "1",
    "--layers",
    "8",
    "--cluster",
    "8xh200",
    "--precision",
    "bf16",
];

fn with<'a>(cmd: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![cmd];
    a.extend_from_slice(&LONG);
    a.extend_from_slice(rest);
    a
}

fn gb(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key}: {v}")) / 1e9
}

/// With `batch=replica` each rank holds 1/N of the sequence: activations (most of this job's
/// memory) and compute shrink with N; the ring adds communication the pieces hide.
#[test]
fn whatif_context_parallelism_splits_the_sequence() {
    let mut last = f64::MAX;
    for cp in ["2", "4", "8"] {
        let pass = format!("context-parallel:degree={cp},batch=replica");
        let v = run_json(&with("whatif", &["--pass", &pass]));
        let (before, after) = (
            gb(&v, "baseline_peak_memory_bytes"),
            gb(&v, "peak_memory_bytes"),
        );
        assert!(after < before * 0.8, "cp={cp}: {before} -> {after} GB");
        assert!(after < last, "cp={cp}: {after} GB, not less than {last}");
        last = after;
        assert!(
            v["iteration_ms"].as_f64().unwrap() < v["baseline_iteration_ms"].as_f64().unwrap(),
            "{v}"
        );
    }
}

/// Under an 8 GB budget no option without context parallelism fits (one sample holds 9 GB of
/// activations); the plan splits the sequence and says so in its layout.
#[test]
fn plan_splits_the_sequence_when_one_sample_does_not_fit() {
    let v = run_json(&with(
        "plan",
        &[
            "--framework",
            "megatron",
            "--passes",
            "context-parallel,grad-accumulation",
            "--memory-budget",
            "8GB",
            "--max-rounds",
            "3",
            "--top",
            "3",
        ],
    ));
    let cp = v["layout"]["cp"].as_u64().unwrap_or(0);
    assert!(cp > 1, "{}", v["layout"]);
    assert!(gb(&v, "planned_device_used_bytes") <= 8.0, "{v}");
    let rows = v["top_layouts"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["layout"]["cp"].as_u64().is_some()));
    assert!(rows[0]["fits"].as_bool().unwrap());
}

#[test]
fn an_impossible_degree_exits_3_naming_the_constraint() {
    check_bad_input(
        &with("whatif", &["--pass", "context-parallel:degree=16"]),
        "degree = 16 must divide the 8 workers",
    );
    // 2 x 8 does not divide 16,392.
    let odd: Vec<&str> = with("whatif", &["--pass", "context-parallel:degree=8"])
        .into_iter()
        .map(|a| if a == "16384" { "16392" } else { a })
        .collect();
    check_bad_input(
        &odd,
        "2 x degree = 16 must divide the sequence of 16392 tokens",
    );
    check_bad_input(
        &with("whatif", &["--pass", "context-parallel:batch=all"]),
        "expected global or replica",
    );
    // Eager attention has no kernel to run a ring over.
    check_bad_input(
        &[
            "whatif",
            "--model",
            "gpt",
            "--layers",
            "2",
            "--cluster",
            "8xh200",
            "--attention",
            "eager",
            "--pass",
            "context-parallel:degree=2",
        ],
        "--attention flash",
    );
}
