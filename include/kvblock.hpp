// kvblock.hpp: header-only C++17 RAII wrapper over kvblock.h.
//
// Every failing C status becomes a kvb::Error carrying the status and the library's message.
// Method names follow TensorRT-LLM's KVCacheManager, but arguments and meanings are kvblock's
// (e.g. addToken(id, token) appends a token; getPriorityByBlockId(window, block)). For call sites
// that port mechanically, use the TensorRT-LLM facade in kvblock_trtllm.hpp. The value types
// (kvb::Config, kvb::Request, kvb::Event, kvb::Error) are in kvblock/; include this header.
#ifndef KVBLOCK_HPP
#define KVBLOCK_HPP

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvblock.h"
#include "kvblock/config.hpp"
#include "kvblock/error.hpp"
#include "kvblock/event.hpp"
#include "kvblock/request.hpp"

namespace kvb {

class LoopbackHub;

/// Owns a kvb_manager_t. Move-only.
class Manager {
  public:
    explicit Manager(const Config& config) {
        kvb_manager_config_t raw = config.raw;
        raw.windows = config.windows.data();
        raw.num_windows = config.windows.size();
        kvb_disk_tier_config_t disk = config.disk;
        if (config.hasDisk) {
            disk.directory = config.diskDirectory.c_str();
            raw.disk = &disk;
        }
        kvb_remote_tier_config_t remote = config.remote;
        if (config.hasRemote) {
            remote.urls = config.remoteUrls.c_str();
            remote.model_id = config.remoteModelId.c_str();
            remote.password =
                config.remotePassword.empty() ? nullptr : config.remotePassword.c_str();
            auto orNull = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
            remote.tls_ca_file = orNull(config.remoteTlsCaFile);
            remote.tls_cert_file = orNull(config.remoteTlsCertFile);
            remote.tls_key_file = orNull(config.remoteTlsKeyFile);
            raw.remote = &remote;
        }
        raw.layers = config.layers.empty() ? nullptr : config.layers.data();
        raw.num_layers = config.layers.size();
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
        request.withC(
            [&](const kvb_request_t* r) { check(kvb_manager_add_sequence(handle_, r, &out)); });
        return out;
    }
    /// Admits `requests` in order with the two-phase pre-claim; returns the admissions (all of
    /// them, or with `longestPrefix` those of the longest prefix that fits).
    std::vector<kvb_admission_t> addSequenceBatch(const std::vector<Request>& requests,
                                                  bool longestPrefix = false) {
        std::vector<kvb_admission_t> out(requests.size());
        size_t admitted = 0;
        withCBatch(requests, [&](const std::vector<kvb_request_t>& c) {
            check(kvb_manager_add_sequence_batch(handle_, c.data(), c.size(), longestPrefix,
                                                 out.data(), &admitted));
        });
        out.resize(admitted);
        return out;
    }
    /// The scheduler's estimate for `requests` in order (what addSequenceBatch will deliver).
    std::vector<kvb_batch_estimate_t> estimateBatch(const std::vector<Request>& requests) {
        std::vector<kvb_batch_estimate_t> out(requests.size());
        withCBatch(requests, [&](const std::vector<kvb_request_t>& c) {
            check(kvb_manager_estimate_batch(handle_, c.data(), c.size(), out.data()));
        });
        return out;
    }
    void addToken(uint64_t id, int32_t token) { check(kvb_manager_add_token(handle_, id, token)); }
    /// One decode step for many sequences (kvb_manager_add_token_batch): returns how many got
    /// their token; the sequence at that index (if any) lacked blocks and is unchanged. Any
    /// other failure throws.
    size_t addTokenBatch(const std::vector<uint64_t>& ids, const std::vector<int32_t>& tokens,
                         bool storeNewBlocks = true) {
        if (ids.size() != tokens.size())
            throw std::invalid_argument("addTokenBatch: ids and tokens differ in size");
        size_t done = 0;
        kvb_status_t s = kvb_manager_add_token_batch(handle_, ids.data(), tokens.data(), ids.size(),
                                                     storeNewBlocks, nullptr, &done);
        if (s != KVB_STATUS_OUT_OF_BLOCKS) check(s);
        return done;
    }
    void removeToken(uint64_t id) { check(kvb_manager_remove_token(handle_, id)); }
    void rewindKVCache(uint64_t id, int32_t n) {
        check(kvb_manager_rewind_kv_cache(handle_, id, n));
    }
    /// After a prefill chunk (kvb_manager_store_context_blocks): `position` prompt tokens are
    /// computed; stores their full blocks for reuse and advances the history to `position`.
    /// Storing for reuse (storeBlocksForReuse, removeSequence with storeForReuse) stops at the
    /// history, so an engine reports each computed chunk here (or with advanceHistory).
    void storeContextBlocks(uint64_t id, int32_t position) {
        check(kvb_manager_store_context_blocks(handle_, id, position));
    }
    void storeNewBlock(uint64_t id) { check(kvb_manager_store_new_block(handle_, id)); }
    std::vector<int32_t> storeBlocksForReuse(uint64_t id, bool pin, int32_t window = 0) {
        std::vector<int32_t> ids(4096);
        size_t n = 0;
        check(kvb_manager_store_blocks_for_reuse(handle_, id, pin, window, ids.data(), ids.size(),
                                                 &n));
        ids.resize(n);
        return ids;
    }
    void removeSequence(uint64_t id, bool storeForReuse = true) {
        check(kvb_manager_remove_sequence(handle_, id, storeForReuse));
    }
    void pinBlocks(uint64_t id) { check(kvb_manager_pin_blocks(handle_, id)); }
    // Scheduler capacity lifecycle (see kvblock.h for each contract). The bool results say
    // whether the blocks could be had (false: nothing changed).
    kvb_sequence_lengths_t getSequenceLengths(uint64_t id) const {
        kvb_sequence_lengths_t l{};
        check(kvb_manager_get_sequence_lengths(handle_, id, &l));
        return l;
    }
    bool resize(uint64_t id, size_t capacity) {
        bool done = false;
        check(kvb_manager_resize(handle_, id, capacity, &done));
        return done;
    }
    bool addSlot(uint64_t id) {
        bool done = false;
        check(kvb_manager_add_slot(handle_, id, &done));
        return done;
    }
    bool allocateGeneration(uint64_t id, size_t numDraftTokens = 0) {
        bool done = false;
        check(kvb_manager_allocate_generation(handle_, id, numDraftTokens, &done));
        return done;
    }
    bool revertAllocateGeneration(uint64_t id) {
        bool done = false;
        check(kvb_manager_revert_allocate_generation(handle_, id, &done));
        return done;
    }
    bool extendCapacityForTokens(uint64_t id, size_t numTokens) {
        bool done = false;
        check(kvb_manager_extend_capacity_for_tokens(handle_, id, numTokens, &done));
        return done;
    }
    bool allocateContext(uint64_t id, size_t numTokens) {
        bool done = false;
        check(kvb_manager_allocate_context(handle_, id, numTokens, &done));
        return done;
    }
    kvb_context_revert_t revertAllocateContext(uint64_t id) {
        kvb_context_revert_t outcome = KVB_CONTEXT_REVERT_NOTHING;
        check(kvb_manager_revert_allocate_context(handle_, id, &outcome));
        return outcome;
    }
    /// Marks `history` tokens of the sequence computed without storing anything
    /// (kvb_manager_advance_history), for engines that compute without storing each chunk: never
    /// decreases; throws KVB_STATUS_INVALID_ARGUMENT beyond the capacity or the known tokens.
    /// Storing for reuse stops at the history.
    void advanceHistory(uint64_t id, size_t history) {
        check(kvb_manager_advance_history(handle_, id, history));
    }
    void suspend(uint64_t id) { check(kvb_manager_suspend(handle_, id)); }
    bool resume(uint64_t id) {
        bool done = false;
        check(kvb_manager_resume(handle_, id, &done));
        return done;
    }
    double getGpuUtilization() const {
        double u = 0.0;
        check(kvb_manager_get_gpu_utilization(handle_, &u));
        return u;
    }
    /// Throws kvb::Error with KVB_STATUS_STALLED once the scheduler has stalled.
    void endSchedulingPass(size_t numGenerationRequests, size_t numScheduled) {
        check(kvb_manager_end_scheduling_pass(handle_, numGenerationRequests, numScheduled));
    }
    /// Pins each listed GPU block of `window` (kvb_manager_pin_blocks_by_id).
    void pinBlocksById(int32_t window, const std::vector<int32_t>& ids) {
        check(kvb_manager_pin_blocks_by_id(handle_, window, ids.data(), ids.size()));
    }
    void unpinBlocksById(int32_t window, const std::vector<int32_t>& ids) {
        check(kvb_manager_unpin_blocks_by_id(handle_, window, ids.data(), ids.size()));
    }
    std::vector<int32_t> getCacheBlockIds(uint64_t id, int32_t window, int32_t beam = 0) const {
        size_t n = 0;
        kvb_status_t s = kvb_manager_get_cache_block_ids(handle_, id, window, beam, nullptr, 0, &n);
        if (s != KVB_OK && s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
        std::vector<int32_t> ids(n);
        check(
            kvb_manager_get_cache_block_ids(handle_, id, window, beam, ids.data(), ids.size(), &n));
        return ids;
    }
    /// {max blocks per sequence, number of pools}.
    std::pair<int32_t, int32_t> getOffsetTableDimensions() const {
        int32_t blocks = 0, pools = 0;
        check(kvb_manager_get_offset_table_dimensions(handle_, &blocks, &pools));
        return {blocks, pools};
    }
    /// The most blocks one beam may list in a window (kvb_manager_get_max_blocks_per_seq).
    int32_t getMaxBlocksPerSeq(int32_t window) const {
        int32_t blocks = 0;
        check(kvb_manager_get_max_blocks_per_seq(handle_, window, &blocks));
        return blocks;
    }
    /// Host-tier blocks of a window, configured or chosen automatically
    /// (kvb_manager_get_host_tier_blocks).
    int64_t getHostTierBlocks(int32_t window) const {
        int64_t blocks = 0;
        check(kvb_manager_get_host_tier_blocks(handle_, window, &blocks));
        return blocks;
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
    /// Collects finished disk I/O; returns the blocks placed in the host tier.
    int64_t diskPoll() {
        int64_t placed = 0;
        check(kvb_manager_disk_poll(handle_, &placed));
        return placed;
    }
    /// Starts reading the disk-resident prefixes of waiting requests into the host tier.
    std::vector<kvb_disk_prefetch_t> diskPrefetch(const std::vector<Request>& requests) {
        std::vector<kvb_disk_prefetch_t> out(requests.size());
        withCBatch(requests, [&](const std::vector<kvb_request_t>& c) {
            check(kvb_manager_disk_prefetch(handle_, c.data(), c.size(), out.data()));
        });
        return out;
    }
    /// Prefix blocks of `request` still being read from disk (0: ready to admit).
    int64_t diskBlocksInFlight(const Request& request) {
        int64_t n = 0;
        request.withC([&](const kvb_request_t* r) {
            check(kvb_manager_disk_blocks_in_flight(handle_, r, &n));
        });
        return n;
    }
    kvb_disk_stats_t getDiskStats() const {
        kvb_disk_stats_t s{};
        s.struct_size = sizeof(s);
        check(kvb_manager_get_disk_stats(handle_, &s));
        return s;
    }
    bool hasDiskTier() const {
        bool b = false;
        check(kvb_manager_has_disk_tier(handle_, &b));
        return b;
    }
    /// Collects finished remote batches; returns the blocks placed in the host tier.
    int64_t remotePoll() {
        int64_t placed = 0;
        check(kvb_manager_remote_poll(handle_, &placed));
        return placed;
    }
    /// Looks up and fetches the remote part of waiting requests' prefixes (never waits).
    std::vector<kvb_remote_prefetch_t> remotePrefetch(const std::vector<Request>& requests) {
        std::vector<kvb_remote_prefetch_t> out(requests.size());
        withCBatch(requests, [&](const std::vector<kvb_request_t>& c) {
            check(kvb_manager_remote_prefetch(handle_, c.data(), c.size(), out.data()));
        });
        return out;
    }
    /// Prefix blocks of `request` still being looked up or fetched (0: ready to admit).
    int64_t remoteBlocksPending(const Request& request) {
        int64_t n = 0;
        request.withC([&](const kvb_request_t* r) {
            check(kvb_manager_remote_blocks_pending(handle_, r, &n));
        });
        return n;
    }
    kvb_remote_stats_t getRemoteStats() const {
        kvb_remote_stats_t s{};
        s.struct_size = sizeof(s);
        check(kvb_manager_get_remote_stats(handle_, &s));
        return s;
    }
    bool hasRemoteTier() const {
        bool b = false;
        check(kvb_manager_has_remote_tier(handle_, &b));
        return b;
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
    /// The most prompt tokens one context step computes, for the remaining-blocks estimate of a
    /// sliding window (kvb_manager_set_max_context_chunk_tokens).
    void setMaxContextChunkTokens(int32_t tokens) {
        check(kvb_manager_set_max_context_chunk_tokens(handle_, tokens));
    }
    void schedulingRemoveSequence(uint64_t id) {
        check(kvb_manager_scheduling_remove_sequence(handle_, id));
    }
    bool schedulingHasFreeBlocks(int32_t n, int32_t window) const {
        bool out = false;
        check(kvb_manager_scheduling_has_free_blocks(handle_, n, window, &out));
        return out;
    }
    /// Blocks the next step of a request needs in one window. The argument order is the C
    /// call's (and Python's): the state, the request whose prompt discounts reusable blocks
    /// (may be null), `twoSteps`, the window.
    int32_t getNeededBlocksOneStep(const kvb_request_state_t& state, const Request* request,
                                   bool twoSteps, int32_t window) {
        int32_t n = 0;
        withOptionalC(request, [&](const kvb_request_t* r) {
            check(kvb_manager_get_needed_blocks_one_step(handle_, &state, r, twoSteps, window, &n));
        });
        return n;
    }
    /// Blocks a request still needs in one window until completion; the C call's order.
    int32_t getRemainingBlocksToCompletion(const kvb_request_state_t& state, const Request* request,
                                           int32_t window) {
        int32_t n = 0;
        withOptionalC(request, [&](const kvb_request_t* r) {
            check(kvb_manager_get_remaining_blocks_to_completion(handle_, &state, r, window, &n));
        });
        return n;
    }
    int32_t countReusableBlocks(const Request& request, int32_t window,
                                bool onlyAllocated = false) {
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
    /// CUDA backend: order later copies with the engine stream `stream` (a cudaStream_t).
    void setStream(void* stream) { check(kvb_manager_set_stream(handle_, stream)); }
    /// CUDA backend, copy-stream ordering: the engine stream waits for the copies so far.
    void syncTransfers() { check(kvb_manager_sync_transfers(handle_)); }
    /// Waits on the host for every copy submitted so far (kvb_manager_wait_for_copies_on_host).
    void waitForCopiesOnHost() { check(kvb_manager_wait_for_copies_on_host(handle_)); }
    /// CUDA backend: the engine's memory as the pool of (window, level).
    void registerPool(int32_t window, kvb_cache_level_t level, void* pointer, size_t bytes) {
        check(kvb_manager_register_pool(handle_, window, level, pointer, bytes));
    }
    /// Batched copy submissions so far (CUDA kernel launches).
    uint64_t copyLaunches() const {
        uint64_t n = 0;
        check(kvb_manager_copy_launches(handle_, &n));
        return n;
    }
    /// Throws kvb::Error (KVB_STATUS_INVARIANT_VIOLATION) naming the first violated invariant.
    void checkInvariants() const { check(kvb_manager_check_invariants(handle_)); }
    void advanceTime(int64_t ms) { check(kvb_manager_advance_time(handle_, ms)); }
    kvb_block_info_t getBlockInfo(int32_t window, int32_t block) const {
        kvb_block_info_t info{};
        check(kvb_manager_get_block_info(handle_, window, block, &info));
        return info;
    }
    /// Moves a primary block to the host tier, a held one included (kvb_manager_offload_block);
    /// false when it does not move.
    bool offloadBlock(int32_t window, int32_t block) {
        bool done = false;
        check(kvb_manager_offload_block(handle_, window, block, &done));
        return done;
    }
    /// Stores `ids` of `window` under the keys of `request`'s first `numTokens` tokens
    /// (kvb_manager_store_blocks): {blocks that joined the tree, ids pinned with `pin`}.
    std::pair<int32_t, std::vector<int32_t>> storeBlocks(const Request& request, int32_t numTokens,
                                                         int32_t window,
                                                         const std::vector<int32_t>& ids,
                                                         bool pin = false) {
        std::vector<int32_t> pinned(pin ? ids.size() : 0);
        size_t numPinned = 0;
        int32_t stored = 0;
        request.withC([&](const kvb_request_t* c) {
            check(kvb_manager_store_blocks(handle_, c, numTokens, window, ids.data(), ids.size(),
                                           pin, pinned.data(), pinned.size(), &numPinned, &stored));
        });
        pinned.resize(numPinned);
        return {stored, pinned};
    }
    /// Sets one block's retention priority, 0..=100 (kvb_manager_set_block_priority).
    void setBlockPriority(int32_t window, int32_t block, int32_t priority) {
        check(kvb_manager_set_block_priority(handle_, window, block, priority));
    }
    /// Brings a free cached host block, or a held one offloadBlock moved, back to the GPU
    /// (kvb_manager_onboard_block); false when it does not move.
    bool onboardBlock(int32_t window, int32_t block) {
        bool done = false;
        check(kvb_manager_onboard_block(handle_, window, block, &done));
        return done;
    }
    /// Carries each request's recurrent state into its next block where `positions[i]` (tokens
    /// processed) is a block boundary (kvb_manager_copy_recurrent_state); returns the block
    /// copies made.
    size_t copyRecurrentState(const std::vector<uint64_t>& ids,
                              const std::vector<int32_t>& positions) {
        if (ids.size() != positions.size()) {
            throw Error(KVB_STATUS_INVALID_ARGUMENT,
                        "copyRecurrentState: one position per request id");
        }
        size_t n = 0;
        check(kvb_manager_copy_recurrent_state(handle_, ids.data(), positions.data(), ids.size(),
                                               &n));
        return n;
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
        check(kvb_manager_get_pool_pointer(handle_, window, static_cast<int32_t>(level), &base,
                                           &row));
        return {base, row};
    }

    /// Pools (TensorRT-LLM `getNumPools`); without block-scale pools: offset-table pools.
    int32_t getNumPools(bool includeBlockScalePools = true) const {
        int32_t n = 0;
        check(kvb_manager_get_num_pools(handle_, includeBlockScalePools, &n));
        return n;
    }
    /// The description of pool `pool`.
    kvb_pool_info_t getPoolInfo(int32_t pool) const {
        kvb_pool_info_t info;
        check(kvb_pool_info_init(&info));
        check(kvb_manager_get_pool_info(handle_, pool, &info));
        return info;
    }
    /// (pool, index in the pool) of every layer (TensorRT-LLM `getLayerToPoolMapping`).
    std::vector<std::pair<int32_t, int32_t>> getLayerToPoolMapping() const {
        size_t n = 0;
        kvb_status_t s = kvb_manager_get_layer_to_pool_mapping(handle_, nullptr, nullptr, 0, &n);
        if (s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
        std::vector<int32_t> pools(n), index(n);
        check(kvb_manager_get_layer_to_pool_mapping(handle_, pools.data(), index.data(), n, &n));
        std::vector<std::pair<int32_t, int32_t>> out;
        for (size_t i = 0; i < n; ++i) out.emplace_back(pools[i], index[i]);
        return out;
    }
    /// Base address of pool `pool` at `level` and the bytes of one block's row in it.
    std::pair<uint8_t*, size_t> getModelPoolPointer(int32_t pool, kvb_cache_level_t level) const {
        uint8_t* base = nullptr;
        size_t row = 0;
        check(kvb_manager_get_model_pool_pointer(handle_, pool, static_cast<int32_t>(level), &base,
                                                 &row));
        return {base, row};
    }
    /// The block-scale pool of each data pool at `level`, null where none
    /// (TensorRT-LLM `getBlockScalePoolPointers`).
    std::vector<uint8_t*> getBlockScalePoolPointers(kvb_cache_level_t level) const {
        size_t n = 0;
        kvb_status_t s = kvb_manager_get_block_scale_pool_pointers(
            handle_, static_cast<int32_t>(level), nullptr, 0, &n);
        if (s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
        std::vector<uint8_t*> out(n);
        check(kvb_manager_get_block_scale_pool_pointers(handle_, static_cast<int32_t>(level),
                                                        out.data(), n, &n));
        return out;
    }
    /// Registers the engine's memory as pool `pool` at `level` (CUDA backend).
    void registerModelPool(int32_t pool, kvb_cache_level_t level, void* pointer, size_t bytes) {
        check(kvb_manager_register_model_pool(handle_, pool, level, pointer, bytes));
    }

    /// Ends the iteration's events (TensorRT-LLM `flushIterationEvents`): pending removals are
    /// committed and the iteration's events become visible to getLatestEvents.
    void flushIterationEvents() { check(kvb_manager_flush_iteration_events(handle_)); }
    /// Takes every flushed event, waiting up to `timeoutMs` (0 = no wait) for at least one
    /// (TensorRT-LLM `getLatestEvents`). May run on another thread than the executor.
    /// `dropped` (optional) receives how many events the full buffer dropped since the last drain.
    std::vector<Event> getLatestEvents(int64_t timeoutMs = 0, uint64_t* dropped = nullptr) const {
        kvb_event_batch_t* raw = nullptr;
        check(kvb_manager_get_latest_events(handle_, timeoutMs, &raw));
        struct BatchFree {
            void operator()(kvb_event_batch_t* b) const noexcept { kvb_event_batch_free(b); }
        };
        std::unique_ptr<kvb_event_batch_t, BatchFree> batch(raw);
        size_t n = 0;
        check(kvb_event_batch_size(batch.get(), &n));
        if (dropped) check(kvb_event_batch_num_dropped(batch.get(), dropped));
        std::vector<Event> out;
        out.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            kvb_event_t e{};
            check(kvb_event_batch_get(batch.get(), i, &e));
            Event ev;
            ev.id = e.event_id;
            ev.type = static_cast<kvb_event_type_t>(e.event_type);
            ev.windowSize = e.window_size;
            if (e.has_attention_dp_rank) ev.attentionDpRank = e.attention_dp_rank;
            ev.numPrimaryBlocks = e.num_primary_blocks;
            ev.numSecondaryBlocks = e.num_secondary_blocks;
            if (e.has_parent_hash) ev.parentHash = e.parent_hash;
            for (size_t j = 0; j < e.num_stored_blocks; ++j) {
                kvb_stored_block_t b{};
                check(kvb_event_batch_get_stored_block(batch.get(), i, j, &b));
                Event::StoredBlock sb;
                sb.hash = b.block_hash;
                sb.tokens.assign(b.tokens, b.tokens + b.num_tokens);
                if (b.token_extra_ids) {
                    sb.extraIds.emplace(b.token_extra_ids, b.token_extra_ids + b.num_tokens);
                }
                if (b.has_lora_task_id) sb.loraTaskId = b.lora_task_id;
                sb.cacheLevel = static_cast<kvb_cache_level_t>(b.cache_level);
                sb.priority = b.priority;
                for (size_t k = 0; k < b.num_mm_keys; ++k) {
                    Event::MmKey key;
                    for (size_t d = 0; d < key.digest.size(); ++d)
                        key.digest[d] = b.mm_keys[k].digest[d];
                    key.startOffset = b.mm_keys[k].start_offset;
                    sb.mmKeys.push_back(key);
                }
                if (b.has_cache_salt) sb.cacheSalt = b.cache_salt;
                ev.storedBlocks.push_back(std::move(sb));
            }
            if (e.num_removed_hashes > 0) {
                ev.removedHashes.assign(e.removed_hashes, e.removed_hashes + e.num_removed_hashes);
            }
            ev.blockHash = e.block_hash;
            if (e.has_cache_level_change)
                ev.cacheLevel = Event::Diff{e.old_cache_level, e.new_cache_level};
            if (e.has_priority_change) ev.priority = Event::Diff{e.old_priority, e.new_priority};
            ev.diskTier = e.disk_tier;
            out.push_back(std::move(ev));
        }
        return out;
    }

    // --- Disaggregated prefill/decode (defined in kvblock_disagg.hpp) ---------------------------
    /// Attaches agent `agentName` of `hub` as the transfer backend (every pool registered).
    void attachLoopback(LoopbackHub& hub, const std::string& agentName, int32_t tpRank = 0,
                        int32_t tpSize = 1, int64_t timeoutMs = 1000);
    /// Attaches a NIXL agent named agentName (kvb_manager_attach_nixl): the transfer backend
    /// between engine processes.
    void attachNixl(const std::string& agentName, int32_t tpRank = 0, int32_t tpSize = 1,
                    int64_t timeoutMs = 1000);
    /// The attached backend's metadata blob, for the peer's addTransferPeer.
    std::vector<uint8_t> transferMetadata() const;
    /// This manager's layout blob, for the peer's postSend.
    std::vector<uint8_t> exportLayout() const;
    /// Loads a peer's metadata blob; returns the peer's agent name.
    std::string addTransferPeer(const std::vector<uint8_t>& metadata);
    /// Admits a request whose prompt's KV arrives from another engine.
    kvb_admission_t addSequenceReceiving(const Request& request);
    /// The receive ticket blob of receiving sequence `id`, for the sender's postSend.
    std::vector<uint8_t> receiveTicket(uint64_t id) const;
    /// The prompt's KV of `id` has landed: stored for reuse, an ordinary sequence from now on.
    void completeReceive(uint64_t id);
    /// Gives up the receive of `id`; the quarantine hold when `outcome` is not quiescent.
    std::optional<uint64_t> abortReceive(uint64_t id, kvb_transfer_outcome_t outcome);
    /// Leases tokens [skipTokens, computedTokens) of `id`; returns the hold id.
    uint64_t beginSend(uint64_t id, int32_t skipTokens, int32_t computedTokens);
    /// Posts lease `hold` to `peer` into the rows of its ticket, laid out as its layout says.
    void postSend(uint64_t hold, const std::string& peer, const std::vector<uint8_t>& peerLayout,
                  const std::vector<uint8_t>& ticket,
                  const std::vector<uint8_t>& notification = {});
    /// Settles what the watched transfers did since the last poll: one event per changed hold.
    std::vector<kvb_transfer_event_t> pollTransfers();
    /// Settles `hold` with the engine's outcome; returns whether the hold still exists.
    bool settleHold(uint64_t hold, kvb_transfer_outcome_t outcome);
    /// Releases a quarantined hold: its blocks go back to the free queues.
    void releaseQuarantine(uint64_t hold);
    /// The oldest notification received and not yet taken: (peer name, message).
    std::optional<std::pair<std::string, std::vector<uint8_t>>> takeTransferNotification();
    /// The transfer lifecycle's counters and gauges.
    kvb_transfer_stats_t transferStats() const;
    /// Turns the contiguous-run allocation preference on or off.
    void setContiguousRuns(bool on);
    /// Per window, how the rows of `id` fall into runs of consecutive rows.
    std::vector<kvb_row_runs_t> rowRuns(uint64_t id) const;

  private:
    /// Calls `f` with a C view of `request`, or with null.
    template <typename F>
    static void withOptionalC(const Request* request, F&& f) {
        if (request) {
            request->withC(f);
        } else {
            f(nullptr);
        }
    }
    /// Builds C views of every request (valid while `f` runs) and calls `f` with them.
    template <typename F>
    static void withCBatch(const std::vector<Request>& requests, F&& f) {
        std::vector<kvb_request_t> c(requests.size());
        std::vector<kvb_retention_config_t> retention(requests.size());
        for (size_t i = 0; i < requests.size(); ++i) { requests[i].fillC(c[i], retention[i]); }
        f(c);
    }

    kvb_manager_t* handle_ = nullptr;
};

}  // namespace kvb

// The disaggregated prefill/decode methods of kvb::Manager, and kvb::LoopbackHub.
#include "kvblock_disagg.hpp"

#endif  // KVBLOCK_HPP
