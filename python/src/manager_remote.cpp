// The shared remote tier (Redis / Valkey): its statistics and prefetch result types, the
// ManagerConfig helper that turns it on, and the KVCacheManager methods that drive it.
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

void init_remote(nb::module_& m) {
    nb::enum_<kvb_remote_write_policy_t>(m, "RemoteWritePolicy",
                                         "When blocks go to the remote store.")
        .value("ON_STORE", KVB_REMOTE_WRITE_ON_STORE, "When stored for reuse (default).")
        .value("ON_HOST_EVICT", KVB_REMOTE_WRITE_ON_HOST_EVICT, "When the host tier evicts them.");

    auto prefetch = nb::class_<kvb_remote_prefetch_t>(m, "RemotePrefetch",
                                                      "What a remote prefetch did for one request.")
                        .def_ro("looked_up", &kvb_remote_prefetch_t::looked_up)
                        .def_ro("started", &kvb_remote_prefetch_t::started)
                        .def_ro("pending", &kvb_remote_prefetch_t::pending,
                                "Prefix blocks not in yet (0: ready to admit).");
    add_repr(prefetch, "RemotePrefetch", {"looked_up", "started", "pending"});

    auto stats = nb::class_<kvb_remote_stats_t>(
        m, "RemoteStats", "Counters of the remote tier (see ``kvb_remote_stats_t``).");
    // clang-format off
#define KVB_REMOTE_STATS_FIELDS(X) \
    X(lookups) X(lookup_hits) X(lookup_drops) X(fetches) X(fetched) X(fetch_bytes) X(hits) \
    X(fetches_discarded) X(fetch_drops) X(fetch_misses) X(verify_failures) X(refused_length) \
    X(refused_garbage) X(refused_namespace) X(refused_corrupt) X(refused_key) X(writes) \
    X(write_bytes) X(write_skips) X(write_dedup_remote) X(write_drops) X(policy_skips) \
    X(errors_unavailable) X(errors_timeout) X(errors_auth) X(errors_other) \
    X(lookups_in_flight) X(fetches_in_flight) X(writes_queued) X(lookup_p50_us) \
    X(lookup_p99_us) X(fetch_p50_us) X(fetch_p99_us) X(store_p50_us) X(store_p99_us) \
    X(errors_protocol) X(errors_oversized)
    // clang-format on
#define X(name) stats.def_ro(#name, &kvb_remote_stats_t::name);
    KVB_REMOTE_STATS_FIELDS(X)
#undef X
#define X(name) #name,
    add_repr(stats, "RemoteStats", {KVB_REMOTE_STATS_FIELDS(X)});
#undef X
}

void init_config_remote(nb::class_<kvb::Config>& config) {
    config.def(
        "with_remote_tier",
        [](kvb::Config& c, std::string urls, std::string model_id, std::string password,
           bool cluster, kvb_remote_write_policy_t policy, std::string tls_ca_file,
           std::string tls_cert_file, std::string tls_key_file) -> kvb::Config& {
            c.withRemoteTier(std::move(urls), std::move(model_id), std::move(password), cluster,
                             policy);
            return c.withRemoteTls(std::move(tls_ca_file), std::move(tls_cert_file),
                                   std::move(tls_key_file));
        },
        "urls"_a, "model_id"_a, "password"_a = "", "cluster"_a = false,
        "write_policy"_a = KVB_REMOTE_WRITE_ON_STORE, "tls_ca_file"_a = "", "tls_cert_file"_a = "",
        "tls_key_file"_a = "", nb::rv_policy::reference,
        "Adds the shared remote tier: comma-separated ``redis://host:port`` URLs (a server, or "
        "a Redis Cluster's seed nodes with ``cluster``; ``rediss://`` for TLS, with a library "
        "built with TLS), the model identity that makes two engines' KV interchangeable, and "
        "the server's password (empty: none). For TLS: ``tls_ca_file`` the PEM authorities the "
        "server's certificate must chain to (empty: the system's trust store), "
        "``tls_cert_file`` and ``tls_key_file`` a client certificate and its key (both or "
        "neither). Returns the config.");
}

void init_manager_remote(ManagerClass& cls) {
    cls.def(
           "remote_poll", [](Manager& self) { return nogil([&] { return self.m.remotePoll(); }); },
           "Collects finished remote batches; returns the blocks placed in the host tier.")
        .def(
            "remote_prefetch",
            [](Manager& self, const std::vector<const PyRequest*>& requests) {
                CBatch batch(requests);
                std::vector<kvb_remote_prefetch_t> out(requests.size());
                call([&] {
                    return kvb_manager_remote_prefetch(self.h(), batch.requests.data(),
                                                       batch.requests.size(), out.data());
                });
                return out;
            },
            "requests"_a,
            "Looks up and fetches the remote part of waiting requests' prefixes (never waits); "
            "one :class:`RemotePrefetch` per request.")
        .def(
            "remote_blocks_pending",
            [](Manager& self, const PyRequest& request) {
                kvb_request_t r;
                kvb_retention_config_t retention;
                request.fill(r, retention);
                int64_t n = 0;
                call([&] { return kvb_manager_remote_blocks_pending(self.h(), &r, &n); });
                return n;
            },
            "request"_a, "Prefix blocks of a request still being looked up or fetched.")
        .def(
            "get_remote_stats",
            [](Manager& self) { return nogil([&] { return self.m.getRemoteStats(); }); },
            "The remote tier's counters (:class:`RemoteStats`).")
        .def_prop_ro(
            "has_remote_tier", [](Manager& self) { return self.m.hasRemoteTier(); },
            "Whether the manager has a remote tier.");
}

}  // namespace kvb_py
