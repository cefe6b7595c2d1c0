// kvblock/request.hpp: kvb::Request, a request descriptor owning its arrays.
// Part of the C++ wrapper; include kvblock.hpp, which includes every part.
#ifndef KVBLOCK_REQUEST_HPP
#define KVBLOCK_REQUEST_HPP

#include <cstdint>
#include <vector>

#include "../kvblock.h"
#include "error.hpp"

namespace kvb {

/// A request descriptor owning its arrays (the C struct only points at them).
struct Request {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
    int32_t inputLength = -1;  // -1: the number of tokens
    int32_t beamWidth = 1;
    std::vector<uint64_t> extraIds;  // empty: none
    bool hasLoraTaskId = false;
    uint64_t loraTaskId = 0;
    bool hasCacheSalt = false;
    uint64_t cacheSalt = 0;
    std::vector<kvb_multimodal_item_t> mmItems;
    bool hasRetention = false;
    std::vector<kvb_token_range_retention_t> retentionRanges;
    int32_t decodePriority = 35;
    int64_t decodeDurationMs = -1;
    /// Opts this request out of reuse: it reuses nothing cached and is never stored.
    bool disableReuse = false;

    Request() = default;
    Request(uint64_t request_id, std::vector<int32_t> prompt)
        : id(request_id), tokens(std::move(prompt)) {}

    Request& withLora(uint64_t lora) {
        hasLoraTaskId = true;
        loraTaskId = lora;
        return *this;
    }
    Request& withSalt(uint64_t salt) {
        hasCacheSalt = true;
        cacheSalt = salt;
        return *this;
    }
    Request& withBeamWidth(int32_t beams) {
        beamWidth = beams;
        return *this;
    }
    Request& withExtraIds(std::vector<uint64_t> ids) {
        extraIds = std::move(ids);
        return *this;
    }
    Request& withMultimodal(const kvb_multimodal_item_t& item) {
        mmItems.push_back(item);
        return *this;
    }
    /// Priority for tokens [start, end) (end -1 = open), optional duration (-1 = none).
    Request& withRange(int32_t start, int32_t end, int32_t priority, int64_t duration_ms = -1) {
        hasRetention = true;
        retentionRanges.push_back(kvb_token_range_retention_t{start, end, priority, duration_ms});
        return *this;
    }
    Request& withDecodeRetention(int32_t priority, int64_t duration_ms = -1) {
        hasRetention = true;
        decodePriority = priority;
        decodeDurationMs = duration_ms;
        return *this;
    }
    Request& withoutReuse() {
        disableReuse = true;
        return *this;
    }

    /// Fills a C view of this request; `retention` must outlive its use.
    void fillC(kvb_request_t& r, kvb_retention_config_t& retention) const {
        check(kvb_request_init(&r));
        r.request_id = id;
        r.input_length = inputLength < 0 ? static_cast<int32_t>(tokens.size()) : inputLength;
        r.beam_width = beamWidth;
        r.tokens = tokens.data();
        r.num_tokens = tokens.size();
        r.token_extra_ids = extraIds.empty() ? nullptr : extraIds.data();
        r.has_lora_task_id = hasLoraTaskId;
        r.lora_task_id = loraTaskId;
        r.has_cache_salt = hasCacheSalt;
        r.cache_salt = cacheSalt;
        r.mm_items = mmItems.empty() ? nullptr : mmItems.data();
        r.num_mm_items = mmItems.size();
        retention = kvb_retention_config_t{retentionRanges.data(), retentionRanges.size(),
                                           decodePriority, decodeDurationMs};
        r.retention = hasRetention ? &retention : nullptr;
        r.disable_reuse = disableReuse;
    }

    /// Calls `f(const kvb_request_t*)` with a C view valid for the call.
    template <typename F>
    auto withC(F&& f) const {
        kvb_request_t r;
        kvb_retention_config_t retention;
        fillC(r, retention);
        return f(&r);
    }
};

}  // namespace kvb

#endif  // KVBLOCK_REQUEST_HPP
