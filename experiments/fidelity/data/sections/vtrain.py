"""vTrain (MICRO'24) validation ground truth: measured Megatron-DeepSpeed GPT iteration times on A100.

Numbers are read from raw/ copies of VIA-Research/vTrain data/ground_truth_{single,multi}.csv
(MIT licence; byte-count checked against the stored originals: 58473 and 5297 chars with CRLF).
"""
import csv
import os

S = "VIA-Research/vTrain@f8dda8473a48b373b1d25f51f52d685bff5150c5"
RAW = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "raw")
COMMON = dict(framework="Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed; version not stated)",
              metric="iteration_time", unit="ms", optimizer="", vocab="")
NOTE = ("measured (vTrain data/README.md: 'collected using Megatron-DeepSpeed'); precision, vocab, "
        "optimizer and A100 memory variant not stated in the repo; checkpointing=yes is taken from the "
        "matching simulation config (use_checkpoint=true), not from the measurement log; accum_steps = "
        "global/(micro x DP) = micro-batches per iteration")


def rows(add, **_):
    with open(os.path.join(RAW, "vtrain_ground_truth_single.csv")) as f:
        rd = csv.reader(f)
        next(rd)
        for i, r in enumerate(rd):
            g, gb, mb, h, a, l, s, tp, dp, pp, ms = r
            g, gb, mb, h, a, l, s, tp, dp, pp = map(int, (g, gb, mb, h, a, l, s, tp, dp, pp))
            add(id=f"vtrain-single-{i:04d}", source=S,
                locator=f"data/ground_truth_single.csv data row {i + 1} (sim config config/validation/single/config_val_single_{i:04d}.json)",
                model="gpt", hidden=h, layers=l, heads=a, seq=s, gpu="A100 (vTrain gpu_name; variant not stated)",
                gpus=g, nodes=1, network="single node (vTrain sim config: intra_node_bandwidth 150)",
                precision="", micro_batch=mb, accum_steps=gb // (mb * dp), global_batch=gb,
                checkpointing="yes (sim config)", extra=f"TP={tp} DP={dp} PP={pp}; 1F1B pipeline schedule (sim config)",
                value=float(ms), iteration_ms=round(float(ms), 3), notes=NOTE, **COMMON)
    with open(os.path.join(RAW, "vtrain_ground_truth_multi.csv")) as f:
        rd = csv.reader(f)
        next(rd)
        for i, r in enumerate(rd):
            P = r[0]
            g, gb, mb, h, a, l, s, tp, dp, pp = map(int, r[1:11])
            ms = float(r[11])
            add(id=f"vtrain-multi-{i:03d}", source=S, locator=f"data/ground_truth_multi.csv data row {i + 1}",
                model=f"gpt-{P}b", hidden=h, layers=l, heads=a, seq=s, gpu="A100 (vTrain gpu_name; variant not stated)",
                gpus=g, nodes=g // 8, network="multi-node (sim config: inter_node_bandwidth 800, 8 GPUs/node)",
                precision="", micro_batch=mb, accum_steps=gb // (mb * dp), global_batch=gb,
                checkpointing="yes (sim config)", extra=f"TP={tp} DP={dp} PP={pp}",
                value=ms, iteration_ms=ms, notes=NOTE + "; configs mirror Narayanan et al. Table 1 sizes", **COMMON)
