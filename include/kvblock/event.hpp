// kvblock/event.hpp: kvb::Event, one KV cache event copied out of a drained batch.
// Part of the C++ wrapper; include kvblock.hpp, which includes every part.
#ifndef KVBLOCK_EVENT_HPP
#define KVBLOCK_EVENT_HPP

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "../kvblock.h"

namespace kvb {

/// One KV cache event, copied out of a drained batch (TensorRT-LLM `executor::KVCacheEvent`).
/// Only the fields of its `type` are meaningful; the others stay empty / zero.
struct Event {
    /// An old and a new value (TensorRT-LLM `KVCacheEventDiff`).
    struct Diff {
        int32_t oldValue = 0;
        int32_t newValue = 0;
    };
    /// A multimodal key of a stored block.
    struct MmKey {
        std::array<uint8_t, 32> digest{};
        int32_t startOffset = 0;
    };
    /// One block of a Stored event (TensorRT-LLM `KVCacheStoredBlockData`).
    struct StoredBlock {
        uint64_t hash = 0;
        std::vector<int32_t> tokens;
        std::optional<std::vector<uint64_t>> extraIds;  // per token, when the request had them
        std::optional<uint64_t> loraTaskId;
        kvb_cache_level_t cacheLevel = KVB_CACHE_LEVEL_PRIMARY;
        int32_t priority = 0;
        std::vector<MmKey> mmKeys;
        std::optional<uint64_t> cacheSalt;
    };

    uint64_t id = 0;
    kvb_event_type_t type = KVB_EVENT_CREATED;
    int32_t windowSize = 0;
    std::optional<int32_t> attentionDpRank;
    /// Created: blocks per cache level of the window.
    int32_t numPrimaryBlocks = 0;
    int32_t numSecondaryBlocks = 0;
    /// Stored: the first block's tree parent (none = the root); block i's parent is block i-1.
    std::optional<uint64_t> parentHash;
    std::vector<StoredBlock> storedBlocks;
    /// Removed.
    std::vector<uint64_t> removedHashes;
    /// Updated: the block and what changed.
    uint64_t blockHash = 0;
    std::optional<Diff> cacheLevel;
    std::optional<Diff> priority;
    /// Stored / Removed: about the disk tier (blocks at `KVB_CACHE_LEVEL_DISK`), not the tree.
    bool diskTier = false;
};

}  // namespace kvb

#endif  // KVBLOCK_EVENT_HPP
