// What the bad-input suites share (bad_input_*_test.cpp): the fixture's manager, snapshots of
// everything a rejected call must leave as it was, and a call of every manager function.
#pragma once

#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace kvb_bad_input {

inline constexpr int32_t kTpb = 4;
inline constexpr int32_t kWindow = 32;
inline constexpr int32_t kMaxSeqLen = 32;
inline constexpr uint64_t kLive = 1;       // a live sequence of the fixture (11 tokens, 3 blocks)
inline constexpr uint64_t kUnknown = 999;  // never admitted

using kvb_test::statusOf;
using kvb_test::tokenRun;

// Everything a rejected call must leave as it was.
struct Snapshot {
    kvb_kv_cache_stats_t stats{};
    int64_t freeBlocks = -1;
    int64_t freePrimary = -1;
    int64_t freeSecondary = -1;
    // Of the fixture's live sequence and its reuse tree (unused for other managers).
    int32_t liveTokens = -1;
    std::vector<int32_t> liveBlocks;
    int32_t reusableLivePrompt = -1;
    int32_t reusableStoredPrompt = -1;
};

// A C request `id` over all of `tokens` (input length = token count); it points into `tokens`.
inline kvb_request_t cRequest(uint64_t id, const std::vector<int32_t>& tokens) {
    kvb_request_t r;
    kvb_request_init(&r);
    r.request_id = id;
    r.input_length = static_cast<int32_t>(tokens.size());
    r.tokens = tokens.data();
    r.num_tokens = tokens.size();
    return r;
}

// Reusable full blocks of `tokens` in `window` (or -1 if the query fails).
inline int32_t countReusable(kvb_manager_t* m, const std::vector<int32_t>& tokens, int32_t window) {
    kvb_request_t r = cRequest(12345, tokens);
    int32_t n = -1;
    if (kvb_manager_count_reusable_blocks(m, &r, window, false, &n) != KVB_OK) return -1;
    return n;
}

inline Snapshot takeSnapshot(kvb_manager_t* m, int32_t window, bool withFixtureState) {
    Snapshot s;
    EXPECT_EQ(kvb_manager_get_kv_cache_stats(m, &s.stats), KVB_OK);
    EXPECT_EQ(kvb_manager_get_num_free_blocks(m, &s.freeBlocks), KVB_OK);
    EXPECT_EQ(kvb_manager_get_num_free_blocks_per_window_size(m, window, &s.freePrimary,
                                                              &s.freeSecondary),
              KVB_OK);
    if (withFixtureState) {
        EXPECT_EQ(kvb_manager_get_num_tokens(m, kLive, &s.liveTokens), KVB_OK);
        std::vector<int32_t> ids(64, -1);
        size_t n = 0;
        EXPECT_EQ(kvb_manager_get_cache_block_ids(m, kLive, window, 0, ids.data(), ids.size(), &n),
                  KVB_OK);
        ids.resize(n);
        s.liveBlocks = ids;
        s.reusableLivePrompt = countReusable(m, tokenRun(0, 10), window);
        s.reusableStoredPrompt = countReusable(m, tokenRun(50, 9), window);
    }
    return s;
}

inline void expectSameSnapshot(const Snapshot& a, const Snapshot& b) {
    kvb_test::expectSameStats(a.stats, b.stats);
    EXPECT_EQ(a.freeBlocks, b.freeBlocks);
    EXPECT_EQ(a.freePrimary, b.freePrimary);
    EXPECT_EQ(a.freeSecondary, b.freeSecondary);
    EXPECT_EQ(a.liveTokens, b.liveTokens);
    EXPECT_EQ(a.liveBlocks, b.liveBlocks);
    EXPECT_EQ(a.reusableLivePrompt, b.reusableLivePrompt);
    EXPECT_EQ(a.reusableStoredPrompt, b.reusableStoredPrompt);
}

