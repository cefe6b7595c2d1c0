// Disaggregated prefill/decode through the C ABI and its C++ wrapper: a prefill engine computes a
// prompt's KV and sends it; a decode engine admits the request as receiving and gets the bytes
// in its own rows. The two managers live in one process on one kvb::LoopbackHub (the in-process
// transfer backend), and everything that crosses between them is a byte blob (metadata, layout,
// receive ticket), as it would between two processes. The bytes really move (host copy backend).
//
// One full-attention window of 64 tokens, 4 tokens per block, rows of 2 layers x 2 (K, V) x 2
// heads x 4 elements of 1 byte; a manual clock, and a transfer timeout of 1000 ms.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;
constexpr int64_t kTimeoutMs = 1000;
constexpr int32_t kBlocks = 16;

using kvb_test::statusOf;
using kvb_test::tokenRun;

kvb::Config engineConfig() {
    kvb::Config c;
    c.addWindow(kWindow, kBlocks, 0, /*layers=*/2, /*heads=*/2, /*headSize=*/4);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = 1;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    c.raw.manual_clock = true;
    return c;
}

// The row of `block` on the GPU level of manager `m`.
std::pair<uint8_t*, size_t> rowOf(const kvb::Manager& m, int32_t block) {
    kvb_block_info_t info = m.getBlockInfo(kWindow, block);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    auto [base, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
    return {base + static_cast<size_t>(info.memory_index) * rowBytes, rowBytes};
}

// The KV byte `j` of block index `i` of request `id`: what the prefill engine computes.
uint8_t kvByte(uint64_t id, size_t i, size_t j) {
    return static_cast<uint8_t>((id * 31 + i * 7 + j % 251) | 1);
}

// The prefill engine computing the KV of every block of `id`.
void compute(const kvb::Manager& m, uint64_t id) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i) {
        auto [row, n] = rowOf(m, blocks[i]);
        for (size_t j = 0; j < n; ++j) row[j] = kvByte(id, i, j);
    }
}

// Whether the rows of `id` in `m` hold the KV the prefill engine computed for it.
::testing::AssertionResult holdsKv(const kvb::Manager& m, uint64_t id) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i) {
        auto [row, n] = rowOf(m, blocks[i]);
        for (size_t j = 0; j < n; ++j) {
            if (row[j] != kvByte(id, i, j)) {
                return ::testing::AssertionFailure()
                       << "block index " << i << " byte " << j << ": got " << int(row[j])
                       << ", want " << int(kvByte(id, i, j));
            }
        }
    }
    return ::testing::AssertionSuccess();
}

std::vector<uint8_t> bytesOf(uint64_t v) {
    std::vector<uint8_t> out(sizeof v);
    std::memcpy(out.data(), &v, sizeof v);
    return out;
}

// A prefill engine and a decode engine on one hub, each having loaded the other's metadata.
class DisaggTest : public ::testing::Test {
  protected:
    DisaggTest() : prefill(engineConfig()), decode(engineConfig()) {
        prefill.attachLoopback(hub, "prefill", 0, 1, kTimeoutMs);
        decode.attachLoopback(hub, "decode", 0, 1, kTimeoutMs);
        EXPECT_EQ(prefill.addTransferPeer(decode.transferMetadata()), "decode");
        EXPECT_EQ(decode.addTransferPeer(prefill.transferMetadata()), "prefill");
        decodeLayout = decode.exportLayout();
    }

    // The prefill side admits and computes `prompt`, leases it, removes its sequence at once
    // (the lease keeps the rows) and posts the lease into the rows of `ticket`. Returns the hold.
    uint64_t send(uint64_t id, const std::vector<int32_t>& prompt,
                  const std::vector<uint8_t>& ticket) {
        prefill.addSequence(kvb::Request(id, prompt));
        compute(prefill, id);
        uint64_t hold = prefill.beginSend(id, 0, static_cast<int32_t>(prompt.size()));
        prefill.removeSequence(id, /*storeForReuse=*/false);
        prefill.postSend(hold, "decode", decodeLayout, ticket, bytesOf(id));
        return hold;
    }

