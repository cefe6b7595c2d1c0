#!/usr/bin/env bash
# Fails when a declaration of the generated header has no doc comment: every type, struct field,
# enum value and function of include/kvblock.h (or the header named by $1) must be directly
# preceded by a `/** ... */` block. Documentation comes from the `///` comments in src/ffi.
set -euo pipefail

header="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/include/kvblock.h}"

awk '
    function need_doc(what) {
        if (!documented) {
            printf "%s:%d: undocumented %s: %s\n", FILENAME, FNR, what, $0
            missing++
        }
    }
    # Inside the license banner and doc comments nothing is a declaration.
    in_comment { if ($0 ~ /\*\//) { in_comment = 0; documented = 1 } next }
    /^[ \t]*\/\*/ {
        if ($0 !~ /\*\//) { in_comment = 1 } else { documented = 1 }
        next
    }
    /^[ \t]*$/ { next }
    /^[ \t]*(#|\/\/)/ { documented = 0; next }
    /^extern "C"|^}[ \t]*\/\/ extern/ { documented = 0; next }
    # A function declaration continues on its argument lines until the closing ";".
    in_fn { if ($0 ~ /;[ \t]*$/) in_fn = 0; next }
    depth > 0 {
        if ($0 ~ /^}/) { depth = 0; documented = 0; next }
        need_doc(kind)
        documented = 0
        next
    }
    /^typedef (struct|enum|union) [A-Za-z_0-9]+ \{/ {
        need_doc("type")
        kind = ($2 == "enum") ? "enum value" : "field"
        depth = 1
        documented = 0
        next
    }
    /^typedef / { need_doc("type"); documented = 0; next }
    {
        need_doc("function")
        documented = 0
        if ($0 !~ /;[ \t]*$/) in_fn = 1
    }
    END {
        if (missing) { printf "%d declarations without a doc comment\n", missing; exit 1 }
    }
' "$header"
