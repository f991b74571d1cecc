//! JAX: `jax.env` and `trainplan_jax.py`, for a training step written with `jax` and `optax`.
//!
//! * the all-reduce combiner → `XLA_FLAGS=--xla_gpu_all_reduce_combine_threshold_bytes=N`: the
//!   threshold of the `jax_tuned` start point (decision knob `combine_threshold_bytes`); none for
//!   `jax_default` (XLA's own 30 MiB); for a plan made for another framework whose tensors are
//!   fused, the largest group (0 when it fuses none: each gradient its own all-reduce);
//! * recomputation → `remat(name, fn)`: `jax.checkpoint(fn, policy=nothing_saveable)` when the
//!   layer `name` (or a module containing it) is planned, so only its inputs are saved and its
//!   forward is re-run in the backward — the per-layer counterpart of `torch.utils.checkpoint`;
//!   `RECOMPUTE_MODULES` lists the planned layers, collapsed to parents as for PyTorch; a plan
//!   made with `--framework jax` checkpoints whole blocks (`recompute:policy=full`: each block's
//!   input saved, the block re-run), which `remat` around each block's function applies as
//!   priced; a layer segment wrapped layer by layer would keep every layer's inputs;
//! * AMP → `COMPUTE_DTYPE` and `cast_params(params)` (called inside the loss, so gradients come
//!   back in fp32 for the fp32 master weights); fp16 needs loss scaling: `loss_scale_init()` and
//!   `scaled_value_and_grad(loss_fn)` scale the loss (dynamic: halved on a non-finite gradient,
//!   doubled after `LOSS_SCALE_PERIOD` finite steps) and unscale the gradients; bf16 needs none
//!   (its exponent range is fp32's) and the scale stays 1;
//! * gradient accumulation k → `make_optimizer(opt)` = `optax.MultiSteps(opt, every_k_schedule=k)`
//!   (gradients averaged over the k micro-steps, so the loss is not divided) fed `MICRO_BATCH` =
//!   batch / k samples per micro-step; with fp16, `should_skip_update_fn=optax.skip_not_finite`
//!   drops a micro-step whose gradients overflowed (the scale is halved for the next);
//! * op fusion is not exported: `jax.jit` compiles the whole step and XLA chooses the fusion (the
//!   planner does not count op fusion for JAX, `search::framework`);
//! * memory → `XLA_PYTHON_CLIENT_MEM_FRACTION`: for a plan made for JAX, the share of the GPU
//!   its memory was checked against (`configs/memory/jax.yaml`'s `pool`, XLA's default 0.75).
//!
//! Checked against real JAX and optax on CPU in `tests/frameworks/jax_optax.py`.

use super::{
    EmitError, Emitted, Facts, comment_text, env_line, header, names_doc, py_list, py_str,
    unmapped_passes,
};
use crate::plan::Plan;

/// XLA's default all-reduce combine threshold on GPU, bytes (what `jax_default` models).
pub const XLA_DEFAULT_COMBINE_BYTES: u64 = 30 << 20;

