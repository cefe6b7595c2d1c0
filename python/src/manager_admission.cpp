// KVCacheManager methods: admission.
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

void init_manager_admission(ManagerClass& cls) {
    cls.def(
           "add_sequence",
           [](Manager& self, const PyRequest& request) {
               kvb_admission_t out{};
               kvb_request_t r;
               kvb_retention_config_t retention;
               request.fill(r, retention);
               call([&] { return kvb_manager_add_sequence(self.h(), &r, &out); });
               return out;
           },
           "request"_a,
           "Admits a :class:`Request` (TensorRT-LLM ``addSequence``): reuses cached prefix "
           "blocks, onboards "
           "host blocks, allocates the rest. Raises :class:`OutOfBlocksError` when a window lacks "
           "blocks.")
        .def(
            "add_sequence",
            [](Manager& self, uint64_t request_id, nb::handle tokens,
               std::optional<int32_t> input_length, int32_t beam_width,
               std::optional<std::vector<uint64_t>> token_extra_ids,
               std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
               std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
               std::optional<RetentionConfig> retention, bool disable_reuse) {
                const PyRequest request(request_id, tokens, input_length, beam_width,
                                        std::move(token_extra_ids), lora_task_id, cache_salt,
                                        std::move(mm_items), std::move(retention), disable_reuse,
                                        /*copy_tokens=*/false);
                kvb_admission_t out{};
                kvb_request_t r;
                kvb_retention_config_t ret;
                request.fill(r, ret);
                call([&] { return kvb_manager_add_sequence(self.h(), &r, &out); });
                return out;
            },
            "request_id"_a, "tokens"_a, nb::kw_only(), "input_length"_a = nb::none(),
            "beam_width"_a = 1, "token_extra_ids"_a = nb::none(), "lora_task_id"_a = nb::none(),
            "cache_salt"_a = nb::none(), "mm_items"_a = nb::none(), "retention"_a = nb::none(),
            "disable_reuse"_a = false,
            "Admits a request given by its fields (as :class:`Request`); an int32 array of tokens "
            "is read "
            "in place, without a copy on the Python side.")
        .def(
            "add_sequence_batch",
            [](Manager& self, const std::vector<const PyRequest*>& requests, bool longest_prefix) {
                CBatch batch(requests);
                std::vector<kvb_admission_t> out(requests.size());
                size_t admitted = 0;
                call([&] {
                    return kvb_manager_add_sequence_batch(self.h(), batch.requests.data(),
                                                          batch.requests.size(), longest_prefix,
                                                          out.data(), &admitted);
                });
                out.resize(admitted);
                return out;
            },
            "requests"_a, "longest_prefix"_a = false,
            "Admits requests in order (TensorRT-LLM ``addSequenceBatch``), claiming every reusable "
            "block "
            "first, so it delivers what :meth:`estimate_batch` estimated. All or nothing "
            "(:class:`OutOfBlocksError`), or with ``longest_prefix`` the longest prefix that fits; "
            "returns the admissions of the admitted requests.")
        .def(
            "estimate_batch",
            [](Manager& self, const std::vector<const PyRequest*>& requests) {
                CBatch batch(requests);
                std::vector<kvb_batch_estimate_t> out(requests.size());
                call([&] {
                    return kvb_manager_estimate_batch(self.h(), batch.requests.data(),
                                                      batch.requests.size(), out.data());
                });
                return out;
            },
            "requests"_a,
            "The scheduler's estimate for a candidate batch, in order, each counting the ones "
            "before it. "
            "Changes nothing.");
}

}  // namespace kvb_py
