//! `plan --top K`: the layout search's table — the options the memory step tried on the
//! baseline, those that fit first, fastest first — as text and as `top_layouts` in `--json`
//! (DESIGN.md's `layout` fields per row, with step time, tokens/s per GPU, MFU and the three
//! memory peaks).

use serde_json::{Value, json};

use crate::search::layout::LayoutRow;

/// One row of the table, with its throughput from the workload's tokens and model FLOPs per
/// GPU per step (`per_step`; None for a model without tokens: no throughput, no MFU).
pub fn row_json(r: &LayoutRow, per_step: Option<(f64, f64)>) -> Value {
    let secs = r.iteration_ns.max(1) as f64 / 1e9;
    let (tokens, mfu) = match per_step {
        Some((tokens, flops)) => (
            Some((tokens / secs).round()),
            (r.peak_flops_per_ns > 0.0).then(|| {
                let m = flops / (r.iteration_ns.max(1) as f64 * r.peak_flops_per_ns);
                (m * 1e4).round() / 1e4
            }),
        ),
        None => (None, None),
    };
    json!({
        "passes": r.passes,
        "layout": {
            "dp_replicate": r.dp_replicate,
            "dp_shard": r.dp_shard,
            "tp": r.tp,
            "pp": r.pp,
            "virtual": r.virtual_stages,
            "cp": r.cp,
            "micro_batch": r.micro_batch,
            "schedule": r.schedule,
        },
        "shard_stage": r.shard_stage,
        "accumulation": r.accumulation,
        "recompute": r.recompute,
        "iteration_ms": (r.iteration_ns as f64 / 1e3).round() / 1e3,
        "tokens_per_s_per_gpu": tokens,
        "mfu": mfu,
        "peak_memory_bytes": r.allocated_bytes,
        "reserved_peak_bytes": r.reserved_bytes,
        "device_used_bytes": r.device_used_bytes,
        "fits": r.fits,
    })
}

/// The first `k` rows as `top_layouts`.
pub fn top_json(rows: &[LayoutRow], k: usize, per_step: Option<(f64, f64)>) -> Value {
    Value::Array(rows.iter().take(k).map(|r| row_json(r, per_step)).collect())
}

/// The table's lines: a heading and one line per row (at most `k`), or one line saying why
/// there is none.
pub fn top_lines(rows: &[LayoutRow], k: usize, per_step: Option<(f64, f64)>) -> Vec<String> {
    if rows.is_empty() {
        return vec![
            "layouts: none tried — the job fits as it is, so the memory step (where layouts are searched) did not run".into(),
        ];
    }
    let shown = k.min(rows.len());
    let mut lines = vec![if rows.iter().any(|r| r.fits) {
        format!(
            "layouts tried: {} (the best {shown}; those that fit first, fastest first)",
            rows.len()
        )
    } else {
        format!(
            "layouts tried: {}, none fits (the {shown} with the least device memory first)",
            rows.len()
        )
    }];
    lines.push(format!(
        "  {:>3}  {:>4} {:>4} {:>4} {:>5} {:>5} {:>5} {:>3} {:>4}  {:>11}  {:>9}  {:>6}  {:>9}  passes",
        "#", "tp", "cp", "pp", "shard", "repl", "micro", "k", "rec", "step", "tok/s/GPU", "MFU", "device"
    ));
    for (i, r) in rows.iter().take(shown).enumerate() {
        let v = row_json(r, per_step);
        let tokens = v["tokens_per_s_per_gpu"]
            .as_f64()
            .map_or("—".to_string(), |t| crate::units::thousands(t as u64));
        let mfu = v["mfu"]
            .as_f64()
            .map_or("—".to_string(), |m| format!("{:.1} %", 100.0 * m));
        lines.push(format!(
            "  {:>3}  {:>4} {:>4} {:>4} {:>5} {:>5} {:>5} {:>3} {:>4}  {:>8.1} ms  {:>9}  {:>6}  {:>6.1} GB{}  {}",
            i + 1,
            r.tp,
            r.cp,
            r.pp,
            r.dp_shard,
            r.dp_replicate,
            r.micro_batch,
            r.accumulation,
            if r.recompute { "yes" } else { "no" },
            r.iteration_ns as f64 / 1e6,
            tokens,
            mfu,
            r.device_used_bytes as f64 / 1e9,
            if r.fits { "" } else { " over" },
            r.passes
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ns: u64, fits: bool) -> LayoutRow {
        LayoutRow {
            passes: "tensor-parallel:degree=8,sequence=1 + shard:stage=3,reshard=1".into(),
            tp: 8,
            cp: 1,
            pp: 1,
            virtual_stages: 1,
            schedule: None,
            dp_shard: 64,
            dp_replicate: 1,
            shard_stage: 3,
            micro_batch: 1,
            accumulation: 8,
            recompute: false,
            iteration_ns: ns,
            allocated_bytes: 70_000_000_000,
            reserved_bytes: 72_000_000_000,
            device_used_bytes: 73_000_000_000,
            fits,
            peak_flops_per_ns: 989_000.0,
        }
    }

    #[test]
    fn throughput_and_mfu_follow_each_rows_step_time() {
        // 8,192 tokens and 4.0e14 FLOPs per GPU per step, in 1 s on a 989 TFLOP/s peak.
        let v = row_json(&row(1_000_000_000, true), Some((8192.0, 4.0e14)));
        assert_eq!(v["tokens_per_s_per_gpu"], 8192.0);
        assert_eq!(v["mfu"], 0.4044);
        assert_eq!(v["layout"]["tp"], 8);
        assert_eq!(v["layout"]["dp_shard"], 64);
        assert_eq!(v["layout"]["pp"], 1);
        assert_eq!(v["iteration_ms"], 1000.0);
        // Twice the time: half the tokens per second and half the MFU.
        let slow = row_json(&row(2_000_000_000, true), Some((8192.0, 4.0e14)));
        assert_eq!(slow["tokens_per_s_per_gpu"], 4096.0);
        assert_eq!(slow["mfu"], 0.2022);
        // No tokens (a CNN): no throughput.
        assert!(row_json(&row(1, true), None)["mfu"].is_null());
    }

    #[test]
    fn the_table_shows_at_most_k_rows_and_flags_those_over() {
        let rows = vec![row(1_000_000_000, true), row(900_000_000, false)];
        let lines = top_lines(&rows, 5, Some((8192.0, 4.0e14)));
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[2].contains("1000.0 ms") && !lines[2].contains(" over "));
        assert!(lines[3].contains("GB over"), "{lines:?}");
        assert_eq!(top_lines(&rows, 1, None).len(), 3);
        assert!(top_lines(&rows[1..], 1, None)[0].contains("none fits"));
        assert!(top_lines(&[], 3, None)[0].contains("fits as it is"));
    }
}
