#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4 minutes): run 15, the x4 CTA-split kernel at 4 CTAs per SM
# (moe_small_ctasplit_x4_b4; prediction bench.SMALL_X4_B4_PREDICTION):
#   1. the comparison twice, in two processes (moe_small_x4_b4.json, moe_small_x4_b4_2.json): four launches, splitk_s4,
#      splitk_s4x4, ctasplit_x4, ctasplit_x4_b4 and both at the fixed split (1, 1), M = 1-16, both routings;
#   2. the gpu tests of the x4 kernels (-k x4); memcheck of both b4 variants and racecheck of ctasplit_x4_b4, in parallel;
#   3. per-instruction profile and summary of ctasplit_x4_b4 at M = 1 (h200_profile_dispatched.sh, SPECS).
# Everything under $OUT/x4_b4.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_x4_b4.sh
set -u
OUT=${OUT:-out}
R=$(mktemp -d)
mkdir -p "$OUT" "$R/logs"
trap 'tar czf "$OUT/x4_b4.tgz" -C "$R" . ; ls -la "$OUT"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
PATHS="four_launch splitk_s4 splitk_s4x4 ctasplit_x4 ctasplit_x4_b4 ctasplit_x4_g1d1 ctasplit_x4_b4_g1d1"
for name in moe_small_x4_b4 moe_small_x4_b4_2; do
  timeout 150 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --small-paths $PATHS \
    > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -14 "$R/logs/compare_$name.txt"
done
timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "x4" -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt"; tail -2 "$R/logs/gpu_tests.txt"
san() {  # tool, variants
  timeout 170 compute-sanitizer --tool $1 python3 -u -m workbench.moe.bench --sanitize --variants none \
    --small-variants $2 > "$R/logs/${1}_${2// /_}.txt" 2>&1
  echo "$1 rc=$?" >> "$R/logs/${1}_${2// /_}.txt"
}
san memcheck "ctasplit_x4_b4 ctasplit_x4_b4_g1d1" &
san racecheck "ctasplit_x4_b4" &
wait
grep -hE "SUMMARY|rc=|checks" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -6
SPECS="ctasplit_x4_b4:1" OUT="$R/profile" bash workbench/moe/h200_profile_dispatched.sh > "$R/logs/profile.txt" 2>&1
tail -6 "$R/logs/profile.txt"; echo "total $(( $(date +%s) - T0 )) s"
