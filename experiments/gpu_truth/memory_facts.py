"""Issue 21: the published out-of-memory facts trainplan gets wrong, re-run in PyTorch on a GPU.

The fidelity table has three memory facts it predicts wrongly and one family of completed runs
it predicts over capacity. Two of them are PyTorch runs whose model code is public, so their
memory can be decomposed on any CUDA GPU (weights, gradients, optimizer state and saved
activations do not depend on the GPU; the context and the allocator's rounding do, and are
measured here too):

  * DLPerf's re-run of NVIDIA DLE PyTorch BERT-base phase-1 pre-training, FP32, seq 128:
    batch 48 ran, batch 64 ran out of memory on a V100 16 GB (BertForPreTraining: the MLM logits
    at every position, as that modeling.py computes them, and the NSP head);
  * Lambda's DLE PyTorch BERT-large SQuAD fine-tuning, AMP fp16, batch 16, seq 384, which ran on
    2-8 V100 16 GB under DDP (trainplan predicts 17.46 GB of device memory there).

and, as a floor for the TensorFlow 1 facts (BERT-large SQuAD FP32 at batch 3 on 16 GB and batch
10 on 32 GB ran out of memory), the same model in PyTorch at those batches.

Each configuration runs in its own process (so that the device memory in use is that run's:
context, allocator segments, NCCL) and records, over the timed steps:

  static_bytes        allocated after a step with the gradients freed: weights + optimizer state
  grads_bytes         what the gradients add (allocated after backward minus before forward,
                      less the activations freed by backward: measured as allocated just after
                      backward minus static)
  after_forward_bytes allocated when the loss exists: static + saved activations (+ loss)
  peak_bytes          torch.cuda.max_memory_allocated
  peak_reserved_bytes torch.cuda.max_memory_reserved
  device_used_bytes   total - free from cudaMemGetInfo after the steps (what nvidia-smi shows)
  alloc_retries       the caching allocator's cudaMalloc retries (fragmentation under pressure)

Models are built from their configs (no download), inputs are random token ids. The optimizer
is Adam with fused=True (one kernel, no foreach temporaries: the closest to APEX's FusedAdam /
FusedLAMB that DLE runs) unless the configuration says foreach.

    python3 experiments/gpu_truth/memory_facts.py --out memory_facts.json [--only NAME,...]
"""

import argparse
import json
import os
import subprocess
import sys
import time

# name -> (task, model size, seq, batch, precision, attention, options)
CONFIGS = {
    "bert-base-pretrain-fp32-eager-b48": ("pretrain", "base", 128, 48, "fp32", "eager", ""),
    "bert-base-pretrain-fp32-eager-b64": ("pretrain", "base", 128, 64, "fp32", "eager", ""),
    "bert-base-pretrain-fp32-sdpa-b64": ("pretrain", "base", 128, 64, "fp32", "sdpa", ""),
    "bert-base-pretrain-fp32-eager-b64-foreach": ("pretrain", "base", 128, 64, "fp32", "eager", "foreach"),
    "bert-large-squad-fp16-eager-b16": ("squad", "large", 384, 16, "fp16", "eager", ""),
    "bert-large-squad-fp16-sdpa-b16": ("squad", "large", 384, 16, "fp16", "sdpa", ""),
    "bert-large-squad-fp32-eager-b3": ("squad", "large", 384, 3, "fp32", "eager", ""),
    "bert-large-squad-fp32-eager-b10": ("squad", "large", 384, 10, "fp32", "eager", ""),
    "bert-base-pretrain-fp32-eager-b64-ddp": ("pretrain", "base", 128, 64, "fp32", "eager", "ddp"),
    "bert-large-squad-fp16-eager-b16-ddp": ("squad", "large", 384, 16, "fp16", "eager", "ddp"),
}


