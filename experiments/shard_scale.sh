#!/usr/bin/env bash
# Issue 23's bench: `plan` for a 7 B GPT-style model on 512 GPUs (64 DGX H100 nodes) with
# sharding, per framework that shards (pytorch FSDP2, deepspeed ZeRO, torchtitan): exit code,
# the plan's sharding, headline, wall time and peak resident memory of the whole command.
#
#   bash experiments/shard_scale.sh [BIN]        (BIN default: target/release/trainplan)
#
# Target (issue 23): each plan in <= 30 s on 2 cores. The 7 B stand-in is the zoo's GPT
# decoder at LLaMA-7B's width and depth (hidden 4096, 32 layers, 32 heads, sequence 2048 (LLaMA-1's context),
# vocabulary 32,000; GPT-2's MLP and learned positions, not LLaMA's SwiGLU and RoPE), at 1
# sequence per GPU in FP32 as the baseline (the plan chooses the precision). Writes
# experiments/results/shard_scale.md (and prints it). Wall-clock and memory figures belong in
# reports, never in tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/trainplan}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out=experiments/results/shard_scale.md
sed 's/^name: .*/name: 512xh100-ib/; s/^nodes: .*/nodes: 64/; s/^description: .*/description: 64 x 8 H100-SXM-80GB, NVLink 4.0 inside, 8 x 400 Gb\/s InfiniBand per server/' \
  configs/clusters/64xh100-ib.yaml >"$tmp/512xh100-ib.yaml"
model="--model gpt --hidden 4096 --layers 32 --heads 32 --seq 2048 --vocab 32000 --batch 1"
rows=()
for fw in pytorch deepspeed torchtitan; do
  # shellcheck disable=SC2086
  /usr/bin/time -f '%e %M' -o "$tmp/time" "$bin" plan $model --cluster "$tmp/512xh100-ib.yaml" \
    --framework "$fw" -o "$tmp/p.yaml" --json >"$tmp/out.json" 2>"$tmp/err" && code=0 || code=$?
  # time(1) writes "Command exited with non-zero status N" first when the command fails.
  read -r wall kb < <(tail -n 1 "$tmp/time")
  summary=$(python3 - "$tmp/out.json" "$tmp/p.yaml" <<'PY'
import json, re, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception:
    print("| — | — | — | — | — |")
    sys.exit(0)
text = open(sys.argv[2]).read() if v.get("plan_path") else ""
m = re.search(r"sharding:\n((?:    .*\n)+)", text)
shard = "none"
if m:
    kv = dict(l.strip().split(": ", 1) for l in m.group(1).splitlines() if ": " in l)
    shard = f"stage {kv.get('stage')}, {kv.get('shard_size')} x {kv.get('replicas')}, reshard {kv.get('reshard')}"
start = next((d["pass"] for d in v.get("decisions", []) if d["pass"].startswith("baseline:")), "—")
print(f"| {v.get('baseline_iteration_ms', 0):.1f} | {v.get('planned_iteration_ms', 0):.1f} | {start} | {shard} | {v.get('planned_device_used_bytes', 0) / 1e9:.1f} GB |")
PY
)
  rows+=("| $fw | $code $summary $wall s | $((kb / 1024)) MiB |")
done
{
  echo "# plan for a 7 B model on 512 GPUs with sharding (issue 23)"
  echo
  echo "\`bash experiments/shard_scale.sh\` on $(nproc) cores, $(date -u +%Y-%m-%d). Model: $model; cluster: 64 x 8 H100 (64xh100-ib with 64 nodes)."
  echo
  echo "| framework | exit | baseline ms | planned ms | start | sharding | device used | wall | peak RSS |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
