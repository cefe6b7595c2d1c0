// kvblock_trtllm/block_manager_inl.hpp: the definitions of BlockManager's and
// WindowBlockManager's methods, which reach into the complete KVCacheManager. Part of
// kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP
#define KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvblock_trtllm/kv_cache_manager.hpp"

namespace kvb::trtllm {

inline bool BlockManager::isVariableWindow() const {
    return owner().isVariableWindow();
}
inline SizeType32 BlockManager::getFirstWindowSize() const {
    return owner().windows_.front();
}
inline SizeType32 BlockManager::getLastWindowSize() const {
    return owner().windows_.back();
}
inline std::map<SizeType32, SizeType32> BlockManager::getNumFreeBlocksPerWindowSize() const {
    return owner().getNumFreeBlocksPerWindowSize();
}
inline bool BlockManager::schedulingHasFreeBlocks(SizeType32 numRequired,
                                                  SizeType32 windowSize) const {
    return owner().impl().schedulingHasFreeBlocks(numRequired, windowSize);
}
inline bool BlockManager::offloadBlock(BlockIdType blockId, SizeType32 windowSize) const {
    return owner().impl().offloadBlock(windowSize, blockId);
}
inline bool BlockManager::onboardBlock(BlockIdType blockId, SizeType32 windowSize) const {
    return owner().impl().onboardBlock(windowSize, blockId);
}
namespace detail {
/// Whether `mode` keeps blocks in files (TensorRT-LLM's GDS and POSIX modes); a file mode
/// without a directory throws.
inline bool usesFiles(KvCacheTransferMode mode, std::string const& directory) {
    if (mode != KvCacheTransferMode::GDS && mode != KvCacheTransferMode::POSIX_DEBUG_FALLBACK)
        return false;
    if (directory.empty())
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "a file transfer mode needs a directory");
    return true;
}
}  // namespace detail

