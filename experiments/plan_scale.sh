#!/usr/bin/env bash
# Issue 20, class 2: `plan` on the everyday jobs that panicked in the search (tensor-fusion shown
# a lean evaluation by the advice step), up to 65,536 GPUs: exit code, stop reason, headline,
# wall time and peak resident memory of the whole command.
#
#   bash experiments/plan_scale.sh [BIN]        (BIN default: target/release/trainplan)
#
# Target (issue 20): every job plans (exit 0, a plan written); the 65,536-GPU plans (8,192
# nodes x 8 V100 or H100) stay under 8 GiB. Writes experiments/results/plan_scale.md (and
# prints it). Wall-clock and memory figures belong in reports, never in tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/trainplan}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out=experiments/results/plan_scale.md
# The two 65,536-GPU clusters: the built-in 16-node V100 and 8-node H100 clusters, 8,192 nodes.
sed 's/^name: .*/name: 65536xv100-rdma/; s/^nodes: .*/nodes: 8192/' configs/clusters/128xv100-rdma.yaml >"$tmp/65536xv100.yaml"
sed 's/^name: .*/name: 65536xh100-ib/; s/^nodes: .*/nodes: 8192/' configs/clusters/64xh100-ib.yaml >"$tmp/65536xh100.yaml"

jobs=(
  "--model bert-large --cluster 128xv100-rdma"
  "--model bert-base --cluster 128xv100-rdma"
  "--model resnet50 --cluster 128xv100-rdma"
  "--model gpt --cluster 128xv100-rdma"
  "--model bert-base --cluster 128xv100-rdma --no-symmetry"
  "--model gpt --layers 36 --hidden 1280 --heads 20 --cluster 64xh100-ib"
  "--model inception-v3 --cluster 64xh100-ib --no-symmetry"
  "--model bert-base --cluster $tmp/65536xv100.yaml"
  "--model bert-base --cluster $tmp/65536xh100.yaml"
)
rows=()
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  /usr/bin/time -f '%e %M' -o "$tmp/time" "$bin" plan $j -o "$tmp/p.yaml" --json >"$tmp/out.json" 2>"$tmp/err" && code=0 || code=$?
  read -r wall kb <"$tmp/time"
  summary=$(python3 - "$tmp/out.json" <<'EOF'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    print(f"{v['stop_reason']} | {v['baseline_iteration_ms']} → {v['planned_iteration_ms']} ms | {v['replays']}")
except Exception:
    print("— | — | —")
EOF
)
  shown=${j//$tmp\//}
  rows+=("| \`plan $shown\` | $code | $summary | $wall s | $(printf '%.2f' "$(echo "$kb / 1048576" | bc -l)") GiB |")
done

{
  echo "# plan on everyday jobs up to 65,536 GPUs (issue 20)"
  echo
  echo "\`bash experiments/plan_scale.sh\` on $(uname -m), $(nproc) cores, $(date -u +%Y-%m-%d); binary: \`$bin\`"
  echo "(commit $(git rev-parse --short HEAD)). Peak memory is the command's maximum resident set"
  echo "(\`/usr/bin/time\`); wall time depends on what else the machine runs."
  echo
  echo "| command | exit | stop | baseline → planned | replays | wall | peak memory |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
