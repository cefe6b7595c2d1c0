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
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "kvblock.h"
#include "replay/report.hpp"
#include "replay/publish.hpp"
#include "replay/trace.hpp"

#ifndef KVBLOCK_REPLAY_DEFAULT_TRACE
#define KVBLOCK_REPLAY_DEFAULT_TRACE "data/mooncake_synthetic_trace.jsonl"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using replay::TraceRequest;

// ---- options ------------------------------------------------------------------------------------

enum class Loop { Engine, Peer };
enum class Scheduler { Preempt, MaxUtilization };

struct Options {
    std::string trace = KVBLOCK_REPLAY_DEFAULT_TRACE;
    size_t limit = 0;  // 0 = every request
    int32_t tokens_per_block = 32;
    int32_t primary_blocks = -1;    // -1: the loop's default
    int32_t secondary_blocks = -1;  // -1: the loop's default
    int32_t max_running = 64;
    int32_t max_output = 128;  // 0 = no cap
    int32_t token_budget = 8192;
    Loop loop = Loop::Engine;
    Scheduler scheduler = Scheduler::Preempt;
    int32_t stall_passes = 1000;
    bool partial_reuse = true;
    bool realtime = false;
    int64_t block_bytes = 0;
    int copy_backend = -1;  // -1: host when block_bytes > 0, else none
    int events = -1;        // -1: the loop's default (engine on, peer off)
    std::string json;
    std::string svg;
    bool svg_set = false;
    bool quiet = false;
    bool self_test = false;
    replay::PublishOptions publish;
};

constexpr int32_t kEngineDefaultPrimary = 30000;
constexpr int32_t kEngineDefaultSecondary = 30000;
constexpr int32_t kPeerDefaultPrimary = 30000;
constexpr int32_t kEventEntries = 1 << 20;

