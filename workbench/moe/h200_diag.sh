#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4-6 minutes): the clock probe and the M = 1 decomposition
# (workbench.moe.diag: moe_clock_probe.json, moe_diag_decomposition.json), then the gpu tests of the diagnostic
# builds and of the read kernel. Everything under $OUT/diag.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_diag.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin diag
T0=$(date +%s)
timeout ${CLOCKS_T:-120} python3 -u -m workbench.moe.diag --clocks --seconds ${SECONDS_PER_PHASE:-3} --out "$R" \
  > "$R/logs/clocks.txt" 2>&1
echo "clocks rc=$? $(( $(date +%s) - T0 )) s"; tail -7 "$R/logs/clocks.txt"
timeout ${DECOMP_T:-300} python3 -u -m workbench.moe.diag --decompose --m ${MS:-1 2 16} --out "$R" \
  > "$R/logs/decompose.txt" 2>&1
echo "decompose rc=$? $(( $(date +%s) - T0 )) s"; tail -4 "$R/logs/decompose.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "diagnostic or stream_touched" -p no:cacheprovider \
  > "$R/logs/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s"; tail -2 "$R/logs/gpu_tests.txt"
nvidia-smi > "$R/logs/nvidia_smi.txt"
