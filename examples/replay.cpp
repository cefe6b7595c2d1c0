// replay: replays a Mooncake-format trace through kvblock, driving its C ABI (kvblock.h) the way an
// inference engine's batch manager does, and reports what the cache did and what it cost.
//
//   build/examples/replay                                # engine loop on the bundled trace
//   build/examples/replay --loop peer --json out.json    # the peer workload (vLLM / SGLang figures)
//   build/examples/replay --help                         # every option
//
// The default trace is data/mooncake_synthetic_trace.jsonl of the source tree (Mooncake FAST'25,
// Apache-2.0, see data/README.md): its absolute path is compiled in by examples/CMakeLists.txt
// (KVBLOCK_REPLAY_DEFAULT_TRACE); `--trace PATH` reads another file of the same format.
//
// Tokens. Trace lines carry only hash ids of 512-token blocks, so tokens are synthesised, in both
// loops, exactly as the peer workload defines them (replay/trace.hpp): prompt token i =
// splitmix64((hash_ids[i/512] << 9) | (i % 512)) % 32000, generated token at sequence position p of
// request r = splitmix64((1 << 63) | (r << 32) | p) % 32000. `--self-test` checks known values of
// the synthesis. A request generates T = max(1, min(output_length, --max-output)) tokens (0 = no
// cap).
//
// ENGINE LOOP (`--loop engine`, the default): an executor iteration of a TensorRT-LLM-like engine.
// Requests arrive in trace order: all of them are waiting from the start (as fast as possible), or
// with `--realtime` each becomes waiting when a simulated clock (ms since start, advanced by wall
// time) passes its timestamp (steps take only the manager's time: no model time is simulated).
// Each step:
//   1. Decode. Every running request whose prompt is complete gets a KV slot for its last token:
//      kvb_manager_add_token(id, last token), then kvb_manager_store_new_block (stores the block
//      that token closed, if any). One token of the step's budget each (--token-budget, default
//      8192), decodes first. On KVB_STATUS_OUT_OF_BLOCKS the most recently admitted running
//      request is preempted - kvb_manager_remove_sequence(id, store) with store only when its
//      prompt was complete (the blocks of a half-done prefill were stored after their chunks and
//      the rest has no KV yet) - and put back at the front of the waiting queue; the slot is
//      retried; if the request itself was the one preempted, decoding stops for this step.
//   2. Prefill. Running requests still in their prompt get chunks of the remaining budget, in
//      admission order (chunked prefill).
//   3. Admission, skipped in a step that preempted. Candidates are taken from the head of the
//      waiting queue (FCFS) while a running slot is free (--max-running, default 64) and the budget
//      is not yet reserved by the candidates' full prompts (so a request is admitted when its first
//      chunk can run); they are admitted in one kvb_manager_add_sequence_batch with longest_prefix:
//      the requests that fit are admitted, the rest stay at the head of the queue. A request's
//      input is its prompt, or prompt + generated tokens after a preemption (recompute). Its prefill
//      starts at the returned prepopulated length (reused prefix) and gets a first chunk if budget
//      is left. If nothing is running and the head request does not fit, the run fails.
//   4. kvb_manager_refresh_blocks (then the model's forward pass would run).
//   5. After the forward pass: kvb_manager_store_context_blocks(id, new context position) for every
//      chunk; a request whose prompt completed samples its first token.
//   6. Sampling: each decoding request appends one token. A request with T tokens is finished and
//      released with kvb_manager_remove_sequence(id, store_for_reuse = true); it holds KV for
//      input_length + T - 1 tokens at that point.
//   7. kvb_manager_flush_iteration_events. Events are on (1 << 20 entries) and a second thread
//      drains them with kvb_manager_get_latest_events, counting them by type.
// `--scheduler max-utilization` replaces preemption by suspension, as a max-utilization scheduler
// does: a step first resumes suspended requests, oldest admission first, while
// kvb_manager_resume succeeds and a running slot is free; a decode reserves its slot with
// kvb_manager_allocate_generation, and when that fails the most recently admitted running request
// is suspended (kvb_manager_suspend: its blocks move to the host tier when the next allocation
// needs their GPU rows) and the slot retried; nothing is admitted while a request is suspended;
// the step ends with kvb_manager_end_scheduling_pass, whose KVB_STATUS_STALLED ends the run with
// its cause (e.g. no host tier) instead of spinning (--stall-passes, default 1000).
//
// PEER LOOP (`--loop peer`): the closed loop of the peer replay workload (vLLM v1's scheduler
// order: decode, then admission, as below), so kvblock is measured on the same work as vLLM and
// SGLang. No chunked prefill, no token budget.
//   A. Decode: for each running request in order, add_token + store_new_block, all in one
//      kvb_manager_add_token_batch per step; when the manager cannot provide a request's slot,
//      preempt the last running request (remove_sequence with store), push it to the front of
//      waiting, retry from that request; stop phase A if it was the request itself.
//   B. Admission, only if nothing was preempted: while a slot is free, the head request is admitted
//      whole (kvb_manager_add_sequence of its current sequence, then store_context_blocks(id, n));
//      if it does not fit, admission stops (head-of-line blocking); nothing running and the head
//      does not fit fails the run.
//   C. Every request scheduled in A or B appends a token; finished ones are released (store).
//   Defaults: 32 tokens per block, 30,000 primary blocks, no host tier, 64 running, 128 outputs,
//   events off. (Engine defaults: the same plus 30,000 host blocks, a budget of 8192, events on.) Refresh and flush are not called (the peers have no such hooks; with --events
//   the flush is called and timed).
//
// METRICS. Only manager calls are timed, one clock pair per call (the CPU's time-stamp counter on
// x86-64, as the floor of the peer workload times its calls, converted to ns by its rate against
// steady_clock over the loop; steady_clock elsewhere); token synthesis, trace parsing and the
// loop are not. Kinds: lookup (always 0 here: kvblock looks up inside admission),
// admit_alloc (add_sequence / add_sequence_batch, failed attempts included), admit_other
// (store_context_blocks), decode_alloc (add_token + store_new_block; in the peer loop the step's
// kvb_manager_add_token_batch calls), free (release at finish),
// preempt, refresh, flush. hash_prompt / hash_decode are 0: kvblock hashes inside those calls.
// Hit rate = reused prompt tokens (prepopulated lengths) / prompt tokens over first admissions
// (`_all_admissions` includes re-admissions). ns per prompt block admission = (lookup +
// admit_alloc + admit_other) / admitted blocks (ceil(n / B) summed over admissions). Manager time
// per step = the sum of a step's timed calls, p50 / p99 over steps.
//
// At the end the replay checks the manager's invariants (kvb_manager_check_invariants) and that
// every block is free again, and fails otherwise.
//
// OUTPUT: a summary on stdout, a progress bar on stderr, `--json PATH` with the same figures
// (field names prompt_tokens, reused_prompt_tokens, hit_rate, ...) and a sampled time series, and
// an SVG plot of the hit rate so far and the free primary blocks per step (`--svg PATH`; default:
// the JSON path with .svg, else replay.svg in the current directory; `--no-svg`: none).
#include "replay/summary.hpp"

