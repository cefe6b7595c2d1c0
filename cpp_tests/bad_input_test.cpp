// Bad input through the C ABI: every invalid argument, config, request or handle is rejected with
// its own status code and a message, and a rejected call leaves the manager exactly as it was
// (statistics, free counts, the live sequence's blocks and the reuse tree), with its invariants
// intact.
//
// This file: null pointers, struct sizes and layouts, invalid configs.
#include "bad_input_support.hpp"

using namespace kvb_bad_input;  // NOLINT(google-build-using-namespace): the suites' shared helpers

namespace {

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

}  // namespace
