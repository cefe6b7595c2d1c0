#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian 12 machine (run as root). Idempotent: does
# nothing that is already done.
#
#   scripts/setup.sh           what the build and the replay need (scripts/run_replay.sh): system
#                              packages (compilers, CMake, GoogleTest) and Rust stable.
#   scripts/setup.sh --tests   also what scripts/test.sh needs: clang-format, Redis, OpenSSL, the
#                              pinned nightly (with rust-src) and minimum Rust, clippy and rustfmt,
#                              the pinned cbindgen, NVRTC (.tools/), the Python venv (.venv/).
#
# Without --tests no NVRTC is installed, so the library embeds no CUBINs (build_support/
# embed_cubins.rs says so in a warning) and compiles its CUDA kernel at run time if a GPU run needs
# it; the replay runs on host memory. .tools/nvrtc.done then says `none`: the build script watches
# that file, so a later `--tests` (which rewrites it) makes cargo embed them, and while it exists
# the build script does not rerun (and rebuild the crate) on every build.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
tests=0
case "${1:-}" in
"") ;;
--tests) tests=1 ;;
*)
    echo "usage: scripts/setup.sh [--tests]" >&2
    exit 2
    ;;
esac
CBINDGEN_VERSION=0.29.0
export HOME="${HOME:-/root}"
export PATH="$HOME/.cargo/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive

