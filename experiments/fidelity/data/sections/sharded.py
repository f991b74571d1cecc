"""Sharded data parallelism (issue 23): ZeRO-1/2/3, FSDP, DeepSpeed/FairScale sharding, offload.

Every number below was read from the cited file at the cited commit (README result blocks, table
cells, log lines). `extra` carries the sharding setup in `key=value` form:
  sharding=none|zero1|zero2|zero3|fsdp-full|fsdp-grad-op|fairscale-sdp|gemini
  offload=cpu (optimizer and/or parameters on the host; notes say which), impl=<library>,
  DP=/TP=/PP= where the source gives a 3D layout, name=<the source's model name>,
  code=<the model code the run executed> where it changes the kernels: code=hf-gpt2 (Hugging Face
  GPT2LMHeadModel: eager attention, gelu_new as element-wise ops), code=mingpt (minGPT's
  CausalSelfAttention: eager attention, nn.GELU).
Memory columns are in 10^9 bytes; MiB values were converted (x 1.048576 / 1000).
"""

MIB = 1.048576 / 1000.0


def gb_mib(x):
    return round(x * MIB, 3)


# ------------------------------------------------------------------------------------------
# 1. SeanNaren/minGPT (PyTorch Lightning + DeepSpeed), 8-GPU A100 server
# ------------------------------------------------------------------------------------------
S_MG = "SeanNaren/minGPT@9d95fa57597a014eac960e94939b4550369ec6d9"
L_MG = "README.md § Results / DDP vs DeepSpeed"
S_MG3 = "SeanNaren/minGPT@0139bda9cd133bf469f67565070d1c59a3056de0"
L_MG3 = "README.md (branch stage3) § Benchmark Results"
MG_MEM = ("torch.cuda.max_memory_allocated of each rank after the 1-epoch run, averaged over ranks "
          "(mingpt/callback.py CUDACallback, reset at epoch start)")
MG_VOCAB_NOTE = ("vocab 65 = unique characters of tinyshakespeare input.txt (CharDataset); the count is "
                 "printed at run time only; taken from the log line 'data has 1115394 characters, 65 "
                 "unique.' of the same CharDataset code on the same file in a PugetBench-minGPT log "
                 "(search index file id 19878368445)")


