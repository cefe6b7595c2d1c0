// kvblock_trtllm/request.hpp: the engine's request as the manager sees it (TensorRT-LLM's
// LlmRequest reduced to what its KVCacheManager reads and writes). Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_REQUEST_HPP
#define KVBLOCK_TRTLLM_REQUEST_HPP

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvblock_trtllm/executor_types.hpp"

namespace kvb::trtllm {

/// What the manager reads from an engine's request and writes back into it (the parts of
/// TensorRT-LLM's `LlmRequest` its KVCacheManager touches). An engine adapts its own request
/// type by overriding these; kvb::trtllm::Request is a plain implementation.
class LlmRequest {
  public:
    virtual ~LlmRequest() = default;

    // Read by admission, lookups and stores.
    virtual RequestIdType getRequestId() const = 0;
    /// Tokens of beam `beam`: prompt, then generated tokens.
    virtual VecTokens const& getTokens(SizeType32 beam) const = 0;
    virtual SizeType32 getPromptLen() const = 0;
    /// Prompt tokens whose KV is computed (after each context chunk).
    virtual SizeType32 getContextCurrentPosition() const = 0;
    /// Extra id per token (multimodal / prompt-tuning tokens), or none.
    virtual std::optional<std::vector<TokenExtraIdType>> getTokenExtraIds() const {
        return std::nullopt;
    }
    virtual std::optional<uint64_t> getLoraTaskId() const { return std::nullopt; }
    virtual std::optional<uint64_t> getCacheSaltID() const { return std::nullopt; }
    /// Multimodal items (content digest, position, length) that key the blocks they cover.
    virtual std::vector<kvb_multimodal_item_t> getMultimodalItems() const { return {}; }
    /// Retention priorities of the prompt's token ranges and of decode blocks; none: defaults.
    virtual std::optional<KvCacheRetentionConfig> getKvCacheRetentionConfig() const {
        return std::nullopt;
    }

    // Read by the scheduler's estimates.
    virtual bool isContextInitState() const = 0;
    virtual bool isFirstContextChunk() const { return getContextCurrentPosition() == 0; }
    virtual bool isGenerationInProgressState() const = 0;
    /// Whether the whole prompt's KV is computed (read by copyLinearAttentionBlock).
    virtual bool isContextFinished() const { return !isContextInitState(); }
    virtual SizeType32 getBeamWidth() const { return 1; }
    virtual SizeType32 getContextChunkSize() const { return getPromptLen(); }
    virtual SizeType32 getNumDraftTokens() const { return 0; }
    virtual SizeType32 getMaxNewTokens() const = 0;
    virtual SizeType32 getNumGeneratedTokens() const {
        return static_cast<SizeType32>(getTokens(0).size()) - getPromptLen();
    }

    // Written by addSequenceBatch.
    virtual void setPrepopulatedPromptLen(SizeType32 prepopulatedPromptLen,
                                          SizeType32 kvTokensPerBlock) = 0;
    virtual void updateAllocTotalBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateAllocNewBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateReusedBlocksPerRequest(SizeType32 n) = 0;
    virtual void updateMissedBlocksPerRequest(SizeType32 n) = 0;
    /// Written by the estimates, which take the request const as TensorRT-LLM's do (keep the
    /// field mutable): prompt tokens the reuse tree would supply to a request not yet
    /// admitted, 0 once admitted (TensorRT-LLM's scheduler reads it back). Ignored by default.
    virtual void setEstimatedReusableTokens(SizeType32 n) const { (void)n; }
};

/// A plain LlmRequest: fields the engine fills, fields the manager writes.
struct Request : LlmRequest {
    RequestIdType requestId = 0;
    std::vector<VecTokens> tokens{VecTokens{}};  // per beam
    SizeType32 promptLen = 0;
    SizeType32 contextCurrentPosition = 0;
    std::optional<std::vector<TokenExtraIdType>> tokenExtraIds;
    std::optional<uint64_t> loraTaskId;
    std::optional<uint64_t> cacheSaltId;
    std::vector<kvb_multimodal_item_t> multimodalItems;
    bool contextInit = true;
    bool generationInProgress = false;
    SizeType32 contextChunkSize = 0;  // 0: the whole prompt
    SizeType32 numDraftTokens = 0;
    SizeType32 maxNewTokens = 0;
    // Written by the manager.
    SizeType32 prepopulatedPromptLen = 0;
    SizeType32 allocTotalBlocks = 0;
    SizeType32 allocNewBlocks = 0;
    SizeType32 reusedBlocks = 0;
    SizeType32 missedBlocks = 0;
    mutable SizeType32 estimatedReusableTokens = 0;

    Request() = default;
    Request(RequestIdType id, VecTokens prompt, SizeType32 maxNew = 0)
        : requestId(id), tokens{std::move(prompt)}, maxNewTokens(maxNew) {
        promptLen = static_cast<SizeType32>(tokens[0].size());
    }
    /// Appends a generated token to every beam.
    void addNewToken(TokenIdType token) {
        for (auto& beam : tokens) beam.push_back(token);
    }

    RequestIdType getRequestId() const override { return requestId; }
    VecTokens const& getTokens(SizeType32 beam) const override {
        return tokens.at(static_cast<size_t>(beam));
    }
    SizeType32 getPromptLen() const override { return promptLen; }
    SizeType32 getContextCurrentPosition() const override { return contextCurrentPosition; }
    std::optional<std::vector<TokenExtraIdType>> getTokenExtraIds() const override {
        return tokenExtraIds;
    }
    std::optional<uint64_t> getLoraTaskId() const override { return loraTaskId; }
    std::optional<uint64_t> getCacheSaltID() const override { return cacheSaltId; }
    std::vector<kvb_multimodal_item_t> getMultimodalItems() const override {
        return multimodalItems;
    }
    bool isContextInitState() const override { return contextInit; }
    bool isGenerationInProgressState() const override { return generationInProgress; }
    SizeType32 getContextChunkSize() const override {
        return contextChunkSize > 0 ? contextChunkSize : promptLen;
    }
    SizeType32 getNumDraftTokens() const override { return numDraftTokens; }
    SizeType32 getMaxNewTokens() const override { return maxNewTokens; }
    void setPrepopulatedPromptLen(SizeType32 len, SizeType32) override {
        prepopulatedPromptLen = len;
    }
    void updateAllocTotalBlocksPerRequest(SizeType32 n) override { allocTotalBlocks += n; }
    void updateAllocNewBlocksPerRequest(SizeType32 n) override { allocNewBlocks += n; }
    void updateReusedBlocksPerRequest(SizeType32 n) override { reusedBlocks += n; }
    void updateMissedBlocksPerRequest(SizeType32 n) override { missedBlocks += n; }
    void setEstimatedReusableTokens(SizeType32 n) const override { estimatedReusableTokens = n; }
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_REQUEST_HPP
