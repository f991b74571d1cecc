//! Pipeline parallelism (`pipeline:stages=N,microbatches=M[,schedule=gpipe]`) end to end on zoo
//! input: each rank holds its stage's weights, the schedule decides the activations in flight,
//! and a pipeline that cannot apply exits 3 naming the constraint.

use crate::sharding::{BIG_GPT, bytes};
use crate::support::{check_bad_input, run_json};
use crate::tensor_parallel::whatif;

// BIG_GPT: the sharding tests' 1.8 B-parameter GPT (16 layers, hidden 3072, 24 heads) at
// batch 1 on 8 V100s, over a V100 under DDP.

#[test]
fn a_pipeline_holds_a_stage_per_rank_and_its_schedules_activations() {
    let one_f_one_b = whatif(&["pipeline:stages=4,microbatches=4"]);
    let gpu = bytes(&one_f_one_b, "gpu_memory_bytes");
    assert!(
        bytes(&one_f_one_b, "baseline_device_used_bytes") > gpu,
        "{one_f_one_b}"
    );
    // A quarter of the blocks' weights, gradients and Adam state per rank: the job fits.
    assert!(
        bytes(&one_f_one_b, "device_used_bytes") < gpu,
        "{one_f_one_b}"
    );
    assert!(
        bytes(&one_f_one_b, "peak_memory_bytes") * 2
            < bytes(&one_f_one_b, "baseline_peak_memory_bytes"),
        "{one_f_one_b}"
    );
    // At batch 2 per GPU a replica of four stages trains 8 samples: GPipe keeps all eight
    // micro-batches' activations on the first stage, 1F1B four.
    let batch2 = |pass: &str| {
        let mut a: Vec<&str> = BIG_GPT.to_vec();
        let at = a.iter().position(|x| *x == "--batch").unwrap() + 1;
        a[at] = "2";
        a.extend_from_slice(&["--pass", pass]);
        run_json(&a)
    };
    let gpipe = batch2("pipeline:stages=4,microbatches=8,schedule=gpipe");
    let fewer = batch2("pipeline:stages=4,microbatches=8");
    assert!(
        bytes(&gpipe, "peak_memory_bytes") > bytes(&fewer, "peak_memory_bytes"),
        "gpipe {gpipe}\n1f1b {fewer}"
    );
}

#[test]
fn an_impossible_pipeline_exits_3_naming_the_constraint() {
    let bad = |pass: &[&str], why: &str| {
        let mut a = BIG_GPT.to_vec();
        for p in pass {
            a.extend_from_slice(&["--pass", p]);
        }
        check_bad_input(&a, why);
    };
    bad(
        &["pipeline:stages=3"],
        "stages = 3 × tensor-parallel degree 1 must divide the 8 workers",
    );
    bad(&["pipeline:stages=16"], "must divide the 8 workers");
    bad(
        &["pipeline:stages=2,microbatches=3"],
        "must divide the replica's batch of 2 samples",
    );
    bad(
        &["pipeline:stages=2,microbatches=2,virtual=2"],
        "virtual = 2 model chunks per rank need schedule=interleaved",
    );
    bad(
        &["pipeline:stages=4,microbatches=2,schedule=interleaved"],
        "needs microbatches = 2 to be a multiple of stages = 4",
    );
    bad(
        &["pipeline:stages=4,microbatches=4,schedule=interleaved,virtual=8"],
        "must divide the model's 16 blocks",
    );
    bad(
        &["pipeline:schedule=zigzag"],
        "expected 1f1b, gpipe or interleaved",
    );
    bad(
        &["pipeline:stages=2,microbatches=2", "amp"],
        "apply amp before pipeline",
    );
    bad(
        &["shard:stage=3", "pipeline:stages=2,microbatches=2"],
        "gathering again for every backward (reshard=1) is not modelled: plan shard:stage=3,reshard=0",
    );
    bad(
        &["shard:stage=2", "pipeline:stages=2,microbatches=2"],
        "sharding stage 2 (reduce-scatter of",
    );
    check_bad_input(
        &[
            "whatif",
            "--model",
            "gpt",
            "--cluster",
            "8xh200",
            "--pass",
            "pipeline:stages=8",
        ],
        "stages = 8 must divide the model's 12 blocks",
    );
    check_bad_input(
        &[
            "whatif",
            "--model",
            "resnet50",
            "--cluster",
            "8xh200",
            "--pass",
            "pipeline",
        ],
        "transformer block",
    );
}
