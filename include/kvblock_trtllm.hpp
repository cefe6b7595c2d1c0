// kvblock_trtllm.hpp: TensorRT-LLM's 2026 KVCacheManager surface over kvblock (header-only).
//
// kvb::trtllm::KVCacheManager has the names, argument orders, argument kinds and return shapes
// of TensorRT-LLM's `batch_manager::kv_cache_manager::KVCacheManager`, so an engine's call
// sites port by changing the namespace. Where kvblock's own API (kvblock.hpp, kvblock.h) means
// something else under the same name, this facade gives TensorRT-LLM's meaning:
//  - addToken(id) reserves one KV slot without a token; getTokenCount counts reserved slots.
//    The token ids arrive later, from the engine's request, whenever the facade is handed it
//    (storeContextBlocks, storeNewBlock, storeBlocksForReuse, removeSequence,
//    commitAndGetBlockHashesForRequest, syncTokens); kvblock keeps token content to store
//    blocks for reuse without calling back into the engine.
//  - removeSequence of an unknown id does nothing; a given request means "store for reuse".
//  - getPriorityByBlockId(blockId, windowSize), unpinBlocksById(ids), getCacheBlockIds ->
//    [beam][block], getBlockOffsetsOfBatch(output, firstBatchSlotIdx, batchSize, beamWidth).
//  - maxSequenceLength includes the extra KV tokens and draft tokens, as the executor passes it.
// The engine's request is abstracted as kvb::trtllm::LlmRequest (what the manager reads from
// TensorRT-LLM's LlmRequest and writes back into it). README.md ("Porting from TensorRT-LLM")
// lists every difference that remains.
#ifndef KVBLOCK_TRTLLM_HPP
#define KVBLOCK_TRTLLM_HPP

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "kvblock.hpp"

namespace kvb::trtllm {

using SizeType32 = int32_t;
using SizeType64 = int64_t;
using TokenIdType = int32_t;
using TokenExtraIdType = uint64_t;
using RequestIdType = uint64_t;
using BlockIdType = int32_t;
using VecTokens = std::vector<TokenIdType>;

/// A token with its extra id (TensorRT-LLM `UniqueToken`).
struct UniqueToken {
    TokenIdType tokenId = 0;
    TokenExtraIdType tokenExtraId = 0;
};
using VecUniqueTokens = std::vector<UniqueToken>;

/// Cache types of TensorRT-LLM, each a kvblock cache type of every layer (kvb_cache_type_t):
/// kSELF K and V, kCROSS the encoder's K and V (a manager of its own, reuse off), kSELFKONLY
/// one K row per token (MLA's latent).
enum class CacheType { kSELF = 0, kCROSS = 1, kSELFKONLY = 2 };

/// `std::nullopt`-or-reference argument (TensorRT-LLM `common::OptionalRef`).
template <typename T>
class OptionalRef {
  public:
    OptionalRef() = default;
    OptionalRef(std::nullopt_t) {}
    OptionalRef(std::nullptr_t) {}
    OptionalRef(T& ref) : ptr_(&ref) {}
    template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
    OptionalRef(U& ref) : ptr_(&ref) {}
    explicit operator bool() const noexcept { return ptr_ != nullptr; }
    bool has_value() const noexcept { return ptr_ != nullptr; }
    T& operator*() const { return *ptr_; }
    T* operator->() const { return ptr_; }

  private:
    T* ptr_ = nullptr;
};

/// What the manager reads from an engine's request and writes back into it (the parts of
/// TensorRT-LLM's `LlmRequest` its KVCacheManager touches). An engine adapts its own request
/// type by overriding these; kvb::trtllm::Request is a plain implementation.
class LlmRequest {
  public:
    virtual ~LlmRequest() = default;

    // Read by admission, lookups and stores.
    virtual RequestIdType getRequestId() const = 0;
    /// Tokens of beam `beam`: prompt, then generated tokens.
    virtual VecTokens const& getTokens(SizeType32 beam) const = 0;
    virtual SizeType32 getPromptLen() const = 0;
    /// Prompt tokens whose KV is computed (after each context chunk).
    virtual SizeType32 getContextCurrentPosition() const = 0;
    /// Extra id per token (multimodal / prompt-tuning tokens), or none.
    virtual std::optional<std::vector<TokenExtraIdType>> getTokenExtraIds() const {
        return std::nullopt;
    }
    virtual std::optional<uint64_t> getLoraTaskId() const { return std::nullopt; }
    virtual std::optional<uint64_t> getCacheSaltID() const { return std::nullopt; }
    /// Multimodal items (content digest, position, length) that key the blocks they cover.
    virtual std::vector<kvb_multimodal_item_t> getMultimodalItems() const { return {}; }

    // Read by the scheduler's estimates.
    virtual bool isContextInitState() const = 0;
    virtual bool isFirstContextChunk() const { return getContextCurrentPosition() == 0; }
    virtual bool isGenerationInProgressState() const = 0;
    /// Whether the whole prompt's KV is computed (read by copyLinearAttentionBlock).
    virtual bool isContextFinished() const { return !isContextInitState(); }
    virtual SizeType32 getBeamWidth() const { return 1; }
    virtual SizeType32 getContextChunkSize() const { return getPromptLen(); }
    virtual SizeType32 getNumDraftTokens() const { return 0; }
    virtual SizeType32 getMaxNewTokens() const = 0;
    virtual SizeType32 getNumGeneratedTokens() const {
        return static_cast<SizeType32>(getTokens(0).size()) - getPromptLen();
    }

    // Written by addSequenceBatch.
    virtual void setPrepopulatedPromptLen(SizeType32 prepopulatedPromptLen,
                                          SizeType32 kvTokensPerBlock) = 0;
    virtual void updateAllocTotalBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateAllocNewBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateReusedBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateMissedBlocksPerRequest(SizeType32 n) = 0;
};

/// A plain LlmRequest: fields the engine fills, fields the manager writes.
struct Request : LlmRequest {
    RequestIdType requestId = 0;
    std::vector<VecTokens> tokens{VecTokens{}};  // per beam
    SizeType32 promptLen = 0;
    SizeType32 contextCurrentPosition = 0;
    std::optional<std::vector<TokenExtraIdType>> tokenExtraIds;
    std::optional<uint64_t> loraTaskId;
    std::optional<uint64_t> cacheSaltId;
    std::vector<kvb_multimodal_item_t> multimodalItems;
    bool contextInit = true;
    bool generationInProgress = false;
    SizeType32 contextChunkSize = 0;  // 0: the whole prompt
    SizeType32 numDraftTokens = 0;
    SizeType32 maxNewTokens = 0;
    // Written by the manager.
    SizeType32 prepopulatedPromptLen = 0;
    SizeType32 allocTotalBlocks = 0;
    SizeType32 allocNewBlocks = 0;
    SizeType32 reusedBlocks = 0;
    SizeType32 missedBlocks = 0;

    Request() = default;
    Request(RequestIdType id, VecTokens prompt, SizeType32 maxNew = 0)
        : requestId(id), tokens{std::move(prompt)}, maxNewTokens(maxNew) {
        promptLen = static_cast<SizeType32>(tokens[0].size());
    }
    /// Appends a generated token to every beam.
    void addNewToken(TokenIdType token) {
        for (auto& beam : tokens) beam.push_back(token);
    }

