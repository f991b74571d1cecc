//! From one rank to n (Daydream's "distributed training from a single profile"): one rank's
//! recorded step stands for every worker of a cluster, and each collective takes the time the
//! communication model gives for its type and size on that cluster.
//!
//! Workers are symmetric: they run the same step at the same pace, so no rank waits for another
//! and the rank's own graph, with its collectives re-timed, is the job's iteration. What the
//! recorded collective durations contained beyond the transfer (waiting for slower ranks) is
//! dropped; stragglers are what a multi-rank replay ([`super::multi`]) shows and this does not.
//!
//! **Sizes.** Per collective, in order of preference: the kernel's own args (`Collective name`,
//! `In msg nelems`/`Out msg nelems` × the size of `dtype`; PyTorch ≥ 2.1), then sizes given by the
//! caller (from the execution trace of the same run). A collective with neither is an error that
//! names the kernel and its event index.
//!
//! **Model** (ring algorithms, `n` ranks, α–β per hop; the hop is the inter-node link when the
//! cluster has several nodes — the ring is paced by its slowest hop — else the intra-node one):
//! all-reduce `2(n−1)(α + S/n/B)`; all-gather and reduce-scatter `(n−1)(α + S/n/B)` (S: the full
//! buffer); all-to-all `α + (n−1)·(S/n)/B` (NCCL issues the n−1 exchanges of `S/n` at once as
//! grouped point-to-point, so one latency, and the rank's link carries them one after another);
//! broadcast and reduce (pipelined) `(n−1)α + S/B`; point-to-point `α + S/B`.

use crate::cost::comm::AlphaBeta;
use crate::cost::config::Cluster;
use crate::graph::comm::CommCost;

use super::collective::collective_type;
pub use super::collective::{CollectiveKind, CollectiveSize};
use super::kineto::KinetoTrace;
use super::step::{TraceCollective, TraceJob};

/// Size of one element of a PyTorch dtype name (`Float`, `float32`, `Half`, `BFloat16`, `Long`,
/// `Int`, `Byte`, `c10::Half`, …).
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    let d = dtype.to_ascii_lowercase();
    let d = d.rsplit("::").next().unwrap_or(&d);
    Some(match d {
        "float" | "float32" | "int" | "int32" | "uint32" | "complexhalf" => 4,
        "double" | "float64" | "long" | "int64" | "uint64" | "complexfloat" => 8,
        "half" | "float16" | "bfloat16" | "short" | "int16" | "uint16" => 2,
        "byte" | "char" | "bool" | "int8" | "uint8" | "float8_e4m3fn" | "float8_e5m2" => 1,
        "complexdouble" => 16,
        _ => return None,
    })
}

/// Type and size of a recorded collective from its kernel's args, when the trace has them.
pub fn size_from_kernel(trace: &KinetoTrace, c: &TraceCollective) -> Option<CollectiveSize> {
    let a = &trace.events.get(c.event)?.args;
    let kind = a
        .collective_name
        .as_deref()
        .and_then(CollectiveKind::parse)
        .or_else(|| CollectiveKind::parse(collective_type(&c.name)))?;
    let elem = dtype_bytes(a.dtype.as_deref()?)?;
    let nelems = match kind {
        CollectiveKind::AllGather => a.out_msg_nelems.or(a.in_msg_nelems)?,
        _ => a.in_msg_nelems?,
    };
    Some(CollectiveSize {
        kind,
        bytes: nelems.max(0) as u64 * elem,
    })
}

/// Time of a collective of `size` over `n` ranks with per-hop α–β `link` (ns).
pub fn collective_ns(size: CollectiveSize, n: u32, link: AlphaBeta) -> u64 {
    if n <= 1 {
        return 0;
    }
    let s = size.bytes as f64;
    let k = f64::from(n - 1);
    let t = match size.kind {
        CollectiveKind::AllReduce => 2.0 * k * link.time_ns(s / f64::from(n)),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => {
            k * link.time_ns(s / f64::from(n))
        }
        // NCCL runs the n−1 sends and receives of an all-to-all concurrently (grouped p2p).
        CollectiveKind::AllToAll => link.alpha_ns + k * (s / f64::from(n)) / link.bytes_per_ns,
        CollectiveKind::Broadcast | CollectiveKind::Reduce => {
            k * link.alpha_ns + s / link.bytes_per_ns
        }
        CollectiveKind::SendRecv => link.time_ns(s),
        CollectiveKind::Barrier => 2.0 * k * link.alpha_ns,
    };
    t.round().max(0.0) as u64
}

