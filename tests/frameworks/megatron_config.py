"""Read exported megatron_args.sh files the way a Megatron-LM launch script does (bash sources
the file and expands the array) and hand the arguments to megatron-core's own config
classes (megatron-core 0.16, CPU: no GPU, no process group).

    python megatron_config.py FILE RANKS LAYERS HIDDEN HEADS KV_HEADS FFN [FILE RANKS ...]

LAYERS .. FFN are the model arguments a user adds beside the file (the plan's model).
Prints one JSON line, {"megatron_core": version, "cases": [...]}, one case per file
(tests/it/frameworks.rs asserts on it):
* `args`: the array as bash expands it, and `flags`: each `--flag` with its value (`true`
  for a switch), named as Megatron-LM's argparse names them (dashes to underscores);
* `unknown`: flags that are not Megatron-LM arguments megatron-core has a field for
  (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig) nor one of the batch,
  precision and layer-split arguments its training loop reads;
* `transformer`: the TransformerConfig built from the flags and the model arguments (its
  __post_init__ is megatron-core's validation: heads divisible by the tensor-parallel
  size, layers by the pipeline's chunks or an uneven first / last stage leaving the middle
  stages equal shares, recompute settings, sequence parallelism) — the
  values it holds, or `error` with megatron-core's message;
* `optimizer`: OptimizerConfig's optimizer, distributed optimizer and precision flags;
* `microbatches`: megatron-core's ConstantNumMicroBatchesCalculator for the global and
  micro-batch sizes over the data-parallel size RANKS / (tp x pp x cp), or its error.
"""

import json
import os
import subprocess
import sys
import warnings

os.environ.setdefault("USE_TF", "0")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from megatron.core import package_info  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.num_microbatches_calculator import (  # noqa: E402
    ConstantNumMicroBatchesCalculator,
)
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

# Megatron-LM arguments whose TransformerConfig field has another name
# (megatron/training/arguments.py: core_transformer_config_from_args).
RENAMED = {
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}

# Arguments Megatron-LM's training loop reads itself (not config-class fields).
LOOP_ARGS = {
    "micro_batch_size",
    "global_batch_size",
    "num_layers_per_virtual_pipeline_stage",
    "bf16",
    "fp16",
    "use_distributed_optimizer",
    "optimizer",
}


def expand(path):
    """The array as `. FILE; printf '%s\\n' "${TRAINPLAN_MEGATRON_ARGS[@]}"` gives it."""
    out = subprocess.run(
        ["bash", "-c", '. "$1" && printf "%s\\n" "${TRAINPLAN_MEGATRON_ARGS[@]}"', "_", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [a for a in out.split("\n") if a]


def flags_of(args):
    flags = {}
    i = 0
    while i < len(args):
        a = args[i]
        assert a.startswith("--"), f"not a flag: {a!r}"
        name = a[2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            v = args[i + 1]
            flags[name] = int(v) if v.isdigit() else v
            i += 2
        else:
            flags[name] = True
            i += 1
    return flags


def fields(cls):
    return set(cls.__dataclass_fields__)


def case(path, ranks, layers, hidden, heads, kv_heads, ffn):
    args = expand(path)
    f = flags_of(args)
    known = (
        fields(TransformerConfig)
        | fields(OptimizerConfig)
        | fields(DistributedDataParallelConfig)
        | LOOP_ARGS
        | set(RENAMED)
    )
    out = {"args": args, "flags": f, "unknown": sorted(k for k in f if k not in known)}
    tp = f.get("tensor_model_parallel_size", 1)
    pp = f.get("pipeline_model_parallel_size", 1)
    cp = f.get("context_parallel_size", 1)
    half = torch.bfloat16 if f.get("bf16") else torch.float16 if f.get("fp16") else torch.float32
    vp = None
    if "num_layers_per_virtual_pipeline_stage" in f:
        # Megatron-LM's arguments.py: chunks per rank = layers / pp / layers per virtual stage.
        vp = layers // pp // f["num_layers_per_virtual_pipeline_stage"]
    kw = dict(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=kv_heads,
        ffn_hidden_size=ffn,
        gated_linear_unit=True,
        normalization="RMSNorm",
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        context_parallel_size=cp,
        sequence_parallel=bool(f.get("sequence_parallel", False)),
        bf16=bool(f.get("bf16", False)),
        fp16=bool(f.get("fp16", False)),
        params_dtype=half,
        pipeline_dtype=half,
    )
    for k in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        if k in f:
            kw[k] = f[k]
    for arg, field in RENAMED.items():
        if arg in f:
            kw[field] = f[arg]
    try:
        c = TransformerConfig(**kw)
        out["transformer"] = {
            k: getattr(c, k)
            for k in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "virtual_pipeline_model_parallel_size",
                "num_layers_in_first_pipeline_stage",
                "num_layers_in_last_pipeline_stage",
                "context_parallel_size",
                "sequence_parallel",
                "recompute_granularity",
                "recompute_method",
                "recompute_num_layers",
                "bf16",
                "fp16",
            )
        }
    except Exception as e:  # megatron-core's validation message
        out["transformer"] = {"error": f"{type(e).__name__}: {e}"}
    o = OptimizerConfig(
        optimizer=f.get("optimizer", "adam"),
        use_distributed_optimizer=bool(f.get("use_distributed_optimizer", False)),
        bf16=bool(f.get("bf16", False)),
        fp16=bool(f.get("fp16", False)),
    )
    out["optimizer"] = {"optimizer": o.optimizer, "use_distributed_optimizer": o.use_distributed_optimizer}
    dp = ranks // (tp * pp * cp)
    out["data_parallel_size"] = dp
    try:
        calc = ConstantNumMicroBatchesCalculator(
            f["global_batch_size"], f["micro_batch_size"], dp, False, 1
        )
        out["microbatches"] = calc.get()
    except Exception as e:
        out["microbatches"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def main(argv):
    if len(argv) % 7 != 0 or not argv:
        sys.exit(__doc__)
    cases = []
    for i in range(0, len(argv), 7):
        path = argv[i]
        nums = [int(x) for x in argv[i + 1 : i + 7]]
        cases.append(case(path, *nums))
    print(json.dumps({"megatron_core": package_info.__version__, "cases": cases}))


if __name__ == "__main__":
    main(sys.argv[1:])
