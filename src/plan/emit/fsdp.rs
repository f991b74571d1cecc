//! PyTorch FSDP2: the part of `trainplan_patch.py` that applies `config.sharding` (issue 23).
//! The PyTorch emitter ([`super::pytorch`]) writes these constants and `apply_fsdp(model,
//! mesh=None)` into every module; for a sharded plan the module's docstring shows the FSDP2
//! loop and `apply_plan` (DDP) refuses to run.
//!
//! | plan (`config.sharding`) | `trainplan_patch.py` |
//! |---|---|
//! | `stage` 3 (1 and 2: refused, per [`shard_supported`]) | `torch.distributed.fsdp.fully_shard` |
//! | `units` (module paths, forward order; `""` the root) | `FSDP_UNITS`: one `fully_shard` per unit, looked up by exact module path (missing ones raise `PlanMismatch` listing a few; so does a `ModuleList`/`ModuleDict`, whose forward never runs), bottom-up, then the root |
//! | `reshard` | `reshard_after_forward` of the units; the root keeps FSDP2's default (`None`: not resharded after the forward) |
//! | `prefetch` p ≥ 1 | `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`: each FSDP module prefetches the next p in its pass's order (root first, then the units forward / reversed); p = 0: no lists (FSDP2's implicit behaviour, which still prefetches one unit in the backward; said in a note) |
//! | `shard_size`, `replicas` | a 1-D mesh `("shard",)`, or for `replicas > 1` the HSDP mesh `(replicas, shard_size)` named `("replicate", "shard")` |
//! | `offload` | refused: FSDP2's `CPUOffloadPolicy` moves parameters and gradients too, not only the optimizer state the plan counts |
//! | `dtype` (AMP) | `MixedPrecisionPolicy(param_dtype=half, reduce_dtype=float32)` on every `fully_shard`; fp32: FSDP2's default policy |
//! | `grad_accumulation` k | `accumulate(model, step)`: `set_requires_gradient_sync(False)` on k−1 micro-steps, `True` on the last |
//!
//! Unit names come from the plan: they reach the file through [`py_str`] only.

use super::{EmitError, py_list};
use crate::cost::framework::Framework;
use crate::plan::{Plan, ShardConfig};
use crate::search::framework::shard_supported;

/// The plan's sharding, when the PyTorch export applies it: `None` for an unsharded plan;
/// stages FSDP2 has no setting for and offloading are refused, naming the field.
pub(super) fn sharding(plan: &Plan) -> Result<Option<&ShardConfig>, EmitError> {
    let Some(sh) = &plan.config.sharding else {
        return Ok(None);
    };
    if let Err(why) = shard_supported(Framework::Pytorch, sh.stage, sh.replicas, sh.reshard) {
        return Err(EmitError::Unsupported {
            field: "config.sharding.stage".into(),
            why: format!("{}: {why}", sh.stage),
        });
    }
    if sh.offload {
        return Err(EmitError::Unsupported {
            field: "config.sharding.offload".into(),
            why: "FSDP2's CPUOffloadPolicy moves parameters and gradients to the CPU too, not only the optimizer state the plan counts".into(),
        });
    }
    Ok(Some(sh))
}

