// KVCacheManager methods: scheduling and estimates.
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

void init_manager_scheduling(ManagerClass& cls) {
    cls.def(
           "start_scheduling", [](Manager& self) { nogil([&] { self.m.startScheduling(); }); },
           "Starts a scheduling simulation (TensorRT-LLM ``startScheduling``).")
        .def(
            "set_max_context_chunk_tokens",
            [](Manager& self, int32_t tokens) {
                nogil([&] { self.m.setMaxContextChunkTokens(tokens); });
            },
            "tokens"_a,
            "The most prompt tokens one context step computes (0: not given): a sliding window's "
            "``get_remaining_blocks_to_completion`` then counts up to that many tokens past the "
            "window (TensorRT-LLM's temporary attention window).")
        .def(
            "scheduling_remove_sequence",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.schedulingRemoveSequence(id); }); },
            "request_id"_a,
            "In the simulation, frees what removing a sequence would free (TensorRT-LLM "
            "``schedulingRemoveSequence``).")
        .def(
            "scheduling_has_free_blocks",
            [](Manager& self, int32_t n, int32_t w) {
                return nogil([&] { return self.m.schedulingHasFreeBlocks(n, w); });
            },
            "num_blocks"_a, "window_size"_a,
            "Whether the simulation has at least ``num_blocks`` free blocks in a window.")
        .def(
            "get_needed_blocks_one_step",
            [](Manager& self, const kvb_request_state_t& state, const PyRequest* request,
               bool two_steps, int32_t w) {
                int32_t n = 0;
                with_optional_request(request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_get_needed_blocks_one_step(self.h(), &state, r,
                                                                      two_steps, w, &n);
                    });
                });
                return n;
            },
            "state"_a, "request"_a.none(), "two_steps_look_ahead"_a, "window_size"_a,
            "Blocks the next step of a request needs in one window (TensorRT-LLM "
            "``getNeededBlocksOneStep``), in the C call's argument order; "
            "``request`` (may be None) lets a first context chunk discount prefix blocks other "
            "sequences hold.")
        .def(
            "get_remaining_blocks_to_completion",
            [](Manager& self, const kvb_request_state_t& state, const PyRequest* request,
               int32_t w) {
                int32_t n = 0;
                with_optional_request(request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_get_remaining_blocks_to_completion(self.h(), &state, r,
                                                                              w, &n);
                    });
                });
                return n;
            },
            "state"_a, "request"_a.none(), "window_size"_a,
            "Blocks a request still needs in one window until completion (TensorRT-LLM "
            "``getRemainingBlocksToCompletion``).")
        .def(
            "count_reusable_blocks",
            [](Manager& self, const PyRequest& request, int32_t w, bool only_allocated) {
                int32_t n = 0;
                with_optional_request(&request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_count_reusable_blocks(self.h(), r, w, only_allocated,
                                                                 &n);
                    });
                });
                return n;
            },
            "request"_a, "window_size"_a, "only_allocated"_a = false,
            "Consecutive full prompt blocks of ``request`` in a window's reuse tree (TensorRT-LLM "
            "``countReusableBlocks``).")
        .def(
            "get_max_capacity_batch_size",
            [](Manager& self, int32_t in, int32_t out) {
                return nogil([&] { return self.m.getMaxCapacityBatchSize(in, out); });
            },
            "input_length"_a, "output_length"_a,
            "Most concurrent requests of ``input_length + output_length`` tokens the primary pools "
            "hold.");
}

}  // namespace kvb_py
