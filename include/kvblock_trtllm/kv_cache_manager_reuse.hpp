// kvblock_trtllm/kv_cache_manager_reuse.hpp: KVCacheManager's reuse-tree queries, scheduler
// estimates, statistics and iteration calls. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_KV_CACHE_MANAGER_REUSE_HPP
#define KVBLOCK_TRTLLM_KV_CACHE_MANAGER_REUSE_HPP

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "kvblock_trtllm/kv_cache_manager.hpp"

namespace kvb::trtllm {

inline BlockPtr KVCacheManager::findBlocksInReuseTreeByBlockKey(BlockKey const& blockKey,
                                                                SizeType32 windowSize) const {
    return blockManager_.findBlockInReuseTreeByBlockKey(blockKey, windowSize);
}

inline PrefixReuseSummary KVCacheManager::analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
                                                             LlmRequest const& llmRequest) const {
    return analyzePrefixReuse(uniqueTokens, llmRequest, windows_.back());
}

inline PrefixReuseSummary KVCacheManager::analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
                                                             LlmRequest const& llmRequest,
                                                             SizeType32 windowSize) const {
    kvb::Request r = toKvb(llmRequest);
    setUniqueTokens(r, uniqueTokens, llmRequest.getTokenExtraIds().has_value());
    kvb_prefix_reuse_summary_t s{};
    r.withC([&](kvb_request_t const* c) {
        check(kvb_manager_analyze_prefix_reuse(impl().get(), c, windowSize, &s));
    });
    return fromC(s);
}

inline SizeType32 KVCacheManager::getNeededBlocksOneStep(
    LlmRequest const& req, bool twoStepsLookAhead, SizeType32 windowSize,
    std::optional<PrefixReuseSummary> const& cachedSummary) const {
    kvb_request_state_t state = stateOf(req);
    int32_t n = 0;
    if (cachedSummary) {
        kvb_prefix_reuse_summary_t s = toC(*cachedSummary);
        check(kvb_manager_get_needed_blocks_one_step_cached(impl().get(), &state, &s,
                                                            twoStepsLookAhead, windowSize, &n));
    } else {
        kvb::Request r = toKvb(req);
        r.withC([&](kvb_request_t const* c) {
            check(kvb_manager_get_needed_blocks_one_step(impl().get(), &state, c, twoStepsLookAhead,
                                                         windowSize, &n));
        });
    }
    estimateReusableTokens(req, windowSize, cachedSummary, /*onlyAllocated*/ true);
    return n;
}

inline SizeType32 KVCacheManager::getRemainingBlocksToCompletion(
    LlmRequest const& req, SizeType32 windowSize,
    std::optional<PrefixReuseSummary> const& cachedSummary) const {
    kvb_request_state_t state = stateOf(req);
    int32_t n = 0;
    if (cachedSummary) {
        kvb_prefix_reuse_summary_t s = toC(*cachedSummary);
        check(kvb_manager_get_remaining_blocks_to_completion_cached(impl().get(), &state, &s,
                                                                    windowSize, &n));
    } else {
        kvb::Request r = toKvb(req);
        r.withC([&](kvb_request_t const* c) {
            check(kvb_manager_get_remaining_blocks_to_completion(impl().get(), &state, c,
                                                                 windowSize, &n));
        });
    }
    estimateReusableTokens(req, windowSize, cachedSummary, /*onlyAllocated*/ false);
    return n;
}

