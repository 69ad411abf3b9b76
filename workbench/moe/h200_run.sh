#!/usr/bin/env bash
# The H200 run behind data/measurements/h200/moe_bandwidth.json, from the repository root on the
# device machine (device tool, carry .whl): GPU tests, memcheck, the benchmark, racecheck.
# BENCH_ARGS / BENCH_T override the benchmark's arguments and time limit.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvcc -arch=sm_90 -Xptxas -v -c workbench/kernels/moe_int4.cu -o /dev/null 2>&1 | grep -A2 small_fused | tail -1
timeout 150 python3 -m pytest -q -x -m gpu tests/test_moe_gpu.py -p no:cacheprovider 2>&1 | tail -12
if [ "${PIPESTATUS[0]}" -ne 0 ]; then echo "GPU TESTS FAILED"; exit 1; fi
timeout 120 compute-sanitizer --tool memcheck python3 -m workbench.moe.bench --sanitize > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|sanitize checks" "$OUT/memcheck.txt"
timeout "${BENCH_T:-300}" python3 -m workbench.moe.bench --out "$OUT" ${BENCH_ARGS:---reps 20 --peer-reps 4 --tune-reps 6} 2>&1 \
  | grep -v '^check ' | tail -32
timeout 150 compute-sanitizer --tool racecheck python3 -m workbench.moe.bench --sanitize --variants 1,2,0,2,1 2,2,2,0,0 \
  > "$OUT/racecheck.txt" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|sanitize checks|Hazard" "$OUT/racecheck.txt" | head -8
