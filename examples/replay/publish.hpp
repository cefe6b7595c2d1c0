// KV events on the wire for the replay (`--publish`): a kvblock event publisher attached to the
// replay's manager, so that a KV-aware router (e.g. Dynamo's standalone indexer) can watch the
// replay live, plus the router check (`--publish-check`): after the run, prompts and kvblock's
// own reusable-block counts, to compare with the router's view.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvblock.h"

namespace replay {

struct PublishOptions {
    std::string endpoint;           // --publish: PUB endpoint; empty = no publisher
    std::string replay_endpoint;    // --publish-replay: ROUTER endpoint for gap replay
    uint64_t wait_subscribers = 0;  // --publish-wait-subscribers: before the first step
    uint64_t late_subscribers = 0;  // --publish-late-subscribers: before the check's probe
    std::string check;              // --publish-check: JSON lines of prompts and counts
    bool hold = false;              // --publish-hold: serve replays until stdin closes
};

inline void publish_check_status(kvb_status_t s, const char* what) {
    if (s != KVB_OK) {
        throw std::runtime_error(std::string(what) + ": " + kvb_status_string(s) + ": " +
                                 kvb_last_error_message());
    }
}

/// Owns a kvb_event_publisher_t attached to the manager.
class EventPublisher {
  public:
    EventPublisher(kvb_manager_t* m, const PublishOptions& o) {
        kvb_event_publisher_config_t config;
        publish_check_status(kvb_event_publisher_config_init(&config),
                             "kvb_event_publisher_config_init");
        config.endpoint = o.endpoint.c_str();
        if (!o.replay_endpoint.empty()) {
            config.replay_endpoint = o.replay_endpoint.c_str();
            config.replay_buffer_steps = 1 << 20;  // the whole replay, so a late router catches up
        }
        config.send_hwm = 0;  // a replay publishes in bursts: never drop on the wire
        publish_check_status(kvb_event_publisher_create(m, &config, &p_),
                             "kvb_event_publisher_create");
        std::fprintf(stderr, "publishing KV events on %s%s%s\n", endpoint(false).c_str(),
                     o.replay_endpoint.empty() ? "" : ", replay on ",
                     o.replay_endpoint.empty() ? "" : endpoint(true).c_str());
    }
    ~EventPublisher() { kvb_event_publisher_destroy(p_); }
    EventPublisher(const EventPublisher&) = delete;
    EventPublisher& operator=(const EventPublisher&) = delete;

    std::string endpoint(bool replay) const {
        char buf[256];
        size_t len = 0;
        publish_check_status(kvb_event_publisher_get_endpoint(p_, replay, buf, sizeof buf, &len),
                             "kvb_event_publisher_get_endpoint");
        return std::string(buf, len);
    }

    /// Blocks until `n` subscriptions arrived in total (0 = return at once).
    void wait_for_subscribers(uint64_t n) const {
        if (n == 0) return;
        std::fprintf(stderr, "waiting for %llu subscriber(s)\n",
                     static_cast<unsigned long long>(n));
        uint64_t got = 0;
        publish_check_status(kvb_event_publisher_wait_for_subscribers(p_, n, -1, &got),
                             "kvb_event_publisher_wait_for_subscribers");
    }

    kvb_event_publisher_stats_t stats() const {
        kvb_event_publisher_stats_t s{};
        publish_check_status(kvb_event_publisher_get_stats(p_, &s),
                             "kvb_event_publisher_get_stats");
        return s;
    }

  private:
    kvb_event_publisher_t* p_ = nullptr;
};

/// Waits until the publisher has sent everything flushed so far (its counters stop moving), then
/// prints what it published and the rate since `start`.
inline kvb_event_publisher_stats_t wait_until_sent(const EventPublisher& pub) {
    kvb_event_publisher_stats_t s = pub.stats();
    for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        kvb_event_publisher_stats_t t = pub.stats();
        if (t.batches == s.batches && t.dropped_events == s.dropped_events) return t;
        s = t;
    }
}

