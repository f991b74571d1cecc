"""NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 README: two README versions."""

S_1910 = "NVIDIA/DeepLearningExamples@3bbe228d38952b8b91caca4842a3e0b27ff99a93"
S_2103 = "NVIDIA/DeepLearningExamples@291f0d02e815b148fa5c2b81bf07aa3552142895"
L = "PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
CFG = ("per-GPU batch from PyTorch/Classification/ConvNets/configs.yml@097c7ff917b7 "
       "(launch.py profile resnet50/<platform>/<precision>; README does not print it)")
ACC = ("accum_steps derived: configs.yml optimizer_batch_size=2048 -> main.py "
       "batch_size_multiplier=int(2048/(batch*gpus)); not stated in README")


def rows(add, **_):
    common = dict(model="resnet50", seq="", framework="PyTorch (NGC 19.10) + APEX",
                  optimizer="SGD momentum", metric="throughput", unit="images/s",
                  checkpointing="no")
    # --- 19.10 version: V100 DGX-1 16G / 32G and DGX-2 -----------------------------------
    t = [
        ("dgx1-16g", "V100-SXM2-16GB", "Traininig performance: NVIDIA DGX1-16G (8x V100 16G)",
         [(1, 893.09, 380.44), (8, 6888.75, 2945.37)]),
        ("dgx1-32g", "V100-SXM2-32GB", "Traininig performance: NVIDIA DGX1-32G (8x V100 32G)",
         [(1, 849.63, 373.93), (8, 6614.15, 2911.22)]),
        ("dgx2", "V100-SXM3-32GB (DGX-2)", "Traininig performance: NVIDIA DGX2 (16x V100 32G)",
         [(1, 894.41, 402.23), (16, 13443.82, 6263.41)]),
    ]
    for tag, gpu, head, data in t:
        for g, amp, fp32 in data:
            for prec, v in (("AMP fp16 (APEX)", amp), ("FP32", fp32)):
                p = "amp" if prec.startswith("AMP") else "fp32"
                add(id=f"dle-pt-rn50-1910-{tag}-{p}-{g}g", source=S_1910,
                    locator=f"{L} § {head}", gpu=gpu, gpus=g, nodes=1,
                    network="NVLink (single node)", precision=prec, value=v,
                    extra="benchmark: --training-only --prof 100; per-GPU batch not printed",
                    notes="19.10 container; README prints no batch size, so no iteration_ms; "
                          "strong-scaling column in source = throughput ratio",
                    **common)
    # --- 21.03 version: A100 80GB DGX A100 and V100 DGX-1 16G / 32G -----------------------
    common2 = dict(common, framework="PyTorch (NGC 21.03) + APEX AMP")
    t2 = [
        ("dgxa100", "A100-SXM4-80GB", "Training performance: NVIDIA DGX A100 (8x A100 80GB)",
         "TF32", 256, [(1, 938, 2470), (8, 7248, 16621)]),
        ("dgx1-16g", "V100-SXM2-16GB", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)",
         "FP32", 112, [(1, 367, 1200), (8, 2855, 8322)]),
        ("dgx1-32g", "V100-SXM2-32GB", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB)",
         "FP32", 112, [(1, 356, 1156), (8, 2766, 8056)]),
    ]
    for tag, gpu, head, base, base_mb, data in t2:
        for g, vb, va in data:
            for prec, v, mb, extra in ((base, vb, base_mb, "NCHW"),
                                       ("AMP fp16 (APEX)", va, 256, "channels_last (nhwc)")):
                acc = int(2048 / (mb * g))
                p = "amp" if prec.startswith("AMP") else base.lower()
                add(id=f"dle-pt-rn50-2103-{tag}-{p}-{g}g", source=S_2103,
                    locator=f"{L} § {head}", gpu=gpu, gpus=g, nodes=1,
                    network="NVLink (single node)", precision=prec, value=v,
                    micro_batch=mb, accum_steps=acc, global_batch=mb * acc * g,
                    extra=f"{extra}; benchmark_training --epochs 1 --prof 100",
                    notes=f"{CFG}; {ACC}", **common2)
