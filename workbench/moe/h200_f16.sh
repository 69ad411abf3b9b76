#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 6 minutes): run 18, the gate_up stage loop on fp16 activations
# (ctasplit_x4eh; prediction bench.SMALL_F16_PREDICTION):
#   1. the comparison in one process (moe_small_f16.json): four launches, the dispatched paths and their x4eh
#      counterparts at the same splits, M = 1, 2, 3, 4, 8, 9, 16, both routings;
#   2. the new gpu tests (-k "x4eh or f16"), memcheck of the x4eh variants and racecheck of ctasplit_x4eh, in parallel;
#   3. a second process of the comparison (moe_small_f16_2.json) when RUNS=2.
# Everything under $OUT/f16.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [RUNS=2] bash workbench/moe/h200_f16.sh
set -u
OUT=${OUT:-out}
R=$(mktemp -d)
mkdir -p "$OUT" "$R/logs"
trap 'tar czf "$OUT/f16.tgz" -C "$R" . ; ls -la "$OUT"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
PATHS="four_launch ctasplit_x4e ctasplit_x4e_g4d1 splitk_s4x4e ctasplit_x4e_g2d1 ctasplit_x4e_g1d1 ctasplit_x4eh ctasplit_x4eh_g4d1 ctasplit_x4eh_g2d1 ctasplit_x4eh_g1d1"
cmp() {
  timeout 200 python3 -u -m workbench.moe.bench --small-compare $1 --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
    --small-paths $PATHS > "$R/logs/compare_$1.txt" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - T0 )) s"; tail -16 "$R/logs/compare_$1.txt"
}
cmp moe_small_f16
timeout 150 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "x4eh or f16" -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1 &
san() {  # tool, variants
  timeout 170 compute-sanitizer --tool $1 python3 -u -m workbench.moe.bench --sanitize --variants none \
    --small-variants $2 > "$R/logs/${1}_${2// /_}.txt" 2>&1
  echo "$1 rc=$?" >> "$R/logs/${1}_${2// /_}.txt"
}
san memcheck "ctasplit_x4eh ctasplit_x4eh_g1d1" &
san racecheck "ctasplit_x4eh" &
wait
tail -3 "$R/logs/gpu_tests.txt"
grep -hE "SUMMARY|rc=|checks" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -6
echo "tests+sanitizers $(( $(date +%s) - T0 )) s"
if [ "${RUNS:-1}" = 2 ]; then cmp moe_small_f16_2; fi
echo "total $(( $(date +%s) - T0 )) s"
