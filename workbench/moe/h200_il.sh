#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 9 minutes): run 27, the interleaved task order of the CTA-split
# kernel (x4e_r3fsti, x4e_r3fsti2). Its gpu tests (parity, bit-identical to x4e_r3fst, edge cases, graph replays) beside
# compute-sanitizer memcheck and racecheck; then, unless a test failed, two processes of the comparison at M = 1-2
# with every one-launch path also timed queued and in-graph (moe_small_il.json, moe_small_il_2.json; prediction
# bench.SMALL_IL_PREDICTION); then the timeline of x4e_r3fsti at M = 1 (moe_ctasplit_trace_il.json).
# Everything under $OUT/il.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_il.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin il
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
san memcheck "ctasplit_x4e_r3fsti ctasplit_x4e_r3fsti2_g4d1" &
san racecheck "ctasplit_x4e_r3fsti" &
timeout 240 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "interleaved" -x -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
rc=$?
wait
echo "gpu tests rc=$rc $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/gpu_tests.txt" | cut -c1-300
grep -hE "SUMMARY|rc=" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -4
[ $rc = 0 ] || exit 1
PATHS="four_launch ctasplit_x4e_r3fst ctasplit_x4e_r3fsti ctasplit_x4e_r3fsti2 ctasplit_x4e_r3fst_g4d1 ctasplit_x4e_r3fsti_g4d1"
PATHS=${PATHS_OVERRIDE:-$PATHS wsplit_r3_g2d1}
for name in moe_small_il moe_small_il_2; do
  timeout ${COMPARE_T:-150} python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m 1 2 \
    --in-graph-all --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -6 "$R/logs/compare_$name.txt" | cut -c1-250
done
timeout 60 python3 -u -m workbench.moe.trace --m 1 --variants ctasplit_x4e_r3fsti ctasplit_x4e_r3fst \
  --name moe_ctasplit_trace_il --out "$R" > "$R/logs/trace.txt" 2>&1
echo "trace rc=$? $(( $(date +%s) - T0 )) s"; tail -5 "$R/logs/trace.txt" | cut -c1-400
