// kvblock_trtllm/kv_cache_manager.hpp: the facade's KVCacheManager (TensorRT-LLM's 2026
// KVCacheManager over a kvb::Manager). Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_KV_CACHE_MANAGER_HPP
#define KVBLOCK_TRTLLM_KV_CACHE_MANAGER_HPP

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

#include "kvblock_trtllm/block_manager.hpp"
#include "kvblock_trtllm/generation_request.hpp"
#include "kvblock_trtllm/sizing.hpp"

namespace kvb::trtllm {

/// TensorRT-LLM's 2026 KVCacheManager over kvblock.
class KVCacheManager : public BaseKVCacheManager {
  public:
    using BaseKVCacheManager::BlocksPerWindow;
    using SizeType32 = kvb::trtllm::SizeType32;
    using CudaStreamPtr = std::shared_ptr<void>;

    /// TensorRT-LLM's constructor as engines call it: the element type as TensorRT's
    /// `nvinfer1::DataType` (or kvb::trtllm::nvinfer1::DataType, same values) and the stream
    /// as the engine's shared stream object, whose `get()` is the `cudaStream_t` kvblock
    /// enqueues its copies on (kept alive as long as the manager). Otherwise as the
    /// byte-sized constructor below.
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    KVCacheManager(std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
                   SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                   SizeType32 maxNumSequences, SizeType32 maxBeamWidth,
                   std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                   SizeType32 sinkTokenLength, std::shared_ptr<Stream> stream,
                   SizeType32 maxSequenceLength, SizeType32 chunkSize = 0,
                   bool enableBlockReuse = false, CacheType cacheType = CacheType::kSELF,
                   std::optional<SizeType32> secondaryOffloadMinPriority = std::nullopt,
                   std::shared_ptr<KVCacheEventManager> eventManager = nullptr,
                   bool enablePartialReuse = true, bool copyOnPartialReuse = true,
                   KvblockOptions options = getDefaultKvblockOptions())
        : KVCacheManager(
              numKvHeadsPerLayer, sizePerHead, tokensPerBlock, blocksPerWindow, maxNumSequences,
              maxBeamWidth, maxAttentionWindowVec, withDataType(options, dtype), sinkTokenLength,
              stream ? stream->get() : nullptr, maxSequenceLength, chunkSize, enableBlockReuse,
              cacheType, secondaryOffloadMinPriority, std::move(eventManager), enablePartialReuse,
              copyOnPartialReuse, withDataTypeOptions(options, dtype)) {
        stream_ = std::move(stream);
        trtDataType_ = static_cast<nvinfer1::DataType>(static_cast<int32_t>(dtype));
    }
    /// The same with every layer having `numKvHeads` heads (TensorRT-LLM's uniform overload).
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    KVCacheManager(SizeType32 numLayers, SizeType32 numKvHeads, SizeType32 sizePerHead,
                   SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                   SizeType32 maxNumSequences, SizeType32 maxBeamWidth,
                   std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                   SizeType32 sinkTokenLength, std::shared_ptr<Stream> stream,
                   SizeType32 maxSequenceLength, SizeType32 chunkSize = 0,
                   bool enableBlockReuse = false, CacheType cacheType = CacheType::kSELF,
                   std::optional<SizeType32> secondaryOffloadMinPriority = std::nullopt,
                   std::shared_ptr<KVCacheEventManager> eventManager = nullptr,
                   bool enablePartialReuse = true, bool copyOnPartialReuse = true,
                   KvblockOptions options = getDefaultKvblockOptions())
        : KVCacheManager(
              std::vector<SizeType32>(static_cast<size_t>(std::max(numLayers, 0)), numKvHeads),
              sizePerHead, tokensPerBlock, blocksPerWindow, maxNumSequences, maxBeamWidth,
              maxAttentionWindowVec, dtype, sinkTokenLength, std::move(stream), maxSequenceLength,
              chunkSize, enableBlockReuse, cacheType, secondaryOffloadMinPriority,
              std::move(eventManager), enablePartialReuse, copyOnPartialReuse, std::move(options)) {
    }

