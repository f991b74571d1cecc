#!/usr/bin/env bash
# Lazy rounds against full rounds (issue 28): `plan` with and without `--no-lazy` on the zoo
# models, clusters and frameworks of the README's examples, with and without symmetry. For
# each job: the planned step of each walk, its rounds and replays, the search's wall time (from
# the text report), and whether the two plans' decisions are the same.
#
#   bash experiments/lazy_rounds.sh [BIN]        (BIN default: target/release/trainplan)
#
# Writes experiments/results/lazy_rounds.md (and prints it). Wall-clock figures belong in
# reports, never in tests; the plans and replay counts do not depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/trainplan}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out=experiments/results/lazy_rounds.md
jobs=(
  "--model resnet50 --cluster dpro-16xv100-rdma"
  "--model vgg16 --cluster dpro-16xv100-rdma"
  "--model inception-v3 --cluster dpro-16xv100-rdma"
  "--model bert-base --cluster dpro-16xv100-rdma"
  "--model bert-large --cluster dpro-16xv100-rdma"
  "--model resnet50 --cluster dpro-16xv100-tcp"
  "--model vgg16 --cluster dpro-16xv100-tcp"
  "--model bert-base --cluster dpro-16xv100-tcp"
  "--model gpt --cluster 8xv100"
  "--model resnet50 --cluster 8xv100"
  "--model bert-base --cluster 64xh100-ib"
  "--model inception-v3 --cluster 64xh100-ib"
  "--model gpt --cluster 64xh100-ib"
  "--model resnet50 --cluster 2xa100"
  "--model bert-large --cluster 128xv100-rdma"
  "--model vgg16 --cluster 8xh200"
  "--model resnet50 --cluster 8xv100 --framework jax"
  "--model gpt --cluster 8xv100 --framework megatron"
  "--model llama3-8b --cluster 64xh100-ib --framework megatron"
  "--model llama3-8b --cluster 64xh100-ib --framework torchtitan"
  "--model resnet50 --cluster dpro-16xv100-rdma --no-symmetry"
  "--model vgg16 --cluster dpro-16xv100-rdma --no-symmetry"
  "--model bert-base --cluster dpro-16xv100-rdma --no-symmetry"
  "--model bert-large --cluster dpro-16xv100-rdma --no-symmetry"
)
rows=()
for job in "${jobs[@]}"; do
  for mode in lazy full; do
    extra=()
    [ "$mode" = full ] && extra=(--no-lazy)
    # shellcheck disable=SC2086
    "$bin" plan $job "${extra[@]}" -o "$tmp/$mode.yaml" >"$tmp/$mode.txt" 2>&1 || {
      echo "failed: plan $job ${extra[*]}" >&2
      cat "$tmp/$mode.txt" >&2
      exit 1
    }
  done
  row=$(python3 - "$tmp" <<'PY'
import re, sys
d = sys.argv[1]
def read(mode):
    text = open(f"{d}/{mode}.txt").read()
    m = re.search(r"search: \S+, (\d+) replays in (\d+) rounds, ([0-9.]+) s", text)
    planned = float(re.search(r"iteration_ms: ([0-9.]+)", open(f"{d}/{mode}.yaml").read().split("planned:")[1]).group(1))
    plan = open(f"{d}/{mode}.yaml").read()
    decisions = plan.split("\ndecisions:")[1].split("\nadvice:")[0] if "\ndecisions:" in plan else ""
    return planned, int(m.group(1)), int(m.group(2)), float(m.group(3)), decisions
lp, lr, lrd, lw, ld = read("lazy")
fp, fr, frd, fw, fd = read("full")
same = "same" if ld == fd else ("extends" if ld.startswith(fd.rstrip()) else "differs")
print(f"| {fp:.3f} | {lp:.3f} | {100 * (lp - fp) / fp:+.2f} % | {frd} / {fr} | {lrd} / {lr} | "
      f"{fw:.1f} | {lw:.1f} | {same} |")
PY
)
  rows+=("| \`$job\` $row")
done
{
  echo "# Lazy rounds against full rounds (issue 28)"
  echo
  echo "\`bash experiments/lazy_rounds.sh\` on $(nproc) cores, $(date -u +%Y-%m-%d), release build."
  echo "Each job planned twice: with every move of every round evaluated (\`--no-lazy\`, full) and"
  echo "with lazy rounds (the default). Decisions: *same* plan; *extends*: the lazy walk took the full"
  echo "walk's decisions and more (its extra round over every move found another gain); *differs*:"
  echo "another walk (a skipped move would have gained more than its last gain said)."
  echo
  echo "| \`plan …\` | full ms | lazy ms | lazy vs full | full rounds / replays | lazy rounds / replays | full s | lazy s | decisions |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
