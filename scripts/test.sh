#!/usr/bin/env bash
# The full test suite: Rust lints, docs, formatting, the MSRV build and tests, header freshness,
# the C++ tests through CMake (with the install/consumer test), the Python module (built,
# installed into .venv, pytest), KV events on the wire (schema, transport, Dynamo's indexer)
# against the replay, then the hardening runs: the C-ABI fuzz target (bounded), the sanitizer
# builds and the soak.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# NVRTC on the loader path: the CUDA kernels are compiled in every run, GPU or not (a missing
# NVRTC fails those tests instead of skipping them).
source scripts/nvrtc_env.sh
export KVBLOCK_REQUIRE_NVRTC=1

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked
step "clang-format --check"
scripts/format.sh --check
step "build with the minimum Rust version (Cargo.toml rust-version)"
source scripts/toolchains.sh
cargo "+$KVB_MSRV" build --lib --locked --target-dir target/msrv
step "cargo test --release"
cargo test --release
step "scripts/check_header.sh"
scripts/check_header.sh
step "cmake configure + build (build/, Release)"
# Options passed explicitly so a cached OFF from another command cannot silently skip tests.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVBLOCK_BUILD_TESTS=ON -DKVBLOCK_BUILD_EXAMPLES=ON
cmake --build build -j2
step "ctest"
ctest --test-dir build --output-on-failure --no-tests=error -j2

step "python: pip install --no-build-isolation . (into .venv)"
# Make, as on a fresh machine (setup.sh installs no ninja); build-python/ keeps the build incremental.
export CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation .
step "python: pytest"
# From outside the source tree, so `import kvblock` is the installed package.
(cd /tmp && KVBLOCK_REPLAY="$OLDPWD/build/examples/replay" "$OLDPWD/.venv/bin/python" -m pytest -q \
    -p no:cacheprovider "$OLDPWD/python/tests")

step "KV events on the wire: schema, transport, Dynamo indexer (scripts/events_wire_test.py)"
.venv/bin/python scripts/events_wire_test.py build/examples/replay

# Hardening (issue 12): each stage says how to run it longer or alone.
step "fuzz the C ABI (scripts/fuzz.sh, ${FUZZ_SECONDS:=120} s)"
FUZZ_SECONDS="$FUZZ_SECONDS" scripts/fuzz.sh
step "sanitizers (scripts/sanitize.sh)"
scripts/sanitize.sh
step "soak (scripts/soak.sh, ${KVB_SOAK_OPS:=1000000} operations, overflow checks on)"
KVB_SOAK_OPS="$KVB_SOAK_OPS" scripts/soak.sh
