"""Load exported torchtitan.toml files with torchtitan's own code (torchtitan 0.2.0, CPU,
no GPU and no real process group) and report what torchtitan makes of them.

    python torchtitan_config.py TOML RANKS [TOML RANKS ...]

Prints one JSON line, {"torchtitan": version, "cases": [...]}, one case per file
(tests/it/frameworks.rs asserts on it):
* `config`: the values torchtitan's ConfigManager returns for
  `parse_args(["--job.config_file", TOML])`, section by section, for every key the file sets;
  `type_errors`: those keys whose value does not fit JobConfig's annotation (a Literal's
  choices, int, bool, str): the manager itself checks names, not values;
* `mesh`: ParallelDims built from the parallelism section with world_size = RANKS (its own
  validation), then its device mesh on a fake process group of RANKS ranks (torch's
  FakeStore backend, device "cpu"): dimension names and sizes, the data-parallel sizes, the
  ranks of rank 0's shard group, the tensor-parallel size and rank 0's tp group;
* `accumulation_steps`: global_batch_size // (local_batch_size * dp degree), the derivation
  torchtitan's Trainer.__init__ makes (`formula_in_train_py` checks that train.py still holds
  it), and the loss rescale torchtitan applies for it (`rescaled_loss` of a loss of 1.0);
* `fsdp` / `ddp`: torchtitan's llama3 `parallelize_llama` applied with this config to its
  `debugmodel` on the meta device: each fully_shard module's reshard-after-forward and mixed
  precision policy; whether DDP was applied instead; `tp_placements`: the placement on the
  `tp` mesh dimension of block 0's `attention.wq` (column-parallel) and `attention.wo`
  (row-parallel) weights, when tensor parallelism was applied; `checkpointed_modules`: how
  many modules activation checkpointing wrapped, of `blocks` transformer blocks;
* `pipeline` (with pipeline_parallel_degree > 1): torchtitan's `pipeline_llm` on its llama3
  debugmodel with the file's layer count: the schedule class and its micro-batches, rank 0's
  stages (index, modules held: `tok_embeddings`, `layers.N`, `norm`, `output`), the number of
  stages, and the reshard-after-forward of every FSDP2 module of the parts;
* `amp_context`: what `maybe_enable_amp` returns (FSDP handles precision itself);
* `optimizer`: the fused / foreach flags of the optimizer `build_optimizers` makes;
* `model_refused`: torchtitan's error for the [model] placeholder; `cli_model`: the model
  name after `--model.name llama3` on the command line (the user's way to set it).

The llama3 package imports the Hugging Face `datasets` loader at import time; no data is
loaded here, so where `datasets` is not installed (a lighter setup than requirements.txt's) a
stub module stands in for it.
"""

import contextlib
import dataclasses
import json
import os
import re
import sys
import types
import typing
import warnings

os.environ.setdefault("USE_TF", "0")
warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

# Written by the export: every (section, key) the file may set, checked against the config.
SECTIONS = ["job", "model", "parallelism", "training", "optimizer", "activation_checkpoint", "compile"]


