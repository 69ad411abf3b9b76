#!/usr/bin/env bash
# Device calls for the tree-verify attention kernel (workbench/ddtree/verify.py; driver: verify_bench.py), from the repository
# root on the H200 (or a copy of the tree), carrying .whl (pytest for the device's python3):
#   run(command="cd .wt/verify && WORKBENCH_COMMIT=<commit> MODE=probe bash workbench/ddtree/h200_verify.sh",
#       carry=[".whl", ".wt/verify"], timeout_s=300)       (the wheels are then at ../../.whl)
# MODE=probe (about 2 minutes): correctness of the current default and where its time goes:
#   1. in parallel, before any timing: memcheck and racecheck of the smoke cases matching $SMOKE; the
#      gpu tests of verify matching $TESTS (fresh random inputs, poisoned outputs, every element).
#   2. alone: verify_probe (each launch of one call replayed alone, the whole call, minimal graph
#      nodes) for the default and $PROBE_VARIANTS -> $OUT/ddtree_verify_probe.json; ncu sections
#      (speed of light, warp states, scheduler, memory) of the attention kernel at $NCU_POINTS -> $OUT/ncu.txt.
# MODE=final (about 4 minutes): the gpu tests of verify; memcheck of every smoke case and racecheck of
#   the wgmma ones in parallel; then alone the parity grid + benchmark with peers and variants
#   ($BENCH_VARIANTS, default: mma and verify.WGMMA_VARIANTS) -> $OUT/ddtree_verify.json, rewritten after
#   every point; then the probe breakdown at $FINAL_POINTS for the default, the previous default and the
#   diagnostic builds (gathers alone, compute alone) -> $OUT/ddtree_verify_probe.json.
set -u
OUT=${OUT:-out}
MODE=${MODE:-probe}
SMOKE=${SMOKE:-wgmma}                       # probe: smoke cases under the sanitizers (--smoke-only)
TESTS=${TESTS:-}                            # probe: gpu tests selected with -k (empty: all of verify's)
PROBE_VARIANTS=${PROBE_VARIANTS:-wgmma_5de266b s1_prepare_merge1 s1_merge1}
NCU_POINTS=${NCU_POINTS:-64:16384 8:131072}
FINAL_POINTS=${FINAL_POINTS:-8:4096 8:16384 8:131072 64:4096 64:16384 64:131072}  # final: probe breakdown
WHL=${WHL:-../../.whl}
mkdir -p "$OUT/san"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
SAN="compute-sanitizer --kernel-name kns=ddtree_verify"
san() {  # tool, smoke filter ('' = every smoke case)
  local c="$SAN --tool $1 python3 -m workbench.ddtree.verify_bench --smoke"
  [ -n "$2" ] && c="$c --smoke-only=$2"
  echo "# command: $c" > "$OUT/san/$1.log"
  timeout "${SAN_T:-100}" $c >> "$OUT/san/$1.log" 2>&1
  echo "exit=$?" >> "$OUT/san/$1.log"
}
if [ "$MODE" = probe ]; then
  san memcheck "$SMOKE" &
  san racecheck "$SMOKE" &
  timeout 100 python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider ${TESTS:+-k "$TESTS"} \
    > "$OUT/gpu_tests.txt" 2>&1 &
  wait
  timeout 90 python3 -m workbench.ddtree.verify_probe --out "$OUT" --variants default $PROBE_VARIANTS \
    --sweep > "$OUT/probe.txt" 2>&1
  echo "probe rc=$?" >> "$OUT/probe.txt"
  timeout 90 ncu --clock-control none --profile-from-start off -k regex:wgmma --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 -m workbench.ddtree.verify_probe --ncu --points $NCU_POINTS --variants default > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu.txt"
  echo "== gpu tests"; tail -3 "$OUT/gpu_tests.txt"
  echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
  echo "== ncu"; grep -E "Stall|Throughput|Duration|Issued|Eligible|No Eligible|ncu point|rc=" "$OUT/ncu.txt" | head -60
  echo "== probe"; tail -16 "$OUT/probe.txt"
  exit 0
fi
# MODE=final
san memcheck "" &
san racecheck "wgmma" &
(
  timeout "${TEST_T:-100}" python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/gpu_tests.txt"
) &
wait
timeout "${BENCH_T:-200}" python3 -m workbench.ddtree.verify_bench --out "$OUT" --reps "${REPS:-30}" \
  --peer-reps "${PEER_REPS:-5}" --sanitizer-logs "$OUT/san" ${BENCH_VARIANTS:+--variants $BENCH_VARIANTS} \
  > "$OUT/bench.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench.txt"
timeout "${PROBE_T:-90}" python3 -m workbench.ddtree.verify_probe --out "$OUT" --sweep --points $FINAL_POINTS \
  --variants default wgmma_5de266b diag_gather=-DVERIFY_WG_DIAG=1 diag_compute=-DVERIFY_WG_DIAG=2 \
  > "$OUT/probe.txt" 2>&1
echo "probe rc=$?" >> "$OUT/probe.txt"
echo "== gpu tests"; tail -4 "$OUT/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=|command" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
echo "== parity (failed rows)"; grep -E " False$" "$OUT/bench.txt" | head -20; grep -E "^parity:" "$OUT/bench.txt"
echo "== bench"; tail -12 "$OUT/bench.txt"
echo "== probe"; tail -26 "$OUT/probe.txt"