    RequestIdType getRequestId() const override { return requestId; }
    VecTokens const& getTokens(SizeType32 beam) const override {
        return tokens.at(static_cast<size_t>(beam));
    }
    SizeType32 getPromptLen() const override { return promptLen; }
    SizeType32 getContextCurrentPosition() const override { return contextCurrentPosition; }
    std::optional<std::vector<TokenExtraIdType>> getTokenExtraIds() const override {
        return tokenExtraIds;
    }
    std::optional<uint64_t> getLoraTaskId() const override { return loraTaskId; }
    std::optional<uint64_t> getCacheSaltID() const override { return cacheSaltId; }
    std::vector<kvb_multimodal_item_t> getMultimodalItems() const override {
        return multimodalItems;
    }
    bool isContextInitState() const override { return contextInit; }
    bool isGenerationInProgressState() const override { return generationInProgress; }
    SizeType32 getContextChunkSize() const override {
        return contextChunkSize > 0 ? contextChunkSize : promptLen;
    }
    SizeType32 getNumDraftTokens() const override { return numDraftTokens; }
    SizeType32 getMaxNewTokens() const override { return maxNewTokens; }
    void setPrepopulatedPromptLen(SizeType32 len, SizeType32) override {
        prepopulatedPromptLen = len;
    }
    void updateAllocTotalBlocksPerRequest(SizeType32 n) override { allocTotalBlocks += n; }
    void updateAllocNewBlocksPerRequest(SizeType32 n) override { allocNewBlocks += n; }
    void updateReusedBlocksPerRequest(SizeType32 n) override { reusedBlocks += n; }
    void updateMissedBlocksPerRequest(SizeType32 n) override { missedBlocks += n; }
};

/// TensorRT-LLM `KvCacheStats`. Plain writable fields: the executor adjusts some of them.
struct KvCacheStats {
    SizeType32 maxNumBlocks = 0;
    SizeType32 freeNumBlocks = 0;
    SizeType32 usedNumBlocks = 0;
    SizeType32 toksPerBlock = 0;
    SizeType32 allocTotalBlocks = 0;
    SizeType32 allocNewBlocks = 0;
    SizeType32 reusedBlocks = 0;
    SizeType32 missedBlocks = 0;
    float cacheHitRate = 0.0f;
    std::map<SizeType32, SizeType32> numFreeBlocksPerWindowSize;
    std::size_t allocatedBytes = 0;
};

/// TensorRT-LLM `KvCacheIterationStats` for one window: gauges at the call, `iter*` counts
/// since the previous getIterationStats.
struct KvCacheIterationStats {
    SizeType32 primaryMaxNumBlocks = 0;
    SizeType32 primaryFreeNumBlocks = 0;
    SizeType32 primaryUsedNumBlocks = 0;
    SizeType32 primaryPeakUsedNumBlocks = 0;
    SizeType32 primaryEvictableNumBlocks = 0;
    SizeType32 secondaryMaxNumBlocks = 0;
    SizeType32 secondaryFreeNumBlocks = 0;
    SizeType32 secondaryEvictableNumBlocks = 0;
    SizeType32 iterAllocTotalBlocks = 0;
    SizeType32 iterAllocNewBlocks = 0;
    SizeType32 iterReusedBlocks = 0;
    SizeType32 iterMissedBlocks = 0;
    float iterCacheHitRate = 0.0f;
    SizeType32 iterOnboardBlocks = 0;
    SizeType64 iterOnboardBytes = 0;
    SizeType32 iterOffloadBlocks = 0;
    SizeType64 iterOffloadBytes = 0;
    SizeType32 iterEvictedBlocks = 0;
};

/// TensorRT-LLM `PrefixReuseSummary`: one tree walk's result, reusable by the estimates.
struct PrefixReuseSummary {
    SizeType32 reusableBlocksAllocated = 0;
    SizeType32 reusableBlocksAll = 0;
    /// Index of the first prompt block the tree does not supply (TensorRT-LLM keeps its key).
    std::optional<SizeType32> firstNewBlock;
};

/// TensorRT-LLM `OffsetTableDimensions`.
struct OffsetTableDimensions {
    SizeType32 maxBlocksPerSeq = 0;
    SizeType32 numPools = 0;
    CacheType cacheType = CacheType::kSELF;
};

/// Stand-in for the `runtime::ITensor` of the block offsets: int32 entries laid out
/// `[numPools][numSlots][2][maxBlocksPerSeq]`, as TensorRT-LLM's kernels read them.
struct BlockOffsetsTensor {
    std::vector<int32_t> data;
    SizeType32 numSlots = 0;
};

/// The key a reuse-tree lookup walks (TensorRT-LLM `BlockKey` over a whole token range).
struct BlockKey {
    VecUniqueTokens uniqueTokens;
    bool usesExtraIds = false;
    std::optional<uint64_t> loraTaskId;
    std::optional<uint64_t> cacheSaltID;
    std::vector<kvb_multimodal_item_t> multimodalItems;
};

/// What a reuse-tree lookup matched: block ids root first (TensorRT-LLM returns the deepest
/// block, whose parents are the same chain).
struct ReuseTreeMatch {
    std::vector<BlockIdType> blockIds;
    BlockIdType lastBlockId() const { return blockIds.back(); }
};

/// What calculateFreeMemBytes reads from TensorRT-LLM's `runtime::BufferManager`: the device
/// of its stream and the free bytes of its stream-ordered memory pool (`memoryPoolFree()`).
struct BufferManager {
    SizeType32 device = 0;
    uint64_t memoryPoolFree = 0;
};

/// What calculateFreeMemBytes reads from TensorRT-LLM's `executor::KvCacheConfig`.
struct KvCacheConfig {
    /// Share of the free GPU memory the KV cache takes; TensorRT-LLM's default is 0.9.
    std::optional<float> freeGpuMemoryFraction;
    /// Bytes of the host (secondary) tier.
    std::optional<uint64_t> hostCacheSize;
};

/// TensorRT-LLM's `KVCacheEventManager` arguments, which kvblock takes in its config.
struct KVCacheEventManager {
    SizeType32 maxKVEventEntries = 0;
    std::optional<SizeType32> attentionDpRank;
};

/// kvblock settings TensorRT-LLM's constructor has no argument for.
struct KvblockOptions {
    /// Of the executor's maxSequenceLength: KV slots for extra tokens (e.g. Eagle) and drafts.
    SizeType32 numExtraKvTokens = 0;
    SizeType32 maxDraftTokens = 0;
    kvb_copy_backend_t copyBackend = KVB_COPY_BACKEND_NONE;
    bool manualClock = false;
    /// Element type of every layer (TensorRT-LLM's `DataType`): DEFAULT takes `dtypeBytes`;
    /// FP8/INT8/NVFP4 quantize the cache (NVFP4 adds a block-scale pool per data pool).
    kvb_kv_data_type_t kvDataType = KVB_KV_DATA_TYPE_DEFAULT;
    /// TensorRT-LLM's indexer K cache (DeepSeek-V3.2's sparse attention), its constructor
    /// arguments: a K-only row per token and layer of `indexerKCacheIndexHeadDim` FP8 elements
    /// and one FP32 scale per `indexerKCacheQuantBlockSize` of them; with `indexerKCacheUseFp4`,
    /// NVFP4 elements with kvblock's FP8 block scales (one per 16 elements: the quant block
    /// size must be 16). `indexerKCacheLayerMask[l]` false leaves layer l without one (empty:
    /// every layer has one). kvblock keeps it in `KVB_CACHE_TYPE_INDEXER_K` pools after the KV
    /// pools, whose indices do not change.
    bool enableIndexerKCache = false;
    SizeType32 indexerKCacheQuantBlockSize = 128;
    SizeType32 indexerKCacheIndexHeadDim = 0;
    bool indexerKCacheUseFp4 = false;
    std::vector<bool> indexerKCacheLayerMask;
};

/// Stand-in for a pool's `runtime::ITensor`: its base address at one cache level and its shape
/// `[numBlocks][numLayers][kvFactor][bytesPerField]` (a block's row is `rowBytes`).
struct PoolView {
    uint8_t* data = nullptr;  // null where the pool has no memory at this level
    SizeType32 poolIdx = 0;
    SizeType32 windowSize = 0;
    SizeType64 numBlocks = 0;
    SizeType32 numLayers = 0;
    SizeType32 kvFactor = 0;
    /// Bytes of one layer's K (or V) in a block: heads x tokens x bytes per head and token.
    SizeType64 bytesPerField = 0;
    SizeType64 rowBytes = 0;
};

/// TensorRT-LLM `WindowSizeMetadata`: one window's blocks, pools and sequence limits.
struct WindowSizeMetadata {
    SizeType32 allottedPrimaryBlocks = 0;
    SizeType32 allottedSecondaryBlocks = 0;
    /// Index of the window's first data pool.
    SizeType32 absolutePoolsOffset = 0;
    /// Data pools of the window.
    SizeType32 numPools = 0;
    SizeType32 maxTokenNum = 0;
    SizeType32 maxBlocksPerSeq = 0;
    SizeType32 maxNumBlocks = 0;
    /// kvblock has no temporary attention window (chunked context over a sliding window): 0.
    SizeType32 temporaryAttentionWindow = 0;
    SizeType32 windowSize = 0;
    bool isSWA = false;
};

class KVCacheManager;

/// Window-level queries (TensorRT-LLM `BlockManager`, reached through getBlockManager()).
class BlockManager {
  public:
    explicit BlockManager(KVCacheManager const& owner) : owner_(owner) {}
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
    /// TensorRT-LLM's queue check; kvblock checks every invariant of the manager.
    void verifyQueueIntegrity(SizeType32 windowSize) const;
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

/// TensorRT-LLM's 2026 KVCacheManager over kvblock.
class KVCacheManager {
  public:
    /// Primary and secondary blocks per window size.
    using BlocksPerWindow = std::map<SizeType32, std::tuple<SizeType32, SizeType32>>;

