//! `trainplan lower-bound` and the ONNX importer from the outside: shapes against ONNX's own
//! shape inference (recorded by `experiments/onnx_fixtures/make_fixtures.py`), ResNet-50 and
//! BERT-base against the zoo and Benanza's layer counts, the CLI's JSON fields and errors, the
//! performance database file, a Kineto trace comparison, and random corruption of model bytes.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::Value;

use crate::support::{check_bad_input, check_error, run, run_json};
use trainplan::cost::config::{Dtype, load_gpu};
use trainplan::lowerbound::{Analysis, PerfDb};
use trainplan::onnx::{self, InferOptions};
use trainplan::zoo::{self, LayerKind, MathClass, ModelOptions};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/onnx")
        .join(name)
}

fn path(name: &str) -> String {
    fixture(name).display().to_string()
}

fn load(name: &str, batch: i64) -> onnx::Graph {
    let opts = InferOptions {
        batch: Some(batch),
        ..Default::default()
    };
    onnx::load(&fixture(name), &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn analyse(name: &str, batch: i64, gpu: &str) -> Analysis {
    let g = load(name, batch);
    Analysis::new(&g, &load_gpu(gpu).unwrap(), Dtype::Fp32, &mut PerfDb::new())
}

#[test]
fn shapes_agree_with_onnx_shape_inference() {
    let text = std::fs::read_to_string(fixture("expected_shapes.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (model, e) in expected.as_object().unwrap() {
        let g = load(&format!("{model}.onnx"), e["batch"].as_i64().unwrap());
        for (value, dims) in e["shapes"].as_object().unwrap() {
            let ours = &g
                .values
                .get(value)
                .unwrap_or_else(|| panic!("{model}: no {value}"))
                .dims;
            let theirs: Vec<Option<i64>> = serde_json::from_value(dims.clone()).unwrap();
            assert_eq!(
                ours.len(),
                theirs.len(),
                "{model}: {value}: {ours:?} vs {theirs:?}"
            );
            for (a, b) in ours.iter().zip(&theirs) {
                // ONNX leaves a dim unknown where only data propagation would find it.
                if let Some(b) = b {
                    assert_eq!(a, b, "{model}: {value}: {ours:?} vs {theirs:?}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 500, "{checked}");
    // The one value ONNX could not size: the Reshape target computed from Shape(tokens).
    let g = load("encoder_block.onnx", 3);
    let last = g.outputs[0].clone();
    assert_eq!(g.values[&last].dims, [3 * 16, 32]);
}

#[test]
fn resnet50_flops_match_the_zoo_and_its_layers_match_benanza() {
    let a = analyse("resnet50.onnx", 1, "v100-32gb");
    // Conv and Gemm FLOPs (bias adds included) against the zoo's torchvision ResNet-50.
    let onnx_matrix: f64 = a
        .layers
        .iter()
        .filter(|l| matches!(l.op_type.as_str(), "Conv" | "Gemm"))
        .map(|l| l.flops())
        .sum();
    let zoo_matrix: f64 = zoo::cnn::resnet50(1)
        .iter()
        .filter(|l| l.math == MathClass::Matrix)
        .map(|l| l.fw_flops)
        .sum();
    assert!(
        (onnx_matrix / zoo_matrix - 1.0).abs() < 1e-9,
        "{onnx_matrix} vs {zoo_matrix}"
    );
    assert!((onnx_matrix / 1e9 - 8.18).abs() < 0.01, "{onnx_matrix}");
    // Benanza counts 175 layers in ResNet-50: 53 conv, 53 BN, 49 ReLU, 16 Add, max pool,
    // global pool, flatten, FC.
    assert_eq!(a.layers.len(), 175);
    let by = a.by_op_type();
    let count = |op: &str| by.get(op).map_or(0, |s| s.layers);
    assert_eq!(
        [
            count("Conv"),
            count("BatchNormalization"),
            count("Relu"),
            count("Add")
        ],
        [53, 53, 49, 16]
    );
    // Unique layers by hand (torchvision v1.5, stride on the 3x3): convs 1 stem + 4 in layer1
    // (1x1 64→64, 3x3, 1x1 64→256 = downsample's shape, 1x1 256→64) + 6 in each later stage
    // (block 0: 1x1 in, strided 3x3, 1x1 out, strided downsample; blocks 1+: 1x1 in, 3x3) = 23;
    // BN and ReLU 12 each (one per distinct activation shape), 4 Adds, 4 singletons = 55.
    assert_eq!(a.unique_layers(), 55);
    // No parallel branch is heavier than a downsample conv: the bounds stay close.
    assert!(a.bounds.parallel_ms < a.bounds.sequential_ms);
    assert!(a.bounds.parallel_ms > 0.9 * a.bounds.sequential_ms);
}

#[test]
fn bert_base_matches_the_zoo() {
    let a = analyse("bert_base.onnx", 1, "v100-32gb");
    // 12 layers × 30 nodes + 6 embedding nodes + 3 pooler nodes.
    assert_eq!(a.layers.len(), 369);
    // By hand, per encoder layer: 3 MatMul shapes, bias Add 768 and 3072, residual Add, LN,
    // Transpose ×3 kinds, QKᵀ, PV, Div, mask Add, Softmax, Gelu, Reshape ×2 kinds = 18; the
    // embeddings add 3 Gathers (their Adds and LN have encoder shapes at batch 1); the pooler
    // Gather, Gemm, Tanh.
    assert_eq!(a.unique_layers(), 24);
    let onnx_mm: f64 = a
        .layers
        .iter()
        .filter(|l| l.op_type == "MatMul")
        .map(|l| l.flops())
        .sum();
    let m = zoo::model(
        "bert-base",
        &ModelOptions {
            batch: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let zoo_mm: f64 = m
        .layers
        .iter()
        .filter(|l| l.name.contains(".encoder.") && l.math == MathClass::Matrix)
        .map(|l| {
            // The zoo's linear layers count their bias add (one FLOP per output) in the GEMM.
            l.fw_flops
                - if l.kind == LayerKind::Gemm {
                    l.out_elems as f64
                } else {
                    0.0
                }
        })
        .sum();
    assert!(
        (onnx_mm / zoo_mm - 1.0).abs() < 1e-9,
        "{onnx_mm} vs {zoo_mm}"
    );
}

#[test]
fn bounds_are_ordered_for_every_fixture() {
    for (name, batch) in [
        ("small_cnn.onnx", 4),
        ("encoder_block.onnx", 4),
        ("resnet50.onnx", 8),
        ("bert_base.onnx", 2),
    ] {
        for gpu in ["v100-32gb", "h200"] {
            let a = analyse(name, batch, gpu);
            let b = &a.bounds;
            let ctx = format!("{name} on {gpu}: {b:?}");
            assert!(b.parallel_ms <= b.sequential_ms + 1e-12, "{ctx}");
            assert!(b.fused_sequential_ms < b.sequential_ms, "{ctx}");
            assert!(
                b.fused_parallel_ms <= b.fused_sequential_ms + 1e-12,
                "{ctx}"
            );
            assert!(b.fused_parallel_ms <= b.parallel_ms + 1e-12, "{ctx}");
            let (_, t) = a
                .tensor_core
                .as_ref()
                .expect("both GPUs have fp16 tensor cores");
            assert!(t.sequential_ms < b.sequential_ms, "{ctx}");
            // A faster GPU never has a higher bound.
            if gpu == "h200" {
                let v = analyse(name, batch, "v100-32gb");
                assert!(b.sequential_ms < v.bounds.sequential_ms, "{ctx}");
            }
        }
    }
}

#[test]
fn fusion_groups_of_the_fixtures() {
    let patterns = |name: &str| -> Vec<(String, usize)> {
        analyse(name, 2, "v100-32gb")
            .fusion_rows()
            .into_iter()
            .map(|r| (r.pattern, r.groups))
            .collect()
    };
    // small_cnn: conv→BN→ReLU and conv(bias)→ReLU fuse fully; the 1x1 conv with bias feeds the
    // Add; the grouped conv has no bias and is followed by a pool.
    assert_eq!(
        patterns("small_cnn.onnx"),
        [("conv+bias".into(), 1), ("conv+bias+act".into(), 2)]
    );
    // encoder_block: one attention; Q, K, V, output and FF2 projections with their bias; FF1
    // with bias and GELU.
    assert_eq!(
        patterns("encoder_block.onnx"),
        [
            ("attention".into(), 1),
            ("gemm+bias".into(), 5),
            ("gemm+bias+act".into(), 1)
        ]
    );
}

#[test]
fn json_carries_the_design_fields() {
    let v = run_json(&[
        "lower-bound",
        &path("resnet50.onnx"),
        "--gpu",
        "v100-32gb",
        "--batch",
        "2",
    ]);
    for k in [
        "sequential_ms",
        "parallel_ms",
        "fused_sequential_ms",
        "tensor_core_ms",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    assert_eq!(v["layers"], 175);
    assert_eq!(v["unique_layers"], 55);
    assert_eq!(v["batch"], 2);
    assert_eq!(v["tensor_core_dtype"], "fp16");
    assert!(v["measured_ms"].is_null() && v["ratio"].is_null());
    assert_eq!(v["answers"].as_array().unwrap().len(), 6);
    let by_op = v["by_op_type"].as_object().unwrap();
    let total: f64 = by_op.values().map(|s| s["ms"].as_f64().unwrap()).sum();
    assert!((total - v["sequential_ms"].as_f64().unwrap()).abs() < 1e-3);
    // With a measurement: the Benanza ratio is bound / measured.
    let m = run_json(&[
        "lower-bound",
        &path("resnet50.onnx"),
        "--batch",
        "2",
        "--measured-ms",
        "10",
    ]);
    assert_eq!(m["measured_ms"], 10.0);
    let r = m["ratio"].as_f64().unwrap();
    assert!(
        (r - m["sequential_ms"].as_f64().unwrap() / 10.0).abs() < 1e-3,
        "{m}"
    );
    assert!(
        m["answers"][0]["answer"]
            .as_str()
            .unwrap()
            .contains("measured 10.000 ms")
    );
}

#[test]
fn human_report_lists_the_top_layers_and_the_answers() {
    let (code, out, err) = run(&[
        "lower-bound",
        &path("bert_base.onnx"),
        "--batch",
        "1",
        "--gpu",
        "h200",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("369 layers, 24 unique"), "{out}");
    assert!(out.contains("MatMul"), "{out}");
    for q in ["Q1 ", "Q2 ", "Q3 ", "Q4 ", "Q5 ", "Q6 "] {
        assert!(out.contains(q), "{q}: {out}");
    }
}

#[test]
fn bad_input_names_the_file_and_the_place() {
    let m = path("unsupported_op.onnx");
    check_bad_input(
        &["lower-bound", &m],
        "unsupported_op.onnx: node #1 `lstm_4` (LSTM): unsupported operator type `LSTM`",
    );
    check_bad_input(
        &["lower-bound", &path("small_cnn.onnx")],
        "graph input `image` has a dynamic batch dimension (`batch`); give the batch size with --batch N",
    );
    let e = check_bad_input(
        &[
            "lower-bound",
            &path("small_cnn.onnx"),
            "--batch",
            "1",
            "--gpu",
            "v200",
        ],
        "unknown GPU `v200`; built-in ones: ",
    );
    assert!(e.contains("v100-32gb") && e.contains("h200"), "{e}");
    // Issue 14: one code per kind of mistake — `--batch 0` is bad input here as in `replay`.
    check_bad_input(
        &["lower-bound", &path("small_cnn.onnx"), "--batch", "0"],
        "batch must be at least 1, got 0",
    );
    check_error(
        &[
            "lower-bound",
            &path("small_cnn.onnx"),
            "--batch",
            "1",
            "--dim",
            "x",
        ],
        2,
        "--dim x: expected NAME=N",
    );
    check_bad_input(
        &["lower-bound", "/nonexistent/m.onnx"],
        "/nonexistent/m.onnx: failed to read",
    );

    let dir = tempdir("bad-input");
    // Truncated: the graph field claims more bytes than the file has.
    let bytes = std::fs::read(fixture("small_cnn.onnx")).unwrap();
    let cut = dir.join("cut.onnx");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = check_bad_input(
        &["lower-bound", cut.to_str().unwrap(), "--batch", "1"],
        "not a valid ONNX protobuf (at byte ",
    );
    assert!(e.contains("remain (truncated file?)"), "{e}");
    let junk = dir.join("junk.onnx");
    std::fs::write(&junk, b"this is not a model\xff\xff\xff").unwrap();
    check_bad_input(
        &["lower-bound", junk.to_str().unwrap(), "--batch", "1"],
        "junk.onnx: not a valid ONNX protobuf",
    );

    // A corrupt or foreign performance database.
    let db = dir.join("db.json");
    std::fs::write(&db, "{\"version\": 1, \"entries\": [{]}").unwrap();
    let d = db.to_str().unwrap();
    check_bad_input(
        &[
            "lower-bound",
            &path("small_cnn.onnx"),
            "--batch",
            "1",
            "--db",
            d,
        ],
        "db.json:1:",
    );
    std::fs::write(&db, "{\"version\": 7, \"entries\": []}").unwrap();
    check_bad_input(
        &[
            "lower-bound",
            &path("small_cnn.onnx"),
            "--batch",
            "1",
            "--db",
            d,
        ],
        "db.json: version 7 is not supported (this trainplan reads version 1)",
    );
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trainplan-lb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn database_is_written_deterministically_and_measured_entries_win() {
    let dir = tempdir("db");
    let db = dir.join("perf.json");
    let d = db.to_str().unwrap();
    let args = [
        "lower-bound",
        &path("small_cnn.onnx"),
        "--batch",
        "2",
        "--db",
        d,
    ];
    let first = run_json(&args);
    let text = std::fs::read_to_string(&db).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(file["version"], 1);
    let entries = file["entries"].as_array().unwrap();
    // Every unique layer with kernels and every fused group, in fp32 and fp16: 15 unique layers
    // of which Flatten launches nothing, 3 groups; the two stride-1 3x3 convs and their two
    // groups also have a Winograd entry.
    assert_eq!(entries.len(), 2 * (14 + 3 + 4), "{text}");
    assert!(
        entries
            .iter()
            .all(|e| e["source"] == "analytic" && e["gpu"] == "v100-32gb")
    );
    run_json(&args);
    assert_eq!(
        std::fs::read_to_string(&db).unwrap(),
        text,
        "not deterministic"
    );
    // Mark the stem conv's fp32 entry as measured at 1 ms: the bound follows it.
    let mut file = file;
    let stem = file["entries"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| {
            let l = e["layer"].as_str().unwrap();
            e["dtype"] == "fp32" && l.starts_with("Conv[") && l.contains("](2x3x32x32,")
        })
        .expect("the stem conv");
    let mut measured = file["entries"][stem].clone();
    let analytic_ms = file["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["dtype"] == "fp32" && e["layer"] == measured["layer"])
        .map(|e| e["ms"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    measured["implementation"] = "cudnn".into();
    measured["source"] = "measured".into();
    measured["ms"] = 1.0.into();
    file["entries"].as_array_mut().unwrap().push(measured);
    std::fs::write(&db, serde_json::to_string(&file).unwrap()).unwrap();
    let second = run_json(&args);
    let delta =
        second["sequential_ms"].as_f64().unwrap() - first["sequential_ms"].as_f64().unwrap();
    assert!(
        (delta - (1.0 - analytic_ms)).abs() < 1e-3,
        "{delta} vs {analytic_ms}"
    );
    assert_eq!(second["measured_layers"], 1);
}

#[test]
fn calibrate_without_the_gpu_feature_says_how_to_get_it() {
    if cfg!(feature = "gpu") {
        // With the feature and no GPU, it must still exit 3 with a clear message.
        let (code, _, err) = run(&["calibrate"]);
        assert!(
            code == 0 || (code == 3 && err.contains("no GPU found")),
            "{code} {err}"
        );
        return;
    }
    check_bad_input(&["calibrate"], "built without the `gpu` feature");
    // A database path of its own that does not exist yet (a fixed /tmp/x.json failed whenever
    // another program had left a file there: it was read as a database first).
    let db = crate::support::scratch("no-gpu").join("db.json");
    check_bad_input(
        &[
            "lower-bound",
            &path("small_cnn.onnx"),
            "--batch",
            "1",
            "--db",
            &db.display().to_string(),
            "--measure",
        ],
        "built without the `gpu` feature",
    );
}

#[test]
fn a_trace_of_the_same_model_answers_q1_q2_q4_q6() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces/pytorch-kineto/resnet50_v100_1gpu_ns_timestamps.json.gz");
    if !trace.exists() {
        crate::skip_note!("skipping: ../shared/traces is absent (the real-trace tests need it)");
        return;
    }
    let v = run_json(&[
        "lower-bound",
        &path("resnet50.onnx"),
        "--batch",
        "32",
        "--trace",
        trace.to_str().unwrap(),
        "--step",
        "104",
    ]);
    let t = &v["trace"];
    assert_eq!(t["step"], "ProfilerStep#104");
    // The README of the traces gives 95.55 ms for this step.
    assert!((t["step_ms"].as_f64().unwrap() - 95.55).abs() < 0.01, "{t}");
    assert_eq!(v["measured_ms"], t["step_ms"]);
    let (busy, sum) = (
        t["gpu_busy_ms"].as_f64().unwrap(),
        t["gpu_time_ms"].as_f64().unwrap(),
    );
    assert!(
        busy > 0.0 && busy <= sum + 1e-9 && busy <= t["step_ms"].as_f64().unwrap(),
        "{t}"
    );
    assert!(t["kernels"].as_u64().unwrap() > 100, "{t}");
    assert!(
        t["tensor_core_kernel_ms"].as_f64().unwrap() <= t["matrix_kernel_ms"].as_f64().unwrap()
    );
    assert!(
        v["answers"][3]["answer"]
            .as_str()
            .unwrap()
            .contains("ProfilerStep#104")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Corrupted model bytes (flipped, cut or spliced) never panic the importer: each gives a
    /// graph or an error.
    #[test]
    fn corrupted_models_never_panic(
        which in 0usize..3,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let name = ["small_cnn.onnx", "encoder_block.onnx", "resnet50.onnx"][which];
        let mut bytes = std::fs::read(fixture(name)).unwrap();
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        let opts = InferOptions { batch: Some(2), ..Default::default() };
        if let Ok(g) = onnx::import(&bytes, name, &opts) {
            // What imports also analyses.
            let a = Analysis::new(&g, &load_gpu("h200").unwrap(), Dtype::Fp32, &mut PerfDb::new());
            prop_assert!(a.bounds.sequential_ms.is_finite());
        }
    }
}

/// The README's `lower-bound` example is this binary's output (lines cut with `…` match up to
/// the cut; `Q… …` lines match on their question number).
#[test]
fn readme_example_is_current() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let cmd = "$ trainplan lower-bound tests/fixtures/onnx/resnet50.onnx --gpu v100-32gb --batch 32 --measured-ms 34.78 --top 3";
    let start = readme.find(cmd).expect("the README shows the example") + cmd.len();
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let (code, out, err) = run(&[
        "lower-bound",
        &path("resnet50.onnx"),
        "--gpu",
        "v100-32gb",
        "--batch",
        "32",
        "--measured-ms",
        "34.78",
        "--top",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
    let out: Vec<&str> = out.lines().map(|l| l.trim_end()).collect();
    let mut checked = 0;
    for line in block.lines().filter(|l| !l.is_empty()) {
        let ok = match line.split_once('…') {
            Some((pre, _)) if pre.len() <= 4 && pre.starts_with('Q') => {
                out.iter().any(|o| o.starts_with(pre.trim_end()))
            }
            Some((pre, _)) => out.iter().any(|o| o.trim_start().starts_with(pre.trim())),
            None => {
                let l = line.strip_prefix("tests/fixtures/onnx/").unwrap_or(line);
                out.iter().any(|o| o.ends_with(l))
            }
        };
        assert!(
            ok,
            "README line not in the output: {line:?}\n{}",
            out.join("\n")
        );
        checked += 1;
    }
    assert!(checked > 15, "{checked}");
}