def mingpt(add):
    base = dict(model="gpt", heads=16, seq=128, vocab=65, nodes=1, network="single node (not stated)",
                framework="PyTorch Lightning (git master, early 2021) + DeepSpeed; PyTorch version not stated",
                precision="AMP fp16 (Lightning --precision 16)", accum_steps=1,
                metric="iteration_time", unit="s per epoch", memory_kind=MG_MEM)
    # 1.6B (n_layer 14, n_embd 3072), 120 batches, default --batch_size 8 (benchmark.py@9d95fa5)
    T = [
        ("ddp", "sharding=none impl=torch-ddp", "torch.optim.AdamW (mingpt/model.py@9d95fa5)", 40.27, 35834.96,
         "DDP (--accelerator ddp)"),
        ("ds-default-offload", "sharding=zero2 offload=cpu impl=deepspeed-lightning-plugin",
         "torch.optim.AdamW passed to DeepSpeed (zero_allow_untested_optimizer)", 357.26, 9993.60,
         "'DeepSpeed Default (With ZeRO-Offload)' (--plugins deepspeed). Stage 2 is Lightning's "
         "DeepSpeedPlugin default (stage: int = 2); CPU offload was the plugin default until "
         "Lightning-AI/pytorch-lightning PR #6262 (2021-03-01), which cites this benchmark"),
        ("ds-zero-nooffload", "sharding=zero2 impl=deepspeed-lightning-plugin",
         "torch.optim.AdamW passed to DeepSpeed", 18.41, 12625.53,
         "'DeepSpeed With ZeRO, no Offload'; stage 2 = plugin default (not printed in the README). "
         "Faster than DDP by 2.2x while sharding: the README gives no explanation; DeepSpeed's fp16 "
         "optimizer vs Lightning native AMP differs, so this pair is not a clean sharding pair"),
        ("ds-nozero", "sharding=none impl=deepspeed-lightning-plugin zero_optimization=0",
         "torch.optim.AdamW passed to DeepSpeed", 33.27, 30698.40,
         "'DeepSpeed Without ZeRO-Offload' via DeepSpeedPlugin(zero_optimization=False) as the README's "
         "code snippet shows, i.e. DeepSpeed engine with ZeRO disabled (the README's heading says "
         "'without ZeRO-Offload'; ambiguous naming)"),
    ]
    LBL = {"ddp": "DDP", "ds-default-offload": "DeepSpeed Default (With ZeRO-Offload)",
           "ds-zero-nooffload": "DeepSpeed With ZeRO, no Offload",
           "ds-nozero": "DeepSpeed Without ZeRO-Offload (requires instantiating the plugin, example below)"}
    for tag, extra, opt, sec, mib, note in T:
        add(id=f"sharded-mingpt-1.6b-{tag}", source=S_MG, locator=f"{L_MG} / ##### {LBL[tag]}",
            hidden=3072, layers=14, gpu="A100 (8 GPU A100 server; variant not stated)", gpus=8,
            micro_batch=8, global_batch=64, checkpointing="no", optimizer=opt,
            extra=extra + " code=mingpt name=minGPT-1.6B", value=sec, iteration_ms=round(sec / 120 * 1000, 1),
            peak_memory_gb=gb_mib(mib),
            notes=note + "; command: --n_layer 14 --n_head 16 --n_embd 3072 --gpus 8 --precision 16 "
                  "--limit_train_batches 120; batch 8 and block_size 128 are benchmark.py defaults; "
                  "iteration_ms derived = epoch time / 120 batches (epoch includes warm-up steps; the README "
                  "says DeepSpeed skipped the optimizer step on the first 20 batches for inf loss scale); "
                  + MG_VOCAB_NOTE, **base)
    add(id="sharded-mingpt-12.9b-ds-default-offload", source=S_MG, locator=L_MG + " / Maximum DeepSpeed!",
        hidden=8192, layers=16, gpu="A100 (8 GPU A100 server; variant not stated)", gpus=8, micro_batch=8,
        global_batch=64, checkpointing="no", optimizer="torch.optim.AdamW passed to DeepSpeed",
        extra="sharding=zero2 offload=cpu impl=deepspeed-lightning-plugin code=mingpt name=minGPT-12.9B", value=1700.02,
        iteration_ms=round(1700.02 / 120 * 1000, 1), peak_memory_gb=gb_mib(35430.12),
        notes="'My attempt to get the fit the largest model I could train on this machine reasonably' "
              "(so near the memory limit); --plugins deepspeed with plugin defaults (stage 2, CPU offload "
              "before PR #6262); iteration_ms derived = epoch time / 120; " + MG_VOCAB_NOTE, **base)

    # stage3 branch: ZeRO-3 via Lightning DeepSpeedPlugin(stage=3); 128 batches for the comparison
    b3 = dict(base, gpu="A100 (not stated for the runs; README names AWS p4d.24xlarge for CPU RAM)",
              gpus=8, framework="PyTorch Lightning (git master, March 2021) + DeepSpeed (ZeRO-3 preview)")
    T3 = [
        ("ddp", "sharding=none impl=torch-ddp", "not stated for DDP", "no", 43.69, 36148.55, "DDP"),
        ("zero3", "sharding=zero3 impl=deepspeed-lightning-plugin", "FusedAdam (README heading)", "no",
         45.05, 7796.98, "DeepSpeed ZeRO Stage 3 + FusedAdam"),
        ("zero3-offload", "sharding=zero3 offload=cpu impl=deepspeed-lightning-plugin",
         "DeepSpeedCPUAdam (README heading)", "no", 248.39, 4976.98,
         "DeepSpeed ZeRO Stage 3 Offload + DeepSpeedCPUAdam"),
        ("zero3-offload-ckpt", "sharding=zero3 offload=cpu impl=deepspeed-lightning-plugin",
         "DeepSpeedCPUAdam (README heading)", "yes (deepspeed.checkpointing per block)", 256.91, 2192.98,
         "DeepSpeed ZeRO Stage 3 Offload + DeepSpeedCPUAdam + Activation Checkpointing"),
    ]
    for tag, extra, opt, ck, sec, mib, label in T3:
        add(id=f"sharded-mingpt3-1.7b-{tag}", source=S_MG3,
            locator=L_MG3 + f" / Smaller Model Comparison, DDP vs DeepSpeed / {label}",
            hidden=3072, layers=15, micro_batch=1, global_batch=8, checkpointing=ck, optimizer=opt,
            extra=extra + " code=mingpt name=minGPT-1.7B", value=sec, iteration_ms=round(sec / 128 * 1000, 1),
            peak_memory_gb=gb_mib(mib),
            notes=f"'{label}'; command: --n_layer 15 --n_head 16 --n_embd 3072 --gpus 8 --precision 16 "
                  "--limit_train_batches 128 --batch_size 1; iteration_ms derived = epoch time / 128; "
                  "benchmark.py at this commit hard-codes stage=3 with offload and partition_activations, "
                  "so the non-offload and DDP rows were run with edits the README does not show; "
                  "offload here = optimizer and parameters (offload_optimizer/offload_parameters); "
                  + MG_VOCAB_NOTE, **b3)
    add(id="sharded-mingpt3-20b-zero3-max", source=S_MG3, locator=L_MG3 + " / Maximum DeepSpeed! / DeepSpeed ZeRO Stage 3",
        hidden=8192, layers=21, micro_batch=1, global_batch=8, checkpointing="not stated",
        optimizer="not stated", extra="sharding=zero3 impl=deepspeed-lightning-plugin code=mingpt name=minGPT-20B",
        value=45.65, iteration_ms=round(45.65 / 120 * 1000, 1), peak_memory_gb=gb_mib(36086.14),
        notes="'Largest model I could fit onto the server' (~20B; --n_layer 21 --n_embd 8192 --gpus 8 "
              "--precision 16 --limit_train_batches 120 --batch_size 1); iteration_ms derived = epoch "
              "time / 120; " + MG_VOCAB_NOTE, **b3)
    add(id="sharded-mingpt3-45b-zero3-offload", source=S_MG3, locator=L_MG3 + " / Maximum DeepSpeed! / DeepSpeed ZeRO Stage 3 Offload",
        hidden=8192, layers=56, micro_batch=4, global_batch=32, checkpointing="not stated",
        optimizer="DeepSpeedCPUAdam (mingpt/model.py@0139bda)",
        extra="sharding=zero3 offload=cpu impl=deepspeed-lightning-plugin code=mingpt name=minGPT-45B", value=3039.97,
        iteration_ms=round(3039.97 / 120 * 1000, 1), peak_memory_gb=gb_mib(14186.86),
        notes="~45B, --n_layer 56 --n_embd 8192 --gpus 8 --precision 16 --limit_train_batches 120 "
              "--cpu_offload; no --batch_size in the command, so micro_batch 4 is the benchmark.py default "
              "at this commit (ambiguous: the README says batch size is set to 1 in its usage examples); "
              "CPU virtual memory used 867.61 GB (91.8%); iteration_ms derived = epoch time / 120; "
              + MG_VOCAB_NOTE, **b3)


