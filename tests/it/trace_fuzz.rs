//! Fuzzing the Kineto importer with proptest: small real traces (when `../shared/traces` exists)
//! and the committed fixtures, mutated (cut at a byte, bytes flipped / inserted / deleted, a
//! number replaced by a string, a huge or negative value, a key dropped, an event duplicated,
//! events shuffled, the result maybe gzipped), go through the whole path a user's trace takes:
//! `parse_kineto` → `steps` → `build_job` → expand → replay → critical path, memory, breakdown
//! (and, for a mutated DLRM rank beside an intact one, the multi-rank path: global graph, clock
//! alignment, replay). Nothing may panic, and every single-rank error must name the file.
//!
//! A panic fails the case with the mutated input saved to a file for reproduction; each input that
//! ever crashed is kept under `tests/fixtures/kineto/fuzz/` and replayed by
//! [`fuzz_regressions`]. Cases per property: `PROPTEST_CASES` (default 96, so that `cargo test`
//! stays fast in debug builds); `PROPTEST_CASES=5000 cargo test --release trace_fuzz` for a longer
//! run.

use std::io::{Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use trainplan::replay::{breakdown, critical_path, dependency_bound_ns, peak_memory, replay};
use trainplan::trace::graph::{build_job, steps};
use trainplan::trace::parse_kineto;

const NAME: &str = "fuzzed-trace.json";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kineto")
}

fn gunzip_if(bytes: Vec<u8>) -> Vec<u8> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .expect("a valid gzip seed");
        out
    } else {
        bytes
    }
}

/// The seeds: committed fixtures, plus the small shared traces when present.
static SEEDS: LazyLock<Vec<(String, Vec<u8>)>> = LazyLock::new(|| {
    let mut seeds = Vec::new();
    for f in [
        "tiny_step.json",
        "legacy_2021_two_steps.json",
        "fsdp_tiny.json",
    ] {
        let b = std::fs::read(fixtures().join(f)).expect("committed fixture");
        seeds.push((f.to_string(), b));
    }
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/pytorch-kineto");
    if shared.is_dir() {
        for f in [
            "toy_cuda_event_sync.json.gz",
            "toy_cuda_event_sync_multi_stream.json.gz",
            "toy_train_mi250_rocm.json.gz",
            "alexnet_a100_cuda_sync.json.gz",
        ] {
            let b = std::fs::read(shared.join(f)).expect("shared trace");
            seeds.push((f.to_string(), gunzip_if(b)));
        }
    } else {
        crate::skip_note!("../shared/traces is absent: fuzzing the committed fixtures only");
    }
    seeds
});

/// The whole path a trace takes through `trainplan replay`; `Err` is the message a user sees.
fn full_path(bytes: &[u8]) -> Result<(), String> {
    let t = parse_kineto(bytes, NAME).map_err(|e| e.to_string())?;
    let _ = steps(&t);
    let _ = t.replayable();
    let tj = build_job(&t, NAME, None).map_err(|e| e.to_string())?;
    let g = tj
        .job
        .expand()
        .map_err(|e| format!("BUG: a built trace job does not expand: {e}"))?;
    let r = replay(&g);
    let cp = critical_path(&g, &r);
    let _ = dependency_bound_ns(&g);
    let _ = peak_memory(&g, &r);
    let _ = breakdown::breakdown(&g, &r, 0);
    let _ = breakdown::critical_path_items(&g, &cp);
    let _ = r.end_ns.get(tj.step_end as usize);
    Ok(())
}

/// Runs `full_path`; a panic or an error that does not name the file fails with the input saved.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let res = catch_unwind(AssertUnwindSafe(|| full_path(bytes)));
    let problem = match res {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(m)) if m.contains(NAME) && !m.starts_with("BUG") => return Ok(()),
        Ok(Err(m)) => format!("error without the file's name, or a bug: {m}"),
        Err(p) => format!(
            "panic: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        ),
    };
    let dir = std::env::temp_dir().join("trainplan-fuzz-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let p = dir.join(format!("{h:016x}.json"));
    std::fs::write(&p, bytes).unwrap();
    Err(TestCaseError::fail(format!(
        "{problem}\ninput saved to {}",
        p.display()
    )))
}

