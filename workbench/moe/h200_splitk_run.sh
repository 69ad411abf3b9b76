#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 2-3 minutes) for the split-K form of the one-launch
# small-M kernel (moe_small_splitk_s3 / _s4; NOT dispatched: fused.set_small_variant selects it):
#   1. ptxas registers / spills of the one-launch kernels (nvcc sm_90),
#   2. bench --small-compare moe_small_splitk: version 3 (moe_small_fused), the four-launch path and the
#      split-K forms splitk_s3, splitk_s4, splitk_s3_max timed in ONE process at M = 1, 2, 4, 8, 9, 16,
#      uniform and skewed routing, each one-launch path parity-checked per row (writes
#      $OUT/moe_small_splitk.json, raw log $OUT/compare.txt),
#   3. in parallel: the gpu-marked MoE tests (tests/test_moe_gpu.py, incl. the split-K tests),
#      compute-sanitizer memcheck (splitk_s3, splitk_s4, splitk_s3_max) and racecheck (splitk_s3, splitk_s4)
#      of `bench --sanitize` (H = I = 1024, 16 experts: parity at M = 1, 2, 9, edge cases, graph replays).
#   NCU=1 adds (after 2, about 30 s more) Nsight Compute of version 3 and splitk_s3 at M = 1 ($OUT/ncu_m1.txt).
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_splitk_run.sh   (OUT defaults to ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 30 nvcc -arch=sm_90 -Xptxas -v -c workbench/kernels/moe_int4.cu -o /dev/null 2>&1 \
  | grep -A2 -E "Function properties for moe_small_(fused|splitk)" | grep -E "moe_small|spill|registers" > "$OUT/ptxas.txt"
cat "$OUT/ptxas.txt"
timeout "${CMP_T:-85}" python3 -u -m workbench.moe.bench --small-compare moe_small_splitk --out "$OUT" \
  --reps "${REPS:-20}" --small-paths small_fused four_launch splitk_s3 splitk_s4 splitk_s3_max \
  > "$OUT/compare.txt" 2>&1
echo "compare rc=$?" >> "$OUT/compare.txt"
if [ "${NCU:-0}" = 1 ]; then
  timeout "${NCU_T:-40}" ncu -k regex:moe_small --section SpeedOfLight --section Occupancy \
    --section LaunchStats --metrics dram__bytes_read.sum,smsp__inst_executed.sum \
    python3 -m workbench.moe.bench --single 1 --small --small-variants v3 splitk_s3 --variants none \
    > "$OUT/ncu_m1.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu_m1.txt"
fi
(timeout "${TEST_T:-75}" python3 -u -m pytest -q -m gpu tests/test_moe_gpu.py -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
(timeout "${SAN_T:-75}" compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none --small-variants splitk_s3 splitk_s4 splitk_s3_max > "$OUT/memcheck.txt" 2>&1; \
  echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
(timeout "${RACE_T:-100}" compute-sanitizer --tool racecheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none --small-variants v3 splitk_s3 splitk_s4 > "$OUT/racecheck.txt" 2>&1; \
  echo "racecheck rc=$?" >> "$OUT/racecheck.txt") &
wait
tail -17 "$OUT/compare.txt"
tail -4 "$OUT/gpu_tests.txt"
for f in memcheck racecheck; do echo "== $f"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/$f.txt" | tail -6; done
[ "${NCU:-0}" = 1 ] && grep -E "moe_small|Duration|DRAM Throughput|Compute \(SM\)|dram__bytes|inst_executed|rc=" "$OUT/ncu_m1.txt" | head -30
exit 0
