#!/usr/bin/env bash
# The replay with its pools on the simulated CUDA driver (cpp_tests/sim_cuda, preloaded: the
# loader then finds libcuda.so already loaded by its SONAME) against the same replay with host
# pools: every counter (steps, reuse, blocks allocated, offloaded and onboarded, events) must be
# equal; only timings differ. Runs in the simulator's eager and deferred modes.
#
#   scripts/replay_on_sim.sh [REPLAY] [SIM_LIBCUDA]     # defaults: the build/ tree's
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
replay="${1:-build/examples/replay}"
sim="${2:-$PWD/build/cpp_tests/sim_cuda/sim_cuda/libcuda.so}"
[[ -x "$replay" && -e "$sim" ]] || { echo "build the project first ($replay, $sim)" >&2; exit 1; }
args=(--limit 300 --primary-blocks 6000 --secondary-blocks 2000 --block-bytes 256 --quiet --no-svg)
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
# Counters only: drop the simulator's banner, the config line (it names the pools' memory) and
# timings.
counters() { grep -vE '^sim-cuda:|^  (config|manager|by kind|wall) ' "$1"; }
"$replay" "${args[@]}" --copy-backend host >"$tmp/host"
for mode in eager deferred; do
    LD_PRELOAD="$sim" KVB_SIM_CUDA_MODE="$mode" "$replay" "${args[@]}" --copy-backend cuda >"$tmp/cuda"
    grep -q 'in GPU pools' "$tmp/cuda" || { echo "the CUDA run did not use GPU pools" >&2; exit 1; }
    if ! diff <(counters "$tmp/host") <(counters "$tmp/cuda"); then
        echo "replay on the simulated driver ($mode): counters differ from the host backend's" >&2
        exit 1
    fi
    echo "replay on the simulated driver ($mode): $(grep -c . <(counters "$tmp/cuda")) counter lines equal to the host backend's"
done
