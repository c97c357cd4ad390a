#!/usr/bin/env bash
# README command 1: set up whatever is missing, then run the main job on its embedded default: the
# showcase (residual, ACN and H-ACN MLP-Mixers trained on Fashion-MNIST, analysed and plotted, then
# the ANCRe Fig. 2b case study). Fashion-MNIST is fetched once (scripts/fetch-data.sh: Debian's
# dataset-fashion-mnist package, or the official mirror). Extra arguments go to `plexus demo`
# (e.g. --figure lnn-fig2c --out runs/fig2c).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
PLEXUS_DATA="$("$ROOT/scripts/fetch-data.sh")"
export PLEXUS_DATA
cd "$ROOT"
exec ./target/release/plexus demo "$@"
