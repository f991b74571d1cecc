//! Sharded data parallelism (`shard:stage=1|2|3`) end to end on zoo input: a GPT that does not
//! fit one V100 with DDP fits once its states are sharded, and what cannot shard exits 3 with
//! the reason.

use crate::support::{check_bad_input, run_json};

/// A 1.8 B-parameter GPT (16 layers, hidden 3072) at batch 1: FP32 Adam's 16 bytes per
/// parameter alone are 29 GB per GPU under DDP.
pub(crate) const BIG_GPT: &[&str] = &[
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

pub(crate) fn bytes(v: &serde_json::Value, k: &str) -> u64 {
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
    // An offloaded optimizer steps on the host: AMP after it would re-price what it copies.
    let mut b = BIG_GPT.to_vec();
    b.extend_from_slice(&["--pass", "shard:offload=1", "--pass", "amp"]);
    check_bad_input(&b, "apply amp before shard with offload=1");
    let mut c = BIG_GPT.to_vec();
    c.extend_from_slice(&["--pass", "shard:stage=4"]);
    check_bad_input(&c, "stage");
}

/// `plan --json` of a hidden-4096, 32-head GPT at batch 1 with `shape` (its layers, seq) on
/// `cluster` for `fw`, with `extra` arguments, written to `out`.
fn plan_gpt(
    shape: &[&str],
    cluster: &str,
    fw: &str,
    extra: &[&str],
    out: &std::path::Path,
) -> (i32, String, String) {
    let mut a = vec![
        "plan", "--model", "gpt", "--hidden", "4096", "--heads", "32",
    ];
    a.extend(shape);
    a.extend(["--batch", "1", "--cluster", cluster, "--framework", fw]);
    a.extend(extra);
    a.extend(["--json", "-o", out.to_str().expect("utf-8 path")]);
    crate::support::run(&a)
}

/// A 3.4 B-parameter GPT (16 layers, hidden 4096): FP32 Adam's states alone are 55 GB per GPU
/// under DDP, over a 34 GB V100 with or without AMP, recomputation or accumulation.
fn plan_huge(fw: &str, passes: &str, out: &std::path::Path) -> (i32, String, String) {
    plan_gpt(
        &["--layers", "16"],
        "8xv100",
        fw,
        &["--passes", passes],
        out,
    )
}

/// `plan` on a model that does not fit with DDP: the frameworks that shard write a plan that
/// fits, with its sharding in `config.sharding` and applied by their export; a framework that
/// cannot shard exits 4 saying sharding would be needed.
#[test]
fn plan_shards_a_model_that_does_not_fit_with_ddp() {
    let dir = crate::support::scratch("plan-shard");
    for fw in ["pytorch", "deepspeed", "torchtitan"] {
        let out = dir.join(format!("{fw}.yaml"));
        let (code, stdout, stderr) = plan_huge(fw, "amp,recompute,grad-accumulation,shard", &out);
        assert_eq!(code, 0, "{fw}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
        let gpu = bytes(&v, "gpu_memory_bytes");
        assert!(bytes(&v, "planned_device_used_bytes") <= gpu, "{fw}: {v}");
        let text = std::fs::read_to_string(&out).expect("plan written");
        let plan = trainplan::plan::Plan::from_yaml(&text, "plan.yaml").expect("plan reads");
        let sh = plan.config.sharding.expect("a sharded plan");
        assert_eq!(sh.shard_size * sh.replicas, 8, "{fw}");
        // `--json`'s layout says the same degrees.
        assert_eq!(v["layout"]["dp_shard"], sh.shard_size, "{fw}: {v}");
        assert_eq!(v["layout"]["dp_replicate"], sh.replicas, "{fw}: {v}");
        assert!(
            trainplan::search::framework::shard_supported(
                plan.workload.framework,
                sh.stage,
                sh.replicas,
                sh.reshard
            )
            .is_ok(),
            "{fw}: stage {} reshard {} is not one its export applies",
            sh.stage,
            sh.reshard
        );
        // States of 3.4 B parameters over 8 ranks: weights, gradients and Adam state at most
        // 16 bytes a parameter / 8 (7 GB), so the plan's peak, activations included, is far
        // below DDP's 55 GB.
        assert!(
            bytes(&v, "planned_peak_memory_bytes") < 30_000_000_000,
            "{fw}: {v}"
        );
        for d in &plan.decisions {
            assert!(
                !d.mechanism.is_empty(),
                "{fw}: decision {} has no mechanism",
                d.pass
            );
        }
    }
    let (code, _, stderr) = plan_huge(
        "horovod",
        "amp,recompute,grad-accumulation",
        &dir.join("h.yaml"),
    );
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("shard them"), "{stderr}");
}

/// A 12 B-parameter GPT on two 80 GB A100s: even fully sharded, mixed-precision Adam keeps
/// 16 bytes a parameter / 2 = 96 GB per GPU. With `--framework deepspeed` the memory step
/// offloads the optimizer to the host (ZeRO-Offload) and the plan fits, slower than the
/// baselines that do not; FSDP2 cannot offload the optimizer alone: exit 4, saying so.
#[test]
fn plan_offloads_the_optimizer_where_nothing_else_fits() {
    let dir = crate::support::scratch("plan-offload");
    let plan = |fw: &str, out: &std::path::Path| {
        plan_gpt(&["--layers", "60", "--seq", "1024"], "2xa100", fw, &[], out)
    };
    let out = dir.join("ds.yaml");
    let (code, stdout, stderr) = plan("deepspeed", &out);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    let gpu = bytes(&v, "gpu_memory_bytes");
    assert!(bytes(&v, "planned_device_used_bytes") <= gpu, "{v}");
    assert!(bytes(&v, "baseline_device_used_bytes") > gpu, "{v}");
    let text = std::fs::read_to_string(&out).expect("plan written");
    let p = trainplan::plan::Plan::from_yaml(&text, "plan.yaml").expect("plan reads");
    let sh = p.config.sharding.expect("a sharded plan");
    assert!(sh.offload, "the optimizer offloaded: {sh:?}");
    // The host's Adam over 12 B parameters (1.4 B a second, the node's two ranks sharing
    // it) is most of the step.
    let ms = v["planned_iteration_ms"]
        .as_f64()
        .expect("planned_iteration_ms");
    assert!(ms > 8_000.0, "{v}");
    let human = crate::support::run(&["show", out.to_str().unwrap()]).1;
    assert!(human.contains("does not fit"), "{human}");
    let (code, _, stderr) = plan("pytorch", &dir.join("pt.yaml"));
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("offload the optimizer"), "{stderr}");
}