/// A change at the level of the JSON values.
#[derive(Clone, Debug)]
enum Edit {
    DropKey(Index, Index),
    DuplicateEvent(Index),
    Shuffle(u64),
    Replace(Index, Index, &'static str),
}

const ODD_VALUES: &[&str] = &[
    "\"abc\"",
    "\"NaN\"",
    "\"-inf\"",
    "1e308",
    "-1e308",
    "-5",
    "0",
    "99999999999999999999999",
    "-9223372036854775808",
    "9223372036854775807",
    "18446744073709551615",
    "4.5e15",
    "-4.5e15",
    "9.2e15",
    "-9.2e15",
    "\"9223372036854775.807\"",
    "\"-9223372036854775.808\"",
    "0.0004",
    "\"stream 7\"",
    "null",
    "[]",
    "{}",
    "true",
    "\"\"",
    "\"ProfilerStep#1\"",
    "\"cudaDeviceSynchronize\"",
];

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<Index>()).prop_map(|(e, k)| Edit::DropKey(e, k)),
        any::<Index>().prop_map(Edit::DuplicateEvent),
        any::<u64>().prop_map(Edit::Shuffle),
        (
            any::<Index>(),
            any::<Index>(),
            proptest::sample::select(ODD_VALUES)
        )
            .prop_map(|(e, k, v)| Edit::Replace(e, k, v)),
    ]
}

