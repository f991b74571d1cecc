"""Hopper's tensor-core convolution efficiency, fitted on half of the H200 CNN sweep.

`configs/arch/hopper.yaml`'s `conv_efficiency.tensor_core` has no published row behind it (the
fidelity experiment predicts no Hopper row with a convolution; it was 0.254 before this fit).
This fits it on the fit half of
the runs `zoo_sweep.sh` measured (every other model, FP32 NCHW and bf16 NHWC), everything else
fixed, by golden-section search on the mean |log error| of the CLI's iteration time, and
reports the other half, never fitted on. Each candidate is a copy of hopper.yaml with the value
changed, reached through a GPU file and a cluster file in a temporary folder (what a user's own
GPU description does), so nothing is rebuilt.

    cargo build --release && python3 experiments/gpu_truth/fit_conv.py
"""

import json
import math
import os
import re
import subprocess
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
H = os.path.join(ROOT, "experiments/gpu_truth/h200")
TP = os.path.join(ROOT, "target/release/trainplan")
FIT = ["resnet18", "resnet152", "vgg16", "mobilenet-v2", "efficientnet-b4"]
HELD_OUT = ["resnet101", "resnext50-32x4d", "inception-v3", "efficientnet-b0", "convnext-tiny"]
VARIANTS = {"baseline": [], "amp-bf16-cl": ["--precision", "bf16", "--channels-last"]}


def runs():
    out = []
    for f in ("cnn_zoo.json", "cnn_zoo2.json"):
        for r in json.load(open(os.path.join(H, f))):
            if "median_ms" in r and r["variant"] in VARIANTS:
                out.append(r)
    return out


def cluster_with(eff, tmp):
    arch = open(os.path.join(ROOT, "configs/arch/hopper.yaml")).read()
    arch, n = re.subn(r"^conv_efficiency: \{cuda_core: ([0-9.]+), tensor_core: [0-9.]+\}",
                      rf"conv_efficiency: {{cuda_core: \1, tensor_core: {eff:.6f}}}", arch, flags=re.M)
    assert n == 1, "hopper.yaml's conv_efficiency line changed shape"
    open(os.path.join(tmp, "hopper_fit.yaml"), "w").write(arch)
    gpu = open(os.path.join(ROOT, "configs/gpus/h200.yaml")).read()
    gpu = re.sub(r"^arch: hopper$", "arch: hopper_fit.yaml", gpu, flags=re.M)
    open(os.path.join(tmp, "h200_fit.yaml"), "w").write(gpu)
    c = open(os.path.join(H, "1xh200.yaml")).read().replace("gpu: h200", "gpu: h200_fit.yaml")
    path = os.path.join(tmp, "1xh200_fit.yaml")
    open(path, "w").write(c)
    return path


def predict(r, cluster):
    args = ["replay", "--model", r["model"], "--batch", str(r["global_batch"]), "--cluster", cluster,
            *VARIANTS[r["variant"]], "--json"]
    p = subprocess.run([TP, *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)["iteration_ms"]


def loss(rows, cluster):
    return sum(abs(math.log(predict(r, cluster) / r["median_ms"])) for r in rows) / len(rows)


def main():
    rows = runs()
    fit = [r for r in rows if r["model"] in FIT]
    held = [r for r in rows if r["model"] in HELD_OUT]
    with tempfile.TemporaryDirectory() as tmp:
        f = lambda e: loss(fit, cluster_with(e, tmp))
        lo, hi = math.log(0.1), math.log(0.9)
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        fa, fb = f(math.exp(a)), f(math.exp(b))
        for _ in range(16):
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - g * (hi - lo)
                fa = f(math.exp(a))
            else:
                lo, a, fa = a, b, fb
                b = lo + g * (hi - lo)
                fb = f(math.exp(b))
        best = math.exp((lo + hi) / 2)
        now = float(re.search(r"^conv_efficiency: \{cuda_core: [0-9.]+, tensor_core: ([0-9.]+)\}",
                              open(os.path.join(ROOT, "configs/arch/hopper.yaml")).read(), re.M).group(1))
        print(f"hopper conv_efficiency.tensor_core {now:.4f} -> {best:.4f} over {len(fit)} fit runs "
              f"(mean |log error| {f(now):.4f} -> {f(best):.4f})")
        for name, part in (("fit", fit), ("held-out", held)):
            for e in (now, best):
                c = cluster_with(e, tmp)
                errs = [100 * (predict(r, c) / r["median_ms"] - 1) for r in part]
                print(f"  {name:8s} at {e:.4f}: mean |error| {sum(map(abs, errs)) / len(errs):5.1f} % over "
                      f"{len(part)} runs ({', '.join(f'{x:+.0f}' for x in errs)})")


if __name__ == "__main__":
    main()
