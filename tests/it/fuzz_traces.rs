//! Fuzzing the execution-trace readers: proptest mutates real files (truncations and byte
//! flips) and hand-made ones, and every reader must return either a trace or an error naming
//! the file — never panic. What is built from a trace that still parses (a Chakra job, host-ET
//! dependencies and collectives, the link to a Kineto trace) must not panic either. Inputs that
//! once crashed are kept below as plain regression tests.

use std::io::Read;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use trainplan::trace::{chakra, horovod, host_et, kineto, link};

fn shared(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces")
        .join(rel);
    if p.is_file() {
        Some(p)
    } else {
        crate::skip_note!("skipping {rel}: ../shared/traces is absent");
        None
    }
}

/// The first `limit` bytes of a file, gunzipped when it is gzip.
fn head(path: &Path, limit: usize) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(&raw[..])
            .take(limit as u64)
            .read_to_end(&mut out)
            .unwrap();
    } else {
        out = raw[..raw.len().min(limit)].to_vec();
    }
    out
}

/// A mutation: cut at a fraction of the length, then overwrite a few bytes.
fn mutation() -> impl Strategy<Value = (f64, Vec<(f64, u8)>)> {
    (
        0.0f64..=1.0,
        proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..6),
    )
}

fn mutate(base: &[u8], (cut, flips): &(f64, Vec<(f64, u8)>)) -> Vec<u8> {
    let mut v = base[..((base.len() as f64 * cut) as usize).min(base.len())].to_vec();
    for (at, b) in flips {
        if !v.is_empty() {
            let i = ((v.len() as f64 * at) as usize).min(v.len() - 1);
            v[i] = *b;
        }
    }
    v
}

fn check_chakra(bytes: &[u8]) {
    match chakra::parse_chakra(bytes, "fuzz.et") {
        Ok(t) => {
            let _ = chakra::build_job(&t, "fuzz.et").map(|j| {
                let g = j.job.local_dfg().unwrap();
                trainplan::replay::replay(&g)
            });
        }
        Err(e) => assert!(e.to_string().contains("fuzz.et"), "{e}"),
    }
}

fn check_host_et(bytes: &[u8]) {
    match host_et::parse_host_et(bytes, "fuzz_et.json") {
        Ok(et) => {
            let _ = et.data_deps();
            let _ = et.comm_calls();
        }
        Err(e) => assert!(e.to_string().contains("fuzz_et.json"), "{e}"),
    }
}

fn check_horovod(bytes: &[u8]) {
    match kineto::parse_kineto(bytes, "fuzz_hvd.json") {
        Ok(t) => {
            let _ = horovod::from_events(&t, "fuzz_hvd.json");
        }
        Err(e) => assert!(e.to_string().contains("fuzz_hvd.json"), "{e}"),
    }
}

proptest! {
    // 48 cases per property by default; TRAINPLAN_FUZZ_CASES=N for a longer run.
    #![proptest_config(ProptestConfig { cases: fuzz_cases(), ..ProptestConfig::default() })]

    #[test]
    fn chakra_hand_made_never_panics(m in mutation()) {
        check_chakra(&mutate(&crate::exec_traces::tiny_stream(), &m));
    }

    #[test]
    fn chakra_real_never_panics(m in mutation()) {
        // The metadata and the first ~100 nodes.
        if let Some(p) = shared("execution-traces/resnet_ddp_rank0.chakra.et") {
            check_chakra(&mutate(&head(&p, 96 << 10), &m));
        }
    }

    #[test]
    fn host_et_real_never_panics(m in mutation(), which in 0usize..3) {
        let rel = ["execution-traces/simple_add.host_et.json.gz",
                   "multi-rank-dlrm/rank0.execution_trace.json.gz",
                   "execution-traces/resnet_ddp_2gpu.host_et.json.gz"][which];
        if let Some(p) = shared(rel) {
            check_host_et(&mutate(&head(&p, 256 << 10), &m));
            // The compressed bytes too: gzip errors and truncations.
            check_host_et(&mutate(&std::fs::read(&p).unwrap()[..4096.min(std::fs::metadata(&p).unwrap().len() as usize)], &m));
        }
    }

    #[test]
    fn horovod_fixture_never_panics(m in mutation()) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/horovod_timeline.json");
        check_horovod(&mutate(&std::fs::read(p).unwrap(), &m));
    }

    #[test]
    fn link_with_mutated_host_et_never_panics(m in mutation()) {
        if let (Some(k), Some(e)) = (shared("multi-rank-dlrm/rank0.kineto.json.gz"),
                                     shared("multi-rank-dlrm/rank0.execution_trace.json.gz")) {
            let k = kineto_cached(&k);
            if let Ok(et) = host_et::parse_host_et(&mutate(&head(&e, 1 << 30), &m)[..], "e.json") {
                let _ = link::collective_sizes(&k, Some(&et));
            }
        }
    }
}

fn fuzz_cases() -> u32 {
    std::env::var("TRAINPLAN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

fn kineto_cached(p: &Path) -> kineto::KinetoTrace {
    use std::sync::OnceLock;
    static K: OnceLock<kineto::KinetoTrace> = OnceLock::new();
    K.get_or_init(|| kineto::read_kineto(p).unwrap()).clone()
}
