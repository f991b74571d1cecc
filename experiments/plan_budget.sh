#!/usr/bin/env bash
# Issue 13, finding 5: how far `plan --budget` overruns and how long Ctrl-C takes to act.
#
#   bash experiments/plan_budget.sh [BIN]        (BIN default: target/release/trainplan)
#
# 1. `--budget 10s` on inception-v3, 128xv100-rdma, --no-symmetry (full-graph replays of
#    ~seconds each): wall time of the whole command. Target: budget + ≤ 10 % + a few seconds.
# 2. The same job, SIGINT after 5 s: time from the signal to the process's exit, exit code,
#    and the plan written (its stop reason).
# 3. Two SIGINTs 5 ms apart: time to exit.
# Prints one line per measurement; wall-clock figures belong in reports, never in tests.
set -euo pipefail
bin="${1:-target/release/trainplan}"
tmp="$(mktemp -d)"
job=(plan --model inception-v3 --cluster 128xv100-rdma --no-symmetry)

start=$(date +%s.%N)
"$bin" "${job[@]}" --budget 10s -o "$tmp/budget.yaml" >/dev/null 2>&1 || true
end=$(date +%s.%N)
echo "budget 10s: wall $(echo "$end - $start" | bc) s, stop: $(grep -o 'stop: [a-z_]*' "$tmp/budget.yaml")"

"$bin" "${job[@]}" --budget 10m -o "$tmp/int.yaml" >/dev/null 2>&1 &
pid=$!
sleep 5
sent=$(date +%s.%N)
kill -INT "$pid"
set +e
wait "$pid"
code=$?
set -e
end=$(date +%s.%N)
echo "ctrl-c: exit $code $(echo "$end - $sent" | bc) s after SIGINT, stop: $(grep -o 'stop: [a-z_]*' "$tmp/int.yaml" 2>/dev/null || echo 'no plan')"

"$bin" "${job[@]}" --budget 10m -o "$tmp/twice.yaml" >/dev/null 2>&1 &
pid=$!
sleep 5
sent=$(date +%s.%N)
kill -INT "$pid"; sleep 0.005; kill -INT "$pid" 2>/dev/null || true
set +e
wait "$pid"
code=$?
set -e
end=$(date +%s.%N)
echo "ctrl-c twice: exit $code $(echo "$end - $sent" | bc) s after the first SIGINT"
rm -rf "$tmp"
