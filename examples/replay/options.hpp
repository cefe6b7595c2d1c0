// replay/options.hpp: Command-line options of the replay and their defaults.
#ifndef KVBLOCK_REPLAY_OPTIONS_HPP
#define KVBLOCK_REPLAY_OPTIONS_HPP

#include <filesystem>
#include <system_error>

#include "common.hpp"
#include "models.hpp"

namespace replay {

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
    int copy_backend = -1;          // -1: host when block_bytes > 0, else none
    std::string model = "uniform";  // a preset of models.hpp
    int events = -1;                // -1: the loop's default (engine on, peer off)
    std::string json;
    std::string svg;
    bool svg_set = false;
    bool quiet = false;
    bool self_test = false;
    std::string disk_dir;                   // empty: no disk tier
    int64_t disk_bytes = int64_t{1} << 30;  // per window
    int64_t disk_read_latency_us = 0;       // injected (benchmarks)
    int32_t disk_write_queue = 4096;        // writes queued before stores are dropped
    int64_t forward_us = 0;                 // engine: simulated forward pass per step
    replay::PublishOptions publish;
    // The shared remote tier (engine loop, real pools): comma-separated redis:// URLs.
    std::string remote;
    bool remote_cluster = false;
    std::string remote_password;
    std::string remote_model = "replay";
    // This process replays requests i with i % instances == instance (a fleet of instances
    // splitting the trace, sharing prefixes through --remote).
    int32_t instance = 0;
    int32_t instances = 1;
};

inline constexpr int32_t kEngineDefaultPrimary = 30000;
inline constexpr int32_t kEngineDefaultSecondary = 30000;
inline constexpr int32_t kPeerDefaultPrimary = 30000;
inline constexpr int32_t kEventEntries = 1 << 20;

inline void usage(std::FILE* out) {
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
        "  --model NAME            the pools of a model's layers: uniform (default: one pool of\n"
        "                          --block-bytes), llama-gqa, deepseek-v3-mla (latent + indexer,\n"
        "                          K only), gemma-vswa (1024-token sliding + global windows, each\n"
        "                          of --primary-blocks), hybrid-mamba (attention + recurrent\n"
        "                          state snapshots); real pools of a model with --copy-backend\n"
        "  --realtime              engine: requests arrive at their timestamps\n"
        "  --block-bytes N         bytes of KV per block in real pools; 0 = bookkeeping only\n"
        "                          (default 0); must be a multiple of 2 x tokens per block\n"
        "  --copy-backend B        none|host|cuda: where the pools live (default: host with\n"
        "                          --block-bytes, else none); cuda puts primary pools in GPU\n"
        "                          memory and the host tier in pinned memory, copies on the GPU\n"
        "  --events / --no-events  KV cache events (default: on in engine, off in peer)\n"
        "  --disk-dir DIR          engine: a disk tier below the host tier, kept in DIR (a second\n"
        "                          run on the same DIR starts warm); prefetches waiting requests\n"
        "                          and admits them when their disk blocks are in\n"
        "  --disk-bytes N          bytes of the disk tier's file (default 1 GiB)\n"
        "  --disk-read-latency-us N  inject N us into every disk read (benchmarks)\n"
        "  --disk-write-queue N    writes queued before stores to disk are dropped (4096)\n"
        "  --forward-us N          engine: sleep N us per step where the forward pass would run\n"
        "                          (background work such as disk I/O then has time; default 0)\n"
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
        "                          and answering replays until standard input closes\n"
        "  --remote URLS           shared remote tier on Redis/Valkey: comma-separated\n"
        "                          redis://host:port URLs (engine loop, needs --block-bytes)\n"
        "  --remote-cluster        the URLs are seed nodes of a Redis Cluster\n"
        "  --remote-password PW    the server's password\n"
        "  --remote-model ID       model identity in the store's keys (default replay)\n"
        "  --instance I/N          replay only requests i with i %% N == I (default 0/1)\n",
        KVBLOCK_REPLAY_DEFAULT_TRACE, kEngineDefaultPrimary, kEngineDefaultSecondary);
}

inline int64_t parse_int(const std::string& flag, const std::string& text, int64_t min,
                         int64_t max) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
        throw std::runtime_error(flag + " expects an integer in [" + std::to_string(min) + ", " +
                                 std::to_string(max) + "], got '" + text + "'");
    }
    return v;
}

inline Options parse_options(int argc, char** argv) {
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
        else if (arg == "--model") {
            o.model = next();
            model_preset(o.model);  // an unknown name fails here
        } else if (arg == "--no-partial-reuse")
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
        else if (arg == "--disk-dir")
            o.disk_dir = next();
        else if (arg == "--disk-bytes")
            o.disk_bytes = parse_int(arg, next(), 1, INT64_MAX);
        else if (arg == "--forward-us")
            o.forward_us = parse_int(arg, next(), 0, 10'000'000);
        else if (arg == "--disk-write-queue")
            o.disk_write_queue = static_cast<int32_t>(parse_int(arg, next(), 1, 1 << 20));
        else if (arg == "--disk-read-latency-us")
            o.disk_read_latency_us = parse_int(arg, next(), 0, 10'000'000);
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
        else if (arg == "--remote")
            o.remote = next();
        else if (arg == "--remote-cluster")
            o.remote_cluster = true;
        else if (arg == "--remote-password")
            o.remote_password = next();
        else if (arg == "--remote-model")
            o.remote_model = next();
        else if (arg == "--instance") {
            std::string v = next();
            size_t slash = v.find('/');
            if (slash == std::string::npos)
                throw std::runtime_error("--instance expects I/N, got '" + v + "'");
            o.instances = static_cast<int32_t>(parse_int(arg, v.substr(slash + 1), 1, 1 << 16));
            o.instance =
                static_cast<int32_t>(parse_int(arg, v.substr(0, slash), 0, o.instances - 1));
        } else
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
    if (o.model != "uniform" && o.block_bytes > 0)
        throw std::runtime_error("--block-bytes applies to the uniform model only");
    if (o.model == "uniform" && (o.copy_backend == KVB_COPY_BACKEND_NONE) != (o.block_bytes == 0)) {
        throw std::runtime_error(
            "--block-bytes > 0 goes with --copy-backend host or cuda, and only with them");
    }
    if (!o.disk_dir.empty() && o.loop == Loop::Peer)
        throw std::runtime_error("--disk-dir applies to the engine loop only");
    if (!o.disk_dir.empty()) {
        // A command-line tool makes the directory it is told to keep its files in.
        std::error_code ec;
        std::filesystem::create_directories(o.disk_dir, ec);
        if (ec) throw std::runtime_error("--disk-dir " + o.disk_dir + ": " + ec.message());
    }
    if (!o.remote.empty() && (o.loop != Loop::Engine || o.copy_backend != KVB_COPY_BACKEND_HOST)) {
        throw std::runtime_error("--remote needs the engine loop and host pools (--block-bytes)");
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

}  // namespace replay

#endif  // KVBLOCK_REPLAY_OPTIONS_HPP
