//! `trainplan export PLAN.yaml --to FRAMEWORK [-o DIR]`: read a plan, run the framework's
//! emitter ([`crate::plan::emit`]), write its files into DIR as one
//! ([`super::atomic::write_dir_atomic`]: a new folder renamed as a whole, an existing one — `.`
//! included — file by file after staging them all; default `trainplan-<framework>/` next to the
//! plan; no file may be the plan: [`super::distinct`]), print the files and the notes
//! (or one JSON object). An unknown `--to` is a usage error (exit 2, clap lists the known
//! names); an unreadable, malformed or other-version plan is bad input (exit 3, naming the file
//! and line).

use std::io::Write;
use std::path::PathBuf;

use serde_json::json;

use super::atomic::write_dir_atomic;
use super::{CliError, ExportArgs};
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
    // No exported file (nor the folder) may be the plan or another input.
    let paths: Vec<PathBuf> = out.files.iter().map(|(n, _)| dir.join(n)).collect();
    let mut outputs = vec![super::distinct::Output::new("-o", &dir)];
    outputs.extend(
        paths
            .iter()
            .map(|p| super::distinct::Output::new("the exported file", p)),
    );
    super::distinct::check(&outputs, &[], &[])?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| CliError::output(format!("failed to create {}: {e}", parent.display())))?;
    }
    let files: Vec<(String, Vec<u8>)> = out
        .files
        .iter()
        .map(|(n, c)| (n.clone(), c.clone().into_bytes()))
        .collect();
    let written: Vec<String> = write_dir_atomic(&dir, &files)
        .map_err(|e| CliError::output(format!("failed to write {}: {e}", dir.display())))?
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut o = super::output::stdout();
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
