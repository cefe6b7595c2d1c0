#!/usr/bin/env bash
# clang-format over the C and C++ sources (.clang-format; the cbindgen header is generated and
# excluded). `scripts/format.sh` rewrites them; `scripts/format.sh --check` fails on a diff.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files '*.c' '*.cpp' '*.hpp' '*.cu' '*.h' | grep -v '^include/kvblock.h$')
if [[ "${1:-}" == --check ]]; then
    clang-format --dry-run --Werror "${files[@]}"
    echo "clang-format: ${#files[@]} files formatted"
else
    clang-format -i "${files[@]}"
fi
