// KV cache events through the public C++ wrapper and the C ABI (the scenarios of TensorRT-LLM's
// tests KVCacheManagerEventStream*, KVCacheManagerEventRemoved*, KVCacheManagerEventStoreFor...).
//
// Events describe the reuse tree to a router: Created once per window, Stored when blocks enter
// the tree, Removed when they leave it (every reason: eviction, detached with an evicted
// ancestor, private take-over of a partially matched leaf), Updated when a tree block changes
// cache level or priority. Removals accumulate per window and are committed just before that
// window's next Stored event, or at flushIterationEvents. Nothing is visible to a drainer before
// a flush; event ids are assigned at commit and increase strictly in delivery order.
//
// Facts the hand-worked scenarios rely on (tokens_per_block 4 everywhere):
//   * a fresh manager hands out primary blocks in id order; secondary ids follow the primary ones;
//   * released blocks go to the back of their free queue, a sequence's last block first;
//   * eviction takes the lowest priority first; a primary block in the tree with priority >= 30
//     is offloaded to the first free host block instead of dropped (when host blocks exist);
//   * reuse keys cover input_length - 1 tokens (the last prompt token is never stored).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kEvTpb = 4;

using EventKind = std::pair<int32_t, kvb_event_type_t>;  // (window size, type)

const char* eventTypeName(kvb_event_type_t t) {
    switch (t) {
        case KVB_EVENT_CREATED:
            return "Created";
        case KVB_EVENT_STORED:
            return "Stored";
        case KVB_EVENT_REMOVED:
            return "Removed";
        case KVB_EVENT_UPDATED:
            return "Updated";
    }
    return "?";
}

/// A readable dump of an event list, for failure messages.
std::string describeEvents(const std::vector<kvb::Event>& events) {
    std::ostringstream os;
    for (const kvb::Event& e : events) {
        os << "\n  #" << e.id << " w" << e.windowSize << " " << eventTypeName(e.type);
        switch (e.type) {
            case KVB_EVENT_CREATED:
                os << " {" << e.numPrimaryBlocks << "," << e.numSecondaryBlocks << "}";
                break;
            case KVB_EVENT_STORED:
                os << " parent=" << (e.parentHash ? std::to_string(*e.parentHash) : "root") << " [";
                for (const auto& b : e.storedBlocks)
                    os << " " << b.hash << "(" << b.tokens.size() << "t)";
                os << " ]";
                break;
            case KVB_EVENT_REMOVED:
                os << " [";
                for (uint64_t h : e.removedHashes) os << " " << h;
                os << " ]";
                break;
            case KVB_EVENT_UPDATED:
                os << " " << e.blockHash;
                if (e.cacheLevel) {
                    os << " level " << e.cacheLevel->oldValue << "->" << e.cacheLevel->newValue;
                }
                if (e.priority) {
                    os << " priority " << e.priority->oldValue << "->" << e.priority->newValue;
                }
                break;
        }
    }
    return os.str();
}

std::vector<EventKind> eventKinds(const std::vector<kvb::Event>& events) {
    std::vector<EventKind> out;
    for (const kvb::Event& e : events) out.emplace_back(e.windowSize, e.type);
    return out;
}

using kvb_test::tokenRun;

/// Events on (`maxEntries` buffered), tokens_per_block 4, max sequence length 32, manual clock.
kvb::Config eventConfig(int32_t maxEntries = 1024) {
    kvb::Config c;
    c.raw.tokens_per_block = kEvTpb;
    c.raw.max_sequence_length = 32;
    c.raw.max_kv_event_entries = maxEntries;
    c.raw.manual_clock = true;
    return c;
}

/// Ends the iteration and takes what was delivered, without waiting.
std::vector<kvb::Event> flushAndDrain(kvb::Manager& m, uint64_t* dropped = nullptr) {
    m.flushIterationEvents();
    return m.getLatestEvents(0, dropped);
}

/// A manager of `config` whose Created events are already drained, so a test sees only its own.
kvb::Manager drainedManager(const kvb::Config& config) {
    kvb::Manager m(config);
    flushAndDrain(m);
    return m;
}

uint64_t hashOf(const kvb::Manager& m, int32_t window, int32_t block) {
    return m.getBlockInfo(window, block).hash;
}

