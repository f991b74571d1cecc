//! One rank alone: its collectives wait for peers that are not in the graph.
//!
//! A collective kernel ends when its last rank arrives, so a rank's recorded kernel time is
//! the wait for its peers plus the transfer. Replaying the rank alone with the recorded
//! durations is right only while each kernel starts when it did; when the graph lets one start
//! earlier (a dependency the trace does not record, such as a stream wait without its record),
//! it also ends earlier — and everything after it. Measured on a held-out 16-rank DLRM rank
//! with 80 `SendRecv`: −5.7 %.
//!
//! Here each collective's duration is re-derived so that the rank's replay as recorded ends it
//! when it ended: `max(transfer, recorded end − replayed start)`, where `transfer` is the shortest
//! recorded duration of a kernel of the same name in the step (the one that waited least). The
//! replay is repeated until no duration moves by more than 1 µs (a later collective's start
//! depends on the earlier ones'), at most 10 times. The peers are thereby taken to arrive, in
//! every what-if, as late *relative to this rank* as they did in the recording: a pass that
//! speeds the rank up speeds its peers up alike (every rank runs the same job), and a rank that
//! arrives later than recorded waits less, down to the transfer alone.
//!
//! A trace of world size 1 has no peers: nothing changes.

use std::collections::BTreeMap;

use super::step::TraceJob;

/// Most replays spent re-deriving the durations.
const ROUNDS: usize = 10;
/// A duration that moves by less than this is settled, ns.
const SETTLED_NS: i64 = 1_000;

/// Re-derive the collectives' durations when `absent` (see the module docs), and the
/// durations of `resumes` — ops that end a wait for another thread of the rank (op, recorded end
/// in ns from the step's start), which get no floor. Returns how many collectives changed.
pub fn calibrate(tj: &mut TraceJob, absent: bool, resumes: &[(crate::graph::OpId, i64)]) -> usize {
    let world = tj
        .job
        .meta
        .trace
        .as_ref()
        .and_then(|f| f.world_size)
        .unwrap_or(2);
    let lo = tj.window.start_ns;
    let mut transfer: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &tj.collectives {
        let t = transfer.entry(c.name.as_str()).or_insert(c.dur_ns);
        *t = (*t).min(c.dur_ns);
    }
    let mut targets: Vec<(usize, i64, u64)> = Vec::new();
    if absent && world > 1 {
        targets.extend(tj.collectives.iter().map(|c| {
            (
                c.op as usize,
                c.start_ns - lo + c.dur_ns as i64,
                transfer[c.name.as_str()],
            )
        }));
    }
    targets.extend(resumes.iter().map(|&(op, end)| (op as usize, end, 0)));
    settle(&mut tj.job, &targets);
    tj.collectives
        .iter()
        .filter(|c| tj.job.local.ops[c.op as usize].spec.dur_ns != c.dur_ns)
        .count()
}

/// Set each target op's duration to `max(floor, recorded end − replayed start)`, replaying
/// until no duration moves by more than [`SETTLED_NS`] (at most [`ROUNDS`] replays): the job
/// replayed as recorded then ends each target when it ended.
pub(crate) fn settle(job: &mut crate::graph::job::Job, targets: &[(usize, i64, u64)]) {
    if targets.is_empty() {
        return;
    }
    for _ in 0..ROUNDS {
        let Ok(g) = job.expand() else {
            break;
        };
        let r = crate::replay::replay(&g);
        let mut moved = 0;
        for &(op, end, x) in targets {
            let need = end - r.start_ns[op] as i64;
            let new = (need.max(0) as u64).max(x);
            let cur = &mut job.local_mut().ops[op].spec.dur_ns;
            if (new as i64 - *cur as i64).abs() > SETTLED_NS {
                *cur = new;
                moved += 1;
            }
        }
        if moved == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::graph::tests::{doc, kernel, parse, x};
    use super::super::graph::{Peers, build};
    use crate::replay::replay;

    /// Step 0–100 µs of rank 0 of 2: k1 [10, 30) on stream 7, then a SendRecv launched at 12
    /// on stream 9 that started at 30 (it waited for k1 through a stream wait the trace does not
    /// record) and ended at 70 (its peer arrived late); the step synchronises at 70–80.
    fn trace() -> String {
        let v = vec![
            x("user_annotation", "ProfilerStep#1", 1, 0, 100, None),
            x("cuda_runtime", "cudaLaunchKernel", 1, 5, 3, Some(1)),
            kernel("k1", 7, 10, 20, 1, 5),
            x("cuda_runtime", "cudaLaunchKernel", 1, 12, 3, Some(2)),
            kernel("ncclKernel_SendRecv_RING_LL_Sum_float", 9, 30, 40, 2, 12),
            x("cuda_runtime", "cudaDeviceSynchronize", 1, 60, 20, Some(3)),
        ];
        let mut d = doc(&v);
        d.insert_str(1, r#""distributedInfo":{"rank":0,"world_size":2},"#);
        d
    }

    #[test]
    fn an_absent_peer_keeps_the_collective_s_recorded_end() {
        let t = parse(&trace());
        // Without the peer model: the SendRecv starts at 15 (after its launch) and ends at 55,
        // so the synchronize (issued at 60) returns at 70 and the step ends at 90 — 10 % early.
        let plain = build(&t, "t", None, Peers::Present).unwrap();
        let r = replay(&plain.job.expand().unwrap());
        assert_eq!(r.end_ns[plain.step_end as usize], 90_000);
        // With it: the SendRecv ends at 70 as recorded (55 µs from its replayed start), and the
        // step at 100.
        let alone = build(&t, "t", None, Peers::Absent).unwrap();
        assert_eq!(alone.peer_waits, 1);
        let r = replay(&alone.job.expand().unwrap());
        assert_eq!(r.end_ns[alone.step_end as usize], 100_000);
        let op = alone.collectives[0].op as usize;
        assert_eq!(r.end_ns[op], 70_000);
        assert_eq!(alone.job.local.ops[op].spec.dur_ns, 55_000);
    }
}
