#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 3 minutes): NEW against BASE at the four dispatched splits, two
# processes ($NAME.json, ${NAME}_2.json; prediction bench.SMALL_PREDICTIONS[NAME], both), M = 1, 2, 3, 4, 8, 9, 16, both
# routings; then NEW's gpu tests and memcheck / racecheck. Defaults (the first use): NEW=x4e_r3 BASE=x4e NAME=moe_small_r3
# (the 3-stage ring against the 4-stage one); then NEW=x4e_r3f BASE=x4e_r3 NAME=moe_small_r3f.
# Everything under $OUT/r3.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [NEW=.. BASE=.. NAME=..] [PATHS_OVERRIDE=".."]
# [CHECKS=0] bash workbench/moe/h200_r3.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin r3
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
PATHS="four_launch"
NEW=${NEW:-x4e_r3}; BASE=${BASE:-x4e}; NAME=${NAME:-moe_small_r3}
for sfx in "" _g4d1 _g2d1 _g1d1; do PATHS="$PATHS ctasplit_$BASE$sfx ctasplit_$NEW$sfx"; done
PATHS=${PATHS_OVERRIDE:-$PATHS}   # another path list (run 23's split sweep); CHECKS=0 skips NEW's tests and sanitizers
for name in $NAME ${NAME}_2; do
  timeout 200 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
    --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -16 "$R/logs/compare_$name.txt" | cut -c1-250
done
[ "${CHECKS:-1}" = 0 ] && exit 0
timeout 170 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "$NEW" -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1 &
san memcheck "ctasplit_$NEW ctasplit_${NEW}_g1d1" &
san racecheck "ctasplit_$NEW" &
wait
tail -3 "$R/logs/gpu_tests.txt"
grep -hE "SUMMARY|rc=|checks" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -6
echo "total $(( $(date +%s) - T0 )) s"
