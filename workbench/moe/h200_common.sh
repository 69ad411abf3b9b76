# Sourced by the workbench/moe/h200_*.sh device scripts (run from the repository root, carrying .whl).
# h200_begin NAME: a temporary folder $R (with $R/logs) packed into $OUT/NAME.tgz when the script exits (the device
# returns one file per call), the carried wheels installed into /tmp/site, and the environment exported.
h200_begin() {
  OUT=${OUT:-out}
  R=$(mktemp -d)
  mkdir -p "$OUT" "$R/logs"
  trap "tar czf \"$OUT/$1.tgz\" -C \"$R\" . ; ls -la \"$OUT\"" EXIT
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
}

# san TOOL "VARIANTS": compute-sanitizer TOOL over the benchmark's small parity checks of those one-launch kernels
# (bench --sanitize), log and exit status in $R/logs/TOOL_<variants>.txt.
san() {
  timeout 170 compute-sanitizer --tool $1 python3 -u -m workbench.moe.bench --sanitize --variants none \
    --small-variants $2 > "$R/logs/${1}_${2// /_}.txt" 2>&1
  echo "$1 rc=$?" >> "$R/logs/${1}_${2// /_}.txt"
}
