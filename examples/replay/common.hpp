// replay/common.hpp: what every part of the replay includes: the standard headers, kvblock.h and
// the trace, report and publisher helpers.
#ifndef KVBLOCK_REPLAY_COMMON_HPP
#define KVBLOCK_REPLAY_COMMON_HPP

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
#include "report.hpp"
#include "publish.hpp"
#include "trace.hpp"

#ifndef KVBLOCK_REPLAY_DEFAULT_TRACE
#define KVBLOCK_REPLAY_DEFAULT_TRACE "data/mooncake_synthetic_trace.jsonl"
#endif

namespace replay {

using Clock = std::chrono::steady_clock;

}  // namespace replay

#endif  // KVBLOCK_REPLAY_COMMON_HPP