/// Appends generated tokens one at a time, calling storeNewBlock after each as an engine does.
void generate(kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
        m.addToken(id, t);
        m.storeNewBlock(id);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// KVCacheManagerEventStream: the life of one prompt as a router sees it.
// ---------------------------------------------------------------------------------------------

// One window (8 primary + 2 host blocks). The stream must let a router follow the tree:
// Created with the window's block counts; Stored for the prompt's full blocks (chain from the
// root, carrying LoRA id, level and priority); the decode block Stored under its parent with the
// next id; nothing for blocks that are already stored; Updated 0->1 per offload, and a Removed for
// the host block whose cached content an offload overwrote; Updated 1->0 per onboard.
TEST(KVCacheManagerEventStream, FollowsStoreDecodeOffloadAndOnboard) {
    constexpr int32_t kW = 32;
    kvb::Config c = eventConfig();
    c.addWindow(kW, 8, 2);
    kvb::Manager m(c);

    auto created = flushAndDrain(m);
    ASSERT_EQ(created.size(), 1u) << describeEvents(created);
    EXPECT_EQ(created[0].type, KVB_EVENT_CREATED);
    EXPECT_EQ(created[0].id, 0u);
    EXPECT_EQ(created[0].windowSize, kW);
    EXPECT_EQ(created[0].numPrimaryBlocks, 8);
    EXPECT_EQ(created[0].numSecondaryBlocks, 2);
    EXPECT_FALSE(created[0].attentionDpRank.has_value());

    // 9-token prompt with LoRA 42: blocks 0, 1 hold keys [0..4), [4..8); block 2 holds token 8.
    m.addSequence(kvb::Request(0, tokenRun(0, 9)).withLora(42));
    EXPECT_TRUE(flushAndDrain(m).empty()) << "admission into free blocks changes no tree";
    m.storeContextBlocks(0, 9);
    auto stored = flushAndDrain(m);
    ASSERT_EQ(stored.size(), 1u) << describeEvents(stored);
    const kvb::Event& s = stored[0];
    EXPECT_EQ(s.type, KVB_EVENT_STORED);
    EXPECT_EQ(s.id, 1u);
    EXPECT_FALSE(s.parentHash.has_value()) << "the first block hangs under the root";
    ASSERT_EQ(s.storedBlocks.size(), 2u);
    const uint64_t h0 = hashOf(m, kW, 0), h1 = hashOf(m, kW, 1);
    EXPECT_EQ(s.storedBlocks[0].hash, h0);
    EXPECT_EQ(s.storedBlocks[1].hash, h1);
    EXPECT_EQ(s.storedBlocks[0].tokens, tokenRun(0, 4));
    EXPECT_EQ(s.storedBlocks[1].tokens, tokenRun(4, 4));
    for (const auto& b : s.storedBlocks) {
        EXPECT_EQ(b.loraTaskId, std::optional<uint64_t>(42));
        EXPECT_EQ(b.cacheLevel, KVB_CACHE_LEVEL_PRIMARY);
        EXPECT_EQ(b.priority, 35);
        EXPECT_FALSE(b.extraIds.has_value());
        EXPECT_FALSE(b.cacheSalt.has_value());
        EXPECT_TRUE(b.mmKeys.empty());
    }

    // Tokens 9..12: block 2 becomes full at the 13th token (which opens block 3).
    generate(m, 0, {100, 101, 102, 103});
    auto decode = flushAndDrain(m);
    ASSERT_EQ(decode.size(), 1u) << describeEvents(decode);
    EXPECT_EQ(decode[0].type, KVB_EVENT_STORED);
    EXPECT_EQ(decode[0].id, s.id + 1);
    EXPECT_EQ(decode[0].parentHash, std::optional<uint64_t>(h1)) << "linked to its tree parent";
    ASSERT_EQ(decode[0].storedBlocks.size(), 1u);
    const uint64_t h2 = hashOf(m, kW, 2);
    EXPECT_EQ(decode[0].storedBlocks[0].hash, h2);
    EXPECT_EQ(decode[0].storedBlocks[0].tokens, (std::vector<int32_t>{8, 100, 101, 102}));
    EXPECT_EQ(decode[0].storedBlocks[0].loraTaskId, std::optional<uint64_t>(42));

    // Storing again (context, and at release) finds every block already in the tree.
    m.storeContextBlocks(0, 9);
    m.removeSequence(0, true);
    EXPECT_TRUE(flushAndDrain(m).empty()) << "duplicates emit nothing";
    m.checkInvariants();

    // Free queue now [4, 5, 6, 7, 3, 2, 1, 0], host [8, 9]. A 29-token prompt takes all 8:
    // blocks 2, 1, 0 are cached (priority 35) and offloaded in that order, into host 8, host 9
    // and then host block 2 itself (the first one offloaded), whose cached content is dropped.
    m.addSequence(kvb::Request(1, tokenRun(1000, 29)));
    auto offload = flushAndDrain(m);
    ASSERT_EQ(eventKinds(offload), (std::vector<EventKind>{{kW, KVB_EVENT_UPDATED},
                                                           {kW, KVB_EVENT_UPDATED},
                                                           {kW, KVB_EVENT_UPDATED},
                                                           {kW, KVB_EVENT_REMOVED}}))
        << describeEvents(offload);
    const uint64_t offloadedOrder[] = {h2, h1, h0};
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(offload[i].blockHash, offloadedOrder[i]);
        ASSERT_TRUE(offload[i].cacheLevel.has_value());
        EXPECT_EQ(offload[i].cacheLevel->oldValue, KVB_CACHE_LEVEL_PRIMARY);
        EXPECT_EQ(offload[i].cacheLevel->newValue, KVB_CACHE_LEVEL_SECONDARY);
        EXPECT_FALSE(offload[i].priority.has_value());
    }
    EXPECT_EQ(offload[3].removedHashes, std::vector<uint64_t>{h2}) << "overwritten host block";
    EXPECT_EQ(m.getBlockInfo(kW, 0).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(m.getBlockInfo(kW, 1).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_FALSE(m.getBlockInfo(kW, 2).in_reuse_tree);
    m.removeSequence(1, false);
    m.checkInvariants();

    // The prompt again: blocks 0 and 1 are found on the host and onboarded.
    kvb_admission_t a = m.addSequence(kvb::Request(2, tokenRun(0, 9)).withLora(42));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    auto onboard = flushAndDrain(m);
    ASSERT_EQ(eventKinds(onboard),
              (std::vector<EventKind>{{kW, KVB_EVENT_UPDATED}, {kW, KVB_EVENT_UPDATED}}))
        << describeEvents(onboard);
    EXPECT_EQ(onboard[0].blockHash, h0);
    EXPECT_EQ(onboard[1].blockHash, h1);
    for (const auto& e : onboard) {
        ASSERT_TRUE(e.cacheLevel.has_value());
        EXPECT_EQ(e.cacheLevel->oldValue, KVB_CACHE_LEVEL_SECONDARY);
        EXPECT_EQ(e.cacheLevel->newValue, KVB_CACHE_LEVEL_PRIMARY);
    }
    EXPECT_EQ(m.getBlockInfo(kW, 0).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_EQ(m.getBlockInfo(kW, 1).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    m.checkInvariants();
}

// A Stored block carries the key's extra ids, cache salt and multimodal keys, so a router can
// recompute or index the same key.
TEST(KVCacheManagerEventStream, StoredBlockCarriesExtraIdsSaltAndMultimodalKeys) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 8));

    std::vector<uint64_t> extra = {7, 7, 7, 7, 8, 8, 8, 8, 9};
    kvb_multimodal_item_t item{};
    for (size_t i = 0; i < sizeof(item.digest); ++i) item.digest[i] = static_cast<uint8_t>(i + 1);
    item.position = 2;
    item.length = 4;  // tokens 2..5: starts in block 0, continues into block 1
    m.addSequence(
        kvb::Request(0, tokenRun(0, 9)).withExtraIds(extra).withSalt(77).withMultimodal(item));
    m.storeContextBlocks(0, 9);
    auto events = flushAndDrain(m);
    ASSERT_EQ(events.size(), 1u) << describeEvents(events);
    ASSERT_EQ(events[0].storedBlocks.size(), 2u);
    const auto& b0 = events[0].storedBlocks[0];
    const auto& b1 = events[0].storedBlocks[1];
    EXPECT_EQ(b0.extraIds, std::optional<std::vector<uint64_t>>({7, 7, 7, 7}));
    EXPECT_EQ(b1.extraIds, std::optional<std::vector<uint64_t>>({8, 8, 8, 8}));
    EXPECT_EQ(b0.cacheSalt, std::optional<uint64_t>(77));
    EXPECT_EQ(b1.cacheSalt, std::optional<uint64_t>(77));
    EXPECT_FALSE(b0.loraTaskId.has_value());
    ASSERT_EQ(b0.mmKeys.size(), 1u);
    ASSERT_EQ(b1.mmKeys.size(), 1u);
    EXPECT_EQ(b0.mmKeys[0].digest[0], 1);
    EXPECT_EQ(b0.mmKeys[0].digest[31], 32);
    EXPECT_EQ(b1.mmKeys[0].digest, b0.mmKeys[0].digest);
    // The item starts inside block 0 (offset 0); block 1 starts 2 tokens into the item.
    EXPECT_EQ(b0.mmKeys[0].startOffset, 0);
    EXPECT_EQ(b1.mmKeys[0].startOffset, 2);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// KVCacheManagerEventStreamOverflow: a bounded buffer drops the oldest events and counts them.
// ---------------------------------------------------------------------------------------------

// Capacity 1: Created is dropped when the first Stored arrives (num_dropped = 1); later drains
// report only their own drops; the decode block's Stored still names its parent, and ids keep
// counting dropped events (they are assigned at commit).
TEST(KVCacheManagerEventStreamOverflow, DropsOldestAndCountsDrops) {
    constexpr int32_t kW = 32;
    kvb::Config c = eventConfig(/*maxEntries=*/1);
    c.addWindow(kW, 8);
    kvb::Manager m(c);

    m.addSequence(kvb::Request(0, tokenRun(0, 9)));
    m.storeContextBlocks(0, 9);
    uint64_t dropped = 99;
    auto first = flushAndDrain(m, &dropped);
    ASSERT_EQ(first.size(), 1u) << describeEvents(first);
    EXPECT_EQ(first[0].type, KVB_EVENT_STORED) << "Created (the oldest) was dropped";
    EXPECT_EQ(first[0].id, 1u);
    EXPECT_EQ(dropped, 1u);

    generate(m, 0, {100, 101, 102, 103});
    auto decode = flushAndDrain(m, &dropped);
    ASSERT_EQ(decode.size(), 1u) << describeEvents(decode);
    EXPECT_EQ(dropped, 0u) << "the count covers drops since the previous drain only";
    EXPECT_EQ(decode[0].type, KVB_EVENT_STORED);
    EXPECT_EQ(decode[0].parentHash, std::optional<uint64_t>(hashOf(m, kW, 1)));
    EXPECT_EQ(decode[0].id, 2u);

    // Two flushes without a drain: the first one's event is dropped for the second one's.
    m.addSequence(kvb::Request(1, tokenRun(200, 5)));
    m.storeContextBlocks(1, 5);  // Stored #3
    m.flushIterationEvents();
    m.addSequence(kvb::Request(2, tokenRun(300, 5)));
    m.storeContextBlocks(2, 5);  // Stored #4
    auto last = flushAndDrain(m, &dropped);
    ASSERT_EQ(last.size(), 1u) << describeEvents(last);
    EXPECT_EQ(dropped, 1u);
    EXPECT_EQ(last[0].id, 4u);
    ASSERT_EQ(last[0].storedBlocks.size(), 1u);
    EXPECT_EQ(last[0].storedBlocks[0].tokens, tokenRun(300, 4));
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// KVCacheManagerEventStreamPriority: retention priorities in Stored and Updated events.
// ---------------------------------------------------------------------------------------------

// Stored blocks carry the priority of their retention range (50). Reusing them without a
// retention config keeps their priority (no event); reusing them with priority 10 changes it,
// reported as Updated 50->10 once per reused block.
TEST(KVCacheManagerEventStreamPriority, RetentionPriorityStoredAndUpdated) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 8));

    m.addSequence(kvb::Request(0, tokenRun(0, 9)).withRange(0, -1, 50));
    m.storeContextBlocks(0, 9);
    m.removeSequence(0, true);
    auto stored = flushAndDrain(m);
    ASSERT_EQ(stored.size(), 1u) << describeEvents(stored);
    ASSERT_EQ(stored[0].storedBlocks.size(), 2u);
    for (const auto& b : stored[0].storedBlocks) EXPECT_EQ(b.priority, 50);
    const uint64_t h0 = hashOf(m, kW, 0), h1 = hashOf(m, kW, 1);

    kvb_admission_t a = m.addSequence(kvb::Request(1, tokenRun(0, 9)));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    m.removeSequence(1, true);
    EXPECT_TRUE(flushAndDrain(m).empty()) << "reuse without retention changes no priority";
    EXPECT_EQ(m.getPriorityByBlockId(kW, 0), 50);
    EXPECT_EQ(m.getPriorityByBlockId(kW, 1), 50);

    m.addSequence(kvb::Request(2, tokenRun(0, 9)).withRange(0, -1, 10));
    auto updated = flushAndDrain(m);
    ASSERT_EQ(eventKinds(updated),
              (std::vector<EventKind>{{kW, KVB_EVENT_UPDATED}, {kW, KVB_EVENT_UPDATED}}))
        << describeEvents(updated);
    EXPECT_EQ(updated[0].blockHash, h0);
    EXPECT_EQ(updated[1].blockHash, h1);
    for (const auto& e : updated) {
        EXPECT_FALSE(e.cacheLevel.has_value());
        ASSERT_TRUE(e.priority.has_value());
        EXPECT_EQ(e.priority->oldValue, 50);
        EXPECT_EQ(e.priority->newValue, 10);
    }
    EXPECT_EQ(m.getPriorityByBlockId(kW, 0), 10);
    m.checkInvariants();
}

