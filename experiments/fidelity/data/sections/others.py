"""Lambda Labs PyTorch benchmark CSVs (DLE models, V100/A100/H100) and DeepSpeed autotuning (HF, 16 V100)."""
from .common import micro_step

S_LT = "lambdal/deeplearning-benchmark@0551cb70ffdc155dc4cb2c10dddebb65651c3883"
S_LB = "lambdal/deeplearning-benchmark@08d77c41c42f48de5598b48c77f3fbd1b6252348"
LAMBDA_NOTE = ("Lambda wrapper around NVIDIA DLE PyTorch (LambdaLabsML/DeepLearningExamples "
               "lambda/benchmark branch), NGC pytorch:22.09+ ('v1' configs); throughput per "
               "compile_results_pytorch.py; single node only")

# throughput CSV rows (fp32, fp16): name -> (gpus, {model: (fp32, fp16)})
LT = {
    ("LambdaCloud V100 16GB", "V100-SXM2-16GB (LambdaCloud)"): {
        1: {"resnet50": (369, 833), "bert_base_squad": (42, 189), "bert_large_squad": (12, 57)},
        2: {"resnet50": (710, 1571), "bert_base_squad": (77, 340), "bert_large_squad": (19, 87)},
        4: {"resnet50": (1422, 3107), "bert_base_squad": (153, 637), "bert_large_squad": (38, 157)},
        8: {"resnet50": (2817, 6174), "bert_base_squad": (289, 1204), "bert_large_squad": (70, 286)},
    },
    ("A100 80GB SXM4", "A100-SXM4-80GB"): {
        1: {"resnet50": (1066, 1582), "bert_base_squad": (239, 443), "bert_large_squad": (75, 152)},
        2: {"resnet50": (2029, 3038), "bert_base_squad": (411, 815), "bert_large_squad": (105, 246)},
        4: {"resnet50": (4042, 6070), "bert_base_squad": (821, 1654), "bert_large_squad": (224, 488)},
        8: {"resnet50": (7397, 11439), "bert_base_squad": (1362, 4273), "bert_large_squad": (251, 746)},
    },
    ("H100 80GB SXM5", "H100-SXM5-80GB"): {
        1: {"resnet50": (1753, 2616), "bert_base_squad": (408, 812), "bert_large_squad": (141, 301)},
        2: {"resnet50": (3477, 5179), "bert_base_squad": (785, 1630), "bert_large_squad": (272, 592)},
        4: {"resnet50": (6930, 10406), "bert_base_squad": (1550, 3219), "bert_large_squad": (520, 1171)},
        8: {"resnet50": (13856, 20728), "bert_base_squad": (3133, 9176), "bert_large_squad": (1042, 2167)},
    },
}
# Lambda's scripts/benchmark_pytorch.sh exported NCCL_P2P_DISABLE=1 before every benchmark from
# 2022-10-16 (0a684b62, "Add 2x4090_v1") until it was commented out on 2023-02-06 (aad0d1cd).
# The logs behind the throughput CSV's cells are dated (pytorch/results/*_v1/*/DD-MM-YYYY_*.txt):
# A100 80GB SXM4 19-11-2022 and LambdaCloud V100 16GB 16-12-2022 inside that window, H100 80GB
# SXM5 14-02-2023 after it. Without peer-to-peer access NCCL stages every hop through host memory.
P2P_OFF = {"A100 80GB SXM4": "results 19-11-2022", "LambdaCloud V100 16GB": "results 16-12-2022"}

# batch CSV (global batch = per-GPU x gpus as compiled), per-GPU values: (fp32, fp16)
LB = {"LambdaCloud V100 16GB": {"resnet50": (128, 256), "bert_base_squad": (24, 48), "bert_large_squad": (8, 16)},
      "A100 80GB SXM4": {"resnet50": (640, 1280), "bert_base_squad": (172, 320), "bert_large_squad": (64, 112)}}
MODEL = {"resnet50": dict(model="resnet50", unit="images/s"),
         "bert_base_squad": dict(model="bert-base", hidden=768, layers=12, heads=12, unit="sequences/s",
                                 extra="SQuAD fine-tuning (DLE run_squad)"),
         "bert_large_squad": dict(model="bert-large", hidden=1024, layers=24, heads=16, unit="sequences/s",
                                  extra="SQuAD fine-tuning (DLE run_squad)")}


def network(name):
    net = "single node (NVLink/NVSwitch for SXM; not stated)"
    if name in P2P_OFF:
        net += ("; NCCL_P2P_DISABLE=1: exported by the benchmark's scripts/benchmark_pytorch.sh from "
                "2022-10-16 (0a684b62) to 2023-02-06 (aad0d1cd), and these runs' logs are dated inside "
                f"that window ({P2P_OFF[name]}), so NCCL's SHM transport through host memory, not NVLink")
    return net


