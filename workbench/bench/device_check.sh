#!/usr/bin/env bash
# One call on a GPU machine: every `gpu` test, then the named areas' benchmarks (each checks its kernels
# against their references before it times them), then the README results table from the fresh files.
#
#   WORKBENCH_COMMIT=<sha> bash workbench/bench/device_check.sh [AREA ...]   AREA: moe ddtree engine (default: none)
#
# WORKBENCH_COMMIT names the commit of the working tree the call carries: the device tool copies the tree, and git
# there can read another commit (seen: the session's base commit), which the measurement files would then record.
#
# Writes under $OUT (default runs/device): gpu.txt, gpu_tests.log, <area>.log, the fresh measurement JSON
# files and results.md. The measurement files are also written to data/measurements/<gpu>/ of this checkout.
# Missing Python packages travel as wheels in .whl/ (the device tool's README says how).
set -uo pipefail
if [ -z "${WORKBENCH_COMMIT:-}" ]; then
  echo "set WORKBENCH_COMMIT to the commit this tree is (git rev-parse HEAD where you start the call)"; exit 2
fi
export WORKBENCH_COMMIT
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv | tee "$OUT/gpu.txt"
status=0
# only the modules that hold gpu tests: the others import the notebook stack, which the device image lacks
gpu_tests=$(grep -l "mark.gpu" tests/test_*.py)
python3 -m pytest -q -m gpu -p no:cacheprovider $gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -25 || status=1
[ "${PIPESTATUS[0]}" = 0 ] || status=1
gpu_dir=$(python3 -c "from workbench.measure import gpu_slug; print(gpu_slug())" 2>/dev/null || echo h200)
for area in "$@"; do
  case "$area" in
    moe|ddtree|engine) ;;
    *) echo "unknown area $area (allowed: moe ddtree engine)"; exit 2 ;;
  esac
  python3 -m "workbench.bench.$area" --out "data/measurements/$gpu_dir" 2>&1 | tee "$OUT/$area.log" | tail -15
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
for f in "data/measurements/$gpu_dir"/*.json; do
  [ "$f" -nt "$OUT/gpu.txt" ] && cp "$f" "$OUT/"
done
python3 -m workbench.reports.readme | tee "$OUT/results.md"
exit $status
