//! PyTorch: `trainplan_patch.py`, a module with `apply_plan(model, optimizer=None, *,
//! ddp_kwargs=None)` (DDP) and helpers; for a plan with `config.sharding`, `apply_fsdp(model,
//! mesh=None)` (FSDP2, [`super::fsdp`]) instead, and `apply_plan` refuses.
//!
//! * tensor groups → DDP buckets. DDP fills buckets in gradient-ready order and closes one when
//!   it reaches `bucket_cap_mb` (the first at 1 MiB only while the cap is left at its default),
//!   and rebuilds them from the order it observed in the first synchronised backward. A plan
//!   made with `--framework pytorch` chose its groups that way: the cap of the `ddp_tuned`
//!   start point (decision knob `bucket_cap_bytes`) is written as `BUCKET_CAP_BYTES`; `None`
//!   keeps DDP's default (`ddp_default`). A plan made for another framework has arbitrary
//!   groups: the cap is then the largest group and a note says the buckets will differ;
//! * compiled regions and buckets: compiling a module changes the order its gradients become
//!   ready (the compiled backward hands them over together), and DDP would rebuild different
//!   buckets. `apply_plan` therefore runs the compiled regions eagerly until DDP has rebuilt its
//!   buckets (`_has_rebuilt_buckets`, after the first synchronised step) and compiled from then
//!   on: the buckets are the plan's, compile on or off (tested against real PyTorch);
//! * AMP → `autocast_context()` (`torch.autocast(device, dtype)`, the device being the model's
//!   as `apply_plan` saw it — a fixed `"cuda"` left a CPU model in fp32 without a word) and
//!   `make_grad_scaler()` (`torch.amp.GradScaler`, enabled for fp16 only); gradients reduced in
//!   half (the amp decision's `fp16_allreduce=1`, `GRAD_REDUCE_DTYPE`) → DDP's
//!   `fp16_compress_hook` / `bf16_compress_hook`, registered by `apply_plan` (tested against
//!   real PyTorch on gloo), or FSDP2's `reduce_dtype`;
//! * recomputation → the planned modules' `forward` wrapped in
//!   `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` (training only); a planned
//!   in-place module (torchvision's `ReLU(inplace=True)`) runs out of place, else it would
//!   overwrite the input the checkpoint keeps for the re-run (found on real ResNet-50);
//! * op fusion → `module.compile()` (or `torch.compile(module.forward)`) on the modules of each
//!   fused cluster: the longest common module prefix of its layers, resolved at run time to the
//!   nearest module the user's model has (`layer3.5.add`, a functional op, → `layer3.5`);
//!   a cluster across module blocks (`bert.encoder.layer.3` and `.4`) is compiled per block,
//!   with a note, never as their parent; a container whose `forward` never runs
//!   (`nn.ModuleList`) stands for its children; `apply_plan` warns after the first forward
//!   about a planned region that was not called (issue 27);
//! * names: every planned parameter must exist (else `PlanMismatch` listing a few missing);
//!   planned modules without any counterpart are skipped with a warning;
//! * gradient accumulation k → `accumulate(model, step)`: `model.no_sync()` for k−1 micro-steps
//!   (an FSDP2 model: `set_requires_gradient_sync(False)`),
//!   `is_update_step(step)`, `scale_loss(loss)` = loss / k, and `MICRO_BATCH` = batch / k: each
//!   micro-step must be fed batch/k samples (keeping the loader's batch would double the
//!   effective batch and save no memory);
//! * `fused-adam` → `optimizer_kwargs()` = `{"fused": True}` for `torch.optim.Adam`/`AdamW`;
//!   `apply_plan(model, optimizer)` warns when a given optimizer is not fused;
//! * layers that are not modules of the user's model (the zoo's `loss.*`: the criterion lives
//!   outside it) are left out of the module lists, so `apply_plan` does not warn about them;
//! * a plan from a trace names ATen operators: no compile or checkpoint regions are written,
//!   and a note says what could not be mapped.

use super::fsdp;
use super::native;
use super::torch_helpers::TORCH_HELPERS_PY;
use super::{
    EmitError, Emitted, Facts, comment_text, header, names_doc, py_groups, py_ints, py_list,
    py_str, unmapped_passes,
};
use crate::passes::op_fusion::module_block;
use crate::plan::Plan;

