//! Horovod: `horovod.env` and `trainplan_horovod.py`.
//!
//! * exact tensor groups → `groups=` (lists of parameters, plan order) for
//!   `hvd.DistributedOptimizer`, `HOROVOD_DISABLE_GROUP_FUSION=1` (a group is never fused with
//!   another), `HOROVOD_FUSION_THRESHOLD` = the largest group in bytes rounded up to a MiB (a
//!   group must fit one fusion buffer; at least 1 MiB);
//! * fusion timing → `HOROVOD_CYCLE_TIME` (ms): the cycle of the Horovod baseline the plan
//!   started from, else 0.5 ms (the plan modelled collectives issued as soon as their group is
//!   ready; Horovod's smallest practical cycle stands for that);
//! * AMP with `fp16_allreduce=1` → `compression=hvd.Compression.fp16` (plain AMP keeps fp32
//!   gradients, as the plan predicted);
//! * AMP → `autocast_context()` and `make_grad_scaler()` (shared with the PyTorch module), and
//!   `step(optimizer, scaler)`: Horovod's documented pattern for a GradScaler —
//!   `optimizer.synchronize()`, `scaler.unscale_`, then `scaler.step` inside
//!   `optimizer.skip_synchronize()`;
//! * gradient accumulation k → `backward_passes_per_step=k` (Horovod sums the k gradients
//!   locally: `scale_loss` divides the loss by k, `MICRO_BATCH` = batch / k samples per
//!   micro-step, `is_update_step(step)` says when to step);
//! * `fused-adam` → `optimizer_kwargs()` = `{"fused": True}` for `torch.optim.Adam`/`AdamW`;
//! * `blueconnect` (hierarchical all-reduce) → `HOROVOD_HIERARCHICAL_ALLREDUCE=1`.
//!
//! Horovod cannot be installed in CI (it builds against MPI/NCCL): the module is run on real
//! PyTorch against a stub `horovod.torch` written from Horovod's documented API
//! (`tests/frameworks/stubs/horovod`, checked signatures and argument rules) in
//! `tests/frameworks/horovod_stub.py`.

use super::torch_helpers::TORCH_HELPERS_PY;
use super::{
    EmitError, Emitted, Facts, comment_text, env_line, header, names_doc, py_groups, py_ints,
    py_str, unmapped_passes,
};
use crate::plan::Plan;

/// Cycle time when the plan did not start from a Horovod baseline, ms.
pub const NO_WAIT_CYCLE_MS: f64 = 0.5;

