//! JAX: `jax.env` and `trainplan_jax.py`.
//!
//! * exact tensor groups → `XLA_FLAGS=--xla_gpu_all_reduce_combine_threshold_bytes=<largest
//!   group>` (XLA combines all-reduces up to that size; 0 when the plan fuses no tensors, so
//!   each gradient keeps its own all-reduce);
//! * recomputation → `remat_policy()` = `jax.checkpoint_policies.save_anything_except_these_names`
//!   over the planned layers (tag their outputs with `jax.ad_checkpoint.checkpoint_name(x,
//!   name)`), and `checkpoint(fn)` = `jax.checkpoint(fn, policy=remat_policy())`;
//! * AMP → `COMPUTE_DTYPE` and `cast_params(params)` (floating leaves to the half dtype; keep
//!   fp32 master weights in the optimizer);
//! * gradient accumulation k → `multi_steps(optimizer)` = `optax.MultiSteps(optimizer, k)`;
//! * op fusion → `FUSED_REGIONS` lists the planned clusters' layers for `jax.jit` boundaries.

use super::horovod::names_doc;
use super::{
    EmitError, Emitted, Facts, comment_text, env_line, header, py_groups, py_list, py_str,
    unmapped_passes,
};
use crate::plan::Plan;

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let mut env = header(plan, "JAX environment — `set -a; . ./jax.env; set +a`");
    let threshold = if f.fuses_tensors() {
        f.largest_group_bytes()
    } else {
        Some(0)
    };
    match threshold {
        Some(b) => {
            env.push_str("# all-reduces combined up to the largest planned group (0: none combined)\n");
            env.push_str(&env_line(
                "XLA_FLAGS",
                &format!("--xla_gpu_all_reduce_combine_threshold_bytes={b}"),
            )?);
        }
        None => notes.push("the plan has no tensor_bytes: set --xla_gpu_all_reduce_combine_threshold_bytes to the largest group's bytes".into()),
    }
    let mut py = format!(
        "\"\"\"Apply a trainplan plan to JAX: remat policy, dtype policy, gradient accumulation.\n\n    import trainplan_jax as tp\n    loss_fn = tp.checkpoint(loss_fn)            # tag layer outputs with checkpoint_name\n    params16 = tp.cast_params(params)\n    optimizer = tp.multi_steps(optax.adamw(1e-4))\n\nThe plan and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "JAX policies"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!(
        "COMPUTE_DTYPE = {}\n",
        py_str(match f.half.as_deref() {
            Some("bf16") => "bfloat16",
            Some(_) => "float16",
            None => "float32",
        })
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(&format!(
        "# Layers whose activations are recomputed (tag them with checkpoint_name).\nRECOMPUTE_NAMES = {}\n",
        py_list(&f.recompute, "")
    ));
    py.push_str(&format!(
        "# Planned op fusion: layers to put inside one jax.jit each.\nFUSED_REGIONS = {}\n",
        py_groups(&f.cluster_modules())
    ));
    py.push_str(JAX_PY);
    if !f.recompute.is_empty() {
        notes.push(format!(
            "recomputation: tag the outputs of {} layer(s) with jax.ad_checkpoint.checkpoint_name and wrap the loss in trainplan_jax.checkpoint",
            f.recompute.len()
        ));
    }
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation: optax.MultiSteps(every_k_schedule={}) via trainplan_jax.multi_steps",
            f.k
        ));
    }
    notes.extend(unmapped_passes(f, &["amp"], "JAX"));
    Ok(Emitted {
        files: vec![("jax.env".into(), env), ("trainplan_jax.py".into(), py)],
        notes,
    })
}

const JAX_PY: &str = r#"

def remat_policy():
    """Save everything except the planned layers' tagged outputs (recomputed in the backward)."""
    import jax

    if not RECOMPUTE_NAMES:
        return jax.checkpoint_policies.everything_saveable
    return jax.checkpoint_policies.save_anything_except_these_names(*RECOMPUTE_NAMES)


def checkpoint(fn):
    """`jax.checkpoint` with the planned policy (a no-op policy without recomputation)."""
    import jax

    return jax.checkpoint(fn, policy=remat_policy())


def cast_params(params):
    """Floating leaves of `params` in the compute dtype (keep fp32 masters for the update)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(COMPUTE_DTYPE)

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map(cast, params)


def multi_steps(optimizer):
    """`optax.MultiSteps` accumulating GRAD_ACCUMULATION micro-batches per update."""
    if GRAD_ACCUMULATION <= 1:
        return optimizer
    import optax

    return optax.MultiSteps(optimizer, every_k_schedule=GRAD_ACCUMULATION)
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, file, tiny_plan};
    use super::super::{Framework, emit};

    #[test]
    fn tiny_plan_env_and_module() {
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into()];
        let e = emit(&p, Framework::Jax).unwrap();
        check_files(&e);
        let env = check_env(file(&e, "jax.env"));
        assert_eq!(
            env["XLA_FLAGS"],
            "--xla_gpu_all_reduce_combine_threshold_bytes=4196352"
        );
        let py = file(&e, "trainplan_jax.py");
        assert!(py.contains("COMPUTE_DTYPE = \"float16\"\n"));
        assert!(py.contains("GRAD_ACCUMULATION = 2\n"));
        assert!(py.contains("RECOMPUTE_NAMES = [\"net.1\"]\n"));
        assert!(py.contains("    [\"net.3\", \"act.3\"],\n"));
    }

    #[test]
    fn unfused_tensors_combine_nothing() {
        let mut p = tiny_plan();
        p.config.tensor_groups = vec![vec!["net.0.weight".into()], vec!["net.0.bias".into()]];
        let e = emit(&p, Framework::Jax).unwrap();
        let env = check_env(file(&e, "jax.env"));
        assert_eq!(
            env["XLA_FLAGS"],
            "--xla_gpu_all_reduce_combine_threshold_bytes=0"
        );
    }
}
