// Request, retention, multimodal items and the scheduler-side RequestState.
#include "init.hpp"
#include "requests.hpp"

namespace kvb_py {

namespace {

#define KVB_REQUEST_STATE_FIELDS(X) \
    X(prompt_len, int32_t)          \
    X(beam_width, int32_t)          \
    X(context_chunk_size, int32_t)  \
    X(num_draft_tokens, int32_t)    \
    X(max_new_tokens, int32_t)      \
    X(num_generated_tokens, int32_t)

}  // namespace

void init_request(nb::module_& m) {
    auto range =
        nb::class_<kvb_token_range_retention_t>(m, "TokenRangeRetentionConfig",
                                                "Priority (0..100) and optional duration for "
                                                "prompt tokens ``[token_start, token_end)``.")
            .def(
                "__init__",
                [](kvb_token_range_retention_t* r, int32_t start, std::optional<int32_t> end,
                   int32_t priority, std::optional<int64_t> duration_ms) {
                    new (r) kvb_token_range_retention_t{start, end.value_or(-1), priority,
                                                        duration_ms.value_or(-1)};
                },
                "token_start"_a, "token_end"_a = nb::none(), "priority"_a = 35,
                "duration_ms"_a = nb::none(),
                "``token_end`` None = to the end of the sequence; ``duration_ms`` None = forever.")
            .def_ro("token_start", &kvb_token_range_retention_t::token_start)
            .def_prop_ro(
                "token_end",
                [](const kvb_token_range_retention_t& r) { return none_if_negative(r.token_end); })
            .def_ro("priority", &kvb_token_range_retention_t::priority)
            .def_prop_ro("duration_ms", [](const kvb_token_range_retention_t& r) {
                return none_if_negative(r.duration_ms);
            });
    add_repr(range, "TokenRangeRetentionConfig",
             {"token_start", "token_end", "priority", "duration_ms"});

    auto retention =
        nb::class_<RetentionConfig>(
            m, "KvCacheRetentionConfig",
            "Retention of a request's blocks (TensorRT-LLM ``KvCacheRetentionConfig``).")
            .def(
                "__init__",
                [](RetentionConfig* r, std::vector<kvb_token_range_retention_t> ranges,
                   int32_t decode_priority, std::optional<int64_t> decode_duration_ms) {
                    new (r) RetentionConfig{std::move(ranges), decode_priority,
                                            decode_duration_ms.value_or(-1)};
                },
                "token_range_retention_configs"_a = std::vector<kvb_token_range_retention_t>(),
                "decode_retention_priority"_a = 35, "decode_duration_ms"_a = nb::none(),
                "Prompt ranges, the priority of generated blocks and its duration (None = "
                "forever).")
            .def_ro("token_range_retention_configs", &RetentionConfig::ranges)
            .def_ro("decode_retention_priority", &RetentionConfig::decode_priority)
            .def_prop_ro("decode_duration_ms", [](const RetentionConfig& r) {
                return none_if_negative(r.decode_duration_ms);
            });
    add_repr(retention, "KvCacheRetentionConfig",
             {"token_range_retention_configs", "decode_retention_priority", "decode_duration_ms"});

    auto mm =
        nb::class_<kvb_multimodal_item_t>(m, "MultimodalItem",
                                          "A multimodal item: a 32-byte content digest covering "
                                          "``length`` prompt tokens from ``position``.")
            .def(
                "__init__",
                [](kvb_multimodal_item_t* item, nb::bytes digest, int32_t position,
                   int32_t length) {
                    new (item) kvb_multimodal_item_t(make_mm_item(digest, position, length));
                },
                "digest"_a, "position"_a, "length"_a)
            .def_prop_ro("digest",
                         [](const kvb_multimodal_item_t& i) { return digest_bytes(i.digest); })
            .def_ro("position", &kvb_multimodal_item_t::position)
            .def_ro("length", &kvb_multimodal_item_t::length);
    add_repr(mm, "MultimodalItem", {"digest", "position", "length"});

    auto request =
        nb::class_<PyRequest>(m, "Request",
                              "A request to admit (what TensorRT-LLM reads from ``LlmRequest``). "
                              "The tokens are copied once, "
                              "at construction.")
            .def(
                "__init__",
                [](PyRequest* r, uint64_t request_id, nb::handle tokens,
                   std::optional<int32_t> input_length, int32_t beam_width,
                   std::optional<std::vector<uint64_t>> token_extra_ids,
                   std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
                   std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
                   std::optional<RetentionConfig> retention, bool disable_reuse) {
                    new (r) PyRequest(request_id, tokens, input_length, beam_width,
                                      std::move(token_extra_ids), lora_task_id, cache_salt,
                                      std::move(mm_items), std::move(retention), disable_reuse,
                                      /*copy_tokens=*/true);
                },
                "request_id"_a, "tokens"_a, nb::kw_only(), "input_length"_a = nb::none(),
                "beam_width"_a = 1, "token_extra_ids"_a = nb::none(), "lora_task_id"_a = nb::none(),
                "cache_salt"_a = nb::none(), "mm_items"_a = nb::none(), "retention"_a = nb::none(),
                "disable_reuse"_a = false,
                "``tokens``: a sequence of ints or a 1-D int32 array (prompt, plus generated "
                "tokens when "
                "re-admitting). ``input_length`` None = all tokens are prompt. "
                "``token_extra_ids``: one per "
                "token (prompt tuning). ``retention``: a :class:`KvCacheRetentionConfig`. "
                "``disable_reuse``: the request reuses nothing cached and is never stored.")
            .def_prop_ro("request_id", [](const PyRequest& r) { return r.req.id; })
            .def_prop_ro(
                "tokens",
                [](const PyRequest& r) {
                    auto out = new_int32_array({r.num_tokens()});
                    std::memcpy(out.data(), r.tokens(), r.num_tokens() * sizeof(int32_t));
                    return out;
                },
                nb::rv_policy::automatic, "A copy of the tokens (numpy int32).")
            .def_prop_ro("num_tokens", &PyRequest::num_tokens)
            .def_prop_ro("input_length",
                         [](const PyRequest& r) {
                             return r.req.inputLength < 0 ? static_cast<int32_t>(r.num_tokens())
                                                          : r.req.inputLength;
                         })
            .def_prop_ro("beam_width", [](const PyRequest& r) { return r.req.beamWidth; })
            .def_prop_ro("lora_task_id",
                         [](const PyRequest& r) {
                             return r.req.hasLoraTaskId ? std::optional<uint64_t>(r.req.loraTaskId)
                                                        : std::nullopt;
                         })
            .def_prop_ro("cache_salt",
                         [](const PyRequest& r) {
                             return r.req.hasCacheSalt ? std::optional<uint64_t>(r.req.cacheSalt)
                                                       : std::nullopt;
                         })
            .def_prop_ro("token_extra_ids",
                         [](const PyRequest& r) {
                             return r.req.extraIds.empty()
                                        ? std::nullopt
                                        : std::optional<std::vector<uint64_t>>(r.req.extraIds);
                         })
            .def_prop_ro("mm_items", [](const PyRequest& r) { return r.req.mmItems; })
            .def_prop_ro("disable_reuse", [](const PyRequest& r) { return r.req.disableReuse; });
    add_repr(
        request, "Request",
        {"request_id", "num_tokens", "input_length", "beam_width", "lora_task_id", "cache_salt"});

    auto state =
        nb::class_<kvb_request_state_t>(
            m, "RequestState",
            "Scheduler-side state of a request, for the estimates (``kvb_request_state_t``).")
            .def(
                "__init__",
                [](kvb_request_state_t* s, uint64_t request_id, nb::kwargs kwargs) {
                    new (s) kvb_request_state_t{};
                    kvb::check(kvb_request_state_init(s));
                    s->request_id = request_id;
                    for (auto [key, value] : kwargs) {
                        const std::string k = nb::cast<std::string>(key);
#define X(name, type)                    \
    if (k == #name) {                    \
        s->name = nb::cast<type>(value); \
        continue;                        \
    }
                        KVB_REQUEST_STATE_FIELDS(X)
#undef X
                        if (k != "phase") {
                            throw nb::type_error(
                                ("RequestState() got an unexpected keyword argument '" + k + "'")
                                    .c_str());
                        }
                        s->phase = static_cast<int32_t>(nb::cast<kvb_request_phase_t>(value));
                    }
                },
                "request_id"_a, "kwargs"_a,
                "Library defaults (``kvb_request_state_init``: context-init, beam width 1), then "
                "the named "
                "fields: ``phase`` (:class:`RequestPhase`), ``prompt_len``, ``beam_width``, "
                "``context_chunk_size``, ``num_draft_tokens``, ``max_new_tokens``, "
                "``num_generated_tokens``.")
            .def_rw("request_id", &kvb_request_state_t::request_id)
            .def_prop_rw(
                "phase",
                [](const kvb_request_state_t& s) {
                    return static_cast<kvb_request_phase_t>(s.phase);
                },
                [](kvb_request_state_t& s, kvb_request_phase_t p) {
                    s.phase = static_cast<int32_t>(p);
                });
#define X(name, type) state.def_rw(#name, &kvb_request_state_t::name);
    KVB_REQUEST_STATE_FIELDS(X)
#undef X
    add_repr(state, "RequestState",
             {"request_id", "phase", "prompt_len", "beam_width", "context_chunk_size",
              "num_draft_tokens", "max_new_tokens", "num_generated_tokens"});
}

}  // namespace kvb_py
