#!/usr/bin/env bash
# One short device call (repository root, carry .whl; about 1 minute) for splitk_s4f (splitk_s4 with the -136
# offset on the tensor core; NOT dispatched):
#   1. bench --small-compare moe_small_s4f: the four-launch path, splitk_s4 (dispatched at M = 2-16) and
#      splitk_s4f in ONE process at M = 1, 2, 4, 16, uniform and skewed, parity per row,
#   2. in parallel (nothing timed): the s4f gpu tests and memcheck of splitk_s4f (bench --sanitize).
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_s4f_run.sh   (OUT defaults to ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout "${CMP_T:-45}" python3 -m workbench.moe.bench --small-compare moe_small_s4f --out "$OUT" --m 1 2 4 16 \
  --reps "${REPS:-20}" --small-paths four_launch splitk_s4 splitk_s4f > "$OUT/compare.txt" 2>&1
echo "compare rc=$?" >> "$OUT/compare.txt"
(timeout "${SAN_T:-25}" compute-sanitizer --tool memcheck python3 -m workbench.moe.bench --sanitize \
  --variants none --small-variants splitk_s4f > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
(timeout "${SAN_T:-25}" python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k s4f -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
wait
tail -11 "$OUT/compare.txt"
tail -3 "$OUT/gpu_tests.txt"
grep -E "ERROR SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/memcheck.txt" | tail -4
exit 0
