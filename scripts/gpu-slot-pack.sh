#!/usr/bin/env bash
# Packs what a GPU slot needs into .gpu-slot/ (ignored by git), on a machine with cargo, before the
# slot: GPU machines lent to this project are offline, have no cargo, and are held ~30 minutes.
#
#   .gpu-slot/plexus    the release binary (debug symbols stripped), built by scripts/setup.sh
#   .gpu-slot/COMMIT    the commit it was built from ("+dirty" when the tree had changes)
#   .gpu-slot/SOURCES   the hash of its sources (scripts/source-hash.sh), which gpu-check.sh checks
#   .gpu-slot/data/     what the `train` group reads: fashion-mnist/ (its test set whole, its training
#                       set cut to the first 10,000 images, so that binary and data fit the device
#                       tool's 64 MiB: a GPU smoke run, not a result), text/tinyshakespeare.txt and
#                       text/wiki_summaries.txt (from scripts/fetch-data.sh's data root)
#   .gpu-slot/py/       PyYAML and safetensors from the venv, which the PyTorch references import and
#                       a GPU image with torch alone lacks (pure Python; safetensors' abi3 library)
#
#   scripts/gpu-slot-pack.sh            binary and data
#   scripts/gpu-slot-pack.sh --no-data  binary only (every group but `train` reads no data)
#
# Pack again after every change to the code: gpu-check.sh refuses a binary built from other sources
# than the checkout's (scripts/source-hash.sh). Then, on the GPU machine, from a copy of the repository with
# .gpu-slot/ in it:
#   scripts/gpu-check.sh --out DIR doctor kernels
# (scripts/gpu-check.sh --list: the groups). With this project's device tool: carry [".gpu-slot"],
# archives written to $OUT; gpu-check.sh's --budget (560 s) skips the steps that would not fit one
# command. The tool carries at most 64 MiB with the working tree: the sizes are printed at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SLOT="$ROOT/.gpu-slot"
WITH_DATA=1
[[ "${1:-}" == "--no-data" ]] && WITH_DATA=0

"$ROOT/scripts/setup.sh" >&2
mkdir -p "$SLOT"
# Not in .gitignore's list of build outputs on purpose: ignored here, per clone.
grep -qx '/.gpu-slot/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu-slot/' >>"$ROOT/.git/info/exclude"
strip --strip-debug -o "$SLOT/plexus.tmp" "$ROOT/target/release/plexus"
mv "$SLOT/plexus.tmp" "$SLOT/plexus"
commit="$(git -C "$ROOT" rev-parse --short HEAD)"
# Changed or untracked sources make it "+dirty".
[[ -z "$(git -C "$ROOT" status --porcelain -- src build.rs Cargo.toml Cargo.lock)" ]] || commit="$commit+dirty"
echo "$commit" >"$SLOT/COMMIT"
"$ROOT/scripts/source-hash.sh" >"$SLOT/SOURCES"

# The references' packages beyond torch, from the venv that scripts/setup.sh made.
rm -rf "$SLOT/py"
mkdir -p "$SLOT/py"
# (setup.sh wrote the venv's Python into .cargo/config.toml.)
VENV_PY="$(sed -n 's/^PLEXUS_PYTHON = "\(.*\)"$/\1/p' "$ROOT/.cargo/config.toml")"
SITE="$("$VENV_PY" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
for pkg in yaml safetensors; do
    if [[ -n $SITE && -d "$SITE/$pkg" ]]; then
        cp -r "$SITE/$pkg" "$SLOT/py/"
    else
        echo "[gpu-slot-pack] $pkg not found in the venv: the parity and bench-torch groups need it on the GPU machine" >&2
    fi
done
find "$SLOT/py" -name '__pycache__' -prune -exec rm -rf {} +

rm -rf "$SLOT/data"
if ((WITH_DATA)); then
    DATA="$("$ROOT/scripts/fetch-data.sh")"
    mkdir -p "$SLOT/data/fashion-mnist" "$SLOT/data/text"
    cp -L "$DATA"/fashion-mnist/t10k-*.gz "$SLOT/data/fashion-mnist/"
    # The first N samples of an IDX file: its header with the count N, then N records.
    cut_idx() {  # SRC DST HEADER_BYTES RECORD_BYTES N
        python3 - "$@" <<'PY'
import gzip, struct, sys
src, dst, header, record, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with gzip.open(src, "rb") as f:
    head = bytearray(f.read(header))
    body = f.read(record * n)
assert struct.unpack(">I", head[4:8])[0] >= n and len(body) == record * n, src
head[4:8] = struct.pack(">I", n)
with gzip.open(dst, "wb", compresslevel=9) as f:
    f.write(bytes(head) + body)
PY
    }
    cut_idx "$DATA/fashion-mnist/train-images-idx3-ubyte.gz" "$SLOT/data/fashion-mnist/train-images-idx3-ubyte.gz" 16 784 10000
    cut_idx "$DATA/fashion-mnist/train-labels-idx1-ubyte.gz" "$SLOT/data/fashion-mnist/train-labels-idx1-ubyte.gz" 8 1 10000
    for f in tinyshakespeare.txt wiki_summaries.txt; do
        if [[ -f "$DATA/text/$f" ]]; then
            cp -L "$DATA/text/$f" "$SLOT/data/text/"
        else
            echo "[gpu-slot-pack] $DATA/text/$f is missing: the train group's GPT/LLaMA runs will fail" >&2
        fi
    done
fi
echo "[gpu-slot-pack] $SLOT at $commit:" >&2
du -sh "$SLOT/plexus" "$SLOT/data" 2>/dev/null >&2 || true
total_kb=$(( $(du -sk "$SLOT" | cut -f1) + $(git -C "$ROOT" ls-files -z | du -ck --files0-from=- | tail -1 | cut -f1) ))
echo "[gpu-slot-pack] with the tracked files: $((total_kb / 1024)) MiB (the device tool carries at most 64 MiB)" >&2
((total_kb <= 64 * 1024)) || echo "[gpu-slot-pack] too large for the device tool: pack with --no-data" >&2
true
