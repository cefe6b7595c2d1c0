// abi_overhead: per-call cost of two hot C ABI calls, the baseline of the Python binding's
// benchmark (python/bench/bench_overhead.py runs this program and the same loops in Python).
//
//   build/examples/abi_overhead [repetitions]
//
// admit_8192: kvb_manager_add_sequence of an uncached 8,192-token prompt, 64 sequences per round
//             (timed), then released without storing (untimed), so every round admits uncached.
// add_token_256: kvb_manager_add_token across 256 running sequences, 32 tokens each (8,192 calls)
//             per round (timed); the sequences are re-admitted between rounds (untimed).
// Prints one line per benchmark: name, median ns per call over rounds, rounds.
#include <kvblock.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(kvb_status_t s, const char* what) {
    if (s != KVB_OK) {
        std::fprintf(stderr, "abi_overhead: %s: %s\n", what, kvb_last_error_message());
        std::exit(1);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

kvb_manager_t* make_manager(int32_t blocks) {
    kvb_window_config_t window{8192 + 64, blocks, 0, 1, 1, 1, false};
    kvb_manager_config_t config;
    check(kvb_manager_config_init(&config), "config_init");
    config.windows = &window;
    config.num_windows = 1;
    config.tokens_per_block = 32;
    config.max_sequence_length = 8192 + 64;
    kvb_manager_t* m = nullptr;
    check(kvb_manager_create(&config, &m), "create");
    return m;
}

kvb_request_t request(uint64_t id, const std::vector<int32_t>& tokens) {
    kvb_request_t r;
    check(kvb_request_init(&r), "request_init");
    r.request_id = id;
    r.tokens = tokens.data();
    r.num_tokens = tokens.size();
    r.input_length = static_cast<int32_t>(tokens.size());
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 50;
    constexpr int kSeqs = 64, kRunning = 256, kSteps = 32;

    kvb_manager_t* m = make_manager(kSeqs * 8192 / 32 + 64);
    std::vector<int32_t> prompt(8192);
    std::iota(prompt.begin(), prompt.end(), 1);
    std::vector<double> per_call;
    for (int round = 0; round < rounds + 2; ++round) {  // the first two warm up
        auto t0 = Clock::now();
        for (uint64_t id = 0; id < kSeqs; ++id) {
            const kvb_request_t r = request(id, prompt);
            check(kvb_manager_add_sequence(m, &r, nullptr), "add_sequence");
        }
        auto ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        if (round >= 2) per_call.push_back(ns / kSeqs);
        for (uint64_t id = 0; id < kSeqs; ++id)
            check(kvb_manager_remove_sequence(m, id, false), "remove_sequence");
    }
    std::printf("admit_8192 %.1f %d\n", median(per_call), rounds);
    check(kvb_manager_destroy(m), "destroy");

    m = make_manager(kRunning * 4);
    std::vector<int32_t> short_prompt(31);
    std::iota(short_prompt.begin(), short_prompt.end(), 1);
    per_call.clear();
    for (int round = 0; round < rounds + 2; ++round) {
        for (uint64_t id = 0; id < kRunning; ++id) {
            const kvb_request_t r = request(id, short_prompt);
            check(kvb_manager_add_sequence(m, &r, nullptr), "add_sequence");
        }
        auto t0 = Clock::now();
        for (int step = 0; step < kSteps; ++step) {
            for (uint64_t id = 0; id < kRunning; ++id)
                check(kvb_manager_add_token(m, id, step), "add_token");
        }
        auto ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        if (round >= 2) per_call.push_back(ns / (kSteps * kRunning));
        for (uint64_t id = 0; id < kRunning; ++id)
            check(kvb_manager_remove_sequence(m, id, false), "remove_sequence");
    }
    std::printf("add_token_256 %.1f %d\n", median(per_call), rounds);
    check(kvb_manager_destroy(m), "destroy");
    return 0;
}