void usage(std::FILE* out) {
    std::fprintf(
        out,
        "usage: replay [options]\n"
        "  --trace PATH            Mooncake-format JSONL trace (default: %s)\n"
        "  --limit N               replay only the first N requests\n"
        "  --loop engine|peer      engine loop (default) or the peer workload loop\n"
        "  --tokens-per-block N    tokens per KV block (default 32)\n"
        "  --primary-blocks N      primary (GPU) blocks (default %d)\n"
        "  --secondary-blocks N    host-tier blocks (default: engine %d, peer 0)\n"
        "  --max-running N         most requests holding KV at once (default 64)\n"
        "  --max-output N          cap on output tokens per request, 0 = none (default 128)\n"
        "  --token-budget N        engine: tokens per step, decodes first (default 8192)\n"
        "  --scheduler S           engine: preempt (release and recompute, default) or\n"
        "                          max-utilization (suspend and resume)\n"
        "  --stall-passes N        max-utilization: stalled passes before giving up (1000)\n"
        "  --no-partial-reuse      reuse full blocks (and exact partial matches) only\n"
        "  --realtime              engine: requests arrive at their timestamps\n"
        "  --block-bytes N         bytes of KV per block in real pools; 0 = bookkeeping only\n"
        "                          (default 0); must be a multiple of 2 x tokens per block\n"
        "  --copy-backend B        none|host|cuda: where the pools live (default: host with\n"
        "                          --block-bytes, else none); cuda puts primary pools in GPU\n"
        "                          memory and the host tier in pinned memory, copies on the GPU\n"
        "  --events / --no-events  KV cache events (default: on in engine, off in peer)\n"
        "  --json PATH             write every figure and a time series as JSON\n"
        "  --svg PATH              plot (default: JSON path with .svg, else replay.svg)\n"
        "  --no-svg                no plot\n"
        "  --quiet                 no progress bar\n"
        "  --self-test             check the token synthesis against its reference values\n"
        "  --publish ENDPOINT      publish KV events over ZeroMQ (vLLM/Dynamo format), e.g.\n"
        "                          tcp://*:5557; implies --events\n"
        "  --publish-replay EP     ROUTER socket answering routers' gap replay requests\n"
        "  --publish-wait-subscribers N  wait for N subscriptions before the first step\n"
        "  --publish-late-subscribers N  --publish-check waits for N subscriptions in total first\n"
        "  --publish-check PATH    after the run: one probe prompt, then JSON lines of sampled\n"
        "                          prompts and kvblock's reusable blocks (router check)\n"
        "  --publish-hold          after the run, print 'publish-hold: ready' and keep publishing\n"
        "                          and answering replays until standard input closes\n",
        KVBLOCK_REPLAY_DEFAULT_TRACE, kEngineDefaultPrimary, kEngineDefaultSecondary);
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
        throw std::runtime_error(flag + " expects an integer in [" + std::to_string(min) + ", " +
                                 std::to_string(max) + "], got '" + text + "'");
    }
    return v;
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        std::string value;
        bool has_inline = false;
        if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
            value = arg.substr(arg.find('=') + 1);
            arg = arg.substr(0, arg.find('='));
            has_inline = true;
        }
        auto next = [&]() -> std::string {
            if (has_inline) return value;
            if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
            return argv[++i];
        };
        const int64_t i32 = INT32_MAX;
        if (arg == "--help" || arg == "-h") {
            usage(stdout);
            std::exit(0);
        } else if (arg == "--trace")
            o.trace = next();
        else if (arg == "--limit")
            o.limit = static_cast<size_t>(parse_int(arg, next(), 1, INT64_MAX));
        else if (arg == "--tokens-per-block")
            o.tokens_per_block = static_cast<int32_t>(parse_int(arg, next(), 1, 1 << 20));
        else if (arg == "--primary-blocks")
            o.primary_blocks = static_cast<int32_t>(parse_int(arg, next(), 1, i32));
        else if (arg == "--secondary-blocks")
            o.secondary_blocks = static_cast<int32_t>(parse_int(arg, next(), 0, i32));
        else if (arg == "--max-running")
            o.max_running = static_cast<int32_t>(parse_int(arg, next(), 1, i32));
        else if (arg == "--max-output")
            o.max_output = static_cast<int32_t>(parse_int(arg, next(), 0, i32));
        else if (arg == "--token-budget")
            o.token_budget = static_cast<int32_t>(parse_int(arg, next(), 1, i32));
        else if (arg == "--loop") {
            std::string v = next();
            if (v == "engine")
                o.loop = Loop::Engine;
            else if (v == "peer")
                o.loop = Loop::Peer;
            else
                throw std::runtime_error("--loop expects engine or peer, got '" + v + "'");
        } else if (arg == "--scheduler") {
            std::string v = next();
            if (v == "preempt")
                o.scheduler = Scheduler::Preempt;
            else if (v == "max-utilization")
                o.scheduler = Scheduler::MaxUtilization;
            else
                throw std::runtime_error("--scheduler expects preempt or max-utilization, got '" +
                                         v + "'");
        } else if (arg == "--stall-passes")
            o.stall_passes = static_cast<int32_t>(parse_int(arg, next(), 1, INT32_MAX));
        else if (arg == "--no-partial-reuse")
            o.partial_reuse = false;
        else if (arg == "--realtime")
            o.realtime = true;
        else if (arg == "--block-bytes")
            o.block_bytes = parse_int(arg, next(), 0, INT64_MAX);
        else if (arg == "--copy-backend") {
            std::string v = next();
            if (v == "none")
                o.copy_backend = KVB_COPY_BACKEND_NONE;
            else if (v == "host")
                o.copy_backend = KVB_COPY_BACKEND_HOST;
            else if (v == "cuda")
                o.copy_backend = KVB_COPY_BACKEND_CUDA;
            else
                throw std::runtime_error("--copy-backend expects none, host or cuda, got '" + v +
                                         "'");
        } else if (arg == "--events")
            o.events = 1;
        else if (arg == "--no-events")
            o.events = 0;
        else if (arg == "--json")
            o.json = next();
        else if (arg == "--svg") {
            o.svg = next();
            o.svg_set = true;
        } else if (arg == "--no-svg") {
            o.svg.clear();
            o.svg_set = true;
        } else if (arg == "--quiet")
            o.quiet = true;
        else if (arg == "--self-test")
            o.self_test = true;
        else if (arg == "--publish")
            o.publish.endpoint = next();
        else if (arg == "--publish-replay")
            o.publish.replay_endpoint = next();
        else if (arg == "--publish-wait-subscribers")
            o.publish.wait_subscribers =
                static_cast<uint64_t>(parse_int(arg, next(), 0, INT64_MAX));
        else if (arg == "--publish-late-subscribers")
            o.publish.late_subscribers =
                static_cast<uint64_t>(parse_int(arg, next(), 0, INT64_MAX));
        else if (arg == "--publish-check")
            o.publish.check = next();
        else if (arg == "--publish-hold")
            o.publish.hold = true;
        else
            throw std::runtime_error("unknown option '" + arg + "' (see --help)");
    }
    if (o.primary_blocks < 0)
        o.primary_blocks = o.loop == Loop::Engine ? kEngineDefaultPrimary : kPeerDefaultPrimary;
    if (o.secondary_blocks < 0)
        o.secondary_blocks = o.loop == Loop::Engine ? kEngineDefaultSecondary : 0;
    if (!o.publish.endpoint.empty() && o.events < 0) o.events = 1;
    if (o.events < 0) o.events = o.loop == Loop::Engine ? 1 : 0;
    if (!o.publish.endpoint.empty() && !o.events)
        throw std::runtime_error("--publish needs events (drop --no-events)");
    if (o.publish.endpoint.empty() &&
        (!o.publish.replay_endpoint.empty() || o.publish.wait_subscribers ||
         o.publish.late_subscribers || !o.publish.check.empty() || o.publish.hold)) {
        throw std::runtime_error("the --publish-* options need --publish");
    }
    if (o.block_bytes % (2 * static_cast<int64_t>(o.tokens_per_block)) != 0) {
        throw std::runtime_error("--block-bytes must be a multiple of 2 x tokens per block (" +
                                 std::to_string(2 * o.tokens_per_block) + ")");
    }
    if (o.block_bytes / (2 * o.tokens_per_block) > INT32_MAX)
        throw std::runtime_error("--block-bytes is too large");
    if (o.copy_backend < 0)
        o.copy_backend = o.block_bytes > 0 ? KVB_COPY_BACKEND_HOST : KVB_COPY_BACKEND_NONE;
    if ((o.copy_backend == KVB_COPY_BACKEND_NONE) != (o.block_bytes == 0)) {
        throw std::runtime_error(
            "--block-bytes > 0 goes with --copy-backend host or cuda, and only with them");
    }
    if (o.realtime && o.loop == Loop::Peer)
        throw std::runtime_error("--realtime applies to the engine loop only");
    if (o.scheduler == Scheduler::MaxUtilization && o.loop == Loop::Peer)
        throw std::runtime_error("--scheduler applies to the engine loop only");
    if (!o.svg_set) {
        if (o.json.empty()) {
            o.svg = "replay.svg";
        } else {
            size_t dot = o.json.rfind('.');
            size_t slash = o.json.find_last_of("/\\");
            bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
            o.svg = (has_ext ? o.json.substr(0, dot) : o.json) + ".svg";
        }
    }
    return o;
}