// A timed retention that expires at refreshBlocks lowers the priority of a cached block to the
// default; a router must hear of it (Updated 80->35) to keep its priorities right.
TEST(KVCacheManagerEventStreamPriority, ExpiredRetentionReportsDecayToDefault) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 8));

    m.addSequence(kvb::Request(0, tokenRun(0, 5)).withRange(0, -1, 80, /*duration_ms=*/10));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    auto stored = flushAndDrain(m);
    ASSERT_EQ(stored.size(), 1u) << describeEvents(stored);
    ASSERT_EQ(stored[0].storedBlocks.size(), 1u);
    EXPECT_EQ(stored[0].storedBlocks[0].priority, 80);

    m.advanceTime(5);
    m.refreshBlocks();
    EXPECT_TRUE(flushAndDrain(m).empty()) << "not expired yet";
    m.advanceTime(10);
    m.refreshBlocks();
    auto decayed = flushAndDrain(m);
    ASSERT_EQ(decayed.size(), 1u) << describeEvents(decayed);
    EXPECT_EQ(decayed[0].type, KVB_EVENT_UPDATED);
    EXPECT_EQ(decayed[0].blockHash, hashOf(m, kW, 0));
    ASSERT_TRUE(decayed[0].priority.has_value());
    EXPECT_EQ(decayed[0].priority->oldValue, 80);
    EXPECT_EQ(decayed[0].priority->newValue, 35);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// KVCacheManagerEventStreamBlocking: drains, flush visibility, threads.
// ---------------------------------------------------------------------------------------------

