"""TensorFlow performance benchmarks page (May 2017), DGX-1 P100: InceptionV3 and VGG16 (tf_cnn_benchmarks)."""

S = "tensorflow/tensorflow@6535ed7c270f9fb96798eec626e1883e15905226"
L = "tensorflow/docs_src/performance/benchmarks.md § Details for NVIDIA DGX-1 (NVIDIA Tesla P100)"

DATA = {  # (batch, data) -> {model: [1,2,4,8 GPU values]}
    (64, "synthetic"): {"inception-v3": [142, 284, 569, 1131], "vgg16": [154, 295, 584, 1081]},
    (64, "real"): {"inception-v3": [142, 278, 551, 1079], "vgg16": [154, 284, 534, 898]},
    (32, "synthetic"): {"inception-v3": [128, 259, 520, 995], "vgg16": [144, 281, 549, 820]},
    (32, "real"): {"inception-v3": [130, 257, 507, 966], "vgg16": [144, 253, 457, 690]},
}
SYNC = {"inception-v3": "variable_update=parameter_server, local_parameter_device=cpu",
        "vgg16": "variable_update=replicated (with NCCL)"}


def rows(add, **_):
    for (mb, data), models in DATA.items():
        for m, vals in models.items():
            for g, v in zip((1, 2, 4, 8), vals):
                sect = "Results" if mb == 64 else "Other Results (batch size 32)"
                add(id=f"tfbench-p100-{m}-{data}-b{mb}-{g}g", source=S,
                    locator=f"{L} / {sect} / Training {data} data", model=m,
                    gpu="P100 (DGX-1)", gpus=g, nodes=1, network="NVLink (DGX-1)",
                    framework="TensorFlow (git b1e174e) tf_cnn_benchmarks 9165a70, CUDA 8.0, cuDNN 5.1",
                    precision="FP32", micro_batch=mb, accum_steps=1, global_batch=mb * g,
                    checkpointing="no", optimizer="SGD", extra=f"{data} data; {SYNC[m]}",
                    metric="throughput", value=v, unit="images/s",
                    notes="Pascal P100 (not a trainplan target GPU): use for VGG16/Inception-v3 structure and "
                          "scaling, not V100/A100 constants; test date May 2017")
