//! Tensor parallelism (`tensor-parallel:degree=N[,sequence=1]`) end to end on zoo input: it
//! splits the blocks' memory, composes with sharding over the data-parallel ranks, and a layout
//! that cannot apply exits 3 naming the constraint.

use crate::sharding::{BIG_GPT, bytes};
use crate::support::{check_bad_input, run_json};

// BIG_GPT: the sharding tests' 1.8 B-parameter GPT (16 layers, hidden 3072, 24 heads) at
// batch 1 on 8 V100s, over a V100 under DDP.

pub(crate) fn whatif(passes: &[&str]) -> serde_json::Value {
    let mut a = BIG_GPT.to_vec();
    for p in passes {
        a.extend_from_slice(&["--pass", p]);
    }
    run_json(&a)
}

#[test]
fn tensor_parallelism_splits_memory_and_composes_with_sharding() {
    let tp = whatif(&["tensor-parallel:degree=8,sequence=1"]);
    let gpu = bytes(&tp, "gpu_memory_bytes");
    assert!(bytes(&tp, "baseline_device_used_bytes") > gpu, "{tp}");
    // Weights, gradients and Adam state of the blocks are 1/8 per rank, and so are the
    // activations with sequence parallelism: the job fits.
    assert!(bytes(&tp, "device_used_bytes") < gpu, "{tp}");
    assert!(
        bytes(&tp, "peak_memory_bytes") * 3 < bytes(&tp, "baseline_peak_memory_bytes"),
        "{tp}"
    );
    // Sharding after it shards over the data-parallel ranks (one per group here: nothing to
    // shard over), and over four of them with degree 2.
    let mut a = BIG_GPT.to_vec();
    a.extend_from_slice(&[
        "--pass",
        "tensor-parallel:degree=8",
        "--pass",
        "shard:stage=3",
    ]);
    check_bad_input(&a, "one data-parallel rank: nothing to shard over");
    let tp2 = whatif(&["tensor-parallel:degree=2"]);
    let both = whatif(&["tensor-parallel:degree=2", "shard:stage=3"]);
    assert!(
        bytes(&both, "peak_memory_bytes") < bytes(&tp2, "peak_memory_bytes"),
        "{both}"
    );
}

#[test]
fn an_impossible_layout_exits_3_naming_the_constraint() {
    let mut a = BIG_GPT.to_vec();
    a.extend_from_slice(&["--pass", "tensor-parallel:degree=16"]);
    check_bad_input(&a, "degree = 16 must divide the 8 workers");
    check_bad_input(
        &[
            "whatif",
            "--model",
            "gpt",
            "--cluster",
            "8xh200",
            "--pass",
            "tensor-parallel:degree=8",
        ],
        "degree = 8 must divide the 12 attention heads",
    );
    check_bad_input(
        &[
            "whatif",
            "--model",
            "resnet50",
            "--cluster",
            "8xh200",
            "--pass",
            "tensor-parallel:degree=2",
        ],
        "tensor parallelism",
    );
    let mut b = BIG_GPT.to_vec();
    b.extend_from_slice(&[
        "--pass",
        "shard:stage=3",
        "--pass",
        "tensor-parallel:degree=2",
    ]);
    check_bad_input(&b, "apply tensor-parallel before sharding");
}

/// A 4-layer GPT at sequence 16,384 on 8 H200s: one sample's activations are more than a GPU
/// holds, so without recomputation only a tensor-parallel layout (with sequence parallelism,
/// and for torchtitan FSDP2 over the data-parallel ranks: its DDP takes a 1-D mesh only)
/// fits.
const LONG_GPT: &[&str] = &[
    "plan",
    "--model",
    "gpt",
    "--hidden",
    "4096",
    "--heads",
    "32",
    "--layers",
    "4",
    "--seq",
    "16384",
    "--vocab",
    "32000",
    "--batch",
    "1",
    "--cluster",
    "8xh200",
    "--max-rounds",
    "2",
    "--json",
];

/// `LONG_GPT` planned for `framework` with the memory moves `passes` (all when None).
fn long_gpt_plan(
    framework: &str,
    passes: Option<&str>,
    out: &std::path::Path,
) -> (i32, String, String) {
    let mut a = LONG_GPT.to_vec();
    let o = out.to_str().unwrap();
    a.extend_from_slice(&["--framework", framework, "--top", "5", "-o", o]);
    if let Some(p) = passes {
        a.extend_from_slice(&["--passes", p]);
    }
    crate::support::run(&a)
}

/// No recomputation: a layout must split the activations.
const NO_RECOMPUTE: Option<&str> = Some("amp,shard,tensor-parallel,grad-accumulation");

