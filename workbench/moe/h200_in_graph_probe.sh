#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 3-4 minutes): run 21's in-graph probe (bench --in-graph-probe:
# one replay, queued, in-graph over two weight sets / one set / two sets with a sleep between calls, M = 1, 4, 16, 64),
# then every gpu test and the GPU pipeline. Everything under $OUT/probe.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_in_graph_probe.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin probe
T0=$(date +%s)
timeout 200 python3 -u -m workbench.moe.bench --in-graph-probe moe_in_graph_probe --out "$R" > "$R/logs/probe.txt" 2>&1
echo "probe rc=$? $(( $(date +%s) - T0 )) s"; tail -5 "$R/logs/probe.txt" | cut -c1-400
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s"; tail -2 "$R/logs/gpu_tests.txt"
timeout 170 python3 -m workbench run --out /tmp/runs --fail-fast > "$R/logs/pipeline.txt" 2>&1
echo "pipeline rc=$? $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/pipeline.txt"
find /tmp/runs -name run.json -exec cp {} "$R/logs/run.json" \; ; nvidia-smi > "$R/logs/nvidia_smi.txt"