    kvb::LoopbackHub hub;
    kvb::Manager prefill;
    kvb::Manager decode;
    std::vector<uint8_t> decodeLayout;
};

// The prompt's KV computed by the prefill engine lands in the rows of the decode engine's
// receiving sequence; the decode engine learns it from the notification, completes the receive,
// and the sequence then generates as any other.
TEST_F(DisaggTest, PromptKvLandsInTheDecodeRows) {
    const std::vector<int32_t> prompt = tokenRun(100, 10);  // 3 blocks, the last one partial
    decode.addSequenceReceiving(kvb::Request(1, prompt));
    std::vector<uint8_t> ticket = decode.receiveTicket(1);
    ASSERT_FALSE(ticket.empty());
    EXPECT_EQ(decode.transferStats().receiving_requests, 1u);
    EXPECT_EQ(decode.transferStats().receiving_blocks, 3u);

    uint64_t hold = send(1, prompt, ticket);
    EXPECT_NE(hold, 0u);

    auto note = decode.takeTransferNotification();
    ASSERT_TRUE(note.has_value());
    EXPECT_EQ(note->first, "prefill");
    EXPECT_EQ(note->second, bytesOf(1));
    EXPECT_FALSE(decode.takeTransferNotification().has_value());

    std::vector<kvb_transfer_event_t> events = prefill.pollTransfers();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].hold_id, hold);
    EXPECT_EQ(events[0].outcome, KVB_TRANSFER_DONE);
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks);  // the lease ended, its rows are free

    decode.completeReceive(1);
    EXPECT_TRUE(holdsKv(decode, 1));
    decode.addToken(1, 7);
    EXPECT_EQ(decode.getNumTokens(1), 11);

    kvb_transfer_stats_t p = prefill.transferStats();
    EXPECT_EQ(p.transfers_posted, 1u);
    EXPECT_EQ(p.transfers_done, 1u);
    EXPECT_EQ(p.active_leases, 0u);
    EXPECT_GT(p.bytes_posted, 0u);
    EXPECT_GE(p.descriptors_unmerged, p.descriptors_posted);
    kvb_transfer_stats_t d = decode.transferStats();
    EXPECT_EQ(d.receives_completed, 1u);
    EXPECT_EQ(d.receiving_requests, 0u);
    prefill.checkInvariants();
    decode.checkInvariants();
}

// Until the receive completes, the sequence refuses every ordinary call with
// KVB_STATUS_SEQUENCE_RECEIVING (its bytes are not there yet), but shows its blocks and rows.
TEST_F(DisaggTest, ReceivingSequenceRefusesTokens) {
    decode.addSequenceReceiving(kvb::Request(2, tokenRun(200, 8)));
    EXPECT_EQ(statusOf([&] { decode.addToken(2, 1); }), KVB_STATUS_SEQUENCE_RECEIVING);
    EXPECT_EQ(statusOf([&] { decode.removeSequence(2); }), KVB_STATUS_SEQUENCE_RECEIVING);
    EXPECT_EQ(decode.getCacheBlockIds(2, kWindow).size(), 2u);
    std::vector<kvb_row_runs_t> runs = decode.rowRuns(2);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].window_size, kWindow);
    EXPECT_EQ(runs[0].blocks, 2);
    EXPECT_GE(runs[0].runs, 1);
    // A completed receive lifts the refusal.
    decode.completeReceive(2);
    decode.addToken(2, 1);
    EXPECT_EQ(decode.getNumTokens(2), 9);
}

