#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 4 minutes): the verify kernel with the slot indices one tile
# ahead in shared memory (VERIFY_WG_SLOTRING, verify_bench.SLOTRING_VARIANTS). In parallel first: every gpu test of
# verify (the variant's outputs bit-identical to the default's, its parity), memcheck and racecheck of the variant;
# then alone: the benchmark of the default beside the variant and both gather-alone builds at the eight points (no
# peers, no parity grid) -> ddtree_verify_slotring.json. $OUT/slotring.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/ddtree/h200_slotring.sh
set -u
source "$(dirname "$0")/../moe/h200_common.sh"
h200_begin slotring
SNIP="import torch; from workbench.ddtree import verify as V, verify_bench as VB
kw = VB.SLOTRING_VARIANTS['slotring']
for i, (h, p, cl) in enumerate(((8, 4133, None), (64, 777, None), (8, 1000, 64), (8, [0, 500, 70, 2000], None))):
    st = V.random_verify_inputs(33, h, p, torch.bfloat16, 'cuda', seed=i)
    fn = V.verify_attention_batched if isinstance(p, list) else V.verify_attention
    o, l = fn(**st, chunk_len=cl, **kw); torch.cuda.synchronize(); print('case', i, bool(torch.isfinite(o).all()))"
for tool in memcheck racecheck; do
  ( timeout 200 compute-sanitizer --tool $tool --kernel-name kns=ddtree_verify python3 -c "$SNIP" > "$R/logs/$tool.txt" 2>&1
    echo "$tool rc=$?" >> "$R/logs/$tool.txt" ) &
done
( timeout 200 python3 -m pytest -q -m gpu tests/test_ddtree_verify.py -p no:cacheprovider > "$R/logs/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$R/logs/gpu_tests.txt" ) &
wait
PRED=$(python3 -c "from workbench.ddtree.verify_bench import SLOTRING_PREDICTION as p; print(p)")
timeout "${BENCH_T:-240}" python3 -m workbench.ddtree.verify_bench --out "$R" --name ddtree_verify_slotring \
  --variants slotring diag_gather slotring_diag_gather --peers --no-parity --reps "${REPS:-30}" \
  --extra-notes "Prediction: $PRED" > "$R/logs/bench.txt" 2>&1
echo "bench rc=$?" >> "$R/logs/bench.txt"
echo "== gpu tests"; tail -3 "$R/logs/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|rc=|case" "$R/logs/memcheck.txt" "$R/logs/racecheck.txt"
echo "== bench"; tail -14 "$R/logs/bench.txt"
python3 - "$R/ddtree_verify_slotring.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["results"]
print("H prefix | default one/in-graph us | slotring one/in-graph | diag_gather in-graph | slotring_diag in-graph")
for p in d["points"]:
    v = p["variants"]
    f = lambda n, k: round(v[n][k] * 1e3, 1) if n in v and k in v[n] else None
    print(p["heads"], p["prefix"], round(p["median_ms"] * 1e3, 1), round(p["batched_ms"] * 1e3, 1), "|",
          f("slotring", "median_ms"), f("slotring", "batched_ms"), "|", f("diag_gather", "batched_ms"), "|",
          f("slotring_diag_gather", "batched_ms"))
PY