/// `HOROVOD_FUSION_THRESHOLD` for a largest group of `bytes`: rounded up to a whole MiB
/// (`None` when that does not fit in 64 bits, which no checked plan reaches).
pub fn fusion_threshold(bytes: u64) -> Option<u64> {
    bytes.div_ceil(1 << 20).max(1).checked_mul(1 << 20)
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let mut env = header(
        plan,
        "Horovod environment — `set -a; . ./horovod.env; set +a` before horovodrun",
    );
    match f.largest_group_bytes() {
        Some(b) => {
            env.push_str(&format!(
                "# largest planned group: {b} B; every group must fit one fusion buffer\n"
            ));
            let t = fusion_threshold(b).ok_or_else(|| {
                EmitError::Inconsistent(format!("a group of {b} bytes fits no fusion buffer"))
            })?;
            env.push_str(&env_line("HOROVOD_FUSION_THRESHOLD", &t.to_string())?);
        }
        None => notes.push(
            "the plan has no tensor_bytes: set HOROVOD_FUSION_THRESHOLD to at least the largest group's bytes".into(),
        ),
    }
    let cycle = f.horovod_cycle_ms.unwrap_or(NO_WAIT_CYCLE_MS);
    env.push_str(&format!(
        "# cycle: {}\n",
        if f.horovod_cycle_ms.is_some() {
            "the Horovod baseline's the plan started from"
        } else {
            "the plan issues each group when ready; a short cycle comes closest"
        }
    ));
    env.push_str(&env_line("HOROVOD_CYCLE_TIME", &format!("{cycle}"))?);
    env.push_str(
        "# the groups= lists of trainplan_horovod.py are the plan's collectives exactly\n",
    );
    env.push_str(&env_line("HOROVOD_DISABLE_GROUP_FUSION", "1")?);
    if f.passes.iter().any(|p| p == "blueconnect") {
        env.push_str("# blueconnect: hierarchical all-reduce\n");
        env.push_str(&env_line("HOROVOD_HIERARCHICAL_ALLREDUCE", "1")?);
    }

    let bytes = f.group_bytes.clone().unwrap_or_default();
    let mut py = format!(
        "\"\"\"Apply a trainplan plan to Horovod (PyTorch): exact gradient groups, accumulation, AMP, fp16\ngradient compression, fused Adam.\n\n    import trainplan_horovod as tp\n    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **tp.optimizer_kwargs())\n    optimizer = tp.distributed_optimizer(optimizer, model)\n    scaler = tp.make_grad_scaler()\n    for step, batch in enumerate(loader):        # MICRO_BATCH samples per micro-step\n        with tp.autocast_context():\n            loss = tp.scale_loss(loss_fn(model(batch)))\n        scaler.scale(loss).backward()\n        if tp.is_update_step(step):\n            tp.step(optimizer, scaler); optimizer.zero_grad()\n\nwith horovod.env loaded. The plan is named in the comments below; NAMES says whose names it uses.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "Horovod groups module"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!(
        "# Collectives in issue order (gradient-ready order), as parameter names.\nGROUPS = {}\n",
        py_groups(&f.groups)
    ));
    py.push_str(&format!("GROUP_BYTES = {}\n", py_ints(&bytes)));
    py.push_str(&format!(
        "BACKWARD_PASSES_PER_STEP = {}\nGRAD_ACCUMULATION = BACKWARD_PASSES_PER_STEP\n",
        f.k
    ));
    let micro = f
        .micro_batch
        .map_or_else(|| "None".to_string(), |m| m.to_string());
    py.push_str(&format!(
        "# Samples per micro-step (the planned batch per GPU divided by GRAD_ACCUMULATION).\nMICRO_BATCH = {micro}\n"
    ));
    py.push_str(&format!(
        "FP16_ALLREDUCE = {}\n",
        if f.fp16_allreduce { "True" } else { "False" }
    ));
    py.push_str(&format!(
        "DTYPE = {}  # compute dtype under autocast; \"fp32\": no AMP\n",
        py_str(f.half.as_deref().unwrap_or("fp32"))
    ));
    py.push_str(&format!(
        "FUSED_ADAM = {}\n",
        if f.passes.iter().any(|p| p == "fused-adam") {
            "True"
        } else {
            "False"
        }
    ));
    py.push_str(&format!("NAMES = {}\n\n", py_str(&plan.workload.names)));
    py.push_str("import contextlib\n");
    py.push_str(TORCH_HELPERS_PY);
    py.push_str(HOROVOD_PY);
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation k = {}: feed MICRO_BATCH = {micro} samples per micro-step, divide the loss with scale_loss(loss) (Horovod sums the k gradients) and step when is_update_step(step) (backward_passes_per_step={})",
            f.k, f.k
        ));
    }
    if f.half.is_some() {
        notes.push(format!(
            "AMP ({}): run forward and loss under trainplan_horovod.autocast_context() and step with trainplan_horovod.step(optimizer, make_grad_scaler()){}",
            f.half.as_deref().unwrap_or("fp16"),
            if f.fp16_allreduce {
                "; gradients are all-reduced in fp16"
            } else {
                ""
            }
        ));
    }
    if f.passes.iter().any(|p| p == "fused-adam") {
        notes.push(
            "fused Adam: build the optimizer with **trainplan_horovod.optimizer_kwargs() ({\"fused\": True})".into(),
        );
    }
    notes.extend(unmapped_passes(
        f,
        &["amp", "blueconnect", "fused-adam"],
        "Horovod",
    ));
    notes.push("load the env: `set -a; . ./horovod.env; set +a`, then wrap the optimizer with trainplan_horovod.distributed_optimizer(optimizer, model)".into());
    Ok(Emitted {
        files: vec![
            ("horovod.env".into(), env),
            ("trainplan_horovod.py".into(), py),
        ],
        notes,
    })
}

const HOROVOD_PY: &str = r#"

class PlanMismatch(ValueError):
    """The model lacks parameters the plan names."""


def _named(model):
    return dict(model.named_parameters())


def groups_for(model):
    """The plan's groups as lists of `model`'s parameters (for `groups=`)."""
    params = _named(model)
    missing = [n for g in GROUPS for n in g if n not in params]
    if missing:
        raise PlanMismatch(
            "%d of %d planned parameters are not in the model, e.g. %s (names: %s)"
            % (len(missing), sum(len(g) for g in GROUPS), ", ".join(missing[:5]), NAMES)
        )
    return [[params[n] for n in g] for g in GROUPS]


