"""NVIDIA DeepLearningExamples, PyTorch ResNeXt101-32x4d and SE-ResNeXt101-32x4d READMEs.

The same README version and recipe as the ResNet-50 v1.5 rows of 21.03 (dle_pytorch_rn50.py):
launch.py --mode benchmark_training --epochs 1 --prof 100, NGC 21.03, APEX AMP, channels-last
for AMP; the per-GPU batch and the optimizer batch come from configs.yml (the README does not
print them). Models as DLE defines them (image_classification/models/resnet.py at the same
commit): src/zoo/cnn.rs `resnext101_32x4d`.
"""

from .common import dle_convnets_rows

S = "NVIDIA/DeepLearningExamples@291f0d02e815b148fa5c2b81bf07aa3552142895"
CFG_AT = "PyTorch/Classification/ConvNets/configs.yml@097c7ff917b7"

# (zoo model, README folder, {platform: {precision: batch}}, optimizer batch)
MODELS = [
    ("resnext101-32x4d", "resnext101-32x4d",
     {"DGX1V": {"AMP": 128, "FP32": 64}, "DGXA100": {"AMP": 128, "TF32": 128}},
     {"DGX1V": {"AMP": 1024, "FP32": 1024}, "DGXA100": {"AMP": 1024, "TF32": 1024}}),
    # DGX1V AMP uses resnet_params_896 (optimizer_batch_size 896), every other 1k.
    ("se-resnext101-32x4d", "se-resnext101-32x4d",
     {"DGX1V": {"AMP": 112, "FP32": 64}, "DGXA100": {"AMP": 128, "TF32": 128}},
     {"DGX1V": {"AMP": 896, "FP32": 1024}, "DGXA100": {"AMP": 1024, "TF32": 1024}}),
]

# README tables "Training performance: ..." (img/s): (GPUs, base precision, AMP).
TABLES = {
    "resnext101-32x4d": [
        ("dgxa100", "A100-SXM4-80GB", "DGXA100", "TF32",
         "Training performance: NVIDIA DGX A100 (8x A100 80GB)", [(1, 456, 1211), (8, 3471, 7925)]),
        ("dgx1-16g", "V100-SXM2-16GB", "DGX1V", "FP32",
         "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)", [(1, 147, 587), (8, 1133, 4065)]),
        ("dgx1-32g", "V100-SXM2-32GB", "DGX1V", "FP32",
         "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB)", [(1, 144, 565), (8, 1108, 3863)]),
    ],
    "se-resnext101-32x4d": [
        ("dgxa100", "A100-SXM4-80GB", "DGXA100", "TF32",
         "Training performance: NVIDIA DGX A100 (8x A100 80GB)", [(1, 395, 855), (8, 2991, 5779)]),
        ("dgx1-16g", "V100-SXM2-16GB", "DGX1V", "FP32",
         "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)", [(1, 132, 443), (8, 1004, 2971)]),
        ("dgx1-32g", "V100-SXM2-32GB", "DGX1V", "FP32",
         "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB)", [(1, 130, 427), (8, 992, 2925)]),
    ],
}


def rows(add, **_):
    common = dict(seq="", framework="PyTorch (NGC 21.03) + APEX AMP",
                  optimizer="SGD momentum", metric="throughput", unit="images/s",
                  checkpointing="no")
    for model, folder, batches, opt_batches in MODELS:
        short = "rx101" if model.startswith("resnext") else "serx101"
        for tag, gpu, platform, base, head, data in TABLES[model]:
            dle_convnets_rows(
                add, source=S, readme=f"PyTorch/Classification/ConvNets/{folder}/README.md",
                model=model, short=short, tag=tag, gpu=gpu, platform=platform, base=base,
                head=head, data=data, batch=batches[platform], opt_batch=opt_batches[platform],
                cfg_at=CFG_AT, amp_label="AMP fp16 (APEX)", common=common)
