"""Train with an exported ds_config.json on CPU: deepspeed.initialize with gloo, one process per
planned rank (RANKS of the exported module: 2, or 4 for a plan with replica groups).

    python deepspeed_train.py EXPORT_DIR [--steps N]

With `--steps 0` the engine is only built (a MiCS plan: DeepSpeed's MiCS gathers parameters
with torch.distributed's coalescing manager, which gloo does not implement — "Backend gloo does
not implement startCoalescing" at the first forward — and the CPU accelerator's other backend,
oneCCL's torch bindings, is not on PyPI; the engine, its MiCS optimizer and the shard groups
are still checked).

Each rank builds a tiny Hugging Face GPT-2 (`GPT2LMHeadModel`, 2 layers, 64 wide, vocabulary
128: the zoo's `gpt` with `--hidden 64 --heads 2 --layers 2 --vocab 128`, its module names
`transformer.h.0` ...) inside `trainplan_deepspeed.model_init(config)`, the config from
`load_config` (lr 1e-2 when the plan uses DeepSpeed's Adam; else a client torch.optim.AdamW),
then runs N x GRADIENT_ACCUMULATION_STEPS micro-steps of MICRO_BATCH sequences of 32 tokens
(the same batch each time, so the loss must fall). Rank 0 prints one JSON line with what the
engine applied: its ZeRO stage and optimizer classes, batch sizes, precision, loss scaling, the
communication dtype, the bucket and prefetch sizes the ZeRO optimizer holds, how much of the
parameters / optimizer state one rank holds, the global step after each micro-step, the losses,
and how many parameters the steps changed (gathered first at stage 3).

Runs on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) with gloo: no oneCCL or Intel
extension is needed. DeepSpeed JIT-compiles two C++ ops with torch's extension builder on first
use (its shared-memory communication op when deepspeed.comm starts; FusedAdam's CPU kernel when
the config asks for Adam), which needs g++ and ninja (found beside the interpreter) and takes a
minute or two once; they are cached in ~/.cache/torch_extensions.
"""

import json
import os
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
try:
    import ninja

    _extra = [ninja.BIN_DIR] if ninja.BIN_DIR else []
except ImportError:
    _extra = []
_extra.append(os.path.dirname(sys.executable))
os.environ["PATH"] = os.pathsep.join(_extra + [os.environ.get("PATH", "")])

import torch  # noqa: E402

SEQ = 32
VOCAB = 128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gathered(engine):
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return [p.detach().float().clone() for p in params]


def local_fraction(engine, stage):
    """The share of the parameters' elements whose optimizer state (stage 1/2) or values
    (stage 3) this rank holds."""
    params = list(engine.module.parameters())
    if stage == 3:
        return sum(p.ds_tensor.numel() for p in params) / sum(p.ds_numel for p in params)
    if stage in (1, 2):
        held = sum(t.numel() for t in engine.optimizer.single_partition_of_fp32_groups)
        return held / sum(p.numel() for p in params)
    return 1.0


def zero_sizes(engine, stage):
    o = engine.optimizer
    if stage == 0:
        return {}
    out = {
        "zero_optimizer": type(o).__name__,
        "reduce_bucket_size": o.reduce_bucket_size,
        # What the engine hands the ZeRO optimizer (stage 3 keeps no attribute; on the CPU,
        # a synchronised device, no side stream is made either way).
        "overlap_comm": engine.zero_overlap_comm(),
        "partition_count": o.partition_count if stage == 3 else o.partition_count[0],
    }
    if stage < 3:
        out["allgather_bucket_size"] = o.allgather_bucket_size
    else:
        out["prefetch_bucket_size"] = o.parameter_offload._prefetch_bucket_sz
    return out


def run(rank, world, export_dir, steps, port, out_q):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_SIZE=str(world),
    )
    torch.set_num_threads(1)
    import deepspeed
    import transformers

    transformers.logging.set_verbosity_error()
    sys.path.insert(0, export_dir)
    import trainplan_deepspeed as tp

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    torch.manual_seed(0)
    kwargs = {}
    if tp.DEEPSPEED_OPTIMIZER:
        config = tp.load_config(lr=1e-2)
    else:
        config = tp.load_config()
    gpt = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=1024,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    with tp.model_init(config):
        model = transformers.GPT2LMHeadModel(gpt)
    if not tp.DEEPSPEED_OPTIMIZER:
        kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, **kwargs
    )
    stage = int(engine.zero_optimization_stage())
    before = gathered(engine)
    g = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, VOCAB, (tp.MICRO_BATCH, SEQ), generator=g)
    losses, global_steps = [], []
    for _ in range(steps * tp.GRADIENT_ACCUMULATION_STEPS):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach().float()))
        global_steps.append(engine.global_steps)
    after = gathered(engine)
    seen = {
        "world_size": world,
        "stage": stage,
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        "train_batch_size": engine.train_batch_size(),
        "fp16": engine.fp16_enabled(),
        "bf16": engine.bfloat16_enabled(),
        "dynamic_loss_scale": engine.dynamic_loss_scale() if engine.fp16_enabled() else None,
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "communication_data_type": str(engine.communication_data_type),
        "basic_optimizer": type(engine.basic_optimizer).__name__,
        "lr": engine.basic_optimizer.param_groups[0]["lr"],
        "local_fraction": local_fraction(engine, stage),
        "global_steps": global_steps,
        "skipped_steps": engine.skipped_steps,
        "losses": losses,
        "params": len(before),
        "params_changed": sum(int(not torch.equal(a, b)) for a, b in zip(before, after)),
        "mics": type(engine.optimizer).__name__ == "MiCS_Optimizer",
    }
    seen.update(zero_sizes(engine, stage))
    if rank == 0:
        out_q.put(seen)
    deepspeed.comm.barrier()


def main():
    export_dir = os.path.abspath(sys.argv[1])
    # --steps 0: build and initialize only (MiCS: gloo cannot run its gathers, see main's doc).
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    sys.path.insert(0, export_dir)
    import trainplan_deepspeed as tp

    world = tp.RANKS
    port = free_port()
    try:
        train(world, export_dir, steps, port)
    finally:
        remove_shm_buffers(port)


def remove_shm_buffers(port):
    """Remove what DeepSpeed's CPU shared-memory all-reduce leaves in /dev/shm: one 66 MiB
    `deepspeed_allreduce_buffer_<..>_<master address>_<port>_<rank>` file per rank, never
    unlinked. Each run leaked about 0.6 GB; run after run they filled /dev/shm (17 GB on the dev
    box) until the memory they held got the other framework tests' ranks killed."""
    import glob

    for f in glob.glob("/dev/shm/deepspeed_allreduce_buffer_*_%d_*" % port):
        try:
            os.unlink(f)
        except OSError:
            pass


def train(world, export_dir, steps, port):
    from ranks import rank0_report

    seen = rank0_report(run, world, (world, export_dir, steps, port))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
