#!/usr/bin/env bash
# Times every test of the full suite one by one (each test binary run with `--exact NAME
# --include-ignored --test-threads=1`), JOBS at a time, and writes `binary<TAB>test<TAB>seconds<TAB>exit`
# lines to OUT (default bench/test-times/latest.tsv), slowest first, with each binary's estimated
# wall time (the larger of its longest test and its total over JOBS) and their sum on stderr. What
# dominates a CI run shows here; the numbers depend on what else the machine runs, so name the
# conditions beside any you commit (bench/test-times/README.md).
#
#   scripts/time-tests.sh [OUT] [JOBS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/bench/test-times/latest.tsv}"
JOBS="${2:-2}"
"$ROOT/scripts/setup.sh"
PLEXUS_DATA="$("$ROOT/scripts/fetch-data.sh")"
export PLEXUS_DATA OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
cd "$ROOT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Every test binary of the suite, as "target path".
cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' > "$work/bins"
while read -r name bin; do
  "$bin" --list --include-ignored 2>/dev/null | sed -n 's/: test$//p' | while read -r t; do
    printf '%s\t%s\t%s\n' "$name" "$bin" "$t"
  done
done < "$work/bins" > "$work/tests"
echo "[time-tests] $(wc -l < "$work/tests") tests in $(wc -l < "$work/bins") binaries, $JOBS at a time" >&2
time_one() {
  local name="$1" bin="$2" t="$3" start end rc=0
  start=$(date +%s.%N)
  "$bin" --exact "$t" --include-ignored --test-threads=1 > /dev/null 2>&1 || rc=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%.1f\t%d\n' "$name" "$t" "$(echo "$end - $start" | bc)" "$rc"
}
export -f time_one
tr '\n' '\0' < "$work/tests" | xargs -0 -P "$JOBS" -I{} bash -c 'IFS=$'"'"'\t'"'"' read -r n b t <<< "$1"; time_one "$n" "$b" "$t"' _ {} \
  > "$work/times"
mkdir -p "$(dirname "$OUT")"
sort -t$'\t' -k3 -nr "$work/times" > "$OUT"
awk -F'\t' -v jobs="$JOBS" '{ s[$1] += $3; if ($3 > m[$1]) m[$1] = $3; if ($4 != 0) bad++ }
  END { for (k in s) { w = (s[k] / jobs > m[k]) ? s[k] / jobs : m[k]; tot += w; printf "%8.1f s  %s\n", w, k | "sort -rn" }
        close("sort -rn"); printf "%8.1f s  estimated wall time of the suite, %d failed\n", tot, bad }' "$OUT" >&2
echo "[time-tests] $OUT" >&2
