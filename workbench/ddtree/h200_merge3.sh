#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 2 minutes): the one-pass merge (VERIFY_MERGE_V3,
# verify_bench.MERGE3_VARIANTS). Every gpu test of verify and memcheck of the merge in parallel; then alone the in-graph
# breakdown of the default and merge3 (ddtree_verify_probe_merge3.json) and the benchmark of both at the eight points (no
# peers, no parity grid; ddtree_verify_merge3.json). $OUT/merge3.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/ddtree/h200_merge3.sh
set -u
source "$(dirname "$0")/../moe/h200_common.sh"
h200_begin merge3
SNIP="import torch; from workbench.ddtree import verify as V, verify_bench as VB
kw = VB.MERGE3_VARIANTS['merge3']
for i, (h, p) in enumerate(((8, 4133), (64, 777), (8, [0, 500, 70, 2000]))):
    st = V.random_verify_inputs(33, h, p, torch.bfloat16, 'cuda', seed=i)
    fn = V.verify_attention_batched if isinstance(p, list) else V.verify_attention
    o, l = fn(**st, **kw); torch.cuda.synchronize(); print('case', i, bool(torch.isfinite(o).all()))"
( timeout 150 compute-sanitizer --tool memcheck --kernel-name kns=ddtree_verify_merge python3 -c "$SNIP" > "$R/logs/memcheck.txt" 2>&1
  echo "memcheck rc=$?" >> "$R/logs/memcheck.txt" ) &
( timeout 150 python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt" ) &
wait
timeout 120 python3 -m workbench.ddtree.verify_probe --out "$R" --name ddtree_verify_probe_merge3 --in-graph --reps 30 \
  --sweep --points 8:4096 8:16384 8:131072 64:4096 64:131072 --variants default merge3 > "$R/logs/probe.txt" 2>&1
echo "probe rc=$?" >> "$R/logs/probe.txt"
PRED=$(python3 -c "from workbench.ddtree.verify_bench import MERGE3_PREDICTION as p; print(p)")
timeout 200 python3 -m workbench.ddtree.verify_bench --out "$R" --name ddtree_verify_merge3 --variants merge3 --peers \
  --no-parity --reps 30 --extra-notes "Prediction: $PRED" > "$R/logs/bench.txt" 2>&1
echo "bench rc=$?" >> "$R/logs/bench.txt"
echo "== gpu tests"; tail -3 "$R/logs/gpu_tests.txt"
echo "== memcheck"; grep -hE "SUMMARY|rc=|case" "$R/logs/memcheck.txt"
echo "== probe"; tail -14 "$R/logs/probe.txt"
echo "== bench"; tail -12 "$R/logs/bench.txt"
