# Sourced: the pinned toolchains beside stable. The nightly runs the sanitizers and libFuzzer
# (rustc's -Zsanitizer is nightly-only); the MSRV build checks Cargo.toml's rust-version.
KVB_NIGHTLY=nightly-2026-05-20
KVB_MSRV=1.88.0
