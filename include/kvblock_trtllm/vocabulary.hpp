// kvblock_trtllm/vocabulary.hpp: the facade's vocabulary types (TensorRT-LLM's size and id
// aliases, tokens with extra ids, cache types, OptionalRef). Part of kvblock_trtllm.hpp;
// include that.
#ifndef KVBLOCK_TRTLLM_VOCABULARY_HPP
#define KVBLOCK_TRTLLM_VOCABULARY_HPP

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
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
    /// From the smart pointers an engine holds its requests in (null: no value).
    template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
    OptionalRef(std::shared_ptr<U> const& ptr) : ptr_(ptr.get()) {}
    template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
    OptionalRef(std::unique_ptr<U> const& ptr) : ptr_(ptr.get()) {}
    explicit operator bool() const noexcept { return ptr_ != nullptr; }
    bool has_value() const noexcept { return ptr_ != nullptr; }
    T& operator*() const { return *ptr_; }
    T* operator->() const { return ptr_; }

  private:
    T* ptr_ = nullptr;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_VOCABULARY_HPP
