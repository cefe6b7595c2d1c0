// Bad input through the C ABI (see bad_input_test.cpp): destroyed and poisoned handles, status
// strings, unsupported operations, the C++ wrapper's errors, the reuse-tree and statistics calls.
#include "bad_input_support.hpp"

using namespace kvb_bad_input;  // NOLINT(google-build-using-namespace): the suites' shared helpers

namespace {

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
