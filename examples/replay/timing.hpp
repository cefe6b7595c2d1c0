// replay/timing.hpp: Timed manager calls: one clock pair per call (the time-stamp counter on x86-64), by kind.
#ifndef KVBLOCK_REPLAY_TIMING_HPP
#define KVBLOCK_REPLAY_TIMING_HPP

#include "common.hpp"
#include "options.hpp"

namespace replay {

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
inline const char* const kKindNames[kNumKinds] = {
    "lookup", "admit_alloc", "admit_other", "decode_alloc", "free", "preempt", "refresh", "flush"};

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
inline kvb_status_t timed(Timings& t, Kind kind, Call&& call) {
    const uint64_t t0 = ticks();
    kvb_status_t status = call();
    const uint64_t ns = ticks() - t0;
    t.ns[kind] += ns;
    t.calls[kind] += 1;
    t.step_ns += ns;
    if (kind == kAdmitAlloc || kind == kAdmitOther) t.step_admit_ns += ns;
    return status;
}

inline void check(kvb_status_t status, const char* what) {
    if (status != KVB_OK) {
        throw std::runtime_error(std::string(what) + " failed: " + kvb_status_string(status) +
                                 ": " + kvb_last_error_message());
    }
}

}  // namespace replay

#endif  // KVBLOCK_REPLAY_TIMING_HPP
