// kvblock_trtllm/connector.hpp: TensorRT-LLM's KV-cache connector hook (a Dynamo/KVBM-style
// external store that loads more of a prompt's KV than the reuse tree holds). Part of
// kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_CONNECTOR_HPP
#define KVBLOCK_TRTLLM_CONNECTOR_HPP

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
    /// ones the reuse tree supplied).
    virtual SizeType32 getNumNewMatchedTokens(LlmRequest const& request,
                                              SizeType32 numComputedTokens) = 0;
};

}  // namespace kvb::trtllm::kv_connector

#endif