    /// The engine constructor with TensorRT-LLM's KV-cache connector (null: none): at
    /// admission the connector is asked how many prompt tokens past the reused prefix it loads
    /// (see addSequenceBatch).
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    KVCacheManager(std::vector<SizeType32> const& numKvHeadsPerLayer, SizeType32 sizePerHead,
                   SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                   SizeType32 maxNumSequences, SizeType32 maxBeamWidth,
                   std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                   SizeType32 sinkTokenLength, std::shared_ptr<Stream> stream,
                   SizeType32 maxSequenceLength, SizeType32 chunkSize, bool enableBlockReuse,
                   CacheType cacheType, std::optional<SizeType32> secondaryOffloadMinPriority,
                   std::shared_ptr<KVCacheEventManager> eventManager, bool enablePartialReuse,
                   bool copyOnPartialReuse,
                   std::shared_ptr<kv_connector::KvCacheConnectorManager> connector,
                   KvblockOptions options = getDefaultKvblockOptions())
        : KVCacheManager(numKvHeadsPerLayer, sizePerHead, tokensPerBlock, blocksPerWindow,
                         maxNumSequences, maxBeamWidth, maxAttentionWindowVec, dtype,
                         sinkTokenLength, std::move(stream), maxSequenceLength, chunkSize,
                         enableBlockReuse, cacheType, secondaryOffloadMinPriority,
                         std::move(eventManager), enablePartialReuse, copyOnPartialReuse,
                         std::move(options)) {
        connector_ = std::move(connector);
    }
    /// The same with every layer having `numKvHeads` heads.
    template <typename DataType, typename Stream,
              typename = std::enable_if_t<std::is_enum_v<DataType>>>
    KVCacheManager(SizeType32 numLayers, SizeType32 numKvHeads, SizeType32 sizePerHead,
                   SizeType32 tokensPerBlock, BlocksPerWindow const& blocksPerWindow,
                   SizeType32 maxNumSequences, SizeType32 maxBeamWidth,
                   std::vector<SizeType32> const& maxAttentionWindowVec, DataType dtype,
                   SizeType32 sinkTokenLength, std::shared_ptr<Stream> stream,
                   SizeType32 maxSequenceLength, SizeType32 chunkSize, bool enableBlockReuse,
                   CacheType cacheType, std::optional<SizeType32> secondaryOffloadMinPriority,
                   std::shared_ptr<KVCacheEventManager> eventManager, bool enablePartialReuse,
                   bool copyOnPartialReuse,
                   std::shared_ptr<kv_connector::KvCacheConnectorManager> connector,
                   KvblockOptions options = getDefaultKvblockOptions())
        : KVCacheManager(
              std::vector<SizeType32>(static_cast<size_t>(std::max(numLayers, 0)), numKvHeads),
              sizePerHead, tokensPerBlock, blocksPerWindow, maxNumSequences, maxBeamWidth,
              maxAttentionWindowVec, dtype, sinkTokenLength, std::move(stream), maxSequenceLength,
              chunkSize, enableBlockReuse, cacheType, secondaryOffloadMinPriority,
              std::move(eventManager), enablePartialReuse, copyOnPartialReuse, std::move(connector),
              std::move(options)) {}

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
                   KvblockOptions const& options = getDefaultKvblockOptions())
        : enableBlockReuse_(enableBlockReuse),
          enablePartialReuse_(enablePartialReuse),
          cacheType_(cacheType) {
        (void)maxNumSequences;  // kvblock bounds sequences by blocks only
        maxContextChunkTokens_ = chunkSize;
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
        elementBytes_ = dtypeBytes;
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
        (void)impl();
    }
    /// Frees the pools and forgets every sequence and cached block.
    void releasePools() {
        manager_.reset();
        sequences_.clear();
        std::lock_guard<std::mutex> lock(pinMutex_);
        pinGroups_.clear();
    }

