#!/usr/bin/env bash
# H-ACN findings at small scale (docs/results.md, "H-ACN findings at small scale"): the paper's Table 2
# initialisations μ ∈ {0.25, 0.75, 1} × seeds 0–2 on the CPU-size Mixer on CIFAR-10, and the same
# μ = 0.25 model on CIFAR-2, with the residual weights' learning rate ×10 so that they move. Prints
# mean ± std of accuracy and Γ per setting. About 10 minutes on 2 cores.
#
#   scripts/hacn-study.sh [OUT_DIR]      # default runs/hacn-study; needs CIFAR-10 under $PLEXUS_DATA
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-runs/hacn-study}"
"$ROOT/scripts/setup.sh" >&2
P="$ROOT/target/release/plexus"
mkdir -p "$OUT"
for seed in 0 1 2; do
  for mu in 0.25 0.75 1.0; do
    "$P" train "$ROOT/configs/mixer-cifar10/cpu/hacn.yaml" --out "$OUT/c10-mu$mu-s$seed" --quiet --overwrite \
      --set seed=$seed --set "topology.init.mu=$mu" --set train.topology_lr_mult=10 >/dev/null
  done
  "$P" train "$ROOT/configs/mixer-cifar2/cpu/hacn.yaml" --out "$OUT/c2-mu0.25-s$seed" --quiet --overwrite \
    --set seed=$seed --set "topology.init.mu=0.25" --set train.topology_lr_mult=10 >/dev/null
done
python3 - "$OUT" <<'PY'
import csv, glob, json, os, statistics as st, sys
rows = {}
for d in sorted(d for d in glob.glob(os.path.join(sys.argv[1], "c*-s*")) if os.path.isdir(d)):
    s = json.load(open(os.path.join(d, "summary.json")))
    first = next(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
    rows.setdefault(os.path.basename(d).rsplit("-s", 1)[0], []).append(
        (100 * s["eval"]["accuracy"], float(first["gamma"]), s["gamma"]))
sd = lambda x: st.stdev(x) if len(x) > 1 else float("nan")
print(f"{'run':16} {'n':>2} {'accuracy':>16} {'Γ init':>8} {'Γ end':>16}")
for k, v in rows.items():
    acc, g0, g = [a for a, _, _ in v], [b for _, b, _ in v], [c for _, _, c in v]
    print(f"{k:16} {len(v):>2} {st.mean(acc):7.2f} ± {sd(acc):5.2f} % {st.mean(g0):8.3f} {st.mean(g):7.3f} ± {sd(g):5.3f}")
PY
