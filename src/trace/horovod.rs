//! Horovod timelines (`HOROVOD_TIMELINE=file.json`, written by rank 0 for all ranks): a Chrome
//! trace event array in which every *tensor* is a process (`pid`, named by a `process_name`
//! metadata event), and its life is a nest of `B`/`E` spans:
//!
//! ```text
//! NEGOTIATE_ALLREDUCE [ X "0"  X "1" ... one zero-length tick per rank that reported ready ]
//! ALLREDUCE [ QUEUE ][ MEMCPY_IN_FUSION_BUFFER ][ NCCL_ALLREDUCE ][ MEMCPY_OUT_FUSION_BUFFER ]  E{dtype, shape}
//! ```
//!
//! The top-level span's `E` carries `dtype` (`HOROVOD_FLOAT32`, ...) and `shape` (`[1024, 512]`),
//! from which the size. `CYCLE_START` instants mark Horovod's background cycles. Timelines of
//! older Horovod versions, and of runs killed while writing, lack the closing `]`; the streamed
//! Kineto reader (which this module uses) accepts that with a warning.
//!
//! What is built: per tensor, its operations with their negotiation span and rank-ready ticks,
//! their top-level span, their activities in order, dtype, shape and bytes. Not built (yet): a
//! [`crate::graph::job::Job`] — a timeline has no compute ops, so a replayable job needs the
//! framework's own trace beside it.

use std::collections::BTreeMap;
use std::path::Path;

use super::TraceError;
use super::host_et::dtype_bytes;
use super::kineto::{Event, Id, KinetoTrace, Phase, read_kineto};

/// A time span, integer ns on the timeline's clock (µs since Horovod started, × 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start_ns: i64,
    pub end_ns: i64,
}

impl Span {
    pub fn dur_ns(&self) -> i64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// One collective operation on one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct HvdOp {
    /// `ALLREDUCE`, `ALLGATHER`, `BROADCAST`, ... (the top-level span's name).
    pub kind: String,
    /// The `NEGOTIATE_*` span before it, if recorded.
    pub negotiate: Option<Span>,
    /// (rank, time) of each rank's ready tick during negotiation.
    pub ready: Vec<(u32, i64)>,
    pub span: Span,
    /// Sub-phases in order (`QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, `NCCL_ALLREDUCE`, ...).
    pub activities: Vec<(String, Span)>,
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    /// Elements × dtype size, when both are known.
    pub bytes: Option<u64>,
}

/// One tensor (one `pid` of the timeline).
#[derive(Clone, Debug, PartialEq)]
pub struct HvdTensor {
    pub pid: i64,
    pub name: String,
    pub ops: Vec<HvdOp>,
}

/// A parsed Horovod timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HorovodTimeline {
    /// Tensors by pid.
    pub tensors: Vec<HvdTensor>,
    /// `CYCLE_START` markers.
    pub cycle_starts_ns: Vec<i64>,
    /// Ignorable oddities (unclosed spans at the end, an `E` without a `B`, no closing `]`).
    pub warnings: Vec<String>,
}

/// Reads a Horovod timeline file (`.json` or gzip; a missing final `]` is tolerated).
pub fn read_horovod(path: &Path) -> Result<HorovodTimeline, TraceError> {
    let t = read_kineto(path)?;
    Ok(from_events(&t, &path.display().to_string()))
}

/// `[1024, 512]` / `[1024,512]` / `[]` → dims.
fn parse_shape(s: &str) -> Option<Vec<u64>> {
    let t = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    if t.trim().is_empty() {
        return Some(Vec::new());
    }
    t.split(',').map(|x| x.trim().parse().ok()).collect()
}

#[derive(Default)]
struct Open {
    /// Open B spans: (name, start).
    stack: Vec<(String, i64)>,
    negotiate: Option<Span>,
    ready: Vec<(u32, i64)>,
    activities: Vec<(String, Span)>,
}

