"""Run an exported trainplan_patch.py against real PyTorch: DDP with gloo, 2 processes, on CPU.

    python torch_ddp.py PATCH_DIR resnet50|bert [--steps N]

Checks, on rank 0, and prints one JSON line with what it saw:
* DDP's buckets, once it has rebuilt them (from the second synchronised step on), are the
  plan's TENSOR_GROUPS: same parameters, same order (read with a comm hook);
* compiled regions (COMPILE_MODULES) really run compiled after the rebuild, eagerly before:
  a counting torch.compile backend (aot_eager underneath) records which compiled graphs ran
  inside each planned region at the last step; every region must have run one (issue 27: the
  README plan named `bert.encoder.layer`, an nn.ModuleList whose forward never runs, and no
  encoder graph compiled), and apply_plan must warn about a planned region never called;
* autocast_context() and make_grad_scaler() are called without a device: they must follow the
  model's (a CPU model here; a "cuda" default left it in fp32);
* autocast is on in the planned dtype (the first layer's output dtype) and a GradScaler steps;
* the planned modules are checkpointed (torch.utils.checkpoint runs for each of them);
* with GRAD_ACCUMULATION = k: the optimizer steps once every k micro-steps, on micro-batches of
  MICRO_BATCH samples, and the accumulated gradient with scale_loss equals the whole batch's;
* the optimizer is fused when the plan counts fused Adam;
* gradients reduced in half precision (GRAD_REDUCE_DTYPE, the amp decision's fp16_allreduce=1):
  register_reduce_hook registers DDP's fp16/bf16 compression hook, and the average it gives is the
  FP32 average to within the half dtype's rounding.

The models are built without downloading weights (torchvision `weights=None`, Hugging Face
`BertForPreTraining(BertConfig())`). Inputs are small (64x64 images, 16-token sequences) to
keep the run short; the checks do not depend on the input size. Compiled regions use the
`aot_eager` backend (dynamo + AOTAutograd, which is what changes the gradient order) instead of
inductor, which would compile C++ for minutes on a CI machine.
"""

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


def build(name):
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)

        def batch(n, seed):
            g = torch.Generator().manual_seed(seed)
            return torch.randn(n, 3, 64, 64, generator=g)

        def loss_fn(model, x):
            return model(x).float().square().mean()

        first = model.conv1
    else:
        from transformers import BertConfig, BertForPreTraining

        cfg = BertConfig()
        cfg.hidden_dropout_prob = 0.0
        cfg.attention_probs_dropout_prob = 0.0
        model = BertForPreTraining(cfg)

        def batch(n, seed):
            g = torch.Generator().manual_seed(seed)
            return torch.randint(0, cfg.vocab_size, (n, 16), generator=g)

        def loss_fn(model, x):
            out = model(input_ids=x)
            return out.prediction_logits.float().square().mean() * 1e-3 + out.seq_relationship_logits.float().square().mean()

        first = model.bert.embeddings.word_embeddings
        # A Linear sees autocast; the embedding does not.
        first = model.bert.encoder.layer[0].attention.self.query
    return model, batch, loss_fn, first


def idle_region_warning(tp):
    """apply_plan's helper on a toy model whose planned region is never called (and whose
    planned container is an nn.ModuleList): the warning it gives, or None."""
    net = torch.nn.Module()
    net.used = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    net.unused = torch.nn.Linear(4, 4)
    net.forward = lambda x: net.used[1](net.used[0](x))
    saved = tp.COMPILE_MODULES
    tp.COMPILE_MODULES = ["used", "unused"]
    try:
        tp.apply_compile(net, backend="eager")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            net(torch.randn(2, 4))
            net(torch.randn(2, 4))
        compiled = sorted(n for n, m in net.named_modules() if getattr(m, "_trainplan_compiled", False))
        found = [str(x.message) for x in w if "not called" in str(x.message)]
        return {"compiled": compiled, "warnings": found}
    finally:
        tp.COMPILE_MODULES = saved


def half_reduce(tp, rank):
    """register_reduce_hook on a toy DDP model with GRAD_REDUCE_DTYPE set to each half dtype (the
    amp decision's fp16_allreduce=1): the hook it returns, the one DDP logs, and how far the
    averaged gradient is from the FP32 average computed by hand. Collective: every rank runs it."""
    out = {"plan_reduce_dtype": tp.GRAD_REDUCE_DTYPE}
    saved = tp.GRAD_REDUCE_DTYPE
    try:
        for dtype in ("fp16", "bf16"):
            tp.GRAD_REDUCE_DTYPE = dtype
            torch.manual_seed(2)
            lin = torch.nn.Linear(8, 4)
            ref = torch.nn.Linear(8, 4)
            ref.load_state_dict(lin.state_dict())
            ddp = torch.nn.parallel.DistributedDataParallel(lin)
            hook = tp.register_reduce_hook(ddp)
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(10 + rank))
            ddp(x).square().mean().backward()
            ref(x).square().mean().backward()
            avg = ref.weight.grad.clone()
            dist.all_reduce(avg)
            avg /= dist.get_world_size()
            out[dtype] = {
                "hook": hook,
                "logged": ddp._get_ddp_logging_data().get("comm_hook"),
                "grad_dtype": str(lin.weight.grad.dtype),
                "rel_err": float((lin.weight.grad - avg).abs().max() / avg.abs().max()),
            }
    finally:
        tp.GRAD_REDUCE_DTYPE = saved
    return out


