//! The passes a command applies: the registry plus `--pass-file` passes, `--pass NAME[:k=v]`
//! resolved before any work, and their application in order to a job.

use serde_json::json;

use super::CliError;
use crate::passes::{self, Evaluated, Pass, PassError};

/// The log target of this module's messages: the one they had before the passes moved here
/// from `cli::whatif`, so that `RUST_LOG` filters and logs stay as they were.
const LOG_TARGET: &str = "trainplan::cli::whatif";

pub fn pass_error(e: PassError) -> CliError {
    CliError::bad_input(e)
}

/// The built-in passes plus the ones registered with `--pass-file`, sorted by name; a file's
/// pass may not shadow a built-in one.
pub fn all_passes(files: &[std::path::PathBuf]) -> Result<Vec<Box<dyn Pass>>, CliError> {
    let mut v = passes::registry();
    for f in files {
        let p = passes::declarative::load_file(f).map_err(pass_error)?;
        if v.iter().any(|q| q.name() == p.name()) {
            return Err(CliError::bad_input(format!(
                "{}: pass name `{}` is already registered; choose another name",
                f.display(),
                p.name()
            )));
        }
        v.push(p);
    }
    v.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(v)
}

/// The passes of one `whatif`, resolved: each pass with its knobs.
pub type PassPlan<'a> = Vec<(&'a dyn Pass, passes::Knobs)>;

/// Resolve every `--pass` and its knobs before any work, so a typo costs nothing.
pub fn resolve<'a>(all: &'a [Box<dyn Pass>], args: &[String]) -> Result<PassPlan<'a>, CliError> {
    let mut plan = Vec::new();
    for arg in args {
        let (name, given) = passes::parse_pass_arg(arg).map_err(pass_error)?;
        let p = passes::find(all, &name).map_err(pass_error)?;
        let knobs = passes::resolve_knobs(p, &given).map_err(pass_error)?;
        plan.push((p, knobs));
    }
    Ok(plan)
}

/// Evaluate `job`, apply the passes in order (each on the previous one's result), evaluate
/// again: (before, after, what each pass did as JSON).
pub fn run_passes(
    job: crate::graph::job::Job,
    plan: &PassPlan,
    warn: bool,
) -> Result<(Evaluated, Evaluated, Vec<serde_json::Value>), CliError> {
    let base = passes::evaluate(job).map_err(CliError::bad_input)?;
    let mut cur = base.clone();
    let mut applied = Vec::new();
    for (p, knobs) in plan {
        let patches = crate::passes::propose(*p, &cur, knobs).map_err(pass_error)?;
        if patches.is_empty() && warn {
            tracing::warn!(target: LOG_TARGET, pass = p.name(), "the pass found nothing to change");
        }
        let job = passes::apply_all(&cur.job, &patches).map_err(pass_error)?;
        applied.push(json!({"pass": p.name(), "patches": patches.len(),
            "why": patches.iter().map(|x| x.why.clone()).filter(|w| !w.is_empty()).take(20).collect::<Vec<_>>()}));
        cur = passes::evaluate(job).map_err(CliError::bad_input)?;
    }
    Ok((base, cur, applied))
}
