// kvblock_trtllm/executor_types.hpp: the executor-level value types TensorRT-LLM's manager
// takes and returns — the element type enumeration, retention configuration, transfer mode and
// KV-cache events whose payload is a variant — with TensorRT-LLM's names and shapes, so code
// that reads them ports by changing the namespace. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_EXECUTOR_TYPES_HPP
#define KVBLOCK_TRTLLM_EXECUTOR_TYPES_HPP

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvblock_trtllm/vocabulary.hpp"

namespace kvb::trtllm {

/// TensorRT's element types with TensorRT's values (`nvinfer1::DataType`). The facade's
/// constructors take this enumeration or any enumeration with the same values (TensorRT's
/// own, in an engine that includes it).
namespace nvinfer1 {
enum class DataType : int32_t {
    kFLOAT = 0,
    kHALF = 1,
    kINT8 = 2,
    kINT32 = 3,
    kBOOL = 4,
    kUINT8 = 5,
    kFP8 = 6,
    kBF16 = 7,
    kINT64 = 8,
    kINT4 = 9,
    kFP4 = 10,
    kE8M0 = 11,
};
}  // namespace nvinfer1

/// Bytes per element of a TensorRT element type and the kvblock data type that stores it:
/// FP8 and FP4 are quantized caches (FP4 adds a block-scale pool); 0 bytes for a type the
/// cache cannot hold.
inline std::pair<SizeType32, kvb_kv_data_type_t> kvDataTypeOf(int32_t trtDataType) {
    switch (static_cast<nvinfer1::DataType>(trtDataType)) {
        case nvinfer1::DataType::kFLOAT:
        case nvinfer1::DataType::kINT32:
            return {4, KVB_KV_DATA_TYPE_DEFAULT};
        case nvinfer1::DataType::kHALF:
        case nvinfer1::DataType::kBF16:
            return {2, KVB_KV_DATA_TYPE_DEFAULT};
        case nvinfer1::DataType::kINT64:
            return {8, KVB_KV_DATA_TYPE_DEFAULT};
        case nvinfer1::DataType::kINT8:
        case nvinfer1::DataType::kUINT8:
        case nvinfer1::DataType::kBOOL:
            return {1, KVB_KV_DATA_TYPE_DEFAULT};
        case nvinfer1::DataType::kFP8:
            return {1, KVB_KV_DATA_TYPE_FP8};
        case nvinfer1::DataType::kFP4:
            return {1, KVB_KV_DATA_TYPE_NVFP4};
        default:
            return {0, KVB_KV_DATA_TYPE_DEFAULT};
    }
}

using RetentionPriority = SizeType32;
using IdType = uint64_t;

/// TensorRT-LLM `KvCacheTransferMode` (kvblock moves blocks with its copy backend; the mode is
/// accepted and not consulted).
enum class KvCacheTransferMode { DRAM = 0, GDS = 1, POSIX_DEBUG_FALLBACK = 2 };

/// TensorRT-LLM `KvCacheRetentionConfig`: priorities (and durations) for token ranges of the
/// prompt and for the blocks decoding adds. The facade hands them to kvblock at admission.
class KvCacheRetentionConfig {
  public:
    static constexpr RetentionPriority kMinRetentionPriority = 0;
    static constexpr RetentionPriority kMaxRetentionPriority = 100;
    static constexpr RetentionPriority kDefaultRetentionPriority = 35;

    struct TokenRangeRetentionConfig {
        explicit TokenRangeRetentionConfig(
            SizeType32 tokenStart, std::optional<SizeType32> tokenEnd = std::nullopt,
            RetentionPriority priority = kDefaultRetentionPriority,
            std::optional<std::chrono::milliseconds> durationMs = std::nullopt)
            : tokenStart(tokenStart),
              tokenEnd(tokenEnd),
              priority(priority),
              durationMs(durationMs) {}
        SizeType32 tokenStart;
        std::optional<SizeType32> tokenEnd;  // none: to the end of the prompt
        RetentionPriority priority;
        std::optional<std::chrono::milliseconds> durationMs;
    };

    KvCacheRetentionConfig() = default;
    explicit KvCacheRetentionConfig(
        std::vector<TokenRangeRetentionConfig> const& tokenRangeRetentionPriorities,
        RetentionPriority decodeRetentionPriority = kDefaultRetentionPriority,
        std::optional<std::chrono::milliseconds> decodeDurationMs = std::nullopt,
        KvCacheTransferMode transferMode = KvCacheTransferMode::DRAM, std::string directory = "")
        : ranges_(tokenRangeRetentionPriorities),
          decodePriority_(decodeRetentionPriority),
          decodeDuration_(decodeDurationMs),
          transferMode_(transferMode),
          directory_(std::move(directory)) {}