/// The α–β of the ring's slowest hop on a cluster.
pub fn ring_link(cluster: &Cluster) -> AlphaBeta {
    let c = CommCost::from_cluster(cluster);
    if cluster.nodes > 1 { c.inter } else { c.intra }
}

/// Why a trace could not be extrapolated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExtrapolateError {
    #[error(
        "{file}: collective #{index} ({name}, event #{event}) has no size: the kernel carries no \
         `In msg nelems`/`dtype` args (PyTorch < 2.1) and no execution trace of the run gave one \
         (pass the run's host execution trace)"
    )]
    NoSize {
        file: String,
        index: usize,
        name: String,
        event: usize,
    },
}

/// One collective as extrapolated.
#[derive(Clone, Debug, PartialEq)]
pub struct Extrapolated {
    pub name: String,
    pub size: CollectiveSize,
    /// Where the size came from: `kernel args` or `execution trace`.
    pub source: &'static str,
    pub recorded_ns: u64,
    pub modelled_ns: u64,
}

/// Re-time `built`'s collectives for `cluster`'s workers. `external[k]` is a size for the k-th
/// collective (in [`TraceJob::collectives`] order) from another source, used when the kernel's
/// args have none. Returns what each collective became.
pub fn extrapolate(
    trace: &KinetoTrace,
    file: &str,
    built: &mut TraceJob,
    cluster: &Cluster,
    external: &[Option<CollectiveSize>],
) -> Result<Vec<Extrapolated>, ExtrapolateError> {
    let n = cluster.workers();
    let link = ring_link(cluster);
    let mut out = Vec::with_capacity(built.collectives.len());
    for (k, c) in built.collectives.iter().enumerate() {
        let (size, source) = match size_from_kernel(trace, c) {
            Some(s) => (s, "kernel args"),
            None => match external.get(k).copied().flatten() {
                Some(s) => (s, "execution trace"),
                None => {
                    return Err(ExtrapolateError::NoSize {
                        file: file.to_string(),
                        index: k,
                        name: c.name.clone(),
                        event: c.event,
                    });
                }
            },
        };
        let modelled_ns = collective_ns(size, n, link);
        built.job.local_mut().ops[c.op as usize].spec.dur_ns = modelled_ns;
        out.push(Extrapolated {
            name: c.name.clone(),
            size,
            source,
            recorded_ns: c.dur_ns,
            modelled_ns,
        });
    }
    built.job.workers = n;
    built.job.meta.cluster = cluster.name.clone();
    if let Some(f) = built.job.meta.trace.as_deref_mut() {
        f.sync_link = Some(crate::graph::job::SyncLink {
            name: cluster.name.clone(),
            link,
            ranks: n,
        });
    }
    Ok(out)
}

/// Sizes of `built`'s collectives from the execution trace recorded beside `path` (issue 3's
/// host-ET link, [`super::link::sizes_beside`]); all `None` when there is none.
pub fn sizes_beside(
    path: &std::path::Path,
    trace: &KinetoTrace,
    built: &TraceJob,
) -> Vec<Option<CollectiveSize>> {
    super::link::sizes_beside(path, trace, built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_times() {
        let link = AlphaBeta {
            alpha_ns: 1000.0,
            bytes_per_ns: 100.0,
        };
        let s = |kind, bytes| CollectiveSize { kind, bytes };
        // 8 ranks, 800 kB: all-reduce 14 × (1 µs + 100 kB / 100 B/ns = 1 µs) = 28 µs.
        assert_eq!(
            collective_ns(s(CollectiveKind::AllReduce, 800_000), 8, link),
            28_000
        );
        // All-to-all: one α, then 7 shares of 100 kB one after another: 1 µs + 7 µs.
        assert_eq!(
            collective_ns(s(CollectiveKind::AllToAll, 800_000), 8, link),
            8_000
        );
        assert_eq!(
            collective_ns(s(CollectiveKind::Broadcast, 800_000), 8, link),
            15_000
        );
        assert_eq!(
            collective_ns(s(CollectiveKind::SendRecv, 800_000), 8, link),
            9_000
        );
        assert_eq!(
            collective_ns(s(CollectiveKind::AllReduce, 800_000), 1, link),
            0
        );
    }

    #[test]
    fn dtype_sizes() {
        assert_eq!(dtype_bytes("Float"), Some(4));
        assert_eq!(dtype_bytes("c10::Half"), Some(2));
        assert_eq!(dtype_bytes("BFloat16"), Some(2));
        assert_eq!(dtype_bytes("Long"), Some(8));
        assert_eq!(dtype_bytes("int8"), Some(1));
        assert_eq!(dtype_bytes("strange"), None);
    }
}