// With events off (max_kv_event_entries 0) nothing is ever delivered, flush is a no-op.
TEST(KVCacheManagerEventStreamBlocking, EventsOffDeliverNothing) {
    kvb::Config c = eventConfig(/*maxEntries=*/0);
    c.addWindow(32, 8, 2);
    kvb::Manager m(c);
    m.addSequence(kvb::Request(0, tokenRun(0, 9)));
    m.storeContextBlocks(0, 9);
    m.removeSequence(0, true);
    uint64_t dropped = 99;
    EXPECT_TRUE(flushAndDrain(m, &dropped).empty());
    EXPECT_EQ(dropped, 0u);
    EXPECT_TRUE(m.getLatestEvents(1).empty());
    m.checkInvariants();
}

// Events become visible only at flushIterationEvents: a drain before it finds nothing.
TEST(KVCacheManagerEventStreamBlocking, NothingVisibleBeforeFlush) {
    kvb::Config c = eventConfig();
    c.addWindow(32, 8);
    kvb::Manager m(c);
    m.addSequence(kvb::Request(0, tokenRun(0, 9)));
    m.storeContextBlocks(0, 9);
    EXPECT_TRUE(m.getLatestEvents(0).empty()) << "Created and Stored are not flushed yet";
    m.flushIterationEvents();
    auto events = m.getLatestEvents(0);
    EXPECT_EQ(eventKinds(events),
              (std::vector<EventKind>{{32, KVB_EVENT_CREATED}, {32, KVB_EVENT_STORED}}));
    EXPECT_TRUE(m.getLatestEvents(0).empty()) << "a drain takes everything";
    m.checkInvariants();
}

// A drainer thread waiting with a long timeout wakes when the executor thread flushes and gets
// the iteration's events (Created, then Stored) while the executor keeps using the manager.
// A drain with timeout 0 returns at once (an empty batch when nothing is pending).
TEST(KVCacheManagerEventStreamBlocking, BlockingDrainOnAnotherThreadReturnsFlushedEvents) {
    kvb::Config c = eventConfig();
    c.addWindow(32, 8);
    kvb::Manager m(c);

    std::promise<void> started;
    std::future<void> drainerStarted = started.get_future();
    auto drained = std::async(std::launch::async, [&m, &started] {
        started.set_value();
        return m.getLatestEvents(/*timeoutMs=*/60000);
    });
    drainerStarted.wait();
    m.addSequence(kvb::Request(0, tokenRun(0, 9)));
    m.storeContextBlocks(0, 9);
    m.flushIterationEvents();
    std::vector<kvb::Event> events = drained.get();
    EXPECT_EQ(eventKinds(events),
              (std::vector<EventKind>{{32, KVB_EVENT_CREATED}, {32, KVB_EVENT_STORED}}))
        << describeEvents(events);

    // The executor goes on while nothing is pending: a zero-timeout drain does not wait.
    m.removeSequence(0, true);
    EXPECT_TRUE(m.getLatestEvents(0).empty());
    m.checkInvariants();
}

// A drainer blocked in the C call returns when the manager is destroyed (empty batch, or
// KVB_STATUS_DESTROYED if it only got there after the destroy); later drains report DESTROYED.
TEST(KVCacheManagerEventStreamBlocking, BlockedDrainReturnsWhenManagerIsDestroyed) {
    kvb::Config c = eventConfig();
    c.addWindow(32, 8);
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* mgr = nullptr;
    ASSERT_EQ(kvb_manager_create(&raw, &mgr), KVB_OK);
    // Consume Created so the drainer has nothing to return until the destroy.
    kvb_event_batch_t* batch = nullptr;
    ASSERT_EQ(kvb_manager_flush_iteration_events(mgr), KVB_OK);
    ASSERT_EQ(kvb_manager_get_latest_events(mgr, 0, &batch), KVB_OK);
    ASSERT_EQ(kvb_event_batch_free(batch), KVB_OK);

    std::promise<void> started;
    std::future<void> drainerStarted = started.get_future();
    auto drained = std::async(std::launch::async, [mgr, &started] {
        started.set_value();
        kvb_event_batch_t* b = nullptr;
        kvb_status_t st = kvb_manager_get_latest_events(mgr, 60000, &b);
        size_t n = 0;
        if (st == KVB_OK) {
            kvb_event_batch_size(b, &n);
            kvb_event_batch_free(b);
        }
        return std::make_pair(st, n);
    });
    drainerStarted.wait();
    ASSERT_EQ(kvb_manager_destroy(mgr), KVB_OK);
    auto [status, n] = drained.get();
    EXPECT_TRUE(status == KVB_OK || status == KVB_STATUS_DESTROYED) << kvb_status_string(status);
    EXPECT_EQ(n, 0u);
    batch = nullptr;
    EXPECT_EQ(kvb_manager_get_latest_events(mgr, 0, &batch), KVB_STATUS_DESTROYED);
    EXPECT_EQ(batch, nullptr);
}

// ---------------------------------------------------------------------------------------------
// KVCacheManagerEventStreamWindowSize: variable sliding windows.
// ---------------------------------------------------------------------------------------------

// Windows 8 (sliding: below max length 32) and 32 (full), listed largest first in the config.
// Created comes per window in ascending order. Every event carries its window. As implemented:
// storeContextBlocks stores in every window (largest first; the same content has the same hash
// in each), storeNewBlock stores decode blocks only in full-attention windows, and a sliding
// window gets its decode block at release (removeSequence with store, still valid).
TEST(KVCacheManagerEventStreamWindowSize, CreatedAscendingAndStoredPerWindow) {
    kvb::Config c = eventConfig();
    c.addWindow(32, 16).addWindow(8, 16);
    kvb::Manager m(c);

    auto created = flushAndDrain(m);
    ASSERT_EQ(eventKinds(created),
              (std::vector<EventKind>{{8, KVB_EVENT_CREATED}, {32, KVB_EVENT_CREATED}}))
        << describeEvents(created);
    EXPECT_EQ(created[0].id, 0u);
    EXPECT_EQ(created[1].id, 1u);
    EXPECT_EQ(created[0].numPrimaryBlocks, 16);

    m.addSequence(kvb::Request(0, tokenRun(0, 9)));
    m.storeContextBlocks(0, 9);
    auto ctx = flushAndDrain(m);
    ASSERT_EQ(eventKinds(ctx),
              (std::vector<EventKind>{{32, KVB_EVENT_STORED}, {8, KVB_EVENT_STORED}}))
        << describeEvents(ctx);
    ASSERT_EQ(ctx[0].storedBlocks.size(), 2u);
    ASSERT_EQ(ctx[1].storedBlocks.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(ctx[0].storedBlocks[i].hash, ctx[1].storedBlocks[i].hash)
            << "a block's hash depends on its content and parent, not on the window";
    }

    // 13 tokens: window 8 detaches block 0 at token 12; block 2 becomes full at token 13.
    generate(m, 0, {100, 101, 102, 103});
    auto decode = flushAndDrain(m);
    ASSERT_EQ(eventKinds(decode), (std::vector<EventKind>{{32, KVB_EVENT_STORED}}))
        << describeEvents(decode);
    EXPECT_EQ(decode[0].parentHash, std::optional<uint64_t>(hashOf(m, 32, 1)));

    m.removeSequence(0, true);
    auto release = flushAndDrain(m);
    ASSERT_EQ(eventKinds(release), (std::vector<EventKind>{{8, KVB_EVENT_STORED}}))
        << describeEvents(release);
    ASSERT_EQ(release[0].storedBlocks.size(), 1u);
    EXPECT_EQ(release[0].storedBlocks[0].hash, decode[0].storedBlocks[0].hash);
    EXPECT_EQ(release[0].parentHash, decode[0].parentHash);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Removed-event batching: one Removed event per window and iteration (TensorRT-LLM PR #11883).
// ---------------------------------------------------------------------------------------------

// Two cached blocks of one window evicted in one iteration are reported by one Removed event
// holding both hashes (not one event per block).
TEST(KVCacheManagerEventRemovedBatchedWithinWindow, TwoEvictionsOneEvent) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 4));

    // A (5 tokens) stores block 0; B (5 tokens) stores block 2. Queue then [1, 0, 3, 2].
    m.addSequence(kvb::Request(0, tokenRun(0, 5)));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    m.addSequence(kvb::Request(1, tokenRun(100, 5)));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);
    ASSERT_EQ(flushAndDrain(m).size(), 2u);
    const uint64_t hA = hashOf(m, kW, 0), hB = hashOf(m, kW, 2);

    // 16 fresh tokens take all four blocks, evicting A's and then B's cached block.
    m.addSequence(kvb::Request(2, tokenRun(1000, 16)));
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events), (std::vector<EventKind>{{kW, KVB_EVENT_REMOVED}}))
        << describeEvents(events);
    EXPECT_EQ(events[0].removedHashes, (std::vector<uint64_t>{hA, hB}));
    m.checkInvariants();
}

