"""A host's `speed` (configs/hosts/eager.yaml) read off a host-bound PyTorch trace of it.

The host model prices each operator at the 25th percentile of its class measured on a V100
host (`forward_us`, `backward_us`) times `speed`. For every step of a trace whose CPU sets the
pace, this divides what the CPU took for the forward (from the step's start to the end of its
last forward operator on the main thread) and the backward (the autograd thread's span) by what
the host model's per-class times give for the same top-level operators (AccumulateGrad left
out, as in the host file's measurement). The median over the steps is the host's `speed`, for
a cluster file's `host_speed`.

    python3 experiments/gpu_truth/host_speed.py TRACE
"""

import gzip
import json
import os
import re
import statistics
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def host_table():
    text = open(os.path.join(ROOT, "configs/hosts/eager.yaml")).read()
    table = {}
    for key in ("forward_us", "backward_us"):
        body = re.search(rf"^{key}: \{{([^}}]*)\}}", text, re.M).group(1)
        table[key] = {k.strip(): float(v) for k, v in (kv.split(":") for kv in body.split(","))}
    return table


def op_class(name):
    n = name.lower()
    for pattern, cls in ((r"conv", "conv"), (r"batch_?norm", "norm"), (r"layer_?norm", "layer_norm"),
                         (r"pool", "pool"), (r"linear|addmm|\bmm\b|matmul|bmm", "gemm"),
                         (r"softmax|nll|cross_entropy", "softmax"), (r"embedding", "embedding")):
        if re.search(pattern, n):
            return cls
    return "elementwise"


def top_level(events):
    """Top-level operators per thread (not nested in another operator of that thread)."""
    out = {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        lst = out.setdefault(e["tid"], [])
        if not lst or e["ts"] >= lst[-1]["ts"] + lst[-1]["dur"]:
            lst.append(e)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ev = json.load(gzip.open(sys.argv[1]))["traceEvents"]
    table = host_table()
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep")),
                   key=lambda e: e["ts"])
    ratios = []
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        threads = top_level([e for e in ops if a <= e["ts"] < b])
        if len(threads) < 2:
            continue
        main_tid = s["tid"]
        bw = [e for t, lst in threads.items() if t != main_tid for e in lst]
        main_ops = threads.get(main_tid, [])
        if not bw or not main_ops:
            continue
        bw0, bw1 = min(e["ts"] for e in bw), max(e["ts"] + e["dur"] for e in bw)
        fw = [e for e in main_ops if e["ts"] < bw0 and not re.search(r"Optimizer|zero_grad", e["name"])]
        fw_span = max(e["ts"] + e["dur"] for e in fw) - a
        fw_basis = sum(table["forward_us"][op_class(e["name"])] for e in fw)
        bw_ops = [e for e in bw if "AccumulateGrad" not in e["name"]]
        bw_basis = sum(table["backward_us"][op_class(e["name"])] for e in bw_ops)
        r = (fw_span + (bw1 - bw0)) / (fw_basis + bw_basis)
        ratios.append(r)
        print(f"{s['name']}: forward {fw_span / 1e3:.2f} ms over {len(fw)} ops (model {fw_basis / 1e3:.2f}), "
              f"backward {(bw1 - bw0) / 1e3:.2f} ms over {len(bw_ops)} ops (model {bw_basis / 1e3:.2f}): {r:.2f}")
    print(f"host speed: {statistics.median(ratios):.2f} (median of {len(ratios)} steps)")


if __name__ == "__main__":
    main()
