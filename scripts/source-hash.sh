#!/usr/bin/env bash
# The hash of what a plexus binary is built from (src/, configs/ — embedded defaults —, build.rs,
# Cargo.toml, Cargo.lock): 16 hex digits. scripts/gpu-slot-pack.sh writes it next to the packed
# binary and scripts/gpu-check.sh compares it with the checkout's, with or without git (a GPU
# machine's copy of the repository may have no .git). Files listed: with git, the tracked and the
# untracked-but-not-ignored ones (what a copy of the working tree holds); without, every file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
paths=(src configs build.rs Cargo.toml Cargo.lock)
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z -co --exclude-standard -- "${paths[@]}"
else
    find "${paths[@]}" -type f -print0
fi | LC_ALL=C sort -z | while IFS= read -r -d '' f; do
    [[ -f $f ]] && printf '%s\0' "$f"  # (a tracked file deleted in the working tree is not there)
done | xargs -0 sha256sum | sha256sum | cut -c1-16
