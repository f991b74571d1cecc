//! PyTorch: `trainplan_patch.py`, a module with `apply_plan(model, optimizer=None, *,
//! ddp_kwargs=None)` and helpers.
//!
//! * exact tensor groups → DDP buckets: `bucket_cap_mb_list` (one cap per planned group, MiB)
//!   where the installed `DistributedDataParallel.__init__` has it (checked with
//!   `inspect.signature`), else one `bucket_cap_mb` = the largest group in MiB and the first
//!   bucket's cap (`dist._DEFAULT_FIRST_BUCKET_BYTES`) = the first group's bytes. DDP fills
//!   buckets in gradient-ready order = reverse parameter registration order, so a plan group is
//!   one bucket only when its tensors are contiguous in that order: checked, with a warning;
//! * AMP → `autocast_context()` (`torch.autocast("cuda", dtype)`) and `make_grad_scaler()`
//!   (`torch.amp.GradScaler`, enabled for fp16 only);
//! * recomputation → the planned modules' `forward` wrapped in
//!   `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` (training only);
//! * op fusion → `module.compile()` (or `torch.compile(module.forward)`) on the modules of each
//!   fused cluster: the longest common module prefix of its layers, resolved at run time to the
//!   nearest module the user's model has (`layer3.5.add`, a functional op, → `layer3.5`);
//! * names: every planned parameter must exist (else `PlanMismatch` listing a few missing);
//!   planned modules without any counterpart are skipped with a warning;
//! * gradient accumulation k → `accumulate(model, step)`: `model.no_sync()` for k−1 micro-steps,
//!   and `is_update_step(step)`;
//! * `fused-adam` → `optimizer_kwargs()` = `{"fused": True}`.

use super::horovod::names_doc;
use super::{
    EmitError, Emitted, Facts, comment_text, header, py_groups, py_ints, py_list, py_str,
    unmapped_passes,
};
use crate::plan::Plan;

