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

# Each stage's time: printed when the next stage starts, and all of them at the end.
stage_name=""
stage_start=$SECONDS
stage_times=()
end_stage() {
    if [[ -n "$stage_name" ]]; then
        local took=$((SECONDS - stage_start))
        printf '    (%s: %d s)\n' "$stage_name" "$took"
        stage_times+=("$(printf '%5d s  %s' "$took" "$stage_name")")
    fi
}
step() {
    end_stage
    stage_name="$*"
    stage_start=$SECONDS
    printf '\n==> %s\n' "$*"
}
report_stage_times() {
    end_stage
    stage_name=""
    printf '\n==> stage times (total %d s)\n' "$SECONDS"
    printf '%s\n' "${stage_times[@]}"
}
trap 'report_stage_times' EXIT

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
# NIXL for the prefill/decode tests (tests/disagg_nixl.rs, tests/disagg_pd_processes.rs: two
# processes on 127.0.0.1): they fail, not skip, without the nixl-cu12 wheel of scripts/setup.sh.
source scripts/nixl_env.sh
step "cargo test --release"
cargo test --release
step "remote tier over TLS (cargo feature tls: rediss://, a real redis-server with TLS)"
cargo test --release --features tls --test remote_tls
step "scripts/check_header.sh"
scripts/check_header.sh
step "cmake configure + build (build/, Release)"
# Options passed explicitly so a cached OFF from another command cannot silently skip tests.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVBLOCK_BUILD_TESTS=ON -DKVBLOCK_BUILD_EXAMPLES=ON
cmake --build build -j2
step "ctest (all but the simulated-driver cases, run next)"
ctest --test-dir build --output-on-failure --no-tests=error -j2 -E '^CudaSim\.'

# The CUDA suites on the simulated driver (cpp_tests/sim_cuda; docs/gpu-data-path.md): the CUDA
# GoogleTests and the simulator's own tests in its three scheduling modes, then the Rust CUDA
# property workload. Nothing GPU-related may skip here; the counts say what ran.
step "CUDA suites on the simulated driver (ctest -R '^CudaSim\.', Rust CUDA workload)"
sim_log="$(mktemp)"
ctest --test-dir build --output-on-failure --no-tests=error -j2 -R '^CudaSim\.' -V >"$sim_log" 2>&1 ||
    { tail -n 80 "$sim_log"; rm -f "$sim_log"; exit 1; }
sim_runs="$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: CudaSim\..* Passed' "$sim_log" || true)"
sim_gtests="$(grep -oE '\[  PASSED  \] [0-9]+ test' "$sim_log" | awk '{n += $4} END {print n + 0}')"
sim_skipped="$(grep -c '\[  SKIPPED \]' "$sim_log" || true)"
rm -f "$sim_log"
sim_lib="$PWD/build/cpp_tests/sim_cuda/sim_cuda/libcuda.so"
rust_cuda=0
# The Rust workload is long on the simulator (about 2 minutes a run on 2 cores): the strictest
# mode only; the C++ suites cover every mode and both symbol sets.
for run in "$sim_lib deferred"; do
    read -r lib mode <<<"$run"
    KVB_SIM_CUDA_LIBRARY="$lib" KVB_SIM_CUDA_MODE="$mode" \
        cargo test --release --test property random_operations_cuda_pools -- --exact
    rust_cuda=$((rust_cuda + 1))
done
scripts/replay_on_sim.sh build/examples/replay "$sim_lib" 2>/dev/null
echo "CUDA tests on the simulated driver: $sim_gtests GoogleTests passed in $sim_runs ctest runs" \
     "(eager, delayed, deferred, CUDA 13.0 and 12.4 symbol sets; $sim_skipped skipped)," \
     "Rust CUDA property workload: $rust_cuda run (deferred)"

step "python: pip install --no-build-isolation . (into .venv)"
# Make, as on a fresh machine (setup.sh installs no ninja); build-python/ keeps the build incremental.
export CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation .
step "python: pytest"
# From outside the source tree, so `import kvblock` is the installed package.
(cd /tmp && KVBLOCK_REPLAY="$OLDPWD/build/examples/replay" "$OLDPWD/.venv/bin/python" -m pytest -q \
    -p no:cacheprovider "$OLDPWD/python/tests")
step "python: the CUDA backend on the simulated driver (with NVRTC, without, and its fallback)"
# The same module against cpp_tests/sim_cuda: the embedded CUBIN (sm_90); then with no NVRTC on
# the loader path at all; then on sm_75, which no embedded CUBIN covers (NVRTC compiles it); and
# sm_75 without NVRTC, which must be a clear error. Then the reference engine on the CUDA backend
# (its GPU pools through DLPack and driver copies; the oracle and the host run's counts).
sim_py() { "$OLDPWD/.venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests/test_cuda_sim.py" "$@"; }
(cd /tmp && export KVB_SIM_CUDA_LIBRARY="$sim_lib" KVB_SIM_CUDA_MODE=deferred &&
    sim_py -k 'not without_cubin' &&
    LD_LIBRARY_PATH= KVB_SIM_EXPECT_NVRTC=0 sim_py -k 'not without_cubin' &&
    KVB_SIM_CUDA_ARCH=75 sim_py -k 'not without_cubin' &&
    LD_LIBRARY_PATH= KVB_SIM_EXPECT_NVRTC=0 KVB_SIM_CUDA_ARCH=75 sim_py -k without_cubin &&
    "$OLDPWD/.venv/bin/python" -m pytest -q -p no:cacheprovider -rs \
        "$OLDPWD/python/tests/test_reference_engine.py" -k 'driver_copies')

step "KV events on the wire: schema, transport, Dynamo indexer (scripts/events_wire_test.py)"
.venv/bin/python scripts/events_wire_test.py build/examples/replay

# Hardening (issue 12): each stage says how to run it longer or alone.
step "fuzz the C ABI (scripts/fuzz.sh, ${FUZZ_SECONDS:=120} s)"
FUZZ_SECONDS="$FUZZ_SECONDS" scripts/fuzz.sh
step "sanitizers (scripts/sanitize.sh)"
scripts/sanitize.sh
step "soak (scripts/soak.sh, ${KVB_SOAK_OPS:=1000000} operations, overflow checks on)"
KVB_SOAK_OPS="$KVB_SOAK_OPS" scripts/soak.sh
