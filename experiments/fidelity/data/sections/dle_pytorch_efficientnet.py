"""NVIDIA DeepLearningExamples, PyTorch EfficientNet README (NGC 21.03): B0 and B4.

README `PyTorch/Classification/ConvNets/efficientnet/README.md` at c4813240 (2021-07-01), § Training
performance results: DGX A100 80GB (TF32 vs AMP) and DGX-1 V100 16GB (FP32 vs AMP), img/s, 1 and 8
GPUs. The README's own benchmark command is launch.py --mode benchmark_training --epochs 1 --prof 100.
Per-GPU batches and image sizes from configs.yml at 555b84b3 (the version beside that README):
efficientnet_b0_params_4k / efficientnet_b4_params_4k (optimizer_batch_size 4096, image 224 / 380;
RMSprop with momentum). The widese variants (the squeeze from the expanded channels) are
added after `depthwise_efficiency` was fitted on B0/B4 alone: never fitted on. Not used: the rows
on 16-64 GPUs (nodes and network not stated) and the DGX-1 32GB table, whose B4 and
widese-B0 rows contradict themselves (36 img/s on 1 GPU and 641 on 8: strong scaling 17.6x on 8 GPUs).
Model as DLE defines it (image_classification/models/efficientnet.py): src/zoo/cnn.rs `efficientnet`.
"""

from .common import dle_convnets_rows

S = "NVIDIA/DeepLearningExamples@c481324031ecf0f70f8939516c02e16cac60446d"
L = "PyTorch/Classification/ConvNets/efficientnet/README.md"
CFG_AT = "PyTorch/Classification/ConvNets/configs.yml@555b84b3"
BATCH = {
    "efficientnet-b0": {"DGX1V-16G": {"AMP": 128, "FP32": 64}, "DGXA100": {"AMP": 256, "TF32": 256}},
    "efficientnet-b4": {"DGX1V-16G": {"AMP": 32, "FP32": 16}, "DGXA100": {"AMP": 128, "TF32": 64}},
    "efficientnet-widese-b0": {"DGX1V-16G": {"AMP": 128, "FP32": 64},
                               "DGXA100": {"AMP": 256, "TF32": 256}},
    "efficientnet-widese-b4": {"DGX1V-16G": {"AMP": 32, "FP32": 16},
                               "DGXA100": {"AMP": 128, "TF32": 64}},
}
SHORT = {"efficientnet-b0": "effb0", "efficientnet-b4": "effb4",
         "efficientnet-widese-b0": "effwb0", "efficientnet-widese-b4": "effwb4"}
TABLES = [
    ("dgxa100", "A100-SXM4-80GB", "DGXA100", "TF32",
     "Training performance: NVIDIA A100 (8x A100 80GB)",
     {"efficientnet-b0": [(1, 1078, 2489), (8, 8193, 16652)],
      "efficientnet-b4": [(1, 157, 331), (8, 1223, 2570)],
      "efficientnet-widese-b0": [(1, 1078, 2512), (8, 8244, 16368)],
      "efficientnet-widese-b4": [(1, 157, 331), (8, 1223, 2585)]}),
    ("dgx1-16g", "V100-SXM2-16GB", "DGX1V-16G", "FP32",
     "Training performance: NVIDIA DGX-1 (8x V100 16GB)",
     {"efficientnet-b0": [(1, 655, 1301), (8, 4672, 7789)],
      "efficientnet-b4": [(1, 83, 204), (8, 616, 1366)],
      "efficientnet-widese-b0": [(1, 655, 1299), (8, 4592, 7875)],
      "efficientnet-widese-b4": [(1, 83, 204), (8, 612, 1356)]}),
]


def rows(add, **_):
    common = dict(seq="", framework="PyTorch (NGC 21.03) + AMP", optimizer="RMSprop (momentum 0.9)",
                  metric="throughput", unit="images/s", checkpointing="no")
    for tag, gpu, platform, base, head, by_model in TABLES:
        for model, data in by_model.items():
            batch = BATCH[model][platform]
            dle_convnets_rows(
                add, source=S, readme=L, model=model,
                short=SHORT[model], tag=tag, gpu=gpu,
                platform=platform, base=base, head=head, data=data, batch=batch,
                opt_batch={k: 4096 for k in batch}, cfg_at=CFG_AT, amp_label="AMP fp16",
                common=common, note="; data: the default PyTorch loader with AutoAugment")