// An eviction and a later store in the same window and iteration: the Removed event is committed
// before the Stored one, so a router never sees content stored before older content leaves.
TEST(KVCacheManagerEventRemovedOrderedBeforeStore, RemovedPrecedesStoredInOneWindow) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 4));

    m.addSequence(kvb::Request(0, tokenRun(0, 5)));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    ASSERT_EQ(flushAndDrain(m).size(), 1u);
    const uint64_t hA = hashOf(m, kW, 0);

    // 13 tokens take all four blocks (evicting A), then their 3 full blocks are stored.
    m.addSequence(kvb::Request(1, tokenRun(1000, 13)));
    m.storeContextBlocks(1, 13);
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events),
              (std::vector<EventKind>{{kW, KVB_EVENT_REMOVED}, {kW, KVB_EVENT_STORED}}))
        << describeEvents(events);
    EXPECT_EQ(events[0].removedHashes, std::vector<uint64_t>{hA});
    EXPECT_LT(events[0].id, events[1].id);
    EXPECT_EQ(events[1].storedBlocks.size(), 3u);
    m.checkInvariants();
}

// Windows 16 (sliding) and 32 (full), 4 primary blocks each. One addToken evicts a cached block
// in both windows; the following storeNewBlock stores only in window 32 (decode blocks are not
// stored in sliding windows). Window 32's store commits only window 32's removal; window 16's
// stays pending until the flush: [Removed(32), Stored(32), Removed(16)].
TEST(KVCacheManagerEventStoreForDifferentWindowDoesNotFlushPendingRemoves,
     StoreCommitsOnlyItsWindow) {
    kvb::Manager m = drainedManager(eventConfig().addWindow(16, 4).addWindow(32, 4));

    // X (5 tokens) leaves block 0 cached in both windows; queue [2, 3, 1, 0].
    m.addSequence(kvb::Request(0, tokenRun(500, 5)));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    const uint64_t hX = hashOf(m, 32, 0);
    ASSERT_EQ(hashOf(m, 16, 0), hX);
    // S (9 tokens) takes blocks 2, 3, 1 and stores two of them in both windows.
    m.addSequence(kvb::Request(1, tokenRun(0, 9)));
    m.storeContextBlocks(1, 9);
    ASSERT_EQ(flushAndDrain(m).size(), 4u);

    // The 13th token needs a block in each window: the only free one is X's cached block 0.
    generate(m, 1, {100, 101, 102, 103});
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events),
              (std::vector<EventKind>{
                  {32, KVB_EVENT_REMOVED}, {32, KVB_EVENT_STORED}, {16, KVB_EVENT_REMOVED}}))
        << describeEvents(events);
    EXPECT_EQ(events[0].removedHashes, std::vector<uint64_t>{hX});
    EXPECT_EQ(events[2].removedHashes, std::vector<uint64_t>{hX});
    m.checkInvariants();
}

// The same rule when both windows store (storeContextBlocks visits windows largest first):
// each window's removals come right before that window's own Stored event.
TEST(KVCacheManagerEventStoreForDifferentWindowDoesNotFlushPendingRemoves,
     EachWindowCommitsBeforeItsOwnStore) {
    kvb::Manager m = drainedManager(eventConfig().addWindow(16, 4).addWindow(32, 4));

    m.addSequence(kvb::Request(0, tokenRun(500, 5)));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    ASSERT_EQ(flushAndDrain(m).size(), 2u);

    // 13 tokens take all four blocks in each window (admission visits windows ascending, so
    // window 16 evicts first), then storeContextBlocks stores window 32, then window 16.
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    m.storeContextBlocks(1, 13);
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events), (std::vector<EventKind>{{32, KVB_EVENT_REMOVED},
                                                          {32, KVB_EVENT_STORED},
                                                          {16, KVB_EVENT_REMOVED},
                                                          {16, KVB_EVENT_STORED}}))
        << describeEvents(events);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Removed policy: every block that leaves a tree is reported (kvblock's documented policy;
// TensorRT-LLM V1 reports no Removed event for the take-over of a partial leaf).
// ---------------------------------------------------------------------------------------------

// An unused leaf that matches a new prompt only partially is taken over privately (its key is
// rewritten): it leaves the tree, so a Removed event names its hash.
TEST(KVCacheManagerEventRemovedPolicy, PartialLeafTakeOverIsReported) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 8));

    // 6 tokens: store keeps [0..4) and the partial [4] (5 of 6 tokens) as blocks 0 and 1.
    m.addSequence(kvb::Request(0, tokenRun(0, 6)));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    auto stored = flushAndDrain(m);
    ASSERT_EQ(stored.size(), 1u) << describeEvents(stored);
    ASSERT_EQ(stored[0].storedBlocks.size(), 2u);
    EXPECT_EQ(stored[0].storedBlocks[1].tokens, std::vector<int32_t>{4});
    const uint64_t hLeaf = hashOf(m, kW, 1);

    // [0..4) matches block 0; [4, 70] shares one token with the leaf, which nobody uses.
    kvb_admission_t a = m.addSequence(kvb::Request(1, {0, 1, 2, 3, 4, 70, 71}));
    EXPECT_EQ(a.prepopulated_prompt_len, 5);
    EXPECT_EQ(m.getCacheBlockIds(1, kW)[1], 1) << "the leaf itself was taken over";
    EXPECT_FALSE(m.getBlockInfo(kW, 1).in_reuse_tree);
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events), (std::vector<EventKind>{{kW, KVB_EVENT_REMOVED}}))
        << describeEvents(events);
    EXPECT_EQ(events[0].removedHashes, std::vector<uint64_t>{hLeaf});
    m.checkInvariants();
}

