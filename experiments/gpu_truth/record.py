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
per tensor, so the difference is the fusion); tf32 (FP32 with TF32 matrix products on; the
baseline leaves PyTorch's default, TF32 off for matmul and on for cuDNN convolutions);
channels-last and amp-bf16-cl (ResNet-50 in NHWC, fp32 and under bf16 autocast). `--batch`
overrides a model's default global batch (e.g. 256 for ResNet-50 to leave the host-bound regime).

Memory (issue 21): every run also records torch.cuda.max_memory_reserved, the device memory in
use (total - free from cudaMemGetInfo, what nvidia-smi shows for the process) after the timed
steps, and the first record holds the CUDA context's size. More models for the memory rows:
gpt2-medium, gpt2-large (causal LM, seq 1024, batch 8), bert-large (seq 512, batch 8) and
bert-large-eager / bert-base-eager (the unfused attention that materializes the score matrix).
"""

import argparse
import gc
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

VARIANTS = ["baseline", "tf32", "channels-last", "amp-bf16-cl", "amp-bf16", "amp-fp16", "ckpt", "accum2", "accum4", "compile", "fused-adam"]


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
    if model_name in TRANSFORMERS:
        return build_transformer(model_name, variant, dev)
    if model_name in CNNS:
        return build_cnn(model_name, dev)
    raise SystemExit(f"unknown model {model_name}")


# The zoo's other CNNs, as torchvision builds them (zoo name -> torchvision constructor, its
# keyword arguments, image side, a batch that keeps an H200 device-bound, the zoo's optimizer).
# Parameter counts equal the zoo's (src/zoo/cnn.rs unit tests); inception_v3 without its
# auxiliary head, as the zoo has it.
CNNS = {
    "resnet18": ("resnet18", {}, 224, 256, "sgd"),
    "resnet101": ("resnet101", {}, 224, 128, "sgd"),
    "resnet152": ("resnet152", {}, 224, 128, "sgd"),
    "resnext50-32x4d": ("resnext50_32x4d", {}, 224, 128, "sgd"),
    "vgg16": ("vgg16", {}, 224, 128, "sgd"),
    "inception-v3": ("inception_v3", dict(aux_logits=False, init_weights=False), 299, 128, "sgd"),
    "mobilenet-v2": ("mobilenet_v2", {}, 224, 256, "sgd"),
    "efficientnet-b0": ("efficientnet_b0", {}, 224, 256, "adam"),
    "efficientnet-b4": ("efficientnet_b4", {}, 380, 64, "adam"),
    "convnext-tiny": ("convnext_tiny", {}, 224, 128, "adam"),
}


def build_cnn(name, dev):
    import torchvision

    ctor, kw, side, gbatch, _ = CNNS[name]
    model = getattr(torchvision.models, ctor)(weights=None, **kw).to(dev)

    def batch(n):
        x = torch.randn(n, 3, side, side, device=dev)
        return (x,), torch.randint(0, 1000, (n,), device=dev)

    loss_fn = torch.nn.CrossEntropyLoss()
    return model, batch, lambda out, y: loss_fn(out, y), gbatch


def optimizer(model_name, model, variant, zoo_optimizer):
    """Adam with `foreach=False` (issue 8's runs), or with --zoo-optimizer the zoo model's
    optimizer with PyTorch's defaults (multi-tensor `foreach` kernels): SGD with momentum 0.9
    and weight decay 1e-4 for the ResNet family, VGG, Inception and MobileNet; AdamW for
    EfficientNet and ConvNeXt."""
    params = model.parameters()
    if zoo_optimizer and model_name in CNNS:
        if CNNS[model_name][4] == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
        return torch.optim.AdamW(params, lr=1e-3)
    fused = variant == "fused-adam"
    return torch.optim.Adam(params, lr=1e-4, fused=fused, foreach=False if not fused else None)


# Memory rows (issue 21): Hugging Face models built from their configs, (family, config kwargs,
# attention implementation, sequence length, batch). GPT-2 is causal-LM training on its own
# tokens; BERT is sequence classification like bert-base above.
TRANSFORMERS = {
    "gpt2-medium": ("gpt2", dict(n_embd=1024, n_layer=24, n_head=16), "sdpa", 1024, 8),
    "gpt2-large": ("gpt2", dict(n_embd=1280, n_layer=36, n_head=20), "sdpa", 1024, 8),
    "bert-large": ("bert", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                intermediate_size=4096), "sdpa", 512, 8),
    "bert-large-eager": ("bert", dict(hidden_size=1024, num_hidden_layers=24,
                                      num_attention_heads=16, intermediate_size=4096), "eager", 512, 8),
    "bert-base-eager": ("bert", {}, "eager", 128, 32),
}


def build_transformer(name, variant, dev):
    family, kw, attn, seq, gbatch = TRANSFORMERS[name]
    if family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_positions=seq, attn_implementation=attn, **kw)
        model = GPT2LMHeadModel(cfg).to(dev)
    else:
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(max_position_embeddings=max(512, seq), attn_implementation=attn, **kw)
        model = BertForSequenceClassification(cfg).to(dev)
    if variant == "ckpt":
        model.gradient_checkpointing_enable()

    def batch(n):
        ids = torch.randint(0, cfg.vocab_size, (n, seq), device=dev)
        if family == "gpt2":
            return (ids,), ids
        mask = torch.ones(n, seq, dtype=torch.long, device=dev)
        return (ids, mask), torch.randint(0, 2, (n,), device=dev)

    def loss(out, y):
        if family == "gpt2":
            logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
            return torch.nn.functional.cross_entropy(logits, y[:, 1:].reshape(-1))
        return torch.nn.functional.cross_entropy(out.logits, y)

    return model, batch, loss, gbatch


class Checkpointed(torch.nn.Module):
    """Run a block under activation checkpointing (its activations are recomputed in backward)."""

    def __init__(self, block, checkpoint):
        super().__init__()
        self.block = block
        self.checkpoint = checkpoint

    def forward(self, x):
        return self.checkpoint(self.block, x, use_reentrant=False)


def run(model_name, variant, steps, warmup, trace_path=None, batch_override=None, zoo_optimizer=False):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = variant == "tf32"
    model, batch, loss_fn, global_batch = build(model_name, variant)
    global_batch = batch_override or global_batch
    channels_last = variant in ("channels-last", "amp-bf16-cl")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = optimizer(model_name, model, variant, zoo_optimizer)
    k = {"accum2": 2, "accum4": 4}.get(variant, 1)
    micro = global_batch // k
    amp_dtype = {"amp-bf16": torch.bfloat16, "amp-bf16-cl": torch.bfloat16,
                 "amp-fp16": torch.float16}.get(variant)
    scaler = torch.amp.GradScaler("cuda") if variant == "amp-fp16" else None
    fwd = torch.compile(model) if variant == "compile" else model
    inputs = [batch(micro) for _ in range(k)]
    if channels_last:
        inputs = [((xs[0].contiguous(memory_format=torch.channels_last),), y) for xs, y in inputs]

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
    peak_reserved = torch.cuda.max_memory_reserved()
    free, total = torch.cuda.mem_get_info()
    reserved_now = torch.cuda.memory_reserved()
    if trace_path:
        sched = torch.profiler.schedule(wait=1, warmup=2, active=4, repeat=1)
        tmp = tempfile.mkdtemp()
        out = {}

        def ready(p):
            f = os.path.join(tmp, "trace.json")
            p.export_chrome_trace(f)
            out["f"] = f

        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=ready,
                                    record_shapes=True) as p:
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
        "peak_reserved_bytes": peak_reserved,
        "device_used_bytes": total - free,
        "reserved_now_bytes": reserved_now,
        "device_total_bytes": total,
        "optimizer": type(opt).__name__ + ("" if not zoo_optimizer else " (foreach)"),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert-base")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", required=True, help="measured.json to write")
    ap.add_argument("--batch", type=int, help="global batch instead of the model's default")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new run after this many seconds (what ran is kept)")
    ap.add_argument("--traces", help="folder for the Kineto traces (<model>_<variant>.json.gz)")
    ap.add_argument("--trace-variants", default="baseline",
                    help="variants traced when --traces is given (comma-separated)")
    ap.add_argument("--trace-models", help="models traced (default: all)")
    ap.add_argument("--zoo-optimizer", action="store_true",
                    help="the zoo's optimizer with PyTorch's defaults for the CNNs (see optimizer())")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True (what CNN training recipes set)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to PyTorch")
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    traced = set(a.trace_variants.split(","))
    trace_models = set(a.trace_models.split(",")) if a.trace_models else None
    results = [context_sizes()]
    start = time.time()
    for m in a.models.split(","):
        for v in a.variants.split(","):
            if v not in VARIANTS:
                sys.exit(f"unknown variant {v}; known: {', '.join(VARIANTS)}")
            if time.time() - start > a.budget_s:
                print(f"budget spent: skipping {m} {v}", flush=True)
                continue
            trace = None
            if v in traced and a.traces and (trace_models is None or m in trace_models):
                os.makedirs(a.traces, exist_ok=True)
                trace = os.path.join(a.traces, f"{m}_{v}.json.gz")
            t = time.time()
            warm = a.warmup * (3 if v == "compile" else 1)
            try:
                r = run(m, v, a.steps, warm, trace, a.batch, a.zoo_optimizer)
            except torch.OutOfMemoryError as e:
                r = {"model": m, "variant": v, "oom": str(e).splitlines()[0]}
            r["wall_s"] = round(time.time() - t, 1)
            r["gpu"] = torch.cuda.get_device_name()
            r["torch"] = torch.__version__
            print(json.dumps(r), flush=True)
            results.append(r)
            gc.collect()
            torch.cuda.empty_cache()
            write(a.out, results)


def write(path, results):
    """Atomically: a run cut short keeps every measurement made so far."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def context_sizes():
    """Device memory in use (total - free) once the CUDA context exists, and again after the
    first cuBLAS product (its handle, workspace and the modules lazy loading brings in)."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    ctx = total - free
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()
    free2, _ = torch.cuda.mem_get_info()
    return {"context": True, "context_bytes": ctx, "after_first_gemm_bytes": total - free2,
            "allocator_reserved_bytes": torch.cuda.memory_reserved(),
            "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: lazy)"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device_total_bytes": total}


if __name__ == "__main__":
    main()
