#!/usr/bin/env bash
# Device calls for the tree-verify attention kernel (workbench/ddtree/verify.py), from the repository
# root on the H200 (or a copy of the tree), carrying .whl (pytest for the device's python3):
#   run(command="cd .wt/verify && WORKBENCH_COMMIT=<commit> MODE=probe bash workbench/ddtree/h200_verify.sh",
#       carry=[".whl", ".wt/verify"], timeout_s=300)       (the wheels are then at ../../.whl)
# MODE=probe (about 3 minutes): where the time goes and whether a -D variant ($VARIANT, a name of
#   verify.WGMMA_VARIANTS, with its -D options $VOPTS) is worth making the default:
#   1. in parallel, before any timing: memcheck and racecheck of the variant's smoke cases; the GPU
#      parity grid of the variant (fresh random inputs, poisoned outputs, every element).
#   2. alone: verify_probe (each launch of one call replayed alone, the whole call, minimal graph nodes,
#      chunk-length sweep) for the default and the variant -> $OUT/ddtree_verify_probe.json; ncu
#      gpu__time_duration of each launch at H 8/64, prefix 4k/128k -> $OUT/ncu.csv; the benchmark
#      (no peers) of the default beside the variant -> $OUT/bench/ddtree_verify.json.
# MODE=final (about 4 minutes): the gpu tests of verify; memcheck of every smoke case and racecheck of
#   the wgmma ones in parallel; then alone the parity grid + benchmark with peers and variants
#   ($BENCH_VARIANTS) -> $OUT/ddtree_verify.json, rewritten after every point.
set -u
OUT=${OUT:-out}
MODE=${MODE:-probe}
VARIANT=${VARIANT:-wgmma_s1}
VOPTS=${VOPTS:--DVERIFY_WG_S1=1}
WHL=${WHL:-../../.whl}
mkdir -p "$OUT/san"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
SAN="compute-sanitizer --kernel-name kns=ddtree_verify"
san() {  # tool, smoke filter ('' = every smoke case)
  local c="$SAN --tool $1 python3 -m workbench.ddtree.verify --smoke"
  [ -n "$2" ] && c="$c --smoke-only=$2"
  echo "# command: $c" > "$OUT/san/$1.log"
  timeout "${SAN_T:-100}" $c >> "$OUT/san/$1.log" 2>&1
  echo "exit=$?" >> "$OUT/san/$1.log"
}
if [ "$MODE" = probe ]; then
  san memcheck "$VOPTS" &
  san racecheck "$VOPTS" &
  timeout 100 python3 - > "$OUT/parity_variant.txt" 2>&1 <<EOF &
from workbench.ddtree import verify as V
cases = [c for c in V.default_parity_cases("cuda") if c.get("options") == list(V.WGMMA_VARIANTS["$VARIANT"]["_options"])]
rows = V.verify_parity_rows(cases, "cuda", seed=5)
print(V._rows_table(rows))
print("variant parity:", sum(r["pass"] for r in rows), "/", len(rows))
EOF
  wait
  timeout 90 python3 -m workbench.ddtree.verify_probe --out "$OUT" --variants default "s1=$VOPTS" \
    > "$OUT/probe.txt" 2>&1
  echo "probe rc=$?" >> "$OUT/probe.txt"
  timeout 60 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    python3 -m workbench.ddtree.verify_probe --ncu --variants default "s1=$VOPTS" > "$OUT/ncu.csv" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu.csv"
  mkdir -p "$OUT/bench"
  timeout 80 python3 -m workbench.ddtree.verify --out "$OUT/bench" --no-parity --variants "$VARIANT" --peers \
    --reps 30 > "$OUT/bench/bench.txt" 2>&1
  echo "bench rc=$?" >> "$OUT/bench/bench.txt"
  echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
  echo "== variant parity"; grep -E "False$|variant parity" "$OUT/parity_variant.txt" | tail -8
  echo "== ncu"; grep -E "ddtree_verify" "$OUT/ncu.csv" | awk -F'","' '{print substr($5,1,40)" | grid "$9" | "$(NF)}'  | head -40
  echo "== probe"; tail -22 "$OUT/probe.txt"
  echo "== bench"; tail -10 "$OUT/bench/bench.txt"
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
timeout "${BENCH_T:-150}" python3 -m workbench.ddtree.verify --out "$OUT" --reps "${REPS:-30}" \
  --peer-reps "${PEER_REPS:-5}" --sanitizer-logs "$OUT/san" ${BENCH_VARIANTS:+--variants $BENCH_VARIANTS} \
  > "$OUT/bench.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench.txt"
echo "== gpu tests"; tail -4 "$OUT/gpu_tests.txt"
echo "== sanitizers"; grep -hE "SUMMARY|SMOKE|exit=|command" "$OUT/san/memcheck.log" "$OUT/san/racecheck.log"
echo "== parity (failed rows)"; grep -E " False$" "$OUT/bench.txt" | head -20; grep -E "^parity:" "$OUT/bench.txt"
echo "== bench"; tail -12 "$OUT/bench.txt"
