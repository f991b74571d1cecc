"""Oneflow-Inc/DLPerf re-measurements of NVIDIA DLE PyTorch models on 4 x 8 V100-16GB (Aug-Sep 2020)."""

S_RN = "Oneflow-Inc/DLPerf@2a4f7c2e3be2a4255d2a30ee94e46469939f1ee0"
L_RN = "NVIDIADeepLearningExamples/PyTorch/resnet50v1.5/README.md"
S_BE = "Oneflow-Inc/DLPerf@a6407984004abe5ba00d163dd5d5309dbdab8f46"
L_BE = "NVIDIADeepLearningExamples/PyTorch/BERT/README.md"
NET = "NVLink within node; InfiniBand EDR 100 Gb/s (Mellanox MT27700) between nodes"
FW = "PyTorch 1.5.0a0+8f84ded (NGC 20.03), NCCL 2.5.6, CUDA 10.2"
MED = "median of 5 runs; each run: iterations 21-120 of the first epoch (README §3)"


def rows(add, BERT_BASE, **_):
    cfgs = [(1, 1), (1, 4), (1, 8), (2, 8), (4, 8)]
    rn = dict(model="resnet50", gpu="V100-SXM2-16GB", framework=FW + " + APEX",
              optimizer="SGD momentum", metric="throughput", unit="images/s", checkpointing="no",
              accum_steps=1, network=NET)
    t = [("fp32", "FP32", 128, "FP32", (367.29, 1449.48, 2887.65, 5716.79, 10917.09),
          "DALI (dali-cpu), NCHW, --optimizer-batch-size -1 (no accumulation; log line)"),
         ("amp-dyn", "AMP fp16 (APEX), dynamic loss scale", 256, "AMP & dynamic loss scale",
          (802.9, 3137.44, 6154.66, 11991.94, 22551.16), "DALI (dali-cpu)"),
         ("amp-static", "AMP fp16 (APEX), static loss scale", 256, "AMP & static loss scale",
          (827.86, 3253.68, 6446.74), "DALI (dali-cpu)")]
    for tag, prec, mb, head, vals, extra in t:
        for (nodes, per), v in zip(cfgs, vals):
            g = nodes * per
            add(id=f"dlperf-pt-rn50-{tag}-b{mb}-{nodes}n{per}g", source=S_RN,
                locator=f"{L_RN} § 性能结果 Performance / {head}, batch_size = {mb}", gpus=g,
                nodes=nodes, precision=prec, micro_batch=mb, global_batch=mb * g, value=v,
                extra=extra, notes=MED, **rn)
    be = dict(BERT_BASE, seq=128, gpu="V100-SXM2-16GB", framework=FW + " + APEX",
              optimizer="Adam (APEX FusedAdam replacing FusedLAMB)", metric="throughput",
              unit="sequences/s", checkpointing="no", accum_steps=1, network=NET,
              extra="DLE run_pretraining.py phase-1 data, max_seq_length=128, max_pred 20")
    t = [("fp32", "FP32", 32, (119.6, 457.72, 921.32, 1499.4, 2885.81)),
         ("fp32", "FP32", 48, (121.94, 464.66, 928.01, 1584.32, 3039.3)),
         ("fp16", "fp16 (DLE --fp16 flag, APEX)", 64, (444.51, 1671.66, 3251.7, 4936.92, 9331.72)),
         ("fp16", "fp16 (DLE --fp16 flag, APEX)", 96, (462.35, 1727.93, 3287.12, 5426.07, 10349.12))]
    for tag, prec, mb, vals in t:
        for (nodes, per), v in zip(cfgs, vals):
            g = nodes * per
            add(id=f"dlperf-pt-bertbase-{tag}-b{mb}-{nodes}n{per}g", source=S_BE,
                locator=f"{L_BE} § 性能结果 Performance / {tag.upper()} BERT-Base batch_size = {mb}",
                gpus=g, nodes=nodes, precision=prec, micro_batch=mb, global_batch=mb * g, value=v,
                notes=MED + "; seq and optimizer from scripts/single_node_train.sh@87ee725ae54e "
                      "and README §Adam 算法", **be)
