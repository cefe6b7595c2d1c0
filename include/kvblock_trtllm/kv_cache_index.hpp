// kvblock_trtllm/kv_cache_index.hpp: TensorRT-LLM's `kernels::KVCacheIndex`, the entry type of
// the block-offset tables the facade writes (copyBlockOffsets) and the pool address of a
// standalone KVCacheBlock. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_KV_CACHE_INDEX_HPP
#define KVBLOCK_TRTLLM_KV_CACHE_INDEX_HPP

#include <cstdint>
#include <limits>

#include "kvblock_trtllm/tensor.hpp"

namespace kvb::trtllm {

/// TensorRT-LLM `KVCacheIndex`: a row (or a K/V field) index into a pool, with the top bit
/// saying the row is in the secondary (host) pool. One int32, so an offsets table of them is
/// an INT32 tensor, which is how kvblock writes it (kvb_manager_copy_block_offsets).
class KVCacheIndex {
  public:
    using UnderlyingType = int32_t;
    /// The entry of no block: what kvblock writes past a sequence's blocks (INT32_MAX).
    static KVCacheIndex const nullIndex;
    static constexpr UnderlyingType kSecondaryPoolFlag =
        static_cast<UnderlyingType>(static_cast<uint32_t>(1) << (8 * sizeof(UnderlyingType) - 1));

    /// The index `value` (non-negative) in the primary pool, or the secondary one.
    explicit constexpr KVCacheIndex(UnderlyingType value, bool isSecondary = false)
        : value_(isSecondary ? (value | kSecondaryPoolFlag) : value) {}
    /// The index without the level bit.
    [[nodiscard]] constexpr UnderlyingType get() const { return value_ & ~kSecondaryPoolFlag; }
    [[nodiscard]] constexpr bool isPrimary() const { return (value_ & kSecondaryPoolFlag) == 0; }

    /// Same row at the same level.
    friend constexpr bool operator==(KVCacheIndex a, KVCacheIndex b) {
        return a.value_ == b.value_;
    }
    /// Another row or another level.
    friend constexpr bool operator!=(KVCacheIndex a, KVCacheIndex b) {
        return a.value_ != b.value_;
    }

  private:
    UnderlyingType value_;
};
inline KVCacheIndex const KVCacheIndex::nullIndex{std::numeric_limits<int32_t>::max()};
static_assert(sizeof(KVCacheIndex) == sizeof(int32_t), "an offsets table is an INT32 tensor");

/// A KVCacheIndex table is an INT32 tensor (TensorRT-LLM `TRTDataType<KVCacheIndex>`).
template <>
struct TRTDataType<KVCacheIndex> {
    static constexpr auto value = nvinfer1::DataType::kINT32;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_KV_CACHE_INDEX_HPP