// Runs `call` on manager `handle` (configured with window `window`; `fixture` says whether it holds
// the fixture's live sequence) and checks: the status is `want`, the last-error message is not
// empty, nothing observable changed, and the invariants hold.
#define EXPECT_REJECTED_ON(handle, window, fixture, call, want)                              \
    do {                                                                                     \
        SCOPED_TRACE(#call);                                                                 \
        const Snapshot before_ = takeSnapshot((handle), (window), (fixture));                \
        const kvb_status_t status_ = (call);                                                 \
        const std::string message_ = kvb_last_error_message();                               \
        EXPECT_EQ(status_, (want)) << kvb_status_string(status_) << ": " << message_;        \
        EXPECT_FALSE(message_.empty());                                                      \
        expectSameSnapshot(before_, takeSnapshot((handle), (window), (fixture)));            \
        EXPECT_EQ(kvb_manager_check_invariants(handle), KVB_OK) << kvb_last_error_message(); \
    } while (0)

// On the fixture's manager.
#define EXPECT_REJECTED(call, want) EXPECT_REJECTED_ON(h(), kWindow, true, call, want)

// A single-window manager config (tokens per block 4, window = max sequence length 32).
inline kvb::Config smallConfig(int32_t primary, int32_t secondary) {
    kvb::Config c = kvb_test::windowConfig(kWindow, primary, secondary, kTpb, kMaxSeqLen);
    c.raw.max_beam_width = 2;
    c.raw.manual_clock = true;
    return c;
}

// A raw C handle from a config (for tests that destroy or poison the handle themselves).
inline kvb_manager_t* createRaw(const kvb::Config& config) {
    kvb_manager_config_t raw = kvb_test::rawConfig(config);
    kvb_manager_t* m = nullptr;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_OK) << kvb_last_error_message();
    return m;
}

struct CallResult {
    std::string name;
    kvb_status_t status;
    std::string message;
};

