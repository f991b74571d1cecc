//! What the integration tests share, in one place: the binary and how to run it
//! ([`trainplan`], [`run`], [`run_json`], [`check_bad_input`], [`check_error`]), scratch folders and
//! files ([`scratch`], [`write_tmp`]), the shared traces ([`shared_dir`], [`shared_traces`],
//! [`traces`]) and the smallest complete Kineto trace ([`TINY_TRACE`]).
//!
//! Scratch names are per process and per calling test file (`#[track_caller]`: `scratch("json")`
//! in `plan.rs` and in `show.rs` are two folders), so test files never share a folder by accident.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The binary, with the environment a test must not inherit (log filters, backtraces).
pub(crate) fn trainplan() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainplan"));
    c.env_remove("RUST_LOG").env_remove("RUST_BACKTRACE");
    c
}

/// Run the binary: (exit code, stdout, stderr).
pub(crate) fn run(args: &[&str]) -> (i32, String, String) {
    let out = trainplan()
        .args(args)
        .output()
        .expect("failed to run trainplan");
    (
        out.status.code().expect("trainplan was killed by a signal"),
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    )
}

/// Run with `--json` appended and parse stdout, which must be exactly one JSON object.
pub(crate) fn run_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, stdout, stderr) = run(&a);
    assert_eq!(code, 0, "{a:?}: {stderr}");
    one_json_object(&stdout)
}

/// `text` is one JSON object followed by a newline, and nothing else.
fn one_json_object(text: &str) -> Value {
    assert!(text.ends_with('\n'), "no final newline: {text:?}");
    assert_eq!(text.lines().count(), 1, "more than one line: {text:?}");
    let values: Vec<Value> = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    assert_eq!(values.len(), 1, "{text:?}");
    let v = values.into_iter().next().unwrap();
    assert!(v.is_object(), "{v}");
    v
}

/// Bad input: exit 3, nothing on stdout, and one line on stderr, `error: …`, containing
/// `expect`, with no panic or backtrace hint. Returns the message after `error: `.
pub(crate) fn check_bad_input(args: &[&str], expect: &str) -> String {
    check_error(args, 3, expect)
}

/// Exit `code`, nothing on stdout, and one line on stderr, `error: …`, containing `expect`, with
/// no panic or backtrace hint. Returns the message after `error: `.
pub(crate) fn check_error(args: &[&str], code: i32, expect: &str) -> String {
    let (got, stdout, stderr) = run(args);
    assert_eq!(got, code, "{args:?}: exit code; stderr: {stderr}");
    assert_eq!(stdout, "", "{args:?}: stdout");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{args:?}: a panic: {stderr}"
    );
    let msg = stderr
        .strip_prefix("error: ")
        .unwrap_or_else(|| panic!("{args:?}: stderr does not start with `error: `: {stderr:?}"));
    let msg = msg
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("{args:?}: no final newline: {stderr:?}"));
    assert!(
        !msg.contains('\n'),
        "{args:?}: more than one line: {stderr:?}"
    );
    assert!(msg.contains(expect), "{args:?}: {msg:?} lacks {expect:?}");
    msg.to_string()
}

/// The calling test file's stem (`plan` for `tests/it/plan.rs`), through `#[track_caller]`.
#[track_caller]
fn caller_stem() -> String {
    let file = std::panic::Location::caller().file();
    Path::new(file)
        .file_stem()
        .map_or_else(|| "it".into(), |s| s.to_string_lossy().into_owned())
}

/// An empty folder `trainplan-it-FILE-PID-NAME` under the system temp dir (FILE: the calling test
/// file's stem), emptied first if a previous run left it.
#[track_caller]
pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "trainplan-it-{}-{}-{name}",
        caller_stem(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a scratch folder");
    d
}

/// `contents` written to `name` in the calling test file's folder `trainplan-it-FILE-PID` under
/// the system temp dir (kept between the file's tests); returns the file's path.
#[track_caller]
pub(crate) fn write_tmp(name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "trainplan-it-{}-{}",
        caller_stem(),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

/// `../shared`, or `TRAINPLAN_TEST_SHARED` when set (the skip test points it at nothing).
pub(crate) fn shared_dir() -> PathBuf {
    std::env::var_os("TRAINPLAN_TEST_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

/// The folder `sub` of the shared traces (`pytorch-kineto`, `multi-rank-dlrm`), or `None` with a
/// skip note when the shared traces are absent.
pub(crate) fn shared_traces(sub: &str) -> Option<PathBuf> {
    let d = shared_dir().join("traces").join(sub);
    if d.is_dir() {
        Some(d)
    } else {
        crate::skip_note!("skipping: ../shared/traces is absent (the real-trace tests need it)");
        None
    }
}

/// The shared Kineto traces (`../shared/traces/pytorch-kineto`), or `None` with a skip note.
pub(crate) fn traces() -> Option<PathBuf> {
    shared_traces("pytorch-kineto")
}

/// A small complete Kineto trace: step 0–100 µs, one kernel behind a device synchronize.
pub(crate) const TINY_TRACE: &str = r#"{"traceEvents":[
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","pid":1,"tid":1,"ts":0,"dur":100},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":20,"dur":10,"args":{"correlation":1}},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":25,"dur":50,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":1,"tid":1,"ts":20},
{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":7,"ts":25,"bp":"e"},
{"ph":"X","cat":"cuda_runtime","name":"cudaDeviceSynchronize","pid":1,"tid":1,"ts":50,"dur":30,"args":{"correlation":2}}
]}"#;