// A transfer still in progress at its deadline polls as TIMED_OUT: the lease is quarantined, and
// its rows stay out of the free count (the transfer may still read them) until the transfer
// really ends and a poll sees it.
TEST_F(DisaggTest, HeldTransferTimesOutAndItsRowsStayHeldUntilItEnds) {
    const std::vector<int32_t> prompt = tokenRun(300, 12);  // 3 full blocks
    decode.addSequenceReceiving(kvb::Request(3, prompt));
    hub.holdNext();
    uint64_t hold = send(3, prompt, decode.receiveTicket(3));
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks - 3);

    prefill.advanceTime(kTimeoutMs - 1);
    EXPECT_TRUE(prefill.pollTransfers().empty());
    prefill.advanceTime(1);
    std::vector<kvb_transfer_event_t> events = prefill.pollTransfers();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].hold_id, hold);
    EXPECT_EQ(events[0].outcome, KVB_TRANSFER_TIMED_OUT);
    kvb_transfer_stats_t s = prefill.transferStats();
    EXPECT_EQ(s.quarantined_holds, 1u);
    EXPECT_EQ(s.quarantined_blocks, 3u);
    EXPECT_EQ(s.transfers_timed_out, 1u);
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks - 3);
    // Declaring it done is not the engine's to say while the backend still watches it: it was
    // quarantined, and only a completion the poll sees releases it.
    EXPECT_TRUE(prefill.pollTransfers().empty());
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks - 3);
    EXPECT_FALSE(decode.takeTransferNotification().has_value());

    EXPECT_EQ(hub.finishHeld(), 1u);
    events = prefill.pollTransfers();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].hold_id, hold);
    EXPECT_EQ(events[0].outcome, KVB_TRANSFER_DONE);
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks);
    EXPECT_EQ(prefill.transferStats().quarantined_holds, 0u);
    EXPECT_EQ(prefill.transferStats().quarantines_released, 1u);

    // The late transfer did deliver: the decode side may use it.
    ASSERT_TRUE(decode.takeTransferNotification().has_value());
    decode.completeReceive(3);
    EXPECT_TRUE(holdsKv(decode, 3));
    prefill.checkInvariants();
}

