//! `trainplan replay --trace FILE` on bad input, end to end: every case of issue 3 exits 3 with
//! one line naming the file and where in it (line and column, of the decompressed JSON for gzip,
//! and the event's index in `traceEvents`), or warns once and goes on when the oddity is
//! ignorable. The fixtures are made here from one small complete trace.

use std::io::Write;

use crate::support::{check_bad_input, run, run_json, write_tmp};

/// A small complete trace, one event per line (event #k is on line k + 2): step 0–100 µs, one
/// kernel behind a device synchronize.
const GOOD: &str = r#"{"traceEvents":[
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","pid":1,"tid":1,"ts":0,"dur":100},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":20,"dur":10,"args":{"correlation":1}},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":25,"dur":50,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g","name":"ac2g","id":1,"pid":1,"tid":1,"ts":20},
{"ph":"f","cat":"ac2g","name":"ac2g","id":1,"pid":0,"tid":7,"ts":25,"bp":"e"},
{"ph":"X","cat":"cuda_runtime","name":"cudaDeviceSynchronize","pid":1,"tid":1,"ts":50,"dur":30,"args":{"correlation":2}}
],
"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
"#;

/// `GOOD` with `from` replaced by `to` (which must occur exactly once).
fn edit(from: &str, to: &str) -> String {
    assert_eq!(GOOD.matches(from).count(), 1, "{from}");
    GOOD.replacen(from, to, 1)
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// `replay --trace` on `bytes` written as `name` exits 3 with one line naming the file and
/// containing every `expect`.
fn check(name: &str, bytes: &[u8], expect: &[&str]) -> String {
    let p = write_tmp(name, bytes);
    let f = p.to_str().unwrap();
    let msg = check_bad_input(&["replay", "--trace", f], expect[0]);
    assert!(msg.contains(f), "{msg:?} does not name {f}");
    for e in expect {
        assert!(msg.contains(e), "{msg:?} lacks {e:?}");
    }
    msg
}

#[test]
fn the_good_fixture_replays() {
    let p = write_tmp("good.json", GOOD.as_bytes());
    let v = run_json(&["replay", "--trace", p.to_str().unwrap()]);
    assert_eq!(v["measured_iteration_ms"].as_f64(), Some(0.1));
    let p = write_tmp("good.json.gz", &gzip(GOOD.as_bytes()));
    let v = run_json(&["replay", "--trace", p.to_str().unwrap()]);
    assert_eq!(v["error_pct"].as_f64(), Some(0.0));
}

#[test]
fn truncated_files() {
    let gz = gzip(GOOD.as_bytes());
    // The gzip stream itself is cut: how much JSON came out, and where that is.
    let m = check(
        "cut_stream.json.gz",
        &gz[..gz.len() / 2],
        &[
            "truncated",
            "gzip stream ends early",
            "bytes of decompressed JSON",
        ],
    );
    assert!(m.contains("line "), "{m}");
    // A complete gzip stream of a cut JSON text: line/column of the decompressed JSON, and the
    // event it ends in.
    let cut = &GOOD[..GOOD.find("\"dur\":50").unwrap()];
    check(
        "cut_json.json.gz",
        &gzip(cut.as_bytes()),
        &[
            "truncated",
            "line 4",
            "of the decompressed JSON",
            "event #2 of traceEvents (\"gemm\", ts 25 µs",
        ],
    );
    check(
        "cut_plain.json",
        cut.as_bytes(),
        &["truncated", "line 4", "event #2"],
    );
}

#[test]
fn malformed_json_mid_file() {
    check(
        "missing_comma.json",
        edit(r#""dur":50,"args""#, r#""dur":50 "args""#).as_bytes(),
        &[
            "malformed JSON",
            "line 4 column",
            "event #2",
            "expected `,` or `}`",
        ],
    );
    check(
        "stray_token.json",
        edit("\n{\"ph\":\"s\"", "\n}{\"ph\":\"s\"").as_bytes(),
        &["malformed JSON", "line 5", "event #3", "expected value"],
    );
    check(
        "trace_events_object.json",
        br#"{"traceEvents": {"ph": "X"}}"#,
        &["expected an array of trace events", "in `traceEvents`"],
    );
    check(
        "event_not_object.json",
        edit(
            "\n{\"ph\":\"s\",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"id\":1,\"pid\":1,\"tid\":1,\"ts\":20},",
            "\n42,",
        )
        .as_bytes(),
        &["expected a trace event (a JSON object)", "event #3"],
    );
    check(
        "no_trace_events.json",
        br#"{"schemaVersion": 1, "nodes": []}"#,
        &["not a Kineto/Chrome trace", "no `traceEvents`", "nodes"],
    );
    check("number.json", b"42", &["expected a Kineto trace"]);
}

#[test]
fn wrong_types_name_event_and_field() {
    check(
        "dur_string.json",
        edit(r#""dur":50,"#, r#""dur":"fifty","#).as_bytes(),
        &[
            "time \"fifty\" is not a number of µs",
            "bad value in",
            "event #2 of traceEvents (\"gemm\", ts 25 µs, field `dur`)",
            "line 4",
        ],
    );
    check(
        "ts_bool.json",
        edit(r#""ts":25,"dur":50"#, r#""ts":true,"dur":50"#).as_bytes(),
        &["invalid type: boolean `true`", "field `ts`", "event #2"],
    );
    check(
        "pid_array.json",
        edit(
            r#""pid":0,"tid":7,"ts":25,"dur""#,
            r#""pid":[0],"tid":7,"ts":25,"dur""#,
        )
        .as_bytes(),
        &["invalid type: sequence", "field `pid`", "event #2"],
    );
}

#[test]
fn empty_binary_directory() {
    check("empty.json", b"", &["is empty"]);
    check("empty.json.gz", b"", &["is empty"]);
    check("nothing.json.gz", &gzip(b""), &["decompresses to nothing"]);
    check(
        "elf.json",
        b"\x7fELF\x02\x01\x01\x00\x00\x00",
        &["not JSON", "7f 45 4c 46"],
    );
    check(
        "garbage.json.gz",
        &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xfe, 0x00, 0x13],
        &["gzip"],
    );
    let dir = std::env::temp_dir().join(format!("trainplan-it-bad-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A folder stands for the traces in it: none there.
    let m = check_bad_input(
        &["replay", "--trace", dir.to_str().unwrap()],
        "the folder holds no Kineto trace",
    );
    assert!(m.contains(dir.to_str().unwrap()), "{m}");
    check_bad_input(
        &["replay", "--trace", "/nonexistent/trace.json"],
        "failed to read /nonexistent/trace.json",
    );
}

#[test]
fn out_of_range_negative_and_nan_like_values() {
    check(
        "huge_ts.json",
        edit(r#""ts":25,"dur""#, r#""ts":1e300,"dur""#).as_bytes(),
        &["out of range", "event #2", "field `ts`"],
    );
    check(
        "huge_int_dur.json",
        edit(r#""dur":50,"#, r#""dur":99999999999999999999999,"#).as_bytes(),
        &["out of range", "field `dur`"],
    );
    check(
        "negative_dur.json",
        edit(r#""dur":50,"#, r#""dur":-50,"#).as_bytes(),
        &[
            "negative duration (-50 µs)",
            "event #2 of traceEvents (\"gemm\"",
        ],
    );
    check(
        "nan_ts.json",
        edit(r#""ts":25,"dur""#, r#""ts":"NaN","dur""#).as_bytes(),
        &["time \"NaN\" is not a number of µs", "event #2"],
    );
    check(
        "inf_dur.json",
        edit(r#""dur":50,"#, r#""dur":"Infinity","#).as_bytes(),
        &["\"Infinity\" is not a number", "event #2"],
    );
    // NaN is not JSON at all.
    check(
        "nan_literal.json",
        edit(r#""dur":50,"#, r#""dur":NaN,"#).as_bytes(),
        &["malformed JSON", "event #2"],
    );
    // A correlation id beyond i64 cannot link the launch to its kernel: the step is incomplete.
    check(
        "huge_correlation.json",
        edit(
            r#""dur":10,"args":{"correlation":1}"#,
            r#""dur":10,"args":{"correlation":1e40}"#,
        )
        .as_bytes(),
        &["no complete iteration"],
    );
}

#[test]
fn duplicate_keys_and_deep_nesting() {
    check(
        "dup_ts.json",
        edit(r#""ts":25,"dur""#, r#""ts":25,"ts":26,"dur""#).as_bytes(),
        &["duplicate field `ts`", "event #2"],
    );
    check(
        "dup_arg.json",
        edit(
            r#""correlation":1,"stream":7"#,
            r#""correlation":1,"correlation":2,"stream":7"#,
        )
        .as_bytes(),
        &["duplicate field `correlation`", "event #2", "field `args`"],
    );
    // A duplicate of a key the importer does not read is ignored.
    let p = write_tmp(
        "dup_ignored.json",
        edit(r#""bp":"e""#, r#""bp":"e","bp":"s""#).as_bytes(),
    );
    assert_eq!(run(&["replay", "--trace", p.to_str().unwrap()]).0, 0);
    // 100,000 nested arrays under an arg the importer does not read: skipped without recursion,
    // the trace replays.
    let nest = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let p = write_tmp(
        "deep_ignored.json",
        edit(r#""stream":7}"#, &format!(r#""stream":7,"x":{nest}}}"#)).as_bytes(),
    );
    let (code, _, err) = run(&["replay", "--trace", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // ... and in a field it reads: a wrong type, named.
    check(
        "deep_name.json",
        edit(r#""name":"gemm""#, &format!(r#""name":{nest}"#)).as_bytes(),
        &[
            "invalid type: sequence, expected a string",
            "event #2",
            "field `name`",
        ],
    );
    check(
        "deep_top.json",
        nest.as_bytes(),
        &["expected a trace event", "event #0"],
    );
}

#[test]
fn not_replayable_traces_are_refused() {
    // No launch→GPU flows at all (as in the sampled traces): no figure, a reason.
    let sampled = GOOD
        .lines()
        .filter(|l| !l.contains("\"ac2g\""))
        .collect::<Vec<_>>()
        .join("\n");
    check(
        "sampled.json",
        sampled.as_bytes(),
        &["cannot be replayed", "sampled or filtered"],
    );
    let no_steps = GOOD
        .lines()
        .filter(|l| !l.contains("ProfilerStep"))
        .collect::<Vec<_>>()
        .join("\n");
    check(
        "no_steps.json",
        no_steps.as_bytes(),
        &["no iteration markers"],
    );
    let Some(d) = crate::support::traces() else {
        return;
    };
    for r in [0, 1] {
        let s = d.join(format!(
            "sampled_events_rank{r}of128_NOT_REPLAYABLE.json.gz"
        ));
        let m = check_bad_input(&["replay", "--trace", s.to_str().unwrap()], "sampled");
        assert!(m.contains("no launch→GPU flow events"), "{m}");
    }
}

#[test]
fn ignorable_oddities_warn_once_and_go_on() {
    // Two events of an unknown category: one warning naming it, and the replay goes on.
    let odd = edit(
        "\n{\"ph\":\"s\"",
        "\n{\"ph\":\"X\",\"cat\":\"my_tool\",\"name\":\"a\",\"pid\":1,\"tid\":9,\"ts\":1,\"dur\":1},\
         \n{\"ph\":\"X\",\"cat\":\"my_tool\",\"name\":\"b\",\"pid\":1,\"tid\":9,\"ts\":2,\"dur\":1},\
         \n{\"ph\":\"s\"",
    );
    let p = write_tmp("unknown_cat.json", odd.as_bytes());
    let (code, out, err) = run(&["replay", "--trace", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"measured_iteration_ms\":0.1"), "{out}");
    assert_eq!(err.matches("my_tool").count(), 1, "{err}");
    assert!(
        err.contains("2 events") && err.contains("first event #3"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // Rank 5 of 2 in distributedInfo: warned about, not used by a one-rank replay.
    let p = write_tmp(
        "bad_rank.json",
        edit(
            r#""rank": 0, "world_size": 1"#,
            r#""rank": 5, "world_size": 2"#,
        )
        .as_bytes(),
    );
    let (code, _, err) = run(&["replay", "--trace", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("rank 5 of world size 2"), "{err}");
    // The same rank twice: refused.
    let f = write_tmp("rank_a.json", GOOD.as_bytes());
    let f = f.to_str().unwrap();
    check_bad_input(&["replay", "--trace", f, "--trace", f], "is given twice");
}

#[test]
fn other_trace_formats_are_named() {
    // A host execution trace given where a Kineto trace is expected.
    let msg = check(
        "host_et.json",
        br#"{"schema": "1.0.1", "pid": 7, "time": "x", "start_ts": 1, "nodes": [], "finish_ts": 2}"#,
        &["host_et.json", "host execution trace"],
    );
    assert!(msg.contains("keys: schema"), "{msg}");
    // A Horovod timeline: communication only, nothing to replay.
    let hvd = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/horovod_timeline.json");
    let msg = check_bad_input(
        &["replay", "--trace", hvd.to_str().unwrap()],
        "Horovod timeline",
    );
    assert!(msg.contains("no compute"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Odd traces that once gave silent wrong answers (issue 20, class 7): warned about with counts.
// ---------------------------------------------------------------------------------------------

/// `replay --trace` on `text`: exit 0, and stderr.
fn replay_warnings(name: &str, text: &str) -> String {
    let p = write_tmp(name, text.as_bytes());
    let (code, out, err) = run(&["replay", "--trace", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with('{'), "{out}");
    err
}

#[test]
fn two_gpu_events_on_one_launch_are_counted() {
    // A second kernel with the launch's correlation id (a merged or corrupt trace).
    let text = edit(
        r#"{"ph":"s","cat":"ac2g""#,
        r#"{"ph":"X","cat":"kernel","name":"gemm2","pid":0,"tid":7,"ts":76,"dur":4,"args":{"correlation":1,"stream":7}},
{"ph":"s","cat":"ac2g""#,
    );
    let err = replay_warnings("shared_corr.json", &text);
    assert!(
        err.contains(
            "1 launch(es) have more than one GPU event with their correlation id (1 extra"
        ) && err.contains("correlation 1, \"gemm\" event #2 and \"gemm2\" event #3"),
        "{err}"
    );
    // The good fixture says nothing of the kind.
    let err = replay_warnings("good_corr.json", GOOD);
    assert!(!err.contains("correlation id"), "{err}");
    assert!(!err.contains("before their launch"), "{err}");
}

#[test]
fn a_kernel_that_starts_before_its_launch_is_counted() {
    // The kernel at 12 µs, its launch at 20 µs.
    let text = edit(
        r#""name":"gemm","pid":0,"tid":7,"ts":25"#,
        r#""name":"gemm","pid":0,"tid":7,"ts":12"#,
    );
    let err = replay_warnings("early.json", &text);
    assert!(
        err.contains(
            "1 GPU event(s) start before their launch (by up to 8.000 µs; first: \"gemm\" event #2)"
        ),
        "{err}"
    );
}

/// A plan from a trace that records no shapes does not know the batch: its file says
/// `batch: null` (once `batch: 0`), `show` says "batch not recorded", and the exports write no
/// made-up micro-batch.
#[test]
fn a_plan_from_a_trace_without_shapes_does_not_make_up_a_batch() {
    let t = write_tmp("noshapes.json", GOOD.as_bytes());
    let out = t.with_file_name("noshapes_plan.yaml");
    let (code, _, err) = run(&[
        "plan",
        "--trace",
        t.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("\n  batch: null\n"), "{text}");
    assert!(!text.contains("batch: 0"), "{text}");
    let (code, shown, err) = run(&["show", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("(batch not recorded)"), "{shown}");
    assert!(!shown.contains("batch 0"), "{shown}");
}
