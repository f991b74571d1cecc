//! Export of a replayed timeline as a Chrome trace (JSON object format) that opens in Perfetto
//! and `chrome://tracing`: one process per worker (plus one for the network and servers), one
//! track (thread) per device, one complete (`"ph": "X"`) event per op named by its layer or
//! tensor, phase and kind. Virtual ops are left out.
//!
//! The writer streams to any `Write`; the caller owns the file (and writes it atomically).

use std::io::{self, Write};

use serde_json::json;

use crate::graph::{DeviceKind, Dfg, OpId};

use super::Replay;

/// Process id of a device's track group: workers are 1…n, shared network and servers 0.
fn pid(d: DeviceKind) -> u64 {
    match d {
        DeviceKind::GpuStream { worker, .. }
        | DeviceKind::CpuThread { worker, .. }
        | DeviceKind::CommStream { worker } => worker as u64 + 1,
        _ => 0,
    }
}

/// Write the timeline; `ts`/`dur` are µs with ns precision.
pub fn write_chrome_trace<W: Write>(g: &Dfg, r: &Replay, out: W) -> io::Result<()> {
    let mut w = io::BufWriter::with_capacity(1 << 20, out);
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut first = true;
    let mut sep = |w: &mut io::BufWriter<W>| -> io::Result<()> {
        if !first {
            w.write_all(b",\n")?;
        }
        first = false;
        Ok(())
    };
    let mut named = std::collections::BTreeSet::new();
    for (d, &kind) in g.devices().iter().enumerate() {
        if kind == DeviceKind::Virtual {
            continue;
        }
        let p = pid(kind);
        if named.insert(p) {
            let name = if p == 0 {
                "network and servers".to_string()
            } else {
                format!("worker {}", p - 1)
            };
            sep(&mut w)?;
            serde_json::to_writer(
                &mut w,
                &json!({"ph": "M", "name": "process_name", "pid": p, "args": {"name": name}}),
            )?;
        }
        sep(&mut w)?;
        serde_json::to_writer(
            &mut w,
            &json!({"ph": "M", "name": "thread_name", "pid": p, "tid": d, "args": {"name": kind.to_string()}}),
        )?;
        sep(&mut w)?;
        serde_json::to_writer(
            &mut w,
            &json!({"ph": "M", "name": "thread_sort_index", "pid": p, "tid": d, "args": {"sort_index": d}}),
        )?;
    }
    for op in 0..g.op_count() as OpId {
        if g.kind(op).is_virtual() {
            continue;
        }
        let d = g.device(op);
        let i = op as usize;
        sep(&mut w)?;
        serde_json::to_writer(
            &mut w,
            &json!({
                "ph": "X",
                "name": g.op_label(op).split(" @").next().unwrap_or(""),
                "cat": g.kind(op),
                "pid": pid(g.device_kind(d)),
                "tid": d,
                "ts": r.start_ns[i] as f64 / 1e3,
                "dur": (r.end_ns[i] - r.start_ns[i]) as f64 / 1e3,
                "args": {"op": op, "phase": g.phase(op)},
            }),
        )?;
    }
    w.write_all(b"\n]}\n")?;
    w.flush()
}