# ------------------------------------------------------------------------------------------
# 2. hpcaitech/ColossalAI-Pytorch-lightning benchmark/gpt (Lightning DDP / DeepSpeed ZeRO-3 / Gemini)
# ------------------------------------------------------------------------------------------
S_CA = "hpcaitech/ColossalAI-Pytorch-lightning@6a82b8015e06288da507d43f17cd40cc644bff03"
L_CA = "benchmark/gpt/README.md"
CA_MEM = ("torch.cuda.max_memory_allocated on rank 0 at fit end (benchmark/gpt/callback.py MemoryMonitor; "
          "printed as 'MB' but computed / 1024**2, i.e. MiB)")
CA_NOTE = ("GPT-2 architecture via HF GPT2LMHeadModel with random weights (benchmark/gpt/model.py), "
           "vocab 50257 and seq 1024 (data.py / train.py defaults), gradient checkpointing on "
           "(train.py default: no --no_activation_ckpt); Lightning precision=16; default 2 epochs x 4 steps "
           "(model scaling commands: 1 epoch x 3 steps); how the step time/throughput was timed is not stated")


def colossal(add):
    base = dict(model="gpt", seq=1024, vocab=50257, gpu="A100 (40G)", nodes=1, network="single node (not stated)",
                framework="PyTorch Lightning + DeepSpeed / ColossalAI (versions not stated)",
                precision="AMP fp16 (Lightning precision=16)", accum_steps=1,
                checkpointing="yes (HF gradient_checkpointing)", memory_kind=CA_MEM)
    xl = dict(hidden=1600, layers=48, heads=25)
    T = [
        ("ddp", "sharding=none impl=lightning-DDPStrategy(static_graph)", "torch.optim.Adam", 6, 24, 11.76, 37905.422,
         "ddp (AMP)"),
        ("zero3", "sharding=zero3 impl=lightning-DeepSpeedStrategy(stage=3)", "DeepSpeed FusedAdam", 40, 160, 18.18,
         25360.968, "deepspeed (zero3)"),
        ("gemini-cuda", "sharding=gemini placement=cuda impl=colossalai", "ColossalAI HybridAdam", 40, 160, 19.36,
         24003.394, "colssalai (cuda)"),
    ]
    for tag, extra, opt, mb, gb, thr, mib, label in T:
        add(id=f"sharded-colossal-gpt2xl-4g-{tag}", source=S_CA, locator=L_CA + f" § Small model comparison / {label}",
            gpus=4, micro_batch=mb, global_batch=gb, optimizer=opt, extra=extra + " code=hf-gpt2 name=gpt2_xl",
            metric="throughput", value=thr, unit="samples/s", peak_memory_gb=gb_mib(mib),
            notes=f"'{label}', 4x A100 (40G); command --np 4 --batch_size {mb}; the batch is the one used, "
                  "not stated as the maximum; " + CA_NOTE, **xl, **base)
    S = [
        ("zero3-offload-1g-18b", "sharding=zero3 offload=cpu impl=lightning-DeepSpeedStrategy(stage=3)",
         "DeepSpeedCPUAdam", 1, dict(hidden=4096, layers=90, heads=16), "gpt2_18B", 18, 5699.500, 39.32,
         "deepspeed (zero3 offload)", "offload_parameters and offload_optimizer both on"),
        ("gemini-auto-1g-24b", "sharding=gemini placement=auto impl=colossalai", "ColossalAI HybridAdam", 1,
         dict(hidden=8192, layers=30, heads=16), "gpt2_24B", 24, 36483.311, 69.54, "colssalai (auto)",
         "--placement_policy auto --opt_gpu_margin_rat 0.9"),
        ("zero3-8g-12b", "sharding=zero3 impl=lightning-DeepSpeedStrategy(stage=3)", "DeepSpeed FusedAdam", 8,
         dict(hidden=4096, layers=60, heads=16), "gpt2_12B", 12, 29751.203, 9.06, "deepspeed (zero3)", ""),
        ("gemini-cuda-8g-12b", "sharding=gemini placement=cuda impl=colossalai", "ColossalAI HybridAdam", 8,
         dict(hidden=4096, layers=60, heads=16), "gpt2_12B", 12, 24504.032, 7.07, "colssalai (cuda)", ""),
    ]
    for tag, extra, opt, g, dims, name, size, mib, st, label, more in S:
        add(id=f"sharded-colossal-maxsize-{tag}", source=S_CA,
            locator=L_CA + f" § Model scaling / {label} / {g} GPU(s)", gpus=g, micro_batch=1, global_batch=g,
            optimizer=opt, extra=extra + f" code=hf-gpt2 name={name}", metric="iteration_time", value=st, unit="s",
            iteration_ms=st * 1000, peak_memory_gb=gb_mib(mib),
            notes=f"'Max model size (B)' = {size}: the largest model that fitted with batch 1 per GPU "
                  f"(so this configuration fits, and the next size in model.py did not; the next size is not "
                  f"named); step time copied from 'Step time (sec)'; RAM 500G; {more}; " + CA_NOTE,
            **dims, **base)