    /// TensorRT-LLM's constructor. `dtypeBytes` stands for `DataType` (bytes per element);
    /// layer l attends over `maxAttentionWindowVec[l % size]` with `numKvHeadsPerLayer[l]` heads
    /// and `cacheType`; layers are grouped into pools by window and shape as TensorRT-LLM groups
    /// them (kvblock's pool model, `kvb_layer_spec_t`). `sinkTokenLength` must be 0. Pools are
    /// made by allocatePools().
    KVCacheManager(std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
                   SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                   SizeType32 maxNumSequences, SizeType32 maxBeamWidth,
                   std::vector<SizeType32> const& maxAttentionWindowVec, SizeType32 dtypeBytes,
                   SizeType32 sinkTokenLength, void* stream, SizeType32 maxSequenceLength,
                   SizeType32 chunkSize = 0, bool enableBlockReuse = false,
                   CacheType cacheType = CacheType::kSELF,
                   std::optional<SizeType32> secondaryOffloadMinPriority = std::nullopt,
                   std::shared_ptr<KVCacheEventManager> eventManager = nullptr,
                   bool enablePartialReuse = true, bool copyOnPartialReuse = true,
                   KvblockOptions const& options = {})
        : enableBlockReuse_(enableBlockReuse),
          enablePartialReuse_(enablePartialReuse),
          cacheType_(cacheType) {
        (void)maxNumSequences;  // kvblock bounds sequences by blocks only
        (void)chunkSize;        // the estimates take each request's chunk size
        if (sinkTokenLength != 0)
            throw Error(KVB_STATUS_UNSUPPORTED, "sink tokens are not supported");
        if (maxAttentionWindowVec.empty() || numKvHeadsPerLayer.empty())
            throw Error(KVB_STATUS_INVALID_CONFIG, "no layers or no attention windows");
        for (auto const& [window, blocks] : blocksPerWindow)
            config_.addWindow(window, std::get<0>(blocks), std::get<1>(blocks));
        config_.layers = layerSpecs(numKvHeadsPerLayer, sizePerHead, maxAttentionWindowVec,
                                    cacheType, options.kvDataType);
        numModelLayers_ = static_cast<SizeType32>(numKvHeadsPerLayer.size());
        if (options.enableIndexerKCache) addIndexerLayers(options, maxAttentionWindowVec);
        auto& raw = config_.raw;
        raw.tokens_per_block = tokensPerBlock;
        raw.max_beam_width = maxBeamWidth;
        raw.max_sequence_length =
            maxSequenceLength - options.numExtraKvTokens - options.maxDraftTokens;
        raw.num_extra_kv_tokens = options.numExtraKvTokens;
        raw.max_draft_tokens = options.maxDraftTokens;
        raw.enable_block_reuse = enableBlockReuse;
        raw.enable_partial_reuse = enablePartialReuse;
        raw.copy_on_partial_reuse = copyOnPartialReuse;
        if (secondaryOffloadMinPriority)
            raw.secondary_offload_min_priority = *secondaryOffloadMinPriority;
        raw.bytes_per_element = dtypeBytes;
        raw.copy_backend = options.copyBackend;
        raw.manual_clock = options.manualClock;
        raw.cuda_stream = stream;
        if (eventManager) {
            raw.max_kv_event_entries = eventManager->maxKVEventEntries;
            raw.attention_dp_rank = eventManager->attentionDpRank.value_or(-1);
        }
        collectWindows();
    }

    /// From kvblock's own configuration (an engine already configured for kvblock).
    explicit KVCacheManager(Config config)
        : config_(std::move(config)),
          enableBlockReuse_(config_.raw.enable_block_reuse),
          enablePartialReuse_(config_.raw.enable_partial_reuse) {
        auto all = [&](kvb_cache_type_t t) {
            return !config_.layers.empty() &&
                   std::all_of(config_.layers.begin(), config_.layers.end(),
                               [t](kvb_layer_spec_t const& l) { return l.cache_type == t; });
        };
        if (all(KVB_CACHE_TYPE_CROSS)) cacheType_ = CacheType::kCROSS;
        if (all(KVB_CACHE_TYPE_SELF_K_ONLY)) cacheType_ = CacheType::kSELFKONLY;
        collectWindows();
    }

    KVCacheManager(KVCacheManager const&) = delete;
    KVCacheManager& operator=(KVCacheManager const&) = delete;

    /// Creates the manager and its pools (TensorRT-LLM allocates the pool tensors here).
    void allocatePools(bool useUvm = false) {
        if (useUvm) throw Error(KVB_STATUS_UNSUPPORTED, "unified memory pools");
        if (!manager_) manager_.emplace(config_);
    }
    /// Frees the pools and forgets every sequence and cached block.
    void releasePools() {
        manager_.reset();
        std::lock_guard<std::mutex> lock(pinMutex_);
        pinGroups_.clear();
    }

