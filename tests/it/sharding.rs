//! Sharded data parallelism (`shard:stage=1|2|3`) end to end on zoo input: a GPT that does not
//! fit one V100 with DDP fits once its states are sharded, and what cannot shard exits 3 with
//! the reason.

use crate::support::{check_bad_input, run_json};

/// A 1.8 B-parameter GPT (16 layers, hidden 3072) at batch 1: FP32 Adam's 16 bytes per
/// parameter alone are 29 GB per GPU under DDP.
const BIG_GPT: &[&str] = &[
    "whatif",
    "--model",
    "gpt",
    "--hidden",
    "3072",
    "--heads",
    "24",
    "--layers",
    "16",
    "--batch",
    "1",
    "--cluster",
    "8xv100",
];

fn whatif(pass: &str) -> serde_json::Value {
    let mut a = BIG_GPT.to_vec();
    a.extend_from_slice(&["--pass", pass]);
    run_json(&a)
}

fn bytes(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {v}"))
}

#[test]
fn a_model_over_capacity_with_ddp_fits_with_full_sharding() {
    let v = whatif("shard:stage=3");
    let gpu = bytes(&v, "gpu_memory_bytes");
    assert!(bytes(&v, "baseline_device_used_bytes") > gpu, "{v}");
    assert!(bytes(&v, "device_used_bytes") < gpu, "{v}");
    assert_eq!(v["memory_over_capacity"], false);
    // Stage by stage, each shards more.
    let peak = |p: &str| bytes(&whatif(p), "peak_memory_bytes");
    let (s1, s2, s3) = (
        peak("shard:stage=1"),
        peak("shard:stage=2"),
        peak("shard:stage=3"),
    );
    assert!(s1 < bytes(&v, "baseline_peak_memory_bytes"));
    assert!(s2 <= s1 && s3 < s2, "{s1} {s2} {s3}");
    // Keeping the gathered parameters from forward to backward costs memory.
    assert!(peak("shard:stage=3,reshard=0") > s3);
}

#[test]
fn what_cannot_shard_exits_3_with_the_reason() {
    let mut a = BIG_GPT.to_vec();
    a.extend_from_slice(&["--pass", "shard:replicas=3"]);
    check_bad_input(&a, "replicas = 3 must divide the 8 workers");
    let mut b = BIG_GPT.to_vec();
    b.extend_from_slice(&["--pass", "shard:offload=1"]);
    check_bad_input(&b, "offload");
    let mut c = BIG_GPT.to_vec();
    c.extend_from_slice(&["--pass", "shard:stage=4"]);
    check_bad_input(&c, "stage");
}
