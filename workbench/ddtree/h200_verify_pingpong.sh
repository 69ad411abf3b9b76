#!/usr/bin/env bash
# One device call for the ping-pong verify kernels (impl="pingpong", "pingpong_rem"; written in the
# session that ended 2026-11-30 without device time: NOT YET RUN ON A GPU). From the repository root on
# the H200, carrying .whl (pytest for the device's python3), e.g.
#   run(command="WORKBENCH_COMMIT=$(git rev-parse HEAD) bash workbench/ddtree/h200_verify_pingpong.sh",
#       carry=[".whl"], timeout_s=270)           # (the commit computed here, not on the device)
# Wall time <= 4 minutes (phase 1 at most 90 s, phase 2 at most 140 s, plus the wheel install):
#   1. in parallel, before any timing: the gpu-marked verify tests (parity of every impl incl. the new
#      ones, their -D variants and round edge cases, no host sync, CUDA graph); compute-sanitizer
#      memcheck of every verify smoke case; racecheck of the ping-pong smoke cases (pingpong and
#      pingpong_rem at small shapes, chunks of several tile pairs, odd tile counts, batched).
#   2. alone on the GPU: python -m workbench.ddtree.verify: the parity grid, then the benchmark (default
#      wgmma kernel; variants mma, pingpong, pingpong_slot_late, pingpong_bar_sync, pingpong_rem,
#      pingpong_rem2; peers), the sanitizer logs recorded under results.sanitizer; ddtree_verify.json
#      is rewritten after every point (results.complete false until the last), so a run cut short
#      keeps its points.
#   3. optional (PAD=1, about 40 s more): H = 8 with 32 nodes (256 rows: no partial row block) against
#      the 33-node points, the default and pingpong (pingpong_rem is pingpong at 256 rows), no peers, to
#      $OUT/t32/: the cost of H = 8's padding measured directly.
# Afterwards, here: copy $OUT/ddtree_verify.json into data/measurements/h200/, commit it, run
# .venv/bin/python -m workbench.ddtree.report and commit the paper; compare with the predictions in
# papers/ddtree_kernels.md (section 3, "Version 7").
set -u
OUT=${OUT:-out}
mkdir -p "$OUT/san"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
SAN="compute-sanitizer --kernel-name kns=ddtree_verify"
(
  c="$SAN --tool memcheck python3 -m workbench.ddtree.verify --smoke"
  echo "# command: $c" > "$OUT/san/memcheck.log"
  timeout "${SAN_T:-90}" $c >> "$OUT/san/memcheck.log" 2>&1
  echo "exit=$?" >> "$OUT/san/memcheck.log"
) &
(
  c="$SAN --tool racecheck python3 -m workbench.ddtree.verify --smoke --smoke-only pingpong"
  echo "# command: $c" > "$OUT/san/racecheck.log"
  timeout "${SAN_T:-90}" $c >> "$OUT/san/racecheck.log" 2>&1
  echo "exit=$?" >> "$OUT/san/racecheck.log"
) &
(
  timeout "${TEST_T:-90}" python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/gpu_tests.txt"
) &
wait
timeout "${BENCH_T:-140}" python3 -m workbench.ddtree.verify --out "$OUT" --reps "${REPS:-30}" \
  --peer-reps "${PEER_REPS:-5}" --sanitizer-logs "$OUT/san" > "$OUT/bench.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench.txt"
if [ "${PAD:-0}" = 1 ]; then
  mkdir -p "$OUT/t32"
  timeout "${PAD_T:-60}" python3 -m workbench.ddtree.verify --out "$OUT/t32" --no-parity --variants pingpong \
    --heads 8 --nodes 32 --reps 20 --peers > "$OUT/t32/bench.txt" 2>&1
  echo "pad rc=$?" >> "$OUT/t32/bench.txt"
fi
echo "== gpu tests"; tail -5 "$OUT/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=|command" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
echo "== parity (failed rows)"; grep -E " False$" "$OUT/bench.txt" | head -20; grep -E "^parity:" "$OUT/bench.txt"
echo "== bench"; tail -12 "$OUT/bench.txt"
