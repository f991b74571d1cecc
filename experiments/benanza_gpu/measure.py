#!/usr/bin/env python3
"""Measure ResNet-50 and BERT-base on a real GPU and export them to ONNX, for comparison with
`trainplan lower-bound` (Benanza's Q1: how far a run sits above its lower bound).

For each model, batch size and dtype it records, with CUDA events (median of --iters runs after
--warmup runs):
  * inference latency: one forward pass under torch.no_grad(), model in eval mode;
  * training-step latency: forward + backward + SGD step, model in train mode;
and exports the model to ONNX (torch.onnx.export, static shapes, constant folding) so that
`trainplan lower-bound` reads exactly the graph that was timed. It also writes one Kineto trace
of the inference loop per model (torch.profiler, ProfilerStep#N) for `lower-bound --trace`.

Needs torch, torchvision, transformers (and onnx for the export) already installed; no download
happens: ResNet-50 and BERT-base are built with random weights (latency does not depend on them).

    python3 experiments/benanza_gpu/measure.py --out experiments/results/gpu
    # then experiments/benanza_gpu/run.sh compares with trainplan (see README.md here)
"""
import argparse
import json
import os
import statistics
import sys


def need(module):
    try:
        return __import__(module)
    except ImportError:
        sys.exit(f"measure.py needs `{module}` (pip install torch torchvision transformers onnx)")


torch = need("torch")
torchvision = need("torchvision")
transformers = need("transformers")


def resnet50():
    return torchvision.models.resnet50(weights=None), lambda b: (torch.randn(b, 3, 224, 224),), ["input"]


def bert_base(seq):
    cfg = transformers.BertConfig()  # bert-base-uncased sizes: 12 layers, hidden 768, 12 heads
    model = transformers.BertModel(cfg, add_pooling_layer=True)
    model.config.return_dict = False

    def inputs(b):
        return (torch.randint(0, cfg.vocab_size, (b, seq)),)

    return model, inputs, ["input_ids"]


def timed(fn, warmup, iters):
    """Median GPU time of fn() in ms, CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="experiments/results/gpu")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--dtypes", default="fp32,tf32,fp16")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--models", default="resnet50,bert_base")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}
    builders = {"resnet50": resnet50, "bert_base": lambda: bert_base(args.seq)}
    for name in args.models.split(","):
        model, make_inputs, input_names = builders[name]()
        model = model.to(dev)
        # ONNX export: the timed graph at batch 1 with a symbolic batch dim.
        onnx_path = os.path.join(args.out, f"{name}.onnx")
        model.eval()
        with torch.no_grad():
            torch.onnx.export(
                model, tuple(x.to(dev) for x in make_inputs(1)), onnx_path,
                input_names=input_names, dynamic_axes={n: {0: "batch"} for n in input_names},
                opset_version=17, do_constant_folding=True, dynamo=False)
        print(f"exported {onnx_path}", flush=True)
        for dtype in args.dtypes.split(","):
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            torch.backends.cudnn.allow_tf32 = dtype == "tf32"
            cast = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype)
            for b in [int(x) for x in args.batches.split(",")]:
                x = tuple(t.to(dev) for t in make_inputs(b))
                m = model.to(torch.float32)
                if cast is not None:
                    m = m.to(cast)
                    x = tuple(t.to(cast) if t.is_floating_point() else t for t in x)
                try:
                    m.eval()
                    with torch.no_grad():
                        inf = timed(lambda: m(*x), args.warmup, args.iters)
                    m.train()
                    opt = torch.optim.SGD(m.parameters(), lr=1e-6)

                    def step():
                        opt.zero_grad(set_to_none=True)
                        out = m(*x)
                        out = out[0] if isinstance(out, (tuple, list)) else out
                        out.float().mean().backward()
                        opt.step()

                    train = timed(step, args.warmup, args.iters)
                except torch.cuda.OutOfMemoryError:
                    print(f"{name} {dtype} batch {b}: out of memory", flush=True)
                    torch.cuda.empty_cache()
                    continue
                run = {"model": name, "dtype": dtype, "batch": b,
                       "inference_ms": inf[0], "inference_min_ms": inf[1],
                       "train_step_ms": train[0], "train_step_min_ms": train[1]}
                results["runs"].append(run)
                print(json.dumps(run), flush=True)
        # One Kineto trace of inference (fp32, batch 32) for `lower-bound --trace`.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        m = model.to(torch.float32).eval()
        x = tuple(t.to(dev) for t in make_inputs(32))
        sched = torch.profiler.schedule(wait=1, warmup=2, active=3)
        trace_path = os.path.join(args.out, f"{name}_b32_fp32_inference.json")
        with torch.no_grad(), torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                schedule=sched,
                on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
            for _ in range(6):
                m(*x)
                torch.cuda.synchronize()
                prof.step()
        print(f"trace {trace_path}", flush=True)
        del model
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "measured.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {os.path.join(args.out, 'measured.json')}")


if __name__ == "__main__":
    main()
