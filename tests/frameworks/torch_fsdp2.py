"""Run the FSDP2 path of an exported trainplan_patch.py against real PyTorch: fully_shard on CPU
with gloo, WORLD processes, on a tiny Hugging Face GPT-2 whose module names are the zoo's.

    python torch_fsdp2.py PATCH_DIR WORLD [--steps N]

Everything reported is read from the running library, not from the module's constants:
* `fsdp_modules`: the modules that are FSDPModule instances after apply_fsdp ("" = the root);
* `resharded_after_forward`: per FSDP module, whether its parameters registered right after
  the forward are the sharded DTensors (FSDP2's documented effect of
  reshard_after_forward=True; False leaves the unsharded tensors registered), and
  `post_forward_mesh_info`: the same from FSDP2's param group (`fully_shard.state(m)
  ._fsdp_param_group.post_forward_mesh_info`, not None when it reshards: torch 2.9.1);
* `unsharded_dtype`: the dtype of the root's parameters registered after the forward (the
  policy's param_dtype), and `mp_policy`: each FSDP state's MixedPrecisionPolicy
  (`fully_shard.state(m)._mp_policy`);
* `prefetch`: each FSDP state's `_states_to_forward_prefetch` / `_states_to_backward_prefetch`
  (what set_modules_to_*_prefetch set), as module names;
* `meshes`: every sharded parameter's DTensor mesh shape, dim names and placements;
* `grads_after_micro_step`: whether any sharded parameter holds a gradient after each
  micro-step's backward (none until the window's last with set_requires_gradient_sync(False));
* `identical_on_all_ranks` / `changed`: the parameters gathered with full_tensor() after the
  optimizer steps agree on every rank and differ from the initial ones; in fp32,
  `grad_error`: the first window's gathered gradient against one process's gradient of the
  whole global batch (every rank's micro-batches, loss divided by WORLD x k);
* checkpoint calls, the optimizer's fused flag, apply_plan's refusal, a missing unit's error,
  a ModuleList unit's error.
"""

import copy
import hashlib
import json
import os

# transformers would import TensorFlow too (same venv): not needed here.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
import sys
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def build():
    """The zoo's `gpt --hidden 64 --heads 2 --layers 2 --vocab 128` (GPT-2 defaults otherwise:
    1024 positions, tied head), without dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=64, n_head=2, n_layer=2, vocab_size=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def batch(n, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, 128, (n, 16), generator=g)


def own_params(model, name, fsdp_names):
    """The parameters FSDP module `name` manages: under it and under no other FSDP module below it."""
    inner = [u for u in fsdp_names if u != name and (name == "" or u.startswith(name + "."))]
    prefix = name + "." if name else ""
    out = []
    for n, p in model.named_parameters():
        if n.startswith(prefix) and not any(n.startswith(u + ".") for u in inner):
            out.append(p)
    return out


def library_view(model):
    """What FSDP2 holds after apply_fsdp: FSDP modules, policies, prefetch lists, meshes."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    fsdp = {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    state_name = {id(fully_shard.state(m)): n for n, m in fsdp.items()}
    view = {"fsdp_modules": sorted(fsdp), "prefetch": {}, "mp_policy": {}}
    for n, m in fsdp.items():
        st = fully_shard.state(m)
        view["prefetch"][n] = {
            "forward": [state_name[id(s)] for s in st._states_to_forward_prefetch],
            "backward": [state_name[id(s)] for s in st._states_to_backward_prefetch],
        }
        view["mp_policy"][n] = [str(st._mp_policy.param_dtype), str(st._mp_policy.reduce_dtype)]
    meshes = set()
    for p in model.parameters():
        assert isinstance(p, DTensor), "a parameter FSDP2 did not shard"
        meshes.add(
            json.dumps([list(p.device_mesh.shape), list(p.device_mesh.mesh_dim_names or []), [str(x) for x in p.placements]])
        )
    view["meshes"] = [json.loads(m) for m in sorted(meshes)]
    return view


