//! TensorFlow / Keras (with or without XLA): `xla.env` and `trainplan_xla.py`.
//!
//! What a plan made with `--framework tf` counts, and how the export applies it:
//!
//! * the `xla_default` start point (XLA auto-clustering, every fusible op fused) →
//!   `compile_kwargs()` = `{"jit_compile": True}` for `model.compile` (Keras 3 turns XLA off by
//!   itself under a distribution strategy, so it is set explicitly, `False` for `tf_default`) and
//!   `TF_XLA_FLAGS=--tf_xla_auto_jit=2` in `xla.env` for `tf.function` code outside Keras;
//! * AMP → `set_precision_policy()` (`mixed_float16` / `mixed_bfloat16`, before the model is
//!   built); fp16 needs loss scaling: `compile_kwargs()` keeps Keras' `auto_scale_loss=True`, and
//!   `wrap_optimizer(opt)` gives a `LossScaleOptimizer` for custom training loops;
//! * gradient accumulation k → `make_optimizer(cls, **kwargs)` builds the Keras optimizer with
//!   `gradient_accumulation_steps=k` (gradients averaged over the k micro-steps, weights updated on
//!   the k-th) fed `MICRO_BATCH` = batch / k samples per micro-step.
//!
//! **What a zoo plan cannot target** (finding 6). The plan names layers the zoo's way
//! (torchvision / Hugging Face: `layer1.0.conv1`); a Keras model names them otherwise
//! (`conv2_block1_1_conv` in `tf.keras.applications.ResNet50`), and its TF graph nodes are named
//! after those. So no op-fusion cluster or recomputation site of a zoo plan can be aimed at a
//! Keras model's nodes, and none is written (no `XLA_CLUSTER_SPEC` file naming nodes that do not
//! exist): the planner does not count op fusion or recomputation for TF (`search::framework`),
//! XLA's own clustering stands for fusion, and the module says so in `NOT_APPLIED` (tested
//! against the real Keras ResNet-50: none of the plan's layer names is a Keras layer name).
//! Exact tensor groups are not TF's either (MirroredStrategy packs gradients by its own rule).
//!
//! Checked against real TensorFlow / Keras on CPU in `tests/frameworks/tf_keras.py`.

use super::{
    EmitError, Emitted, Facts, comment_text, env_line, header, names_doc, py_list, py_str,
    split_member, unmapped_passes,
};
use crate::plan::Plan;

/// Whether the plan runs with XLA auto-clustering: it started from `xla_default`, or (a plan
/// made for another framework) it fuses ops.
pub fn auto_jit(plan: &Plan, f: &Facts) -> bool {
    let start = plan
        .decisions
        .iter()
        .find(|d| d.pass.starts_with("baseline:"));
    match start {
        Some(d) if d.pass == "baseline:xla_default" => true,
        Some(d) if d.pass == "baseline:tf_default" => false,
        _ => !f.clusters.is_empty(),
    }
}

