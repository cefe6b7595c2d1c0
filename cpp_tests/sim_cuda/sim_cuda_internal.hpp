// What the translation units of the simulated CUDA driver share (sim_cuda.cpp describes the
// simulator and its settings). One library, split by concept; each file uses only the layers listed
// before it, never one after:
//   sim_cuda.cpp           settings, the simulator's state, the entry points' prologue (call
//                          counting, tracing, fault injection), lazy setup, exit report, SIGSEGV
//   sim_cuda_ordering.cpp  the allocation registry (where an address lives) and the happens-before
//                          checks on the bytes of allocations
//   sim_cuda_streams.cpp   streams as in-order queues run by workers in the three scheduling modes,
//                          and the stream and event entry points
//   sim_cuda_device.cpp    entry points: errors, versions, init, the device, contexts
//   sim_cuda_memory.cpp    entry points: allocations, pointer attributes, copies and memsets
//   sim_cuda_modules.cpp   entry points: CUBIN loading and function lookup
//   sim_cuda_launch.cpp    cuLaunchKernel: the copy kernel compiled for the CPU, descriptor checks
//   sim_cuda_hooks.cpp     the kvb_sim_cuda_* test hooks
//   sim_cuda_stubs.cpp     every other function of a driver's symbol set (12.4 or 13.0): a stub
// Everything here is in namespace kvb_sim and stays inside the library: it builds with hidden
// visibility and exports.map exports only cu* and kvb_sim_cuda_*. Helpers one file alone uses are
// in an anonymous namespace there.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#define KVB_EXPORT extern "C" __attribute__((visibility("default")))

