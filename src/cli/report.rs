//! How a command hands back what it found, one way for every command: one JSON object on
//! stdout (`--json`) or text lines, and the files it writes (atomically, with one shape of
//! error message).

use std::io::Write;
use std::path::Path;

use serde_json::json;

use super::CliError;
use super::output::Clean;
use crate::replay::breakdown;

/// Stdout, with every control character escaped.
pub fn out() -> Clean<std::io::StdoutLock<'static>> {
    super::output::stdout()
}

/// One JSON object on one line of `o`.
pub fn json_line(o: &mut impl Write, v: &serde_json::Value) -> Result<(), CliError> {
    writeln!(o, "{v}").map_err(CliError::stdout)
}

/// Text lines on `o`.
pub fn lines(o: &mut impl Write, lines: &[String]) -> Result<(), CliError> {
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}

/// Write `path` atomically; a failure is an output error, "failed to write {what} {path}".
pub fn write_file(
    path: &Path,
    what: &str,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), CliError> {
    super::write_atomic(path, fill)
        .map_err(|e| CliError::output(format!("failed to write {what} {}: {e}", path.display())))
}

/// `--timeline PATH`: the replay as a Chrome trace, once the path is known not to be an input.
pub fn write_timeline(
    path: &Path,
    g: &crate::graph::Dfg,
    r: &crate::replay::Replay,
) -> Result<(), CliError> {
    super::distinct::check(
        &[super::distinct::Output::new("--timeline", path)],
        &[],
        &[],
    )?;
    write_file(path, "timeline", |w| {
        crate::replay::timeline::write_chrome_trace(g, r, w)
    })
}

/// The critical path's ten largest items for `--json` (`critical_path_top`).
pub fn top_items_json(items: &[breakdown::PathItem]) -> Vec<serde_json::Value> {
    items
        .iter()
        .take(10)
        .map(|i| json!({"name": i.name, "ms": i.dur_ns as f64 / 1e6}))
        .collect()
}

/// A trace report's summary lines, then the critical path's largest items.
pub fn write_report(
    o: &mut impl Write,
    lines: &[String],
    items: &[breakdown::PathItem],
) -> Result<(), CliError> {
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    writeln!(o, "\ncritical path, largest items:").map_err(CliError::stdout)?;
    for i in items.iter().take(8) {
        // Kernel names run to hundreds of characters (templates): the start says which.
        let name: String = if i.name.chars().count() > 100 {
            i.name.chars().take(99).chain(['…']).collect()
        } else {
            i.name.clone()
        };
        writeln!(
            o,
            "    {:>11}  {}",
            super::output::dur_ms(i.dur_ns as f64 / 1e6, 3),
            name.trim_end()
        )
        .map_err(CliError::stdout)?;
    }
    Ok(())
}