    /// kvblock's own API on the same manager (e.g. kvblock's token-carrying addToken).
    /// Made on first use when allocatePools() was not called (TensorRT-LLM's manager admits
    /// sequences before its pools are allocated); after releasePools() it is made anew.
    [[nodiscard]] Manager& impl() const {
        if (!manager_) {
            manager_.emplace(config_);
            // The chunk size (TensorRT-LLM's temporary attention window inputs) is read by the
            // remaining-blocks estimate only.
            if (maxContextChunkTokens_ > 0)
                manager_->setMaxContextChunkTokens(maxContextChunkTokens_);
        }
        return *manager_;
    }
    /// The manager's record of a live sequence (TensorRT-LLM `getSequence`), refreshed now; the
    /// reference stays valid, and is refreshed by every facade call that changes the sequence,
    /// until removeSequence. An unknown id throws (KVB_STATUS_UNKNOWN_REQUEST).
    [[nodiscard]] GenerationRequest const& getSequence(RequestIdType requestId) const {
        return refreshSequence(requestId);
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
    [[nodiscard]] KvCacheStats getKvCacheStats() const;
    /// Per window size: the statistics since the previous call (the first: since creation).
    std::map<SizeType32, KvCacheIterationStats> getIterationStats();
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
    /// The same, for its calls that write a caller's GenerationRequest (onboardBlock).
    [[nodiscard]] BlockManager& getBlockManager() { return blockManager_; }

    // --- pools (kvblock's pool model) ------------------------------------------------------
    /// TensorRT-LLM's `[numKVPools, 2]` host tensor of addresses (`TRTDataType<void*>`, read
    /// with `BufferRange<void*>`): each data pool's primary and secondary base, null where a
    /// pool has no memory at that level (no host tier, or an unregistered CUDA pool). A new
    /// tensor each call; the addresses hold while the pools live.
    [[nodiscard]] ITensor::SharedPtr getBlockPoolPointers() const;
    /// The same `[numBlockScalePools, 2]` table for the block-scale pools (NVFP4), in data
    /// pool order; no rows without them.
    [[nodiscard]] ITensor::SharedPtr getBlockScalePoolPointers() const;
    /// TensorRT-LLM's `[numLayers, 2]` host tensor of `int32`: each layer's data pool and the
    /// layer's index in it.
    [[nodiscard]] ITensor::SharedPtr getLayerToPoolMapping() const;
    /// The same mapping as a table ([layer][pool, index of the layer in its pool]).
    [[nodiscard]] std::vector<std::array<SizeType32, 2>> layerToPoolTable() const;

    // --- the indexer K cache (DeepSeek-V3.2 sparse attention) ----------------------------
    [[nodiscard]] bool isEnableIndexerKCache() const { return indexer_.enabled; }
    [[nodiscard]] SizeType32 getIndexerKCacheIndexHeadDim() const { return indexer_.headDim; }
    [[nodiscard]] SizeType32 getIndexerKCacheQuantBlockSize() const {
        return indexer_.quantBlockSize;
    }
    [[nodiscard]] bool getIndexerKCacheUseFp4() const { return indexer_.useFp4; }
    /// The indexer K cache pool in GPU memory (TensorRT-LLM `getIndexerKCachePool`, an ITensor
    /// of bytes `[blocks][layers with an indexer][1][tokens x bytes per token]`): each token's
    /// row is its FP8 elements then its FP32 scales; with FP4, the NVFP4 elements, their scales
    /// in the pool's block-scale pool. With several attention windows each has its own; this is
    /// the first (TensorRT-LLM has one). Throws KVB_STATUS_UNSUPPORTED without an indexer.
    [[nodiscard]] ITensor::SharedPtr getIndexerKCachePool() const;
    /// The same pool as kvblock's PoolView.
    [[nodiscard]] PoolView getIndexerKCachePoolView() const;
    /// The index of layer `layerIdx` in its pool.
    [[nodiscard]] SizeType32 getPoolLayerIdx(SizeType32 layerIdx) const;
    /// Whether layer `layerIdx` is the first layer of its pool.
    [[nodiscard]] bool isPoolLayerFirst(SizeType32 layerIdx) const;
    /// The primary pool when there is exactly one data pool (throws otherwise), as an ITensor
    /// (see BlockManager::getPrimaryPool).
    [[nodiscard]] ITensor::SharedPtr getUniquePrimaryPool() const;
    /// The primary pool holding layer `layerIdx`, as an ITensor.
    [[nodiscard]] ITensor::SharedPtr getPrimaryPool(SizeType32 layerIdx) const;
    /// The primary pool holding layer `layerIdx` as kvblock's PoolView.
    [[nodiscard]] PoolView getPrimaryPoolView(SizeType32 layerIdx) const;

    // --- admission -----------------------------------------------------------------------
    /// Admits every request (id, input length, beam width) with its engine request, claiming
    /// every reusable block of the batch before allocating; writes the prepopulated prompt
    /// length and the per-request block counts into each request. All or nothing: a batch
    /// that does not fit throws (KVB_STATUS_OUT_OF_BLOCKS) and admits none. With a connector,
    /// each request's prepopulated length also counts the tokens the connector says it loads
    /// past the reused prefix (at most up to the last prompt token, which the engine always
    /// computes); it is asked before admission (a throwing connector admits none), and kvblock
    /// treats its tokens as computed once the request's context position covers them, as it
    /// does every computed token.
    void addSequenceBatch(
        std::vector<std::tuple<RequestIdType, SizeType32, SizeType32>> const& requestInfos,
        std::vector<std::reference_wrapper<LlmRequest>> const& llmRequests);

    // --- tokens --------------------------------------------------------------------------
    /// Grows a sequence by one KV slot (a decode step's token, an extra KV token, a draft
    /// token), allocating a block at a block boundary (one per beam with beam search). The
    /// slot's token id comes later from the request (see the file comment). Throws
    /// KVB_STATUS_OUT_OF_BLOCKS when the blocks are not there.
    void addToken(RequestIdType requestId);
    /// KV slots of a sequence: its tokens plus the slots addToken reserved.
    [[nodiscard]] SizeType32 getTokenCount(RequestIdType requestId) const;
    /// Drops the last `numTokens` slots (rejected drafts): reserved slots first, then tokens.
    void rewindKVCache(RequestIdType requestId, SizeType32 numTokens);
    void removeToken(RequestIdType requestId) { rewindKVCache(requestId, 1); }
    /// Gives the manager the request's token ids for the slots it has reserved (kvblock keeps
    /// block content); with `storeNewBlocks`, each block a token completes is stored for reuse.
    void syncTokens(LlmRequest const& llmRequest, bool storeNewBlocks = false);

    // --- store, release, pins ------------------------------------------------------------
    void storeContextBlocks(LlmRequest const& llmRequest);
    void storeNewBlock(LlmRequest const& llmRequest);
    /// Stores every computed token for reuse; with `pinBlocks`, pins the sequence's blocks in
    /// every window and returns those of the smallest window (beam 0) for unpinBlocksById.
    std::vector<BlockIdType> storeBlocksForReuse(RequestIdType requestId,
                                                 OptionalRef<LlmRequest const> llmRequest,
                                                 bool pinBlocks = false);
    /// Releases a sequence; stores it for reuse when the request is given (and reuse is on);
    /// with `pinOnRelease` its blocks stay allocated until unpinBlocksById. Returns the last
    /// block of beam 0 in the smallest window when the sequence was stored or pinned. An
    /// unknown id does nothing.
    std::optional<BlockIdType> removeSequence(RequestIdType requestId,
                                              OptionalRef<LlmRequest const> llmRequest = nullptr,
                                              bool pinOnRelease = false);
    void pinBlocks(RequestIdType requestId) { pinSequence(requestId); }
    /// Drops the pins of a group of blocks pinned through this facade (by its ids in the
    /// smallest window, as storeBlocksForReuse returned them, or ids pinned by a reuse-tree
    /// lookup in that window).
    void unpinBlocksById(std::vector<BlockIdType> const& blockIds);
    void schedulingRemoveSequence(RequestIdType requestId);
    void startScheduling() { impl().startScheduling(); }

    // --- block ids and offsets ------------------------------------------------------------
    /// Block ids of every beam of a sequence in one window: [beam][block].
    /// The reference is the sequence's record (see getSequence): it reads current ids until
    /// the sequence is removed, so `auto const& ids = getCacheBlockIds(id, w)[0]` is safe.
    [[nodiscard]] std::vector<std::vector<SizeType32>> const& getCacheBlockIds(
        RequestIdType requestId, SizeType32 windowSize) const;
    [[nodiscard]] std::vector<std::vector<std::vector<SizeType32>>> getBatchCacheBlockIds(
        std::vector<RequestIdType> const& requestIds, SizeType32 windowSize) const;
    [[nodiscard]] std::optional<BlockIdType> getLastBlockId(RequestIdType requestId) const;
    [[nodiscard]] SizeType32 getNumFrontBlocksRemoved(RequestIdType requestId,
                                                      SizeType32 windowSize) const;
    /// Writes one request's offsets at slot `outputSlotOffset`; returns its block count.
    SizeType32 copyBlockOffsets(BlockOffsetsTensor& output, SizeType32 outputSlotOffset,
                                RequestIdType requestId) const;
    /// TensorRT-LLM's form: `output` an INT32 (KVCacheIndex) host tensor
    /// `[numPools][numSlots][2][maxBlocksPerSeq]`, as BufferManager::cpu makes it. Entries past
    /// the sequence's blocks in its rows are INT32_MAX; other slots are not touched. A tensor of
    /// another type, rank, pool count or row length throws (KVB_STATUS_INVALID_ARGUMENT).
    SizeType32 copyBlockOffsets(ITensor& output, SizeType32 outputSlotOffset,
                                RequestIdType requestId) const;
    /// The offsets of `batchSize` requests whose ids are `firstBatchSlotIdx + i`, at slots
    /// `i * beamWidth`.
    void getBlockOffsetsOfBatch(BlockOffsetsTensor& output, SizeType32 firstBatchSlotIdx,
                                SizeType32 batchSize, SizeType32 beamWidth) const;
    /// The same into a KVCacheIndex tensor (see copyBlockOffsets).
    void getBlockOffsetsOfBatch(ITensor& output, SizeType32 firstBatchSlotIdx, SizeType32 batchSize,
                                SizeType32 beamWidth) const;
    /// The executor's batch form: request i at slots `offset + i * beamWidth`.
    void copyBatchBlockOffsets(BlockOffsetsTensor& output,
                               std::vector<RequestIdType> const& requestIds, SizeType32 beamWidth,
                               SizeType32 offset) const;
    /// The same into a KVCacheIndex tensor (see copyBlockOffsets).
    void copyBatchBlockOffsets(ITensor& output, std::vector<RequestIdType> const& requestIds,
                               SizeType32 beamWidth, SizeType32 offset) const;
    /// The GPU-pool row of each block id of a window; -1 for a block on the host tier.
    [[nodiscard]] std::vector<SizeType32> getMemoryPoolBlockIndicesByBlockIds(
        std::vector<BlockIdType> const& blockIds, SizeType32 windowSize) const;
    [[nodiscard]] SizeType32 getPriorityByBlockId(BlockIdType blockId, SizeType32 windowSize) const;

    // --- reuse ----------------------------------------------------------------------------
    /// The deepest cached block whose chain matches `blockKey` (TensorRT-LLM
    /// `findBlocksInReuseTreeByBlockKey`); null when nothing matches. Its getPrevBlock() walks
    /// to the root.
    [[nodiscard]] BlockPtr findBlocksInReuseTreeByBlockKey(BlockKey const& blockKey,
                                                           SizeType32 windowSize) const;
    /// One walk of the largest window's tree along `uniqueTokens` keyed as `llmRequest`'s
    /// blocks (LoRA task, salt, multimodal items).
    [[nodiscard]] PrefixReuseSummary analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
                                                        LlmRequest const& llmRequest) const;
    [[nodiscard]] PrefixReuseSummary analyzePrefixReuse(VecUniqueTokens const& uniqueTokens,
                                                        LlmRequest const& llmRequest,
                                                        SizeType32 windowSize) const;
    [[nodiscard]] SizeType32 getNeededBlocksOneStep(
        LlmRequest const& req, bool twoStepsLookAhead, SizeType32 windowSize,
        std::optional<PrefixReuseSummary> const& cachedSummary = std::nullopt) const;
    [[nodiscard]] SizeType32 getRemainingBlocksToCompletion(
        LlmRequest const& req, SizeType32 windowSize,
        std::optional<PrefixReuseSummary> const& cachedSummary = std::nullopt) const;
    /// Stores the request's full computed blocks and returns their hash chain.
    std::vector<SizeType64> commitAndGetBlockHashesForRequest(LlmRequest const& llmRequest,
                                                              SizeType32 windowSize);
    /// Drops cached blocks of `targetTokens` past its first `numTokensToKeep` tokens.
    void truncateBlocks(VecTokens const& targetTokens, SizeType32 numTokensToKeep);
    void resetReuseState() { check(kvb_manager_reset_reuse_state(impl().get(), nullptr)); }