    [[nodiscard]] std::vector<TokenRangeRetentionConfig> const& getTokenRangeRetentionConfigs()
        const {
        return ranges_;
    }
    [[nodiscard]] RetentionPriority getDecodeRetentionPriority() const { return decodePriority_; }
    [[nodiscard]] std::optional<std::chrono::milliseconds> getDecodeDurationMs() const {
        return decodeDuration_;
    }
    [[nodiscard]] KvCacheTransferMode getTransferMode() const { return transferMode_; }
    [[nodiscard]] std::string const& getDirectory() const { return directory_; }

  private:
    std::vector<TokenRangeRetentionConfig> ranges_;
    RetentionPriority decodePriority_ = kDefaultRetentionPriority;
    std::optional<std::chrono::milliseconds> decodeDuration_;
    KvCacheTransferMode transferMode_ = KvCacheTransferMode::DRAM;
    std::string directory_;
};

/// TensorRT-LLM `KVCacheCreatedData`: blocks per cache level (primary, secondary).
struct KVCacheCreatedData {
    std::vector<SizeType32> numBlocksPerCacheLevel;
};

/// TensorRT-LLM `KVCacheStoredBlockData`: one stored block.
struct KVCacheStoredBlockData {
    IdType blockHash = 0;
    VecUniqueTokens tokens;
    std::optional<uint64_t> loraId;
    SizeType32 cacheLevel = 0;
    SizeType32 priority = 0;
    std::optional<uint64_t> cacheSaltId;
};

/// TensorRT-LLM `KVCacheStoredData`: a chain of stored blocks under `parentHash` (none: the
/// root).
struct KVCacheStoredData {
    std::optional<IdType> parentHash;
    std::vector<KVCacheStoredBlockData> blocks;
};

/// TensorRT-LLM `KVCacheRemovedData`.
struct KVCacheRemovedData {
    std::vector<IdType> blockHashes;
};

/// TensorRT-LLM `KVCacheEventDiff`.
template <typename T>
struct KVCacheEventDiff {
    T oldValue;
    T newValue;
};

/// TensorRT-LLM `KVCacheUpdatedData`: what changed about a cached block.
struct KVCacheUpdatedData {
    IdType blockHash = 0;
    std::optional<KVCacheEventDiff<SizeType32>> cacheLevel;
    std::optional<KVCacheEventDiff<SizeType32>> priority;
};

using KVCacheEventData =
    std::variant<KVCacheCreatedData, KVCacheStoredData, KVCacheRemovedData, KVCacheUpdatedData>;

/// TensorRT-LLM `KVCacheEvent`: an id, the window, and the payload as a variant.
struct KVCacheEvent {
    IdType eventId = 0;
    KVCacheEventData data;
    SizeType32 windowSize = 0;
    std::optional<SizeType32> attentionDpRank;
};

/// A kvblock event in TensorRT-LLM's shape.
inline KVCacheEvent toTrtllmEvent(Event const& e) {
    KVCacheEvent out;
    out.eventId = e.id;
    out.windowSize = e.windowSize;
    out.attentionDpRank = e.attentionDpRank;
    switch (e.type) {
        case KVB_EVENT_CREATED:
            out.data = KVCacheCreatedData{{e.numPrimaryBlocks, e.numSecondaryBlocks}};
            break;
        case KVB_EVENT_STORED: {
            KVCacheStoredData stored{e.parentHash, {}};
            for (auto const& b : e.storedBlocks) {
                KVCacheStoredBlockData d;
                d.blockHash = b.hash;
                for (size_t t = 0; t < b.tokens.size(); ++t)
                    d.tokens.push_back(
                        {b.tokens[t], b.extraIds && t < b.extraIds->size() ? (*b.extraIds)[t] : 0});
                d.loraId = b.loraTaskId;
                d.cacheLevel = static_cast<SizeType32>(b.cacheLevel);
                d.priority = b.priority;
                d.cacheSaltId = b.cacheSalt;
                stored.blocks.push_back(std::move(d));
            }
            out.data = std::move(stored);
            break;
        }
        case KVB_EVENT_REMOVED:
            out.data = KVCacheRemovedData{e.removedHashes};
            break;
        default: {
            KVCacheUpdatedData u;
            u.blockHash = e.blockHash;
            if (e.cacheLevel) u.cacheLevel = {{e.cacheLevel->oldValue, e.cacheLevel->newValue}};
            if (e.priority) u.priority = {{e.priority->oldValue, e.priority->newValue}};
            out.data = u;
        }
    }
    return out;
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_EXECUTOR_TYPES_HPP
