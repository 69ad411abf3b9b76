#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 2-3 minutes): the gather probe of the verify kernel's key tiles
# (workbench/ddtree/gather_probe.py). In order: its gpu tests (every method and depth's landed rows checked at its
# layout) and memcheck of the layout check, then alone the probe -> ddtree_gather_probe.json; $OUT/gather.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/ddtree/h200_gather.sh
set -u
source "$(dirname "$0")/../moe/h200_common.sh"
h200_begin gather
timeout 120 python3 -m pytest -q -m gpu tests/test_ddtree_gather_probe.py -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt"
timeout 120 compute-sanitizer --tool memcheck --kernel-name kns=ddtree_gather python3 -c \
  "from workbench.ddtree.gather_probe import check_layouts; print(check_layouts(prefix=3000))" > "$R/logs/memcheck.txt" 2>&1
echo "memcheck rc=$?" >> "$R/logs/memcheck.txt"
timeout "${PROBE_T:-200}" python3 -m workbench.ddtree.gather_probe --out "$R" ${POINTS:+--points $POINTS} \
  > "$R/logs/probe.txt" 2>&1
echo "probe rc=$?" >> "$R/logs/probe.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$R/logs/smi.txt" 2>&1
echo "== gpu tests"; tail -3 "$R/logs/gpu_tests.txt"
echo "== memcheck"; grep -E "SUMMARY|rc=|\{" "$R/logs/memcheck.txt"
echo "== probe"; tail -40 "$R/logs/probe.txt"
