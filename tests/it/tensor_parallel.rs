//! Tensor parallelism (`tensor-parallel:degree=N[,sequence=1]`) end to end on zoo input: it
//! splits the blocks' memory, composes with sharding over the data-parallel ranks, and a layout
//! that cannot apply exits 3 naming the constraint.

use crate::sharding::{BIG_GPT, bytes};
use crate::support::{check_bad_input, run_json};

// BIG_GPT: the sharding tests' 1.8 B-parameter GPT (16 layers, hidden 3072, 24 heads) at
// batch 1 on 8 V100s, over a V100 under DDP.

fn whatif(passes: &[&str]) -> serde_json::Value {
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
