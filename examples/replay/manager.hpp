// replay/manager.hpp: The manager under replay and the thread that drains its KV events.
#ifndef KVBLOCK_REPLAY_MANAGER_HPP
#define KVBLOCK_REPLAY_MANAGER_HPP

#include "common.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace replay {

// ---- the manager and its event drainer ---------------------------------------------------------

/// Owns a kvb_manager_t.
struct ManagerHandle {
    kvb_manager_t* m = nullptr;
    ManagerHandle() = default;
    ManagerHandle(const ManagerHandle&) = delete;
    ManagerHandle& operator=(const ManagerHandle&) = delete;
    ~ManagerHandle() { kvb_manager_destroy(m); }
};

/// One full-attention window as long as the longest sequence; real pools (host memory, or GPU and
/// pinned host memory) when --block-bytes > 0. The CUDA backend copies on the legacy default
/// stream, standing in for the engine's.
inline void create_manager(ManagerHandle& h, const Options& o, int32_t max_sequence_length) {
    if (o.model != "uniform") {
        // A model preset: its layers decide the pools; every window gets the configured blocks.
        std::vector<kvb_layer_spec_t> layers;
        std::vector<kvb_window_config_t> windows;
        model_windows(model_preset(o.model), max_sequence_length, o.primary_blocks,
                      o.secondary_blocks, layers, windows);
        kvb_manager_config_t config;
        check(kvb_manager_config_init(&config), "kvb_manager_config_init");
        config.windows = windows.data();
        config.num_windows = windows.size();
        config.layers = layers.data();
        config.num_layers = layers.size();
        config.tokens_per_block = o.tokens_per_block;
        config.max_beam_width = 1;
        config.max_sequence_length = max_sequence_length;
        config.enable_partial_reuse = o.partial_reuse;
        config.copy_backend = o.copy_backend;
        config.max_kv_event_entries = o.events ? kEventEntries : 0;
        config.stall_pass_threshold = o.stall_passes;
        check(kvb_manager_create(&config, &h.m), "kvb_manager_create");
        return;
    }
    const bool real_pools = o.block_bytes > 0;
    kvb_window_config_t window{};
    window.window_size = max_sequence_length;
    window.primary_blocks = o.primary_blocks;
    window.secondary_blocks = o.secondary_blocks;
    window.num_layers = 1;
    window.num_kv_heads = 1;
    // Row bytes = layers x 2 (K, V) x heads x tokens_per_block x size_per_head x bytes_per_element.
    window.size_per_head =
        real_pools ? static_cast<int32_t>(o.block_bytes / (2 * o.tokens_per_block)) : 1;

    kvb_manager_config_t config;
    check(kvb_manager_config_init(&config), "kvb_manager_config_init");
    config.windows = &window;
    config.num_windows = 1;
    config.tokens_per_block = o.tokens_per_block;
    config.max_beam_width = 1;
    config.max_sequence_length = max_sequence_length;
    config.enable_partial_reuse = o.partial_reuse;
    config.bytes_per_element = 1;
    config.copy_backend = o.copy_backend;
    config.max_kv_event_entries = o.events ? kEventEntries : 0;
    config.stall_pass_threshold = o.stall_passes;
    kvb_disk_tier_config_t disk;
    check(kvb_disk_tier_config_init(&disk), "kvb_disk_tier_config_init");
    if (!o.disk_dir.empty()) {
        disk.directory = o.disk_dir.c_str();
        disk.bytes_per_window = static_cast<uint64_t>(o.disk_bytes);
        disk.max_writes_queued = o.disk_write_queue;
        config.disk = &disk;
    }
    kvb_remote_tier_config_t remote;
    check(kvb_remote_tier_config_init(&remote), "kvb_remote_tier_config_init");
    if (!o.remote.empty()) {
        remote.urls = o.remote.c_str();
        remote.cluster = o.remote_cluster;
        remote.password = o.remote_password.empty() ? nullptr : o.remote_password.c_str();
        remote.model_id = o.remote_model.c_str();
        config.remote = &remote;
    }
    check(kvb_manager_create(&config, &h.m), "kvb_manager_create");
    if (o.disk_read_latency_us > 0) {
        check(kvb_manager_disk_inject_read_latency(h.m,
                                                   static_cast<uint64_t>(o.disk_read_latency_us)),
              "kvb_manager_disk_inject_read_latency");
    }
}

/// Events by type, as counted by the drainer thread.
struct EventCounts {
    uint64_t created = 0, stored = 0, stored_blocks = 0, removed = 0, removed_hashes = 0;
    uint64_t updated = 0, level_changes = 0, priority_changes = 0, dropped = 0;
};

/// A second thread that drains the manager's events (kvb_manager_get_latest_events waits without
/// holding the manager's lock) until stopped, then takes what is left.
class EventDrainer {
  public:
    explicit EventDrainer(kvb_manager_t* m) : m_(m), thread_([this] { run(); }) {}
    ~EventDrainer() { stop(); }
    EventDrainer(const EventDrainer&) = delete;
    EventDrainer& operator=(const EventDrainer&) = delete;

    /// Call after the last flush: the final drain then sees every event.
    void stop() {
        if (thread_.joinable()) {
            stop_.store(true);
            thread_.join();
        }
    }
    const EventCounts& counts() const { return counts_; }  // after stop()
    const std::string& error() const { return error_; }

  private:
    void run() {
        while (!stop_.load() && drain(50)) {}
        drain(0);
    }
    bool drain(int64_t timeout_ms) {
        kvb_event_batch_t* batch = nullptr;
        kvb_status_t s = kvb_manager_get_latest_events(m_, timeout_ms, &batch);
        if (s != KVB_OK) {
            error_ = std::string("kvb_manager_get_latest_events: ") + kvb_status_string(s) + ": " +
                     kvb_last_error_message();
            return false;
        }
        size_t n = 0;
        uint64_t dropped = 0;
        kvb_event_batch_size(batch, &n);
        kvb_event_batch_num_dropped(batch, &dropped);
        counts_.dropped += dropped;
        for (size_t i = 0; i < n; ++i) {
            kvb_event_t e;
            if (kvb_event_batch_get(batch, i, &e) != KVB_OK) continue;
            switch (e.event_type) {
                case KVB_EVENT_CREATED:
                    ++counts_.created;
                    break;
                case KVB_EVENT_STORED:
                    ++counts_.stored;
                    counts_.stored_blocks += e.num_stored_blocks;
                    break;
                case KVB_EVENT_REMOVED:
                    ++counts_.removed;
                    counts_.removed_hashes += e.num_removed_hashes;
                    break;
                case KVB_EVENT_UPDATED:
                    ++counts_.updated;
                    counts_.level_changes += e.has_cache_level_change ? 1 : 0;
                    counts_.priority_changes += e.has_priority_change ? 1 : 0;
                    break;
                default:
                    break;
            }
        }
        kvb_event_batch_free(batch);
        return true;
    }

    kvb_manager_t* m_;
    EventCounts counts_;
    std::string error_;
    std::atomic<bool> stop_{false};
    std::thread thread_;  // last: starts after the members above exist
};

}  // namespace replay

#endif  // KVBLOCK_REPLAY_MANAGER_HPP