template <class TimePoint>
void report_published(const EventPublisher& pub, TimePoint start) {
    const kvb_event_publisher_stats_t s = wait_until_sent(pub);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "  published    %llu batches, %llu events (%.0f events/s over %.2f s), %llu dropped, %llu "
        "gaps, "
        "%llu subscriptions, %llu replay requests\n",
        static_cast<unsigned long long>(s.batches), static_cast<unsigned long long>(s.events),
        seconds > 0 ? static_cast<double>(s.events) / seconds : 0.0, seconds,
        static_cast<unsigned long long>(s.dropped_events), static_cast<unsigned long long>(s.gaps),
        static_cast<unsigned long long>(s.subscriptions),
        static_cast<unsigned long long>(s.replay_requests));
    std::fflush(stdout);
}

inline kvb_request_t prompt_request(uint64_t id, const std::vector<int32_t>& prompt) {
    kvb_request_t r;
    publish_check_status(kvb_request_init(&r), "kvb_request_init");
    r.request_id = id;
    r.input_length = static_cast<int32_t>(prompt.size());
    r.tokens = prompt.data();
    r.num_tokens = prompt.size();
    return r;
}

/// The router check after the run: waits for late subscribers, then admits, computes (one prefill
/// chunk: store_context_blocks of the whole prompt) and releases one probe prompt (a sampled
/// prompt with a fresh tail, so the probe publishes a batch that late subscribers see, detect
/// their gap on and replay), then writes one JSON line per prompt with kvblock's reusable full
/// blocks in the published window.
inline void write_publish_check(kvb_manager_t* m, const EventPublisher& pub,
                                const PublishOptions& o, std::vector<std::vector<int32_t>> prompts,
                                int32_t window, int32_t tokens_per_block, uint64_t probe_id) {
    pub.wait_for_subscribers(o.late_subscribers);
    if (!prompts.empty()) {
        std::vector<int32_t> probe = prompts.front();
        for (int32_t i = 0; i < 2 * tokens_per_block; ++i) probe.push_back(1'000'000'007 + i);
        kvb_request_t r = prompt_request(probe_id, probe);
        publish_check_status(kvb_manager_add_sequence(m, &r, nullptr),
                             "kvb_manager_add_sequence (probe)");
        // Storing stops at what was computed: the engine's prefill of the probe comes first.
        publish_check_status(
            kvb_manager_store_context_blocks(m, probe_id, static_cast<int32_t>(probe.size())),
            "kvb_manager_store_context_blocks (probe)");
        publish_check_status(kvb_manager_remove_sequence(m, probe_id, true),
                             "kvb_manager_remove_sequence (probe)");
        publish_check_status(kvb_manager_flush_iteration_events(m),
                             "kvb_manager_flush_iteration_events");
        prompts.push_back(std::move(probe));
    }
    std::FILE* f = std::fopen(o.check.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write '" + o.check + "'");
    for (const auto& p : prompts) {
        kvb_request_t r = prompt_request(probe_id + 1, p);
        int32_t n = 0;
        publish_check_status(kvb_manager_count_reusable_blocks(m, &r, window, false, &n),
                             "kvb_manager_count_reusable_blocks");
        std::fprintf(f, "{\"reusable_blocks\": %d, \"tokens\": [", n);
        for (size_t i = 0; i < p.size(); ++i) std::fprintf(f, i ? ",%d" : "%d", p[i]);
        std::fprintf(f, "]}\n");
    }
    if (std::fclose(f) != 0) throw std::runtime_error("cannot write '" + o.check + "'");
}

/// `--publish-hold`: waits until everything is sent, tells the watcher (with the next sequence
/// number) that the check is written and keeps the publisher (and its
/// replay socket) alive until standard input closes.
inline void hold_publisher(const EventPublisher& pub, const PublishOptions& o) {
    if (!o.hold) return;
    std::printf("publish-hold: ready next_sequence=%llu\n",
                static_cast<unsigned long long>(wait_until_sent(pub).next_sequence));
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {}
}

}  // namespace replay
