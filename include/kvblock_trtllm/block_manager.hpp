// kvblock_trtllm/block_manager.hpp: the window-level views of the facade (TensorRT-LLM's
// BlockManager and WindowBlockManager), declared here and defined in block_manager_inl.hpp
// once KVCacheManager is complete. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BLOCK_MANAGER_HPP
#define KVBLOCK_TRTLLM_BLOCK_MANAGER_HPP

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvblock_trtllm/block.hpp"
#include "kvblock_trtllm/buffer_manager.hpp"
#include "kvblock_trtllm/executor_types.hpp"
#include "kvblock_trtllm/tensor.hpp"
#include "kvblock_trtllm/types.hpp"

namespace kvb::trtllm {

class KVCacheManager;
class GenerationRequest;

/// What BlockManager::addSequenceBatch returns for each sequence (TensorRT-LLM's per-sequence
/// result): the prompt tokens whose KV the reused blocks already hold, and the request's block
/// counters of this admission (summed over windows).
struct AddSequenceResult {
    SizeType32 prepopulatedLen = 0;
    SizeType32 allocTotalBlocks = 0;
    SizeType32 allocNewBlocks = 0;
    SizeType32 reusedBlocks = 0;
    SizeType32 missedBlocks = 0;
};

/// TensorRT-LLM `BlockManager`, in two modes. A view: what KVCacheManager::getBlockManager()
/// returns (window-level queries on that manager). Owning: built by TensorRT-LLM's constructor,
/// it owns a KVCacheManager and drives it with GenerationRequest records its caller owns, as
/// TensorRT-LLM's tests and engines that use a BlockManager on its own do: each call that
/// changes a sequence writes the sequence's block ids back into the caller's GenerationRequest.
class BlockManager {
  public:
    using SizeType32 = kvb::trtllm::SizeType32;
    using BlocksPerWindow = std::map<SizeType32, std::tuple<SizeType32, SizeType32>>;

    /// The view of `owner` (what KVCacheManager holds).
    explicit BlockManager(KVCacheManager const& owner) : owner_(&owner) {}
    /// TensorRT-LLM's constructor: a BlockManager that owns its manager (a KVCacheManager made
    /// with the same arguments, block reuse on). `dtype` is TensorRT's `nvinfer1::DataType` (or
    /// kvb::trtllm::nvinfer1::DataType); `stream` the engine's shared stream object, kept alive.
    /// Differences: `maxNumSequences` is not a limit (kvblock bounds sequences by blocks);
    /// `sinkBubbleLength` must be 0; `onboardBlocks` false is not honoured (kvblock onboards
    /// the host blocks a prompt reuses); TensorRT-LLM's connector and transfer-agent arguments
    /// do not exist (the connector has the overload below). Pools are made by allocatePools()
    /// (or on first use).
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    BlockManager(std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
                 SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                 SizeType32 maxNumSequences, std::shared_ptr<Stream> stream,
                 SizeType32 maxSequenceLength, SizeType32 maxBeamWidth,
                 std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                 SizeType32 sinkBubbleLength, bool onboardBlocks,
                 CacheType cacheType = CacheType::kSELF,
                 std::optional<SizeType32> secondaryOffloadMinPriority = std::nullopt,
                 std::shared_ptr<KVCacheEventManager> eventManager = nullptr,
                 bool enablePartialReuse = true, bool copyOnPartialReuse = true,
                 KvblockOptions options = getDefaultKvblockOptions());
    /// The same with TensorRT-LLM's KV-cache connector (null: none): addSequenceBatch counts
    /// the prompt tokens it loads past the reused prefix in each sequence's prepopulated length,
    /// as KVCacheManager::addSequenceBatch does.
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    BlockManager(std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
                 SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                 SizeType32 maxNumSequences, std::shared_ptr<Stream> stream,
                 SizeType32 maxSequenceLength, SizeType32 maxBeamWidth,
                 std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                 SizeType32 sinkBubbleLength, bool onboardBlocks, CacheType cacheType,
                 std::optional<SizeType32> secondaryOffloadMinPriority,
                 std::shared_ptr<KVCacheEventManager> eventManager, bool enablePartialReuse,
                 bool copyOnPartialReuse,
                 std::shared_ptr<kv_connector::KvCacheConnectorManager> connector,
                 KvblockOptions options = getDefaultKvblockOptions());
    ~BlockManager();
    BlockManager(BlockManager const&) = delete;
    BlockManager& operator=(BlockManager const&) = delete;