// ---- timed manager calls -----------------------------------------------------------------------

/// What a timed manager call is for (the kinds of call the replay workload times, plus the
/// per-step hooks).
enum Kind {
    kLookup,
    kAdmitAlloc,
    kAdmitOther,
    kDecodeAlloc,
    kFree,
    kPreempt,
    kRefresh,
    kFlush,
    kNumKinds
};
const char* const kKindNames[kNumKinds] = {"lookup", "admit_alloc", "admit_other", "decode_alloc",
                                           "free",   "preempt",     "refresh",     "flush"};

struct Timings {
    uint64_t ns[kNumKinds] = {};
    uint64_t calls[kNumKinds] = {};
    uint64_t step_ns = 0;        // timed calls of the current step
    uint64_t step_admit_ns = 0;  // admission calls (admit_alloc + admit_other) of the current step
};

/// The clock that times manager calls: the CPU's time-stamp counter on x86-64 (a few ns per
/// read, the floor's clock), else steady_clock in ns. Ticks become ns by the rate measured
/// against steady_clock over the whole loop (TickCalibration).
inline uint64_t ticks() {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
#endif
}

/// Measures ns per tick between construction and `ns_per_tick()`.
struct TickCalibration {
    Clock::time_point wall0 = Clock::now();
    uint64_t tick0 = ticks();
    double ns_per_tick() const {
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - wall0).count();
        const uint64_t dt = ticks() - tick0;
        return dt > 0 ? ns / static_cast<double>(dt) : 1.0;
    }
};

/// Runs one manager call between a pair of tick reads and books it under `kind` (in ticks until
/// the loop converts its figures to ns, RunResult::to_ns).
template <typename Call>
kvb_status_t timed(Timings& t, Kind kind, Call&& call) {
    const uint64_t t0 = ticks();
    kvb_status_t status = call();
    const uint64_t ns = ticks() - t0;
    t.ns[kind] += ns;
    t.calls[kind] += 1;
    t.step_ns += ns;
    if (kind == kAdmitAlloc || kind == kAdmitOther) t.step_admit_ns += ns;
    return status;
}