    /// kvblock's own API on the same manager (e.g. kvblock's token-carrying addToken).
    [[nodiscard]] Manager& impl() const {
        if (!manager_) throw Error(KVB_STATUS_INVALID_ARGUMENT, "call allocatePools() first");
        return *manager_;
    }

    // --- sizes and counters -------------------------------------------------------------
    [[nodiscard]] SizeType32 getTokensPerBlock() const { return config_.raw.tokens_per_block; }
    [[nodiscard]] SizeType32 getMaxNumBlocks() const { return getKvCacheStats().maxNumBlocks; }
    [[nodiscard]] SizeType32 getUsedNumBlocks() const { return getKvCacheStats().usedNumBlocks; }
    [[nodiscard]] SizeType32 getNumFreeBlocks() const {
        return static_cast<SizeType32>(impl().getNumFreeBlocks());
    }
    [[nodiscard]] SizeType32 getNumPools() const {
        return impl().getOffsetTableDimensions().second;
    }
    [[nodiscard]] SizeType32 getNumAllocTotalBlocks() const {
        return getKvCacheStats().allocTotalBlocks;
    }
    [[nodiscard]] SizeType32 getNumAllocNewBlocks() const {
        return getKvCacheStats().allocNewBlocks;
    }
    [[nodiscard]] SizeType32 getNumReusedBlocks() const { return getKvCacheStats().reusedBlocks; }
    [[nodiscard]] SizeType32 getNumMissedBlocks() const { return getKvCacheStats().missedBlocks; }
    [[nodiscard]] std::map<SizeType32, SizeType32> getNumFreeBlocksPerWindowSize() const {
        std::map<SizeType32, SizeType32> out;
        for (SizeType32 w : windows_)
            out[w] = static_cast<SizeType32>(impl().getNumFreeBlocksPerWindowSize(w).first);
        return out;
    }
    [[nodiscard]] KvCacheStats getKvCacheStats() const {
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
    /// Per window size: the statistics since the previous call (the first: since creation).
    std::map<SizeType32, KvCacheIterationStats> getIterationStats() {
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
    [[nodiscard]] OffsetTableDimensions getOffsetTableDimensions() const {
        auto [blocks, pools] = impl().getOffsetTableDimensions();
        return {blocks, pools, cacheType_};
    }
    [[nodiscard]] SizeType32 getMaxBlocksPerSeq() const {
        return getOffsetTableDimensions().maxBlocksPerSeq;
    }

    // --- configuration queries -----------------------------------------------------------
    [[nodiscard]] bool isEnableBlockReuse() const { return enableBlockReuse_; }
    [[nodiscard]] bool isEnablePartialReuse() const { return enablePartialReuse_; }
    [[nodiscard]] bool isCrossKv() const { return cacheType_ == CacheType::kCROSS; }
    [[nodiscard]] CacheType getCacheType() const { return cacheType_; }
    [[nodiscard]] bool isVariableWindow() const { return windows_.size() > 1; }
    [[nodiscard]] std::vector<SizeType32> const& getWindowSizes() const { return windows_; }
    [[nodiscard]] BlockManager const& getBlockManager() const { return blockManager_; }

    // --- pools (kvblock's pool model) ------------------------------------------------------
    /// [data pool][primary, secondary] base addresses (TensorRT-LLM's `[numPools, 2]` tensor);
    /// null where a pool has no memory at that level (no host tier, or an unregistered CUDA
    /// pool).
    [[nodiscard]] std::vector<std::array<void*, 2>> getBlockPoolPointers() const {
        SizeType32 n = getBlockManager().getNumPools(false);
        std::vector<std::array<void*, 2>> out(static_cast<size_t>(n));
        for (SizeType32 p = 0; p < n; ++p)
            out[static_cast<size_t>(p)] = {poolBase(p, KVB_CACHE_LEVEL_PRIMARY),
                                           poolBase(p, KVB_CACHE_LEVEL_SECONDARY)};
        return out;
    }
    /// [data pool][primary, secondary] addresses of each data pool's block-scale pool (NVFP4),
    /// null where the pool has none.
    [[nodiscard]] std::vector<std::array<void*, 2>> getBlockScalePoolPointers() const {
        auto primary = impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY);
        auto secondary = impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_SECONDARY);
        std::vector<std::array<void*, 2>> out(primary.size());
        for (size_t p = 0; p < out.size(); ++p)
            out[p] = {primary[p], p < secondary.size() ? secondary[p] : nullptr};
        return out;
    }
    /// [layer][pool, index of the layer in its pool] (TensorRT-LLM's `[numLayers, 2]` tensor).
    [[nodiscard]] std::vector<std::array<SizeType32, 2>> getLayerToPoolMapping() const {
        std::vector<std::array<SizeType32, 2>> out;
        for (auto const& [pool, index] : impl().getLayerToPoolMapping()) {
            if (numModelLayers_ && out.size() == static_cast<size_t>(numModelLayers_))
                break;  // the indexer's layers come after the model's
            out.push_back({pool, index});
        }
        return out;
    }

    // --- the indexer K cache (DeepSeek-V3.2 sparse attention) ----------------------------
    [[nodiscard]] bool isEnableIndexerKCache() const { return indexer_.enabled; }
    [[nodiscard]] SizeType32 getIndexerKCacheIndexHeadDim() const { return indexer_.headDim; }
    [[nodiscard]] SizeType32 getIndexerKCacheQuantBlockSize() const {
        return indexer_.quantBlockSize;
    }
    [[nodiscard]] bool getIndexerKCacheUseFp4() const { return indexer_.useFp4; }
    /// The indexer K cache pool in GPU memory: a K-only pool `[blocks][layers with an
    /// indexer][1][tokens x bytes per token]` (FP8 elements then their FP32 scales per token;
    /// with FP4, the NVFP4 elements, their scales in the pool's block-scale pool). With several
    /// attention windows each has its own; this is the first (TensorRT-LLM has one). Throws
    /// KVB_STATUS_UNSUPPORTED without an indexer.
    [[nodiscard]] PoolView getIndexerKCachePool() const {
        SizeType32 n = impl().getNumPools(false);
        for (SizeType32 p = 0; p < n; ++p)
            if (impl().getPoolInfo(p).cache_type == KVB_CACHE_TYPE_INDEXER_K)
                return getBlockManager().getPrimaryPool(p);
        throw Error(KVB_STATUS_UNSUPPORTED, "this manager has no indexer K cache");
    }
    /// The index of layer `layerIdx` in its pool.
    [[nodiscard]] SizeType32 getPoolLayerIdx(SizeType32 layerIdx) const {
        return getLayerToPoolMapping().at(static_cast<size_t>(layerIdx))[1];
    }
    /// Whether layer `layerIdx` is the first layer of its pool.
    [[nodiscard]] bool isPoolLayerFirst(SizeType32 layerIdx) const {
        return getPoolLayerIdx(layerIdx) == 0;
    }
    /// The primary pool when there is exactly one data pool (throws otherwise).
    [[nodiscard]] PoolView getUniquePrimaryPool() const {
        if (getBlockManager().getNumPools(false) != 1)
            throw Error(KVB_STATUS_UNSUPPORTED, "getUniquePrimaryPool needs exactly one pool");
        return getBlockManager().getPrimaryPool(0);
    }
    /// The primary pool holding layer `layerIdx`.
    [[nodiscard]] PoolView getPrimaryPool(SizeType32 layerIdx) const {
        return getBlockManager().getPrimaryPool(getBlockManager().getLayerPoolIdx(layerIdx));
    }