def stub_datasets():
    """Stand in for Hugging Face `datasets` where it is not installed (never called here)."""
    import importlib.util

    if importlib.util.find_spec("datasets") is not None:
        return
    for name in ["datasets", "datasets.distributed"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["datasets"].Dataset = object
    sys.modules["datasets"].load_dataset = None
    sys.modules["datasets.distributed"].split_dataset_by_node = None


def fits(value, hint):
    """Whether `value` fits the dataclass annotation `hint`."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(fits(v, item) for v in value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return False


def written_keys(path):
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def config_values(cfg, raw):
    out, errors = {}, []
    for section, keys in raw.items():
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        out[section] = {}
        for key in keys:
            value = getattr(obj, key)
            out[section][key] = value
            if not fits(value, hints[key]):
                errors.append(f"{section}.{key} = {value!r} is not {hints[key]}")
    return out, errors


def mesh_facts(dims):
    mesh = dims.world_mesh
    names = list(mesh.mesh_dim_names or [])
    sizes = [mesh.size(i) for i in range(mesh.ndim)]
    out = {
        "names": names,
        "sizes": sizes,
        "dp": mesh["dp"].size() if dims.dp_enabled else 1,
        "dp_shard_cp": mesh["dp_shard_cp"].size() if dims.fsdp_enabled else None,
        # Rank 0's shard group: consecutive ranks, or every tp-th with tensor parallelism
        # (torchtitan's mesh puts tp innermost).
        "shard_group_of_rank0": mesh["dp_shard_cp"].mesh.tolist() if dims.fsdp_enabled else None,
        "tp": mesh["tp"].size() if dims.tp_enabled else 1,
        "pp": mesh["pp"].size() if dims.pp_enabled else 1,
        "cp": mesh["cp"].size() if dims.cp_enabled else 1,
        "tp_group_of_rank0": mesh["tp"].mesh.tolist() if dims.tp_enabled else None,
        "dp_enabled": dims.dp_enabled,
        "fsdp_enabled": dims.fsdp_enabled,
        "dp_replicate_enabled": dims.dp_replicate_enabled,
    }
    return out


def accumulation(cfg, dp):
    """torchtitan 0.2.0's Trainer.__init__ derivation, checked to be train.py's own."""
    import torchtitan.train as train_mod
    from torchtitan.components.loss import rescale_accumulated_loss

    src = re.sub(r"\s+", "", open(train_mod.__file__).read())
    formula = (
        'dp_mesh=world_mesh["dp"]dp_degree,dp_rank=dp_mesh.size()' in src
        and "self.gradient_accumulation_steps=global_batch_size//(job_config.training.local_batch_size*dp_degree)" in src
        and "rescale_accumulated_loss(self.loss_fn,self.gradient_accumulation_steps)" in src
    )
    t = cfg.training
    global_batch = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * dp
    divides = global_batch % (t.local_batch_size * dp) == 0
    steps = global_batch // (t.local_batch_size * dp)
    loss = rescale_accumulated_loss(lambda *a: torch.tensor(1.0), steps)
    return {
        "formula_in_train_py": formula,
        "divides": divides,
        "accumulation_steps": steps,
        "rescaled_loss": float(loss(None, None)),
    }


def parallelized(cfg, dims):
    """torchtitan's llama3 parallelize_llama on its debugmodel (meta device)."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.utils import maybe_enable_amp
    from torchtitan.models.llama3 import get_train_spec

    spec = get_train_spec()
    with torch.device("meta"):
        model = spec.model_cls(spec.model_args["debugmodel"])
    model = spec.parallelize_fn(model, dims, cfg)
    fsdp = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            state = mod._get_fsdp_state()
            group = state._fsdp_param_group
            mp = state._mp_policy
            fsdp[name] = {
                # FSDP2 keeps a post-forward mesh exactly when it reshards after the forward.
                "reshard": group is not None and group.post_forward_mesh_info is not None,
                "hsdp": group is not None and getattr(group.mesh_info, "replicate_mesh_dim", None) is not None,
                "param_dtype": str(mp.param_dtype),
                "reduce_dtype": str(mp.reduce_dtype),
            }
    from torch.distributed._composable.contract import _get_registry

    # torchtitan's apply_ddp is torch's composable `replicate` (DDP).
    ddp = "replicate" in (_get_registry(model) or {})
    amp = maybe_enable_amp(dims, cfg.training.mixed_precision_param, "cpu")
    amp_context = (
        "nullcontext"
        if isinstance(amp, contextlib.nullcontext)
        else f"autocast:{getattr(amp, 'fast_dtype', None)}"
    )
    # Tensor parallelism as applied: the placement of block 0's column-parallel (wq) and
    # row-parallel (wo) weights on the tp mesh dimension.
    tp = {}
    for name, param in model.named_parameters():
        # Activation checkpointing wraps each block: its parameters' names gain a segment.
        name = name.replace("_checkpoint_wrapped_module.", "")
        if name in ("layers.0.attention.wq.weight", "layers.0.attention.wo.weight"):
            dims_of = list(getattr(getattr(param, "device_mesh", None), "mesh_dim_names", None) or [])
            if "tp" in dims_of:
                tp[name] = str(param.placements[dims_of.index("tp")])
    # Activation checkpointing as applied: the modules torchtitan wrapped.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    opt = spec.build_optimizers_fn([model], cfg.optimizer, dims)
    group0 = opt.optimizers[0].param_groups[0]
    return {
        "fsdp": fsdp or None,
        "tp_placements": tp or None,
        "checkpointed_modules": wrapped,
        "blocks": len(model.layers),
        "ddp": ddp,
        "amp_context": amp_context,
        "optimizer": {"fused": group0.get("fused"), "foreach": group0.get("foreach")},
    }


def pipelined(cfg, dims):
    """torchtitan's pipeline_llm (what train.py runs with pipeline_parallel_degree > 1) on its
    llama3 debugmodel with as many layers as the file's model parts name, on the meta device:
    rank 0's stages and their modules, the schedule, and FSDP2 as applied to each part."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.llama3 import get_train_spec

    spec = get_train_spec()
    parts = cfg.parallelism.module_fqns_per_model_part or []
    layers = sum(n.startswith("layers.") for part in parts for n in part)
    args = dataclasses.replace(spec.model_args["debugmodel"], n_layers=layers)
    with torch.device("meta"):
        model = spec.model_cls(args)
    schedule, model_parts, has_first, has_last = pipeline_llm(
        model, dims, cfg, torch.device("meta"), args, spec.parallelize_fn, lambda out, tgt: out.sum()
    )
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    held = []
    for stage, part in zip(stages, model_parts):
        names = [n for n, m in part.named_children() if m is not None and not (
            isinstance(m, (torch.nn.ModuleDict, torch.nn.ModuleList)) and len(m) == 0)]
        layer_names = [f"layers.{k}" for k in getattr(part, "layers", {}).keys()]
        held.append({
            "stage": stage.stage_index,
            "modules": sorted(n for n in names if n != "layers") + layer_names,
        })
    reshard = set()
    for part in model_parts:
        for mod in part.modules():
            if isinstance(mod, FSDPModule):
                group = mod._get_fsdp_state()._fsdp_param_group
                reshard.add(group is not None and group.post_forward_mesh_info is not None)
    return {
        "schedule": type(schedule).__name__,
        "n_microbatches": schedule._n_microbatches,
        "stages_of_rank0": held,
        "num_stages": stages[0].num_stages,
        "has_first_stage": has_first,
        "has_last_stage": has_last,
        "fsdp_reshard": sorted(reshard),
    }


def one_case(path, ranks):
    import torchtitan.distributed.parallel_dims as pd_mod
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.protocols.train_spec import get_train_spec

    # No GPU here: torchtitan picks "cuda" when it finds no accelerator; its mesh goes on CPU.
    pd_mod.device_type = "cpu"
    raw = written_keys(path)
    cfg = ConfigManager().parse_args(["--job.config_file", path])
    config, type_errors = config_values(cfg, raw)
    p = cfg.parallelism
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        dims = ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            etp=p.expert_tensor_parallel_degree,
            world_size=ranks,
        )
        mesh = mesh_facts(dims)
        case = {
            "path": path,
            "ranks": ranks,
            "sections": sorted(raw),
            "config": config,
            "type_errors": type_errors,
            "mesh": mesh,
            **accumulation(cfg, mesh["dp"]),
            **parallelized(cfg, dims),
        }
        if dims.pp_enabled:
            case["pipeline"] = pipelined(cfg, dims)
    finally:
        dist.destroy_process_group()
    try:
        get_train_spec(cfg.model.name)
        case["model_refused"] = None
    except ValueError as e:
        case["model_refused"] = str(e)
    cli = ConfigManager().parse_args(["--job.config_file", path, "--model.name", "llama3"])
    case["cli_model"] = cli.model.name
    return case


def main():
    stub_datasets()
    torch.set_num_threads(1)
    args = sys.argv[1:]
    cases = [one_case(args[i], int(args[i + 1])) for i in range(0, len(args), 2)]
    import importlib.metadata

    print(json.dumps({"torchtitan": importlib.metadata.version("torchtitan"), "cases": cases}))


if __name__ == "__main__":
    main()
