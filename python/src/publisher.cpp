// EventPublisher: a manager's KV events on the wire (kvb_event_publisher_*).
#include "init.hpp"
#include "manager.hpp"

namespace kvb_py {

namespace {

/// Owns a kvb_event_publisher_t; keeps its manager alive while it runs.
struct Publisher {
    kvb_event_publisher_t* p = nullptr;
    nb::object manager;  // the KVCacheManager it drains (kept alive)

    Publisher(nb::object mgr, const std::string& endpoint, const std::string& topic,
              std::optional<int32_t> dp_rank, int32_t send_hwm,
              std::optional<std::string> replay_endpoint, int32_t replay_buffer_steps,
              uint64_t start_sequence, bool all_blocks_cleared_first, int32_t window_size,
              int32_t linger_ms, uint64_t max_queued_bytes, uint64_t replay_peer_max_bytes,
              int32_t replay_requests_per_second_per_peer, int32_t replay_requests_per_second,
              int32_t max_replay_peers, int32_t max_incoming_message_bytes,
              int32_t slow_peer_timeout_ms, bool publish_disk_events)
        : manager(std::move(mgr)) {
        Manager& m = nb::cast<Manager&>(manager);
        kvb_event_publisher_config_t c;
        kvb::check(kvb_event_publisher_config_init(&c));
        c.endpoint = endpoint.c_str();
        c.topic = topic.c_str();
        c.has_dp_rank = dp_rank.has_value();
        c.dp_rank = dp_rank.value_or(0);
        c.send_hwm = send_hwm;
        c.replay_endpoint = replay_endpoint ? replay_endpoint->c_str() : nullptr;
        c.replay_buffer_steps = replay_buffer_steps;
        c.start_sequence = start_sequence;
        c.all_blocks_cleared_first = all_blocks_cleared_first;
        c.window_size = window_size;
        c.linger_ms = linger_ms;
        c.max_queued_bytes = max_queued_bytes;
        c.replay_peer_max_bytes = replay_peer_max_bytes;
        c.replay_requests_per_second_per_peer = replay_requests_per_second_per_peer;
        c.replay_requests_per_second = replay_requests_per_second;
        c.max_replay_peers = max_replay_peers;
        c.max_incoming_message_bytes = max_incoming_message_bytes;
        c.slow_peer_timeout_ms = slow_peer_timeout_ms;
        c.publish_disk_events = publish_disk_events;
        call([&] { return kvb_event_publisher_create(m.h(), &c, &p); });
    }
    ~Publisher() { close(); }
    void close() {
        if (p) {
            kvb_event_publisher_t* q = p;
            p = nullptr;
            nogil([&] { kvb_event_publisher_destroy(q); });
        }
    }
    kvb_event_publisher_t* live() const {
        if (!p) throw kvb::Error(KVB_STATUS_DESTROYED, "the publisher is closed");
        return p;
    }
    std::string endpoint(bool replay) const {
        std::vector<char> buf(256);
        size_t len = 0;
        kvb_status_t st = nogil([&] {
            return kvb_event_publisher_get_endpoint(live(), replay, buf.data(), buf.size(), &len);
        });
        if (st == KVB_STATUS_BUFFER_TOO_SMALL) {
            buf.resize(len + 1);
            st = nogil([&] {
                return kvb_event_publisher_get_endpoint(live(), replay, buf.data(), buf.size(),
                                                        &len);
            });
        }
        kvb::check(st);
        return std::string(buf.data(), len);
    }
};

const char* const kPublisherDoc =
    R"(Publishes a manager's KV events over ZeroMQ in the vLLM / Dynamo
wire format (``kvb_event_publisher_*``), from a thread of its own, so that KV-aware routers
(Dynamo's KV router or indexer, vLLM's production stack) see what this engine caches. The manager
needs events on (``max_kv_event_entries`` > 0) and the publisher is then their only consumer.
Use as a context manager or call :meth:`close`.)";

}  // namespace

