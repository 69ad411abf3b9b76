#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 8 minutes): run 25, the warp-split kernel. First its gpu tests
# (parity, bit-identical to the CTA-split kernel, edge cases, graph replays, determinism) with memcheck and racecheck,
# then, unless a test failed, two processes of the comparison (moe_small_wsplit.json, moe_small_wsplit_2.json;
# prediction bench.SMALL_WSPLIT_PREDICTION) of the dispatched paths against wsplit at M = 1, 2, 3, 4, 8, 9, 16.
# Everything under $OUT/wsplit.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [PATHS_OVERRIDE=".."] bash workbench/moe/h200_wsplit.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin wsplit
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "wsplit" -x -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
rc=$?
echo "gpu tests rc=$rc $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/gpu_tests.txt" | cut -c1-300
[ $rc = 0 ] || exit 1
san memcheck "wsplit_r3 wsplit_r3_g1d1" &
san racecheck "wsplit_r3" &
wait
grep -hE "SUMMARY|rc=" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -4
PATHS="four_launch ctasplit_x4e_r3fst ctasplit_x4e_r3f_g4d1 ctasplit_x4e_r3f_g2d1 ctasplit_x4e_r3_g1d1 wsplit_r3 wsplit_r4"
PATHS="$PATHS wsplit_r3_g4d1 wsplit_r3_g2d1 wsplit_r3_g1d1"
PATHS=${PATHS_OVERRIDE:-$PATHS}
for name in moe_small_wsplit moe_small_wsplit_2; do
  timeout 200 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
    --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -16 "$R/logs/compare_$name.txt" | cut -c1-250
done
echo "total $(( $(date +%s) - T0 )) s"
