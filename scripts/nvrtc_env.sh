#!/usr/bin/env bash
# Sourced by the test and bench scripts: puts the NVRTC library that scripts/setup.sh installed
# (the nvidia-cuda-nvrtc wheel in .tools/venv) on the loader path, so the CUDA backend can compile
# its kernels. Its folder also holds libnvrtc-builtins, which NVRTC loads at compile time.
_kvb_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_kvb_nvrtc_lib="$(ls -d "$_kvb_root"/.tools/venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -n1)"
if [[ -n "$_kvb_nvrtc_lib" ]]; then
    export LD_LIBRARY_PATH="$_kvb_nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
unset _kvb_root _kvb_nvrtc_lib
