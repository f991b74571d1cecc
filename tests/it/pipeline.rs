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

/// `--framework pytorch` pipelines a Llama-style model that does not fit (beside FSDP2 without
/// resharding), and the export lays it out as planned (`apply_parallel`'s constants); a GPT-2,
/// whose projections DTensor cannot split, gets no pipeline from it.
#[test]
fn pytorch_plans_and_exports_a_pipeline_for_a_llama_only() {
    let dir = crate::support::scratch("pt-pipeline");
    let plan = dir.join("plan.yaml");
    let common = "--kv-heads 4 --ffn 4096 --seq 2048 --vocab 32000 --batch 2 --layers 8 \
        --cluster 8xh200 --framework pytorch --precision bf16 --max-rounds 5 \
        --passes pipeline,shard --memory-budget 3GB";
    let mut args: Vec<&str> = "plan --model llama --hidden 1024 --heads 16"
        .split(' ')
        .chain(common.split_whitespace())
        .collect();
    args.extend(["-o", plan.to_str().unwrap()]);
    let (code, _, err) = crate::support::run(&args);
    assert_eq!(code, 0, "{err}");
    let p =
        trainplan::plan::Plan::from_yaml(&std::fs::read_to_string(&plan).unwrap(), "p").unwrap();
    let pp = p.config.pipeline.as_ref().expect("a pipeline");
    let sh = p.config.sharding.as_ref().expect("FSDP2 beside it");
    assert_eq!((sh.stage, sh.reshard), (3, false));
    let out = dir.join("out");
    let v = run_json(&[
        "export",
        plan.to_str().unwrap(),
        "--to",
        "pytorch",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        v["notes"]
            .to_string()
            .contains("apply_parallel(model, loss_fn)"),
        "{v}"
    );
    let py = std::fs::read_to_string(out.join("trainplan_patch.py")).unwrap();
    assert!(
        py.contains(&format!("PIPELINE_STAGES = {}\n", pp.stages)),
        "{py}"
    );
    assert!(py.contains(&format!("PIPELINE_MICROBATCHES = {}\n", pp.microbatches)));
    assert!(py.contains(&format!("DATA_PARALLEL = {}\n", 8 / pp.stages)));
    let parts = py
        .split("PIPELINE_PARTS = ")
        .nth(1)
        .and_then(|t| t.split("\n\n").next())
        .unwrap();
    assert_eq!(
        parts.matches("\"model.layers.").count(),
        8,
        "each block in one part: {parts}"
    );
    assert_eq!(parts.matches("\"lm_head\"").count(), 1, "{parts}");
    assert_eq!(
        parts.matches("], [").count() as u32 + 1,
        pp.stages * pp.chunks_per_rank,
        "{parts}"
    );
    // The same memory budget on a GPT-2 of the same shape: no pipeline from PyTorch.
    let gpt = dir.join("gpt.yaml");
    let mut args: Vec<&str> = "plan --model gpt --hidden 1024 --heads 16 --seq 1024 --vocab 32000 \
        --batch 2 --layers 8 --cluster 8xh200 --framework pytorch --precision bf16 --max-rounds 5 \
        --passes pipeline,shard --memory-budget 3GB"
        .split_whitespace()
        .collect();
    args.extend(["-o", gpt.to_str().unwrap(), "--json"]);
    let (code, out, err) = crate::support::run(&args);
    if code == 0 {
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["layout"]["pp"], 1, "{v}");
    } else {
        assert_eq!(code, 4, "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