/// The combine threshold to write, or `None` to keep XLA's default.
pub fn combine_threshold(plan: &Plan, f: &Facts) -> Option<u64> {
    let start = plan
        .decisions
        .iter()
        .find(|d| d.pass.starts_with("baseline:"));
    if let Some(t) = start
        .and_then(|d| d.knobs.get("combine_threshold_bytes"))
        .and_then(|v| v.parse().ok())
    {
        return Some(t);
    }
    if start.is_some_and(|d| d.pass == "baseline:jax_default") {
        return None;
    }
    if f.fuses_tensors() {
        f.largest_group_bytes()
    } else {
        Some(0)
    }
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let mut env = header(plan, "JAX environment — `set -a; . ./jax.env; set +a`");
    match combine_threshold(plan, f) {
        Some(b) => {
            env.push_str(
                "# all-reduces combined up to this many bytes (the plan's groups; 0: none combined)\n",
            );
            env.push_str(&env_line(
                "XLA_FLAGS",
                &format!("--xla_gpu_all_reduce_combine_threshold_bytes={b}"),
            )?);
        }
        None if f.fuses_tensors() && f.group_bytes.is_none() => notes.push("the plan has no tensor_bytes: set --xla_gpu_all_reduce_combine_threshold_bytes to the largest group's bytes".into()),
        None => env.push_str(&format!(
            "# XLA's default all-reduce combiner ({XLA_DEFAULT_COMBINE_BYTES} bytes) is the plan's: nothing to set\n"
        )),
    }
    // The pool the plan's memory was checked against (configs/memory/jax.yaml): XLA's own
    // default, written so that an environment asking for less cannot undo the plan's fit.
    if plan.workload.framework == crate::cost::framework::Framework::Jax
        && let Some(crate::cost::memory::PoolLimit::FractionOfTotal { fraction }) =
            crate::cost::memory::MemorySpec::builtin(crate::cost::framework::Framework::Jax).pool
    {
        env.push_str(
            "# the share of the GPU XLA's allocator may hold: the plan's memory was checked against it\n",
        );
        env.push_str(&env_line(
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            &format!("{fraction}"),
        )?);
    }
    let fp16 = f.half.as_deref() == Some("fp16");
    let micro = f
        .micro_batch
        .map_or_else(|| "None".to_string(), |m| m.to_string());
    let recompute: Vec<String> = if plan.workload.names == "trace" {
        Vec::new()
    } else {
        f.recompute.clone()
    };
    let mut py = format!(
        "\"\"\"Apply a trainplan plan to a JAX / optax training step: recomputed layers, compute dtype\nand loss scaling, gradient accumulation.\n\n    import optax, trainplan_jax as tp\n    optimizer = tp.make_optimizer(optax.adamw(1e-4))      # MultiSteps(k), skips overflowed fp16 steps\n    opt_state, scale = optimizer.init(params), tp.loss_scale_init()\n\n    def loss_fn(params, batch):\n        p = tp.cast_params(params)                          # compute dtype; masters stay fp32\n        x = tp.remat(\"layer1.0\", block)(p[\"layer1.0\"], x)  # jax.checkpoint where planned\n        ...\n\n    grad_fn = jax.jit(tp.scaled_value_and_grad(loss_fn))\n    for micro_batch in loader:                              # MICRO_BATCH samples each\n        loss, grads, scale, finite = grad_fn(params, scale, micro_batch)\n        updates, opt_state = optimizer.update(grads, opt_state, params)\n        params = optax.apply_updates(params, updates)\n\nThe plan and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "JAX policies"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!("NAMES = {}\n", py_str(&plan.workload.names)));
    py.push_str(&format!(
        "COMPUTE_DTYPE = {}\n",
        py_str(match f.half.as_deref() {
            Some("bf16") => "bfloat16",
            Some(_) => "float16",
            None => "float32",
        })
    ));
    py.push_str(&format!(
        "# fp16 only: bf16 and fp32 keep fp32's exponent range and need no loss scale.\nLOSS_SCALING = {}\nINITIAL_LOSS_SCALE = 32768.0\nLOSS_SCALE_PERIOD = 2000\n",
        if fp16 { "True" } else { "False" }
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(&format!(
        "# Samples per micro-step (the planned batch per device divided by GRAD_ACCUMULATION).\nMICRO_BATCH = {micro}\n"
    ));
    py.push_str(&format!(
        "# Layers (or modules) whose forward is re-run in the backward: wrap them with remat(name, fn).\nRECOMPUTE_MODULES = {}\n",
        py_list(&recompute, "")
    ));
    py.push_str(JAX_PY);
    if !recompute.is_empty() {
        notes.push(format!(
            "recomputation of {} layer(s)/module(s): wrap each one's function with trainplan_jax.remat(name, fn) (jax.checkpoint where planned)",
            recompute.len()
        ));
        if !super::whole_block_recompute(plan) {
            notes.push("the plan recomputes segments of layers (recompute:policy=layers or selective): jax.checkpoint keeps each wrapped function's inputs, so wrapped layer by layer the peak is higher than predicted (plan with --framework jax, which checkpoints whole blocks as priced)".into());
        }
    }
    if plan.workload.names == "trace" && !f.recompute.is_empty() {
        notes.push("the plan comes from a trace, whose names are ATen operators: its recomputation sites are not mapped to JAX functions".into());
    }
    match f.half.as_deref() {
        Some("fp16") => notes.push("AMP fp16: cast_params(params) inside the loss, gradients through scaled_value_and_grad (dynamic loss scale) and the optimizer through make_optimizer (overflowed steps skipped)".into()),
        Some(h) => notes.push(format!("AMP {h}: cast_params(params) inside the loss; no loss scaling needed")),
        None => {}
    }
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation k = {}: optax.MultiSteps via trainplan_jax.make_optimizer, MICRO_BATCH = {micro} samples per micro-step (gradients are averaged: do not divide the loss)",
            f.k
        ));
    }
    if !f.clusters.is_empty() {
        notes.push("op fusion is left to XLA (jax.jit compiles the whole step): the plan's fused op groups are not exported".into());
    }
    notes.extend(unmapped_passes(f, &["amp"], "JAX"));
    Ok(Emitted {
        files: vec![("jax.env".into(), env), ("trainplan_jax.py".into(), py)],
        notes,
    })
}

