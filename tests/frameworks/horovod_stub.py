"""Run an exported trainplan_horovod.py / horovod.env on real PyTorch against the stub
`horovod.torch` in tests/frameworks/stubs (Horovod's documented API; Horovod itself cannot be
installed here).

    python horovod_stub.py EXPORT_DIR resnet50|bert

Prints one JSON line with what it saw (tests/it/frameworks.rs asserts on it):
* the one hvd.DistributedOptimizer call: its groups (as parameter names), backward_passes_per_step
  and compression, accepted by the documented signature and argument rules;
* the real model's bytes per planned group (fp32 parameters) against GROUP_BYTES, and
  horovod.env's HOROVOD_FUSION_THRESHOLD (every group must fit one fusion buffer);
* a training loop as the module's docstring writes it (autocast, scale_loss, is_update_step,
  step with a GradScaler): optimizer steps and all-reduce synchronisations per update, the
  stub's "more than backward_passes_per_step" check, the first matrix layer's dtype, and whether
  the optimizer is fused.
"""

import json
import os
import sys

os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
import warnings

import torch

warnings.filterwarnings("ignore")


def build(name):
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        return model, lambda n: torch.randn(n, 3, 64, 64), model.conv1
    from transformers import BertConfig, BertForPreTraining

    cfg = BertConfig()
    model = BertForPreTraining(cfg)
    return model, lambda n: torch.randint(0, cfg.vocab_size, (n, 16)), model.bert.encoder.layer[0].attention.self.query


def main():
    export_dir, name = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "stubs"))
    sys.path.insert(0, export_dir)
    import horovod.torch as hvd
    import trainplan_horovod as tp

    torch.set_num_threads(2)
    hvd.init()
    model, batch, first = build(name)
    seen = {"first_dtype": None}
    first.register_forward_hook(lambda m, i, o: seen.__setitem__("first_dtype", str(o.dtype)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **tp.optimizer_kwargs())
    dopt = tp.distributed_optimizer(opt, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    call = [c for c in hvd.CALLS if c[0] == "DistributedOptimizer"]
    seen["calls"] = len(call)
    seen["call"] = call[0][1]

    params = dict(model.named_parameters())
    seen["real_group_bytes"] = [sum(params[n].numel() * params[n].element_size() for n in g) for g in tp.GROUPS]
    seen["group_bytes"] = tp.GROUP_BYTES
    env = {}
    with open(os.path.join(export_dir, "horovod.env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k] = v.strip('"')
    seen["env"] = env

    scaler = tp.make_grad_scaler()
    k = tp.GRAD_ACCUMULATION
    micro = max(1, min(2, int(tp.MICRO_BATCH or 2)))
    updates = 2
    for step in range(updates * k):
        with tp.autocast_context():
            out = model(batch(micro))
            logits = out if torch.is_tensor(out) else out.prediction_logits
            loss = tp.scale_loss(logits.float().square().mean() * 1e-3)
        scaler.scale(loss).backward()
        if tp.is_update_step(step):
            tp.step(dopt, scaler)
            dopt.zero_grad()
    seen["micro_steps"] = updates * k
    seen["optimizer_steps"] = dopt.hvd_steps
    seen["synchronizes"] = dopt.hvd_synchronizes
    seen["scaler_enabled"] = scaler.is_enabled()
    # One backward pass too many before a step: the documented error.
    try:
        for _ in range(k + 1):
            with tp.autocast_context():
                out = model(batch(1))
                logits = out if torch.is_tensor(out) else out.prediction_logits
            logits.float().sum().backward()
        seen["extra_pass_refused"] = False
    except AssertionError:
        seen["extra_pass_refused"] = True
    seen["fused"] = all(bool(g.get("fused")) for g in opt.param_groups)
    seen["dtype"] = tp.DTYPE
    seen["k"] = k
    seen["torch"] = torch.__version__
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
