//! BytePS: `byteps.env` and `byteps_partitions.txt`.
//!
//! * tensor partition → `BYTEPS_PARTITION_BYTES` = P, the one piece size BytePS applies to every
//!   tensor: the largest `⌈bytes(g) / k(g)⌉` over the partitioned groups, rounded up to 4 KiB,
//!   so no planned group is cut into more pieces than the plan chose (`⌈bytes(g)/P⌉ ≤ k(g)`).
//!   Without partitions in the plan P is the largest tensor rounded up to 4 KiB: nothing is cut
//!   (BytePS' 4,096,000 B default would cut what the plan kept whole);
//! * `BYTEPS_SCHEDULING_CREDIT` (counted in partitions) = the largest planned partition number:
//!   all the pieces of one planned group may be in flight at once, as the plan replayed them;
//! * `byteps_partitions.txt`: `<tensor> <partitions> <group>` per gradient tensor in issue order
//!   (the group column is the dPRO fork's group file; stock BytePS synchronises per tensor).
//!   A multi-tensor group's partition number is that of the group's fused buffer. A tensor name
//!   is one field ([`super::escape::record_field`]: whitespace and control characters escaped).
//! * gradient accumulation → `backward_passes_per_step=k` of `bps.DistributedOptimizer`.

use super::escape::record_field;
use super::{EmitError, Emitted, Facts, env_line, header, unmapped_passes};
use crate::plan::Plan;

/// Piece sizes are rounded up to this, bytes.
pub const ALIGN_BYTES: u64 = 4096;

/// `BYTEPS_PARTITION_BYTES` for the plan, when its bytes are known.
pub fn partition_bytes(plan: &Plan, f: &Facts) -> Option<u64> {
    let bytes = f.group_bytes.as_ref()?;
    let c = &plan.config;
    let planned = f
        .groups
        .iter()
        .zip(bytes)
        .filter_map(|(g, &b)| {
            c.partitions
                .get(&g[0])
                .map(|&k| b.div_ceil(k.max(1) as u64))
        })
        .max();
    let p = match planned {
        Some(p) => p,
        None => c
            .tensor_bytes
            .values()
            .copied()
            .max()
            .unwrap_or(ALIGN_BYTES),
    };
    p.div_ceil(ALIGN_BYTES).max(1).checked_mul(ALIGN_BYTES)
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let c = &plan.config;
    let mut env = header(
        plan,
        "BytePS environment — `set -a; . ./byteps.env; set +a` before bpslaunch",
    );
    let p = partition_bytes(plan, f);
    match p {
        Some(p) => {
            env.push_str(&format!(
                "# {}\n",
                if c.partitions.is_empty() {
                    "the plan partitions nothing: pieces as large as the largest tensor"
                } else {
                    "no planned group is cut into more pieces than the plan chose"
                }
            ));
            env.push_str(&env_line("BYTEPS_PARTITION_BYTES", &p.to_string())?);
            let cut: Vec<&String> = f
                .groups
                .iter()
                .filter(|g| !c.partitions.contains_key(&g[0]))
                .flatten()
                .filter(|t| c.tensor_bytes.get(*t).is_some_and(|&b| b > p))
                .collect();
            if !cut.is_empty() {
                notes.push(format!(
                    "{} tensor(s) the plan keeps whole are larger than BYTEPS_PARTITION_BYTES and will be cut too, e.g. {}",
                    cut.len(),
                    cut[0]
                ));
            }
        }
        None => notes.push(
            "the plan has no tensor_bytes: set BYTEPS_PARTITION_BYTES from byteps_partitions.txt by hand".into(),
        ),
    }
    let credit = c.partitions.values().copied().max().unwrap_or(1).max(1);
    env.push_str("# partitions in flight: one planned group's pieces at a time\n");
    env.push_str(&env_line("BYTEPS_SCHEDULING_CREDIT", &credit.to_string())?);

    let mut txt = header(
        plan,
        "per-tensor partition spec: `<tensor> <partitions> <group>`",
    );
    txt.push_str("# a tensor name is one field: whitespace, backslashes, control and non-ASCII characters as \\ escapes (\\x20, \\n, \\xe9)\n");
    txt.push_str("# tensors in issue order; a group of several tensors is one fused buffer (dPRO's BytePS fork)\n");
    for (i, g) in f.groups.iter().enumerate() {
        let k = c.partitions.get(&g[0]).copied().unwrap_or(1);
        for t in g {
            txt.push_str(&format!("{} {k} {i}\n", record_field(t)));
        }
    }
    if f.fuses_tensors() {
        notes.push("stock BytePS synchronises tensor by tensor: the planned groups need dPRO's BytePS fork (group column of byteps_partitions.txt)".into());
    }
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation: bps.DistributedOptimizer(..., backward_passes_per_step={})",
            f.k
        ));
    }
    notes.extend(unmapped_passes(f, &[], "BytePS"));
    Ok(Emitted {
        files: vec![
            ("byteps.env".into(), env),
            ("byteps_partitions.txt".into(), txt),
        ],
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, file, tiny_plan};
    use super::super::{Framework, emit};
    use super::*;

    #[test]
    fn tiny_plan_env_and_spec() {
        let e = emit(&tiny_plan(), Framework::Byteps).unwrap();
        check_files(&e);
        let env = check_env(file(&e, "byteps.env"));
        // Group [net.0.weight] = 4 MiB in 4 pieces → 1 MiB (already 4 KiB-aligned).
        assert_eq!(env["BYTEPS_PARTITION_BYTES"], "1048576");
        assert_eq!(env["BYTEPS_SCHEDULING_CREDIT"], "4");
        let txt = file(&e, "byteps_partitions.txt");
        let body: Vec<&str> = txt.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(body.len(), 8);
        assert_eq!(body[0], "net.3.weight 1 0");
        assert_eq!(body[6], "net.0.weight 4 3");
        // net.1/2/3 weights (4 MiB each, kept whole by the plan) exceed 1 MiB.
        assert!(
            e.notes.iter().any(|n| n.starts_with("3 tensor(s)")),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn no_partitions_keep_tensors_whole() {
        let mut p = tiny_plan();
        p.config.partitions.clear();
        let f = Facts::of(&p).unwrap();
        // Largest tensor 4 MiB.
        assert_eq!(partition_bytes(&p, &f), Some(4 << 20));
        // 10,000 B in 3 pieces → 3,334 → 4,096.
        p.config.tensor_groups = vec![vec!["a".into()]];
        p.config.tensor_bytes = [("a".to_string(), 10_000)].into();
        p.config.partitions = [("a".to_string(), 3)].into();
        let f = Facts::of(&p).unwrap();
        assert_eq!(partition_bytes(&p, &f), Some(4096));
        let e = emit(&p, Framework::Byteps).unwrap();
        assert_eq!(
            check_env(file(&e, "byteps.env"))["BYTEPS_SCHEDULING_CREDIT"],
            "3"
        );
    }
}