    // --- iteration -------------------------------------------------------------------------
    void refreshBlocks() { impl().refreshBlocks(); }
    void flushIterationEvents() { impl().flushIterationEvents(); }
    /// kvblock enqueues its copies on the engine stream: nothing to order here.
    void syncTransferManagerWithBufferManager() {}
    /// Flushed events; no timeout waits until there is one (at once when events are off).
    /// Events in TensorRT-LLM's shape (a variant payload); kvblock's own form is
    /// impl().getLatestEvents().
    [[nodiscard]] std::deque<KVCacheEvent> getLatestEvents(
        std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;
    [[nodiscard]] SizeType32 getMaxCapacityBatchSize(SizeType32 inputLength,
                                                     SizeType32 outputLength) const;

    /// Carries a hybrid model's recurrent state into the request's next block at a block
    /// boundary (TensorRT-LLM `copyLinearAttentionBlock`; kvb_manager_copy_recurrent_state):
    /// the tokens processed are the context position during the context phase and all but the
    /// newest token after it. True when a copy was issued (it is ordered before the engine's
    /// next work on the stream). kvblock keeps a state row in every block, so decode
    /// boundaries copy too (TensorRT-LLM's placeholders make it copy only inside the prompt).
    /// A request the manager does not hold is skipped, as TensorRT-LLM warns and skips it.
    bool copyLinearAttentionBlock(LlmRequest const& llmRequest);
    /// The batch form: one submission (one kernel launch on the CUDA backend) for all.
    bool copyLinearAttentionBlockBatch(std::vector<std::shared_ptr<LlmRequest>> const& requests);

    [[nodiscard]] bool hasSequence(RequestIdType requestId) const;

  private:
    /// `reused` plus what the connector loads past it, bounded by the last prompt token.
    SizeType32 connectorExtended(LlmRequest const& req, SizeType32 inputLength,
                                 SizeType32 reused) const;
    friend class BlockManager;

    template <typename DataType>
    static SizeType32 withDataType(KvblockOptions const& options, DataType dtype) {
        (void)options;
        auto [bytes, kind] = kvDataTypeOf(static_cast<int32_t>(dtype));
        (void)kind;
        if (bytes == 0) throw Error(KVB_STATUS_UNSUPPORTED, "the KV cache cannot hold this type");
        return bytes;
    }
    template <typename DataType>
    static KvblockOptions withDataTypeOptions(KvblockOptions options, DataType dtype) {
        auto kind = kvDataTypeOf(static_cast<int32_t>(dtype)).second;
        if (options.kvDataType == KVB_KV_DATA_TYPE_DEFAULT) options.kvDataType = kind;
        return options;
    }

    /// The estimates' side effect in TensorRT-LLM: a request not yet admitted learns how many
    /// prompt tokens the reuse tree would supply (whole blocks, at most the prompt's whole
    /// blocks), which its scheduler counts against the token budget: the next step's estimate
    /// counts blocks other sequences hold (`onlyAllocated`; a free block may be evicted before
    /// admission), the estimate to completion every cached block. Block budgets are not
    /// reduced by it.
    void estimateReusableTokens(LlmRequest const& req, SizeType32 windowSize,
                                std::optional<PrefixReuseSummary> const& cachedSummary,
                                bool onlyAllocated) const;

    /// Hands kvblock the request's tokens and its computed extent (the context position, or
    /// every token once the context is finished) before a store, as TensorRT-LLM stores up to
    /// the materialized context: kvblock never caches KV nobody computed.
    void syncComputed(LlmRequest const& req);

    /// Reads a live sequence's block ids into its record (made on first use).
    GenerationRequest& refreshSequence(RequestIdType requestId) const;

    bool copyRecurrentState(std::vector<LlmRequest const*> const& requests);

    /// Appends an indexer K layer for every model layer the mask keeps (after the model's).
    void addIndexerLayers(KvblockOptions const& o, std::vector<SizeType32> const& windows);

    /// The index of the first indexer K cache pool (throws without one).
    SizeType32 indexerPoolIdx() const;

    /// A pool view as TensorRT-LLM's tensor (see BlockManager::getPrimaryPool): typed by the
    /// constructor's element type where the pool stores it unquantized, bytes otherwise.
    ITensor::SharedPtr poolTensor(PoolView const& v, kvb_cache_level_t level) const;

    /// Base of data pool `pool` at `level`; null where it has no memory there.
    void* poolBase(SizeType32 pool, kvb_cache_level_t level) const;

    void collectWindows() {
        for (auto const& w : config_.windows) windows_.push_back(w.window_size);
        std::sort(windows_.begin(), windows_.end());
    }

    /// Pins every listed block of a sequence in every window and remembers the group.
    std::vector<BlockIdType> pinSequence(RequestIdType requestId);

    static kvb::Request toKvb(LlmRequest const& req);
    static void setUniqueTokens(kvb::Request& r, VecUniqueTokens const& tokens, bool extra);
    static kvb_request_state_t stateOf(LlmRequest const& req);
    static PrefixReuseSummary fromC(kvb_prefix_reuse_summary_t const& s);
    static kvb_prefix_reuse_summary_t toC(PrefixReuseSummary const& s);

    Config config_;
    /// The constructor's chunkSize (0: none), given to each manager impl() makes.
    SizeType32 maxContextChunkTokens_ = 0;
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
    SizeType32 elementBytes_ = 0;
    std::shared_ptr<void> stream_;  // the engine's stream object, kept alive
    /// The element type the engine constructor was given (its pools' tensors are typed by it).
    std::optional<nvinfer1::DataType> trtDataType_;
    /// BlockManager::getBufferManager's per-window buffer managers (stable references).
    mutable std::mutex bufferManagersMutex_;
    mutable std::map<SizeType32, BufferManager> bufferManagers_;
    std::shared_ptr<kv_connector::KvCacheConnectorManager> connector_;  // null: none
    mutable std::optional<Manager> manager_;
    /// TensorRT-LLM's per-sequence records, refreshed from kvblock (see getSequence).
    mutable std::map<RequestIdType, GenerationRequest> sequences_;
    BlockManager blockManager_{*this};
    /// Pins made through the facade: the smallest window's beam-0 ids -> every window's ids.
    std::mutex pinMutex_;
    std::vector<std::pair<std::vector<BlockIdType>,
                          std::vector<std::pair<SizeType32, std::vector<BlockIdType>>>>>
        pinGroups_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_KV_CACHE_MANAGER_HPP
