#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4 minutes) for the producer / consumer one-launch kernel
# (moe_small_tma_w4 / _w8; NOT dispatched: fused.set_small_variant selects it):
#   1. smoke: bench --sanitize of tma_w4 and tma_w8 (parity at H = I = 1024, edge cases, a graph replay), no
#      sanitizer, 35 s: a hang or a failure here drops the tma paths from the timed run,
#   2. bench --small-compare moe_small_tma: version 3, the four-launch path, splitk_s4 (dispatched at M = 2-16)
#      and tma_w4 / tma_w8 timed in ONE process at M = 1, 2, 4, 8, 9, 16, uniform and skewed, each one-launch
#      path parity-checked per row ($OUT/moe_small_tma.json, log $OUT/compare.txt),
#   3. Nsight Compute (clocks not locked) of tma_w4 at M = 1 ($OUT/ncu_tma_m1.txt),
#   4. in parallel (nothing timed): the tma tests of tests/test_moe_gpu.py, memcheck of tma_w4 + tma_w8 and racecheck of tma_w4.
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_tma_run.sh   (OUT defaults to ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
TMA="tma_w4 tma_w8"
timeout "${SMOKE_T:-35}" python3 -m workbench.moe.bench --sanitize --variants none --small-variants $TMA \
  > "$OUT/smoke.txt" 2>&1
rc=$?; echo "smoke rc=$rc" >> "$OUT/smoke.txt"; tail -3 "$OUT/smoke.txt"
[ $rc = 0 ] || TMA=""
timeout "${CMP_T:-95}" python3 -m workbench.moe.bench --small-compare moe_small_tma --out "$OUT" \
  --reps "${REPS:-20}" --small-paths small_fused four_launch splitk_s4 $TMA > "$OUT/compare.txt" 2>&1
echo "compare rc=$?" >> "$OUT/compare.txt"
if [ -n "$TMA" ]; then
  timeout "${NCU_T:-25}" ncu --clock-control none -k regex:moe_small_tma --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats \
    --metrics 'dram__bytes_read.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 -m workbench.moe.bench --single 1 --small --small-variants tma_w4 --variants none > "$OUT/ncu_tma_m1.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu_tma_m1.txt"
  (timeout "${SAN_T:-90}" compute-sanitizer --tool memcheck python3 -m workbench.moe.bench --sanitize \
    --variants none --small-variants tma_w4 tma_w8 > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
  (timeout "${SAN_T:-90}" compute-sanitizer --tool racecheck python3 -m workbench.moe.bench --sanitize \
    --variants none --small-variants tma_w4 > "$OUT/racecheck.txt" 2>&1; echo "racecheck rc=$?" >> "$OUT/racecheck.txt") &
fi
(timeout "${TEST_T:-90}" python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k tma -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
wait
tail -16 "$OUT/compare.txt"
tail -4 "$OUT/gpu_tests.txt"
for f in memcheck racecheck; do [ -f "$OUT/$f.txt" ] && { echo "== $f"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/$f.txt" | tail -6; }; done
[ -f "$OUT/ncu_tma_m1.txt" ] && grep -E "Duration|DRAM Throughput|inst_executed|Issued Warp|No Eligible|Warp Cycles Per Issued|Achieved Occ|stalled_(long_sc|membar|wait|barrier|math|not_sel|short)|rc=" "$OUT/ncu_tma_m1.txt" | head -40
exit 0
