// kvblock_trtllm/block_manager_inl.hpp: the definitions of BlockManager's and
// WindowBlockManager's methods, which reach into the complete KVCacheManager. Part of
// kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP
#define KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "kvblock_trtllm/kv_cache_manager.hpp"

namespace kvb::trtllm {

inline bool BlockManager::isVariableWindow() const {
    return owner_.isVariableWindow();
}
inline SizeType32 BlockManager::getFirstWindowSize() const {
    return owner_.windows_.front();
}
inline SizeType32 BlockManager::getLastWindowSize() const {
    return owner_.windows_.back();
}
inline std::map<SizeType32, SizeType32> BlockManager::getNumFreeBlocksPerWindowSize() const {
    return owner_.getNumFreeBlocksPerWindowSize();
}
inline bool BlockManager::schedulingHasFreeBlocks(SizeType32 numRequired,
                                                  SizeType32 windowSize) const {
    return owner_.impl().schedulingHasFreeBlocks(numRequired, windowSize);
}
inline bool BlockManager::offloadBlock(BlockIdType blockId, SizeType32 windowSize) const {
    return owner_.impl().offloadBlock(windowSize, blockId);
}
inline bool BlockManager::onboardBlock(BlockIdType blockId, SizeType32 windowSize) const {
    return owner_.impl().onboardBlock(windowSize, blockId);
}
inline std::pair<SizeType32, std::vector<BlockIdType>> BlockManager::storeBlocks(
    std::vector<BlockKey> const& blockKeys, std::vector<BlockIdType> const& blockIds,
    SizeType32 windowSize, bool pinBlocks) const {
    if (blockKeys.empty() || blockIds.empty()) return {0, {}};
    BlockKey const& first = blockKeys.front();
    VecUniqueTokens tokens;
    for (BlockKey const& k : blockKeys)
        tokens.insert(tokens.end(), k.uniqueTokens.begin(), k.uniqueTokens.end());
    kvb::Request r;
    KVCacheManager::setUniqueTokens(r, tokens, first.usesExtraIds);
    if (first.loraTaskId) r.withLora(*first.loraTaskId);
    if (first.cacheSaltID) r.withSalt(*first.cacheSaltID);
    r.mmItems = first.multimodalItems;
    size_t n = std::min(blockKeys.size(), blockIds.size());
    std::vector<BlockIdType> ids(blockIds.begin(), blockIds.begin() + static_cast<ptrdiff_t>(n));
    auto [stored, pinned] = owner_.impl().storeBlocks(r, static_cast<int32_t>(tokens.size()),
                                                      windowSize, ids, pinBlocks);
    if (!pinned.empty()) {
        auto& self = const_cast<KVCacheManager&>(owner_);
        std::lock_guard<std::mutex> lock(self.pinMutex_);
        self.pinGroups_.emplace_back(
            pinned,
            std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>{{windowSize, pinned}});
    }
    return {stored, pinned};
}
inline WindowBlockManager BlockManager::getWindowBlockManager(SizeType32 windowSize) const {
    (void)owner_.impl().getMaxBlocksPerSeq(windowSize);  // throws for an unknown window
    return WindowBlockManager(owner_, windowSize);
}
inline void WindowBlockManager::pinBlock(BlockIdType blockId) const {
    owner_.impl().pinBlocksById(windowSize_, {blockId});
}
inline void WindowBlockManager::unpinBlock(BlockIdType blockId) const {
    owner_.impl().unpinBlocksById(windowSize_, {blockId});
}
inline SizeType32 BlockManager::getNumPools(bool includeBlockScalePools,
                                            bool includeIndexerKCachePools) const {
    SizeType32 n = owner_.impl().getNumPools(includeBlockScalePools);
    if (includeIndexerKCachePools) return n;
    SizeType32 indexer = 0;
    for (SizeType32 p = 0; p < n; ++p)
        indexer += owner_.impl().getPoolInfo(p).cache_type == KVB_CACHE_TYPE_INDEXER_K;
    return n - indexer;
}
inline SizeType32 BlockManager::getPoolWindowSize(SizeType32 poolIdx) const {
    return owner_.impl().getPoolInfo(poolIdx).window_size;
}
inline std::vector<kvb_pool_info_t> BlockManager::getPoolConfigurations() const {
    std::vector<kvb_pool_info_t> out;
    for (SizeType32 p = 0; p < getNumPools(); ++p) out.push_back(owner_.impl().getPoolInfo(p));
    return out;
}
inline SizeType32 BlockManager::getLayerPoolIdx(SizeType32 layerIdx) const {
    return owner_.getLayerToPoolMapping().at(static_cast<size_t>(layerIdx))[0];
}
inline PoolView BlockManager::getPrimaryPool(SizeType32 poolIdx) const {
    kvb_pool_info_t info = owner_.impl().getPoolInfo(poolIdx);
    PoolView v;
    v.data = static_cast<uint8_t*>(owner_.poolBase(poolIdx, KVB_CACHE_LEVEL_PRIMARY));
    v.poolIdx = poolIdx;
    v.windowSize = info.window_size;
    auto const& windows = owner_.config_.windows;
    auto w = std::find_if(windows.begin(), windows.end(), [&](kvb_window_config_t const& c) {
        return c.window_size == info.window_size;
    });
    v.numBlocks = w == windows.end() ? 0 : w->primary_blocks;
    v.numLayers = info.num_layers;
    v.kvFactor = info.kv_factor;
    v.bytesPerField = static_cast<SizeType64>(info.num_kv_heads) * info.tokens_per_block *
                      info.bytes_per_head_token;
    v.rowBytes = static_cast<SizeType64>(info.row_bytes);
    return v;
}
inline PoolView BlockManager::getSecondaryPool(SizeType32 poolIdx) const {
    PoolView v = getPrimaryPool(poolIdx);
    v.data = static_cast<uint8_t*>(owner_.poolBase(poolIdx, KVB_CACHE_LEVEL_SECONDARY));
    v.numBlocks = owner_.impl().getHostTierBlocks(v.windowSize);
    return v;
}
inline std::map<SizeType32, WindowSizeMetadata> BlockManager::getWindowSizesMetadata() const {
    std::map<SizeType32, WindowSizeMetadata> out;
    auto const& raw = owner_.config_.raw;
    SizeType32 maxTokens = raw.max_sequence_length + raw.num_extra_kv_tokens + raw.max_draft_tokens;
    for (SizeType32 p = 0; p < getNumPools(false); ++p) {
        SizeType32 window = getPoolWindowSize(p);
        auto [it, first] = out.try_emplace(window);
        WindowSizeMetadata& m = it->second;
        ++m.numPools;
        if (!first) continue;
        PoolView primary = getPrimaryPool(p);
        m.allottedPrimaryBlocks = static_cast<SizeType32>(primary.numBlocks);
        m.allottedSecondaryBlocks =
            static_cast<SizeType32>(owner_.impl().getHostTierBlocks(window));
        m.maxNumBlocks = m.allottedPrimaryBlocks + m.allottedSecondaryBlocks;
        m.absolutePoolsOffset = p;
        m.maxTokenNum = maxTokens;
        m.maxBlocksPerSeq = owner_.impl().getMaxBlocksPerSeq(window);
        m.windowSize = window;
        m.isSWA = window < maxTokens;
    }
    return out;
}
inline SizeType32 BlockManager::getNumSecondaryBlocks() const {
    return static_cast<SizeType32>(owner_.impl().getKvCacheStats().num_secondary_blocks);
}
inline SizeType32 BlockManager::getNumFreeSecondaryBlocks() const {
    return static_cast<SizeType32>(owner_.impl().getKvCacheStats().free_secondary_blocks);
}
inline kvb_block_info_t BlockManager::getBlockById(BlockIdType blockId,
                                                   SizeType32 windowSize) const {
    return owner_.impl().getBlockInfo(windowSize, blockId);
}
inline std::optional<ReuseTreeMatch> BlockManager::findBlocksInReuseTreeByBlockKey(
    BlockKey const& blockKey, SizeType32 windowSize) const {
    return find(blockKey, windowSize, false, nullptr);
}
inline std::optional<ReuseTreeMatch> BlockManager::findBlocksInReuseTreeByBlockKey(
    BlockKey const& blockKey, SizeType32 windowSize,
    std::vector<BlockIdType>& pinnedBlockIds) const {
    return find(blockKey, windowSize, true, &pinnedBlockIds);
}
inline std::optional<ReuseTreeMatch> BlockManager::findBlocksInReuseTreeByBlockKeys(
    std::vector<BlockKey> const& blockKeys, SizeType32 windowSize) const {
    if (blockKeys.empty()) return std::nullopt;
    BlockKey all = blockKeys.front();
    for (size_t i = 1; i < blockKeys.size(); ++i)
        all.uniqueTokens.insert(all.uniqueTokens.end(), blockKeys[i].uniqueTokens.begin(),
                                blockKeys[i].uniqueTokens.end());
    return find(all, windowSize, false, nullptr);
}
inline std::map<SizeType32, KvCacheIterationStats> BlockManager::getAndResetIterationStats() const {
    return const_cast<KVCacheManager&>(owner_).getIterationStats();
}
inline bool BlockManager::verifyQueueIntegrity(SizeType32) const {
    return kvb_manager_check_invariants(owner_.impl().get()) == KVB_OK;
}
inline SizeType32 BlockManager::getNumFreeBlocks() const {
    return owner_.getNumFreeBlocks();
}
inline SizeType32 BlockManager::getNumAllocatedBlocks() const {
    return getMaxNumBlocks() - getNumFreeBlocks();
}
inline SizeType32 BlockManager::getMaxNumBlocks() const {
    return getNumPrimaryBlocks();
}
inline SizeType32 BlockManager::getNumPrimaryBlocks() const {
    SizeType32 n = 0;
    for (auto const& w : owner_.config_.windows) n += static_cast<SizeType32>(w.primary_blocks);
    return n;
}
inline SizeType32 BlockManager::getTokensPerBlock() const {
    return owner_.getTokensPerBlock();
}
inline SizeType32 BlockManager::getBlockSize(SizeType32 poolIdx) const {
    kvb_pool_info_t info = owner_.impl().getPoolInfo(poolIdx);
    SizeType32 elementBytes = std::max<SizeType32>(1, owner_.elementBytes_);
    return static_cast<SizeType32>(static_cast<int64_t>(info.num_kv_heads) * info.tokens_per_block *
                                   info.bytes_per_head_token / elementBytes);
}
inline bool BlockManager::isVariableGQA() const {
    auto const& layers = owner_.config_.layers;
    return std::any_of(layers.begin(), layers.end(), [&](kvb_layer_spec_t const& l) {
        return l.num_kv_heads != layers.front().num_kv_heads;
    });
}
inline std::optional<ReuseTreeMatch> BlockManager::find(BlockKey const& key, SizeType32 windowSize,
                                                        bool pin,
                                                        std::vector<BlockIdType>* pinned) const {
    if (key.uniqueTokens.empty()) return std::nullopt;
    kvb::Request r;
    KVCacheManager::setUniqueTokens(r, key.uniqueTokens, key.usesExtraIds);
    if (key.loraTaskId) r.withLora(*key.loraTaskId);
    if (key.cacheSaltID) r.withSalt(*key.cacheSaltID);
    r.mmItems = key.multimodalItems;
    size_t tpb = static_cast<size_t>(owner_.getTokensPerBlock());
    std::vector<int32_t> ids((key.uniqueTokens.size() + tpb - 1) / tpb);
    size_t n = 0;
    r.withC([&](kvb_request_t const* c) {
        check(kvb_manager_find_blocks_in_reuse_tree(owner_.impl().get(), c,
                                                    static_cast<int32_t>(c->num_tokens), windowSize,
                                                    pin, ids.data(), ids.size(), &n));
    });
    if (n == 0) return std::nullopt;
    ids.resize(n);
    if (pinned) {
        pinned->insert(pinned->end(), ids.begin(), ids.end());
        auto& self = const_cast<KVCacheManager&>(owner_);
        std::lock_guard<std::mutex> lock(self.pinMutex_);
        self.pinGroups_.emplace_back(
            ids, std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>{{windowSize, ids}});
    }
    return ReuseTreeMatch{ids};
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP
