// kvblock_trtllm/types.hpp: the plain structs of the facade's calls (statistics, reuse
// summaries, offsets, block keys, construction options and their process-wide default, pool
// views, window metadata, and the stand-in for what TensorRT-LLM's KvCacheConfig hands the
// sizing helpers).
// Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_TYPES_HPP
#define KVBLOCK_TRTLLM_TYPES_HPP

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "kvblock_trtllm/request.hpp"

namespace kvb::trtllm {

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
    BlockKey() = default;
    /// TensorRT-LLM's constructor from plain tokens (extra ids 0) and a LoRA task.
    explicit BlockKey(VecTokens const& tokens, std::optional<uint64_t> loraTaskId = std::nullopt)
        : loraTaskId(loraTaskId) {
        uniqueTokens.reserve(tokens.size());
        for (TokenIdType t : tokens) uniqueTokens.push_back({t, 0});
    }
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

/// What calculateFreeMemBytes reads from TensorRT-LLM's `executor::KvCacheConfig`.
struct KvCacheConfig {
    /// Share of the free GPU memory the KV cache takes; TensorRT-LLM's default is 0.9.
    std::optional<float> freeGpuMemoryFraction;
    /// Bytes of the host (secondary) tier.
    std::optional<uint64_t> hostCacheSize;
};

/// TensorRT-LLM's `KVCacheEventManager` arguments, which kvblock takes in its config.
struct KVCacheEventManager {
    KVCacheEventManager() = default;
    /// TensorRT-LLM's constructor: the event queue's capacity, and the attention-DP rank its
    /// events carry.
    explicit KVCacheEventManager(SizeType32 maxKVEventEntries,
                                 std::optional<SizeType32> attentionDpRank = std::nullopt)
        : maxKVEventEntries(maxKVEventEntries), attentionDpRank(attentionDpRank) {}
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

namespace detail {
inline std::mutex& defaultOptionsMutex() {
    static std::mutex m;
    return m;
}
inline KvblockOptions& defaultOptions() {
    static KvblockOptions o;
    return o;
}
}  // namespace detail

/// The KvblockOptions a manager takes when its constructor is not given any: TensorRT-LLM's
/// constructors have no argument for kvblock's settings, so code built on them unchanged (an
/// engine's construction path, a ported test) gets the copy backend and the rest from here.
/// Set once before building managers; a manager keeps the options it was built with.
inline void setDefaultKvblockOptions(KvblockOptions options) {
    std::lock_guard<std::mutex> lock(detail::defaultOptionsMutex());
    detail::defaultOptions() = std::move(options);
}
/// What setDefaultKvblockOptions set (KvblockOptions{} until then: no pool memory).
inline KvblockOptions getDefaultKvblockOptions() {
    std::lock_guard<std::mutex> lock(detail::defaultOptionsMutex());
    return detail::defaultOptions();
}

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

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_TYPES_HPP
