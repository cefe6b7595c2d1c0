// KVCacheManager methods: iteration, events, checks.
#include "manager.hpp"

namespace kvb_py {

void init_manager_iteration(ManagerClass& cls) {
    cls.def(
           "refresh_blocks", [](Manager& self) { nogil([&] { self.m.refreshBlocks(); }); },
           "Expires timed retentions and syncs outstanding copies; call once per iteration.")
        .def(
            "flush_iteration_events",
            [](Manager& self) { nogil([&] { self.m.flushIterationEvents(); }); },
            "Ends the iteration's events (TensorRT-LLM ``flushIterationEvents``): they become "
            "visible to "
            ":meth:`get_latest_events`.")
        .def(
            "get_latest_events",
            [](Manager& self, int64_t timeout_ms) {
                return nogil([&] { return self.m.getLatestEvents(timeout_ms); });
            },
            "timeout_ms"_a = 0,
            "Takes every flushed event, waiting up to ``timeout_ms`` (0 = no wait) for one, "
            "without holding "
            "the GIL (TensorRT-LLM ``getLatestEvents``). Safe from another thread.")
        .def(
            "get_latest_events_and_dropped",
            [](Manager& self, int64_t timeout_ms) {
                uint64_t dropped = 0;
                auto events = nogil([&] { return self.m.getLatestEvents(timeout_ms, &dropped); });
                return std::make_pair(std::move(events), dropped);
            },
            "timeout_ms"_a = 0,
            "As :meth:`get_latest_events`, with the number of events the full buffer dropped since "
            "the "
            "previous drain.")
        .def(
            "check_invariants", [](Manager& self) { nogil([&] { self.m.checkInvariants(); }); },
            "Verifies the manager's invariants; raises :class:`InvariantViolationError` naming the "
            "first "
            "violation.")
        .def(
            "advance_time",
            [](Manager& self, int64_t ms) { nogil([&] { self.m.advanceTime(ms); }); }, "ms"_a,
            "Advances the manual clock (managers created with ``manual_clock``).")
        .def(
            "_debug_trigger_panic",
            [](Manager& self) { call([&] { return kvb_manager_debug_trigger_panic(self.h()); }); },
            "Test hook: panics inside the library (raises :class:`InternalError`; the manager is "
            "then "
            "poisoned).");
}

}  // namespace kvb_py
