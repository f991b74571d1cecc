"""Out-of-memory / max-batch observations stated in the sources (binary memory-capacity facts)."""

S_TFB = "NVIDIA/DeepLearningExamples@12c7bc23020554c8380b788964d02bcf2c594820"
L_TFB = "TensorFlow/LanguageModeling/BERT/README.md § Training performance results"
S_DLP = "Oneflow-Inc/DLPerf@28c5854bbdd71618a31b263c5544f1f660406b92"
L_DLP = "reports/dlperf_benchmark_test_report_v1.md § Benchmark Test Results"
S_DLR = "Oneflow-Inc/DLPerf@2a4f7c2e3be2a4255d2a30ee94e46469939f1ee0"
S_DLB = "Oneflow-Inc/DLPerf@a6407984004abe5ba00d163dd5d5309dbdab8f46"
MK = "out-of-memory observation stated by the source (binary: 1 = ran, 0 = OOM)"


def rows(add, BERT_BASE, BERT_LARGE, **_):
    T = [
        ("tfbert-1903-v100-16g-fp32-b3", S_TFB, L_TFB + " / NVIDIA DGX-1 (8x V100 16G), note under the batch-3 table",
         BERT_LARGE, 384, "V100-SXM2-16GB", "FP32", 3, 0, "TensorFlow (NGC 19.03-py3)", "SQuAD fine-tuning; FP16 at batch 3 runs (17.14 seq/s on 1 GPU)"),
        ("tfbert-1903-v100-32g-fp32-b10", S_TFB, L_TFB + " / NVIDIA DGX-1 (8x V100 32G), note under the batch-10 table",
         BERT_LARGE, 384, "V100-SXM2-32GB", "FP32", 10, 0, "TensorFlow (NGC 19.03-py3)", "SQuAD fine-tuning; FP16 at batch 10 runs (31.80 seq/s on 1 GPU)"),
        ("dlperf-dle-pt-bertbase-fp32-b64", S_DLP, L_DLP + " / BERT Base Pretrain batch size = 64, PyTorch column",
         BERT_BASE, 128, "V100-SXM2-16GB", "FP32", 64, 0, "PyTorch 1.5 (NGC 20.03), NVIDIA DLE", "table cell 'OOM'; the same model runs at batch 48 (DLPerf PyTorch BERT README)"),
        ("dlperf-dle-tf-bertbase-fp32-b64", S_DLP, L_DLP + " / BERT Base Pretrain batch size = 64, TensorFlow 1.x column",
         BERT_BASE, 128, "V100-SXM2-16GB", "FP32", 64, 0, "TensorFlow 1.15 (NGC 20.03), NVIDIA DLE", "table cell 'OOM'"),
        ("dlperf-gluon-mxnet-bertbase-fp32-b64", S_DLP, L_DLP + " / BERT Base Pretrain batch size = 64, MXNet column",
         BERT_BASE, 128, "V100-SXM2-16GB", "FP32", 64, 0, "MXNet 1.6 gluon-nlp", "table cell 'OOM'"),
        ("dlperf-dle-pt-bertbase-fp32-b48", S_DLB, "NVIDIA DLE PyTorch BERT README § FP32 BERT-Base batch_size = 48",
         BERT_BASE, 128, "V100-SXM2-16GB", "FP32", 48, 1, "PyTorch 1.5 (NGC 20.03), NVIDIA DLE", "runs (121.94 seq/s on 1 GPU)"),
        ("dlperf-dle-pt-bertbase-fp16-b96-max", S_DLB, "NVIDIA DLE PyTorch BERT README § FP16 BERT-Base batch_size = 96",
         BERT_BASE, 128, "V100-SXM2-16GB", "fp16 (DLE --fp16, APEX)", 96, 1, "PyTorch 1.5 (NGC 20.03), NVIDIA DLE", "README: max supported batch size = 96"),
        ("dlperf-dle-pt-rn50-amp-b256-max", S_DLR, "NVIDIA DLE PyTorch resnet50v1.5 README § AMP batch_size = 256",
         dict(model="resnet50"), "", "V100-SXM2-16GB", "AMP fp16 (APEX)", 256, 1, "PyTorch 1.5 (NGC 20.03), NVIDIA DLE", "README: max supported batch size = 256"),
        ("dlperf-dle-mxnet-rn50-fp32-b128", S_DLP, L_DLP + " / ResNet50 V1.5 batch size = 128, MXNet column note",
         dict(model="resnet50"), "", "V100-SXM2-16GB", "FP32", 128, 0, "MXNet 1.6 (NGC 20.03), NVIDIA DLE, DALI", "report: MXNet OOM at batch 128, so batch 96 was used"),
    ]
    for tag, src, loc, mdl, seq, gpu, prec, mb, ok, fw, note in T:
        add(id=f"oom-{tag}", source=src, locator=loc, seq=seq, gpu=gpu, gpus=1, nodes=1, framework=fw,
            precision=prec, micro_batch=mb, checkpointing="no", metric="fits_in_memory", value=ok, unit="bool",
            memory_kind=MK, notes=note, **mdl)