// Evicting a block whose descendants are cached detaches the whole subtree: every detached
// block is reported (in one Removed event), not only the evicted one.
TEST(KVCacheManagerEventRemovedPolicy, EvictedParentReportsItsSubtree) {
    constexpr int32_t kW = 32;
    kvb::Manager m = drainedManager(eventConfig().addWindow(kW, 4));

    // 13 tokens, first block at priority 10, the rest at 80: blocks 0 <- 1 <- 2 stored.
    m.addSequence(kvb::Request(0, tokenRun(0, 13)).withRange(0, 4, 10).withRange(4, -1, 80));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0, true);
    ASSERT_EQ(flushAndDrain(m).size(), 1u);
    const std::set<uint64_t> chain = {hashOf(m, kW, 0), hashOf(m, kW, 1), hashOf(m, kW, 2)};

    // One new block: the lowest priority goes first, i.e. the root of the chain.
    m.addSequence(kvb::Request(1, tokenRun(900, 3)));
    EXPECT_EQ(m.getCacheBlockIds(1, kW), std::vector<int32_t>{0});
    auto events = flushAndDrain(m);
    ASSERT_EQ(eventKinds(events), (std::vector<EventKind>{{kW, KVB_EVENT_REMOVED}}))
        << describeEvents(events);
    const auto& removed = events[0].removedHashes;
    EXPECT_EQ(std::set<uint64_t>(removed.begin(), removed.end()), chain);
    EXPECT_EQ(removed.size(), 3u);
    for (int32_t b : {1, 2}) {
        kvb_block_info_t info = m.getBlockInfo(kW, b);
        EXPECT_FALSE(info.in_reuse_tree) << "block " << b;
        EXPECT_TRUE(info.is_free) << "block " << b << " stays free, just unreachable";
    }
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Router model: a consumer applying the stream holds exactly the manager's trees.
// ---------------------------------------------------------------------------------------------

namespace {

struct RouterBlock {
    std::optional<uint64_t> parent;
    int32_t level = 0;
    int32_t priority = 0;
    bool operator==(const RouterBlock& o) const {
        return parent == o.parent && level == o.level && priority == o.priority;
    }
};

using RouterTree = std::map<uint64_t, RouterBlock>;  // hash -> block

std::string describeRouterBlock(uint64_t hash, const RouterBlock& b) {
    std::ostringstream os;
    os << hash << " (parent " << (b.parent ? std::to_string(*b.parent) : "root") << ", level "
       << b.level << ", priority " << b.priority << ")";
    return os.str();
}

/// Applies events as a KV-aware router would; fails on an event it could not apply.
class EventRouter {
  public:
    explicit EventRouter(std::optional<int32_t> dpRank) : dpRank_(dpRank) {}

    ::testing::AssertionResult apply(const std::vector<kvb::Event>& events) {
        for (const kvb::Event& e : events) {
            if (lastId_ && e.id <= *lastId_) {
                return ::testing::AssertionFailure()
                       << "event id " << e.id << " after " << *lastId_;
            }
            lastId_ = e.id;
            if (e.attentionDpRank != dpRank_) {
                return ::testing::AssertionFailure()
                       << "event " << e.id << " has the wrong dp rank";
            }
            RouterTree& tree = trees_[e.windowSize];
            switch (e.type) {
                case KVB_EVENT_CREATED:
                    if (!created_.insert(e.windowSize).second) {
                        return ::testing::AssertionFailure()
                               << "window " << e.windowSize << " created twice";
                    }
                    break;
                case KVB_EVENT_STORED: {
                    if (e.storedBlocks.empty()) {
                        return ::testing::AssertionFailure() << "empty Stored event " << e.id;
                    }
                    if (e.parentHash && !tree.count(*e.parentHash)) {
                        return ::testing::AssertionFailure()
                               << "event " << e.id << ": stored under unknown parent "
                               << *e.parentHash;
                    }
                    std::optional<uint64_t> parent = e.parentHash;
                    for (const auto& b : e.storedBlocks) {
                        if (!tree.emplace(b.hash, RouterBlock{parent, b.cacheLevel, b.priority})
                                 .second) {
                            return ::testing::AssertionFailure()
                                   << "event " << e.id << ": block " << b.hash << " stored twice";
                        }
                        parent = b.hash;
                    }
                    ++stored_;
                    break;
                }
                case KVB_EVENT_REMOVED:
                    if (e.removedHashes.empty()) {
                        return ::testing::AssertionFailure() << "empty Removed event " << e.id;
                    }
                    for (uint64_t h : e.removedHashes) {
                        if (tree.erase(h) != 1) {
                            return ::testing::AssertionFailure()
                                   << "event " << e.id << ": removed unknown block " << h;
                        }
                    }
                    ++removed_;
                    break;
                case KVB_EVENT_UPDATED: {
                    auto it = tree.find(e.blockHash);
                    if (it == tree.end()) {
                        return ::testing::AssertionFailure()
                               << "event " << e.id << ": update of unknown block " << e.blockHash;
                    }
                    if (!e.cacheLevel && !e.priority) {
                        return ::testing::AssertionFailure()
                               << "event " << e.id << ": Updated without a change";
                    }
                    if (e.cacheLevel) {
                        if (e.cacheLevel->oldValue != it->second.level) {
                            return ::testing::AssertionFailure()
                                   << "event " << e.id << ": level diff from "
                                   << e.cacheLevel->oldValue << " but the router has "
                                   << it->second.level;
                        }
                        it->second.level = e.cacheLevel->newValue;
                    }
                    if (e.priority) {
                        if (e.priority->oldValue != it->second.priority) {
                            return ::testing::AssertionFailure()
                                   << "event " << e.id << ": priority diff from "
                                   << e.priority->oldValue << " but the router has "
                                   << it->second.priority;
                        }
                        it->second.priority = e.priority->newValue;
                    }
                    ++updated_;
                    break;
                }
            }
        }
        return ::testing::AssertionSuccess();
    }

    const RouterTree& tree(int32_t window) { return trees_[window]; }
    size_t numCreated() const { return created_.size(); }
    uint64_t stored() const { return stored_; }
    uint64_t removed() const { return removed_; }
    uint64_t updated() const { return updated_; }

