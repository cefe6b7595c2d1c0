// kvblock_trtllm/block_manager.hpp: the window-level views of the facade (TensorRT-LLM's
// BlockManager and WindowBlockManager), declared here and defined in block_manager_inl.hpp
// once KVCacheManager is complete. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BLOCK_MANAGER_HPP
#define KVBLOCK_TRTLLM_BLOCK_MANAGER_HPP

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kvblock_trtllm/types.hpp"

namespace kvb::trtllm {

class KVCacheManager;

/// Window-level queries (TensorRT-LLM `BlockManager`, reached through getBlockManager()).
class BlockManager {
  public:
    using SizeType32 = kvb::trtllm::SizeType32;
    explicit BlockManager(KVCacheManager const& owner) : owner_(owner) {}
    // Counts over every window (TensorRT-LLM sums its window managers).
    [[nodiscard]] SizeType32 getNumFreeBlocks() const;
    [[nodiscard]] SizeType32 getNumAllocatedBlocks() const;
    [[nodiscard]] SizeType32 getMaxNumBlocks() const;
    [[nodiscard]] SizeType32 getNumPrimaryBlocks() const;
    [[nodiscard]] SizeType32 getTokensPerBlock() const;
    /// Elements of one layer's K (or V) in a block of pool `poolIdx` (heads x tokens x head
    /// size), as TensorRT-LLM counts it.
    [[nodiscard]] SizeType32 getBlockSize(SizeType32 poolIdx) const;
    /// Whether layers differ in their number of KV heads.
    [[nodiscard]] bool isVariableGQA() const;
    [[nodiscard]] bool isVariableWindow() const;
    [[nodiscard]] SizeType32 getFirstWindowSize() const;
    [[nodiscard]] SizeType32 getLastWindowSize() const;
    [[nodiscard]] std::map<SizeType32, SizeType32> getNumFreeBlocksPerWindowSize() const;
    [[nodiscard]] bool schedulingHasFreeBlocks(SizeType32 numRequired, SizeType32 windowSize) const;
    /// Moves the free, cached primary block `blockId` of `windowSize` to the host tier now
    /// (TensorRT-LLM `offloadBlock`): by id, with no transfer mode or directory (kvblock's host
    /// tier is the one destination; its disk tier fills from host evictions). False when it
    /// does not move (not cached, no free host block, no host tier); a block in use throws
    /// (KVB_STATUS_INVALID_ARGUMENT) and stays where it is.
    bool offloadBlock(BlockIdType blockId, SizeType32 windowSize) const;
    /// Brings the free, cached host block `blockId` of `windowSize` back to the GPU now
    /// (TensorRT-LLM `onboardBlock`): by id, with no sequence, transfer mode or directory (the
    /// GPU row is taken as an allocation takes one). False when it does not move (already on
    /// the GPU, nothing cached, no free GPU block); a block in use throws
    /// (KVB_STATUS_INVALID_ARGUMENT): kvblock onboards a sequence's blocks itself.
    bool onboardBlock(BlockIdType blockId, SizeType32 windowSize) const;
    /// Stores `blockIds` under `blockKeys` (one key a block, in order) in `windowSize`'s reuse
    /// tree (TensorRT-LLM `storeBlocks`): where the tree has a key the cached block is kept and
    /// the given one skipped, after the first miss each given block joins. Returns {blocks
    /// that joined, ids pinned along the path with `pinBlocks`} (release with
    /// KVCacheManager::unpinBlocksById(ids)). The keys' attributes (LoRA, salt, extra ids)
    /// are the first key's.
    std::pair<SizeType32, std::vector<BlockIdType>> storeBlocks(
        std::vector<BlockKey> const& blockKeys, std::vector<BlockIdType> const& blockIds,
        SizeType32 windowSize, bool pinBlocks = false) const;
    /// The block manager of one window (TensorRT-LLM `WindowBlockManager`): pinBlock/unpinBlock.
    [[nodiscard]] class WindowBlockManager getWindowBlockManager(SizeType32 windowSize) const;
    /// Pools; without block-scale pools: the data pools; without indexer K cache pools: not
    /// those (they are the last data pools).
    [[nodiscard]] SizeType32 getNumPools(bool includeBlockScalePools = true,
                                         bool includeIndexerKCachePools = true) const;
    /// The window of pool `poolIdx` (pools are ordered by window, then by shape).
    [[nodiscard]] SizeType32 getPoolWindowSize(SizeType32 poolIdx) const;
    /// The shape of every pool, block-scale pools last (kvblock's kvb_pool_info_t).
    [[nodiscard]] std::vector<kvb_pool_info_t> getPoolConfigurations() const;
    /// The pool of layer `layerIdx`.
    [[nodiscard]] SizeType32 getLayerPoolIdx(SizeType32 layerIdx) const;
    /// Pool `poolIdx` in GPU (primary) and host (secondary) memory.
    [[nodiscard]] PoolView getPrimaryPool(SizeType32 poolIdx) const;
    [[nodiscard]] PoolView getSecondaryPool(SizeType32 poolIdx) const;
    [[nodiscard]] std::map<SizeType32, WindowSizeMetadata> getWindowSizesMetadata() const;
    [[nodiscard]] SizeType32 getNumSecondaryBlocks() const;
    [[nodiscard]] SizeType32 getNumFreeSecondaryBlocks() const;
    [[nodiscard]] kvb_block_info_t getBlockById(BlockIdType blockId, SizeType32 windowSize) const;
    [[nodiscard]] std::optional<ReuseTreeMatch> findBlocksInReuseTreeByBlockKey(
        BlockKey const& blockKey, SizeType32 windowSize) const;
    /// The 2026 pinning overload: the matched GPU blocks are pinned and their ids appended to
    /// `pinnedBlockIds` (release with unpinBlocksById). Safe from a transceiver thread.
    [[nodiscard]] std::optional<ReuseTreeMatch> findBlocksInReuseTreeByBlockKey(
        BlockKey const& blockKey, SizeType32 windowSize,
        std::vector<BlockIdType>& pinnedBlockIds) const;
    /// Lookup from per-block keys: the keys are concatenated (the tree keys whole blocks).
    [[nodiscard]] std::optional<ReuseTreeMatch> findBlocksInReuseTreeByBlockKeys(
        std::vector<BlockKey> const& blockKeys, SizeType32 windowSize) const;
    /// TensorRT-LLM's queue check; kvblock checks every invariant of the manager. True when
    /// they hold (a broken invariant is reported, not thrown, as TensorRT-LLM reports it).
    [[nodiscard]] bool verifyQueueIntegrity(SizeType32 windowSize) const;
    /// The manager's getIterationStats (one interval for both).
    std::map<SizeType32, KvCacheIterationStats> getAndResetIterationStats() const;

  private:
    std::optional<ReuseTreeMatch> find(BlockKey const& key, SizeType32 windowSize, bool pin,
                                       std::vector<BlockIdType>* pinned) const;
    KVCacheManager const& owner_;
};

/// One window's block manager (TensorRT-LLM `WindowBlockManager`), for the calls a cache
/// transceiver makes on single blocks. A view: valid while its KVCacheManager lives.
class WindowBlockManager {
  public:
    WindowBlockManager(KVCacheManager const& owner, SizeType32 windowSize)
        : owner_(owner), windowSize_(windowSize) {}
    [[nodiscard]] SizeType32 getWindowSize() const { return windowSize_; }
    /// Pins a GPU block (TensorRT-LLM `pinBlock(BlockPtr)`, by id): it keeps its row and
    /// content until unpinned; a host block throws (KVB_STATUS_INVALID_ARGUMENT). Safe from a
    /// transceiver thread (every call takes the manager's lock).
    void pinBlock(BlockIdType blockId) const;
    /// Drops one pin (TensorRT-LLM `unpinBlock`); a block without a pin throws.
    void unpinBlock(BlockIdType blockId) const;

  private:
    KVCacheManager const& owner_;
    SizeType32 windowSize_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_BLOCK_MANAGER_HPP