/// `units=GLOB` chooses what is wrapped: the outermost module the glob matches.
#[test]
fn the_units_knob_chooses_the_wrapped_modules_and_refuses_a_glob_that_names_none() {
    let peak = |p: &str| bytes(&whatif(p), "peak_memory_bytes");
    let auto = peak("shard:stage=3");
    // Each block, spelled out: the same units as auto.
    assert_eq!(peak("shard:stage=3,units=transformer.h.*"), auto);
    // The whole stack of blocks as one unit: all of it gathered at once.
    let whole = peak("shard:stage=3,units=transformer.h");
    assert!(whole > auto, "{whole} vs {auto}");
    // Blocks 10-15 wrapped one by one, 0-9 left to the root unit: in between.
    let some = peak("shard:stage=3,units=transformer.h.1?");
    assert!(some > auto && some < whole, "{auto} {some} {whole}");
    let mut a = BIG_GPT.to_vec();
    a.extend_from_slice(&["--pass", "shard:units=bert.encoder.layer.*"]);
    let e = check_bad_input(&a, "knob units = bert.encoder.layer.*");
    assert!(e.contains("`transformer.h.0`"), "{e}");
}

/// `whatif` on Llama 3 8B, bf16, one H200 server, with `passes`.
fn llama_whatif(passes: &[&str]) -> serde_json::Value {
    let mut a = vec![
        "whatif",
        "--model",
        "llama3-8b",
        "--cluster",
        "8xh200",
        "--precision",
        "bf16",
    ];
    for p in passes {
        a.extend_from_slice(&["--pass", p]);
    }
    run_json(&a)
}