inline std::vector<BlockManager::FileRow> BlockManager::fileRows(
    BlockPtr const& block, SizeType32 windowSize, std::string const& directory) const {
    std::vector<FileRow> rows;
    auto const index = static_cast<std::size_t>(block->getMemoryPoolBlockIndex());
    SizeType32 n = 0;
    for (SizeType32 p = 0; p < getNumPools(); ++p) {
        if (getPoolWindowSize(p) != windowSize) continue;
        PoolView v = getSecondaryPoolView(p);
        if (v.data == nullptr)
            throw Error(KVB_STATUS_UNSUPPORTED, "file transfers need host pools with memory");
        auto const bytes = static_cast<std::size_t>(v.rowBytes);
        rows.push_back({v.data + index * bytes, bytes,
                        directory + "/block_" + std::to_string(block->getBlockId()) + "_pool_" +
                            std::to_string(n++) + ".bin"});
    }
    return rows;
}
inline bool BlockManager::offloadBlock(BlockPtr const& block, SizeType32 windowSize,
                                       KvCacheTransferMode mode,
                                       std::string const& directory) const {
    if (!block) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null block handle");
    bool const files = detail::usesFiles(mode, directory);
    bool moved = offloadBlock(block->getBlockId(), windowSize);
    if (!moved || !files) return moved;
    // TensorRT-LLM's file modes keep the offloaded bytes in files: the host rows, once the
    // copies that filled them are done.
    owner().impl().waitForCopiesOnHost();
    for (FileRow const& r : fileRows(block, windowSize, directory)) {
        std::ofstream out(r.path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<char const*>(r.row), static_cast<std::streamsize>(r.bytes));
        if (!out) throw Error(KVB_STATUS_INVALID_ARGUMENT, "cannot write " + r.path);
    }
    return true;
}
inline bool BlockManager::onboardBlock(GenerationRequest& sequence, BlockPtr const& block,
                                       SizeType32 windowSize, KvCacheTransferMode mode,
                                       std::string const& directory) {
    if (!block) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null block handle");
    if (detail::usesFiles(mode, directory) && !block->isPrimary()) {
        // Read every file first: one of the wrong size leaves every row as it was.
        std::vector<FileRow> rows = fileRows(block, windowSize, directory);
        std::vector<std::vector<char>> contents(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
            std::ifstream in(rows[i].path, std::ios::binary | std::ios::ate);
            if (!in) continue;
            auto const size = static_cast<std::size_t>(in.tellg());
            if (size != rows[i].bytes)
                throw Error(KVB_STATUS_INVALID_ARGUMENT,
                            rows[i].path + " holds " + std::to_string(size) + " bytes, the row " +
                                std::to_string(rows[i].bytes));
            contents[i].resize(size);
            in.seekg(0);
            in.read(contents[i].data(), static_cast<std::streamsize>(size));
        }
        owner().impl().waitForCopiesOnHost();
        for (std::size_t i = 0; i < rows.size(); ++i)
            if (!contents[i].empty())
                std::copy(contents[i].begin(), contents[i].end(), rows[i].row);
    }
    bool moved = onboardBlock(block->getBlockId(), windowSize);
    writeBack(sequence);
    return moved;
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
    auto [stored, pinned] = owner().impl().storeBlocks(r, static_cast<int32_t>(tokens.size()),
                                                       windowSize, ids, pinBlocks);
    if (!pinned.empty()) {
        auto& self = mutableOwner();
        std::lock_guard<std::mutex> lock(self.pinMutex_);
        self.pinGroups_.emplace_back(
            pinned,
            std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>{{windowSize, pinned}});
    }
    return {stored, pinned};
}
inline WindowBlockManager BlockManager::getWindowBlockManager(SizeType32 windowSize) const {
    (void)owner().impl().getMaxBlocksPerSeq(windowSize);  // throws for an unknown window
    return WindowBlockManager(*owner_, windowSize);
}
inline void WindowBlockManager::pinBlock(BlockIdType blockId) const {
    owner_.impl().pinBlocksById(windowSize_, {blockId});
}
inline void WindowBlockManager::unpinBlock(BlockIdType blockId) const {
    owner_.impl().unpinBlocksById(windowSize_, {blockId});
}
inline SizeType32 BlockManager::getNumPools(bool includeBlockScalePools,
                                            bool includeIndexerKCachePools) const {
    SizeType32 n = owner().impl().getNumPools(includeBlockScalePools);
    if (includeIndexerKCachePools) return n;
    SizeType32 indexer = 0;
    for (SizeType32 p = 0; p < n; ++p)
        indexer += owner().impl().getPoolInfo(p).cache_type == KVB_CACHE_TYPE_INDEXER_K;
    return n - indexer;
}
inline bool BlockManager::containsBlockScales(SizeType32 poolIdx) const {
    return owner().impl().getPoolInfo(poolIdx).scales_of >= 0;
}
inline SizeType32 BlockManager::getPoolWindowSize(SizeType32 poolIdx) const {
    return owner().impl().getPoolInfo(poolIdx).window_size;
}
inline std::vector<kvb_pool_info_t> BlockManager::getPoolConfigurations() const {
    std::vector<kvb_pool_info_t> out;
    for (SizeType32 p = 0; p < getNumPools(); ++p) out.push_back(owner().impl().getPoolInfo(p));
    return out;
}
inline SizeType32 BlockManager::getLayerPoolIdx(SizeType32 layerIdx) const {
    return owner().layerToPoolTable().at(static_cast<size_t>(layerIdx))[0];
}
inline PoolView BlockManager::getPrimaryPoolView(SizeType32 poolIdx) const {
    kvb_pool_info_t info = owner().impl().getPoolInfo(poolIdx);
    PoolView v;
    v.data = static_cast<uint8_t*>(owner().poolBase(poolIdx, KVB_CACHE_LEVEL_PRIMARY));
    v.poolIdx = poolIdx;
    v.windowSize = info.window_size;
    auto const& windows = owner().config_.windows;
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
inline PoolView BlockManager::getSecondaryPoolView(SizeType32 poolIdx) const {
    PoolView v = getPrimaryPoolView(poolIdx);
    v.data = static_cast<uint8_t*>(owner().poolBase(poolIdx, KVB_CACHE_LEVEL_SECONDARY));
    v.numBlocks = owner().impl().getHostTierBlocks(v.windowSize);
    return v;
}
inline ITensor::SharedPtr BlockManager::getPrimaryPool(SizeType32 poolIdx) const {
    return owner().poolTensor(getPrimaryPoolView(poolIdx), KVB_CACHE_LEVEL_PRIMARY);
}
inline ITensor::SharedPtr BlockManager::getSecondaryPool(SizeType32 poolIdx) const {
    return owner().poolTensor(getSecondaryPoolView(poolIdx), KVB_CACHE_LEVEL_SECONDARY);
}
inline BufferManager const& BlockManager::getBufferManager(SizeType32 windowSize) const {
    auto const& windows = owner().windows_;
    if (std::find(windows.begin(), windows.end(), windowSize) == windows.end())
        throw Error(KVB_STATUS_INVALID_ARGUMENT,
                    "getBufferManager: no window of size " + std::to_string(windowSize));
    KVCacheManager const* mgr = owner_;
    std::lock_guard<std::mutex> lock(mgr->bufferManagersMutex_);
    auto [it, fresh] = mgr->bufferManagers_.try_emplace(windowSize);
    if (fresh)
        it->second = BufferManager::reportingPoolBytes([mgr, windowSize]() -> std::size_t {
            if (!mgr->manager_) return 0;  // no pools before allocatePools
            std::size_t bytes = 0;
            BlockManager const& bm = mgr->getBlockManager();
            for (SizeType32 p = 0; p < bm.getNumPools(); ++p) {
                PoolView v = bm.getPrimaryPoolView(p);
                if (v.windowSize == windowSize && v.data)
                    bytes += static_cast<std::size_t>(v.numBlocks * v.rowBytes);
            }
            return bytes;
        });
    return it->second;
}
inline std::map<SizeType32, WindowSizeMetadata> BlockManager::getWindowSizesMetadata() const {
    std::map<SizeType32, WindowSizeMetadata> out;
    auto const& raw = owner().config_.raw;
    SizeType32 maxTokens = raw.max_sequence_length + raw.num_extra_kv_tokens + raw.max_draft_tokens;
    for (SizeType32 p = 0; p < getNumPools(false); ++p) {
        SizeType32 window = getPoolWindowSize(p);
        auto [it, first] = out.try_emplace(window);
        WindowSizeMetadata& m = it->second;
        ++m.numPools;
        if (!first) continue;
        PoolView primary = getPrimaryPoolView(p);
        m.allottedPrimaryBlocks = static_cast<SizeType32>(primary.numBlocks);
        m.allottedSecondaryBlocks =
            static_cast<SizeType32>(owner().impl().getHostTierBlocks(window));
        m.maxNumBlocks = m.allottedPrimaryBlocks + m.allottedSecondaryBlocks;
        m.absolutePoolsOffset = p;
        m.maxTokenNum = maxTokens;
        m.maxBlocksPerSeq = owner().impl().getMaxBlocksPerSeq(window);
        m.windowSize = window;
        m.isSWA = window < maxTokens;
    }
    return out;
}
inline SizeType32 BlockManager::getNumSecondaryBlocks() const {
    return static_cast<SizeType32>(owner().impl().getKvCacheStats().num_secondary_blocks);
}
inline SizeType32 BlockManager::getNumFreeSecondaryBlocks() const {
    return static_cast<SizeType32>(owner().impl().getKvCacheStats().free_secondary_blocks);
}
inline BlockPtr BlockManager::getBlockById(BlockIdType blockId, SizeType32 windowSize) const {
    (void)owner().impl().getBlockInfo(windowSize, blockId);  // throws for an unknown block
    return BlockPtr(std::make_shared<KVCacheBlock>(owner(), windowSize, blockId));
}
inline BlockPtr BlockManager::findBlockInReuseTreeByBlockKey(BlockKey const& blockKey,
                                                             SizeType32 windowSize) const {
    auto match = find(blockKey, windowSize, false, nullptr);
    if (!match) return nullptr;
    return BlockPtr(std::make_shared<KVCacheBlock>(owner(), windowSize, match->lastBlockId()));
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
    return mutableOwner().getIterationStats();
}
inline bool BlockManager::verifyQueueIntegrity(SizeType32) const {
    return kvb_manager_check_invariants(owner().impl().get()) == KVB_OK;
}
inline SizeType32 BlockManager::getNumFreeBlocks() const {
    return owner().getNumFreeBlocks();
}
inline SizeType32 BlockManager::getNumAllocatedBlocks() const {
    return getMaxNumBlocks() - getNumFreeBlocks();
}
// TensorRT-LLM counts every block of every window, the host tier's included (so
// getNumAllocatedBlocks counts the host blocks as allocated: its free count is the GPU's).
inline SizeType32 BlockManager::getMaxNumBlocks() const {
    return getNumPrimaryBlocks() + getNumSecondaryBlocks();
}
inline SizeType32 BlockManager::getNumPrimaryBlocks() const {
    SizeType32 n = 0;
    for (auto const& w : owner().config_.windows) n += static_cast<SizeType32>(w.primary_blocks);
    return n;
}
inline SizeType32 BlockManager::getTokensPerBlock() const {
    return owner().getTokensPerBlock();
}
inline SizeType32 BlockManager::getBlockSize(SizeType32 poolIdx) const {
    kvb_pool_info_t info = owner().impl().getPoolInfo(poolIdx);
    SizeType32 elementBytes = std::max<SizeType32>(1, owner().elementBytes_);
    return static_cast<SizeType32>(static_cast<int64_t>(info.num_kv_heads) * info.tokens_per_block *
                                   info.bytes_per_head_token / elementBytes);
}
inline bool BlockManager::isVariableGQA() const {
    auto const& layers = owner().config_.layers;
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
    size_t tpb = static_cast<size_t>(owner().getTokensPerBlock());
    std::vector<int32_t> ids((key.uniqueTokens.size() + tpb - 1) / tpb);
    size_t n = 0;
    r.withC([&](kvb_request_t const* c) {
        check(kvb_manager_find_blocks_in_reuse_tree(owner().impl().get(), c,
                                                    static_cast<int32_t>(c->num_tokens), windowSize,
                                                    pin, ids.data(), ids.size(), &n));
    });
    if (n == 0) return std::nullopt;
    ids.resize(n);
    if (pinned) {
        pinned->insert(pinned->end(), ids.begin(), ids.end());
        auto& self = mutableOwner();
        std::lock_guard<std::mutex> lock(self.pinMutex_);
        self.pinGroups_.emplace_back(
            ids, std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>{{windowSize, ids}});
    }
    return ReuseTreeMatch{ids};
}

// --- KVCacheBlock -------------------------------------------------------------------------

inline kvb_block_info_t KVCacheBlock::getInfo() const {
    if (blockId_ == kCachedBlocksRootId)
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "the reuse tree's root is not a block");
    return owner().impl().getBlockInfo(windowSize_, blockId_);
}
inline bool KVCacheBlock::isPrimary() const {
    if (!owner_) return standaloneIndex_.isPrimary();
    return blockId_ == kCachedBlocksRootId || getInfo().cache_level == KVB_CACHE_LEVEL_PRIMARY;
}
inline SizeType32 KVCacheBlock::getMemoryPoolBlockIndex() const {
    if (!owner_) return standaloneIndex_.get();
    return getInfo().memory_index;
}
inline SizeType32 KVCacheBlock::getPriority() const {
    return getInfo().priority;
}
inline void KVCacheBlock::setPriority(SizeType32 priority) const {
    if (blockId_ == kCachedBlocksRootId)
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "the reuse tree's root is not a block");
    owner().impl().setBlockPriority(windowSize_, blockId_, priority);
}
inline SizeType32 KVCacheBlock::getNumRefs() const {
    return blockId_ == kCachedBlocksRootId ? 0 : getInfo().ref_count;
}
inline bool KVCacheBlock::isLeaf() const {
    return blockId_ != kCachedBlocksRootId && getInfo().is_leaf;
}
inline std::size_t KVCacheBlock::getHash() const {
    if (blockId_ == kCachedBlocksRootId) return 0;
    kvb_block_info_t info = getInfo();
    return info.in_reuse_tree ? static_cast<std::size_t>(info.hash) : 0;
}
inline BlockPtr KVCacheBlock::getPrevBlock() const {
    if (blockId_ == kCachedBlocksRootId) return nullptr;
    int64_t parent = getInfo().parent;
    if (parent < kCachedBlocksRootId) return nullptr;  // not in the tree
    return BlockPtr(
        std::make_shared<KVCacheBlock>(owner(), windowSize_, static_cast<IdType>(parent)));
}

