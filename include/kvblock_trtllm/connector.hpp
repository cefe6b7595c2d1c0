// kvblock_trtllm/connector.hpp: TensorRT-LLM's KV-cache connector hook (a Dynamo/KVBM-style
// external store that loads more of a prompt's KV than the reuse tree holds). Part of
// kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_CONNECTOR_HPP
#define KVBLOCK_TRTLLM_CONNECTOR_HPP

#include <type_traits>

#include "kvblock.hpp"
#include "kvblock_trtllm/request.hpp"

namespace kvb::trtllm::kv_connector {

/// What a KVCacheManager asks an external KV store at admission (TensorRT-LLM's
/// `kv_connector::KvCacheConnectorManager`): after the reuse tree's match, how many more prompt
/// tokens the store will load into the request's blocks. The manager adds them to the
/// request's prepopulated length; the connector writes their KV before the engine computes.
class KvCacheConnectorManager {
  public:
    KvCacheConnectorManager() = default;
    virtual ~KvCacheConnectorManager() = default;
    KvCacheConnectorManager(KvCacheConnectorManager const&) = delete;
    KvCacheConnectorManager& operator=(KvCacheConnectorManager const&) = delete;

    /// Tokens the store holds after the first `numComputedTokens` of `request`'s prompt (the
    /// ones the reuse tree supplies). Called before the request is admitted; an exception
    /// leaves the manager unchanged and propagates.
    virtual SizeType32 getNumNewMatchedTokens(LlmRequest const& request,
                                              SizeType32 numComputedTokens) = 0;
};

/// The connector over an engine's own request type (derived from LlmRequest), so the engine's
/// connector overrides `getNumNewMatchedTokens(EngineRequest const&, …)` as it does against
/// TensorRT-LLM. A request of another type reaching it throws (before admission changes
/// anything).
template <typename EngineRequest>
class KvCacheConnectorManagerFor : public KvCacheConnectorManager {
    static_assert(std::is_base_of_v<LlmRequest, EngineRequest>,
                  "the engine's request type derives from kvb::trtllm::LlmRequest");

  public:
    virtual SizeType32 getNumNewMatchedTokens(EngineRequest const& request,
                                              SizeType32 numComputedTokens) = 0;
    SizeType32 getNumNewMatchedTokens(LlmRequest const& request,
                                      SizeType32 numComputedTokens) final {
        auto const* own = dynamic_cast<EngineRequest const*>(&request);
        if (!own)
            throw Error(KVB_STATUS_INVALID_ARGUMENT,
                        "the connector was given a request of another type");
        return getNumNewMatchedTokens(*own, numComputedTokens);
    }
};

}  // namespace kvb::trtllm::kv_connector

#endif