namespace kvb_sim {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

// Result codes (cuda.h).
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3,
                   kInvalidDevice = 101, kInvalidImage = 200, kInvalidContext = 201,
                   kNoBinaryForGpu = 209, kInvalidHandle = 400, kNotFound = 500, kNotReady = 600,
                   kContextIsDestroyed = 709, kNotSupported = 801, kUnknown = 999;

// ---- Settings (sim_cuda.cpp) ---------------------------------------------------------------------
enum class Mode { Eager, Delayed, Deferred };

// Prints `message` and aborts: how the simulator reports a misuse of the driver.
[[noreturn]] void die(const std::string& message);

struct FailRule {
    std::string name;
    uint64_t nth;
    CUresult code;
};

struct Config {
    Mode mode = Mode::Eager;
    uint64_t seed = 1;
    uint64_t delayUs = 300;
    uint64_t memory = 2ull << 30;
    uint64_t hostMemory = ~0ull;
    int version = 13000;
    int arch = 90;
    int sms = 132;
    bool leaksFail = true;
    bool trace = false;
    bool ordering = true;
};

// The settings, read from the environment at the first call.
const Config& config();

// ---- Vector clocks --------------------------------------------------------------------------------
// Actor 0 is the host (every host thread: they order among themselves in ways the driver cannot
// see, so one host clock never reports a race that is not one); each stream is an actor.
struct Clock {
    std::vector<uint64_t> v;
    uint64_t get(size_t actor) const { return actor < v.size() ? v[actor] : 0; }
    void set(size_t actor, uint64_t value) {
        if (v.size() <= actor) v.resize(actor + 1, 0);
        v[actor] = value;
    }
    void join(const Clock& o) {
        if (v.size() < o.v.size()) v.resize(o.v.size(), 0);
        for (size_t i = 0; i < o.v.size(); ++i) v[i] = std::max(v[i], o.v[i]);
    }
};

// One access by an operation: actor and its position, and what it was (for messages).
struct Access {
    size_t actor = 0;
    uint64_t seq = 0;  // 0: nobody
    std::shared_ptr<const std::string> what;
};

inline bool happensBefore(const Access& a, const Clock& c) {
    return a.seq == 0 || c.get(a.actor) >= a.seq;
}

// ---- The simulator's state ------------------------------------------------------------------------
enum class Kind { Device, Pinned };

struct Allocation {
    Kind kind;
    uint64_t base = 0;  // the address both sides use (device VA, or the host pointer)
    uint64_t size = 0;
    uint64_t reserved = 0;  // bytes of the reservation (device: with the guard page)
    uint64_t id = 0;
    std::string origin;  // the call that made it
    std::string describe() const {
        char b[160];
        std::snprintf(b, sizeof b, "%s allocation #%llu (%s, %llu bytes at 0x%llx)",
                      kind == Kind::Device ? "device" : "pinned host", (unsigned long long)id,
                      origin.c_str(), (unsigned long long)size, (unsigned long long)base);
        return b;
    }
};

struct Stream;
struct Context;

struct Op {
    uint64_t seq = 0;
    // A wait for another stream's position (cuStreamWaitEvent, the legacy stream's implicit waits).
    std::shared_ptr<Stream> waitFor;
    uint64_t waitSeq = 0;
    std::function<void()> run;
};

struct Stream {
    size_t actor = 0;
    uint64_t id = 0;
    unsigned flags = 0;
    bool legacy = false;
    Context* ctx = nullptr;
    std::deque<Op> queue;
    uint64_t enqueued = 0, completed = 0, allowed = 0;
    uint64_t queried = 0;  // deferred mode: the position cuStreamQuery answered NOT_READY for
    Clock clock;
    std::map<Stream*, uint64_t> waited;  // the other streams' positions already waited for
    bool destroyed = false;
    std::mt19937_64 rng;
    std::thread worker;
    std::string label() const {
        return legacy ? std::string("the legacy default stream") : "stream #" + std::to_string(id);
    }
};

struct Event {
    uint64_t id = 0;
    std::shared_ptr<Stream> stream;  // null: never recorded (complete)
    uint64_t seq = 0;
    Clock clock;
    uint64_t queried = 0;  // deferred mode: the record position already answered NOT_READY
};

struct Module {
    uint64_t id = 0;
    std::set<std::string> symbols;
    std::deque<std::pair<Module*, std::string>> functions;
};

struct Context {
    int refs = 0;
    std::shared_ptr<Stream> legacyStream;
};

// A segment of tracked memory: the last write, the reads since (the latest per actor), and for
// pinned memory last written by the host, the bytes the device read (to see host rewrites).
struct Segment {
    uint64_t end = 0;
    Access write;
    std::vector<Access> reads;
    std::vector<uint8_t> snapshot;
};

struct Sim {
    std::mutex mu;
    std::condition_variable cv;
    bool initialized = false;
    bool cuInitDone = false;  // cuInit succeeded
    bool shutdown = false;
    // Device address space and its shadow.
    uint64_t deviceBase = 0;
    uint8_t* shadow = nullptr;
    std::map<uint64_t, uint64_t> freeRanges;  // offset -> size
    uint64_t deviceUsed = 0, hostUsed = 0;
    std::map<uint64_t, Allocation> allocations;  // by base address (both kinds)
    uint64_t nextAllocation = 1;
    Context primary;
    std::map<Stream*, std::shared_ptr<Stream>> streams;  // live user streams
    std::vector<std::shared_ptr<Stream>> allStreams;     // every stream ever made (workers)
    std::map<Event*, std::unique_ptr<Event>> events;
    std::map<Module*, std::unique_ptr<Module>> modules;
    uint64_t nextStream = 1, nextEvent = 1, nextModule = 1, nextLaunch = 1, nextOp = 1;
    size_t nextActor = 1;
    Clock host;
    std::map<uint64_t, Segment> segments;  // tracked memory, by start address
    std::map<std::string, uint64_t> calls;
    std::vector<FailRule> failRules;
};

// The one simulator; its `mu` guards everything in it.
Sim& sim();

// The calling thread's context stack (cuCtxSetCurrent, cuCtxPushCurrent_v2, ...).
extern thread_local std::vector<Context*> t_contexts;

// ---- The entry points' prologue (sim_cuda.cpp) ---------------------------------------------------
// Parses a KVB_SIM_CUDA_FAIL spec into `out`; counts are relative to the calls made so far.
void parseFailRules(const char* spec, std::vector<FailRule>& out,
                    const std::map<std::string, uint64_t>& calls);
// Lazily sets up the simulator (at the first call of any entry point).
void initOnce(Sim& s);
// Counts a call of `name` and says whether fault injection fails it (with `code`).
bool injected(Sim& s, const char* name, CUresult& code);
// The calling thread's current context, or the error a call needing one returns.
CUresult currentContext(Sim& s, Context** out);

// ---- The allocation registry and happens-before tracking (sim_cuda_ordering.cpp) -----------------
// The live allocation holding [addr, addr + len), or null.
const Allocation* findAllocation(Sim& s, uint64_t addr, uint64_t len);
// A device-visible range: device memory, or pinned host memory (unified addressing).
const Allocation* deviceRange(Sim& s, uint64_t addr, uint64_t len);
// Where the simulator reads and writes `addr` (device memory lives in the shadow).
uint8_t* view(Sim& s, const Allocation& a, uint64_t addr);
// `addr` for messages, with the allocation it lies in.
std::string describeAddress(Sim& s, uint64_t addr);
// Tracks an access to [addr, addr + len) of an allocation (pinned memory gets its view); an access
// that nothing orders after a conflicting earlier one aborts.
void trackRange(Sim& s, const Allocation& a, uint64_t addr, uint64_t len, bool write,
                const Access& who, const Clock& clock);
// Forgets [lo, hi) (freed memory).
void untrack(Sim& s, uint64_t lo, uint64_t hi);

// ---- Streams (sim_cuda_streams.cpp) ---------------------------------------------------------------
// The context's legacy default stream, made at first use.
Stream* legacyStream(Sim& s, Context* ctx);
// The stream behind a handle (0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the legacy stream).
CUresult resolveStream(Sim& s, Context* ctx, void* handle, Stream** out);
// Opens a new operation on `st`: its access (actor, position) and clock; call `enqueue` right after.
Access beginOp(Sim& s, Stream* st, const std::string& what, Clock& clock);
// Enqueues the operation `beginOp` opened (`run` null: nothing to do).
void enqueue(Sim& s, Stream* st, std::function<void()> run);
// The host waits until `st` completed `seq` (running it first in deferred mode).
void hostWait(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, uint64_t seq);
// The host waits for every stream (cuCtxSynchronize, frees).
void synchronizeAll(Sim& s, std::unique_lock<std::mutex>& lock);

// ---- Handles of the driver API --------------------------------------------------------------------
using CUcontext = Context*;
using CUstream = void*;
using CUevent = void*;
using CUmodule = void*;
using CUfunction = void*;

}  // namespace kvb_sim

// Common prologue of an entry point: takes the lock, counts the call, applies fault injection.
// (Used after `using namespace kvb_sim;`, as the entry points are outside the namespace.)
#define ENTER(name)                                                 \
    Sim& s = sim();                                                 \
    std::unique_lock<std::mutex> lock(s.mu);                        \
    initOnce(s);                                                    \
    {                                                               \
        CUresult injected_code = 0;                                 \
        if (injected(s, name, injected_code)) return injected_code; \
    }

// For entry points that need a current context: declares `ctx`, or returns the error.
#define NEED_CONTEXT()                                                    \
    Context* ctx = nullptr;                                               \
    if (CUresult rc = currentContext(s, &ctx); rc != kSuccess) return rc; \
    (void)ctx;

// For entry points that need only cuInit.
#define NEED_INIT() \
    if (!s.cuInitDone) return kNotInitialized;
