//! `trainplan replay --trace FILE.et`: Chakra execution traces end to end — a hand-made stream
//! replayed exactly, the real ResNet DDP trace, and broken files refused with exit 3.

use std::path::Path;

use prost::Message;
use trainplan::trace::chakra::{AttrValue, AttributeProto, GlobalMetadata, Node, NodeType};

use crate::support::{check_bad_input, run, run_json, write_tmp};

fn attr(name: &str, value: AttrValue) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        doc_string: String::new(),
        value: Some(value),
    }
}

/// A CPU op (10 µs) feeding a GPU kernel (100 µs), as a Chakra byte stream.
pub(crate) fn tiny_stream() -> Vec<u8> {
    let meta = GlobalMetadata {
        version: String::new(),
        attr: vec![attr("schema", AttrValue::String("1.0.1".into()))],
    };
    let node = |id: u64, cpu: bool, dur: u64, deps: Vec<u64>| Node {
        id,
        name: format!("op{id}"),
        r#type: NodeType::Comp as i32,
        data_deps: deps,
        duration_micros: dur,
        attr: vec![attr("is_cpu_op", AttrValue::Bool(cpu))],
        ..Default::default()
    };
    let mut out = Vec::new();
    meta.encode_length_delimited(&mut out).unwrap();
    for n in [node(1, true, 10, vec![]), node(2, false, 100, vec![1])] {
        n.encode_length_delimited(&mut out).unwrap();
    }
    out
}

#[test]
fn tiny_chakra_replays_exactly() {
    let p = write_tmp("tiny.et", &tiny_stream());
    let v = run_json(&["replay", "--trace", p.to_str().unwrap()]);
    assert_eq!(v["iteration_ms"].as_f64(), Some(0.11));
    assert!(v["measured_iteration_ms"].is_null() && v["error_pct"].is_null());
    assert_eq!(
        (v["ops"].as_u64(), v["workers"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(v["critical_path_ms"].as_f64(), Some(0.11));
    assert_eq!(v["format"], "chakra");
    let (code, out, err) = run(&["replay", "--trace", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Chakra execution trace") && out.contains("n/a"),
        "{out}"
    );
}

#[test]
fn broken_chakra_exits_3() {
    let bytes = tiny_stream();
    let cut = write_tmp("cut.et", &bytes[..bytes.len() - 4]);
    let msg = check_bad_input(&["replay", "--trace", cut.to_str().unwrap()], "truncated");
    assert!(msg.contains("cut.et") && msg.contains("message 2"), "{msg}");
    let empty = write_tmp("empty.et", b"");
    let msg = check_bad_input(&["replay", "--trace", empty.to_str().unwrap()], "empty");
    assert!(msg.contains("empty.et"), "{msg}");
}

#[test]
fn real_resnet_chakra() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces/execution-traces/resnet_ddp_rank0.chakra.et");
    if !p.is_file() {
        crate::skip_note!("skipping: ../shared/traces is absent (the real Chakra replay needs it)");
        return;
    }
    let v = run_json(&["replay", "--trace", p.to_str().unwrap()]);
    assert!(v["measured_iteration_ms"].is_null() && v["error_pct"].is_null());
    assert_eq!(
        (v["ops"].as_u64(), v["nodes"].as_u64()),
        (Some(3664), Some(3664))
    );
    assert_eq!(v["gpu_collectives"].as_u64(), Some(7));
    // Sum of comm_size over the 7 GPU collectives (python3).
    assert_eq!(v["collective_bytes"].as_u64(), Some(102_441_032));
    assert_eq!(v["critical_path_ms"].as_f64(), Some(82.269));
    // The GPU compute stream's kernels alone take 292.828 ms (sum of durations, python3): the
    // replay can be no shorter.
    assert!(v["iteration_ms"].as_f64().unwrap() >= 292.828, "{v}");
}

/// One rank → n on the DLRM trace, whose kernels carry no sizes: the sizes come from the host
/// execution trace beside it (`rank0.execution_trace.json.gz`).
#[test]
fn dlrm_rank_to_cluster_takes_sizes_from_the_execution_trace() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces/multi-rank-dlrm/rank0.kineto.json.gz");
    if !p.is_file() {
        crate::skip_note!("skipping: ../shared/traces is absent (the DLRM traces are needed)");
        return;
    }
    let v = run_json(&[
        "replay",
        "--trace",
        p.to_str().unwrap(),
        "--cluster",
        "8xh200",
    ]);
    let list = v["extrapolation"]["collectives"].as_array().unwrap();
    let got: Vec<(u64, &str)> = list
        .iter()
        .map(|c| {
            (
                c["bytes"].as_u64().unwrap(),
                c["size_from"].as_str().unwrap(),
            )
        })
        .collect();
    let send = [24576, 192, 1536, 13568, 1576964, 24576, 448, 907840];
    assert_eq!(
        got,
        send.iter()
            .map(|&b| (b, "execution trace"))
            .collect::<Vec<_>>()
    );
}
