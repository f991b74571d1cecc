"""What batch normalisation's kernels achieve, read off profiler traces recorded with shapes.

For every BatchNorm kernel (cuDNN's `bn_fw_*` / `bn_bw_*`, PyTorch's native
`batch_norm_*` kernels) of a Kineto trace recorded with `record_shapes`, the operator that
launched it (its `External id`) gives the activation's shape and dtype. The model's traffic for
it (src/zoo/cnn.rs `bn`: forward reads x and writes y, 2 passes; backward reads x and dy and
writes dx, 3 passes) over the kernels' summed time is the rate batch norm reaches; divided by
the GPU's datasheet bandwidth and its architecture's `memory_efficiency`, it is the
`norm_efficiency` of `configs/arch/<arch>.yaml`: the fraction of the streaming rate batch norm
reaches at the model's minimum traffic.

    python3 experiments/gpu_truth/norm_rate.py TRACE:GPU [TRACE:GPU ...]

GPU names a `configs/gpus/*.yaml` (h200, v100-32gb, ...). Prints one row per trace and the
pooled figure per architecture.
"""

import gzip
import json
import math
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BN_KERNEL = re.compile(r"cudnn::bn_(fw|bw)_|batch_norm_(collect_statistics|transform_input|"
                       r"backward_reduce|backward_elemt|elementwise|reduce_statistics)")
DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8}


def yaml_field(path, field):
    for line in open(path):
        m = re.match(rf"^{re.escape(field)}:\s*([0-9.]+)", line)
        if m:
            return float(m.group(1))
    raw = open(path).read()
    m = re.search(rf"^{re.escape(field)}:\s*(\S+)", raw, re.M)
    return m.group(1) if m else None


def gpu_rate(gpu):
    """Datasheet bytes/s and the architecture's memory_efficiency."""
    g = os.path.join(ROOT, "configs", "gpus", f"{gpu}.yaml")
    arch = re.search(r"^arch:\s*(\S+)", open(g).read(), re.M).group(1)
    eff = yaml_field(os.path.join(ROOT, "configs", "arch", f"{arch}.yaml"), "memory_efficiency")
    return yaml_field(g, "memory_gbps") * 1e9, eff, arch


def events(path):
    d = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    return d["traceEvents"] if isinstance(d, dict) else d


def measure(path):
    """(model bytes, kernel seconds, kernels) of the trace's BN kernels, forward and backward."""
    ev = events(path)
    ops = {}
    for e in ev:
        a = e.get("args") or {}
        if e.get("cat") in ("cpu_op", "Operator") and "Input Dims" in a and "batch_norm" in e["name"]:
            ops[a.get("External id")] = e
    out = {"fw": [0.0, 0.0, 0], "bw": [0.0, 0.0, 0]}
    unmatched = 0
    for e in ev:
        if e.get("cat") not in ("kernel", "Kernel") or not BN_KERNEL.search(e.get("name", "")):
            continue
        a = e.get("args") or {}
        op = ops.get(a.get("External id", a.get("external id")))  # the 2021 format: lower case
        if op is None:
            unmatched += 1
            continue
        dims, types = op["args"]["Input Dims"], op["args"].get("Input type", [])
        elems = math.prod(dims[0]) if dims and dims[0] else 0
        nbytes = DTYPE_BYTES.get(types[0] if types else "float", 4)
        phase = "bw" if "backward" in op["name"] or "_bw_" in e["name"] or "backward" in e["name"] else "fw"
        passes = 3 if phase == "bw" else 2
        out[phase][2] += 1
        out[phase][1] += e["dur"] * 1e-6
        out.setdefault(phase + "_ops", set()).add(id(op))
        # Several kernels of one op share its traffic: count the op's bytes once.
        if id(op) not in out.setdefault("seen", set()):
            out["seen"].add(id(op))
            out[phase][0] += passes * elems * nbytes
    return out, unmatched


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pooled = {}
    print("| trace | GPU | BN kernels fw / bw | model GB fw / bw | ms fw / bw | reached GB/s | norm_efficiency |")
    print("|---|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        path, gpu = arg.rsplit(":", 1)
        peak, mem_eff, arch = gpu_rate(gpu)
        m, unmatched = measure(path)
        b = m["fw"][0] + m["bw"][0]
        t = m["fw"][1] + m["bw"][1]
        if t == 0:
            print(f"| {os.path.basename(path)} | {gpu} | no BN kernel with a shaped operator ({unmatched} unmatched) |")
            continue
        eff = b / t / peak / mem_eff
        p = pooled.setdefault(arch, [0.0, 0.0, peak * mem_eff])
        p[0] += b / (peak * mem_eff)
        p[1] += t
        print(f"| {os.path.basename(path)} | {gpu} | {m['fw'][2]} / {m['bw'][2]} | "
              f"{m['fw'][0] / 1e9:.2f} / {m['bw'][0] / 1e9:.2f} | {m['fw'][1] * 1e3:.1f} / {m['bw'][1] * 1e3:.1f} | "
              f"{b / t / 1e9:.0f} | {eff:.3f} |")
    for arch, (ideal, t, _) in pooled.items():
        print(f"\n{arch}: pooled norm_efficiency {ideal / t:.3f} (model time at the streaming rate "
              f"{ideal * 1e3:.1f} ms over the kernels' {t * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
