#!/usr/bin/env bash
# The H200 run behind data/measurements/h200/moe_bandwidth.json, from the repository root on the
# device machine (device tool, carry .whl): the benchmark (its own parity checks first), then
# memcheck and racecheck on small shapes (the one-launch kernel and the four-launch variants named
# in SAN_VARIANTS, default all). TESTS=1 also runs the gpu-marked pytest tests first.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvcc -arch=sm_90 -Xptxas -v -c workbench/kernels/moe_int4.cu -o /dev/null 2>&1 | grep -A2 small_fused | tail -1
if [ "${TESTS:-0}" = 1 ]; then
  timeout 150 python3 -m pytest -q -x -m gpu tests/test_moe_gpu.py -p no:cacheprovider 2>&1 | tail -12
fi
timeout "${BENCH_T:-300}" python3 -m workbench.moe.bench --out "$OUT" ${BENCH_ARGS:---reps 20 --peer-reps 4 --tune-reps 6} 2>&1 \
  | grep -v '^check \|^{' | tail -30
for tool in memcheck racecheck; do
  timeout "${SAN_T:-100}" compute-sanitizer --tool $tool python3 -m workbench.moe.bench --sanitize \
    ${SAN_VARIANTS:+--variants $SAN_VARIANTS} > "$OUT/$tool.txt" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks" "$OUT/$tool.txt"
done