/// The module's FSDP2 constants (neutral values for an unsharded plan, whose `apply_fsdp`
/// refuses to run).
pub(super) fn constants(sh: Option<&ShardConfig>) -> String {
    let units: Vec<String> = sh.map(|s| s.units.clone()).unwrap_or_default();
    let py_bool = |b: bool| if b { "True" } else { "False" };
    format!(
        "# Sharded data parallelism: FSDP2 fully_shard (apply_fsdp) when True; DDP (apply_plan) when False.\n\
         SHARDED = {}\n\
         # FSDP units (module paths, forward order; \"\" is the root, sharded last).\n\
         FSDP_UNITS = {}\n\
         # reshard_after_forward of the units (the root keeps FSDP2's default).\n\
         FSDP_RESHARD_AFTER_FORWARD = {}\n\
         # Units each FSDP module all-gathers ahead (explicit forward and backward prefetch); 0: FSDP2's implicit prefetch.\n\
         FSDP_PREFETCH = {}\n\
         # Mesh: FSDP_REPLICAS groups of FSDP_SHARD_SIZE ranks (HSDP when FSDP_REPLICAS > 1).\n\
         FSDP_REPLICAS = {}\n\
         FSDP_SHARD_SIZE = {}\n",
        py_bool(sh.is_some()),
        py_list(&units, ""),
        py_bool(sh.is_none_or(|s| s.reshard)),
        sh.map_or(0, |s| s.prefetch),
        sh.map_or(1, |s| s.replicas),
        sh.map_or(0, |s| s.shard_size),
    )
}

/// What the user must know about the FSDP2 path of a sharded plan.
pub(super) fn notes(sh: &ShardConfig, half: Option<&str>, reduce_half: bool) -> Vec<String> {
    let n = sh.units.iter().filter(|u| !u.is_empty()).count();
    let mesh = if sh.replicas > 1 {
        format!(
            "the HSDP mesh ({}, {}) (\"replicate\", \"shard\")",
            sh.replicas, sh.shard_size
        )
    } else {
        format!("a 1-D mesh of {} ranks", sh.shard_size)
    };
    let policy = match half {
        Some(h) => {
            let half = if h == "bf16" { "bfloat16" } else { "float16" };
            format!(
                "MixedPrecisionPolicy(param_dtype={half}, reduce_dtype={})",
                if reduce_half { half } else { "float32" }
            )
        }
        None => "FSDP2's default MixedPrecisionPolicy (fp32)".to_string(),
    };
    let mut out = vec![format!(
        "FSDP2: call apply_fsdp(model) after torch.distributed.init_process_group, instead of apply_plan, and build the optimizer after it (its parameters become sharded DTensors): fully_shard on {n} planned unit(s), then the root, on {mesh}, reshard_after_forward={} on the units, {policy}",
        if sh.reshard { "True" } else { "False" }
    )];
    if sh.prefetch == 0 {
        out.push("prefetch 0: no explicit prefetch lists are set; FSDP2 still all-gathers the next unit ahead in the backward (its default), which the plan does not count".into());
    } else {
        out.push(format!(
            "prefetch {}: each FSDP module prefetches the next {} unit(s) of its pass (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch)",
            sh.prefetch, sh.prefetch
        ));
    }
    out
}

/// The module docstring of a sharded plan (fixed text: no plan string may reach a docstring).
pub(super) const FSDP_DOC: &str = r#""""Apply a trainplan plan to a PyTorch training loop with FSDP2 (the plan shards the model).

    from trainplan_patch import (apply_fsdp, check_optimizer, autocast_context, make_grad_scaler,
                                 accumulate, is_update_step, scale_loss, optimizer_kwargs, MICRO_BATCH)
    model = apply_fsdp(model)          # after init_process_group (apply_fsdp(model, mesh) to pass a mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **optimizer_kwargs())  # after apply_fsdp
    check_optimizer(model, optimizer)
    scaler = make_grad_scaler()
    for step, batch in enumerate(loader):   # a loader of MICRO_BATCH samples per step
        with accumulate(model, step), autocast_context():
            loss = scale_loss(loss_fn(model(batch)))
        scaler.scale(loss).backward()
        if is_update_step(step):
            scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

apply_fsdp(model, mesh=None) checks the planned names, checkpoints and compiles the planned
modules, then calls torch.distributed.fsdp.fully_shard on each module of FSDP_UNITS (looked up
by module path, bottom-up), then on the root: reshard_after_forward=FSDP_RESHARD_AFTER_FORWARD
on the units (the root keeps FSDP2's default), MixedPrecisionPolicy(param_dtype=the half
dtype, reduce_dtype=float32) under AMP, and each FSDP module prefetches the next FSDP_PREFETCH
modules of the forward (root, then the units in order) and of the backward (root, then the
units reversed). Without a mesh it builds one with init_device_mesh: 1-D over FSDP_SHARD_SIZE
ranks, or with FSDP_REPLICAS > 1 the HSDP mesh (FSDP_REPLICAS, FSDP_SHARD_SIZE) named
("replicate", "shard").