# ------------------------------------------------------------------------------------------
# 3. BigScience tr11 (BLOOM) pre-training prequel: Megatron-DeepSpeed with ZeRO-1 + TP + PP
# ------------------------------------------------------------------------------------------
S_BS = "bigscience-workshop/bigscience@59a90eec97d93ef0b7093e2052e2b70196813ded"
L_BS = "train/tr11-176B-ml/chronicles-prequel.md"
BS_MEM = ("'Mem = max memory used by the first (last) nodes with the word embedding matrix - max is 77GB' "
          "(per GPU; 'GB' as written); the instrument is nvidia-smi: '(was quickly getting the memory "
          "snapshot with: `pdsh -w jean-zay-iam01 \"source ~/.pdshrc; nvidia-smi\"`)' under the 02-28 "
          "tables, and 'Checking the actual GPU allocations (nvidia-smi)' in the 104B section")
# Activation checkpointing: the document never prints the flag, but its TFLOPs column follows
# Megatron's formula 24*c*B*s*l*h^2*(1 + s/(6h) + V/(16lh)) / (sec * GPUs) with c = 4 (the
# checkpoint-activations factor; 3 without): the 02-21 row DP=4 PP=12 MBS=2 (181B, 134.02 s/it) gives
# 120.3 with c = 4 (printed 120.29; 90.2 with c = 3), the 02-17 200B DP=1 row (844.81 s) 102.5 with
# c = 4 against 98.87 printed by the calculator the document says under-reported by ~3 % (76.9 with
# c = 3). The 20B rows share the 200B rows' section and log format (the old calculator's figure for
# them matches neither factor).
BS_CKPT = ("full (derived: the TFLOPs column matches Megatron's formula only with the checkpoint-"
           "activations factor 4, e.g. 181B DP=4 PP=12 MBS=2: 120.3 computed vs 120.29 printed, 90.2 "
           "without; every transformer block checkpointed, Megatron-DeepSpeed --checkpoint-activations)")
# Precision of the rows after '## Best TFLOPs': the '## Rebalancing layers' section (02-28) says
# 'from now on the testing is happening with BF16 optimizer ... this is compared to fp16 which grad
# accumulates in fp16', so the 02-20 to 02-27 runs before it were fp16.
BS_FP16 = ("fp16 (derived: the 02-28 section says 'from now on the testing is happening with BF16 "
           "optimizer ... this is compared to fp16', so the earlier runs were fp16)")
BS_NET = "NVLink within node (NVLink 4 inter-gpu connects); 4 Omni-Path links per node, Omni-Path Architecture (OPA) between nodes (jz/hpc-specs.md)"
BS_FW = "Megatron-DeepSpeed (bigscience fork) + DeepSpeed; PyTorch 1.11 pre-release (train/tr11-176B-ml/README.md)"


