#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 1.5 minutes): per-SASS-instruction Nsight Compute counters
# of the one-launch kernels dispatched today (fused.SMALL_TABLE): ctasplit_x4 at M = 1, splitk_s4 at M = 2,
# splitk_s4x4 at M = 16 (one launch each, clocks not locked; SPECS="variant:M ..." overrides), as
#   $OUT/sass_<variant>_m<M>.csv   (ncu --page source --print-source sass --csv: stall samples, shared-memory
#                                   wavefronts, per instruction; read by workbench.moe.report.ncu_sass_rows)
#   $OUT/summary_<variant>_m<M>.txt (SpeedOfLight, Occupancy, WarpStateStats, SchedulerStats, SourceCounters)
# Everything is also packed into $OUT/profile.tgz (the device returns at most a few files per call).
# For the phased forms (two launches), PARTS="gu dn" profiles each launch's kernel (default gu: the one the variant
# names); the files are then named <variant>_<part>_m<M>. EXTRA_SECTIONS="--section MemoryWorkloadAnalysis ..." adds
# sections to the summaries.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_profile_dispatched.sh
# Afterwards: copy the files to data/measurements/h200/moe_profile_<sha>/ and point a report block at them
# (workbench/moe/report.py: ncu_sass_rows(path)).
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin profile
for spec in ${SPECS:-ctasplit_x4:1 splitk_s4:2 splitk_s4x4:16}; do
 for part in ${PARTS:-gu}; do
  v0=${spec%%:*}; m=${spec##*:}
  kname=$(python3 -c "from workbench.moe.fused import SMALL_VARIANTS as S; print(S['$v0'][0].replace('_gu_', '_$part' + '_'))")
  v=$v0; [ "${PARTS:-gu}" = gu ] || v=${v0}_$part
  # the sections that collect the per-instruction counters (without them the source page lists only the SASS)
  timeout "${NCU_T:-60}" ncu --clock-control none -k "regex:^${kname}\$" -c 1 --section SourceCounters \
    --section WarpStateStats --page source --print-source sass --csv \
    python3 -m workbench.moe.bench --single "$m" --small --small-variants "$v0" --variants none \
    > "$R/sass_${v}_m${m}.csv" 2> "$R/sass_${v}_m${m}.err"
  echo "sass $v M=$m rc=$?"
  timeout "${NCU_T:-60}" ncu --clock-control none -k "regex:^${kname}\$" -c 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section SourceCounters ${EXTRA_SECTIONS:-} \
    python3 -m workbench.moe.bench --single "$m" --small --small-variants "$v0" --variants none \
    > "$R/summary_${v}_m${m}.txt" 2>&1
  echo "summary $v M=$m rc=$?"; grep -E "Duration|DRAM Throughput|Issued Warp|Achieved Occupancy" "$R/summary_${v}_m${m}.txt" | head -4
 done
done
