"""NVIDIA DeepLearningExamples, TensorFlow 1 ResNet-50 v1.5 README (20.06-tf1 container)."""

S = "NVIDIA/DeepLearningExamples@e6757d7c1402cfe7f15d176bc9591b615ea2d37b"
L = "TensorFlow/Classification/ConvNets/resnet50v1.5/README.md"


def rows(add, **_):
    common = dict(model="resnet50", framework="TensorFlow 1.15 (NGC 20.06-tf1) + Horovod",
                  optimizer="SGD momentum", metric="throughput", unit="images/s",
                  checkpointing="no", accum_steps=1)
    t = [
        ("dgxa100", "A100-SXM4-40GB", "Training performance: NVIDIA DGX A100 (8x A100 40GB)",
         "TF32", 256, [(1, 808, 1770), (8, 6300, 16400)]),
        ("dgx1-16g", "V100-SXM2-16GB", "Training performance: NVIDIA DGX-1 (8x V100 16G)",
         "FP32", 128, [(1, 412, 1270), (8, 3170, 9510)]),
        ("dgx2", "V100-SXM3-32GB (DGX-2)", "Training performance: NVIDIA DGX-2 (16x V100 32G)",
         "FP32", 128, [(1, 432, 1300), (16, 6500, 17250)]),
    ]
    for tag, gpu, head, base, base_mb, data in t:
        for g, vb, va in data:
            for prec, v, mb in ((base, vb, base_mb), ("AMP fp16 (TF-AMP)", va, 256)):
                p = "amp" if prec.startswith("AMP") else base.lower()
                note = "averaged over an entire training epoch (README)"
                if tag == "dgxa100" and p == "amp" and g == 8:
                    note += "; SUSPICIOUS: README weak scaling 9.26x on 8 GPUs (super-linear)"
                add(id=f"dle-tf-rn50-2006-{tag}-{p}-{g}g", source=S,
                    locator=f"{L} § {head}", gpu=gpu, gpus=g, nodes=1,
                    network="NVLink (single node)", precision=prec, value=v,
                    micro_batch=mb, global_batch=mb * g, extra="XLA on (table column '+ XLA')",
                    notes=note, **common)
