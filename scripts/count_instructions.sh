#!/usr/bin/env bash
# Counts the instructions kvblock executes inside its C entry points on the replay's peer loop
# (valgrind's callgrind): a figure that, unlike seconds, is the same on a busy machine, so two
# builds compare exactly. Prints the total and the inclusive count per entry point.
#
#   scripts/count_instructions.sh [--blocks N] [--replay PATH]     # default 8000 blocks
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
blocks=8000; replay=build/examples/replay
while [ $# -gt 0 ]; do
  case "$1" in
    --blocks) blocks=$2; shift 2;; --replay) replay=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
[ -x "$replay" ] || { echo "build the project first ($replay missing)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg" '--toggle-collect=kvb_manager_*' \
  "$replay" --loop peer --tokens-per-block 32 --primary-blocks "$blocks" --secondary-blocks 0 \
  --max-running 64 --max-output 128 --block-bytes 0 --quiet --no-svg >/dev/null 2>"$out/log"
grep -o 'Collected : [0-9]*' "$out/log" | awk '{printf "instructions inside kvb_manager_*: %.1f M\n", $3 / 1e6}'
callgrind_annotate --inclusive=yes "$out/cg" 2>/dev/null |
  grep -E '^ *[0-9,]+ .*:kvb_manager_[a-z_]+( \[.*)?$' |
  awk '{n=$1; gsub(",", "", n); name=$0; sub(/.*:kvb_manager_/, "kvb_manager_", name); sub(/ \[.*/, "", name);
        if (!(name in seen)) { seen[name]=1; printf "  %-40s %8.1f M\n", name, n / 1e6 } }'