def measure(name, steps):
    import torch
    from transformers import BertConfig, BertForPreTraining, BertForQuestionAnswering

    task, size, seq, batch, precision, attn, options = CONFIGS[name]
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    free0, total = torch.cuda.mem_get_info()
    kw = dict(attn_implementation=attn, vocab_size=30528)
    if size == "large":
        kw.update(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    cfg = BertConfig(**kw)
    model = (BertForPreTraining if task == "pretrain" else BertForQuestionAnswering)(cfg).to(dev)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    fwd = model
    if "ddp" in options:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
        fwd = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    if "foreach" in options:
        opt = torch.optim.Adam(model.parameters(), lr=1e-5, foreach=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=True)
    amp = torch.float16 if precision == "fp16" else None
    scaler = torch.amp.GradScaler("cuda") if amp is not None else None

    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev, generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)
    types = torch.zeros(batch, seq, dtype=torch.long, device=dev)
    if task == "pretrain":
        labels = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev, generator=g)
        keep = torch.rand(batch, seq, device=dev, generator=g) < 0.15
        labels = torch.where(keep, labels, torch.full_like(labels, -100))
        nsp = torch.randint(0, 2, (batch,), device=dev, generator=g)
    else:
        start = torch.randint(0, seq, (batch,), device=dev, generator=g)
        end = torch.randint(0, seq, (batch,), device=dev, generator=g)
    ce = torch.nn.functional.cross_entropy
    marks = {}

    def step(record):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            out = fwd(input_ids=ids, attention_mask=mask, token_type_ids=types)
            if task == "pretrain":
                v = out.prediction_logits
                loss = ce(v.reshape(-1, v.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
                loss = loss + ce(out.seq_relationship_logits.float(), nsp)
            else:
                loss = (ce(out.start_logits.float(), start) + ce(out.end_logits.float(), end)) / 2
        if record:
            marks["after_forward"] = torch.cuda.memory_allocated()
        del out
        (scaler.scale(loss) if scaler else loss).backward()
        if record:
            marks["after_backward"] = torch.cuda.memory_allocated()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        del loss

    t0 = time.time()
    step(False)
    step(False)
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for i in range(steps):
        step(i == steps - 1)
    ev[1].record()
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    result = {
        "name": name,
        "task": task,
        "model": f"bert-{size}",
        "seq": seq,
        "batch": batch,
        "precision": precision,
        "attention": attn,
        "options": options,
        "params": params,
        "optimizer": "Adam(foreach=True)" if "foreach" in options else "Adam(fused=True)",
        "step_ms": ev[0].elapsed_time(ev[1]) / steps,
        "static_bytes": static,
        "after_forward_bytes": marks["after_forward"],
        "after_backward_bytes": marks["after_backward"],
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "reserved_now_bytes": torch.cuda.memory_reserved(),
        "device_used_bytes": total - free,
        "device_used_before_bytes": total - free0,
        "device_total_bytes": total,
        "alloc_retries": stats.get("num_alloc_retries", 0) - retries0,
        "wall_s": round(time.time() - t0, 1),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    if "ddp" in options:
        import torch.distributed as dist

        dist.destroy_process_group()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated configuration names (default: all)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--limit-s", type=float, default=90, help="per configuration")
    a = ap.parse_args()
    if a.one:
        try:
            r = measure(a.one, a.steps)
        except Exception as e:  # an out-of-memory is a result, not a failure
            r = {"name": a.one, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        with open(a.out, "w") as f:
            json.dump(r, f)
        return
    names = a.only.split(",") if a.only else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        sys.exit(f"unknown configuration(s): {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    results = []
    for n in names:
        tmp = a.out + ".one"
        try:
            subprocess.run([sys.executable, __file__, "--one", n, "--out", tmp, "--steps", str(a.steps)],
                           timeout=a.limit_s, check=False)
            with open(tmp) as f:
                r = json.load(f)
        except (subprocess.TimeoutExpired, OSError, ValueError) as e:
            r = {"name": n, "error": f"{type(e).__name__}: {e}"}
        results.append(r)
        gb = lambda k: f"{r[k] / 1e9:6.2f}" if k in r else "   -  "
        print(f"{n:45} static {gb('static_bytes')} fwd {gb('after_forward_bytes')} peak {gb('peak_bytes')} "
              f"resv {gb('peak_reserved_bytes')} used {gb('device_used_bytes')} GB "
              f"{r.get('step_ms', 0):7.1f} ms {r.get('error', '')}", flush=True)
        with open(a.out + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
