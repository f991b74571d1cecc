//! `trainplan replay --trace FILE.et`: replay of a Chakra execution trace. A Chakra trace has
//! node durations but (in the files converted from PyTorch) no start times, so there is no
//! measured iteration: `measured_iteration_ms` and `error_pct` are null and the prediction is the
//! replayed makespan of the recorded operators under their data dependencies.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::output::thousands;
use super::{CliError, ReplayArgs, write_atomic};
use crate::replay::{self, breakdown, critical_path, dependency_bound_ns};
use crate::trace::chakra;

/// Reads, builds, replays and reports one Chakra trace.
pub fn replay(a: &ReplayArgs, path: &Path) -> Result<(), CliError> {
    let file = path.display().to_string();
    if a.input.step.is_some() {
        tracing::warn!(file = %file, "--step is ignored for a Chakra trace (it holds one iteration)");
    }
    let t = Instant::now();
    let trace = chakra::read_chakra(path).map_err(CliError::bad_input)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = name
        .strip_suffix(".gz")
        .unwrap_or(&name)
        .trim_end_matches(".et")
        .trim_end_matches(".chakra")
        .to_string();
    let built = chakra::build_job(&trace, &file).map_err(CliError::bad_input)?;
    crate::graph::bounds::check(&built.job)
        .map_err(|m| CliError::bad_input(format!("{file}: {m}")))?;
    for w in &built.warnings {
        tracing::warn!(file = %file, "{w}");
    }
    let g = built
        .job
        .expand()
        .map_err(|e| CliError::bad_input(format!("{file}: {e}")))?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let r = replay::replay(&g);
    let replay_wall_ms = t.elapsed().as_secs_f64() * 1e3;
    crate::graph::bounds::check_replayed(r.iteration_ns)
        .map_err(|m| CliError::bad_input(format!("{file}: {m}")))?;
    let cp = critical_path(&g, &r);
    let bd = breakdown::breakdown(&g, &r, 0);
    let items = breakdown::critical_path_items(&g, &cp);
    let dep = dependency_bound_ns(&g);
    if let Some(p) = &a.timeline {
        super::distinct::check(&[super::distinct::Output::new("--timeline", p)], &[], &[])?;
        write_atomic(p, |w| replay::timeline::write_chrome_trace(&g, &r, w)).map_err(|e| {
            CliError::output(format!("failed to write timeline {}: {e}", p.display()))
        })?;
    }
    let measured = built.measured_ns;
    let err = measured.map(|m| 100.0 * (r.iteration_ns as f64 / m.max(1) as f64 - 1.0));
    let mut o = super::output::stdout();
    if a.json {
        let top = super::report::top_items_json(&items);
        let v = json!({
            "iteration_ms": r.iteration_ns as f64 / 1e6,
            "measured_iteration_ms": measured.map(|m| m as f64 / 1e6),
            "error_pct": err,
            "ops": g.op_count(),
            "devices": g.device_count(),
            "workers": 1,
            "critical_path_ms": dep as f64 / 1e6,
            "peak_memory_bytes": 0,
            "reserved_peak_bytes": null,
            "device_used_bytes": null,
            "memory_modelled": false,
            "replay_wall_ms": replay_wall_ms,
            "build_wall_ms": build_ms,
            "edges": g.edge_count(),
            "trace": file,
            "format": "chakra",
            "schema": trace.schema(),
            "nodes": trace.nodes.len(),
            "gpu_collectives": built.gpu_collectives,
            "collective_bytes": built.collective_bytes,
            "model": name,
            "cluster": "trace",
            "compute_ms": bd.compute_ns as f64 / 1e6,
            "critical_path_top": top,
            "timeline": a.timeline.as_ref().map(|p| p.display().to_string()),
        });
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let lines = [
        format!(
            "{file} (Chakra execution trace, schema {}, {} nodes, one rank)",
            trace.schema().unwrap_or("?"),
            thousands(trace.nodes.len() as u64)
        ),
        format!(
            "graph: {} ops, {} edges, {} devices; built in {:.0} ms, replayed in {:.0} ms",
            thousands(g.op_count() as u64),
            thousands(g.edge_count() as u64),
            g.device_count(),
            build_ms,
            replay_wall_ms
        ),
        format!(
            "GPU collectives: {} moving {} bytes",
            built.gpu_collectives,
            thousands(built.collective_bytes)
        ),
        String::new(),
        match measured {
            Some(m) => format!(
                "measured span    {:>12}   first start to last end",
                super::output::dur(m, 3)
            ),
            None => "measured span         n/a      the nodes have no start times".to_string(),
        },
        format!(
            "predicted        {:>12}   replayed makespan{}",
            super::output::dur(r.iteration_ns, 3),
            err.map(|e| format!("; error {e:+.2} %"))
                .unwrap_or_default()
        ),
        format!(
            "dependency bound {:>12}   longest dependency chain (unlimited devices)",
            super::output::dur(dep, 3)
        ),
    ];
    super::report::write_report(&mut o, &lines, &items)
}