def rows(add, BERT_BASE, BERT_LARGE, **_):
    for (name, gpu), per in LT.items():
        for g, models in per.items():
            for m, (f32, f16) in models.items():
                for prec, v, i in (("FP32 mode (DLE fp32 flag; TF32 math on Ampere/Hopper not stated)", f32, 0),
                                   ("AMP fp16", f16, 1)):
                    p = "fp32" if i == 0 else "amp"
                    kw = dict(MODEL[m])
                    mb = LB.get(name, {}).get(m, (None, None))[i]
                    note = LAMBDA_NOTE
                    it = ""
                    if mb:
                        note += (f"; per-GPU batch from pytorch/pytorch-train-bs-*.csv@{S_LB.split('@')[1][:12]} "
                                 "(a different commit than the throughput CSV)")
                        it, n = micro_step(mb, g, v)
                        note += "; " + n
                    else:
                        note += "; batch for this system not in the stored batch-size CSV"
                    if g > 1:
                        eff = v / (per[1][m][i] * g)
                        if eff > 1.02:
                            note += f"; SUSPICIOUS: super-linear ({eff:.2f} x linear vs the 1-GPU row)"
                        elif eff < 0.6:
                            note += f"; SUSPICIOUS: poor scaling ({eff:.2f} x linear vs the 1-GPU row)"
                    add(id=f"lambda-{gpu.split(' ')[0].lower()}-{m.replace('_', '')}-{p}-{g}g",
                        source=S_LT, locator=f"pytorch/pytorch-train-throughput-{'fp32' if i == 0 else 'fp16'}.csv row '{name if g == 1 else f'{g}x ' + name}' column {m}",
                        seq=384 if m != "resnet50" else "", gpu=gpu, gpus=g, nodes=1,
                        network=network(name),
                        framework="PyTorch (NGC pytorch:22.09+), NVIDIA DLE scripts", precision=prec,
                        micro_batch=mb, metric="throughput", value=v, iteration_ms=it,
                        checkpointing="no", notes=note, **kw)

    S_DS = "microsoft/DeepSpeedExamples@127c7a10983c09be471d51686bc29d0924cdae6b"
    L = "training/autotuning/hf/README.md § Throughput Comparison"
    base = dict(gpu="V100 (variant not stated)", gpus=16, nodes=1, network="single node",
                framework="PyTorch + HF transformers 4.12.0 (run_glue / examples)", precision="FP32",
                metric="throughput", unit="samples/s", checkpointing="no", accum_steps=1)
    T = [("bertbase", BERT_BASE, 128, "mnli", [("hf", "HF DDP baseline", 128, 2502.236),
                                               ("ds-z0", "DeepSpeed ZeRO-0, hand-tuned", 128, 2523.684),
                                               ("ds-autotuned-z0", "DeepSpeed autotuned z0", 235, 2736.561)]),
         ("bertlarge", BERT_LARGE, None, None, [("hf", "HF DDP baseline", 64, 742.692),
                                                ("ds-z1", "DeepSpeed ZeRO-1, hand-tuned", 64, 766.929),
                                                ("ds-autotuned-z1", "DeepSpeed autotuned z1", 93, 808.168)]),
         ("gpt2", dict(model="gpt2 (124M)", hidden=768, layers=12, heads=12), None, None,
          [("hf", "HF DDP baseline", 8, 284.142), ("ds-z1", "DeepSpeed ZeRO-1, hand-tuned", 8, 397.827),
           ("ds-autotuned-z1", "DeepSpeed autotuned z1", 14, 431.586)]),
         ("gpt2-medium", dict(model="gpt2-medium (355M)", hidden=1024, layers=24, heads=16), None, None,
          [("hf", "HF DDP baseline", 2, 71.61), ("ds-z1", "DeepSpeed ZeRO-1, hand-tuned", 4, 142.211),
           ("ds-autotuned-z1", "DeepSpeed autotuned z1", 6, 163.3)]),
         ("gpt2-large", dict(model="gpt2-large (774M)", hidden=1280, layers=36, heads=20), None, None,
          [("hf", "HF DDP baseline", 1, 27.874), ("ds-z1", "DeepSpeed ZeRO-1, hand-tuned", 2, 56.797),
           ("ds-autotuned-z1", "DeepSpeed autotuned z1", 3, 69.061)])]
    for tag, mdl, seq, task, cells in T:
        for sub, label, mb, v in cells:
            note = f"{label}; 200 steps (max_steps in test_tune.sh); throughput as printed by the HF Trainer"
            if seq:
                note += f"; task {task}, --max_seq_length {seq} (bert-base/test_tune.sh@8d78a00b4719)"
            else:
                note += "; sequence length not in the stored files (not given)"
            if tag.startswith("gpt2"):
                note += "; GPT-2 dims are the standard HF configs for the named checkpoint"
            add(id=f"ds-autotune-hf-{tag}-{sub}", source=S_DS, locator=L, seq=seq, micro_batch=mb,
                global_batch=mb * 16, value=v, optimizer="AdamW (HF default)" if sub == "hf" else "AdamW (DeepSpeed)",
                extra=label, notes=note, **dict(base, **mdl))