void check(kvb_status_t status, const char* what) {
    if (status != KVB_OK) {
        throw std::runtime_error(std::string(what) + " failed: " + kvb_status_string(status) +
                                 ": " + kvb_last_error_message());
    }
}

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
void create_manager(ManagerHandle& h, const Options& o, int32_t max_sequence_length) {
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
    check(kvb_manager_create(&config, &h.m), "kvb_manager_create");
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

// ---- requests and counters ---------------------------------------------------------------------

/// A trace request during the replay.
struct Req {
    uint64_t r = 0;  // trace index, also the manager's request id
    const TraceRequest* trace = nullptr;
    int32_t T = 1;                // tokens to generate
    std::vector<int32_t> tokens;  // prompt + generated so far (synthesised at first admission)
    int32_t generated = 0;
    int32_t input_length = 0;  // tokens given to the current admission
    int32_t context_pos = 0;   // engine: prompt tokens computed in the current admission
    bool in_prefill = false;   // engine: admitted, prompt not complete
    bool admitted_once = false;
    bool done = false;
    uint64_t admission_order = 0;  // engine: when it was last admitted (running order)
};

struct Counters {
    uint64_t steps = 0, admissions = 0, admission_failures = 0, preemptions = 0;
    uint64_t hit_blocks = 0, new_prompt_blocks = 0, admitted_blocks = 0;
    uint64_t decode_slots = 0, decode_new_blocks = 0, generated_tokens = 0, finished = 0;
    uint64_t prompt_tokens = 0, reused_prompt_tokens = 0;          // first admissions
    uint64_t prompt_tokens_all = 0, reused_prompt_tokens_all = 0;  // every admission
    uint64_t prefill_tokens = 0, prefill_chunks = 0;               // engine: computed prompt tokens
    uint64_t suspensions = 0, resumes = 0;                         // engine, max-utilization

    double hit_rate() const {
        return prompt_tokens
                   ? static_cast<double>(reused_prompt_tokens) / static_cast<double>(prompt_tokens)
                   : 0;
    }
};

/// Everything a loop produces.
struct RunResult {
    Counters c;
    Timings t;
    std::vector<uint64_t> step_ns;  // manager time of each step
    /// Admission time per admitted prompt block, for each step that admitted something.
    std::vector<uint64_t> block_ns;
    uint64_t blocks_before_step = 0;
    std::vector<replay::SeriesPoint> series;
    double loop_seconds = 0;

    /// Converts the timed figures, booked in ticks, to ns.
    void to_ns(double ns_per_tick) {
        auto conv = [ns_per_tick](uint64_t& v) {
            v = static_cast<uint64_t>(static_cast<double>(v) * ns_per_tick + 0.5);
        };
        for (uint64_t& v : t.ns) conv(v);
        for (uint64_t& v : step_ns) conv(v);
        for (uint64_t& v : block_ns) conv(v);
    }
};

kvb_request_t c_request(const Req& q) {
    kvb_request_t r;
    check(kvb_request_init(&r), "kvb_request_init");
    r.request_id = q.r;
    r.input_length = static_cast<int32_t>(q.tokens.size());
    r.tokens = q.tokens.data();
    r.num_tokens = q.tokens.size();
    return r;
}

/// Books an admission of `q` (its whole current sequence) with the manager's result.
void record_admission(Counters& c, Req& q, const kvb_admission_t& a, int32_t tpb) {
    const uint64_t n = q.tokens.size();
    q.input_length = static_cast<int32_t>(n);
    c.admissions += 1;
    c.hit_blocks += a.stats.reused_blocks;
    c.new_prompt_blocks += a.stats.missed_blocks;
    c.admitted_blocks += (n + static_cast<uint64_t>(tpb) - 1) / static_cast<uint64_t>(tpb);
    c.prompt_tokens_all += n;
    c.reused_prompt_tokens_all += static_cast<uint64_t>(a.prepopulated_prompt_len);
    if (!q.admitted_once) {
        q.admitted_once = true;
        c.prompt_tokens += n;
        c.reused_prompt_tokens += static_cast<uint64_t>(a.prepopulated_prompt_len);
    }
}

/// Appends the next generated token of `q`; true when the request has all its tokens.
bool sample(Counters& c, Req& q) {
    q.tokens.push_back(replay::output_token(q.r, q.tokens.size()));
    q.generated += 1;
    c.generated_tokens += 1;
    return q.generated >= q.T;
}

/// Samples one token for each of `sampled`; a request with all its tokens is released with its
/// blocks stored for reuse and leaves `running`.
void sample_and_release(RunResult& out, kvb_manager_t* m, const std::vector<Req*>& sampled,
                        std::vector<Req*>& running) {
    for (Req* q : sampled) {
        if (!sample(out.c, *q)) continue;
        check(timed(out.t, kFree, [&] { return kvb_manager_remove_sequence(m, q->r, true); }),
              "kvb_manager_remove_sequence");
        q->done = true;
        q->tokens = std::vector<int32_t>();
        out.c.finished += 1;
    }
    running.erase(std::remove_if(running.begin(), running.end(), [](Req* q) { return q->done; }),
                  running.end());
}

void finish_step(RunResult& out, kvb_manager_t* m, replay::Progress& progress) {
    out.step_ns.push_back(out.t.step_ns);
    out.t.step_ns = 0;
    const uint64_t blocks = out.c.admitted_blocks - out.blocks_before_step;
    if (blocks > 0) out.block_ns.push_back(out.t.step_admit_ns / blocks);
    out.blocks_before_step = out.c.admitted_blocks;
    out.t.step_admit_ns = 0;
    int64_t free_blocks = 0;
    check(kvb_manager_get_num_free_blocks(m, &free_blocks), "kvb_manager_get_num_free_blocks");
    out.series.push_back({out.c.steps, out.c.hit_rate(), free_blocks});
    progress.update(out.c.finished, out.c.steps, out.c.hit_rate());
}

// ---- engine loop ----------------------------------------------------------------------------------

class EngineLoop {
  public:
    EngineLoop(const Options& o, kvb_manager_t* m, std::vector<Req>& reqs,
               replay::Progress& progress)
        : o_(o), m_(m), reqs_(reqs), progress_(progress) {}

    RunResult run() {
        auto start = Clock::now();
        TickCalibration calibration;
        size_t next_arrival = 0;
        const double t0_ms = reqs_.front().trace->timestamp_ms;
        if (!o_.realtime) {
            for (Req& q : reqs_) waiting_.push_back(&q);
            next_arrival = reqs_.size();
        }
        while (out_.c.finished < reqs_.size()) {
            if (o_.realtime) {
                double now_ms =
                    std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                while (next_arrival < reqs_.size() &&
                       reqs_[next_arrival].trace->timestamp_ms - t0_ms <= now_ms) {
                    waiting_.push_back(&reqs_[next_arrival++]);
                }
                if (waiting_.empty() && running_.empty()) {  // idle until the next arrival
                    double wait = reqs_[next_arrival].trace->timestamp_ms - t0_ms - now_ms;
                    std::this_thread::sleep_for(
                        std::chrono::duration<double, std::milli>(std::min(wait, 100.0)));
                    continue;
                }
            }
            step();
        }
        out_.loop_seconds = std::chrono::duration<double>(Clock::now() - start).count();
        out_.to_ns(calibration.ns_per_tick());
        return std::move(out_);
    }

  private:
    void step() {
        Counters& c = out_.c;
        c.steps += 1;
        int64_t budget = o_.token_budget;
        bool preempted = false;
        std::vector<Req*> decoding;                    // got a KV slot for their last token
        std::vector<std::pair<Req*, int32_t>> chunks;  // prefill chunks of this step
        const bool max_utilization = o_.scheduler == Scheduler::MaxUtilization;

        // 0. (max-utilization) Resume suspended requests, oldest admission first.
        if (max_utilization) resume_suspended();
        size_t decode_attempts = 0;
        // 1. Decode: one KV slot per generating request, preempting (or suspending) from the back
        //    when full.
        for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
            Req* q = running_[i];
            if (q->in_prefill) continue;
            c.decode_slots += 1;
            decode_attempts += 1;
            const bool got =
                max_utilization ? reserve_decode_slot(*q, preempted) : decode_slot(*q, preempted);
            if (!got) break;  // q itself was preempted or suspended
            decoding.push_back(q);
            budget -= 1;
        }
        // 2. Continuing prefills, in admission order.
        for (Req* q : running_) {
            if (q->in_prefill && budget > 0) budget -= plan_chunk(*q, budget, chunks);
        }
        // 3. Admission of new requests, one batch, FCFS (suspended requests come first).
        if (!preempted && suspended_.empty() && budget > 0) admit(budget, chunks);
        // 4. Per-iteration hook, before the forward pass.
        check(timed(out_.t, kRefresh, [&] { return kvb_manager_refresh_blocks(m_); }),
              "kvb_manager_refresh_blocks");
        // (The forward pass would run here.)
        // 5. Store the blocks each chunk completed; a completed prompt samples its first token.
        std::vector<Req*> sampling = decoding;
        for (auto& [q, n] : chunks) {
            q->context_pos += n;
            c.prefill_tokens += static_cast<uint64_t>(n);
            c.prefill_chunks += 1;
            check(timed(out_.t, kAdmitOther,
                        [&] { return kvb_manager_store_context_blocks(m_, q->r, q->context_pos); }),
                  "kvb_manager_store_context_blocks");
            if (q->context_pos == q->input_length) {
                q->in_prefill = false;
                sampling.push_back(q);
            }
        }
        // 6. Sample; release finished requests, storing their blocks for reuse.
        sample_and_release(out_, m_, sampling, running_);
        // 7. End of the iteration's events (the drainer thread picks them up).
        check(timed(out_.t, kFlush, [&] { return kvb_manager_flush_iteration_events(m_); }),
              "kvb_manager_flush_iteration_events");
        if (max_utilization) {
            // Requests that wanted to generate: those that tried for a slot, and the suspended.
            const size_t generation = decode_attempts + suspended_.size();
            check(timed(out_.t, kRefresh,
                        [&] {
                            return kvb_manager_end_scheduling_pass(m_, generation,
                                                                   decoding.size() + chunks.size());
                        }),
                  "kvb_manager_end_scheduling_pass");
        }
        finish_step(out_, m_, progress_);
    }

    /// max-utilization: reserves q's decode slot with allocate_generation, suspending the most
    /// recently admitted running request while it cannot be had, then adds the token (which
    /// cannot run out of blocks now). False when q itself was suspended.
    bool reserve_decode_slot(Req& q, bool& suspended) {
        while (true) {
            bool allocated = false;
            check(timed(out_.t, kDecodeAlloc,
                        [&] { return kvb_manager_allocate_generation(m_, q.r, 0, &allocated); }),
                  "kvb_manager_allocate_generation");
            if (allocated) break;
            Req* victim = running_.back();
            running_.pop_back();
            suspend(*victim);
            suspended = true;
            if (victim == &q) return false;
        }
        const int32_t token = q.tokens.back();
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_add_token(m_, q.r, token); }),
              "kvb_manager_add_token");
        if ((q.tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
            out_.c.decode_new_blocks += 1;
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_store_new_block(m_, q.r); }),
              "kvb_manager_store_new_block");
        return true;
    }

    /// Suspends a running request: it keeps its blocks (they may move to the host tier) and its
    /// progress, and waits in admission order to be resumed.
    void suspend(Req& v) {
        check(timed(out_.t, kPreempt, [&] { return kvb_manager_suspend(m_, v.r); }),
              "kvb_manager_suspend");
        auto at = std::upper_bound(
            suspended_.begin(), suspended_.end(), &v,
            [](const Req* a, const Req* b) { return a->admission_order < b->admission_order; });
        suspended_.insert(at, &v);
        out_.c.suspensions += 1;
    }

    /// Resumes suspended requests, oldest admission first, while a running slot is free and the
    /// manager takes them back (it refuses above its utilization threshold or without room).
    void resume_suspended() {
        while (!suspended_.empty() && running_.size() < static_cast<size_t>(o_.max_running)) {
            Req* q = suspended_.front();
            bool resumed = false;
            check(timed(out_.t, kPreempt, [&] { return kvb_manager_resume(m_, q->r, &resumed); }),
                  "kvb_manager_resume");
            if (!resumed) return;
            suspended_.erase(suspended_.begin());
            auto at = std::upper_bound(
                running_.begin(), running_.end(), q,
                [](const Req* a, const Req* b) { return a->admission_order < b->admission_order; });
            running_.insert(at, q);
            out_.c.resumes += 1;
        }
    }

    /// add_token for q's last token (+ store_new_block). On OUT_OF_BLOCKS preempts the last
    /// running request and retries; false when q itself was preempted.
    bool decode_slot(Req& q, bool& preempted) {
        const int32_t token = q.tokens.back();
        while (true) {
            kvb_status_t s =
                timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_add_token(m_, q.r, token); });
            if (s == KVB_OK) break;
            if (s != KVB_STATUS_OUT_OF_BLOCKS) check(s, "kvb_manager_add_token");
            Req* victim = running_.back();
            running_.pop_back();
            preempt(*victim);
            preempted = true;
            if (victim == &q) return false;
        }
        // The manager now holds KV slots for every token of q; a new block opened when the
        // last one landed at a block boundary.
        if ((q.tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
            out_.c.decode_new_blocks += 1;
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_store_new_block(m_, q.r); }),
              "kvb_manager_store_new_block");
        return true;
    }

    /// Releases a running request and puts it back at the head of the waiting queue. Its KV is
    /// stored for reuse only when its prompt was complete (all tokens but the last computed).
    void preempt(Req& v) {
        const bool store = !v.in_prefill;
        check(timed(out_.t, kPreempt, [&] { return kvb_manager_remove_sequence(m_, v.r, store); }),
              "kvb_manager_remove_sequence (preempt)");
        v.in_prefill = false;
        v.context_pos = 0;
        out_.c.preemptions += 1;
        waiting_.push_front(&v);
    }

    int64_t plan_chunk(Req& q, int64_t budget, std::vector<std::pair<Req*, int32_t>>& chunks) {
        int32_t n = static_cast<int32_t>(std::min<int64_t>(budget, q.input_length - q.context_pos));
        if (n > 0) chunks.emplace_back(&q, n);
        return n;
    }

    void admit(int64_t& budget, std::vector<std::pair<Req*, int32_t>>& chunks) {
        // Candidates: the head of the queue while a running slot is free and their full prompts
        // have not yet reserved the budget (the first candidate always has a chunk).
        std::vector<kvb_request_t> batch;
        int64_t reserved = 0;
        for (size_t k = 0;
             k < waiting_.size() && running_.size() + k < static_cast<size_t>(o_.max_running) &&
             reserved < budget;
             ++k) {
            Req& q = *waiting_[k];
            if (q.tokens.empty()) q.tokens = replay::synthesize_prompt(*q.trace);
            reserved += static_cast<int64_t>(q.tokens.size());
            batch.push_back(c_request(q));
        }
        if (batch.empty()) return;
        std::vector<kvb_admission_t> results(batch.size());
        size_t admitted = 0;
        check(timed(out_.t, kAdmitAlloc,
                    [&] {
                        return kvb_manager_add_sequence_batch(m_, batch.data(), batch.size(), true,
                                                              results.data(), &admitted);
                    }),
              "kvb_manager_add_sequence_batch");
        if (admitted < batch.size()) out_.c.admission_failures += 1;
        for (size_t i = 0; i < admitted; ++i) {
            Req* q = waiting_.front();
            waiting_.pop_front();
            running_.push_back(q);
            q->admission_order = next_admission_order_++;
            record_admission(out_.c, *q, results[i], o_.tokens_per_block);
            q->in_prefill = true;
            q->context_pos = results[i].prepopulated_prompt_len;
            if (budget > 0) budget -= plan_chunk(*q, budget, chunks);
        }
        if (running_.empty()) {
            const Req& head = *waiting_.front();
            throw std::runtime_error(
                "request " + std::to_string(head.r) + " (" + std::to_string(head.tokens.size()) +
                " tokens) does not fit in " + std::to_string(o_.primary_blocks) +
                " primary blocks even with nothing running: raise --primary-blocks");
        }
    }

    const Options& o_;
    kvb_manager_t* m_;
    std::vector<Req>& reqs_;
    replay::Progress& progress_;
    std::deque<Req*> waiting_;
    std::vector<Req*> running_;    // admission order
    std::vector<Req*> suspended_;  // max-utilization: admission order
    uint64_t next_admission_order_ = 0;
    RunResult out_;
};

