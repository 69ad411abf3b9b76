#!/usr/bin/env bash
# One device call for the next session (repository root, carry .whl; about 4 minutes; NOT YET RUN):
#   1. the comparison moe_small_x4_splits: four launches, splitk_s4, splitk_s4x4, ctasplit_x4 and ctasplit_x4 at
#      the fixed splits (2, 1) and (1, 1) (host-side variants of a kernel already run), M = 1-16, both routings,
#      parity per row, the prediction in bench.SMALL_CTASPLIT_X4_SPLITS_PREDICTION as its notes;
#   2. the gpu tests of the x4 variants (-k "x4"); memcheck of the two new split variants;
#   3. the per-instruction profiles of the dispatched kernels (h200_profile_dispatched.sh).
# Everything under $OUT/next.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_next_moe.sh
# Afterwards: copy moe_small_x4_splits.json to data/measurements/h200/, add a report block
# (report._small_run_block), set fused.SMALL_TABLE from it if a path wins beyond the run-to-run spread (~1-2%),
# and read the profiles with report.ncu_sass_rows.
set -u
OUT=${OUT:-out}
R=$(mktemp -d)
mkdir -p "$OUT" "$R/logs"
trap 'tar czf "$OUT/next.tgz" -C "$R" . ; ls -la "$OUT"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
timeout 150 python3 -u -m workbench.moe.bench --small-compare moe_small_x4_splits --out "$R" --reps 20 \
  --small-paths four_launch splitk_s4 splitk_s4x4 ctasplit_x4 ctasplit_x4_g2d1 ctasplit_x4_g1d1 > "$R/logs/compare.txt" 2>&1
echo "compare rc=$? $(( $(date +%s) - T0 )) s"; tail -14 "$R/logs/compare.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "x4" -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt"; tail -2 "$R/logs/gpu_tests.txt"
timeout 150 compute-sanitizer --tool memcheck python3 -u -m workbench.moe.bench --sanitize --variants none \
  --small-variants ctasplit_x4_g2d1 ctasplit_x4_g1d1 > "$R/logs/memcheck.txt" 2>&1
echo "memcheck rc=$?" >> "$R/logs/memcheck.txt"; grep -E "SUMMARY|rc=|checks" "$R/logs/memcheck.txt" | tail -3
OUT="$R/profile" bash workbench/moe/h200_profile_dispatched.sh > "$R/logs/profile.txt" 2>&1
tail -12 "$R/logs/profile.txt"; echo "total $(( $(date +%s) - T0 )) s"
