#!/usr/bin/env bash
# Regenerates include/kvblock.h (or the file named by $1) with the pinned cbindgen.
set -euo pipefail

CBINDGEN_VERSION=0.29.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/include/kvblock.h}"
export PATH="$HOME/.cargo/bin:$PATH"

# A different cbindgen version formats the header differently, which would fail check_header.sh.
if [[ "$(cbindgen --version 2>/dev/null || true)" != "cbindgen $CBINDGEN_VERSION" ]]; then
    echo "installing cbindgen $CBINDGEN_VERSION" >&2
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --force
fi

cd "$root"
cbindgen --quiet --config cbindgen.toml --crate kvblock --output "$out"
# cbindgen leaves no final newline; add one so strict C compilers and diffs stay quiet.
if [[ -n "$(tail -c1 "$out")" ]]; then echo >>"$out"; fi
