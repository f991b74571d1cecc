#!/usr/bin/env bash
# One lease of a GPU machine (the workplace's device tool): every ground-truth measurement in
# this folder, each section under its own time limit, results gathered after each section so a
# run cut short keeps what it measured. Needs $OUT (where results go) and, for `calibrate`, a
# trainplan built with `--features gpu` at .devbin/trainplan (carried; the machine has no Rust).
#   $OUT/results.tgz  measured.json memory.json attention.csv fsdp.json calibrated.yaml logs
#   $OUT/*.json.gz    Kineto traces: resnet50/bert-base baselines, FSDP2 and plain GPT-2 medium
#   $OUT/log.txt      everything printed
set -uo pipefail
cd "$(dirname "$0")/../.."
W=/tmp/gpu_truth; mkdir -p "$W"
export PYTHONUNBUFFERED=1 USE_TF=0 TRANSFORMERS_NO_TF=1 HF_HUB_OFFLINE=1
G=experiments/gpu_truth
pack() { tar czf "$OUT/results.tmp" --exclude='*.json.gz' -C "$W" . && mv "$OUT/results.tmp" "$OUT/results.tgz"; }
section() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s) $(date +%T)"
  timeout "$limit" "$@"; echo "=== $name rc=$? $(date +%T)"; pack; }
{
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
section record 150 python3 $G/record.py --out $W/measured.json --traces $W/traces --steps 20 --warmup 5 \
  --budget-s 110 --variants baseline,tf32,amp-bf16,amp-fp16,ckpt,accum2,accum4,fused-adam
cp $W/traces/*.json.gz "$OUT/" 2>/dev/null
section memory 90 python3 $G/record.py --out $W/memory.json --steps 10 --warmup 3 --budget-s 60 \
  --models gpt2-medium,gpt2-large,bert-large,bert-large-eager,bert-base-eager --variants baseline,amp-bf16
section attention 50 python3 $G/attention.py --out $W/attention.csv
section fsdp 80 python3 $G/fsdp_trace.py --out $W/fsdp
mv $W/fsdp/*.json.gz "$OUT/" 2>/dev/null
if [ -x .devbin/trainplan ]; then
  section calibrate 45 .devbin/trainplan calibrate -o $W/calibrated.yaml
fi
ls -la "$OUT"
} 2>&1 | tee "$OUT/log.txt"
