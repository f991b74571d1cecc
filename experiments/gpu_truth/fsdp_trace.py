"""The shape of an FSDP2 GPU trace (issue 23, part 5): one process, NCCL, world size 1 (the
device machine has one GPU), a Hugging Face GPT-2 (hidden 1024, 24 layers, 16 heads, seq 1024,
batch 8, vocab 50257) with fully_shard on every block and on the root, bf16 parameters and
fp32 gradient reduction (MixedPrecisionPolicy), AdamW. The same model without FSDP under
torch.autocast(bf16) is timed and traced too: the difference is FSDP's copy-in/copy-out,
hooks and its collectives (with one rank NCCL's all-gather and reduce-scatter are local copies,
so the collectives' shape is there, not their network time).

    python3 experiments/gpu_truth/fsdp_trace.py --out DIR

Writes DIR/fsdp_gpt2m_1rank.json.gz, DIR/plain_gpt2m.json.gz (Kineto traces of 3 steps after
5 warm-ups) and DIR/fsdp.json (CUDA-event median step times of 20 steps, peaks allocated and
reserved, device memory in use). `--detail`: the FSDP run alone, traced with cuda_sync events
(each cudaStreamWaitEvent's streams), shapes and allocator events, into
DIR/fsdp_gpt2m_1rank_detail.json.gz and DIR/fsdp_detail.json.
"""

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile

import torch
import torch.distributed as dist


def build():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).cuda(), cfg


def measure(model, cfg, step_amp, trace_path, detail=False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with step_amp():
            logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    free, total = torch.cuda.mem_get_info()
    out = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
           "peak_bytes": torch.cuda.max_memory_allocated(),
           "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
           "device_used_bytes": total - free}
    tmp = tempfile.mkdtemp()
    f = os.path.join(tmp, "t.json")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    extra = {}
    if detail:
        # cuda_sync events (which stream waits on which event), shapes and allocator events.
        extra = dict(record_shapes=True, profile_memory=True,
                     experimental_config=torch._C._profiler._ExperimentalConfig(
                         enable_cuda_sync_events=True))
    with torch.profiler.profile(activities=acts, **extra) as p:
        for _ in range(3):
            with torch.profiler.record_function("ProfilerStep#train"):
                step()
        torch.cuda.synchronize()
    p.export_chrome_trace(f)
    with open(f, "rb") as src, gzip.open(trace_path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--detail", action="store_true",
                    help="FSDP run only, its trace with cuda_sync events, shapes and memory")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from contextlib import nullcontext

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    model, cfg = build()
    result["params"] = sum(p.numel() for p in model.parameters())
    if not a.detail:
        result["plain_autocast_bf16"] = measure(
            model, cfg, lambda: torch.autocast("cuda", dtype=torch.bfloat16),
            os.path.join(a.out, "plain_gpt2m.json.gz"))
        del model
        torch.cuda.empty_cache()
        model, cfg = build()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    name = "fsdp_gpt2m_1rank_detail.json.gz" if a.detail else "fsdp_gpt2m_1rank.json.gz"
    result["fsdp2_bf16"] = measure(model, cfg, nullcontext, os.path.join(a.out, name), a.detail)
    print(json.dumps(result, indent=1), flush=True)
    with open(os.path.join(a.out, "fsdp_detail.json" if a.detail else "fsdp.json"), "w") as f:
        json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
