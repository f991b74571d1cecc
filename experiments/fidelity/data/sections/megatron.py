"""Narayanan et al. SC'21 Table 1 (weak scaling of GPT on Selene)."""

S = ("Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti, Vainbrand, Kashinkunti, "
     "Bernauer, Catanzaro, Phanishayee, Zaharia: Efficient Large-Scale Language Model Training on "
     "GPU Clusters Using Megatron-LM, SC 2021 (arXiv:2104.04473)")
L = "Table 1 (weak-scaling throughput for GPT models ranging from 1 billion to 1 trillion parameters)"
TRANS = ("transcribed from the paper's Table 1 as reproduced in two independent public notes "
         "(search-index ids 66890646596 and 55320678230; identical cells)")

# params(B), heads, hidden, layers, t, p, gpus, batch, TFLOP/s per GPU, % of peak
T1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]


def rows(add, **_):
    s, V = 2048, 51200
    for P, a, h, l, t, p, n, B, X, pct in T1:
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        it = flops / (n * X * 1e12) * 1000.0
        dp = n // (t * p)
        add(id=f"megatron-sc21-t1-gpt-{P:g}b", source=S, locator=L, model=f"gpt-{P:g}b",
            hidden=h, layers=l, heads=a, seq=s, vocab=V, gpu="A100-SXM4-80GB (Selene)", gpus=n,
            nodes=n // 8, network="NVLink/NVSwitch in node; HDR InfiniBand between nodes (Selene)",
            framework="Megatron-LM (PyTorch)", precision="mixed fp16", global_batch=B,
            checkpointing="yes (activation recomputation; Eq.3 FLOPs include the extra forward)",
            optimizer="Adam", extra=f"TP={t} PP={p} DP={dp}; micro-batch not given in Table 1",
            metric="achieved_tflops_per_gpu", value=X, unit="TFLOP/s per GPU",
            iteration_ms=round(it, 1),
            notes=(f"{pct}% of 312 TFLOP/s peak; {TRANS}; iteration_ms derived from the paper's "
                   "Eq.3: F=96*B*s*l*h^2*(1+s/(6h)+V/(16*l*h)), t=F/(n*X)"))
