#!/usr/bin/env bash
# Part 5 of the lower-bound issue, on a machine with an NVIDIA GPU: calibrate the GPU, measure
# ResNet-50 and BERT-base with PyTorch, and compare every measurement with trainplan's bounds
# (analytic from the built-in config, analytic from the calibrated profile, and measured layer
# by layer). Writes everything under experiments/results/gpu/. See README.md in this folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/results/gpu
GPU=${GPU:-h200}            # the built-in config to compare with
mkdir -p "$OUT"
cargo build --release --features gpu
TP=target/release/trainplan
[ -n "${CARGO_TARGET_DIR:-}" ] && TP="$CARGO_TARGET_DIR/release/trainplan"

"$TP" calibrate -o "$OUT/calibrated.yaml" 2> "$OUT/calibrate.log"
python3 experiments/benanza_gpu/measure.py --out "$OUT" | tee "$OUT/measure.log"

python3 - "$TP" "$OUT" "$GPU" <<'PY'
import json, subprocess, sys
tp, out, gpu = sys.argv[1:]
runs = json.load(open(f"{out}/measured.json"))["runs"]
rows = ["| model | dtype | batch | measured inference ms | bound (config) | BR | bound (calibrated) | BR | bound (measured DB) | BR |",
        "|---|---|---|---|---|---|---|---|---|---|"]
for r in runs:
    model = f"{out}/{r['model']}.onnx"
    common = ["lower-bound", model, "--batch", str(r["batch"]), "--dtype", r["dtype"], "--json",
              "--measured-ms", str(r["inference_ms"])]
    def bound(*extra):
        p = subprocess.run([tp, *common, *extra], capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip()
        v = json.loads(p.stdout)
        return v["sequential_ms"], None
    cells = []
    for extra in (["--gpu", gpu], ["--gpu", f"{out}/calibrated.yaml"],
                  ["--gpu", f"{out}/calibrated.yaml", "--db", f"{out}/perf.json", "--measure"]):
        ms, err = bound(*extra)
        cells += ["error: " + err, ""] if ms is None else [f"{ms:.3f}", f"{ms / r['inference_ms']:.2f}"]
    rows.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['inference_ms']:.3f} | " + " | ".join(cells) + " |")
open(f"{out}/comparison.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
for m in resnet50 bert_base; do
  "$TP" lower-bound "$OUT/$m.onnx" --batch 32 --gpu "$OUT/calibrated.yaml" \
    --trace "$OUT/${m}_b32_fp32_inference.json" > "$OUT/${m}_b32_trace_report.txt" || true
done
echo "results in $OUT"