inline std::vector<SizeType64> KVCacheManager::commitAndGetBlockHashesForRequest(
    LlmRequest const& llmRequest, SizeType32 windowSize) {
    syncTokens(llmRequest);
    RequestIdType id = llmRequest.getRequestId();
    size_t n = 0;
    kvb_status_t s = kvb_manager_commit_block_hashes(impl().get(), id, windowSize, nullptr, 0, &n);
    if (s != KVB_OK && s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
    std::vector<uint64_t> hashes(n);
    check(kvb_manager_commit_block_hashes(impl().get(), id, windowSize, hashes.data(),
                                          hashes.size(), &n));
    return {hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(n)};
}

inline void KVCacheManager::truncateBlocks(VecTokens const& targetTokens,
                                           SizeType32 numTokensToKeep) {
    check(kvb_manager_truncate_blocks(impl().get(), targetTokens.data(), targetTokens.size(),
                                      numTokensToKeep, nullptr));
}

inline std::deque<KVCacheEvent> KVCacheManager::getLatestEvents(
    std::optional<std::chrono::milliseconds> timeout) const {
    std::vector<Event> events;
    if (timeout) {
        events = impl().getLatestEvents(timeout->count());
    } else {
        do {
            events = impl().getLatestEvents(1000);
        } while (events.empty() && config_.raw.max_kv_event_entries > 0);
    }
    std::deque<KVCacheEvent> out;
    for (auto const& e : events) out.push_back(toTrtllmEvent(e));
    return out;
}

inline SizeType32 KVCacheManager::getMaxCapacityBatchSize(SizeType32 inputLength,
                                                          SizeType32 outputLength) const {
    return impl().getMaxCapacityBatchSize(inputLength, outputLength);
}

inline bool KVCacheManager::copyLinearAttentionBlock(LlmRequest const& llmRequest) {
    return copyRecurrentState({&llmRequest});
}

inline bool KVCacheManager::copyLinearAttentionBlockBatch(
    std::vector<std::shared_ptr<LlmRequest>> const& requests) {
    std::vector<LlmRequest const*> raw;
    for (auto const& r : requests)
        if (r) raw.push_back(r.get());
    return copyRecurrentState(raw);
}

inline bool KVCacheManager::hasSequence(RequestIdType requestId) const {
    kvb_sequence_lengths_t l{};
    kvb_status_t s = kvb_manager_get_sequence_lengths(impl().get(), requestId, &l);
    if (s == KVB_STATUS_UNKNOWN_REQUEST) return false;
    check(s);
    return true;
}
inline void KVCacheManager::estimateReusableTokens(
    LlmRequest const& req, SizeType32 windowSize,
    std::optional<PrefixReuseSummary> const& cachedSummary, bool onlyAllocated) const {
    if (!enableBlockReuse_ || !req.isContextInitState() || hasSequence(req.getRequestId())) return;
    PrefixReuseSummary summary;
    if (cachedSummary) {
        summary = *cachedSummary;
    } else {
        VecUniqueTokens tokens;
        auto const& ids = req.getTokens(0);
        auto extra = req.getTokenExtraIds();
        for (size_t i = 0; i < ids.size(); ++i)
            tokens.push_back({ids[i], extra && i < extra->size() ? (*extra)[i] : 0});
        summary = analyzePrefixReuse(tokens, req, windowSize);
    }
    SizeType32 const tpb = getTokensPerBlock();
    SizeType32 const reusable =
        onlyAllocated ? summary.reusableBlocksAllocated : summary.reusableBlocksAll;
    SizeType32 const blocks = std::min(reusable, req.getPromptLen() / tpb);
    req.setEstimatedReusableTokens(blocks * tpb);
}

inline bool KVCacheManager::copyRecurrentState(std::vector<LlmRequest const*> const& requests) {
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    for (LlmRequest const* r : requests) {
        if (!hasSequence(r->getRequestId())) continue;
        ids.push_back(r->getRequestId());
        positions.push_back(r->isContextFinished()
                                ? static_cast<int32_t>(r->getTokens(0).size()) - 1
                                : r->getContextCurrentPosition());
    }
    return !ids.empty() && impl().copyRecurrentState(ids, positions) > 0;
}

inline kvb_request_state_t KVCacheManager::stateOf(LlmRequest const& req) {
    kvb_request_state_t s{};
    check(kvb_request_state_init(&s));
    s.request_id = req.getRequestId();
    s.phase =
        req.isContextInitState()
            ? (req.isFirstContextChunk() ? KVB_PHASE_CONTEXT_INIT : KVB_PHASE_CONTEXT_CONTINUE)
            : (req.isGenerationInProgressState() ? KVB_PHASE_GENERATION : KVB_PHASE_OTHER);
    s.prompt_len = req.getPromptLen();
    s.beam_width = req.getBeamWidth();
    // TensorRT-LLM's request has a chunk size only in the context phase (it throws after).
    s.context_chunk_size = req.isContextInitState() ? req.getContextChunkSize() : 0;
    s.num_draft_tokens = req.getNumDraftTokens();
    s.max_new_tokens = req.getMaxNewTokens();
    s.num_generated_tokens = req.getNumGeneratedTokens();
    return s;
}

inline PrefixReuseSummary KVCacheManager::fromC(kvb_prefix_reuse_summary_t const& s) {
    PrefixReuseSummary out{s.reusable_blocks_allocated, s.reusable_blocks_all, std::nullopt};
    if (s.first_new_block_index >= 0) out.firstNewBlock = s.first_new_block_index;
    return out;
}

inline kvb_prefix_reuse_summary_t KVCacheManager::toC(PrefixReuseSummary const& s) {
    return {s.reusableBlocksAllocated, s.reusableBlocksAll, s.firstNewBlock.value_or(-1)};
}
inline KvCacheStats KVCacheManager::getKvCacheStats() const {
    kvb_kv_cache_stats_t s = impl().getKvCacheStats();
    KvCacheStats out;
    out.maxNumBlocks = static_cast<SizeType32>(s.max_num_blocks);
    out.freeNumBlocks = static_cast<SizeType32>(s.free_num_blocks);
    out.usedNumBlocks = static_cast<SizeType32>(s.used_num_blocks);
    out.toksPerBlock = static_cast<SizeType32>(s.tokens_per_block);
    out.allocTotalBlocks = static_cast<SizeType32>(s.alloc_total_blocks);
    out.allocNewBlocks = static_cast<SizeType32>(s.alloc_new_blocks);
    out.reusedBlocks = static_cast<SizeType32>(s.reused_blocks);
    out.missedBlocks = static_cast<SizeType32>(s.missed_blocks);
    out.cacheHitRate = static_cast<float>(s.cache_hit_rate);
    out.numFreeBlocksPerWindowSize = getNumFreeBlocksPerWindowSize();
    out.allocatedBytes = static_cast<std::size_t>(s.allocated_bytes);
    return out;
}

inline std::map<SizeType32, KvCacheIterationStats> KVCacheManager::getIterationStats() {
    std::vector<kvb_iteration_stats_t> raw(windows_.size());
    size_t n = 0;
    check(kvb_manager_get_iteration_stats(impl().get(), raw.data(), raw.size(), &n));
    std::map<SizeType32, KvCacheIterationStats> out;
    for (size_t i = 0; i < n; ++i) {
        auto const& r = raw[i];
        KvCacheIterationStats s;
        s.primaryMaxNumBlocks = static_cast<SizeType32>(r.primary_max_blocks);
        s.primaryFreeNumBlocks = static_cast<SizeType32>(r.primary_free_blocks);
        s.primaryUsedNumBlocks = static_cast<SizeType32>(r.primary_used_blocks);
        s.primaryPeakUsedNumBlocks = static_cast<SizeType32>(r.primary_peak_used_blocks);
        s.primaryEvictableNumBlocks = static_cast<SizeType32>(r.primary_evictable_blocks);
        s.secondaryMaxNumBlocks = static_cast<SizeType32>(r.secondary_max_blocks);
        s.secondaryFreeNumBlocks = static_cast<SizeType32>(r.secondary_free_blocks);
        s.secondaryEvictableNumBlocks = static_cast<SizeType32>(r.secondary_evictable_blocks);
        s.iterAllocTotalBlocks = static_cast<SizeType32>(r.iter_alloc_total_blocks);
        s.iterAllocNewBlocks = static_cast<SizeType32>(r.iter_alloc_new_blocks);
        s.iterReusedBlocks = static_cast<SizeType32>(r.iter_reused_blocks);
        s.iterMissedBlocks = static_cast<SizeType32>(r.iter_missed_blocks);
        s.iterCacheHitRate = static_cast<float>(r.iter_cache_hit_rate);
        s.iterOnboardBlocks = static_cast<SizeType32>(r.iter_onboard_blocks);
        s.iterOnboardBytes = static_cast<SizeType64>(r.iter_onboard_bytes);
        s.iterOffloadBlocks = static_cast<SizeType32>(r.iter_offload_blocks);
        s.iterOffloadBytes = static_cast<SizeType64>(r.iter_offload_bytes);
        s.iterEvictedBlocks = static_cast<SizeType32>(r.iter_evicted_blocks);
        out[r.window_size] = s;
    }
    return out;
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_KV_CACHE_MANAGER_REUSE_HPP