/// Llama 3 8B at 8,192 tokens in bf16 on one H200 server: 203 GB per GPU unsharded, under
/// the GPU's 150 GB once FSDP shards it over the 8 ranks (units: `model.layers.N`).
#[test]
fn llama3_8b_fits_an_h200_server_only_sharded() {
    let v = llama_whatif(&["shard:stage=3"]);
    let gpu = bytes(&v, "gpu_memory_bytes");
    assert!(bytes(&v, "baseline_device_used_bytes") > gpu, "{v}");
    assert!(bytes(&v, "device_used_bytes") < gpu, "{v}");
    let units = llama_whatif(&["shard:stage=3,units=model.layers.*"]);
    assert_eq!(
        bytes(&units, "peak_memory_bytes"),
        bytes(&v, "peak_memory_bytes")
    );
    // With recomputation too: the reduce-scatters free whole gradient blocks and allocate the
    // shards, so the allocator reserves little beyond what is allocated (it once kept every
    // gradient block pinned: 54.7 GB reserved for 31.4 GB allocated).
    let rc = llama_whatif(&["shard:stage=3", "recompute"]);
    let (alloc, reserved) = (
        bytes(&rc, "peak_memory_bytes"),
        bytes(&rc, "reserved_peak_bytes"),
    );
    assert!(
        reserved < alloc + alloc / 4,
        "{alloc} allocated, {reserved} reserved"
    );
}

#[test]
fn grouped_query_attention_options_are_checked() {
    let base = ["replay", "--model", "llama3-8b", "--cluster", "8xh200"];
    let mut a = base.to_vec();
    a.extend_from_slice(&["--kv-heads", "5"]);
    check_bad_input(&a, "heads = 32 is not divisible by kv_heads = 5");
    check_bad_input(
        &[
            "replay",
            "--model",
            "gpt",
            "--cluster",
            "8xh200",
            "--kv-heads",
            "4",
        ],
        "--kv-heads applies to the llama models",
    );
}

