// kvblock.hpp: header-only C++17 RAII wrapper over kvblock.h.
//
// Every failing C status becomes a kvb::Error carrying the status and the library's message.
// Method names follow TensorRT-LLM's KVCacheManager so call sites port mechanically.
#ifndef KVBLOCK_HPP
#define KVBLOCK_HPP

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvblock.h"

namespace kvb {

/// A failed kvblock call: the status and the message of kvb_last_error_message().
class Error : public std::runtime_error {
public:
    Error(kvb_status_t status, const std::string& message)
        : std::runtime_error(std::string(kvb_status_string(status)) + ": " + message),
          status_(status) {}
    kvb_status_t status() const noexcept { return status_; }

private:
    kvb_status_t status_;
};

/// Throws kvb::Error unless `status` is KVB_OK.
inline void check(kvb_status_t status) {
    if (status != KVB_OK) {
        throw Error(status, kvb_last_error_message());
    }
}

/// Manager configuration: the C config (initialised with defaults) plus owned windows.
struct Config {
    kvb_manager_config_t raw{};
    std::vector<kvb_window_config_t> windows;

    Config() { check(kvb_manager_config_init(&raw)); }

    /// Adds a window of `window_size` tokens with its pool layout.
    Config& addWindow(int32_t window_size, int32_t primary_blocks, int32_t secondary_blocks = 0,
                      int32_t num_layers = 1, int32_t num_kv_heads = 1, int32_t size_per_head = 1) {
        windows.push_back(kvb_window_config_t{window_size, primary_blocks, secondary_blocks,
                                              num_layers, num_kv_heads, size_per_head});
        return *this;
    }
};

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

    Request() = default;
    Request(uint64_t request_id, std::vector<int32_t> prompt)
        : id(request_id), tokens(std::move(prompt)) {}

    Request& withLora(uint64_t lora) { hasLoraTaskId = true; loraTaskId = lora; return *this; }
    Request& withSalt(uint64_t salt) { hasCacheSalt = true; cacheSalt = salt; return *this; }
    Request& withBeamWidth(int32_t beams) { beamWidth = beams; return *this; }
    Request& withExtraIds(std::vector<uint64_t> ids) { extraIds = std::move(ids); return *this; }
    Request& withMultimodal(const kvb_multimodal_item_t& item) { mmItems.push_back(item); return *this; }
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

    /// Calls `f(const kvb_request_t*)` with a C view valid for the call.
    template <typename F>
    auto withC(F&& f) const {
        kvb_request_t r;
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
        kvb_retention_config_t retention{retentionRanges.data(), retentionRanges.size(),
                                         decodePriority, decodeDurationMs};
        r.retention = hasRetention ? &retention : nullptr;
        return f(&r);
    }
};

