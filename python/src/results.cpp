// Results of calls: admission, request stats, lengths, estimates, statistics, block info.
#include "init.hpp"

namespace kvb_py {

void init_results(nb::module_& m) {
    auto rs = nb::class_<kvb_request_stats_t>(
                  m, "RequestStats", "Per-request allocation counters, summed over windows.")
                  .def_ro("alloc_total_blocks", &kvb_request_stats_t::alloc_total_blocks)
                  .def_ro("alloc_new_blocks", &kvb_request_stats_t::alloc_new_blocks)
                  .def_ro("reused_blocks", &kvb_request_stats_t::reused_blocks)
                  .def_ro("missed_blocks", &kvb_request_stats_t::missed_blocks)
                  .def_ro("cache_hit_rate", &kvb_request_stats_t::cache_hit_rate);
    add_repr(rs, "RequestStats",
             {"alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "missed_blocks",
              "cache_hit_rate"});

    auto adm =
        nb::class_<kvb_admission_t>(m, "Admission", "Result of an admission.")
            .def_ro(
                "prepopulated_prompt_len", &kvb_admission_t::prepopulated_prompt_len,
                "Prompt tokens already in the cache: the engine computes from this position on.")
            .def_ro("stats", &kvb_admission_t::stats);
    add_repr(adm, "Admission", {"prepopulated_prompt_len", "stats"});

    auto lengths =
        nb::class_<kvb_sequence_lengths_t>(
            m, "SequenceLengths",
            "A sequence's lengths in tokens: committed <= history <= capacity.")
            .def_ro("num_tokens", &kvb_sequence_lengths_t::num_tokens,
                    "Token ids known: prompt plus generated tokens.")
            .def_ro("capacity", &kvb_sequence_lengths_t::capacity, "Tokens with KV slots.")
            .def_ro("history", &kvb_sequence_lengths_t::history, "Tokens whose KV is computed.")
            .def_ro("committed", &kvb_sequence_lengths_t::committed,
                    "Tokens stored in the reuse tree.")
            .def_ro("reused", &kvb_sequence_lengths_t::reused, "Prompt tokens reused at admission.")
            .def_ro("suspended", &kvb_sequence_lengths_t::suspended);
    add_repr(lengths, "SequenceLengths",
             {"num_tokens", "capacity", "history", "committed", "reused", "suspended"});

    auto est = nb::class_<kvb_batch_estimate_t>(
                   m, "BatchEstimate", "The estimate for one request of a candidate batch.")
                   .def_ro("reusable_tokens", &kvb_batch_estimate_t::reusable_tokens)
                   .def_ro("allocated_blocks", &kvb_batch_estimate_t::allocated_blocks)
                   .def_ro("free_blocks_consumed", &kvb_batch_estimate_t::free_blocks_consumed)
                   .def_ro("reused_blocks", &kvb_batch_estimate_t::reused_blocks)
                   .def_ro("missed_blocks", &kvb_batch_estimate_t::missed_blocks)
                   .def_ro("fits", &kvb_batch_estimate_t::fits,
                           "Whether this request and every one before it fit.");
    add_repr(est, "BatchEstimate",
             {"reusable_tokens", "allocated_blocks", "free_blocks_consumed", "reused_blocks",
              "missed_blocks", "fits"});

    auto stats = nb::class_<kvb_kv_cache_stats_t>(
        m, "KvCacheStats", "Whole-manager statistics (TensorRT-LLM ``KvCacheStats``).");
    // One field per line; clang-format would re-indent the list on every run.
    // clang-format off
#define KVB_STATS_FIELDS(X) \
    X(max_num_blocks)       \
    X(free_num_blocks)      \
    X(used_num_blocks)      \
    X(tokens_per_block)     \
    X(alloc_total_blocks)   \
    X(alloc_new_blocks)     \
    X(reused_blocks)        \
    X(missed_blocks)        \
    X(cache_hit_rate)       \
    X(num_primary_blocks)   \
    X(num_secondary_blocks) \
    X(free_secondary_blocks) \
    X(offloaded_blocks)     \
    X(onboarded_blocks)     \
    X(evicted_blocks)       \
    X(allocated_bytes)
    // clang-format on
#define X(name) stats.def_ro(#name, &kvb_kv_cache_stats_t::name);
    KVB_STATS_FIELDS(X)
#undef X
#define X(name) #name,
    add_repr(stats, "KvCacheStats", {KVB_STATS_FIELDS(X)});
#undef X

    auto info = nb::class_<kvb_block_info_t>(m, "BlockInfo", "Snapshot of one block.")
                    .def_prop_ro("cache_level",
                                 [](const kvb_block_info_t& b) {
                                     return static_cast<kvb_cache_level_t>(b.cache_level);
                                 })
                    .def_ro("memory_index", &kvb_block_info_t::memory_index,
                            "Row index inside the pools of that level.")
                    .def_ro("ref_count", &kvb_block_info_t::ref_count)
                    .def_ro("priority", &kvb_block_info_t::priority)
                    .def_ro("in_reuse_tree", &kvb_block_info_t::in_reuse_tree)
                    .def_ro("is_leaf", &kvb_block_info_t::is_leaf)
                    .def_ro("is_free", &kvb_block_info_t::is_free, "In a free queue (evictable).")
                    .def_ro("num_tokens", &kvb_block_info_t::num_tokens)
                    .def_ro("hash", &kvb_block_info_t::hash,
                            "TensorRT-LLM block hash (valid when in the tree).")
                    .def_ro("parent", &kvb_block_info_t::parent,
                            "Tree parent block id; -1 = the root; -2 = not in the tree.");
    add_repr(info, "BlockInfo",
             {"cache_level", "memory_index", "ref_count", "priority", "in_reuse_tree", "is_leaf",
              "is_free", "num_tokens", "hash", "parent"});
}

}  // namespace kvb_py
