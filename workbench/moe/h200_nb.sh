#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 5 minutes): run 26, the CTA-split kernel without its block
# barrier (x4e_r3nb). First its gpu tests with memcheck and racecheck, then, unless a test failed, two processes of
# the comparison (moe_small_nb.json, moe_small_nb_2.json; prediction bench.SMALL_NB_PREDICTION) of the dispatched
# paths against x4e_r3nb at four splits, M = 1, 2, 3, 4, 8, 9, 16.
# Everything under $OUT/nb.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [PATHS_OVERRIDE=".."] bash workbench/moe/h200_nb.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin nb
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "nb_" -x -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
rc=$?
echo "gpu tests rc=$rc $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/gpu_tests.txt" | cut -c1-300
[ $rc = 0 ] || exit 1
san memcheck "ctasplit_x4e_r3nb ctasplit_x4e_r3nb_g1d1" &
san racecheck "ctasplit_x4e_r3nb" &
wait
grep -hE "SUMMARY|rc=" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -4
PATHS="four_launch ctasplit_x4e_r3fst wsplit_r3_g2d1 wsplit_r3_g1d1 ctasplit_x4e_r3nb ctasplit_x4e_r3nb_g4d1"
PATHS="$PATHS ctasplit_x4e_r3nb_g2d1 ctasplit_x4e_r3nb_g1d1"
PATHS=${PATHS_OVERRIDE:-$PATHS}
for name in moe_small_nb moe_small_nb_2; do
  timeout 200 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
    --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -16 "$R/logs/compare_$name.txt" | cut -c1-250
done
echo "total $(( $(date +%s) - T0 )) s"