    // --- admission -----------------------------------------------------------------------
    /// Admits every request (id, input length, beam width) with its engine request, claiming
    /// every reusable block of the batch before allocating; writes the prepopulated prompt
    /// length and the per-request block counts into each request. All or nothing: a batch
    /// that does not fit throws (KVB_STATUS_OUT_OF_BLOCKS) and admits none.
    void addSequenceBatch(
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
        auto admissions = impl().addSequenceBatch(batch);
        for (size_t i = 0; i < admissions.size(); ++i) {
            LlmRequest& req = llmRequests[i].get();
            auto const& a = admissions[i];
            req.setPrepopulatedPromptLen(a.prepopulated_prompt_len, getTokensPerBlock());
            req.updateAllocTotalBlocksPerRequest(
                static_cast<SizeType32>(a.stats.alloc_total_blocks));
            req.updateAllocNewBlocksPerRequest(static_cast<SizeType32>(a.stats.alloc_new_blocks));
            req.updateReusedBlocksPerRequest(static_cast<SizeType32>(a.stats.reused_blocks));
            req.updateMissedBlocksPerRequest(static_cast<SizeType32>(a.stats.missed_blocks));
        }
    }

    // --- tokens --------------------------------------------------------------------------
    /// Grows a sequence by one KV slot (a decode step's token, an extra KV token, a draft
    /// token), allocating a block at a block boundary. The slot's token id comes later from
    /// the request (see the file comment). Throws KVB_STATUS_OUT_OF_BLOCKS when no block is
    /// left, KVB_STATUS_UNSUPPORTED with beam search.
    void addToken(RequestIdType requestId) {
        auto l = impl().getSequenceLengths(requestId);
        if (!impl().resize(requestId, l.capacity + 1))
            throw Error(KVB_STATUS_OUT_OF_BLOCKS, "no free block for the new slot");
    }
    /// KV slots of a sequence: its tokens plus the slots addToken reserved.
    [[nodiscard]] SizeType32 getTokenCount(RequestIdType requestId) const {
        return static_cast<SizeType32>(impl().getSequenceLengths(requestId).capacity);
    }
    /// Drops the last `numTokens` slots (rejected drafts): reserved slots first, then tokens.
    void rewindKVCache(RequestIdType requestId, SizeType32 numTokens) {
        auto l = impl().getSequenceLengths(requestId);
        size_t reserved = l.capacity - std::min(l.capacity, l.num_tokens);
        size_t n = static_cast<size_t>(numTokens);
        if (n <= reserved) {
            if (n > 0) impl().resize(requestId, l.capacity - n);
        } else {
            impl().rewindKVCache(requestId, static_cast<int32_t>(n - reserved));
        }
    }
    void removeToken(RequestIdType requestId) { rewindKVCache(requestId, 1); }
    /// Gives the manager the request's token ids for the slots it has reserved (kvblock keeps
    /// block content); with `storeNewBlocks`, each block a token completes is stored for reuse.
    void syncTokens(LlmRequest const& llmRequest, bool storeNewBlocks = false) {
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
    }

