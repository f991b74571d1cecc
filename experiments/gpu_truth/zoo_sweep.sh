#!/usr/bin/env bash
# One lease of a GPU machine (the workplace's device tool): the zoo's CNNs as torchvision builds
# them, trained the way their recipes do (cuDNN benchmark on; the zoo's optimizer with PyTorch's
# foreach defaults), FP32 NCHW and bf16 autocast NHWC at a device-bound batch, each run's step
# time and its three memory peaks; the depthwise-conv models also in the two mixed layouts;
# Kineto traces (with shapes) of four bf16 NHWC runs. Each section has its own time limit and
# results are packed after each, so a run cut short keeps what it measured. Needs $OUT.
#   $OUT/results.tgz  cnn_zoo.json cnn_layouts.json
#   $OUT/traces.tar   <model>_amp-bf16-cl.json.gz
#   $OUT/log.txt      everything printed
set -uo pipefail
cd "$(dirname "$0")/../.."
W=/tmp/zoo_sweep; mkdir -p "$W/traces"
export PYTHONUNBUFFERED=1
G=experiments/gpu_truth
pack() { tar czf "$OUT/results.tmp" -C "$W" --exclude=traces . && mv "$OUT/results.tmp" "$OUT/results.tgz"
  tar cf "$OUT/traces.tmp" -C "$W/traces" . && mv "$OUT/traces.tmp" "$OUT/traces.tar"; }
section() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s) $(date +%T)"
  timeout "$limit" "$@"; echo "=== $name rc=$? $(date +%T)"; pack; }
CNNS=resnet18,resnet101,resnet152,resnext50-32x4d,vgg16,inception-v3,mobilenet-v2,efficientnet-b0,efficientnet-b4,convnext-tiny
{
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.draw --format=csv
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.get_device_name())"
section zoo 270 python3 $G/record.py --out $W/cnn_zoo.json --models $CNNS --variants baseline,amp-bf16-cl \
  --zoo-optimizer --cudnn-benchmark --steps 12 --warmup 4 --budget-s 230 \
  --traces $W/traces --trace-variants amp-bf16-cl --trace-models mobilenet-v2,efficientnet-b0,convnext-tiny,resnext50-32x4d
section layouts 80 python3 $G/record.py --out $W/cnn_layouts.json --models mobilenet-v2,efficientnet-b0 \
  --variants channels-last,amp-bf16 --zoo-optimizer --cudnn-benchmark --steps 12 --warmup 4 --budget-s 60
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
ls -la "$OUT"
} 2>&1 | tee "$OUT/log.txt"