const JAX_PY: &str = r#"

def is_recomputed(name):
    """Whether the plan recomputes layer `name`: it, or a module containing it, is planned."""
    while name:
        if name in RECOMPUTE_MODULES:
            return True
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return False


def remat(name, fn):
    """`fn` (the forward of layer `name`) under jax.checkpoint when the plan recomputes it: only
    its inputs are saved, its forward is re-run in the backward. Unplanned layers: `fn` as is."""
    if not is_recomputed(name):
        return fn
    import jax

    return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)


def cast_params(params):
    """Floating leaves of `params` in COMPUTE_DTYPE. Call it inside the loss: the gradients
    then come back in the masters' fp32."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(COMPUTE_DTYPE)

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map(cast, params)


def loss_scale_init():
    """The loss-scale state: {"scale", "good_steps"} (scale 1 without fp16)."""
    import jax.numpy as jnp

    scale = INITIAL_LOSS_SCALE if LOSS_SCALING else 1.0
    return {"scale": jnp.asarray(scale, jnp.float32), "good_steps": jnp.asarray(0, jnp.int32)}


def all_finite(tree):
    """True when every leaf of `tree` is finite."""
    import jax
    import jax.numpy as jnp

    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def scaled_value_and_grad(loss_fn):
    """`(params, state, *args) -> (loss, grads, state, finite)`: the value and fp32 gradients of
    `loss_fn(params, *args)`, the loss multiplied by the scale before the backward (so fp16
    gradients do not underflow) and the gradients divided by it after. With fp16 the scale is
    halved when a gradient is not finite (that step must be skipped: make_optimizer does) and
    doubled after LOSS_SCALE_PERIOD finite steps."""
    import jax
    import jax.numpy as jnp

    def step(params, state, *args):
        used = state["scale"]

        def scaled(p, *a):
            return loss_fn(p, *a).astype(jnp.float32) * used

        loss, grads = jax.value_and_grad(scaled)(params, *args)
        grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32) / used, grads)
        finite = all_finite(grads)
        if LOSS_SCALING:
            good = jnp.where(finite, state["good_steps"] + 1, 0)
            grow = good >= LOSS_SCALE_PERIOD
            scale = jnp.where(finite, jnp.where(grow, used * 2.0, used), jnp.maximum(used / 2.0, 1.0))
            state = {"scale": scale, "good_steps": jnp.where(grow, 0, good)}
        return loss / used, grads, state, finite

    return step


def make_optimizer(optimizer):
    """`optimizer` accumulating GRAD_ACCUMULATION micro-steps per update (optax.MultiSteps,
    gradients averaged); with fp16 a micro-step whose gradients are not finite is skipped."""
    import optax

    skip = optax.skip_not_finite if LOSS_SCALING else None
    if GRAD_ACCUMULATION <= 1 and skip is None:
        return optimizer
    return optax.MultiSteps(optimizer, every_k_schedule=GRAD_ACCUMULATION, should_skip_update_fn=skip)
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, decision, file, tiny_plan};
    use super::super::{Facts, Framework, emit};
    use super::*;

    #[test]
    fn tiny_plan_env_and_module() {
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into()];
        let e = emit(&p, Framework::Jax).unwrap();
        check_files(&e);
        // A plan for another framework that fuses tensors: the largest group (4 MiB + 2 KiB).
        let env = check_env(file(&e, "jax.env"));
        assert_eq!(
            env["XLA_FLAGS"],
            "--xla_gpu_all_reduce_combine_threshold_bytes=4196352"
        );
        // A plan made for another framework was not checked against XLA's pool.
        assert!(
            !env.contains_key("XLA_PYTHON_CLIENT_MEM_FRACTION"),
            "{env:?}"
        );
        let py = file(&e, "trainplan_jax.py");
        assert!(py.contains("COMPUTE_DTYPE = \"float16\"\n"));
        assert!(py.contains("LOSS_SCALING = True\n"));
        assert!(py.contains("GRAD_ACCUMULATION = 2\n"));
        assert!(py.contains("MICRO_BATCH = 2\n"));
        assert!(py.contains("RECOMPUTE_MODULES = [\"net.1\"]\n"));
        // The fused op groups are not exported (finding 6: FUSED_REGIONS is gone).
        assert!(!py.contains("FUSED_REGIONS"));
        assert!(e.notes.iter().any(|n| n.contains("left to XLA")));
        // bf16: no loss scaling.
        p.config.dtype = "bf16".into();
        let py = file(&emit(&p, Framework::Jax).unwrap(), "trainplan_jax.py").to_string();
        assert!(py.contains("COMPUTE_DTYPE = \"bfloat16\"\n"));
        assert!(py.contains("LOSS_SCALING = False\n"));
    }

    #[test]
    fn the_threshold_is_the_start_points() {
        let mut p = tiny_plan();
        p.decisions[0] = decision(
            "baseline:jax_tuned",
            &[("combine_threshold_bytes", "8388608")],
            "start",
        );
        let f = Facts::of(&p).unwrap();
        assert_eq!(combine_threshold(&p, &f), Some(8 << 20));
        p.decisions[0] = decision("baseline:jax_default", &[], "start");
        assert_eq!(combine_threshold(&p, &f), None);
        let env = check_env(file(&emit(&p, Framework::Jax).unwrap(), "jax.env"));
        assert!(!env.contains_key("XLA_FLAGS"), "{env:?}");
        // A plan made for JAX: the pool its memory was checked against (jax.yaml's 0.75).
        p.workload.framework = crate::cost::framework::Framework::Jax;
        let env = check_env(file(&emit(&p, Framework::Jax).unwrap(), "jax.env"));
        assert_eq!(env["XLA_PYTHON_CLIENT_MEM_FRACTION"], "0.75", "{env:?}");
        // No start point, no fused tensors: every gradient its own all-reduce.
        p.decisions.clear();
        p.config.tensor_groups = vec![vec!["net.0.weight".into()], vec!["net.0.bias".into()]];
        p.config.partitions.clear();
        let e = emit(&p, Framework::Jax).unwrap();
        assert_eq!(
            check_env(file(&e, "jax.env"))["XLA_FLAGS"],
            "--xla_gpu_all_reduce_combine_threshold_bytes=0"
        );
    }
}