// --- the owning BlockManager ----------------------------------------------------------------

template <typename DataType, typename Stream, typename>
BlockManager::BlockManager(std::vector<SizeType32> const& numKvHeadsPerLayer,
                           SizeType32 sizePerHead, SizeType32 tokensPerBlock,
                           BlocksPerWindow const& blocksPerWindow, SizeType32 maxNumSequences,
                           std::shared_ptr<Stream> stream, SizeType32 maxSequenceLength,
                           SizeType32 maxBeamWidth,
                           std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                           SizeType32 sinkBubbleLength, bool onboardBlocks, CacheType cacheType,
                           std::optional<SizeType32> secondaryOffloadMinPriority,
                           std::shared_ptr<KVCacheEventManager> eventManager,
                           bool enablePartialReuse, bool copyOnPartialReuse,
                           KvblockOptions options) {
    (void)onboardBlocks;
    owned_ = std::make_unique<KVCacheManager>(
        numKvHeadsPerLayer, sizePerHead, tokensPerBlock, blocksPerWindow, maxNumSequences,
        maxBeamWidth, maxAttentionWindowVec, dtype, sinkBubbleLength, std::move(stream),
        maxSequenceLength, /*chunkSize*/ 0, /*enableBlockReuse*/ true, cacheType,
        secondaryOffloadMinPriority, std::move(eventManager), enablePartialReuse,
        copyOnPartialReuse, std::move(options));
    owner_ = owned_.get();
}
template <typename DataType, typename Stream, typename>
BlockManager::BlockManager(std::vector<SizeType32> const& numKvHeadsPerLayer,
                           SizeType32 sizePerHead, SizeType32 tokensPerBlock,
                           BlocksPerWindow const& blocksPerWindow, SizeType32 maxNumSequences,
                           std::shared_ptr<Stream> stream, SizeType32 maxSequenceLength,
                           SizeType32 maxBeamWidth,
                           std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                           SizeType32 sinkBubbleLength, bool onboardBlocks, CacheType cacheType,
                           std::optional<SizeType32> secondaryOffloadMinPriority,
                           std::shared_ptr<KVCacheEventManager> eventManager,
                           bool enablePartialReuse, bool copyOnPartialReuse,
                           std::shared_ptr<kv_connector::KvCacheConnectorManager> connector,
                           KvblockOptions options)
    : BlockManager(numKvHeadsPerLayer, sizePerHead, tokensPerBlock, blocksPerWindow,
                   maxNumSequences, std::move(stream), maxSequenceLength, maxBeamWidth,
                   maxAttentionWindowVec, dtype, sinkBubbleLength, onboardBlocks, cacheType,
                   secondaryOffloadMinPriority, std::move(eventManager), enablePartialReuse,
                   copyOnPartialReuse, std::move(options)) {
    owned_->connector_ = std::move(connector);
}
inline BlockManager::~BlockManager() = default;

