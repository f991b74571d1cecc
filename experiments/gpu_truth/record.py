"""Ground truth for issue 8: measure PyTorch training variants on a real GPU, and record the
baseline profiler traces that `trainplan whatif --trace` predicts from.

Run on a machine with a CUDA GPU, PyTorch, torchvision and transformers (no download needed:
the models are built from their configs, the data is synthetic):

    python3 experiments/gpu_truth/record.py --out experiments/gpu_truth/measured.json \
        --traces experiments/gpu_truth/traces

For each model (torchvision ResNet-50 at batch 64, transformers BERT-base at batch 32 x seq 128,
FP32 training with Adam) and each variant, it runs warm-up steps, then times >= 20 steady-state
steps with CUDA events (median reported) and reads torch.cuda.max_memory_allocated. The baseline
is also profiled (torch.profiler, a few steps after warm-up) into a gzipped Kineto trace.

Variants: baseline; amp-bf16 and amp-fp16 (torch.autocast, GradScaler for fp16); ckpt
(activation checkpointing: every ResNet bottleneck block of layer2-layer4, every BERT encoder
layer); accum2 / accum4 (gradient accumulation, same global batch); compile (torch.compile,
default mode); fused-adam (Adam with fused=True; the baseline uses foreach=False, one kernel
per tensor, so the difference is the fusion).
"""

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

VARIANTS = ["baseline", "amp-bf16", "amp-fp16", "ckpt", "accum2", "accum4", "compile", "fused-adam"]


def build(model_name, variant):
    """Model, a function making one micro-batch of `n` samples, and the loss function."""
    dev = torch.device("cuda")
    if model_name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(dev)
        if variant == "ckpt":
            from torch.utils.checkpoint import checkpoint

            for stage in (model.layer2, model.layer3, model.layer4):
                for i, block in enumerate(stage):
                    stage[i] = Checkpointed(block, checkpoint)

        def batch(n):
            x = torch.randn(n, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (n,), device=dev)
            return (x,), y

        loss_fn = torch.nn.CrossEntropyLoss()

        def loss(out, y):
            return loss_fn(out, y)

        return model, batch, loss, 64
    if model_name == "bert-base":
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig()  # bert-base-uncased shape: 12 layers, hidden 768, 12 heads
        model = BertForSequenceClassification(cfg).to(dev)
        if variant == "ckpt":
            model.gradient_checkpointing_enable()

        def batch(n):
            ids = torch.randint(0, cfg.vocab_size, (n, 128), device=dev)
            mask = torch.ones(n, 128, dtype=torch.long, device=dev)
            y = torch.randint(0, 2, (n,), device=dev)
            return (ids, mask), y

        def loss(out, y):
            return torch.nn.functional.cross_entropy(out.logits, y)

        return model, batch, loss, 32
    raise SystemExit(f"unknown model {model_name}")


class Checkpointed(torch.nn.Module):
    """Run a block under activation checkpointing (its activations are recomputed in backward)."""

    def __init__(self, block, checkpoint):
        super().__init__()
        self.block = block
        self.checkpoint = checkpoint

    def forward(self, x):
        return self.checkpoint(self.block, x, use_reentrant=False)


def run(model_name, variant, steps, warmup, trace_path=None):
    torch.manual_seed(0)
    model, batch, loss_fn, global_batch = build(model_name, variant)
    model.train()
    fused = variant == "fused-adam"
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused, foreach=False if not fused else None)
    k = {"accum2": 2, "accum4": 4}.get(variant, 1)
    micro = global_batch // k
    amp_dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(variant)
    scaler = torch.amp.GradScaler("cuda") if variant == "amp-fp16" else None
    fwd = torch.compile(model) if variant == "compile" else model
    inputs = [batch(micro) for _ in range(k)]

    def step():
        opt.zero_grad(set_to_none=True)
        for xs, y in inputs:
            if amp_dtype is not None:
                with torch.autocast("cuda", dtype=amp_dtype):
                    out = fwd(*xs)
                    loss = loss_fn(out, y) / k
            else:
                out = fwd(*xs)
                loss = loss_fn(out, y) / k
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    peak = torch.cuda.max_memory_allocated()
    if trace_path:
        sched = torch.profiler.schedule(wait=1, warmup=2, active=4, repeat=1)
        tmp = tempfile.mkdtemp()
        out = {}

        def ready(p):
            f = os.path.join(tmp, "trace.json")
            p.export_chrome_trace(f)
            out["f"] = f

        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=ready) as p:
            for _ in range(1 + 2 + 4 + 1):
                step()
                p.step()
        torch.cuda.synchronize()
        with open(out["f"], "rb") as src, gzip.open(trace_path, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        shutil.rmtree(tmp)
    return {
        "model": model_name,
        "variant": variant,
        "global_batch": global_batch,
        "micro_batches": k,
        "steps": steps,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "peak_bytes": peak,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert-base")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", required=True, help="measured.json to write")
    ap.add_argument("--traces", help="folder for the baseline Kineto traces (<model>_baseline.json.gz)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to PyTorch")
    results = []
    for m in a.models.split(","):
        for v in a.variants.split(","):
            if v not in VARIANTS:
                sys.exit(f"unknown variant {v}; known: {', '.join(VARIANTS)}")
            trace = None
            if v == "baseline" and a.traces:
                os.makedirs(a.traces, exist_ok=True)
                trace = os.path.join(a.traces, f"{m}_baseline.json.gz")
            t = time.time()
            warm = a.warmup * (3 if v == "compile" else 1)
            r = run(m, v, a.steps, warm, trace)
            r["wall_s"] = round(time.time() - t, 1)
            r["gpu"] = torch.cuda.get_device_name()
            r["torch"] = torch.__version__
            print(json.dumps(r), flush=True)
            results.append(r)
            torch.cuda.empty_cache()
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
