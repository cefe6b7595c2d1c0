// basic_reuse: drives kvblock's C ABI through a few requests that share a system prompt and
// prints what the manager did: prefix reuse, partial reuse, host offload and onboard, block
// tables. Uses only kvblock.h (the C API), as an engine integration would.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvblock.h"

namespace {

void check(kvb_status_t status, const char* what) {
    if (status != KVB_OK) {
        std::fprintf(stderr, "%s failed: %s: %s\n", what, kvb_status_string(status),
                     kvb_last_error_message());
        std::exit(1);
    }
}

constexpr int32_t kWindow = 4096;
constexpr int32_t kTokensPerBlock = 16;

std::vector<int32_t> prompt(int32_t system_tokens, int32_t user_seed, int32_t user_tokens) {
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < system_tokens; ++i) tokens.push_back(1000 + i);
    for (int32_t i = 0; i < user_tokens; ++i) tokens.push_back(50000 + user_seed * 997 + i);
    return tokens;
}

kvb_admission_t admit(kvb_manager_t* m, uint64_t id, const std::vector<int32_t>& tokens) {
    kvb_request_t r;
    check(kvb_request_init(&r), "kvb_request_init");
    r.request_id = id;
    r.input_length = static_cast<int32_t>(tokens.size());
    r.tokens = tokens.data();
    r.num_tokens = tokens.size();
    kvb_admission_t out;
    check(kvb_manager_add_sequence(m, &r, &out), "kvb_manager_add_sequence");
    std::printf("request %llu: %zu prompt tokens, %d reused (%llu blocks reused, %llu new)\n",
                static_cast<unsigned long long>(id), tokens.size(), out.prepopulated_prompt_len,
                static_cast<unsigned long long>(out.stats.reused_blocks),
                static_cast<unsigned long long>(out.stats.missed_blocks));
    return out;
}

void generate(kvb_manager_t* m, uint64_t id, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
        check(kvb_manager_add_token(m, id, 7 + i), "kvb_manager_add_token");
        check(kvb_manager_store_new_block(m, id), "kvb_manager_store_new_block");
    }
}

void print_stats(kvb_manager_t* m) {
    kvb_kv_cache_stats_t s;
    check(kvb_manager_get_kv_cache_stats(m, &s), "kvb_manager_get_kv_cache_stats");
    std::printf(
        "  free primary %llu / %llu, free host %llu / %llu, offloaded %llu, onboarded %llu, "
        "hit rate %.2f\n",
        static_cast<unsigned long long>(s.free_num_blocks),
        static_cast<unsigned long long>(s.num_primary_blocks),
        static_cast<unsigned long long>(s.free_secondary_blocks),
        static_cast<unsigned long long>(s.num_secondary_blocks),
        static_cast<unsigned long long>(s.offloaded_blocks),
        static_cast<unsigned long long>(s.onboarded_blocks), s.cache_hit_rate);
}

}  // namespace

int main() {
    kvb_window_config_t window{kWindow,        /*primary*/ 24,  /*secondary*/ 16,
                               /*layers*/ 2,
                               /*kv heads*/ 2, /*head size*/ 8, /*auto host tier*/ false};
    kvb_manager_config_t config;
    check(kvb_manager_config_init(&config), "kvb_manager_config_init");
    config.windows = &window;
    config.num_windows = 1;
    config.tokens_per_block = kTokensPerBlock;
    config.max_sequence_length = kWindow;
    config.copy_backend = KVB_COPY_BACKEND_HOST;
    kvb_manager_t* m = nullptr;
    check(kvb_manager_create(&config, &m), "kvb_manager_create");

    std::printf("== two requests share a 64-token system prompt\n");
    admit(m, 1, prompt(64, 1, 20));
    check(kvb_manager_store_context_blocks(m, 1, 84), "kvb_manager_store_context_blocks");
    admit(m, 2, prompt(64, 2, 20));
    // Each prefill stores its computed blocks (storing for reuse stops at what was computed).
    check(kvb_manager_store_context_blocks(m, 2, 84), "kvb_manager_store_context_blocks");
    print_stats(m);

    std::printf("== both finish; a third request repeats request 1 and reuses its partial block\n");
    generate(m, 1, 12);
    check(kvb_manager_remove_sequence(m, 1, true), "kvb_manager_remove_sequence");
    check(kvb_manager_remove_sequence(m, 2, true), "kvb_manager_remove_sequence");
    admit(m, 3, prompt(64, 1, 20));
    check(kvb_manager_remove_sequence(m, 3, true), "kvb_manager_remove_sequence");

    std::printf("== a long unrelated request evicts cached blocks to the host tier\n");
    std::vector<int32_t> other;
    for (int32_t i = 0; i < 300; ++i) other.push_back(90000 + i);
    admit(m, 4, other);
    print_stats(m);
    check(kvb_manager_remove_sequence(m, 4, false), "kvb_manager_remove_sequence");

    std::printf("== request 1's prompt again: its prefix comes back from the host tier\n");
    admit(m, 5, prompt(64, 1, 20));
    print_stats(m);

    int32_t max_blocks = 0, pools = 0;
    check(kvb_manager_get_offset_table_dimensions(m, &max_blocks, &pools),
          "kvb_manager_get_offset_table_dimensions");
    std::vector<int32_t> table(static_cast<size_t>(pools) * 1 * 2 * max_blocks);
    int32_t count = 0;
    check(kvb_manager_copy_block_offsets(m, table.data(), table.size(), 1, 0, 5, &count),
          "kvb_manager_copy_block_offsets");
    std::printf("== block table of request 5 (K offsets): ");
    for (int32_t i = 0; i < count; ++i) std::printf("%d ", table[i]);
    std::printf("\n");

    check(kvb_manager_check_invariants(m), "kvb_manager_check_invariants");
    check(kvb_manager_remove_sequence(m, 5, true), "kvb_manager_remove_sequence");
    check(kvb_manager_destroy(m), "kvb_manager_destroy");
    std::printf("ok\n");
    return 0;
}