inline void BlockManager::allocatePools(bool useUvm) {
    mutableOwner().allocatePools(useUvm);
}
inline void BlockManager::releasePools() {
    mutableOwner().releasePools();
    admitted_.clear();
}

inline std::vector<AddSequenceResult> BlockManager::addSequenceBatch(
    std::vector<GenerationRequest*> const& sequences, std::vector<SizeType32> const& inputLengths,
    std::vector<SizeType32> const& numContextBlocks,
    std::vector<std::reference_wrapper<LlmRequest>> const& llmRequests, SizeType32 windowSize,
    bool isEnableBlockReuse) {
    size_t const n = sequences.size();
    if (inputLengths.size() != n || numContextBlocks.size() != n || llmRequests.size() != n)
        throw Error(KVB_STATUS_INVALID_ARGUMENT,
                    "sequences, inputLengths, numContextBlocks and llmRequests differ in size");
    (void)owner().impl().getMaxBlocksPerSeq(windowSize);  // throws for an unknown window
    std::vector<AddSequenceResult> results(n);
    std::vector<size_t> fresh;  // indices of the sequences this call admits
    std::vector<kvb::Request> batch;
    for (size_t i = 0; i < n; ++i) {
        GenerationRequest* seq = sequences[i];
        if (!seq) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null GenerationRequest");
        auto it = admitted_.find(seq->getRequestId());
        if (it != admitted_.end() && it->second.sequence == seq &&
            !it->second.windows.count(windowSize) && owner().hasSequence(seq->getRequestId())) {
            // Admitted by this sequence's call for another window: kvblock admitted them all.
            it->second.windows.insert(windowSize);
            results[i] = it->second.result;
            continue;
        }
        kvb::Request r = KVCacheManager::toKvb(llmRequests[i].get());
        r.id = seq->getRequestId();
        r.inputLength = inputLengths[i];
        r.beamWidth = seq->getBeamWidth();
        r.disableReuse = !isEnableBlockReuse;
        batch.push_back(std::move(r));
        fresh.push_back(i);
    }
    if (batch.empty()) return results;
    // A connector is asked before anything changes (as KVCacheManager::addSequenceBatch asks).
    std::vector<SizeType32> prepopulated;
    if (owner().connector_) {
        auto const estimates = owner().impl().estimateBatch(batch);
        for (size_t k = 0; k < batch.size(); ++k)
            prepopulated.push_back(owner().connectorExtended(
                llmRequests[fresh[k]].get(), inputLengths[fresh[k]], estimates[k].reusable_tokens));
    }
    auto admissions = owner().impl().addSequenceBatch(batch);
    for (size_t k = 0; k < admissions.size(); ++k) {
        size_t const i = fresh[k];
        auto const& a = admissions[k];
        AddSequenceResult& res = results[i];
        res.prepopulatedLen = prepopulated.empty() ? a.prepopulated_prompt_len : prepopulated[k];
        res.allocTotalBlocks = static_cast<SizeType32>(a.stats.alloc_total_blocks);
        res.allocNewBlocks = static_cast<SizeType32>(a.stats.alloc_new_blocks);
        res.reusedBlocks = static_cast<SizeType32>(a.stats.reused_blocks);
        res.missedBlocks = static_cast<SizeType32>(a.stats.missed_blocks);
        LlmRequest& req = llmRequests[i].get();
        req.updateAllocTotalBlocksPerRequest(res.allocTotalBlocks);
        req.updateAllocNewBlocksPerRequest(res.allocNewBlocks);
        req.updateReusedBlocksPerRequest(res.reusedBlocks);
        req.updateMissedBlocksPerRequest(res.missedBlocks);
        req.setEstimatedReusableTokens(0);  // admitted: the reuse is applied now
        GenerationRequest* seq = sequences[i];
        admitted_[seq->getRequestId()] = Admitted{seq, {windowSize}, res, isEnableBlockReuse};
        writeBack(*seq);
    }
    return results;
}

