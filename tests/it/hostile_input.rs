//! Hostile and huge inputs (issue 14, classes 2–4), end to end through the binary: a FIFO, a
//! character device (`/dev/zero`, `/dev/urandom`) or a directory at every file input is refused
//! at once (exit 3, naming the file and what it is — never a hang); amplifying inputs stop with
//! exit 3 and one line instead of an abort: a gzip of millions of tiny events under a memory
//! ceiling, one huge JSON string, a stream of empty Chakra nodes, a host execution trace beside
//! a Kineto trace that does not fit (a warning: it was not asked for), a folder of copies of one
//! rank (refused at the second file).
//!
//! Every run has a deadline: a hang fails the test instead of blocking the suite.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::scratch;

/// Run the binary in `dir` with a 60 s deadline: (exit code, stdout, stderr). A run past the
/// deadline is killed and fails the test (a hang).
fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    run_limited(dir, args, None)
}

/// [`run_in`] under an address-space limit of `address_space` bytes (`ulimit -v`,
/// `prlimit --as`), set in the child before it runs.
fn run_limited(dir: &Path, args: &[&str], address_space: Option<u64>) -> (i32, String, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = crate::support::trainplan();
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(bytes) = address_space {
        let limit = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("trainplan {args:?} hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().expect("killed by a signal"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Exit 3, nothing on stdout, one `error: …` line holding every piece of `expect`.
fn bad_input(dir: &Path, args: &[&str], expect: &[&str]) -> String {
    bad_input_limited(dir, args, None, expect)
}

/// [`bad_input`] under an address-space limit.
fn bad_input_limited(
    dir: &Path,
    args: &[&str],
    address_space: Option<u64>,
    expect: &[&str],
) -> String {
    let (code, out, err) = run_limited(dir, args, address_space);
    assert_eq!(code, 3, "{args:?}: {err}");
    assert_eq!(out, "", "{args:?}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    for e in expect {
        assert!(err.contains(e), "{args:?}: {err:?} lacks {e:?}");
    }
    err
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(st.success());
}

/// Every file input of the CLI, with the file put at `f`.
fn every_input(f: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| s.replace("F", f)).collect::<Vec<String>>();
    let onnx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/onnx/small_cnn.onnx"
    );
    vec![
        v(&["replay", "--model", "resnet50", "--cluster", "F"]),
        v(&["replay", "--model", "resnet50", "--cluster", "gpuref.yaml"]),
        v(&[
            "whatif",
            "--model",
            "resnet50",
            "--cluster",
            "8xh200",
            "--pass-file",
            "F",
            "--pass",
            "x",
        ]),
        v(&["export", "F", "--to", "jax"]),
        v(&["lower-bound", "F", "--batch", "1"]),
        v(&["lower-bound", onnx, "--batch", "1", "--db", "F"]),
        v(&["lower-bound", onnx, "--batch", "1", "--gpu", "F"]),
        v(&["replay", "--trace", "F"]),
    ]
}

#[test]
fn fifos_devices_and_folders_are_refused_at_every_input_without_blocking() {
    let dir = scratch("special");
    for (name, what) in [
        ("fifo.yaml", "a FIFO"),
        ("fifo.json", "a FIFO"),
        ("fifo.json.gz", "a FIFO"),
        ("fifo.et", "a FIFO"),
    ] {
        mkfifo(&dir.join(name));
        // The cluster's `gpu:` reference points at the FIFO too.
        std::fs::write(
            dir.join("gpuref.yaml"),
            format!("name: c\ngpu: {name}\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-a100\n"),
        )
        .unwrap();
        for args in every_input(name) {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            bad_input(&dir, &a, &[name, what]);
        }
    }
    for dev in ["/dev/zero", "/dev/urandom"] {
        std::fs::write(
            dir.join("gpuref.yaml"),
            format!("name: c\ngpu: {dev}\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-a100\n"),
        )
        .unwrap();
        for args in every_input(dev) {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            bad_input(&dir, &a, &[dev, "a character device"]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn gzip(path: &Path, parts: impl IntoIterator<Item = Vec<u8>>) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    for p in parts {
        gz.write_all(&p).unwrap();
    }
    gz.finish().unwrap();
}

#[test]
fn amplifying_traces_stop_with_one_line() {
    let dir = scratch("amplify");
    // 8 M events of 3 bytes each (`{},`): ~200 KB of gzip, gigabytes as events. Under a 300 MB
    // ceiling the importer stops before the event vector outgrows it.
    gzip(
        &dir.join("tiny_events.json.gz"),
        std::iter::once(b"{\"traceEvents\":[".to_vec())
            .chain((0..8).map(|_| b"{},".repeat(1 << 20)))
            .chain(std::iter::once(b"{}]}".to_vec())),
    );
    let err = bad_input(
        &dir,
        &[
            "replay",
            "--trace",
            "tiny_events.json.gz",
            "--max-memory",
            "300MB",
        ],
        &[
            "tiny_events.json.gz",
            "would need",
            "more than the ceiling of 0.3 GB",
            "--max-memory",
        ],
    );
    assert!(err.contains("events"), "{err}");
    // One string of 17 MiB in a gzip of ~17 KB.
    gzip(
        &dir.join("long_string.json.gz"),
        [
            b"{\"traceEvents\":[{\"name\":\"".to_vec(),
            vec![b'A'; 17 << 20],
            b"\"}]}".to_vec(),
        ],
    );
    bad_input(
        &dir,
        &["replay", "--trace", "long_string.json.gz"],
        &[
            "long_string.json.gz",
            "a JSON string longer than 16 MiB",
            "Limits",
        ],
    );
    // A Chakra stream: metadata, then a million empty nodes (one zero byte each: node id 0).
    let mut et = crate::exec_traces::tiny_stream();
    let first = et.len();
    et.extend(std::iter::repeat_n(0u8, 1 << 20));
    std::fs::write(dir.join("empty_nodes.et"), &et).unwrap();
    let err = bad_input(
        &dir,
        &["replay", "--trace", "empty_nodes.et"],
        &["empty_nodes.et", "node id 0 appears twice"],
    );
    // Stopped at the second empty node, a few bytes in.
    assert!(err.contains(&format!("byte {}", first + 1)), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small complete Kineto trace (one step, one kernel behind a device synchronize).
const TINY_TRACE: &str = r#"{"traceEvents":[
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","pid":1,"tid":1,"ts":0,"dur":100},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":20,"dur":10,"args":{"correlation":1}},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":25,"dur":50,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":1,"tid":1,"ts":20},
{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":7,"ts":25,"bp":"e"},
{"ph":"X","cat":"cuda_runtime","name":"cudaDeviceSynchronize","pid":1,"tid":1,"ts":50,"dur":30,"args":{"correlation":2}}
],"distributedInfo":{"rank":0,"world_size":4}}"#;

#[test]
fn an_execution_trace_beside_obeys_the_same_limits_and_fails_as_a_warning() {
    let dir = scratch("beside");
    std::fs::write(dir.join("rank0.kineto.json"), TINY_TRACE).unwrap();
    let args = [
        "replay",
        "--trace",
        "rank0.kineto.json",
        "--cluster",
        "2xa100",
        "--json",
    ];
    // A FIFO beside: not a file, never opened.
    mkfifo(&dir.join("rank0.execution_trace.json"));
    let (code, _, err) = run_in(&dir, &args);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_file(dir.join("rank0.execution_trace.json")).unwrap();
    // An execution trace beside that is far larger in memory than on disk: 2 M nodes in ~100 KB.
    gzip(
        &dir.join("rank0.execution_trace.json"),
        std::iter::once(b"{\"schema\":\"1.0.1\",\"nodes\":[".to_vec())
            .chain((0..2).map(|_| b"{\"id\":1,\"name\":\"x\"},".repeat(1 << 20)))
            .chain(std::iter::once(b"{\"id\":2}]}".to_vec())),
    );
    let mut with_ceiling = args.to_vec();
    with_ceiling.extend(["--max-memory", "200MB"]);
    let (code, out, err) = run_in(&dir, &with_ceiling);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with('{'), "{out}");
    assert!(
        err.contains("ignoring the execution trace beside") && err.contains("would need"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn copies_of_one_rank_are_refused_at_the_second_file() {
    let dir = scratch("ranks");
    let folder = dir.join("ranks");
    std::fs::create_dir_all(&folder).unwrap();
    for i in 0..50 {
        std::fs::write(folder.join(format!("r{i:03}.json")), TINY_TRACE).unwrap();
    }
    bad_input(
        &dir,
        &["replay", "--trace", "ranks"],
        &["r000.json and ", "r001.json are both rank 0"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Refuse, don't saturate (class 6)
// ---------------------------------------------------------------------------------------------

#[test]
fn out_of_range_factors_rates_and_sums_are_refused_not_saturated() {
    let dir = scratch("saturate");
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    let whatif = |file: &str, pass: &str| -> Vec<String> {
        [
            "whatif",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xh200",
            "--pass-file",
            file,
            "--pass",
            pass,
        ]
        .map(String::from)
        .to_vec()
    };
    let check = |args: Vec<String>, expect: &[&str]| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        bad_input(&dir, &a, expect)
    };
    // A scale of 1e308 once read as −86 % iteration time.
    w(
        "huge.yaml",
        "name: huge\ndoc: x\nrules:\n  - select: {phase: bw}\n    scale: 1e308\n",
    );
    check(
        whatif("huge.yaml", "huge"),
        &["huge.yaml:5:12: field scale: must be a number ≥ 0 and ≤ 10000, got 1e308"],
    );
    // A memory factor of 1e15 once lowered peak memory 3.0 → 0.3 GB.
    w(
        "mem.yaml",
        "name: mem\ndoc: x\nrules:\n  - select: {phase: fw}\n    memory: 1e15\n",
    );
    check(
        whatif("mem.yaml", "mem"),
        &["mem.yaml:5:13: field memory: must be", "got 1e15"],
    );
    // A knob whose declared range leaves the field's.
    w(
        "knob.yaml",
        "name: knob\ndoc: x\nknobs:\n  - {name: f, default: 1, min: 0, max: 1e300, doc: x}\nrules:\n  - select: {phase: bw}\n    scale: $f\n",
    );
    check(
        whatif("knob.yaml", "knob"),
        &["knob `$f` ranges over [0, 1e300]"],
    );
    // Each factor in range, their product (10^20) not: refused naming the pass file and rule.
    let mut chain = String::from("name: chain\ndoc: x\nrules:\n");
    for _ in 0..5 {
        chain.push_str("  - select: {phase: bw}\n    scale: 10000\n");
    }
    w("chain.yaml", &chain);
    check(
        whatif("chain.yaml", "chain"),
        &["chain.yaml:", "would last", "~13 days"],
    );
    check(
        [
            "plan",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xh200",
            "--pass-file",
            "chain.yaml",
            "--passes",
            "chain,amp",
            "--max-rounds",
            "100",
            "-o",
            "p.yaml",
        ]
        .map(String::from)
        .to_vec(),
        &["chain.yaml:", "would last"],
    );
    assert!(!dir.join("p.yaml").exists(), "no plan adopting the pass");
    // Rates that made communication free or every time infinite.
    w(
        "slow.yaml",
        "name: slow\nscope: intra\nline_rate_gbit_s: 1e-20\nefficiency: 0.9\nalpha_us: 1\n",
    );
    w(
        "c1.yaml",
        "name: c1\ngpu: h200\nnodes: 1\ngpus_per_node: 2\nintra: slow.yaml\n",
    );
    let replay = |c: &str| {
        ["replay", "--model", "resnet50", "--cluster", c]
            .map(String::from)
            .to_vec()
    };
    check(
        replay("c1.yaml"),
        &[
            "slow.yaml",
            "field line_rate_gbit_s: must be between 0.001 and 1000000, got 1e-20",
        ],
    );
    w(
        "tiny.yaml",
        "name: t\nmodel: T\nvendor: x\nmatrix_tflops: {fp16: 1e-320}\nvector_tflops: {fp32: 1}\nmemory_gbps: 1\nmemory_gib: 1\nlaunch_overhead_us: 1\narch: hopper\nsms: 132\nboost_clock_mhz: 1980\n",
    );
    w(
        "c2.yaml",
        "name: c2\ngpu: tiny.yaml\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-h100\n",
    );
    check(
        replay("c2.yaml"),
        &[
            "tiny.yaml",
            "matrix_tflops.fp16: must be between",
            "got 1e-320",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Memory limits (issue 20, class 3): `ulimit -v`, `--max-memory` on every command, pass files and
// plans that amplify.
// ---------------------------------------------------------------------------------------------

/// A cluster of `nodes` × 8 V100 over RDMA, written into `dir`.
fn v100_cluster(dir: &Path, nodes: u32) -> String {
    let name = format!("v100x{nodes}.yaml");
    std::fs::write(
        dir.join(&name),
        format!(
            "name: v100x{nodes}\ngpu: v100-32gb\nnodes: {nodes}\ngpus_per_node: 8\n\
             intra: nvlink-v100\ninter: rdma-100g\nnics_per_node: 1\nsync: ring\n"
        ),
    )
    .unwrap();
    name
}

#[test]
fn an_address_space_limit_stops_with_exit_3_not_an_abort() {
    const MB: u64 = 1_000_000;
    let dir = scratch("ulimit");
    // 24 M tiny events (~330 KB of gzip): under `ulimit -v` 500 MB and no --max-memory, the
    // importer stops on the mapped size before an allocation the limit would refuse.
    gzip(
        &dir.join("tiny_events.json.gz"),
        std::iter::once(b"{\"traceEvents\":[".to_vec())
            .chain((0..24).map(|_| b"{},".repeat(1 << 20)))
            .chain(std::iter::once(b"{}]}".to_vec())),
    );
    let args = ["replay", "--trace", "tiny_events.json.gz"];
    let err = bad_input_limited(
        &dir,
        &args,
        Some(500 * MB),
        &["tiny_events.json.gz", "would need", "ulimit -v"],
    );
    assert!(!err.contains("memory allocation"), "{err}");
    // An explicit --max-memory below the limit is the binding one, and says so.
    let mut capped = args.to_vec();
    capped.extend(["--max-memory", "300MB"]);
    bad_input_limited(
        &dir,
        &capped,
        Some(1_000 * MB),
        &[
            "would need",
            "more than the ceiling of 0.3 GB",
            "--max-memory",
        ],
    );
    // A large replay: refused before the graph is built, with what it needs and what helps.
    let cluster = v100_cluster(&dir, 64);
    let replay = [
        "replay",
        "--model",
        "bert-base",
        "--cluster",
        cluster.as_str(),
    ];
    bad_input_limited(
        &dir,
        &replay,
        Some(1_000 * MB),
        &["graph of", "ops would need", "GB", "--symmetric"],
    );
    // ... and its symmetric form fits.
    let mut symmetric = replay.to_vec();
    symmetric.extend(["--symmetric", "--json"]);
    let (code, out, err) = run_limited(&dir, &symmetric, Some(1_000 * MB));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with('{'), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_honours_max_memory() {
    let dir = scratch("replay-ceiling");
    let cluster = v100_cluster(&dir, 64);
    // 512 V100s, ~15.6 M ops: ~1.9 GB to evaluate; it once used that under a 300 MiB ceiling.
    let err = bad_input(
        &dir,
        &[
            "replay",
            "--model",
            "bert-base",
            "--cluster",
            &cluster,
            "--max-memory",
            "300MiB",
        ],
        &[
            "the job's graph of 15,",
            "would need 1.9 GB of memory, more than the ceiling of 0.3 GB",
            "try --symmetric",
        ],
    );
    assert!(err.len() < 400, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `whatif` on a large ring job evaluates the full graph unless told `--symmetric`: over the
/// ceiling it says so and names the form that fits, which then runs under the same ceiling.
#[test]
fn whatif_over_the_ceiling_names_the_symmetric_form() {
    let dir = scratch("whatif-ceiling");
    let cluster = v100_cluster(&dir, 64);
    let args = [
        "whatif",
        "--model",
        "bert-base",
        "--cluster",
        &cluster,
        "--pass",
        "amp",
        "--max-memory",
        "300MiB",
    ];
    let err = bad_input(
        &dir,
        &args,
        &[
            "evaluating a graph of ",
            "(all 512 workers; --symmetric replays one and the quotient ring)",
            "more than the ceiling of 0.3 GB",
        ],
    );
    assert!(err.len() < 400, "{err}");
    let mut sym = args.to_vec();
    sym.push("--symmetric");
    let (code, out, err) = run_limited(&dir, &sym, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("what if amp"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pass_files_that_amplify_are_refused_naming_the_file_rule_and_limit() {
    let dir = scratch("pass-amplify");
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    let whatif = |file: &str, pass: &str| {
        let (f, p) = (file.to_string(), pass.to_string());
        move |dir: &Path, expect: &[&str]| {
            bad_input(
                dir,
                &[
                    "whatif",
                    "--model",
                    "bert-base",
                    "--cluster",
                    "8xv100",
                    "--pass-file",
                    &f,
                    "--pass",
                    &p,
                ],
                expect,
            )
        }
    };
    // Every forward op to every backward op: 443 × 443 edges from five lines.
    w(
        "edges.yaml",
        "name: all-edges\ndoc: x\nrules:\n  - select: {phase: fw}\n    add_edge: {to: {phase: bw}}\n",
    );
    whatif("edges.yaml", "all-edges")(
        &dir,
        &[
            "edges.yaml:4: rule 1 (add_edge)",
            "196,249 edges",
            "more than the limit of 100,000 edges a pass may add",
            "Limits",
        ],
    );
    // 15,000 rules in 600 KB.
    let mut many = String::from("name: many\ndoc: x\nrules:\n");
    for _ in 0..15_000 {
        many.push_str("  - select: {phase: fw}\n    scale: 0.99\n");
    }
    w("many.yaml", &many);
    whatif("many.yaml", "many")(
        &dir,
        &[
            "many.yaml:2004:",
            "15,000 rules, more than the limit of 1,000 rules in a pass file",
            "Limits",
        ],
    );
    // 1.3 MB of YAML holding 270,000 values: the parser's limit, named as a user reads it.
    let mut big = String::from("name: big\ndoc: x\nrules:\n");
    let names: Vec<String> = (0..300).map(|j| format!("a{j}")).collect();
    for _ in 0..900 {
        big.push_str(&format!(
            "  - select: {{name: [{}]}}\n    scale: 0.99\n",
            names.join(",")
        ));
    }
    w("big.yaml", &big);
    let err = whatif("big.yaml", "big")(
        &dir,
        &[
            "big.yaml:",
            "more than 250,000 YAML values",
            "the limit for a pass file",
            "Limits",
        ],
    );
    assert!(!err.contains("budget breached"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_plan_over_the_yaml_parsers_default_is_read() {
    // (A plan beyond its own limit is refused naming it: `cost::config`'s
    // `yaml_limits_are_per_kind_and_named`.)
    let dir = scratch("big-plan");
    let (code, _, err) = run_in(
        &dir,
        &[
            "plan",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xv100",
            "--passes",
            "tensor-fusion",
            "-o",
            "p.yaml",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let plan = std::fs::read_to_string(dir.join("p.yaml")).unwrap();
    // One more tensor group of 400,000 names (~7 MB): over the parser's default of 250,000
    // values, which once refused it as "budget breached: Nodes { nodes: 250001 }".
    let at = plan.find("  tensor_groups:\n").expect("tensor groups") + "  tensor_groups:\n".len();
    let mut group = String::from("  - - extra0\n");
    for i in 1..400_000 {
        group.push_str(&format!("    - extra{i}\n"));
    }
    let big = format!("{}{group}{}", &plan[..at], &plan[at..]);
    assert!(big.len() > 6_000_000);
    std::fs::write(dir.join("big.yaml"), &big).unwrap();
    let (code, out, err) = run_in(&dir, &["show", "big.yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("`extra0`"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
