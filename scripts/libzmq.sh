# shellcheck shell=bash disable=SC2034 # KVB_LIBZMQ_CONFIG: used by the sourcing scripts
# Sourced by the test scripts. The zmq-sys crate builds libzmq from source (zeromq-src: C++, about
# two minutes on two cores) in every target folder that needs it: the release build, clippy's and
# the docs' (build scripts run for checks too), the MSRV check's, the fuzz target's and the
# sanitizers'. `kvb_libzmq_once` builds it once, in target/release (the unit `cargo build
# --release` builds anyway, so nothing extra there), and sets KVB_LIBZMQ_CONFIG: cargo --config
# arguments that stand in for zmq-sys's build script (its `links = "zmq"`) with that library, for
# the other target folders. The same sources and compiler flags (the release profile's; RUSTFLAGS
# such as the sanitizers' never reach C++ that a build script compiles), so the fuzz target and the
# sanitizer builds link what their own build script would have built; the checks link nothing.
# The release target folder never gets the override: the library, CMake's and pip's builds are
# built as always. KVB_LIBZMQ_OUT (exported) passes the built one on to the scripts run after.
kvb_libzmq_once() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [[ -z "${KVB_LIBZMQ_OUT:-}" || ! -e "$KVB_LIBZMQ_OUT/lib/libzmq.a" ]]; then
        KVB_LIBZMQ_OUT="$(cd "$root" &&
            cargo build --release --locked -p zmq-sys --message-format=json-render-diagnostics |
            sed -n 's/.*"reason":"build-script-executed","package_id":"[^"]*zmq-sys@[^"]*".*"out_dir":"\([^"]*\)".*/\1/p')"
        if [[ ! -e "$KVB_LIBZMQ_OUT/lib/libzmq.a" ]]; then
            echo "libzmq: zmq-sys's build left no libzmq.a (out dir: '$KVB_LIBZMQ_OUT')" >&2
            return 1
        fi
    fi
    export KVB_LIBZMQ_OUT
    local key="target.x86_64-unknown-linux-gnu.zmq"
    # What zmq-sys's build script prints (cargo:rustc-link-lib, rustc-link-search, include, ...).
    KVB_LIBZMQ_CONFIG=(
        --config "$key.rustc-link-lib=[\"static=zmq\", \"stdc++\"]"
        --config "$key.rustc-link-search=[\"native=$KVB_LIBZMQ_OUT/lib\"]"
        --config "$key.include=\"$KVB_LIBZMQ_OUT/source/include\""
        --config "$key.lib=\"$KVB_LIBZMQ_OUT/lib\""
        --config "$key.out=\"$KVB_LIBZMQ_OUT\""
    )
}