SUDO=""
if [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null; then SUDO=sudo; fi

apt_updated=0
apt_install() {
    if [[ $apt_updated == 0 ]]; then
        echo "+ apt-get update"
        $SUDO apt-get update -q
        apt_updated=1
    fi
    echo "+ apt-get install -y -q --no-install-recommends $*"
    $SUDO apt-get install -y -q --no-install-recommends "$@"
}

missing=()
for tool in cmake:cmake g++:g++ make:make pkg-config:pkg-config curl:curl python3:python3; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
# GoogleTest: a CMake configure of the tree (scripts/run_replay.sh's too) finds it.
[[ -e /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)
[[ -e /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
# No libzmq package: the zmq-sys crate builds libzmq from source and links it statically
# (scripts/libzmq.sh).
if ((tests)); then
    command -v clang-format >/dev/null || missing+=(clang-format)
    # python3-venv: the NVRTC venv (.tools/), the project venv (.venv/), the wire test's packages.
    python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        2>/dev/null || missing+=(python3-dev)
    # redis-server, redis-cli: the remote tier's tests start a real Redis (standalone and a
    # three-node Redis Cluster on loopback); the benchmarks compare against redis-benchmark.
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v redis-cli >/dev/null || missing+=(redis-tools)
    # openssl: the remote tier's TLS test makes its certificate authority and certificates with it.
    command -v openssl >/dev/null || missing+=(openssl)
fi
if ((${#missing[@]})); then apt_install "${missing[@]}"; else echo "system packages: present"; fi

# Debian 12's own rustc/cargo (1.63) is older than the crate's rust-version (1.88) and
# cbindgen's, so Rust comes from rustup (also when only that old distro Rust is present).
rust_minor="$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\).*/\1/p' || true)"
if ! command -v cargo >/dev/null || [[ -z "$rust_minor" ]] || ((rust_minor < 88)); then
    echo "+ installing Rust (stable) via rustup"
    # The path check would stop rustup-init when an old distro rustc is on PATH.
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        RUSTUP_INIT_SKIP_PATH_CHECK=yes sh -s -- -y --profile minimal
fi
cargo --version
rustc --version
if ((!tests)); then
    [[ -e .tools/nvrtc.done ]] || { mkdir -p .tools && echo none >.tools/nvrtc.done; }
    echo "setup for the build and the replay: done (scripts/setup.sh --tests adds what the tests need)"
    exit 0
fi

# --- What the tests need. The Rust part (rustup's downloads, then cbindgen's compile) runs in the
# background while pip downloads NVRTC and the Python packages; its output is printed at the end.
rust_for_tests() {
    # clippy and rustfmt (cargo clippy, cargo fmt --check).
    if command -v rustup >/dev/null; then
        echo "+ rustup component add clippy rustfmt"
        rustup component add clippy rustfmt
    fi
    # The header generator (scripts/gen_header.sh, scripts/check_header.sh), compiled from source
    # with stable (a few minutes of CPU): started first, it compiles while rustup downloads.
    local cbindgen_pid=""
    if [[ "$(cbindgen --version 2>/dev/null || true)" != "cbindgen $CBINDGEN_VERSION" ]]; then
        echo "+ cargo install cbindgen --version $CBINDGEN_VERSION --locked --force"
        cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --force --quiet &
        cbindgen_pid=$!
    fi
    # The pinned nightly (sanitizers, libFuzzer; rust-src for the ThreadSanitizer's -Zbuild-std)
    # and the declared minimum Rust version (scripts/toolchains.sh). One rustup at a time: they
    # share ~/.rustup.
    source scripts/toolchains.sh
    for tc in "$KVB_NIGHTLY" "$KVB_MSRV"; do
        if ! rustup run "$tc" rustc --version >/dev/null 2>&1; then
            echo "+ rustup toolchain install $tc --profile minimal"
            rustup toolchain install "$tc" --profile minimal
        fi
    done
    if ! rustup component list --toolchain "$KVB_NIGHTLY" --installed | grep -q '^rust-src'; then
        echo "+ rustup component add rust-src --toolchain $KVB_NIGHTLY"
        rustup component add rust-src --toolchain "$KVB_NIGHTLY"
    fi
    if [[ -n "$cbindgen_pid" ]]; then
        wait "$cbindgen_pid" # its failure fails this function (set -e)
    fi
    cbindgen --version
}
rust_log="$(mktemp)"
rust_for_tests >"$rust_log" 2>&1 </dev/null &
rust_pid=$!
# On a failure below, the Rust part still finishes (no stray rustup or cargo left running).
trap 'wait "$rust_pid" 2>/dev/null || true; rm -f "$rust_log"' EXIT

# NVRTC for the CUDA backend's kernels, on machines without a GPU too. The CUDA 12.x one (12.8 or
# later: sm_100 and sm_120) compiles the CUBINs the build embeds (build_support/embed_cubins.rs):
# every driver from CUDA 12.4 on loads them. The 13.0 one is the run-time fallback for an
# architecture not embedded; scripts/nvrtc_env.sh puts its folder on the loader path. Both land in
# .tools/ (git-ignored).
NVRTC_WHEEL="nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvrtc-cu12==12.9.86"
if [[ ! -e .tools/nvrtc.done ]] || [[ "$(cat .tools/nvrtc.done)" != "$NVRTC_WHEEL" ]]; then
    echo "+ installing $NVRTC_WHEEL into .tools/venv"
    rm -rf .tools/venv
    python3 -m venv .tools/venv
    # shellcheck disable=SC2086 # two requirements
    .tools/venv/bin/pip install -q --disable-pip-version-check $NVRTC_WHEEL
    echo "$NVRTC_WHEEL" > .tools/nvrtc.done
fi
echo "nvrtc: $NVRTC_WHEEL"

# NIXL for the disaggregation transfer backend's tests (src/disagg/nixl, tests/disagg_nixl.rs):
# the nixl-cu12 wheel without its dependencies (torch is only a type hint) in .tools/nixl-venv
# (git-ignored, about 270 MB). Its libnixl_capi.so finds NIXL, the plugins and UCX through its
# own RPATH; scripts/nixl_env.sh points KVBLOCK_NIXL_LIBRARY at it. Keep the system rdma-core
# (libibverbs) off this machine: with it, NIXL processes crash at exit (see nixl_env.sh).
NIXL_WHEEL="nixl-cu12==1.5.1"
if [[ ! -e .tools/nixl.done ]] || [[ "$(cat .tools/nixl.done)" != "$NIXL_WHEEL" ]]; then
    echo "+ installing $NIXL_WHEEL (--no-deps) into .tools/nixl-venv"
    rm -rf .tools/nixl-venv
    python3 -m venv .tools/nixl-venv
    .tools/nixl-venv/bin/pip install -q --disable-pip-version-check --no-deps "$NIXL_WHEEL"
    echo "$NIXL_WHEEL" > .tools/nixl.done
fi
echo "nixl: $NIXL_WHEEL"

# --- Python: a project virtual environment (.venv/, git-ignored) with the pinned build and test
# dependencies of the Python module (python/requirements-dev.txt); scripts/test.sh installs the
# module into it with `pip install --no-build-isolation .`.
if [[ ! -x .venv/bin/python ]]; then
    echo "+ python3 -m venv .venv"
    python3 -m venv .venv
fi
if ! .venv/bin/python - python/requirements-dev.txt <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        try:
            if version(name) != want:
                sys.exit(1)
        except PackageNotFoundError:
            sys.exit(1)
PY
then
    echo "+ .venv/bin/pip install -r python/requirements-dev.txt"
    .venv/bin/pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
fi
.venv/bin/python -c 'import nanobind, scikit_build_core, numpy, pytest; print("python venv: nanobind", nanobind.__version__, "numpy", numpy.__version__, "pytest", pytest.__version__)'

# The KV-events wire test (scripts/events_wire_test.py) runs in a git-ignored venv: pyzmq and
# msgspec for the subscriber and vLLM's schema, NVIDIA Dynamo's runtime for its standalone KV
# indexer (`python -m dynamo.indexer`, a real router; no GPU needed).
PY_TEST_DEPS=(pyzmq==27.3.0 msgspec==0.22.0 ai-dynamo-runtime==1.6.1)
[[ -x .venv/bin/python ]] || { echo "+ python3 -m venv .venv"; python3 -m venv .venv; }
if .venv/bin/python -m pip freeze 2>/dev/null | grep -qx -e "${PY_TEST_DEPS[0]}" &&
    .venv/bin/python -m pip freeze | grep -qx -e "${PY_TEST_DEPS[1]}" &&
    .venv/bin/python -m pip freeze | grep -qx -e "${PY_TEST_DEPS[2]}"; then
    echo "python test deps: present"
else
    echo "+ .venv/bin/pip install ${PY_TEST_DEPS[*]}"
    .venv/bin/python -m pip install -q "${PY_TEST_DEPS[@]}"
fi

echo "+ Rust for the tests (in the background until now):"
if wait "$rust_pid"; then
    cat "$rust_log"
else
    cat "$rust_log"
    echo "setup: the Rust toolchains or cbindgen failed to install (above)" >&2
    exit 1
fi