// ---- peer loop ------------------------------------------------------------------------------------

class PeerLoop {
  public:
    PeerLoop(const Options& o, kvb_manager_t* m, std::vector<Req>& reqs, replay::Progress& progress)
        : o_(o), m_(m), reqs_(reqs), progress_(progress) {}

    RunResult run() {
        auto start = Clock::now();
        TickCalibration calibration;
        for (Req& q : reqs_) waiting_.push_back(&q);
        Counters& c = out_.c;
        std::vector<Req*> scheduled;
        while (!waiting_.empty() || !running_.empty()) {
            c.steps += 1;
            scheduled.clear();
            bool preempted = false;
            // A. Decode.
            decode(scheduled, preempted);
            // B. Admission, whole requests, head-of-line blocking.
            if (!preempted) {
                while (!waiting_.empty() && running_.size() < static_cast<size_t>(o_.max_running)) {
                    Req* q = waiting_.front();
                    if (!admit(*q)) break;
                    waiting_.pop_front();
                    running_.push_back(q);
                    scheduled.push_back(q);
                }
            }
            // C. Sample; release finished requests.
            sample_and_release(out_, m_, scheduled, running_);
            if (o_.events) {
                check(timed(out_.t, kFlush, [&] { return kvb_manager_flush_iteration_events(m_); }),
                      "kvb_manager_flush_iteration_events");
            }
            finish_step(out_, m_, progress_);
        }
        out_.loop_seconds = std::chrono::duration<double>(Clock::now() - start).count();
        out_.to_ns(calibration.ns_per_tick());
        return std::move(out_);
    }

