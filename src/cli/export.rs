//! `trainplan export PLAN.yaml --to FRAMEWORK [-o DIR]`: read a plan, run the framework's
//! emitter ([`crate::plan::emit`]), write its files atomically into DIR (default
//! `trainplan-<framework>/` next to the plan, created if needed), print the files and the notes
//! (or one JSON object). An unknown `--to` is a usage error (exit 2, clap lists the known
//! names); an unreadable, malformed or other-version plan is bad input (exit 3, naming the file
//! and line).

use std::io::Write;
use std::path::PathBuf;

use serde_json::json;

use super::{CliError, ExportArgs, write_atomic};
use crate::plan::Plan;
use crate::plan::emit;

/// `trainplan export`.
pub fn export_cmd(a: &ExportArgs) -> Result<(), CliError> {
    let shown = a.plan.display().to_string();
    let text = crate::input::read_to_string(&a.plan, crate::input::InputKind::Plan)
        .map_err(|e| CliError::bad_input(format!("failed to read the plan {shown}: {e}")))?;
    let plan = Plan::from_yaml(&text, &shown).map_err(CliError::bad_input)?;
    let out = emit::emit(&plan, a.to).map_err(|e| CliError::bad_input(format!("{shown}: {e}")))?;
    let dir: PathBuf = match &a.output {
        Some(d) => d.clone(),
        None => a
            .plan
            .parent()
            .map(|p| p.to_path_buf())
            .unwrap_or_default()
            .join(format!("trainplan-{}", a.to.name())),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::bad_input(format!("failed to create {}: {e}", dir.display())))?;
    let mut written = Vec::new();
    for (name, content) in &out.files {
        let path = dir.join(name);
        write_atomic(&path, |w| w.write_all(content.as_bytes()))
            .map_err(|e| CliError::bad_input(format!("failed to write {}: {e}", path.display())))?;
        written.push(path.display().to_string());
    }
    let mut o = std::io::stdout().lock();
    if a.json {
        let v = json!({
            "framework": a.to.name(),
            "plan_path": shown,
            "dir": dir.display().to_string(),
            "files": written,
            "notes": out.notes,
        });
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let mut lines = vec![format!(
        "{} patch for {} written to {}:",
        a.to.name(),
        plan.workload.model,
        dir.display()
    )];
    lines.extend(written.iter().map(|p| format!("  {p}")));
    lines.push(String::new());
    lines.push("to do:".into());
    lines.extend(out.notes.iter().map(|n| format!("  - {n}")));
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}
