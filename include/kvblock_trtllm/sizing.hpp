// kvblock_trtllm/sizing.hpp: TensorRT-LLM's static sizing helpers, on a base class as its
// `BaseKVCacheManager` holds them (KVCacheManager derives from it, so
// `KVCacheManager::calculateMaxNumBlocks(...)` and the rest port as written). Sink tokens: only
// 0, as TensorRT-LLM's manager requires. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_SIZING_HPP
#define KVBLOCK_TRTLLM_SIZING_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "kvblock_trtllm/buffer_manager.hpp"
#include "kvblock_trtllm/types.hpp"

namespace kvb::trtllm {

/// TensorRT-LLM `BaseKVCacheManager`'s static helpers over kvblock's sizing calls.
class BaseKVCacheManager {
  public:
    using SizeType32 = kvb::trtllm::SizeType32;
    /// Primary and secondary blocks per window size.
    using BlocksPerWindow = std::map<SizeType32, std::tuple<SizeType32, SizeType32>>;

    /// Slots left empty after the sink tokens so that the first non-sink token starts a block
    /// (TensorRT-LLM's sink bubble). kvblock's managers take no sink tokens; the sizing helpers
    /// compute with them, so an engine's capacity planning ports unchanged.
    [[nodiscard]] static SizeType32 getSinkBubbleLength(SizeType32 sinkTokenLen,
                                                        SizeType32 tokensPerBlock) {
        if (sinkTokenLen < 0 || tokensPerBlock <= 0)
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "negative sink length or empty blocks");
        SizeType32 rest = sinkTokenLen % tokensPerBlock;
        return rest == 0 ? 0 : tokensPerBlock - rest;
    }
    [[nodiscard]] static SizeType32 calculateMaxBlockRequirementsPerBeam(
        SizeType32 sequenceLength, SizeType32 sinkTokenLength, SizeType32 windowSize,
        SizeType32 tokensPerBlock) {
        if (sinkTokenLength != 0) {
            // The window's tokens plus the bubble, and the extra block a sliding window holds.
            SizeType32 bubble = getSinkBubbleLength(sinkTokenLength, tokensPerBlock);
            SizeType32 tokens = std::min(sequenceLength, windowSize) + bubble;
            SizeType32 blocks = (tokens + tokensPerBlock - 1) / tokensPerBlock;
            return sequenceLength > windowSize ? blocks + 1 : blocks;
        }
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
            bufferManager.getDevice(),
            static_cast<double>(config.freeGpuMemoryFraction.value_or(0.9f)),
            bufferManager.memoryPoolFree(), config.hostCacheSize.value_or(0));
        return {primary, secondary};
    }

  protected:
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
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_SIZING_HPP
