#!/usr/bin/env bash
# Sourced by the test scripts: points KVBLOCK_NIXL_LIBRARY at the NIXL C API library of the
# nixl-cu12 wheel that scripts/setup.sh installed in .tools/nixl-venv (src/disagg/nixl loads it
# at run time; the library finds NIXL, its plugins and UCX through its own RPATH). Leaves an
# existing KVBLOCK_NIXL_LIBRARY alone.
_kvb_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_kvb_nixl_lib="$(ls -d "$_kvb_root"/.tools/nixl-venv/lib/python3*/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so 2>/dev/null | head -n1)"
if [[ -z "${KVBLOCK_NIXL_LIBRARY:-}" && -n "$_kvb_nixl_lib" ]]; then
    export KVBLOCK_NIXL_LIBRARY="$_kvb_nixl_lib"
fi
# UCX modules that need the system's rdma-core are not loaded: where libibverbs is installed,
# the wheel's bundled copy and the system's both load and the process crashes at exit
# (rtnl_tc_unregister in libnl-route-3). There is no RDMA on the test machines anyway.
export UCX_MODULES="${UCX_MODULES:-^ib,ib_*,rdmacm}"
unset _kvb_root _kvb_nixl_lib
