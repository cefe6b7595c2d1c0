// kvblock_trtllm/kv_cache_manager_sequences.hpp: KVCacheManager's calls on one sequence —
// admission, token slots, stores, release and pins, block ids and offsets — and the record
// (GenerationRequest) the facade keeps of each. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_KV_CACHE_MANAGER_SEQUENCES_HPP
#define KVBLOCK_TRTLLM_KV_CACHE_MANAGER_SEQUENCES_HPP

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kvblock_trtllm/kv_cache_manager.hpp"

namespace kvb::trtllm {

inline void KVCacheManager::addSequenceBatch(
    std::vector<std::tuple<RequestIdType, SizeType32, SizeType32>> const& requestInfos,
    std::vector<std::reference_wrapper<LlmRequest>> const& llmRequests) {
    if (requestInfos.size() != llmRequests.size())
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "requestInfos and llmRequests differ in size");
    std::vector<kvb::Request> batch;
    batch.reserve(requestInfos.size());
    for (size_t i = 0; i < requestInfos.size(); ++i) {
        auto const& [id, inputLength, beamWidth] = requestInfos[i];
        kvb::Request r = toKvb(llmRequests[i].get());
        r.id = id;
        r.inputLength = inputLength;
        r.beamWidth = beamWidth;
        batch.push_back(std::move(r));
    }
    // The connector is asked before anything changes, from kvblock's estimate of the batch
    // (exactly the reuse admission then delivers), so a connector that throws leaves the
    // manager as it was.
    std::vector<SizeType32> prepopulated;
    if (connector_) {
        auto const estimates = impl().estimateBatch(batch);
        for (size_t i = 0; i < batch.size(); ++i)
            prepopulated.push_back(connectorExtended(
                llmRequests[i].get(), std::get<1>(requestInfos[i]), estimates[i].reusable_tokens));
    }
    auto admissions = impl().addSequenceBatch(batch);
    for (size_t i = 0; i < admissions.size(); ++i) {
        LlmRequest& req = llmRequests[i].get();
        auto const& a = admissions[i];
        req.setPrepopulatedPromptLen(connector_ ? prepopulated[i] : a.prepopulated_prompt_len,
                                     getTokensPerBlock());
        req.updateAllocTotalBlocksPerRequest(static_cast<SizeType32>(a.stats.alloc_total_blocks));
        req.updateAllocNewBlocksPerRequest(static_cast<SizeType32>(a.stats.alloc_new_blocks));
        req.updateReusedBlocksPerRequest(static_cast<SizeType32>(a.stats.reused_blocks));
        req.updateMissedBlocksPerRequest(static_cast<SizeType32>(a.stats.missed_blocks));
        req.setEstimatedReusableTokens(0);  // admitted: the reuse is applied now
        refreshSequence(std::get<0>(requestInfos[i]));
    }
}

inline SizeType32 KVCacheManager::connectorExtended(LlmRequest const& req, SizeType32 inputLength,
                                                    SizeType32 reused) const {
    if (!connector_) return reused;
    // The admission is already done: the connector's answer is bounded, not refused.
    int64_t const loaded = std::max<SizeType32>(0, connector_->getNumNewMatchedTokens(req, reused));
    int64_t const last = std::max<SizeType32>(reused, inputLength - 1);
    return static_cast<SizeType32>(std::min<int64_t>(reused + loaded, last));
}

inline void KVCacheManager::addToken(RequestIdType requestId) {
    // Detaches the blocks that leave a sliding window, then reserves the slot.
    if (!impl().addSlot(requestId))
        throw Error(KVB_STATUS_OUT_OF_BLOCKS, "no free block for the new slot");
    refreshSequence(requestId);
}

inline SizeType32 KVCacheManager::getTokenCount(RequestIdType requestId) const {
    return static_cast<SizeType32>(impl().getSequenceLengths(requestId).capacity);
}

inline void KVCacheManager::rewindKVCache(RequestIdType requestId, SizeType32 numTokens) {
    auto l = impl().getSequenceLengths(requestId);
    size_t reserved = l.capacity - std::min(l.capacity, l.num_tokens);
    size_t n = static_cast<size_t>(numTokens);
    if (n <= reserved) {
        if (n > 0) impl().resize(requestId, l.capacity - n);
    } else {
        impl().rewindKVCache(requestId, static_cast<int32_t>(n - reserved));
    }
    refreshSequence(requestId);
}