  private:
    std::optional<int32_t> dpRank_;
    std::optional<uint64_t> lastId_;
    std::map<int32_t, RouterTree> trees_;
    std::set<int32_t> created_;
    uint64_t stored_ = 0, removed_ = 0, updated_ = 0;
};

/// The tree of one window as the manager reports it block by block (getBlockInfo).
RouterTree actualTree(const kvb::Manager& m, int32_t window, int32_t numBlocks) {
    RouterTree out;
    for (int32_t b = 0; b < numBlocks; ++b) {
        kvb_block_info_t info = m.getBlockInfo(window, b);
        if (!info.in_reuse_tree) continue;
        RouterBlock rb;
        if (info.parent >= 0)
            rb.parent = m.getBlockInfo(window, static_cast<int32_t>(info.parent)).hash;
        rb.level = info.cache_level;
        rb.priority = info.priority;
        EXPECT_TRUE(out.emplace(info.hash, rb).second)
            << "two tree blocks share hash " << info.hash;
    }
    return out;
}

::testing::AssertionResult sameTree(const RouterTree& router, const RouterTree& actual) {
    for (const auto& [hash, block] : actual) {
        auto it = router.find(hash);
        if (it == router.end()) {
            return ::testing::AssertionFailure()
                   << "router misses " << describeRouterBlock(hash, block);
        }
        if (!(it->second == block)) {
            return ::testing::AssertionFailure()
                   << "router has " << describeRouterBlock(hash, it->second) << ", manager has "
                   << describeRouterBlock(hash, block);
        }
    }
    for (const auto& [hash, block] : router) {
        if (!actual.count(hash)) {
            return ::testing::AssertionFailure()
                   << "router still holds " << describeRouterBlock(hash, block);
        }
    }
    return ::testing::AssertionSuccess();
}

struct RouterWorkload {
    const char* name;
    std::vector<kvb_window_config_t> windows;  // window, primary, secondary, ...
    bool partialReuse;
    bool copyOnPartialReuse;
    int32_t dpRank;  // -1: none
};

bool isExpectedFailure(const kvb::Error& e) {
    return e.status() == KVB_STATUS_OUT_OF_BLOCKS || e.status() == KVB_STATUS_SEQUENCE_TOO_LONG;
}

/// Runs a random workload, checking the router's view against the trees at every flush.
void runRouterWorkload(const RouterWorkload& w, uint32_t seed, int steps) {
    SCOPED_TRACE(std::string(w.name) + " seed " + std::to_string(seed));
    kvb::Config c;
    c.raw.tokens_per_block = kEvTpb;
    c.raw.max_sequence_length = 48;
    c.raw.enable_partial_reuse = w.partialReuse;
    c.raw.copy_on_partial_reuse = w.copyOnPartialReuse;
    c.raw.manual_clock = true;
    c.raw.max_kv_event_entries = 1 << 20;
    c.raw.attention_dp_rank = w.dpRank;
    for (const auto& win : w.windows)
        c.addWindow(win.window_size, win.primary_blocks, win.secondary_blocks);
    kvb::Manager m(c);
    EventRouter router(w.dpRank >= 0 ? std::optional<int32_t>(w.dpRank) : std::nullopt);

    std::mt19937 rng(seed);
    auto below = [&rng](uint32_t n) { return static_cast<int32_t>(rng() % n); };
    auto chance = [&below](int32_t percent) { return below(100) < percent; };
    auto pick = [&below](size_t n) { return static_cast<size_t>(below(static_cast<uint32_t>(n))); };
    std::vector<std::vector<int32_t>> prefixes;
    for (int32_t p = 0; p < 4; ++p) prefixes.push_back(tokenRun(p * 100, 24));
    std::vector<uint64_t> live;
    uint64_t nextId = 0;

    auto check = [&](int step) {
        std::vector<kvb::Event> events = flushAndDrain(m);
        ASSERT_TRUE(router.apply(events)) << "step " << step << describeEvents(events);
        for (const auto& win : w.windows) {
            RouterTree actual =
                actualTree(m, win.window_size, win.primary_blocks + win.secondary_blocks);
            ASSERT_TRUE(sameTree(router.tree(win.window_size), actual))
                << "window " << win.window_size << " at step " << step << describeEvents(events);
        }
    };

    for (int step = 0; step < steps; ++step) {
        int32_t op = below(12);
        try {
            if (op <= 3) {
                // One request, or a batch of 2-3 admitted together (longest prefix that fits).
                std::vector<kvb::Request> batch;
                for (int32_t k = 0, n = chance(30) ? 2 + below(2) : 1; k < n; ++k) {
                    const auto& prefix = prefixes[pick(prefixes.size())];
                    int32_t shared = below(static_cast<uint32_t>(prefix.size()) + 1);
                    std::vector<int32_t> tokens(prefix.begin(), prefix.begin() + shared);
                    for (int32_t i = 0, t = 1 + below(12); i < t; ++i)
                        tokens.push_back(1000 + below(6));
                    kvb::Request r(nextId++, tokens);
                    if (chance(20)) r.withLora(static_cast<uint64_t>(below(2)));
                    if (chance(30)) {
                        const int32_t priorities[] = {10, 50, 80, 90};
                        int64_t duration = chance(50) ? 1 + below(20) : -1;
                        r.withRange(0, -1, priorities[below(4)], duration);
                        const int32_t decode[] = {20, 35, 60};
                        r.withDecodeRetention(decode[below(3)]);
                    }
                    batch.push_back(std::move(r));
                }
                size_t admitted = 1;
                if (batch.size() == 1) {
                    m.addSequence(batch[0]);
                } else {
                    admitted = m.addSequenceBatch(batch, /*longestPrefix=*/true).size();
                }
                for (size_t k = 0; k < admitted; ++k) {
                    live.push_back(batch[k].id);
                    if (chance(50)) {
                        m.storeContextBlocks(batch[k].id,
                                             static_cast<int32_t>(batch[k].tokens.size()));
                    }
                }
            } else if (op <= 5 && !live.empty()) {
                uint64_t id = live[pick(live.size())];
                m.addToken(id, 2000 + below(4));
                m.storeNewBlock(id);
            } else if (op <= 7 && !live.empty()) {
                size_t i = pick(live.size());
                uint64_t id = live[i];
                live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
                // A request that neither stored its context nor generated a token is preempted
                // before its prefill ran: it stores only what it reused (storing stops at the
                // history), the case of a request preempted mid-prefill.
                m.removeSequence(id, chance(85));
            } else if (op == 8) {
                m.advanceTime(below(10));
                m.refreshBlocks();
            } else if (op == 9) {
                const auto& win = w.windows[pick(w.windows.size())];
                int32_t block =
                    below(static_cast<uint32_t>(win.primary_blocks + win.secondary_blocks));
                kvb_block_info_t info = m.getBlockInfo(win.window_size, block);
                if (info.ref_count == 0) m.offloadBlock(win.window_size, block);
            } else if (op == 10 && !live.empty() && chance(30)) {
                m.storeBlocksForReuse(live[pick(live.size())], false);
            } else {
                check(step);
                if (::testing::Test::HasFatalFailure()) return;
            }
        } catch (const kvb::Error& e) {
            ASSERT_TRUE(isExpectedFailure(e)) << "step " << step << ": " << e.what();
        }
        ASSERT_NO_THROW(m.checkInvariants()) << "step " << step;
    }
    check(steps);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(router.numCreated(), w.windows.size());
    EXPECT_GT(router.stored(), 10u) << "the workload must store blocks";
    EXPECT_GT(router.removed(), 0u) << "the workload must evict blocks";
    EXPECT_GT(router.updated(), 0u) << "the workload must move or re-prioritise blocks";
}

}  // namespace

