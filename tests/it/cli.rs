//! End-to-end tests of the `trainplan` binary: `--json` output carries the fields DESIGN.md
//! fixes, human output and listings name what they should, bad input exits 3 with one line on
//! stderr naming the problem, usage errors exit 2, the timeline is a Chrome trace written
//! atomically, a closed stdout exits 0, and runs are deterministic.
//!
//! Cases are kept small (ResNet-50 at batch 1–2 on one H200 server, BERT-base on the dPRO
//! testbed) so that the debug binary `cargo test` builds runs them in well under a second each.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::support::{check_bad_input, check_error, run, run_json, scratch, trainplan, write_tmp};

/// A directory under the system temp dir, unique to this process and test, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        TempDir(scratch(test))
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn write(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
    /// Names of the entries in the directory, sorted.
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SMALL: &[&str] = &[
    "replay",
    "--model",
    "resnet50",
    "--batch",
    "2",
    "--cluster",
    "8xh200",
];

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

#[test]
fn replay_json_has_the_design_fields() {
    let v = run_json(&[
        "replay",
        "--model",
        "bert-base",
        "--cluster",
        "dpro-16xv100-rdma",
    ]);
    for field in [
        "iteration_ms",
        "measured_iteration_ms",
        "error_pct",
        "ops",
        "devices",
        "workers",
        "critical_path_ms",
        "peak_memory_bytes",
        "replay_wall_ms",
    ] {
        assert!(v.get(field).is_some(), "missing {field}: {v}");
    }
    assert!(v["measured_iteration_ms"].is_null(), "{v}");
    assert!(v["error_pct"].is_null(), "{v}");
    assert_eq!(v["workers"], 16);
    assert_eq!(v["symmetric"], false);
    assert_eq!(v["model"], "bert-base");
    assert_eq!(v["cluster"], "dpro-16xv100-rdma");
    let iteration = v["iteration_ms"].as_f64().unwrap();
    let cp = v["critical_path_ms"].as_f64().unwrap();
    assert!(cp > 0.0, "{v}");
    assert!(iteration >= cp, "{v}");
    // DDP's buckets (the default sync): 16 workers, 30 ring steps per bucket.
    assert!(v["ops"].as_u64().unwrap() > 20_000, "{v}");
    assert!(v["devices"].as_u64().unwrap() >= 16 * 2 + 16, "{v}");
    assert!(
        v["peak_memory_bytes"].as_u64().unwrap() > 1_000_000_000,
        "{v}"
    );
    assert!(v["replay_wall_ms"].as_f64().unwrap() >= 0.0, "{v}");
}

#[test]
fn replay_symmetric_stands_for_all_workers() {
    let args = [
        "replay",
        "--model",
        "resnet50",
        "--batch",
        "1",
        "--cluster",
        "dpro-16xv100-rdma",
    ];
    let full = run_json(&args);
    let mut a = args.to_vec();
    a.push("--symmetric");
    let sym = run_json(&a);
    assert_eq!(sym["symmetric"], true);
    assert_eq!(sym["workers"], 16);
    assert!(sym["ops"].as_u64() < full["ops"].as_u64(), "{sym} {full}");
}

#[test]
fn replay_human_summary() {
    let (code, stdout, stderr) = run(SMALL);
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "iteration",
        "critical path",
        "peak memory",
        "resnet50",
        "8xh200",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
}

/// `trainplan <list>` names every item; `--json` parses and lists the same names under `key`.
fn check_list(list: &str, key: &str, names: &[&str]) {
    let (code, stdout, stderr) = run(&[list]);
    assert_eq!(code, 0, "{stderr}");
    for n in names {
        assert!(stdout.contains(n), "`{list}` lacks {n}:\n{stdout}");
    }
    let v = run_json(&[list]);
    let got: Vec<&str> = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} array: {v}"))
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let (mut got, mut want) = (got, names.to_vec());
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn models_lists_the_zoo() {
    check_list(
        "models",
        "models",
        &[
            "bert-base",
            "bert-large",
            "convnext-base",
            "convnext-small",
            "convnext-tiny",
            "efficientnet-b0",
            "efficientnet-b1",
            "efficientnet-b2",
            "efficientnet-b3",
            "efficientnet-b4",
            "efficientnet-b5",
            "efficientnet-b6",
            "efficientnet-b7",
            "efficientnet-widese-b0",
            "efficientnet-widese-b4",
            "gpt",
            "gpt3-175b",
            "inception-v3",
            "llama",
            "llama3-405b",
            "llama3-70b",
            "llama3-8b",
            "mobilenet-v2",
            "resnet101",
            "resnet152",
            "resnet18",
            "resnet34",
            "resnet50",
            "resnext101-32x4d",
            "resnext50-32x4d",
            "se-resnext101-32x4d",
            "vgg16",
        ],
    );
}

#[test]
fn clusters_lists_the_builtins() {
    check_list(
        "clusters",
        "clusters",
        &[
            "dpro-16xv100-rdma",
            "dpro-16xv100-tcp",
            "128xv100-rdma",
            "8xh200",
            "64xh100-ib",
            "512xh100-ib",
            "16384xh100-ib",
            "8xv100",
            "2xa100",
        ],
    );
}

#[test]
fn json_runs_are_deterministic() {
    let a = run_json(SMALL);
    let b = run_json(SMALL);
    for field in [
        "iteration_ms",
        "peak_memory_bytes",
        "critical_path_top",
        "ops",
    ] {
        assert_eq!(a[field], b[field], "{field}");
    }
    assert!(!a["critical_path_top"].as_array().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Bad input (exit 3) and usage errors (exit 2)
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_names_list_the_known_ones() {
    let m = check_bad_input(
        &["replay", "--model", "resnet51", "--cluster", "8xh200"],
        "resnet51",
    );
    // Every zoo name, the last included: the message is not cut.
    for z in [
        "bert-base",
        "bert-large",
        "gpt",
        "inception-v3",
        "resnet50",
        "vgg16",
    ] {
        assert!(m.contains(z), "{m}");
    }
    assert!(!m.contains("more characters"), "{m}");
    let m = check_bad_input(
        &["replay", "--model", "resnet50", "--cluster", "9xh200"],
        "9xh200",
    );
    for c in [
        "dpro-16xv100-rdma",
        "dpro-16xv100-tcp",
        "128xv100-rdma",
        "8xh200",
        "64xh100-ib",
    ] {
        assert!(m.contains(c), "{m}");
    }
}

#[test]
fn impossible_model_options_are_bad_input() {
    let cases: &[(&[&str], &str)] = &[
        (&["--model", "resnet50", "--batch", "0"], "batch"),
        (&["--model", "resnet50", "--batch", "99999999"], "batch"),
        (
            &["--model", "gpt", "--hidden", "100", "--heads", "7"],
            "heads",
        ),
        (
            &["--model", "resnet50", "--hidden", "512"],
            "not a transformer",
        ),
        (&["--model", "gpt", "--heads", "0"], "heads"),
        (&["--model", "gpt", "--layers", "4294967295"], "layers"),
    ];
    for (opts, expect) in cases {
        let mut args = vec!["replay", "--cluster", "8xh200"];
        args.extend_from_slice(opts);
        check_bad_input(&args, expect);
    }
}

const CLUSTER: &str = "\
name: mine
gpu: v100-32gb
nodes: 2
gpus_per_node: 8
intra: nvlink-v100
inter: rdma-100g
";

#[test]
fn cluster_files_errors_name_the_file_line_and_field() {
    let dir = TempDir::new("cluster-files");
    // (file name, content, line the message must name, substring)
    let cases: &[(&str, String, u32, &str)] = &[
        ("malformed.yaml", "name: [mine\n".into(), 1, ""),
        (
            "nodes0.yaml",
            CLUSTER.replace("nodes: 2", "nodes: 0"),
            3,
            "nodes",
        ),
        (
            "unknown-field.yaml",
            format!("{CLUSTER}colour: red\n"),
            7,
            "colour",
        ),
        (
            "gpus1000.yaml",
            CLUSTER.replace("gpus_per_node: 8", "gpus_per_node: 1000"),
            4,
            "gpus_per_node",
        ),
        (
            "not-a-u32.yaml",
            CLUSTER.replace("nodes: 2", "nodes: -1"),
            3,
            "",
        ),
        ("empty.yaml", String::new(), 1, ""),
    ];
    let good = dir.write("good.yaml", CLUSTER);
    let (code, _, stderr) = run(&[
        "replay",
        "--model",
        "resnet50",
        "--batch",
        "1",
        "--cluster",
        &good,
    ]);
    assert_eq!(code, 0, "the base file is valid: {stderr}");
    for (name, text, line, expect) in cases {
        let path = dir.write(name, text);
        let msg = check_bad_input(
            &[
                "replay",
                "--model",
                "resnet50",
                "--batch",
                "1",
                "--cluster",
                &path,
            ],
            expect,
        );
        let rest = msg
            .strip_prefix(&format!("{path}:"))
            .unwrap_or_else(|| panic!("{name}: message does not start with the path: {msg}"));
        let got: u32 = rest
            .split(':')
            .next()
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no line number: {msg}"));
        assert_eq!(got, *line, "{name}: {msg}");
    }
}

#[test]
fn missing_cluster_file_is_bad_input_naming_it() {
    let dir = TempDir::new("missing-file");
    let path = dir.path().join("nope.yaml").display().to_string();
    check_bad_input(
        &["replay", "--model", "resnet50", "--cluster", &path],
        &path,
    );
}

#[test]
fn usage_errors_exit_2() {
    check_error(&["replay", "--model", "resnet50"], 2, "--cluster");
    let (code, stdout, stderr) = run(&[
        "replay",
        "--model",
        "resnet50",
        "--cluster",
        "8xh200",
        "--bogus",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert!(stderr.contains("--bogus"), "{stderr}");
    let (code, _, _) = run(&[]);
    assert_eq!(code, 2);
}

#[test]
fn help_and_version_exit_0() {
    for args in [&["--help"][..], &["replay", "--help"]] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.contains("Examples"), "{args:?}:\n{stdout}");
    }
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(stdout.starts_with("trainplan "), "{stdout}");
}

// ---------------------------------------------------------------------------------------------
// Timeline
// ---------------------------------------------------------------------------------------------

#[test]
fn timeline_is_a_chrome_trace() {
    let dir = TempDir::new("timeline");
    let path = dir.path().join("t.json").display().to_string();
    let mut args = SMALL.to_vec();
    args.extend(["--timeline", &path]);
    let v = run_json(&args);
    assert_eq!(v["timeline"], path.as_str());
    assert_eq!(dir.entries(), vec!["t.json"], "only the timeline is left");
    let text = std::fs::read_to_string(&path).unwrap();
    let trace: Value = serde_json::from_str(&text).expect("the timeline is JSON");
    let events = trace["traceEvents"]
        .as_array()
        .expect("a traceEvents array");
    let mut threads = std::collections::BTreeSet::new();
    for e in events {
        if e["ph"] == "M" && e["name"] == "thread_name" {
            threads.insert((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()));
        }
    }
    assert!(!threads.is_empty(), "no thread_name metadata");
    let mut last_end_us: f64 = 0.0;
    let mut complete = 0;
    for e in events.iter().filter(|e| e["ph"] == "X") {
        complete += 1;
        let ts = e["ts"].as_f64().expect("ts");
        let dur = e["dur"].as_f64().expect("dur");
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        assert!(e["name"].is_string(), "{e}");
        let key = (
            e["pid"].as_u64().expect("pid"),
            e["tid"].as_u64().expect("tid"),
        );
        assert!(threads.contains(&key), "X event on an unnamed thread: {e}");
        last_end_us = last_end_us.max(ts + dur);
    }
    assert!(complete > 1000, "{complete} X events");
    // The last op ends at the iteration time.
    let iteration_us = v["iteration_ms"].as_f64().unwrap() * 1e3;
    assert!(
        (last_end_us - iteration_us).abs() <= 1e-6 * iteration_us,
        "{last_end_us} µs vs {iteration_us} µs"
    );
}

#[test]
fn timeline_that_cannot_be_written_is_an_output_error_and_leaves_nothing() {
    let dir = TempDir::new("timeline-errors");
    // A path inside a directory that does not exist.
    let missing = dir
        .path()
        .join("no-such-dir")
        .join("t.json")
        .display()
        .to_string();
    let mut args = SMALL.to_vec();
    args.extend(["--timeline", &missing]);
    // Exit 5, an output error (issue 14: it was 3, bad input).
    check_error(&args, 5, &missing);
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
    // A path that is an existing directory: the temporary file is created next to it, and
    // must be gone after the failed rename.
    std::fs::create_dir(dir.path().join("a-dir")).unwrap();
    let is_dir = dir.path().join("a-dir").display().to_string();
    let mut args = SMALL.to_vec();
    args.extend(["--timeline", &is_dir]);
    check_error(&args, 5, &is_dir);
    assert_eq!(dir.entries(), vec!["a-dir"]);
    assert_eq!(std::fs::read_dir(&is_dir).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Broken pipe
// ---------------------------------------------------------------------------------------------

/// Run with stdout piped and its reading end closed at once: a closed pipe is a normal end.
fn check_closed_stdout_exits_0(args: &[&str]) {
    let mut child = trainplan()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
}

#[test]
fn closed_stdout_exits_0() {
    check_closed_stdout_exits_0(&["models"]);
    check_closed_stdout_exits_0(&["clusters"]);
    // The replay takes long enough that the pipe is surely closed before the first write.
    check_closed_stdout_exits_0(SMALL);
}

#[test]
fn precision_is_checked_against_the_gpu_and_the_input() {
    // A V100 has no TF32 or bf16 tensor cores.
    check_bad_input(
        &[
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xv100",
            "--precision",
            "tf32",
        ],
        "no TF32 tensor cores",
    );
    check_bad_input(
        &[
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xv100",
            "--precision",
            "bf16",
        ],
        "no bf16 matrix peak",
    );
    // A trace ran in the precision it was recorded in.
    let (code, _, stderr) = run(&["replay", "--trace", "no-such.json", "--precision", "fp16"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("applies to --model jobs"), "{stderr}");
    // Mixed precision speeds up a compute-bound model (batch 256: at 64 the H200 waits for the
    // host's dispatch, and autocast's casts cost more than its math saves); fp32 is slower than
    // the H200's default (TF32 convolutions under PyTorch).
    let it = |p: Option<&str>| {
        let mut a = vec![
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "256",
            "--cluster",
            "8xh200",
        ];
        if let Some(p) = p {
            a.extend(["--precision", p]);
        }
        run_json(&a)["iteration_ms"].as_f64().unwrap()
    };
    let (default, fp32, bf16) = (it(None), it(Some("fp32")), it(Some("bf16")));
    assert!(fp32 > default, "fp32 {fp32} vs default {default}");
    assert!(bf16 < default, "bf16 {bf16} vs default {default}");
}

#[test]
fn amp_style_pure_holds_the_model_in_half() {
    let job = |extra: &[&str]| {
        let mut a = vec![
            "replay",
            "--model",
            "bert-large",
            "--head",
            "squad",
            "--seq",
            "384",
            "--batch",
            "8",
            "--cluster",
            "8xv100",
            "--precision",
            "fp16",
        ];
        a.extend(extra);
        run_json(&a)
    };
    let auto = job(&[]);
    let pure = job(&["--amp-style", "pure"]);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    // Softmax, LayerNorm and the loss saved in half, half gradients: less memory; no casts
    // around them and half the all-reduce: faster.
    assert!(
        f(&pure, "peak_memory_bytes") < f(&auto, "peak_memory_bytes"),
        "{pure} vs {auto}"
    );
    assert!(f(&pure, "iteration_ms") < f(&auto, "iteration_ms"));
    // DeepSpeed's AMP is the model in half; naming the style it already has changes nothing.
    let ds = job(&["--framework", "deepspeed"]);
    let ds_pure = job(&["--framework", "deepspeed", "--amp-style", "pure"]);
    assert_eq!(ds["peak_memory_bytes"], ds_pure["peak_memory_bytes"]);
    assert_eq!(ds["iteration_ms"], ds_pure["iteration_ms"]);
    let ds_auto = job(&["--framework", "deepspeed", "--amp-style", "autocast"]);
    assert!(f(&ds_auto, "peak_memory_bytes") > f(&ds, "peak_memory_bytes"));
    // A trace ran in its own precision; an unknown style is a usage error.
    let (code, _, stderr) = run(&["replay", "--trace", "no-such.json", "--amp-style", "pure"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--amp-style applies to --model jobs"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&[
        "replay",
        "--model",
        "gpt",
        "--cluster",
        "8xv100",
        "--amp-style",
        "o2",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("autocast") && stderr.contains("pure"),
        "{stderr}"
    );
}

/// GPUs without peer-to-peer access (`NCCL_P2P_DISABLE=1`, consumer cards) all-reduce through
/// host memory: `intra: shm-host`, NCCL's SHM transport at the 3.9 GB/s NVIDIA/nccl#384
/// measured. On two GPUs a ring all-reduce moves each rank's whole gradient once, so
/// BERT-large's 336,226,108 FP32 gradients (1.345 GB) take 1.345 GB / 3.906 GB/s = 344.3 ms on
/// the comm stream, and part of it shows after the backward; over NVLink they take a few ms.
#[test]
fn gpus_without_peer_access_all_reduce_through_host_memory() {
    let cluster = |intra: &str| {
        format!(
            "name: two\ngpu: a100-80gb\nnodes: 1\ngpus_per_node: 2\nintra: {intra}\nsync: ring\n"
        )
    };
    let nvlink = write_tmp("two-nvlink.yaml", cluster("nvlink-a100"));
    let shm = write_tmp("two-shm.yaml", cluster("shm-host"));
    let replay = |c: &Path| {
        run_json(&[
            "replay",
            "--model",
            "bert-large",
            "--batch",
            "16",
            "--cluster",
            c.to_str().unwrap(),
        ])
    };
    let (nv, sh) = (replay(&nvlink), replay(&shm));
    let ms = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    let expect = 336_226_108.0 * 4.0 / (126.0 / 8.0 * 0.248) / 1e6;
    let comm = ms(&sh, "communication_ms");
    assert!(
        (expect..expect * 1.03).contains(&comm),
        "SHM all-reduce {comm:.1} ms, expected {expect:.1} ms and a few alphas"
    );
    assert!(ms(&nv, "communication_ms") < expect / 20.0, "{nv}");
    assert!(ms(&sh, "exposed_communication_ms") > 50.0, "{sh}");
    assert!(ms(&sh, "iteration_ms") > ms(&nv, "iteration_ms") + 50.0);
}
