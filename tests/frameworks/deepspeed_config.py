"""Read exported ds_config.json files with DeepSpeed's own configuration classes.

    python deepspeed_config.py EXPORT_DIR [EXPORT_DIR ...]

For each folder (a `trainplan export --to deepspeed` output) the config is parsed by
`deepspeed.runtime.config.DeepSpeedConfig`, which validates the `zero_optimization` section with
the pydantic model `DeepSpeedZeroConfig` (unknown keys refused), the `fp16` / `bf16` sections,
and checks train_batch_size = micro-batch x accumulation x data-parallel world size. The world
size is the plan's: deepspeed.comm runs on one gloo process and the config is read with an `mpu`
(DeepSpeed's model-parallel-unit interface) whose data-parallel world size is the module's
RANKS — DeepSpeedConfig takes the world size from the mpu once deepspeed.comm is up. A config
without batch keys (a plan that does not know its batch) must be refused; it is then read again
with a micro-batch of 1 added, as its note tells the user to.

Prints one JSON line: {dir: what DeepSpeed read}. The exported module is imported too
(load_config with an lr, its constants).
"""

import importlib.util
import json
import os
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# transformers (same venv) would import TensorFlow when DeepSpeed probes for it: not needed.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
# DeepSpeed JIT-compiles a CPU op when deepspeed.comm starts: torch's builder needs ninja,
# which the venv (or a pip --target folder) installs beside the interpreter.
try:
    import ninja

    extra = [ninja.BIN_DIR] if ninja.BIN_DIR else []
except ImportError:
    extra = []
extra.append(os.path.dirname(sys.executable))
os.environ["PATH"] = os.pathsep.join(extra + [os.environ.get("PATH", "")])


class DataParallel:
    """An mpu that says only the data-parallel world size (all DeepSpeedConfig asks of it)."""

    def __init__(self, ranks):
        self.ranks = ranks

    def get_data_parallel_world_size(self):
        return self.ranks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def module(export_dir, i):
    spec = importlib.util.spec_from_file_location(
        "trainplan_deepspeed_%d" % i, os.path.join(export_dir, "trainplan_deepspeed.py")
    )
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def read(config, ranks):
    from deepspeed.runtime.config import DeepSpeedConfig

    c = DeepSpeedConfig(config, mpu=DataParallel(ranks))
    z = c.zero_config
    offload = z.offload_optimizer
    return {
        "world_size": c.world_size,
        "stage": int(c.zero_optimization_stage),
        "train_batch_size": c.train_batch_size,
        "micro_batch": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "fp16": c.float16_config.enabled,
        "loss_scale": c.float16_config.loss_scale,
        "initial_scale_power": c.float16_config.initial_scale_power,
        "bf16": c.bfloat16_config.enabled,
        "communication_data_type": None
        if c.communication_data_type is None
        else str(c.communication_data_type),
        "reduce_bucket_size": z.reduce_bucket_size,
        "allgather_bucket_size": z.allgather_bucket_size,
        "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients,
        "prefetch_bucket_size": z.prefetch_bucket_size,
        "param_persistence_threshold": z.param_persistence_threshold,
        "mics_shard_size": c.mics_shard_size,
        "offload_optimizer": None if offload is None else str(getattr(offload.device, "value", offload.device)),
        "optimizer": c.optimizer_name,
        "optimizer_params": c.optimizer_params,
    }


def main():
    import deepspeed
    import torch

    from deepspeed_train import remove_shm_buffers

    torch.set_num_threads(1)
    port = free_port()
    try:
        read_all(deepspeed, port)
    finally:
        remove_shm_buffers(port)


def read_all(deepspeed, port):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_SIZE="1",
    )
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    out = {"deepspeed": deepspeed.__version__}
    for i, d in enumerate(sys.argv[1:]):
        m = module(d, i)
        with open(os.path.join(d, "ds_config.json")) as fh:
            config = json.load(fh)
        seen = {}
        if "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
            try:
                read(dict(config), m.RANKS)
                seen["refused_without_batch"] = None
            except AssertionError as e:
                seen["refused_without_batch"] = str(e)
            config["train_micro_batch_size_per_gpu"] = 1
        seen.update(read(config, m.RANKS))
        seen["module"] = {
            k: getattr(m, k)
            for k in [
                "ZERO_STAGE",
                "MICS_SHARD_SIZE",
                "MICRO_BATCH",
                "GRADIENT_ACCUMULATION_STEPS",
                "RANKS",
                "DTYPE",
                "DEEPSPEED_OPTIMIZER",
            ]
        }
        if m.DEEPSPEED_OPTIMIZER:
            seen["module"]["load_config_lr"] = m.load_config(lr=0.02)["optimizer"]["params"]["lr"]
        else:
            try:
                m.load_config(lr=0.02)
                seen["module"]["load_config_lr"] = "accepted"
            except ValueError:
                seen["module"]["load_config_lr"] = "refused"
        out[d] = seen
    print(json.dumps(out))


if __name__ == "__main__":
    main()