#[test]
fn the_layout_search_picks_tensor_parallelism_where_nothing_else_fits() {
    let dir = crate::support::scratch("tp-layout");
    let (code, out, err) = long_gpt_plan("torchtitan", NO_RECOMPUTE, &dir.join("plan.yaml"));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let gpu = bytes(&v, "gpu_memory_bytes");
    assert!(bytes(&v, "baseline_device_used_bytes") > gpu, "{v}");
    assert!(bytes(&v, "planned_device_used_bytes") <= gpu, "{v}");
    let decisions = v["decisions"].as_array().unwrap();
    let knob = |pass: &str, k: &str| -> Option<String> {
        decisions
            .iter()
            .find(|d| d["pass"] == pass)
            .and_then(|d| d["knobs"][k].as_str().map(str::to_string))
    };
    let tp: u64 = knob("tensor-parallel", "degree").unwrap().parse().unwrap();
    assert!(tp >= 2, "{v}");
    assert_eq!(knob("tensor-parallel", "sequence").as_deref(), Some("1"));
    assert_eq!(knob("shard", "stage").as_deref(), Some("3"), "{v}");
    // DESIGN.md's layout: the degrees multiply to the GPUs.
    let l = &v["layout"];
    assert_eq!(l["tp"], tp, "{v}");
    let ranks = l["tp"].as_u64().unwrap()
        * l["dp_shard"].as_u64().unwrap()
        * l["dp_replicate"].as_u64().unwrap();
    assert_eq!(ranks, 8, "{v}");
    assert!(v["mfu"].as_f64().unwrap() > 0.0, "{v}");
    // The table: at most K rows, those that fit first and fastest first, the plan's layout
    // the first of them.
    let top = v["top_layouts"].as_array().unwrap();
    assert!(!top.is_empty() && top.len() <= 5, "{v}");
    assert_eq!(top[0]["layout"], v["layout"], "{v}");
    // A group of tp ranks trains tp samples (batch 1 per GPU): the micro-batch is whole.
    let k = knob("grad-accumulation", "k").map_or(1, |k| k.parse::<u64>().unwrap());
    assert_eq!(l["micro_batch"].as_u64().unwrap() * k, tp, "{v}");
    assert!(top[0]["fits"].as_bool().unwrap());
    let fitting: Vec<f64> = top
        .iter()
        .take_while(|r| r["fits"] == true)
        .map(|r| r["iteration_ms"].as_f64().unwrap())
        .collect();
    assert!(fitting.windows(2).all(|w| w[0] <= w[1]), "{v}");
    assert!(
        top.iter()
            .all(|r| (r["fits"] == true) == (bytes(r, "device_used_bytes") <= gpu)),
        "{v}"
    );
    // Deterministic: the same input gives the same table.
    let (_, again, _) = long_gpt_plan("torchtitan", NO_RECOMPUTE, &dir.join("again.yaml"));
    let w: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(w["top_layouts"], v["top_layouts"]);
    // The export sets the degree; the data-parallel ranks are FSDP2's.
    let toml_dir = dir.join("titan");
    let (code, _, err) = crate::support::run(&[
        "export",
        dir.join("plan.yaml").to_str().unwrap(),
        "--to",
        "torchtitan",
        "-o",
        toml_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(toml_dir.join("torchtitan.toml")).unwrap();
    assert!(
        text.contains(&format!("tensor_parallel_degree = {tp}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("data_parallel_shard_degree = {}\n", 8 / tp)),
        "{text}"
    );
    // PyTorch's export lays out Llama-style models only, not this GPT-2: its plan never has
    // tensor parallelism (recomputation fits there instead), and without recomputation nothing
    // fits.
    let (code, _, err) = long_gpt_plan("pytorch", NO_RECOMPUTE, &dir.join("pt0.yaml"));
    assert_eq!(code, 4, "{err}");
    let (code, out, err) = long_gpt_plan("pytorch", None, &dir.join("pt.yaml"));
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        !p["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["pass"] == "tensor-parallel"),
        "{p}"
    );
    assert_eq!(p["layout"]["tp"], 1, "{p}");
    // Without accumulation a group of t ranks holds t samples' activations: nothing fits, and
    // `--top` shows what came closest before the error (exit 4).
    let mut a = LONG_GPT.to_vec();
    let tight = dir.join("over.yaml");
    a.extend_from_slice(&[
        "--framework",
        "torchtitan",
        "--passes",
        "amp,shard,tensor-parallel",
        "--memory-budget",
        "20GB",
        "--top",
        "3",
        "-o",
        tight.to_str().unwrap(),
    ]);
    let (code, _, err) = crate::support::run(&a);
    assert_eq!(code, 4, "{err}");
    let table = err.find("none fits (the 3 with the least device memory first)");
    let error = err.find("error: no plan fits the memory budget of 20.00 GB");
    assert!(table.is_some() && error.is_some() && table < error, "{err}");
    assert_eq!(err.matches(" over  ").count(), 3, "{err}");
    assert!(err.contains("tensor-parallel:degree="), "{err}");
    assert!(!tight.exists(), "no plan is written");
    let _ = std::fs::remove_dir_all(&dir);
}