Gradient accumulation: DDP's no_sync() does not exist in FSDP2. accumulate(model, step) calls
model.set_requires_gradient_sync(False) on the first GRAD_ACCUMULATION - 1 micro-steps and
True on the last: no reduce-scatter (nor HSDP all-reduce) until the window's last backward,
the unsharded gradients accumulate on each rank, and the parameters are still resharded after
each backward and gathered again for the next micro-step.

The plan (model, cluster, --framework, predicted times) and whose names it uses are in the
comments below.
"""
"#;

/// The FSDP2 helpers (read `SHARDED`, `FSDP_*`, `DTYPE`, and the PyTorch module's
/// `check_names`, `apply_checkpointing`, `apply_compile`, `set_device_type`).
pub(super) const FSDP_PY: &str = r#"

def fsdp_units(model):
    """The planned FSDP units other than the root ("") as (name, module) pairs of `model`, in
    the plan's forward order. Raise PlanMismatch listing a few the model lacks, or naming a unit
    that is a ModuleList / ModuleDict: its forward never runs, so FSDP2's hooks would never
    gather its parameters."""
    import torch

    modules = dict(model.named_modules())
    names = [u for u in FSDP_UNITS if u != ""]
    missing = [u for u in names if u not in modules]
    if missing:
        raise _missing_error("FSDP units", missing, len(names))
    for u in names:
        if isinstance(modules[u], (torch.nn.ModuleList, torch.nn.ModuleDict)):
            raise PlanMismatch(
                "FSDP unit %r is a %s, whose forward never runs: wrap its children instead "
                "(shard:units=%s.*)" % (u, type(modules[u]).__name__, u)
            )
    return [(u, modules[u]) for u in names]


def mixed_precision_policy():
    """The planned MixedPrecisionPolicy: under AMP, parameters gathered in the half dtype and
    gradients reduced in float32, or in the half dtype when the plan says so (GRAD_REDUCE_DTYPE);
    fp32: FSDP2's default (no casting)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if DTYPE == "fp32":
        return MixedPrecisionPolicy()
    half = torch.float16 if DTYPE == "fp16" else torch.bfloat16
    reduce = torch.float32 if GRAD_REDUCE_DTYPE is None else half
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=reduce)


def planned_mesh_shape():
    """(FSDP_REPLICAS, FSDP_SHARD_SIZE) for HSDP, else (FSDP_SHARD_SIZE,)."""
    if FSDP_REPLICAS > 1:
        return (FSDP_REPLICAS, FSDP_SHARD_SIZE)
    return (FSDP_SHARD_SIZE,)


