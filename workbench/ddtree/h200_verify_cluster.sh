#!/usr/bin/env bash
# One device call for the cluster variant of the tree-verify kernel (impl="cluster", NOT YET RUN ON A GPU when
# written), from the repository root on the H200 (or a copy of the tree), carrying .whl (pytest for python3):
#   rsync -a --delete --exclude .git /work/wt-vc/ /work/main/.wt/vc/
#   run(command="cd .wt/vc && WORKBENCH_COMMIT=<commit> bash workbench/ddtree/h200_verify_cluster.sh",
#       carry=[".whl", ".wt/vc"], timeout_s=290)                     (the wheels are then at ../../.whl)
# About 4 minutes (timeouts: 75 s for the parallel checks, 65 + 30 s benchmarks, 70 s probe):
#   1. in parallel, before any timing: memcheck and racecheck of the cluster smoke cases
#      (verify_bench --smoke --smoke-only=cluster); the gpu tests of verify that name the cluster variant
#      (parity at odd and even row-block counts, bit-identity with the default, no host sync + CUDA graph)
#      -> $OUT/gpu_tests.txt, $OUT/san/*.log
#   2. alone: the benchmark of the default with the cluster variants beside it in one process (cluster: the
#      default's chunking; cluster_bal: one request's solo row block on shorter chunks; T=33 nodes, H=8 and 64,
#      prefix 4k-128k; no peers, no parity grid) -> $OUT/ddtree_verify_cluster.json; the default and cluster
#      at T=32, H=64 (32 row blocks: every CTA shares) -> $OUT/ddtree_verify_cluster_t32.json
#   3. alone: the probe breakdown at 16k and 128k (per-tile costs) for the default, the cluster variant and
#      the gathers-alone builds (default: whole tiles; cluster: half tiles + copies to the partner; cluster
#      without the copies) -> $OUT/ddtree_verify_cluster_probe.json
# Afterwards: copy the JSON files into data/measurements/h200/, append OUTCOME sentences (after the run,
# labelled) to their notes, regenerate the paper (python -m workbench.ddtree.report). A slower variant is
# reverted (the idea and the figures stay in the paper).
set -u
OUT=${OUT:-out}
WHL=${WHL:-../../.whl}
mkdir -p "$OUT/san"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
PRED=$(python3 -c "from workbench.ddtree.verify_cluster import PREDICTION; print(PREDICTION)")
SAN="compute-sanitizer --kernel-name kns=ddtree_verify"
san() {  # tool
  local c="$SAN --tool $1 python3 -m workbench.ddtree.verify_bench --smoke --smoke-only=cluster"
  echo "# command: $c" > "$OUT/san/$1.log"
  timeout "${SAN_T:-75}" $c >> "$OUT/san/$1.log" 2>&1
  echo "exit=$?" >> "$OUT/san/$1.log"
}
san memcheck &
san racecheck &
(
  timeout "${TEST_T:-75}" python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider -k cluster \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/gpu_tests.txt"
) &
wait
timeout "${BENCH_T:-65}" python3 -m workbench.ddtree.verify_bench --out "$OUT" --name ddtree_verify_cluster \
  --no-parity --peers --variants cluster cluster_bal --reps "${REPS:-20}" --sanitizer-logs "$OUT/san" \
  --extra-notes "$PRED" > "$OUT/bench.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench.txt"
timeout "${BENCH32_T:-30}" python3 -m workbench.ddtree.verify_bench --out "$OUT" --name ddtree_verify_cluster_t32 \
  --no-parity --peers --variants cluster --nodes 32 --heads 64 --prefixes 16384 131072 --reps "${REPS:-20}" \
  --extra-notes "$PRED" > "$OUT/bench_t32.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_t32.txt"
timeout "${PROBE_T:-70}" python3 -m workbench.ddtree.verify_probe --out "$OUT" --name ddtree_verify_cluster_probe \
  --points 64:16384:32 64:131072:32 64:16384 64:131072 8:16384 8:131072 --sweep --reps 20 \
  --variants default cluster diag_gather=-DVERIFY_WG_DIAG=1 cluster_diag_gather cluster_diag_half \
  --extra-notes "$PRED" \
  > "$OUT/probe.txt" 2>&1
echo "probe rc=$?" >> "$OUT/probe.txt"
echo "== gpu tests"; tail -4 "$OUT/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
echo "== bench T=33"; tail -9 "$OUT/bench.txt"
echo "== bench T=32"; tail -3 "$OUT/bench_t32.txt"
echo "== probe"; tail -38 "$OUT/probe.txt"
