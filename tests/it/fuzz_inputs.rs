//! Fuzz targets for the parsers the trace fuzzers do not cover (issue 14): GPU, network and
//! cluster configs, declarative pass files, plans (and every emitter on whatever plan parses),
//! the performance database and nccl-tests tables. Each property mutates a real seed — byte
//! flips, cuts, splices of hostile fragments (huge and tiny numbers, NaN, control characters,
//! YAML anchors and deep nesting, quotes) — and checks that the parser never panics, that an
//! error names the file, and that what it accepts is in range (a config's rates, a plan's
//! files printable and inert). Bounded: `TRAINPLAN_FUZZ_CASES` cases per target (default 48,
//! a few seconds in all), so CI runs them every time.

use proptest::prelude::*;
use proptest::sample::Index;

use trainplan::cost::config::{BUILTIN, MIN_RATE, parse_cluster, parse_gpu, parse_network};
use trainplan::lowerbound::PerfDb;
use trainplan::plan::Plan;
use trainplan::plan::emit::{Framework, emit};

fn cases() -> u32 {
    std::env::var("TRAINPLAN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

/// Pieces spliced into the seeds.
const FRAGMENTS: [&str; 16] = [
    "1e308",
    "1e-320",
    "-1",
    ".nan",
    ".inf",
    "0",
    "\u{0}",
    "\u{1b}[2J",
    "\r\n",
    "\"\"\"",
    "&a [*a, *a, *a, *a]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    "{x: {y: {z: {w: 1}}}}",
    "'",
    "$(touch PWNED)",
    "18446744073709551616",
];

#[derive(Clone, Debug)]
enum Edit {
    Flip(Index, u8),
    Cut(Index),
    Splice(Index, usize),
    /// Replace the value after a `key:` (or `"key":`) with a fragment.
    Value(Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        any::<Index>().prop_map(Edit::Cut),
        (any::<Index>(), 0..FRAGMENTS.len()).prop_map(|(i, f)| Edit::Splice(i, f)),
        (any::<Index>(), 0..FRAGMENTS.len()).prop_map(|(i, f)| Edit::Value(i, f)),
    ]
}

/// `seed` with `edits` applied (bytes, then lossily back to text: the parsers take `&str`).
fn mutate(seed: &str, edits: &[Edit]) -> String {
    let mut b = seed.as_bytes().to_vec();
    for e in edits {
        if b.is_empty() {
            break;
        }
        match e {
            Edit::Flip(i, x) => {
                let k = i.index(b.len());
                b[k] = *x;
            }
            Edit::Cut(i) => b.truncate(i.index(b.len())),
            Edit::Splice(i, f) => {
                let k = i.index(b.len());
                b.splice(k..k, FRAGMENTS[*f].bytes());
            }
            Edit::Value(i, f) => {
                let text = String::from_utf8_lossy(&b).into_owned();
                let colons: Vec<usize> = text.match_indices(": ").map(|(k, _)| k).collect();
                if colons.is_empty() {
                    continue;
                }
                let at = colons[i.index(colons.len())] + 2;
                let end = text[at..]
                    .find(['\n', ',', '}'])
                    .map_or(text.len(), |e| at + e);
                b = format!("{}{}{}", &text[..at], FRAGMENTS[*f], &text[end..]).into_bytes();
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn builtin(prefix: &str) -> Vec<&'static str> {
    BUILTIN
        .iter()
        .filter(|(p, _)| p.starts_with(prefix))
        .map(|(_, t)| *t)
        .collect()
}

fn pick<'a>(v: &[&'a str], i: &Index) -> &'a str {
    v[i.index(v.len())]
}

/// A plan with some of everything, as YAML (the seed of the plan target).
fn plan_seed() -> String {
    // The plan the binary writes, read back from a scratch file.
    let d = std::env::temp_dir().join(format!("trainplan-fuzz-plan-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("p.yaml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_trainplan"))
        .args([
            "plan",
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "8xh200",
        ])
        .args(["--max-rounds", "100", "-o"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = std::fs::read_to_string(&p).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    text
}

fn plan_text() -> &'static str {
    use std::sync::OnceLock;
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(plan_seed)
}

const DB: &str = r#"{"version": 1, "entries": [
  {"gpu": "v100-32gb", "dtype": "fp32", "layer": "Conv[k=3](1x3x224x224)->1x64x112x112", "implementation": "roofline", "source": "analytic", "ms": 0.0123, "flops": 1.8e9, "bytes": 1.2e6},
  {"gpu": "v100-32gb", "dtype": "fp16", "layer": "Relu(1x64)->1x64", "implementation": "cudnn", "source": "measured", "ms": 0.002}]}"#;

const NCCL: &str = "size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n\
                    1048576,262144,float,79930,22.96,78610,23.34\n\
                    2097152,524288,float,101300,36.22,101000,36.33\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// GPU, network and cluster files: an error names the file; what is accepted is in range.
    #[test]
    fn configs(which in 0usize..3, seed in any::<Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        match which {
            0 => {
                let t = mutate(pick(&builtin("gpus/"), &seed), &edits);
                match parse_gpu(&t, "g.yaml") {
                    Ok(g) => {
                        for v in g.matrix_tflops.values().chain(g.vector_tflops.values())
                            .chain([&g.memory_gbps, &g.memory_gib])
                        {
                            prop_assert!(v.is_finite() && *v >= MIN_RATE, "{v} accepted:\n{t}");
                        }
                    }
                    Err(e) => prop_assert!(e.to_string().starts_with("g.yaml"), "{e}"),
                }
            }
            1 => {
                let t = mutate(pick(&builtin("networks/"), &seed), &edits);
                match parse_network(&t, "n.yaml") {
                    Ok(n) => prop_assert!(
                        n.line_rate_gbit_s >= MIN_RATE && n.efficiency >= MIN_RATE && n.efficiency <= 1.0,
                        "{n:?} accepted:\n{t}"
                    ),
                    Err(e) => prop_assert!(e.to_string().starts_with("n.yaml"), "{e}"),
                }
            }
            _ => {
                let t = mutate(pick(&builtin("clusters/"), &seed), &edits);
                match parse_cluster(&t, "c.yaml", None) {
                    Ok(c) => prop_assert!(c.workers() >= 1 && c.workers() <= trainplan::limits::MAX_WORKERS),
                    Err(e) => prop_assert!(e.to_string().contains("c.yaml") || e.to_string().starts_with("unknown"), "{e}"),
                }
            }
        }
    }

    /// Declarative pass files: an error names the file; an accepted pass proposes without panic.
    #[test]
    fn pass_files(seed in any::<Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let files: Vec<&str> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/passes"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "yaml"))
            .map(|e| &*Box::leak(std::fs::read_to_string(e.path()).unwrap().into_boxed_str()))
            .collect();
        let t = mutate(pick(&files, &seed), &edits);
        if let Err(e) = trainplan::passes::declarative::parse(&t, "p.yaml") {
            prop_assert!(e.to_string().contains("p.yaml"), "{e}");
        }
    }

    /// Plans: an error names the file; what is accepted is in the planner's ranges (issue 20,
    /// class 5: times positive and finite, k and ranks in range, the Horovod fusion buffer
    /// holding the largest group as summed without overflow); every emitter runs on it, and its
    /// files hold no control character (the hostile-export tests import and source them).
    #[test]
    fn plans_and_emitters(edits in prop::collection::vec(edit(), 1..4)) {
        let t = mutate(plan_text(), &edits);
        match Plan::from_yaml(&t, "plan.yaml") {
            Ok(plan) => {
                let p = &plan.predicted;
                for ms in [p.baseline.iteration_ms, p.planned.iteration_ms] {
                    prop_assert!(ms.is_finite() && ms > 0.0, "{ms}");
                }
                prop_assert!(p.speedup.is_finite() && p.speedup > 0.0);
                prop_assert!(plan.workload.ranks >= 1);
                prop_assert!((1..=1024).contains(&plan.config.grad_accumulation));
                let c = &plan.config;
                let sums: Option<Vec<u128>> = c
                    .tensor_groups
                    .iter()
                    .map(|g| g.iter().map(|t| c.tensor_bytes.get(t).map(|&b| u128::from(b))).sum())
                    .collect();
                if let (Some(largest), Ok(e)) = (
                    sums.and_then(|v| v.into_iter().max()),
                    emit(&plan, Framework::Horovod),
                ) {
                    let env = &e.files.iter().find(|(n, _)| n == "horovod.env").unwrap().1;
                    let threshold: u128 = env
                        .lines()
                        .find_map(|l| l.strip_prefix("HOROVOD_FUSION_THRESHOLD="))
                        .unwrap()
                        .parse()
                        .unwrap();
                    prop_assert!(threshold > 0 && threshold >= largest, "{threshold} < {largest}");
                }
                for fw in Framework::ALL {
                    if let Ok(e) = emit(&plan, fw) {
                        for (name, text) in &e.files {
                            prop_assert!(
                                !text.chars().any(|c| c.is_control() && c != '\n'),
                                "{fw}/{name}"
                            );
                        }
                    }
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("plan.yaml"), "{e}"),
        }
    }

    /// The performance database and nccl-tests tables.
    #[test]
    fn database_and_nccl_tables(which in any::<bool>(), edits in prop::collection::vec(edit(), 1..4)) {
        if which {
            let t = mutate(DB, &edits);
            if let Err(e) = PerfDb::parse(&t, "db.json") {
                prop_assert!(e.to_string().contains("db.json"), "{e}");
            }
        } else {
            let t = mutate(NCCL, &edits);
            if let Ok(rows) = trainplan::cost::comm::parse_nccl_tests_lut(&t) {
                for r in rows {
                    prop_assert!(r.time_ns.is_finite() && r.time_ns > 0.0, "{r:?}");
                }
            }
        }
    }
}