namespace replay {
namespace {

int run(const Options& o) {
    const auto wall_start = Clock::now();
    std::vector<TraceRequest> trace = replay::load_trace(o.trace, o.limit);
    if (o.instances > 1) {  // this instance's share of the trace
        std::vector<TraceRequest> mine;
        for (size_t i = static_cast<size_t>(o.instance); i < trace.size();
             i += static_cast<size_t>(o.instances))
            mine.push_back(std::move(trace[i]));
        trace = std::move(mine);
    }

    std::vector<Req> reqs(trace.size());
    int32_t max_sequence_length = 1;
    for (size_t i = 0; i < trace.size(); ++i) {
        Req& q = reqs[i];
        q.r = i;
        q.trace = &trace[i];
        int32_t cap = o.max_output > 0 ? std::min(trace[i].output_length, o.max_output)
                                       : trace[i].output_length;
        q.T = std::max(1, cap);
        max_sequence_length = std::max<int32_t>(max_sequence_length, trace[i].input_length + q.T);
    }

    ManagerHandle manager;
    create_manager(manager, o, max_sequence_length);
    EventCounts events;
    RunResult result;
    {
        // A publisher is the events' consumer; otherwise a drainer thread counts them.
        std::unique_ptr<replay::EventPublisher> publisher;
        if (!o.publish.endpoint.empty())
            publisher = std::make_unique<replay::EventPublisher>(manager.m, o.publish);
        if (publisher) publisher->wait_for_subscribers(o.publish.wait_subscribers);
        const auto publish_start = Clock::now();
        std::unique_ptr<EventDrainer> drainer;
        if (o.events && !publisher) drainer = std::make_unique<EventDrainer>(manager.m);
        replay::Progress progress(reqs.size(), !o.quiet);
        if (o.loop == Loop::Engine) {
            result = EngineLoop(o, manager.m, reqs, progress).run();
        } else {
            result = PeerLoop(o, manager.m, reqs, progress).run();
        }
        progress.update(result.c.finished, result.c.steps, result.c.hit_rate(), true);
        progress.finish();
        if (drainer) {
            check(kvb_manager_flush_iteration_events(manager.m),
                  "kvb_manager_flush_iteration_events");
            drainer->stop();
            if (!drainer->error().empty()) throw std::runtime_error(drainer->error());
            events = drainer->counts();
        }
        if (publisher) {
            check(kvb_manager_flush_iteration_events(manager.m),
                  "kvb_manager_flush_iteration_events");
            replay::report_published(*publisher, publish_start);
            if (!o.publish.check.empty()) {
                std::vector<std::vector<int32_t>> prompts;
                const size_t stride = std::max<size_t>(1, reqs.size() / 32);
                for (size_t i = 0; i < reqs.size(); i += stride) {
                    prompts.push_back(
                        replay::synthesize_prompt(*reqs[i].trace));  // freed at finish
                }
                replay::write_publish_check(manager.m, *publisher, o.publish, std::move(prompts),
                                            max_sequence_length, o.tokens_per_block, reqs.size());
            }
            replay::hold_publisher(*publisher, o.publish);
        }
    }
    kvb_disk_stats_t disk{};
    disk.struct_size = sizeof(disk);
    if (!o.disk_dir.empty()) {
        // Reads still in flight hold host blocks: let them land before the final checks.
        for (;;) {
            check(kvb_manager_disk_poll(manager.m, nullptr), "kvb_manager_disk_poll");
            check(kvb_manager_get_disk_stats(manager.m, &disk), "kvb_manager_get_disk_stats");
            if (disk.reads_in_flight == 0 && disk.writes_queued == 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    kvb_remote_stats_t remote{};
    remote.struct_size = sizeof(remote);
    if (!o.remote.empty()) {
        // Fetches still in flight hold claimed host blocks, queued writes are the last
        // prefixes: let them finish (bounded by the tier's timeouts).
        const auto deadline = Clock::now() + std::chrono::seconds(60);
        for (;;) {
            check(kvb_manager_remote_poll(manager.m, nullptr), "kvb_manager_remote_poll");
            check(kvb_manager_get_remote_stats(manager.m, &remote), "kvb_manager_get_remote_stats");
            if (remote.fetches_in_flight + remote.lookups_in_flight + remote.writes_queued == 0 ||
                Clock::now() > deadline)
                break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    check(kvb_manager_check_invariants(manager.m), "kvb_manager_check_invariants");
    kvb_kv_cache_stats_t stats{};
    check(kvb_manager_get_kv_cache_stats(manager.m, &stats), "kvb_manager_get_kv_cache_stats");
    // Every request finished and was released: every block must be free (cached or not) again,
    // in every window (a model preset may have several, each of the configured blocks).
    if (stats.free_num_blocks != stats.num_primary_blocks ||
        stats.free_secondary_blocks != stats.num_secondary_blocks) {
        throw std::runtime_error("blocks still held after every request finished: " +
                                 std::to_string(stats.free_num_blocks) + " of " +
                                 std::to_string(stats.num_primary_blocks) + " primary and " +
                                 std::to_string(stats.free_secondary_blocks) + " of " +
                                 std::to_string(stats.num_secondary_blocks) + " host blocks free");
    }

    const double wall = std::chrono::duration<double>(Clock::now() - wall_start).count();
    Report report{o, reqs.size(), max_sequence_length, result, stats, events, wall, disk};
    print_summary(report);
    if (!o.remote.empty()) {
        auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
        std::printf(
            "  remote       instance %d/%d: %llu lookups (%llu present), %llu hits placed, "
            "%llu writes (%llu MiB), %llu deduplicated, %llu dropped, %llu refused, "
            "%llu errors; %llu steps waited; fetch p50/p99 %llu/%llu us\n",
            o.instance, o.instances, u(remote.lookups), u(remote.lookup_hits), u(remote.hits),
            u(remote.writes), u(remote.write_bytes >> 20),
            u(remote.write_dedup_remote + remote.write_skips), u(remote.write_drops),
            u(remote.verify_failures),
            u(remote.errors_unavailable + remote.errors_timeout + remote.errors_auth +
              remote.errors_other),
            u(result.c.remote_wait_steps), u(remote.fetch_p50_us), u(remote.fetch_p99_us));
    }
    if (!o.json.empty()) {
        write_json(report, o.json);
        std::printf("  json         %s\n", o.json.c_str());
    }
    if (!o.svg.empty()) {
        std::string title = "kvblock replay (" + report.loop_name() + " loop, " +
                            std::to_string(reqs.size()) + " requests, " +
                            std::to_string(o.primary_blocks) + " primary blocks)";
        if (!replay::write_svg(o.svg, title, replay::downsample(result.series, 2000),
                               o.primary_blocks)) {
            throw std::runtime_error("cannot write '" + o.svg + "'");
        }
        std::printf("  plot         %s\n", o.svg.c_str());
    }
    return 0;
}

}  // namespace
}  // namespace replay

int main(int argc, char** argv) {
    try {
        replay::Options o = replay::parse_options(argc, argv);
        if (o.self_test) {
            std::printf("token synthesis self-test:\n");
            bool ok = replay::token_self_test(stdout);
            std::printf("%s\n", ok ? "ok" : "FAILED");
            return ok ? 0 : 1;
        }
        return replay::run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "replay: %s\n", e.what());
        return 1;
    }
}