    // --- store, release, pins ------------------------------------------------------------
    void storeContextBlocks(LlmRequest const& llmRequest) {
        impl().storeContextBlocks(llmRequest.getRequestId(),
                                  llmRequest.getContextCurrentPosition());
    }
    void storeNewBlock(LlmRequest const& llmRequest) {
        syncTokens(llmRequest, /*storeNewBlocks*/ true);
        impl().storeNewBlock(llmRequest.getRequestId());
    }
    /// Stores every computed token for reuse; with `pinBlocks`, pins the sequence's blocks in
    /// every window and returns those of the smallest window (beam 0) for unpinBlocksById.
    std::vector<BlockIdType> storeBlocksForReuse(RequestIdType requestId,
                                                 OptionalRef<LlmRequest const> llmRequest,
                                                 bool pinBlocks = false) {
        if (llmRequest) syncTokens(*llmRequest);
        impl().storeBlocksForReuse(requestId, false);
        if (!pinBlocks) return {};
        return pinSequence(requestId);
    }
    /// Releases a sequence; stores it for reuse when the request is given (and reuse is on);
    /// with `pinOnRelease` its blocks stay allocated until unpinBlocksById. Returns the last
    /// block of beam 0 in the smallest window when the sequence was stored or pinned. An
    /// unknown id does nothing.
    std::optional<BlockIdType> removeSequence(RequestIdType requestId,
                                              OptionalRef<LlmRequest const> llmRequest = nullptr,
                                              bool pinOnRelease = false) {
        if (!hasSequence(requestId)) return std::nullopt;
        if (llmRequest) syncTokens(*llmRequest);
        std::optional<BlockIdType> last;
        if (llmRequest || pinOnRelease) last = impl().getLastBlockId(requestId);
        if (pinOnRelease) pinSequence(requestId);
        impl().removeSequence(requestId, llmRequest.has_value() && enableBlockReuse_);
        return last;
    }
    void pinBlocks(RequestIdType requestId) { pinSequence(requestId); }
    /// Drops the pins of a group of blocks pinned through this facade (by its ids in the
    /// smallest window, as storeBlocksForReuse returned them, or ids pinned by a reuse-tree
    /// lookup in that window).
    void unpinBlocksById(std::vector<BlockIdType> const& blockIds) {
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
    void schedulingRemoveSequence(RequestIdType requestId) {
        impl().schedulingRemoveSequence(requestId);
    }
    void startScheduling() { impl().startScheduling(); }

    // --- block ids and offsets ------------------------------------------------------------
    /// Block ids of every beam of a sequence in one window: [beam][block].
    [[nodiscard]] std::vector<std::vector<SizeType32>> getCacheBlockIds(
        RequestIdType requestId, SizeType32 windowSize) const {
        int32_t beams = 0;
        check(kvb_manager_get_beam_width(impl().get(), requestId, &beams));
        std::vector<std::vector<SizeType32>> out;
        for (int32_t b = 0; b < beams; ++b)
            out.push_back(impl().getCacheBlockIds(requestId, windowSize, b));
        return out;
    }
    [[nodiscard]] std::vector<std::vector<std::vector<SizeType32>>> getBatchCacheBlockIds(
        std::vector<RequestIdType> const& requestIds, SizeType32 windowSize) const {
        std::vector<std::vector<std::vector<SizeType32>>> out;
        out.reserve(requestIds.size());
        for (auto id : requestIds) out.push_back(getCacheBlockIds(id, windowSize));
        return out;
    }
    [[nodiscard]] std::optional<BlockIdType> getLastBlockId(RequestIdType requestId) const {
        if (!hasSequence(requestId)) return std::nullopt;
        return impl().getLastBlockId(requestId);
    }
    [[nodiscard]] SizeType32 getNumFrontBlocksRemoved(RequestIdType requestId,
                                                      SizeType32 windowSize) const {
        int32_t n = 0;
        check(kvb_manager_get_num_front_blocks_removed(impl().get(), requestId, windowSize, &n));
        return n;
    }
    /// Writes one request's offsets at slot `outputSlotOffset`; returns its block count.
    SizeType32 copyBlockOffsets(BlockOffsetsTensor& output, SizeType32 outputSlotOffset,
                                RequestIdType requestId) const {
        return impl().copyBlockOffsets(output.data, output.numSlots, outputSlotOffset, requestId);
    }
    /// The offsets of `batchSize` requests whose ids are `firstBatchSlotIdx + i`, at slots
    /// `i * beamWidth`.
    void getBlockOffsetsOfBatch(BlockOffsetsTensor& output, SizeType32 firstBatchSlotIdx,
                                SizeType32 batchSize, SizeType32 beamWidth) const {
        for (SizeType32 i = 0; i < batchSize; ++i)
            copyBlockOffsets(output, i * beamWidth,
                             static_cast<RequestIdType>(firstBatchSlotIdx + i));
    }
    /// The executor's batch form: request i at slots `offset + i * beamWidth`.
    void copyBatchBlockOffsets(BlockOffsetsTensor& output,
                               std::vector<RequestIdType> const& requestIds, SizeType32 beamWidth,
                               SizeType32 offset) const {
        for (size_t i = 0; i < requestIds.size(); ++i)
            copyBlockOffsets(output, offset + static_cast<SizeType32>(i) * beamWidth,
                             requestIds[i]);
    }
    /// The GPU-pool row of each block id of a window; -1 for a block on the host tier.
    [[nodiscard]] std::vector<SizeType32> getMemoryPoolBlockIndicesByBlockIds(
        std::vector<BlockIdType> const& blockIds, SizeType32 windowSize) const {
        std::vector<SizeType32> rows(blockIds.size());
        check(kvb_manager_get_memory_pool_block_indices(impl().get(), windowSize, blockIds.data(),
                                                        blockIds.size(), rows.data()));
        return rows;
    }
    [[nodiscard]] SizeType32 getPriorityByBlockId(BlockIdType blockId,
                                                  SizeType32 windowSize) const {
        return impl().getPriorityByBlockId(windowSize, blockId);
    }

    // --- reuse ----------------------------------------------------------------------------
    /// One walk of the largest window's tree along `uniqueTokens` keyed as `llmRequest`'s
    /// blocks (LoRA task, salt, multimodal items).
    [[nodiscard]] PrefixReuseSummary analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
                                                        LlmRequest const& llmRequest) const {
        return analyzePrefixReuse(uniqueTokens, llmRequest, windows_.back());
    }
    [[nodiscard]] PrefixReuseSummary analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
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
    [[nodiscard]] SizeType32 getNeededBlocksOneStep(
        LlmRequest const& req, bool twoStepsLookAhead, SizeType32 windowSize,
        std::optional<PrefixReuseSummary> const& cachedSummary = std::nullopt) const {
        kvb_request_state_t state = stateOf(req);
        int32_t n = 0;
        if (cachedSummary) {
            kvb_prefix_reuse_summary_t s = toC(*cachedSummary);
            check(kvb_manager_get_needed_blocks_one_step_cached(impl().get(), &state, &s,
                                                                twoStepsLookAhead, windowSize, &n));
        } else {
            kvb::Request r = toKvb(req);
            r.withC([&](kvb_request_t const* c) {
                check(kvb_manager_get_needed_blocks_one_step(impl().get(), &state, c,
                                                             twoStepsLookAhead, windowSize, &n));
            });
        }
        return n;
    }
    [[nodiscard]] SizeType32 getRemainingBlocksToCompletion(
        LlmRequest const& req, SizeType32 windowSize,
        std::optional<PrefixReuseSummary> const& cachedSummary = std::nullopt) const {
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
        return n;
    }
    /// Stores the request's full computed blocks and returns their hash chain.
    std::vector<SizeType64> commitAndGetBlockHashesForRequest(LlmRequest const& llmRequest,
                                                              SizeType32 windowSize) {
        syncTokens(llmRequest);
        RequestIdType id = llmRequest.getRequestId();
        size_t n = 0;
        kvb_status_t s =
            kvb_manager_commit_block_hashes(impl().get(), id, windowSize, nullptr, 0, &n);
        if (s != KVB_OK && s != KVB_STATUS_BUFFER_TOO_SMALL) check(s);
        std::vector<uint64_t> hashes(n);
        check(kvb_manager_commit_block_hashes(impl().get(), id, windowSize, hashes.data(),
                                              hashes.size(), &n));
        return {hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(n)};
    }
    /// Drops cached blocks of `targetTokens` past its first `numTokensToKeep` tokens.
    void truncateBlocks(VecTokens const& targetTokens, SizeType32 numTokensToKeep) {
        check(kvb_manager_truncate_blocks(impl().get(), targetTokens.data(), targetTokens.size(),
                                          numTokensToKeep, nullptr));
    }
    void resetReuseState() { check(kvb_manager_reset_reuse_state(impl().get(), nullptr)); }

    // --- iteration -------------------------------------------------------------------------
    void refreshBlocks() { impl().refreshBlocks(); }
    void flushIterationEvents() { impl().flushIterationEvents(); }
    /// kvblock enqueues its copies on the engine stream: nothing to order here.
    void syncTransferManagerWithBufferManager() {}
    /// Flushed events; no timeout waits until there is one (at once when events are off).
    [[nodiscard]] std::deque<Event> getLatestEvents(
        std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
        std::vector<Event> events;
        if (timeout) {
            events = impl().getLatestEvents(timeout->count());
        } else {
            do {
                events = impl().getLatestEvents(1000);
            } while (events.empty() && config_.raw.max_kv_event_entries > 0);
        }
        return {events.begin(), events.end()};
    }
    [[nodiscard]] SizeType32 getMaxCapacityBatchSize(SizeType32 inputLength,
                                                     SizeType32 outputLength) const {
        return impl().getMaxCapacityBatchSize(inputLength, outputLength);
    }

    // --- static sizing helpers (sink tokens: only 0, as TensorRT-LLM's manager requires) --
    [[nodiscard]] static SizeType32 getSinkBubbleLength(SizeType32 sinkTokenLen,
                                                        SizeType32 tokensPerBlock) {
        (void)tokensPerBlock;
        requireNoSink(sinkTokenLen);
        return 0;
    }
    [[nodiscard]] static SizeType32 calculateMaxBlockRequirementsPerBeam(
        SizeType32 sequenceLength, SizeType32 sinkTokenLength, SizeType32 windowSize,
        SizeType32 tokensPerBlock) {
        requireNoSink(sinkTokenLength);
        int32_t n = 0;
        check(kvb_calculate_max_block_requirements_per_beam(sequenceLength, windowSize,
                                                            tokensPerBlock, &n));
        return n;
    }
    [[nodiscard]] static SizeType32 calculateMaxBlockRequirements(
        SizeType32 inputLength, SizeType32 outputLength, SizeType32 sinkTokenLength,
        SizeType32 windowSize, SizeType32 beamWidth, SizeType32 tokensPerBlock) {
        requireNoSink(sinkTokenLength);
        int32_t n = 0;
        check(kvb_calculate_max_block_requirements(inputLength, outputLength, windowSize, beamWidth,
                                                   tokensPerBlock, &n));
        return n;
    }
    [[nodiscard]] static SizeType32 calculateMaxAttentionWindow(
        SizeType32 inputLength, SizeType32 outputLength, SizeType32 sinkTokenLength,
        SizeType32 blockCapacity, SizeType32 beamWidth, SizeType32 tokensPerBlock) {
        requireNoSink(sinkTokenLength);
        int32_t n = 0;
        check(kvb_calculate_max_attention_window(inputLength, outputLength, blockCapacity,
                                                 beamWidth, tokensPerBlock, &n));
        return n;
    }