def distributed_optimizer(optimizer, model, **kwargs):
    """`hvd.DistributedOptimizer` with the plan's groups, accumulation and compression."""
    import horovod.torch as hvd

    set_device_type(model)
    options = dict(
        named_parameters=model.named_parameters(),
        groups=groups_for(model),
        backward_passes_per_step=BACKWARD_PASSES_PER_STEP,
    )
    if FP16_ALLREDUCE:
        options["compression"] = hvd.Compression.fp16
    options.update(kwargs)
    return hvd.DistributedOptimizer(optimizer, **options)


def step(optimizer, scaler=None):
    """One update of a Horovod DistributedOptimizer, with a GradScaler (AMP) as Horovod
    documents it: all-reduce first, unscale the reduced gradients, step without a second
    all-reduce. Without a scaler: optimizer.step()."""
    if scaler is None or not scaler.is_enabled():
        return optimizer.step()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        result = scaler.step(optimizer)
    scaler.update()
    return result
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, file, tiny_plan};
    use super::super::{Framework, emit};
    use super::*;

    #[test]
    fn tiny_plan_env_and_module() {
        let e = emit(&tiny_plan(), Framework::Horovod).unwrap();
        check_files(&e);
        let env = check_env(file(&e, "horovod.env"));
        // Largest group 4,196,352 B (4 MiB + 2 KiB) → rounded up to 5 MiB.
        assert_eq!(env["HOROVOD_FUSION_THRESHOLD"], "5242880");
        // The autotune baseline's 2.5 ms cycle.
        assert_eq!(env["HOROVOD_CYCLE_TIME"], "2.5");
        assert_eq!(env["HOROVOD_DISABLE_GROUP_FUSION"], "1");
        assert_eq!(env["HOROVOD_HIERARCHICAL_ALLREDUCE"], "1");
        let py = file(&e, "trainplan_horovod.py");
        assert!(py.contains("    [\"net.2.bias\", \"net.1.weight\", \"net.1.bias\"],\n"));
        assert!(py.contains("BACKWARD_PASSES_PER_STEP = 2\n"));
        assert!(py.contains("FP16_ALLREDUCE = True\n"));
        assert!(py.contains("GROUP_BYTES = [4195328, 4194304, 4196352, 4194304, 1024]\n"));
        // AMP, fused Adam and accumulation are the module's too (finding 6: every counted
        // decision of a Horovod plan is applied by its export).
        assert!(py.contains("DTYPE = \"fp16\""));
        assert!(py.contains("FUSED_ADAM = True\n"));
        assert!(py.contains("MICRO_BATCH = 2\n"));
        for f in [
            "def autocast_context(",
            "def make_grad_scaler(",
            "def optimizer_kwargs(",
            "def scale_loss(",
            "def is_update_step(",
            "def step(optimizer, scaler=None)",
        ] {
            assert!(py.contains(f), "{f}");
        }
        assert!(e.notes.iter().any(|n| n.contains("optimizer_kwargs()")));
        assert!(
            !e.notes.iter().any(|n| n.contains("apply by hand")),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn defaults_without_a_horovod_baseline_or_amp() {
        let mut p = tiny_plan();
        p.decisions.clear();
        p.config.dtype = "fp32".into();
        p.config.passes.clear();
        p.config.grad_accumulation = 1;
        let e = emit(&p, Framework::Horovod).unwrap();
        let env = check_env(file(&e, "horovod.env"));
        assert_eq!(env["HOROVOD_CYCLE_TIME"], "0.5");
        assert!(!env.contains_key("HOROVOD_HIERARCHICAL_ALLREDUCE"));
        let py = file(&e, "trainplan_horovod.py");
        assert!(py.contains("FP16_ALLREDUCE = False\n"));
        assert!(py.contains("BACKWARD_PASSES_PER_STEP = 1\n"));
        assert_eq!(fusion_threshold(1), Some(1 << 20));
        assert_eq!(fusion_threshold(1 << 20), Some(1 << 20));
        assert_eq!(fusion_threshold((1 << 20) + 1), Some(2 << 20));
        // Rounded up past 2^64: refused, never wrapped to 0.
        assert_eq!(fusion_threshold(u64::MAX), None);
    }
}