void init_publisher(nb::module_& m) {
    auto stats = nb::class_<kvb_event_publisher_stats_t>(m, "EventPublisherStats",
                                                         "Counters of an :class:`EventPublisher`.")
                     .def_ro("batches", &kvb_event_publisher_stats_t::batches)
                     .def_ro("events", &kvb_event_publisher_stats_t::events)
                     .def_ro("dropped_events", &kvb_event_publisher_stats_t::dropped_events)
                     .def_ro("gaps", &kvb_event_publisher_stats_t::gaps)
                     .def_ro("subscriptions", &kvb_event_publisher_stats_t::subscriptions)
                     .def_ro("replay_requests", &kvb_event_publisher_stats_t::replay_requests)
                     .def_ro("next_sequence", &kvb_event_publisher_stats_t::next_sequence);
    add_repr(stats, "EventPublisherStats",
             {"batches", "events", "dropped_events", "gaps", "subscriptions", "replay_requests",
              "next_sequence"});
    nb::class_<Publisher>(m, "EventPublisher", kPublisherDoc)
        .def(
            nb::init<nb::object, const std::string&, const std::string&, std::optional<int32_t>,
                     int32_t, std::optional<std::string>, int32_t, uint64_t, bool, int32_t, int32_t,
                     uint64_t, uint64_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool>(),
            "manager"_a, "endpoint"_a, "topic"_a = "", "dp_rank"_a = nb::none(),
            "send_hwm"_a = 100000, "replay_endpoint"_a = nb::none(),
            "replay_buffer_steps"_a = 10000, "start_sequence"_a = 0,
            "all_blocks_cleared_first"_a = false, "window_size"_a = 0, "linger_ms"_a = 1000,
            "max_queued_bytes"_a = uint64_t{64} << 20,
            "replay_peer_max_bytes"_a = uint64_t{4} << 20,
            "replay_requests_per_second_per_peer"_a = 10, "replay_requests_per_second"_a = 100,
            "max_replay_peers"_a = 64, "max_incoming_message_bytes"_a = 256,
            "slow_peer_timeout_ms"_a = 10000, "publish_disk_events"_a = false,
            "Binds ``endpoint`` (``tcp://HOST:PORT`` with PORT 1-65535 or ``*`` for a free one, "
            "or ``ipc://PATH``) and starts publishing ``manager``'s flushed events; "
            "``replay_endpoint`` adds the ROUTER socket that answers replay requests. The "
            "service limits bound what peers can make the publisher queue and ask (see "
            "``kvb_event_publisher_config_t``). Raises :class:`TransportError` for a refused "
            "endpoint or a failed bind, :class:`InvalidArgumentError` (a ValueError) for a "
            "setting out of range (``start_sequence`` at or above 2**63, a non-positive "
            "limit), :class:`UnsupportedError` when the manager already has a publisher.")
        .def("close", &Publisher::close,
             "Publishes what was flushed, stops the thread and releases the sockets.")
        .def(
            "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
        .def("__exit__", [](Publisher& self, nb::args) { self.close(); })
        .def_prop_ro(
            "endpoint", [](const Publisher& self) { return self.endpoint(false); },
            "The PUB socket's bound endpoint (with the port actually chosen).")
        .def_prop_ro(
            "replay_endpoint", [](const Publisher& self) { return self.endpoint(true); },
            "The replay socket's bound endpoint.")
        .def(
            "wait_for_subscribers",
            [](const Publisher& self, uint64_t n, int64_t timeout_ms) {
                uint64_t got = 0;
                call([&] {
                    return kvb_event_publisher_wait_for_subscribers(self.live(), n, timeout_ms,
                                                                    &got);
                });
                return got;
            },
            "min_subscriptions"_a = 1, "timeout_ms"_a = -1,
            "Waits (GIL released) until ``min_subscriptions`` subscriptions arrived or the "
            "timeout; "
            "returns the count received.")
        .def_prop_ro(
            "stats",
            [](const Publisher& self) {
                kvb_event_publisher_stats_t out{};
                call([&] { return kvb_event_publisher_get_stats(self.live(), &out); });
                return out;
            },
            "The publisher's counters (:class:`EventPublisherStats`).");
}

}  // namespace kvb_py