// Calls every function that takes a manager handle (except destroy) with otherwise valid
// arguments, recording each status and message.
inline std::vector<CallResult> callEveryManagerFunction(kvb_manager_t* m) {
    std::vector<CallResult> out;
    auto rec = [&](const char* name, kvb_status_t s) {
        out.push_back(CallResult{name, s, kvb_last_error_message()});
    };
    std::vector<int32_t> tokens = tokenRun(0, 10);
    kvb_request_t req = cRequest(77, tokens);
    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.request_id = 77;
    state.prompt_len = 10;
    kvb_admission_t admission{};
    kvb_kv_cache_stats_t stats{};
    kvb_block_info_t info{};
    int32_t i32 = 0, j32 = 0;
    int64_t i64 = 0, j64 = 0;
    size_t count = 0;
    bool flag = false;
    std::vector<int32_t> ids(64, 0);
    std::vector<int32_t> table(4096, 0);
    uint64_t rid = kLive;
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    int32_t pinned = 0;

    rec("add_sequence", kvb_manager_add_sequence(m, &req, &admission));
    rec("add_sequence_batch",
        kvb_manager_add_sequence_batch(m, &req, 1, false, &admission, &count));
    kvb_batch_estimate_t estimate{};
    rec("estimate_batch", kvb_manager_estimate_batch(m, &req, 1, &estimate));
    rec("add_token", kvb_manager_add_token(m, kLive, 5));
    rec("remove_token", kvb_manager_remove_token(m, kLive));
    rec("rewind_kv_cache", kvb_manager_rewind_kv_cache(m, kLive, 1));
    rec("store_context_blocks", kvb_manager_store_context_blocks(m, kLive, 4));
    rec("store_new_block", kvb_manager_store_new_block(m, kLive));
    rec("store_blocks_for_reuse",
        kvb_manager_store_blocks_for_reuse(m, kLive, false, 0, ids.data(), ids.size(), &count));
    rec("remove_sequence", kvb_manager_remove_sequence(m, kLive, true));
    rec("pin_blocks", kvb_manager_pin_blocks(m, kLive));
    rec("unpin_blocks_by_id", kvb_manager_unpin_blocks_by_id(m, kWindow, &pinned, 1));
    rec("get_cache_block_ids",
        kvb_manager_get_cache_block_ids(m, kLive, kWindow, 0, ids.data(), ids.size(), &count));
    rec("get_offset_table_dimensions", kvb_manager_get_offset_table_dimensions(m, &i32, &j32));
    rec("get_max_blocks_per_seq", kvb_manager_get_max_blocks_per_seq(m, kWindow, &i32));
    rec("get_host_tier_blocks", kvb_manager_get_host_tier_blocks(m, kWindow, &i64));
    rec("copy_block_offsets",
        kvb_manager_copy_block_offsets(m, table.data(), table.size(), 1, 0, kLive, &i32));
    rec("get_block_offsets_of_batch",
        kvb_manager_get_block_offsets_of_batch(m, table.data(), table.size(), 1, &rid, 1, 1));
    rec("get_kv_cache_stats", kvb_manager_get_kv_cache_stats(m, &stats));
    rec("get_num_free_blocks", kvb_manager_get_num_free_blocks(m, &i64));
    rec("get_num_free_blocks_per_window_size",
        kvb_manager_get_num_free_blocks_per_window_size(m, kWindow, &i64, &j64));
    rec("get_request_stats", kvb_manager_get_request_stats(m, kLive, &admission));
    rec("get_num_tokens", kvb_manager_get_num_tokens(m, kLive, &i32));
    rec("start_scheduling", kvb_manager_start_scheduling(m));
    rec("set_max_context_chunk_tokens", kvb_manager_set_max_context_chunk_tokens(m, 64));
    rec("wait_for_copies_on_host", kvb_manager_wait_for_copies_on_host(m));
    rec("scheduling_remove_sequence", kvb_manager_scheduling_remove_sequence(m, kLive));
    rec("scheduling_has_free_blocks", kvb_manager_scheduling_has_free_blocks(m, 1, kWindow, &flag));
    rec("get_needed_blocks_one_step",
        kvb_manager_get_needed_blocks_one_step(m, &state, &req, false, kWindow, &i32));
    rec("get_remaining_blocks_to_completion",
        kvb_manager_get_remaining_blocks_to_completion(m, &state, &req, kWindow, &i32));
    rec("count_reusable_blocks", kvb_manager_count_reusable_blocks(m, &req, kWindow, false, &i32));
    rec("get_max_capacity_batch_size", kvb_manager_get_max_capacity_batch_size(m, 10, 10, &i32));
    rec("refresh_blocks", kvb_manager_refresh_blocks(m));
    rec("check_invariants", kvb_manager_check_invariants(m));
    rec("advance_time", kvb_manager_advance_time(m, 1));
    rec("get_pool_pointer",
        kvb_manager_get_pool_pointer(m, kWindow, KVB_CACHE_LEVEL_PRIMARY, &base, &rowBytes));
    rec("get_block_info", kvb_manager_get_block_info(m, kWindow, 0, &info));
    rec("offload_block", kvb_manager_offload_block(m, kWindow, 0, &flag));
    rec("get_priority_by_block_id", kvb_manager_get_priority_by_block_id(m, kWindow, 0, &i32));
    rec("get_last_block_id", kvb_manager_get_last_block_id(m, kLive, &i32));
    rec("get_tokens_per_block", kvb_manager_get_tokens_per_block(m, &i32));
    rec("flush_iteration_events", kvb_manager_flush_iteration_events(m));
    kvb_event_batch_t* events = nullptr;
    rec("get_latest_events", kvb_manager_get_latest_events(m, 0, &events));
    kvb_event_batch_free(events);
    kvb_prefix_reuse_summary_t summary{};
    rec("analyze_prefix_reuse", kvb_manager_analyze_prefix_reuse(m, &req, kWindow, &summary));
    rec("get_needed_blocks_one_step_cached",
        kvb_manager_get_needed_blocks_one_step_cached(m, &state, &summary, false, kWindow, &i32));
    rec("get_remaining_blocks_to_completion_cached",
        kvb_manager_get_remaining_blocks_to_completion_cached(m, &state, &summary, kWindow, &i32));
    rec("find_blocks_in_reuse_tree",
        kvb_manager_find_blocks_in_reuse_tree(m, &req, 8, kWindow, false, ids.data(), ids.size(),
                                              &count));
    rec("truncate_blocks", kvb_manager_truncate_blocks(m, tokens.data(), tokens.size(), 4, &count));
    rec("reset_reuse_state", kvb_manager_reset_reuse_state(m, &count));
    uint64_t hashes[8] = {};
    rec("commit_block_hashes",
        kvb_manager_commit_block_hashes(m, kLive, kWindow, hashes, 8, &count));
    kvb_iteration_stats_t iteration[2] = {};
    rec("get_iteration_stats", kvb_manager_get_iteration_stats(m, iteration, 2, &count));
    rec("get_beam_width", kvb_manager_get_beam_width(m, kLive, &i32));
    rec("get_num_front_blocks_removed",
        kvb_manager_get_num_front_blocks_removed(m, kLive, kWindow, &i32));
    rec("get_memory_pool_block_indices",
        kvb_manager_get_memory_pool_block_indices(m, kWindow, &pinned, 1, &j32));
    rec("onboard_block", kvb_manager_onboard_block(m, kWindow, 0, &flag));
    rec("set_block_priority", kvb_manager_set_block_priority(m, kWindow, 0, 50));
    rec("pin_blocks_by_id", kvb_manager_pin_blocks_by_id(m, kWindow, &pinned, 1));
    int32_t numStored = 0;
    rec("store_blocks", kvb_manager_store_blocks(m, &req, 8, kWindow, &pinned, 1, false, nullptr, 0,
                                                 &count, &numStored));
    const int32_t position = 4;
    rec("copy_recurrent_state", kvb_manager_copy_recurrent_state(m, &rid, &position, 1, &count));
    rec("add_slot", kvb_manager_add_slot(m, kLive, &flag));
    // Disaggregated prefill/decode.
    uint8_t blob[64] = {};
    char name[16] = {};
    size_t len = 0, len2 = 0;
    uint64_t hold = 0;
    bool got = false;
    rec("attach_loopback", kvb_manager_attach_loopback(m, nullptr, "a", 0, 1, 100));
    rec("attach_nixl", kvb_manager_attach_nixl(m, "a", 0, 1, 100));
    rec("get_transfer_metadata", kvb_manager_get_transfer_metadata(m, blob, sizeof blob, &len));
    rec("export_layout", kvb_manager_export_layout(m, blob, sizeof blob, &len));
    rec("add_transfer_peer",
        kvb_manager_add_transfer_peer(m, blob, sizeof blob, name, sizeof name, &len));
    rec("take_transfer_notification",
        kvb_manager_take_transfer_notification(m, name, sizeof name, &len, blob, sizeof blob, &len2,
                                               &got));
    kvb_transfer_stats_t transferStats{};
    transferStats.struct_size = sizeof transferStats;
    rec("get_transfer_stats", kvb_manager_get_transfer_stats(m, &transferStats));
    rec("begin_send", kvb_manager_begin_send(m, kLive, 0, 8, &hold));
    rec("post_send",
        kvb_manager_post_send(m, 1, "a", blob, sizeof blob, blob, sizeof blob, nullptr, 0));
    kvb_transfer_event_t transferEvents[2] = {};
    rec("poll_transfers", kvb_manager_poll_transfers(m, transferEvents, 2, &len));
    rec("settle_hold", kvb_manager_settle_hold(m, 1, KVB_TRANSFER_DONE, &got));
    rec("release_quarantine", kvb_manager_release_quarantine(m, 1));
    rec("add_sequence_receiving", kvb_manager_add_sequence_receiving(m, &req, &admission));
    rec("get_receive_ticket", kvb_manager_get_receive_ticket(m, kLive, blob, sizeof blob, &len));
    rec("complete_receive", kvb_manager_complete_receive(m, kLive));
    rec("abort_receive", kvb_manager_abort_receive(m, kLive, KVB_TRANSFER_DONE, &hold));
    rec("set_contiguous_runs", kvb_manager_set_contiguous_runs(m, true));
    kvb_row_runs_t runs[2] = {};
    rec("get_row_runs", kvb_manager_get_row_runs(m, kLive, runs, 2, &len));
    rec("debug_trigger_panic", kvb_manager_debug_trigger_panic(m));
    return out;
}