/// Owns a kvb_manager_t. Move-only.
class Manager {
public:
    explicit Manager(const Config& config) {
        kvb_manager_config_t raw = config.raw;
        raw.windows = config.windows.data();
        raw.num_windows = config.windows.size();
        check(kvb_manager_create(&raw, &handle_));
    }
    ~Manager() { kvb_manager_destroy(handle_); }
    Manager(const Manager&) = delete;
    Manager& operator=(const Manager&) = delete;
    Manager(Manager&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Manager& operator=(Manager&& other) noexcept {
        if (this != &other) {
            kvb_manager_destroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }

    kvb_manager_t* get() const noexcept { return handle_; }

    kvb_admission_t addSequence(const Request& request) {
        kvb_admission_t out{};
        request.withC([&](const kvb_request_t* r) { check(kvb_manager_add_sequence(handle_, r, &out)); });
        return out;
    }
    void addToken(uint64_t id, int32_t token) { check(kvb_manager_add_token(handle_, id, token)); }
    void removeToken(uint64_t id) { check(kvb_manager_remove_token(handle_, id)); }
    void rewindKVCache(uint64_t id, int32_t n) { check(kvb_manager_rewind_kv_cache(handle_, id, n)); }
    void storeContextBlocks(uint64_t id, int32_t position) {
        check(kvb_manager_store_context_blocks(handle_, id, position));
    }
    void storeNewBlock(uint64_t id) { check(kvb_manager_store_new_block(handle_, id)); }
    std::vector<int32_t> storeBlocksForReuse(uint64_t id, bool pin, int32_t window = 0) {
        std::vector<int32_t> ids(4096);
        size_t n = 0;
        check(kvb_manager_store_blocks_for_reuse(handle_, id, pin, window, ids.data(), ids.size(), &n));
        ids.resize(n);
        return ids;
    }
    void removeSequence(uint64_t id, bool storeForReuse = true) {
        check(kvb_manager_remove_sequence(handle_, id, storeForReuse));
    }
    void pinBlocks(uint64_t id) { check(kvb_manager_pin_blocks(handle_, id)); }
    void unpinBlocksById(int32_t window, const std::vector<int32_t>& ids) {
        check(kvb_manager_unpin_blocks_by_id(handle_, window, ids.data(), ids.size()));
    }
    std::vector<int32_t> getCacheBlockIds(uint64_t id, int32_t window, int32_t beam = 0) const {
        size_t n = 0;
        kvb_status_t s = kvb_manager_get_cache_block_ids(handle_, id, window, beam, nullptr, 0, &n);
        if (s != KVB_OK && s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
        std::vector<int32_t> ids(n);
        check(kvb_manager_get_cache_block_ids(handle_, id, window, beam, ids.data(), ids.size(), &n));
        return ids;
    }
    /// {max blocks per sequence, number of pools}.
    std::pair<int32_t, int32_t> getOffsetTableDimensions() const {
        int32_t blocks = 0, pools = 0;
        check(kvb_manager_get_offset_table_dimensions(handle_, &blocks, &pools));
        return {blocks, pools};
    }
    int32_t copyBlockOffsets(std::vector<int32_t>& table, int32_t numSlots, int32_t slotOffset,
                             uint64_t id) const {
        int32_t count = 0;
        check(kvb_manager_copy_block_offsets(handle_, table.data(), table.size(), numSlots,
                                             slotOffset, id, &count));
        return count;
    }
    void getBlockOffsetsOfBatch(std::vector<int32_t>& table, int32_t numSlots,
                                const std::vector<uint64_t>& ids, int32_t beamWidth) const {
        check(kvb_manager_get_block_offsets_of_batch(handle_, table.data(), table.size(), numSlots,
                                                     ids.data(), ids.size(), beamWidth));
    }
    kvb_kv_cache_stats_t getKvCacheStats() const {
        kvb_kv_cache_stats_t s{};
        check(kvb_manager_get_kv_cache_stats(handle_, &s));
        return s;
    }
    int64_t getNumFreeBlocks() const {
        int64_t n = 0;
        check(kvb_manager_get_num_free_blocks(handle_, &n));
        return n;
    }
    /// {primary, secondary} free blocks of a window.
    std::pair<int64_t, int64_t> getNumFreeBlocksPerWindowSize(int32_t window) const {
        int64_t p = 0, s = 0;
        check(kvb_manager_get_num_free_blocks_per_window_size(handle_, window, &p, &s));
        return {p, s};
    }
    kvb_admission_t getRequestStats(uint64_t id) const {
        kvb_admission_t a{};
        check(kvb_manager_get_request_stats(handle_, id, &a));
        return a;
    }
    int32_t getNumTokens(uint64_t id) const {
        int32_t n = 0;
        check(kvb_manager_get_num_tokens(handle_, id, &n));
        return n;
    }
    void startScheduling() { check(kvb_manager_start_scheduling(handle_)); }
    void schedulingRemoveSequence(uint64_t id) { check(kvb_manager_scheduling_remove_sequence(handle_, id)); }
    bool schedulingHasFreeBlocks(int32_t n, int32_t window) const {
        bool out = false;
        check(kvb_manager_scheduling_has_free_blocks(handle_, n, window, &out));
        return out;
    }
    int32_t getNeededBlocksOneStep(const kvb_request_state_t& state, bool twoSteps, int32_t window,
                                   const Request* request = nullptr) {
        int32_t n = 0;
        if (request) {
            request->withC([&](const kvb_request_t* r) {
                check(kvb_manager_get_needed_blocks_one_step(handle_, &state, r, twoSteps, window, &n));
            });
        } else {
            check(kvb_manager_get_needed_blocks_one_step(handle_, &state, nullptr, twoSteps, window, &n));
        }
        return n;
    }
    int32_t getRemainingBlocksToCompletion(const kvb_request_state_t& state, int32_t window,
                                           const Request* request = nullptr) {
        int32_t n = 0;
        if (request) {
            request->withC([&](const kvb_request_t* r) {
                check(kvb_manager_get_remaining_blocks_to_completion(handle_, &state, r, window, &n));
            });
        } else {
            check(kvb_manager_get_remaining_blocks_to_completion(handle_, &state, nullptr, window, &n));
        }
        return n;
    }
    int32_t countReusableBlocks(const Request& request, int32_t window, bool onlyAllocated = false) {
        int32_t n = 0;
        request.withC([&](const kvb_request_t* r) {
            check(kvb_manager_count_reusable_blocks(handle_, r, window, onlyAllocated, &n));
        });
        return n;
    }
    int32_t getMaxCapacityBatchSize(int32_t input, int32_t output) const {
        int32_t n = 0;
        check(kvb_manager_get_max_capacity_batch_size(handle_, input, output, &n));
        return n;
    }
    void refreshBlocks() { check(kvb_manager_refresh_blocks(handle_)); }
    /// Throws kvb::Error (KVB_STATUS_INVARIANT_VIOLATION) naming the first violated invariant.
    void checkInvariants() const { check(kvb_manager_check_invariants(handle_)); }
    void advanceTime(int64_t ms) { check(kvb_manager_advance_time(handle_, ms)); }
    kvb_block_info_t getBlockInfo(int32_t window, int32_t block) const {
        kvb_block_info_t info{};
        check(kvb_manager_get_block_info(handle_, window, block, &info));
        return info;
    }
    bool offloadBlock(int32_t window, int32_t block) {
        bool done = false;
        check(kvb_manager_offload_block(handle_, window, block, &done));
        return done;
    }
    int32_t getPriorityByBlockId(int32_t window, int64_t block) const {
        int32_t p = 0;
        check(kvb_manager_get_priority_by_block_id(handle_, window, block, &p));
        return p;
    }
    int32_t getLastBlockId(uint64_t id) const {
        int32_t b = 0;
        check(kvb_manager_get_last_block_id(handle_, id, &b));
        return b;
    }
    /// {base address, bytes per row} of a window's host-backend pool.
    std::pair<uint8_t*, size_t> getPoolPointer(int32_t window, kvb_cache_level_t level) const {
        uint8_t* base = nullptr;
        size_t row = 0;
        check(kvb_manager_get_pool_pointer(handle_, window, static_cast<int32_t>(level), &base, &row));
        return {base, row};
    }

private:
    kvb_manager_t* handle_ = nullptr;
};

}  // namespace kvb

#endif  // KVBLOCK_HPP
