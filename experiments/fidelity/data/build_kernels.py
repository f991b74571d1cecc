#!/usr/bin/env python3
"""Builds kernels.csv: kernel-level constants with citations. Numbers copied from the cited source."""
import csv
import os

COLS = ["id", "source", "locator", "gpu", "arch", "what", "dtype", "m", "n", "k", "bytes", "value", "unit", "notes"]
R = []


def add(**r):
    for c in r:
        assert c in COLS, c
    R.append({c: ("" if r.get(c) is None else r.get(c)) for c in COLS})


# ---- ml-engineering: MAMF tables, spec tables ------------------------------------------------
MLE = "stas00/ml-engineering@b9e29720eebd4aa946fa9678975385efbc90a777"
L_MAMF = "compute/accelerator/README.md § Maximum Achievable Matmul FLOPS comparison table"
ARCH = {"A100": "Ampere", "H100": "Hopper", "H200": "Hopper", "GH200": "Hopper", "MI300X": "CDNA3",
        "MI325X": "CDNA3", "MI250X": "CDNA2", "V100": "Volta"}
for gpu, arch, v, theory, shape, sw, note in [
    ("A100-SXM", "Ampere", 271.2, 312, (1024, 10240, 5120), "torch 2.6.0+cu126", ""),
    ("GH200-SXM (900W, 141GB HBM3e)", "Hopper", 828.6, 989, (1024, 15360, 4096), "torch 2.6.0+cu126", ""),
    ("A100-PCIe", "Ampere", 252.9, 312, (2048, 5120, 6144), "torch 2.5.1+cu124", ""),
    ("H100-SXM", "Hopper", 794.5, 989, (2048, 2048, 13312), "torch 2.7.0+cu126", ""),
    ("MI325X (1000W)", "CDNA3", 784.9, 1300, (13312, 10240, 8192), "torch 2.6.0+rocm6.2.4", "PYTORCH_TUNABLEOP_ENABLED=1"),
    ("MI300X", "CDNA3", 668.4, 1300, (10240, 15360, 8192), "torch 2.5.1+rocm6.3.42131", "PYTORCH_TUNABLEOP_ENABLED=1"),
]:
    add(id=f"mamf-v2-bf16-{gpu.split(' ')[0].lower()}", source=MLE, locator=L_MAMF + " (BF16, v2)", gpu=gpu,
        arch=arch, what="max achievable matmul TFLOPS (best shape of a brute-force search)", dtype="bf16",
        m=shape[0], n=shape[1], k=shape[2], value=v, unit="TFLOP/s",
        notes=f"{sw}; mean of 100 iters after 50 warmup, cache reset between iters; efficiency {v / theory * 100:.1f}% of {theory} spec" + (f"; {note}" if note else ""))
for gpu, v, theory, shape in [("GH200-SXM (900W, 141GB HBM3e)", 1535.0, 1979, (1024, 14336, 14336)),
                              ("H100-SXM", 1402.6, 1979, (1024, 9216, 14336))]:
    add(id=f"mamf-v2-fp8-{gpu.split(' ')[0].lower()}", source=MLE, locator=L_MAMF + " (FP8 float8_e4m3fn)", gpu=gpu,
        arch="Hopper", what="max achievable matmul TFLOPS", dtype="fp8 e4m3", m=shape[0], n=shape[1], k=shape[2],
        value=v, unit="TFLOP/s", notes=f"efficiency {v / theory * 100:.1f}% of {theory} spec")
for gpu, arch, v, theory, shape, sw in [
    ("A100-SXM", "Ampere", 267.9, 312, (6912, 2048, 16384), "CUDA 12.1"),
    ("GH200-SXM", "Hopper", 821.0, 989, (11264, 1536, 19712), "CUDA 12.5"),
    ("A100-PCIe", "Ampere", 256.4, 312, (2304, 1536, 5120), "CUDA 12.1"),
    ("H100-SXM", "Hopper", 792.1, 989, (6144, 2816, 17920), "CUDA 12.1"),
    ("MI250X (1 GCD)", "CDNA2", 147.0, 191.5, (1024, 19968, 14080), "ROCm 6.2"),
    ("MI300X", "CDNA3", 781.9, 1300, (4096, 4864, 10240), "ROCm 6.2"),
]:
    add(id=f"mamf-v1-bf16-{gpu.split(' ')[0].lower()}", source=MLE, locator=L_MAMF + " (older v1 table)", gpu=gpu,
        arch=arch, what="max achievable matmul TFLOPS", dtype="bf16", m=shape[0], n=shape[1], k=shape[2], value=v,
        unit="TFLOP/s", notes=f"{sw}; v1 did not reset the cache between iterations (README); efficiency {v / theory * 100:.1f}%")
