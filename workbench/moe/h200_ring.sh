#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 3 minutes): the ring-read kernel beside the read kernel and the
# dispatched path (workbench.moe.ceiling --ring, moe_stream_ring.json), then the read and ring kernels' gpu tests
# and memcheck over them. Everything under $OUT/ring.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [NAME=.. RING_ARGS='--ring-configs ..' MS='1 2'] bash workbench/moe/h200_ring.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin ring
T0=$(date +%s)
timeout ${RING_T:-240} python3 -u -m workbench.moe.ceiling ${RING_ARGS:---ring} --name ${NAME:-moe_stream_ring} \
  --routings uniform --m ${MS:-1 2 4 16} --configs 8 512 4 --out "$R" > "$R/logs/ring.txt" 2>&1
echo "ring rc=$? $(( $(date +%s) - T0 )) s"; tail -5 "$R/logs/ring.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "stream_ring or stream_touched or diagnostic" \
  -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s"; tail -2 "$R/logs/gpu_tests.txt"
timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "stream_ring" \
  -p no:cacheprovider > "$R/logs/memcheck_stream_ring.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - T0 )) s"; grep -E "ERROR SUMMARY|passed|failed" "$R/logs/memcheck_stream_ring.txt" | tail -3
