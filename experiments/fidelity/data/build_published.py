#!/usr/bin/env python3
"""Builds published.csv from the transcribed measurements below.

Every number in this file was copied from the cited source (table cell, log line or text);
the only computed column is `iteration_ms`, derived by one of the formulas in `derive()` and
named in each row's notes. Run: `python3 build_published.py` (writes published.csv beside it).
"""

import csv
import os

COLUMNS = [
    "id", "source", "locator", "model", "hidden", "layers", "heads", "seq", "vocab", "gpu", "gpus",
    "nodes", "network", "framework", "precision", "micro_batch", "accum_steps", "global_batch",
    "checkpointing", "optimizer", "extra", "metric", "value", "unit", "iteration_ms",
    "peak_memory_gb", "memory_kind", "notes",
]

ROWS = []

BERT_BASE = dict(model="bert-base", hidden=768, layers=12, heads=12)
BERT_LARGE = dict(model="bert-large", hidden=1024, layers=24, heads=16)


def fmt(x):
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        s = f"{x:.3f}".rstrip("0").rstrip(".")
        return s
    return str(x)


def derive(r):
    """iteration_ms per optimizer step, when the row gives enough to derive it."""
    note = ""
    if r.get("iteration_ms") not in (None, ""):
        return r["iteration_ms"], note
    m, v, gb = r.get("metric"), r.get("value"), r.get("global_batch")
    if m == "throughput" and v and gb:
        it = gb / v * 1000.0
        note = "iteration_ms derived = global_batch / throughput x 1000"
        mb, acc = r.get("micro_batch"), r.get("accum_steps")
        if acc and acc > 1 and mb:
            note += f"; per micro-step = {gb / acc / v * 1000.0:.1f} ms"
        return round(it, 2), note
    return "", note


def add(**r):
    it, dnote = derive(r)
    r["iteration_ms"] = it
    if dnote:
        r["notes"] = (r.get("notes", "") + ("; " if r.get("notes") else "") + dnote)
    for c in r:
        if c not in COLUMNS:
            raise KeyError(f"unknown column {c} in {r.get('id')}")
    ROWS.append({c: fmt(r.get(c)) for c in COLUMNS})


# ------------------------------------------------------------------------------------------
# Source sections (one module per source family) append through add().
# ------------------------------------------------------------------------------------------
from sections import (  # noqa: E402
    dle_pytorch_rn50, dle_pytorch_resnext, dle_pytorch_efficientnet, dle_tf_rn50, dle_pytorch_bert,
    dle_tf_bert, dlperf, megatron, korthikanti, hf_single_gpu, others, tf_benchmarks, vtrain,
    memory_limits, sharded,
)

for mod in (dle_pytorch_rn50, dle_pytorch_resnext, dle_pytorch_efficientnet, dle_tf_rn50,
            dle_pytorch_bert, dle_tf_bert, dlperf, megatron,
            korthikanti, hf_single_gpu, others, tf_benchmarks, vtrain, memory_limits, sharded):
    mod.rows(add, BERT_BASE=BERT_BASE, BERT_LARGE=BERT_LARGE)

ids = [r["id"] for r in ROWS]
dups = {i for i in ids if ids.count(i) > 1}
if dups:
    raise SystemExit(f"duplicate ids: {sorted(dups)}")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published.csv")
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(ROWS)
print(f"{len(ROWS)} rows -> {out}")