/// Zoo layer names the plan fuses or recomputes: what a Keras model cannot be matched against.
fn untargeted_layers(f: &Facts, plan: &Plan) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let members = f.clusters.iter().flatten().map(|m| split_member(m).0);
    for l in members.chain(plan.config.recompute.iter().map(String::as_str)) {
        if !out.iter().any(|o| o == l) {
            out.push(l.to_string());
        }
    }
    out
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let jit = auto_jit(plan, f);
    let mut env = header(
        plan,
        "TensorFlow/XLA environment — `set -a; . ./xla.env; set +a`",
    );
    if jit {
        env.push_str("# XLA auto-clustering (the plan's fusion is XLA's own), for tf.function code; Keras: compile_kwargs()\n");
        env.push_str(&env_line("TF_XLA_FLAGS", "--tf_xla_auto_jit=2")?);
    } else {
        env.push_str("# the plan runs without XLA: nothing to set\n");
    }
    let fp16 = f.half.as_deref() == Some("fp16");
    let micro = f
        .micro_batch
        .map_or_else(|| "None".to_string(), |m| m.to_string());
    let untargeted = untargeted_layers(f, plan);
    let mut not_applied: Vec<String> = Vec::new();
    if !f.clusters.is_empty() {
        not_applied.push(format!(
            "op fusion: {} fused op group(s) named by the {} names of {}; a Keras model's nodes are named otherwise, so no cluster can be targeted — XLA clusters by itself{}",
            f.clusters.len(),
            plan.workload.names,
            plan.workload.model,
            if jit { " (jit_compile=True)" } else { " when jit_compile is on" }
        ));
    }
    if !plan.config.recompute.is_empty() {
        not_applied.push(format!(
            "recomputation of {} layer(s): not applied (the names are not Keras layers; wrap the matching layers' calls in tf.recompute_grad by hand)",
            plan.config.recompute.len()
        ));
    }
    if f.fuses_tensors() {
        not_applied
            .push("exact tensor groups: MirroredStrategy packs gradients by its own rule".into());
    }
    let mut py = format!(
        "\"\"\"Apply a trainplan plan to TensorFlow / Keras: precision policy and loss scaling, gradient\naccumulation, XLA.\n\n    import keras, trainplan_xla as tp\n    tp.set_precision_policy()                                  # before building the model\n    model = build_model()\n    optimizer = tp.make_optimizer(keras.optimizers.AdamW, learning_rate=1e-4)\n    model.compile(optimizer=optimizer, loss=loss, **tp.compile_kwargs())\n    model.fit(dataset.batch(int(tp.MICRO_BATCH)), ...)       # MICRO_BATCH samples per micro-step\n\nCustom loops: optimizer = tp.wrap_optimizer(optimizer) (LossScaleOptimizer for fp16).\nNOT_APPLIED lists what the plan names that no Keras model can be matched against.\n\nThe plan and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "TensorFlow / Keras"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!("NAMES = {}\n", py_str(&plan.workload.names)));
    py.push_str(&format!(
        "PRECISION_POLICY = {}\n",
        py_str(match f.half.as_deref() {
            Some("bf16") => "mixed_bfloat16",
            Some(_) => "mixed_float16",
            None => "float32",
        })
    ));
    py.push_str(&format!(
        "# fp16 only (bf16 keeps fp32's exponent range).\nLOSS_SCALING = {}\n",
        if fp16 { "True" } else { "False" }
    ));
    py.push_str(&format!(
        "# XLA: the plan's fusion is XLA's own clustering (xla_default), or no XLA (tf_default).\nJIT_COMPILE = {}\n",
        if jit { "True" } else { "False" }
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(&format!(
        "# Samples per micro-step (the planned batch per replica divided by GRAD_ACCUMULATION).\nMICRO_BATCH = {micro}\n"
    ));
    py.push_str(&format!(
        "# What the plan names that the export cannot aim at a Keras model, and why.\nNOT_APPLIED = {}\n",
        py_list(&not_applied, "")
    ));
    py.push_str(&format!(
        "# The plan's layer names behind NOT_APPLIED (the zoo's; no Keras layer carries them).\nUNTARGETED_LAYERS = {}\n",
        py_list(&untargeted, "")
    ));
    py.push_str(XLA_PY);
    files_notes(f, &mut notes, &micro, jit);
    notes.extend(not_applied.iter().map(|n| format!("not applied: {n}")));
    notes.extend(unmapped_passes(f, &["amp"], "TensorFlow/XLA"));
    Ok(Emitted {
        files: vec![("xla.env".into(), env), ("trainplan_xla.py".into(), py)],
        notes,
    })
}

/// What the user does to apply the counted decisions.
fn files_notes(f: &Facts, notes: &mut Vec<String>, micro: &str, jit: bool) {
    if jit {
        notes.push("XLA: model.compile(..., **trainplan_xla.compile_kwargs()) sets jit_compile=True; TF_XLA_FLAGS in xla.env for other tf.function code".into());
    }
    match f.half.as_deref() {
        Some("fp16") => notes.push("AMP fp16: trainplan_xla.set_precision_policy() before building the model; Keras scales the loss (auto_scale_loss), custom loops wrap the optimizer with wrap_optimizer".into()),
        Some(h) => notes.push(format!("AMP {h}: trainplan_xla.set_precision_policy() before building the model; no loss scaling needed")),
        None => {}
    }
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation k = {}: build the optimizer with trainplan_xla.make_optimizer (gradient_accumulation_steps={}) and feed MICRO_BATCH = {micro} samples per micro-step (gradients are averaged: do not divide the loss)",
            f.k, f.k
        ));
    }
}