/// The longest common dotted prefix of `layers` (at least one), or `None` when they share none.
fn common_prefix(layers: &[&str]) -> Option<String> {
    let parts: Vec<Vec<&str>> = layers.iter().map(|l| l.split('.').collect()).collect();
    let first = parts.first()?;
    let mut n = first.len();
    for p in &parts[1..] {
        n = n.min(first.iter().zip(p).take_while(|(a, b)| a == b).count());
    }
    (n > 0).then(|| first[..n].join("."))
}

/// Where each fused cluster is compiled, and the clusters that span several module blocks.
pub struct CompileRegions {
    /// Modules to compile, none inside another, in order of first appearance.
    pub modules: Vec<String>,
    /// Clusters whose layers lie in several blocks (one line each: the blocks), compiled as one
    /// region per block: the fusion across the blocks' boundary is not applied.
    pub split: Vec<String>,
}

/// The modules each fused cluster compiles: per module block ([`module_block`]) of its layers, the
/// longest common dotted prefix of the cluster's layers in that block (the layer itself when it
/// is alone there). A cluster never compiles a parent of its blocks: a container such as
/// `bert.encoder.layer` (an `nn.ModuleList`, whose `forward` never runs — issue 27) or the
/// whole `bert` for a fusion of the last encoder layer and the pooler.
pub fn compile_regions(f: &Facts) -> CompileRegions {
    let mut out: Vec<String> = Vec::new();
    let mut split = Vec::new();
    for layers in f.cluster_modules() {
        let mut blocks: Vec<(String, Vec<&str>)> = Vec::new();
        for l in &layers {
            let b = module_block(l);
            match blocks.iter_mut().find(|(x, _)| *x == b) {
                Some((_, v)) => v.push(l),
                None => blocks.push((b, vec![l])),
            }
        }
        if blocks.len() > 1 {
            split.push(
                blocks
                    .iter()
                    .map(|(b, _)| b.as_str())
                    .collect::<Vec<_>>()
                    .join(" + "),
            );
        }
        for (_, members) in blocks {
            let c = if members.len() == 1 {
                members[0].to_string()
            } else {
                common_prefix(&members).unwrap_or_else(|| members[0].to_string())
            };
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
    CompileRegions {
        modules: out,
        split,
    }
}

/// Layers of a zoo plan that are not modules of the user's model (the criterion).
fn is_module(layer: &str) -> bool {
    layer != "loss" && !layer.starts_with("loss.")
}

/// `bucket_cap_bytes` of the plan's start point, and whether the plan's groups are DDP's
/// (made with `--framework pytorch`).
pub fn bucket_cap(plan: &Plan) -> (Option<u64>, bool) {
    let start = plan
        .decisions
        .iter()
        .find(|d| d.pass.starts_with("baseline:"));
    let cap = start
        .and_then(|d| d.knobs.get("bucket_cap_bytes"))
        .and_then(|v| v.parse().ok());
    let ddp = plan.workload.framework == crate::cost::framework::Framework::Pytorch
        && start.is_some_and(|d| d.pass.starts_with("baseline:ddp_"));
    (cap, ddp)
}

/// The module docstring of an unsharded (DDP) plan: fixed text.
const DDP_DOC: &str = "\"\"\"Apply a trainplan plan to a PyTorch training loop.\n\n    from trainplan_patch import (apply_plan, autocast_context, make_grad_scaler, accumulate,\n                                 is_update_step, scale_loss, optimizer_kwargs, MICRO_BATCH)\n    model = apply_plan(model)          # after init_process_group, instead of DistributedDataParallel(model)\n    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **optimizer_kwargs())\n    scaler = make_grad_scaler()\n    for step, batch in enumerate(loader):   # a loader of MICRO_BATCH samples per step\n        with accumulate(model, step), autocast_context():\n            loss = scale_loss(loss_fn(model(batch)))\n        scaler.scale(loss).backward()\n        if is_update_step(step):\n            scaler.step(optimizer); scaler.update(); optimizer.zero_grad()\n\nThe plan (model, cluster, --framework, predicted times) and whose names it uses are in the\ncomments below.\n\"\"\"\n";

/// The modules the module compiles and checkpoints (none for a trace's ATen names), and the
/// compile regions (for the note on split clusters).
fn regions_of(plan: &Plan, f: &Facts) -> (CompileRegions, Vec<String>, Vec<String>) {
    let trace = plan.workload.names == "trace";
    let regions = if trace {
        CompileRegions {
            modules: Vec::new(),
            split: Vec::new(),
        }
    } else {
        compile_regions(f)
    };
    let compile: Vec<String> = regions
        .modules
        .iter()
        .filter(|m| is_module(m))
        .cloned()
        .collect();
    let recompute: Vec<String> = if trace {
        Vec::new()
    } else {
        f.recompute
            .iter()
            .filter(|m| is_module(m))
            .cloned()
            .collect()
    };
    (regions, compile, recompute)
}

/// DDP's bucket cap for the module (`None`: DDP's default), with a note when the plan's groups
/// are not DDP's. A sharded plan's groups are FSDP2's reduce-scatters: no cap, no note.
fn ddp_cap(plan: &Plan, f: &Facts, sharded: bool, notes: &mut Vec<String>) -> Option<u64> {
    if sharded {
        return None;
    }
    match bucket_cap(plan) {
        (Some(c), _) => Some(c),
        (None, true) => None,
        (None, false) => {
            if f.fuses_tensors() {
                notes.push(format!(
                    "the plan was made for --framework {}: its tensor groups are not DDP buckets; bucket_cap_mb is set to the largest group and DDP's buckets will differ (plan with --framework pytorch)",
                    plan.workload.framework
                ));
            }
            f.largest_group_bytes().filter(|_| f.fuses_tensors())
        }
    }
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let shard = fsdp::sharding(plan)?;
    let par = native::layout(plan, f, shard)?;
    let mut notes = Vec::new();
    let (regions, compile, recompute) = regions_of(plan, f);
    let cap = ddp_cap(plan, f, shard.is_some(), &mut notes);
    let micro = f
        .micro_batch
        .map_or_else(|| "None".to_string(), |m| m.to_string());
    let mut py = format!(
        "{}\n{}# names: {}\n# planned with --framework {}\nimport contextlib\nimport warnings\n\n",
        if par.is_some() {
            native::PARALLEL_DOC
        } else if shard.is_some() {
            fsdp::FSDP_DOC
        } else {
            DDP_DOC
        },
        header(plan, "PyTorch patch"),
        comment_text(&names_doc(plan)),
        plan.workload.framework
    );
    py.push_str(&format!("NAMES = {}\n", py_str(&plan.workload.names)));
    py.push_str(&format!(
        "# The plan's gradient collectives ({}), in issue order, as parameter names.\nTENSOR_GROUPS = {}\n",
        if shard.is_some() {
            "FSDP2's reduce-scatters"
        } else {
            "DDP buckets"
        },
        py_groups(&f.groups)
    ));
    py.push_str(&format!(
        "GROUP_BYTES = {}\n",
        py_ints(&f.group_bytes.clone().unwrap_or_default())
    ));
    py.push_str(&format!(
        "# DistributedDataParallel(bucket_cap_mb=BUCKET_CAP_BYTES / 2**20); None: DDP's default (25 MiB, first bucket 1 MiB).\nBUCKET_CAP_BYTES = {}\n",
        cap.map_or("None".to_string(), |c| c.to_string())
    ));
    py.push_str(&format!(
        "DTYPE = {}  # compute dtype under autocast; \"fp32\": no AMP\n",
        py_str(f.half.as_deref().unwrap_or("fp32"))
    ));
    py.push_str(&format!(
        "# Gradients all-reduced in this dtype (the amp decision's fp16_allreduce=1): DDP's\n# fp16_compress_hook / bf16_compress_hook; None: in the gradients' own dtype (FP32 under autocast).\nGRAD_REDUCE_DTYPE = {}\n",
        match (f.fp16_allreduce, f.half.as_deref()) {
            (true, Some(h)) => py_str(h),
            _ => "None".to_string(),
        }
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(&format!(
        "# Samples per micro-step (the planned batch per GPU divided by GRAD_ACCUMULATION).\nMICRO_BATCH = {micro}\n"
    ));
    py.push_str(&format!(
        "# Modules whose activations are recomputed in the backward (torch.utils.checkpoint).\nRECOMPUTE_MODULES = {}\n",
        py_list(&recompute, "")
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
    py.push_str(&fsdp::constants(shard));
    py.push_str(&native::constants(par.as_ref()));
    py.push_str(TORCH_HELPERS_PY);
    py.push_str(PYTORCH_PY);
    py.push_str(fsdp::FSDP_PY);
    py.push_str(native::PARALLEL_PY);
    if let Some(l) = &par {
        notes.extend(native::notes(l, f, shard, !compile.is_empty()));
    }
    notes.extend(usage_notes(
        plan,
        f,
        &micro,
        &regions,
        &recompute,
        &compile,
        par.is_some(),
    ));
    match shard {
        _ if par.is_some() => {}
        Some(sh) => notes.extend(fsdp::notes(sh, f.half.as_deref(), f.fp16_allreduce)),
        None => notes.push("call apply_plan(model) after torch.distributed.init_process_group and before wrapping in DistributedDataParallel: it wraps the model itself".into()),
    }
    Ok(Emitted {
        files: vec![("trainplan_patch.py".into(), py)],
        notes,
    })
}

/// What the user must do for AMP, accumulation, checkpointing, compiled regions and fused Adam,
/// and the passes PyTorch has no setting for.
fn usage_notes(
    plan: &Plan,
    f: &Facts,
    micro: &str,
    regions: &CompileRegions,
    recompute: &[String],
    compile: &[String],
    parallel: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    let sharded = plan.config.sharding.is_some();
    let entry = if parallel {
        "apply_parallel"
    } else if sharded {
        "apply_fsdp"
    } else {
        "apply_plan"
    };
    if plan.workload.names == "trace" && (!f.clusters.is_empty() || !f.recompute.is_empty()) {
        notes.push(
            "the plan comes from a trace, whose names are ATen operators, not modules: its op-fusion and recomputation sites cannot be mapped to modules and are not applied".into(),
        );
    }
    if f.half.is_some() {
        notes.push(format!(
            "AMP ({}): run forward and loss under autocast_context() and step through make_grad_scaler()",
            f.half.as_deref().unwrap_or("fp16")
        ));
    }
    if f.fp16_allreduce && f.half.is_some() && !sharded && !parallel {
        notes.push(format!(
            "gradients all-reduced in {} (the amp decision's fp16_allreduce=1): apply_plan registers DDP's {}_compress_hook (register_reduce_hook); a model wrapped in DDP otherwise needs it registered too",
            f.half.as_deref().unwrap_or("fp16"),
            f.half.as_deref().unwrap_or("fp16")
        ));
    }
    if f.k > 1 && parallel {
        notes.push(format!(
            "gradient accumulation k = {}: par.step runs the replica's batch as {} micro-steps of MICRO_BATCH = {micro} samples{}",
            f.k,
            f.k,
            if sharded {
                ", FSDP2 reducing gradients after the last only (set_requires_gradient_sync)"
            } else {
                ""
            }
        ));
    } else if f.k > 1 {
        notes.push(format!(
            "gradient accumulation k = {}: feed MICRO_BATCH = {micro} samples per micro-step (not the full batch), divide the loss with scale_loss(loss), wrap each micro-step in accumulate(model, step) ({}) and step the optimizer when is_update_step(step)",
            f.k,
            if sharded {
                "FSDP2: set_requires_gradient_sync(False) on the first k-1 micro-steps"
            } else {
                "DDP: no_sync() on the first k-1 micro-steps"
            }
        ));
        if sharded && !super::holds_sharded_gradients(plan) {
            notes.push("the plan reduce-scatters every micro-step's gradients (grad-accumulation sync=auto, as torchtitan and DeepSpeed run it); this export holds them whole over the micro-steps (set_requires_gradient_sync(False)): more memory, less communication than predicted (plan with --framework pytorch)".into());
        }
    }
    if !recompute.is_empty() {
        notes.push(format!(
            "activation checkpointing of {} module(s), applied by {entry}",
            recompute.len()
        ));
        if !super::whole_block_recompute(plan) {
            notes.push("the plan recomputes segments of layers (recompute:policy=layers or selective): torch.utils.checkpoint wraps each listed module on its own, keeping its inputs, and re-runs a functional op's enclosing module whole, so the peak is higher and the backward longer than predicted (plan with --framework pytorch, which checkpoints whole blocks as priced)".into());
        }
    }
    if !compile.is_empty() && !parallel {
        notes.push(format!(
            "torch.compile of {} module(s) where op fusion was planned, applied by {entry}{} (compile=False to skip)",
            compile.len(),
            if sharded {
                " before fully_shard"
            } else {
                " once DDP has fixed its buckets"
            }
        ));
    }
    if let Some(first) = regions.split.first() {
        notes.push(format!(
            "{} fused cluster(s) span several module blocks (e.g. {first}): each block is compiled as its own region, so the fusion across their boundary is not applied (a parent module is never compiled in their place)",
            regions.split.len()
        ));
    }
    if f.passes.iter().any(|p| p == "fused-adam") {
        notes.push(
            "fused Adam: build the optimizer with **optimizer_kwargs() ({\"fused\": True})".into(),
        );
    }
    notes.extend(unmapped_passes(f, &["amp", "fused-adam"], "PyTorch"));
    notes
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
    """Raise PlanMismatch when `model` lacks a planned parameter; warn about planned modules
    without any counterpart."""
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
    """Planned module names resolved in `model`, deduplicated, none inside another. A container
    whose `forward` never runs (nn.ModuleList, nn.ModuleDict) stands for its children."""
    import torch

    modules = dict(model.named_modules())
    out = []
    for n in names:
        r = _resolve(model, n)
        if r is None:
            continue
        if isinstance(modules[r], (torch.nn.ModuleList, torch.nn.ModuleDict)):
            found = [r + "." + c for c, _ in modules[r].named_children()]
        else:
            found = [r]
        for x in found:
            if x not in out:
                out.append(x)
    return [m for m in out if not any(m.startswith(p + ".") for p in out)]


def bucket_kwargs():
    """DDP keyword arguments that make its buckets the plan's groups."""
    if BUCKET_CAP_BYTES is None:
        return {}
    return {"bucket_cap_mb": BUCKET_CAP_BYTES / float(1 << 20)}


def register_reduce_hook(ddp):
    """Reduce the gradients in GRAD_REDUCE_DTYPE, as planned: DDP's built-in compression hook
    casts each bucket to half precision, all-reduces it and casts the average back. Returns the
    hook's name, or None when the plan reduces in the gradients' own dtype."""
    if GRAD_REDUCE_DTYPE is None:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = {
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[GRAD_REDUCE_DTYPE]
    ddp.register_comm_hook(None, hook)
    return hook.__name__


def planned_buckets():
    """The plan's buckets as parameter names, in the order DDP all-reduces them."""
    return [list(g) for g in TENSOR_GROUPS]


def apply_checkpointing(model):
    """Recompute the planned modules' activations in the backward."""
    from torch.utils.checkpoint import checkpoint
    import torch

    modules = dict(model.named_modules())
    wider = [n for n in RECOMPUTE_MODULES if _resolve(model, n) not in (None, n)]
    if wider:
        warnings.warn(
            "%d planned recomputation sites are not modules of the model (functional ops such as %s): "
            "their enclosing modules are checkpointed instead, recomputing more than the plan counts"
            % (len(wider), wider[0])
        )
    for name in _resolved(model, RECOMPUTE_MODULES):
        module = modules[name]
        original = module.forward

        def forward(*args, _original=original, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)
            return _original(*args, **kwargs)

        module.forward = forward
        module._trainplan_checkpointed = True
        # An in-place module (torchvision's ReLU(inplace=True)) would overwrite the input the
        # checkpoint keeps for its re-run: computed out of place, the values are the same.
        if getattr(module, "inplace", False) is True:
            module.inplace = False
    # A Hugging Face model's key/value cache grows in the forward: a checkpointed block's
    # re-run would see it grown and compute different shapes (found on GPT-2). Hugging Face
    # turns the cache off for its own gradient checkpointing; so does this.
    config = getattr(model, "config", None)
    if RECOMPUTE_MODULES and getattr(config, "use_cache", False) is True:
        config.use_cache = False
        warnings.warn("use_cache=False: the key/value cache does not survive activation checkpointing")
    return model


class _Ready:
    """Whether compiled regions may run compiled: after DDP has rebuilt its buckets from the
    eager gradient order (or at once without DDP)."""

    def __init__(self):
        self.ddp = None

    def __call__(self):
        return self.ddp is None or getattr(self.ddp, "_has_rebuilt_buckets", True)


def apply_compile(model, ready=None, **compile_kwargs):
    """Compile each planned fusion region (parameter names are unchanged). With `ready`, a
    region runs eagerly while ready() is false. Each region counts its calls
    (compiled_region_calls()); after the model's first forward, a planned region that was not
    called is reported with a warning: its planned fusion is not applied."""
    import torch

    modules = dict(model.named_modules())
    regions = _resolved(model, COMPILE_MODULES)
    for name in regions:
        module = modules[name]
        eager = module.forward
        compiled = torch.compile(eager, **compile_kwargs)
        module._trainplan_calls = 0

        def forward(*args, _eager=eager, _compiled=compiled, _module=module, **kwargs):
            _module._trainplan_calls += 1
            if ready is None or ready():
                return _compiled(*args, **kwargs)
            return _eager(*args, **kwargs)

        module.forward = forward
        module._trainplan_compiled = True
    if regions and not getattr(model, "_trainplan_call_check", False):
        model._trainplan_call_check = True
        checked = []

        def after_first_forward(root, inputs, output):
            if checked:
                return
            checked.append(True)
            idle = [n for n, c in compiled_region_calls(root).items() if c == 0]
            if idle:
                warnings.warn(
                    "%d of %d planned compile regions were not called in the model's forward, so "
                    "their planned fusion is not applied: %s"
                    % (len(idle), len(regions), ", ".join(idle[:5]))
                )

        model.register_forward_hook(after_first_forward)
    return model


def compiled_region_calls(model):
    """How many times each compiled region's forward has been called, by module name."""
    return {
        n: m._trainplan_calls
        for n, m in model.named_modules()
        if getattr(m, "_trainplan_compiled", False)
    }


def accumulate(model, step):
    """Skip the gradient synchronisation on the first k-1 micro-steps of each window: DDP's
    model.no_sync(); for an FSDP2 model (apply_fsdp), which has no no_sync(),
    model.set_requires_gradient_sync(False) on those micro-steps and True on the last (no
    reduce-scatter until the window's last backward; the unsharded gradients accumulate).
    Returns a context (a no-op without accumulation). Feed MICRO_BATCH samples per micro-step
    and divide the loss with scale_loss()."""
    if GRAD_ACCUMULATION > 1 and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(is_update_step(step))
        return contextlib.nullcontext()
    if GRAD_ACCUMULATION > 1 and not is_update_step(step) and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def check_optimizer(model, optimizer):
    """Warn when `optimizer` does not update every planned parameter, or is not fused when the
    plan counts fused Adam."""
    planned = {n for g in TENSOR_GROUPS for n in g}
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    lost = [n for n, p in model.named_parameters() if n in planned and id(p) not in owned]
    if lost:
        warnings.warn("the optimizer does not update %d planned parameters, e.g. %s" % (len(lost), lost[0]))
    if FUSED_ADAM and not all(g.get("fused") for g in optimizer.param_groups):
        warnings.warn("the plan counts fused Adam: build the optimizer with **optimizer_kwargs()")


def apply_plan(model, optimizer=None, *, ddp=None, ddp_kwargs=None, checkpointing=True, compile=True, compile_kwargs=None):
    """Apply the plan to `model` (not yet wrapped in DistributedDataParallel) and return the
    model to train: checked names, checkpointing, compiled regions, and, when a process group
    is initialised (or ddp=True), DDP with the planned buckets (and its half-precision reduce
    hook when the plan reduces in half). Compiled regions run eagerly
    until DDP has fixed its buckets (after the first synchronised step). `optimizer` is only
    checked (check_optimizer). A sharded plan is applied by apply_fsdp instead (FSDP2)."""
    inner = getattr(model, "module", None)
    if inner is not None and type(model).__name__ == "DistributedDataParallel":
        raise ValueError(
            "apply_plan needs the model before DistributedDataParallel wraps it: "
            "buckets are fixed when DDP is built"
        )
    if PARALLEL:
        raise ValueError(
            "this plan lays the model out over tensor / pipeline parallelism: call "
            "apply_parallel(model, loss_fn) instead of apply_plan"
        )
    if SHARDED:
        raise ValueError(
            "this plan shards the model (FSDP2): call apply_fsdp(model) instead of apply_plan, "
            "and build the optimizer after it"
        )
    check_names(model)
    if optimizer is not None:
        check_optimizer(model, optimizer)
    if ddp is None:
        try:
            import torch.distributed as dist

            ddp = dist.is_available() and dist.is_initialized()
        except ImportError:
            ddp = False
    set_device_type(model)
    ready = _Ready()
    if checkpointing:
        apply_checkpointing(model)
    if compile:
        apply_compile(model, ready if ddp else None, **(compile_kwargs or {}))
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        kwargs = bucket_kwargs()
        kwargs.update(ddp_kwargs or {})
        model = DistributedDataParallel(model, **kwargs)
        register_reduce_hook(model)
        ready.ddp = model
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
        // Its amp decision reduces in fp16 (fp16_allreduce=1): DDP's compression hook.
        assert!(py.contains("GRAD_REDUCE_DTYPE = \"fp16\"\n"));
        assert!(py.contains("register_reduce_hook(model)"));
        assert!(
            e.notes.iter().any(|n| n.contains("fp16_compress_hook")),
            "{:?}",
            e.notes
        );
        let mut q = tiny_plan();
        for d in q.decisions.iter_mut().filter(|d| d.pass == "amp") {
            d.knobs.remove("fp16_allreduce");
        }
        let plain = emit(&q, Framework::Pytorch).unwrap();
        assert!(file(&plain, "trainplan_patch.py").contains("GRAD_REDUCE_DTYPE = None\n"));
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
        // Started from a Horovod baseline: the groups are not DDP's; the cap is the largest
        // group (4 MiB + 2 KiB) and a note says the buckets will differ.
        assert!(py.contains("BUCKET_CAP_BYTES = 4196352\n"), "{py}");
        assert!(e.notes.iter().any(|n| n.contains("not DDP buckets")));
        // Batch 4 in k = 2 micro-steps.
        assert!(py.contains("MICRO_BATCH = 2\n"));
        assert!(py.contains("def scale_loss(loss)"));
        assert!(
            e.notes
                .iter()
                .any(|n| n.contains("MICRO_BATCH = 2") && n.contains("scale_loss"))
        );
        // Finding 8: the docstring's import line names every helper it uses.
        let doc = py.split("\"\"\"").nth(1).unwrap();
        for helper in [
            "is_update_step",
            "scale_loss",
            "optimizer_kwargs",
            "MICRO_BATCH",
        ] {
            assert!(doc.contains(helper), "{helper} missing from the docstring");
        }
        assert!(e.notes.iter().any(|n| n.contains("blueconnect")));
        assert!(e.notes[0].contains("zoo"));
    }

    /// A checkpoint around a module keeps its inputs: only whole blocks (`policy=full`) are
    /// applied as priced, and a plan that recomputes layer segments is told so.
    #[test]
    fn layer_segments_get_a_note_whole_blocks_do_not() {
        let mut p = tiny_plan();
        p.config.recompute = vec!["net.1".into()];
        p.decisions.push(super::super::tests::decision(
            "recompute",
            &[],
            "memory step",
        ));
        let segments = "recomputes segments of layers";
        let e = emit(&p, Framework::Pytorch).unwrap();
        assert!(
            e.notes.iter().any(|n| n.contains(segments)),
            "{:?}",
            e.notes
        );
        let jax = emit(&p, Framework::Jax).unwrap();
        assert!(
            jax.notes.iter().any(|n| n.contains(segments)),
            "{:?}",
            jax.notes
        );
        let last = p.decisions.len() - 1;
        p.decisions[last] =
            super::super::tests::decision("recompute", &[("policy", "full")], "memory step");
        let e = emit(&p, Framework::Pytorch).unwrap();
        assert!(
            !e.notes.iter().any(|n| n.contains(segments)),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn a_ddp_plan_writes_its_tuned_cap_and_skips_non_modules() {
        let mut p = tiny_plan();
        p.decisions[0] = super::super::tests::decision(
            "baseline:ddp_tuned",
            &[("bucket_cap_bytes", "8388608")],
            "start",
        );
        p.config.fused_ops = vec![vec!["loss.total FW".into(), "loss.total BW".into()]];
        p.config.recompute = vec!["loss.total".into(), "net.1".into()];
        let e = emit(&p, Framework::Pytorch).unwrap();
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains("BUCKET_CAP_BYTES = 8388608\n"), "{py}");
        assert!(!e.notes.iter().any(|n| n.contains("not DDP buckets")));
        assert!(py.contains("COMPILE_MODULES = []\n"), "{py}");
        assert!(py.contains("RECOMPUTE_MODULES = [\"net.1\"]\n"), "{py}");
        // The default start keeps DDP's defaults.
        p.decisions[0] = super::super::tests::decision("baseline:ddp_default", &[], "start");
        let py = file(&emit(&p, Framework::Pytorch).unwrap(), "trainplan_patch.py").to_string();
        assert!(py.contains("BUCKET_CAP_BYTES = None\n"));
    }

    #[test]
    fn a_trace_plan_compiles_no_aten_op() {
        let mut p = tiny_plan();
        p.workload.names = "trace".into();
        p.workload.source = "trace".into();
        p.config.fused_ops = vec![vec![
            "aten::_foreach_mul_ FW".into(),
            "aten::_foreach_add_ FW".into(),
        ]];
        let e = emit(&p, Framework::Pytorch).unwrap();
        let py = file(&e, "trainplan_patch.py");
        assert!(py.contains("COMPILE_MODULES = []\n"), "{py}");
        assert!(!py.contains("aten::_foreach_mul_\","));
        assert!(e.notes.iter().any(|n| n.contains("ATen operators")));
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
        // layer1.0 once. The cluster across layer2.0 and layer2.1 is compiled per block, never
        // as their container `layer2` (issue 27); layer2.1 absorbs layer2.1.conv1.
        let r = compile_regions(&f);
        assert_eq!(r.modules, vec!["layer1.0", "layer2.0.conv1", "layer2.1"]);
        assert_eq!(r.split, vec!["layer2.0 + layer2.1"]);
    }

    /// Issue 27: the README plan's encoder clusters named `bert.encoder.layer`, an
    /// `nn.ModuleList` whose `forward` never runs, and a cluster across the last encoder layer
    /// and the pooler would compile the whole `bert`.
    #[test]
    fn compile_regions_never_name_a_container_or_a_parent() {
        let mut p = tiny_plan();
        p.config.fused_ops = vec![
            vec![
                "bert.encoder.layer.3.output.LayerNorm FW".into(),
                "bert.encoder.layer.4.attention.self.query FW".into(),
                "bert.encoder.layer.4.attention.self.key FW".into(),
            ],
            vec![
                "bert.encoder.layer.11.output.dense FW".into(),
                "bert.pooler.dense FW".into(),
                "bert.pooler.activation FW".into(),
            ],
            vec!["features.0 FW".into(), "features.1 FW".into()],
        ];
        let r = compile_regions(&Facts::of(&p).unwrap());
        assert_eq!(
            r.modules,
            vec![
                "bert.encoder.layer.3.output.LayerNorm",
                "bert.encoder.layer.4.attention.self",
                "bert.encoder.layer.11.output.dense",
                "bert.pooler",
                "features",
            ]
        );
        assert_eq!(r.split.len(), 2);
        let e = emit(&p, Framework::Pytorch).unwrap();
        assert!(
            e.notes
                .iter()
                .any(|n| n.starts_with("2 fused cluster(s) span several module blocks")),
            "{:?}",
            e.notes
        );
    }

    /// The emitted module really applies the plan, when python3 has torch.
    #[test]
    fn runs_against_a_toy_model_when_torch_is_installed() {
        let has_torch = std::process::Command::new("python3")
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_torch {
            crate::skip_note!("python3 with torch not found: skipping the toy-model run");
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
