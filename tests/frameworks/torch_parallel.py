"""Run the tensor / pipeline / data-parallel path of an exported trainplan_patch.py against real
PyTorch: apply_parallel on WORLD gloo processes (CPU), on a tiny Hugging Face Llama whose module
names are the zoo's `llama`.

    python torch_parallel.py PATCH_DIR WORLD HIDDEN HEADS KV_HEADS LAYERS FFN SEQ VOCAB [--steps N]

Everything reported is read from the running library, not from the module's constants:
* `mesh`: the DeviceMesh apply_parallel built (shape, dim names);
* per rank (`ranks`): its mesh coordinates, the pipeline stages it runs (`stages`, from each
  torch.distributed.pipelining stage's stage_index), the model's modules its parts hold
  (`modules`), the schedule's class and micro-batches, and per part whether it is an FSDP module;
  the placements of a query projection's and a norm's weight (`q_proj`, `norm`: DTensor mesh
  dims and placements, or "tensor" for a plain one);
* `grad_error`: the largest gradient difference of any parameter on any rank (gathered with
  full_tensor()) against one process's gradient of the whole global batch, relative to the
  largest reference gradient (fp32 plans);
* `loss_error`: where the last stage runs, its loss against one process's loss on that replica's
  batch; `losses`: the mean loss of each optimizer step (the same batch each step: it must fall);
* `checkpointed_blocks`: the blocks this rank runs whose forward apply_parallel checkpointed;
* `fused`: whether the optimizer built with the module's optimizer_kwargs() is fused (a
  fused-Adam plan's AdamW steps on the DTensor parameters);
* `unchanged`: parameters the optimizer steps left equal to their initial value;
* the refusals of apply_plan and apply_fsdp for this plan.
"""

import copy
import json
import os
import sys
import warnings

# transformers would import TensorFlow too (same venv): not needed here.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def build(dims):
    """The zoo's `llama --hidden H --heads A --kv-heads K --layers L --ffn F --vocab V` (untied
    head), SDPA attention."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=dims["hidden"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"],
        num_hidden_layers=dims["layers"],
        intermediate_size=dims["ffn"],
        vocab_size=dims["vocab"],
        max_position_embeddings=max(64, dims["seq"]),
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


def loss_fn(logits, targets):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def replica_batch(replica, n, dims):
    """Token ids and next-token targets of one data-parallel replica's batch of n samples."""
    g = torch.Generator().manual_seed(1000 + replica)
    x = torch.randint(0, dims["vocab"], (n, dims["seq"] + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def placements(p):
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return "tensor"
    return [list(p.device_mesh.mesh_dim_names or []), [str(x) for x in p.placements]]


def rank_view(tp, par):
    from torch.distributed.fsdp import FSDPModule

    mesh = par.mesh
    view = {
        "coords": {d: mesh[d].get_local_rank() for d in mesh.mesh_dim_names},
        "stages": list(par.stage_ids),
        "fsdp_parts": [isinstance(p, FSDPModule) for p in par.parts],
        "modules": [],
        "q_proj": None,
        "norm": None,
    }
    for part in par.parts:
        names = set(n for n, _ in part.named_modules())
        for top in ("model.embed_tokens", "model.norm", "lm_head"):
            if top in names:  # a part without it holds None, which named_modules() skips
                view["modules"].append(top)
        for i in part.model.layers.keys():
            view["modules"].append("model.layers." + i)
            block = part.model.layers[i]
            view["q_proj"] = view["q_proj"] or placements(block.self_attn.q_proj.weight)
            view["norm"] = view["norm"] or placements(block.input_layernorm.weight)
    if par.schedule is not None:
        stages = getattr(par.schedule, "_stages", None) or [par.schedule._stage]
        view["pipeline_stage_index"] = [s.stage_index for s in stages]
        view["schedule"] = type(par.schedule).__name__
        view["microbatches"] = par.schedule._n_microbatches
    return view


def run(rank, world, patch_dir, dims, steps, port, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, patch_dir)
    import trainplan_patch as tp

    model = build(dims)
    reference = copy.deepcopy(model)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    par = tp.apply_parallel(model, loss_fn, device_type="cpu")
    view = rank_view(tp, par)
    mesh = par.mesh
    replica = mesh["dp_replicate"].get_local_rank() * mesh["dp_shard"].size() + mesh["dp_shard"].get_local_rank()
    micro_steps = tp.PIPELINE_MICROBATCHES if tp.PIPELINE_STAGES > 1 else tp.GRAD_ACCUMULATION
    n = tp.MICRO_BATCH * micro_steps
    x, y = replica_batch(replica, n, dims)
    opt = torch.optim.AdamW(par.parameters(), lr=1e-2, **tp.optimizer_kwargs())
    losses, grads = [], None
    for step in range(steps):
        with tp.autocast_context("cpu"):
            loss = par.step(x if par.has_first else None, y if par.has_last else None)
        if step == 0:
            from torch.distributed.tensor import DTensor

            grads = {}
            for name, p in par.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[name] = g.detach().clone()
        opt.step()
        opt.zero_grad()
        losses.append(None if loss is None else float(loss))
    view["losses"] = losses
    view["fused"] = all(bool(g.get("fused")) for g in opt.param_groups)
    view["checkpointed_blocks"] = sum(
        1 for part in par.parts for b in part.model.layers.values() if getattr(b, "_trainplan_checkpointed", False)
    )
    # One process, no parallelism: the whole global batch's loss and gradient.
    xs, ys = zip(*[replica_batch(r, n, dims) for r in range(tp.DATA_PARALLEL)])
    ref_loss = loss_fn(reference(torch.cat(xs)).logits, torch.cat(ys))
    ref_loss.backward()
    ref = dict(reference.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in ref.values())
    view["grad_error"] = max(float((g - ref[k].grad).abs().max()) for k, g in grads.items()) / scale
    view["parameters"] = sorted(grads)
    if par.has_last:
        with torch.no_grad():
            view["loss_error"] = abs(losses[0] - float(loss_fn(reference(x).logits, y)))
    from torch.distributed.tensor import DTensor

    view["unchanged"] = []
    for name, p in par.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if torch.equal(full.detach(), initial[name]):
            view["unchanged"].append(name)
    views = [None] * world
    dist.all_gather_object(views, view)
    if rank == 0:
        seen = {"torch": torch.__version__, "world": world, "mesh": {"shape": list(mesh.shape), "names": list(mesh.mesh_dim_names)}, "ranks": views}
        seen["reference_loss"] = float(ref_loss)
        for entry, call in (("apply_plan_refused", lambda: tp.apply_plan(build(dims), ddp=False)), ("apply_fsdp_refused", lambda: tp.apply_fsdp(build(dims)))):
            try:
                call()
                seen[entry] = None
            except ValueError as e:
                seen[entry] = str(e)
        out_q.put(seen)
    dist.barrier()
    dist.destroy_process_group()


def main():
    patch_dir, world = sys.argv[1], int(sys.argv[2])
    keys = ("hidden", "heads", "kv_heads", "layers", "ffn", "seq", "vocab")
    dims = dict(zip(keys, (int(v) for v in sys.argv[3:10])))
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    port = 29500 + (os.getpid() % 2000)
    from ranks import rank0_report

    seen = rank0_report(run, world, (world, patch_dir, dims, steps, port))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