add(id="mamf-text-mi300x-rocm61", source=MLE, locator="compute/accelerator/README.md § MAMF table notes", gpu="MI300X",
    arch="CDNA3", what="max achievable matmul TFLOPS with ROCm 6.1 (text)", dtype="bf16", value=450, unit="TFLOP/s",
    notes="author's note: ~450 TFLOPS with ROCm-6.1 vs 781.9 with ROCm-6.2 - software version matters")
add(id="mle-a100-llm-training-tflops", source=MLE, locator="compute/accelerator/README.md § Maximum Achievable FLOPS",
    gpu="A100-SXM", arch="Ampere", what="typical achieved TFLOPS in mixed-precision LLM training (anecdotal)",
    dtype="bf16/fp16", value=150, unit="TFLOP/s",
    notes="text: ~150 TFLOPS was close to the best before FlashAttention, ~180+ with FlashAttention; anecdotal, not a measurement table")

L_SPEC = "compute/accelerator/README.md § TFLOPS comparison table (theoretical, dense)"
for gpu, arch, vals in [("A100-SXM", "Ampere", {"fp32": 19.5, "tf32": 156.0, "fp16": 312, "bf16": 312}),
                        ("H100-SXM", "Hopper", {"fp32": 67.0, "tf32": 494.5, "fp16": 989, "bf16": 989, "fp8": 1979}),
                        ("H200-SXM", "Hopper", {"fp32": 67.0, "tf32": 494.5, "fp16": 989, "bf16": 989, "fp8": 1979}),
                        ("H100-PCIe", "Hopper", {"fp32": 51.0, "tf32": 378.0, "bf16": 756, "fp8": 1513}),
                        ("MI300X", "CDNA3", {"fp32": 163.4, "tf32": 653.7, "fp16": 1300, "bf16": 1300, "fp8": 2600})]:
    for dt, v in vals.items():
        add(id=f"spec-peak-{gpu.lower()}-{dt}", source=MLE, locator=L_SPEC, gpu=gpu, arch=arch,
            what="theoretical peak (vendor spec, no sparsity)", dtype=dt, value=v, unit="TFLOP/s")
L_MEM = "compute/accelerator/README.md § Accelerator memory size and speed"
for gpu, arch, cap, typ, bw in [("A100-SXM-80GB", "Ampere", 80, "HBM2e", 2.00), ("A100-PCIe-80GB", "Ampere", 80, "HBM2e", 1.94),
                                ("H100-SXM", "Hopper", 80, "HBM3", 3.35), ("H100-PCIe", "Hopper", 80, "HBM3", 2.00),
                                ("H200-SXM", "Hopper", 141, "HBM3e", 4.80), ("MI300X", "CDNA3", 192, "HBM3", 5.30)]:
    add(id=f"spec-hbm-bw-{gpu.lower()}", source=MLE, locator=L_MEM, gpu=gpu, arch=arch, what="peak memory bandwidth (spec)",
        bytes=cap * 10**9, value=bw, unit="TB/s", notes=f"{cap} GB {typ}; bytes column = capacity")
L_CACHE = "compute/accelerator/README.md § Caches"
for gpu, arch, units, l2 in [("H100-SXM", "Hopper", 132, "50MB"), ("H200-SXM", "Hopper", 132, "50MB"),
                             ("A100-SXM", "Ampere", 108, "40MB"), ("A100-PCIe", "Ampere", 108, "40MB")]:
    add(id=f"spec-sm-count-{gpu.lower()}", source=MLE, locator=L_CACHE, gpu=gpu, arch=arch, what="SM count",
        value=units, unit="SMs", notes=f"L2 total {l2}")
add(id="spec-units-mi300x", source=MLE, locator=L_CACHE, gpu="MI300X", arch="CDNA3", what="XCD count (cache units)",
    value=8, unit="XCDs", notes="L2 4MB per XCD (32MB total), 256MB Infinity Cache (LLC); CU count not in this source")
L_CLK = "compute/accelerator/README.md § Clock speed"
for gpu, arch, mhz in [("H200-SXM", "Hopper", 1830), ("H100-SXM", "Hopper", 1830), ("A100-SXM", "Ampere", 1410),
                       ("A100-PCIe", "Ampere", 1410), ("MI300X", "CDNA3", 2100), ("MI325X", "CDNA3", 2100)]:
    add(id=f"spec-boost-clock-{gpu.lower()}", source=MLE, locator=L_CLK, gpu=gpu, arch=arch, what="boost clock",
        value=mhz, unit="MHz", notes="H100 SXM: the same README's FMA derivation lists 1980 MHz (wiki) and notes the 989 TFLOPS spec implies 1830 MHz" if gpu == "H100-SXM" else "")