// The fixture: a manager (tokens per block 4, window 32 = max sequence length, 16 primary and 4
// host blocks, beam up to 2, manual clock) holding a live sequence (id 1: 10 prompt tokens plus
// one generated token, 3 blocks) and a stored, released prompt (tokens 50..58).
class BadInputTest : public ::testing::Test {
  protected:
    void SetUp() override {
        manager = std::make_unique<kvb::Manager>(smallConfig(16, 4));
        manager->addSequence(kvb::Request(kLive, tokenRun(0, 10)));
        manager->addToken(kLive, 100);
        manager->addSequence(kvb::Request(2, tokenRun(50, 9)));
        kvb_test::markPrefillComputed(*manager, 2);
        manager->removeSequence(2, true);
        manager->checkInvariants();
    }

    void TearDown() override {
        if (manager) manager->checkInvariants();
    }

    kvb_manager_t* h() const { return manager->get(); }

    // add_sequence with a C view of `r` (no exception), writing the admission to `out`.
    kvb_status_t addRaw(const kvb::Request& r, kvb_admission_t* out = nullptr) {
        return r.withC(
            [&](const kvb_request_t* c) { return kvb_manager_add_sequence(h(), c, out); });
    }

    std::unique_ptr<kvb::Manager> manager;
};

}  // namespace kvb_bad_input
