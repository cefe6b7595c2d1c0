#!/usr/bin/env bash
# The soak (tests/soak.rs): KVB_SOAK_OPS (default 1,000,000) random valid operations on small
# host-memory pools with byte verification, invariants every 1,000 operations, events drained by
# another thread, the router model compared at the end. The library and the test are built with
# overflow checks and debug assertions, so a wrapped size is a failure instead of silence, and
# under AddressSanitizer: it is the build of `scripts/sanitize.sh asan-rust` (the pinned nightly,
# target/asan, the flags of scripts/toolchains.sh), so after that stage nothing is rebuilt, and the
# normal release build stays as it is.
#
#   scripts/soak.sh                                   # the CI run
#   KVB_SOAK_OPS=100000000 KVB_SOAK_SEED=7 scripts/soak.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/toolchains.sh
source scripts/libzmq.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export KVB_SOAK_OPS="${KVB_SOAK_OPS:-1000000}"
kvb_libzmq_once # as asan-rust does: the same cargo arguments, the same build
ASAN_OPTIONS="$KVB_ASAN_OPTIONS" RUSTFLAGS="$KVB_ASAN_RUSTFLAGS" \
    cargo "+$KVB_NIGHTLY" test --locked --release --target x86_64-unknown-linux-gnu \
    --target-dir target/asan --test soak "${KVB_LIBZMQ_CONFIG[@]}" -- --nocapture
