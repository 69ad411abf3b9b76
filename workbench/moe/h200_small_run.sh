#!/usr/bin/env bash
# The H200 run behind data/measurements/h200/moe_small_v3.json (one device call, repository root,
# carry .whl): the one-launch small-M kernel against the four-launch path at M = 1-16 (parity check
# per M and routing, copy bandwidth in the same process), then, in parallel (timing done), the
# gpu-marked MoE tests and a compute-sanitizer memcheck of the one-launch kernel's sanitize checks.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout "${CMP_T:-75}" python3 -u -m workbench.moe.bench --small-compare moe_small_v3 --out "$OUT" \
  --reps "${REPS:-20}" > "$OUT/compare.txt" 2>&1
echo "compare rc=$?" >> "$OUT/compare.txt"
(timeout "${TEST_T:-60}" python3 -u -m pytest -q -m gpu tests/test_moe_gpu.py -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
(timeout "${SAN_T:-60}" compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
wait
tail -16 "$OUT/compare.txt"
tail -4 "$OUT/gpu_tests.txt"
grep -E "ERROR SUMMARY|sanitize checks|rc=" "$OUT/memcheck.txt"