// A receive aborted in doubt (a transfer may still write its rows) releases the sequence but
// keeps its receiving rows in quarantine under a hold; releasing the hold frees them. An abort
// that knows nothing was submitted frees everything at once.
TEST_F(DisaggTest, AbortInDoubtQuarantinesTheRowsUntilReleased) {
    const int64_t free0 = decode.getNumFreeBlocks();
    decode.addSequenceReceiving(kvb::Request(4, tokenRun(400, 8)));
    EXPECT_EQ(decode.getNumFreeBlocks(), free0 - 2);

    std::optional<uint64_t> hold = decode.abortReceive(4, KVB_TRANSFER_IN_DOUBT);
    ASSERT_TRUE(hold.has_value());
    EXPECT_EQ(statusOf([&] { decode.getNumTokens(4); }), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(decode.getNumFreeBlocks(), free0 - 2);
    EXPECT_EQ(decode.transferStats().quarantined_holds, 1u);
    EXPECT_EQ(decode.transferStats().receives_aborted, 1u);

    decode.releaseQuarantine(*hold);
    EXPECT_EQ(decode.getNumFreeBlocks(), free0);
    EXPECT_EQ(statusOf([&] { decode.releaseQuarantine(*hold); }), KVB_STATUS_INVALID_ARGUMENT);

    decode.addSequenceReceiving(kvb::Request(5, tokenRun(500, 8)));
    EXPECT_FALSE(decode.abortReceive(5, KVB_TRANSFER_NOT_SUBMITTED).has_value());
    EXPECT_EQ(decode.getNumFreeBlocks(), free0);
    decode.checkInvariants();
}

// A layout or ticket blob that is not one is refused with KVB_STATUS_INVALID_ARGUMENT, saying
// why, and nothing is posted: the lease is still there, and posting it right works.
TEST_F(DisaggTest, GarbageBlobsAreRefusedAndNothingIsPosted) {
    const std::vector<int32_t> prompt = tokenRun(600, 8);
    decode.addSequenceReceiving(kvb::Request(6, prompt));
    std::vector<uint8_t> ticket = decode.receiveTicket(6);
    prefill.addSequence(kvb::Request(6, prompt));
    compute(prefill, 6);
    uint64_t hold = prefill.beginSend(6, 0, 8);

    const std::vector<uint8_t> garbage = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3};
    try {
        prefill.postSend(hold, "decode", garbage, ticket);
        FAIL() << "a garbage layout was accepted";
    } catch (const kvb::Error& e) {
        EXPECT_EQ(e.status(), KVB_STATUS_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
    }
    EXPECT_EQ(statusOf([&] { prefill.postSend(hold, "decode", decodeLayout, garbage); }),
              KVB_STATUS_INVALID_ARGUMENT);
    std::vector<uint8_t> truncated(decodeLayout.begin(), decodeLayout.end() - 1);
    EXPECT_EQ(statusOf([&] { prefill.postSend(hold, "decode", truncated, ticket); }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { prefill.postSend(hold, "nobody", decodeLayout, ticket); }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(prefill.transferStats().transfers_posted, 0u);
    EXPECT_EQ(prefill.transferStats().active_leases, 1u);
    EXPECT_FALSE(decode.takeTransferNotification().has_value());

    prefill.postSend(hold, "decode", decodeLayout, ticket);
    ASSERT_EQ(prefill.pollTransfers().size(), 1u);
    decode.completeReceive(6);
    EXPECT_TRUE(holdsKv(decode, 6));
}

// A failed transfer quarantines its lease; the engine releases it once it knows the transfer is
// over. A lease never posted is settled as NOT_SUBMITTED.
TEST_F(DisaggTest, FailedTransferQuarantinesTheLease) {
    const std::vector<int32_t> prompt = tokenRun(700, 8);
    decode.addSequenceReceiving(kvb::Request(7, prompt));
    hub.failNext();
    uint64_t hold = send(7, prompt, decode.receiveTicket(7));
    std::vector<kvb_transfer_event_t> events = prefill.pollTransfers();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].outcome, KVB_TRANSFER_FAILED);
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks - 2);
    EXPECT_TRUE(prefill.settleHold(hold, KVB_TRANSFER_FAILED));  // still quarantined
    prefill.releaseQuarantine(hold);
    EXPECT_EQ(prefill.getNumFreeBlocks(), kBlocks);

    prefill.addSequence(kvb::Request(8, prompt));
    uint64_t lease = prefill.beginSend(8, 0, 8);
    EXPECT_FALSE(prefill.settleHold(lease, KVB_TRANSFER_NOT_SUBMITTED));
    EXPECT_EQ(prefill.transferStats().active_leases, 0u);
}

