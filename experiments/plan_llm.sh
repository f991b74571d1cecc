#!/usr/bin/env bash
# Issue 24's search bench, as far as the planner goes today: `plan` for Llama 3 70B on 512 H100s
# (512xh100-ib) and Llama 3 405B on 16,384 H100s (16384xh100-ib), for --framework pytorch
# (FSDP2 as the memory step's sharding, AMP, recomputation of chosen layers, op fusion) and
# --framework torchtitan (the layout search: tensor parallelism 1-8 with sequence parallelism,
# FSDP2, full activation checkpointing, accumulation; --top 3) and --framework megatron (the
# same with the distributed optimizer for sharding, and 1F1B pipelines of every depth that
# divides the layers and the ranks, interleaved where that is faster; context parallelism where
# nothing fits or the fastest fit recomputes). A last row plans Llama 3 8B at one 131,072-token
# sequence per GPU on 64 H100s (--framework megatron), where context parallelism is chosen.
# Target (issue 24): 405B on 16,384 GPUs in <= 60 s on 2 cores.
#
#   bash experiments/plan_llm.sh [BIN]        (BIN default: target/release/trainplan)
#
# Writes experiments/results/plan_llm.md (and prints it): exit code, baseline and planned
# step, rounds and replays, MFU, device memory, wall time and peak resident memory of the
# whole command. Wall-clock and memory figures belong in reports, never in tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/trainplan}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out=experiments/results/plan_llm.md
rows=()
for job in "llama3-70b 512xh100-ib pytorch" "llama3-405b 16384xh100-ib pytorch" \
  "llama3-70b 512xh100-ib torchtitan" "llama3-405b 16384xh100-ib torchtitan" \
  "llama3-70b 512xh100-ib megatron" "llama3-405b 16384xh100-ib megatron" \
  "llama3-8b 64xh100-ib megatron --seq 131072 --batch 1 --precision bf16"; do
  read -r model cluster fw extra <<<"$job"
  # shellcheck disable=SC2086 # extra is a list of arguments
  /usr/bin/time -f '%e %M' -o "$tmp/time" "$bin" plan --model "$model" --cluster "$cluster" \
    --framework "$fw" $extra --top 3 -o "$tmp/p.yaml" --json >"$tmp/out.json" 2>"$tmp/err" && code=0 || code=$?
  read -r wall kb < <(tail -n 1 "$tmp/time")
  summary=$(python3 - "$tmp/out.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception:
    print("| — | — | — | — | — | — |")
    sys.exit(0)
mfu = v.get("mfu")
l = v.get("layout") or {}
layout = f"tp {l.get('tp')} · cp {l.get('cp')} · pp {l.get('pp')} · shard {l.get('dp_shard')} · repl {l.get('dp_replicate')} · micro {l.get('micro_batch')}"
if l.get("schedule"):
    layout += f" · {l['schedule']}"
print(f"| {v.get('baseline_iteration_ms', 0):.1f} | {v.get('planned_iteration_ms', 0):.1f} | "
      f"{layout} | "
      f"{v.get('rounds', '—')} / {v.get('replays', '—')} | "
      f"{'—' if mfu is None else f'{100 * mfu:.1f} %'} | "
      f"{v.get('planned_device_used_bytes', 0) / 1e9:.1f} GB |")
PY
)
  if [ "$code" = 4 ]; then
    # Infeasible: the smallest peak reached, from the message.
    why=$(grep -o 'the smallest peak reached is [0-9.]* GB[^;]*' "$tmp/err" | head -n 1 || true)
    summary="| — | — | ${why:-—} | — | — | — |"
  fi
  label="$model"
  [ -n "${extra:-}" ] && label="$model ${extra}"
  rows+=("| $label | $cluster | $fw | $code $summary $wall s | $((kb / 1024)) MiB |")
done
{
  echo "# plan for Llama 3 70B and 405B, and 8B at 131,072 tokens (issue 24)"
  echo
  echo "\`bash experiments/plan_llm.sh\` on $(nproc) cores, $(date -u +%Y-%m-%d)."
  echo
  echo "| model | cluster | framework | exit | baseline ms | planned ms | layout | rounds / replays | MFU | device used | wall | peak RSS |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
