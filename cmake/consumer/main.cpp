// Consumer of an installed kvblock: checks the run-time version and that a repeated prompt is
// reused, through the C++ wrapper and through the TensorRT-LLM facade (whose headers are a
// directory of their own). Exit status 0 on success.
#include <kvblock.hpp>
#include <kvblock_trtllm.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
    uint32_t major = 0, minor = 0, patch = 0;
    kvb::check(kvb_version(&major, &minor, &patch));
    const std::string version =
        std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    if (version != KVBLOCK_EXPECTED_VERSION) {
        std::fprintf(stderr, "kvb_version %s, expected %s\n", version.c_str(),
                     KVBLOCK_EXPECTED_VERSION);
        return 1;
    }
    kvb::Config config;
    config.addWindow(256, 16);
    config.raw.tokens_per_block = 4;
    config.raw.max_sequence_length = 256;
    kvb::Manager manager(config);
    std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9};
    manager.addSequence(kvb::Request(1, prompt));
    manager.storeContextBlocks(1, 9);
    manager.removeSequence(1);
    const kvb_admission_t again = manager.addSequence(kvb::Request(2, prompt));
    if (again.prepopulated_prompt_len != 8) {
        std::fprintf(stderr, "reused %d tokens, expected 8\n", again.prepopulated_prompt_len);
        return 1;
    }
    kvb::trtllm::KVCacheManager facade(config);
    facade.allocatePools();
    kvb::trtllm::Request request(3, prompt);
    facade.addSequenceBatch({{3, 9, 1}}, {request});
    if (request.prepopulatedPromptLen != 0) {  // a manager of its own: nothing cached yet
        std::fprintf(stderr, "the facade reused %d tokens\n", request.prepopulatedPromptLen);
        return 1;
    }
    std::printf("consumer: kvblock %s, reused %d tokens\n", version.c_str(),
                again.prepopulated_prompt_len);
    return 0;
}
