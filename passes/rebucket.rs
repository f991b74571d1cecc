//! `tensor-fusion` on a recorded step: re-bucket the gradient all-reduces the framework issued
//! (dPRO's use case: a trace with one all-reduce per tensor) into buckets, and price each
//! bucket's collective with the communication model.
//!
//! **Sites.** The step's all-reduces in stream order, each with the host ops of the call that
//! issued it (`trace::calls`). A bucket is a run of consecutive all-reduces on one stream with no
//! other collective between them, of at most `threshold_mb` MiB (a gradient larger than that stays
//! alone), filled greedily in issue order (= gradient-ready order) as Horovod's fusion buffer and
//! DDP's buckets are. `scope=critical` keeps the buckets with a member on the critical path — its
//! kernel or its host call (a host-bound step pays for every call on its thread); `scope=all`
//! keeps them all.
//!
//! **Rewrite.** The members' kernels merge into one collective, which waits for every member's
//! inputs (so it starts once the bucket's last gradient is ready) and releases what any of them
//! released; the host calls of all but the last member take no time (one call per bucket, issued
//! when the last gradient is ready), their recorded idle gaps kept.
//!
//! **Price.** `recorded × model(bucket) / Σ model(member)` (how every re-costed trace kernel is
//! scaled): `model` is the ring all-reduce `2(n−1)(α + S/n/B)` on the step's link
//! (`TraceFacts::sync_link`: the GPU's own server link over the recorded ranks, or `--cluster`'s
//! ring). The fused kernel also copies the gradients into a flat buffer and back (Horovod's fusion
//! buffer; DDP without `gradient_as_bucket_view`): 4 bytes moved per byte of gradient at the
//! GPU's memory bandwidth. A member's size is its kernel's (`In msg nelems` × dtype); a kernel
//! without one (PyTorch < 2.1) gets the size whose modelled time is its recorded time — an
//! estimate the patch says it is.
//!
//! **Not (yet)**: the ranks of one job given together (`--trace DIR` of several ranks) are not
//! re-bucketed — a bucket must be the same on every rank and each rank proposes on its own
//! graph; a rank alone, or one rank extrapolated to `--cluster`, is.

use std::collections::BTreeMap;

use super::{Edit, Evaluated, PassError, Patch};
use crate::graph::job::{RecordedSync, SyncLink};
use crate::graph::{DeviceId, OpId, OpKind};

/// One recorded all-reduce, found in the job.
struct Member {
    index: u32,
    kernel: OpId,
    host: Vec<OpId>,
    device: DeviceId,
    recorded_ns: u64,
    bytes: u64,
    estimated: bool,
}

/// Ring all-reduce time of `bytes` on `l` (ns): the model every synchronisation uses.
fn ring_ns(l: &SyncLink, bytes: f64) -> f64 {
    crate::cost::comm::ring_allreduce_ns(l.link, l.ranks.max(2), bytes)
}

/// The size whose modelled time is `recorded_ns` (0 when the latency alone exceeds it).
fn size_from_time(l: &SyncLink, recorded_ns: u64) -> u64 {
    let n = f64::from(l.ranks.max(2));
    let per_hop = recorded_ns as f64 / (2.0 * (n - 1.0)) - l.link.alpha_ns;
    (per_hop.max(0.0) * n * l.link.bytes_per_ns).round() as u64
}

fn members(cx: &Evaluated, syncs: &[RecordedSync], link: &SyncLink) -> Vec<Member> {
    let l = &cx.job.local;
    let mut host: BTreeMap<u32, Vec<OpId>> = BTreeMap::new();
    let mut kernel: BTreeMap<u32, OpId> = BTreeMap::new();
    for (&op, &index) in &l.calls {
        match l.ops[op as usize].spec.kind {
            OpKind::Collective => {
                kernel.insert(index, op);
            }
            OpKind::Launch | OpKind::CpuOther => host.entry(index).or_default().push(op),
            _ => {}
        }
    }
    kernel
        .into_iter()
        .filter_map(|(index, op)| {
            let s = syncs.get(index as usize)?;
            let spec = &l.ops[op as usize].spec;
            let (bytes, estimated) = match s.bytes {
                Some(b) => (b, false),
                None => (size_from_time(link, spec.dur_ns), true),
            };
            Some(Member {
                index,
                kernel: op,
                host: host.remove(&index).unwrap_or_default(),
                device: spec.device,
                recorded_ns: spec.dur_ns,
                bytes,
                estimated,
            })
        })
        .collect()
}