# ---- V100 / A100 PCIe spec pages --------------------------------------------------------------
INSIDE_VOLTA = ("NVIDIA 'Inside Volta' blog Table 1 (May 2017), as reproduced at "
                "http://www.xenon.com.au/nvidia-tesla-volta-worlds-advanced-data-center-gpu/")
for what, v, u in [("SM count", 80, "SMs"), ("boost clock (pre-production)", 1455, "MHz"),
                   ("peak FP32 (pre-production)", 15, "TFLOP/s"), ("peak tensor core fp16 (pre-production)", 120, "TFLOP/s"),
                   ("L2 cache", 6144, "KB")]:
    add(id=f"spec-v100-{what.split(' ')[0].lower()}-{what.split(' ')[1].lower()}", source=INSIDE_VOLTA,
        locator="Table 1 (Tesla product comparison), Tesla V100 column", gpu="V100-SXM2", arch="Volta", what=what,
        dtype="fp16->fp32" if "tensor" in what else ("fp32" if "FP32" in what else ""), value=v, unit=u,
        notes="pre-production figures; the shipped SXM2 part is specified higher (not sourced here)" if "pre" in what else "")
SYS = "https://sysrqmts.com/gpus/compare/nvidia-a100-pcie-vs-nvidia-tesla-v100-pcie-16-gb (spec aggregator page)"
for gpu, arch, clk, bw, sms in [("A100-PCIe-40GB", "Ampere", 1410, 1555, 108), ("V100-PCIe-16GB", "Volta", 1380, 897.0, 80)]:
    add(id=f"spec-bw-{gpu.lower()}", source=SYS, locator="comparison table", gpu=gpu, arch=arch,
        what="memory bandwidth (spec)", value=bw, unit="GB/s", notes=f"boost clock {clk} MHz; {sms} SMs (same table)")

# ---- CUDA samples on A100 PCIe vs V100 SXM2 -----------------------------------------------------
DW = "dingwentao/CUDA-benchmark-performance-on-A100@e50ebe21454c94c02ad9e3283788ac87239c6f0d"
for gpu, arch, v in [("A100-PCIE-40GB", "Ampere", 2.645), ("V100-SXM2-32GB", "Volta", 4.371)]:
    add(id=f"cudasample-simplecublas-{arch.lower()}", source=DW, locator="README.md § 5. simpleCUBLAS", gpu=gpu, arch=arch,
        what="cuBLAS SGEMM achieved (simpleCUBLAS sample)", dtype="fp32", m=275, n=275, k=275, value=v, unit="TFLOP/s",
        notes="tiny square GEMM; shows small-GEMM inefficiency (V100 faster than A100 here)")
for gpu, arch, v in [("A100-PCIE-40GB", "Ampere", 51.03), ("V100-SXM2-32GB", "Volta", 48.41)]:
    add(id=f"cudasample-wmma-fp16-{arch.lower()}", source=DW, locator="README.md § 6. cudaTensorCoreGemm", gpu=gpu,
        arch=arch, what="CUDA-sample WMMA tensor-core GEMM (not cuBLAS)", dtype="fp16", m=4096, n=4096, k=4096, value=v,
        unit="TFLOP/s", notes="sample kernel, far below cuBLAS; do not use as a cuBLAS ceiling")
add(id="cudasample-bf16-a100", source=DW, locator="README.md § 8. bf16TensorCoreGemm", gpu="A100-PCIE-40GB", arch="Ampere",
    what="CUDA-sample bf16 tensor-core GEMM (not cuBLAS)", dtype="bf16", m=8192, n=8192, k=8192, value=76.42, unit="TFLOP/s",
    notes="sample kernel")
add(id="cudasample-tf32-a100", source=DW, locator="README.md § 9. tf32TensorCoreGemm", gpu="A100-PCIE-40GB", arch="Ampere",
    what="CUDA-sample tf32 tensor-core GEMM (not cuBLAS)", dtype="tf32", m=8192, n=8192, k=4096, value=22.46, unit="TFLOP/s",
    notes="sample kernel")

