"""NVIDIA DeepLearningExamples, TensorFlow BERT README (19.03 container), SQuAD fine-tuning."""
from .common import micro_step

S = "NVIDIA/DeepLearningExamples@12c7bc23020554c8380b788964d02bcf2c594820"
L = "TensorFlow/LanguageModeling/BERT/README.md"


def rows(add, BERT_LARGE, **_):
    base = dict(BERT_LARGE, seq=384, framework="TensorFlow (NGC 19.03-py3) + Horovod",
                metric="throughput", unit="sequences/s", checkpointing="no", optimizer="Adam",
                extra="SQuAD v1.1 fine-tuning from uncased_L-24_H-1024_A-16; XLA not stated "
                      "for the table (run_squad.sh default: XLA on)")
    t = [
        ("dgx1-16g", "V100-SXM2-16GB", "NVIDIA DGX-1 (8x V100 16G)",
         [(2, [(1, 8.06, 14.12), (4, 25.71, 41.32), (8, 50.20, 80.76)]),
          (3, [(1, None, 17.14), (4, None, 51.59), (8, None, 98.75)])]),
        ("dgx1-32g", "V100-SXM2-32GB", "NVIDIA DGX-1 (8x V100 32G)",
         [(4, [(1, 8.96, 20.91), (4, 33.66, 64.89), (8, 66.65, 129.16)]),
          (10, [(1, None, 31.80), (4, None, 107.65), (8, None, 220.88)])]),
        ("dgx2", "V100-SXM3-32GB (DGX-2)", "NVIDIA DGX-2 (16x V100 32G)",
         [(4, [(1, 10.85, 21.83), (4, 38.85, 71.87), (8, 74.65, 140.66), (16, 132.71, 251.26)]),
          (10, [(1, None, 34.38), (4, None, 119.19), (8, None, 233.86), (16, None, 427.19)])]),
    ]
    for tag, gpu, head, groups in t:
        for mb, data in groups:
            for g, f32, f16 in data:
                for prec, v in (("FP32", f32), ("AMP fp16 (TF-AMP)", f16)):
                    if v is None:
                        continue
                    p = "fp32" if prec == "FP32" else "amp"
                    it, n = micro_step(mb, g, v)
                    add(id=f"dle-tf-bert-1903-{tag}-squad-{p}-b{mb}-{g}g", source=S,
                        locator=f"{L} § Training performance results / {head}", gpu=gpu, gpus=g,
                        nodes=1, network="NVLink (single node)", precision=prec, micro_batch=mb,
                        value=v, iteration_ms=it, notes="steady-state throughput (README); " + n,
                        **base)
