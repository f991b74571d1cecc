//! What trainplan prints cannot be turned against the terminal or the reader (issue 14, class
//! 8): a file that is not the expected format is never echoed (`gpu: /etc/shadow`); control
//! characters in names (ANSI escapes) are escaped on stdout and stderr; a message is at most a
//! few hundred characters; stdout that cannot be written is exit 5 (output error), a closed pipe
//! exit 0; and each kind of mistake has one exit code in every command. Numbers on screen (issue
//! 20, class 8): short steps keep their digits (µs below a millisecond, never `0.000 ms`, never
//! `1.200 ms` for 1.234), `--json` keeps them unrounded, and out-of-range latencies (a measured
//! 1e308 ms, a database entry of 1e300 ms) are refused instead of printed as `inf`.

use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};

use crate::support::scratch;

/// (code, stdout bytes, stderr bytes), run in `dir`.
fn run(dir: &std::path::Path, args: &[&std::ffi::OsStr]) -> (i32, Vec<u8>, Vec<u8>) {
    let o = crate::support::trainplan()
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (o.status.code().unwrap(), o.stdout, o.stderr)
}

fn os(v: &[&str]) -> Vec<std::ffi::OsString> {
    v.iter().map(|s| s.into()).collect()
}

fn refs(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    v.iter().map(|s| s.as_os_str()).collect()
}