# ---- NCCL ------------------------------------------------------------------------------------
add(id="nccl-h100-nvls-allreduce-peak-busbw", source="NVIDIA/nccl-tests issue #212 (comment by sjeaugey, 2024-05-06)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/212", gpu="8x H100 (NVLink/NVSwitch)", arch="Hopper",
    what="all_reduce peak busbw with NVLink SHARP (NVLS), 8 GPUs", value=480, unit="GB/s",
    notes="maintainer estimate: algbw ~275 GB/s; needs sizes > 256 MB; NVLS busbw is not wire bandwidth")
add(id="nccl-h100-nvlink-effective-busbw", source="NVIDIA/nccl-tests issue #212 (comment by sjeaugey, 2024-05-06)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/212", gpu="8x H100 (NVLink/NVSwitch)", arch="Hopper",
    what="effective NVLink busbw for non-allreduce collectives or NCCL_ALGO=RING", value=370, unit="GB/s",
    notes="450 GB/s line rate minus ~20% protocol overhead (maintainer)")
add(id="nccl-h100-nvlink-line-rate", source="NVIDIA/nccl-tests issue #212 (comment by sjeaugey, 2024-05-06)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/212", gpu="H100 SXM", arch="Hopper", what="NVLink line rate per GPU (one direction)",
    value=450, unit="GB/s")
add(id="nccl-h100-allreduce-user-algbw", source="NVIDIA/nccl-tests issue #212 (report by liminn, 2024-05-06)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/212", gpu="8x H100", arch="Hopper",
    what="all_reduce_perf algbw as measured by the reporter", value=250, unit="GB/s",
    notes="'about 250GB/S'; max size ~256 MB per the maintainer's reply")
add(id="nccl-a100-3node-allreduce-avg-busbw", source="NVIDIA/nccl-tests issue #119 (Yujaeseo, 2022-11-17)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/119", gpu="24x A100-SXM4-40GB (3 nodes x 8)", arch="Ampere",
    what="all_reduce_perf avg busbw, 8 B - 128 MB, 4x HDR 200 Gb/s IB per node", bytes=134217728, value=84.8, unit="GB/s",
    notes="peak ~96 GB/s; reporter's theoretical 100 GB/s = 4x200Gb/8")
add(id="nccl-a100-3node-allreduce-peak-busbw", source="NVIDIA/nccl-tests issue #119 (Yujaeseo, 2022-11-17)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/119", gpu="24x A100-SXM4-40GB (3 nodes x 8)", arch="Ampere",
    what="all_reduce_perf peak busbw (<=128 MB)", bytes=134217728, value=96, unit="GB/s", notes="'about 96GB/s' (text)")
add(id="nccl-a100-8gpu-allreduce-busbw", source="NVIDIA/nccl-tests issue #149 (acgandhi, 2023-06-27)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/149", gpu="8x A100-SXM4-80GB (HPE Apollo 6500, NVLink)", arch="Ampere",
    what="all_reduce_perf busbw (up to 1 GB)", bytes=1073741824, value=200, unit="GB/s",
    notes="'~200 GB/s' (text); NCCL 2.18.1/2.17.1; p2pBandwidthLatencyTest bidirectional 430-520 GB/s")
add(id="nccl-a100-nv12-pair-allreduce-busbw", source="NVIDIA/nccl-tests issue #178 (arul-lm, 2023-11-17)",
    locator="https://github.com/NVIDIA/nccl-tests/issues/178", gpu="2x A100 (NV12 pair)", arch="Ampere",
    what="all_reduce_perf busbw, 2 GPUs on one NV12 link group", value=208, unit="GB/s",
    notes="with a 3rd GPU across PCIe/NUMA the busbw drops to ~20 GB/s (same report)")
MARIN = "marin-community/marin issue #6736 (agent-generated exploratory measurement, 2026-06-28)"
add(id="nccl-h100-8gpu-small-allreduce-latency", source=MARIN, locator="https://github.com/marin-community/marin/issues/6736",
    gpu="8x H100 (CoreWeave, NVLink/NVSwitch)", arch="Hopper", what="all-reduce latency, 4 B - 1 MiB (PyTorch/NCCL)",
    bytes=1048576, value=22.5, unit="us", notes="reported as ~20-25 us; midpoint recorded; exploratory, one host")
add(id="nccl-h100-8gpu-1gib-allreduce-time", source=MARIN, locator="https://github.com/marin-community/marin/issues/6736",
    gpu="8x H100 (CoreWeave, NVLink/NVSwitch)", arch="Hopper", what="all-reduce time, 1 GiB", bytes=1073741824, value=4.06,
    unit="ms", notes="=> algbw ~264 GB/s, busbw ~463 GB/s if ring-normalised (derived); exploratory")

