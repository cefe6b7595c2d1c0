// The KVCacheManager class: construction and closing; its methods are added by manager_*.cpp.
#include "init.hpp"
#include "manager.hpp"

namespace kvb_py {

const char* const kManagerDoc = R"(A KV-cache block manager (TensorRT-LLM ``KVCacheManager``).

Every method calls the C ABI with the GIL released, so another thread (e.g. one draining events
with :meth:`get_latest_events`) runs meanwhile; calls on one manager are serialized by the
library. A failed call raises a :class:`kvblock.Error` subclass and changes nothing. Use as a
context manager or call :meth:`close` to free the manager before it is garbage collected.)";

void init_manager(nb::module_& m) {
    auto cls =
        nb::class_<Manager>(m, "KVCacheManager", kManagerDoc, nb::is_weak_referenceable())
            .def(
                "__init__",
                [](Manager* self, const kvb::Config& config) {
                    nogil([&] { new (self) Manager(config); });
                },
                "config"_a, "Creates a manager (``kvb_manager_create``).")
            .def("close", &Manager::close,
                 "Destroys the manager now; later calls raise :class:`DestroyedError`, a thread "
                 "waiting in "
                 ":meth:`get_latest_events` returns an empty list. Closing twice raises.")
            .def(
                "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
            .def(
                "__exit__",
                [](Manager& self, nb::handle, nb::handle, nb::handle) {
                    // With pool views alive, the destroy waits for the manager object's collection
                    // (the views hold it), so their memory stays valid.
                    if (self.live_views > 0) return;
                    nogil(
                        [&] { return kvb_manager_destroy(self.h()); });  // closed already: ignored
                },
                "exc_type"_a.none(), "exc_value"_a.none(), "traceback"_a.none(),
                "Closes the manager (deferred to its collection while pool views are alive).");
    init_manager_admission(cls);
    init_manager_lifecycle(cls);
    init_manager_tables(cls);
    init_manager_queries(cls);
    init_manager_remote(cls);
    init_manager_disagg(cls);
    init_manager_scheduling(cls);
    init_manager_iteration(cls);
    init_manager_reuse_tree(m, cls);
    init_sizing(cls);
    init_manager_disk(cls);
    init_manager_pools(cls);
}

}  // namespace kvb_py
