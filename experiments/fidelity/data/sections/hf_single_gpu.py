"""Hugging Face transformers docs: Efficient Training on a Single GPU (early-2022 version)."""

S = "huggingface/transformers@98513dfd0db6dab00d26c1ef3a0e5f7410ce2035"
L = "docs/source/en/perf_train_gpu_one.mdx"
MK = ("NVML memory used on the GPU after trainer.train() (nvidia-smi view: includes the CUDA "
      "context ~1.3 GB and the caching allocator's reserved pool), not torch max_memory_allocated")


def rows(add, BERT_LARGE, **_):
    base = dict(BERT_LARGE, seq=512, gpu="V100-SXM2-16GB", gpus=1, nodes=1,
                framework="PyTorch + HF transformers Trainer (versions not stated, Jan 2022)",
                metric="throughput", unit="samples/s", memory_kind=MK)
    T = [  # tag, section, prec, mb, acc, ckpt, optimizer, samples/s, MiB, time s
        ("vanilla", "Vanilla Training", "FP32", 4, 1, "no", "AdamW (HF default)", 8.86, 14949, 57.82),
        ("accum4", "Gradient Accumulation", "FP32", 1, 4, "no", "AdamW (HF default)", 7.75, 8681, 66.03),
        ("accum4-gc", "Gradient Checkpointing", "FP32", 1, 4, "yes (HF gradient_checkpointing)",
         "AdamW (HF default)", 5.99, 6775, 85.47),
        ("fp16", "FP16 Training", "AMP fp16 (torch.cuda.amp)", 4, 1, "no", "AdamW (HF default)", 18.64, 13939, 27.46),
        ("accum4-gc-fp16", "FP16 Training (combined)", "AMP fp16 (torch.cuda.amp)", 1, 4,
         "yes (HF gradient_checkpointing)", "AdamW (HF default)", 10.09, 7275, 50.76),
        ("adafactor", "Adafactor", "FP32", 4, 1, "no", "Adafactor", 7.96, 12295, 64.31),
        ("accum4-gc-fp16-adafactor", "Adafactor (combined)", "AMP fp16 (torch.cuda.amp)", 1, 4,
         "yes (HF gradient_checkpointing)", "Adafactor", 9.06, 4847, 56.54),
        ("adam8bit", "8-bit Adam", "FP32", 4, 1, "no", "Adam8bit (bitsandbytes)", 9.15, 13085, 55.95),
        ("accum4-gc-fp16-adam8bit", "8-bit Adam (combined)", "AMP fp16 (torch.cuda.amp)", 1, 4,
         "yes (HF gradient_checkpointing)", "Adam8bit (bitsandbytes)", 10.35, 5363, 49.46),
    ]
    for tag, sec, prec, mb, acc, ck, opt, v, mib, secs in T:
        add(id=f"hf-1gpu-bertlarge-{tag}", source=S, locator=f"{L} § {sec}", precision=prec,
            micro_batch=mb, accum_steps=acc, global_batch=mb * acc, checkpointing=ck, optimizer=opt,
            extra="bert-large-uncased AutoModelForSequenceClassification, 512 random sequences, 1 epoch",
            value=v, peak_memory_gb=round(mib * 1048576 / 1e9, 3),
            notes=(f"printed 'GPU memory occupied: {mib} MB' (NVML used // 1024**2, i.e. MiB; "
                   f"converted to 1e9-byte GB); train_runtime {secs} s for 512 samples (includes "
                   "Trainer start-up)"), **base)