inline void KVCacheManager::syncTokens(LlmRequest const& llmRequest, bool storeNewBlocks) {
    RequestIdType id = llmRequest.getRequestId();
    auto l = impl().getSequenceLengths(id);
    VecTokens const& tokens = llmRequest.getTokens(0);
    size_t target = std::min(tokens.size(), l.capacity);
    if (target <= l.num_tokens) return;
    std::vector<uint64_t> ids(target - l.num_tokens, id);
    std::vector<int32_t> toks(tokens.begin() + static_cast<std::ptrdiff_t>(l.num_tokens),
                              tokens.begin() + static_cast<std::ptrdiff_t>(target));
    if (impl().addTokenBatch(ids, toks, storeNewBlocks) != ids.size())
        throw Error(KVB_STATUS_OUT_OF_BLOCKS, "no free block for a token");
    refreshSequence(id);
}

inline void KVCacheManager::storeContextBlocks(LlmRequest const& llmRequest) {
    impl().storeContextBlocks(llmRequest.getRequestId(), llmRequest.getContextCurrentPosition());
}

inline void KVCacheManager::storeNewBlock(LlmRequest const& llmRequest) {
    syncTokens(llmRequest, /*storeNewBlocks*/ true);
    impl().storeNewBlock(llmRequest.getRequestId());
}

inline std::vector<BlockIdType> KVCacheManager::storeBlocksForReuse(
    RequestIdType requestId, OptionalRef<LlmRequest const> llmRequest, bool pinBlocks) {
    if (llmRequest) syncComputed(*llmRequest);
    impl().storeBlocksForReuse(requestId, false);
    if (!pinBlocks) return {};
    return pinSequence(requestId);
}

inline std::optional<BlockIdType> KVCacheManager::removeSequence(
    RequestIdType requestId, OptionalRef<LlmRequest const> llmRequest, bool pinOnRelease) {
    if (!hasSequence(requestId)) return std::nullopt;
    if (llmRequest) syncComputed(*llmRequest);
    std::optional<BlockIdType> last;
    if (llmRequest || pinOnRelease) last = impl().getLastBlockId(requestId);
    if (pinOnRelease) pinSequence(requestId);
    impl().removeSequence(requestId, llmRequest.has_value() && enableBlockReuse_);
    sequences_.erase(requestId);
    return last;
}

inline void KVCacheManager::unpinBlocksById(std::vector<BlockIdType> const& blockIds) {
    std::lock_guard<std::mutex> lock(pinMutex_);
    for (auto it = pinGroups_.begin(); it != pinGroups_.end(); ++it) {
        if (it->first == blockIds) {
            for (auto const& [window, ids] : it->second) impl().unpinBlocksById(window, ids);
            pinGroups_.erase(it);
            return;
        }
    }
    impl().unpinBlocksById(windows_.front(), blockIds);
}

inline void KVCacheManager::schedulingRemoveSequence(RequestIdType requestId) {
    impl().schedulingRemoveSequence(requestId);
}

inline std::vector<std::vector<SizeType32>> const& KVCacheManager::getCacheBlockIds(
    RequestIdType requestId, SizeType32 windowSize) const {
    return refreshSequence(requestId).getCacheBlockIds(windowSize);
}

inline std::vector<std::vector<std::vector<SizeType32>>> KVCacheManager::getBatchCacheBlockIds(
    std::vector<RequestIdType> const& requestIds, SizeType32 windowSize) const {
    std::vector<std::vector<std::vector<SizeType32>>> out;
    out.reserve(requestIds.size());
    for (auto id : requestIds) out.push_back(getCacheBlockIds(id, windowSize));
    return out;
}

inline std::optional<BlockIdType> KVCacheManager::getLastBlockId(RequestIdType requestId) const {
    if (!hasSequence(requestId)) return std::nullopt;
    return impl().getLastBlockId(requestId);
}