# ---- compute/communication overlap -----------------------------------------------------------
OV = ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: "
      "Performance and Power Implications, arXiv:2507.03114 (2025)")
for what, v in [("compute slowdown when overlapped with communication (mean)", 18.9),
                ("compute slowdown when overlapped with communication (max)", 40.0),
                ("sequential compute+comm vs overlapped execution, extra time (mean)", 10.2),
                ("sequential compute+comm vs overlapped execution, extra time (max)", 26.6)]:
    add(id="overlap-" + ("slowdown" if "slowdown" in what else "sequential") + ("-mean" if "mean" in what else "-max"),
        source=OV, locator="Abstract", gpu="4x A100 / 4x H100 / MI250 / MI210", arch="Ampere/Hopper/CDNA2",
        what=what, value=v, unit="%", notes="GPT and LLaMA workloads on 4 GPUs; per-GPU breakdown in the paper body (not transcribed)")
add(id="overlap-h100-gemm-allgather", source="NVIDIA Developer Forums thread 337991 (2025)",
    locator="https://forums.developer.nvidia.com/t/compute-communication-overlap-causes-severe-gemm-performance-degradation-because-of-tail-effect/337991",
    gpu="H100 (132 SMs)", arch="Hopper", what="GEMM MFU with a concurrent ncclAllGather (24 CTAs)", value=47,
    unit="% MFU", notes="standalone GEMM (132 CTAs, one wave) ~80% MFU; concurrent all-gather pushes CTAs into a 2nd wave: GEMM time nearly doubles; dtype not stated")

# ---- launch / dispatch overheads --------------------------------------------------------------
PT = "pytorch/pytorch issue #41383 (2020-07-14)"
add(id="pt-eager-op-overhead-cpu-grad", source=PT, locator="https://github.com/pytorch/pytorch/issues/41383 (description)",
    gpu="CPU tensor (no GPU)", what="PyTorch eager per-op overhead, y=2*x on a 1-element tensor with requires_grad", value=6.8,
    unit="us/op", notes="1e6 ops took 6.8 s; reporter: ~5 us without requires_grad; dispatcher/Python cost, no kernel launch")
add(id="pt-eager-op-overhead-cpu-nograd", source=PT + " (comment by ngimel)", locator="https://github.com/pytorch/pytorch/issues/41383",
    gpu="CPU tensor (no GPU)", what="PyTorch eager per-op overhead, x*x, requires_grad=False", value=2, unit="us/op",
    notes="'approx 2 us', about half Python parsing; same op via the C++ API ~1 us")
add(id="triton-launch-latency-regressed", source="triton-lang/triton issue #3619 (2024-04-09)",
    locator="https://github.com/triton-lang/triton/issues/3619", gpu="NVIDIA (not stated)", what="Triton kernel launch latency (Python launcher), regressed value",
    value=350, unit="us", notes="was ~70 us months earlier; PR #3648 made launches '6x faster than before'; depends on argument count/types")
SIM = "openfabric-systems/simllm PR #109 (2026-08-18; study reviewed VOID, retained findings only)"
add(id="a100-hbm-measured-simllm", source=SIM, locator="https://github.com/openfabric-systems/simllm/pull/109 (description)",
    gpu="A100 (Merlin partition)", arch="Ampere", what="measured HBM bandwidth roof", value=1818.21, unit="GB/s",
    notes="89.17% of nameplate (per PR); SM clock bimodal 1275/1410 MHz; exploratory")
add(id="a100-eventrecord-cost-simllm", source=SIM, locator="https://github.com/openfabric-systems/simllm/pull/109 (description)",
    gpu="A100 (Merlin partition)", arch="Ampere", what="device time of a cudaEventRecord between launches", value=2.34, unit="us",
    notes="two independent methods (per PR); exploratory")
DD = "Zhu et al., Daydream, USENIX ATC 2020 (/work/shared/papers/000_a9967673e2b17c5f.txt)"
for model, n, frac in [("BERT-base", 2633, 30), ("BERT-large", 5164, 45)]:
    add(id=f"daydream-adam-kernels-{model.lower()}", source=DD, locator="§6.3 FusedAdam Optimizer", gpu="RTX 2080 Ti",
        arch="Turing", what=f"element-wise GPU kernels in the (unfused) Adam weight update, {model}", value=n, unit="kernels",
        notes=f"weight update ~{frac}% of the iteration; CPU launch calls become the bottleneck (PyTorch 1.0 era)")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.csv")
ids = [r["id"] for r in R]
assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLS)
    w.writeheader()
    w.writerows(R)
print(f"{len(R)} rows -> {out}")
