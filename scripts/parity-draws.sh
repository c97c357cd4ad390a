#!/usr/bin/env bash
# Every parity case on N random draws (default 20) in each kernel mode: the fused kernels
# (PLEXUS_FUSED_KERNELS=1, the default), the composite libtorch code (0) and the GPU paths' host
# build (cuda-host). Draw k seeds the reference's weights, input and cotangent with the case's
# seed + 1000003·k (`plexus parity --draws N`; parity/SPEC.md "Tolerance"). The slow test tier
# runs 2 draws per mode (tests/it/parity.rs, parity_holds_on_random_draws_in_every_kernel_mode);
# this runs the full set and writes a summary.
#
#   scripts/parity-draws.sh [--draws N] [--threads T] [--only NAME] [--out FILE]
#                                         # FILE: bench/parity-draws.txt; --only: cases named *NAME*
#
# The summary gives, per mode: the case-draws that passed and failed, each failure's line; the
# largest ratio of a tensor's error to its bound; the bf16 case-draws past the direct bound (on a
# few draws of a case: a rounding that flipped, src/parity.rs TOL_BF16_DIRECT); and how many would
# fail the bound used before the spread runs (8 x the reference's one run + the case's largest
# such error; the direct bound aside). Each mode's full table (one line per case and draw) and CSV
# (one row per tensor) are kept in a temporary folder the script names. Exits non-zero if any
# case-draw fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
draws=20
threads=""
only=""
out="$ROOT/bench/parity-draws.txt"
while [ $# -gt 0 ]; do
  case "$1" in
    --draws) draws="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--draws N] [--threads T] [--only NAME] [--out FILE]" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/setup.sh" >&2
cd "$ROOT"
mkdir -p "$(dirname "$out")"
logs="$(mktemp -d "${TMPDIR:-/tmp}/parity-draws.XXXXXX")"
args=(--draws "$draws")
[ -n "$threads" ] && args+=(--threads "$threads")
[ -n "$only" ] && args+=(--only "$only")

summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
{
  echo "# scripts/parity-draws.sh --draws $draws${threads:+ --threads $threads}${only:+ --only $only}"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src native parity 2>/dev/null || echo ' (with uncommitted changes)'), $(date -u +%Y-%m-%d)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc --all) cores"
  echo "# every case of parity/cases${only:+ named *$only*} on draws 1..$draws in each kernel mode; a case-draw passes when every"
  echo "# tensor is within GROWTH x the worst of the reference's runs + FLOOR_ULPS units of roundoff"
  echo "# (src/parity.rs; parity/SPEC.md, Tolerance); a bf16 case fails the direct bound where it"
  echo "# exceeds it on most of its draws (src/parity.rs, TOL_BF16_DIRECT)"
} > "$summary"

failed_modes=0
for mode in 1 0 cuda-host; do
  log="$logs/parity-draws-$mode.log"
  start=$(date +%s)
  status=0
  csv="$logs/parity-draws-$mode.csv"
  PLEXUS_FUSED_KERNELS="$mode" ./target/release/plexus parity "${args[@]}" --csv "$csv" >"$log" 2>&1 || status=$?
  secs=$(($(date +%s) - start))
  result="$(grep -E '^parity: ' "$log" || echo "parity: no result (exit $status)")"
  cases="$(grep -E ' cases × ' "$log" || true)"
  worst="$(awk '$NF == "pass" || $NF == "FAIL" || $NF == "direct" { r = $(NF - 3) + 0; if (r > m) { m = r; w = $1 " " $3 } }
    END { printf "%.2f (%s)", m, w }' "$log")"
  # The same runs judged by the previous bound: 8 × the reference's one run + the case's largest
  # such error (at least 4 units of roundoff), without the spread runs (the direct bound aside).
  previous="$(awk -F, '
    NR > 1 {
      k = $1 "@" $2; u = ($3 == "bf16") ? 2 ^ -8 : 2 ^ -24; n[k]++; p[k, n[k]] = $5; r[k, n[k]] = $6; t[k, n[k]] = $4
      if (!(k in lvl) || $6 > lvl[k]) lvl[k] = $6
      fl[k] = 4 * u
    }
    END {
      for (k in n) {
        f = (lvl[k] > fl[k]) ? lvl[k] : fl[k]; worst = 0; name = ""
        for (i = 1; i <= n[k]; i++) {
          ratio = p[k, i] / (8 * r[k, i] + f)
          if (p[k, i] != p[k, i] + 0 || ratio > worst) { worst = ratio; name = t[k, i] }
        }
        if (worst > 1) { failed++; printf "    %s %s ratio %.2f\n", k, name, worst }
        cases++
      }
      printf "~ %d of %d failed\n", failed, cases
    }' "$csv" | sort -V)"
  {
    echo
    echo "PLEXUS_FUSED_KERNELS=$mode: $cases, $result; largest error/bound $worst; $((secs / 60)) min $((secs % 60)) s"
    grep -E '( FAIL| ERROR| direct)$|^FAIL: |^within the bound, past the direct bound' "$log" | sed 's/^/  /' || true
    echo "  the bound before the spread runs (8 x the reference's one run + the case's largest such error):" \
      "$(grep '^~' <<<"$previous" | cut -c3-)"
    grep -v '^~' <<<"$previous" || true
  } >> "$summary"
  [ "$status" -eq 0 ] || failed_modes=$((failed_modes + 1))
done
cp "$summary" "$out"
cat "$out"
echo "full tables: $logs/parity-draws-{1,0,cuda-host}.{log,csv}" >&2
exit $((failed_modes > 0))