def after_forward(model, names):
    """Right after a forward: is each FSDP module resharded (its registered parameters the
    sharded DTensors), per the documented effect and per FSDP2's param group."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    modules = dict(model.named_modules())
    seen = {"resharded_after_forward": {}, "post_forward_mesh_info": {}}
    for n in names:
        params = own_params(model, n, names)
        seen["resharded_after_forward"][n] = all(isinstance(p, DTensor) for p in params)
        group = fully_shard.state(modules[n])._fsdp_param_group
        seen["post_forward_mesh_info"][n] = group.post_forward_mesh_info is not None
    seen["unsharded_dtype"] = str(own_params(model, "", names)[0].dtype)
    return seen


def full_params(model):
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def reference_grads(reference, tp, world, micro):
    """One process, no FSDP: the gradient of the whole global batch of the first window."""
    k = tp.GRAD_ACCUMULATION
    for r in range(world):
        for s in range(k):
            x = batch(micro, r, s)
            (reference(input_ids=x, labels=x).loss / (world * k)).backward()
    return {n: p.grad for n, p in reference.named_parameters()}


def checks_on_the_side(tp, seen):
    """apply_plan refuses a sharded plan; a missing unit is named."""
    try:
        tp.apply_plan(build(), ddp=False)
        seen["apply_plan_refused"] = None
    except ValueError as e:
        seen["apply_plan_refused"] = str(e)
    seen["missing_unit_error"] = unit_error(tp, "transformer.h.9")
    seen["container_unit_error"] = unit_error(tp, "transformer.h")


def unit_error(tp, extra):
    """The PlanMismatch fsdp_units raises with `extra` among the planned units (None if none)."""
    saved = tp.FSDP_UNITS
    tp.FSDP_UNITS = saved + [extra]
    try:
        tp.fsdp_units(build())
        return None
    except tp.PlanMismatch as e:
        return str(e)
    finally:
        tp.FSDP_UNITS = saved


def train(tp, model, steps, rank, micro, seen):
    """steps windows of k micro-steps through the module's helpers; the first window's gathered
    gradient in fp32."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **tp.optimizer_kwargs())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tp.check_optimizer(model, opt)
    seen["optimizer_warnings"] = [str(x.message) for x in w]
    seen["fused"] = all(bool(g.get("fused")) for g in opt.param_groups)
    scaler = tp.make_grad_scaler()
    names = seen["fsdp_modules"]
    grads_present, grads, updates = [], None, 0
    for step in range(steps * tp.GRAD_ACCUMULATION):
        x = batch(micro, rank, step)
        with tp.accumulate(model, step), tp.autocast_context():
            loss = tp.scale_loss(model(input_ids=x, labels=x).loss)
        if step == 0:
            seen.update(after_forward(model, names))
        scaler.scale(loss).backward()
        grads_present.append(any(p.grad is not None for p in model.parameters()))
        if tp.is_update_step(step):
            if grads is None and tp.DTYPE == "fp32":
                grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            updates += 1
    seen["grads_after_micro_step"] = grads_present
    seen["optimizer_steps"] = updates
    return grads


def run(rank, world, patch_dir, steps, port, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, patch_dir)
    import trainplan_patch as tp

    model = build()
    reference = copy.deepcopy(model)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    import torch.utils.checkpoint as cp

    calls = [0]
    real_checkpoint = cp.checkpoint

    def counting_checkpoint(*a, **k):
        calls[0] += 1
        return real_checkpoint(*a, **k)

    cp.checkpoint = counting_checkpoint
    model = tp.apply_fsdp(model, compile_kwargs={"backend": "eager"})
    seen = library_view(model)
    seen["checkpointed"] = sorted(n for n, m in model.named_modules() if getattr(m, "_trainplan_checkpointed", False))
    micro = max(1, min(int(tp.MICRO_BATCH or 2), 2))
    grads = train(tp, model, steps, rank, micro, seen)
    seen["checkpoint_calls"] = calls[0]
    seen["micro_steps"] = steps * tp.GRAD_ACCUMULATION
    final = full_params(model)
    digest = hashlib.sha256(b"".join(final[n].numpy().tobytes() for n in sorted(final))).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    seen["identical_on_all_ranks"] = len(set(digests)) == 1
    seen["changed"] = sorted(n for n in final if not torch.equal(final[n], initial[n]))
    seen["parameters"] = sorted(final)
    if rank == 0:
        if grads is not None:
            ref = reference_grads(reference, tp, world, micro)
            scale = max(float(g.abs().max()) for g in ref.values())
            seen["grad_error"] = max(float((grads[n] - ref[n]).abs().max()) for n in ref) / scale
        checks_on_the_side(tp, seen)
        seen["world"] = world
        seen["torch"] = torch.__version__
        out_q.put(seen)
    dist.barrier()
    dist.destroy_process_group()


def main():
    patch_dir, world = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 2
    port = 29500 + (os.getpid() % 2000)
    from ranks import rank0_report

    seen = rank0_report(run, world, (world, patch_dir, steps, port))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
