#!/usr/bin/env bash
# Builds the project through CMake and runs the basic_reuse example.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2 --target basic_reuse
exec build/examples/basic_reuse "$@"
