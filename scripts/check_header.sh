#!/usr/bin/env bash
# Fails when include/kvblock.h is stale, has a declaration without a doc comment
# (scripts/check_header_docs.sh), or does not compile on its own as C99 and C++17.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
header="$root/include/kvblock.h"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$root/scripts/gen_header.sh" "$tmp/kvblock.h"
if ! diff -u "$header" "$tmp/kvblock.h"; then
    echo "include/kvblock.h is out of date: run scripts/gen_header.sh" >&2
    exit 1
fi
"$root/scripts/check_header_docs.sh" "$header"

printf '#include "kvblock.h"\nint main(void) { return 0; }\n' >"$tmp/c_check.c"
cp "$tmp/c_check.c" "$tmp/cxx_check.cpp"
cc -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$root/include" "$tmp/c_check.c"
c++ -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$root/include" "$tmp/cxx_check.cpp"
echo "include/kvblock.h: up to date, every declaration documented, compiles as C99 and C++17"
