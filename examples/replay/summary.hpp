// replay/summary.hpp: The replay's figures: the report, its summary on stdout and its JSON file.
#ifndef KVBLOCK_REPLAY_SUMMARY_HPP
#define KVBLOCK_REPLAY_SUMMARY_HPP

#include "common.hpp"
#include "options.hpp"
#include "timing.hpp"
#include "manager.hpp"
#include "requests.hpp"
#include "engine_loop.hpp"
#include "peer_loop.hpp"

namespace replay {

// ---- report ---------------------------------------------------------------------------------------

struct Report {
    const Options& o;
    size_t num_requests;
    int32_t max_sequence_length;
    const RunResult& run;
    kvb_kv_cache_stats_t stats;
    EventCounts events;
    double wall_seconds;
    kvb_disk_stats_t disk{};  // zeros without --disk-dir

    double seconds(Kind k) const { return static_cast<double>(run.t.ns[k]) * 1e-9; }
    uint64_t total_ns() const {
        uint64_t s = 0;
        for (uint64_t v : run.t.ns) s += v;
        return s;
    }
    uint64_t admission_ns() const {
        return run.t.ns[kLookup] + run.t.ns[kAdmitAlloc] + run.t.ns[kAdmitOther];
    }
    double ns_per_prompt_block() const {
        return run.c.admitted_blocks ? static_cast<double>(admission_ns()) /
                                           static_cast<double>(run.c.admitted_blocks)
                                     : 0;
    }
    double ns_per_decode_token() const {
        return run.c.decode_slots ? static_cast<double>(run.t.ns[kDecodeAlloc]) /
                                        static_cast<double>(run.c.decode_slots)
                                  : 0;
    }
    double hit_rate_all() const {
        return run.c.prompt_tokens_all ? static_cast<double>(run.c.reused_prompt_tokens_all) /
                                             static_cast<double>(run.c.prompt_tokens_all)
                                       : 0;
    }
    std::string loop_name() const { return o.loop == Loop::Engine ? "engine" : "peer"; }
};

inline void print_summary(const Report& r) {
    const Counters& c = r.run.c;
    auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    std::printf("kvblock replay, %s loop: %s\n", r.loop_name().c_str(), r.o.trace.c_str());
    std::string extras;
    if (r.o.loop == Loop::Engine) extras += ", token budget " + std::to_string(r.o.token_budget);
    if (!r.o.partial_reuse) extras += ", no partial reuse";
    if (r.o.realtime) extras += ", realtime";
    if (r.o.model != "uniform") extras += ", model " + r.o.model;
    if (r.o.block_bytes > 0) {
        extras += ", " + std::to_string(r.o.block_bytes) + " bytes per block in " +
                  (r.o.copy_backend == KVB_COPY_BACKEND_CUDA ? "GPU" : "host") + " pools";
    }
    std::printf(
        "  config       %zu requests, %d tokens/block, %d primary + %d host blocks, max running "
        "%d, "
        "max output %d, max sequence %d tokens%s\n",
        r.num_requests, r.o.tokens_per_block, r.o.primary_blocks, r.o.secondary_blocks,
        r.o.max_running, r.o.max_output, r.max_sequence_length, extras.c_str());
    if (r.o.model != "uniform") {
        // The preset's pools: bytes one token takes in each window.
        std::vector<kvb_layer_spec_t> layers;
        std::vector<kvb_window_config_t> windows;
        model_windows(model_preset(r.o.model), r.max_sequence_length, 0, 0, layers, windows);
        std::vector<int32_t> sizes(windows.size());
        std::vector<uint64_t> bytes(windows.size());
        size_t n = 0;
        std::string per_window;
        if (kvb_calculate_window_bytes_per_token(layers.data(), layers.size(), 2,
                                                 r.o.tokens_per_block, sizes.data(), bytes.data(),
                                                 sizes.size(), &n) == KVB_OK) {
            for (size_t i = 0; i < n; ++i) {
                per_window += (i ? ", " : "") + std::to_string(bytes[i]) + " in window " +
                              std::to_string(sizes[i]);
            }
        }
        std::printf("  model        %s: %zu layers; bytes per token %s\n", r.o.model.c_str(),
                    layers.size(), per_window.c_str());
    }
    std::printf(
        "  steps        %llu (%llu admissions, %llu admission attempts that did not fit, %llu "
        "preemptions)\n",
        u(c.steps), u(c.admissions), u(c.admission_failures), u(c.preemptions));
    if (r.o.scheduler == Scheduler::MaxUtilization) {
        std::printf("  scheduler    max-utilization: %llu suspensions, %llu resumes\n",
                    u(c.suspensions), u(c.resumes));
    }
    std::printf(
        "  prompt       %llu tokens, %llu reused: prefix hit rate %.4f (all admissions %.4f)\n",
        u(c.prompt_tokens), u(c.reused_prompt_tokens), c.hit_rate(), r.hit_rate_all());
    if (r.o.loop == Loop::Engine) {
        std::printf("  prefill      %llu tokens computed in %llu chunks\n", u(c.prefill_tokens),
                    u(c.prefill_chunks));
    }
    std::printf("  generated    %llu tokens (%llu decode slots, %llu new decode blocks)\n",
                u(c.generated_tokens), u(c.decode_slots), u(c.decode_new_blocks));
    const std::string left_tree =
        std::to_string(r.stats.evicted_blocks) + " (evicted or taken over)";
    std::printf(
        "  blocks       allocated %llu (%llu without cached content), reused %llu, missed %llu, "
        "offloaded %llu, onboarded %llu, left the reuse tree %s\n",
        u(r.stats.alloc_total_blocks), u(r.stats.alloc_new_blocks), u(r.stats.reused_blocks),
        u(r.stats.missed_blocks), u(r.stats.offloaded_blocks), u(r.stats.onboarded_blocks),
        left_tree.c_str());
    if (r.o.events) {
        std::printf(
            "  events       created %llu, stored %llu (%llu blocks), removed %llu (%llu hashes), "
            "updated %llu (%llu level, %llu priority), dropped %llu\n",
            u(r.events.created), u(r.events.stored), u(r.events.stored_blocks), u(r.events.removed),
            u(r.events.removed_hashes), u(r.events.updated), u(r.events.level_changes),
            u(r.events.priority_changes), u(r.events.dropped));
    } else {
        std::printf("  events       off\n");
    }
    if (!r.o.disk_dir.empty()) {
        const kvb_disk_stats_t& d = r.disk;
        std::printf(
            "  disk         %s I/O, %llu slots of %llu bytes (%llu used, %llu recovered at start, "
            "%llu ignored); hits %llu blocks (%llu prompt tokens not recomputed), reads %llu, "
            "writes %llu, dropped writes %llu, skipped %llu, errors %llu write / %llu read, "
            "verify failures %llu, discarded reads %llu, disk evictions %llu; admissions put off "
            "for disk reads %llu\n",
            d.direct_io ? "O_DIRECT" : "buffered", u(d.slots), u(d.slot_bytes), u(d.slots_used),
            u(d.recovered), u(d.ignored_at_restart), u(d.hits),
            u(d.hits * static_cast<uint64_t>(r.o.tokens_per_block)), u(d.reads), u(d.writes),
            u(d.write_drops), u(d.write_skips), u(d.write_errors), u(d.read_errors),
            u(d.verify_failures), u(d.reads_discarded), u(d.evictions), u(c.disk_parked));
    }
    uint64_t total_calls = 0;
    for (uint64_t v : r.run.t.calls) total_calls += v;
    std::printf(
        "  manager      %.3f s in %llu calls; per step p50 %.1f us, p99 %.1f us; "
        "%.1f ns per admitted prompt block (p50 %llu, p99 %llu over admitting steps), "
        "%.1f ns per decode slot\n",
        static_cast<double>(r.total_ns()) * 1e-9, u(total_calls),
        static_cast<double>(replay::percentile(r.run.step_ns, 0.5)) * 1e-3,
        static_cast<double>(replay::percentile(r.run.step_ns, 0.99)) * 1e-3,
        r.ns_per_prompt_block(), u(replay::percentile(r.run.block_ns, 0.5)),
        u(replay::percentile(r.run.block_ns, 0.99)), r.ns_per_decode_token());
    std::printf("  by kind     ");
    for (int k = 0; k < kNumKinds; ++k) {
        if (r.run.t.calls[k] == 0 && k != kLookup) continue;
        std::printf(" %s %.3f s / %llu;", kKindNames[k], r.seconds(static_cast<Kind>(k)),
                    u(r.run.t.calls[k]));
    }
    std::printf(
        "\n               (lookup and block hashing happen inside kvblock's admission and store "
        "calls: hash_prompt = hash_decode = lookup = 0)\n");
    std::printf("  wall         %.2f s total, %.2f s in the loop\n", r.wall_seconds,
                r.run.loop_seconds);
}

inline void write_json(const Report& r, const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write '" + path + "'");
    const Counters& c = r.run.c;
    replay::JsonWriter w(f);
    w.begin_object();
    w.str("tool", "kvblock replay");
    w.begin_object("config")
        .str("trace", r.o.trace)
        .str("loop", r.loop_name())
        .str("model", r.o.model)
        .str("scheduler",
             r.o.scheduler == Scheduler::MaxUtilization ? "max-utilization" : "preempt")
        .num("requests", static_cast<uint64_t>(r.num_requests))
        .num("limit", static_cast<uint64_t>(r.o.limit))
        .num("tokens_per_block", r.o.tokens_per_block)
        .num("primary_blocks", r.o.primary_blocks)
        .num("secondary_blocks", r.o.secondary_blocks)
        .num("max_running", r.o.max_running)
        .num("max_output", r.o.max_output)
        .num("token_budget", r.o.token_budget)
        .boolean("partial_reuse", r.o.partial_reuse)
        .boolean("realtime", r.o.realtime)
        .num("block_bytes", r.o.block_bytes)
        .boolean("events", r.o.events != 0)
        .num("max_sequence_length", r.max_sequence_length)
        .end_object();
    w.num("requests", static_cast<uint64_t>(r.num_requests))
        .num("steps", c.steps)
        .num("prompt_tokens", c.prompt_tokens)
        .num("reused_prompt_tokens", c.reused_prompt_tokens)
        .num("hit_rate", c.hit_rate())
        .num("prompt_tokens_all_admissions", c.prompt_tokens_all)
        .num("reused_prompt_tokens_all_admissions", c.reused_prompt_tokens_all)
        .num("hit_rate_all_admissions", r.hit_rate_all())
        .num("admissions", c.admissions)
        .num("admission_failures", c.admission_failures)
        .num("preemptions", c.preemptions)
        .num("suspensions", c.suspensions)
        .num("resumes", c.resumes)
        .num("hit_blocks", c.hit_blocks)
        .num("new_prompt_blocks", c.new_prompt_blocks)
        .num("admitted_blocks", c.admitted_blocks)
        .num("decode_slots", c.decode_slots)
        .num("decode_new_blocks", c.decode_new_blocks)
        .num("blocks_touched", c.admitted_blocks + c.decode_new_blocks)
        .num("generated_tokens", c.generated_tokens)
        .num("prefill_tokens", c.prefill_tokens)
        .num("prefill_chunks", c.prefill_chunks);
    if (!r.o.disk_dir.empty()) {
        w.begin_object("disk")
            .num("direct_io", r.disk.direct_io ? 1 : 0)
            .num("hits", r.disk.hits)
            .num("reads", r.disk.reads)
            .num("writes", r.disk.writes)
            .num("write_drops", r.disk.write_drops)
            .num("write_errors", r.disk.write_errors)
            .num("read_errors", r.disk.read_errors)
            .num("verify_failures", r.disk.verify_failures)
            .num("reads_discarded", r.disk.reads_discarded)
            .num("recovered", r.disk.recovered)
            .num("parked_admissions", c.disk_parked)
            .end_object();
    }
    w.begin_object("blocks")
        .num("allocated", r.stats.alloc_total_blocks)
        .num("allocated_new", r.stats.alloc_new_blocks)
        .num("reused", r.stats.reused_blocks)
        .num("missed", r.stats.missed_blocks)
        .num("offloaded", r.stats.offloaded_blocks)
        .num("onboarded", r.stats.onboarded_blocks)
        .num("free_primary_end", r.stats.free_num_blocks)
        .num("free_secondary_end", r.stats.free_secondary_blocks)
        .num("cache_hit_rate_blocks", r.stats.cache_hit_rate);
    w.num("left_reuse_tree", r.stats.evicted_blocks);  // evicted or taken over
    w.end_object();
    w.begin_object("events")
        .boolean("enabled", r.o.events != 0)
        .num("created", r.events.created)
        .num("stored", r.events.stored)
        .num("stored_blocks", r.events.stored_blocks)
        .num("removed", r.events.removed)
        .num("removed_hashes", r.events.removed_hashes)
        .num("updated", r.events.updated)
        .num("updated_level", r.events.level_changes)
        .num("updated_priority", r.events.priority_changes)
        .num("dropped", r.events.dropped)
        .end_object();
    // Seconds and calls per kind of timed call.
    const double total = static_cast<double>(r.total_ns()) * 1e-9;
    w.num("hash_prompt_seconds", 0.0).num("hash_decode_seconds", 0.0);
    for (int k = 0; k < kNumKinds; ++k) {
        std::string name = kKindNames[k];
        w.num((name + "_seconds").c_str(), r.seconds(static_cast<Kind>(k)));
        w.num((name + "_calls").c_str(), r.run.t.calls[k]);
    }
    w.num("manager_seconds_total", total)
        .num("manager_seconds_total_excl_hashing", total)
        .num("ns_per_prompt_block_admission", r.ns_per_prompt_block())
        .num("ns_per_prompt_block_admission_incl_hash", r.ns_per_prompt_block())
        .num("ns_per_decode_token_alloc", r.ns_per_decode_token())
        .num("ns_per_decode_token_alloc_incl_hash", r.ns_per_decode_token())
        .num("step_manager_ns_p50", replay::percentile(r.run.step_ns, 0.5))
        .num("step_manager_ns_p99", replay::percentile(r.run.step_ns, 0.99))
        .num("step_manager_ns_max", replay::percentile(r.run.step_ns, 1.0))
        .num("prompt_block_admission_ns_p50", replay::percentile(r.run.block_ns, 0.5))
        .num("prompt_block_admission_ns_p99", replay::percentile(r.run.block_ns, 0.99))
        .num("loop_seconds", r.run.loop_seconds)
        .num("wall_seconds", r.wall_seconds);
    w.str("series_columns", "step, hit_rate_so_far, free_primary_blocks");
    w.begin_array("series");
    for (const auto& p : replay::downsample(r.run.series, 500))
        w.point(p.step, p.hit_rate, p.free_primary);
    w.end_array();
    w.end_object();
    w.finish();
    if (std::fclose(f) != 0) throw std::runtime_error("cannot write '" + path + "'");
}

}  // namespace replay

#endif  // KVBLOCK_REPLAY_SUMMARY_HPP