def bigscience(add):
    base = dict(model="gpt", seq=2048, vocab=250000, gpu="A100 80GB", network=BS_NET, framework=BS_FW,
                checkpointing=BS_CKPT, optimizer="Adam (Megatron-DeepSpeed)", memory_kind=BS_MEM)
    # Best TFLOPs section: log lines (iteration 2) + the summary tables (Mem), fp16 and bf16
    runs = [
        ("20b-8g-dp1", 8, 1, 1, 1, dict(hidden=14400, layers=8, heads=32), "20B", {"fp16": (769.99, 67), "bf16": (777.09, 68)}),
        ("200b-80g-dp1", 80, 10, 1, 10, dict(hidden=14400, layers=80, heads=96), "200B", {"fp16": (844.81, 73), "bf16": (853.81, 75)}),
        ("200b-160g-dp2", 160, 20, 2, 10, dict(hidden=14400, layers=80, heads=96), "200B", {"fp16": (430.21, 51), "bf16": (434.14, 53)}),
    ]
    for tag, g, n, dp, pp, dims, size, per in runs:
        for prec, (sec, mem) in per.items():
            add(id=f"sharded-bigsci-{tag}-{prec}", source=S_BS,
                locator=f"{L_BS} § Best TFLOPs / ### {prec}: iteration-2 log line ('elapsed time per iteration (s)') and the GPUs/Size/DP/TP/PP/MBS/Mem table",
                gpus=g, nodes=n, precision=prec, micro_batch=1, accum_steps=2048 // dp, global_batch=2048,
                extra=f"sharding=zero1 DP={dp} TP=8 PP={pp} impl=megatron-deepspeed name=bigscience-{size}",
                metric="iteration_time", value=sec, unit="s", iteration_ms=round(sec * 1000, 1),
                peak_memory_gb=mem,
                notes=f"{size}: NLAYERS/NHIDDEN/NHEADS, SEQ_LEN=2048, VOCAB_LENGTH=250k (as written), GBS=2048 "
                      "stated above the log line; the text attributes the DP=2 vs DP=1 memory drop to ZeRO-1 "
                      "('because of ZeRO-1 that saves a lot of memory'); accum_steps derived = GBS/(MBS x DP); "
                      "a single (2nd) iteration, not an average", **dims, **base)
    h181 = dict(hidden=14336, layers=72, heads=64)
    # ZeRO stage pair: the time/TFLOPs columns are ambiguous, so the ZS=0 row is recorded as a memory fact
    add(id="sharded-bigsci-181b-zs0-dp4-pp12-mbs2", source=S_BS,
        locator=L_BS + " § 48 node contenders / 'Trying with ZeRO_STAGE=0/1' table, row ZS=0",
        gpus=384, nodes=48, precision=BS_FP16, micro_batch=2, accum_steps=256, global_batch=2048,
        extra="sharding=none zero_stage=0 DP=4 TP=8 PP=12 impl=megatron-deepspeed name=bigscience-181B",
        metric="fits_in_memory", value=1, unit="bool", peak_memory_gb=72,
        notes="ZS=0 (no ZeRO) row: Mem 72GB vs 37GB for ZS=1 in the same table. The table prints "
              "'Sec/it | TFLOPs' = 120.29 | 134.02 for ZS=1, but the same ZS=1 configuration in the previous "
              "table reads 134.02 s/it and 120.29 TFLOPs, so the columns look swapped; the ZS=0 time is "
              "therefore either 113.02 or 137.34 s/it (not used). The author notes ZS=0 and ZS=1 ran on "
              "different branches ('need to retest the above on the same branch'). Stated that it ran "
              "(fits)", **h181, **base)
    C = [  # 48 node contenders, NHIDDEN=14336 / NLAYERS=72 (NHEADS=64 per '## Final round comparison')
        (4, 12, 1, 29, 143.31), (4, 12, 2, 37, 134.02), (4, 12, 4, 49, 123.69), (4, 12, 8, 69, 129.26),
        (8, 6, 1, 38, 139.82), (8, 6, 2, 44, 131.02), (8, 6, 4, 56, 121.48),
    ]
    for dp, pp, mbs, mem, sec in C:
        add(id=f"sharded-bigsci-181b-dp{dp}-tp8-pp{pp}-mbs{mbs}", source=S_BS,
            locator=L_BS + f" § 48 node contenders (NHIDDEN=14336 / NLAYERS=72), row DP={dp} PP={pp} MBS={mbs}",
            gpus=384, nodes=48, precision=BS_FP16, micro_batch=mbs, accum_steps=2048 // (mbs * dp),
            global_batch=2048, extra=f"sharding=zero1 DP={dp} TP=8 PP={pp} impl=megatron-deepspeed name=bigscience-181B",
            metric="iteration_time", value=sec, unit="s", iteration_ms=round(sec * 1000, 1), peak_memory_gb=mem,
            notes="Sec/it at iteration 2; ZeRO stage 1 per the section's ZS table (ZS=1 is this table's "
                  "DP=4 PP=12 MBS=2 row) and the text ('thanks to ZeRO which shards all fp32 optim+grad+params "
                  "over all gpus'); NHEADS=64 stated under '## Final round comparison' ('all NHEADS=64 (above "
                  "too)'); accum_steps derived = GBS/(MBS x DP)", **h181, **base)
    # Tweaking TP table (02-25): DP/TP/PP trade-offs at 48 nodes, 181B; OOM cells are memory facts
    P = [
        (8, 4, 12, 4, "60", 111.89), (8, 4, 12, 2, "44", 110.48), (8, 4, 12, 2, "38", 113.54),
        (16, 4, 6, 4, "75", 117.11), (16, 4, 6, 2, "57", 111.71), (16, 2, 12, 2, "63", 112.50),
        (32, 2, 6, 2, "OOM", None), (32, 2, 6, 1, "OOM", None), (8, 2, 24, 1, "44", 119.53),
        (8, 2, 24, 2, "53", 122.75),
    ]
    seen = {}
    for dp, tp, pp, mbs, mem, sec in P:
        key = f"dp{dp}-tp{tp}-pp{pp}-mbs{mbs}"
        seen[key] = seen.get(key, 0) + 1
        rid = f"sharded-bigsci-181b-tptweak-{key}" + (f"-run{seen[key]}" if seen[key] > 1 else "")
        common = dict(id=rid, source=S_BS,
                      locator=L_BS + f" § GBS Variations / 'Tweaking TP' table (02-25), row DP={dp} TP={tp} PP={pp} MBS={mbs} Mem={mem}",
                      gpus=384, nodes=48, precision=BS_FP16, micro_batch=mbs,
                      accum_steps=2048 // (mbs * dp), global_batch=2048,
                      extra=f"sharding=zero1 DP={dp} TP={tp} PP={pp} impl=megatron-deepspeed name=bigscience-181B",
                      **h181, **base)
        nb = ("NLAYERS=72 NHIDDEN=14336 NHEADS=64 stated at the top of '## GBS Variations'; the section notes "
              "a PCIe/NUMA fix that day raised all TFLOPs 1-5% (do not compare with earlier tables); ZeRO-1 as "
              "in the earlier sections (stage not printed per row)")
        if mem == "OOM":
            add(metric="fits_in_memory", value=0, unit="bool",
                notes="table cell Mem = 'OOM'; " + nb, **common)
        else:
            dup = " The table lists DP=8 TP=4 PP=12 MBS=2 twice (44GB/110.48 and 38GB/113.54); no difference is stated." if key == "dp8-tp4-pp12-mbs2" else ""
            add(metric="iteration_time", value=sec, unit="s", iteration_ms=round(sec * 1000, 1),
                peak_memory_gb=int(mem), notes=nb + "; Sec/it at iteration 2; accum_steps derived = GBS/(MBS x DP)." + dup,
                **common)
    # '## NHEADs comparison' (02-23/24): one layout (48 nodes, DP=8 TP=8 PP=6 MBS=4, GBS 2048), the
    # head count varied at four hidden sizes. Each row its own model (`name=`): a head sweep, not a
    # layout comparison. Mem 'GB' (blank) cells have no memory.
    H = [  # (NHIDDEN, NLAYERS, NHEADS, Mem GB or None, Sec/it, date)
        (14336, 72, 16, 54, 121.03, "02-24"), (14336, 72, 32, 55, 124.01, "02-23"),
        (14336, 72, 64, 55, 120.18, "02-23"), (14336, 72, 112, 53, 138.72, "02-23"),
        (14336, 72, 128, 55, 124.89, "02-23"), (14336, 72, 256, 54, 132.85, "02-24"),
        (13824, 78, 64, None, 121.28, "02-23"), (13824, 78, 96, 59, 124.75, "02-23"),
        (13824, 78, 128, 54, 162.72, "02-23"),
        (13312, 84, 64, None, 122.93, "02-23"), (13312, 84, 128, None, 129.17, "02-23"),
        (12288, 96, 64, None, 122.96, "02-24"), (12288, 96, 96, None, 145.40, "02-24"),
    ]
    for hid, lay, nh, mem, sec, date in H:
        mem_kw = {} if mem is None else dict(peak_memory_gb=mem)
        add(id=f"sharded-bigsci-nheads-h{hid}-n{nh}", source=S_BS,
            locator=L_BS + f" § NHEADs comparison, NHIDDEN={hid} / NLAYERS={lay} table, row NHEADS={nh} ({date})",
            gpus=384, nodes=48, precision=BS_FP16, micro_batch=4, accum_steps=64, global_batch=2048,
            extra=f"sharding=zero1 DP=8 TP=8 PP=6 impl=megatron-deepspeed name=bigscience-nheads-h{hid}-n{nh}",
            metric="iteration_time", value=sec, unit="s", iteration_ms=round(sec * 1000, 1),
            hidden=hid, layers=lay, heads=nh,
            notes=f"head dimension {hid}/{nh} = {hid / nh:g}; Sec/it at iteration 2; ZeRO-1 as in the "
                  "48-node sections; accum_steps derived = GBS/(MBS x DP); the section's constraint "
                  "'(HEADS/TP)*MBS % 4 = 0' (Megatron's fused softmax) holds for every row"
                  + ("" if mem is not None else "; Mem cell blank ('GB')"),
            **mem_kw, **base)
    add(id="sharded-bigsci-181b-dp48-tp8-pp1-mbs1-oom", source=S_BS,
        locator=L_BS + " § GBS Variations / 'some more configs with lower PP' table, row DP=48 TP=8 PP=1 MBS=1",
        gpus=384, nodes=48, precision=BS_FP16, micro_batch=1, accum_steps=42, global_batch=2016,
        extra="sharding=zero1 DP=48 TP=8 PP=1 impl=megatron-deepspeed name=bigscience-181B",
        metric="fits_in_memory", value=0, unit="bool",
        notes="table cell Mem = 'OOM' (GBS 2016); the full 181B model replicated per TP group with ZeRO-1 "
              "over DP=48; accum_steps derived = GBS/(MBS x DP)", **h181, **base)