#[test]
fn a_file_of_another_format_is_never_echoed() {
    let d = scratch("shadow");
    std::fs::write(
        d.join("shadow"),
        "root:$6$s3cr3tHash$abcdef:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n",
    )
    .unwrap();
    std::fs::write(
        d.join("c.yaml"),
        "name: c\ngpu: ./shadow\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-a100\n",
    )
    .unwrap();
    for args in [
        os(&["replay", "--model", "resnet50", "--cluster", "c.yaml"]),
        os(&["replay", "--model", "resnet50", "--cluster", "shadow"]),
        os(&["export", "shadow", "--to", "jax"]),
        os(&[
            "whatif",
            "--model",
            "resnet50",
            "--cluster",
            "8xh200",
            "--pass-file",
            "shadow",
            "--pass",
            "x",
        ]),
    ] {
        let (code, out, err) = run(&d, &refs(&args));
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, 3, "{args:?}: {err}");
        assert!(out.is_empty());
        assert!(
            !err.contains("s3cr3t") && !err.contains("root:"),
            "{args:?}: {err}"
        );
        assert!(err.contains("shadow"), "{args:?}: the file is named: {err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn control_characters_in_names_never_reach_the_terminal() {
    let d = scratch("ansi");
    // A cluster named with ANSI escapes, a C1 CSI and a carriage return.
    std::fs::write(
        d.join("c.yaml"),
        "name: \"\\e[2J\\e]0;owned\\a\\u009b31m\\rX\"\ngpu: h200\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-h100\n",
    )
    .unwrap();
    let bad = |b: &[u8]| {
        b.iter()
            .any(|&c| (c < 0x20 && c != b'\n' && c != b'\t') || c == 0x7f)
            || b.windows(2)
                .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
    };
    for args in [
        os(&[
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "c.yaml",
        ]),
        os(&[
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "c.yaml",
            "--json",
        ]),
    ] {
        let (code, out, err) = run(&d, &refs(&args));
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        assert!(
            !bad(&out) && !bad(&err),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
    // The JSON still says the name exactly.
    let (_, out, _) = run(
        &d,
        &refs(&os(&[
            "replay",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "c.yaml",
            "--json",
        ])),
    );
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["cluster"], "\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m\rX");
    // A file name with escapes, in an error and in a warning.
    let name = std::ffi::OsStr::from_bytes(b"\x1b[31mmissing\x07.json");
    let (code, _, err) = run(&d, &["replay".as_ref(), "--trace".as_ref(), name]);
    assert_eq!(code, 3);
    assert!(!bad(&err), "{}", String::from_utf8_lossy(&err));
    assert!(String::from_utf8_lossy(&err).contains("\\u001b[31mmissing\\u0007.json"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn messages_are_capped() {
    let d = scratch("cap");
    let long = format!("/nonexistent/{}/plan.yaml", "x".repeat(3000));
    let (code, _, err) = run(&d, &refs(&os(&["export", &long, "--to", "jax"])));
    let err = String::from_utf8(err).unwrap();
    assert_eq!(code, 3);
    assert_eq!(err.lines().count(), 1);
    // The cap (`cli::output::MAX_MESSAGE`, 1000 characters) plus the count of what was cut.
    assert!(
        err.chars().count() < 1100,
        "{} characters",
        err.chars().count()
    );
    assert!(err.contains("more characters)"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn output_errors_have_their_own_code() {
    let d = scratch("output");
    // stdout on a full device: exit 5, not 1 (a bug).
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_trainplan"))
        .args(["models"])
        .stdout(Stdio::from(full))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.starts_with("error: failed to write to stdout"), "{err}");
    // A plan that cannot be written: 5 as well.
    let (code, _, err) = run(
        &d,
        &refs(&os(&[
            "plan",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xh200",
            "--max-rounds",
            "100",
            "-o",
            "/nonexistent/dir/p.yaml",
        ])),
    );
    assert_eq!(code, 5, "{}", String::from_utf8_lossy(&err));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn one_exit_code_per_kind_of_mistake() {
    let d = scratch("codes");
    let onnx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/onnx/small_cnn.onnx"
    );
    let zoo = ["--model", "resnet50", "--cluster", "8xh200", "--batch", "0"];
    // An impossible model option: bad input (3) in every command.
    for cmd in [
        &["replay"][..],
        &["whatif", "--pass", "amp"],
        &["plan", "--max-rounds", "100"],
    ] {
        let mut a: Vec<&str> = cmd.to_vec();
        a.extend(zoo);
        let (code, _, err) = run(&d, &refs(&os(&a)));
        assert_eq!(code, 3, "{a:?}: {}", String::from_utf8_lossy(&err));
    }
    let (code, _, _) = run(&d, &refs(&os(&["lower-bound", onnx, "--batch", "0"])));
    assert_eq!(code, 3);
    // A flag value out of its range: usage (2), however it is written.
    for budget in ["1e300", "500000000000years", "0s"] {
        let (code, _, err) = run(
            &d,
            &refs(&os(&[
                "plan",
                "--model",
                "resnet50",
                "--cluster",
                "8xh200",
                "--budget",
                budget,
            ])),
        );
        assert_eq!(
            code,
            2,
            "--budget {budget}: {}",
            String::from_utf8_lossy(&err)
        );
    }
    let (code, _, _) = run(&d, &refs(&os(&["models", "--max-memory", "lots"])));
    assert_eq!(code, 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn short_steps_keep_their_digits_and_absurd_latencies_are_refused() {
    let d = scratch("digits");
    let tiny = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kineto/tiny_step.json"
    ))
    .unwrap();
    // A 1.234 ms step, and the fixture's own 100 µs one (97 µs replayed).
    let step = "\"ts\":0,\"dur\":100}";
    assert!(tiny.contains(step));
    std::fs::write(
        d.join("long.json"),
        tiny.replacen(step, "\"ts\":0,\"dur\":1234}", 1),
    )
    .unwrap();
    std::fs::write(d.join("short.json"), &tiny).unwrap();
    let text = |args: &[&str]| {
        let (code, out, err) = run(&d, &refs(&os(args)));
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        String::from_utf8(out).unwrap()
    };
    let long = text(&["replay", "--trace", "long.json"]);
    assert!(long.contains("measured step        1.234 ms"), "{long}");
    assert!(long.contains("predicted step       1.231 ms"), "{long}");
    let short = text(&["replay", "--trace", "short.json"]);
    assert!(short.contains("measured step          100 µs"), "{short}");
    assert!(
        short.contains("predicted step        97.0 µs   replayed; error -3.00 %"),
        "{short}"
    );
    assert!(
        !short.contains("0.000 ms") && !short.contains(" 0.1 ms"),
        "{short}"
    );
    // --json: the values themselves, not rounded for the screen.
    let v: serde_json::Value =
        serde_json::from_str(&text(&["replay", "--trace", "short.json", "--json"])).unwrap();
    assert_eq!(v["measured_iteration_ms"], 0.1);
    assert_eq!(v["iteration_ms"], 0.097);
    assert!((v["error_pct"].as_f64().unwrap() + 3.0).abs() < 1e-9, "{v}");

    // A measured latency no run can have: a usage error, never "infx".
    let onnx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/onnx/small_cnn.onnx"
    );
    let (code, out, err) = run(
        &d,
        &refs(&os(&[
            "lower-bound",
            onnx,
            "--batch",
            "1",
            "--measured-ms",
            "1e308",
        ])),
    );
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 2, "{err}");
    assert!(
        out.is_empty() && err.contains("--measured-ms") && !err.contains("inf"),
        "{err}"
    );
    // A database entry of 1e300 ms would become the bound: refused, naming the file and entry.
    let db = d.join("db.json");
    let (code, _, err) = run(
        &d,
        &refs(&os(&[
            "lower-bound",
            onnx,
            "--batch",
            "1",
            "--db",
            "db.json",
        ])),
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let text_db = std::fs::read_to_string(&db).unwrap();
    let first = text_db.find("\"ms\": ").unwrap() + 6;
    let end = first + text_db[first..].find([',', '\n']).unwrap();
    std::fs::write(
        &db,
        format!("{}1e300{}", &text_db[..first], &text_db[end..]),
    )
    .unwrap();
    let (code, _, err) = run(
        &d,
        &refs(&os(&[
            "lower-bound",
            onnx,
            "--batch",
            "1",
            "--db",
            "db.json",
        ])),
    );
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("db.json: entries[0]") && err.contains("physical bound"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Issue 20, class 7: whatever a budget cuts, the row labelled "the framework's default" is the
/// framework's default (`ddp_default` for PyTorch); when the budget ends before it was evaluated
/// the plan compares with what was, says so on stderr, and labels nothing as the default. (The
/// budget decides which case a run hits; the test checks the rule in both.)
#[test]
fn a_budget_cut_never_labels_another_baseline_the_frameworks_default() {
    let dir = std::env::temp_dir().join(format!("trainplan-msg-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for budget in ["1ns", "1h"] {
        let args = os(&[
            "plan",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xv100",
            "--budget",
            budget,
            "-o",
            "p.yaml",
        ]);
        let (code, out, err) = run(&dir, &refs(&args));
        let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
        assert_eq!(code, 0, "{err}");
        let plan = std::fs::read_to_string(dir.join("p.yaml")).unwrap();
        let headline_is_default = plan.contains("baseline_name: ddp_default");
        for l in out
            .lines()
            .filter(|l| l.contains("the framework's default"))
        {
            if l.contains("(the framework's default)") {
                assert!(l.starts_with("ddp_default "), "{budget}: {l}");
            } else {
                assert!(l.contains("was not evaluated"), "{budget}: {l}");
            }
        }
        assert_eq!(
            out.contains("(the framework's default)"),
            headline_is_default,
            "{budget}: {out}"
        );
        assert_eq!(
            err.contains("before the framework's default (ddp_default) was evaluated"),
            !headline_is_default,
            "{budget}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
