#!/usr/bin/env bash
# Profiles the replay's peer loop with perf (DWARF call graphs) and prints where kvblock's own time
# goes, by C entry point and by leaf function (scripts/profile_breakdown.py).
#
#   scripts/profile_replay.sh [--blocks N] [--out DIR]     # default 30000 blocks, output in /tmp
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
blocks=30000; out="${TMPDIR:-/tmp}/kvblock-profile"
while [ $# -gt 0 ]; do
  case "$1" in
    --blocks) blocks=$2; shift 2;; --out) out=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
replay=build/examples/replay
[ -x "$replay" ] || { echo "build the project first ($replay missing)" >&2; exit 1; }
mkdir -p "$out"
perf record -F 4000 --call-graph dwarf,16384 -o "$out/perf-$blocks.data" \
  "$replay" --loop peer --tokens-per-block 32 --primary-blocks "$blocks" --secondary-blocks 0 \
  --max-running 64 --max-output 128 --block-bytes 0 --quiet --no-svg >/dev/null 2>"$out/perf-$blocks.log"
perf script -i "$out/perf-$blocks.data" 2>/dev/null | python3 scripts/profile_breakdown.py
