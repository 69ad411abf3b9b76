#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4 minutes): run 19 (prediction bench.SMALL_XS_PREDICTION; run at
# 709c28f, whose moe_int4.cu and fused.py hold the x4s and x4ec kernels, reverted since):
#   1. the comparison in two processes (moe_small_xs.json, moe_small_xs_2.json): four launches, ctasplit_x4e at the
#      dispatched splits and its forms x4s (activation slice staged in the ring), x4e_r3 (3-stage ring), x4ec (L2-only
#      activation loads) at the same splits, M = 1, 2, 3, 4, 8, 9, 16, both routings;
#   2. the run-19 gpu tests and the edge-case tests of x4s / x4e_r3, memcheck of x4s and x4e_r3, racecheck of x4s,
#      in parallel;
#   3. per-instruction profiles of x4s at M = 1 and x4s_g1d1 at M = 16.
# Everything under $OUT/xs.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_xs.sh
set -u
OUT=${OUT:-out}
R=$(mktemp -d)
mkdir -p "$OUT" "$R/logs"
trap 'tar czf "$OUT/xs.tgz" -C "$R" . ; ls -la "$OUT"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi > "$R/logs/nvidia_smi.txt"
T0=$(date +%s)
PATHS="four_launch"
for sfx in "" _g4d1 _g2d1 _g1d1; do PATHS="$PATHS ctasplit_x4e$sfx ctasplit_x4s$sfx"; done
PATHS="$PATHS ctasplit_x4e_r3 ctasplit_x4e_r3_g1d1 ctasplit_x4ec ctasplit_x4ec_g1d1"
for name in moe_small_xs moe_small_xs_2; do
  timeout 200 python3 -u -m workbench.moe.bench --small-compare $name --out "$R" --reps 20 --m 1 2 3 4 8 9 16 \
    --small-paths $PATHS > "$R/logs/compare_$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; tail -16 "$R/logs/compare_$name.txt" | cut -c1-250
done
timeout 170 python3 -m pytest -q -m gpu tests/test_moe_gpu.py -k "xs_forms or edge_cases_graph" -p no:cacheprovider \
  > "$R/logs/gpu_tests.txt" 2>&1 &
san() {  # tool, variants
  timeout 170 compute-sanitizer --tool $1 python3 -u -m workbench.moe.bench --sanitize --variants none \
    --small-variants $2 > "$R/logs/${1}_${2// /_}.txt" 2>&1
  echo "$1 rc=$?" >> "$R/logs/${1}_${2// /_}.txt"
}
san memcheck "ctasplit_x4s ctasplit_x4s_g1d1 ctasplit_x4e_r3" &
san racecheck "ctasplit_x4s" &
wait
tail -3 "$R/logs/gpu_tests.txt"
grep -hE "SUMMARY|rc=|checks" "$R"/logs/memcheck_*.txt "$R"/logs/racecheck_*.txt | tail -6
echo "tests+sanitizers $(( $(date +%s) - T0 )) s"
SPECS="ctasplit_x4s:1 ctasplit_x4s_g1d1:16" OUT="$R/profile" bash workbench/moe/h200_profile_dispatched.sh \
  > "$R/logs/profile.txt" 2>&1
tail -12 "$R/logs/profile.txt"; echo "total $(( $(date +%s) - T0 )) s"
