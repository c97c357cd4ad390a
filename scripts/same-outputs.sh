#!/usr/bin/env bash
# Whether two plexus binaries write the same files: the check a refactoring round makes that it
# changed no behaviour. Both binaries run the same invocations — every committed claims table
# re-reported with its spec, a short train run and its `plot` figures (curves and C heatmaps), a
# short RL run, and a small sweep with a claim and its report — each into its own folder; then
# every file is compared byte for byte, except what records time (wall seconds, throughput, the
# RL table's seconds column, TensorBoard event files) or the binary's own path, and PDFs (svg2pdf
# orders a resource dictionary differently from run to run; the SVG they are made from is
# compared). Exits 1 and prints the differing lines where any file differs.
#
#   scripts/same-outputs.sh OLD_BINARY NEW_BINARY [WORK_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { sed -n 2,11p "$0"; exit 2; }
OLD="$(realpath "$1")"; NEW="$(realpath "$2")"
WORK="${3:-$(mktemp -d)}"
PLEXUS_DATA="${PLEXUS_DATA:-$("$ROOT/scripts/fetch-data.sh")}"
export PLEXUS_DATA
cd "$ROOT"
run_all() {
  local B="$1" O="$2"
  rm -rf "$O"; mkdir -p "$O/rep"
  for spec in configs/studies/*.yaml; do
    local n; n="$(basename "$spec" .yaml)"
    [ -f "docs/claims/$n.csv" ] || continue
    "$B" report "docs/claims/$n.csv" --spec "$spec" --out "$O/rep/$n" --formats png,svg > "$O/rep/$n.stdout" 2>&1 || echo "[exit status $?]" >> "$O/rep/$n.stdout"
  done
  "$B" train configs/mixer-fmnist/cpu/hacn.yaml --set train.steps=30 --set train.warmup_steps=5 --set log.eval_every=10 \
    --set log.connectivity_every=10 --out "$O/train" --quiet > "$O/train.stdout" 2>&1
  "$B" plot "$O/train" --out "$O/plot" --formats png,svg > "$O/plot.stdout" 2>&1
  "$B" rl configs/crl-maze/cpu/d4.yaml --set train.env_steps=3200 --set train.prefill_env_steps=800 \
    --set log.eval_every=1600 --out "$O/rl" --quiet > "$O/rl.stdout" 2>&1
  cat > "$O/spec.yaml" <<YAML
configs: [$ROOT/configs/mixer-fmnist/cpu/res.yaml, $ROOT/configs/mixer-fmnist/cpu/hacn.yaml]
set: {train.steps: 20, train.warmup_steps: 5, log.eval_every: 10}
seeds: [0, 1, 2]
out: $O/sweep
report: {formats: "png,svg"}
claims:
  - {id: t, statement: H-ACN ends more accurate, source: this check, metric: eval.accuracy, a: name=mixer-fmnist-cpu-hacn, b: name=mixer-fmnist-cpu-res, expect: greater}
YAML
  "$B" sweep "$O/spec.yaml" --jobs 2 --quiet > "$O/sweep.stdout" 2>&1
  "$B" report "$O/sweep" --out "$O/sweep-report" --formats png,svg > "$O/sweep-report.stdout" 2>&1
}
echo "[same-outputs] $OLD → $WORK/old" >&2
run_all "$OLD" "$WORK/old"
echo "[same-outputs] $NEW → $WORK/new" >&2
run_all "$NEW" "$WORK/new"
python3 - "$WORK" "$OLD" "$NEW" <<'PY'
import difflib, os, re, sys
work, old_bin, new_bin = sys.argv[1:]
# A time in a summary ("wall_seconds": 3.2) or a printed table (3.2s).
timed = [(re.compile(r'("(?:wall_seconds|samples_per_second|seconds)":\s*)[-+0-9.eE]+'), r"\1T"),
         (re.compile(r"\b\d+\.\d+s\b"), "Ts")]
def norm(text, side, binary):
    text = text.replace(os.path.join(work, side), "WORK").replace(binary, "PLEXUS")
    for pattern, to in timed:
        text = pattern.sub(to, text)
    return text.splitlines()
compared, differing = 0, 0
for root, _, files in os.walk(os.path.join(work, "old")):
    for f in sorted(files):
        a = os.path.join(root, f)
        b = os.path.join(work, "new", os.path.relpath(a, os.path.join(work, "old")))
        if f.endswith(".pdf") or f == ".lock" or "tfevents" in f:
            continue
        compared += 1
        if not os.path.exists(b):
            print(f"only in the old binary's output: {a}"); differing += 1; continue
        A, B = open(a, "rb").read(), open(b, "rb").read()
        if A == B:
            continue
        try:
            la, lb = norm(A.decode(), "old", old_bin), norm(B.decode(), "new", new_bin)
        except UnicodeDecodeError:
            print(f"differs (binary): {a}"); differing += 1; continue
        if os.path.basename(root) == "rl" and f == "metrics.csv":
            la, lb = [l.rsplit(",", 1)[0] for l in la], [l.rsplit(",", 1)[0] for l in lb]
        if la != lb:
            differing += 1
            print(f"differs: {a}")
            print("\n".join(list(difflib.unified_diff(la, lb, lineterm="", n=0))[2:12]))
print(f"[same-outputs] {compared} files compared, {differing} differ", file=sys.stderr)
sys.exit(1 if differing else 0)
PY
