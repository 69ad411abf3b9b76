#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4 minutes): run 16, the x4 kernels with the next stage's
# activations loaded after the stage's last step (XEND; prediction bench.SMALL_XEND_PREDICTION):
#   1. the comparison twice, in two processes (moe_small_xend.json, moe_small_xend_2.json): four launches, splitk_s4,
#      splitk_s4x4(e), ctasplit_x4(e), ctasplit_x4(e)_g1d1, M = 1-16, both routings;
#   2. the gpu tests of the x4 kernels (-k x4); memcheck of the three XEND variants and racecheck of ctasplit_x4e and
#      splitk_s4x4e, in parallel;
#   3. per-instruction profiles of ctasplit_x4e at M = 1 and ctasplit_x4e_g1d1 at M = 16.
# Everything under $OUT/xend.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_xend.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin xend
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
PATHS="four_launch splitk_s4 splitk_s4x4 splitk_s4x4e ctasplit_x4 ctasplit_x4e ctasplit_x4_g1d1 ctasplit_x4e_g1d1"
for name in moe_small_xend moe_small_xend_2; do
  timeout 150 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --small-paths $PATHS \
    > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -14 "$R/logs/compare_$name.txt"
done
timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "x4" -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt"; tail -2 "$R/logs/gpu_tests.txt"
san memcheck "splitk_s4x4e ctasplit_x4e ctasplit_x4e_g1d1" &
san racecheck "ctasplit_x4e" &
san racecheck "splitk_s4x4e" &
wait
grep -hE "SUMMARY|rc=|checks" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -9
SPECS="ctasplit_x4e:1 ctasplit_x4e_g1d1:16" OUT="$R/profile" bash workbench/moe/h200_profile_dispatched.sh \
  > "$R/logs/profile.txt" 2>&1
tail -10 "$R/logs/profile.txt"; echo "total $(( $(date +%s) - T0 )) s"