/// Groups a timeline's events (already read) per tensor; `name` is used in warnings.
pub fn from_events(t: &KinetoTrace, name: &str) -> HorovodTimeline {
    let mut out = HorovodTimeline {
        warnings: t.warnings.clone(),
        ..Default::default()
    };
    let mut names: BTreeMap<i64, String> = BTreeMap::new();
    let mut ops: BTreeMap<i64, Vec<HvdOp>> = BTreeMap::new();
    let mut open: BTreeMap<i64, Open> = BTreeMap::new();
    let mut stray_ends = 0usize;
    for (i, e) in t.events.iter().enumerate() {
        let Event { ph, pid, .. } = e;
        if *ph == Phase::Instant && &*e.name == "CYCLE_START" {
            out.cycle_starts_ns.push(e.ts_ns);
            continue;
        }
        let Id::Num(pid) = pid else { continue };
        match ph {
            Phase::Metadata if &*e.name == "process_name" => {
                if let Some(n) = &e.args.name {
                    names.insert(*pid, n.clone());
                }
            }
            Phase::Begin => open
                .entry(*pid)
                .or_default()
                .stack
                .push((e.name.to_string(), e.ts_ns)),
            Phase::Complete => {
                // A rank's ready tick during negotiation.
                let o = open.entry(*pid).or_default();
                let negotiating = o
                    .stack
                    .last()
                    .is_some_and(|(n, _)| n.starts_with("NEGOTIATE_"));
                if let (true, Ok(rank)) = (negotiating, e.name.trim().parse::<u32>()) {
                    o.ready.push((rank, e.ts_ns));
                }
            }
            Phase::End => {
                let o = open.entry(*pid).or_default();
                let Some((span_name, start)) = o.stack.pop() else {
                    stray_ends += 1;
                    tracing::debug!(event = i, pid, "Horovod timeline: E without B");
                    continue;
                };
                let span = Span {
                    start_ns: start,
                    end_ns: e.ts_ns,
                };
                if span_name.starts_with("NEGOTIATE_") {
                    o.negotiate = Some(span);
                } else if !o.stack.is_empty() {
                    o.activities.push((span_name, span));
                } else {
                    let dtype = e.args.dtype.clone();
                    let shape = e.args.shape.as_deref().and_then(parse_shape);
                    let size = dtype
                        .as_deref()
                        .and_then(|d| dtype_bytes(d.trim_start_matches("HOROVOD_")));
                    let bytes = match (&shape, size) {
                        (Some(s), Some(b)) => s.iter().try_fold(b, |acc, d| acc.checked_mul(*d)),
                        _ => None,
                    };
                    ops.entry(*pid).or_default().push(HvdOp {
                        kind: span_name,
                        negotiate: o.negotiate.take(),
                        ready: std::mem::take(&mut o.ready),
                        span,
                        activities: std::mem::take(&mut o.activities),
                        dtype,
                        shape,
                        bytes,
                    });
                }
            }
            _ => {}
        }
    }
    if stray_ends > 0 {
        out.warnings.push(format!(
            "{name}: {stray_ends} end (E) events had no open span on their tensor; ignored"
        ));
    }
    let unclosed: usize = open.values().map(|o| o.stack.len()).sum();
    if unclosed > 0 {
        out.warnings.push(format!(
            "{name}: {unclosed} spans are still open at the end of the timeline (it was cut \
             while the job ran); their operations are left out"
        ));
    }
    let pids: std::collections::BTreeSet<i64> = names
        .keys()
        .chain(ops.keys())
        .copied()
        .filter(|&p| p != 0 || ops.contains_key(&p))
        .collect();
    for pid in pids {
        out.tensors.push(HvdTensor {
            pid,
            name: names.get(&pid).cloned().unwrap_or_default(),
            ops: ops.remove(&pid).unwrap_or_default(),
        });
    }
    for w in &out.warnings {
        tracing::warn!("{w}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/horovod_timeline.json")
    }

    #[test]
    fn hand_made_timeline() {
        let t = read_horovod(&fixture()).unwrap();
        let names: Vec<&str> = t.tensors.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "DistributedSGD_Allreduce/grad_dense_kernel_0",
                "DistributedSGD_Allreduce/grad_dense_bias_0"
            ]
        );
        assert_eq!(t.cycle_starts_ns, vec![1_050_000, 1_450_000]);
        let op = &t.tensors[0].ops[0];
        assert_eq!(t.tensors[0].ops.len(), 1);
        assert_eq!(op.kind, "ALLREDUCE");
        assert_eq!(
            op.negotiate,
            Some(Span {
                start_ns: 1_000_000,
                end_ns: 1_041_000
            })
        );
        assert_eq!(op.ready, vec![(0, 1_002_000), (1, 1_040_000)]);
        assert_eq!((op.span.start_ns, op.span.end_ns), (1_060_000, 1_401_000));
        let acts: Vec<(&str, i64)> = op
            .activities
            .iter()
            .map(|(n, s)| (n.as_str(), s.dur_ns()))
            .collect();
        assert_eq!(
            acts,
            [
                ("QUEUE", 9_000),
                ("MEMCPY_IN_FUSION_BUFFER", 15_000),
                ("NCCL_ALLREDUCE", 300_000),
                ("MEMCPY_OUT_FUSION_BUFFER", 15_000)
            ]
        );
        assert_eq!(op.shape, Some(vec![1024, 512]));
        assert_eq!(op.bytes, Some(1024 * 512 * 4));
        assert_eq!(t.tensors[1].ops[0].bytes, Some(512 * 4));
        // No closing `]`, and the last negotiation is still open.
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        assert!(t.warnings[0].contains("not closed"), "{:?}", t.warnings);
        assert!(t.warnings[1].contains("1 spans are still open"));
    }

    #[test]
    fn broken_timelines() {
        use super::super::kineto::parse_kineto;
        let text = std::fs::read_to_string(fixture()).unwrap();
        // Cut inside an event: the complete events are kept, and the cut spans reported.
        let cut = &text[..text.find("MEMCPY_IN").unwrap()];
        let t = from_events(
            &parse_kineto(cut.as_bytes(), "hvd.json").unwrap(),
            "hvd.json",
        );
        assert!(t.tensors.iter().all(|x| x.ops.is_empty()));
        assert!(
            t.warnings[1].contains("2 spans are still open"),
            "{:?}",
            t.warnings
        );
        // Malformed JSON: an error naming the file and the line.
        let bad = text.replacen("\"pid\": 1}", "\"pid\": 1]", 1);
        let msg = parse_kineto(bad.as_bytes(), "hvd.json")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("hvd.json") && msg.contains("line 6 column 64"),
            "{msg}"
        );
        assert_eq!(parse_shape("[3,4]"), Some(vec![3, 4]));
        assert_eq!(parse_shape("[]"), Some(vec![]));
        assert_eq!(parse_shape("3x4"), None);
    }
}
