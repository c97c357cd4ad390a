#!/usr/bin/env bash
# Redraws the figures of docs/claims.md that come from committed per-run tables
# (docs/claims/*.csv and their .curves.csv), with the binary of this checkout, into docs/figures/.
# Each is `plexus report TABLE --spec SPEC --out DIR` and one figure of DIR, as the page says
# under the figure. The RL success curve (rl-serpentine-success.png) is not redrawn here: its runs' curves are not committed;
# its claim's figure, drawn from the committed table, is. The DiT eval loss is drawn from a rerun
# of its sweep (docs/claims/replications/dit-fmnist-2026-12-02.csv and .curves.csv). The showcase's curves were committed on
# 2026-12-02 from a rerun of its sweep whose runs.csv matched docs/claims/showcase-seeds.csv byte
# for byte. Two figures are drawn by `plexus plot RUN` from one run of a study, whose folder is not
# committed, and are not redrawn here either: compose-depth-width.png (docs/compose.md) and
# mudd-char-ways.png (docs/topologies.md); the page names the run under each.
#
#   scripts/docs-figures.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh" >&2
PLEXUS="$ROOT/target/release/plexus"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# docs/figures name ← table (under docs/claims/), spec (under configs/studies/; `-` for none: a
# replication table without the spec's metrics, reported with the flags after the figure),
# figure of the report.
while read -r name table spec figure flags; do
  out="$work/$name"
  if [ "$spec" = - ]; then set -- $flags; else set -- --spec "configs/studies/$spec"; fi
  "$PLEXUS" report "docs/claims/$table" "$@" --out "$out" --formats png > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; exit 1; }
  [ -f "$out/$figure" ] || { echo "docs-figures: $table drew no $figure (it drew: $(ls "$out" | tr '\n' ' '))" >&2; exit 1; }
  cp "$out/$figure" "docs/figures/$name"
  echo "docs/figures/$name  ← $table: $figure"
done <<'TABLE'
ancre-fig2b-loss.png ancre-fig2b.csv ancre-fig2b.yaml curve-loss.png
hacn-mu-layer-gamma.png hacn-mu-layer.csv hacn-mu-layer.yaml curve-gamma.png
hacn-layer-gamma.png hacn-layer.csv hacn-layer.yaml curve-gamma.png
hacn-a-seeds.png hacn-a-seeds.csv hacn-a-seeds.yaml claim-hacn-a-correlates-across-seeds.png
llama-char-loss.png replications/llama-char-2026-11-28.csv llama-char.yaml curve-loss.png
dit-fd-curve-fd.png dit-fd-curve.csv dit-fd-curve.yaml curve-fd_fd.png
hacn-fig7-accuracy.png hacn-fig7.csv hacn-fig7.yaml curve-eval_accuracy.png
hacn-appendix-h-gamma.png hacn-appendix-h.csv hacn-appendix-h.yaml curve-gamma.png
graph-transplant-accuracy.png graph-transplant.csv graph-transplant.yaml curve-eval_accuracy.png
showcase-seeds-layerwise.png showcase-seeds.csv showcase-seeds.yaml curve-layerwise_accuracy.png
compose-char-vs-mhc.png compose-char.csv compose-char.yaml claim-compose-beats-mhc.png
showcase-seeds-noise.png showcase-seeds.csv showcase-seeds.yaml curve-noise_accuracy.png
dit-fmnist-claim-eps.png dit-fmnist.csv dit-fmnist.yaml claim-dit-ancre-lowers-eps.png
dit-fmnist-eval-loss.png replications/dit-fmnist-2026-12-02.csv - curve-eval_loss.png --by topology.kind --metric eval.loss --curves loss,eval.loss
rl-serpentine-claim-time-at-goal.png rl-serpentine.csv rl-serpentine.yaml claim-rl-ancre-d16-time-at-goal.png
hacn-paper-training-gamma.png hacn-paper-training.csv hacn-paper-training.yaml curve-gamma.png
mudd-char-vs-1.8x.png mudd-char.csv mudd-char.yaml claim-mudd-matches-residual-at-1_8x-steps.png
TABLE
