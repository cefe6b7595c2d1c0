# shellcheck shell=bash disable=SC2034 # sourced; the variables are used by the sourcing scripts
# Sourced: the pinned toolchains beside stable. The nightly runs the sanitizers and libFuzzer
# (rustc's -Zsanitizer is nightly-only); the MSRV build checks Cargo.toml's rust-version.
KVB_NIGHTLY=nightly-2026-05-20
KVB_MSRV=1.88.0
# The AddressSanitizer build of the Rust tests (target/asan): scripts/sanitize.sh asan-rust runs
# every test in it and scripts/soak.sh the long soak. The same flags, hence one build for both.
KVB_ASAN_RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers -Cdebug-assertions -Coverflow-checks"
# allocator_may_return_null: the out-of-memory tests ask for absurd pools on purpose.
KVB_ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:abort_on_error=1"
