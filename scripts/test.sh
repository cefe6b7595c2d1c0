#!/usr/bin/env bash
# The full test suite: Rust lints, docs, formatting, the MSRV check and tests, header freshness,
# the C++ tests through CMake (with the install/consumer test), the Python module (built,
# installed into .venv, pytest), KV events on the wire (schema, transport, Dynamo's indexer)
# against the replay, then the hardening runs: the C-ABI fuzz target (bounded), the sanitizer
# builds and the soak.
#
# Two lanes share the machine's cores: once libzmq is built (scripts/libzmq.sh: once for every
# target folder), the hardening runs on the pinned nightly (fuzz, the Rust sanitizers, the soak;
# their own target folders) start in the background, while the rest runs here; the fuzz run uses
# one core for its two minutes and the test runs leave cores idle, so neither lane waits for the
# other. The background lane's output goes to its own log, printed if it fails (its tail
# otherwise); every stage's time is reported, of both lanes, and any failure fails the script.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# NVRTC on the loader path: the CUDA kernels are compiled in every run, GPU or not (a missing
# NVRTC fails those tests instead of skipping them).
source scripts/nvrtc_env.sh
export KVBLOCK_REQUIRE_NVRTC=1
source scripts/toolchains.sh
source scripts/libzmq.sh
# One BLAS thread for the reference engines' numpy model: the background lane keeps both cores
# busy, and OpenBLAS's spinning worker threads then slow the engine tests 2-3x (8-11 s with one
# thread against 23-31 s with two for the same test on this 2-core machine under load).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Not exported: the other test runs keep their own (smaller) soak.
FUZZ_SECONDS="${FUZZ_SECONDS:-120}"
KVB_SOAK_OPS="${KVB_SOAK_OPS:-1000000}"

# Each stage's time: printed when the next stage of its lane starts, and all of them at the end
# (in the order they ended; a background stage is marked so).
work="$(mktemp -d)"
stage_name=""
stage_start=$SECONDS
lane=""
end_stage() {
    if [[ -n "$stage_name" ]]; then
        local took=$((SECONDS - stage_start))
        printf '    (%s: %d s)\n' "$stage_name" "$took"
        printf '%5d s  %s%s\n' "$took" "$lane" "$stage_name" >>"$work/stage_times"
    fi
    stage_name=""
}
step() {
    end_stage
    stage_name="$*"
    stage_start=$SECONDS
    printf '\n==> %s\n' "$*"
}

# Lanes in the background: `in_background NAME FUNCTION` runs FUNCTION (its own `step`s) with its
# output in $work/NAME.log; `wait_background` waits for all of them, prints the log of a failed
# one (the tail of one that passed) and fails if any failed. Each lane is its own process group,
# so that a failure here stops it with everything it started.
bg_pids=()
bg_names=()
in_background() {
    local name="$1"
    shift
    set -m
    (
        lane="[$name] " stage_name=""
        trap end_stage EXIT
        "$@"
    ) >"$work/$name.log" 2>&1 </dev/null &
    set +m
    bg_pids+=("$!")
    bg_names+=("$name")
    printf '\n==> started in the background: %s (log: %s)\n' "$name" "$work/$name.log"
}
wait_background() {
    local i failed=()
    for i in "${!bg_pids[@]}"; do
        if wait "${bg_pids[i]}"; then
            printf '\n==> background lane %s passed; the end of its log:\n' "${bg_names[i]}"
            tail -n 40 "$work/${bg_names[i]}.log"
        else
            printf '\n==> background lane %s FAILED; its log:\n' "${bg_names[i]}"
            cat "$work/${bg_names[i]}.log"
            failed+=("${bg_names[i]}")
        fi
    done
    bg_pids=()
    bg_names=()
    if ((${#failed[@]})); then
        echo "failed in the background: ${failed[*]}" >&2
        return 1
    fi
}
finish() {
    local rc=$?
    end_stage
    local pid
    for pid in "${bg_pids[@]}"; do
        # Still running only when this lane failed first: stop it and all it started.
        kill -TERM -- "-$pid" 2>/dev/null && echo "stopped the background lane (process group $pid)"
    done
    printf '\n==> stage times (total %d s)\n' "$SECONDS"
    cat "$work/stage_times" 2>/dev/null || true
    if ((${#bg_pids[@]})); then
        echo "(background lanes not waited for: ${bg_names[*]}; their logs: $work)"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap finish EXIT

# Hardening (issue 12), on the pinned nightly: each stage says how to run it longer or alone. The
# C++ sanitizer build (asan-cpp) runs at the end of the other lane: it links the release library.
hardening() {
    step "fuzz the C ABI (scripts/fuzz.sh, $FUZZ_SECONDS s)"
    FUZZ_SECONDS="$FUZZ_SECONDS" scripts/fuzz.sh
    step "sanitizers: asan-rust (scripts/sanitize.sh asan-rust)"
    scripts/sanitize.sh asan-rust
    step "soak (scripts/soak.sh, $KVB_SOAK_OPS operations, overflow checks on; the asan-rust build)"
    KVB_SOAK_OPS="$KVB_SOAK_OPS" scripts/soak.sh
    step "sanitizers: tsan-rust (scripts/sanitize.sh tsan-rust)"
    scripts/sanitize.sh tsan-rust
    # Not hardening, but on its own toolchain and target folder like the rest of this lane, so
    # it runs here, in the time this lane ends before the other. A check (no code generation):
    # what the MSRV can fail on is the language and the standard library the crate and its
    # dependencies use.
    step "check with the minimum Rust version (Cargo.toml rust-version)"
    cargo "+$KVB_MSRV" check --lib --locked --target-dir target/msrv "${KVB_LIBZMQ_CONFIG[@]}"
}
# libzmq, compiled from source by zmq-sys, is built once for every target folder (scripts/libzmq.sh):
# before the lanes start, which then use it.
step "libzmq, built once for all target folders (scripts/libzmq.sh)"
kvb_libzmq_once
in_background hardening hardening

step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets "${KVB_LIBZMQ_CONFIG[@]}" -- -D warnings
step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked "${KVB_LIBZMQ_CONFIG[@]}"
step "clang-format --check"
scripts/format.sh --check
# NIXL for the prefill/decode tests (tests/disagg_nixl.rs, tests/disagg_pd_processes.rs: two
# processes on 127.0.0.1): they fail, not skip, without the nixl-cu12 wheel of scripts/setup.sh
# --tests. (The sanitizer runs unset it: scripts/sanitize.sh.)
source scripts/nixl_env.sh
step "cargo test --release"
cargo test --release
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

step "sanitizers: asan-cpp (scripts/sanitize.sh asan-cpp)"
scripts/sanitize.sh asan-cpp

# The last release build: libkvblock is a cdylib, whose file name has no hash, so the builds with
# and without the feature share target/release/deps/libkvblock.so and each switch between them
# compiles the crate again. Run after every build without it (cargo test, CMake's, pip's, the
# asan-cpp build), it costs one such compile instead of two.
step "remote tier over TLS (cargo feature tls: rediss://, a real redis-server with TLS)"
cargo test --release --features tls --test remote_tls

step "waiting for the background lane (hardening)"
wait_background