/// A change at the level of the bytes.
#[derive(Clone, Debug)]
enum ByteEdit {
    Truncate(Index),
    Flip(Index, u8),
    Insert(Index, u8),
    Delete(Index, usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        any::<Index>().prop_map(ByteEdit::Truncate),
        (any::<Index>(), 1u8..=255).prop_map(|(i, x)| ByteEdit::Flip(i, x)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        (any::<Index>(), 1usize..32).prop_map(|(i, n)| ByteEdit::Delete(i, n)),
    ]
}

fn apply_edit(events: &mut Vec<Value>, e: &Edit) {
    if events.is_empty() {
        return;
    }
    match e {
        Edit::DropKey(i, k) => {
            let at = i.index(events.len());
            if let Some(o) = events[at].as_object_mut()
                && !o.is_empty()
            {
                let key = o.keys().nth(k.index(o.len())).cloned().unwrap();
                o.remove(&key);
            }
        }
        Edit::DuplicateEvent(i) => {
            let at = i.index(events.len());
            let e = events[at].clone();
            events.insert(at, e);
        }
        Edit::Shuffle(seed) => {
            let mut x = seed | 1;
            for i in (1..events.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                events.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
        Edit::Replace(i, k, v) => {
            let new: Value = serde_json::from_str(v).unwrap_or(Value::Null);
            let raw_huge = v.starts_with("9999");
            let at = i.index(events.len());
            if let Some(o) = events[at].as_object_mut()
                && !o.is_empty()
            {
                let key = o.keys().nth(k.index(o.len())).cloned().unwrap();
                // Inside `args` half the time: the keys the graph builder uses live there.
                let target = match o.get_mut("args").and_then(Value::as_object_mut) {
                    Some(a) if !a.is_empty() && k.index(2) == 0 => {
                        let ak = a.keys().nth(k.index(a.len())).cloned().unwrap();
                        a.get_mut(&ak).unwrap()
                    }
                    _ => o.get_mut(&key).unwrap(),
                };
                *target = if raw_huge {
                    // serde_json cannot hold it as an integer: mark it, patched in the text.
                    Value::String("__HUGE__".into())
                } else {
                    new
                };
            }
        }
    }
}

fn apply_byte_edit(b: &mut Vec<u8>, e: &ByteEdit) {
    if b.is_empty() {
        return;
    }
    match *e {
        ByteEdit::Truncate(i) => b.truncate(i.index(b.len())),
        ByteEdit::Flip(i, x) => {
            let at = i.index(b.len());
            b[at] ^= x;
        }
        ByteEdit::Insert(i, x) => b.insert(i.index(b.len() + 1), x),
        ByteEdit::Delete(i, n) => {
            let at = i.index(b.len());
            b.drain(at..(at + n).min(b.len()));
        }
    }
}

/// Seed `seed` with the value edits applied (re-serialised), then the byte edit, then maybe gzip.
fn mutate(seed: usize, edits: &[Edit], bytes: Option<&ByteEdit>, gz: Option<&ByteEdit>) -> Vec<u8> {
    let (_, text) = &SEEDS[seed];
    let mut out = if edits.is_empty() {
        text.clone()
    } else {
        let mut doc: Value = serde_json::from_slice(text).expect("seeds are JSON");
        let events = match &mut doc {
            Value::Array(a) => a,
            Value::Object(o) => o
                .get_mut("traceEvents")
                .and_then(Value::as_array_mut)
                .expect("seeds have traceEvents"),
            _ => unreachable!("seeds are objects or arrays"),
        };
        for e in edits {
            apply_edit(events, e);
        }
        serde_json::to_string(&doc)
            .unwrap()
            .replace("\"__HUGE__\"", "99999999999999999999999")
            .into_bytes()
    };
    if let Some(e) = bytes {
        apply_byte_edit(&mut out, e);
    }
    if let Some(e) = gz {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&out).unwrap();
        out = enc.finish().unwrap();
        // Only cut / corrupt the compressed stream (past its 10-byte header half the time).
        apply_byte_edit(&mut out, e);
    }
    out
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(96)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Structural edits (keys dropped, events duplicated or shuffled, odd values), re-serialised.
    #[test]
    fn value_edits_never_panic(
        seed in any::<Index>(),
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let s = seed.index(SEEDS.len());
        check(&mutate(s, &edits, None, None))?;
    }

    /// Byte edits (cut, flipped, inserted, deleted), on the plain text or on its gzip stream.
    #[test]
    fn byte_edits_never_panic(
        seed in any::<Index>(),
        edit in byte_edit(),
        gz in any::<bool>(),
    ) {
        let s = seed.index(SEEDS.len());
        let bytes = if gz {
            mutate(s, &[], None, Some(&edit))
        } else {
            mutate(s, &[], Some(&edit), None)
        };
        check(&bytes)?;
    }

    /// Both: structural edits, then a byte edit.
    #[test]
    fn mixed_edits_never_panic(
        seed in any::<Index>(),
        edits in proptest::collection::vec(edit(), 1..3),
        edit in byte_edit(),
    ) {
        let s = seed.index(SEEDS.len());
        check(&mutate(s, &edits, Some(&edit), None))?;
    }
}

/// The fixtures replay as they are (so the fuzzer starts from inputs that go all the way).
#[test]
fn seeds_go_all_the_way() {
    for (name, text) in SEEDS.iter() {
        if name.starts_with("alexnet") {
            // No step markers: refused by design.
            let e = full_path(text).unwrap_err();
            assert!(e.contains("no iteration markers"), "{name}: {e}");
            continue;
        }
        if name == "toy_cuda_event_sync_multi_stream.json.gz" {
            let e = full_path(text).unwrap_err();
            assert!(e.contains("no iteration markers"), "{name}: {e}");
            continue;
        }
        full_path(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Every input the fuzzer ever crashed on, replayed through the whole path.
#[test]
fn fuzz_regressions() {
    let dir = fixtures().join("fuzz");
    let mut n = 0;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/kineto/fuzz")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        check(&bytes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

/// Every time field of every event of the fixtures set, one at a time, to the extremes an `i64` of
/// ns can hold (and a pair of opposite extremes on the step marker and one other event): the
/// arithmetic on times in the graph builder must not overflow.
#[test]
fn extreme_times_everywhere() {
    // Beyond the bounds the reader refuses; within them, the largest times it lets through.
    const EXTREMES: &[&str] = &["9.2e15", "-3e15", "3e15", "1e15"];
    // The committed fixtures and the smallest shared trace (all seeds with PROPTEST_CASES set).
    let all = std::env::var_os("PROPTEST_CASES").is_some();
    for (name, text) in SEEDS.iter().filter(|(n, _)| {
        n.ends_with(".json")
            || n == "toy_cuda_event_sync.json.gz"
            || all && !n.starts_with("alexnet")
    }) {
        let doc: Value = serde_json::from_slice(text).unwrap();
        let n = doc["traceEvents"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            for key in ["ts", "dur"] {
                for v in EXTREMES {
                    let mut d = doc.clone();
                    let e = &mut d["traceEvents"][i];
                    if e.get(key).is_none() {
                        continue;
                    }
                    e[key] = serde_json::from_str(v).unwrap();
                    let bytes = serde_json::to_vec(&d).unwrap();
                    check(&bytes).unwrap_or_else(|err| panic!("{name} event {i} {key}={v}: {err}"));
                    // The opposite extreme on the first event (the step marker in the fixtures).
                    let opposite = if v.starts_with('-') { "3e15" } else { "-3e15" };
                    d["traceEvents"][0]["ts"] = serde_json::from_str(opposite).unwrap();
                    let bytes = serde_json::to_vec(&d).unwrap();
                    check(&bytes).unwrap_or_else(|err| {
                        panic!("{name} event {i} {key}={v}, first ts={opposite}: {err}")
                    });
                }
            }
        }
    }
}

/// Two ranks of the DLRM job (when `../shared/traces` exists), the second one mutated, through the
/// multi-rank path: steps of every rank, the global graph, clock alignment, replay. No panic.
fn multi_rank_path(r0: &[u8], r1: &[u8]) -> Result<(), String> {
    use trainplan::trace::align::{AlignOptions, align};
    use trainplan::trace::multi::{collective_times, global_graph, rank_steps, replay_ranks};
    let a = parse_kineto(r0, "rank0.json").map_err(|e| e.to_string())?;
    let b = parse_kineto(r1, NAME).map_err(|e| e.to_string())?;
    let traces = [("rank0.json".to_string(), &a), (NAME.to_string(), &b)];
    let (ranks, _) = rank_steps(&traces, None).map_err(|e| e.to_string())?;
    let g = global_graph(&ranks).map_err(|e| e.to_string())?;
    let offsets = if g.matched.is_empty() {
        vec![0; ranks.len()]
    } else {
        align(&collective_times(&ranks), &AlignOptions::default())
            .map_err(|e| e.to_string())?
            .offsets_ns
    };
    let _ = replay_ranks(&ranks, &g, &offsets);
    Ok(())
}

static DLRM: LazyLock<Option<(Vec<u8>, Vec<u8>)>> = LazyLock::new(|| {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/multi-rank-dlrm");
    let read = |r: u32| std::fs::read(d.join(format!("rank{r}.kineto.json.gz"))).ok();
    Some((gunzip_if(read(0)?), gunzip_if(read(1)?)))
});

proptest! {
    // ~70 ms a case in a debug build: a twelfth of the cases of the other properties.
    #![proptest_config(ProptestConfig { cases: cases() / 12 + 1, ..config() })]

    /// One rank of two mutated (value edits, maybe a byte edit): the multi-rank path never panics.
    #[test]
    fn multi_rank_edits_never_panic(
        edits in proptest::collection::vec(edit(), 1..4),
        bytes in proptest::option::of(byte_edit()),
    ) {
        let Some((r0, r1)) = DLRM.as_ref() else {
            crate::skip_note!("skipping: ../shared/traces is absent");
            return Ok(());
        };
        let mut doc: Value = serde_json::from_slice(r1).unwrap();
        let events = doc["traceEvents"].as_array_mut().unwrap();
        for e in &edits {
            apply_edit(events, e);
        }
        let mut m = serde_json::to_string(&doc)
            .unwrap()
            .replace("\"__HUGE__\"", "99999999999999999999999")
            .into_bytes();
        if let Some(e) = &bytes {
            apply_byte_edit(&mut m, e);
        }
        let res = catch_unwind(AssertUnwindSafe(|| multi_rank_path(r0, &m)));
        if res.is_err() {
            let p = std::env::temp_dir().join("trainplan-fuzz-failures");
            std::fs::create_dir_all(&p).unwrap();
            let f = p.join("multi_rank_rank1.json");
            std::fs::write(&f, &m).unwrap();
            return Err(TestCaseError::fail(format!("panic; rank 1 saved to {}", f.display())));
        }
    }
}
