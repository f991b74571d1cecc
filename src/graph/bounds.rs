//! Physical bounds of a job: what an op's duration, a tensor's bytes and a worker's memory may
//! be, so that the replay's integer arithmetic (ns and bytes in `u64`) cannot overflow and a
//! saturated value cannot pass for an answer. A job that leaves them — through a pass factor, a
//! corrupt trace, an edit — is refused with a message naming the op, tensor or sum, never
//! replayed.
//!
//! Why these figures: one op longer than [`MAX_OP_NS`] (~13 days) or a gradient of more than
//! [`MAX_TENSOR_BYTES`] (16 TiB) is not a training step anyone runs; with every op under the
//! first and at most 2^32 ops, a worker's sum of durations stays under [`MAX_SUM_NS`] (2^62) —
//! checked — and the replay's clock (see `replay`, which adds with saturation and reports an
//! overflow) stays exact.

use super::job::Job;

/// Longest op, ns (2^50 ns ≈ 13 days).
pub const MAX_OP_NS: u64 = 1 << 50;
/// Largest sum of one worker's op durations and gaps, ns (2^62).
pub const MAX_SUM_NS: u64 = 1 << 62;
/// Largest tensor or synchronisation, bytes (16 TiB).
pub const MAX_TENSOR_BYTES: u64 = 1 << 44;
/// Largest memory of one worker (static plus every allocation and free), bytes (64 PiB): far
/// above any GPU, since a job is built at its whole batch before a pipeline or accumulation
/// splits it (BigScience's 176B at 2,048 sequences on one replica holds 2.1 TB of logits in one
/// op, its effects over 1 PiB), and 2^56 keeps every sum exact in `u64` with 256x to spare.
pub const MAX_MEMORY_BYTES: u64 = 1 << 56;

/// Check `job` against the bounds; the error names what left them.
pub fn check(job: &Job) -> Result<(), String> {
    let l = &job.local;
    let mut sum: u64 = 0;
    for (i, op) in l.ops.iter().enumerate() {
        let s = &op.spec;
        let d = s.dur_ns.max(s.gap_ns);
        if d > MAX_OP_NS {
            return Err(format!(
                "op {i} ({}) would last {} ns, more than the {MAX_OP_NS} ns (~13 days) an op may",
                l.layers.get(s.layer as usize).map_or("?", String::as_str),
                d
            ));
        }
        sum = sum
            .checked_add(s.dur_ns)
            .and_then(|x| x.checked_add(s.gap_ns))
            .filter(|&x| x <= MAX_SUM_NS)
            .ok_or_else(|| format!("the ops of one worker add up to more than {MAX_SUM_NS} ns"))?;
    }
    for t in &l.tensors {
        if t.bytes > MAX_TENSOR_BYTES {
            return Err(format!(
                "tensor {} would hold {} bytes, more than the {MAX_TENSOR_BYTES} (16 TiB) a tensor may",
                t.name, t.bytes
            ));
        }
    }
    for (i, s) in job.syncs.iter().enumerate() {
        if s.bytes > MAX_TENSOR_BYTES {
            return Err(format!(
                "synchronisation {i} would move {} bytes, more than the {MAX_TENSOR_BYTES} (16 TiB) one may",
                s.bytes
            ));
        }
    }
    let mut mem = l.static_mem_bytes;
    for m in &l.mem {
        mem = mem
            .checked_add(m.bytes)
            .filter(|&x| x <= MAX_MEMORY_BYTES)
            .ok_or_else(|| {
                format!(
                    "memory effects add up to more than {MAX_MEMORY_BYTES} bytes (64 PiB) per worker (op {} allocates or frees {} bytes)",
                    m.op, m.bytes
                )
            })?;
    }
    Ok(())
}

