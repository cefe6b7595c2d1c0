#!/usr/bin/env bash
# The full test suite: Rust lints and tests, header freshness, the C++ tests through CMake, then
# KV events on the wire (schema, transport, Dynamo's indexer) against the replay.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
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
step "KV events on the wire: schema, transport, Dynamo indexer (scripts/events_wire_test.py)"
.venv/bin/python scripts/events_wire_test.py build/examples/replay
