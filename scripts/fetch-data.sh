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
#      - cifar10/ and text/: the shared data folder when present (users: see docs/setup-and-data.md, "Data").
#
# Usage: PLEXUS_DATA="$(scripts/fetch-data.sh)"   (progress goes to stderr, the root to stdout)
#
#        scripts/fetch-data.sh cifar10
#   Downloads the official CIFAR-10 binaries (cifar-10-binary.tar.gz, 163 MB, from the Toronto site;
#   kept in ~/.cache/plexus/downloads), checks the tarball's MD5 and each batch file's size, and
#   extracts them to <data root>/cifar10/cifar-10-batches-bin/ (the layout `data.kind: cifar10`
#   reads), where the data root is $PLEXUS_DATA if set, else the assembled root above (in which a
#   linked CIFAR-10 image folder becomes a folder linking its train/ and test/ next to the batches,
#   so the shared folder is never written). Idempotent; prints the data root. Without network: put
#   the tarball at ~/.cache/plexus/downloads/cifar-10-binary.tar.gz and run it again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

has_fmnist() { for f in "${FILES[@]}"; do [[ -s "$1/$f" ]] || return 1; done; }

CIFAR_URL="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR_MD5="c32a1d4ab5d03f1284b67883e8d87530"
CIFAR_FILES=(data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin)
CIFAR_FILE_BYTES=30730000 # 10,000 records of 1 label byte + 3,072 pixel bytes

has_cifar_bin() { # has_cifar_bin DIR: the six batch files, each of the right size
    for f in "${CIFAR_FILES[@]}"; do
        [[ -f "$1/$f" && "$(stat -c %s "$1/$f")" == "$CIFAR_FILE_BYTES" ]] || return 1
    done
}

fail() { echo "fetch-data.sh: $*" >&2; exit 1; }

fetch_cifar10() { # fetch_cifar10 DATA_ROOT MANAGED(1 when the script assembled the root)
    local dest="$1" managed="$2"
    local dir="$dest/cifar10"
    local bin="$dir/cifar-10-batches-bin"
    if has_cifar_bin "$bin"; then
        echo "CIFAR-10 binaries already in $bin" >&2
        echo "$dest"
        return 0
    fi
    local downloads="${PLEXUS_CACHE:-$HOME/.cache/plexus}/downloads"
    local tgz="$downloads/cifar-10-binary.tar.gz"
    mkdir -p "$downloads"
    if [[ ! -s "$tgz" ]]; then
        echo "fetching CIFAR-10 (binary version, 163 MB) from $CIFAR_URL …" >&2
        command -v curl >/dev/null || fail "curl is not installed: download $CIFAR_URL yourself, put it at $tgz and run this again"
        if ! curl -fSL --progress-bar --retry 2 --connect-timeout 20 -o "$tgz.partial" "$CIFAR_URL" >&2; then
            rm -f "$tgz.partial"
            fail "could not download $CIFAR_URL (no network, or the site is down). On a machine with internet, download it and copy it to $tgz (MD5 $CIFAR_MD5), then run this again; or set PLEXUS_DATA to a folder that already holds cifar10/cifar-10-batches-bin/"
        fi
        local got
        got="$(md5sum "$tgz.partial" | cut -d' ' -f1)"
        if [[ "$got" != "$CIFAR_MD5" ]]; then
            rm -f "$tgz.partial"
            fail "the download of $CIFAR_URL has MD5 $got, expected $CIFAR_MD5 (truncated or changed upstream); nothing was kept"
        fi
        mv "$tgz.partial" "$tgz"
    fi
    local md5
    md5="$(md5sum "$tgz" | cut -d' ' -f1)"
    [[ "$md5" == "$CIFAR_MD5" ]] || fail "$tgz has MD5 $md5, expected $CIFAR_MD5 (the official cifar-10-binary.tar.gz): a truncated or different file; delete it and run this again"
    if [[ "$managed" == 1 && -L "$dir" ]]; then
        # The assembled root links cifar10/ to a shared image folder: make it a real folder that
        # links the folder's contents, so the batches go next to them and the shared folder stays untouched.
        local target
        target="$(readlink -f "$dir")"
        rm "$dir"
        mkdir -p "$dir"
        for e in "$target"/*; do [[ -e "$e" ]] && ln -s "$e" "$dir/$(basename "$e")"; done
    fi
    mkdir -p "$dir" 2>/dev/null && [[ -w "$dir" ]] || fail "cannot write to $dir (set PLEXUS_DATA to a writable data root)"
    local tmp
    tmp="$(mktemp -d "$dir/.extract.XXXXXX")"
    echo "extracting to $bin …" >&2
    if ! tar -xzf "$tgz" -C "$tmp" cifar-10-batches-bin || ! has_cifar_bin "$tmp/cifar-10-batches-bin"; then
        rm -rf "$tmp"
        fail "$tgz did not hold the six CIFAR-10 batch files of $CIFAR_FILE_BYTES bytes in cifar-10-batches-bin/"
    fi
    rm -rf "$bin"
    mv "$tmp/cifar-10-batches-bin" "$bin"
    rm -rf "$tmp"
    echo "CIFAR-10 binaries in $bin" >&2
    echo "$dest"
}

case "${1:-}" in
    "") ;;
    cifar10)
        if [[ -n "${PLEXUS_DATA:-}" ]]; then
            fetch_cifar10 "$PLEXUS_DATA" 0
        else
            DATA="${PLEXUS_CACHE:-$HOME/.cache/plexus}/data/root"
            mkdir -p "$DATA"
            SHARED="$(cd "$ROOT/.." && pwd)/shared/data"
            [[ -e "$DATA/cifar10" || ! -d "$SHARED/cifar10" ]] || ln -sfn "$SHARED/cifar10" "$DATA/cifar10"
            fetch_cifar10 "$DATA" 1
        fi
        exit 0
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) fail "unknown dataset \`$1\`: give no argument (Fashion-MNIST and the data root) or \`cifar10\`" ;;
esac

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
    echo "could not fetch Fashion-MNIST into $DATA/fashion-mnist (see docs/setup-and-data.md, Data)" >&2
    exit 1
}
for d in cifar10 text; do
    [[ -d "$SHARED/$d" ]] && link "$d" "$SHARED/$d"
done
echo "$DATA"