    /// Layer indices per window size; layer l has `maxAttentionWindowVec[l % size]`.
    [[nodiscard]] static std::map<SizeType32, std::vector<SizeType32>> groupLayersByWindowSize(
        std::vector<SizeType32> const& maxAttentionWindowVec, SizeType32 numLayers) {
        if (maxAttentionWindowVec.empty())
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "no attention windows");
        std::map<SizeType32, std::vector<SizeType32>> out;
        for (SizeType32 l = 0; l < numLayers; ++l)
            out[maxAttentionWindowVec[static_cast<size_t>(l) % maxAttentionWindowVec.size()]]
                .push_back(l);
        return out;
    }
    /// Elements one token takes in the layers `windowSizeLayers` (sum over them of
    /// `kvFactor x numKvHeadsPerLayer[l] x sizePerHead`), through
    /// kvb_calculate_window_bytes_per_token; TensorRT-LLM reads heads from its ModelConfig.
    [[nodiscard]] static SizeType32 calculateCacheSizePerTokenForSingleWindowSize(
        std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
        std::vector<SizeType32> const& windowSizeLayers, bool isCrossAttention,
        SizeType32 kvFactor) {
        if (kvFactor != 1 && kvFactor != 2)
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "kvFactor must be 1 or 2");
        if (windowSizeLayers.empty()) return 0;
        kvb_cache_type_t type = kvFactor == 1      ? KVB_CACHE_TYPE_SELF_K_ONLY
                                : isCrossAttention ? KVB_CACHE_TYPE_CROSS
                                                   : KVB_CACHE_TYPE_SELF;
        std::vector<kvb_layer_spec_t> layers;
        for (SizeType32 l : windowSizeLayers)
            layers.push_back(kvb_layer_spec_t{1, type,
                                              numKvHeadsPerLayer.at(static_cast<size_t>(l)),
                                              sizePerHead, KVB_KV_DATA_TYPE_DEFAULT});
        // One byte per element and one token per block: the byte count is the element count.
        int32_t window = 0;
        uint64_t bytes = 0;
        size_t n = 0;
        check(kvb_calculate_window_bytes_per_token(layers.data(), layers.size(), 1, 1, &window,
                                                   &bytes, 1, &n));
        return static_cast<SizeType32>(bytes);
    }
    /// Primary and secondary blocks per window that the memory budgets allow (TensorRT-LLM's
    /// `calculateMaxNumBlocks` on one rank): bytes per token of each window over its layers
    /// (kvb_calculate_window_bytes_per_token, block scales included), the budget split by
    /// `window x bytes per token` (kvb_calculate_window_size_to_share), then
    /// kvb_calculate_max_num_blocks. `maxTokens` caps a single window's primary tokens.
    [[nodiscard]] static BlocksPerWindow calculateMaxNumBlocks(
        std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
        std::vector<SizeType32> const& maxAttentionWindowVec, SizeType32 dtypeBytes,
        SizeType32 tokensPerBlock, uint64_t allottedPrimaryMemBytes,
        uint64_t allottedSecondaryMemBytes, std::size_t extraCostMemory = 0,
        CacheType cacheType = CacheType::kSELF,
        kvb_kv_data_type_t kvDataType = KVB_KV_DATA_TYPE_DEFAULT,
        std::optional<SizeType64> maxTokens = std::nullopt) {
        auto layers = layerSpecs(numKvHeadsPerLayer, sizePerHead, maxAttentionWindowVec, cacheType,
                                 kvDataType);
        std::vector<int32_t> windows(layers.size());
        std::vector<uint64_t> bytes(layers.size());
        size_t n = 0;
        check(kvb_calculate_window_bytes_per_token(layers.data(), layers.size(), dtypeBytes,
                                                   tokensPerBlock, windows.data(), bytes.data(),
                                                   windows.size(), &n));
        windows.resize(n);
        bytes.resize(n);
        std::vector<int32_t> perToken(bytes.begin(), bytes.end());
        std::vector<double> shares(n);
        check(
            kvb_calculate_window_size_to_share(windows.data(), perToken.data(), n, shares.data()));
        std::vector<uint64_t> primary(n), secondary(n);
        check(kvb_calculate_max_num_blocks(bytes.data(), shares.data(), n, allottedPrimaryMemBytes,
                                           allottedSecondaryMemBytes, extraCostMemory,
                                           maxTokens.value_or(-1), tokensPerBlock, primary.data(),
                                           secondary.data()));
        BlocksPerWindow out;
        for (size_t i = 0; i < n; ++i)
            out[windows[i]] = {static_cast<SizeType32>(primary[i]),
                               static_cast<SizeType32>(secondary[i])};
        return out;
    }

    /// GPU and host bytes for the KV cache (TensorRT-LLM `calculateFreeMemBytes`, as its
    /// engine calls it before calculateMaxNumBlocks): (the device's free bytes after its work
    /// + the buffer manager's pool free bytes) x freeGpuMemoryFraction (default 0.9), and
    /// hostCacheSize (default 0). Throws KVB_STATUS_UNSUPPORTED without a CUDA driver or GPU.
    [[nodiscard]] static std::tuple<uint64_t, uint64_t> calculateFreeMemBytes(
        BufferManager const& bufferManager, KvCacheConfig const& config) {
        auto [primary, secondary] = kvb::calculateFreeMemBytes(
            bufferManager.device, static_cast<double>(config.freeGpuMemoryFraction.value_or(0.9f)),
            bufferManager.memoryPoolFree, config.hostCacheSize.value_or(0));
        return {primary, secondary};
    }

    /// Carries a hybrid model's recurrent state into the request's next block at a block
    /// boundary (TensorRT-LLM `copyLinearAttentionBlock`; kvb_manager_copy_recurrent_state):
    /// the tokens processed are the context position during the context phase and all but the
    /// newest token after it. True when a copy was issued (it is ordered before the engine's
    /// next work on the stream). kvblock keeps a state row in every block, so decode
    /// boundaries copy too (TensorRT-LLM's placeholders make it copy only inside the prompt).
    /// A request the manager does not hold is skipped, as TensorRT-LLM warns and skips it.
    bool copyLinearAttentionBlock(LlmRequest const& llmRequest) {
        return copyRecurrentState({&llmRequest});
    }
    /// The batch form: one submission (one kernel launch on the CUDA backend) for all.
    bool copyLinearAttentionBlockBatch(std::vector<std::shared_ptr<LlmRequest>> const& requests) {
        std::vector<LlmRequest const*> raw;
        for (auto const& r : requests)
            if (r) raw.push_back(r.get());
        return copyRecurrentState(raw);
    }

    [[nodiscard]] bool hasSequence(RequestIdType requestId) const {
        kvb_sequence_lengths_t l{};
        kvb_status_t s = kvb_manager_get_sequence_lengths(impl().get(), requestId, &l);
        if (s == KVB_STATUS_UNKNOWN_REQUEST) return false;
        check(s);
        return true;
    }

  private:
    friend class BlockManager;

