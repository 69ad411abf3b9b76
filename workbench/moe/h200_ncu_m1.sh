#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 2-3 minutes): what bounds M = 1-2.
#   1. Nsight Compute (clocks NOT locked, so durations compare with the sweeps) of the small-M kernels SV (default
#      the dispatched phased_r3_pdl; run 25 profiled splitk_s4) and the four-launch variants V (default none; run 25:
#      1,2,0,2,1) at M = 1 and M = 2 (bench --single: a warm-up call and one call each, both profiled): duration,
#      DRAM throughput and bytes read, achieved occupancy, warp-state stall reasons, scheduler issue rate, memory
#      workload, and the busiest / idlest / mean SM's active cycles (how evenly the work lands on the SMs).
#   2. then (nothing timed beside it) compute-sanitizer racecheck of SV alone (bench --sanitize).
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_ncu_m1.sh   (OUT defaults to ./out)
#   MS="16 4" profiles other M values (default "1 2"); RACE=0 skips the racecheck.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SV=${SV:-phased_r3_pdl}
RLOG="$OUT/racecheck_${SV// /_}.txt"
for m in ${MS:-1 2}; do
  timeout "${NCU_T:-45}" ncu --clock-control none -k regex:moe_ --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --metrics 'dram__bytes_read.sum,smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,gpc__cycles_elapsed.max,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 -m workbench.moe.bench --single $m --small --small-variants $SV --variants ${V:-none} \
    > "$OUT/ncu_m$m.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu_m$m.txt"
done
if [ "${RACE:-1}" = 1 ]; then
  timeout "${RACE_T:-150}" compute-sanitizer --tool racecheck python3 -u -m workbench.moe.bench --sanitize \
    --variants none --small-variants $SV > "$RLOG" 2>&1
  echo "racecheck rc=$?" >> "$RLOG"
fi
for m in ${MS:-1 2}; do
  echo "== M=$m"
  grep -E "^  moe_|Duration|DRAM Throughput|dram__bytes_read|inst_executed|sm__cycles_active|gpc__cycles|Achieved Occupancy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|rc=" "$OUT/ncu_m$m.txt" | head -80
  grep -E "^  moe_|stalled_(long_scoreboard|barrier|membar|short_scoreboard|wait|math|mio|lg_throttle|no_instruction|branch|sleeping|not_selected|selected|drain|dispatch|imc|tex|misc)_per" "$OUT/ncu_m$m.txt" | head -60
done
[ "${RACE:-1}" = 1 ] && echo "== racecheck" && grep -E "RACECHECK SUMMARY|sanitize checks|rc=|'ok': False|Error|Warning" "$RLOG" | tail -8
exit 0
