#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 6-8 minutes): the streaming-read ceiling beside the dispatched
# path (workbench.moe.ceiling, moe_stream_ceiling.json), then every gpu test, then compute-sanitizer memcheck over the
# read kernel's gpu tests. Everything under $OUT/ceiling.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_ceiling.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin ceiling
T0=$(date +%s)
timeout ${CEILING_T:-260} python3 -u -m workbench.moe.ceiling --out "$R" --reps ${REPS:-20} > "$R/logs/ceiling.txt" 2>&1
echo "ceiling rc=$? $(( $(date +%s) - T0 )) s"; tail -12 "$R/logs/ceiling.txt"
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/gpu_tests.txt"
timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k stream_touched \
  -p no:cacheprovider > "$R/logs/memcheck_stream_touched.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - T0 )) s"; grep -E "ERROR SUMMARY|passed|failed" "$R/logs/memcheck_stream_touched.txt" | tail -3
nvidia-smi > "$R/logs/nvidia_smi.txt"
