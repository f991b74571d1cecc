"""Run an exported trainplan_jax.py / jax.env against real JAX and optax, on CPU.

    python jax_optax.py EXPORT_DIR

Prints one JSON line with what it saw (tests/it/frameworks.rs asserts on it):
* remat: a chain of layers named as the plan names them (the planned recomputed modules and a
  few others), each `y = sin(x @ w)` wrapped in trainplan_jax.remat(name, fn). JAX's saved
  residuals are counted: a layer run normally saves its cos(x @ w); a recomputed one saves only
  its inputs. So `cos_residuals` must equal the layers not recomputed; the gradients with and
  without remat must agree;
* dtype: a layer's output dtype under cast_params (the planned compute dtype) and the gradient
  dtype (fp32 masters);
* loss scaling: a loss whose fp16 backward underflows (a cotangent of 1e-8): plain gradients are
  0, scaled_value_and_grad's are right; an overflowing step reports non-finite, halves the scale
  and make_optimizer skips it (parameters unchanged);
* accumulation: with make_optimizer(optax.sgd), the parameters change only every
  GRAD_ACCUMULATION micro-steps, and k micro-batches give the update of the whole batch;
* XLA_FLAGS: jax.env's flags are accepted by XLA (an unknown flag aborts the process).
"""

import contextlib
import io
import json
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import print_saved_residuals


def residuals(fn, *args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_saved_residuals(fn, *args)
    return buf.getvalue().splitlines()


def chain_loss(tp, names, use_remat):
    def layer(w, h):
        return jnp.sin(h @ w)

    def loss(params, x):
        p = tp.cast_params(params)
        h = x.astype(jnp.dtype(tp.COMPUTE_DTYPE))
        for n in names:
            fn = tp.remat(n, layer) if use_remat else layer
            h = fn(p[n], h)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return loss


def check_remat(tp):
    planned = list(tp.RECOMPUTE_MODULES)
    others = [n for n in ["conv1", "fc", "bn1"] if not tp.is_recomputed(n)]
    names = planned[:12] + others
    d = 8
    key = jax.random.PRNGKey(0)
    params = {n: jax.random.normal(jax.random.fold_in(key, i), (d, d)) * 0.3 for i, n in enumerate(names)}
    x = jax.random.normal(jax.random.PRNGKey(1), (4, d))
    with_remat = chain_loss(tp, names, True)
    plain = chain_loss(tp, names, False)
    lines = residuals(with_remat, params, x)
    g1 = jax.grad(with_remat)(params, x)
    g2 = jax.grad(plain)(params, x)
    err = max(float(jnp.max(jnp.abs(g1[n] - g2[n]))) for n in names)
    # A layer's output dtype under the planned compute dtype.
    h = jnp.sin(x.astype(jnp.dtype(tp.COMPUTE_DTYPE)) @ tp.cast_params(params)[names[0]])
    return {
        "layers": len(names),
        "recomputed": sum(1 for n in names if tp.is_recomputed(n)),
        "cos_residuals": sum(1 for l in lines if "output of cos" in l),
        "remat_grad_error": err,
        "activation_dtype": str(h.dtype),
        "grad_dtype": str(g1[names[0]].dtype),
    }


def check_loss_scaling(tp):
    out = {"loss_scaling": tp.LOSS_SCALING, "compute_dtype": tp.COMPUTE_DTYPE}
    w = {"w": jnp.full((4,), 0.5, jnp.float32)}
    x = jnp.ones((4,), jnp.float32)

    def tiny_loss(params, x):
        # The cotangent entering the half-precision product is 1e-8: below fp16's smallest
        # subnormal (6e-8), so an unscaled fp16 backward loses it.
        p = tp.cast_params(params)
        y = jnp.sum(p["w"] * x.astype(p["w"].dtype))
        return y.astype(jnp.float32) * 1e-8

    plain = jax.grad(tiny_loss)(w, x)["w"]
    state = tp.loss_scale_init()
    loss, grads, state2, finite = jax.jit(tp.scaled_value_and_grad(tiny_loss))(w, state, x)
    out["plain_grad"] = float(plain[0])
    out["scaled_grad"] = float(grads["w"][0])
    out["scaled_loss"] = float(loss)
    out["scale"] = float(state["scale"])
    out["finite"] = bool(finite)

    def huge_loss(params, x):
        p = tp.cast_params(params)
        y = jnp.sum(p["w"] * x.astype(p["w"].dtype))
        return y.astype(jnp.float32) * 1e6

    _, grads, state3, finite = tp.scaled_value_and_grad(huge_loss)(w, state, x)
    out["overflow_finite"] = bool(finite)
    out["scale_after_overflow"] = float(state3["scale"])
    opt = tp.make_optimizer(optax.sgd(0.1))
    s = opt.init(w)
    upd, s = opt.update(grads, s, w)
    new = optax.apply_updates(w, upd)
    out["overflow_step_changed_params"] = bool(jnp.any(new["w"] != w["w"]))
    return out


def check_accumulation(tp):
    k = tp.GRAD_ACCUMULATION
    opt = tp.make_optimizer(optax.sgd(0.5))
    key = jax.random.PRNGKey(2)
    params = {"w": jax.random.normal(key, (3, 2))}
    xs = jax.random.normal(jax.random.PRNGKey(3), (2 * k, 3))

    def loss(p, x):
        return jnp.mean((x @ p["w"]) ** 2)

    state = opt.init(params)
    p = params
    changed = []
    for i, part in enumerate(jnp.split(xs, k)):
        g = jax.grad(loss)(p, part)
        upd, state = opt.update(g, state, p)
        new = optax.apply_updates(p, upd)
        changed.append(bool(jnp.any(new["w"] != p["w"])))
        p = new
    whole = optax.apply_updates(params, optax.sgd(0.5).update(jax.grad(loss)(params, xs), optax.sgd(0.5).init(params))[0])
    return {
        "k": k,
        "changed_at_micro_step": changed,
        "accumulated_update_error": float(jnp.max(jnp.abs(p["w"] - whole["w"]))),
        "micro_batch": tp.MICRO_BATCH,
    }


def check_env(export_dir):
    env = dict(os.environ)
    flags = None
    with open(os.path.join(export_dir, "jax.env")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            env[key] = value.strip('"')
            if key == "XLA_FLAGS":
                flags = env[key]
    r = subprocess.run(
        [sys.executable, "-c", "import jax, jax.numpy as jnp; print(float(jnp.ones(3).sum()))"],
        env=env,
        capture_output=True,
        text=True,
    )
    return {"xla_flags": flags, "xla_flags_accepted": r.returncode == 0 and r.stdout.strip() == "3.0", "xla_stderr": r.stderr[-300:]}


def main():
    export_dir = sys.argv[1]
    sys.path.insert(0, export_dir)
    import trainplan_jax as tp

    seen = {"jax": jax.__version__, "optax": optax.__version__}
    seen.update(check_remat(tp))
    seen.update(check_loss_scaling(tp))
    seen.update(check_accumulation(tp))
    seen.update(check_env(export_dir))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
