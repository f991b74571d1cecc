"""Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models (MLSys'23)."""

S = ("Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro: Reducing Activation "
     "Recomputation in Large Transformer Models, MLSys 2023 (arXiv:2205.05198)")
TRANS = ("transcribed via public notes of the paper (search-index ids 55271916660 and "
         "69499497868; cells agree)")
GPU = "A100-SXM4-80GB (Selene)"
NET = "NVLink/NVSwitch in node; InfiniBand between nodes (Selene)"


def rows(add, **_):
    # Table 3 configs; Table 5 iteration times (s) full recompute vs present work, MFU, HFU.
    T = [("22b", 64, 6144, 48, 8, 1, 8, 4, 4, 1.42, 1.10, 41.5, 43.7),
         ("175b", 96, 12288, 96, 8, 8, 64, 64, 1, 18.13, 13.75, 51.4, 52.8),
         ("530b", 128, 20480, 105, 8, 35, 280, 280, 1, 49.05, 37.83, 56.0, 57.0),
         ("1t", 160, 25600, 128, 8, 64, 512, 512, 1, 94.42, 71.49, 56.3, 57.0)]
    for name, a, h, l, t, p, n, B, b, full, present, mfu, hfu in T:
        common = dict(source=S, model=f"gpt-{name}", hidden=h, layers=l, heads=a, seq=2048,
                      vocab=51200, gpu=GPU, gpus=n, nodes=max(1, n // 8), network=NET,
                      framework="Megatron-LM (PyTorch)", precision="mixed fp16", micro_batch=b,
                      accum_steps=B // b, global_batch=B, optimizer="Adam",
                      metric="iteration_time", unit="s")
        pipe = f"TP={t} PP={p} DP=1" + ("; interleaved schedule m=3" if name in ("175b", "530b") else "")
        add(id=f"korthikanti-t5-{name}-full-recompute", locator="Table 5 (full recompute column); configs Table 3",
            checkpointing="full (every transformer layer)", extra=pipe + "; no sequence parallelism",
            value=full, iteration_ms=full * 1000,
            notes=f"accum_steps = pipeline micro-batches per iteration (global/micro); {TRANS}",
            **common)
        add(id=f"korthikanti-t5-{name}-selective-sp", locator="Table 5 (present work column); configs Table 3",
            checkpointing="selective (attention core only)", extra=pipe + "; sequence parallelism",
            value=present, iteration_ms=present * 1000,
            notes=(f"MFU {mfu}%, HFU {hfu}% of 312 TFLOP/s (Table 5); accum_steps = pipeline "
                   f"micro-batches per iteration; {TRANS}"), **common)
    # Table 4: one transformer layer of the 22B model (t=8), forward/backward ms.
    T4 = [("none", "no", "baseline, no recompute", 7.7, 11.9, 19.6, ""),
          ("sp", "no", "sequence parallelism", 7.2, 11.8, 19.0, "sequence parallelism"),
          ("full", "full (layer)", "baseline with full recompute", 7.7, 19.5, 27.2, ""),
          ("selective", "selective (attention core)", "selective recompute", 7.7, 13.2, 20.9, ""),
          ("selective-sp", "selective (attention core)", "selective recompute + sequence parallelism",
           7.2, 13.1, 20.3, "sequence parallelism")]
    for tag, ck, label, fw, bw, tot, sp in T4:
        add(id=f"korthikanti-t4-22b-layer-{tag}", source=S,
            locator=f"Table 4 (per-layer time, 22B model), row '{label}'", model="gpt-22b (one layer)",
            hidden=6144, layers=1, heads=64, seq=2048, vocab=51200, gpu=GPU, gpus=8, nodes=1,
            network="NVLink/NVSwitch", framework="Megatron-LM (PyTorch)", precision="mixed fp16",
            micro_batch=4, global_batch=4, checkpointing=ck,
            extra="TP=8" + ("; " + sp if sp else ""), metric="layer_fw_bw_time", value=tot,
            unit="ms", notes=f"forward {fw} ms, backward {bw} ms (Table 4); micro-batch 4 from "
                             f"Table 3 (22B); {TRANS}")
