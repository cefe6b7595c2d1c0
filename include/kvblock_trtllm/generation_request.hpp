// kvblock_trtllm/generation_request.hpp: TensorRT-LLM's per-sequence view (GenerationRequest)
// and the free helpers its tests and engines call on token vectors (chopVectorIntoBlocks,
// kSWAExtraBlock). Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_GENERATION_REQUEST_HPP
#define KVBLOCK_TRTLLM_GENERATION_REQUEST_HPP

#include <algorithm>
#include <map>
#include <vector>

#include "kvblock_trtllm/types.hpp"

namespace kvb::trtllm {

/// The extra block a sliding-window sequence may hold while its oldest block leaves the window
/// (TensorRT-LLM counts it in calculateMaxBlockRequirements).
inline constexpr SizeType32 kSWAExtraBlock = 1;

/// `vec`'s first `usableSize` elements in blocks of `elementsPerBlock`; the last, shorter one
/// only with `allowPartial` (TensorRT-LLM `chopVectorIntoBlocks`).
template <typename T>
std::vector<std::vector<T>> chopVectorIntoBlocks(std::vector<T> const& vec, SizeType32 usableSize,
                                                 SizeType32 elementsPerBlock, bool allowPartial) {
    std::vector<std::vector<T>> out;
    if (elementsPerBlock <= 0) return out;
    size_t const usable = std::min(vec.size(), static_cast<size_t>(std::max(usableSize, 0)));
    size_t const step = static_cast<size_t>(elementsPerBlock);
    for (size_t begin = 0; begin < usable; begin += step) {
        size_t const end = std::min(usable, begin + step);
        if (end - begin < step && !allowPartial) break;
        out.emplace_back(vec.begin() + static_cast<std::ptrdiff_t>(begin),
                         vec.begin() + static_cast<std::ptrdiff_t>(end));
    }
    return out;
}

/// One sequence as TensorRT-LLM's manager holds it: its id, its KV slots, its beams, and its
/// block ids per window as [beam][block]. KVCacheManager keeps one per live sequence and
/// refreshes it after every call that changes the sequence, so a reference taken from
/// getSequence() or getCacheBlockIds() reads current ids until the sequence is removed (as in
/// TensorRT-LLM, where the same reference is the manager's own record).
class GenerationRequest {
  public:
    using SizeType32 = kvb::trtllm::SizeType32;
    using CacheBlockIds = std::vector<std::vector<SizeType32>>;

    GenerationRequest(RequestIdType requestId, SizeType32 numTokens, SizeType32 beamWidth,
                      std::map<SizeType32, WindowSizeMetadata> const& windowSizesMetadata = {})
        : requestId_(requestId), numTokens_(numTokens), beamWidth_(beamWidth) {
        for (auto const& [window, metadata] : windowSizesMetadata) {
            (void)metadata;
            cacheBlockIds_[window] = CacheBlockIds(static_cast<size_t>(beamWidth));
        }
    }

    [[nodiscard]] RequestIdType getRequestId() const { return requestId_; }
    [[nodiscard]] SizeType32 getNumTokens() const { return numTokens_; }
    [[nodiscard]] SizeType32 getBeamWidth() const { return beamWidth_; }
    /// [beam][block] ids in `windowSize`; an unknown window throws std::out_of_range.
    [[nodiscard]] CacheBlockIds const& getCacheBlockIds(SizeType32 windowSize) const {
        return cacheBlockIds_.at(windowSize);
    }
    [[nodiscard]] SizeType32 getNumFrontBlocksRemoved(SizeType32 windowSize) const {
        auto it = frontBlocksRemoved_.find(windowSize);
        return it == frontBlocksRemoved_.end() ? 0 : it->second;
    }

  private:
    friend class KVCacheManager;
    friend class BlockManager;  // writes an owning BlockManager's ids into its caller's record
    RequestIdType requestId_;
    SizeType32 numTokens_;
    SizeType32 beamWidth_;
    std::map<SizeType32, CacheBlockIds> cacheBlockIds_;
    std::map<SizeType32, SizeType32> frontBlocksRemoved_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_GENERATION_REQUEST_HPP
