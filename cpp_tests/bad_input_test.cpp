// Bad input through the C ABI: every invalid argument, config, request or handle is rejected with
// its own status code and a message, and a rejected call leaves the manager exactly as it was
// (statistics, free counts, the live sequence's blocks and the reuse tree), with its invariants
// intact.
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

namespace {

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 32;
constexpr int32_t kMaxSeqLen = 32;
constexpr uint64_t kLive = 1;       // a live sequence of the fixture (11 tokens, 3 blocks)
constexpr uint64_t kUnknown = 999;  // never admitted

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
kvb_request_t cRequest(uint64_t id, const std::vector<int32_t>& tokens) {
    kvb_request_t r;
    kvb_request_init(&r);
    r.request_id = id;
    r.input_length = static_cast<int32_t>(tokens.size());
    r.tokens = tokens.data();
    r.num_tokens = tokens.size();
    return r;
}

// Reusable full blocks of `tokens` in `window` (or -1 if the query fails).
int32_t countReusable(kvb_manager_t* m, const std::vector<int32_t>& tokens, int32_t window) {
    kvb_request_t r = cRequest(12345, tokens);
    int32_t n = -1;
    if (kvb_manager_count_reusable_blocks(m, &r, window, false, &n) != KVB_OK) return -1;
    return n;
}

Snapshot takeSnapshot(kvb_manager_t* m, int32_t window, bool withFixtureState) {
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

void expectSameSnapshot(const Snapshot& a, const Snapshot& b) {
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
kvb::Config smallConfig(int32_t primary, int32_t secondary) {
    kvb::Config c = kvb_test::windowConfig(kWindow, primary, secondary, kTpb, kMaxSeqLen);
    c.raw.max_beam_width = 2;
    c.raw.manual_clock = true;
    return c;
}

// A raw C handle from a config (for tests that destroy or poison the handle themselves).
kvb_manager_t* createRaw(const kvb::Config& config) {
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
std::vector<CallResult> callEveryManagerFunction(kvb_manager_t* m) {
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

// ---------------------------------------------------------------------------------------------
// Null pointers

// Every call that takes a manager rejects a null handle with KVB_STATUS_NULL_POINTER.
TEST_F(BadInputTest, NullManagerIsRejectedByEveryCall) {
    for (const CallResult& r : callEveryManagerFunction(nullptr)) {
        EXPECT_EQ(r.status, KVB_STATUS_NULL_POINTER) << r.name;
        EXPECT_FALSE(r.message.empty()) << r.name;
    }
    // The fixture's manager was not touched by any of them.
    EXPECT_EQ(manager->getNumTokens(kLive), 11);
}

// Destroying a null handle is a no-op that succeeds (like free(NULL)).
TEST(BadInputHandleTest, DestroyNullIsOk) {
    EXPECT_EQ(kvb_manager_destroy(nullptr), KVB_OK);
}

// A null request descriptor is rejected by every call that needs one; the estimates accept a
// null request (it is optional there).
TEST_F(BadInputTest, NullRequestIsRejected) {
    kvb_admission_t out{};
    int32_t n = 0;
    EXPECT_REJECTED(kvb_manager_add_sequence(h(), nullptr, &out), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_count_reusable_blocks(h(), nullptr, kWindow, false, &n),
                    KVB_STATUS_NULL_POINTER);
    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.prompt_len = 8;
    EXPECT_EQ(kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, &n),
              KVB_OK);
    EXPECT_EQ(n, 2);
    // A null scheduler state is not optional.
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), nullptr, nullptr, false, kWindow, &n),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_remaining_blocks_to_completion(h(), nullptr, nullptr, kWindow, &n),
        KVB_STATUS_NULL_POINTER);
}

// A request whose token array is null while it claims tokens is rejected.
TEST_F(BadInputTest, NullTokenArrayIsRejected) {
    kvb_request_t r;
    kvb_request_init(&r);
    r.request_id = 3;
    r.input_length = 4;
    r.tokens = nullptr;
    r.num_tokens = 4;
    EXPECT_REJECTED(kvb_manager_add_sequence(h(), &r, nullptr), KVB_STATUS_NULL_POINTER);
}

// A null config or a null out-handle is rejected by create; a failed create writes null.
TEST(BadInputConfigTest, NullConfigIsRejected) {
    int dummy = 0;
    kvb_manager_t* out = reinterpret_cast<kvb_manager_t*>(&dummy);
    EXPECT_EQ(kvb_manager_create(nullptr, &out), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(out, nullptr);

    kvb::Config c = smallConfig(4, 0);
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    EXPECT_EQ(kvb_manager_create(&raw, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");

    // Windows pointer null while the count says there are windows.
    raw.windows = nullptr;
    out = reinterpret_cast<kvb_manager_t*>(&dummy);
    EXPECT_EQ(kvb_manager_create(&raw, &out), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(out, nullptr);
}

// The *_init functions reject a null struct.
TEST(BadInputConfigTest, InitFunctionsRejectNull) {
    EXPECT_EQ((kvb_manager_config_init)(nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ((kvb_request_init)(nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(kvb_request_init_sized(nullptr, sizeof(kvb_request_t)), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ((kvb_request_state_init)(nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_STRNE(kvb_last_error_message(), "");
}

// Every *_init of the header initialises the caller's own size (the macro passes sizeof) and
// writes struct_size = that size; a size that is no layout of the struct, or a null struct, is
// refused.
template <typename T>
void expectSizedInit(kvb_status_t (*initSized)(T*, size_t), const char* name) {
    SCOPED_TRACE(name);
    T s;
    std::memset(&s, 0xAB, sizeof s);
    ASSERT_EQ(initSized(&s, sizeof s), KVB_OK) << kvb_last_error_message();
    EXPECT_EQ(s.struct_size, sizeof s);
    EXPECT_EQ(initSized(&s, sizeof s + 8), KVB_STATUS_STRUCT_SIZE);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(initSized(&s, 4), KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(initSized(nullptr, sizeof s), KVB_STATUS_NULL_POINTER);
}

TEST(BadInputConfigTest, SizedInitsWriteTheCallersSizeOnly) {
    expectSizedInit(kvb_manager_config_init_sized, "manager config");
    expectSizedInit(kvb_pool_info_init_sized, "pool info");
    expectSizedInit(kvb_request_init_sized, "request");
    expectSizedInit(kvb_request_state_init_sized, "request state");
    expectSizedInit(kvb_event_publisher_config_init_sized, "publisher config");
    expectSizedInit(kvb_disk_tier_config_init_sized, "disk tier config");
    expectSizedInit(kvb_remote_tier_config_init_sized, "remote tier config");
    // The macros give the defaults the symbols give for this header's layout.
    kvb_manager_config_t viaMacro, viaSymbol;
    std::memset(&viaMacro, 0xAB, sizeof viaMacro);
    std::memset(&viaSymbol, 0xCD, sizeof viaSymbol);
    ASSERT_EQ(kvb_manager_config_init(&viaMacro), KVB_OK);
    ASSERT_EQ((kvb_manager_config_init)(&viaSymbol), KVB_OK);
    EXPECT_EQ(viaMacro.struct_size, viaSymbol.struct_size);
    EXPECT_EQ(viaMacro.tokens_per_block, viaSymbol.tokens_per_block);
    EXPECT_EQ(viaMacro.enable_block_reuse, viaSymbol.enable_block_reuse);
    EXPECT_EQ(viaMacro.copy_backend, viaSymbol.copy_backend);
    EXPECT_EQ(viaMacro.windows, viaSymbol.windows);
    EXPECT_EQ(viaMacro.recurrent_snapshot_interval_tokens,
              viaSymbol.recurrent_snapshot_interval_tokens);
}

// add_sequence documents its admission out-pointer as optional: null admits the sequence.
TEST_F(BadInputTest, AddSequenceAcceptsNullAdmissionOut) {
    kvb::Request r(3, tokenRun(50, 9));
    ASSERT_EQ(addRaw(r, nullptr), KVB_OK) << kvb_last_error_message();
    EXPECT_EQ(manager->getNumTokens(3), 9);
    // The admission is still available afterwards: the stored prompt's two full blocks reused.
    EXPECT_EQ(manager->getRequestStats(3).prepopulated_prompt_len, 8);
    manager->checkInvariants();
}

// A required out-pointer that is null fails with KVB_STATUS_NULL_POINTER before the call does
// anything: no offload, no store, no pin happens.
TEST_F(BadInputTest, NullRequiredOutPointerIsRejectedAndChangesNothing) {
    std::vector<int32_t> ids(64);
    std::vector<int32_t> table(4096);
    int32_t i32 = 0;
    int64_t i64 = 0;
    size_t count = 0;
    bool flag = false;
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    uint64_t rid = kLive;
    std::vector<int32_t> tokens = tokenRun(0, 10);
    kvb_request_t req = cRequest(3, tokens);
    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.prompt_len = 8;

    // A free (cached) block: offloading it would change the stats.
    const int32_t freeBlock = [&] {
        for (int32_t b = 0; b < 20; ++b) {
            if (manager->getBlockInfo(kWindow, b).is_free &&
                manager->getBlockInfo(kWindow, b).cache_level == KVB_CACHE_LEVEL_PRIMARY &&
                manager->getBlockInfo(kWindow, b).in_reuse_tree)
                return b;
        }
        return -1;
    }();
    ASSERT_GE(freeBlock, 0);

    EXPECT_REJECTED(kvb_manager_offload_block(h(), kWindow, freeBlock, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_store_blocks_for_reuse(h(), kLive, true, 0, ids.data(), ids.size(), nullptr),
        KVB_STATUS_NULL_POINTER);
    // Pinning with a capacity but no id buffer.
    EXPECT_REJECTED(kvb_manager_store_blocks_for_reuse(h(), kLive, true, 0, nullptr, 4, &count),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_kv_cache_stats(h(), nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_num_free_blocks(h(), nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_num_free_blocks_per_window_size(h(), kWindow, nullptr, &i64),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_num_free_blocks_per_window_size(h(), kWindow, &i64, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_request_stats(h(), kLive, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_num_tokens(h(), kLive, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_last_block_id(h(), kLive, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_tokens_per_block(h(), nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_block_info(h(), kWindow, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_priority_by_block_id(h(), kWindow, 0, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_cache_block_ids(h(), kLive, kWindow, 0, ids.data(), ids.size(), nullptr),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_cache_block_ids(h(), kLive, kWindow, 0, nullptr, 8, &count),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_offset_table_dimensions(h(), nullptr, &i32),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_offset_table_dimensions(h(), &i32, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 1, 0, kLive, nullptr),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_copy_block_offsets(h(), nullptr, table.size(), 1, 0, kLive, &i32),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_block_offsets_of_batch(h(), nullptr, table.size(), 1, &rid, 1, 1),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_block_offsets_of_batch(h(), table.data(), table.size(), 1, nullptr, 1, 1),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_scheduling_has_free_blocks(h(), 1, kWindow, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, nullptr),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_remaining_blocks_to_completion(h(), &state, nullptr, kWindow, nullptr),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_count_reusable_blocks(h(), &req, kWindow, false, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_max_capacity_batch_size(h(), 8, 8, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_pool_pointer(h(), kWindow, KVB_CACHE_LEVEL_PRIMARY, nullptr, &rowBytes),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(
        kvb_manager_get_pool_pointer(h(), kWindow, KVB_CACHE_LEVEL_PRIMARY, &base, nullptr),
        KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_unpin_blocks_by_id(h(), kWindow, nullptr, 1),
                    KVB_STATUS_NULL_POINTER);
    (void)flag;
}

// ---------------------------------------------------------------------------------------------
// struct_size

// A config whose struct_size is not this library's size (an ABI mismatch, or a struct never
// initialised with kvb_manager_config_init) is rejected with KVB_STATUS_STRUCT_SIZE.
TEST(BadInputConfigTest, ConfigStructSizeMismatchIsRejected) {
    kvb::Config c = smallConfig(4, 0);
    for (uint32_t size : {0u, static_cast<uint32_t>(sizeof(kvb_manager_config_t)) - 4u,
                          static_cast<uint32_t>(sizeof(kvb_manager_config_t)) + 8u}) {
        SCOPED_TRACE(size);
        kvb_manager_config_t raw = kvb_test::rawConfig(c);
        raw.struct_size = size;
        int dummy = 0;
        kvb_manager_t* out = reinterpret_cast<kvb_manager_t*>(&dummy);
        EXPECT_EQ(kvb_manager_create(&raw, &out), KVB_STATUS_STRUCT_SIZE);
        EXPECT_STRNE(kvb_last_error_message(), "");
        EXPECT_EQ(out, nullptr);
    }
}

// A request or scheduler state whose struct_size is wrong is rejected with
// KVB_STATUS_STRUCT_SIZE and changes nothing.
TEST_F(BadInputTest, RequestStructSizeMismatchIsRejected) {
    std::vector<int32_t> tokens = tokenRun(50, 9);
    kvb_request_t r = cRequest(3, tokens);
    r.struct_size = static_cast<uint32_t>(sizeof(kvb_request_t)) + 8u;
    kvb_admission_t out{};
    int32_t n = 0;
    EXPECT_REJECTED(kvb_manager_add_sequence(h(), &r, &out), KVB_STATUS_STRUCT_SIZE);
    EXPECT_REJECTED(kvb_manager_count_reusable_blocks(h(), &r, kWindow, false, &n),
                    KVB_STATUS_STRUCT_SIZE);
    r.struct_size = 0;
    EXPECT_REJECTED(kvb_manager_add_sequence(h(), &r, &out), KVB_STATUS_STRUCT_SIZE);

    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.prompt_len = 8;
    state.struct_size = 0;
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, &n),
        KVB_STATUS_STRUCT_SIZE);
    EXPECT_REJECTED(
        kvb_manager_get_remaining_blocks_to_completion(h(), &state, nullptr, kWindow, &n),
        KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(manager->getNumTokens(kLive), 11);
}

// A caller built against the request layout before `disable_reuse` (its struct_size ends there)
// is served: its requests take part in reuse, arrays of them are read with their own stride,
// and nothing past a request's own size is read. One array holds one layout.
TEST_F(BadInputTest, RequestsOfTheLayoutBeforeDisableReuseAreAccepted) {
    constexpr size_t kOldSize = offsetof(kvb_request_t, disable_reuse);
    static_assert(kOldSize % alignof(kvb_request_t) == 0, "the old layout tiles an array");
    std::vector<int32_t> stored = tokenRun(50, 9);
    std::vector<int32_t> fresh = tokenRun(400, 6);
    kvb_request_t full[2] = {cRequest(3, stored), cRequest(4, fresh)};
    full[0].disable_reuse = true;  // never read: the old layout has no such field
    // Exactly two old-layout requests: ASan catches a read past them.
    std::unique_ptr<uint64_t[]> old(new uint64_t[2 * kOldSize / sizeof(uint64_t)]);
    auto* bytes = reinterpret_cast<unsigned char*>(old.get());
    for (size_t i = 0; i < 2; ++i) {
        full[i].struct_size = static_cast<uint32_t>(kOldSize);
        std::memcpy(bytes + i * kOldSize, &full[i], kOldSize);
    }
    const auto* oldArray = reinterpret_cast<const kvb_request_t*>(bytes);
    kvb_admission_t results[2] = {};
    size_t admitted = 0;
    ASSERT_EQ(kvb_manager_add_sequence_batch(h(), oldArray, 2, false, results, &admitted), KVB_OK)
        << kvb_last_error_message();
    EXPECT_EQ(admitted, 2u);
    EXPECT_EQ(results[0].prepopulated_prompt_len, 8);  // the stored prompt is reused
    EXPECT_EQ(manager->getNumTokens(4), 6);
    EXPECT_EQ(kvb_manager_check_invariants(h()), KVB_OK);
    manager->removeSequence(3, false);
    manager->removeSequence(4, false);

    // An old-layout request followed by one of this library's layout.
    // The symbol kvb_request_init (what such a program calls; the header's macro of the same name
    // passes sizeof) writes that layout and nothing past it: ASan catches a byte more.
    std::unique_ptr<uint64_t[]> one(new uint64_t[kOldSize / sizeof(uint64_t)]);
    auto* oldRequest = reinterpret_cast<kvb_request_t*>(one.get());
    ASSERT_EQ((kvb_request_init)(oldRequest), KVB_OK);
    EXPECT_EQ(oldRequest->struct_size, kOldSize);
    EXPECT_EQ(oldRequest->beam_width, 1);
    kvb_request_t sized;
    EXPECT_EQ(kvb_request_init_sized(&sized, kOldSize + 1), KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(kvb_request_init(&sized), KVB_OK);
    EXPECT_EQ(sized.struct_size, sizeof(kvb_request_t));
    EXPECT_FALSE(sized.disable_reuse);

    std::unique_ptr<uint64_t[]> mixed(
        new uint64_t[(kOldSize + sizeof(kvb_request_t)) / sizeof(uint64_t)]);
    auto* mixedBytes = reinterpret_cast<unsigned char*>(mixed.get());
    std::memcpy(mixedBytes, &full[0], kOldSize);
    kvb_request_t current = cRequest(4, fresh);
    std::memcpy(mixedBytes + kOldSize, &current, sizeof(current));
    EXPECT_REJECTED(
        kvb_manager_add_sequence_batch(h(), reinterpret_cast<const kvb_request_t*>(mixedBytes), 2,
                                       false, results, &admitted),
        KVB_STATUS_STRUCT_SIZE);
}

// ---------------------------------------------------------------------------------------------
// Invalid configs

// Creates a manager from smallConfig(4, 2) after `edit` and checks it fails with `want`, a
// message, and a null out-handle.
void expectCreateRejected(
    const std::function<void(kvb_manager_config_t&, std::vector<kvb_window_config_t>&)>& edit,
    kvb_status_t want) {
    kvb::Config c = smallConfig(4, 2);
    std::vector<kvb_window_config_t> windows = c.windows;
    kvb_manager_config_t raw = c.raw;
    edit(raw, windows);
    raw.windows = windows.empty() ? nullptr : windows.data();
    raw.num_windows = windows.size();
    int dummy = 0;
    kvb_manager_t* out = reinterpret_cast<kvb_manager_t*>(&dummy);
    const kvb_status_t s = kvb_manager_create(&raw, &out);
    const std::string message = kvb_last_error_message();
    EXPECT_EQ(s, want) << kvb_status_string(s) << ": " << message;
    EXPECT_FALSE(message.empty());
    EXPECT_EQ(out, nullptr);
    if (s == KVB_OK) kvb_manager_destroy(out);
}

// The unmodified base config is valid (so the rejections below are caused by the edits).
TEST(BadInputConfigTest, BaseConfigIsValid) {
    kvb::Config c = smallConfig(4, 2);
    kvb_manager_t* m = createRaw(c);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(kvb_manager_destroy(m), KVB_OK);
}

// Zero tokens per block cannot form blocks.
TEST(BadInputConfigTest, ZeroTokensPerBlockIsInvalid) {
    expectCreateRejected([](auto& c, auto&) { c.tokens_per_block = 0; }, KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.tokens_per_block = -4; },
                         KVB_STATUS_INVALID_CONFIG);
}

// A window without primary blocks cannot hold any sequence.
TEST(BadInputConfigTest, ZeroPrimaryBlocksIsInvalid) {
    expectCreateRejected([](auto&, auto& w) { w[0].primary_blocks = 0; },
                         KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto&, auto& w) { w[0].primary_blocks = -1; },
                         KVB_STATUS_INVALID_CONFIG);
}

// Secondary blocks may be 0 but not negative.
TEST(BadInputConfigTest, NegativeSecondaryBlocksIsInvalid) {
    expectCreateRejected([](auto&, auto& w) { w[0].secondary_blocks = -1; },
                         KVB_STATUS_INVALID_CONFIG);
}

// Window sizes identify windows: the same size listed twice is ambiguous.
TEST(BadInputConfigTest, DuplicateWindowSizesAreInvalid) {
    expectCreateRejected([](auto&, auto& w) { w.push_back(w[0]); }, KVB_STATUS_INVALID_CONFIG);
}

// A zero or negative window size is invalid.
TEST(BadInputConfigTest, NonPositiveWindowSizeIsInvalid) {
    expectCreateRejected([](auto&, auto& w) { w[0].window_size = 0; }, KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto&, auto& w) { w[0].window_size = -32; }, KVB_STATUS_INVALID_CONFIG);
}

// copy_backend must be a kvb_copy_backend_t value.
TEST(BadInputConfigTest, UnknownCopyBackendIsInvalid) {
    expectCreateRejected([](auto& c, auto&) { c.copy_backend = 7; }, KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.copy_backend = -1; }, KVB_STATUS_INVALID_CONFIG);
}

// At least one window is required.
TEST(BadInputConfigTest, NoWindowsIsInvalid) {
    expectCreateRejected([](auto&, auto& w) { w.clear(); }, KVB_STATUS_INVALID_CONFIG);
}

// The maximum sequence length is required (config_init leaves it 0).
TEST(BadInputConfigTest, ZeroMaxSequenceLengthIsInvalid) {
    expectCreateRejected([](auto& c, auto&) { c.max_sequence_length = 0; },
                         KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.max_sequence_length = -1; },
                         KVB_STATUS_INVALID_CONFIG);
}

// Other sizes: beam width, the offload priority threshold, the host-pool geometry.
TEST(BadInputConfigTest, OtherOutOfRangeFieldsAreInvalid) {
    expectCreateRejected([](auto& c, auto&) { c.max_beam_width = 0; }, KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.secondary_offload_min_priority = 101; },
                         KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.secondary_offload_min_priority = -1; },
                         KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected([](auto& c, auto&) { c.bytes_per_element = -2; },
                         KVB_STATUS_INVALID_CONFIG);
    expectCreateRejected(
        [](auto& c, auto& w) {
            c.copy_backend = KVB_COPY_BACKEND_HOST;
            w[0].num_layers = 0;
        },
        KVB_STATUS_INVALID_CONFIG);
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments of calls

// Window sizes in calls must be positive and configured.
TEST_F(BadInputTest, NegativeOrUnknownWindowSizeIsInvalidArgument) {
    std::vector<int32_t> ids(64);
    size_t count = 0;
    int64_t p = 0, s = 0;
    kvb_block_info_t info{};
    bool flag = false;
    int32_t i32 = 0;
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    for (int32_t w : {-1, -kWindow, 7}) {
        SCOPED_TRACE(w);
        EXPECT_REJECTED(
            kvb_manager_get_cache_block_ids(h(), kLive, w, 0, ids.data(), ids.size(), &count),
            KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(kvb_manager_get_num_free_blocks_per_window_size(h(), w, &p, &s),
                        KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(kvb_manager_get_block_info(h(), w, 0, &info), KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(kvb_manager_offload_block(h(), w, 0, &flag), KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(kvb_manager_get_priority_by_block_id(h(), w, 0, &i32),
                        KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(kvb_manager_scheduling_has_free_blocks(h(), 1, w, &flag),
                        KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(
            kvb_manager_get_pool_pointer(h(), w, KVB_CACHE_LEVEL_PRIMARY, &base, &rowBytes),
            KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_REJECTED(
            kvb_manager_store_blocks_for_reuse(h(), kLive, true, w, ids.data(), ids.size(), &count),
            KVB_STATUS_INVALID_ARGUMENT);
        const int32_t none = 0;
        EXPECT_REJECTED(kvb_manager_unpin_blocks_by_id(h(), w, &none, 0),
                        KVB_STATUS_INVALID_ARGUMENT);
    }
}

// Beam indices and beam widths must be non-negative / positive and within the sequence.
TEST_F(BadInputTest, NegativeBeamIsInvalidArgument) {
    std::vector<int32_t> ids(64);
    size_t count = 0;
    EXPECT_REJECTED(
        kvb_manager_get_cache_block_ids(h(), kLive, kWindow, -1, ids.data(), ids.size(), &count),
        KVB_STATUS_INVALID_ARGUMENT);
    // The live sequence has beam width 1: beam 1 does not exist.
    EXPECT_REJECTED(
        kvb_manager_get_cache_block_ids(h(), kLive, kWindow, 1, ids.data(), ids.size(), &count),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(50, 9)).withBeamWidth(-1)),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(50, 9)).withBeamWidth(0)),
                    KVB_STATUS_INVALID_ARGUMENT);
    std::vector<int32_t> table(4096);
    const uint64_t rid = kLive;
    EXPECT_REJECTED(
        kvb_manager_get_block_offsets_of_batch(h(), table.data(), table.size(), 4, &rid, 1, -1),
        KVB_STATUS_INVALID_ARGUMENT);
}

// Rewinding a negative number of tokens, or more tokens than were generated, is invalid; the
// prompt is never rewound.
TEST_F(BadInputTest, NegativeRewindCountIsInvalidArgument) {
    EXPECT_REJECTED(kvb_manager_rewind_kv_cache(h(), kLive, -1), KVB_STATUS_INVALID_ARGUMENT);
    // One token was generated: two cannot be rewound.
    EXPECT_REJECTED(kvb_manager_rewind_kv_cache(h(), kLive, 2), KVB_STATUS_INVALID_ARGUMENT);
    manager->removeToken(kLive);
    EXPECT_EQ(manager->getNumTokens(kLive), 10);
    manager->addToken(kLive, 100);
}

// Other out-of-range arguments: input length, context position, clock steps, block ids, cache
// level, slots, counts, scheduler state fields, multimodal items.
TEST_F(BadInputTest, OtherOutOfRangeArgumentsAreInvalidArgument) {
    kvb::Request zeroInput(3, tokenRun(50, 9));
    zeroInput.inputLength = 0;
    EXPECT_REJECTED(addRaw(zeroInput), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_store_context_blocks(h(), kLive, -1), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_store_context_blocks(h(), kLive, 11), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_advance_time(h(), -1), KVB_STATUS_INVALID_ARGUMENT);

    kvb_block_info_t info{};
    bool flag = false;
    EXPECT_REJECTED(kvb_manager_get_block_info(h(), kWindow, -1, &info),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_get_block_info(h(), kWindow, 1000, &info),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_offload_block(h(), kWindow, -1, &flag),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_offload_block(h(), kWindow, 1000, &flag),
                    KVB_STATUS_INVALID_ARGUMENT);
    const int32_t used = manager->getCacheBlockIds(kLive, kWindow)[0];
    // Unpinning a block that holds no pin (checked before anything changes: the pinned-looking
    // first id is not unpinned either).
    const int32_t notPinned[] = {used, used};
    EXPECT_REJECTED(kvb_manager_unpin_blocks_by_id(h(), kWindow, notPinned, 2),
                    KVB_STATUS_INVALID_ARGUMENT);
    const int32_t negative[] = {-1};
    EXPECT_REJECTED(kvb_manager_unpin_blocks_by_id(h(), kWindow, negative, 1),
                    KVB_STATUS_INVALID_ARGUMENT);

    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    EXPECT_REJECTED(kvb_manager_get_pool_pointer(h(), kWindow, 5, &base, &rowBytes),
                    KVB_STATUS_INVALID_ARGUMENT);

    std::vector<int32_t> table(4096);
    int32_t i32 = 0;
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 0, 0, kLive, &i32),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 2, -1, kLive, &i32),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 2, 2, kLive, &i32),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_scheduling_has_free_blocks(h(), -1, kWindow, &flag),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(kvb_manager_get_max_capacity_batch_size(h(), -1, 8, &i32),
                    KVB_STATUS_INVALID_ARGUMENT);

    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.prompt_len = -8;
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, &i32),
        KVB_STATUS_INVALID_ARGUMENT);
    state.prompt_len = 8;
    state.phase = 9;
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, &i32),
        KVB_STATUS_INVALID_ARGUMENT);

    kvb_multimodal_item_t item{};
    item.position = -1;
    item.length = 4;
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(50, 9)).withMultimodal(item)),
                    KVB_STATUS_INVALID_ARGUMENT);
    item.position = 0;
    item.length = 0;
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(50, 9)).withMultimodal(item)),
                    KVB_STATUS_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// Request ids

// Every per-request call rejects an id that has no sequence with KVB_STATUS_UNKNOWN_REQUEST.
TEST_F(BadInputTest, UnknownRequestIdIsRejectedByEveryPerRequestCall) {
    std::vector<int32_t> ids(64);
    std::vector<int32_t> table(4096);
    size_t count = 0;
    int32_t i32 = 0;
    kvb_admission_t admission{};
    const uint64_t unknown = kUnknown;
    EXPECT_REJECTED(kvb_manager_add_token(h(), kUnknown, 5), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_remove_token(h(), kUnknown), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_rewind_kv_cache(h(), kUnknown, 1), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_store_context_blocks(h(), kUnknown, 4), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_store_new_block(h(), kUnknown), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_store_blocks_for_reuse(h(), kUnknown, false, 0, nullptr, 0, &count),
                    KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(
        kvb_manager_store_blocks_for_reuse(h(), kUnknown, true, 0, ids.data(), ids.size(), &count),
        KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_remove_sequence(h(), kUnknown, true), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_remove_sequence(h(), kUnknown, false), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_pin_blocks(h(), kUnknown), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(
        kvb_manager_get_cache_block_ids(h(), kUnknown, kWindow, 0, ids.data(), ids.size(), &count),
        KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 1, 0, kUnknown, &i32),
        KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(
        kvb_manager_get_block_offsets_of_batch(h(), table.data(), table.size(), 1, &unknown, 1, 1),
        KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_get_request_stats(h(), kUnknown, &admission),
                    KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_get_num_tokens(h(), kUnknown, &i32), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_scheduling_remove_sequence(h(), kUnknown),
                    KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_get_last_block_id(h(), kUnknown, &i32), KVB_STATUS_UNKNOWN_REQUEST);
    kvb_request_state_t state;
    kvb_request_state_init(&state);
    state.request_id = kUnknown;
    state.phase = KVB_PHASE_GENERATION;
    state.prompt_len = 8;
    state.max_new_tokens = 8;
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step(h(), &state, nullptr, false, kWindow, &i32),
        KVB_STATUS_UNKNOWN_REQUEST);
}

// A removed sequence is gone: removing it again is an unknown request.
TEST_F(BadInputTest, RemovedRequestIdIsUnknown) {
    manager->addSequence(kvb::Request(3, tokenRun(200, 6)));
    manager->removeSequence(3, false);
    EXPECT_REJECTED(kvb_manager_remove_sequence(h(), 3, false), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_add_token(h(), 3, 1), KVB_STATUS_UNKNOWN_REQUEST);
}

// Admitting an id that already has a sequence fails with KVB_STATUS_DUPLICATE_REQUEST and leaves
// the existing sequence (tokens, blocks) as it was.
TEST_F(BadInputTest, DuplicateRequestIdIsRejected) {
    EXPECT_REJECTED(addRaw(kvb::Request(kLive, tokenRun(0, 10))), KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_REJECTED(addRaw(kvb::Request(kLive, tokenRun(300, 5))), KVB_STATUS_DUPLICATE_REQUEST);
}

// A batch is validated as a whole before anything is admitted: one bad request (duplicate id in
// the batch, an id already live, a wrong struct_size, a null array) rejects the batch and admits
// none of the valid requests before it.
TEST_F(BadInputTest, BadRequestInBatchAdmitsNothing) {
    std::vector<int32_t> a = tokenRun(300, 6);
    std::vector<int32_t> b = tokenRun(400, 6);
    kvb_request_t reqs[2];
    reqs[0] = cRequest(3, a);
    reqs[1] = reqs[0];
    reqs[1].tokens = b.data();
    kvb_admission_t results[2] = {};
    size_t admitted = 99;
    // Both requests have id 3.
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, false, results, &admitted),
                    KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, true, results, &admitted),
                    KVB_STATUS_DUPLICATE_REQUEST);
    // The second request's id is live.
    reqs[1].request_id = kLive;
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, true, results, &admitted),
                    KVB_STATUS_DUPLICATE_REQUEST);
    reqs[1].request_id = 4;
    reqs[1].struct_size = 0;
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, true, results, &admitted),
                    KVB_STATUS_STRUCT_SIZE);
    reqs[1].struct_size = reqs[0].struct_size;
    reqs[1].beam_width = 3;
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, true, results, &admitted),
                    KVB_STATUS_BEAM_WIDTH_EXCEEDED);
    reqs[1].beam_width = 1;
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), nullptr, 2, true, results, &admitted),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 2, true, results, nullptr),
                    KVB_STATUS_NULL_POINTER);
    // An empty batch is an invalid argument.
    EXPECT_REJECTED(kvb_manager_add_sequence_batch(h(), reqs, 0, true, results, &admitted),
                    KVB_STATUS_INVALID_ARGUMENT);
    kvb_batch_estimate_t estimates[2] = {};
    EXPECT_REJECTED(kvb_manager_estimate_batch(h(), reqs, 2, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(admitted, 99u);
    // The same batch, now valid, is admitted whole.
    ASSERT_EQ(kvb_manager_estimate_batch(h(), reqs, 2, estimates), KVB_OK)
        << kvb_last_error_message();
    ASSERT_EQ(kvb_manager_add_sequence_batch(h(), reqs, 2, false, results, &admitted), KVB_OK)
        << kvb_last_error_message();
    EXPECT_EQ(admitted, 2u);
    EXPECT_EQ(manager->getNumTokens(3), 6);
    EXPECT_EQ(manager->getNumTokens(4), 6);
}

// An input length above the number of tokens given is KVB_STATUS_TOO_FEW_TOKENS.
TEST_F(BadInputTest, FewerTokensThanInputLengthIsRejected) {
    kvb::Request r(3, tokenRun(50, 5));
    r.inputLength = 9;
    EXPECT_REJECTED(addRaw(r), KVB_STATUS_TOO_FEW_TOKENS);
    int32_t n = 0;
    EXPECT_REJECTED(r.withC([&](const kvb_request_t* c) {
        return kvb_manager_count_reusable_blocks(h(), c, kWindow, false, &n);
    }),
                    KVB_STATUS_TOO_FEW_TOKENS);
    // No tokens at all.
    kvb::Request empty(3, {});
    empty.inputLength = 1;
    EXPECT_REJECTED(addRaw(empty), KVB_STATUS_TOO_FEW_TOKENS);
}

// A beam width above the configured maximum (2) is KVB_STATUS_BEAM_WIDTH_EXCEEDED.
TEST_F(BadInputTest, BeamWidthAboveMaximumIsRejected) {
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(50, 9)).withBeamWidth(3)),
                    KVB_STATUS_BEAM_WIDTH_EXCEEDED);
    // The maximum itself is accepted.
    kvb_admission_t a{};
    EXPECT_EQ(addRaw(kvb::Request(3, tokenRun(400, 5)).withBeamWidth(2), &a), KVB_OK)
        << kvb_last_error_message();
    manager->checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Retention

// Priorities outside 0..=100 and malformed token ranges are KVB_STATUS_INVALID_RETENTION.
TEST_F(BadInputTest, InvalidRetentionIsRejected) {
    auto req = [] { return kvb::Request(3, tokenRun(50, 9)); };
    EXPECT_REJECTED(addRaw(req().withRange(0, 4, 101)), KVB_STATUS_INVALID_RETENTION);
    EXPECT_REJECTED(addRaw(req().withRange(0, 4, -1)), KVB_STATUS_INVALID_RETENTION);
    // [0, 6) and [4, 8) overlap.
    EXPECT_REJECTED(addRaw(req().withRange(0, 6, 50).withRange(4, 8, 50)),
                    KVB_STATUS_INVALID_RETENTION);
    // An open range ([0, end)) must be the last one.
    EXPECT_REJECTED(addRaw(req().withRange(0, -1, 50).withRange(4, 8, 50)),
                    KVB_STATUS_INVALID_RETENTION);
    // Empty / reversed range and negative start.
    EXPECT_REJECTED(addRaw(req().withRange(4, 4, 50)), KVB_STATUS_INVALID_RETENTION);
    EXPECT_REJECTED(addRaw(req().withRange(-4, 4, 50)), KVB_STATUS_INVALID_RETENTION);
    // Durations are -1 (none) or non-negative.
    EXPECT_REJECTED(addRaw(req().withRange(0, 4, 50, -5)), KVB_STATUS_INVALID_RETENTION);
    EXPECT_REJECTED(addRaw(req().withDecodeRetention(50, -5)), KVB_STATUS_INVALID_RETENTION);
    // Decode priority outside 0..=100.
    EXPECT_REJECTED(addRaw(req().withDecodeRetention(101)), KVB_STATUS_INVALID_RETENTION);
    EXPECT_REJECTED(addRaw(req().withDecodeRetention(-1)), KVB_STATUS_INVALID_RETENTION);
    // The limits themselves are valid.
    EXPECT_EQ(addRaw(req().withRange(0, 4, 0).withRange(4, -1, 100).withDecodeRetention(100, 0)),
              KVB_OK)
        << kvb_last_error_message();
}

// ---------------------------------------------------------------------------------------------
// Lengths and capacity

// A prompt longer than max_sequence_length (32) is KVB_STATUS_SEQUENCE_TOO_LONG.
TEST_F(BadInputTest, PromptLongerThanMaxSequenceLengthIsRejected) {
    EXPECT_REJECTED(addRaw(kvb::Request(3, tokenRun(500, kMaxSeqLen + 1))),
                    KVB_STATUS_SEQUENCE_TOO_LONG);
}

// Generating past max_sequence_length is KVB_STATUS_SEQUENCE_TOO_LONG, and the token is not
// appended.
TEST_F(BadInputTest, AddTokenBeyondMaxSequenceLengthIsRejected) {
    manager->addSequence(kvb::Request(3, tokenRun(500, kMaxSeqLen - 1)));
    manager->addToken(3, 1);
    ASSERT_EQ(manager->getNumTokens(3), kMaxSeqLen);
    const auto before = manager->getCacheBlockIds(3, kWindow);
    EXPECT_REJECTED(kvb_manager_add_token(h(), 3, 2), KVB_STATUS_SEQUENCE_TOO_LONG);
    EXPECT_EQ(manager->getNumTokens(3), kMaxSeqLen);
    EXPECT_EQ(manager->getCacheBlockIds(3, kWindow), before);
}

// A result buffer that is too small fails with KVB_STATUS_BUFFER_TOO_SMALL, writes the needed
// count, and writes no ids.
TEST_F(BadInputTest, BufferTooSmallReportsNeededCount) {
    std::vector<int32_t> ids(2, -7);
    size_t count = 0;
    EXPECT_REJECTED(kvb_manager_get_cache_block_ids(h(), kLive, kWindow, 0, ids.data(), 2, &count),
                    KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(count, 3u);
    EXPECT_EQ(ids, std::vector<int32_t>(2, -7));
    // The size-query idiom: no buffer at all.
    count = 0;
    EXPECT_REJECTED(kvb_manager_get_cache_block_ids(h(), kLive, kWindow, 0, nullptr, 0, &count),
                    KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(count, 3u);
    // An offset table smaller than [pools][slots][2][max_blocks_per_seq].
    std::vector<int32_t> table(2 * 8 - 1, -7);
    int32_t maxCount = -1;
    EXPECT_REJECTED(
        kvb_manager_copy_block_offsets(h(), table.data(), table.size(), 1, 0, kLive, &maxCount),
        KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(table, std::vector<int32_t>(2 * 8 - 1, -7));
}

// Pinning through store_blocks_for_reuse with a buffer too small for the pinned ids fails with
// KVB_STATUS_BUFFER_TOO_SMALL and the needed count, like every failed call without storing or
// pinning anything; retrying with that capacity succeeds.
TEST_F(BadInputTest, StoreBlocksForReusePinBufferTooSmallChangesNothing) {
    std::vector<int32_t> ids(1, -7);
    size_t count = 0;
    EXPECT_REJECTED(kvb_manager_store_blocks_for_reuse(h(), kLive, true, 0, ids.data(), 1, &count),
                    KVB_STATUS_BUFFER_TOO_SMALL);
    ASSERT_GE(count, 3u);
    for (int32_t b : manager->getCacheBlockIds(kLive, kWindow)) {
        EXPECT_FALSE(manager->getBlockInfo(kWindow, b).in_reuse_tree) << b;
    }
    ids.assign(count, -7);
    ASSERT_EQ(
        kvb_manager_store_blocks_for_reuse(h(), kLive, true, 0, ids.data(), ids.size(), &count),
        KVB_OK)
        << kvb_last_error_message();
    ids.resize(count);
    EXPECT_EQ(ids, manager->getCacheBlockIds(kLive, kWindow));
    manager->removeSequence(kLive, false);
    manager->unpinBlocksById(kWindow, ids);
    manager->checkInvariants();
    manager.reset();
}

// A manager with 4 primary blocks and no host tier, full with two 8-token sequences.
class BadInputOutOfBlocksTest : public ::testing::Test {
  protected:
    void SetUp() override {
        kvb::Config c = smallConfig(4, 0);
        manager = std::make_unique<kvb::Manager>(c);
    }
    kvb_manager_t* h() const { return manager->get(); }
    std::unique_ptr<kvb::Manager> manager;
};

// Admission that needs more blocks than are free fails with KVB_STATUS_OUT_OF_BLOCKS and changes
// nothing: no blocks leaked, no claims on the reusable prefix left behind.
TEST_F(BadInputOutOfBlocksTest, AddSequenceOutOfBlocksChangesNothing) {
    // Store a 3-block prompt, released: 4 free blocks, two of them reusable.
    manager->addSequence(kvb::Request(1, tokenRun(0, 10)));
    kvb_test::markPrefillComputed(*manager, 1);
    manager->removeSequence(1, true);
    ASSERT_EQ(manager->getNumFreeBlocks(), 4);
    // Shares 8 tokens with it but needs 5 blocks.
    kvb::Request big(2, tokenRun(0, 18));
    EXPECT_REJECTED_ON(h(), kWindow, false, big.withC([&](const kvb_request_t* r) {
        return kvb_manager_add_sequence(h(), r, nullptr);
    }),
                       KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(manager->countReusableBlocks(kvb::Request(9, tokenRun(0, 10)), kWindow), 2);
    // The cached prefix is still reusable.
    EXPECT_EQ(manager->addSequence(kvb::Request(3, tokenRun(0, 10))).prepopulated_prompt_len, 9);
    manager->checkInvariants();
}

// add_token that needs a new block when none is free fails with KVB_STATUS_OUT_OF_BLOCKS and does
// not append the token.
TEST_F(BadInputOutOfBlocksTest, AddTokenOutOfBlocksDoesNotAppendTheToken) {
    manager->addSequence(kvb::Request(1, tokenRun(0, 8)));
    manager->addSequence(kvb::Request(2, tokenRun(100, 8)));
    ASSERT_EQ(manager->getNumFreeBlocks(), 0);
    const auto blocks = manager->getCacheBlockIds(1, kWindow);
    EXPECT_REJECTED_ON(h(), kWindow, false, kvb_manager_add_token(h(), 1, 42),
                       KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(manager->getNumTokens(1), 8);
    EXPECT_EQ(manager->getCacheBlockIds(1, kWindow), blocks);
    // A third sequence does not fit either.
    kvb::Request third(3, tokenRun(200, 2));
    EXPECT_REJECTED_ON(h(), kWindow, false, third.withC([&](const kvb_request_t* r) {
        return kvb_manager_add_sequence(h(), r, nullptr);
    }),
                       KVB_STATUS_OUT_OF_BLOCKS);
    // Once a block is free the same token is accepted.
    manager->removeSequence(2, false);
    manager->addToken(1, 42);
    EXPECT_EQ(manager->getNumTokens(1), 9);
    manager->checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Handles

// After destroy every call returns KVB_STATUS_DESTROYED (with a message) instead of touching
// freed memory; destroying twice returns KVB_STATUS_DESTROYED.
TEST(BadInputHandleTest, DestroyedHandleIsRejectedByEveryCall) {
    kvb_manager_t* m = createRaw(smallConfig(4, 0));
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> tokens = tokenRun(0, 6);
    kvb_request_t r = cRequest(kLive, tokens);
    ASSERT_EQ(kvb_manager_add_sequence(m, &r, nullptr), KVB_OK);
    ASSERT_EQ(kvb_manager_destroy(m), KVB_OK);
    for (const CallResult& c : callEveryManagerFunction(m)) {
        EXPECT_EQ(c.status, KVB_STATUS_DESTROYED) << c.name;
        EXPECT_FALSE(c.message.empty()) << c.name;
    }
    EXPECT_EQ(kvb_manager_destroy(m), KVB_STATUS_DESTROYED);
    EXPECT_STRNE(kvb_last_error_message(), "");
}

// A panic inside the library returns KVB_STATUS_INTERNAL and poisons the handle: every later
// call returns KVB_STATUS_POISONED; destroy still frees it, after which calls say DESTROYED.
TEST(BadInputHandleTest, PoisonedHandleRejectsEveryCallButCanBeDestroyed) {
    kvb_manager_t* m = createRaw(smallConfig(4, 0));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(kvb_manager_debug_trigger_panic(m), KVB_STATUS_INTERNAL);
    EXPECT_STRNE(kvb_last_error_message(), "");
    for (const CallResult& c : callEveryManagerFunction(m)) {
        EXPECT_EQ(c.status, KVB_STATUS_POISONED) << c.name;
        EXPECT_FALSE(c.message.empty()) << c.name;
    }
    EXPECT_EQ(kvb_manager_destroy(m), KVB_OK);
    int32_t n = 0;
    EXPECT_EQ(kvb_manager_get_tokens_per_block(m, &n), KVB_STATUS_DESTROYED);
    EXPECT_EQ(kvb_manager_destroy(m), KVB_STATUS_DESTROYED);
}

// A poisoned handle does not affect other managers.
TEST(BadInputHandleTest, PoisoningIsPerHandle) {
    kvb_manager_t* a = createRaw(smallConfig(4, 0));
    kvb_manager_t* b = createRaw(smallConfig(4, 0));
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(kvb_manager_debug_trigger_panic(a), KVB_STATUS_INTERNAL);
    EXPECT_EQ(kvb_manager_check_invariants(b), KVB_OK);
    int32_t n = 0;
    EXPECT_EQ(kvb_manager_get_tokens_per_block(b, &n), KVB_OK);
    EXPECT_EQ(n, kTpb);
    EXPECT_EQ(kvb_manager_destroy(a), KVB_OK);
    EXPECT_EQ(kvb_manager_destroy(b), KVB_OK);
}

// ---------------------------------------------------------------------------------------------
// Status strings, unsupported operations, the C++ wrapper

// Every status has its own non-empty name; values the library does not define are "unknown
// status" (never null).
constexpr kvb_status_t kLastStatus = KVB_STATUS_SEQUENCE_RECEIVING;  // the highest defined status

TEST(BadInputStatusTest, EveryStatusHasADistinctName) {
    std::set<std::string> names;
    for (int32_t s = 0; s <= static_cast<int32_t>(kLastStatus); ++s) {
        const char* name = kvb_status_string(s);
        ASSERT_NE(name, nullptr) << s;
        EXPECT_STRNE(name, "") << s;
        EXPECT_STRNE(name, "unknown status") << s;
        names.insert(name);
    }
    EXPECT_EQ(names.size(), static_cast<size_t>(kLastStatus) + 1);
    for (int32_t s : {-1, static_cast<int32_t>(kLastStatus) + 1, 1000, INT32_MIN, INT32_MAX}) {
        const char* name = kvb_status_string(s);
        ASSERT_NE(name, nullptr) << s;
        EXPECT_STREQ(name, "unknown status") << s;
    }
}

// A successful call clears the thread's last-error message.
TEST_F(BadInputTest, SuccessClearsLastErrorMessage) {
    EXPECT_EQ(kvb_manager_add_token(h(), kUnknown, 1), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_STRNE(kvb_last_error_message(), "");
    int32_t n = 0;
    EXPECT_EQ(kvb_manager_get_tokens_per_block(h(), &n), KVB_OK);
    EXPECT_STREQ(kvb_last_error_message(), "");
}

// The clock only moves by advance_time on managers created with manual_clock.
TEST(BadInputUnsupportedTest, AdvanceTimeWithoutManualClockIsUnsupported) {
    kvb::Config c = smallConfig(4, 0);
    c.raw.manual_clock = false;
    kvb::Manager m(c);
    EXPECT_REJECTED_ON(m.get(), kWindow, false, kvb_manager_advance_time(m.get(), 10),
                       KVB_STATUS_UNSUPPORTED);
}

// Pool memory is host-addressable only with the host copy backend.
TEST(BadInputUnsupportedTest, PoolPointerWithoutHostBackendIsUnsupported) {
    kvb::Manager m(smallConfig(4, 2));
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    EXPECT_REJECTED_ON(
        m.get(), kWindow, false,
        kvb_manager_get_pool_pointer(m.get(), kWindow, KVB_CACHE_LEVEL_PRIMARY, &base, &rowBytes),
        KVB_STATUS_UNSUPPORTED);
    EXPECT_REJECTED_ON(
        m.get(), kWindow, false,
        kvb_manager_get_pool_pointer(m.get(), kWindow, KVB_CACHE_LEVEL_SECONDARY, &base, &rowBytes),
        KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(base, nullptr);
    // With the host backend the same call succeeds.
    kvb::Config host = smallConfig(4, 2);
    host.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    kvb::Manager hm(host);
    EXPECT_NE(hm.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY).first, nullptr);
}

// Rewinding is defined for beam width 1 only.
TEST_F(BadInputTest, RewindWithBeamSearchIsUnsupported) {
    manager->addSequence(kvb::Request(3, tokenRun(400, 5)).withBeamWidth(2));
    manager->addToken(3, 1);
    EXPECT_REJECTED(kvb_manager_rewind_kv_cache(h(), 3, 1), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(manager->getNumTokens(3), 6);
}

// kvb::Error carries the failing status and the library's message; the wrapper throws for every
// failing call.
TEST(BadInputWrapperTest, ErrorCarriesStatusAndMessage) {
    kvb::Config bad;
    bad.raw.tokens_per_block = kTpb;
    bad.raw.max_sequence_length = kMaxSeqLen;  // but no windows
    try {
        kvb::Manager m(bad);
        FAIL() << "a config without windows was accepted";
    } catch (const kvb::Error& e) {
        EXPECT_EQ(e.status(), KVB_STATUS_INVALID_CONFIG);
        const std::string what = e.what();
        EXPECT_NE(what.find(kvb_status_string(KVB_STATUS_INVALID_CONFIG)), std::string::npos)
            << what;
        EXPECT_GT(what.size(), std::strlen(kvb_status_string(KVB_STATUS_INVALID_CONFIG)) + 2);
    }

    kvb::Manager m(smallConfig(4, 0));
    EXPECT_EQ(statusOf([&] { m.addToken(kUnknown, 1); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.addSequence(kvb::Request(1, tokenRun(0, 5)));
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(1, tokenRun(0, 5))); }),
              KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(2, tokenRun(0, 5)).withBeamWidth(3)); }),
              KVB_STATUS_BEAM_WIDTH_EXCEEDED);
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(2, tokenRun(0, 40))); }),
              KVB_STATUS_SEQUENCE_TOO_LONG);
    EXPECT_EQ(
        statusOf([&] { m.addSequence(kvb::Request(2, tokenRun(0, 5)).withRange(0, 4, 101)); }),
        KVB_STATUS_INVALID_RETENTION);
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(2, tokenRun(100, 20))); }),
              KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(statusOf([&] { m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY); }),
              KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(statusOf([&] { m.rewindKVCache(1, -1); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.checkInvariants(); }), KVB_OK);
}

}  // namespace

