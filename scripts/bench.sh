#!/usr/bin/env bash
# The benchmark driver (issue: plexus against PyTorch eager / torch.compile, topology overhead,
# cost versus depth): sets up what is missing, then runs bench/run.py with the venv's Python and
# writes bench/results.md (about an hour on a 2-core CPU with compile; --no-compile: ~15 minutes).
# Extra arguments go to bench/run.py (e.g. --backbones gpt --topologies residual,hacn --rounds 3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
PY="$(sed -n 's/^PLEXUS_PYTHON *= *"\(.*\)"/\1/p' "$ROOT/.cargo/config.toml" | head -1)"
cd "$ROOT"
exec "${PY:-python3}" bench/run.py "$@"