def device_mesh(device_type="cpu"):
    """The planned mesh: 1-D over FSDP_SHARD_SIZE ranks ("shard",) or, with FSDP_REPLICAS > 1,
    the HSDP mesh (FSDP_REPLICAS, FSDP_SHARD_SIZE) named ("replicate", "shard"): parameters
    sharded inside each group of FSDP_SHARD_SIZE consecutive ranks, replicated across the
    groups. The process group must hold exactly the planned ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != FSDP_REPLICAS * FSDP_SHARD_SIZE:
        raise PlanMismatch(
            "the plan shards over %d ranks (%d replicas x %d), the process group has %d"
            % (FSDP_REPLICAS * FSDP_SHARD_SIZE, FSDP_REPLICAS, FSDP_SHARD_SIZE, world)
        )
    if FSDP_REPLICAS > 1:
        return init_device_mesh(device_type, planned_mesh_shape(), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, planned_mesh_shape(), mesh_dim_names=("shard",))


def _fsdp_device_type(model):
    """The device FSDP2 computes on: the model's when it is on an accelerator, else CUDA when
    available (fully_shard moves a CPU model there), else the CPU."""
    import torch

    p = next(iter(model.parameters()), None)
    if p is not None and p.device.type not in ("cpu", "meta"):
        return p.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_fsdp(model, mesh=None, *, device_type=None, checkpointing=True, compile=True, compile_kwargs=None):
    """Shard `model` as planned with FSDP2 and return it (the same module, now an FSDPModule):
    checked names, checkpointing, compiled regions, then fully_shard on each planned unit
    (bottom-up) and on the root, with the planned reshard_after_forward, mixed-precision policy,
    prefetch and mesh (device_mesh() when `mesh` is None). Call it after init_process_group and
    build the optimizer after it."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if PARALLEL:
        raise ValueError("this plan lays the model out over tensor / pipeline parallelism: use apply_parallel(model, loss_fn)")
    if not SHARDED:
        raise ValueError("this plan does not shard the model: use apply_plan (DistributedDataParallel)")
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError("apply_fsdp needs the model before fully_shard: it shards the planned units itself")
    check_names(model)
    units = fsdp_units(model)
    device_type = device_type or _fsdp_device_type(model)
    set_device_type(device_type)
    if mesh is None:
        mesh = device_mesh(device_type)
    elif tuple(mesh.shape) != planned_mesh_shape():
        warnings.warn("the mesh %s is not the planned %s" % (tuple(mesh.shape), planned_mesh_shape()))
    if checkpointing:
        apply_checkpointing(model)
    if compile:
        apply_compile(model, None, **(compile_kwargs or {}))
    policy = mixed_precision_policy()
    # Bottom-up: fully_shard groups the parameters no inner call has grouped yet.
    for _, module in sorted(units, key=lambda u: -u[0].count(".")):
        fully_shard(module, mesh=mesh, reshard_after_forward=FSDP_RESHARD_AFTER_FORWARD, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if FSDP_PREFETCH > 0:
        forward = [model] + [m for _, m in units]
        backward = [model] + [m for _, m in reversed(units)]
        for i, m in enumerate(forward):
            if forward[i + 1 : i + 1 + FSDP_PREFETCH]:
                m.set_modules_to_forward_prefetch(forward[i + 1 : i + 1 + FSDP_PREFETCH])
        for i, m in enumerate(backward):
            if backward[i + 1 : i + 1 + FSDP_PREFETCH]:
                m.set_modules_to_backward_prefetch(backward[i + 1 : i + 1 + FSDP_PREFETCH])
    return model
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_files, file, tiny_plan};
    use super::super::{EmitError, Framework, emit};
    use crate::plan::ShardConfig;

    fn sharded(stage: u32, replicas: u32, prefetch: u32) -> crate::plan::Plan {
        let mut p = tiny_plan();
        p.config.sharding = Some(ShardConfig {
            stage,
            shard_size: 8 / replicas,
            replicas,
            reshard: false,
            prefetch,
            offload: false,
            units: ["", "net.0", "net.1"].map(String::from).to_vec(),
            unit_bytes: vec![0, 1 << 20, 1 << 20],
        });
        p
    }

    #[test]
    fn a_sharded_plan_writes_the_fsdp2_path() {
        let e = emit(&sharded(3, 2, 2), Framework::Pytorch).unwrap();
        check_files(&e);
        let py = file(&e, "trainplan_patch.py");
        for line in [
            "SHARDED = True\n",
            "FSDP_UNITS = [\"\", \"net.0\", \"net.1\"]\n",
            "FSDP_RESHARD_AFTER_FORWARD = False\n",
            "FSDP_PREFETCH = 2\n",
            "FSDP_REPLICAS = 2\n",
            "FSDP_SHARD_SIZE = 4\n",
            "def apply_fsdp(model, mesh=None, *",
        ] {
            assert!(py.contains(line), "{line} missing:\n{py}");
        }
        let doc = py.split("\"\"\"").nth(1).unwrap();
        for word in [
            "apply_fsdp",
            "set_requires_gradient_sync",
            "check_optimizer",
        ] {
            assert!(doc.contains(word), "{word} missing from the docstring");
        }
        // No DDP advice for a sharded plan: its groups are FSDP2's, not buckets.
        assert!(
            !e.notes.iter().any(|n| n.contains("DDP buckets")),
            "{:?}",
            e.notes
        );
        assert!(
            e.notes.iter().any(|n| n.contains("apply_fsdp")
                && n.contains("HSDP mesh (2, 4)")
                && n.contains("param_dtype=float16")),
            "{:?}",
            e.notes
        );
        assert!(
            e.notes
                .iter()
                .any(|n| n.contains("set_requires_gradient_sync"))
        );
        // The tiny plan's amp decision reduces in fp16 (fp16_allreduce=1): so does FSDP2's
        // policy; without the knob it reduces in float32.
        let policy = |p: &crate::plan::Plan| -> String {
            emit(p, Framework::Pytorch)
                .unwrap()
                .notes
                .into_iter()
                .find(|n| n.contains("MixedPrecisionPolicy"))
                .unwrap()
        };
        assert!(py.contains("reduce = torch.float32 if GRAD_REDUCE_DTYPE is None else half"));
        let mut plain = sharded(3, 2, 2);
        assert!(
            policy(&plain).contains("param_dtype=float16, reduce_dtype=float16"),
            "{}",
            policy(&plain)
        );
        for d in plain.decisions.iter_mut().filter(|d| d.pass == "amp") {
            d.knobs.remove("fp16_allreduce");
        }
        assert!(policy(&plain).contains("param_dtype=float16, reduce_dtype=float32"));
    }

    #[test]
    fn an_unsharded_plan_keeps_the_ddp_path() {
        let e = emit(&tiny_plan(), Framework::Pytorch).unwrap();
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains("\nSHARDED = False\n"), "{py}");
        assert!(py.contains("\nFSDP_UNITS = []\n"), "{py}");
        assert!(py.contains("model = apply_plan(model)"));
        assert!(!e.notes.iter().any(|n| n.contains("apply_fsdp")));
    }

    #[test]
    fn stages_fsdp2_cannot_apply_and_offload_are_refused_naming_the_field() {
        for stage in [1, 2] {
            let e = emit(&sharded(stage, 1, 1), Framework::Pytorch).unwrap_err();
            assert!(
                matches!(&e, EmitError::Unsupported { field, .. } if field == "config.sharding.stage"),
                "{e}"
            );
            assert!(e.to_string().contains("deepspeed"), "{e}");
        }
        let mut p = sharded(3, 1, 0);
        p.config.sharding.as_mut().unwrap().offload = true;
        let e = emit(&p, Framework::Pytorch).unwrap_err().to_string();
        assert!(e.contains("config.sharding.offload"), "{e}");
        // Prefetch 0 says what FSDP2 still does.
        let e = emit(&sharded(3, 1, 0), Framework::Pytorch).unwrap();
        assert!(e.notes.iter().any(|n| n.starts_with("prefetch 0")));
    }

    /// Unit names are plan text: they reach the module as escaped literals only.
    #[test]
    fn hostile_unit_names_stay_inside_their_literals() {
        let mut p = sharded(3, 1, 1);
        p.config.sharding.as_mut().unwrap().units[1] =
            "a\"\"\"\nimport os; os.system('x')\n\\é".into();
        let e = emit(&p, Framework::Pytorch).unwrap();
        check_files(&e);
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains(
            "FSDP_UNITS = [\"\", \"a\\\"\\\"\\\"\\nimport os; os.system('x')\\n\\\\\\xe9\", \"net.1\"]"
        ), "{py}");
        assert!(!py.lines().any(|l| l.starts_with("import os")));
    }
}