// The calls of TensorRT-LLM's 2026 surface reject bad arguments, and a buffer too small, without
// changing anything: no pin taken, no block committed, no statistics interval restarted.
TEST_F(BadInputTest, ReuseTreeAndStatisticsCallsRejectBadArgumentsAndChangeNothing) {
    std::vector<int32_t> stored = tokenRun(50, 9);
    kvb_request_t req = cRequest(9, stored);
    kvb_prefix_reuse_summary_t summary{};
    EXPECT_REJECTED(kvb_manager_analyze_prefix_reuse(h(), &req, kWindow, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_analyze_prefix_reuse(h(), &req, kWindow + 1, &summary),
                    KVB_STATUS_INVALID_ARGUMENT);
    kvb_request_state_t state;
    kvb_request_state_init(&state);
    int32_t n = 0;
    summary.reusable_blocks_allocated = -1;
    EXPECT_REJECTED(
        kvb_manager_get_needed_blocks_one_step_cached(h(), &state, &summary, false, kWindow, &n),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_REJECTED(
        kvb_manager_get_remaining_blocks_to_completion_cached(h(), &state, nullptr, kWindow, &n),
        KVB_STATUS_NULL_POINTER);
    int32_t ids[1] = {};
    size_t count = 0;
    EXPECT_REJECTED(
        kvb_manager_find_blocks_in_reuse_tree(h(), &req, 8, kWindow, true, ids, 1, &count),
        KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(count, 2u);
    EXPECT_REJECTED(
        kvb_manager_find_blocks_in_reuse_tree(h(), &req, 10, kWindow, false, ids, 1, &count),
        KVB_STATUS_INVALID_ARGUMENT);  // more tokens than the request has
    EXPECT_REJECTED(kvb_manager_truncate_blocks(h(), stored.data(), stored.size(), -1, nullptr),
                    KVB_STATUS_INVALID_ARGUMENT);
    kvb_test::markPrefillComputed(*manager, kLive);
    uint64_t hashes[1] = {};
    EXPECT_REJECTED(kvb_manager_commit_block_hashes(h(), kLive, kWindow, hashes, 1, &count),
                    KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(count, 2u);
    EXPECT_REJECTED(kvb_manager_commit_block_hashes(h(), 999, kWindow, hashes, 1, &count),
                    KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_REJECTED(kvb_manager_get_iteration_stats(h(), nullptr, 0, &count),
                    KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_REJECTED(kvb_manager_get_num_front_blocks_removed(h(), kLive, kWindow, nullptr),
                    KVB_STATUS_NULL_POINTER);
    EXPECT_REJECTED(kvb_manager_get_beam_width(h(), 999, &n), KVB_STATUS_UNKNOWN_REQUEST);
    int32_t bad[2] = {0, 100000};
    int32_t rows[2] = {7, 7};
    EXPECT_REJECTED(kvb_manager_get_memory_pool_block_indices(h(), kWindow, bad, 2, rows),
                    KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(rows[0], 7) << "nothing written before the bad id was found";
}