/// Runs of consecutive all-reduces (stream order, one stream, nothing between) of at most
/// `cap` bytes; runs of one are dropped.
fn buckets<'a>(ms: &'a [Member], syncs: &[RecordedSync], cap: u64) -> Vec<&'a [Member]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for i in 0..=ms.len() {
        let joins = i < ms.len()
            && i > start
            && ms[i].device == ms[i - 1].device
            && syncs[ms[i].index as usize].position == syncs[ms[i - 1].index as usize].position + 1
            && bytes.saturating_add(ms[i].bytes) <= cap;
        if joins {
            bytes += ms[i].bytes;
            continue;
        }
        if i - start >= 2 {
            out.push(&ms[start..i]);
        }
        start = i;
        bytes = ms.get(i).map_or(0, |m| m.bytes);
    }
    out
}

/// The patches re-bucketing a recorded step's all-reduces; empty when the step has none (a
/// zoo job, or a trace without two consecutive all-reduces that fit the threshold).
pub(super) fn propose(
    cx: &Evaluated,
    pass: &str,
    all: bool,
    threshold_mb: f64,
) -> Result<Vec<Patch>, PassError> {
    let Some(facts) = cx.job.meta.trace.as_deref() else {
        return Ok(Vec::new());
    };
    // The ranks of one job are matched collective by collective: a bucket would have to be
    // the same on every rank, and each rank proposes on its own graph (with sizes estimated
    // from its own times). Not re-bucketed there (yet).
    if facts.ranks_given > 1 {
        return Ok(Vec::new());
    }
    let Some(link) = facts.sync_link.as_ref().filter(|l| l.ranks >= 2) else {
        return Ok(Vec::new());
    };
    let ms = members(cx, &facts.recorded_syncs, link);
    let cap = (threshold_mb * 1024.0 * 1024.0) as u64;
    let critical: std::collections::HashSet<OpId> = cx.critical_local.iter().copied().collect();
    let mut out = Vec::new();
    for b in buckets(&ms, &facts.recorded_syncs, cap) {
        let on_path = b
            .iter()
            .any(|m| critical.contains(&m.kernel) || m.host.iter().any(|h| critical.contains(h)));
        if !all && !on_path {
            continue;
        }
        let (patch, saved_ns) = bucket_patch(cx, pass, link, b);
        // scope=critical: only a bucket that saves time where it is paid (the comm stream's
        // time and the host calls it removes; the flat-buffer copies count against it).
        if !all && saved_ns <= 0 {
            continue;
        }
        // A bucket whose merge would close a cycle (a member's result needed before a later
        // member is issued) is left as recorded.
        if super::apply(&cx.job, &patch).is_ok() {
            out.push(patch);
        }
    }
    // Later ranges first, as the zoo form's patches (see tensor_fusion's module docs).
    out.reverse();
    Ok(out)
}

