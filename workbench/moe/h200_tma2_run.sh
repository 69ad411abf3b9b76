#!/usr/bin/env bash
# Second device call for the producer / consumer one-launch kernel (per-slot task decoding removed; tma_w4o5
# added), lean (about 2 minutes; carry .whl):
#   1. smoke: bench --sanitize of tma_w4, tma_w8, tma_w4o5 (no sanitizer, 35 s): a failure drops them from 2,
#   2. bench --small-compare moe_small_tma2: four launches, splitk_s4 (dispatched at M = 2-16), tma_w4, tma_w4o5
#      in ONE process at M = 1, 2, 4, 8, 16, uniform and skewed, parity per row ($OUT/moe_small_tma2.json),
#   3. Nsight Compute (clocks not locked) of tma_w4 at M = 1: instructions, issue rate, stalls,
#   4. in parallel (nothing timed): the tma gpu tests and memcheck of tma_w4 + tma_w4o5.
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_tma2_run.sh   (OUT defaults to ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
TMA="tma_w4 tma_w4o5"
timeout "${SMOKE_T:-35}" python3 -m workbench.moe.bench --sanitize --variants none --small-variants $TMA tma_w8 \
  > "$OUT/smoke.txt" 2>&1
rc=$?; echo "smoke rc=$rc" >> "$OUT/smoke.txt"; tail -2 "$OUT/smoke.txt"
[ $rc = 0 ] || TMA=""
timeout "${CMP_T:-70}" python3 -m workbench.moe.bench --small-compare moe_small_tma2 --out "$OUT" --m 1 2 4 8 16 \
  --reps "${REPS:-20}" --small-paths four_launch splitk_s4 $TMA > "$OUT/compare.txt" 2>&1
echo "compare rc=$?" >> "$OUT/compare.txt"
if [ -n "$TMA" ]; then
  timeout "${NCU_T:-25}" ncu --clock-control none -k regex:moe_small_tma --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats \
    --metrics 'dram__bytes_read.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 -m workbench.moe.bench --single 1 --small --small-variants tma_w4 --variants none > "$OUT/ncu_tma2_m1.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu_tma2_m1.txt"
  (timeout "${SAN_T:-45}" compute-sanitizer --tool memcheck python3 -m workbench.moe.bench --sanitize \
    --variants none --small-variants tma_w4 tma_w4o5 > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
  (timeout "${TEST_T:-45}" python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k tma -p no:cacheprovider \
    > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
  wait
fi
tail -13 "$OUT/compare.txt"
tail -3 "$OUT/gpu_tests.txt" 2>/dev/null
grep -E "ERROR SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/memcheck.txt" 2>/dev/null | tail -4
grep -E "Duration|DRAM Throughput|inst_executed|Issued Warp|No Eligible|Warp Cycles Per Issued|Achieved Occ|rc=" "$OUT/ncu_tma2_m1.txt" 2>/dev/null | head -20
exit 0
