#!/usr/bin/env bash
# Python with the project's environment (torch==2.11.0, numpy, safetensors, PyYAML: the venv that
# scripts/setup.sh keeps outside the clone), set up first if missing. For the PyTorch side of the
# benchmarks and the parity references, which the system Python cannot run (it has no torch):
#
#   scripts/python.sh parity/bench.py configs/mixer-fmnist/cpu/hacn.yaml --mode compile
#   scripts/python.sh parity/run.py --out-dir /tmp/ref parity/cases/hyper.yaml
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >&2
PY="$(sed -n 's/^PLEXUS_PYTHON *= *"\(.*\)"/\1/p' "$ROOT/.cargo/config.toml" | head -1)"
exec "${PY:?scripts/setup.sh wrote no PLEXUS_PYTHON into .cargo/config.toml}" "$@"