/// The bucket's patch and the time it saves: recorded kernel and host time less the fused
/// kernel's (ns; negative when the copies cost more than the latencies saved).
fn bucket_patch(cx: &Evaluated, pass: &str, link: &SyncLink, b: &[Member]) -> (Patch, i64) {
    let l = &cx.job.local;
    let bytes: u64 = b.iter().map(|m| m.bytes).sum();
    let recorded: u64 = b.iter().map(|m| m.recorded_ns).sum();
    let modelled: f64 = b.iter().map(|m| ring_ns(link, m.bytes as f64)).sum();
    let copy_ns = 4.0 * bytes as f64 / cx.job.gpu.memory_gbps.max(1e-9);
    let fused_ns = (recorded as f64 * ring_ns(link, bytes as f64) / modelled.max(1.0) + copy_ns)
        .round()
        .max(0.0) as u64;
    // What waited for an earlier member (the compute stream's wait right after its call) now
    // waits for the bucket: the last member's waits, which the merged kernel keeps.
    let kernels: Vec<OpId> = b.iter().map(|m| m.kernel).collect();
    let mut edits: Vec<Edit> = l
        .edges
        .iter()
        .filter(|&&(from, to)| {
            kernels[..kernels.len() - 1].contains(&from)
                && !kernels.contains(&to)
                && l.ops[to as usize].spec.device != b[0].device
        })
        .map(|&(from, to)| Edit::DropEdge { from, to })
        .collect();
    edits.push(Edit::Merge {
        ops: kernels,
        dur_ns: fused_ns,
    });
    let mut host_ns = 0u64;
    for m in &b[..b.len() - 1] {
        for &h in &m.host {
            host_ns += l.ops[h as usize].spec.dur_ns;
            edits.push(Edit::SetDuration { op: h, dur_ns: 0 });
        }
    }
    let estimated = b.iter().filter(|m| m.estimated).count();
    let sizes = if estimated == 0 {
        "sizes from the kernels' args".to_string()
    } else {
        format!(
            "{estimated} of {} sizes estimated from the recorded times (no `In msg nelems`: \
             PyTorch < 2.1)",
            b.len()
        )
    };
    let saved_ns = recorded as i64 + host_ns as i64 - fused_ns as i64;
    let patch = Patch {
        pass: pass.into(),
        why: format!(
            "bucket of all-reduces #{}..=#{} ({} recorded all-reduces, {:.2} MB; {sizes}): {:.3} → {:.3} ms \
             on the comm stream (ring of {} on {}, flat-buffer copies {:.3} ms); {} host calls \
             become one ({:.3} ms of host time saved)",
            b[0].index,
            b[b.len() - 1].index,
            b.len(),
            bytes as f64 / 1e6,
            recorded as f64 / 1e6,
            fused_ns as f64 / 1e6,
            link.ranks,
            link.name,
            copy_ns / 1e6,
            b.len(),
            host_ns as f64 / 1e6,
        ),
        edits,
    };
    (patch, saved_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::graph::tests::{doc, kernel, parse, x};

    const V100: &str = r#""deviceProperties":[{"id":0,"name":"Tesla V100-SXM2-32GB","totalGlobalMem":34089730048,"computeMajor":7,"computeMinor":0,"numSms":80}],"distributedInfo":{"backend":"nccl","rank":0,"world_size":2}"#;

    /// An NCCL all-reduce kernel of `nelems` floats on stream 20, with its flow pair.
    fn nccl(ts: u64, dur: u64, corr: u32, launch_ts: u64, nelems: u64) -> String {
        format!(
            r#"{{"ph":"X","cat":"kernel","name":"ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)","pid":0,"tid":20,"ts":{ts},"dur":{dur},"args":{{"correlation":{corr},"stream":20,"In msg nelems":{nelems},"Out msg nelems":{nelems},"dtype":"Float","Collective name":"allreduce"}}}},
{{"ph":"s","cat":"ac2g","name":"ac2g","id":{corr},"pid":100,"tid":1,"ts":{launch_ts}}},
{{"ph":"f","cat":"ac2g","name":"ac2g","id":{corr},"pid":0,"tid":20,"ts":{ts},"bp":"e"}}"#
        )
    }

    /// A step (0–1000 µs) of per-tensor gradient all-reduces, as a hand-written loop over
    /// `dist.all_reduce(p.grad)` issues them: four `c10d::allreduce_` calls of 120 µs, each
    /// launching a 1 MiB all-reduce on stream 20 after waiting for the compute stream, and the
    /// compute stream waiting for it before the next backward kernel (so a bucket must drop
    /// those waits or close a cycle). Host-bound: the calls are on the step's critical path.
    fn per_tensor_step() -> String {
        let mut ev = vec![x("user_annotation", "ProfilerStep#1", 1, 0, 1000, None)];
        let mut corr = 1;
        for i in 0..4u64 {
            let t = 100 + 200 * i;
            // The backward kernel of this gradient.
            ev.push(x("cpu_op", "aten::mm", 1, t - 60, 40, None));
            ev.push(x(
                "cuda_runtime",
                "cudaLaunchKernel",
                1,
                t - 50,
                10,
                Some(corr),
            ));
            ev.push(kernel("gemm", 7, t - 45, 30, corr, t - 50));
            corr += 1;
            ev.push(x("cpu_op", "c10d::allreduce_", 1, t, 120, None));
            ev.push(x("cpu_op", "record_param_comms", 1, t + 5, 100, None));
            ev.push(x(
                "cuda_runtime",
                "cudaEventRecord",
                1,
                t + 10,
                2,
                Some(corr),
            ));
            ev.push(x(
                "cuda_runtime",
                "cudaStreamWaitEvent",
                1,
                t + 15,
                2,
                Some(corr + 1),
            ));
            ev.push(format!(
                r#"{{"ph":"X","cat":"cuda_sync","name":"Wait Event","pid":0,"tid":20,"ts":{},"dur":0,"args":{{"cuda_sync_kind":"Wait Event","wait_on_stream":7,"wait_on_cuda_event_record_corr_id":{corr},"stream":20,"correlation":{}}}}}"#,
                t + 16,
                corr + 1
            ));
            ev.push(x(
                "cuda_runtime",
                "cudaLaunchKernel",
                1,
                t + 60,
                20,
                Some(corr + 2),
            ));
            ev.push(nccl(t + 85, 30, corr + 2, t + 60, 262_144));
            ev.push(x(
                "cuda_runtime",
                "cudaEventRecord",
                1,
                t + 100,
                2,
                Some(corr + 3),
            ));
            ev.push(x(
                "cuda_runtime",
                "cudaStreamWaitEvent",
                1,
                t + 105,
                2,
                Some(corr + 4),
            ));
            ev.push(format!(
                r#"{{"ph":"X","cat":"cuda_sync","name":"Wait Event","pid":0,"tid":7,"ts":{},"dur":0,"args":{{"cuda_sync_kind":"Wait Event","wait_on_stream":20,"wait_on_cuda_event_record_corr_id":{},"stream":7,"correlation":{}}}}}"#,
                t + 106,
                corr + 3,
                corr + 4
            ));
            corr += 5;
        }
        let d = doc(&ev);
        format!("{{{V100},{}", &d[1..])
    }

    fn evaluated() -> Evaluated {
        let t = crate::trace::graph::build_job(&parse(&per_tensor_step()), "t.json", None).unwrap();
        super::super::evaluate(t.job).unwrap()
    }

    #[test]
    fn per_tensor_all_reduces_are_labelled_with_their_calls() {
        let cx = evaluated();
        let f = cx.job.meta.trace.as_deref().unwrap();
        assert_eq!(f.recorded_syncs.len(), 4);
        assert!(f.recorded_syncs.iter().all(|s| s.bytes == Some(1 << 20)));
        let link = f.sync_link.as_ref().unwrap();
        assert_eq!((link.name.as_str(), link.ranks), ("nvlink-v100", 2));
        let ms = members(&cx, &f.recorded_syncs, link);
        assert_eq!(ms.len(), 4);
        let l = &cx.job.local;
        for m in &ms {
            // Each call's host ops: c10d::allreduce_, record_param_comms, the two event calls
            // before the launch, the launch, the two after: 120 µs in all.
            let host: u64 = m.host.iter().map(|&h| l.ops[h as usize].spec.dur_ns).sum();
            assert_eq!(host, 120_000, "call {}", m.index);
            assert!(!m.estimated && m.bytes == 1 << 20);
        }
        // The backward kernels and their launches are not part of any call; each call has one
        // launch, its kernel's.
        for (i, o) in l.ops.iter().enumerate() {
            if l.layers.get(o.spec.layer as usize).map(String::as_str) == Some("aten::mm") {
                assert!(!l.calls.contains_key(&(i as OpId)), "op {i}");
            }
        }
        let launches = l
            .calls
            .keys()
            .filter(|&&o| l.ops[o as usize].spec.kind == OpKind::Launch)
            .count();
        assert_eq!(launches, 4);
    }

    #[test]
    fn tensor_fusion_rebuckets_a_recorded_step_and_prices_the_bucket() {
        let cx = evaluated();
        let before = cx.replay.iteration_ns;
        let patches = propose(&cx, "tensor-fusion", false, 64.0).unwrap();
        assert_eq!(patches.len(), 1, "{patches:?}");
        let p = &patches[0];
        assert!(
            p.why.starts_with("bucket of all-reduces #0..=#3 (4 recorded all-reduces, 4.19 MB; sizes from the kernels' args)"),
            "{}",
            p.why
        );
        // The price: the kernels' time × ring(4 MiB) / (4 × ring(1 MiB)) on NVLink 2 between 2
        // ranks, plus copying 4 MiB into a flat buffer and back at the V100's bandwidth.
        let link = cx
            .job
            .meta
            .trace
            .as_deref()
            .unwrap()
            .sync_link
            .clone()
            .unwrap();
        let ring = |s: f64| 2.0 * (link.link.alpha_ns + s / 2.0 / link.link.bytes_per_ns);
        let mib = (1u64 << 20) as f64;
        let l = &cx.job.local;
        let kernels: u64 = l
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Collective)
            .map(|o| o.spec.dur_ns)
            .sum();
        assert!(kernels >= 120_000);
        let want = kernels as f64 * ring(4.0 * mib) / (4.0 * ring(mib))
            + 4.0 * 4.0 * mib / cx.job.gpu.memory_gbps;
        let merged = p
            .edits
            .iter()
            .find_map(|e| match e {
                Edit::Merge { ops, dur_ns } => Some((ops.len(), *dur_ns)),
                _ => None,
            })
            .unwrap();
        assert_eq!(merged.0, 4);
        assert!(
            (merged.1 as f64 - want).abs() <= 1.0,
            "{} vs {want}",
            merged.1
        );
        // The compute stream's waits after the first three calls are dropped (else the merge
        // closes a cycle), and those calls' host time (3 × 120 µs) goes.
        let drops = p
            .edits
            .iter()
            .filter(|e| matches!(e, Edit::DropEdge { .. }))
            .count();
        assert_eq!(drops, 3);
        let keep_waits = Patch {
            edits: p
                .edits
                .iter()
                .filter(|e| !matches!(e, Edit::DropEdge { .. }))
                .cloned()
                .collect(),
            ..p.clone()
        };
        assert!(super::super::apply(&cx.job, &keep_waits).is_err());
        let after = super::super::evaluate(super::super::apply(&cx.job, p).unwrap()).unwrap();
        let saved = before - after.replay.iteration_ns;
        assert!(
            (300_000..=360_000).contains(&saved),
            "{before} → {} ns",
            after.replay.iteration_ns
        );
        // The threshold closes buckets: 2 MiB holds two gradients.
        let two = propose(&cx, "tensor-fusion", true, 2.0).unwrap();
        assert_eq!(two.len(), 2);
        assert!(two[0].why.starts_with("bucket of all-reduces #2..=#3"));
        assert!(two[1].why.starts_with("bucket of all-reduces #0..=#1"));
    }

    #[test]
    fn sizes_without_args_come_from_the_recorded_time() {
        let link = SyncLink {
            name: "l".into(),
            link: crate::cost::comm::AlphaBeta {
                alpha_ns: 5_000.0,
                bytes_per_ns: 100.0,
            },
            ranks: 4,
        };
        // 4 ranks: 6 hops of (α + S/4/B); S = 4 MB → 6 × (5 µs + 10 µs) = 90 µs.
        assert_eq!(size_from_time(&link, 90_000), 4_000_000);
        assert!((ring_ns(&link, 4e6) - 90_000.0).abs() < 1e-6);
        // A kernel faster than the latencies alone: no bytes.
        assert_eq!(size_from_time(&link, 20_000), 0);
    }
}