// Random workloads (single and batched admission with shared prefixes, LoRA, retention with
// expiry, decode with storeNewBlock, release with and without store, explicit offload, partial
// stores): after every flush the router's view, built only from events, equals the set of
// in-tree blocks reported by getBlockInfo (hash, parent, cache level, priority) in every window.
// Event ids strictly increase and carry the configured attention DP rank.
TEST(KVCacheManagerEventRouterModel, RouterViewEqualsReuseTrees) {
    const std::vector<RouterWorkload> workloads = {
        {"single window with host tier", {{48, 24, 16, 1, 1, 1, false}}, true, true, 3},
        {"no copy on partial reuse", {{48, 20, 8, 1, 1, 1, false}}, true, false, -1},
        {"no partial reuse, no host tier", {{48, 16, 0, 1, 1, 1, false}}, false, false, -1},
        {"variable windows with host tier",
         {{16, 30, 10, 1, 1, 1, false}, {48, 24, 12, 1, 1, 1, false}},
         true,
         true,
         0},
    };
    for (const RouterWorkload& w : workloads) {
        for (uint32_t seed = 1; seed <= 3; ++seed) {
            runRouterWorkload(w, seed, 2000);
            if (HasFatalFailure()) return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input to the event C API.
// ---------------------------------------------------------------------------------------------

namespace {

/// A live manager (events on) whose first drained batch holds Created and Stored.
struct EventBatchFixture {
    kvb::Manager m;
    kvb_event_batch_t* batch = nullptr;

    EventBatchFixture() : m(makeConfig()) {
        m.addSequence(kvb::Request(0, tokenRun(0, 9)));
        m.storeContextBlocks(0, 9);
        m.flushIterationEvents();
        kvb::check(kvb_manager_get_latest_events(m.get(), 0, &batch));
    }
    ~EventBatchFixture() { kvb_event_batch_free(batch); }
    static kvb::Config makeConfig() {
        kvb::Config c = eventConfig();
        c.addWindow(32, 8);
        return c;
    }
};

}  // namespace

// Null arguments fail with KVB_STATUS_NULL_POINTER; the out batch is left null on failure, so
// freeing it is always safe.
TEST(KVCacheManagerEventBadInput, NullPointers) {
    EventBatchFixture f;
    kvb_event_batch_t* out = reinterpret_cast<kvb_event_batch_t*>(&f);  // must be overwritten
    EXPECT_EQ(kvb_manager_get_latest_events(nullptr, 0, &out), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(kvb_manager_get_latest_events(f.m.get(), 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_flush_iteration_events(nullptr), KVB_STATUS_NULL_POINTER);

    size_t n = 0;
    uint64_t dropped = 0;
    kvb_event_t e{};
    kvb_stored_block_t b{};
    EXPECT_EQ(kvb_event_batch_size(nullptr, &n), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_size(f.batch, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_num_dropped(nullptr, &dropped), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_num_dropped(f.batch, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_get(nullptr, 0, &e), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_get(f.batch, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_get_stored_block(nullptr, 1, 0, &b), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_get_stored_block(f.batch, 1, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_batch_free(nullptr), KVB_OK) << "freeing null is a no-op";

    // Nothing was consumed by the failed drains.
    ASSERT_EQ(kvb_event_batch_size(f.batch, &n), KVB_OK);
    EXPECT_EQ(n, 2u);
    f.m.checkInvariants();
}

// Out-of-range indices and a negative timeout fail with KVB_STATUS_INVALID_ARGUMENT.
TEST(KVCacheManagerEventBadInput, InvalidArguments) {
    EventBatchFixture f;
    size_t n = 0;
    ASSERT_EQ(kvb_event_batch_size(f.batch, &n), KVB_OK);
    ASSERT_EQ(n, 2u);  // Created, Stored (2 blocks)
    kvb_event_t e{};
    kvb_stored_block_t b{};
    EXPECT_EQ(kvb_event_batch_get(f.batch, 2, &e), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_event_batch_get(f.batch, SIZE_MAX, &e), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_event_batch_get_stored_block(f.batch, 2, 0, &b), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_event_batch_get_stored_block(f.batch, 1, 2, &b), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_event_batch_get_stored_block(f.batch, 0, 0, &b), KVB_STATUS_INVALID_ARGUMENT)
        << "a Created event has no stored blocks";
    EXPECT_EQ(kvb_event_batch_get_stored_block(f.batch, 1, 1, &b), KVB_OK);
    EXPECT_EQ(b.num_tokens, 4u);

    kvb_event_batch_t* out = nullptr;
    EXPECT_EQ(kvb_manager_get_latest_events(f.m.get(), -1, &out), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
    try {
        f.m.getLatestEvents(-5);
        ADD_FAILURE() << "a negative timeout must throw";
    } catch (const kvb::Error& err) { EXPECT_EQ(err.status(), KVB_STATUS_INVALID_ARGUMENT); }
    f.m.checkInvariants();
}

// Draining through a destroyed manager fails with KVB_STATUS_DESTROYED (as does flushing).
TEST(KVCacheManagerEventBadInput, DestroyedManager) {
    kvb::Config c = eventConfig();
    c.addWindow(32, 8);
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* mgr = nullptr;
    ASSERT_EQ(kvb_manager_create(&raw, &mgr), KVB_OK);
    ASSERT_EQ(kvb_manager_flush_iteration_events(mgr), KVB_OK);  // Created is pending delivery
    ASSERT_EQ(kvb_manager_destroy(mgr), KVB_OK);
    kvb_event_batch_t* out = nullptr;
    EXPECT_EQ(kvb_manager_get_latest_events(mgr, 0, &out), KVB_STATUS_DESTROYED);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(kvb_manager_flush_iteration_events(mgr), KVB_STATUS_DESTROYED);
}
