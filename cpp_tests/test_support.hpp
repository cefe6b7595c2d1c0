// Helpers shared by several GoogleTest suites of cpp_tests/. Header-only; everything goes through
// the public C ABI (kvblock.h) and its C++ wrapper (kvblock.hpp). Helpers that serve one suite
// only stay in that suite's file.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"

namespace kvb_test {

// An engine's stream object as the TensorRT-LLM facade takes it (`std::shared_ptr<Stream>`):
// `get()` is the raw stream (none on the host backend); the manager keeps it alive.
struct EngineStream {
    void* get() const { return nullptr; }
};

// Token ids start, start + 1, ..., start + n - 1: a prompt (or generated run) whose content is
// distinct from any other run that does not overlap it.
inline std::vector<int32_t> tokenRun(int32_t start, int32_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
    return v;
}

// The tokens of `a` followed by those of `b` (a prompt extended by more tokens).
inline std::vector<int32_t> concatTokens(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// A list of block ids written inline, to compare with getCacheBlockIds: ids({0, 1, 3}).
inline std::vector<int32_t> ids(std::initializer_list<int32_t> l) {
    return std::vector<int32_t>(l);
}

// Runs `f` and returns the status of the kvb::Error it throws, or KVB_OK when it throws none.
template <typename F>
kvb_status_t statusOf(F&& f) {
    try {
        f();
    } catch (const kvb::Error& e) { return e.status(); }
    return KVB_OK;
}

// A config with one window of `window` tokens (`primary` and `secondary` blocks, one layer of one
// head of size 1), `tokensPerBlock` and `maxSequenceLength`; every other field keeps its
// kvb_manager_config_init default.
inline kvb::Config windowConfig(int32_t window, int32_t primary, int32_t secondary,
                                int32_t tokensPerBlock, int32_t maxSequenceLength) {
    kvb::Config c;
    c.addWindow(window, primary, secondary);
    c.raw.tokens_per_block = tokensPerBlock;
    c.raw.max_sequence_length = maxSequenceLength;
    return c;
}

// The C view of `config` for kvb_manager_create: its raw struct with the window array attached.
// The result points into `config.windows`, so `config` must outlive it.
inline kvb_manager_config_t rawConfig(const kvb::Config& config) {
    kvb_manager_config_t raw = config.raw;
    raw.windows = config.windows.data();
    raw.num_windows = config.windows.size();
    return raw;
}

// Marks sequence `id`'s known tokens computed (its whole prompt, or what its capacity covers), as
// an engine's prefill does before the request is stored or released for reuse: storing stops at
// the history (tokens whose KV is computed), so a sequence admitted and removed with
// store_for_reuse without this stores only what it reused at admission. Goes through
// kvb_manager_advance_history, which stores nothing and emits no events (an engine that stores each
// chunk calls kvb_manager_store_context_blocks instead).
inline void markPrefillComputed(kvb_manager_t* m, uint64_t id) {
    kvb_sequence_lengths_t l{};
    ASSERT_EQ(kvb_manager_get_sequence_lengths(m, id, &l), KVB_OK) << kvb_last_error_message();
    const size_t computed = std::min(l.num_tokens, l.capacity);
    ASSERT_EQ(kvb_manager_advance_history(m, id, computed), KVB_OK) << kvb_last_error_message();
}
inline void markPrefillComputed(kvb::Manager& m, uint64_t id) {
    markPrefillComputed(m.get(), id);
}

// Full prompt blocks of `tokens` currently in the reuse tree of `window` (host or primary), as
// counted for a request id no test admits.
inline int32_t reusableBlocks(kvb::Manager& m, const std::vector<int32_t>& tokens, int32_t window) {
    return m.countReusableBlocks(kvb::Request(999999, tokens), window);
}

// Expects every field of two whole-manager statistics to be equal.
inline void expectSameStats(const kvb_kv_cache_stats_t& a, const kvb_kv_cache_stats_t& b) {
    EXPECT_EQ(a.max_num_blocks, b.max_num_blocks);
    EXPECT_EQ(a.free_num_blocks, b.free_num_blocks);
    EXPECT_EQ(a.used_num_blocks, b.used_num_blocks);
    EXPECT_EQ(a.tokens_per_block, b.tokens_per_block);
    EXPECT_EQ(a.alloc_total_blocks, b.alloc_total_blocks);
    EXPECT_EQ(a.alloc_new_blocks, b.alloc_new_blocks);
    EXPECT_EQ(a.reused_blocks, b.reused_blocks);
    EXPECT_EQ(a.missed_blocks, b.missed_blocks);
    EXPECT_EQ(a.cache_hit_rate, b.cache_hit_rate);
    EXPECT_EQ(a.num_primary_blocks, b.num_primary_blocks);
    EXPECT_EQ(a.num_secondary_blocks, b.num_secondary_blocks);
    EXPECT_EQ(a.free_secondary_blocks, b.free_secondary_blocks);
    EXPECT_EQ(a.offloaded_blocks, b.offloaded_blocks);
    EXPECT_EQ(a.onboarded_blocks, b.onboarded_blocks);
    EXPECT_EQ(a.allocated_bytes, b.allocated_bytes);
}

}  // namespace kvb_test
