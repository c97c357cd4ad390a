#!/usr/bin/env bash
# Prints a data root (a folder holding `fashion-mnist/`, and `cifar10/` and `text/` where available) and
# fetches what is missing. Idempotent: a second call finds everything in place and only prints.
#
# Order of preference:
#   1. $PLEXUS_DATA, when set and it holds fashion-mnist/ — used as is.
#   2. A data root assembled under ~/.cache/plexus/data/root (or $PLEXUS_CACHE/data/root) with links to
#      - fashion-mnist/: /usr/share/datasets/fashion-mnist (Debian's `dataset-fashion-mnist`), else the
#        shared data folder next to the clone (../shared/data), else the Debian package downloaded with
#        `apt-get download` and unpacked with `dpkg -x` (no root needed), else the official files
#        from Zalando's mirror with curl;
#      - cifar10/ and text/: the shared data folder when present (users: see README "Data").
#
# Usage: PLEXUS_DATA="$(scripts/fetch-data.sh)"   (progress goes to stderr, the root to stdout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

has_fmnist() { for f in "${FILES[@]}"; do [[ -s "$1/$f" ]] || return 1; done; }

if [[ -n "${PLEXUS_DATA:-}" ]] && has_fmnist "$PLEXUS_DATA/fashion-mnist"; then
    echo "$PLEXUS_DATA"
    exit 0
fi

CACHE="${PLEXUS_CACHE:-$HOME/.cache/plexus}/data"
DATA="$CACHE/root"
mkdir -p "$DATA"
SHARED="$(cd "$ROOT/.." && pwd)/shared/data"

link() { # link NAME TARGET: point $DATA/NAME at TARGET unless it already resolves to a folder
    [[ -e "$DATA/$1" ]] || ln -sfn "$2" "$DATA/$1"
}

if ! has_fmnist "$DATA/fashion-mnist"; then
    rm -f "$DATA/fashion-mnist"
    if has_fmnist /usr/share/datasets/fashion-mnist; then
        link fashion-mnist /usr/share/datasets/fashion-mnist
    elif has_fmnist "$SHARED/fashion-mnist"; then
        link fashion-mnist "$SHARED/fashion-mnist"
    else
        DEB="$CACHE/debian"
        if ! has_fmnist "$DEB/usr/share/datasets/fashion-mnist" && command -v apt-get >/dev/null \
            && command -v dpkg >/dev/null; then
            echo "fetching Fashion-MNIST: Debian package dataset-fashion-mnist (31 MB)…" >&2
            TMP="$(mktemp -d)"
            (cd "$TMP" && apt-get download dataset-fashion-mnist >&2 2>/dev/null) \
                && dpkg -x "$TMP"/dataset-fashion-mnist_*.deb "$DEB.partial" && rm -rf "$DEB" \
                && mv "$DEB.partial" "$DEB" || echo "apt-get download failed; trying the official mirror" >&2
            rm -rf "$TMP" "$DEB.partial"
        fi
        if has_fmnist "$DEB/usr/share/datasets/fashion-mnist"; then
            link fashion-mnist "$DEB/usr/share/datasets/fashion-mnist"
        else
            echo "fetching Fashion-MNIST from http://fashion-mnist.s3-website.eu-central-1.amazonaws.com …" >&2
            mkdir -p "$DATA/fashion-mnist"
            for f in "${FILES[@]}"; do
                [[ -s "$DATA/fashion-mnist/$f" ]] && continue
                curl -fsSL "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/$f" \
                    -o "$DATA/fashion-mnist/$f.partial" && mv "$DATA/fashion-mnist/$f.partial" "$DATA/fashion-mnist/$f"
            done
        fi
    fi
fi
has_fmnist "$DATA/fashion-mnist" || {
    echo "could not fetch Fashion-MNIST into $DATA/fashion-mnist (see README, Data)" >&2
    exit 1
}
for d in cifar10 text; do
    [[ -d "$SHARED/$d" ]] && link "$d" "$SHARED/$d"
done
echo "$DATA"
