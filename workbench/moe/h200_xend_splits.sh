#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 2.5 minutes): run 17, ctasplit_x4e at fixed splits at M = 1-4
# (prediction bench.SMALL_XEND_SPLITS_PREDICTION): the comparison twice in two processes (moe_small_xend_splits.json,
# moe_small_xend_splits_2.json); in parallel afterwards the gpu parity tests of the fixed-split variants and memcheck
# of the three new ones. Everything under $OUT/xend_splits.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_xend_splits.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin xend_splits
T0=$(date +%s)
PATHS="four_launch splitk_s4x4e ctasplit_x4e ctasplit_x4e_g1d1 ctasplit_x4e_g2d1 ctasplit_x4e_g4d1 ctasplit_x4e_g2d2"
for name in moe_small_xend_splits moe_small_xend_splits_2; do
  timeout 120 python3 -u -m workbench.moe.bench --small-compare $name --m 1 2 3 4 --out "$R" --reps 20 \
    --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -10 "$R/logs/compare_$name.txt"
done
(timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "fixed_splits" -p no:cacheprovider \
  > "$R/logs/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt") &
(timeout 150 compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize --variants none \
  --small-variants ctasplit_x4e_g2d1 ctasplit_x4e_g4d1 ctasplit_x4e_g2d2 > "$R/logs/memcheck.txt" 2>&1;
  echo "memcheck rc=$?" >> "$R/logs/memcheck.txt") &
wait
tail -2 "$R/logs/gpu_tests.txt"; grep -hE "SUMMARY|rc=|checks" "$R/logs/memcheck.txt" | tail -3
echo "total $(( $(date +%s) - T0 )) s"
