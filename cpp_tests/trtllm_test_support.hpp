// Helpers shared by the TensorRT-LLM facade's suites (cpp_tests/trtllm_facade_*_test.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kvblock_trtllm.hpp"

namespace kvb_test {

// An external KV store (TensorRT-LLM's KV-cache connector) that claims a fixed number of
// prompt tokens past the reused prefix and records what it was asked: (request id, tokens the
// cache already had).
class FixedConnector : public kvb::trtllm::kv_connector::KvCacheConnectorManager {
  public:
    explicit FixedConnector(int32_t tokens) : tokens_(tokens) {}
    int32_t getNumNewMatchedTokens(kvb::trtllm::LlmRequest const& request,
                                   int32_t numComputedTokens) override {
        asked.emplace_back(request.getRequestId(), numComputedTokens);
        return tokens_;
    }
    std::vector<std::pair<uint64_t, int32_t>> asked;

  private:
    int32_t tokens_;
};

}  // namespace kvb_test
