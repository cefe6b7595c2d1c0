// kvblock._kvblock: the Python binding of kvblock (nanobind). It wraps the C ABI (kvblock.h)
// through the C++ RAII header (kvblock.hpp) and implements nothing of its own: every call converts
// its arguments, releases the GIL, calls the library and converts the result. A failing status
// becomes the Python exception of that status (kvblock.Error and subclasses) with the library's
// message.
//
// One file per subsystem, each with its init function (init.hpp); shared helpers in common.hpp,
// requests.hpp and manager.hpp.
#include "init.hpp"
#include "requests.hpp"

NB_MODULE(_kvblock, m) {
    m.doc() =
        "kvblock: a KV-cache block manager for LLM inference (the C ABI, wrapped with nanobind).";
    kvb_py::init_enums(m);
    kvb_py::init_errors(m);
    kvb_py::init_remote(m);
    kvb_py::init_pool_model(m);
    kvb_py::init_config(m);
    kvb_py::init_request(m);
    kvb_py::init_results(m);
    kvb_py::init_events(m);
    kvb_py::init_disagg(m);
    kvb_py::init_manager(m);
    kvb_py::init_disk(m);
    kvb_py::init_publisher(m);
    m.def(
        "multimodal_digest",
        [](nb::bytes content) {
            uint8_t digest[32];
            kvb_py::call([&] {
                return kvb_multimodal_digest(reinterpret_cast<const uint8_t*>(content.c_str()),
                                             content.size(), digest);
            });
            return kvb_py::digest_bytes(digest);
        },
        "content"_a,
        "The 32-byte content digest of a multimodal item's raw bytes (BLAKE3, "
        "``kvb_multimodal_digest``), for :class:`MultimodalItem`.");
    m.def(
        "version",
        [] {
            uint32_t major = 0, minor = 0, patch = 0;
            kvb::check(kvb_version(&major, &minor, &patch));
            return std::make_tuple(major, minor, patch);
        },
        "``(major, minor, patch)`` of the loaded libkvblock (``kvb_version``).");
}
