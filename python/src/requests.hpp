// Requests as the bindings see them: token views without a Python loop, retention, and the C
// views of one request or a batch.
#pragma once

#include "common.hpp"

namespace kvb_py {

using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt64Array = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

/// Token ids viewed without a Python-level loop: a C-contiguous int32 array (numpy, any DLPack
/// or buffer object) is read in place; any other sequence of ints is converted in C++.
struct TokenView {
    const int32_t* data = nullptr;
    size_t size = 0;
    Int32Array array;            // keeps a viewed array alive
    std::vector<int32_t> owned;  // converted tokens

    explicit TokenView(nb::handle tokens) {
        if (nb::try_cast(tokens, array, /*convert=*/false)) {
            data = array.data();
            size = array.shape(0);
            return;
        }
        if (!nb::try_cast(tokens, owned)) {
            throw nb::type_error("tokens must be a sequence of ints or a 1-D int32 array");
        }
        data = owned.data();
        size = owned.size();
    }
};

/// Retention of a request's blocks (TensorRT-LLM `KvCacheRetentionConfig`).
struct RetentionConfig {
    std::vector<kvb_token_range_retention_t> ranges;
    int32_t decode_priority = 35;
    int64_t decode_duration_ms = -1;
};

/// A request to admit: kvb::Request for everything but the tokens, which it owns (Request objects)
/// or views (the keyword form of add_sequence).
struct PyRequest {
    kvb::Request req;
    std::optional<TokenView> view;

    PyRequest(uint64_t request_id, nb::handle tokens, std::optional<int32_t> input_length,
              int32_t beam_width, std::optional<std::vector<uint64_t>> token_extra_ids,
              std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
              std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
              std::optional<RetentionConfig> retention, bool disable_reuse, bool copy_tokens) {
        req.id = request_id;
        view.emplace(tokens);
        if (copy_tokens) {
            req.tokens.assign(view->data, view->data + view->size);
            view.reset();
        }
        req.inputLength = input_length.value_or(-1);
        req.beamWidth = beam_width;
        if (token_extra_ids) req.extraIds = std::move(*token_extra_ids);
        if (lora_task_id) req.withLora(*lora_task_id);
        if (cache_salt) req.withSalt(*cache_salt);
        if (mm_items) req.mmItems = std::move(*mm_items);
        if (retention) {
            req.hasRetention = true;
            req.retentionRanges = retention->ranges;
            req.decodePriority = retention->decode_priority;
            req.decodeDurationMs = retention->decode_duration_ms;
        }
        req.disableReuse = disable_reuse;
    }

    const int32_t* tokens() const { return view ? view->data : req.tokens.data(); }
    size_t num_tokens() const { return view ? view->size : req.tokens.size(); }

    /// The C view of this request; `retention` must outlive its use.
    void fill(kvb_request_t& r, kvb_retention_config_t& retention) const {
        req.fillC(r, retention);
        r.tokens = tokens();
        r.num_tokens = num_tokens();
        r.input_length = req.inputLength < 0 ? static_cast<int32_t>(num_tokens()) : req.inputLength;
    }
};

/// C views of a list of requests, valid while the list lives.
struct CBatch {
    std::vector<kvb_request_t> requests;
    std::vector<kvb_retention_config_t> retention;

    explicit CBatch(const std::vector<const PyRequest*>& batch)
        : requests(batch.size()), retention(batch.size()) {
        for (size_t i = 0; i < batch.size(); ++i) batch[i]->fill(requests[i], retention[i]);
    }
};

/// Calls `f(const kvb_request_t*)` with a C view of an optional request (null when absent).
template <typename F>
void with_optional_request(const PyRequest* request, F&& f) {
    kvb_request_t r;
    kvb_retention_config_t retention;
    if (request) request->fill(r, retention);
    f(request ? &r : nullptr);
}

inline kvb_multimodal_item_t make_mm_item(nb::bytes digest, int32_t position, int32_t length) {
    kvb_multimodal_item_t item{};
    if (digest.size() != sizeof(item.digest)) {
        invalid_argument("a multimodal digest has 32 bytes, got " + std::to_string(digest.size()));
    }
    std::memcpy(item.digest, digest.c_str(), sizeof(item.digest));
    item.position = position;
    item.length = length;
    return item;
}

template <size_t N>
nb::bytes digest_bytes(const uint8_t (&digest)[N]) {
    return nb::bytes(reinterpret_cast<const char*>(digest), N);
}

inline std::optional<int64_t> none_if_negative(int64_t v) {
    return v < 0 ? std::nullopt : std::optional<int64_t>(v);
}

}  // namespace kvb_py
