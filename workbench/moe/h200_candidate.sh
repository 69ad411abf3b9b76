#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 5-9 minutes): a candidate one-launch kernel against the dispatch.
# Its gpu tests (pytest -k "$TEST_K") beside compute-sanitizer memcheck ($SAN_MEM) and racecheck ($SAN_RACE); then,
# unless a test failed, two processes of the comparison at M = $MS with every one-launch path also timed queued and
# in-graph ($NAME.json, ${NAME}_2.json; prediction bench.SMALL_PREDICTIONS[$NAME]); then, where set, the timeline of
# $TRACE_VARIANTS at M = 1 (workbench.moe.trace: moe_ctasplit_trace_$NAME.json) and the phased forms' breakdown of
# $BREAKDOWN_VARIANTS at M = $BREAKDOWN_MS (workbench.moe.phased: moe_phased_breakdown_$BREAKDOWN_NAME.json).
# Everything under $OUT/$NAME.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> NAME=moe_small_ew PATHS="four_launch ..." TEST_K=epilogue_warp
#        SAN_MEM="v1 v2" SAN_RACE="v1" [TRACE_VARIANTS="v1 ctasplit_x4e_r3fst"] [MS="1 2"]
#        [BREAKDOWN_VARIANTS="phased_r3_pdl v1" BREAKDOWN_MS="1 2" BREAKDOWN_NAME=pf] bash workbench/moe/h200_candidate.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin "$NAME"
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
san memcheck "$SAN_MEM" &
san racecheck "$SAN_RACE" &
timeout ${TEST_T:-240} python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "$TEST_K" -x -p no:cacheprovider \
  > "$R/logs/gpu_tests.txt" 2>&1
rc=$?
wait
echo "gpu tests rc=$rc $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/gpu_tests.txt" | cut -c1-300
grep -hE "SUMMARY|rc=" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -4
[ $rc = 0 ] || exit 1
for name in $NAME ${NAME}_2; do
  timeout ${COMPARE_T:-150} python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m ${MS:-1 2} \
    --in-graph-all --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -8 "$R/logs/compare_$name.txt" | cut -c1-250
done
if [ -n "${TRACE_VARIANTS:-}" ]; then
  timeout ${TRACE_T:-90} python3 -u -m workbench.moe.trace --m 1 --variants $TRACE_VARIANTS \
    --name moe_ctasplit_trace_$NAME --out "$R" > "$R/logs/trace.txt" 2>&1
  echo "trace rc=$? $(( $(date +%s) - T0 )) s"; tail -6 "$R/logs/trace.txt" | cut -c1-420
fi
if [ -n "${BREAKDOWN_VARIANTS:-}" ]; then
  timeout ${BREAKDOWN_T:-120} python3 -u -m workbench.moe.phased --m ${BREAKDOWN_MS:-1 2} --variants $BREAKDOWN_VARIANTS \
    --name moe_phased_breakdown_${BREAKDOWN_NAME:-$NAME} --out "$R" > "$R/logs/breakdown.txt" 2>&1
  echo "breakdown rc=$? $(( $(date +%s) - T0 )) s"; tail -12 "$R/logs/breakdown.txt" | cut -c1-250
fi
