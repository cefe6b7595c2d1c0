// kvblock_disagg.hpp: the C++ wrapper of disaggregated prefill/decode (included by kvblock.hpp).
//
// The kvb::Manager methods declared in kvblock.hpp under "Disaggregated prefill/decode" are
// defined here, with kvb::LoopbackHub (an in-process transfer hub, RAII). Blobs (metadata,
// layout, receive ticket) are std::vector<uint8_t>, to be carried between the engines as they
// are. Failures throw kvb::Error, as everywhere in kvblock.hpp.
#ifndef KVBLOCK_DISAGG_HPP
#define KVBLOCK_DISAGG_HPP

#include "kvblock.hpp"

namespace kvb {

/// Owns a kvb_loopback_hub_t: managers attached to one hub (Manager::attachLoopback) transfer
/// KV bytes between each other in this process. Move-only. Attached managers keep the hub
/// alive after this object is gone.
class LoopbackHub {
  public:
    LoopbackHub() { check(kvb_loopback_hub_create(&handle_)); }
    ~LoopbackHub() { kvb_loopback_hub_destroy(handle_); }
    LoopbackHub(const LoopbackHub&) = delete;
    LoopbackHub& operator=(const LoopbackHub&) = delete;
    LoopbackHub(LoopbackHub&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    LoopbackHub& operator=(LoopbackHub&& other) noexcept {
        if (this != &other) {
            kvb_loopback_hub_destroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    kvb_loopback_hub_t* get() const noexcept { return handle_; }

    /// The next transfer posted on the hub stays in progress until finishHeld().
    void holdNext() { check(kvb_loopback_hub_hold_next(handle_)); }
    /// The next transfer posted on the hub fails at once (nothing copied, no notification).
    void failNext() { check(kvb_loopback_hub_fail_next(handle_)); }
    /// Completes every held transfer (bytes copied, notifications delivered); returns how many.
    size_t finishHeld() {
        size_t n = 0;
        check(kvb_loopback_hub_finish_held(handle_, &n));
        return n;
    }

  private:
    kvb_loopback_hub_t* handle_ = nullptr;
};

namespace detail {
/// Calls `f(buf, capacity, &len)` once to learn a blob's size, then with a buffer that fits.
template <typename F>
std::vector<uint8_t> readBlob(F&& f) {
    std::vector<uint8_t> out;
    for (;;) {
        size_t len = 0;
        kvb_status_t s = f(out.empty() ? nullptr : out.data(), out.size(), &len);
        if (s == KVB_STATUS_BUFFER_TOO_SMALL) {
            out.resize(len);
            continue;
        }
        check(s);
        out.resize(len);
        return out;
    }
}
}  // namespace detail

inline void Manager::attachLoopback(LoopbackHub& hub, const std::string& agentName, int32_t tpRank,
                                    int32_t tpSize, int64_t timeoutMs) {
    check(kvb_manager_attach_loopback(handle_, hub.get(), agentName.c_str(), tpRank, tpSize,
                                      timeoutMs));
}

inline void Manager::attachNixl(const std::string& agentName, int32_t tpRank, int32_t tpSize,
                                int64_t timeoutMs) {
    check(kvb_manager_attach_nixl(handle_, agentName.c_str(), tpRank, tpSize, timeoutMs));
}

inline std::vector<uint8_t> Manager::transferMetadata() const {
    return detail::readBlob([&](uint8_t* buf, size_t cap, size_t* len) {
        return kvb_manager_get_transfer_metadata(handle_, buf, cap, len);
    });
}

inline std::vector<uint8_t> Manager::exportLayout() const {
    return detail::readBlob([&](uint8_t* buf, size_t cap, size_t* len) {
        return kvb_manager_export_layout(handle_, buf, cap, len);
    });
}

inline std::string Manager::addTransferPeer(const std::vector<uint8_t>& metadata) {
    std::vector<char> name(64);
    for (;;) {
        size_t len = 0;
        kvb_status_t s = kvb_manager_add_transfer_peer(handle_, metadata.data(), metadata.size(),
                                                       name.data(), name.size(), &len);
        if (s == KVB_STATUS_BUFFER_TOO_SMALL) {
            name.resize(len + 1);
            continue;
        }
        check(s);
        return std::string(name.data(), len);
    }
}

inline kvb_admission_t Manager::addSequenceReceiving(const Request& request) {
    kvb_admission_t out{};
    request.withC([&](const kvb_request_t* r) {
        check(kvb_manager_add_sequence_receiving(handle_, r, &out));
    });
    return out;
}

inline std::vector<uint8_t> Manager::receiveTicket(uint64_t id) const {
    return detail::readBlob([&](uint8_t* buf, size_t cap, size_t* len) {
        return kvb_manager_get_receive_ticket(handle_, id, buf, cap, len);
    });
}

inline void Manager::completeReceive(uint64_t id) {
    check(kvb_manager_complete_receive(handle_, id));
}

inline std::optional<uint64_t> Manager::abortReceive(uint64_t id, kvb_transfer_outcome_t outcome) {
    uint64_t hold = 0;
    check(kvb_manager_abort_receive(handle_, id, static_cast<int32_t>(outcome), &hold));
    if (hold == 0) return std::nullopt;
    return hold;
}

inline uint64_t Manager::beginSend(uint64_t id, int32_t skipTokens, int32_t computedTokens) {
    uint64_t hold = 0;
    check(kvb_manager_begin_send(handle_, id, skipTokens, computedTokens, &hold));
    return hold;
}

inline void Manager::postSend(uint64_t hold, const std::string& peer,
                              const std::vector<uint8_t>& peerLayout,
                              const std::vector<uint8_t>& ticket,
                              const std::vector<uint8_t>& notification) {
    check(kvb_manager_post_send(handle_, hold, peer.c_str(), peerLayout.data(), peerLayout.size(),
                                ticket.data(), ticket.size(), notification.data(),
                                notification.size()));
}

inline std::vector<kvb_transfer_event_t> Manager::pollTransfers() {
    std::vector<kvb_transfer_event_t> out;
    for (;;) {
        size_t n = 0;
        kvb_status_t s = kvb_manager_poll_transfers(handle_, out.data(), out.size(), &n);
        if (s == KVB_STATUS_BUFFER_TOO_SMALL) {
            out.resize(n);
            continue;
        }
        check(s);
        out.resize(n);
        return out;
    }
}

inline bool Manager::settleHold(uint64_t hold, kvb_transfer_outcome_t outcome) {
    bool stillHeld = false;
    check(kvb_manager_settle_hold(handle_, hold, static_cast<int32_t>(outcome), &stillHeld));
    return stillHeld;
}

inline void Manager::releaseQuarantine(uint64_t hold) {
    check(kvb_manager_release_quarantine(handle_, hold));
}

inline std::optional<std::pair<std::string, std::vector<uint8_t>>>
Manager::takeTransferNotification() {
    std::vector<char> peer;
    std::vector<uint8_t> msg;
    for (;;) {
        size_t peerLen = 0, msgLen = 0;
        bool got = false;
        kvb_status_t s = kvb_manager_take_transfer_notification(
            handle_, peer.empty() ? nullptr : peer.data(), peer.size(), &peerLen,
            msg.empty() ? nullptr : msg.data(), msg.size(), &msgLen, &got);
        if (s == KVB_STATUS_BUFFER_TOO_SMALL) {
            peer.resize(peerLen + 1);
            msg.resize(msgLen);
            continue;
        }
        check(s);
        if (!got) return std::nullopt;
        msg.resize(msgLen);
        return std::make_pair(std::string(peer.data(), peerLen), std::move(msg));
    }
}

inline kvb_transfer_stats_t Manager::transferStats() const {
    kvb_transfer_stats_t s{};
    s.struct_size = sizeof(s);
    check(kvb_manager_get_transfer_stats(handle_, &s));
    return s;
}

inline void Manager::setContiguousRuns(bool on) {
    check(kvb_manager_set_contiguous_runs(handle_, on));
}

inline std::vector<kvb_row_runs_t> Manager::rowRuns(uint64_t id) const {
    std::vector<kvb_row_runs_t> out;
    for (;;) {
        size_t n = 0;
        kvb_status_t s = kvb_manager_get_row_runs(handle_, id, out.data(), out.size(), &n);
        if (s == KVB_STATUS_BUFFER_TOO_SMALL) {
            out.resize(n);
            continue;
        }
        check(s);
        out.resize(n);
        return out;
    }
}

}  // namespace kvb

#endif  // KVBLOCK_DISAGG_HPP
