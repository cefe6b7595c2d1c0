// The disk tier below the host tier: its configuration on ManagerConfig, its statistics, and the
// KVCacheManager methods that poll it, prefetch waiting requests and tell when they are ready.
#include "init.hpp"
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

void init_disk(nb::module_& m) {
    nb::enum_<kvb_disk_write_policy_t>(m, "DiskWritePolicy",
                                       "Which blocks leaving the host tier are written to disk.")
        .value("ALL", KVB_DISK_WRITE_ALL, "Every cached block the host tier evicts (default).")
        .value("REUSED", KVB_DISK_WRITE_REUSED,
               "Only blocks reused at least once while cached (fewer writes).");

    auto stats = nb::class_<kvb_disk_stats_t>(
        m, "DiskStats", "Counters of the disk tier, summed over windows (``kvb_disk_stats_t``).");
#define X(name) stats.def_ro(#name, &kvb_disk_stats_t::name);
    X(direct_io)
    X(hits)
    X(reads)
    X(read_bytes)
    X(writes)
    X(write_bytes)
    X(write_drops)
    X(write_skips)
    X(policy_skips)
    X(write_errors)
    X(enospc_errors)
    X(read_errors)
    X(verify_failures)
    X(reads_discarded)
    X(read_drops)
    X(evictions)
    X(recovered)
    X(ignored_at_restart)
    X(slots)
    X(slots_used)
    X(reads_in_flight)
    X(writes_queued)
    X(slot_bytes)
#undef X

    nb::class_<kvb_disk_prefetch_t>(
        m, "DiskPrefetch", "What a prefetch did for one request (``kvb_disk_prefetch_t``).")
        .def_ro("started", &kvb_disk_prefetch_t::started, "Reads started by this call.")
        .def_ro("in_flight", &kvb_disk_prefetch_t::in_flight, "Prefix blocks already being read.");

    nb::object config = m.attr("ManagerConfig");
    config.attr("with_disk_tier") = nb::cpp_function(
        [](kvb::Config& c, std::string directory, uint64_t bytes_per_window,
           kvb_disk_write_policy_t policy, int32_t max_writes_queued,
           int32_t max_reads_in_flight) -> kvb::Config& {
            c.withDiskTier(std::move(directory), bytes_per_window, policy);
            c.disk.max_writes_queued = max_writes_queued;
            c.disk.max_reads_in_flight = max_reads_in_flight;
            return c;
        },
        nb::is_method(), nb::scope(config), nb::name("with_disk_tier"), "directory"_a,
        "bytes_per_window"_a = 0, "policy"_a = KVB_DISK_WRITE_ALL, "max_writes_queued"_a = 64,
        "max_reads_in_flight"_a = 64, nb::rv_policy::reference,
        "Adds a disk tier below the host tier in ``directory`` (kept across runs: a new manager "
        "with the same geometry and budget reuses it); ``bytes_per_window`` 0 = half the free "
        "space. Returns the config.");
}

void init_manager_disk(ManagerClass& cls) {
    cls.def(
           "disk_poll", [](Manager& self) { return nogil([&] { return self.m.diskPoll(); }); },
           "Collects finished disk I/O; returns the blocks placed in the host tier.")
        .def(
            "disk_prefetch",
            [](Manager& self, const std::vector<const PyRequest*>& requests) {
                CBatch batch(requests);
                std::vector<kvb_disk_prefetch_t> out(requests.size());
                call([&] {
                    return kvb_manager_disk_prefetch(self.h(), batch.requests.data(),
                                                     batch.requests.size(), out.data());
                });
                return out;
            },
            "requests"_a,
            "Starts reading the disk-resident prefixes of waiting requests into the host tier; "
            "never waits.")
        .def(
            "disk_blocks_in_flight",
            [](Manager& self, const PyRequest& request) {
                int64_t n = 0;
                with_optional_request(&request, [&](const kvb_request_t* r) {
                    call([&] { return kvb_manager_disk_blocks_in_flight(self.h(), r, &n); });
                });
                return n;
            },
            "request"_a, "Prefix blocks of a request still being read from disk (0: ready).")
        .def(
            "get_disk_stats",
            [](Manager& self) { return nogil([&] { return self.m.getDiskStats(); }); },
            "The disk tier's counters (:class:`DiskStats`).")
        .def_prop_ro(
            "has_disk_tier", [](Manager& self) { return self.m.hasDiskTier(); },
            "Whether the manager has a disk tier.");
}

}  // namespace kvb_py
