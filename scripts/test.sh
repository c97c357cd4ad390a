#!/usr/bin/env bash
# README command 2: set up whatever is missing, then run the whole test suite (unit, integration,
# CLI). `.ci/run` calls exactly this. Extra arguments go to `cargo test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
# Same profile as the binary the README runs, so the tch build is shared.
exec cargo test --release "$@"