inline std::optional<BlockIdType> BlockManager::releaseBlocks(
    GenerationRequest& sequence, OptionalRef<LlmRequest const> llmRequest, bool pinBlocks) {
    RequestIdType const id = sequence.getRequestId();
    auto it = admitted_.find(id);
    bool const reuse = it == admitted_.end() || it->second.reuse;
    if (it != admitted_.end()) admitted_.erase(it);
    if (reuse && llmRequest) syncGenerated(id, *llmRequest);
    auto last = mutableOwner().removeSequence(
        id, reuse ? llmRequest : OptionalRef<LlmRequest const>(), pinBlocks);
    writeBack(sequence);
    return last;
}

inline void BlockManager::syncGenerated(RequestIdType id, LlmRequest const& req) const {
    // The manager's own rule covers a request in its context phase (computed up to the
    // context position) and one past it (every known token). A request whose prefill is
    // complete but which has not left the context state yet and has tokens past its prompt
    // ran decode steps: every token but the newest has KV, as in any decode step. Those the
    // blocks the sequence holds have room for are handed over now.
    if (!owner().hasSequence(id) || req.isContextFinished() ||
        req.getContextCurrentPosition() < req.getPromptLen() || req.getBeamWidth() != 1)
        return;
    size_t const tokens = req.getTokens(0).size();
    if (tokens <= static_cast<size_t>(req.getPromptLen())) return;
    Manager& m = owner().impl();
    size_t room = 0;
    for (SizeType32 w : owner().getWindowSizes()) {
        size_t held = m.getCacheBlockIds(id, w, 0).size();
        int32_t front = 0;
        check(kvb_manager_get_num_front_blocks_removed(m.get(), id, w, &front));
        size_t const wroom = (held + static_cast<size_t>(std::max(front, 0))) *
                             static_cast<size_t>(owner().getTokensPerBlock());
        room = room == 0 ? wroom : std::min(room, wroom);
    }
    size_t const target = std::min(tokens, room);
    auto l = m.getSequenceLengths(id);
    if (target > l.capacity && !m.resize(id, target)) return;
    mutableOwner().syncTokens(req);
    l = m.getSequenceLengths(id);
    size_t const computed = std::min(target, l.num_tokens);
    if (computed > l.history) m.advanceHistory(id, computed);
}

