//! `trainplan show PLAN [--json]`: what a plan changes, its predicted effect, what each
//! framework's export does with each decision (by `search::framework`, the table the planner
//! itself obeys), and what is left to the user (the export's notes for the plan's framework).

use std::io::Write;

use serde_json::json;

use super::{CliError, ShowArgs};
use crate::cost::framework::Framework;
use crate::plan::{Plan, emit};
use crate::search::framework::{Names, baseline_mechanism, mechanism};

/// How `fw`'s export treats decision `pass`: `Ok(mechanism)` or `Err(why not)`.
fn treats(fw: Framework, pass: &str, names: Names) -> Result<&'static str, &'static str> {
    match pass.strip_prefix("baseline:") {
        Some(b) => {
            let own = match fw {
                Framework::Pytorch => "ddp_",
                Framework::Horovod => "horovod_",
                Framework::Byteps => "byteps_",
                Framework::Tf => "tf_",
                Framework::Jax => "jax_",
                Framework::Deepspeed => "zero",
                Framework::Torchtitan => "torchtitan_",
                Framework::Megatron => "megatron_",
            };
            let also = match fw {
                Framework::Tf => &["xla_default"][..],
                Framework::Pytorch | Framework::Torchtitan => &["fsdp2_default"][..],
                Framework::Deepspeed => &["deepspeed_default"][..],
                _ => &[][..],
            };
            if b.starts_with(own) || also.contains(&b) {
                baseline_mechanism(b)
            } else {
                Err("a setting of another framework")
            }
        }
        None => mechanism(fw, pass, names),
    }
}

/// `trainplan show`.
pub fn show_cmd(a: &ShowArgs) -> Result<(), CliError> {
    let shown = a.plan.display().to_string();
    let text = crate::input::read_to_string(&a.plan, crate::input::InputKind::Plan)
        .map_err(|e| CliError::bad_input(format!("failed to read the plan {shown}: {e}")))?;
    let plan = Plan::from_yaml(&text, &shown).map_err(CliError::bad_input)?;
    let names = Names::of(&plan.workload.names);
    let mut passes: Vec<&str> = Vec::new();
    for d in &plan.decisions {
        if !passes.contains(&d.pass.as_str()) {
            passes.push(&d.pass);
        }
    }
    let own = emit::emit(&plan, emit::Framework::of(plan.workload.framework))
        .map_err(|e| CliError::bad_input(format!("{shown}: {e}")))?;
    // Plan text reaches the terminal with its control characters escaped.
    let mut o = super::output::stdout();
    if a.json {
        let exports: serde_json::Map<String, serde_json::Value> = Framework::ALL
            .iter()
            .map(|&fw| {
                let (applied, not): (Vec<_>, Vec<_>) = passes
                    .iter()
                    .map(|p| (p, treats(fw, p, names)))
                    .partition(|(_, r)| r.is_ok());
                (
                    fw.name().to_string(),
                    json!({
                        "applies": applied.iter().map(|(p, r)| json!({"pass": p, "mechanism": r.ok()})).collect::<Vec<_>>(),
                        "does_not_apply": not.iter().map(|(p, r)| json!({"pass": p, "why": r.err()})).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect();
        let v = json!({
            "plan": shown,
            "workload": plan.workload,
            "predicted": plan.predicted,
            "peak_memory_bytes": plan.predicted.planned.peak_memory_bytes,
            "reserved_peak_bytes": plan.predicted.planned.reserved_peak_bytes,
            "device_used_bytes": plan.predicted.planned.device_used_bytes,
            "memory_over_capacity": plan
                .predicted
                .planned
                .device_used_bytes
                .zip(plan.predicted.gpu_memory_bytes)
                .map(|(d, g)| d > g),
            "baselines": plan.baselines,
            "decisions": plan.decisions,
            "advice": plan.advice,
            "exports": exports,
            "left_to_the_user": own.notes,
        });
        return writeln!(o, "{v}").map_err(CliError::stdout);
    }
    let mut lines = super::plan::summary(&plan);
    lines.push("what each framework's export does with the plan's decisions:".into());
    for fw in Framework::ALL {
        let marks: Vec<String> = passes
            .iter()
            .map(|p| match treats(fw, p, names) {
                Ok(_) => format!("{p} ✓"),
                Err(_) => format!("{p} ✗"),
            })
            .collect();
        let tag = if fw == plan.workload.framework {
            " (planned for)"
        } else {
            ""
        };
        lines.push(format!("  {:<8}{tag} {}", fw.name(), marks.join(", ")));
    }
    lines.push(String::new());
    lines.push(format!(
        "how the {} export applies them:",
        plan.workload.framework
    ));
    for p in &passes {
        if let Ok(m) = treats(plan.workload.framework, p, names) {
            lines.push(format!("  {p:<22} {m}"));
        }
    }
    lines.push(String::new());
    lines.push(format!(
        "left to you (trainplan export {shown} --to {}):",
        emit::Framework::of(plan.workload.framework)
    ));
    for n in &own.notes {
        lines.push(format!("  - {n}"));
    }
    for l in lines {
        writeln!(o, "{l}").map_err(CliError::stdout)?;
    }
    Ok(())
}