/// The module each fused cluster compiles: the longest common dotted prefix of its layer
/// names, or the layers themselves when they share none.
pub fn compile_modules(f: &Facts) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for layers in f.cluster_modules() {
        let parts: Vec<Vec<&str>> = layers.iter().map(|l| l.split('.').collect()).collect();
        let Some(first) = parts.first() else { continue };
        let mut n = first.len();
        for p in &parts[1..] {
            n = n.min(first.iter().zip(p).take_while(|(a, b)| a == b).count());
        }
        let chosen: Vec<String> = if n > 0 {
            vec![first[..n].join(".")]
        } else {
            layers.clone()
        };
        for c in chosen {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    // A module inside another compiled one is compiled with it.
    let all = out.clone();
    out.retain(|m| {
        !all.iter()
            .any(|p| m != p && m.starts_with(p.as_str()) && m[p.len()..].starts_with('.'))
    });
    out
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let compile = compile_modules(f);
    let bytes = f.group_bytes.clone().unwrap_or_default();
    let mut py = format!(
        "\"\"\"Apply a trainplan plan to a PyTorch training loop.\n\n    from trainplan_patch import apply_plan, autocast_context, make_grad_scaler, accumulate\n    model = apply_plan(model)          # after init_process_group, before training\n    scaler = make_grad_scaler()\n    for step, batch in enumerate(loader):\n        with accumulate(model, step), autocast_context():\n            loss = model(batch)\n        scaler.scale(loss).backward()\n        if is_update_step(step):\n            scaler.step(optimizer); scaler.update(); optimizer.zero_grad()\n\nThe plan (model, cluster, predicted times) and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\nimport contextlib\nimport inspect\nimport warnings\n\n",
        header(plan, "PyTorch patch"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!("NAMES = {}\n", py_str(&plan.workload.names)));
    py.push_str(&format!(
        "# DDP buckets = the plan's collectives, in gradient-ready order, as parameter names.\nTENSOR_GROUPS = {}\n",
        py_groups(&f.groups)
    ));
    py.push_str(&format!("GROUP_BYTES = {}\n", py_ints(&bytes)));
    py.push_str(&format!(
        "DTYPE = {}  # compute dtype under autocast; \"fp32\": no AMP\n",
        py_str(f.half.as_deref().unwrap_or("fp32"))
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(&format!(
        "# Modules whose activations are recomputed in the backward (torch.utils.checkpoint).\nRECOMPUTE_MODULES = {}\n",
        py_list(&f.recompute, "")
    ));
    py.push_str(&format!(
        "# Modules compiled as one region each (planned op fusion).\nCOMPILE_MODULES = {}\n",
        py_list(&compile, "")
    ));
    py.push_str(&format!(
        "FUSED_ADAM = {}\n",
        if f.passes.iter().any(|p| p == "fused-adam") {
            "True"
        } else {
            "False"
        }
    ));
    py.push_str(PYTORCH_PY);
    if f.group_bytes.is_none() {
        notes.push("the plan has no tensor_bytes: DDP keeps its default bucket sizes".into());
    }
    if f.half.is_some() {
        notes.push(format!(
            "AMP ({}): run forward and loss under autocast_context() and step through make_grad_scaler()",
            f.half.as_deref().unwrap_or("fp16")
        ));
    }
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation k = {}: wrap each micro-step in accumulate(model, step) and step the optimizer when is_update_step(step)",
            f.k
        ));
    }
    if !f.recompute.is_empty() {
        notes.push(format!(
            "activation checkpointing of {} module(s), applied by apply_plan",
            f.recompute.len()
        ));
    }
    if !compile.is_empty() {
        notes.push(format!(
            "torch.compile of {} module(s) where op fusion was planned, applied by apply_plan (compile=False to skip)",
            compile.len()
        ));
    }
    notes.extend(unmapped_passes(f, &["amp", "fused-adam"], "PyTorch"));
    notes.push("call apply_plan(model) after torch.distributed.init_process_group and before wrapping in DistributedDataParallel: it wraps the model itself".into());
    Ok(Emitted {
        files: vec![("trainplan_patch.py".into(), py)],
        notes,
    })
}

const PYTORCH_PY: &str = r#"

class PlanMismatch(ValueError):
    """The model lacks parameters or modules the plan names."""


def _missing_error(kind, missing, total):
    return PlanMismatch(
        "%d of %d planned %s are not in the model, e.g. %s (the plan uses %s names)"
        % (len(missing), total, kind, ", ".join(missing[:5]), NAMES)
    )


def check_names(model):
    """Raise PlanMismatch when `model` lacks a planned parameter or module."""
    params = dict(model.named_parameters())
    planned = [n for g in TENSOR_GROUPS for n in g]
    missing = [n for n in planned if n not in params]
    if missing:
        raise _missing_error("parameters", missing, len(planned))
    wanted = RECOMPUTE_MODULES + COMPILE_MODULES
    missing = [n for n in wanted if _resolve(model, n) is None]
    if missing:
        warnings.warn(
            "%d planned modules have no counterpart in the model and are skipped, e.g. %s"
            % (len(missing), ", ".join(missing[:5]))
        )


def _resolve(model, name):
    """The module `name`, or its nearest ancestor that is a module of `model` (a planned layer
    may be a functional op such as `layer3.5.add` inside the block `layer3.5`); None when only
    the root would do."""
    modules = dict(model.named_modules())
    while name:
        if name in modules:
            return name
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return None


def _resolved(model, names):
    """Planned module names resolved in `model`, deduplicated, none inside another."""
    out = []
    for n in names:
        r = _resolve(model, n)
        if r is not None and r not in out:
            out.append(r)
    return [m for m in out if not any(m.startswith(p + ".") for p in out)]


def _ready_order(model):
    """Parameter names in gradient-ready order (DDP's: reverse registration order)."""
    return [n for n, p in reversed(list(model.named_parameters())) if p.requires_grad]


def contiguous_groups(model):
    """True when every planned group is a contiguous run of the gradient-ready order (DDP
    buckets can only be such runs); warns naming the first group that is not."""
    position = {n: i for i, n in enumerate(_ready_order(model))}
    for i, g in enumerate(TENSOR_GROUPS):
        idx = sorted(position[n] for n in g if n in position)
        if idx and idx[-1] - idx[0] + 1 != len(idx):
            warnings.warn(
                "planned group %d (%s, ...) is not contiguous in gradient-ready order: "
                "DDP buckets will differ from the plan" % (i, g[0])
            )
            return False
    return True


def bucket_kwargs(model=None):
    """DDP keyword arguments that make its buckets the plan's groups."""
    if not GROUP_BYTES:
        return {}
    from torch.nn.parallel import DistributedDataParallel

    mib = [b / float(1 << 20) for b in GROUP_BYTES]
    if model is not None:
        contiguous_groups(model)
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    if "bucket_cap_mb_list" in params:
        return {"bucket_cap_mb_list": mib}
    # One cap for every bucket: the largest planned group. DDP closes a bucket once it reaches
    # the cap, so smaller groups may merge; the first bucket has its own cap.
    try:
        import torch.distributed as dist

        if hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES"):
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(GROUP_BYTES[0])
    except ImportError:
        pass
    return {"bucket_cap_mb": max(mib)}


def autocast_context(device_type="cuda"):
    """`torch.autocast` in the planned dtype, or a no-op context without AMP."""
    if DTYPE == "fp32":
        return contextlib.nullcontext()
    import torch

    dtype = torch.float16 if DTYPE == "fp16" else torch.bfloat16
    return torch.autocast(device_type, dtype=dtype)


def make_grad_scaler(device_type="cuda"):
    """A GradScaler, enabled for fp16 (bf16 and fp32 need none: it is then a pass-through)."""
    import torch

    enabled = DTYPE == "fp16"
    try:
        return torch.amp.GradScaler(device_type, enabled=enabled)
    except (AttributeError, TypeError):
        return torch.cuda.amp.GradScaler(enabled=enabled)


def optimizer_kwargs():
    """Extra optimizer arguments the plan asks for (fused Adam)."""
    return {"fused": True} if FUSED_ADAM else {}


def apply_checkpointing(model):
    """Recompute the planned modules' activations in the backward."""
    from torch.utils.checkpoint import checkpoint
    import torch

    modules = dict(model.named_modules())
    for name in _resolved(model, RECOMPUTE_MODULES):
        module = modules[name]
        original = module.forward

        def forward(*args, _original=original, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)
            return _original(*args, **kwargs)

        module.forward = forward
    return model


def apply_compile(model, **compile_kwargs):
    """Compile each planned fusion region (parameter names are unchanged)."""
    import torch

    modules = dict(model.named_modules())
    for name in _resolved(model, COMPILE_MODULES):
        module = modules[name]
        if hasattr(module, "compile"):
            module.compile(**compile_kwargs)
        else:
            module.forward = torch.compile(module.forward, **compile_kwargs)
    return model


def is_update_step(step):
    """True on the micro-step that ends an accumulation window (always without accumulation)."""
    return (step + 1) % GRAD_ACCUMULATION == 0


def accumulate(model, step):
    """`model.no_sync()` on the first k-1 micro-steps of each window, else a no-op context."""
    if GRAD_ACCUMULATION > 1 and not is_update_step(step) and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def apply_plan(model, optimizer=None, *, ddp=None, ddp_kwargs=None, checkpointing=True, compile=True):
    """Apply the plan to `model` (not yet wrapped in DistributedDataParallel) and return the
    model to train: checked names, checkpointing, compiled regions, and, when a process group
    is initialised (or ddp=True), DDP with the planned buckets. `optimizer` is only checked."""
    inner = getattr(model, "module", None)
    if inner is not None and type(model).__name__ == "DistributedDataParallel":
        raise ValueError(
            "apply_plan needs the model before DistributedDataParallel wraps it: "
            "buckets are fixed when DDP is built"
        )
    check_names(model)
    if optimizer is not None:
        planned = {n for g in TENSOR_GROUPS for n in g}
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        lost = [n for n, p in model.named_parameters() if n in planned and id(p) not in owned]
        if lost:
            warnings.warn("the optimizer does not update %d planned parameters, e.g. %s" % (len(lost), lost[0]))
    if checkpointing:
        apply_checkpointing(model)
    if compile:
        apply_compile(model)
    if ddp is None:
        try:
            import torch.distributed as dist

            ddp = dist.is_available() and dist.is_initialized()
        except ImportError:
            ddp = False
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        kwargs = bucket_kwargs(model)
        kwargs.update(ddp_kwargs or {})
        model = DistributedDataParallel(model, **kwargs)
    return model
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_files, file, tiny_plan};
    use super::super::{Facts, Framework, emit};
    use super::*;

    #[test]
    fn tiny_plan_module() {
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into()];
        let e = emit(&p, Framework::Pytorch).unwrap();
        check_files(&e);
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains("GROUP_BYTES = [4195328, 4194304, 4196352, 4194304, 1024]\n"));
        assert!(py.contains("DTYPE = \"fp16\""));
        assert!(py.contains("GRAD_ACCUMULATION = 2\n"));
        // 4 layers, every = ⌈√4⌉ = 2: checkpoints net.0, net.2; net.1 dropped; net.3 is the
        // last segment, kept.
        assert!(py.contains("RECOMPUTE_MODULES = [\"net.1\"]\n"), "{py}");
        // Clusters {net.1, act.1} and {net.3, act.3} share no prefix: their layers are compiled.
        assert!(
            py.contains("COMPILE_MODULES = [\"net.1\", \"act.1\", \"net.3\", \"act.3\"]\n"),
            "{py}"
        );
        assert!(py.contains("FUSED_ADAM = True\n"));
        assert!(py.contains("def apply_plan(model, optimizer=None, *, ddp=None, ddp_kwargs=None"));
        assert!(py.contains("\"bucket_cap_mb_list\" in params"));
        assert!(e.notes.iter().any(|n| n.contains("blueconnect")));
        assert!(e.notes[0].contains("zoo"));
    }

    #[test]
    fn compile_regions_are_common_prefixes() {
        let mut p = tiny_plan();
        p.config.fused_ops = vec![
            vec!["layer1.0.conv1 FW".into(), "layer1.0.bn1 FW".into()],
            vec!["layer1.0.relu FW".into(), "layer1.0.conv2 FW".into()],
            vec!["layer2.0.conv1 BW".into(), "layer2.1.conv1 BW".into()],
            vec!["layer2.1.bn1 FW".into(), "layer2.1.relu FW".into()],
        ];
        let f = Facts::of(&p).unwrap();
        // layer1.0 once; layer2 absorbs layer2.1.
        assert_eq!(compile_modules(&f), vec!["layer1.0", "layer2"]);
    }

    /// The emitted module really applies the plan, when python3 has torch.
    #[test]
    fn runs_against_a_toy_model_when_torch_is_installed() {
        let has_torch = std::process::Command::new("python3")
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_torch {
            eprintln!("python3 with torch not found: skipping the toy-model run");
            return;
        }
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into()];
        p.config.fused_ops.clear();
        let e = emit(&p, Framework::Pytorch).unwrap();
        let dir = std::env::temp_dir().join(format!("trainplan-torch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("trainplan_patch.py"),
            file(&e, "trainplan_patch.py"),
        )
        .unwrap();
        let script = r#"
import torch, trainplan_patch as tp
net = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
model = torch.nn.Module(); model.net = net
model.forward = lambda x: net(x)
m = tp.apply_plan(model, ddp=False, compile=False)
y = net(torch.randn(2, 8, requires_grad=True)).sum(); y.backward()
assert tp.is_update_step(1) and not tp.is_update_step(0)
bad = torch.nn.Module(); bad.other = torch.nn.Linear(2, 2)
try:
    tp.apply_plan(bad, ddp=False)
    raise SystemExit("no error")
except tp.PlanMismatch as e:
    assert "net.3.weight" in str(e), e
print("ok")
"#;
        let o = std::process::Command::new("python3")
            .args(["-c", script])
            .current_dir(&dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}
