// The C ABI of the wire publisher (kvb_event_publisher_*): argument validation, status codes and
// messages, endpoints read back, subscribers counted, destroy joining cleanly. The payload and
// the router are checked by scripts/events_wire_test.py.
#include <gtest/gtest.h>

#include <string>

#include "kvblock.h"
#include "test_support.hpp"

namespace {

kvb::Manager eventManager(int32_t eventEntries) {
    kvb::Config c = kvb_test::windowConfig(64, 16, 0, 4, 64);
    c.raw.max_kv_event_entries = eventEntries;
    return kvb::Manager(c);
}

kvb_event_publisher_config_t loopbackConfig() {
    kvb_event_publisher_config_t c;
    EXPECT_EQ(kvb_event_publisher_config_init(&c), KVB_OK);
    c.endpoint = "tcp://127.0.0.1:*";
    return c;
}

std::string endpointOf(const kvb_event_publisher_t* p, bool replay) {
    char buf[128];
    size_t len = 0;
    EXPECT_EQ(kvb_event_publisher_get_endpoint(p, replay, buf, sizeof buf, &len), KVB_OK);
    return std::string(buf, len);
}

TEST(Publisher, CreatesOnLoopbackAndReportsBoundEndpoints) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    c.replay_endpoint = "tcp://127.0.0.1:*";
    kvb_event_publisher_t* p = nullptr;
    ASSERT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_OK) << kvb_last_error_message();
    const std::string pub = endpointOf(p, false), rep = endpointOf(p, true);
    EXPECT_EQ(pub.rfind("tcp://127.0.0.1:", 0), 0u) << pub;
    EXPECT_NE(pub, rep);
    EXPECT_EQ(pub.find('*'), std::string::npos) << "port resolved";

    char small[4];
    size_t needed = 0;
    EXPECT_EQ(kvb_event_publisher_get_endpoint(p, false, small, sizeof small, &needed),
              KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(needed, pub.size());

    kvb_event_publisher_stats_t s{};
    ASSERT_EQ(kvb_event_publisher_get_stats(p, &s), KVB_OK);
    EXPECT_EQ(s.batches, 0u);
    EXPECT_EQ(s.next_sequence, 0u);
    uint64_t subs = 7;
    EXPECT_EQ(kvb_event_publisher_wait_for_subscribers(p, 0, 0, &subs), KVB_OK);
    EXPECT_EQ(subs, 0u);
    EXPECT_EQ(kvb_event_publisher_destroy(p), KVB_OK);
}

TEST(Publisher, StartSequenceShowsInStats) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    c.start_sequence = 42;
    kvb_event_publisher_t* p = nullptr;
    ASSERT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_OK);
    kvb_event_publisher_stats_t s{};
    ASSERT_EQ(kvb_event_publisher_get_stats(p, &s), KVB_OK);
    EXPECT_EQ(s.next_sequence, 42u);
    kvb_event_publisher_destroy(p);
}

TEST(Publisher, RejectsBadArgumentsWithAStatusAndAMessage) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    kvb_event_publisher_t* p = reinterpret_cast<kvb_event_publisher_t*>(0x1);

    EXPECT_EQ(kvb_event_publisher_create(m.get(), nullptr, &p), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(p, nullptr) << "out is cleared on failure";
    EXPECT_EQ(kvb_event_publisher_create(nullptr, &c, &p), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &c, nullptr), KVB_STATUS_NULL_POINTER);

    kvb_event_publisher_config_t bad = c;
    bad.struct_size = 3;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_STRUCT_SIZE);
    bad = c;
    bad.endpoint = nullptr;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_NULL_POINTER);
    bad = c;
    bad.endpoint = "not-an-endpoint";
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_TRANSPORT);
    EXPECT_NE(std::string(kvb_last_error_message()).find("not-an-endpoint"), std::string::npos);
    bad = c;
    bad.window_size = 32;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_INVALID_ARGUMENT);
    bad = c;
    bad.send_hwm = -1;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_INVALID_ARGUMENT);
    bad = c;
    bad.replay_endpoint = "tcp://127.0.0.1:*";
    bad.replay_buffer_steps = 0;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &bad, &p), KVB_STATUS_INVALID_ARGUMENT);

    kvb::Manager quiet = eventManager(0);
    EXPECT_EQ(kvb_event_publisher_create(quiet.get(), &c, &p), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvb_last_error_message()).find("events off"), std::string::npos);

    uint64_t n = 0;
    kvb_event_publisher_stats_t s{};
    EXPECT_EQ(kvb_event_publisher_wait_for_subscribers(nullptr, 1, 0, &n), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_publisher_get_stats(nullptr, &s), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_event_publisher_destroy(nullptr), KVB_OK);
    EXPECT_EQ(std::string(kvb_status_string(KVB_STATUS_TRANSPORT)), "transport error");
}

TEST(Publisher, ReplayEndpointOfAPublisherWithoutReplayIsAnError) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    kvb_event_publisher_t* p = nullptr;
    ASSERT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_OK);
    char buf[64];
    size_t len = 0;
    EXPECT_EQ(kvb_event_publisher_get_endpoint(p, true, buf, sizeof buf, &len),
              KVB_STATUS_INVALID_ARGUMENT);
    uint64_t n = 0;
    EXPECT_EQ(kvb_event_publisher_wait_for_subscribers(p, 1, -2, &n), KVB_STATUS_INVALID_ARGUMENT);
    kvb_event_publisher_destroy(p);
}

TEST(Publisher, DestroyTwiceAndCallsAfterDestroyReturnDestroyed) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    kvb_event_publisher_t* p = nullptr;
    ASSERT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_OK);
    kvb_event_publisher_t* second = nullptr;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &c, &second), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(second, nullptr);
    EXPECT_EQ(kvb_event_publisher_destroy(p), KVB_OK);
    EXPECT_EQ(kvb_event_publisher_destroy(p), KVB_STATUS_DESTROYED);
    kvb_event_publisher_stats_t s{};
    EXPECT_EQ(kvb_event_publisher_get_stats(p, &s), KVB_STATUS_DESTROYED);
    kvb_event_publisher_service_stats_t v{};
    v.struct_size = sizeof v;
    EXPECT_EQ(kvb_event_publisher_get_service_stats(p, &v), KVB_STATUS_DESTROYED);
}

TEST(Publisher, BadPortsAndStartSequencesAreRefused) {
    kvb::Manager m = eventManager(1024);
    kvb_event_publisher_config_t c = loopbackConfig();
    kvb_event_publisher_t* p = nullptr;
    c.endpoint = "tcp://127.0.0.1:70000";
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_STATUS_TRANSPORT);
    c.endpoint = "tcp://127.0.0.1:x";
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_STATUS_TRANSPORT);
    c = loopbackConfig();
    c.start_sequence = UINT64_MAX;
    EXPECT_EQ(kvb_event_publisher_create(m.get(), &c, &p), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
}

}  // namespace