inline SizeType32 KVCacheManager::getNumFrontBlocksRemoved(RequestIdType requestId,
                                                           SizeType32 windowSize) const {
    int32_t n = 0;
    check(kvb_manager_get_num_front_blocks_removed(impl().get(), requestId, windowSize, &n));
    return n;
}

inline SizeType32 KVCacheManager::copyBlockOffsets(BlockOffsetsTensor& output,
                                                   SizeType32 outputSlotOffset,
                                                   RequestIdType requestId) const {
    return impl().copyBlockOffsets(output.data, output.numSlots, outputSlotOffset, requestId);
}

inline SizeType32 KVCacheManager::copyBlockOffsets(ITensor& output, SizeType32 outputSlotOffset,
                                                   RequestIdType requestId) const {
    // The table's shape is checked against the manager's before kvblock writes into it: a
    // wrongly sized table would otherwise be written with the manager's row length.
    ITensor::Shape const& s = output.getShape();
    auto [maxBlocks, numPools] = impl().getOffsetTableDimensions();
    if (output.getDataType() != TRTDataType<KVCacheIndex>::value || s.nbDims != 4 ||
        s.d[0] != numPools || s.d[2] != 2 || s.d[3] != maxBlocks)
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "copyBlockOffsets: the table must be INT32 [" +
                                                     std::to_string(numPools) + "][slots][2][" +
                                                     std::to_string(maxBlocks) + "]");
    int32_t* table = bufferCast<int32_t>(output);
    int32_t count = 0;
    check(kvb_manager_copy_block_offsets(impl().get(), table, output.getSize(),
                                         static_cast<int32_t>(s.d[1]), outputSlotOffset, requestId,
                                         &count));
    return count;
}

inline void KVCacheManager::getBlockOffsetsOfBatch(ITensor& output, SizeType32 firstBatchSlotIdx,
                                                   SizeType32 batchSize,
                                                   SizeType32 beamWidth) const {
    for (SizeType32 i = 0; i < batchSize; ++i)
        copyBlockOffsets(output, i * beamWidth, static_cast<RequestIdType>(firstBatchSlotIdx + i));
}

inline void KVCacheManager::copyBatchBlockOffsets(ITensor& output,
                                                  std::vector<RequestIdType> const& requestIds,
                                                  SizeType32 beamWidth, SizeType32 offset) const {
    for (size_t i = 0; i < requestIds.size(); ++i)
        copyBlockOffsets(output, offset + static_cast<SizeType32>(i) * beamWidth, requestIds[i]);
}

inline void KVCacheManager::getBlockOffsetsOfBatch(BlockOffsetsTensor& output,
                                                   SizeType32 firstBatchSlotIdx,
                                                   SizeType32 batchSize,
                                                   SizeType32 beamWidth) const {
    for (SizeType32 i = 0; i < batchSize; ++i)
        copyBlockOffsets(output, i * beamWidth, static_cast<RequestIdType>(firstBatchSlotIdx + i));
}

inline void KVCacheManager::copyBatchBlockOffsets(BlockOffsetsTensor& output,
                                                  std::vector<RequestIdType> const& requestIds,
                                                  SizeType32 beamWidth, SizeType32 offset) const {
    for (size_t i = 0; i < requestIds.size(); ++i)
        copyBlockOffsets(output, offset + static_cast<SizeType32>(i) * beamWidth, requestIds[i]);
}

inline std::vector<SizeType32> KVCacheManager::getMemoryPoolBlockIndicesByBlockIds(
    std::vector<BlockIdType> const& blockIds, SizeType32 windowSize) const {
    std::vector<SizeType32> rows(blockIds.size());
    check(kvb_manager_get_memory_pool_block_indices(impl().get(), windowSize, blockIds.data(),
                                                    blockIds.size(), rows.data()));
    return rows;
}

