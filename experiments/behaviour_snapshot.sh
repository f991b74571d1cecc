#!/usr/bin/env bash
# What trainplan prints and writes on the built-in examples and the shared traces, with the
# fields that depend on the clock or the output path removed: run it on two builds and `diff -r`
# the folders to check that a refactoring changed no behaviour (issue 25).
#
#   experiments/behaviour_snapshot.sh target/release/trainplan /tmp/before
#   ... change the code, cargo build --release ...
#   experiments/behaviour_snapshot.sh target/release/trainplan /tmp/after
#   diff -r /tmp/before /tmp/after && echo unchanged
#
# Covers replay / whatif / plan (--max-rounds, never a wall-clock budget) / show / export on
# every zoo model, the framework baselines, and replay / whatif / plan on ../shared/traces when
# it is there. `fidelity --check` (tests/it/fidelity.rs) covers the fidelity figures.
set -u
bin=$(realpath "$1")
out=$2
shared=${SHARED:-$(dirname "$(realpath "$0")")/../../shared}
rm -rf "$out"
mkdir -p "$out"
cd "$out" || exit 1
# Drop wall-clock and path fields from JSON; keep everything else byte for byte.
clean() { jq -S 'walk(if type == "object" then with_entries(select(.key | test("wall|_path$|elapsed|seconds") | not)) else . end)' 2>/dev/null || cat; }
run() { # name, args...
    local name=$1; shift
    "$bin" "$@" >"$name.out" 2>"$name.err"
    echo "exit $?" >>"$name.err"
    if grep -q '^[{[]' "$name.out" 2>/dev/null; then clean <"$name.out" >"$name.json" && rm "$name.out"; fi
    # stderr: drop progress and timing lines
    sed -E 's/^[0-9T:.-]+Z +//' "$name.err" | grep -v -E 'elapsed|[0-9.]+ ?s\b|searching|round [0-9]' >"$name.stderr"; rm "$name.err"
}
for m in bert-base bert-large gpt inception-v3 resnet50 vgg16; do
    for c in dpro-16xv100-rdma 64xh100-ib; do
        run "replay-$m-$c" replay --model "$m" --cluster "$c" --json
        run "whatif-$m-$c" whatif --model "$m" --cluster "$c" --pass amp --pass recompute --json
        run "plan-$m-$c" plan --model "$m" --cluster "$c" --max-rounds 100 --json -o "plan-$m-$c.yaml"
    done
done
for fw in pytorch tf jax horovod byteps; do
    run "plan-fw-$fw" plan --model resnet50 --cluster 8xv100 --framework "$fw" --max-rounds 100 --json -o "plan-fw-$fw.yaml"
    run "export-$fw" export --to "$fw" "plan-fw-$fw.yaml" -o "export-$fw"
done
run plan-memory plan --model gpt --hidden 16384 --heads 16 --layers 4 --cluster 8xv100 --json -o plan-memory.yaml
run plan-budgeted plan --model bert-large --cluster 8xv100 --memory-budget 12GB --max-rounds 100 --json -o plan-budgeted.yaml
run show show plan-bert-base-dpro-16xv100-rdma.yaml
if [ -d "$shared/traces" ]; then
    t=$shared/traces
    for f in "$t"/pytorch-kineto/*.json.gz; do
        n=$(basename "$f" .json.gz)
        run "trace-replay-$n" replay --trace "$f" --json
        run "trace-whatif-$n" whatif --trace "$f" --pass amp --json
        run "trace-plan-$n" plan --trace "$f" --max-rounds 100 --json -o "trace-plan-$n.yaml"
    done
    run trace-replay-dlrm replay --trace "$t/multi-rank-dlrm" --json
    run trace-plan-dlrm plan --trace "$t/multi-rank-dlrm" --max-rounds 100 --json -o trace-plan-dlrm.yaml
    run trace-replay-chakra replay --trace "$t/execution-traces/resnet_ddp_rank0.chakra.et" --json
fi
# Plans and exports: drop lines that carry a time or a path.
find . -type f \( -name '*.yaml' -o -name '*.py' -o -name '*.env' -o -name '*.md' \) -exec sed -i -E '/search_wall|wall_s|elapsed|created/d' {} +
echo "snapshot of $(find . -type f | wc -l) files in $out"
