#!/usr/bin/env bash
# The H200 run behind data/measurements/h200/moe_bandwidth.json (repository root, carry .whl): the benchmark
# (its own parity checks first; one-replay, queued and in-graph timings), then with PIPELINE=1 the GPU notebook
# pipeline, with SAN=1 memcheck and racecheck on small shapes (the one-launch kernels in SAN_SMALL and the
# four-launch variants in SAN_VARIANTS, default all). Everything under $OUT/bandwidth.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> [PIPELINE=1] [SAN=1 [SAN_T=100] [RACE_T=240]] bash workbench/moe/h200_run.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin bandwidth
T0=$(date +%s)
timeout "${BENCH_T:-330}" python3 -u -m workbench.moe.bench --out "$R" ${BENCH_ARGS:---reps 20 --peer-reps 4 --tune-reps 6} \
  > "$R/logs/bench.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"; grep -v '^check \|^{' "$R/logs/bench.txt" | tail -30
if [ "${PIPELINE:-0}" = 1 ]; then
  timeout 170 python3 -m workbench run --out /tmp/runs --fail-fast > "$R/logs/pipeline.txt" 2>&1
  echo "pipeline rc=$? $(( $(date +%s) - T0 )) s"; tail -3 "$R/logs/pipeline.txt"
  find /tmp/runs -name run.json -exec cp {} "$R/logs/run.json" \;
fi
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck; do   # racecheck runs longer: the phased pair and its M = 2 form took 122 s (run 30)
    t=${SAN_T:-100}; [ $tool = racecheck ] && t=${RACE_T:-240}
    timeout "$t" compute-sanitizer --tool $tool python3 -m workbench.moe.bench --sanitize \
      ${SAN_VARIANTS:+--variants $SAN_VARIANTS} ${SAN_SMALL:+--small-variants $SAN_SMALL} > "$R/logs/$tool.txt" 2>&1
    echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks" "$R/logs/$tool.txt"
  done
fi
nvidia-smi > "$R/logs/nvidia_smi.txt"
