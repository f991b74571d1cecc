def micro_step(mb, gpus, v):
    """(iteration_ms, note) for a row whose accumulation during the benchmark is unknown."""
    return (round(mb * gpus / v * 1000.0, 2),
            "iteration_ms derived per forward+backward micro-step = micro_batch x gpus / "
            "throughput x 1000 (accumulation during the benchmark not stated)")


def dle_convnets_rows(add, *, source, readme, model, short, tag, gpu, platform, base, head, data,
                      batch, opt_batch, cfg_at, amp_label, common, note=""):
    """The rows of one DeepLearningExamples ConvNets training table (PyTorch 21.03 recipe):
    `data` is [(gpus, base-precision img/s, AMP img/s)]; `batch` and `opt_batch` map
    "AMP" / `base` to the per-GPU batch and the optimizer batch of configs.yml. main.py turns the
    optimizer batch into accumulation of int(opt_batch / (batch x gpus)) micro-steps."""
    for g, vb, va in data:
        for prec, v, layout in ((base, vb, "NCHW"), (amp_label, va, "channels_last (nhwc)")):
            key = "AMP" if prec.startswith("AMP") else base
            mb, ob = batch[key], opt_batch[key]
            acc = max(1, int(ob / (mb * g)))
            p = "amp" if key == "AMP" else base.lower()
            add(id=f"dle-pt-{short}-2103-{tag}-{p}-{g}g", source=source,
                locator=f"{readme} § {head}", model=model, gpu=gpu, gpus=g, nodes=1,
                network="NVLink (single node)", precision=prec, value=v,
                micro_batch=mb, accum_steps=acc, global_batch=mb * acc * g,
                extra=f"{layout}; benchmark_training --epochs 1 --prof 100",
                notes=(f"per-GPU batch from {cfg_at} (launch.py profile {model}/{platform}/{key}; "
                       f"README does not print it); accum_steps derived: optimizer_batch_size="
                       f"{ob} -> main.py batch_size_multiplier=int({ob}/(batch*gpus)); not stated "
                       f"in README{note}"),
                **common)
