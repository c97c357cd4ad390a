#!/usr/bin/env bash
# README command 2: set up whatever is missing, then run the whole test suite (unit, integration,
# CLI, PyTorch parity). `.ci/run` calls exactly this. Extra arguments go to `cargo test`.
# Real-data tests read $PLEXUS_DATA (scripts/fetch-data.sh: Fashion-MNIST always; CIFAR-10 and the
# text corpora where ../shared/data provides them; see tests/data.rs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
PLEXUS_DATA="$("$ROOT/scripts/fetch-data.sh")"
export PLEXUS_DATA
cd "$ROOT"
# Same profile as the binary the README runs, so the tch build is shared.
exec cargo test --release "$@"
