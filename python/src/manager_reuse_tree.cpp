// KVCacheManager methods of TensorRT-LLM's 2026 surface: prefix analysis in one walk and the
// estimates that reuse it, reuse-tree lookups by key (with pins), truncate and reset, committed
// hash chains, per-iteration statistics, and per-sequence / per-block queries.
#include "manager.hpp"
#include "requests.hpp"

namespace kvb_py {

namespace {

/// Every window's iteration statistics (kvb_manager_get_iteration_stats), keyed by window size.
std::vector<kvb_iteration_stats_t> iteration_stats(Manager& self) {
    std::vector<kvb_iteration_stats_t> out(self.config.windows.size());
    size_t n = 0;
    call([&] { return kvb_manager_get_iteration_stats(self.h(), out.data(), out.size(), &n); });
    out.resize(n);
    return out;
}

}  // namespace

void init_manager_reuse_tree(nb::module_& m, ManagerClass& cls) {
    auto summary =
        nb::class_<kvb_prefix_reuse_summary_t>(
            m, "PrefixReuseSummary",
            "One reuse-tree walk along a prompt (TensorRT-LLM ``PrefixReuseSummary``): reusable "
            "full blocks some sequence holds, all reusable full blocks, and the index of the first "
            "block the tree lacks (-1: none, reuse off).")
            .def(nb::init<>())
            .def_rw("reusable_blocks_allocated",
                    &kvb_prefix_reuse_summary_t::reusable_blocks_allocated)
            .def_rw("reusable_blocks_all", &kvb_prefix_reuse_summary_t::reusable_blocks_all)
            .def_rw("first_new_block_index", &kvb_prefix_reuse_summary_t::first_new_block_index);
    add_repr(summary, "PrefixReuseSummary",
             {"reusable_blocks_allocated", "reusable_blocks_all", "first_new_block_index"});

    auto stats =
        nb::class_<kvb_iteration_stats_t>(
            m, "IterationStats",
            "One window's statistics since the previous ``get_iteration_stats`` "
            "(TensorRT-LLM ``KvCacheIterationStats``): gauges now, ``iter_*`` counts "
            "over the interval.")
            .def_ro("window_size", &kvb_iteration_stats_t::window_size)
            .def_ro("primary_max_blocks", &kvb_iteration_stats_t::primary_max_blocks)
            .def_ro("primary_free_blocks", &kvb_iteration_stats_t::primary_free_blocks)
            .def_ro("primary_used_blocks", &kvb_iteration_stats_t::primary_used_blocks)
            .def_ro("primary_peak_used_blocks", &kvb_iteration_stats_t::primary_peak_used_blocks)
            .def_ro("primary_evictable_blocks", &kvb_iteration_stats_t::primary_evictable_blocks)
            .def_ro("secondary_max_blocks", &kvb_iteration_stats_t::secondary_max_blocks)
            .def_ro("secondary_free_blocks", &kvb_iteration_stats_t::secondary_free_blocks)
            .def_ro("secondary_evictable_blocks",
                    &kvb_iteration_stats_t::secondary_evictable_blocks)
            .def_ro("iter_alloc_total_blocks", &kvb_iteration_stats_t::iter_alloc_total_blocks)
            .def_ro("iter_alloc_new_blocks", &kvb_iteration_stats_t::iter_alloc_new_blocks)
            .def_ro("iter_reused_blocks", &kvb_iteration_stats_t::iter_reused_blocks)
            .def_ro("iter_missed_blocks", &kvb_iteration_stats_t::iter_missed_blocks)
            .def_ro("iter_cache_hit_rate", &kvb_iteration_stats_t::iter_cache_hit_rate)
            .def_ro("iter_onboard_blocks", &kvb_iteration_stats_t::iter_onboard_blocks)
            .def_ro("iter_onboard_bytes", &kvb_iteration_stats_t::iter_onboard_bytes)
            .def_ro("iter_offload_blocks", &kvb_iteration_stats_t::iter_offload_blocks)
            .def_ro("iter_offload_bytes", &kvb_iteration_stats_t::iter_offload_bytes)
            .def_ro("iter_evicted_blocks", &kvb_iteration_stats_t::iter_evicted_blocks);
    add_repr(stats, "IterationStats",
             {"window_size", "primary_used_blocks", "primary_peak_used_blocks",
              "primary_evictable_blocks", "iter_alloc_total_blocks", "iter_reused_blocks",
              "iter_missed_blocks"});

    cls.def(
           "analyze_prefix_reuse",
           [](Manager& self, const PyRequest& request, int32_t w) {
               kvb_prefix_reuse_summary_t s{};
               with_optional_request(&request, [&](const kvb_request_t* r) {
                   call([&] { return kvb_manager_analyze_prefix_reuse(self.h(), r, w, &s); });
               });
               return s;
           },
           "request"_a, "window_size"_a,
           "One walk of a window's reuse tree along the request's prompt (TensorRT-LLM "
           "``analyzePrefixReuse``); changes nothing.")
        .def(
            "get_needed_blocks_one_step_cached",
            [](Manager& self, const kvb_request_state_t& state, const kvb_prefix_reuse_summary_t& s,
               bool two_steps, int32_t w) {
                int32_t n = 0;
                call([&] {
                    return kvb_manager_get_needed_blocks_one_step_cached(self.h(), &state, &s,
                                                                         two_steps, w, &n);
                });
                return n;
            },
            "state"_a, "summary"_a, "two_steps_look_ahead"_a, "window_size"_a,
            ":meth:`get_needed_blocks_one_step` with the reuse of an earlier "
            ":meth:`analyze_prefix_reuse` (TensorRT-LLM's ``cachedSummary``).")
        .def(
            "get_remaining_blocks_to_completion_cached",
            [](Manager& self, const kvb_request_state_t& state, const kvb_prefix_reuse_summary_t& s,
               int32_t w) {
                int32_t n = 0;
                call([&] {
                    return kvb_manager_get_remaining_blocks_to_completion_cached(self.h(), &state,
                                                                                 &s, w, &n);
                });
                return n;
            },
            "state"_a, "summary"_a, "window_size"_a,
            ":meth:`get_remaining_blocks_to_completion` with the reuse of an earlier "
            ":meth:`analyze_prefix_reuse`.")
        .def(
            "find_blocks_in_reuse_tree",
            [](Manager& self, const PyRequest& request, int32_t num_tokens, int32_t w, bool pin) {
                const size_t tpb = static_cast<size_t>(self.config.raw.tokens_per_block);
                std::vector<int32_t> ids(request.num_tokens() / tpb + 1);
                size_t n = 0;
                with_optional_request(&request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_find_blocks_in_reuse_tree(
                            self.h(), r, num_tokens, w, pin, ids.data(), ids.size(), &n);
                    });
                });
                ids.resize(n);
                return ids;
            },
            "request"_a, "num_tokens"_a, "window_size"_a, "pin"_a = false,
            "Block ids, root first, of the cached chain spelling the request's first "
            "``num_tokens`` tokens (TensorRT-LLM ``findBlocksInReuseTreeByBlockKey``); with "
            "``pin``, its GPU prefix is pinned (release with :meth:`unpin_blocks_by_id`).")
        .def(
            "store_blocks",
            [](Manager& self, const PyRequest& request, int32_t num_tokens, int32_t w,
               const std::vector<int32_t>& ids, bool pin) {
                std::vector<int32_t> pinned(pin ? ids.size() : 0);
                size_t n = 0;
                int32_t stored = 0;
                with_optional_request(&request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_store_blocks(self.h(), r, num_tokens, w, ids.data(),
                                                        ids.size(), pin, pinned.data(),
                                                        pinned.size(), &n, &stored);
                    });
                });
                pinned.resize(n);
                return std::make_pair(stored, pinned);
            },
            "request"_a, "num_tokens"_a, "window_size"_a, "block_ids"_a, "pin"_a = false,
            "Stores ``block_ids`` under the keys of the request's first ``num_tokens`` tokens "
            "(TensorRT-LLM ``storeBlocks``): where the tree has a key its cached block is kept, "
            "after the first miss each given block joins. Returns ``(stored, pinned_ids)``.")
        .def(
            "truncate_blocks",
            [](Manager& self, nb::handle tokens, int32_t keep) {
                TokenView view(tokens);
                size_t removed = 0;
                call([&] {
                    return kvb_manager_truncate_blocks(self.h(), view.data, view.size, keep,
                                                       &removed);
                });
                return removed;
            },
            "tokens"_a, "num_tokens_to_keep"_a,
            "Drops the cached blocks of ``tokens`` past its first ``num_tokens_to_keep`` tokens "
            "from every window's tree (TensorRT-LLM ``truncateBlocks``); returns how many left.")
        .def(
            "reset_reuse_state",
            [](Manager& self) {
                size_t removed = 0;
                call([&] { return kvb_manager_reset_reuse_state(self.h(), &removed); });
                return removed;
            },
            "Empties every window's reuse tree (TensorRT-LLM ``resetReuseState``); returns how "
            "many blocks left.")
        .def(
            "commit_block_hashes",
            [](Manager& self, uint64_t id, int32_t w) {
                size_t n = 0;
                kvb_status_t s = nogil([&] {
                    return kvb_manager_commit_block_hashes(self.h(), id, w, nullptr, 0, &n);
                });
                if (s != KVB_STATUS_BUFFER_TOO_SMALL) call([&] { return s; });
                std::vector<uint64_t> hashes(n);
                call([&] {
                    return kvb_manager_commit_block_hashes(self.h(), id, w, hashes.data(),
                                                           hashes.size(), &n);
                });
                hashes.resize(n);
                return hashes;
            },
            "request_id"_a, "window_size"_a,
            "Stores the full computed blocks of a sequence and returns their hash chain "
            "(TensorRT-LLM ``commitAndGetBlockHashesForRequest``).")
        .def(
            "get_iteration_stats",
            [](Manager& self) {
                nb::dict out;
                for (const auto& s : iteration_stats(self))
                    out[nb::int_(s.window_size)] = nb::cast(s);
                return out;
            },
            "Per window size, the statistics since the previous call (TensorRT-LLM "
            "``getIterationStats``).")
        .def(
            "get_beam_width",
            [](Manager& self, uint64_t id) {
                int32_t n = 0;
                call([&] { return kvb_manager_get_beam_width(self.h(), id, &n); });
                return n;
            },
            "request_id"_a, "Beams of a live sequence.")
        .def(
            "get_num_front_blocks_removed",
            [](Manager& self, uint64_t id, int32_t w) {
                int32_t n = 0;
                call([&] { return kvb_manager_get_num_front_blocks_removed(self.h(), id, w, &n); });
                return n;
            },
            "request_id"_a, "window_size"_a,
            "Blocks a sliding window detached from the front of a sequence.")
        .def(
            "get_memory_pool_block_indices",
            [](Manager& self, std::vector<int32_t> ids, int32_t w) {
                std::vector<int32_t> rows(ids.size());
                call([&] {
                    return kvb_manager_get_memory_pool_block_indices(self.h(), w, ids.data(),
                                                                     ids.size(), rows.data());
                });
                return rows;
            },
            "block_ids"_a, "window_size"_a,
            "The GPU-pool row of each block id (-1 on the host tier; TensorRT-LLM "
            "``getMemoryPoolBlockIndicesByBlockIds``).");
}

}  // namespace kvb_py
