// KVCacheManager methods: sizing helpers.
#include "manager.hpp"

namespace kvb_py {

void init_sizing(ManagerClass& cls) {
    cls.def_static(
           "calculate_max_block_requirements_per_beam",
           [](int32_t sequence_length, int32_t window_size, int32_t tokens_per_block) {
               int32_t n = 0;
               kvb::check(kvb_calculate_max_block_requirements_per_beam(
                   sequence_length, window_size, tokens_per_block, &n));
               return n;
           },
           "sequence_length"_a, "window_size"_a, "tokens_per_block"_a,
           "Blocks one beam needs for ``sequence_length`` tokens under ``window_size``.")
        .def_static(
            "calculate_max_block_requirements",
            [](int32_t input_length, int32_t output_length, int32_t window_size, int32_t beam_width,
               int32_t tokens_per_block) {
                int32_t n = 0;
                kvb::check(kvb_calculate_max_block_requirements(
                    input_length, output_length, window_size, beam_width, tokens_per_block, &n));
                return n;
            },
            "input_length"_a, "output_length"_a, "window_size"_a, "beam_width"_a,
            "tokens_per_block"_a,
            "Blocks a request of ``input_length + output_length`` tokens needs.")
        .def_static(
            "calculate_max_attention_window",
            [](int32_t input_length, int32_t output_length, int32_t capacity_blocks,
               int32_t beam_width, int32_t tokens_per_block) {
                int32_t n = 0;
                kvb::check(kvb_calculate_max_attention_window(input_length, output_length,
                                                              capacity_blocks, beam_width,
                                                              tokens_per_block, &n));
                return n;
            },
            "input_length"_a, "output_length"_a, "capacity_blocks"_a, "beam_width"_a,
            "tokens_per_block"_a,
            "The largest attention window ``capacity_blocks`` allow for one request.")
        .def_static(
            "calculate_window_size_to_share",
            [](const std::vector<int32_t>& window_sizes,
               const std::vector<int32_t>& cache_size_per_token) {
                if (window_sizes.size() != cache_size_per_token.size()) {
                    invalid_argument("window_sizes and cache_size_per_token differ in length");
                }
                std::vector<double> shares(window_sizes.size());
                kvb::check(kvb_calculate_window_size_to_share(window_sizes.data(),
                                                              cache_size_per_token.data(),
                                                              window_sizes.size(), shares.data()));
                return shares;
            },
            "window_sizes"_a, "cache_size_per_token"_a,
            "Memory share of each window, proportional to window x cache bytes per token.")
        .def_static(
            "calculate_max_num_blocks",
            [](const std::vector<uint64_t>& bytes_per_token, uint64_t primary_bytes,
               uint64_t secondary_bytes, int32_t tokens_per_block,
               std::optional<std::vector<double>> shares, uint64_t extra_cost_bytes,
               std::optional<int64_t> max_tokens) {
                if (shares && shares->size() != bytes_per_token.size()) {
                    invalid_argument("shares and bytes_per_token differ in length");
                }
                std::vector<uint64_t> primary(bytes_per_token.size()),
                    secondary(bytes_per_token.size());
                kvb::check(kvb_calculate_max_num_blocks(
                    bytes_per_token.data(), shares ? shares->data() : nullptr,
                    bytes_per_token.size(), primary_bytes, secondary_bytes, extra_cost_bytes,
                    max_tokens.value_or(-1), tokens_per_block, primary.data(), secondary.data()));
                return std::make_pair(primary, secondary);
            },
            "bytes_per_token"_a, "primary_bytes"_a, "secondary_bytes"_a, "tokens_per_block"_a,
            nb::kw_only(), "shares"_a = nb::none(), "extra_cost_bytes"_a = 0,
            "max_tokens"_a = nb::none(),
            "``(primary, secondary)`` blocks per window that the memory budgets allow "
            "(TensorRT-LLM "
            "``calculateMaxNumBlocks`` on one rank); ``bytes_per_token[w]``: KV bytes of one token "
            "in "
            "window w.")
        .def_static(
            "calculate_auto_host_tier_blocks",
            [](int64_t gpu_quota_blocks, uint64_t available_host_bytes,
               uint64_t memlock_limit_bytes, uint64_t row_bytes) {
                int64_t blocks = 0;
                kvb::check(
                    kvb_calculate_auto_host_tier_blocks(gpu_quota_blocks, available_host_bytes,
                                                        memlock_limit_bytes, row_bytes, &blocks));
                return blocks;
            },
            "gpu_quota_blocks"_a, "available_host_bytes"_a, "memlock_limit_bytes"_a, "row_bytes"_a,
            "Host blocks of an automatic host tier: ``min(gpu_quota_blocks, 50% of "
            "available_host_bytes / row_bytes, 80% of memlock_limit_bytes / row_bytes)``; 0 = an "
            "unknown figure (caps nothing), caps of no block fall back to the quota.")
        .def_static(
            "calculate_free_mem_bytes",
            [](int32_t device, double fraction, uint64_t pool_free, uint64_t host_bytes) {
                return nogil([&] {
                    return kvb::calculateFreeMemBytes(device, fraction, pool_free, host_bytes);
                });
            },
            "cuda_device"_a, "free_gpu_memory_fraction"_a, "memory_pool_free_bytes"_a = 0,
            "host_cache_bytes"_a = 0,
            "``(gpu_bytes, host_bytes)`` for a KV cache (TensorRT-LLM ``calculateFreeMemBytes``): "
            "(the device's free bytes + ``memory_pool_free_bytes``) x the fraction, and "
            "``host_cache_bytes``. Raises :class:`UnsupportedError` without a CUDA driver or GPU.")
        .def_static(
            "calculate_disk_tier_blocks",
            [](int32_t tokens_per_block, uint64_t row_bytes, uint64_t disk_bytes) {
                int64_t blocks = 0;
                uint64_t slot_bytes = 0;
                kvb::check(kvb_calculate_disk_tier_blocks(tokens_per_block, row_bytes, disk_bytes,
                                                          &blocks, &slot_bytes));
                return std::make_pair(blocks, slot_bytes);
            },
            "tokens_per_block"_a, "row_bytes"_a, "disk_bytes"_a,
            "``(blocks, slot_bytes)`` of a window's disk tier: the bytes one block takes on disk "
            "(its row of ``row_bytes``, every pool of the window, behind a header with its key "
            "and checksums, aligned to 4 KiB) and the blocks ``disk_bytes`` holds, as "
            "``with_disk_tier(directory, bytes_per_window=disk_bytes)`` sizes it.");
}

}  // namespace kvb_py
