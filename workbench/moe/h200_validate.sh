#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 8-9 minutes): the GPU paths a CPU-only refactor touched, run
# once on the GPU, plus two diagnostics. In order: the verify clock probe (workbench.ddtree.verify_probe --clocks:
# ddtree_verify_clock_probe.json), the CTA-split timeline of the M = 1 kernel (workbench.moe.trace on
# ctasplit_x4e_r3fst: moe_ctasplit_trace_r3fst.json), a short read-kernel ceiling (ceiling.time_read,
# timing_fields: moe_stream_ceiling_check.json), the M = 1 decomposition (diag.run_decomposition:
# moe_diag_decomposition_check.json), then every gpu test. Everything under $OUT/validate.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_validate.sh
set -u
source "$(dirname "$0")/h200_common.sh"
h200_begin validate
T0=$(date +%s)
step() {  # step NAME TIMEOUT CMD...: run, log to $R/logs/NAME.txt, print rc, elapsed and the log's tail
  local name=$1 t=$2; shift 2
  timeout "$t" "$@" > "$R/logs/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -${TAIL:-6} "$R/logs/$name.txt"
}
step verify_clocks 100 python3 -u -m workbench.ddtree.verify_probe --clocks --out "$R"
step trace 90 python3 -u -m workbench.moe.trace --m 1 2 --variants ctasplit_x4e_r3fst --name moe_ctasplit_trace_r3fst \
  --out "$R"
step ceiling 70 python3 -u -m workbench.moe.ceiling --m 1 16 --routings uniform --reps 10 --name moe_stream_ceiling_check \
  --out "$R"
step decompose 90 python3 -u -m workbench.moe.diag --decompose --m 1 --reps 10 --out "$R"
step gpu_tests 220 python3 -m pytest -q -m gpu tests -p no:cacheprovider
nvidia-smi > "$R/logs/nvidia_smi.txt"