// Null pointers, bad enum values and small buffers get clear statuses, and change nothing.
TEST_F(DisaggTest, BadArgumentsGetClearStatuses) {
    kvb_manager_t* p = prefill.get();
    kvb_manager_t* d = decode.get();
    size_t len = 0;
    bool flag = false;
    uint64_t hold = 0;

    // Hub handles.
    EXPECT_EQ(kvb_loopback_hub_create(nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_loopback_hub_destroy(nullptr), KVB_OK);
    EXPECT_EQ(kvb_loopback_hub_hold_next(nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_loopback_hub_finish_held(hub.get(), nullptr), KVB_STATUS_NULL_POINTER);
    kvb_loopback_hub_t* h = nullptr;
    ASSERT_EQ(kvb_loopback_hub_create(&h), KVB_OK);
    ASSERT_EQ(kvb_loopback_hub_destroy(h), KVB_OK);
    EXPECT_EQ(kvb_loopback_hub_destroy(h), KVB_STATUS_DESTROYED);
    EXPECT_EQ(kvb_loopback_hub_fail_next(h), KVB_STATUS_DESTROYED);

    // Attaching.
    EXPECT_EQ(kvb_manager_attach_loopback(nullptr, hub.get(), "x", 0, 1, 10),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_attach_loopback(p, nullptr, "x", 0, 1, 10), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_attach_loopback(p, hub.get(), nullptr, 0, 1, 10),
              KVB_STATUS_NULL_POINTER);
    kvb::Manager third(engineConfig());
    EXPECT_EQ(kvb_manager_attach_loopback(third.get(), hub.get(), "x", 1, 1, 10),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_attach_loopback(third.get(), hub.get(), "x", -1, 1, 10),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_attach_loopback(third.get(), hub.get(), "x", 0, 1, 0),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_attach_loopback(third.get(), hub.get(), "decode", 0, 1, 10),
              KVB_STATUS_INVALID_ARGUMENT);  // the name is taken on the hub
    EXPECT_EQ(kvb_manager_get_transfer_metadata(third.get(), nullptr, 0, &len),
              KVB_STATUS_INVALID_ARGUMENT);  // nothing attached (the failures left nothing)
    EXPECT_EQ(kvb_manager_attach_loopback(third.get(), hub.get(), "third", 0, 1, 10), KVB_OK);

    // Blobs: a size query, then a buffer that is too small, then null with a large capacity.
    EXPECT_EQ(kvb_manager_export_layout(p, nullptr, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_export_layout(p, nullptr, 0, &len), KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, prefill.exportLayout().size());
    std::vector<uint8_t> small(len - 1);
    EXPECT_EQ(kvb_manager_export_layout(p, small.data(), small.size(), &len),
              KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(kvb_manager_export_layout(p, nullptr, len, &len), KVB_STATUS_NULL_POINTER);
    char name[4];
    std::vector<uint8_t> meta = decode.transferMetadata();
    EXPECT_EQ(kvb_manager_add_transfer_peer(p, nullptr, meta.size(), name, sizeof name, &len),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_add_transfer_peer(p, meta.data(), meta.size(), name, sizeof name, &len),
              KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, 6u);  // "decode"
    EXPECT_EQ(kvb_manager_add_transfer_peer(p, meta.data(), 3, name, sizeof name, &len),
              KVB_STATUS_INVALID_ARGUMENT);

    // Receiving: bad outcome values are refused and the sequence keeps receiving.
    decode.addSequenceReceiving(kvb::Request(9, tokenRun(900, 8)));
    EXPECT_EQ(kvb_manager_add_sequence_receiving(d, nullptr, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_receive_ticket(d, 9, nullptr, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_receive_ticket(d, 999, nullptr, 0, &len), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(kvb_manager_abort_receive(d, 9, 5, &hold), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_abort_receive(d, 9, -1, &hold), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_abort_receive(d, 9, KVB_TRANSFER_IN_DOUBT, nullptr),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(decode.transferStats().receiving_requests, 1u);
    EXPECT_EQ(kvb_manager_complete_receive(d, 999), KVB_STATUS_UNKNOWN_REQUEST);
    size_t n = 0;
    EXPECT_EQ(kvb_manager_get_row_runs(d, 9, nullptr, 0, &n), KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 1u);

    // Sending: bad counts and outcomes, and a poll whose buffer cannot hold every hold that
    // may change: refused before polling, so no outcome is lost.
    std::vector<uint8_t> ticket = decode.receiveTicket(9);
    prefill.addSequence(kvb::Request(9, tokenRun(900, 8)));
    EXPECT_EQ(kvb_manager_begin_send(p, 9, -4, 8, &hold), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_begin_send(p, 9, 2, 8, &hold), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_begin_send(p, 9, 0, 8, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(prefill.transferStats().active_leases, 0u);
    hold = prefill.beginSend(9, 0, 8);
    EXPECT_EQ(kvb_manager_settle_hold(p, hold, 5, &flag), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_settle_hold(p, hold, KVB_TRANSFER_DONE, nullptr),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_settle_hold(p, hold + 100, KVB_TRANSFER_DONE, &flag),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_post_send(p, hold, nullptr, decodeLayout.data(), decodeLayout.size(),
                                    ticket.data(), ticket.size(), nullptr, 0),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_post_send(p, hold, "decode", nullptr, decodeLayout.size(), ticket.data(),
                                    ticket.size(), nullptr, 0),
              KVB_STATUS_NULL_POINTER);
    prefill.postSend(hold, "decode", decodeLayout, ticket);
    EXPECT_EQ(kvb_manager_settle_hold(p, hold, KVB_TRANSFER_DONE, &flag),
              KVB_STATUS_INVALID_ARGUMENT);  // a posted lease is settled by the poll
    EXPECT_EQ(kvb_manager_poll_transfers(p, nullptr, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_poll_transfers(p, nullptr, 0, &n), KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 1u);
    kvb_transfer_event_t event{};
    ASSERT_EQ(kvb_manager_poll_transfers(p, &event, 1, &n), KVB_OK);
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(event.hold_id, hold);
    EXPECT_EQ(event.outcome, KVB_TRANSFER_DONE);

    // Notifications: one whose buffers are too small stays queued.
    char peer[16];
    uint8_t msg[16];
    size_t peerLen = 0, msgLen = 0;
    EXPECT_EQ(kvb_manager_take_transfer_notification(d, peer, sizeof peer, nullptr, msg, sizeof msg,
                                                     &msgLen, &flag),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_take_transfer_notification(d, nullptr, sizeof peer, &peerLen, msg,
                                                     sizeof msg, &msgLen, &flag),
              KVB_STATUS_NULL_POINTER);
    // The post above carried no notification: none is queued.
    ASSERT_EQ(kvb_manager_take_transfer_notification(d, peer, sizeof peer, &peerLen, msg,
                                                     sizeof msg, &msgLen, &flag),
              KVB_OK);
    EXPECT_FALSE(flag);
    decode.addSequenceReceiving(kvb::Request(10, tokenRun(1000, 8)));
    send(10, tokenRun(1000, 8), decode.receiveTicket(10));
    EXPECT_EQ(kvb_manager_take_transfer_notification(d, peer, 7, &peerLen, msg, 4, &msgLen, &flag),
              KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(peerLen, 7u);  // "prefill"
    EXPECT_EQ(msgLen, 8u);
    EXPECT_FALSE(flag);
    ASSERT_EQ(kvb_manager_take_transfer_notification(d, peer, sizeof peer, &peerLen, msg,
                                                     sizeof msg, &msgLen, &flag),
              KVB_OK);
    EXPECT_TRUE(flag);
    EXPECT_STREQ(peer, "prefill");
    EXPECT_EQ(std::vector<uint8_t>(msg, msg + msgLen), bytesOf(10));

    // Statistics need their struct_size.
    kvb_transfer_stats_t stats{};
    EXPECT_EQ(kvb_manager_get_transfer_stats(p, &stats), KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(kvb_manager_get_transfer_stats(p, nullptr), KVB_STATUS_NULL_POINTER);

    // Quarantine calls on holds that are not quarantined, or not there.
    EXPECT_EQ(kvb_manager_release_quarantine(p, hold), KVB_STATUS_INVALID_ARGUMENT);

    // Every new call rejects a null manager.
    EXPECT_EQ(kvb_manager_get_transfer_metadata(nullptr, nullptr, 0, &len),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_export_layout(nullptr, nullptr, 0, &len), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(
        kvb_manager_add_transfer_peer(nullptr, meta.data(), meta.size(), name, sizeof name, &len),
        KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_add_sequence_receiving(nullptr, nullptr, nullptr),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_receive_ticket(nullptr, 9, nullptr, 0, &len),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_complete_receive(nullptr, 9), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_abort_receive(nullptr, 9, 0, &hold), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_begin_send(nullptr, 9, 0, 8, &hold), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_post_send(nullptr, 1, "decode", nullptr, 0, nullptr, 0, nullptr, 0),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_poll_transfers(nullptr, nullptr, 0, &n), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_settle_hold(nullptr, 1, 0, &flag), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_release_quarantine(nullptr, 1), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_take_transfer_notification(nullptr, peer, sizeof peer, &peerLen, msg,
                                                     sizeof msg, &msgLen, &flag),
              KVB_STATUS_NULL_POINTER);
    stats.struct_size = sizeof stats;
    EXPECT_EQ(kvb_manager_get_transfer_stats(nullptr, &stats), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_set_contiguous_runs(nullptr, true), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_row_runs(nullptr, 9, nullptr, 0, &n), KVB_STATUS_NULL_POINTER);
    prefill.checkInvariants();
    decode.checkInvariants();
}

// Every new call on a destroyed manager returns KVB_STATUS_DESTROYED (never touches freed memory).
TEST(DisaggHandleTest, DestroyedManagerIsRejectedByEveryCall) {
    kvb::Config config = engineConfig();
    kvb_manager_config_t raw = kvb_test::rawConfig(config);
    kvb_manager_t* m = nullptr;
    ASSERT_EQ(kvb_manager_create(&raw, &m), KVB_OK);
    kvb::LoopbackHub hub;
    ASSERT_EQ(kvb_manager_attach_loopback(m, hub.get(), "gone", 0, 1, 10), KVB_OK);
    ASSERT_EQ(kvb_manager_destroy(m), KVB_OK);

    std::vector<int32_t> tokens = tokenRun(0, 8);
    kvb_request_t req;
    ASSERT_EQ(kvb_request_init(&req), KVB_OK);
    req.request_id = 1;
    req.tokens = tokens.data();
    req.num_tokens = tokens.size();
    req.input_length = 8;
    uint8_t buf[64];
    char name[16];
    size_t len = 0, len2 = 0;
    uint64_t hold = 0;
    bool flag = false;
    kvb_transfer_event_t event{};
    kvb_row_runs_t runs{};
    kvb_transfer_stats_t stats{};
    stats.struct_size = sizeof stats;
    const std::vector<std::pair<const char*, kvb_status_t>> calls = {
        {"attach_loopback", kvb_manager_attach_loopback(m, hub.get(), "again", 0, 1, 10)},
        {"get_transfer_metadata", kvb_manager_get_transfer_metadata(m, buf, sizeof buf, &len)},
        {"export_layout", kvb_manager_export_layout(m, buf, sizeof buf, &len)},
        {"add_transfer_peer",
         kvb_manager_add_transfer_peer(m, buf, sizeof buf, name, sizeof name, &len)},
        {"take_transfer_notification",
         kvb_manager_take_transfer_notification(m, name, sizeof name, &len, buf, sizeof buf, &len2,
                                                &flag)},
        {"get_transfer_stats", kvb_manager_get_transfer_stats(m, &stats)},
        {"begin_send", kvb_manager_begin_send(m, 1, 0, 8, &hold)},
        {"post_send",
         kvb_manager_post_send(m, 1, "peer", buf, sizeof buf, buf, sizeof buf, nullptr, 0)},
        {"poll_transfers", kvb_manager_poll_transfers(m, &event, 1, &len)},
        {"settle_hold", kvb_manager_settle_hold(m, 1, KVB_TRANSFER_DONE, &flag)},
        {"release_quarantine", kvb_manager_release_quarantine(m, 1)},
        {"add_sequence_receiving", kvb_manager_add_sequence_receiving(m, &req, nullptr)},
        {"get_receive_ticket", kvb_manager_get_receive_ticket(m, 1, buf, sizeof buf, &len)},
        {"complete_receive", kvb_manager_complete_receive(m, 1)},
        {"abort_receive", kvb_manager_abort_receive(m, 1, KVB_TRANSFER_DONE, &hold)},
        {"set_contiguous_runs", kvb_manager_set_contiguous_runs(m, true)},
        {"get_row_runs", kvb_manager_get_row_runs(m, 1, &runs, 1, &len)},
    };
    for (const auto& [call, status] : calls) EXPECT_EQ(status, KVB_STATUS_DESTROYED) << call;
}

}  // namespace