const XLA_PY: &str = r#"

def set_precision_policy():
    """The planned Keras mixed-precision policy (call it before the model is built)."""
    import keras

    keras.mixed_precision.set_global_policy(PRECISION_POLICY)


def make_optimizer(cls, **kwargs):
    """A Keras optimizer `cls(**kwargs)` that accumulates GRAD_ACCUMULATION micro-steps."""
    if GRAD_ACCUMULATION > 1:
        kwargs["gradient_accumulation_steps"] = GRAD_ACCUMULATION
    return cls(**kwargs)


def wrap_optimizer(optimizer):
    """A LossScaleOptimizer around `optimizer` when the plan computes in fp16 (for custom
    training loops; model.compile does it itself with auto_scale_loss)."""
    if not LOSS_SCALING:
        return optimizer
    import keras

    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return optimizer
    return keras.mixed_precision.LossScaleOptimizer(optimizer)


def compile_kwargs():
    """Keyword arguments for model.compile: XLA as planned, Keras' loss scaling on."""
    return {"jit_compile": JIT_COMPILE, "auto_scale_loss": True}


def check_model(model):
    """Raise ValueError when `model` was not built under the planned policy (call
    set_precision_policy() first)."""
    want = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[PRECISION_POLICY]
    wrong = [
        layer.name
        for layer in model.layers
        if layer.weights and getattr(layer, "compute_dtype", want) not in (want, "float32")
    ]
    built = {getattr(layer, "compute_dtype", None) for layer in model.layers if layer.weights}
    if wrong or (want != "float32" and want not in built):
        raise ValueError(
            "the model was built without the planned policy %s (set_precision_policy() first), e.g. %s"
            % (PRECISION_POLICY, (wrong or [model.name])[0])
        )
    return model
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, decision, file, tiny_plan};
    use super::super::{Facts, Framework, emit};
    use super::*;

    #[test]
    fn tiny_plan_env_and_module() {
        let e = emit(&tiny_plan(), Framework::Xla).unwrap();
        check_files(&e);
        // The tiny plan (made for pytorch) fuses ops: XLA auto-clustering, no cluster file.
        let env = check_env(file(&e, "xla.env"));
        assert_eq!(env["TF_XLA_FLAGS"], "--tf_xla_auto_jit=2");
        assert!(!env.contains_key("XLA_CLUSTER_SPEC"));
        assert!(e.files.iter().all(|(n, _)| n != "xla_clusters.txt"));
        let py = file(&e, "trainplan_xla.py");
        assert!(py.contains("PRECISION_POLICY = \"mixed_float16\""));
        assert!(py.contains("LOSS_SCALING = True\n"));
        assert!(py.contains("JIT_COMPILE = True\n"));
        assert!(py.contains("GRAD_ACCUMULATION = 2\n"), "{py}");
        assert!(py.contains("MICRO_BATCH = 2\n"), "{py}");
        // What cannot be targeted is said, with the names behind it.
        assert!(py.contains("op fusion: 2 fused op group(s)"), "{py}");
        assert!(
            py.contains("\"net.1\", \"act.1\", \"net.3\", \"act.3\""),
            "{py}"
        );
        assert!(
            e.notes
                .iter()
                .any(|n| n.starts_with("not applied: op fusion"))
        );
    }

    #[test]
    fn the_start_point_decides_xla() {
        let mut p = tiny_plan();
        p.decisions[0] = decision("baseline:tf_default", &[], "start");
        let f = Facts::of(&p).unwrap();
        assert!(!auto_jit(&p, &f));
        let e = emit(&p, Framework::Xla).unwrap();
        assert!(check_env(file(&e, "xla.env")).is_empty());
        assert!(file(&e, "trainplan_xla.py").contains("JIT_COMPILE = False\n"));
        p.decisions[0] = decision("baseline:xla_default", &[("auto_jit", "2")], "start");
        p.config.fused_ops.clear();
        let f = Facts::of(&p).unwrap();
        assert!(auto_jit(&p, &f));
        let py = file(&emit(&p, Framework::Xla).unwrap(), "trainplan_xla.py").to_string();
        assert!(
            py.contains("NOT_APPLIED = [\n") || py.contains("NOT_APPLIED = [\""),
            "{py}"
        );
        assert!(!py.contains("op fusion:"), "{py}");
    }
}
