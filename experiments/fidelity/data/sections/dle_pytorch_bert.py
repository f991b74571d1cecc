"""NVIDIA DeepLearningExamples, PyTorch BERT README: 19.07 (V100) and 21.11 (A100/V100) versions."""
from .common import micro_step

S_1907 = "NVIDIA/DeepLearningExamples@23a6382cbe8f77c22b0a7b7d263191ee6b947dfa"
S_2111 = ("NVIDIA/DeepLearningExamples README as mirrored in fork "
          "thelordsaves/DeepLearningExamples@ea2edf66ef50719d22432e2ef231453fa3f36fc5")
L = "PyTorch/LanguageModeling/BERT/README.md"
# The README's changelog (January 2022): "Binned pretraining for phase2 with LDDL using a bin size
# of 64". Each phase-2 batch is padded to its bin, not to 512; the tables state 512.
BINNED = "; phase-2 binned sequence lengths (bin 64)"
# The same changelog: "Pre-training with native AMP, native DDP, and TorchScript with NVFuser
# backend"; "Pre-training using [LDDL]". Fine-tuning (run_squad.py) is not scripted.
PRETRAIN_2022 = "LDDL data loader; TorchScript with the NVFuser backend"


def rows(add, BERT_LARGE, **_):
    # ---------------- 19.07 container, V100 ----------------------------------------------
    base = dict(BERT_LARGE, framework="PyTorch (NGC 19.07) + APEX", metric="throughput",
                unit="sequences/s", checkpointing="no")
    pre = dict(base, optimizer="LAMB (APEX)")
    ft = dict(base, seq=384, extra="SQuAD v1.1 fine-tuning")

    def emit(tag, gpu, head, kind, seq, g, nodes, prec, mb, v, note=""):
        it, n = micro_step(mb, g, v)
        p = "amp" if prec != "FP32" else "fp32"
        d = pre if kind == "pretrain" else ft
        kw = dict(d)
        if kind == "pretrain":
            kw["seq"] = seq
        add(id=f"dle-pt-bert-1907-{tag}-{kind}{seq if kind == 'pretrain' else ''}-{p}-b{mb}-{g}g",
            source=S_1907, locator=f"{L} § {head}", gpu=gpu, gpus=g, nodes=nodes,
            network="NVLink (single node)" if nodes == 1 else "multi-node (interconnect not stated)",
            precision="AMP fp16 (APEX)" if p == "amp" else "FP32", micro_batch=mb, value=v,
            iteration_ms=it, notes=(note + "; " if note else "") + n, **kw)

    v16 = "V100-SXM2-16GB"
    h = "Training performance: NVIDIA DGX-1 (8x V100 16G) / Pre-training NVIDIA DGX-1 With 16G"
    for g, f32, f16 in ((1, 33.36, 125.44), (4, 121.92, 458.24), (8, 245.12, 919.04)):
        emit("dgx1-16g", v16, h, "pretrain", 128, g, 1, "FP32", 8, f32)
        emit("dgx1-16g", v16, h, "pretrain", 128, g, 1, "AMP", 16, f16)
    for g, f32, f16 in ((1, 7.56, 26.64), (4, 28, 98.24), (8, 56.16, 194.56)):
        emit("dgx1-16g", v16, h, "pretrain", 512, g, 1, "FP32", 2, f32)
        emit("dgx1-16g", v16, h, "pretrain", 512, g, 1, "AMP", 4, f16)
    h = "Pre-training on multiple NVIDIA DGX-1 With 16G"
    for nodes, v in ((1, 874.24), (4, 3089.76), (16, 12144.64)):
        emit("multi-dgx1-16g", v16, h, "pretrain", 128, 8 * nodes, nodes, "AMP", 16, v)
    for nodes, v in ((1, 195.93), (4, 700.16), (16, 2746.368)):
        emit("multi-dgx1-16g", v16, h, "pretrain", 512, 8 * nodes, nodes, "AMP", 4, v)
    h = "Fine-tuning NVIDIA DGX-1 With 16G"
    for g, f32, f16 in ((1, 8.96, 35.88), (4, 31.04, 120.00), (8, 64.64, 227.84)):
        emit("dgx1-16g", v16, h, "squad", 384, g, 1, "FP32", 4, f32)
        emit("dgx1-16g", v16, h, "squad", 384, g, 1, "AMP", 4, f16)
    for g, v in ((1, 45.2), (4, 163.6), (8, 327.2)):
        emit("dgx1-16g", v16, h, "squad", 384, g, 1, "AMP", 10, v)

    v32 = "V100-SXM2-32GB"
    h = "Training performance: NVIDIA DGX-1 (8x V100 32G) / Pre-training NVIDIA DGX-1 With 32G"
    for g, f32, f16 in ((1, 40.32, 171.52), (4, 154.88, 655.36), (8, 309.76, 1305.6)):
        emit("dgx1-32g", v32, h, "pretrain", 128, g, 1, "FP32", 32, f32)
        emit("dgx1-32g", v32, h, "pretrain", 128, g, 1, "AMP", 64, f16)
    for g, f32, f16 in ((1, 8.36, 30.08), (4, 31.52, 116.80), (8, 62.72, 231.68)):
        emit("dgx1-32g", v32, h, "pretrain", 512, g, 1, "FP32", 4, f32)
        emit("dgx1-32g", v32, h, "pretrain", 512, g, 1, "AMP", 8, f16)
    h = "Fine-tuning NVIDIA DGX-1 With 32G"
    sus = ("SUSPICIOUS: the 4-GPU FP32/AMP cells (31.52/116.80) equal the 4-GPU seq-512 "
           "pre-training cells of the same README; likely a copy error")
    for g, f32, f16 in ((1, 8.64, 36.04), (4, 31.52, 116.80), (8, 64.32, 231.04)):
        emit("dgx1-32g", v32, h, "squad", 384, g, 1, "FP32", 8, f32, sus if g == 4 else "")
        emit("dgx1-32g", v32, h, "squad", 384, g, 1, "AMP", 8, f16, sus if g == 4 else "")
    for g, v in ((1, 46.00), (4, 164.00), (8, 325.60)):
        emit("dgx1-32g", v32, h, "squad", 384, g, 1, "AMP", 10, v)

    d2 = "V100-SXM3-32GB (DGX-2)"
    h = "Training performance: NVIDIA DGX-2 (16x V100 32G) / Pre-training NVIDIA DGX-2 With 32G"
    for g, f32, f16 in ((1, 43.52, 181.76), (4, 168.96, 704), (8, 335.36, 1402.88),
                        (16, 665.6, 2775.04)):
        emit("dgx2", d2, h, "pretrain", 128, g, 1, "FP32", 32, f32)
        emit("dgx2", d2, h, "pretrain", 128, g, 1, "AMP", 64, f16)
    for g, f32, f16 in ((1, 9.0, 32.32), (4, 34.4, 124.16), (8, 68.16, 247.04),
                        (16, 135.68, 488.96)):
        emit("dgx2", d2, h, "pretrain", 512, g, 1, "FP32", 4, f32)
        emit("dgx2", d2, h, "pretrain", 512, g, 1, "AMP", 8, f16)
    h = "Pre-training on multiple NVIDIA DGX-2H With 32G (DGX-2H, not DGX-2)"
    d2h = "V100-SXM3-32GB-H (DGX-2H)"
    for nodes, v in ((1, 3379.2), (4, 12709.88), (16, 51937.28), (64, 188088.32)):
        emit("multi-dgx2h", d2h, h, "pretrain", 128, 16 * nodes, nodes, "AMP", 64, v)
    emit("multi-dgx2h", d2h, h, "pretrain", 128, 1024, 64, "FP32", 32, 46628.86)
    for nodes, v in ((1, 625.66), (4, 2386.38), (16, 9932.8), (64, 37478.4)):
        emit("multi-dgx2h", d2h, h, "pretrain", 512, 16 * nodes, nodes, "AMP", 8, v)
    emit("multi-dgx2h", d2h, h, "pretrain", 512, 1024, 64, "FP32", 4, 9543.68)
    h = "Fine-tuning NVIDIA DGX-2 With 32G"
    for g, f32, f16 in ((1, 9.92, 38.16), (4, 35.52, 122.08), (8, 71.36, 241.28),
                        (16, 141.40, 462.08)):
        emit("dgx2", d2, h, "squad", 384, g, 1, "FP32", 4, f32)
        emit("dgx2", d2, h, "squad", 384, g, 1, "AMP", 4, f16)
    for g, v in ((1, 47.40), (4, 165.60), (8, 325.60), (16, 648.00)):
        emit("dgx2", d2, h, "squad", 384, g, 1, "AMP", 10, v)

    # ---------------- 21.11 container: DGX A100 80GB and DGX-1 V100 32G --------------------
    b2 = dict(BERT_LARGE, framework="PyTorch (NGC 21.11), native AMP + DDP, TorchScript/NVFuser",
              metric="throughput", unit="sequences/s", checkpointing="no")
    # Fine-tuning kept apex: the changelog's native AMP, native DDP and TorchScript are
    # pre-training's, and run_squad.py (NVIDIA/DeepLearningExamples@f8b3a63f, the newest stored)
    # still calls amp.initialize(..., opt_level="O2") and wraps the model in apex's DDP.
    ft2 = dict(b2, framework="PyTorch (NGC 21.11), apex AMP O2 + apex DDP (run_squad.py)")
    a100 = "A100-SXM4-80GB"
    h = "Training performance: NVIDIA DGX A100 (8x A100 80GB) / Pre-training NVIDIA DGX A100"
    for seq, mbs, accs, data in ((128, (128, 256), (64, 32), ((1, 317, 580), (8, 2505, 4591))),
                                 (512, (16, 32), (256, 128), ((1, 110, 210), (8, 860, 1657)))):
        for g, vt, va in data:
            for prec, v, mb, acc in (("TF32", vt, mbs[0], accs[0]), ("AMP fp16", va, mbs[1], accs[1])):
                p = "tf32" if prec == "TF32" else "amp"
                add(id=f"dle-pt-bert-2111-dgxa100-pretrain{seq}-{p}-{g}g", source=S_2111,
                    locator=f"{L} § {h}", seq=seq, gpu=a100, gpus=g, nodes=1,
                    network="NVLink/NVSwitch (single node)", precision=prec, micro_batch=mb,
                    accum_steps=acc, global_batch=mb * acc * g, optimizer="LAMB (APEX FusedLAMB)",
                    extra=PRETRAIN_2022 + BINNED * (seq == 512),
                    value=v, notes="accumulated batch per GPU 8192 (seq128) / 4096 (seq512) per README",
                    **b2)
    h = "Pre-training NVIDIA DGX A100 (8x A100 80GB) Multi-node Scaling"
    mn128 = ((1, 64, 32, 4553, 2486), (2, 32, 16, 9191, 4979), (4, 16, 8, 18119, 9859),
             (8, 8, 4, 35774, 19815), (16, 4, 2, 70555, 38866), (32, 2, 1, 138294, 75706))
    mn512 = ((1, 256, 128, 1648, 854), (2, 128, 64, 3291, 1684), (4, 64, 32, 6464, 3293),
             (8, 32, 16, 13005, 6515), (16, 16, 8, 25570, 12131), (32, 8, 4, 49663, 21298))
    for seq, mbs, data in ((128, (128, 256), mn128), (512, (16, 32), mn512)):
        for nodes, acc_t, acc_a, va, vt in data:
            for prec, v, mb, acc in (("TF32", vt, mbs[0], acc_t), ("AMP fp16", va, mbs[1], acc_a)):
                p = "tf32" if prec == "TF32" else "amp"
                note = "strong scaling at fixed global batch (accumulation shrinks with nodes)"
                if seq == 128 and p == "tf32":
                    note += ("; README prints TF32 batch/GPU as 126 (typo?): 128 used = "
                             "accumulated batch/GPU / accumulation steps")
                if seq == 128 and nodes == 4 and p == "amp":
                    note += "; README prints FP16 accumulation '18' (typo): 8 used = 2048/256"
                add(id=f"dle-pt-bert-2111-multinode-pretrain{seq}-{p}-{nodes}n", source=S_2111,
                    locator=f"{L} § {h}", seq=seq, gpu=a100, gpus=8 * nodes, nodes=nodes,
                    network="multi-node (interconnect not stated; DGX A100 cluster)",
                    precision=prec, micro_batch=mb, accum_steps=acc,
                    global_batch=mb * acc * 8 * nodes, optimizer="LAMB (APEX FusedLAMB)",
                    extra=PRETRAIN_2022 + BINNED * (seq == 512), value=v, notes=note, **b2)
    h = "Fine-tuning NVIDIA DGX A100 (8x A100 80GB) (SQuAD)"
    for g, vt, va in ((1, 61.5, 110.5), (8, 469.8, 846.7)):
        for prec, v in (("TF32", vt), ("AMP fp16", va)):
            p = "tf32" if prec == "TF32" else "amp"
            it, n = micro_step(32, g, v)
            add(id=f"dle-pt-bert-2111-dgxa100-squad-{p}-{g}g", source=S_2111, locator=f"{L} § {h}",
                seq=384, gpu=a100, gpus=g, nodes=1, network="NVLink/NVSwitch (single node)",
                precision=prec, micro_batch=32, value=v, iteration_ms=it,
                extra="SQuAD v1.1 fine-tuning", notes=n, **ft2)
    v32 = "V100-SXM2-32GB"
    h = "Training performance: NVIDIA DGX-1 (8x V100 32G) / Pre-training NVIDIA DGX-1 With 32G"
    for seq, mbs, accs, data in ((128, (32, 64), (128, 64), ((1, 50, 224), (8, 387, 1746))),
                                 (512, (4, 8), (512, 256), ((1, 19, 75), (8, 149.6, 586)))):
        for g, vf, va in data:
            for prec, v, mb, acc in (("FP32", vf, mbs[0], accs[0]), ("AMP fp16", va, mbs[1], accs[1])):
                p = "fp32" if prec == "FP32" else "amp"
                add(id=f"dle-pt-bert-2111-dgx1-32g-pretrain{seq}-{p}-{g}g", source=S_2111,
                    locator=f"{L} § {h}", seq=seq, gpu=v32, gpus=g, nodes=1,
                    network="NVLink (single node)", precision=prec, micro_batch=mb,
                    accum_steps=acc, global_batch=mb * acc * g, optimizer="LAMB (APEX FusedLAMB)",
                    extra=PRETRAIN_2022 + BINNED * (seq == 512), value=v,
                    notes=("README column 'Batch size / GPU' prints the accumulated batch (4096 "
                           "seq128 / 2048 seq512); micro_batch derived = that / accumulation steps"),
                    **b2)
    h = "Fine-tuning NVIDIA DGX-1 With 32G (SQuAD)"
    for g, vf, va in ((1, 12, 52), (8, 85.5, 382)):
        for prec, v, mb in (("FP32", vf, 8), ("AMP fp16", va, 16)):
            p = "fp32" if prec == "FP32" else "amp"
            it, n = micro_step(mb, g, v)
            add(id=f"dle-pt-bert-2111-dgx1-32g-squad-{p}-{g}g", source=S_2111, locator=f"{L} § {h}",
                seq=384, gpu=v32, gpus=g, nodes=1, network="NVLink (single node)", precision=prec,
                micro_batch=mb, value=v, iteration_ms=it, extra="SQuAD v1.1 fine-tuning",
                notes=n, **ft2)
