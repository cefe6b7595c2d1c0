#!/usr/bin/env bash
# Builds and runs the C-ABI fuzz target (fuzz/fuzz_targets/c_abi.rs) with libFuzzer, under
# AddressSanitizer, with overflow checks and debug assertions on, so that a wrapped size is a
# crash instead of silence. Bounded: FUZZ_SECONDS (default 120) of fuzzing from the seed corpus
# (fuzz/corpus/c_abi, read-only here; new inputs go to the git-ignored fuzz/corpus/c_abi-work).
# A crash is saved under fuzz/artifacts/ and fails the run; copy it to fuzz/regressions/ so
# `cargo test --test fuzz_regressions` replays it forever.
#
#   scripts/fuzz.sh                       # the CI run (120 s)
#   FUZZ_SECONDS=3600 scripts/fuzz.sh     # an hour; or FUZZ_ARGS='-jobs=2 -workers=2'
#   scripts/fuzz.sh build                 # only build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/toolchains.sh
source scripts/libzmq.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# libzmq as built once in target/release (scripts/libzmq.sh), before RUSTFLAGS are set.
kvb_libzmq_once

TARGET=x86_64-unknown-linux-gnu
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Zsanitizer=address -Cforce-frame-pointers \
-Cdebug-assertions -Coverflow-checks"
export RUSTDOCFLAGS="$RUSTFLAGS"
cargo "+$KVB_NIGHTLY" build --release --locked --manifest-path fuzz/Cargo.toml --target "$TARGET" --bin c_abi \
    "${KVB_LIBZMQ_CONFIG[@]}"
[[ "${1:-}" == build ]] && exit 0

BIN="fuzz/target/$TARGET/release/c_abi"
mkdir -p fuzz/corpus/c_abi-work fuzz/artifacts
# The binary is not a cdylib host: leaks are real leaks (the graveyard of destroyed handles is
# reachable, so LeakSanitizer does not report it).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
echo "fuzzing for ${FUZZ_SECONDS:-120} s"
# shellcheck disable=SC2086
"$BIN" -max_total_time="${FUZZ_SECONDS:-120}" -max_len=4096 -rss_limit_mb=2048 -timeout=20 \
    -print_final_stats=1 -artifact_prefix=fuzz/artifacts/ ${FUZZ_ARGS:-} \
    fuzz/corpus/c_abi-work fuzz/corpus/c_abi