def run(rank, patch_dir, name, steps, port, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    sys.path.insert(0, patch_dir)
    import trainplan_patch as tp

    model, batch, loss_fn, first = build(name)
    names = {p: n for n, p in model.named_parameters()}
    seen = {"checkpoint_calls": 0, "first_dtype": None, "buckets": [], "compiled_calls": 0}

    import torch.utils.checkpoint as cp

    real_checkpoint = cp.checkpoint

    def counting_checkpoint(*a, **k):
        seen["checkpoint_calls"] += 1
        return real_checkpoint(*a, **k)

    cp.checkpoint = counting_checkpoint
    first.register_forward_hook(lambda m, i, o: seen.__setitem__("first_dtype", str(o.dtype)))
    # One counting backend for every region (as a user's one backend): each compiled graph
    # counts the runs it makes inside the region that is running.
    from torch._dynamo.backends.registry import lookup_backend

    aot = lookup_backend("aot_eager")
    graphs = []
    active = []
    ran = {}

    def counting_backend(gm, example_inputs):
        gid = len(graphs)
        graphs.append(gid)
        inner = aot(gm, example_inputs)

        def run(*a):
            if active:
                ran.setdefault(active[-1], set()).add(gid)
            return inner(*a)

        return run

    ddp = tp.apply_plan(model, compile_kwargs={"backend": counting_backend})
    regions = [n for n, m in model.named_modules() if getattr(m, "_trainplan_compiled", False)]
    for n in regions:
        m = dict(model.named_modules())[n]

        def marked(*a, _f=m.forward, _n=n, **kw):
            active.append(_n)
            try:
                return _f(*a, **kw)
            finally:
                active.pop()

        m.forward = marked
    assert type(ddp).__name__ == "DistributedDataParallel", type(ddp)
    cur = []

    def hook(state, bucket):
        cur.append([names[p] for p in bucket.parameters()])
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] / 2)

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, **tp.optimizer_kwargs())
    scaler = tp.make_grad_scaler()
    # Optimizer steps as the loop asks for them (GradScaler may skip an fp16 step with inf
    # gradients, which is its job, not the plan's).
    step_calls = [0]
    real_step = scaler.step

    def counting_step(*a, **k):
        step_calls[0] += 1
        return real_step(*a, **k)

    scaler.step = counting_step
    k = tp.GRAD_ACCUMULATION
    micro = int(tp.MICRO_BATCH) if tp.MICRO_BATCH else 2
    micro = max(1, min(micro, 2))
    rounds = []
    micro_steps = steps * k
    for step in range(micro_steps):
        cur.clear()
        ran.clear()
        with tp.accumulate(ddp, step), tp.autocast_context():
            loss = tp.scale_loss(loss_fn(ddp, batch(micro, 1000 * rank + step)))
        scaler.scale(loss).backward()
        if tp.is_update_step(step):
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            rounds.append([list(b) for b in cur])
    seen["optimizer_steps"] = step_calls[0]
    seen["micro_steps"] = micro_steps
    seen["buckets"] = rounds
    seen["fused"] = all(bool(g.get("fused")) for g in opt.param_groups)
    seen["has_rebuilt_buckets"] = bool(getattr(ddp, "_has_rebuilt_buckets", False))
    # Accumulation arithmetic on one process, without DDP: k micro-batches with scale_loss give
    # the gradient of the whole batch.
    if k > 1 and rank == 0:
        torch.manual_seed(1)
        lin = torch.nn.Linear(4, 3)
        x = torch.randn(2 * k, 4)
        lin(x).square().mean().backward()
        whole = lin.weight.grad.clone()
        lin.weight.grad = None
        for part in x.chunk(k):
            tp.scale_loss(lin(part).square().mean()).backward()
        seen["accumulated_grad_error"] = float((lin.weight.grad - whole).abs().max())
    half = half_reduce(tp, rank)
    if rank == 0:
        seen["half_reduce"] = half
        seen["planned"] = tp.planned_buckets()
        seen["recompute_modules"] = tp.RECOMPUTE_MODULES
        # The modules they resolve to in the real model (a planned layer that is no module of
        # it, such as the zoo's relu1, is covered by its enclosing module).
        seen["resolved_recompute"] = sorted(tp._resolved(model, tp.RECOMPUTE_MODULES))
        seen["planned_recompute"] = sorted(tp.RECOMPUTE_MODULES)
        seen["compile_modules"] = tp.COMPILE_MODULES
        seen["compiled"] = sorted(
            n for n, m in model.named_modules() if getattr(m, "_trainplan_compiled", False)
        )
        # At the last step (compiled: DDP has rebuilt its buckets), the compiled graphs each
        # planned region ran, and the regions that ran none.
        seen["regions"] = sorted(regions)
        seen["graphs_per_region"] = {n: len(ran.get(n, ())) for n in sorted(regions)}
        seen["compiled_graphs"] = len(graphs)
        seen["region_calls"] = tp.compiled_region_calls(model)
        seen["idle_region_warning"] = idle_region_warning(tp)
        seen["checkpointed"] = sorted(
            n for n, m in model.named_modules() if getattr(m, "_trainplan_checkpointed", False)
        )
        seen["dtype"] = tp.DTYPE
        seen["k"] = k
        seen["torch"] = torch.__version__
        out_q.put(seen)
    dist.barrier()
    dist.destroy_process_group()


def main():
    patch_dir, name = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    port = 29500 + (os.getpid() % 2000)
    from ranks import rank0_report

    seen = rank0_report(run, 2, (patch_dir, name, steps, port))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
