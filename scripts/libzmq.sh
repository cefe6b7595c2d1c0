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
# built as always. The library is copied to target/libzmq/; KVB_LIBZMQ_OUT (exported) passes that
# folder on to the scripts run after.
kvb_libzmq_once() {
    local root built
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [[ -z "${KVB_LIBZMQ_OUT:-}" || ! -e "$KVB_LIBZMQ_OUT/lib/libzmq.a" ]]; then
        built="$(cd "$root" &&
            cargo build --release --locked -p zmq-sys --message-format=json-render-diagnostics |
            sed -n 's/.*"reason":"build-script-executed","package_id":"[^"]*zmq-sys@[^"]*".*"out_dir":"\([^"]*\)".*/\1/p')"
        if [[ ! -e "$built/lib/libzmq.a" ]]; then
            echo "libzmq: zmq-sys's build left no libzmq.a (out dir: '$built')" >&2
            return 1
        fi
        # A copy in a folder of its own: a later build script run in target/release (rewriting
        # its libzmq.a) cannot touch what a build in another folder is linking, and the path in
        # the overrides (part of the other folders' fingerprints) stays the same across versions.
        KVB_LIBZMQ_OUT="$root/target/libzmq"
        mkdir -p "$KVB_LIBZMQ_OUT/lib" "$KVB_LIBZMQ_OUT/include"
        if ! cmp -s "$built/lib/libzmq.a" "$KVB_LIBZMQ_OUT/lib/libzmq.a"; then
            cp "$built/lib/libzmq.a" "$KVB_LIBZMQ_OUT/lib/libzmq.a.tmp"
            mv "$KVB_LIBZMQ_OUT/lib/libzmq.a.tmp" "$KVB_LIBZMQ_OUT/lib/libzmq.a"
        fi
        cp -R "$built/source/include/." "$KVB_LIBZMQ_OUT/include/"
    fi
    export KVB_LIBZMQ_OUT
    local key="target.x86_64-unknown-linux-gnu.zmq"
    # What zmq-sys's build script prints (cargo:rustc-link-lib, rustc-link-search, include, ...).
    KVB_LIBZMQ_CONFIG=(
        --config "$key.rustc-link-lib=[\"static=zmq\", \"stdc++\"]"
        --config "$key.rustc-link-search=[\"native=$KVB_LIBZMQ_OUT/lib\"]"
        --config "$key.include=\"$KVB_LIBZMQ_OUT/include\""
        --config "$key.lib=\"$KVB_LIBZMQ_OUT/lib\""
        --config "$key.out=\"$KVB_LIBZMQ_OUT\""
    )
}
