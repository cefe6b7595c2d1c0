#!/usr/bin/env bash
# Builds everything the GPU checks need into gpu-bundle/ (git-ignored, small enough to carry to a
# GPU machine that has CUDA but no Rust): libkvblock.so, the GoogleTest binary, the replay, the
# Rust property-test binary (its CUDA scenario) and the bandwidth bench, plus gpu-bundle/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# The CUBINs the GPU runs are embedded at build time by the CUDA 12.x NVRTC of scripts/setup.sh.
source scripts/nvrtc_env.sh

cargo build --release
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVBLOCK_BUILD_TESTS=ON -DKVBLOCK_BUILD_EXAMPLES=ON >/dev/null
cmake --build build -j2
# Test and bench executables; cargo prints their paths as JSON lines.
executables() {
    cargo "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])'
}
rm -rf gpu-bundle && mkdir -p gpu-bundle/data
cp target/release/libkvblock.so build/cpp_tests/kvblock_tests build/examples/replay gpu-bundle/
cp data/mooncake_synthetic_trace.jsonl gpu-bundle/data/
executables test --release --test property | while read -r name path; do cp "$path" gpu-bundle/property_test; done
executables bench --bench gpu_bandwidth | while read -r name path; do cp "$path" gpu-bundle/gpu_bandwidth; done
strip --strip-debug gpu-bundle/* 2>/dev/null || true
cat > gpu-bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs the GPU checks on a machine with an NVIDIA GPU, the CUDA toolkit, CMake and a Python with
# torch, nanobind and pytest, but no Rust: from the repository root, `gpu-bundle/run.sh [LOGDIR]`.
# Each step is bounded; the log and the replay's JSON go to LOGDIR (default gpu-bundle/).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bundle="$PWD/gpu-bundle"
logdir="${1:-$bundle}"
mkdir -p "$logdir"
export LD_LIBRARY_PATH="$bundle:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
ln -sf libkvblock.so "$bundle/libkvblock.so.0"  # the SONAME the programs record
status=0
step() { printf '\n== %s\n' "$*"; }
check() { local limit="$1"; shift; timeout "$limit" "$@" || { echo "FAILED ($?): $*"; status=1; }; }
step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvidia-smi | grep -o 'CUDA Version: [0-9.]*' || true
step "GoogleTest: CUDA suites on the real driver"
check 120 "$bundle/kvblock_tests" --gtest_filter='CudaBackendTest.*:CudaUnavailableTest.*:CudaSimFaultTest.*'
step "Rust: randomized integrity on CUDA pools"
check 180 "$bundle/property_test" random_operations_cuda_pools --exact --nocapture
step "bandwidth"
check 180 "$bundle/gpu_bandwidth"
step "replay on GPU pools"
check 180 "$bundle/replay" --trace "$bundle/data/mooncake_synthetic_trace.jsonl" --copy-backend cuda \
    --block-bytes 1048576 --primary-blocks 16000 --secondary-blocks 16000 --quiet --no-svg \
    --json "$logdir/replay_cuda.json"
step "python: the extension against the bundled libkvblock (no Rust here)"
py=python3
site=/tmp/kvblock-site
rm -rf /tmp/kvblock-python "$site" && mkdir -p "$site/kvblock"
if timeout 300 cmake -S . -B /tmp/kvblock-python -DCMAKE_BUILD_TYPE=Release -DKVBLOCK_BUILD_PYTHON=ON \
        -DKVBLOCK_BUILD_TESTS=OFF -DKVBLOCK_BUILD_EXAMPLES=OFF -DKVBLOCK_INSTALL=OFF \
        -DKVBLOCK_PREBUILT_LIBRARY="$bundle/libkvblock.so" -DPython_EXECUTABLE="$(command -v $py)" \
        -Dnanobind_DIR="$($py -m nanobind --cmake_dir)" >/dev/null &&
   timeout 300 cmake --build /tmp/kvblock-python -j"$(nproc)" --target _kvblock >/dev/null; then
    cp python/kvblock/*.py python/kvblock/py.typed "$site/kvblock/"
    cp /tmp/kvblock-python/python/_kvblock*.so "$site/kvblock/"
    cp "$bundle/libkvblock.so" "$site/kvblock/libkvblock.so.0"
    export PYTHONPATH="$site"
    step "pytest: the CUDA backend and the reference engine with torch on the GPU"
    (cd /tmp && check 300 $py -m pytest -q -p no:cacheprovider -rs \
        "$OLDPWD/python/tests/test_cuda.py" "$OLDPWD/python/tests/test_reference_engine.py" \
        "$OLDPWD/python/tests/test_pool_views.py")
    step "reference engine: the full run with torch on the GPU"
    check 300 $py examples/engine/run.py --backend cuda-torch
else
    echo "FAILED: the Python extension did not build"; status=1
fi
exit $status
RUN
chmod +x gpu-bundle/run.sh
du -sh gpu-bundle