inline SizeType32 KVCacheManager::getPriorityByBlockId(BlockIdType blockId,
                                                       SizeType32 windowSize) const {
    return impl().getPriorityByBlockId(windowSize, blockId);
}
inline void KVCacheManager::syncComputed(LlmRequest const& req) {
    syncTokens(req);
    RequestIdType id = req.getRequestId();
    auto l = impl().getSequenceLengths(id);
    size_t extent = static_cast<size_t>(std::max(req.getContextCurrentPosition(), 0));
    size_t const prompt = static_cast<size_t>(std::max(req.getPromptLen(), 0));
    size_t const tpb = static_cast<size_t>(getTokensPerBlock());
    // Mid-prefill only whole blocks are materialized; a finished prompt stores its
    // partial last block too, and after the context every known token.
    if (extent < prompt && !req.isContextFinished()) extent = extent / tpb * tpb;
    if (req.isContextFinished()) extent = std::max(extent, req.getTokens(0).size());
    extent = std::min({extent, l.capacity, l.num_tokens});
    if (extent > l.history) impl().advanceHistory(id, extent);
}

inline GenerationRequest& KVCacheManager::refreshSequence(RequestIdType requestId) const {
    int32_t beams = 0;
    check(kvb_manager_get_beam_width(impl().get(), requestId, &beams));
    auto l = impl().getSequenceLengths(requestId);
    auto [it, fresh] = sequences_.try_emplace(requestId, requestId, 0, beams);
    (void)fresh;
    GenerationRequest& seq = it->second;
    seq.numTokens_ = static_cast<SizeType32>(l.capacity);
    seq.beamWidth_ = beams;
    for (SizeType32 w : windows_) {
        auto& ids = seq.cacheBlockIds_[w];
        ids.resize(static_cast<size_t>(beams));
        for (int32_t b = 0; b < beams; ++b)
            ids[static_cast<size_t>(b)] = impl().getCacheBlockIds(requestId, w, b);
        int32_t front = 0;
        check(kvb_manager_get_num_front_blocks_removed(impl().get(), requestId, w, &front));
        seq.frontBlocksRemoved_[w] = front;
    }
    return seq;
}

inline std::vector<BlockIdType> KVCacheManager::pinSequence(RequestIdType requestId) {
    std::vector<std::pair<SizeType32, std::vector<BlockIdType>>> group;
    for (SizeType32 w : windows_) {
        std::vector<BlockIdType> ids;
        SizeType32 front = getNumFrontBlocksRemoved(requestId, w);
        for (auto const& beam : getCacheBlockIds(requestId, w))
            ids.insert(ids.end(), beam.begin() + front, beam.end());
        group.emplace_back(w, std::move(ids));
    }
    auto beam0 = getCacheBlockIds(requestId, windows_.front()).at(0);
    std::vector<BlockIdType> key(
        beam0.begin() + getNumFrontBlocksRemoved(requestId, windows_.front()), beam0.end());
    impl().pinBlocks(requestId);
    std::lock_guard<std::mutex> lock(pinMutex_);
    pinGroups_.emplace_back(key, std::move(group));
    return key;
}

inline kvb::Request KVCacheManager::toKvb(LlmRequest const& req) {
    kvb::Request r(req.getRequestId(), req.getTokens(0));
    r.inputLength = req.getPromptLen();
    if (auto extra = req.getTokenExtraIds()) r.extraIds = *extra;
    if (auto lora = req.getLoraTaskId()) r.withLora(*lora);
    if (auto salt = req.getCacheSaltID()) r.withSalt(*salt);
    r.mmItems = req.getMultimodalItems();
    if (auto retention = req.getKvCacheRetentionConfig()) {
        for (auto const& range : retention->getTokenRangeRetentionConfigs())
            r.withRange(range.tokenStart, range.tokenEnd.value_or(-1), range.priority,
                        range.durationMs ? range.durationMs->count() : -1);
        auto decode = retention->getDecodeDurationMs();
        r.withDecodeRetention(retention->getDecodeRetentionPriority(),
                              decode ? decode->count() : -1);
    }
    return r;
}

inline void KVCacheManager::setUniqueTokens(kvb::Request& r, VecUniqueTokens const& tokens,
                                            bool extra) {
    r.tokens.clear();
    r.extraIds.clear();
    for (auto const& t : tokens) {
        r.tokens.push_back(t.tokenId);
        if (extra) r.extraIds.push_back(t.tokenExtraId);
    }
    r.inputLength = static_cast<int32_t>(tokens.size());
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_KV_CACHE_MANAGER_SEQUENCES_HPP