/// The recorded shape of an FSDP2 step (issue 23, "Traces"): PyTorch's own `fully_shard` on the
/// zoo's `gpt --hidden 64 --heads 2 --layers 2 --vocab 128`, two gloo processes, the GPU side
/// synthesised around FSDP2's recorded streams and events (`tests/fixtures/kineto/fsdp2/record.py`).
fn fsdp2_fixture(file: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kineto/fsdp2")
        .join(file)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_recorded_fsdp2_step_replays_within_one_percent_on_every_rank() {
    let v = run_json(&["replay", "--trace", &fsdp2_fixture("")]);
    assert_eq!(v["workers"], 2);
    // Three units gathered before their forward, two again before their backward (the root
    // is not resharded), three reduce-scatters: 8 collectives matched across the ranks.
    assert_eq!(v["collectives"], 8);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for r in ranks {
        let e = r["error_pct"].as_f64().unwrap();
        assert!(e.abs() < 1.0, "rank {}: {e} %", r["rank"]);
    }
}

/// Rank 0's host ops moved by up to ±50 µs (a deterministic pattern) change how its FSDP2 hooks
/// nest, so `shard:reshard=0` removes other backward all-gathers on rank 0 than on rank 1: the
/// ranks' collectives no longer match, which is refused (exit 3, naming the ranks), not a panic.
#[test]
fn a_pass_that_leaves_the_ranks_unmatched_is_refused() {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fsdp2_fixture("rank0.json.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let mut t: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut i: i64 = 0;
    for e in t["traceEvents"].as_array_mut().unwrap() {
        if e["cat"] == "cpu_op"
            && let Some(ts) = e["ts"].as_f64()
        {
            e["ts"] = serde_json::json!(ts + ((i * 7919) % 101 - 50) as f64);
            i += 1;
        }
    }
    let r0 = crate::support::write_tmp("jittered_fsdp2_r0.json", t.to_string());
    let msg = check_bad_input(
        &[
            "whatif",
            "--trace",
            r0.to_str().unwrap(),
            &fsdp2_fixture("rank1.json.gz"),
            "--pass",
            "shard:reshard=0",
        ],
        "the passes changed the ranks' collectives differently",
    );
    assert!(msg.contains("rank 0") && msg.contains("rank 1"), "{msg}");
}

#[test]
fn a_recorded_fsdp2_step_says_its_units_resharding_and_collectives() {
    let v = run_json(&["replay", "--trace", &fsdp2_fixture("rank0.json.gz")]);
    let s = &v["trace_facts"]["sharding"];
    assert_eq!(s["framework"], "FSDP2 (fully_shard)");
    assert_eq!(
        s["units"],
        serde_json::json!(["", "transformer.h.0", "transformer.h.1"])
    );
    assert_eq!(
        s["resharded"],
        serde_json::json!(["transformer.h.0", "transformer.h.1"])
    );
    assert_eq!(s["all_gathers"], 5);
    assert_eq!(s["reduce_scatters"], 3);
    // What each unit holds, from GPT-2's shapes (hidden h = 64, vocabulary 128, 1024
    // positions, tied head): the root wte + wpe + ln_f, a block 12h² + 13h.
    let h = 64u64;
    let root = 128 * h + 1024 * h + 2 * h;
    let block = 12 * h * h + 13 * h;
    assert_eq!(block, 49_984);
    // FP32: gathered before each forward (root and both blocks) and again before each block's
    // backward; each unit's gradients reduce-scattered once.
    assert_eq!(s["all_gather_bytes"], 4 * (root + 4 * block));
    assert_eq!(s["reduce_scatter_bytes"], 4 * (root + 2 * block));
}

/// `shard:reshard=0` (and `stage=2`, which FSDP2 spells the same way) on the recorded step:
/// the blocks keep their parameters gathered from the forward; their backward all-gathers and
/// copy-outs go, on one rank and on both ranks replayed together. The defaults are the
/// recorded sharding: nothing to change.
#[test]
fn whatif_on_a_recorded_fsdp2_step_keeps_the_blocks_gathered() {
    let rank0 = fsdp2_fixture("rank0.json.gz");
    let v = run_json(&["whatif", "--trace", &rank0, "--pass", "shard:reshard=0"]);
    let (before, after) = (
        v["baseline_iteration_ms"].as_f64().unwrap(),
        v["iteration_ms"].as_f64().unwrap(),
    );
    assert!(after < before, "{before} → {after} ms");
    let why = v["passes"][0]["why"][0].as_str().unwrap();
    // Both blocks' FP32 parameters: 2 × 49,984 × 4 B.
    assert!(
        why.contains("2 units (transformer.h.0, transformer.h.1)") && why.contains("0.40 MB"),
        "{why}"
    );
    let same = run_json(&["whatif", "--trace", &rank0, "--pass", "shard"]);
    assert_eq!(same["iteration_ms"], same["baseline_iteration_ms"]);
    let both = run_json(&[
        "whatif",
        "--trace",
        &fsdp2_fixture(""),
        "--pass",
        "shard:stage=2",
    ]);
    assert_eq!(both["workers"], 2);
    for r in both["ranks"].as_array().unwrap() {
        let (b, a) = (
            r["baseline_ms"].as_f64().unwrap(),
            r["ms"].as_f64().unwrap(),
        );
        assert!(a < b, "rank {}: {b} → {a} ms", r["rank"]);
    }
}

/// `prefetch=2` on both ranks of the recorded FSDP2 step: each rank issues its all-gathers two
/// units ahead, the ranks still match collective by collective (the gathers keep their order),
/// and the step is not slower (the fixture's all-gather stream is already busy end to end: an
/// earlier issue cannot make it faster, only the copy-ins run sooner). Together with
/// `reshard=0` both changes are made.
#[test]
fn whatif_prefetch_on_a_recorded_fsdp2_step_runs_on_every_rank() {
    let both = run_json(&[
        "whatif",
        "--trace",
        &fsdp2_fixture(""),
        "--pass",
        "shard:prefetch=2",
    ]);
    assert_eq!(both["workers"], 2);
    let why = both["passes"][0]["why"][0].as_str().unwrap();
    assert!(
        why.contains("2 forward and 1 backward all-gathers issued 2 units ahead"),
        "{why}"
    );
    for r in both["ranks"].as_array().unwrap() {
        let (b, a) = (
            r["baseline_ms"].as_f64().unwrap(),
            r["ms"].as_f64().unwrap(),
        );
        assert!(a <= b * 1.001, "rank {}: {b} → {a} ms", r["rank"]);
    }
    let rank0 = fsdp2_fixture("rank0.json.gz");
    let v = run_json(&[
        "whatif",
        "--trace",
        &rank0,
        "--pass",
        "shard:reshard=0,prefetch=2",
    ]);
    let why = v["passes"][0]["why"][0].as_str().unwrap();
    assert!(
        why.contains("reshard=0") && why.contains("2 forward and 0 backward"),
        "{why}"
    );
}

#[test]
fn what_a_recorded_fsdp2_step_cannot_become_exits_3_with_the_reason() {
    let rank0 = fsdp2_fixture("rank0.json.gz");
    for (pass, why) in [
        ("shard:stage=1", "no optimizer-only sharding"),
        (
            "shard:prefetch=0",
            "prefetch=0 cannot apply to a recorded FSDP2 step: FSDP2 always gathers the next unit",
        ),
        (
            "shard:replicas=2",
            "replicas (HSDP) on a recorded FSDP2 step",
        ),
        ("shard:offload=1", "offload on a recorded FSDP2 step"),
        (
            "shard:units=transformer",
            "its units are the ones fully_shard wrapped (root, transformer.h.0, transformer.h.1)",
        ),
    ] {
        check_bad_input(&["whatif", "--trace", &rank0, "--pass", pass], why);
    }
    // Op fusion merges a copy-out with the compute around it: removing it would drop them.
    check_bad_input(
        &[
            "whatif",
            "--trace",
            &rank0,
            "--pass",
            "op-fusion",
            "--pass",
            "shard:reshard=0",
        ],
        "apply shard before op-fusion",
    );
    check_bad_input(
        &[
            "whatif",
            "--trace",
            &rank0,
            "--pass",
            "grad-accumulation:k=2",
            "--pass",
            "shard:reshard=0",
        ],
        "apply shard before grad-accumulation",
    );
}

/// `plan` on the recorded FSDP2 step: the planned step's GPU time is the planned job's (the
/// search keeps its best lean; the report read 0 ms from it), below the recorded one once AMP
/// halves the matrix work, and the job line keeps the recorded sharding.
#[test]
fn plan_on_a_recorded_fsdp2_step_reports_the_planned_gpu_time() {
    let dir = crate::support::scratch("fsdp2_plan");
    let out = dir.join("plan.yaml");
    let v = run_json(&[
        "plan",
        "--trace",
        &fsdp2_fixture("rank0.json.gz"),
        "--passes",
        "amp",
        "-o",
        out.to_str().unwrap(),
    ]);
    let (before, after) = (
        v["bound"]["gpu_busy_ms"].as_f64().unwrap(),
        v["bound"]["gpu_busy_after_ms"].as_f64().unwrap(),
    );
    assert!(
        after > 0.5 * before && after < before,
        "{before} → {after} ms"
    );
}

/// A recorded step that did not shard (a DDP all-reduce, no FSDP2 hooks): `shard` on it is
/// refused, saying why, instead of "one worker has nothing to shard over" for a 2-rank job.
#[test]
fn sharding_a_recorded_ddp_step_exits_3_saying_why() {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kineto/tiny_step.json");
    check_bad_input(
        &[
            "whatif",
            "--trace",
            tiny.to_str().unwrap(),
            "--pass",
            "shard:stage=2",
        ],
        "sharding a recorded step that did not shard (no FSDP2 hooks in the trace) is not modelled",
    );
}

/// The smallest FSDP2 step (`tests/fixtures/kineto/fsdp_tiny.json`, written by hand: one unit
/// `m`, gathered before its forward and again before its backward, one reduce-scatter; also a
/// fuzzing seed): recognised, and `reshard=0` drops the second gather.
#[test]
fn the_smallest_fsdp2_step_is_read_and_unsharded() {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kineto/fsdp_tiny.json");
    let tiny = tiny.to_str().unwrap();
    let v = run_json(&["replay", "--trace", tiny]);
    let s = &v["trace_facts"]["sharding"];
    assert_eq!(s["units"], serde_json::json!(["m"]));
    assert_eq!(s["resharded"], serde_json::json!(["m"]));
    assert_eq!(
        (s["all_gathers"].as_u64(), s["reduce_scatters"].as_u64()),
        (Some(2), Some(1))
    );
    // Out msg nelems 64 × 4 B twice; In msg nelems 64 × 4 B once.
    assert_eq!(
        (
            s["all_gather_bytes"].as_u64(),
            s["reduce_scatter_bytes"].as_u64()
        ),
        (Some(512), Some(256))
    );
    let w = run_json(&["whatif", "--trace", tiny, "--pass", "shard:reshard=0"]);
    assert!(
        w["iteration_ms"].as_f64() < w["baseline_iteration_ms"].as_f64(),
        "{w}"
    );
    let why = w["passes"][0]["why"][0].as_str().unwrap();
    assert!(
        why.contains("1 unit (m) keeps its gathered parameters"),
        "{why}"
    );
}
