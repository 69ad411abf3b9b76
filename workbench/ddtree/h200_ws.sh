#!/usr/bin/env bash
# One device call (repository root, carry .whl; 2-5 minutes): the warp-specialised verify kernel (impl="wgmma_ws",
# verify_bench.WS_VARIANTS). First, alone and under a short timeout (a barrier mismatch would hang): its parity test;
# then, only if that passed: every gpu test of verify, memcheck and racecheck of the kernel (in parallel), and alone the
# benchmark of the default beside ws and the previous default (no peers, no parity grid) -> ddtree_verify_ws16.json.
# $OUT/ws.tgz. Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/ddtree/h200_ws.sh
set -u
source "$(dirname "$0")/../moe/h200_common.sh"
h200_begin ws16
timeout 60 python3 -m pytest -v -m gpu tests/test_ddtree_verify.py -p no:cacheprovider -x \
  -k "warp_specialised" > "$R/logs/ws_parity.txt" 2>&1
rc=$?
echo "ws parity rc=$rc" >> "$R/logs/ws_parity.txt"
echo "== ws parity"; tail -30 "$R/logs/ws_parity.txt" | cut -c1-400
[ $rc -eq 0 ] || exit 0
SNIP="import torch; from workbench.ddtree import verify as V
for i, (n, h, p, cl) in enumerate(((33, 8, 4133, None), (33, 64, 777, None), (33, 8, 1000, 48), (17, 8, [0, 500, 70, 2000], None))):
    st = V.random_verify_inputs(n, h, p, torch.bfloat16, 'cuda', seed=i)
    fn = V.verify_attention_batched if isinstance(p, list) else V.verify_attention
    o, l = fn(**st, chunk_len=cl, impl='wgmma_ws'); torch.cuda.synchronize(); print('case', i, bool(torch.isfinite(o).all()))"
for tool in memcheck racecheck; do
  ( timeout 200 compute-sanitizer --tool $tool --kernel-name kns=ddtree_verify_wgmma_ws python3 -c "$SNIP" \
      > "$R/logs/$tool.txt" 2>&1
    echo "$tool rc=$?" >> "$R/logs/$tool.txt" ) &
done
( timeout 200 python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt" ) &
wait
PRED=$(python3 -c "from workbench.ddtree.verify_bench import WS16_PREDICTION as p; print(p)")
timeout "${BENCH_T:-240}" python3 -m workbench.ddtree.verify_bench --out "$R" --name ddtree_verify_ws16 \
  --variants ws16 --peers --no-parity --reps "${REPS:-30}" \
  --extra-notes "Prediction: $PRED" > "$R/logs/bench.txt" 2>&1
echo "bench rc=$?" >> "$R/logs/bench.txt"
echo "== gpu tests"; tail -3 "$R/logs/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|rc=|case" "$R/logs/memcheck.txt" "$R/logs/racecheck.txt"
echo "== bench"; tail -14 "$R/logs/bench.txt"
python3 - "$R/ddtree_verify_ws16.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["results"]
print("H prefix | default one/in-graph us | ws16 one/in-graph")
for p in d["points"]:
    v = p["variants"]
    f = lambda n, k: round(v[n][k] * 1e3, 1) if n in v and k in v[n] else None
    print(p["heads"], p["prefix"], round(p["median_ms"] * 1e3, 1), round(p["batched_ms"] * 1e3, 1), "|",
          f("ws16", "median_ms"), f("ws16", "batched_ms"))
PY
