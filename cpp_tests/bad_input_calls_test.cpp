// Bad input through the C ABI (see bad_input_test.cpp): invalid arguments of calls, unknown and
// duplicate request ids, invalid retention, lengths and capacity.
#include "bad_input_support.hpp"

using namespace kvb_bad_input;  // NOLINT(google-build-using-namespace): the suites' shared helpers

namespace {

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

}  // namespace