# ------------------------------------------------------------------------------------------
# 4. Hugging Face blog posts (2x TITAN RTX 24GB): FairScale / DeepSpeed / FSDP via Trainer / Accelerate
# ------------------------------------------------------------------------------------------
S_ZB = "huggingface/blog@09e31d10fec2b303c22ef30c094534fbb155f39b"
L_ZB = "zero-deepspeed-fairscale.md § Huge Speedups with Multi-GPU Setups (results table)"
S_FS = "huggingface/blog@00e67ae4b7a8c1bc4db743be1a2931422c6d2be2"
L_FS = "pytorch-fsdp.md § Multi-GPU FSDP"
S_AD = "huggingface/blog@29b1b07dc3947a6f5e8bd4baf104afa73ccf9d26"
L_AD = "accelerate-deepspeed.md"
FIT = "out-of-memory observation stated by the source (binary: 1 = ran, 0 = OOM)"
T5_SETUP = ("setup from huggingface/transformers#8771 comment 759248400 (linked from the post): PyTorch 1.7.1, "
            "CUDA 10.2, 2x TITAN RTX, transformers 4.2.0dev0, finetune_trainer.py t5-large wmt_en_ro, "
            "--max_source_length 128 --max_target_length 128, --n_train 2000")


def hf_blogs(add):
    base = dict(gpu="TITAN RTX 24GB", nodes=1, network="single node (not stated)")
    # zero-deepspeed-fairscale: t5-large, 2 GPUs, max batch per method, Trainer train_runtime for 2000 samples
    T = [
        ("baseline", "sharding=none impl=torch-ddp", "FP32 (no --fp16)", 16, "30.9458"),
        ("fp16", "sharding=none impl=torch-ddp", "fp16 (HF --fp16)", 20, "21.4943"),
        ("sharded-ddp", "sharding=fairscale-sdp impl=fairscale", "FP32 (no --fp16)", 30, "25.9085"),
        ("sharded-ddp-fp16", "sharding=fairscale-sdp impl=fairscale", "fp16 (HF --fp16)", 30, "17.3838"),
        ("deepspeed", "sharding=zero2 impl=deepspeed", "not stated (DeepSpeed config not shown in the post)", 40, "10.4007"),
        ("deepspeed-offload", "sharding=zero2 offload=cpu impl=deepspeed", "not stated (DeepSpeed config not shown in the post)", 50, "20.9706"),
    ]
    ZLBL = {"baseline": "baseline", "fp16": "fp16", "sharded-ddp": "sharded_ddp",
            "sharded-ddp-fp16": "sharded_ddp+fp16", "deepspeed": "deepspeed w/o cpu offload",
            "deepspeed-offload": "deepspeed w/ cpu offload"}
    for tag, extra, prec, bs, rt in T:
        steps = -(-2000 // (2 * bs))
        add(id=f"sharded-hfblog-t5large-2g-{tag}", source=S_ZB, locator=L_ZB + f", row '{ZLBL[tag]}'",
            model="t5-large", gpus=2, framework="PyTorch 1.7.1 + HF transformers 4.2.0dev0 Trainer", precision=prec,
            micro_batch=bs, accum_steps=1, global_batch=2 * bs, checkpointing="no", optimizer="AdamW (HF Trainer)",
            extra=extra + " name=t5-large", metric="iteration_time", value=rt, unit="s (train_runtime for 2000 samples)",
            iteration_ms=round(float(rt) / steps * 1000, 1),
            notes=f"'max BS' {bs} per GPU = the largest batch that fitted before OOM; 'train time' is the Trainer's "
                  f"train_runtime; iteration_ms derived = train_runtime / ceil(2000 / (2 x {bs})) = / {steps} steps "
                  "(train_runtime also covers Trainer/DeepSpeed start-up inside train(), so it overstates the "
                  "step); encoder-decoder, not a GPT/BERT zoo model; sharded_ddp = FairScale OSS+ShardedDDP "
                  "(optimizer state + gradient sharding); DeepSpeed stage 2 inferred from the post's text ('As of "
                  "this writing FairScale and DeepSpeed only perform ... (Sharding) for the optimizer states and "
                  "gradients'), not printed; " + T5_SETUP, **base)
    t5_3b = dict(model="t5-3b", gpus=1, gpu="RTX-3090 24GB", nodes=1, network="single GPU",
                 framework="PyTorch + HF transformers >= 4.2.0 Trainer", precision="fp16 (HF --fp16)",
                 accum_steps=1, checkpointing="no", optimizer="AdamW (HF Trainer)",
                 metric="fits_in_memory", unit="bool", memory_kind=FIT)
    add(id="sharded-hfblog-t5-3b-1g-ddp-bs1-oom", source=S_ZB, locator="zero-deepspeed-fairscale.md § Fitting A Huge Model Onto One GPU",
        micro_batch=1, global_batch=1, extra="sharding=none name=t5-3b", value=0,
        notes="'even with BS=1 we get: RuntimeError: CUDA out of memory. ... 23.70 GiB total capacity; 21.37 GiB "
              "already allocated; 45.69 MiB free; 22.05 GiB reserved in total by PyTorch'", **t5_3b)
    add(id="sharded-hfblog-t5-3b-1g-deepspeed-bs20", source=S_ZB, locator="zero-deepspeed-fairscale.md § Fitting A Huge Model Onto One GPU",
        micro_batch=20, global_batch=20, extra="sharding=zero2 offload=cpu impl=deepspeed name=t5-3b", value=1,
        notes="'We get a a batch size of 20 trained just fine'; train_runtime = 8.8511 s for train_n_objs = 60 "
              "(3 steps, too few for a step time); ds_config_1gpu.json not shown; ZeRO-Offload named as what made "
              "it fit ('You saw its dramatic impact in the success at running t5-3b on a 24GB GPU')", **t5_3b)
    add(id="sharded-hfblog-t5-3b-1g-deepspeed-bs30-oom", source=S_ZB, locator="zero-deepspeed-fairscale.md § Fitting A Huge Model Onto One GPU",
        micro_batch=30, global_batch=30, extra="sharding=zero2 offload=cpu impl=deepspeed name=t5-3b", value=0,
        notes="'The program failed with OOM at BS=30'", **t5_3b)

    # pytorch-fsdp.md: GPT-2 Large / XL, max batch per method (fits facts); times are whole-command minutes
    g2l = dict(model="gpt", hidden=1280, layers=36, heads=20, vocab=50257, seq=12)
    g2xl = dict(model="gpt", hidden=1600, layers=48, heads=25, vocab=50257, seq=12)
    DIMS = ("GPT-2 dims are the standard ones for the HF checkpoint, as also written in "
            "hpcaitech/ColossalAI-Pytorch-lightning@6a82b80 benchmark/gpt/model.py (gpt2_large / gpt2_xl); "
            "seq: the command prints '--block_size 12' (SUSPECT truncation of 128 in the post; as written)")
    fs = dict(framework="PyTorch nightly / 1.12 FSDP + HF Accelerate (run_clm_no_trainer.py)", optimizer="AdamW",
              checkpointing="no", accum_steps=1, metric="fits_in_memory", unit="bool", memory_kind=FIT)
    T1 = [
        ("ddp", "sharding=none impl=torch-ddp", "FP32 (mixed_precision: 'no')", 7, 15, "DDP (Distributed Data Parallel)"),
        ("ddp-fp16", "sharding=none impl=torch-ddp", "fp16 (accelerate mixed precision)", 7, 8, "DDP + FP16"),
        ("fsdp-grad-op", "sharding=fsdp-grad-op impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 11, 11, "FSDP with SHARD_GRAD_OP"),
        ("fsdp-full-wrap1m", "sharding=fsdp-full wrap_min_params=1000000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 15, 12, "FSDP with min_num_params = 1M + FULL_SHARD"),
        ("fsdp-full-wrap2k", "sharding=fsdp-full wrap_min_params=2000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 15, 13, "FSDP with min_num_params = 2K + FULL_SHARD"),
        ("fsdp-full-offload-wrap1m", "sharding=fsdp-full offload=cpu wrap_min_params=1000000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 20, 23, "FSDP with min_num_params = 1M + FULL_SHARD + Offload to CPU"),
        ("fsdp-full-offload-wrap2k", "sharding=fsdp-full offload=cpu wrap_min_params=2000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 22, 24, "FSDP with min_num_params = 2K + FULL_SHARD + Offload to CPU"),
    ]
    for tag, extra, prec, bs, mins, label in T1:
        add(id=f"sharded-hfblog-gpt2large-2g-{tag}-bs{bs}", source=S_FS,
            locator=L_FS + f" / Table 1 (GPT-2 Large 762M), row '{label}'", gpus=2, precision=prec,
            micro_batch=bs, global_batch=2 * bs, extra=extra + " code=hf-gpt2 name=gpt2-large", value=1,
            notes=f"'Batch Size Max ($BS)' = {bs}: the largest per-GPU batch without OOM (the command says to "
                  f"decrease BS until it fits); 'Approx Train Time' {mins} min is `time accelerate launch` of the "
                  "whole script (2000 train + 500 eval samples, load and eval included), so no step time; "
                  "precision: the sample config shows mixed_precision 'no' and only 'DDP + FP16' names fp16 "
                  "(the post says FSDP mixed precision had issues); offload = FSDP offload_params (params + "
                  "grads to CPU); " + DIMS, **g2l, **base, **fs)
    T2 = [
        ("ddp-1g-bs1-oom", "sharding=none impl=torch-ddp", "FP32 (mixed_precision: 'no')", 1, 1, 0, "DDP, 1 GPU"),
        ("ddp-2g-bs1-oom", "sharding=none impl=torch-ddp", "FP32 (mixed_precision: 'no')", 2, 1, 0, "DDP, 2 GPUs"),
        ("ddp-fp16-1g-bs1-oom", "sharding=none impl=torch-ddp", "fp16 (accelerate mixed precision)", 1, 1, 0, "DDP + FP16, 1 GPU"),
        ("fsdp-full-2g-bs5", "sharding=fsdp-full wrap_min_params=2000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 2, 5, 1, "FSDP with min_num_params = 2K, 2 GPUs"),
        ("fsdp-full-offload-1g-bs10", "sharding=fsdp-full offload=cpu wrap_min_params=2000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 1, 10, 1, "FSDP with min_num_params = 2K + Offload to CPU, 1 GPU"),
        ("fsdp-full-offload-2g-bs14", "sharding=fsdp-full offload=cpu wrap_min_params=2000 impl=torch-fsdp", "FP32 (mixed_precision: 'no')", 2, 14, 1, "FSDP with min_num_params = 2K + Offload to CPU, 2 GPUs"),
    ]
    for tag, extra, prec, g, bs, ok, label in T2:
        n = ("'OOM Error RuntimeError: CUDA out of memory. Tried to allocate 40.00 MiB (GPU 0; 23.65 GiB total "
             "capacity; 22.27 GiB already allocated; 20.31 MiB free; 22.76 GiB reserved in total by PyTorch)'"
             if not ok else
             f"'Batch Size Max' = {bs} (largest that fitted); approx train time in the table: "
             + {5: "0.6 h", 10: "3 h", 14: "1.16 h"}[bs] + " (whole command, no step time)")
        add(id=f"sharded-hfblog-gpt2xl-{tag}", source=S_FS, locator=L_FS + f" / Table 2 (GPT-2 XL 1.5B), row '{label}'",
            gpus=g, precision=prec, micro_batch=bs, global_batch=g * bs, extra=extra + " code=hf-gpt2 name=gpt2-xl", value=ok,
            notes=n + "; FULL_SHARD per the text ('FSDP with Zero-Stage 3 is able to be run on 2 GPUs with batch "
                      "size of 5'); " + DIMS, **g2xl, **base, **fs)

    # accelerate-deepspeed.md Table 3: GPT-XL (config from gpt2-xl), block_size 128
    ad = dict(framework="HF Accelerate + DeepSpeed (run_clm_no_trainer.py)", precision="fp16 (DeepSpeed fp16)",
              optimizer="AdamW (DeepSpeed config)", checkpointing="no", accum_steps=1, metric="fits_in_memory",
              unit="bool", memory_kind=FIT)
    g2xl128 = dict(g2xl, seq=128)
    add(id="sharded-hfblog-gpt2xl-accel-ddp-oom", source=S_AD, locator=L_AD + " § CPU/Disk Offloading ... / Table 3, row 'DDP'",
        gpus=1, micro_batch=1, global_batch=1, extra="sharding=none impl=torch-ddp code=hf-gpt2 name=gpt2-xl", value=0,
        notes="'On a single 24GB NVIDIA Titan RTX GPU, one cannot train GPT-XL Model (1.5B parameters) even with a "
              "batch size of 1'; table: 'OOM Error'; GPT-2 XL dims as above, --block_size 128",
        **g2xl128, **base, **ad)
    add(id="sharded-hfblog-gpt2xl-accel-zero3-offload-bs16", source=S_AD,
        locator=L_AD + " § CPU/Disk Offloading ... / Table 3, row 'DeepSpeed ZeRO Stage 3'", gpus=2, micro_batch=16,
        global_batch=32, extra="sharding=zero3 offload=cpu impl=deepspeed code=hf-gpt2 name=gpt2-xl", value=1,
        notes="'Batch Size Max' 16; train time per epoch 6608.35 s (wikitext-2 step count not stated, so no step "
              "time); zero3_offload_config_accelerate.json: stage 3, offload_optimizer and offload_param to CPU "
              "(pinned), overlap_comm, sub_group_size 1e9, stage3_max_live_parameters 1e9; GPU count ambiguous: "
              "the text speaks of a single GPU but the printed accelerate config has num_processes: 2 (used here); "
              "--config_name gpt2-xl (random init), --block_size 128", **g2xl128, **base, **ad)


def rows(add, **_):
    mingpt(add)
    colossal(add)
    bigscience(add)
    hf_blogs(add)
