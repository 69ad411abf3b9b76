#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 5-8 minutes): every path fused.SMALL_TABLE dispatches, with the
# four-launch path, splitk_s4 and fused.DEFAULT_SMALL_VARIANT, timed in one process at M = 1-16 (moe_small_dispatch.json, plots.SMALL_COMPARE;
# the dispatched path of each M also queued and in-graph), then every gpu test and (PIPELINE=0 skips it) the GPU
# pipeline. Everything under $OUT/dispatch.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_dispatch_check.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin dispatch
T0=$(date +%s)
PATHS=$(python3 -c "from workbench.moe.fused import SMALL_TABLE as T, DEFAULT_SMALL_VARIANT as D; print(' '.join(dict.fromkeys(['four_launch', 'splitk_s4', D] + [v for _, v in T if v])))")
timeout ${COMPARE_T:-240} python3 -u -m workbench.moe.bench --small-compare moe_small_dispatch --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
  --small-paths $PATHS > "$R/logs/compare.txt" 2>&1
echo "compare rc=$? $(( $(date +%s) - T0 )) s"; tail -14 "$R/logs/compare.txt"
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s"; tail -2 "$R/logs/gpu_tests.txt"
[ "${PIPELINE:-1}" = 0 ] && exit 0
timeout 170 python3 -m workbench run --out /tmp/runs --fail-fast > "$R/logs/pipeline.txt" 2>&1
echo "pipeline rc=$? $(( $(date +%s) - T0 )) s"; tail -6 "$R/logs/pipeline.txt"
find /tmp/runs -name run.json -exec cp {} "$R/logs/run.json" \; ; nvidia-smi > "$R/logs/nvidia_smi.txt"
