#!/usr/bin/env bash
# README command 1: set up whatever is missing, then run the main job on its embedded default
# (ANCRe Fig. 2b case study: prints the result table, writes runs/demo/figures/loss.{png,svg}).
# Extra arguments go to `plexus demo` (e.g. --figure lnn-fig2c --out runs/fig2c).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
exec ./target/release/plexus demo "$@"