    bool copyRecurrentState(std::vector<LlmRequest const*> const& requests) {
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

    static void requireNoSink(SizeType32 sinkTokenLength) {
        if (sinkTokenLength != 0)
            throw Error(KVB_STATUS_UNSUPPORTED, "sink tokens are not supported");
    }

    /// Layer l: window `maxAttentionWindowVec[l % size]`, `numKvHeadsPerLayer[l]` heads.
    static std::vector<kvb_layer_spec_t> layerSpecs(
        std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
        std::vector<SizeType32> const& maxAttentionWindowVec, CacheType cacheType,
        kvb_kv_data_type_t kvDataType) {
        if (maxAttentionWindowVec.empty() || numKvHeadsPerLayer.empty())
            throw Error(KVB_STATUS_INVALID_CONFIG, "no layers or no attention windows");
        kvb_cache_type_t type = cacheType == CacheType::kCROSS       ? KVB_CACHE_TYPE_CROSS
                                : cacheType == CacheType::kSELFKONLY ? KVB_CACHE_TYPE_SELF_K_ONLY
                                                                     : KVB_CACHE_TYPE_SELF;
        std::vector<kvb_layer_spec_t> layers;
        for (size_t l = 0; l < numKvHeadsPerLayer.size(); ++l)
            layers.push_back(
                kvb_layer_spec_t{maxAttentionWindowVec[l % maxAttentionWindowVec.size()], type,
                                 numKvHeadsPerLayer[l], sizePerHead, kvDataType});
        return layers;
    }

    /// Appends an indexer K layer for every model layer the mask keeps (after the model's).
    void addIndexerLayers(KvblockOptions const& o, std::vector<SizeType32> const& windows) {
        if (o.indexerKCacheIndexHeadDim <= 0 || o.indexerKCacheQuantBlockSize <= 0 ||
            o.indexerKCacheIndexHeadDim % o.indexerKCacheQuantBlockSize != 0)
            throw Error(KVB_STATUS_INVALID_CONFIG,
                        "the indexer K cache needs a positive head dim that is a multiple of its "
                        "quant block size");
        if (o.indexerKCacheUseFp4 && o.indexerKCacheQuantBlockSize != 16)
            throw Error(KVB_STATUS_UNSUPPORTED,
                        "an FP4 indexer K cache takes kvblock's NVFP4 layout: quant blocks of 16");
        if (!o.indexerKCacheLayerMask.empty() &&
            o.indexerKCacheLayerMask.size() != static_cast<size_t>(numModelLayers_))
            throw Error(KVB_STATUS_INVALID_CONFIG, "indexerKCacheLayerMask needs one per layer");
        SizeType32 const headDim = o.indexerKCacheIndexHeadDim;
        // FP8: the elements, then one FP32 scale per quant block, as bytes of an FP8 row.
        SizeType32 const fp8Bytes = headDim + headDim / o.indexerKCacheQuantBlockSize * 4;
        for (SizeType32 l = 0; l < numModelLayers_; ++l) {
            if (!o.indexerKCacheLayerMask.empty() && !o.indexerKCacheLayerMask[l]) continue;
            config_.layers.push_back(kvb_layer_spec_t{
                windows[static_cast<size_t>(l) % windows.size()], KVB_CACHE_TYPE_INDEXER_K, 1,
                o.indexerKCacheUseFp4 ? headDim : fp8Bytes,
                o.indexerKCacheUseFp4 ? KVB_KV_DATA_TYPE_NVFP4 : KVB_KV_DATA_TYPE_FP8});
        }
        indexer_ = {true, headDim, o.indexerKCacheQuantBlockSize, o.indexerKCacheUseFp4};
    }

    /// Base of data pool `pool` at `level`; null where it has no memory there.
    void* poolBase(SizeType32 pool, kvb_cache_level_t level) const {
        uint8_t* base = nullptr;
        size_t rowBytes = 0;
        kvb_status_t s = kvb_manager_get_model_pool_pointer(
            impl().get(), pool, static_cast<int32_t>(level), &base, &rowBytes);
        if (s == KVB_STATUS_UNSUPPORTED) return nullptr;
        check(s);
        return base;
    }

    void collectWindows() {
        for (auto const& w : config_.windows) windows_.push_back(w.window_size);
        std::sort(windows_.begin(), windows_.end());
    }

    /// Pins every listed block of a sequence in every window and remembers the group.
    std::vector<BlockIdType> pinSequence(RequestIdType requestId) {
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

    static kvb::Request toKvb(LlmRequest const& req) {
        kvb::Request r(req.getRequestId(), req.getTokens(0));
        r.inputLength = req.getPromptLen();
        if (auto extra = req.getTokenExtraIds()) r.extraIds = *extra;
        if (auto lora = req.getLoraTaskId()) r.withLora(*lora);
        if (auto salt = req.getCacheSaltID()) r.withSalt(*salt);
        r.mmItems = req.getMultimodalItems();
        return r;
    }
    static void setUniqueTokens(kvb::Request& r, VecUniqueTokens const& tokens, bool extra) {
        r.tokens.clear();
        r.extraIds.clear();
        for (auto const& t : tokens) {
            r.tokens.push_back(t.tokenId);
            if (extra) r.extraIds.push_back(t.tokenExtraId);
        }
        r.inputLength = static_cast<int32_t>(tokens.size());
    }
    static kvb_request_state_t stateOf(LlmRequest const& req) {
        kvb_request_state_t s{};
        check(kvb_request_state_init(&s));
        s.request_id = req.getRequestId();
        s.phase =
            req.isContextInitState()
                ? (req.isFirstContextChunk() ? KVB_PHASE_CONTEXT_INIT : KVB_PHASE_CONTEXT_CONTINUE)
                : (req.isGenerationInProgressState() ? KVB_PHASE_GENERATION : KVB_PHASE_OTHER);
        s.prompt_len = req.getPromptLen();
        s.beam_width = req.getBeamWidth();
        s.context_chunk_size = req.getContextChunkSize();
        s.num_draft_tokens = req.getNumDraftTokens();
        s.max_new_tokens = req.getMaxNewTokens();
        s.num_generated_tokens = req.getNumGeneratedTokens();
        return s;
    }
    static PrefixReuseSummary fromC(kvb_prefix_reuse_summary_t const& s) {
        PrefixReuseSummary out{s.reusable_blocks_allocated, s.reusable_blocks_all, std::nullopt};
        if (s.first_new_block_index >= 0) out.firstNewBlock = s.first_new_block_index;
        return out;
    }
    static kvb_prefix_reuse_summary_t toC(PrefixReuseSummary const& s) {
        return {s.reusableBlocksAllocated, s.reusableBlocksAll, s.firstNewBlock.value_or(-1)};
    }

    Config config_;
    bool enableBlockReuse_ = false;
    bool enablePartialReuse_ = false;
    CacheType cacheType_ = CacheType::kSELF;
    /// The model's layers (0: not known, a manager built from kvblock's own Config).
    SizeType32 numModelLayers_ = 0;
    struct IndexerKCache {
        bool enabled = false;
        SizeType32 headDim = 0;
        SizeType32 quantBlockSize = 0;
        bool useFp4 = false;
    } indexer_;
    std::vector<SizeType32> windows_;
    mutable std::optional<Manager> manager_;
    BlockManager blockManager_{*this};
    /// Pins made through the facade: the smallest window's beam-0 ids -> every window's ids.
    std::mutex pinMutex_;
    std::vector<std::pair<std::vector<BlockIdType>,
                          std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>>>
        pinGroups_;
};

// --- BlockManager ----------------------------------------------------------------------------
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
inline void BlockManager::verifyQueueIntegrity(SizeType32) const {
    owner_.impl().checkInvariants();
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

#endif  // KVBLOCK_TRTLLM_HPP
