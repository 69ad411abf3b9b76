#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 3 minutes, at most ~4) for the CTA-split one-launch
# kernel (moe_small_ctasplit, issue 5; NOT dispatched: fused.set_small_variant("ctasplit") selects it;
# NOT YET RUN ON A GPU when this script was written):
#   1. (background, CPU) ptxas registers / spills / shared memory of moe_small_splitk_s4 and moe_small_ctasplit,
#   2. a smoke run of both CTA-split variants (bench --sanitize without the sanitizer, H = I = 1024: parity
#      at M = 1, 2, 9, edge cases, a graph replay; a hang shows up here, cut at SMOKE_T seconds); if it fails
#      or hangs, only memcheck of the same checks runs after it (no timing),
#   3. bench --small-compare moe_small_ctasplit: the four-launch path, splitk_s4 (today's default one-launch
#      kernel), ctasplit and ctasplit_max (down split 4 too) timed in ONE process at M = 1, 2, 4, 8, 9, 16, uniform and skewed routing, each
#      one-launch path parity-checked per row ($OUT/moe_small_ctasplit.json, with the prediction as notes;
#      raw log $OUT/compare.txt),
#   4. Nsight Compute (clocks not locked) of ctasplit at M in NCU_MS (default "1"; "" skips): duration, DRAM,
#      issue rate, occupancy, stall reasons per issue ($OUT/ncu_ctasplit_m<M>.txt),
#   5. then in parallel: the gpu tests of the new variant (tests/test_moe_gpu.py -k ctasplit: parity incl. the
#      Kimi shape, edge cases, graph replays, determinism, agreement with splitk_s4), compute-sanitizer
#      memcheck of `bench --sanitize --variants none --small-variants ctasplit ctasplit_max`, and racecheck of
#      each of the two variants (two processes).
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_ctasplit_run.sh   (OUT defaults to ./out)
# Afterwards: copy $OUT/moe_small_ctasplit.json to data/measurements/h200/ and the *.txt logs to
# data/measurements/h200/moe_small_ctasplit_logs/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(timeout 40 nvcc -arch=sm_90 -Xptxas -v -c workbench/kernels/moe_int4.cu -o /dev/null 2>&1 \
  | grep -A2 -E "Function properties for moe_small_(splitk_s4|ctasplit)$" | grep -E "moe_small|spill|registers" \
  > "$OUT/ptxas.txt") &
timeout "${SMOKE_T:-45}" python3 -u -m workbench.moe.bench --sanitize --variants none \
  --small-variants ctasplit ctasplit_max > "$OUT/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE after $(( $(date +%s) - T0 )) s" >> "$OUT/smoke.txt"
tail -2 "$OUT/smoke.txt"
if [ "$SMOKE" != 0 ]; then
  # a hang (124) or a failed check: no timing; memcheck says where it goes wrong (a hang is cut again)
  echo "smoke FAILED: skipping the comparison, ncu, tests and racecheck"
  grep -E "'ok': False|Error|error" "$OUT/smoke.txt" | head -8
  timeout "${SAN_T:-80}" compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize \
    --variants none --small-variants ctasplit ctasplit_max > "$OUT/memcheck.txt" 2>&1
  echo "memcheck rc=$?" >> "$OUT/memcheck.txt"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|sanitize checks|rc=" "$OUT/memcheck.txt" | head -12
  wait
  cat "$OUT/ptxas.txt"
  echo "total $(( $(date +%s) - T0 )) s"
  exit 0
fi
timeout "${CMP_T:-80}" python3 -u -m workbench.moe.bench --small-compare moe_small_ctasplit --out "$OUT" \
  --reps "${REPS:-15}" --small-paths four_launch splitk_s4 ctasplit ctasplit_max > "$OUT/compare.txt" 2>&1
CMP=$?
echo "compare rc=$CMP after $(( $(date +%s) - T0 )) s" >> "$OUT/compare.txt"
[ "$CMP" = 124 ] && NCU_MS="" && echo "compare timed out (a hang at Kimi shapes?): no ncu"
for m in ${NCU_MS-1}; do
  timeout "${NCU_T:-45}" ncu --clock-control none -k regex:moe_small --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --metrics 'dram__bytes_read.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 -m workbench.moe.bench --single "$m" --small --small-variants ctasplit --variants none \
    > "$OUT/ncu_ctasplit_m$m.txt" 2>&1
  echo "ncu rc=$? after $(( $(date +%s) - T0 )) s" >> "$OUT/ncu_ctasplit_m$m.txt"
done
(timeout "${TEST_T:-80}" python3 -u -m pytest -q -m gpu tests/test_moe_gpu.py -k ctasplit -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
(timeout "${SAN_T:-80}" compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none --small-variants ctasplit ctasplit_max > "$OUT/memcheck.txt" 2>&1; \
  echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
for v in ctasplit ctasplit_max; do
  (timeout "${RACE_T:-90}" compute-sanitizer --tool racecheck python3 -u -m workbench.moe.bench --sanitize \
    --variants none --small-variants "$v" > "$OUT/racecheck_$v.txt" 2>&1; \
    echo "racecheck rc=$?" >> "$OUT/racecheck_$v.txt") &
done
wait
cat "$OUT/ptxas.txt"
tail -3 "$OUT/gpu_tests.txt"
for f in memcheck racecheck_ctasplit racecheck_ctasplit_max; do
  echo "== $f"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/$f.txt" | tail -6
done
for m in ${NCU_MS-1}; do
  echo "== ncu ctasplit M=$m"
  grep -E "Duration|DRAM Throughput|inst_executed|Achieved Occupancy|Issued Warp Per Scheduler|No Eligible|rc=" \
    "$OUT/ncu_ctasplit_m$m.txt" | head -12
  grep -E "stalled_(long_scoreboard|barrier|membar|short_scoreboard|wait|math_pipe_throttle|mio_throttle|lg_throttle|not_selected|sleeping)_per" \
    "$OUT/ncu_ctasplit_m$m.txt" | head -12
done
echo "total $(( $(date +%s) - T0 )) s"
tail -16 "$OUT/compare.txt" | cut -c1-160
exit 0