  private:
    /// Phase A in one kvb_manager_add_token_batch per step (add_token + store_new_block for every
    /// running request, in order). When the request at index i gets no block, the last running
    /// request is preempted and the batch goes on from i; if i itself was preempted, phase A
    /// stops. The same calls in the same order as one add_token + store_new_block per request.
    void decode(std::vector<Req*>& scheduled, bool& preempted) {
        size_t i = 0;
        while (i < running_.size()) {
            ids_.clear();
            tokens_.clear();
            for (size_t k = i; k < running_.size(); ++k) {
                ids_.push_back(running_[k]->r);
                tokens_.push_back(running_[k]->tokens.back());
            }
            size_t done = 0;
            kvb_status_t s = timed(out_.t, kDecodeAlloc, [&] {
                return kvb_manager_add_token_batch(m_, ids_.data(), tokens_.data(), ids_.size(),
                                                   true, nullptr, &done);
            });
            for (size_t k = i; k < i + done; ++k) {
                Req* q = running_[k];
                out_.c.decode_slots += 1;
                if ((q->tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
                    out_.c.decode_new_blocks += 1;
                scheduled.push_back(q);
            }
            i += done;
            if (s == KVB_OK) return;
            if (s != KVB_STATUS_OUT_OF_BLOCKS) check(s, "kvb_manager_add_token_batch");
            Req* q = running_[i];
            Req* victim = running_.back();
            running_.pop_back();
            check(timed(out_.t, kPreempt,
                        [&] { return kvb_manager_remove_sequence(m_, victim->r, true); }),
                  "kvb_manager_remove_sequence (preempt)");
            out_.c.preemptions += 1;
            waiting_.push_front(victim);
            preempted = true;
            if (victim == q) {
                out_.c.decode_slots += 1;  // its slot was requested
                return;
            }
        }
    }

    /// Admits q's whole current sequence and caches its full blocks; false when it does not fit.
    bool admit(Req& q) {
        if (q.tokens.empty()) q.tokens = replay::synthesize_prompt(*q.trace);
        const kvb_request_t r = c_request(q);
        kvb_admission_t a{};
        kvb_status_t s =
            timed(out_.t, kAdmitAlloc, [&] { return kvb_manager_add_sequence(m_, &r, &a); });
        if (s == KVB_STATUS_OUT_OF_BLOCKS) {
            out_.c.admission_failures += 1;
            if (running_.empty()) {
                throw std::runtime_error(
                    "request " + std::to_string(q.r) + " (" + std::to_string(q.tokens.size()) +
                    " tokens) does not fit in " + std::to_string(o_.primary_blocks) +
                    " primary blocks with nothing running: raise --primary-blocks");
            }
            return false;
        }
        check(s, "kvb_manager_add_sequence");
        record_admission(out_.c, q, a, o_.tokens_per_block);
        const int32_t n = r.input_length;
        check(timed(out_.t, kAdmitOther,
                    [&] { return kvb_manager_store_context_blocks(m_, q.r, n); }),
              "kvb_manager_store_context_blocks");
        return true;
    }

    const Options& o_;
    kvb_manager_t* m_;
    std::vector<Req>& reqs_;
    replay::Progress& progress_;
    std::deque<Req*> waiting_;
    std::vector<Req*> running_;
    std::vector<uint64_t> ids_;    // decode batch
    std::vector<int32_t> tokens_;  // decode batch
    RunResult out_;
};

// ---- report ---------------------------------------------------------------------------------------

struct Report {
    const Options& o;
    size_t num_requests;
    int32_t max_sequence_length;
    const RunResult& run;
    kvb_kv_cache_stats_t stats;
    EventCounts events;
    double wall_seconds;

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

void print_summary(const Report& r) {
    const Counters& c = r.run.c;
    auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    std::printf("kvblock replay, %s loop: %s\n", r.loop_name().c_str(), r.o.trace.c_str());
    std::string extras;
    if (r.o.loop == Loop::Engine) extras += ", token budget " + std::to_string(r.o.token_budget);
    if (!r.o.partial_reuse) extras += ", no partial reuse";
    if (r.o.realtime) extras += ", realtime";
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

void write_json(const Report& r, const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write '" + path + "'");
    const Counters& c = r.run.c;
    replay::JsonWriter w(f);
    w.begin_object();
    w.str("tool", "kvblock replay");
    w.begin_object("config")
        .str("trace", r.o.trace)
        .str("loop", r.loop_name())
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

int run(const Options& o) {
    const auto wall_start = Clock::now();
    std::vector<TraceRequest> trace = replay::load_trace(o.trace, o.limit);

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
    check(kvb_manager_check_invariants(manager.m), "kvb_manager_check_invariants");
    kvb_kv_cache_stats_t stats{};
    check(kvb_manager_get_kv_cache_stats(manager.m, &stats), "kvb_manager_get_kv_cache_stats");
    // Every request finished and was released: every block must be free (cached or not) again.
    if (stats.free_num_blocks != static_cast<uint64_t>(o.primary_blocks) ||
        stats.free_secondary_blocks != static_cast<uint64_t>(o.secondary_blocks)) {
        throw std::runtime_error("blocks still held after every request finished: " +
                                 std::to_string(stats.free_num_blocks) + " of " +
                                 std::to_string(o.primary_blocks) + " primary and " +
                                 std::to_string(stats.free_secondary_blocks) + " of " +
                                 std::to_string(o.secondary_blocks) + " host blocks free");
    }

    const double wall = std::chrono::duration<double>(Clock::now() - wall_start).count();
    Report report{o, reqs.size(), max_sequence_length, result, stats, events, wall};
    print_summary(report);
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

int main(int argc, char** argv) {
    try {
        Options o = parse_options(argc, argv);
        if (o.self_test) {
            std::printf("token synthesis self-test:\n");
            bool ok = replay::token_self_test(stdout);
            std::printf("%s\n", ok ? "ok" : "FAILED");
            return ok ? 0 : 1;
        }
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "replay: %s\n", e.what());
        return 1;
    }
}
