"""Attention on a Hopper GPU (issue 22): time PyTorch's scaled_dot_product_attention forward and
forward+backward in bf16 at sequence lengths 512..32k with the token count held fixed, causal
and not, per backend (flash, cuDNN, memory-efficient; whichever this PyTorch offers). CUDA-event
median of 20 after 5 warm-ups, inputs redrawn per size. Writes a CSV:

    python3 experiments/gpu_truth/attention.py --out attention.csv
"""

import argparse
import csv
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def median_ms(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32768, help="batch x sequence per size")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    rows = []
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        batch = max(1, a.tokens // seq)
        shape = (batch, a.heads, seq, a.head_dim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            # matmul FLOPs of QK^T and PV (2 each per MAC), halved under a causal mask
            fwd_flop = 4 * batch * a.heads * seq * seq * a.head_dim * (0.5 if causal else 1.0)
            for name, backend in BACKENDS.items():
                try:
                    with sdpa_kernel([backend]):
                        f = median_ms(lambda: sdpa(q, k, v, is_causal=causal))
                        fb = median_ms(lambda: sdpa(q, k, v, is_causal=causal).backward(g))
                except RuntimeError as e:
                    print(f"seq {seq} causal {causal} {name}: {str(e).splitlines()[0]}")
                    continue
                row = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           backend=name, batch=batch, heads=a.heads, head_dim=a.head_dim,
                           seq=seq, causal=causal, fwd_ms=round(f, 4), fwd_bwd_ms=round(fb, 4),
                           fwd_tflops=round(fwd_flop / f / 1e9, 1),
                           fwd_bwd_tflops=round(3.5 * fwd_flop / fb / 1e9, 1))
                print(row, flush=True)
                rows.append(row)
        del q, k, v, g
        torch.cuda.empty_cache()
    tmp = a.out + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
