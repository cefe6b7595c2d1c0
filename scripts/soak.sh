#!/usr/bin/env bash
# The soak (tests/soak.rs): KVB_SOAK_OPS (default 1,000,000) random valid operations on small
# host-memory pools with byte verification, invariants every 1,000 operations, events drained by
# another thread, the router model compared at the end. The library is built with overflow
# checks and debug assertions (its own target folder, so the normal release build stays), so a
# wrapped size is a failure instead of silence.
#
#   scripts/soak.sh                                   # the CI run
#   KVB_SOAK_OPS=100000000 KVB_SOAK_SEED=7 scripts/soak.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export KVB_SOAK_OPS="${KVB_SOAK_OPS:-1000000}"
CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
    CARGO_TARGET_DIR=target/checked \
    cargo test --release --locked --test soak -- --nocapture
