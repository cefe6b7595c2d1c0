#!/usr/bin/env bash
# Builds everything the GPU checks need into gpu-bundle/ (git-ignored, small enough to carry to a
# GPU machine that has CUDA but no Rust): libkvblock.so, the GoogleTest binary, the replay, the
# Rust property-test binary (its CUDA scenario) and the bandwidth bench, plus gpu-bundle/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

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
# Runs the GPU checks from the bundle on a machine with an NVIDIA GPU and the CUDA 13 toolkit.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export LD_LIBRARY_PATH="$PWD:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
status=0
echo "== GoogleTest: CUDA suites"; ./kvblock_tests --gtest_filter='Cuda*' || status=1
echo "== Rust: randomized integrity on CUDA pools"; ./property_test random_operations_cuda_pools --nocapture || status=1
echo "== bandwidth"; ./gpu_bandwidth || status=1
echo "== replay on GPU pools"
./replay --trace data/mooncake_synthetic_trace.jsonl --copy-backend cuda --block-bytes 1048576 \
    --primary-blocks 16000 --secondary-blocks 16000 --quiet --no-svg --json replay_cuda.json || status=1
exit $status
RUN
chmod +x gpu-bundle/run.sh
du -sh gpu-bundle
