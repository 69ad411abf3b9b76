#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 3 minutes) for the group-sum form of the split-K
# one-launch kernel (moe_small_splitk_s4g, issue 5; NOT dispatched: fused.set_small_variant selects it):
#   1. (background, CPU) ptxas registers / spills of moe_small_splitk_s4 / _s4g (nvcc sm_90),
#   1b. a smoke run of the new kernel (bench --sanitize without the sanitizer, H = I = 1024, ~10 s),
#   2. bench --small-compare moe_small_s4g: the four-launch path, splitk_s4 (the default) and splitk_s4g timed
#      in ONE process at M = 1, 2, 4, 8, 9, 16, uniform and skewed routing, each one-launch path
#      parity-checked per row (writes $OUT/moe_small_s4g.json, raw log $OUT/compare.txt),
#   3. then in parallel: the gpu tests of the new variant (tests/test_moe_gpu.py -k s4g: parity incl. the
#      Kimi shape, edge cases, graph replays, determinism, agreement with splitk_s4), compute-sanitizer
#      memcheck and racecheck of `bench --sanitize --variants none --small-variants splitk_s4g`.
# Usage: WORKBENCH_COMMIT=<sha> bash workbench/moe/h200_s4g_run.sh   (OUT defaults to ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
(timeout 40 nvcc -arch=sm_90 -Xptxas -v -c workbench/kernels/moe_int4.cu -o /dev/null 2>&1 \
  | grep -A2 -E "Function properties for moe_small_splitk_s4" | grep -E "moe_small|spill|registers" > "$OUT/ptxas.txt") &
# smoke first (compiles the module into CuPy's cache; a hang or a parity failure shows up here in seconds)
timeout "${SMOKE_T:-35}" python3 -u -m workbench.moe.bench --sanitize --variants none --small-variants splitk_s4g \
  > "$OUT/smoke.txt" 2>&1
echo "smoke rc=$? after $(( $(date +%s) - T0 )) s" >> "$OUT/smoke.txt"
tail -2 "$OUT/smoke.txt"
timeout "${CMP_T:-75}" python3 -u -m workbench.moe.bench --small-compare moe_small_s4g --out "$OUT" \
  --reps "${REPS:-15}" --small-paths four_launch splitk_s4 splitk_s4g > "$OUT/compare.txt" 2>&1
echo "compare rc=$? after $(( $(date +%s) - T0 )) s" >> "$OUT/compare.txt"
(timeout "${TEST_T:-65}" python3 -u -m pytest -q -m gpu tests/test_moe_gpu.py -k s4g -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/gpu_tests.txt") &
(timeout "${SAN_T:-65}" compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none --small-variants splitk_s4g > "$OUT/memcheck.txt" 2>&1; \
  echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
(timeout "${RACE_T:-70}" compute-sanitizer --tool racecheck python3 -u -m workbench.moe.bench --sanitize \
  --variants none --small-variants splitk_s4g > "$OUT/racecheck.txt" 2>&1; \
  echo "racecheck rc=$?" >> "$OUT/racecheck.txt") &
wait
cat "$OUT/ptxas.txt"
tail -3 "$OUT/gpu_tests.txt"
for f in memcheck racecheck; do echo "== $f"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize checks|rc=|'ok': False" "$OUT/$f.txt" | tail -6; done
echo "total $(( $(date +%s) - T0 )) s"
tail -16 "$OUT/compare.txt"
exit 0