    /// Whether this BlockManager owns its manager (TensorRT-LLM's constructor) or is a view.
    [[nodiscard]] bool isOwning() const { return owned_ != nullptr; }
    /// The KVCacheManager behind this BlockManager (the owned one, or the one viewed).
    [[nodiscard]] KVCacheManager const& getKVCacheManager() const { return *owner_; }

    // --- the owning mode's calls (TensorRT-LLM's BlockManager driven with GenerationRequests)
    /// Creates the pools (TensorRT-LLM `allocatePools(useUvm)`); unified memory throws.
    void allocatePools(bool useUvm = false);
    /// Frees the pools and forgets every sequence and cached block (TensorRT-LLM
    /// `releasePools`).
    void releasePools();
    /// Admits each sequence with its engine request (TensorRT-LLM `addSequenceBatch`): claims
    /// the batch's reusable blocks before allocating, then fills each caller's GenerationRequest
    /// with its block ids and updates the request's block counters; returns each sequence's
    /// prepopulated length (not written into the request: TensorRT-LLM's caller does that),
    /// which with a connector counts the tokens it loads past the reused prefix (bounded by
    /// the last prompt token; it is asked before anything changes).
    /// kvblock admits every window at once: the first call for a sequence admits it, a call
    /// for another `windowSize` with the same GenerationRequest returns the same result.
    /// `numContextBlocks` is what kvblock computes itself (checked, not used).
    /// `isEnableBlockReuse` false opts the call's requests out of reuse, as TensorRT-LLM's
    /// non-reuse path: they match no cached block, are never stored, and their beams share a
    /// last prompt block the prompt fills. A batch that does not fit throws
    /// (KVB_STATUS_OUT_OF_BLOCKS) and admits none; a live id throws
    /// (KVB_STATUS_DUPLICATE_REQUEST); both are std::runtime_error.
    std::vector<AddSequenceResult> addSequenceBatch(
        std::vector<GenerationRequest*> const& sequences,
        std::vector<SizeType32> const& inputLengths,
        std::vector<SizeType32> const& numContextBlocks,
        std::vector<std::reference_wrapper<LlmRequest>> const& llmRequests, SizeType32 windowSize,
        bool isEnableBlockReuse);
    /// Releases a sequence's blocks (TensorRT-LLM `releaseBlocks`); with the request (and reuse
    /// on at admission) its computed blocks are stored for reuse first, bounded by the
    /// request's context position as kvblock caches only computed KV (see
    /// KVCacheManager::removeSequence); with `pinBlocks` they stay allocated until
    /// KVCacheManager::unpinBlocksById. Empties the GenerationRequest's block ids. Returns the
    /// last block of beam 0 in the smallest window when stored or pinned.
    std::optional<BlockIdType> releaseBlocks(GenerationRequest& sequence,
                                             OptionalRef<LlmRequest const> llmRequest = nullptr,
                                             bool pinBlocks = false);
    /// Stores the context's computed blocks for reuse (TensorRT-LLM `storeContextBlocks`), up to
    /// the request's context position.
    void storeContextBlocks(GenerationRequest& sequence, LlmRequest const& llmRequest);
    /// TensorRT-LLM `onboardBlock(sequence, block, windowSize, mode, directory)`: brings a host
    /// block back to the GPU (see the by-id overload), then refreshes the sequence's block ids.
    /// With `GDS` or `POSIX_DEBUG_FALLBACK`, the files offloadBlock wrote in `directory`
    /// (`block_<id>_pool_<n>.bin`, one per pool of the window) are read into the block's host
    /// rows first, as TensorRT-LLM onboards from its files; a missing file leaves its row as it
    /// is, a file of another size throws (KVB_STATUS_INVALID_ARGUMENT) with nothing moved.
    bool onboardBlock(GenerationRequest& sequence, BlockPtr const& block, SizeType32 windowSize,
                      KvCacheTransferMode mode = KvCacheTransferMode::DRAM,
                      std::string const& directory = "");
    /// Each window's share of the KV memory (TensorRT-LLM's static
    /// `calculateWindowSizeToShare`): proportional to the window times its cache size per
    /// token (kvb_calculate_window_size_to_share); the layers of each window are not counted
    /// again (the cache size is already summed over them).
    [[nodiscard]] static std::map<SizeType32, float> calculateWindowSizeToShare(
        std::map<SizeType32, std::vector<SizeType32>> const& windowSizeToLayers,
        std::map<SizeType32, SizeType32> const& cacheSizePerTokenPerWindow);
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
    /// Moves the primary block `blockId` of `windowSize` to the host tier now (TensorRT-LLM
    /// `offloadBlock`): by id, with no transfer mode or directory (kvblock's host tier is the
    /// one destination; its disk tier fills from host evictions). A block sequences hold moves
    /// too and stays theirs; their offset tables are refused until onboardBlock brings it back
    /// (kvb_manager_offload_block). False when it does not move (a free block with nothing
    /// cached, no free host block, no host tier).
    bool offloadBlock(BlockIdType blockId, SizeType32 windowSize) const;
    /// TensorRT-LLM `offloadBlock(block, windowSize, mode, directory)`: the by-id call on the
    /// handle's block. With `GDS` or `POSIX_DEBUG_FALLBACK` the block's host rows are then also
    /// written to `directory` (one file per pool of the window, `block_<id>_pool_<n>.bin`, n
    /// counting the window's pools from 0), as TensorRT-LLM's file transfers name them; an
    /// empty directory throws (KVB_STATUS_INVALID_ARGUMENT).
    bool offloadBlock(BlockPtr const& block, SizeType32 windowSize,
                      KvCacheTransferMode mode = KvCacheTransferMode::DRAM,
                      std::string const& directory = "") const;
    /// Brings the host block `blockId` of `windowSize` back to the GPU now (TensorRT-LLM
    /// `onboardBlock`): by id, with no sequence, transfer mode or directory (the GPU row is
    /// taken as an allocation takes one): a free cached block, or a held one offloadBlock moved.
    /// False when it does not move (already on the GPU, nothing cached, no free GPU block); a
    /// block a suspension moved throws (KVB_STATUS_INVALID_ARGUMENT): it comes back on resume.
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
    /// Whether pool `poolIdx` holds block scales (an NVFP4 data pool's scale pool).
    [[nodiscard]] bool containsBlockScales(SizeType32 poolIdx) const;
    /// The window of pool `poolIdx` (pools are ordered by window, then by shape).
    [[nodiscard]] SizeType32 getPoolWindowSize(SizeType32 poolIdx) const;
    /// The shape of every pool, block-scale pools last (kvblock's kvb_pool_info_t).
    [[nodiscard]] std::vector<kvb_pool_info_t> getPoolConfigurations() const;
    /// The pool of layer `layerIdx`.
    [[nodiscard]] SizeType32 getLayerPoolIdx(SizeType32 layerIdx) const;
    /// Pool `poolIdx` in GPU (primary) memory as TensorRT-LLM hands it out: an ITensor
    /// `[blocks][layers][kvFactor][heads x tokens x head size]` of the manager's element type
    /// (bytes, kUINT8, where the pool's element is not the constructor's type: quantized and
    /// indexer pools, a byte-sized constructor), viewing kvblock's memory: valid while the pools
    /// live, null data with the bookkeeping-only backend. A block's row is
    /// `ITensor::slice(pool, block->getMemoryPoolBlockIndex(), 1)`.
    [[nodiscard]] ITensor::SharedPtr getPrimaryPool(SizeType32 poolIdx) const;
    /// The same pool in host (secondary) memory: the host tier's rows (no rows without one).
    [[nodiscard]] ITensor::SharedPtr getSecondaryPool(SizeType32 poolIdx) const;
    /// Pool `poolIdx` as kvblock's PoolView (base address and byte geometry), the facade's
    /// form before it had tensors.
    [[nodiscard]] PoolView getPrimaryPoolView(SizeType32 poolIdx) const;
    [[nodiscard]] PoolView getSecondaryPoolView(SizeType32 poolIdx) const;
    /// TensorRT-LLM `getBufferManager(windowSize)`: the buffer manager of a window, whose
    /// memoryPoolUsed() is the bytes of the window's primary pools (0 before allocatePools).
    /// The reference lives as long as the manager. An unknown window throws.
    [[nodiscard]] BufferManager const& getBufferManager(SizeType32 windowSize) const;
    [[nodiscard]] std::map<SizeType32, WindowSizeMetadata> getWindowSizesMetadata() const;
    [[nodiscard]] SizeType32 getNumSecondaryBlocks() const;
    [[nodiscard]] SizeType32 getNumFreeSecondaryBlocks() const;
    /// TensorRT-LLM `getBlockById`: a live handle on block `blockId` of `windowSize` (see
    /// KVCacheBlock); it converts to kvblock's kvb_block_info_t snapshot. An unknown block or
    /// window throws (KVB_STATUS_INVALID_ARGUMENT).
    [[nodiscard]] BlockPtr getBlockById(BlockIdType blockId, SizeType32 windowSize) const;
    /// The deepest block `blockKey` matches in `windowSize`'s reuse tree, whose getPrevBlock()
    /// chain walks to the root (TensorRT-LLM's `findBlocksInReuseTreeByBlockKey` shape); null
    /// when the key matches no whole block.
    [[nodiscard]] BlockPtr findBlockInReuseTreeByBlockKey(BlockKey const& blockKey,
                                                          SizeType32 windowSize) const;
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
    /// A host row of a block in one pool of its window, and the file the file transfer modes
    /// keep it in (see offloadBlock).
    struct FileRow {
        uint8_t* row;
        std::size_t bytes;
        std::string path;
    };
    /// The host rows of `block` (on the host tier) in each pool of `windowSize`.
    [[nodiscard]] std::vector<FileRow> fileRows(BlockPtr const& block, SizeType32 windowSize,
                                                std::string const& directory) const;
    KVCacheManager const& owner() const { return *owner_; }
    KVCacheManager& mutableOwner() const { return const_cast<KVCacheManager&>(*owner_); }
    /// Copies the manager's record of `sequence` (its block ids in every window) into the
    /// caller's GenerationRequest; a sequence the manager does not hold gets empty beams.
    void writeBack(GenerationRequest& sequence) const;
    /// Before a release stores a sequence: the tokens a request generated past its finished
    /// prefill, while it is still in the context state (see the definition).
    void syncGenerated(RequestIdType id, LlmRequest const& req) const;
    KVCacheManager const* owner_ = nullptr;
    std::unique_ptr<KVCacheManager> owned_;
    /// Admitted through addSequenceBatch: id -> (its GenerationRequest, the windows it was
    /// asked for, its result, whether reuse was on).
    struct Admitted {
        GenerationRequest const* sequence = nullptr;
        std::set<SizeType32> windows;
        AddSequenceResult result;
        bool reuse = true;
    };
    std::map<RequestIdType, Admitted> admitted_;
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