inline void BlockManager::storeContextBlocks(GenerationRequest& sequence,
                                             LlmRequest const& llmRequest) {
    auto it = admitted_.find(sequence.getRequestId());
    if (it != admitted_.end() && !it->second.reuse) return;
    owner().impl().storeContextBlocks(sequence.getRequestId(),
                                      llmRequest.getContextCurrentPosition());
    writeBack(sequence);
}

inline std::map<SizeType32, float> BlockManager::calculateWindowSizeToShare(
    std::map<SizeType32, std::vector<SizeType32>> const& windowSizeToLayers,
    std::map<SizeType32, SizeType32> const& cacheSizePerTokenPerWindow) {
    std::vector<int32_t> windows, perToken;
    for (auto const& [window, layers] : windowSizeToLayers) {
        (void)layers;
        auto c = cacheSizePerTokenPerWindow.find(window);
        if (c == cacheSizePerTokenPerWindow.end())
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "a window without its cache size per token");
        windows.push_back(window);
        perToken.push_back(c->second);
    }
    std::vector<double> shares(windows.size());
    check(kvb_calculate_window_size_to_share(windows.data(), perToken.data(), windows.size(),
                                             shares.data()));
    std::map<SizeType32, float> out;
    for (size_t i = 0; i < windows.size(); ++i) out[windows[i]] = static_cast<float>(shares[i]);
    return out;
}

inline void BlockManager::writeBack(GenerationRequest& sequence) const {
    RequestIdType const id = sequence.getRequestId();
    if (!owner().hasSequence(id)) {
        for (auto& [window, beams] : sequence.cacheBlockIds_) {
            (void)window;
            for (auto& beam : beams) beam.clear();
        }
        sequence.frontBlocksRemoved_.clear();
        return;
    }
    GenerationRequest const& record = owner().refreshSequence(id);
    for (auto const& [window, beams] : record.cacheBlockIds_)
        sequence.cacheBlockIds_[window] = beams;
    sequence.frontBlocksRemoved_ = record.frontBlocksRemoved_;
    sequence.numTokens_ = record.numTokens_;
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_BLOCK_MANAGER_INL_HPP