/// The number of ops `job.expand()` would build, without building it: the count its op limit
/// uses, an upper estimate (within 1/8 of the real count; tested). The topology's devices are
/// made on a scratch builder. For memory decisions:
/// × [`crate::limits::EVAL_BYTES_PER_OP`] is what an evaluation of the job needs.
pub fn expanded_ops(job: &Job) -> u64 {
    expanded_ops_in(job, job.symmetric)
}

/// [`expanded_ops`] of `job` in the symmetric form or the full graph, whichever `symmetric`
/// says (without copying the job to set its flag).
pub fn expanded_ops_in(job: &Job, symmetric: bool) -> u64 {
    use super::comm::CommTopology;
    use super::{DeviceKind, DfgBuilder};
    if let Some(p) = &job.meta.pipeline {
        return super::pipeline::expanded_ops(job, p);
    }
    let gw = if symmetric { 1 } else { job.workers };
    let mut b = DfgBuilder::new();
    let streams: Vec<u32> = (0..gw)
        .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
        .collect();
    let topo = if symmetric && job.comm.scheme == crate::cost::config::SyncScheme::Ring {
        CommTopology::symmetric_ring(&mut b, &job.comm, job.workers, streams[0])
    } else {
        CommTopology::new(&mut b, &job.comm, streams)
    };
    let pieces: u64 = job.syncs.iter().map(|s| s.partitions.max(1) as u64).sum();
    // The full form adds two ops per sync and worker around its pieces; the quotient ring's
    // one send and one receive per piece are all of it.
    let per_sync = if topo.is_symmetric() { 0 } else { 2 };
    gw as u64 * (job.local.ops.len() as u64 + per_sync * job.syncs.len() as u64)
        + pieces * topo.ops_per_tensor() as u64
}

/// A replayed iteration of `ns` is a time, not a saturated overflow (see `replay`).
pub fn check_replayed(ns: u64) -> Result<(), String> {
    if ns > MAX_SUM_NS {
        return Err(format!(
            "the replayed iteration would last more than {MAX_SUM_NS} ns (~146 years): a duration, size or rate of the job is out of range"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        let m = crate::zoo::model(
            "resnet50",
            &crate::zoo::ModelOptions {
                batch: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        let c = crate::cost::config::load_cluster("8xh200").unwrap();
        crate::zoo::build::job(&m, &c, &Default::default()).unwrap()
    }

    #[test]
    fn expanded_ops_bounds_the_count_expand_builds() {
        let mut j = job();
        for symmetric in [false, true] {
            j.symmetric = symmetric;
            let (est, real) = (expanded_ops(&j), j.expand().unwrap().op_count() as u64);
            assert!(est >= real && est <= real + real / 8, "{est} vs {real}");
        }
    }

    #[test]
    fn a_zoo_job_is_within_bounds_and_each_excess_is_named() {
        let j = job();
        check(&j).unwrap();
        let mut a = j.clone();
        a.local_mut().ops[3].spec.dur_ns = MAX_OP_NS + 1;
        assert!(
            check(&a).unwrap_err().starts_with("op 3 ("),
            "{:?}",
            check(&a)
        );
        let mut b = j.clone();
        b.local_mut().tensors[0].bytes = u64::MAX;
        assert!(check(&b).unwrap_err().contains("16 TiB"));
        let mut c = j.clone();
        c.syncs[0].bytes = MAX_TENSOR_BYTES + 1;
        assert!(check(&c).unwrap_err().starts_with("synchronisation 0"));
        let mut d = j.clone();
        d.local_mut().mem[0].bytes = u64::MAX - 5;
        assert!(check(&d).unwrap_err().contains("64 PiB"));
        // 4,097 ops of 2^50 ns each: every op within bounds, their sum past 2^62.
        let mut e = j;
        let mut op = e.local.ops[0].clone();
        op.spec.dur_ns = MAX_OP_NS;
        e.local_mut().ops = vec![op; 4097];
        assert!(check(&e).unwrap_err().contains("add up"));
    }
}
