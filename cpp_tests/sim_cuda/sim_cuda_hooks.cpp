// The test hooks: exported next to the driver API (exports.map: kvb_sim_cuda_*) so that a test can
// arm fault injection, count calls and count live objects at run time.
#include <algorithm>

#include "sim_cuda_internal.hpp"

using namespace kvb_sim;

// ---- Test hooks ------------------------------------------------------------------------------------------
// Makes the `nth` next call of `name` fail with `code` (0: the default of KVB_SIM_CUDA_FAIL);
// `nth` 0 disarms the failures still pending for `name`.
KVB_EXPORT int kvb_sim_cuda_fail(const char* name, unsigned nth, int code) {
    Sim& s = sim();
    std::lock_guard<std::mutex> lock(s.mu);
    initOnce(s);
    if (!name) return kInvalidValue;
    if (nth == 0) {
        auto& rules = s.failRules;
        rules.erase(std::remove_if(rules.begin(), rules.end(),
                                   [&](const FailRule& r) { return r.name == name; }),
                    rules.end());
        return kSuccess;
    }
    std::string spec = std::string(name) + ":" + std::to_string(nth);
    if (code != 0) spec += ":" + std::to_string(code);
    parseFailRules(spec.c_str(), s.failRules, s.calls);
    return kSuccess;
}

// How many times `name` was called.
KVB_EXPORT unsigned long long kvb_sim_cuda_calls(const char* name) {
    Sim& s = sim();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.calls.find(name ? name : "");
    return it == s.calls.end() ? 0 : it->second;
}

// Live allocations, streams, events and modules (what the exit report would call leaked).
KVB_EXPORT unsigned long long kvb_sim_cuda_live_objects(void) {
    Sim& s = sim();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.allocations.size() + s.streams.size() + s.events.size() + s.modules.size();
}
