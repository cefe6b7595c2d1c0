#!/usr/bin/env bash
# Builds the project through CMake and runs the replay (examples/replay.cpp): the engine loop on the
# bundled Mooncake synthetic trace. Extra arguments go to the replay (see `--help`); the plot is
# written to build/replay.svg unless `--svg PATH` / `--no-svg` says otherwise.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2 --target replay basic_reuse
exec build/examples/replay --svg build/replay.svg "$@"
