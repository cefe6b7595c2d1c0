// Disaggregated prefill/decode: the transfer outcome enum, the statistics and row-run types,
// the in-process LoopbackHub, and the KVCacheManager methods that attach a transfer backend,
// exchange blobs with the peer engine, lease, post, poll, receive and quarantine.
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

namespace {

nb::bytes to_bytes(const std::vector<uint8_t>& v) {
    return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

std::vector<uint8_t> from_bytes(const nb::bytes& b) {
    const auto* p = reinterpret_cast<const uint8_t*>(b.c_str());
    return std::vector<uint8_t>(p, p + b.size());
}

}  // namespace

void init_disagg(nb::module_& m) {
    nb::enum_<kvb_transfer_outcome_t>(m, "TransferOutcome",
                                      "How a transfer ended (only DONE and NOT_SUBMITTED end its "
                                      "access to its rows; the others quarantine them).")
        .value("DONE", KVB_TRANSFER_DONE)
        .value("NOT_SUBMITTED", KVB_TRANSFER_NOT_SUBMITTED)
        .value("FAILED", KVB_TRANSFER_FAILED)
        .value("TIMED_OUT", KVB_TRANSFER_TIMED_OUT)
        .value("IN_DOUBT", KVB_TRANSFER_IN_DOUBT);

    auto stats = nb::class_<kvb_transfer_stats_t>(
        m, "TransferStats",
        "Counters and gauges of the transfer lifecycle (kvb_transfer_stats_t).");
    // clang-format off
#define KVB_TRANSFER_STATS_FIELDS(X) \
    X(active_leases) X(leased_blocks) X(receiving_requests) X(receiving_blocks) \
    X(quarantined_holds) X(quarantined_blocks) X(transfers_posted) X(transfers_done) \
    X(transfers_failed) X(transfers_timed_out) X(bytes_posted) X(descriptors_unmerged) \
    X(descriptors_posted) X(receives_completed) X(receives_aborted) X(quarantines_released)
    // clang-format on
#define X(name) stats.def_ro(#name, &kvb_transfer_stats_t::name);
    KVB_TRANSFER_STATS_FIELDS(X)
#undef X
#define X(name) #name,
    add_repr(stats, "TransferStats", {KVB_TRANSFER_STATS_FIELDS(X)});
#undef X

    auto runs = nb::class_<kvb_row_runs_t>(m, "RowRuns",
                                           "How a sequence's rows of one window fall into runs of "
                                           "consecutive rows.")
                    .def_ro("window_size", &kvb_row_runs_t::window_size)
                    .def_ro("blocks", &kvb_row_runs_t::blocks)
                    .def_ro("runs", &kvb_row_runs_t::runs);
    add_repr(runs, "RowRuns", {"window_size", "blocks", "runs"});

    nb::class_<kvb::LoopbackHub>(m, "LoopbackHub",
                                 "An in-process transfer hub: managers attached to it "
                                 "(``attach_loopback``) move KV bytes between each other with "
                                 "memcpy. For tests; with fault injection.")
        .def(nb::init<>())
        .def("hold_next", &kvb::LoopbackHub::holdNext,
             "The next transfer posted stays in progress until ``finish_held``.")
        .def("fail_next", &kvb::LoopbackHub::failNext,
             "The next transfer posted fails at once (nothing copied, no notification).")
        .def("finish_held", &kvb::LoopbackHub::finishHeld,
             "Completes every held transfer; returns how many.");
}

void init_manager_disagg(ManagerClass& cls) {
    cls.def(
           "attach_loopback",
           [](Manager& self, kvb::LoopbackHub& hub, const std::string& agent_name, int32_t tp_rank,
              int32_t tp_size, int64_t timeout_ms) {
               nogil([&] { self.m.attachLoopback(hub, agent_name, tp_rank, tp_size, timeout_ms); });
           },
           "hub"_a, "agent_name"_a, "tp_rank"_a = 0, "tp_size"_a = 1, "timeout_ms"_a = 1000,
           "Attaches agent ``agent_name`` of ``hub`` as the transfer backend (every pool "
           "registered).")
        .def(
            "attach_nixl",
            [](Manager& self, const std::string& agent_name, int32_t tp_rank, int32_t tp_size,
               int64_t timeout_ms) {
                nogil([&] { self.m.attachNixl(agent_name, tp_rank, tp_size, timeout_ms); });
            },
            "agent_name"_a, "tp_rank"_a = 0, "tp_size"_a = 1, "timeout_ms"_a = 1000,
            "Attaches a NIXL agent (UCX) as the transfer backend between engine processes; "
            "NIXL's C API is loaded from ``KVBLOCK_NIXL_LIBRARY`` or the loader path.")
        .def(
            "transfer_metadata",
            [](Manager& self) {
                return to_bytes(nogil([&] { return self.m.transferMetadata(); }));
            },
            "The attached backend's metadata blob, for the peer's ``add_transfer_peer``.")
        .def(
            "export_layout",
            [](Manager& self) { return to_bytes(nogil([&] { return self.m.exportLayout(); })); },
            "This manager's layout blob, for the peer's ``post_send``.")
        .def(
            "add_transfer_peer",
            [](Manager& self, nb::bytes metadata) {
                auto md = from_bytes(metadata);
                return nogil([&] { return self.m.addTransferPeer(md); });
            },
            "metadata"_a, "Loads a peer's metadata blob; returns the peer's agent name.")
        .def(
            "add_sequence_receiving",
            [](Manager& self, const PyRequest& request) {
                kvb_admission_t out{};
                kvb_request_t r;
                kvb_retention_config_t retention;
                request.fill(r, retention);
                call([&] { return kvb_manager_add_sequence_receiving(self.h(), &r, &out); });
                return out;
            },
            "request"_a,
            "Admits a request whose prompt's KV arrives from another engine: local reuse as "
            "usual, the rest receiving until ``complete_receive``.")
        .def(
            "receive_ticket",
            [](Manager& self, uint64_t id) {
                return to_bytes(nogil([&] { return self.m.receiveTicket(id); }));
            },
            "request_id"_a, "The receive ticket blob of a receiving sequence, for the sender.")
        .def(
            "complete_receive",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.completeReceive(id); }); },
            "request_id"_a,
            "The prompt's KV has landed: its blocks are stored for reuse; an ordinary sequence.")
        .def(
            "abort_receive",
            [](Manager& self, uint64_t id, kvb_transfer_outcome_t outcome) {
                return nogil([&] { return self.m.abortReceive(id, outcome); });
            },
            "request_id"_a, "outcome"_a,
            "Gives the receive up; returns the quarantine hold id when the outcome is not "
            "quiescent (else None).")
        .def(
            "begin_send",
            [](Manager& self, uint64_t id, int32_t skip_tokens, int32_t computed_tokens) {
                return nogil([&] { return self.m.beginSend(id, skip_tokens, computed_tokens); });
            },
            "request_id"_a, "skip_tokens"_a, "computed_tokens"_a,
            "Leases the blocks of tokens [skip_tokens, computed_tokens); returns the hold id.")
        .def(
            "post_send",
            [](Manager& self, uint64_t hold, const std::string& peer, nb::bytes peer_layout,
               nb::bytes ticket, nb::bytes notification) {
                auto l = from_bytes(peer_layout), t = from_bytes(ticket),
                     n = from_bytes(notification);
                nogil([&] { self.m.postSend(hold, peer, l, t, n); });
            },
            "hold"_a, "peer"_a, "peer_layout"_a, "ticket"_a, "notification"_a = nb::bytes(""),
            "Posts a lease into the rows of the peer's ticket.")
        .def(
            "poll_transfers",
            [](Manager& self) {
                auto events = nogil([&] { return self.m.pollTransfers(); });
                std::vector<std::pair<uint64_t, kvb_transfer_outcome_t>> out;
                for (const auto& e : events)
                    out.emplace_back(e.hold_id, static_cast<kvb_transfer_outcome_t>(e.outcome));
                return out;
            },
            "Settles what the watched transfers did: ``[(hold, TransferOutcome)]``.")
        .def(
            "settle_hold",
            [](Manager& self, uint64_t hold, kvb_transfer_outcome_t outcome) {
                return nogil([&] { return self.m.settleHold(hold, outcome); });
            },
            "hold"_a, "outcome"_a, "Settles a hold; returns whether it still exists.")
        .def(
            "release_quarantine",
            [](Manager& self, uint64_t hold) { nogil([&] { self.m.releaseQuarantine(hold); }); },
            "hold"_a, "Releases a quarantined hold: its blocks go back to the free queues.")
        .def(
            "take_transfer_notification",
            [](Manager& self) -> std::optional<std::pair<std::string, nb::bytes>> {
                auto n = nogil([&] { return self.m.takeTransferNotification(); });
                if (!n) return std::nullopt;
                return std::make_pair(n->first, to_bytes(n->second));
            },
            "The oldest notification not yet taken: ``(peer, message)``, or None.")
        .def(
            "transfer_stats",
            [](Manager& self) { return nogil([&] { return self.m.transferStats(); }); },
            "The transfer lifecycle's counters and gauges (:class:`TransferStats`).")
        .def(
            "set_contiguous_runs",
            [](Manager& self, bool on) { nogil([&] { self.m.setContiguousRuns(on); }); }, "on"_a,
            "Turns the contiguous-run allocation preference on or off.")
        .def(
            "row_runs",
            [](Manager& self, uint64_t id) { return nogil([&] { return self.m.rowRuns(id); }); },
            "request_id"_a, "Per window, how the rows of a sequence fall into runs.");
}

}  // namespace kvb_py
